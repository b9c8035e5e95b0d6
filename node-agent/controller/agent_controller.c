/* agent_controller: reconciles Checkpoint and Restore objects for pods on this node: caches
 * from three watches (the process's shared mirrors, kube/agent_informer: in role all the
 * Checkpoints' and Restores' watches are the scaler's roles' too), workers that take keys from
 * kube/agent_workq and run C/R through gcr_cr (different pods in parallel, one operation per
 * pod at a time). This file is
 * the dispatch (what a cache change queues, claims, workers) and
 * what every action shares (status, Events, processes, pods); each action has its agent_ctl_*.c.
 *
 * Users write these objects, status included, so status is only an output. What a suspend,
 * a recovery, a Restore or a deletion acts on comes from the node: the registry (peer
 * credentials, the cgroup's pod UID, the start time) and the agent's own record of each
 * Checkpoint (agent_record, root-only on the node), written before any process is touched. */
#include "config.h"

#include "agent_controller.h"
#include "agent_ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent_ckimage.h"
#include "agent_crobj.h"
#include "agent_lease.h"
#include "agent_phase.h"
#include "agent_record.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_scale.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"

/* Waiting work (a Restore whose Checkpoint is not finished, transient API errors) is retried
 * after this many ms, doubling per key up to RETRY_MAX_MS. */
#define RETRY_MS 2000
#define RETRY_MAX_MS 60000
/* A status write that did not land is tried again after 250 ms, doubling to 8 s, until it
 * lands or the object is gone: an API server restart takes seconds, and the object must not
 * stay Running once the process is suspended. */
#define STATUS_RETRY_FIRST_MS 250
#define STATUS_RETRY_MAX_MS 8000
/* Checkpoints with action Image: where, and how many per pod (agent_controller_cfg). */
#define DEFAULT_IMAGES_DIR "/var/lib/gcr/images"
#define DEFAULT_IMAGES_KEEP 2

/* The queue's key of the sweep, every SWEEP_MS and after each list: records whose Checkpoint is
 * gone (queued as "o:<uid>"), images whose Checkpoint is gone (agent_images_sweep). */
#define SWEEP_KEY "s:sweep"

/* ---- queue and caches ---- */

/* Queues key (agent_workq de-duplicates it, and holds one being processed for its done). */
static void enqueue(struct agent_controller *c, const char *key)
{
	if (agent_workq_add(c->q, key) < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "%.100s: not queued (out of memory, or too long a name)", key);
}

const char *agent_ctl_md_str(json_t *obj, const char *field)
{
	return json_string_value(json_object_get(json_object_get(obj, "metadata"), field));
}

const char *agent_ctl_status_str(json_t *obj, const char *field)
{
	return json_string_value(json_object_get(json_object_get(obj, "status"), field));
}

static const char *spec_str(json_t *obj, const char *field)
{
	return json_string_value(json_object_get(json_object_get(obj, "spec"), field));
}

/* Enqueues the work an object's change calls for: a Checkpoint or Restore, the
 * Restores waiting on a Checkpoint. Caller holds the lock. */
static void touch_locked(struct agent_controller *c, enum kind k, json_t *obj)
{
	const char *ns = agent_ctl_md_str(obj, "namespace"), *name = agent_ctl_md_str(obj, "name");
	char key[600];
	if (ns == NULL || name == NULL)
		return;
	if (k == K_POD) {
		pthread_cond_broadcast(&c->pod_changed);
		return;
	}
	snprintf(key, sizeof(key), "%c:%s/%s", k == K_CK ? 'c' : 'r', ns, name);
	enqueue(c, key);
	if (k == K_CK) { /* checkpoint_wait's waiters, and the Restores waiting on this Checkpoint */
		pthread_cond_broadcast(&c->ck_changed);
		const char *rk;
		json_t *r;
		for (void *it = agent_informer_next_locked(c->sub[K_RS], NULL, &rk, &r); it != NULL;
		     it = agent_informer_next_locked(c->sub[K_RS], it, &rk, &r)) {
			const char *rns = agent_ctl_md_str(r, "namespace"), *ck = spec_str(r, "checkpointName");
			if (rns && ck && strcmp(rns, ns) == 0 && strcmp(ck, name) == 0) {
				snprintf(key, sizeof(key), "r:%s", rk);
				enqueue(c, key);
			}
		}
	}
}

/* A Checkpoint or Restore another node's agent took (status.nodeName): this agent only has
 * to recognise it (phase, node, the pod or Checkpoint it names, the message a waiting
 * Restore quotes, whether it is being deleted; an Image's action and CPU side, which a Restore
 * into a pod here needs when the images are shared), so the rest (processes, conditions, managed
 * fields) is not kept: a node's memory does not grow with the whole cluster's requests.
 * Status is the user's to write too: whatever this agent did to an object is in its record,
 * which never depends on what is kept here. Stolen. */
static json_t *slim(struct agent_controller *c, enum kind k, json_t *obj)
{
	const char *node = agent_ctl_status_str(obj, "nodeName");
	if (k == K_POD || node == NULL || strcmp(node, c->node) == 0)
		return obj;
	json_t *md = json_object_get(obj, "metadata"), *spec = json_object_get(obj, "spec"),
	       *st = json_object_get(obj, "status");
	json_t *s = json_pack("{s:O*, s:O*, s:{s:O*, s:O*, s:O*, s:O*, s:O*, s:O*}, s:{s:O*, s:O*, s:O*, s:O*}, s:{s:O*, s:O*, s:O*, s:O*}}",
			      "apiVersion", json_object_get(obj, "apiVersion"), "kind", json_object_get(obj, "kind"),
			      "metadata", "namespace", json_object_get(md, "namespace"), "name",
			      json_object_get(md, "name"), "uid", json_object_get(md, "uid"), "resourceVersion",
			      json_object_get(md, "resourceVersion"), "deletionTimestamp",
			      json_object_get(md, "deletionTimestamp"), "finalizers", json_object_get(md, "finalizers"),
			      "spec", "podName", json_object_get(spec, "podName"), "checkpointName",
			      json_object_get(spec, "checkpointName"), "action", json_object_get(spec, "action"),
			      "cpuCheckpoint", json_object_get(spec, "cpuCheckpoint"), "status", "phase", json_object_get(st, "phase"),
			      "nodeName", json_object_get(st, "nodeName"), "podName", json_object_get(st, "podName"),
			      "message", json_object_get(st, "message"));
	if (s == NULL)
		return obj; /* out of memory: keep it whole rather than lose it */
	json_decref(obj);
	return s;
}

/* The controller's view of obj (agent_informer's slim, without the lock; obj is the watch's,
 * borrowed): a copy of its own, reduced for another node's objects. */
static json_t *om_slim(enum kind k, json_t *obj, void *data)
{
	json_t *copy = json_deep_copy(obj);
	return copy != NULL ? slim(data, k, copy) : NULL;
}

static json_t *om_slim_pod(json_t *obj, void *data)
{
	return om_slim(K_POD, obj, data);
}

static json_t *om_slim_ck(json_t *obj, void *data)
{
	return om_slim(K_CK, obj, data);
}

static json_t *om_slim_rs(json_t *obj, void *data)
{
	return om_slim(K_RS, obj, data);
}

/* Under the lock, a cache changed (agent_informer's hook of the controller's own views): the
 * work it calls for is queued; a deleted object's uid is forgotten; once all three are listed
 * the workers start, and after each list the records whose Checkpoint is gone are looked for in
 * it. */
static void om_changed(enum kind k, const char *key, json_t *old, json_t *cur, struct agent_controller *c)
{
	if (key == NULL) {
		const char *kk;
		json_t *v;
		for (void *it = agent_informer_next_locked(c->sub[k], NULL, &kk, &v); it != NULL;
		     it = agent_informer_next_locked(c->sub[k], it, &kk, &v))
			touch_locked(c, k, v);
		if (agent_ctl_synced_locked(c)) {
			enqueue(c, SWEEP_KEY);
			pthread_cond_broadcast(&c->cond);
			agent_metrics_set_ready(c->metrics);
		}
		return;
	}
	if (cur == NULL && agent_ctl_md_str(old, "uid") != NULL) {
		json_object_del(c->done, agent_ctl_md_str(old, "uid")); /* a uid is never reused */
		json_object_del(c->first_seen, agent_ctl_md_str(old, "uid"));
	}
	touch_locked(c, k, cur != NULL ? cur : old);
}

static void om_changed_pod(const char *key, json_t *old, json_t *cur, void *data)
{
	om_changed(K_POD, key, old, cur, data);
}

static void om_changed_ck(const char *key, json_t *old, json_t *cur, void *data)
{
	om_changed(K_CK, key, old, cur, data);
}

static void om_changed_rs(const char *key, json_t *old, json_t *cur, void *data)
{
	om_changed(K_RS, key, old, cur, data);
}

json_t *agent_ctl_cached_locked(struct agent_controller *c, enum kind k, const char *key)
{
	return agent_informer_get_locked(c->sub[k], key);
}

int agent_ctl_synced_locked(struct agent_controller *c)
{
	return agent_informer_synced_all_locked(c->sub, NK);
}

/* A deep copy of a cached object, or NULL. */
json_t *agent_ctl_cache_get(struct agent_controller *c, enum kind k, const char *ns, const char *name)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	agent_informers_lock(c->inf);
	json_t *o = json_deep_copy(agent_ctl_cached_locked(c, k, key));
	agent_informers_unlock(c->inf);
	return o;
}

/* Whether the cache holds ns/name with this uid. */
int agent_ctl_cache_has_uid(struct agent_controller *c, enum kind k, const char *ns, const char *name, const char *uid)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	agent_informers_lock(c->inf);
	const char *u = agent_ctl_md_str(agent_ctl_cached_locked(c, k, key), "uid");
	int has = u != NULL && strcmp(u, uid) == 0;
	agent_informers_unlock(c->inf);
	return has;
}

void agent_ctl_mark_done(struct agent_controller *c, const char *uid)
{
	agent_informers_lock(c->inf);
	json_object_set_new(c->done, uid, json_true());
	agent_informers_unlock(c->inf);
}

int agent_ctl_is_done(struct agent_controller *c, const char *uid)
{
	agent_informers_lock(c->inf);
	int d = json_object_get(c->done, uid) != NULL;
	agent_informers_unlock(c->inf);
	return d;
}

/* Queues key again after a delay: ms, or (ms 0) RETRY_MS doubling per key up to RETRY_MAX_MS. */
void agent_ctl_retry_later(struct agent_controller *c, const char *key, int ms)
{
	int rc = ms == 0 ? agent_workq_backoff(c->q, key) : agent_workq_add_after(c->q, key, ms);
	if (rc < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "%.100s: no retry queued (out of memory, or too long a name)", key);
}

void agent_ctl_retry_reset(struct agent_controller *c, const char *key)
{
	agent_workq_forget(c->q, key);
}

int agent_ctl_retrying(struct agent_controller *c, const char *key)
{
	return agent_workq_backoff_ms(c->q, key) != 0;
}

/* Waits ms unless the agent is stopping; 1 if it is. */
int agent_ctl_nap(struct agent_controller *c, int ms)
{
	struct timespec dl;
	gcr_time_deadline(&dl, ms);
	agent_informers_lock(c->inf);
	int rc = 0;
	while (!atomic_load(&c->stop) && rc == 0)
		rc = agent_informers_wait_locked(c->inf, &c->cond, &dl);
	agent_informers_unlock(c->inf);
	return atomic_load(&c->stop) ? 1 : 0;
}

/* ---- status and events ---- */

static const char *action_of(const struct op *o)
{
	return o->kind == K_CK ? "Checkpoint" : "Restore";
}

static void op_path(struct op *o, const char *ns, const char *name)
{
	snprintf(o->path, sizeof(o->path), API "/namespaces/%s/%s/%s", ns, o->kind == K_CK ? "checkpoints" : "restores",
		 name);
}

/* A status: phase, message, the Complete condition, nodeName and the timestamps; extra
 * (stolen, may be NULL) adds fields. A new reference. */
json_t *agent_ctl_build_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
			       const char *message, json_t *extra)
{
	char now[40];
	agent_kube_time(now, sizeof(now), 0);
	int final = phase == AGENT_PHASE_SUCCEEDED || phase == AGENT_PHASE_FAILED;
	const char *cs = phase == AGENT_PHASE_SUCCEEDED ? "True" : phase == AGENT_PHASE_FAILED ? "False" : "Unknown";
	json_t *st = extra != NULL ? extra : json_object();
	json_object_set_new(st, "phase", json_string(agent_phase_name(phase)));
	json_object_set_new(st, "nodeName", json_string(c->node));
	json_object_set_new(st, "message", json_string(message));
	json_t *gen = json_object_get(json_object_get(o->obj, "metadata"), "generation");
	if (json_is_integer(gen))
		json_object_set(st, "observedGeneration", gen);
	const char *start = agent_ctl_status_str(o->obj, "startTime");
	json_object_set_new(st, "startTime", json_string(start != NULL && strlen(start) < 40 ? start : now));
	if (final)
		json_object_set_new(st, "completionTime", json_string(now));
	json_object_set_new(st, "conditions",
			    json_pack("[{s:s, s:s, s:s, s:s, s:s}]", "type", "Complete", "status", cs,
				      "lastTransitionTime", now, "reason", reason, "message", message));
	/* A Checkpoint's status says it is the agent's (the column SetByAgent): one it did not write
	 * is marked False (mark_forged). */
	if (o->kind == K_CK)
		json_array_append_new(json_object_get(st, "conditions"),
				      json_pack("{s:s, s:s, s:s, s:s, s:s}", "type", FORGED_TYPE, "status", "True",
						"lastTransitionTime", now, "reason", "WrittenByAgent", "message",
						"this status was written by the GCR agent of its node"));
	return st;
}

/* Merge-patches status st (borrowed) until it lands, the object is gone (-ENOENT), the API
 * server refuses it for good (-EINVAL: 422, e.g. a phase already final) or the agent stops
 * (-ECANCELED). Without a resourceVersion a merge patch never conflicts: only this node's
 * agent writes these fields (a user who writes them only misleads themself). */
int agent_ctl_write_status(struct agent_controller *c, struct op *o, json_t *st)
{
	json_t *patch = json_pack("{s:O}", "status", st);
	const char *phase = json_string_value(json_object_get(st, "phase"));
	int delay = STATUS_RETRY_FIRST_MS, rc;
	for (;;) {
		struct gcr_err err;
		rc = patch ? agent_kube_patch_status(c->kube, o->path, patch, &err) : -ENOMEM;
		if (rc == 0 || rc == -ENOENT || rc == -EINVAL || rc == -ENOMEM) {
			if (rc < 0)
				GCR_LOG(GCR_LOG_WARN, "controller", "status write of %s %s/%s (%s) given up: %s",
					action_of(o), o->d.ns, o->d.name, phase, rc == -ENOMEM ? "out of memory" : err.msg);
			break;
		}
		GCR_LOG(GCR_LOG_WARN, "controller", "status write of %s %s/%s (%s) failed: %s; retrying in %d ms",
			action_of(o), o->d.ns, o->d.name, phase, err.msg, delay);
		if (agent_ctl_nap(c, delay)) {
			rc = -ECANCELED;
			break;
		}
		delay = delay * 2 < STATUS_RETRY_MAX_MS ? delay * 2 : STATUS_RETRY_MAX_MS;
	}
	json_decref(patch);
	/* Remember that phase locally too, so that a later event of the older version does
	 * not look like work left over. */
	json_t *s = json_object_get(o->obj, "status");
	if (!json_is_object(s)) {
		s = json_object();
		json_object_set_new(o->obj, "status", s);
	}
	json_object_set(s, "phase", json_object_get(st, "phase"));
	json_object_set(s, "startTime", json_object_get(st, "startTime"));
	return rc;
}

int agent_ctl_set_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
			 const char *message, json_t *extra)
{
	json_t *st = agent_ctl_build_status(c, o, phase, reason, message, extra);
	int rc = agent_ctl_write_status(c, o, st);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "%s %s/%s: %s (%s) %s", action_of(o), o->d.ns, o->d.name,
			agent_phase_name(phase), reason, message);
	json_decref(st);
	return rc;
}

void agent_ctl_event(struct agent_controller *c, json_t *obj, const char *action, const char *type, const char *reason,
		     const char *note)
{
	struct gcr_err err;
	if (agent_kube_event(c->kube, obj, type, reason, action, note, c->instance, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "event %s: %s", reason, err.msg);
}

/* Final failure of an object this agent touched nothing for: phase Failed, a Warning Event,
 * metrics. */
void agent_ctl_fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	agent_ctl_set_status(c, o, AGENT_PHASE_FAILED, reason, msg, NULL);
	agent_ctl_event(c, o->obj, action_of(o), "Warning", reason, msg);
	agent_metrics_op(c->metrics, o->kind == K_CK ? "checkpoint" : "restore", 0, 0, 0);
	agent_ctl_mark_done(c, o->d.uid);
}

/* The test hook: GCR_AGENT_TEST_PAUSE=where pauses pause_s seconds there; =file:PATH reads
 * "where seconds" from PATH at each point (a test chooses the point, one agent serving every
 * case: PATH must be a file only root can write, as the record directory). */
void agent_ctl_test_pause(struct agent_controller *c, const char *where)
{
	int secs = c->pause_s;
	if (c->pause == NULL)
		return;
	if (strncmp(c->pause, "file:", 5) == 0) {
		char line[128], at[64];
		FILE *f = fopen(c->pause + 5, "re");
		int ok = f != NULL && fgets(line, sizeof(line), f) != NULL && sscanf(line, "%63s %d", at, &secs) >= 1 &&
			 strcmp(at, where) == 0;
		if (f != NULL)
			fclose(f);
		if (!ok)
			return;
	} else if (strcmp(c->pause, where) != 0) {
		return;
	}
	GCR_LOG(GCR_LOG_WARN, "controller", "test hook: pausing %d s at %s", secs, where);
	for (int i = 0; i < secs * 10 && !atomic_load(&c->stop); i++)
		usleep(100 * 1000);
}

static void image_pause(void *data, const char *where)
{
	agent_ctl_test_pause(data, where);
}

/* Saves r; a failure is logged (the status says what happened; a restart then finds the
 * record one step behind, which recovery handles). */
void agent_ctl_save(struct agent_controller *c, const struct agent_record *r)
{
	struct gcr_err err;
	if (agent_record_put(c->rec, r, &err) < 0)
		GCR_LOG(GCR_LOG_ERROR, "controller", "record of Checkpoint %s/%s (%s): %s", r->ns, r->name,
			agent_record_state_name(r->state), err.msg);
}

/* Adds or removes our finalizer on Checkpoint ns/name (uid): reads it fresh, then patches.
 * 0; -ENOENT when it is gone or another object now has that name; else an error to retry. */
int agent_ctl_ck_finalizer(struct agent_controller *c, const char *ns, const char *name, const char *uid, int add,
			   struct gcr_err *err)
{
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/checkpoints/%s", ns, name);
	int rc = -EAGAIN;
	for (int attempt = 0; attempt < 5 && rc == -EAGAIN; attempt++) {
		long st = 0;
		json_t *obj = NULL;
		rc = agent_kube_request(c->kube, "GET", path, NULL, NULL, &st, &obj, err);
		if (rc == 0 && st == 404)
			rc = gcr_err_set(err, -ENOENT, "Checkpoint %s/%s is gone", ns, name);
		else if (rc == 0 && st != 200)
			rc = gcr_err_set(err, -EIO, "GET Checkpoint %s/%s: HTTP %ld", ns, name, st);
		else if (rc == 0 && (agent_ctl_md_str(obj, "uid") == NULL || strcmp(agent_ctl_md_str(obj, "uid"), uid) != 0))
			rc = gcr_err_set(err, -ENOENT, "Checkpoint %s/%s is another object now", ns, name);
		else if (rc == 0)
			rc = agent_kube_set_finalizer(c->kube, path, obj, AGENT_CROBJ_FINALIZER, add, err);
		json_decref(obj);
	}
	if (rc == 0)
		GCR_LOG(GCR_LOG_DEBUG, "controller", "Checkpoint %s/%s: finalizer %s %s", ns, name, AGENT_CROBJ_FINALIZER,
			add ? "on" : "off");
	return rc;
}

/* ---- processes ---- */

/* A container status's ID without its "runtime://" scheme; NULL when absent. */
const char *agent_ctl_status_container_id(json_t *st)
{
	const char *id = json_string_value(json_object_get(st, "containerID"));
	const char *p = id ? strstr(id, "://") : NULL;
	return p ? p + 3 : id;
}

/* The pod.status.containerStatuses entry named cname, or whose container ID is cid. */
json_t *agent_ctl_container_status(json_t *pod, const char *cname, const char *cid)
{
	json_t *cs = json_object_get(json_object_get(pod, "status"), "containerStatuses");
	size_t i;
	json_t *st;
	json_array_foreach(cs, i, st)
	{
		const char *n = json_string_value(json_object_get(st, "name"));
		const char *id = agent_ctl_status_container_id(st);
		if (n == NULL || id == NULL)
			continue;
		if ((cname != NULL && strcmp(n, cname) == 0) || (cid != NULL && strcmp(id, cid) == 0))
			return st;
	}
	return NULL;
}

/* The container name of a container ID ("" when the pod does not list it or it is no name). */
void agent_ctl_container_name_of(json_t *pod, const char *cid, char *out, size_t len)
{
	json_t *st = agent_ctl_container_status(pod, NULL, cid);
	const char *n = st ? json_string_value(json_object_get(st, "name")) : NULL;
	snprintf(out, len, "%s", n && agent_crobj_is_label(n) ? n : "");
}

json_t *agent_ctl_procs_json(const struct proc *p, int n, const char *state)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_pack("{s:i, s:s, s:s}", "pid", (int)p[i].pid, "containerName",
						   p[i].container, "state", state));
	return a;
}

/* The processes of r that are still the ones recorded: registered with the registry, in the
 * recorded pod (its cgroup's pod UID) and with the recorded start time. Others (exited, or
 * a pid now someone else's) are never touched; *gone counts them. */
int agent_ctl_verified_procs(struct agent_controller *c, const struct agent_record *r, struct proc *out, int *gone)
{
	int n = 0;
	*gone = 0;
	for (int i = 0; i < r->n; i++) {
		struct agent_registry_proc rp;
		if (agent_registry_get(c->reg, r->p[i].pid, &rp) < 0 || strcmp(rp.pod_uid, r->pod_uid) != 0 ||
		    rp.start != r->p[i].start) {
			(*gone)++;
			continue;
		}
		out[n].pid = r->p[i].pid;
		snprintf(out[n].container, sizeof(out[n].container), "%s", r->p[i].container);
		n++;
	}
	return n;
}

enum gcr_cr_mode agent_ctl_mode_of(int keep_context)
{
	return keep_context ? GCR_CR_DATA_ONLY : GCR_CR_FULL;
}

const char *agent_ctl_mode_api_name(enum gcr_cr_mode m)
{
	return m == GCR_CR_DATA_ONLY ? "KeepContext" : "Full";
}

/* The process's real state, from its shim and the driver (gcr_cr_state), in the mode it was
 * suspended in. UNMANAGED and GONE (no shim answers) count as neither running nor suspended. */
enum gcr_cr_st agent_ctl_real_state(struct agent_controller *c, pid_t pid, enum gcr_cr_mode mode)
{
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode, .timeout_ms = 10000 };
	struct gcr_cr_proc_state ps;
	struct gcr_err err;
	if (gcr_cr_state(pid, &opts, &ps, &err) < 0)
		return GCR_CR_ST_GONE;
	GCR_LOG(GCR_LOG_INFO, "controller", "pid %d: %s (shim %s, driver %s)", (int)pid, gcr_cr_st_name(ps.state),
		ps.shim ? gcr_shimreply_st_name(ps.shim_st) : "-",
		ps.hip ? GCR_CR_DRIVER_NONE : ps.driver ? gcr_driver_state_name(ps.driver_st) : "-");
	return ps.state;
}

int agent_ctl_timeout_ms_of(const struct agent_crobj *d)
{
	return d != NULL && d->timeout_s > 0 ? d->timeout_s * 1000 : DEFAULT_TIMEOUT_MS;
}

/* Resumes every process of p that is not running (undo, a Restore, a deletion) in the mode
 * they were suspended in, all at once (gcr_scale_run: one thread per process). Returns 0 or
 * the first error, with its message in err. */
int agent_ctl_resume_all(struct agent_controller *c, const struct proc *p, int n, enum gcr_cr_mode mode,
			 int timeout_ms, const struct agent_crobj *rs, struct gcr_cr_result *sum, struct gcr_err *err)
{
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode, .timeout_ms = timeout_ms,
				    .call_ms = timeout_ms + GATE_SLACK_MS };
	if (rs != NULL) { /* a Restore: onto the GPUs it names, if any */
		opts.target_gpu = rs->target_gpu[0] != '\0' ? rs->target_gpu : NULL;
		opts.gpu_pairs = rs->pairs;
		opts.ngpu_pairs = rs->npairs;
	}
	struct gcr_scale_proc sp[MAX_PROCS];
	int k = 0;
	for (int i = 0; i < n && k < MAX_PROCS; i++)
		if (agent_ctl_real_state(c, p[i].pid, mode) != GCR_CR_ST_RUNNING)
			sp[k++] = (struct gcr_scale_proc){ .pid = p[i].pid, .action = GCR_SCALE_RESUME };
	int rc = gcr_scale_run(sp, (size_t)k, &opts, NULL), told = 0;
	for (int i = 0; i < k; i++) {
		if (sp[i].rc < 0 && !told++)
			gcr_err_set(err, sp[i].rc, "pid %d: %s", (int)sp[i].pid, sp[i].err.msg);
		if (sum != NULL && sp[i].rc == 0) {
			sum->ms_data += sp[i].r.ms_data;
			sum->ms_restore += sp[i].r.ms_restore;
			sum->ms_unlock += sp[i].r.ms_unlock;
			sum->bytes_moved += sp[i].r.bytes_moved;
		}
	}
	gcr_scale_procs_clear(sp, (size_t)k);
	return rc;
}

/* ---- pods ---- */

/* The pod on this node: from the cache, else straight from the API (the pod
 * watch may lag). NULL unless *where is POD_HERE; for POD_OTHER_NODE, node
 * (nlen bytes) gets the pod's node. */
json_t *agent_ctl_find_pod(struct agent_controller *c, const char *ns, const char *name, enum pod_where *where,
			   char *node, size_t nlen)
{
	*where = POD_HERE;
	node[0] = '\0';
	json_t *pod = agent_ctl_cache_get(c, K_POD, ns, name);
	if (pod != NULL)
		return pod;
	char path[700];
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", ns, name);
	long st = 0;
	struct gcr_err err;
	if (agent_kube_request(c->kube, "GET", path, NULL, NULL, &st, &pod, &err) < 0 ||
	    (st != 200 && st != 404)) {
		*where = POD_UNKNOWN;
		json_decref(pod);
		return NULL;
	}
	if (st == 404) {
		*where = POD_MISSING;
		json_decref(pod);
		return NULL;
	}
	const char *pn = json_string_value(json_object_get(json_object_get(pod, "spec"), "nodeName"));
	if (pn == NULL || pn[0] == '\0') {
		*where = POD_UNSCHEDULED;
		json_decref(pod);
		return NULL;
	}
	if (strcmp(pn, c->node) != 0) {
		*where = POD_OTHER_NODE;
		snprintf(node, nlen, "%s", pn);
		json_decref(pod);
		return NULL;
	}
	return pod;
}

/* A request for another node: that node's agent owns it while its heartbeat
 * Lease is live (this agent must not race it); with no live Lease nobody would
 * ever answer, so it fails here, touching nothing. Retried on API errors. */
void agent_ctl_other_node(struct agent_controller *c, struct op *o, const char *node, const char *what)
{
	struct gcr_err err;
	int live = agent_lease_node_live(c->kube, c->lease_ns, node, &err);
	if (live < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "%s %s/%s: node %s: %s; retrying", action_of(o), o->d.ns,
			o->d.name, node, err.msg);
		agent_ctl_retry_later(c, o->key, 0);
	} else if (live) {
		GCR_LOG(GCR_LOG_DEBUG, "controller", "%s %s/%s: %s on node %s, whose agent is live; left to it",
			action_of(o), o->d.ns, o->d.name, what, node);
	} else {
		agent_ctl_fail(c, o, "NoAgentOnNode",
			       "%s is on node %s, where no GCR agent is running (no live Lease %s/gcr-agent-%s); nothing was done",
			       what, node, c->lease_ns, node);
	}
}

/* ---- records whose Checkpoint is gone ---- */

/* Queues "o:<uid>" for each record whose Checkpoint the (complete) cache lacks. Caller
 * holds the lock. */
static void sweep_locked(struct agent_controller *c)
{
	json_t *list = agent_record_list(c->rec);
	size_t i;
	json_t *e;
	json_array_foreach(list, i, e)
	{
		char key[600], ckkey[600];
		snprintf(ckkey, sizeof(ckkey), "%s/%s", json_string_value(json_object_get(e, "ns")),
			 json_string_value(json_object_get(e, "name")));
		const char *uid = json_string_value(json_object_get(e, "uid"));
		const char *u = agent_ctl_md_str(agent_ctl_cached_locked(c, K_CK, ckkey), "uid");
		snprintf(key, sizeof(key), "o:%s", uid);
		if ((u == NULL || strcmp(u, uid) != 0) && !agent_workq_waiting(c->q, key))
			enqueue(c, key);
	}
	json_decref(list);
}

/* ---- worker ---- */

/* The pod an operation acts on, as "ns/pod" in out: a Checkpoint's spec.podName, a
 * Restore's Checkpoint's, a record's. A Restore whose Checkpoint cannot be read touches no
 * process (it fails or is retried): it gets a key of its own. */
static void pod_key(struct agent_controller *c, const char *key, char *out, size_t len)
{
	char ns[300], name[300];
	const char *slash = strchr(key + 2, '/');
	if (key[0] == 'o') {
		struct agent_record r;
		if (agent_record_get(c->rec, key + 2, &r) == 0)
			snprintf(out, len, "%s/%s", r.ns, r.pod);
		else
			snprintf(out, len, "%s", key);
		agent_record_clear(&r);
		return;
	}
	snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key - 2), key + 2);
	snprintf(name, sizeof(name), "%s", slash + 1);
	json_t *obj = agent_ctl_cache_get(c, key[0] == 'c' ? K_CK : K_RS, ns, name);
	const char *pod = key[0] == 'c' ? spec_str(obj, "podName") : NULL;
	json_t *ck = NULL;
	if (key[0] == 'r' && spec_str(obj, "checkpointName") != NULL) {
		int transient = 0;
		ck = agent_ctl_find_checkpoint(c, ns, spec_str(obj, "checkpointName"), &transient);
		pod = spec_str(ck, "podName");
	}
	if (pod != NULL)
		snprintf(out, len, "%s/%s", ns, pod);
	else
		snprintf(out, len, "%s/%s", ns, key); /* no pod is named so */
	json_decref(ck);
	json_decref(obj);
}

/* The namespace of a pod key ("ns/pod", or "ns/<key>" for an operation naming no pod). */
static void ns_of_pod_key(const char *pod, char *out, size_t len)
{
	const char *slash = strchr(pod, '/');
	snprintf(out, len, "%.*s", slash != NULL ? (int)(slash - pod) : (int)strlen(pod), pod);
}

/* Where a key waits for its namespace's share of the workers (agent_workq_park). */
static void share_place(const char *ns, char *out, size_t len)
{
	snprintf(out, len, "ns:%s", ns);
}

/* Takes pod for this worker, and a worker of its namespace's share: 1 taken; 0 when another
 * worker has the pod, or the namespace holds its whole share of the workers: key is then
 * deferred and queued again once that worker is done with the pod, or the namespace with one
 * of its operations. *told: the namespace's share refused this time, to be told (an Event on
 * the object, once a minute at most); msg (len bytes) says so. */
static int claim(struct agent_controller *c, const char *pod, const char *key, int *told, char *msg, size_t len)
{
	char ns[300], place[310];
	struct gcr_err err;
	*told = 0;
	ns_of_pod_key(pod, ns, sizeof(ns));
	share_place(ns, place, sizeof(place));
	/* Under the lock: a release (which unparks) cannot slip between a refusal and the park. */
	agent_informers_lock(c->inf);
	int got = agent_workq_claim(c->q, pod, key);
	if (got == 1 && c->workers_share != NULL && agent_share_take(c->workers_share, ns, key, told, &err) < 0) {
		agent_workq_release(c->q, pod); /* those parked on the pod try again, and park on the share */
		got = agent_workq_park(c->q, place, key);
		snprintf(msg, len, "waits for a worker: namespace %.63s runs %d operations at once on node %.100s, its share of the "
			 "node's %d (the other namespaces' operations go on); it runs when one of them ends", ns,
			 agent_share_limit(c->workers_share), c->node, agent_share_capacity(c->workers_share));
		GCR_LOG(GCR_LOG_INFO, "controller", "%s %s", key, msg);
	} else if (got == 0) {
		GCR_LOG(GCR_LOG_INFO, "controller", "%s waits: pod %s has an operation in flight", key, pod);
	}
	agent_informers_unlock(c->inf);
	if (got < 0) { /* out of memory, or too long a name: tried again later rather than lost */
		GCR_LOG(GCR_LOG_WARN, "controller", "%s: pod %s not claimed; retrying", key, pod);
		agent_ctl_retry_later(c, key, 0);
	}
	return got == 1;
}

static void release(struct agent_controller *c, const char *pod)
{
	char ns[300], place[310];
	ns_of_pod_key(pod, ns, sizeof(ns));
	share_place(ns, place, sizeof(place));
	agent_informers_lock(c->inf);
	agent_workq_release(c->q, pod);
	if (c->workers_share != NULL) {
		agent_share_give(c->workers_share, ns);
		agent_workq_unpark(c->q, place);
	}
	agent_informers_unlock(c->inf);
}

/* One queued key, under its pod's claim; the object is read (and decoded) under the claim:
 * a worker that held the pod may have changed it meanwhile. */
static void process(struct agent_controller *c, const char *key)
{
	char pod[700];
	if (strcmp(key, SWEEP_KEY) == 0) {
		agent_informers_lock(c->inf);
		sweep_locked(c);
		agent_informers_unlock(c->inf);
		agent_ctl_sweep_images(c);
		agent_workq_add_after(c->q, SWEEP_KEY, SWEEP_MS);
		return;
	}
	if (key[0] != 'o' && strchr(key + 2, '/') == NULL)
		return;
	pod_key(c, key, pod, sizeof(pod));
	int told = 0;
	char msg[512];
	if (!claim(c, pod, key, &told, msg, sizeof(msg))) {
		json_t *obj = NULL;
		if (told && key[0] != 'o' && strchr(key + 2, '/') != NULL) {
			char ns[300], name[300];
			const char *slash = strchr(key + 2, '/');
			snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key - 2), key + 2);
			snprintf(name, sizeof(name), "%s", slash + 1);
			obj = agent_ctl_cache_get(c, key[0] == 'c' ? K_CK : K_RS, ns, name);
		}
		if (obj != NULL) /* an API call: after the claim's lock */
			agent_ctl_event(c, obj, key[0] == 'c' ? "Checkpoint" : "Restore", "Warning", "WorkerShareUsed", msg);
		json_decref(obj);
		return;
	}
	if (key[0] == 'o') {
		agent_ctl_reconcile_orphan(c, key, key + 2);
		release(c, pod);
		return;
	}
	enum kind k = key[0] == 'c' ? K_CK : K_RS;
	char ns[300], name[300];
	const char *slash = strchr(key + 2, '/');
	snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key - 2), key + 2);
	snprintf(name, sizeof(name), "%s", slash + 1);
	struct op o = { .kind = k, .obj = agent_ctl_cache_get(c, k, ns, name), .key = key };
	struct gcr_err err;
	if (o.obj != NULL) {
		int rc = agent_crobj_decode(o.obj, k == K_CK ? AGENT_CROBJ_CHECKPOINT : AGENT_CROBJ_RESTORE, &o.d, &err);
		op_path(&o, ns, name);
		if (rc < 0 && o.d.uid[0] == '\0')
			GCR_LOG(GCR_LOG_WARN, "controller", "%s: %s; ignored", key, err.msg);
		else if (rc < 0 && !agent_ctl_is_done(c, o.d.uid) && o.d.phase != AGENT_PHASE_SUCCEEDED &&
			 o.d.phase != AGENT_PHASE_FAILED)
			agent_ctl_fail(c, &o, "InvalidSpec", "%s; nothing was done", err.msg);
		else if (rc == 0 && k == K_CK)
			agent_ctl_reconcile_checkpoint(c, &o);
		else if (rc == 0)
			agent_ctl_reconcile_restore(c, &o);
	}
	json_decref(o.obj);
	release(c, pod);
}

/* Once the three caches are listed (an object's work needs the others'), takes keys until the
 * queue is shut down; each key is with this worker alone until its done. */
static void *worker_main(void *data)
{
	struct agent_controller *c = data;
	agent_informers_lock(c->inf);
	while (!atomic_load(&c->stop) && !agent_ctl_synced_locked(c))
		agent_informers_wait_locked(c->inf, &c->cond, NULL);
	agent_informers_unlock(c->inf);
	char key[AGENT_WORKQ_KEY_MAX];
	while (!atomic_load(&c->stop) && agent_workq_get(c->q, key, sizeof(key)) == 1) {
		process(c, key);
		agent_workq_done(c->q, key);
	}
	return NULL;
}

/* ---- life cycle ---- */

int agent_controller_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_registry *reg,
			 struct agent_metrics *m, const struct agent_controller_cfg *cfg, struct agent_controller **out,
			 struct gcr_err *err)
{
	*out = NULL;
	struct agent_controller *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	c->inf = inf;
	pthread_cond_init(&c->cond, NULL);
	pthread_cond_init(&c->pod_changed, NULL);
	pthread_cond_init(&c->ck_changed, NULL);
	c->kube = kube;
	c->reg = reg;
	c->metrics = m;
	c->pause_s = cfg->pause_s;
	c->grace_ms = (cfg->restore_grace_s > 0 ? cfg->restore_grace_s : AGENT_CONTROLLER_GRACE_S) * 1000;
	c->node = strdup(cfg->node_name);
	c->lease_ns = strdup(cfg->lease_namespace ? cfg->lease_namespace : "gcr-system");
	c->socket_dir = strdup(cfg->socket_dir);
	c->images_dir = strdup(cfg->images_dir ? cfg->images_dir : DEFAULT_IMAGES_DIR);
	c->images_keep = cfg->images_keep > 0 ? cfg->images_keep : DEFAULT_IMAGES_KEEP;
	c->images_shared = cfg->images_shared != 0;
	c->kubelet_url = cfg->kubelet_url && cfg->kubelet_url[0] ? strdup(cfg->kubelet_url) : NULL;
	c->key_dir = cfg->images_key_dir && cfg->images_key_dir[0] ? strdup(cfg->images_key_dir) : NULL;
	c->registry_port = cfg->registry_port;
	c->pause = cfg->test_pause ? strdup(cfg->test_pause) : NULL;
	c->alloc_root = cfg->alloc_root ? strdup(cfg->alloc_root) : NULL;
	c->adopt = cfg->adopt;
	size_t qn = strlen(cfg->node_name) + 64;
	c->pod_query = malloc(qn);
	c->instance = malloc(qn);
	c->q = agent_workq_new(RETRY_MS, RETRY_MAX_MS);
	c->done = json_object();
	c->first_seen = json_object();
	c->workers_share = cfg->workers;
	c->nworkers = cfg->max_parallel > 0 ? cfg->max_parallel : DEFAULT_PARALLEL;
	if (c->nworkers > MAX_PARALLEL)
		c->nworkers = MAX_PARALLEL;
	if (c->node == NULL || c->q == NULL || c->lease_ns == NULL || c->socket_dir == NULL || c->images_dir == NULL ||
	    c->pod_query == NULL || c->instance == NULL || c->done == NULL || c->first_seen == NULL || (cfg->test_pause && c->pause == NULL) ||
	    (cfg->alloc_root && c->alloc_root == NULL)) {
		agent_controller_free(c);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	int rc = agent_record_store_new(cfg->record_dir, &c->rec, err);
	if (rc < 0) {
		agent_controller_free(c);
		return rc;
	}
	struct agent_ckimage_cfg icfg = { .kube = kube, .reg = reg, .rec = c->rec, .socket_dir = c->socket_dir,
					  .images_dir = c->images_dir, .proc_root = cfg->proc_root, .node = c->node,
					  .kubelet_url = c->kubelet_url, .checkpoints_dir = cfg->kubelet_checkpoints,
					  .key_dir = c->key_dir, .copy_bound = agent_ctl_copy_bound, .copy_bound_data = c,
					  .pause = image_pause, .pause_data = c };
	rc = agent_ckimage_new(&icfg, &c->img, err);
	if (rc < 0) {
		agent_controller_free(c);
		return rc;
	}
	snprintf(c->pod_query, qn, "fieldSelector=spec.nodeName%%3D%s", cfg->node_name);
	snprintf(c->instance, qn, "gcr-agent-%s", cfg->node_name);
	/* This node's pods (a mirror of their own: the query is the node's); every Checkpoint and
	 * Restore (a Restore's Checkpoint may be any node's: the mirrors every role of the process
	 * shares). */
	static const char *const paths[NK] = { [K_POD] = "/api/v1/pods", [K_CK] = API "/checkpoints",
					       [K_RS] = API "/restores" };
	const char *queries[NK] = { [K_POD] = c->pod_query };
	const struct agent_informer_handler hs[NK] = {
		[K_POD] = { .slim = om_slim_pod, .changed = om_changed_pod, .data = c },
		[K_CK] = { .slim = om_slim_ck, .changed = om_changed_ck, .data = c },
		[K_RS] = { .slim = om_slim_rs, .changed = om_changed_rs, .data = c },
	};
	for (int k = 0; k < NK; k++) {
		rc = agent_informers_subscribe(inf, paths[k], queries[k], &hs[k], &c->sub[k], err);
		if (rc < 0) {
			agent_controller_free(c);
			return rc;
		}
	}
	*out = c;
	return 0;
}

int agent_controller_start(struct agent_controller *c, struct gcr_err *err)
{
	for (int i = 0; i < c->nworkers; i++) {
		int rc = pthread_create(&c->workers[i], NULL, worker_main, c);
		if (rc != 0)
			return gcr_err_set(err, -rc, "cannot start a worker: %s", strerror(rc));
		c->workers_started++;
	}
	GCR_LOG(GCR_LOG_INFO, "controller", "%d workers: operations on different pods run in parallel",
		c->nworkers);
	return 0;
}

void agent_controller_stop(struct agent_controller *c)
{
	atomic_store(&c->stop, 1);
	agent_informers_lock(c->inf);
	pthread_cond_broadcast(&c->cond);
	pthread_cond_broadcast(&c->pod_changed);
	pthread_cond_broadcast(&c->ck_changed);
	agent_informers_unlock(c->inf);
	if (c->q != NULL)
		agent_workq_shutdown(c->q); /* a worker waiting for a key returns; one busy finishes first */
	for (int i = 0; i < c->workers_started; i++) /* each finishes its operation in flight */
		pthread_join(c->workers[i], NULL);
	c->workers_started = 0;
}

void agent_controller_free(struct agent_controller *c)
{
	if (c == NULL)
		return;
	agent_controller_stop(c);
	json_decref(c->done);
	json_decref(c->first_seen);
	agent_workq_free(c->q);
	agent_ckimage_free(c->img);
	agent_record_store_free(c->rec);
	pthread_cond_destroy(&c->cond);
	pthread_cond_destroy(&c->pod_changed);
	pthread_cond_destroy(&c->ck_changed);
	free(c->node);
	free(c->lease_ns);
	free(c->socket_dir);
	free(c->images_dir);
	free(c->kubelet_url);
	free(c->key_dir);
	free(c->alloc_root);
	free(c->pause);
	free(c->pod_query);
	free(c->instance);
	free(c);
}

json_t *agent_controller_pod_by_uid(struct agent_controller *c, const char *uid)
{
	json_t *found = NULL, *pod;
	const char *key;
	agent_informers_lock(c->inf);
	for (void *it = agent_informer_next_locked(c->sub[K_POD], NULL, &key, &pod); it != NULL;
	     it = agent_informer_next_locked(c->sub[K_POD], it, &key, &pod)) {
		const char *u = agent_ctl_md_str(pod, "uid");
		if (u != NULL && strcmp(u, uid) == 0) {
			found = json_deep_copy(pod);
			break;
		}
	}
	agent_informers_unlock(c->inf);
	return found;
}

void agent_controller_pod_event(struct agent_controller *c, const char *uid, const char *type, const char *reason,
				const char *action, const char *note)
{
	json_t *pod = agent_controller_pod_by_uid(c, uid);
	struct gcr_err err;
	if (pod == NULL)
		return;
	/* The watch's objects may lack these (a list's items do). */
	if (json_object_get(pod, "apiVersion") == NULL)
		json_object_set_new(pod, "apiVersion", json_string("v1"));
	if (json_object_get(pod, "kind") == NULL)
		json_object_set_new(pod, "kind", json_string("Pod"));
	if (agent_kube_event(c->kube, pod, type, reason, action, note, c->instance, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "event %s on pod %s not posted: %s", reason, uid, err.msg);
	json_decref(pod);
}

int agent_controller_checkpoint_wait(struct agent_controller *c, const char *ns, const char *name, double until_s,
				     atomic_int *stop, char *msg, size_t len)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	int seen = 0, rc = 0;
	agent_informers_lock(c->inf);
	for (;;) {
		json_t *ck = agent_ctl_cached_locked(c, K_CK, key);
		json_t *s = json_object_get(ck, "status");
		enum agent_phase ph = agent_phase_of(json_string_value(json_object_get(s, "phase")));
		if (ph == AGENT_PHASE_SUCCEEDED || ph == AGENT_PHASE_FAILED) {
			const char *m = json_string_value(json_object_get(s, "message"));
			const char *ip = json_string_value(json_object_get(json_object_get(s, "image"), "path"));
			rc = ph == AGENT_PHASE_SUCCEEDED;
			snprintf(msg, len, "%s", rc ? (ip != NULL ? ip : "") : (m != NULL ? m : "Failed, no message"));
			break;
		}
		/* Absent before it was first seen: its creation has not reached the cache yet. */
		if (ck == NULL && seen && agent_ctl_synced_locked(c)) {
			snprintf(msg, len, "the Checkpoint was deleted before it ended");
			break;
		}
		seen |= ck != NULL;
		if ((stop != NULL && atomic_load(stop)) || atomic_load(&c->stop)) {
			rc = -ECANCELED;
			break;
		}
		double left_ms = (until_s - gcr_time_wall_s()) * 1000; /* a wall-clock deadline */
		if (left_ms <= 0) {
			snprintf(msg, len, "not final when the grace period ended");
			break;
		}
		/* Woken by each Checkpoint change; at least once a second to notice *stop. */
		struct timespec dl;
		gcr_time_deadline(&dl, left_ms < 1000 ? (long)left_ms + 1 : 1000);
		agent_informers_wait_locked(c->inf, &c->ck_changed, &dl);
	}
	agent_informers_unlock(c->inf);
	return rc;
}
