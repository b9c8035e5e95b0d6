/* agent_crobj: decoding and checking Checkpoint and Restore objects (agent_crobj.h). */
#include "agent_crobj.h"

#include "gcr_uuid.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static int label_chars(const char *s, size_t n)
{
	if (n == 0 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
			return 0;
	return 1;
}

int agent_crobj_is_label(const char *s)
{
	return s != NULL && label_chars(s, strlen(s));
}

int agent_crobj_is_subdomain(const char *s)
{
	if (s == NULL)
		return 0;
	size_t n = strlen(s);
	if (n == 0 || n > 253)
		return 0;
	for (const char *p = s;;) {
		const char *dot = strchr(p, '.');
		size_t len = dot ? (size_t)(dot - p) : strlen(p);
		if (!label_chars(p, len))
			return 0;
		if (dot == NULL)
			return 1;
		p = dot + 1;
	}
}

int agent_crobj_is_token(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n >= AGENT_CROBJ_UID_LEN)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
		      s[i] == '-'))
			return 0;
	return 1;
}

static const char *str(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

int agent_crobj_decode(json_t *obj, enum agent_crobj_kind kind, struct agent_crobj *o, struct gcr_err *err)
{
	memset(o, 0, sizeof(*o));
	o->kind = kind;
	json_t *md = json_object_get(obj, "metadata"), *spec = json_object_get(obj, "spec"),
	       *st = json_object_get(obj, "status");
	const char *ns = str(md, "namespace"), *name = str(md, "name"), *uid = str(md, "uid");
	if (!agent_crobj_is_label(ns) || !agent_crobj_is_subdomain(name) || !agent_crobj_is_token(uid))
		return gcr_err_set(err, -EINVAL, "object without a valid namespace, name and uid");
	snprintf(o->ns, sizeof(o->ns), "%s", ns);
	snprintf(o->name, sizeof(o->name), "%s", name);
	snprintf(o->uid, sizeof(o->uid), "%s", uid);
	const char *rv = str(md, "resourceVersion");
	if (agent_crobj_is_token(rv))
		snprintf(o->resource_version, sizeof(o->resource_version), "%s", rv);
	o->deleting = json_object_get(md, "deletionTimestamp") != NULL;
	size_t i;
	json_t *f;
	json_array_foreach(json_object_get(md, "finalizers"), i, f)
	{
		if (json_is_string(f) && strcmp(json_string_value(f), AGENT_CROBJ_FINALIZER) == 0)
			o->finalizer = 1;
	}

	/* status: anything malformed reads as absent */
	o->phase = agent_phase_of(str(st, "phase"));
	const char *node = str(st, "nodeName");
	if (agent_crobj_is_subdomain(node))
		snprintf(o->node, sizeof(o->node), "%s", node);

	/* spec */
	const char *target = str(spec, kind == AGENT_CROBJ_CHECKPOINT ? "podName" : "checkpointName");
	if (target == NULL)
		return gcr_err_set(err, -EINVAL, "spec.%s is missing",
				   kind == AGENT_CROBJ_CHECKPOINT ? "podName" : "checkpointName");
	if (!agent_crobj_is_subdomain(target))
		return gcr_err_set(err, -EINVAL, "spec.%s is not a valid object name",
				   kind == AGENT_CROBJ_CHECKPOINT ? "podName" : "checkpointName");
	snprintf(o->target, sizeof(o->target), "%s", target);
	json_t *cn = json_object_get(spec, "containerName");
	if (kind == AGENT_CROBJ_CHECKPOINT && cn != NULL) {
		if (!agent_crobj_is_label(json_string_value(cn)))
			return gcr_err_set(err, -EINVAL, "spec.containerName is not a valid container name");
		snprintf(o->container, sizeof(o->container), "%s", json_string_value(cn));
	}
	json_t *kc = json_object_get(spec, "keepContext");
	if (kc != NULL && !json_is_boolean(kc))
		return gcr_err_set(err, -EINVAL, "spec.keepContext is not a boolean");
	o->keep_context = kind == AGENT_CROBJ_CHECKPOINT && json_is_true(kc);
	json_t *ac = json_object_get(spec, "action");
	if (kind == AGENT_CROBJ_CHECKPOINT && ac != NULL) {
		const char *a = json_string_value(ac);
		if (a != NULL && strcmp(a, "Suspend") == 0)
			o->action = AGENT_ACTION_SUSPEND;
		else if (a != NULL && strcmp(a, "Image") == 0)
			o->action = AGENT_ACTION_IMAGE;
		else
			return gcr_err_set(err, -EINVAL, "spec.action is neither Suspend nor Image");
		if (o->action == AGENT_ACTION_IMAGE && o->keep_context)
			return gcr_err_set(err, -EINVAL, "spec.keepContext does not apply to action Image");
	}
	json_t *cc = json_object_get(spec, "cpuCheckpoint");
	if (kind == AGENT_CROBJ_CHECKPOINT && cc != NULL) {
		const char *v = json_string_value(cc);
		if (v == NULL || (strcmp(v, "Agent") != 0 && strcmp(v, "Kubelet") != 0))
			return gcr_err_set(err, -EINVAL, "spec.cpuCheckpoint is neither Agent nor Kubelet");
		o->cpu_kubelet = strcmp(v, "Kubelet") == 0;
		if (o->cpu_kubelet && o->action != AGENT_ACTION_IMAGE)
			return gcr_err_set(err, -EINVAL, "spec.cpuCheckpoint applies to action Image only");
	}
	json_t *pn = json_object_get(spec, "podName");
	if (kind == AGENT_CROBJ_RESTORE && pn != NULL) {
		if (!agent_crobj_is_subdomain(json_string_value(pn)))
			return gcr_err_set(err, -EINVAL, "spec.podName is not a valid pod name");
		snprintf(o->pod, sizeof(o->pod), "%s", json_string_value(pn));
	}
	json_t *tg = json_object_get(spec, "targetGPU"), *gp = json_object_get(spec, "gpuPairs");
	if (kind == AGENT_CROBJ_RESTORE && tg != NULL) {
		if (!gcr_uuid_valid(json_string_value(tg)))
			return gcr_err_set(err, -EINVAL, "spec.targetGPU is not a GPU UUID");
		snprintf(o->target_gpu, sizeof(o->target_gpu), "%s", json_string_value(tg));
	}
	if (kind == AGENT_CROBJ_RESTORE && gp != NULL) {
		if (tg != NULL)
			return gcr_err_set(err, -EINVAL, "spec.targetGPU and spec.gpuPairs together");
		if (!json_is_array(gp) || json_array_size(gp) > AGENT_CROBJ_MAX_PAIRS)
			return gcr_err_set(err, -EINVAL, "spec.gpuPairs is not a list of at most %d pairs",
					   AGENT_CROBJ_MAX_PAIRS);
		json_t *pr;
		json_array_foreach(gp, i, pr)
		{
			const char *from = str(pr, "from"), *to = str(pr, "to");
			if (!gcr_uuid_valid(from) || !gcr_uuid_valid(to))
				return gcr_err_set(err, -EINVAL, "spec.gpuPairs[%zu]: from and to must be GPU UUIDs", i);
			snprintf(o->pairs[i].from, sizeof(o->pairs[i].from), "%s", from);
			snprintf(o->pairs[i].to, sizeof(o->pairs[i].to), "%s", to);
		}
		o->npairs = json_array_size(gp);
	}
	json_t *to = json_object_get(spec, "timeoutSeconds");
	if (to != NULL) {
		json_int_t t = json_integer_value(to);
		if (!json_is_integer(to) || t < 1 || t > 3600)
			return gcr_err_set(err, -EINVAL, "spec.timeoutSeconds is not an integer in 1..3600");
		o->timeout_s = (int)t;
	}
	return 0;
}
