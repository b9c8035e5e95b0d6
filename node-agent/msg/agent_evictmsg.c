/* agent_evictmsg: eviction imaging's parsers of outside input (gcr-hold's line, the pod
 * object) and its pure decisions; every field checked, nothing else in the input believed. */
#include "agent_evictmsg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Longest object name the Checkpoint gets (a label value's limit, so others may copy it). */
#define CK_NAME_MAX 63
/* Hex digits of the pod uid in the name. */
#define UID_HEX 8

int agent_evictmsg_parse_hold(const char *line, size_t len, struct gcr_err *err)
{
	if (len > AGENT_EVICTMSG_MAX_LINE)
		return gcr_err_set(err, -EMSGSIZE, "line of %zu bytes exceeds %d", len, AGENT_EVICTMSG_MAX_LINE);
	if (memchr(line, '\0', len) != NULL)
		return gcr_err_set(err, -EBADMSG, "a NUL byte in the line");
	json_error_t je;
	json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	int rc = 0;
	if (!json_is_object(j)) {
		rc = gcr_err_set(err, -EBADMSG, "not a JSON object");
		goto out;
	}
	const char *key;
	json_t *v;
	json_object_foreach(j, key, v) {
		if (strcmp(key, "op") != 0 && strcmp(key, "v") != 0) {
			rc = gcr_err_set(err, -EBADMSG, "unknown field \"%.32s\"", key);
			goto out;
		}
	}
	json_t *op = json_object_get(j, "op"), *ver = json_object_get(j, "v");
	if (!json_is_string(op))
		rc = gcr_err_set(err, -EBADMSG, "\"op\" must be a string");
	else if (!json_is_integer(ver))
		rc = gcr_err_set(err, -EBADMSG, "\"v\" must be an integer");
	else if (strcmp(json_string_value(op), AGENT_EVICTMSG_OP) != 0)
		rc = gcr_err_set(err, -EPROTO, "op \"%.32s\" is not %s", json_string_value(op), AGENT_EVICTMSG_OP);
	else if (json_integer_value(ver) != AGENT_EVICTMSG_VERSION)
		rc = gcr_err_set(err, -EPROTO, "version %lld, this agent speaks %d", (long long)json_integer_value(ver),
				 AGENT_EVICTMSG_VERSION);
out:
	json_decref(j);
	return rc;
}

const char *agent_evictmsg_outcome_name(enum agent_evictmsg_outcome o)
{
	switch (o) {
	case AGENT_EVICTMSG_WRITTEN:
		return "written";
	case AGENT_EVICTMSG_FAILED:
		return "failed";
	case AGENT_EVICTMSG_NO_TIME:
		return "no-time";
	case AGENT_EVICTMSG_NOTHING:
		break;
	}
	return "nothing";
}

char *agent_evictmsg_reply(enum agent_evictmsg_outcome o, const char *message)
{
	json_t *j = json_pack("{s:s, s:s}", "outcome", agent_evictmsg_outcome_name(o), "message",
			      message != NULL ? message : "");
	char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
	json_decref(j);
	char *line = NULL;
	if (s != NULL && asprintf(&line, "%s\n", s) < 0)
		line = NULL;
	free(s);
	return line;
}

const char *agent_evictmsg_cause_name(enum agent_evictmsg_cause c)
{
	switch (c) {
	case AGENT_EVICTMSG_CAUSE_PREEMPTION:
		return "PreemptionByScheduler";
	case AGENT_EVICTMSG_CAUSE_EVICTION:
		return "EvictionByEvictionAPI";
	case AGENT_EVICTMSG_CAUSE_ANY:
		return "AnyDeletion";
	case AGENT_EVICTMSG_CAUSE_NONE:
		break;
	}
	return "";
}

/* A string field of obj copied into out (len bytes); -EBADMSG when absent, empty or too long. */
static int copy_str(json_t *obj, const char *field, char *out, size_t len, struct gcr_err *err)
{
	const char *s = json_string_value(json_object_get(obj, field));
	if (s == NULL || s[0] == '\0' || strlen(s) >= len)
		return gcr_err_set(err, -EBADMSG, "metadata.%s missing or longer than %zu bytes", field, len - 1);
	memcpy(out, s, strlen(s) + 1);
	return 0;
}

/* "YYYY-MM-DDTHH:MM:SSZ" (what the API server writes for metadata timestamps) as Unix seconds. */
static int rfc3339(const char *s, long long *out)
{
	struct tm tm = { 0 };
	const char *end = s != NULL ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (end == NULL)
		return -EBADMSG;
	if (*end == '.') /* fractional seconds: not written by the API server, allowed */
		for (end++; *end >= '0' && *end <= '9'; end++)
			;
	if (strcmp(end, "Z") != 0)
		return -EBADMSG;
	time_t t = timegm(&tm);
	if (t == (time_t)-1 || t <= 0)
		return -EBADMSG;
	*out = (long long)t;
	return 0;
}

/* Whether container c asks for resource in its limits or requests. */
static int asks(json_t *c, const char *resource)
{
	json_t *r = json_object_get(c, "resources");
	return json_object_get(json_object_get(r, "limits"), resource) != NULL ||
	       json_object_get(json_object_get(r, "requests"), resource) != NULL;
}

/* The name of the container whose status carries container id cid ("runtime://<cid>"). */
static const char *container_of_id(json_t *pod, const char *cid)
{
	json_t *cs = json_object_get(json_object_get(pod, "status"), "containerStatuses"), *s;
	size_t i;
	if (cid == NULL || cid[0] == '\0')
		return NULL;
	json_array_foreach(cs, i, s) {
		const char *id = json_string_value(json_object_get(s, "containerID"));
		const char *sep = id != NULL ? strstr(id, "://") : NULL;
		if (sep != NULL && strcmp(sep + 3, cid) == 0)
			return json_string_value(json_object_get(s, "name"));
	}
	return NULL;
}

int agent_evictmsg_pod(json_t *pod, const char *resource, const char *cid, struct agent_evictmsg_pod *out,
		       struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	json_t *md = json_object_get(pod, "metadata");
	if (!json_is_object(md))
		return gcr_err_set(err, -EBADMSG, "the pod has no metadata");
	if (copy_str(md, "namespace", out->ns, sizeof(out->ns), err) < 0 ||
	    copy_str(md, "name", out->name, sizeof(out->name), err) < 0 ||
	    copy_str(md, "uid", out->uid, sizeof(out->uid), err) < 0)
		return -EBADMSG;
	const char *lab = json_string_value(json_object_get(json_object_get(md, "labels"), AGENT_EVICTMSG_LABEL));
	const char *on = json_string_value(json_object_get(json_object_get(md, "annotations"), AGENT_EVICTMSG_ON_KEY));
	out->opted = lab != NULL && strcmp(lab, AGENT_EVICTMSG_LABEL_VALUE) == 0;
	out->any_deletion = on != NULL && strcmp(on, AGENT_EVICTMSG_ON_ANY) == 0;
	json_t *dt = json_object_get(md, "deletionTimestamp");
	if (dt != NULL && !json_is_null(dt) && rfc3339(json_string_value(dt), &out->deletion) < 0)
		return gcr_err_set(err, -EBADMSG, "metadata.deletionTimestamp is not an RFC 3339 time");
	json_t *refs = json_object_get(md, "ownerReferences"), *ref;
	size_t i;
	json_array_foreach(refs, i, ref) {
		const char *u = json_string_value(json_object_get(ref, "uid"));
		if (json_is_true(json_object_get(ref, "controller")) && u != NULL && strlen(u) < sizeof(out->owner_uid))
			snprintf(out->owner_uid, sizeof(out->owner_uid), "%s", u);
	}
	/* The cause: a DisruptionTarget condition the API server (eviction) or the scheduler
	 * (preemption) sets before the deletion; other reasons (taint manager, GC) are not ours. */
	json_t *conds = json_object_get(json_object_get(pod, "status"), "conditions"), *c;
	json_array_foreach(conds, i, c) {
		const char *type = json_string_value(json_object_get(c, "type"));
		const char *st = json_string_value(json_object_get(c, "status"));
		const char *reason = json_string_value(json_object_get(c, "reason"));
		if (type == NULL || strcmp(type, "DisruptionTarget") != 0 || st == NULL || strcmp(st, "True") != 0 ||
		    reason == NULL)
			continue;
		if (strcmp(reason, "PreemptionByScheduler") == 0)
			out->cause = AGENT_EVICTMSG_CAUSE_PREEMPTION;
		else if (strcmp(reason, "EvictionByEvictionAPI") == 0)
			out->cause = AGENT_EVICTMSG_CAUSE_EVICTION;
	}
	if (out->cause == AGENT_EVICTMSG_CAUSE_NONE && out->any_deletion)
		out->cause = AGENT_EVICTMSG_CAUSE_ANY;
	/* The container: the hold's own when it asks for the resource, else the first that does. */
	const char *hold = container_of_id(pod, cid), *first = NULL;
	json_t *cs = json_object_get(json_object_get(pod, "spec"), "containers");
	json_array_foreach(cs, i, c) {
		const char *n = json_string_value(json_object_get(c, "name"));
		if (n == NULL || strlen(n) >= sizeof(out->container) || !asks(c, resource))
			continue;
		if (first == NULL)
			first = n;
		if (hold != NULL && strcmp(hold, n) == 0)
			first = n;
	}
	if (first != NULL)
		snprintf(out->container, sizeof(out->container), "%s", first);
	return 0;
}

int agent_evictmsg_decide(const struct agent_evictmsg_pod *p, char *why, size_t len)
{
	if (!p->opted)
		snprintf(why, len, "the pod is not labelled %s: %s", AGENT_EVICTMSG_LABEL, AGENT_EVICTMSG_LABEL_VALUE);
	else if (p->deletion == 0)
		snprintf(why, len, "the pod is not being deleted");
	else if (p->cause == AGENT_EVICTMSG_CAUSE_NONE)
		snprintf(why, len, "the deletion is not for preemption or drain (no DisruptionTarget condition with "
			 "reason PreemptionByScheduler or EvictionByEvictionAPI, no %s: %s annotation)",
			 AGENT_EVICTMSG_ON_KEY, AGENT_EVICTMSG_ON_ANY);
	else if (p->container[0] == '\0')
		snprintf(why, len, "no container of the pod asks for the GCR resource");
	else
		return 1;
	return 0;
}

double agent_evictmsg_needed_s(unsigned long long bytes, double rate_mib_s, double fixed_s)
{
	if (rate_mib_s <= 0)
		rate_mib_s = 1;
	return fixed_s + (double)bytes / (rate_mib_s * 1048576.0);
}

void agent_evictmsg_ck_name(const char *pod, const char *uid, char *out, size_t len)
{
	char hex[UID_HEX + 1];
	size_t h = 0;
	for (const char *u = uid; *u != '\0' && h < UID_HEX; u++)
		if ((*u >= '0' && *u <= '9') || (*u >= 'a' && *u <= 'f'))
			hex[h++] = *u;
	hex[h] = '\0';
	/* "evict-" + cut + "-" + hex within CK_NAME_MAX; a cut ending in '-' or '.' would end a DNS
	 * label badly, so those are dropped too. */
	size_t room = CK_NAME_MAX - strlen("evict-") - 1 - h, n = strlen(pod);
	if (n > room)
		n = room;
	while (n > 0 && (pod[n - 1] == '-' || pod[n - 1] == '.'))
		n--;
	snprintf(out, len, "evict-%.*s-%s", (int)n, pod, hex);
}

json_t *agent_evictmsg_checkpoint(const struct agent_evictmsg_pod *p, const char *node, const char *api_version)
{
	char name[CK_NAME_MAX + 1], podlab[CK_NAME_MAX + 1];
	agent_evictmsg_ck_name(p->name, p->uid, name, sizeof(name));
	/* A label value: at most 63 bytes, ending alphanumeric (a pod name starts so). */
	size_t n = strlen(p->name) > CK_NAME_MAX ? CK_NAME_MAX : strlen(p->name);
	while (n > 0 && (p->name[n - 1] == '-' || p->name[n - 1] == '.'))
		n--;
	snprintf(podlab, sizeof(podlab), "%.*s", (int)n, p->name);
	json_t *labels = json_pack("{s:s, s:s, s:s}", AGENT_EVICTMSG_L_EVICTION, "true", AGENT_EVICTMSG_L_POD, podlab,
				   AGENT_EVICTMSG_L_NODE, node);
	if (labels != NULL && p->owner_uid[0] != '\0')
		json_object_set_new(labels, AGENT_EVICTMSG_L_OWNER, json_string(p->owner_uid));
	return json_pack("{s:s, s:s, s:{s:s, s:s, s:o, s:{s:s}}, s:{s:s, s:s, s:s, s:s}}", "apiVersion", api_version,
			 "kind", "Checkpoint", "metadata", "name", name, "namespace", p->ns, "labels", labels,
			 "annotations", AGENT_EVICTMSG_A_CAUSE, agent_evictmsg_cause_name(p->cause), "spec", "podName",
			 p->name, "action", "Image", "cpuCheckpoint", "Kubelet", "containerName", p->container);
}
