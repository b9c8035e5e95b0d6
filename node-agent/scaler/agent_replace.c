/* agent_replace: a replacement pod restored from its owner's eviction image. The rules are the
 * contract's (docs/preemption.md, "The replacement pod"): a pod carrying the scheduling gate
 * gpucr.dev/restore whose controller owner has a Succeeded, unconsumed eviction Checkpoint
 * gets that image (the Checkpoint marked consumed first, with a 128-bit token as the image's
 * tag; the pod's container image pointed at its node's registry, nodeSelector to that node
 * unless the images directory is shared, the gate removed); one in progress holds the gate,
 * bounded; none removes it at once. Once the restored container runs, a Restore gives it its
 * GPU data; its end is told by an Event on the pod, and a failure deletes the pod so that its
 * owner makes a new one, started cold.
 * Everything is read back from watches, so a new leader carries on where the old one was: the
 * process's shared mirrors (kube/agent_informer), each change queuing its owner's key on a work
 * queue (kube/agent_workq) whose worker looks at that owner's pods and Checkpoints alone. */
#include "agent_replace.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_ocidist.h"
#include "agent_informer.h"
#include "agent_ocireg.h"
#include "agent_phase.h"
#include "gcr_log.h"
#include "agent_workq.h"
#include "gcr_time.h"

#define API "/apis/gpucr.dev/v1alpha1"
/* Leadership is looked at this often (ms, the key TICK_KEY; no request): a new term queues every
 * owner. A failed write is tried again after RETRY_MS, doubling per owner to RETRY_MAX_MS. */
#define TICK_MS 500
#define TICK_KEY "r-tick"
#define RETRY_MS 500
#define RETRY_MAX_MS 8000
/* A Failed eviction Checkpoint younger than this, in seconds, is named in a cold start's Event. */
#define RECENT_FAILED_S 600

enum rkind { R_POD, R_CK, R_RS, RN };
/* The mirrors the gate follows too (one watch each in the process); of Checkpoints and Restores
 * only the eviction's are kept (the Restores are the ones this module labels so). */
static const char *const paths[RN] = { "/api/v1/pods", API "/checkpoints", API "/restores" };

struct agent_replace {
	struct agent_kube *kube;
	struct agent_leader *leader;
	struct agent_replace_cfg cfg;
	/* The shared mirrors (borrowed): "ns/name" -> what the worker needs of each object
	 * (slim_*), per rkind, under the mirrors' lock. */
	struct agent_informers *inf;
	struct agent_informer_sub *sub[RN];
	/* "o:ns/<owner uid>": that owner's pods and eviction Checkpoints; "p:ns/<pod>": a pod with
	 * no controller owner; TICK_KEY. */
	struct agent_workq *q;
	pthread_t worker;
	int worker_started;
	/* The worker's alone: pod uid -> monotonic ms first seen waiting (logged once) or restoring;
	 * the leadership last seen; what the key in hand asks for after it (a write to try again,
	 * a look again in next_ms, < 0 none). */
	json_t *since;
	int was_leader;
	unsigned terms;
	int retry;
	double next_ms;
};

static const char *sget(json_t *o, const char *k)
{
	return json_string_value(json_object_get(o, k));
}

/* The phase a Checkpoint's or Restore's entry keeps, decoded by slim_ck and slim_rs; NONE for
 * no entry. */
static enum agent_phase phase_of(json_t *e)
{
	return (enum agent_phase)json_integer_value(json_object_get(e, "phase"));
}

static const char *at(json_t *o, const char *a, const char *b)
{
	return json_string_value(json_object_get(json_object_get(o, a), b));
}

static const char *label(json_t *o, const char *k)
{
	return json_string_value(json_object_get(json_object_get(json_object_get(o, "metadata"), "labels"), k));
}

static const char *annotation(json_t *o, const char *k)
{
	return json_string_value(json_object_get(json_object_get(json_object_get(o, "metadata"), "annotations"), k));
}

/* Seconds since the epoch of an RFC 3339 UTC time; 0 when absent or malformed. */
static double epoch(const char *s)
{
	struct tm tm = { 0 };
	return s != NULL && strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) != NULL ? (double)timegm(&tm) : 0;
}

/* A label value naming name: at most 63 characters, ending alphanumeric. */
static void label_value(const char *name, char out[64])
{
	snprintf(out, 64, "%.63s", name);
	size_t n = strlen(out);
	while (n > 0 && !((out[n - 1] >= 'a' && out[n - 1] <= 'z') || (out[n - 1] >= '0' && out[n - 1] <= '9')))
		out[--n] = '\0';
}

static const char *controller_uid(json_t *pod)
{
	size_t i;
	json_t *o;
	json_array_foreach(json_object_get(json_object_get(pod, "metadata"), "ownerReferences"), i, o)
	{
		if (json_is_true(json_object_get(o, "controller")))
			return sget(o, "uid");
	}
	return NULL;
}

/* What a pass needs of a pod, NULL for a pod it has nothing to do with: one gated, one patched
 * by it (annotation restore-from), or one of an owner being deleted with the opt-in label (its
 * eviction Checkpoint may not exist yet: replacements wait for it). */
static json_t *slim_pod(json_t *p)
{
	json_t *spec = json_object_get(p, "spec"), *md = json_object_get(p, "metadata");
	int gate = -1;
	size_t i;
	json_t *g;
	json_array_foreach(json_object_get(spec, "schedulingGates"), i, g)
	{
		if (sget(g, "name") != NULL && strcmp(sget(g, "name"), AGENT_REPLACE_GATE) == 0)
			gate = (int)i;
	}
	const char *from = annotation(p, AGENT_REPLACE_ANN_FROM), *ev = label(p, AGENT_REPLACE_LABEL_EVICT);
	int deleting = json_object_get(md, "deletionTimestamp") != NULL;
	if (gate < 0 && from == NULL && !(deleting && ev != NULL))
		return NULL;
	json_t *names = json_array(), *running = json_object(), *waiting = json_object();
	json_array_foreach(json_object_get(spec, "containers"), i, g) json_array_append_new(names, json_string(sget(g, "name")));
	json_array_foreach(json_object_get(json_object_get(p, "status"), "containerStatuses"), i, g)
	{
		json_t *st = json_object_get(g, "state");
		const char *n = sget(g, "name");
		if (n == NULL)
			continue;
		if (json_object_get(st, "running") != NULL)
			json_object_set_new(running, n, json_real(epoch(at(st, "running", "startedAt"))));
		else if (at(st, "waiting", "reason") != NULL)
			json_object_set_new(waiting, n, json_string(at(st, "waiting", "reason")));
		else if (json_object_get(st, "terminated") != NULL)
			json_object_set_new(waiting, n, json_string("Terminated"));
	}
	json_t *sel = json_object_get(spec, "nodeSelector");
	return json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?, s:i, s:s?, s:b, s:b, s:f, s:o, s:o, s:o, s:b, s:s?, s:b}", "ns",
			 sget(md, "namespace"), "name", sget(md, "name"), "uid", sget(md, "uid"), "rv",
			 sget(md, "resourceVersion"), "owner", controller_uid(p), "gate", gate, "from", from, "deleting",
			 deleting, "evict", ev != NULL, "created", epoch(sget(md, "creationTimestamp")), "containers",
			 names, "running", running, "waiting", waiting, "has_sel", json_is_object(sel), "host",
			 sget(sel, "kubernetes.io/hostname"), "has_ann", json_is_object(json_object_get(md, "annotations")));
}

/* An eviction's object (agent_evict labels its Checkpoints, this module its Restores). */
static int eviction(json_t *o)
{
	const char *v = label(o, AGENT_OCIREG_LABEL_EVICTION);
	return v != NULL && strcmp(v, "true") == 0;
}

static json_t *slim_ck(json_t *c)
{
	json_t *md = json_object_get(c, "metadata"), *st = json_object_get(c, "status");
	return json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:i, s:s?, s:s?, s:s?, s:f, s:s?}", "ns",
			 sget(md, "namespace"), "name", sget(md, "name"), "rv", sget(md, "resourceVersion"), "owner",
			 label(c, AGENT_REPLACE_LABEL_OWNER), "into", label(c, AGENT_OCIREG_LABEL_RESTORED_INTO), "token",
			 annotation(c, AGENT_OCIREG_ANN_TOKEN), "container", at(c, "spec", "containerName"), "phase",
			 (int)agent_phase_of(sget(st, "phase")), "node", sget(st, "nodeName"), "path",
			 at(st, "image", "path"), "msg", sget(st, "message"), "created",
			 epoch(sget(md, "creationTimestamp")), "pod", at(c, "spec", "podName"));
}

static json_t *slim_rs(json_t *o)
{
	json_t *st = json_object_get(o, "status");
	return json_pack("{s:s?, s:s?, s:i, s:s?, s:f}", "ck", at(o, "spec", "checkpointName"), "pod",
			 at(o, "spec", "podName"), "phase", (int)agent_phase_of(sget(st, "phase")), "msg",
			 sget(st, "message"), "done", epoch(sget(st, "completionTime")));
}

static json_t *slim_p(json_t *o, void *data)
{
	(void)data;
	return slim_pod(o);
}

static json_t *slim_c(json_t *o, void *data)
{
	(void)data;
	return eviction(o) ? slim_ck(o) : NULL;
}

static json_t *slim_r(json_t *o, void *data)
{
	(void)data;
	return eviction(o) ? slim_rs(o) : NULL;
}

/* ---- keys ---- */

static void enqueue(struct agent_replace *r, const char *key)
{
	if (agent_workq_add(r->q, key) < 0)
		GCR_LOG(GCR_LOG_WARN, "replace", "%.300s: not queued (out of memory, or too long a name)", key);
}

/* The key of a pod's view (its owner's, or its own without one) into out; 0, or -EINVAL. */
static int pod_key(json_t *p, char *out, size_t len)
{
	const char *ns = sget(p, "ns"), *owner = sget(p, "owner"), *name = sget(p, "name");
	if (ns == NULL || (owner == NULL && name == NULL))
		return -EINVAL;
	snprintf(out, len, "%c:%s/%s", owner ? 'o' : 'p', ns, owner ? owner : name);
	return 0;
}

/* The owner key of an eviction Checkpoint's view; -EINVAL without an owner label (no pod of
 * any owner can take it). */
static int ck_key(json_t *c, char *out, size_t len)
{
	const char *ns = sget(c, "ns"), *owner = sget(c, "owner");
	if (ns == NULL || owner == NULL)
		return -EINVAL;
	snprintf(out, len, "o:%s/%s", ns, owner);
	return 0;
}

/* Every owner queued (under the mirrors' lock): after a list, and for a new term. */
static void enqueue_all_locked(struct agent_replace *r)
{
	const char *k;
	json_t *v;
	char key[AGENT_WORKQ_KEY_MAX];
	for (void *it = agent_informer_next_locked(r->sub[R_POD], NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(r->sub[R_POD], it, &k, &v))
		if (pod_key(v, key, sizeof(key)) == 0)
			enqueue(r, key);
	for (void *it = agent_informer_next_locked(r->sub[R_CK], NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(r->sub[R_CK], it, &k, &v))
		if (ck_key(v, key, sizeof(key)) == 0)
			enqueue(r, key);
}

/* The mirrors' hooks, under their lock: a change queues its owner (a Restore's through its
 * Checkpoint, which has its name). */
static void changed_pod(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_replace *r = data;
	char qk[AGENT_WORKQ_KEY_MAX];
	if (key == NULL)
		enqueue_all_locked(r);
	else if (pod_key(cur != NULL ? cur : old, qk, sizeof(qk)) == 0)
		enqueue(r, qk);
}

static void changed_ck(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_replace *r = data;
	char qk[AGENT_WORKQ_KEY_MAX];
	if (key == NULL)
		enqueue_all_locked(r);
	else if (ck_key(cur != NULL ? cur : old, qk, sizeof(qk)) == 0)
		enqueue(r, qk);
}

static void changed_rs(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_replace *r = data;
	char qk[AGENT_WORKQ_KEY_MAX];
	(void)old, (void)cur;
	if (key == NULL)
		enqueue_all_locked(r);
	else if (ck_key(agent_informer_get_locked(r->sub[R_CK], key), qk, sizeof(qk)) == 0)
		enqueue(r, qk);
}

/* ---- writes (the leader's) ---- */

/* A request with a JSON body (stolen); 0 with *st, or -errno. Refused once no longer the leader. */
static int api(struct agent_replace *r, const char *method, const char *path, const char *ctype, json_t *body,
	       long *st, struct gcr_err *err)
{
	if (!agent_leader_is_leader(r->leader)) {
		json_decref(body);
		return gcr_err_set(err, -EPERM, "no longer the leader");
	}
	char *text = body != NULL ? json_dumps(body, JSON_COMPACT) : NULL;
	json_decref(body);
	if (body != NULL && text == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = agent_kube_request(r->kube, method, path, ctype, text, st, NULL, err);
	free(text);
	if (rc == 0 && *st >= 300)
		rc = gcr_err_set(err, *st == 409 || *st == 422 ? -EAGAIN : *st == 404 ? -ENOENT : -EIO, "HTTP %ld", *st);
	return rc;
}

static void pod_event(struct agent_replace *r, json_t *p, const char *type, const char *reason, const char *note)
{
	json_t *obj = json_pack("{s:s, s:s, s:{s:s?, s:s?, s:s?}}", "apiVersion", "v1", "kind", "Pod", "metadata",
				"namespace", sget(p, "ns"), "name", sget(p, "name"), "uid", sget(p, "uid"));
	struct gcr_err err;
	if (obj == NULL || agent_kube_event(r->kube, obj, type, reason, "Restore", note,
					    agent_leader_identity(r->leader), &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "replace", "pod %s/%s: Event %s not written: %s", sget(p, "ns"), sget(p, "name"),
			reason, obj ? err.msg : "out of memory");
	json_decref(obj);
	GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: %s: %s", sget(p, "ns"), sget(p, "name"), reason, note);
}

/* JSON patch of the pod p as the watch last saw it (the resourceVersion tested: a pod changed
 * since is compared again next pass). ops: the operations after the test (stolen). */
static int patch_pod(struct agent_replace *r, json_t *p, json_t *ops, struct gcr_err *err)
{
	char path[700];
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", sget(p, "ns"), sget(p, "name"));
	json_t *all = json_pack("[{s:s, s:s, s:s?}]", "op", "test", "path", "/metadata/resourceVersion", "value",
				sget(p, "rv"));
	if (all == NULL || json_array_extend(all, ops) < 0) {
		json_decref(all);
		json_decref(ops);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	json_decref(ops);
	long st = 0;
	return api(r, "PATCH", path, "application/json-patch+json", all, &st, err);
}

static json_t *remove_gate_op(json_t *p)
{
	char gp[64];
	snprintf(gp, sizeof(gp), "/spec/schedulingGates/%d", (int)json_integer_value(json_object_get(p, "gate")));
	return json_pack("{s:s, s:s}", "op", "remove", "path", gp);
}

/* The gate removed with nothing else changed: the pod starts as without GCR, and says why. */
static void start_cold(struct agent_replace *r, json_t *p, const char *type, const char *why)
{
	struct gcr_err err;
	if (patch_pod(r, p, json_pack("[o]", remove_gate_op(p)), &err) < 0) {
		GCR_LOG(err.code == -EAGAIN ? GCR_LOG_DEBUG : GCR_LOG_WARN, "replace",
			"pod %s/%s: gate not removed (%s); tried again", sget(p, "ns"), sget(p, "name"), err.msg);
		r->retry = 1;
		return;
	}
	char note[1024];
	snprintf(note, sizeof(note), "started cold: %s", why);
	pod_event(r, p, type, "StartedCold", note);
}

/* Merge patch of a Checkpoint's metadata (patch stolen) carrying rv when given, so that two
 * replacements never take one image. */
static int patch_ck(struct agent_replace *r, const char *ns, const char *name, json_t *md, struct gcr_err *err)
{
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/checkpoints/%s", ns, name);
	long st = 0;
	json_t *body = md != NULL ? json_pack("{s:o}", "metadata", md) : NULL;
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	return api(r, "PATCH", path, "application/merge-patch+json", body, &st, err);
}

/* The container of p the image restores: the Checkpoint's, else p's only one. */
static const char *target_container(json_t *p, json_t *ck, int *index)
{
	json_t *names = json_object_get(p, "containers");
	const char *want = sget(ck, "container");
	if (want == NULL && json_array_size(names) == 1)
		want = json_string_value(json_array_get(names, 0));
	size_t i;
	json_t *n;
	json_array_foreach(names, i, n)
	{
		if (want != NULL && json_string_value(n) != NULL && strcmp(json_string_value(n), want) == 0) {
			*index = (int)i;
			return want;
		}
	}
	return NULL;
}

/* Takes the image of ck for the gated pod p (ck already consumed by p: carries on). */
static void restore_into(struct agent_replace *r, json_t *p, json_t *ck)
{
	const char *ns = sget(p, "ns"), *name = sget(p, "name"), *ckname = sget(ck, "name"), *node = sget(ck, "node");
	char into[64], token[AGENT_OCIDIST_TOKEN_LEN + 1], why[700], ref[700];
	struct gcr_err err;
	int ci = -1;
	const char *container = target_container(p, ck, &ci);
	const char *host = sget(p, "host");
	if (container == NULL || node == NULL || (!r->cfg.images_shared && host != NULL && strcmp(host, node) != 0)) {
		if (container == NULL)
			snprintf(why, sizeof(why), "Checkpoint %s images container %s, which the pod lacks", ckname,
				 sget(ck, "container") ? sget(ck, "container") : "(unnamed, and the pod has several)");
		else
			snprintf(why, sizeof(why), "Checkpoint %s's image is on node %s, the pod's nodeSelector asks for %s",
				 ckname, node ? node : "(none)", host);
		start_cold(r, p, "Warning", why);
		return;
	}
	label_value(name, into);
	if (sget(ck, "into") == NULL) {
		if (agent_ocidist_token(token, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "replace", "pod %s/%s: no token (%s); tried again", ns, name, err.msg);
			r->retry = 1;
			return;
		}
		json_t *md = json_pack("{s:s?, s:{s:s}, s:{s:s, s:s}}", "resourceVersion", sget(ck, "rv"), "labels",
				       AGENT_OCIREG_LABEL_RESTORED_INTO, into, "annotations", AGENT_OCIREG_ANN_TOKEN, token,
				       AGENT_OCIREG_ANN_CONTAINER, container);
		if (patch_ck(r, ns, ckname, md, &err) < 0) {
			GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: Checkpoint %s not taken (%s); compared again", ns, name,
				ckname, err.msg);
			r->retry = 1;
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: Checkpoint %s taken (consumed)", ns, name, ckname);
	} else {
		snprintf(token, sizeof(token), "%s", sget(ck, "token"));
	}
	if (agent_ocidist_ref(r->cfg.registry_port, ns, ckname, token, ref, sizeof(ref)) < 0) {
		start_cold(r, p, "Warning", "the image reference is too long");
		return;
	}
	char ip[64];
	snprintf(ip, sizeof(ip), "/spec/containers/%d/image", ci);
	json_t *ops = json_pack("[o, {s:s, s:s, s:s}]", remove_gate_op(p), "op", "replace", "path", ip, "value", ref);
	/* Node-local images: only the image's node has it. Shared: the scheduler picks the node. */
	int has_sel = json_is_true(json_object_get(p, "has_sel"));
	if (!r->cfg.images_shared)
		json_array_append_new(ops, has_sel ? json_pack("{s:s, s:s, s:s}", "op", "add", "path",
							       "/spec/nodeSelector/kubernetes.io~1hostname", "value", node)
						   : json_pack("{s:s, s:s, s:{s:s}}", "op", "add", "path",
							       "/spec/nodeSelector", "value", "kubernetes.io/hostname", node));
	if (json_is_true(json_object_get(p, "has_ann")))
		json_array_append_new(ops, json_pack("{s:s, s:s, s:s}", "op", "add", "path",
						     "/metadata/annotations/gpucr.dev~1restore-from", "value", ckname));
	else
		json_array_append_new(ops, json_pack("{s:s, s:s, s:{s:s}}", "op", "add", "path", "/metadata/annotations",
						     "value", AGENT_REPLACE_ANN_FROM, ckname));
	if (patch_pod(r, p, ops, &err) < 0) {
		GCR_LOG(err.code == -EAGAIN ? GCR_LOG_INFO : GCR_LOG_WARN, "replace",
			"pod %s/%s: not pointed at Checkpoint %s's image (%s); tried again", ns, name, ckname, err.msg);
		r->retry = 1;
		return;
	}
	GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: gate removed, container %s from Checkpoint %s's image on node %s",
		ns, name, container, ckname, node);
}

/* A pod held until a change of its objects, or ms at most: its key is looked at again then. */
static void hold(struct agent_replace *r, double ms)
{
	if (r->next_ms < 0 || ms < r->next_ms)
		r->next_ms = ms;
}

/* Milliseconds since the worker first saw pod uid in state what (kept per uid and state). */
static double waited_ms(struct agent_replace *r, const char *uid, const char *what, int *first)
{
	char key[200];
	snprintf(key, sizeof(key), "%s/%s", uid ? uid : "", what);
	double now = gcr_time_mono_ms();
	json_t *v = json_object_get(r->since, key);
	*first = v == NULL;
	if (v == NULL) {
		json_object_set_new(r->since, key, json_real(now));
		return 0;
	}
	return now - json_real_value(v);
}

static void gated(struct agent_replace *r, json_t *pods, json_t *cks, json_t *rss, json_t *p)
{
	const char *ns = sget(p, "ns"), *name = sget(p, "name"), *owner = sget(p, "owner");
	char into[64], why[900];
	if (owner == NULL) {
		start_cold(r, p, "Normal", "the pod has no controller owner, so no eviction image can be its");
		return;
	}
	label_value(name, into);
	json_t *best = NULL, *pending = NULL, *failed = NULL, *c;
	const char *k;
	double now = (double)time(NULL);
	json_object_foreach(cks, k, c)
	{
		const char *cns = sget(c, "ns"), *cown = sget(c, "owner"), *in = sget(c, "into");
		enum agent_phase ph = phase_of(c);
		if (cns == NULL || cown == NULL || strcmp(cns, ns) != 0 || strcmp(cown, owner) != 0)
			continue;
		if (in != NULL) { /* consumed; by this pod when a restart of this pass left it half done */
			if (strcmp(in, into) == 0 && sget(c, "token") != NULL && ph == AGENT_PHASE_SUCCEEDED)
				best = c;
			continue;
		}
		if (ph == AGENT_PHASE_NONE || ph == AGENT_PHASE_PENDING || ph == AGENT_PHASE_RUNNING)
			pending = c;
		else if (ph == AGENT_PHASE_FAILED && now - json_real_value(json_object_get(c, "created")) < RECENT_FAILED_S)
			failed = c;
		else if (ph == AGENT_PHASE_SUCCEEDED && sget(c, "path") != NULL && sget(c, "node") != NULL &&
			 (best == NULL || (sget(best, "into") == NULL && json_real_value(json_object_get(c, "created")) >
									 json_real_value(json_object_get(best, "created")))))
			best = c;
	}
	int first;
	if (best != NULL) {
		/* The evicted pod still ending (its grace period): its process would run beside the
		 * restored one, and CRIU's restore failed while it did (the stand-in driver's lock,
		 * measured on the test bed); on a GPU it would hold the memory the restore needs. */
		char ok[600];
		snprintf(ok, sizeof(ok), "%s/%s", ns, sget(best, "pod") ? sget(best, "pod") : "");
		json_t *old = json_object_get(pods, ok);
		double w;
		if (old != NULL && old != p && json_is_true(json_object_get(old, "deleting")) &&
		    (w = waited_ms(r, sget(p, "uid"), "evicted", &first)) < r->cfg.wait_s * 1000.0) {
			hold(r, r->cfg.wait_s * 1000.0 - w);
			if (first)
				GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: held until the evicted pod %s has ended (up to %d s)",
					ns, name, sget(best, "pod"), r->cfg.wait_s);
			return;
		}
		restore_into(r, p, best);
		return;
	}
	if (pending != NULL) {
		double age = now - json_real_value(json_object_get(pending, "created"));
		if (age < r->cfg.wait_s) {
			hold(r, (r->cfg.wait_s - age) * 1000.0);
			waited_ms(r, sget(p, "uid"), "pending", &first);
			if (first)
				GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: held for Checkpoint %s in progress (up to %d s)", ns,
					name, sget(pending, "name"), r->cfg.wait_s);
			return;
		}
		snprintf(why, sizeof(why), "eviction Checkpoint %s not finished after %d s", sget(pending, "name"),
			 r->cfg.wait_s);
		start_cold(r, p, "Warning", why);
		return;
	}
	/* A pod of the same owner opted in and being deleted: its Checkpoint may be moments away. Not
	 * one this module deletes itself: a replacement whose restore failed or never ran. */
	json_object_foreach(pods, k, c)
	{
		const char *o = sget(c, "owner"), *from = sget(c, "from");
		char rk[600];
		snprintf(rk, sizeof(rk), "%s/%s", ns, from ? from : "");
		json_t *rs = from ? json_object_get(rss, rk) : NULL;
		if (from != NULL && phase_of(rs) != AGENT_PHASE_SUCCEEDED)
			continue;
		if (c != p && json_is_true(json_object_get(c, "deleting")) && json_is_true(json_object_get(c, "evict")) &&
		    o != NULL && strcmp(o, owner) == 0 && sget(c, "ns") && strcmp(sget(c, "ns"), ns) == 0) {
			double w = waited_ms(r, sget(p, "uid"), "sibling", &first);
			if (w < r->cfg.wait_s * 1000.0) {
				hold(r, r->cfg.wait_s * 1000.0 - w);
				if (first)
					GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: held while pod %s of its owner is deleted "
						"(its eviction image may come; up to %d s)", ns, name, sget(c, "name"), r->cfg.wait_s);
				return;
			}
			snprintf(why, sizeof(why), "no eviction Checkpoint appeared for pod %s within %d s of its deletion",
				 sget(c, "name"), r->cfg.wait_s);
			start_cold(r, p, "Warning", why);
			return;
		}
	}
	if (failed != NULL) {
		snprintf(why, sizeof(why), "the eviction Checkpoint %s of its owner Failed: %.600s", sget(failed, "name"),
			 sget(failed, "msg") ? sget(failed, "msg") : "(no message)");
		start_cold(r, p, "Warning", why);
		return;
	}
	start_cold(r, p, "Normal", "no eviction image of its owner");
}

/* A pod pointed at an image: once its container runs (containerd restored it), the Restore. */
static void restoring(struct agent_replace *r, json_t *cks, json_t *rss, json_t *p)
{
	const char *ns = sget(p, "ns"), *name = sget(p, "name"), *from = sget(p, "from");
	char key[600], path[400];
	snprintf(key, sizeof(key), "%s/%s", ns, from);
	json_t *ck = json_object_get(cks, key);
	if (ck == NULL || sget(ck, "token") == NULL || json_object_get(rss, key) != NULL)
		return; /* not ours, finished, or its Restore made */
	int ci = -1, first;
	const char *container = target_container(p, ck, &ci);
	if (container != NULL && json_object_get(json_object_get(p, "running"), container) != NULL) {
		json_t *rs = json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s}}, s:{s:s, s:s}}", "apiVersion", "gpucr.dev/v1alpha1",
				       "kind", "Restore", "metadata", "name", from, "namespace", ns, "labels",
				       AGENT_OCIREG_LABEL_EVICTION, "true", "spec", "checkpointName", from, "podName", name);
		snprintf(path, sizeof(path), API "/namespaces/%s/restores", ns);
		long st = 0;
		struct gcr_err err;
		int rc = api(r, "POST", path, "application/json", rs, &st, &err);
		if (rc < 0 && err.code != -EAGAIN) { /* 409: made already, its event not seen yet */
			GCR_LOG(GCR_LOG_WARN, "replace", "pod %s/%s: Restore %s not created (%s); tried again", ns, name,
				from, err.msg);
			r->retry = 1;
		} else if (rc == 0)
			GCR_LOG(GCR_LOG_INFO, "replace", "pod %s/%s: restored container %s runs: Restore %s created", ns, name,
				container, from);
		return;
	}
	double w = waited_ms(r, sget(p, "uid"), "restoring", &first);
	const char *wr = container ? sget(json_object_get(p, "waiting"), container) : "no such container";
	if (w < r->cfg.wait_s * 1000.0) {
		hold(r, r->cfg.wait_s * 1000.0 - w);
		return;
	}
	/* Never ran from the image (pull refused, restore failed): a new pod of the owner starts cold. */
	char why[900], pp[700];
	snprintf(why, sizeof(why), "its container did not run from Checkpoint %s's image within %d s (%s): the pod is "
		 "deleted, so its owner makes a new one, started cold", from, r->cfg.wait_s, wr ? wr : "not started");
	snprintf(pp, sizeof(pp), "/api/v1/namespaces/%s/pods/%s", ns, name);
	long st = 0;
	struct gcr_err err;
	if (api(r, "DELETE", pp, NULL, NULL, &st, &err) < 0 && err.code != -ENOENT) {
		GCR_LOG(GCR_LOG_WARN, "replace", "pod %s/%s: not deleted (%s)", ns, name, err.msg);
		r->retry = 1;
		return;
	}
	pod_event(r, p, "Warning", "NotRestoredFromEviction", why);
	struct gcr_err e2;
	if (patch_ck(r, ns, from, json_pack("{s:{s:n}}", "annotations", AGENT_OCIREG_ANN_TOKEN), &e2) < 0)
		GCR_LOG(GCR_LOG_WARN, "replace", "Checkpoint %s/%s: token not withdrawn (%s)", ns, from, e2.msg);
}

/* A Restore of this module final: the Event on its pod, the token withdrawn (the registry serves
 * the image no more; it also marks this done), and after a failure the pod deleted. */
static void finished(struct agent_replace *r, json_t *pods, json_t *ck, json_t *rs)
{
	const char *ns = sget(ck, "ns"), *ckname = sget(ck, "name"), *pod = sget(rs, "pod");
	char key[600], note[1200], pp[700];
	snprintf(key, sizeof(key), "%s/%s", ns, pod ? pod : "");
	json_t *p = json_object_get(pods, key);
	json_t *dummy = p ? json_incref(p) : json_pack("{s:s, s:s?}", "ns", ns, "name", pod);
	struct gcr_err err;
	if (phase_of(rs) == AGENT_PHASE_SUCCEEDED) {
		double created = p ? json_real_value(json_object_get(p, "created")) : 0, ran = 0;
		const char *k;
		json_t *v;
		json_object_foreach(p ? json_object_get(p, "running") : NULL, k, v) ran = json_real_value(v);
		double done = json_real_value(json_object_get(rs, "done"));
		snprintf(note, sizeof(note), "restored from eviction Checkpoint %s (imaged %.0f s before the pod was "
			 "created): pod created to running %.0f s, to GPU data back %.0f s", ckname,
			 created - json_real_value(json_object_get(ck, "created")), ran > 0 ? ran - created : -1,
			 done > 0 ? done - created : -1);
		pod_event(r, dummy, "Normal", "RestoredFromEviction", note);
	} else {
		snprintf(pp, sizeof(pp), "/api/v1/namespaces/%s/pods/%s", ns, pod ? pod : "");
		long st = 0;
		int drc = pod ? api(r, "DELETE", pp, NULL, NULL, &st, &err) : 0;
		if (drc < 0 && err.code != -ENOENT) {
			GCR_LOG(GCR_LOG_WARN, "replace", "pod %s: not deleted after its failed Restore (%s)", key, err.msg);
			json_decref(dummy);
			r->retry = 1;
			return;
		}
		snprintf(note, sizeof(note), "not restored from eviction Checkpoint %s: Restore %s failed: %.700s; the pod "
			 "is deleted, so its owner makes a new one, started cold", ckname, ckname,
			 sget(rs, "msg") ? sget(rs, "msg") : "(no message)");
		pod_event(r, dummy, "Warning", "NotRestoredFromEviction", note);
	}
	json_decref(dummy);
	if (patch_ck(r, ns, ckname, json_pack("{s:{s:n}}", "annotations", AGENT_OCIREG_ANN_TOKEN), &err) < 0) {
		GCR_LOG(GCR_LOG_WARN, "replace", "Checkpoint %s/%s: token not withdrawn (%s); tried again", ns, ckname,
			err.msg);
		r->retry = 1;
	}
}

/* What one owner's key looks at, copied under the lock (the views shared, never changed): the
 * pods of key (an owner's, or the one pod without one), the eviction Checkpoints of that owner
 * and those the pods were pointed at, and their Restores. Waits of pods gone are forgotten. */
static int gather(struct agent_replace *r, const char *key, json_t *pods, json_t *cks, json_t *rss)
{
	const char *k;
	json_t *v;
	char vk[AGENT_WORKQ_KEY_MAX], ck[600];
	void *tmp;
	agent_informers_lock(r->inf);
	if (!agent_informer_synced_all_locked(r->sub, RN)) { /* the last list to come queues every owner */
		agent_informers_unlock(r->inf);
		return 0;
	}
	json_object_foreach_safe(r->since, tmp, k, v)
	{
		int live = 0;
		const char *pk;
		json_t *pv;
		for (void *it = agent_informer_next_locked(r->sub[R_POD], NULL, &pk, &pv); it != NULL && !live;
		     it = agent_informer_next_locked(r->sub[R_POD], it, &pk, &pv)) {
			const char *u = sget(pv, "uid");
			live = u != NULL && strncmp(k, u, strlen(u)) == 0 && k[strlen(u)] == '/';
		}
		if (!live)
			json_object_del(r->since, k);
	}
	for (void *it = agent_informer_next_locked(r->sub[R_POD], NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(r->sub[R_POD], it, &k, &v)) {
		if (pod_key(v, vk, sizeof(vk)) < 0 || strcmp(vk, key) != 0)
			continue;
		json_object_set(pods, k, v);
		if (sget(v, "from") != NULL) {
			snprintf(ck, sizeof(ck), "%s/%s", sget(v, "ns"), sget(v, "from"));
			json_t *c = agent_informer_get_locked(r->sub[R_CK], ck);
			if (c != NULL)
				json_object_set(cks, ck, c);
		}
	}
	for (void *it = agent_informer_next_locked(r->sub[R_CK], NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(r->sub[R_CK], it, &k, &v))
		if (ck_key(v, vk, sizeof(vk)) == 0 && strcmp(vk, key) == 0)
			json_object_set(cks, k, v);
	json_object_foreach(cks, k, v)
	{
		json_t *rs = agent_informer_get_locked(r->sub[R_RS], k); /* a Restore is named as its Checkpoint */
		if (rs != NULL)
			json_object_set(rss, k, rs);
	}
	agent_informers_unlock(r->inf);
	return 1;
}

/* One owner: its gated pods given an image (or started cold), its restored pods their Restore,
 * its finished Restores told. */
static void reconcile(struct agent_replace *r, json_t *pods, json_t *cks, json_t *rss)
{
	const char *k;
	json_t *p;
	json_object_foreach(pods, k, p)
	{
		if (json_is_true(json_object_get(p, "deleting")))
			continue;
		if (json_integer_value(json_object_get(p, "gate")) >= 0)
			gated(r, pods, cks, rss, p);
		else if (sget(p, "from") != NULL)
			restoring(r, cks, rss, p);
	}
	json_object_foreach(cks, k, p)
	{
		json_t *rs = json_object_get(rss, k);
		enum agent_phase ph = phase_of(rs);
		if (sget(p, "token") != NULL && (ph == AGENT_PHASE_SUCCEEDED || ph == AGENT_PHASE_FAILED))
			finished(r, pods, p, rs);
	}
}

/* The leadership tick: a term won (or leadership back) queues every owner, for what happened
 * while another replica led; keys taken while not leading were dropped. */
static void tick(struct agent_replace *r)
{
	int lead = agent_leader_is_leader(r->leader);
	unsigned terms = agent_leader_terms(r->leader);
	if (lead && (!r->was_leader || terms != r->terms)) {
		agent_informers_lock(r->inf);
		enqueue_all_locked(r);
		agent_informers_unlock(r->inf);
	}
	r->was_leader = lead;
	r->terms = terms;
	if (agent_workq_add_after(r->q, TICK_KEY, TICK_MS) < 0)
		GCR_LOG(GCR_LOG_ERROR, "replace", "out of memory: leadership no longer followed");
}

static void process(struct agent_replace *r, const char *key)
{
	if (strcmp(key, TICK_KEY) == 0) {
		tick(r);
		return;
	}
	if (!agent_leader_is_leader(r->leader))
		return;
	json_t *pods = json_object(), *cks = json_object(), *rss = json_object();
	r->retry = 0;
	r->next_ms = -1;
	if (pods != NULL && cks != NULL && rss != NULL && gather(r, key, pods, cks, rss))
		reconcile(r, pods, cks, rss);
	else if (pods == NULL || cks == NULL || rss == NULL)
		r->retry = 1; /* out of memory */
	json_decref(pods);
	json_decref(cks);
	json_decref(rss);
	if (r->retry) {
		if (agent_workq_backoff(r->q, key) < 0)
			GCR_LOG(GCR_LOG_WARN, "replace", "%.300s: no retry queued (out of memory)", key);
		return;
	}
	agent_workq_forget(r->q, key);
	/* Held for a bound (a Checkpoint in progress, a pod ending, a container to run): looked at
	 * again then, or sooner at a change of its objects. 50 ms past it: times have whole seconds. */
	if (r->next_ms >= 0 && agent_workq_add_after(r->q, key, (int)r->next_ms + 50) < 0)
		GCR_LOG(GCR_LOG_WARN, "replace", "%.300s: no look again queued (out of memory)", key);
}

static void *worker_main(void *data)
{
	struct agent_replace *r = data;
	char key[AGENT_WORKQ_KEY_MAX];
	while (agent_workq_get(r->q, key, sizeof(key)) == 1) {
		process(r, key);
		agent_workq_done(r->q, key);
	}
	return NULL;
}

int agent_replace_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		      const struct agent_replace_cfg *cfg, struct agent_replace **out, struct gcr_err *err)
{
	*out = NULL;
	if (cfg->registry_port <= 0 || cfg->registry_port > 65535 || cfg->wait_s <= 0)
		return gcr_err_set(err, -EINVAL, "replacement: registry port %d or wait %d s out of range",
				   cfg->registry_port, cfg->wait_s);
	struct agent_replace *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	r->kube = kube;
	r->inf = inf;
	r->leader = leader;
	r->cfg = *cfg;
	if ((r->since = json_object()) == NULL || (r->q = agent_workq_new(RETRY_MS, RETRY_MAX_MS)) == NULL) {
		agent_replace_free(r);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	const struct agent_informer_handler hs[RN] = {
		{ .slim = slim_p, .changed = changed_pod, .data = r },
		{ .slim = slim_c, .changed = changed_ck, .data = r },
		{ .slim = slim_r, .changed = changed_rs, .data = r },
	};
	int rc = agent_informers_subscribe_n(inf, paths, hs, RN, r->sub, err);
	if (rc < 0) {
		agent_replace_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

int agent_replace_start(struct agent_replace *r, struct gcr_err *err)
{
	if (agent_workq_add(r->q, TICK_KEY) < 0)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = pthread_create(&r->worker, NULL, worker_main, r);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the replacement worker: %s", strerror(rc));
	r->worker_started = 1;
	GCR_LOG(GCR_LOG_INFO, "replace", "pods gated %s are restored from their owner's eviction image (registry "
		"127.0.0.1:%d on the image's node; waits up to %d s)", AGENT_REPLACE_GATE, r->cfg.registry_port,
		r->cfg.wait_s);
	return 0;
}

void agent_replace_free(struct agent_replace *r)
{
	if (r == NULL)
		return;
	if (r->q != NULL)
		agent_workq_shutdown(r->q); /* the worker ends after the owner in hand */
	if (r->worker_started)
		pthread_join(r->worker, NULL);
	agent_workq_free(r->q);
	json_decref(r->since);
	free(r);
}
