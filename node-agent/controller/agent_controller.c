/* agent_controller: reconciles Checkpoint and Restore objects for pods on this node: caches
 * from three watches, workers that run C/R through gcr_cr (different pods in parallel, one
 * operation per pod at a time).
 *
 * Users write these objects, status included, so status is only an output. What a suspend,
 * a recovery, a Restore or a deletion acts on comes from the node: the registry (peer
 * credentials, the cgroup's pod UID, the start time) and the agent's own record of each
 * Checkpoint (agent_record, root-only on the node), written before any process is touched. */
#include "config.h"

#include "agent_controller.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_ckimage.h"
#include "agent_crobj.h"
#include "agent_images.h"
#include "agent_lease.h"
#include "agent_ociimg.h"
#include "agent_ocireg.h"
#include "agent_phase.h"
#include "agent_podspec.h"
#include "agent_quantity.h"
#include "agent_record.h"
#include "gcr_cr.h"
#include "gcr_image.h"
#include "gcr_imgcr.h"
#include "gcr_procns.h"
#include "gcr_log.h"
#include "gcr_nvml.h"
#include "gcr_scale.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"

#define API "/apis/gpucr.dev/v1alpha1"
#define MAX_PROCS AGENT_RECORD_MAX_PROCS
/* Default bound of one gate/driver-lock step in ms when the spec has no timeoutSeconds. */
#define DEFAULT_TIMEOUT_MS 60000
/* Waiting work (a Restore whose Checkpoint is not finished, transient API errors) is retried
 * after this many ms, doubling per key up to RETRY_MAX_MS. */
#define RETRY_MS 2000
#define RETRY_MAX_MS 60000
/* A status write that did not land is tried again after 250 ms, doubling to 8 s, until it
 * lands or the object is gone: an API server restart takes seconds, and the object must not
 * stay Running once the process is suspended. */
#define STATUS_RETRY_FIRST_MS 250
#define STATUS_RETRY_MAX_MS 8000
/* Longest wait for the scaler's process to mark a gated pod not ready before its suspend,
 * in ms: traffic should leave first, but a missing scaler must not stop the suspend. */
#define GATE_WAIT_MS 10000
/* A suspend or resume's wait for the shim's answer: the operation's timeout (the gate's and the
 * driver lock's bound) plus this (ms), for the copies after the gate closed. */
#define GATE_SLACK_MS 60000
/* A Restore refused for want of GPU memory (gcr_cr_resume's -ENOSPC: nothing touched) is
 * retried after 1 s, doubling to 30 s, for the Restore's timeoutSeconds or else this long
 * (ms): room usually comes back when a neighbour's job or request ends, within minutes. */
#define ROOM_RETRY_FIRST_MS 1000
#define ROOM_RETRY_MAX_MS 30000
#define ROOM_WAIT_DEFAULT_MS (15 * 60 * 1000)
/* Operations run at once by default, and at most (different pods only). */
#define DEFAULT_PARALLEL 4
#define MAX_PARALLEL 64
/* Checkpoints with action Image: where, and how many per pod (agent_controller_cfg). */
#define DEFAULT_IMAGES_DIR "/var/lib/gcr/images"
#define DEFAULT_IMAGES_KEEP 2
/* Records whose Checkpoint is gone, and images whose Checkpoint is gone, are looked for this
 * often (ms). */
#define SWEEP_MS 2000
/* What Images leave behind (in pods' directories, the kubelet's archives) is looked for this often
 * (ms): the sweep reads every allocation's directory. */
#define LEFTOVER_SWEEP_MS 10000
/* The condition that says whether a Checkpoint's status is the agent's (False, reason Forged:
 * a final phase someone else wrote, which the CRD keeps final). */
#define FORGED_TYPE "SetByAgent"
#define FORGED_REASON "Forged"

enum kind { K_POD, K_CK, K_RS, NK };
/* The queue's key of the images sweep (agent_images_sweep), one at a time. */
#define IMAGES_SWEEP_KEY "i:images"
static const char *const watch_paths[NK] = { "/api/v1/pods", API "/checkpoints", API "/restores" };

struct agent_controller;

struct watch {
	struct agent_controller *c;
	enum kind kind;
	pthread_t th;
	int started;
};

struct agent_controller {
	struct agent_kube *kube;
	struct agent_registry *reg;
	struct agent_metrics *metrics;
	struct agent_record_store *rec;
	struct agent_ckimage *img; /* the Image action (agent_ckimage) */
	char *node, *lease_ns, *socket_dir, *pause, *pod_query, *instance, *images_dir, *kubelet_url, *key_dir,
		*alloc_root;
	int pause_s, grace_ms, images_keep, images_shared, registry_port;
	struct agent_controller_adopt adopt;
	double last_leftovers; /* the last sweep of leftovers (monotonic ms) */
	atomic_int stop;
	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;
	pthread_cond_t pod_changed; /* a pod event arrived (wait_gate) */
	/* "ns/name" -> object: this node's pods (field selector); the Checkpoints and Restores
	 * not yet taken by a node, or taken by this one, whole; those another node took only as
	 * far as needed to recognise them (slim). */
	json_t *cache[NK];
	int listed[NK];
	json_t *queue;      /* array of "c:ns/name", "r:ns/name", "o:<record uid>", IMAGES_SWEEP_KEY */
	json_t *queued;     /* the same keys as a set */
	json_t *retry;      /* key -> when to queue it again (CLOCK_MONOTONIC ms) */
	json_t *backoff;    /* key -> its last retry delay (ms) */
	json_t *done;       /* metadata.uid of objects finished by this process (no record) */
	json_t *first_seen; /* Restore uid -> when it was first seen without its Checkpoint (ms) */
	double last_sweep;
	/* "ns/pod" of each pod a worker is acting on -> keys deferred until it is done, so
	 * that operations on one pod never overlap (its processes' state machine is one). */
	json_t *busy;
	/* Each namespace's share of the workers (cfg.workers); namespace -> keys waiting for it. */
	struct agent_share *workers_share;
	json_t *ns_waiting;
	struct watch w[NK];
	int nworkers;
	pthread_t workers[MAX_PARALLEL];
	int workers_started;
};

/* ---- queue and caches ---- */

static void enqueue_locked(struct agent_controller *c, const char *key)
{
	if (json_object_get(c->queued, key) != NULL)
		return;
	json_object_set_new(c->queued, key, json_true());
	json_array_append_new(c->queue, json_string(key));
	pthread_cond_signal(&c->cond); /* one idle worker takes it */
}

static const char *md_str(json_t *obj, const char *field)
{
	return json_string_value(json_object_get(json_object_get(obj, "metadata"), field));
}

static const char *status_str(json_t *obj, const char *field)
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
	const char *ns = md_str(obj, "namespace"), *name = md_str(obj, "name");
	char key[600];
	if (ns == NULL || name == NULL)
		return;
	if (k == K_POD) {
		pthread_cond_broadcast(&c->pod_changed);
		return;
	}
	snprintf(key, sizeof(key), "%c:%s/%s", k == K_CK ? 'c' : 'r', ns, name);
	enqueue_locked(c, key);
	if (k == K_CK) { /* Restores waiting on this Checkpoint */
		const char *rk;
		json_t *r;
		json_object_foreach(c->cache[K_RS], rk, r)
		{
			const char *rns = md_str(r, "namespace"), *ck = spec_str(r, "checkpointName");
			if (rns && ck && strcmp(rns, ns) == 0 && strcmp(ck, name) == 0) {
				snprintf(key, sizeof(key), "r:%s", rk);
				enqueue_locked(c, key);
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
	const char *node = status_str(obj, "nodeName");
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

static void on_list(json_t *items, void *data)
{
	struct watch *w = data;
	struct agent_controller *c = w->c;
	json_t *m = agent_kube_index(items);
	size_t i;
	json_t *it;
	const char *k;
	json_t *v;
	json_object_foreach(m, k, v) json_object_set_new(m, k, slim(c, w->kind, json_incref(v)));
	pthread_mutex_lock(&c->lock);
	json_decref(c->cache[w->kind]);
	c->cache[w->kind] = m;
	c->listed[w->kind] = 1;
	json_array_foreach(items, i, it) touch_locked(c, w->kind, it);
	c->last_sweep = 0; /* look for records whose Checkpoint is gone against the new list */
	int all = c->listed[K_POD] && c->listed[K_CK] && c->listed[K_RS];
	pthread_cond_signal(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (all)
		agent_metrics_set_ready(c->metrics);
}

static void on_event(const struct agent_watch_event *ev, void *data)
{
	struct watch *w = data;
	struct agent_controller *c = w->c;
	char key[600];
	if (agent_kube_obj_key(ev->object, key, sizeof(key)) < 0)
		return;
	pthread_mutex_lock(&c->lock);
	if (ev->type == AGENT_WATCH_DELETED && md_str(ev->object, "uid") != NULL) {
		json_object_del(c->done, md_str(ev->object, "uid")); /* a uid is never reused */
		json_object_del(c->first_seen, md_str(ev->object, "uid"));
	}
	if (ev->type == AGENT_WATCH_DELETED)
		json_object_del(c->cache[w->kind], key);
	else
		json_object_set_new(c->cache[w->kind], key, slim(c, w->kind, json_deep_copy(ev->object)));
	touch_locked(c, w->kind, ev->object);
	pthread_mutex_unlock(&c->lock);
}

static void *watch_main(void *data)
{
	struct watch *w = data;
	struct agent_kube_watch_ops ops = { .on_list = on_list, .on_event = on_event, .data = w };
	agent_kube_watch_loop(w->c->kube, watch_paths[w->kind], w->kind == K_POD ? w->c->pod_query : NULL,
			      &ops, &w->c->stop);
	return NULL;
}

/* A deep copy of a cached object, or NULL. */
static json_t *cache_get(struct agent_controller *c, enum kind k, const char *ns, const char *name)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	pthread_mutex_lock(&c->lock);
	json_t *o = json_deep_copy(json_object_get(c->cache[k], key));
	pthread_mutex_unlock(&c->lock);
	return o;
}

/* Whether the cache holds ns/name with this uid. */
static int cache_has_uid(struct agent_controller *c, enum kind k, const char *ns, const char *name, const char *uid)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	pthread_mutex_lock(&c->lock);
	const char *u = md_str(json_object_get(c->cache[k], key), "uid");
	int has = u != NULL && strcmp(u, uid) == 0;
	pthread_mutex_unlock(&c->lock);
	return has;
}

static void mark_done(struct agent_controller *c, const char *uid)
{
	pthread_mutex_lock(&c->lock);
	json_object_set_new(c->done, uid, json_true());
	pthread_mutex_unlock(&c->lock);
}

static int is_done(struct agent_controller *c, const char *uid)
{
	pthread_mutex_lock(&c->lock);
	int d = json_object_get(c->done, uid) != NULL;
	pthread_mutex_unlock(&c->lock);
	return d;
}

/* Queues key again after a delay: ms, or (ms 0) RETRY_MS doubling per key up to RETRY_MAX_MS. */
static void retry_later(struct agent_controller *c, const char *key, int ms)
{
	pthread_mutex_lock(&c->lock);
	if (ms == 0) {
		json_int_t last = json_integer_value(json_object_get(c->backoff, key));
		ms = last == 0 ? RETRY_MS : last * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : (int)last * 2;
		json_object_set_new(c->backoff, key, json_integer(ms));
	}
	json_object_set_new(c->retry, key, json_integer((json_int_t)(gcr_time_mono_ms() + ms)));
	pthread_mutex_unlock(&c->lock);
}

static void retry_reset(struct agent_controller *c, const char *key)
{
	pthread_mutex_lock(&c->lock);
	json_object_del(c->backoff, key);
	pthread_mutex_unlock(&c->lock);
}

/* Waits ms unless the agent is stopping; 1 if it is. */
static int nap(struct agent_controller *c, int ms)
{
	struct timespec dl;
	gcr_time_deadline(&dl, ms);
	pthread_mutex_lock(&c->lock);
	int rc = 0;
	while (!atomic_load(&c->stop) && rc == 0)
		rc = pthread_cond_timedwait(&c->cond, &c->lock, &dl);
	pthread_mutex_unlock(&c->lock);
	return atomic_load(&c->stop) ? 1 : 0;
}

/* ---- status and events ---- */

struct op {
	enum kind kind;
	json_t *obj; /* owned copy */
	struct agent_crobj d; /* obj decoded */
	const char *key;
	char path[700];
};

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
static json_t *build_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
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
	const char *start = status_str(o->obj, "startTime");
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
static int write_status(struct agent_controller *c, struct op *o, json_t *st)
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
		if (nap(c, delay)) {
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

static int set_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
		      const char *message, json_t *extra)
{
	json_t *st = build_status(c, o, phase, reason, message, extra);
	int rc = write_status(c, o, st);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "%s %s/%s: %s (%s) %s", action_of(o), o->d.ns, o->d.name,
			agent_phase_name(phase), reason, message);
	json_decref(st);
	return rc;
}

static void event(struct agent_controller *c, json_t *obj, const char *action, const char *type, const char *reason,
		  const char *note)
{
	struct gcr_err err;
	if (agent_kube_event(c->kube, obj, type, reason, action, note, c->instance, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "event %s: %s", reason, err.msg);
}

/* Final failure of an object this agent touched nothing for: phase Failed, a Warning Event,
 * metrics. */
static void fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	set_status(c, o, AGENT_PHASE_FAILED, reason, msg, NULL);
	event(c, o->obj, action_of(o), "Warning", reason, msg);
	agent_metrics_op(c->metrics, o->kind == K_CK ? "checkpoint" : "restore", 0, 0, 0);
	mark_done(c, o->d.uid);
}

/* The test hook: GCR_AGENT_TEST_PAUSE=where pauses pause_s seconds there; =file:PATH reads
 * "where seconds" from PATH at each point (a test chooses the point, one agent serving every
 * case: PATH must be a file only root can write, as the record directory). */
static void test_pause(struct agent_controller *c, const char *where)
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
	test_pause(data, where);
}

/* Saves r; a failure is logged (the status says what happened; a restart then finds the
 * record one step behind, which recovery handles). */
static void save(struct agent_controller *c, const struct agent_record *r)
{
	struct gcr_err err;
	if (agent_record_put(c->rec, r, &err) < 0)
		GCR_LOG(GCR_LOG_ERROR, "controller", "record of Checkpoint %s/%s (%s): %s", r->ns, r->name,
			agent_record_state_name(r->state), err.msg);
}

/* Adds or removes our finalizer on Checkpoint ns/name (uid): reads it fresh, then patches.
 * 0; -ENOENT when it is gone or another object now has that name; else an error to retry. */
static int ck_finalizer(struct agent_controller *c, const char *ns, const char *name, const char *uid, int add,
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
		else if (rc == 0 && (md_str(obj, "uid") == NULL || strcmp(md_str(obj, "uid"), uid) != 0))
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

struct proc {
	pid_t pid;
	char container[AGENT_CROBJ_NS_LEN];
};

/* A container status's ID without its "runtime://" scheme; NULL when absent. */
static const char *status_container_id(json_t *st)
{
	const char *id = json_string_value(json_object_get(st, "containerID"));
	const char *p = id ? strstr(id, "://") : NULL;
	return p ? p + 3 : id;
}

/* The pod.status.containerStatuses entry named cname, or whose container ID is cid. */
static json_t *container_status(json_t *pod, const char *cname, const char *cid)
{
	json_t *cs = json_object_get(json_object_get(pod, "status"), "containerStatuses");
	size_t i;
	json_t *st;
	json_array_foreach(cs, i, st)
	{
		const char *n = json_string_value(json_object_get(st, "name"));
		const char *id = status_container_id(st);
		if (n == NULL || id == NULL)
			continue;
		if ((cname != NULL && strcmp(n, cname) == 0) || (cid != NULL && strcmp(id, cid) == 0))
			return st;
	}
	return NULL;
}

/* The container name of a container ID ("" when the pod does not list it or it is no name). */
static void container_name_of(json_t *pod, const char *cid, char *out, size_t len)
{
	json_t *st = container_status(pod, NULL, cid);
	const char *n = st ? json_string_value(json_object_get(st, "name")) : NULL;
	snprintf(out, len, "%s", n && agent_crobj_is_label(n) ? n : "");
}

static json_t *procs_json(const struct proc *p, int n, const char *state)
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
static int verified_procs(struct agent_controller *c, const struct agent_record *r, struct proc *out, int *gone)
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

static enum gcr_cr_mode mode_of(int keep_context)
{
	return keep_context ? GCR_CR_DATA_ONLY : GCR_CR_FULL;
}

static const char *mode_api_name(enum gcr_cr_mode m)
{
	return m == GCR_CR_DATA_ONLY ? "KeepContext" : "Full";
}

/* The process's real state, from its shim and the driver (gcr_cr_state), in the mode it was
 * suspended in. UNMANAGED and GONE (no shim answers) count as neither running nor suspended. */
static enum gcr_cr_st real_state(struct agent_controller *c, pid_t pid, enum gcr_cr_mode mode)
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

static int timeout_ms_of(const struct agent_crobj *d)
{
	return d != NULL && d->timeout_s > 0 ? d->timeout_s * 1000 : DEFAULT_TIMEOUT_MS;
}

/* Resumes every process of p that is not running (undo, a Restore, a deletion) in the mode
 * they were suspended in, all at once (gcr_scale_run: one thread per process). Returns 0 or
 * the first error, with its message in err. */
static int resume_all(struct agent_controller *c, const struct proc *p, int n, enum gcr_cr_mode mode,
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
		if (real_state(c, p[i].pid, mode) != GCR_CR_ST_RUNNING)
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

enum pod_where { POD_HERE, POD_MISSING, POD_OTHER_NODE, POD_UNSCHEDULED, POD_UNKNOWN };

/* The pod on this node: from the cache, else straight from the API (the pod
 * watch may lag). NULL unless *where is POD_HERE; for POD_OTHER_NODE, node
 * (nlen bytes) gets the pod's node. */
static json_t *find_pod(struct agent_controller *c, const char *ns, const char *name, enum pod_where *where,
			char *node, size_t nlen)
{
	*where = POD_HERE;
	node[0] = '\0';
	json_t *pod = cache_get(c, K_POD, ns, name);
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
static void other_node(struct agent_controller *c, struct op *o, const char *node, const char *what)
{
	struct gcr_err err;
	int live = agent_lease_node_live(c->kube, c->lease_ns, node, &err);
	if (live < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "%s %s/%s: node %s: %s; retrying", action_of(o), o->d.ns,
			o->d.name, node, err.msg);
		retry_later(c, o->key, 0);
	} else if (live) {
		GCR_LOG(GCR_LOG_DEBUG, "controller", "%s %s/%s: %s on node %s, whose agent is live; left to it",
			action_of(o), o->d.ns, o->d.name, what, node);
	} else {
		fail(c, o, "NoAgentOnNode",
		     "%s is on node %s, where no GCR agent is running (no live Lease %s/gcr-agent-%s); nothing was done",
		     what, node, c->lease_ns, node);
	}
}

/* ---- readiness gate ---- */

/* A pod declaring the readiness gate is marked not ready by the scaler's process (agent_gate:
 * node agents may not write pods) as soon as its Checkpoint exists; the suspend waits for
 * that to reach this node's pod watch, bounded, so traffic leaves before the threads stop. */
static void wait_gate(struct agent_controller *c, const char *ns, const char *name, int bound_ms)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	struct timespec dl;
	int wait_ms = bound_ms > 0 && bound_ms < GATE_WAIT_MS ? bound_ms : GATE_WAIT_MS;
	gcr_time_deadline(&dl, wait_ms);
	pthread_mutex_lock(&c->lock);
	json_t *pod = json_object_get(c->cache[K_POD], key);
	int declared = agent_podspec_gate_declared(pod), rc = 0;
	while (declared && rc == 0 && !atomic_load(&c->stop)) {
		const char *st = agent_podspec_gate_status(json_object_get(c->cache[K_POD], key));
		if (st != NULL && strcmp(st, "False") == 0)
			break;
		rc = pthread_cond_timedwait(&c->pod_changed, &c->lock, &dl);
	}
	pthread_mutex_unlock(&c->lock);
	if (declared && rc != 0)
		GCR_LOG(GCR_LOG_WARN, "controller",
			"pod %s: %s still not False after %d ms (is the scaler running?); suspending anyway", key,
			AGENT_PODSPEC_GATE_TYPE, wait_ms);
}

/* ---- Checkpoint ---- */

/* The Checkpoint's final status goes into its record first, then to the API: a write lost to
 * an API fault or a restart is made again from the record (sync_checkpoint). */
static void finish_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r, int ok,
			      const char *reason, const char *note, json_t *extra, double ms_total,
			      long long bytes)
{
	json_t *st = build_status(c, o, ok ? AGENT_PHASE_SUCCEEDED : AGENT_PHASE_FAILED, reason, note, extra);
	agent_record_set_status(&r->ck_status, st);
	r->state = ok ? AGENT_REC_SUSPENDED : AGENT_REC_FAILED;
	save(c, r);
	if (write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s (%s) %s", o->d.ns, o->d.name,
			ok ? "Succeeded" : "Failed", reason, note);
	json_decref(st);
	event(c, o->obj, "Checkpoint", ok ? "Normal" : "Warning", reason, note);
	agent_metrics_op(c->metrics, "checkpoint", ok, ms_total, bytes);
	struct gcr_err err;
	if (!ok && ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT)
		retry_later(c, o->key, 0); /* sync_checkpoint takes it off */
}

/* Suspends the recorded processes all at once (gcr_scale_run, as gcrctl scale does) in the
 * recorded mode; on a failure resumes those this run suspended. */
/* Processes the overcommit policy holds suspended (for idling, or for another pod): their owner's
 * Checkpoint takes them over rather than failing "already suspended", and its Restore resumes
 * them (docs/preemption.md, "Taken over by a Checkpoint"). Only when the policy holds every one
 * of them in one mode (the record has one). 1: taken over and finished; 0: not held, nothing done. */
static int take_over(struct agent_controller *c, struct op *o, struct agent_record *r, const struct proc *p, int n)
{
	int mode = -1, d = 0, taken = 0, rc = 0;
	if (c->adopt.held == NULL || c->adopt.release == NULL)
		return 0;
	for (int i = 0; i < n; i++) {
		if (c->adopt.held(c->adopt.data, p[i].pid, r->p[i].start, &d) != 1 || (mode >= 0 && d != mode))
			return 0;
		mode = d;
	}
	struct gcr_err err = { 0 };
	for (; taken < n && rc == 0; taken += rc == 0)
		if ((rc = c->adopt.release(c->adopt.data, p[taken].pid, r->p[taken].start, &d, timeout_ms_of(&o->d))) < 0)
			gcr_err_set(&err, rc, "pid %d: %s", (int)p[taken].pid,
				    rc == -ETIMEDOUT ? "the overcommit policy did not give it up in time" : "no longer held");
	r->keep_context = mode;
	char note[1024];
	if (rc < 0 && taken == 0)
		return 0;
	if (rc < 0) {
		struct gcr_err e2;
		int urc = resume_all(c, p, taken, mode_of(mode), timeout_ms_of(&o->d), NULL, NULL, &e2);
		snprintf(note, sizeof(note), "taking over processes the overcommit policy held failed at %s; the %d taken "
			 "over were %s", err.msg, taken, urc == 0 ? "resumed" : "left suspended (resume failed)");
		finish_checkpoint(c, o, r, 0, "CheckpointFailed", note, NULL, 0, 0);
		return 1;
	}
	snprintf(note, sizeof(note), "%d process(es) already suspended by the overcommit policy%s: this Checkpoint holds "
		 "them now (the policy no longer resumes them); a Restore resumes them", n,
		 mode ? ", data only (CUDA context kept on the GPU)" : "");
	json_t *extra = json_pack("{s:o, s:s}", "processes", procs_json(p, n, "Checkpointed"), "mode",
				  mode_api_name(mode_of(mode)));
	finish_checkpoint(c, o, r, 1, "Checkpointed", note, extra, 0, 0);
	return 1;
}

static void run_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r, const struct proc *p,
			   int n)
{
	if (take_over(c, o, r, p, n))
		return;
	enum gcr_cr_mode mode = mode_of(r->keep_context);
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode, .timeout_ms = timeout_ms_of(&o->d),
				    .call_ms = timeout_ms_of(&o->d) + GATE_SLACK_MS };
	struct gcr_cr_result sum = { 0 };
	double t0 = gcr_time_mono_ms();
	test_pause(c, "before-cr");
	struct gcr_scale_proc sp[MAX_PROCS];
	for (int i = 0; i < n; i++)
		sp[i] = (struct gcr_scale_proc){ .pid = p[i].pid, .action = GCR_SCALE_SUSPEND };
	int rc = gcr_scale_run(sp, (size_t)n, &opts, NULL);
	char note[1024];
	if (rc < 0) {
		struct proc undo[MAX_PROCS];
		int nu = 0, bad = -1;
		for (int i = 0; i < n; i++) {
			if (sp[i].rc == 0)
				undo[nu++] = p[i];
			else if (bad < 0)
				bad = i;
		}
		struct gcr_err e2;
		int urc = nu > 0 ? resume_all(c, undo, nu, mode, opts.timeout_ms, NULL, NULL, &e2) : 0;
		snprintf(note, sizeof(note), "suspend of pid %d failed: %s%s%s", (int)sp[bad].pid, sp[bad].err.msg,
			 nu == 0 ? "" : urc == 0 ? "; processes already suspended were resumed" : "; undo failed: ",
			 nu > 0 && urc < 0 ? e2.msg : "");
		finish_checkpoint(c, o, r, 0, rc == -EALREADY ? "AlreadySuspended" : "CheckpointFailed", note, NULL,
				  gcr_time_mono_ms() - t0, 0);
		gcr_scale_procs_clear(sp, (size_t)n);
		return;
	}
	for (int i = 0; i < n; i++) {
		sum.ms_data += sp[i].r.ms_data;
		sum.ms_lock += sp[i].r.ms_lock;
		sum.ms_checkpoint += sp[i].r.ms_checkpoint;
		sum.bytes_moved += sp[i].r.bytes_moved;
	}
	gcr_scale_procs_clear(sp, (size_t)n);
	test_pause(c, "after-cr");
	double ms = gcr_time_mono_ms() - t0;
	snprintf(note, sizeof(note), "%d process(es) suspended, %lld bytes to host memory%s", n, sum.bytes_moved,
		 mode == GCR_CR_DATA_ONLY ? "; CUDA context kept on the GPU" : "");
	json_t *extra = json_pack("{s:o, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  procs_json(p, n, "Checkpointed"), "mode", mode_api_name(mode), "bytes", "vmm",
				  (json_int_t)sum.bytes_moved, "total", (json_int_t)sum.bytes_moved, "durations", "data",
				  (json_int_t)sum.ms_data, "lock", (json_int_t)sum.ms_lock, "checkpoint",
				  (json_int_t)sum.ms_checkpoint, "total", (json_int_t)ms);
	finish_checkpoint(c, o, r, 1, "Checkpointed", note, extra, ms, sum.bytes_moved);
}

/* The record says suspending: the finalizer, then status Running, then the suspend. */
static void start_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r, const struct proc *p,
			     int n)
{
	struct gcr_err err;
	int rc = ck_finalizer(c, r->ns, r->name, r->uid, 1, &err);
	if (rc == -ENOENT || rc == -EINVAL) { /* gone, or being deleted: never started */
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s; nothing was done", r->ns, r->name, err.msg);
		agent_record_del(c->rec, r->uid, &err);
		return;
	}
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: finalizer: %s; retrying", r->ns, r->name, err.msg);
		retry_later(c, o->key, 0);
		return;
	}
	char msg[256];
	enum gcr_cr_mode mode = mode_of(r->keep_context);
	snprintf(msg, sizeof(msg), "suspending %d process(es)%s", n,
		 mode == GCR_CR_DATA_ONLY ? ", keeping the CUDA context" : "");
	rc = set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
			json_pack("{s:o, s:s}", "processes", procs_json(p, n, "Running"), "mode", mode_api_name(mode)));
	if (rc == -ECANCELED)
		return; /* stopping: the record brings it back after the restart */
	if (rc < 0) { /* gone, or someone wrote a final phase: it is not run */
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: not run (its status cannot be written)", r->ns,
			r->name);
		if (ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) == 0 || err.code == -ENOENT)
			agent_record_del(c->rec, r->uid, &err);
		return;
	}
	wait_gate(c, r->ns, r->pod, timeout_ms_of(&o->d));
	run_checkpoint(c, o, r, p, n);
}

/* ---- Checkpoint with action Image (agent_ckimage runs it; here its record and statuses) ---- */

/* Whose images this node's retention removes (agent_images.h): on shared storage only its own;
 * node-local, every one in the directory (also those from before manifests named the node). */
static const char *images_owner(const struct agent_controller *c)
{
	return c->images_shared ? c->node : NULL;
}

/* The images key (shared storage): *keys loaded when the agent has a key directory; 0 when it
 * has none (*keys->n 0) or they loaded, else -errno with why. The caller clears them. */
static int load_keys(struct agent_controller *c, struct gcr_imagemac_keys *keys, struct gcr_err *err)
{
	memset(keys, 0, sizeof(*keys));
	return c->key_dir == NULL ? 0 : gcr_imagemac_load(c->key_dir, keys, err);
}

/* After an image of a pod committed at path: its pod directory keeps images.keep images.
 * Returns how many were removed (0 when pruning failed: logged, the image stands). */
static int image_prune(struct agent_controller *c, const struct agent_crobj *d, const char *path)
{
	char pod_dir[PATH_MAX];
	struct gcr_err err;
	snprintf(pod_dir, sizeof(pod_dir), "%s", path);
	char *slash = strrchr(pod_dir, '/');
	if (slash != NULL)
		*slash = '\0';
	int pruned = agent_images_prune(pod_dir, c->images_keep, images_owner(c), &err);
	if (pruned < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: pruning %s: %s", d->ns, d->name, pod_dir, err.msg);
	return pruned > 0 ? pruned : 0;
}

/* What a pod's process may make the agent copy into its image (agent_ckimage_cfg.copy_bound;
 * docs/install.md, "Input bounds"): the bytes it holds on the GPU now (NVML: the driver's count,
 * not the shim's word; a suspended process, or where NVML cannot say: every GPU's memory), and no
 * more than its container's ephemeral-storage limit when it has one, so that the copy counts
 * against the pod that made it. 0 with err: no bound. */
static unsigned long long copy_bound(void *data, const struct agent_record *r, int suspended, char *why, size_t len,
				     struct gcr_err *err)
{
	struct agent_controller *c = data;
	struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
	int k = 0;
	unsigned long long gpu = 0, limit = 0;
	if (!suspended && gcr_nvml_proc_use(r->p[0].pid, use, GCR_NVML_MAX_DEVICES, &k, err) == 0) {
		for (int i = 0; i < k; i++)
			gpu += use[i].bytes;
		snprintf(why, len, "%llu MiB on the GPU", gpu >> 20);
	} else {
		char gpus[GCR_NVML_MAX_DEVICES][GCR_NVML_UUID_LEN];
		int n = 0;
		if (!suspended)
			GCR_LOG(GCR_LOG_WARN, "controller", "pid %d: its GPU bytes unknown (%s); its image's files are "
				"bounded by the node's GPU memory", (int)r->p[0].pid, err->msg);
		for (int i = 0; gcr_nvml_gpus(gpus, GCR_NVML_MAX_DEVICES, &n, err) == 0 && i < n; i++) {
			unsigned long long fr = 0, total = 0;
			if (gcr_nvml_mem(gpus[i], &fr, &total, err) == 0)
				gpu += total;
		}
		snprintf(why, len, "%llu MiB: the node's GPU memory", gpu >> 20);
	}
	json_t *pod = cache_get(c, K_POD, r->ns, r->pod), *ct;
	size_t i;
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "containers"), i, ct) {
		const char *name = json_string_value(json_object_get(ct, "name"));
		const char *q = json_string_value(json_object_get(
			json_object_get(json_object_get(ct, "resources"), "limits"), "ephemeral-storage"));
		if (name != NULL && strcmp(name, r->p[0].container) == 0 && q != NULL &&
		    agent_quantity_parse(q, strlen(q), &limit) == 0 && limit < gpu) {
			snprintf(why, len, "%llu MiB: container %.63s's ephemeral-storage limit %.32s", limit >> 20,
				 r->p[0].container, q);
			gpu = limit;
		}
	}
	json_decref(pod);
	if (gpu == 0)
		gcr_err_set(err, -EIO, "the bytes pid %d may write cannot be bounded (NVML: %s)", (int)r->p[0].pid,
			    err->msg);
	return gpu;
}

/* The checkpoint image's reference on this node's registry (agent_ocireg), with a new 128-bit
 * token as its tag: what a user's new pod names to be created from this Checkpoint's image. Not
 * for an eviction's (its replacement pod gets its own token from the scaler) nor without the
 * registry: -ENOENT. */
static int publish_ref(struct agent_controller *c, const struct op *o, char *ref, size_t len)
{
	json_t *labels = json_object_get(json_object_get(o->obj, "metadata"), "labels");
	const char *ev = json_string_value(json_object_get(labels, AGENT_OCIREG_LABEL_EVICTION));
	char token[AGENT_OCIIMG_TOKEN_LEN + 1];
	struct gcr_err err;
	if (c->registry_port <= 0 || (ev != NULL && strcmp(ev, "true") == 0))
		return -ENOENT;
	if (agent_ociimg_token(token, &err) < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: no image reference (%s)", o->d.ns, o->d.name,
			err.msg);
		return -ENOENT;
	}
	return agent_ociimg_ref(c->registry_port, o->d.ns, o->d.name, token, ref, len) < 0 ? -ENOENT : 0;
}

/* An Image's every wait on its process: spec.timeoutSeconds, else this (ms): its suspend and
 * resume move the GPU data at the disk's speed, not PCIe's. */
#define IMAGE_OP_DEFAULT_MS (10 * 60 * 1000)

static int image_op_ms(const struct agent_crobj *d)
{
	return d->timeout_s > 0 ? d->timeout_s * 1000 : IMAGE_OP_DEFAULT_MS;
}

/* The Image of r (state imaging) run or finished by agent_ckimage, then its outcome into the
 * record first and the status after (sync_checkpoint writes it again if that write is lost).
 * Not over (its process not back yet): the record stays imaging, retried with backoff. */
static void run_image(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	struct agent_ckimage_out out;
	agent_ckimage_run(c->img, r, timeout_ms_of(&o->d), image_op_ms(&o->d), &out);
	struct proc p = { .pid = r->p[0].pid };
	snprintf(p.container, sizeof(p.container), "%s", r->img.container);
	if (!out.final) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: %s", r->ns, r->name, out.msg);
		save(c, r);
		/* Said once: a write of the same again would bring its own event, and a try, back at once. */
		const char *said = status_str(o->obj, "message");
		if (o->obj != NULL && (said == NULL || strcmp(said, out.msg) != 0))
			set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", out.msg,
				   json_pack("{s:o}", "processes", procs_json(&p, 1, out.state)));
		retry_later(c, o->key, 0);
		agent_ckimage_out_clear(&out);
		return;
	}
	json_t *extra = out.extra != NULL ? json_incref(out.extra) : json_object();
	char msg[sizeof(out.msg) + 900];
	snprintf(msg, sizeof(msg), "%s", out.msg);
	if (out.ok) {
		if (image_prune(c, &o->d, r->img.path) > 0)
			snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), "; older images of the pod past the limit "
				 "removed");
		char ref[700];
		if (r->img.kubelet && o->obj != NULL && publish_ref(c, o, ref, sizeof(ref)) == 0) {
			json_object_set_new(json_object_get(extra, "image"), "reference", json_string(ref));
			/* The reference carries the token: status.image.reference only, never the message, an
			 * Event or a log line (docs/install.md, "The image registry"). */
			snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), "; a new pod restores it from the image "
				 "named in status.image.reference");
		}
	}
	json_object_set_new(extra, "processes", procs_json(&p, 1, out.state));
	json_t *st = build_status(c, o, out.ok ? AGENT_PHASE_SUCCEEDED : AGENT_PHASE_FAILED, out.reason, msg, extra);
	agent_record_set_status(&r->ck_status, st);
	r->state = out.ok ? AGENT_REC_IMAGED : AGENT_REC_FAILED;
	save(c, r);
	if (o->obj != NULL && write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s (%s) %s", o->d.ns, o->d.name,
			out.ok ? "Succeeded" : "Failed", out.reason, msg);
	json_decref(st);
	if (o->obj != NULL)
		event(c, o->obj, "Checkpoint", out.ok ? "Normal" : "Warning", out.ok ? "ImageWritten" : out.reason, msg);
	agent_metrics_op(c->metrics, "checkpoint", out.ok, out.ms_total, out.bytes);
	mark_done(c, r->uid);
	retry_reset(c, o->key);
	agent_ckimage_out_clear(&out);
}

/* A new Image of the pod's one GCR process: refused at once where nothing can be done, else
 * recorded (imaging, step start) before anything is touched, then run. */
static void new_image(struct agent_controller *c, struct op *o, json_t *pod, const struct agent_registry_proc *rp,
		      int n)
{
	const struct agent_crobj *d = &o->d;
	struct gcr_err err;
	if (n != 1) {
		fail(c, o, "ImageFailed", "pod %s/%s has %d processes under the GCR shim; an image holds one (name its "
		     "container in spec.containerName); nothing was done", d->ns, d->target, n);
		return;
	}
	if (gcr_image_is_partial(d->name)) {
		fail(c, o, "InvalidSpec", "Checkpoint name %s holds \"%s\", which names a partial image (never taken for "
		     "an image, never removed by retention): an Image needs another name; nothing was done", d->name,
		     GCR_IMAGE_PARTIAL);
		return;
	}
	if (d->cpu_kubelet && c->kubelet_url == NULL) {
		fail(c, o, "ImageFailed", "spec.cpuCheckpoint Kubelet: this agent has no kubelet URL (the chart's "
		     "images.kubelet.enabled is off); nothing was done");
		return;
	}
	struct agent_record r = { .keep_context = 0, .state = AGENT_REC_IMAGING, .action = AGENT_REC_ACT_IMAGE, .n = 1 };
	snprintf(r.uid, sizeof(r.uid), "%s", d->uid);
	snprintf(r.ns, sizeof(r.ns), "%s", d->ns);
	snprintf(r.name, sizeof(r.name), "%s", d->name);
	snprintf(r.pod, sizeof(r.pod), "%s", d->target);
	snprintf(r.pod_uid, sizeof(r.pod_uid), "%s", rp[0].pod_uid);
	r.p[0].pid = rp[0].pid;
	r.p[0].start = rp[0].start;
	container_name_of(pod, rp[0].container_id, r.p[0].container, sizeof(r.p[0].container));
	r.img = (struct agent_record_image){ .kubelet = d->cpu_kubelet, .step = AGENT_REC_STEP_START, .attempt = 1 };
	snprintf(r.img.container, sizeof(r.img.container), "%s", r.p[0].container);
	if (agent_images_path(c->images_dir, d->ns, d->target, d->name, r.img.path, sizeof(r.img.path), &err) < 0) {
		fail(c, o, "ImageFailed", "%s; nothing was done", err.msg);
		return;
	}
	if (d->cpu_kubelet && r.img.container[0] == '\0') {
		fail(c, o, "ImageFailed", "pod %s/%s lists no container for pid %d: the kubelet checkpoints a container "
		     "by name; nothing was done", d->ns, d->target, (int)rp[0].pid);
		return;
	}
	if (agent_record_put(c->rec, &r, &err) < 0) {
		fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
		return;
	}
	char msg[PATH_MAX + 200];
	snprintf(msg, sizeof(msg), "writing an image of pid %d to %s%s", (int)rp[0].pid, r.img.path,
		 d->cpu_kubelet ? " (CPU side by the kubelet)" : "");
	struct proc p = { .pid = rp[0].pid };
	snprintf(p.container, sizeof(p.container), "%s", r.p[0].container);
	int rc = set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
			    json_pack("{s:o}", "processes", procs_json(&p, 1, "Running")));
	if (rc == -ECANCELED) {
		agent_record_clear(&r);
		return; /* stopping: recorded at step start, run after the restart */
	}
	if (rc < 0) { /* gone, or someone wrote a final phase: it is not run */
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: not run (its status cannot be written)", d->ns,
			d->name);
		agent_record_del(c->rec, r.uid, &err);
		agent_record_clear(&r);
		return;
	}
	test_pause(c, "before-cr");
	run_image(c, o, &r);
	test_pause(c, "after-cr");
	agent_record_clear(&r);
}

/* An Image's record whose Checkpoint is gone: one cut short is brought back and cleaned all the
 * same (no status to write); the record goes once nothing is left for the sweep. */
static void orphan_image(struct agent_controller *c, const char *key, struct agent_record *r)
{
	struct gcr_err err;
	if (r->state == AGENT_REC_IMAGING) {
		struct op o = { .kind = K_CK, .key = key };
		snprintf(o.d.ns, sizeof(o.d.ns), "%s", r->ns);
		snprintf(o.d.name, sizeof(o.d.name), "%s", r->name);
		snprintf(o.d.uid, sizeof(o.d.uid), "%s", r->uid);
		run_image(c, &o, r);
		if (r->state == AGENT_REC_IMAGING)
			return; /* retried */
	}
	if (agent_ckimage_pending(r, (long long)time(NULL))) {
		retry_later(c, key, SWEEP_MS * 5);
		return;
	}
	agent_record_del(c->rec, r->uid, &err);
	retry_reset(c, key);
}

/* Whether Checkpoint ns/name is in the (listed) cache: agent_images_sweep's question. */
static int ck_exists(void *data, const char *ns, const char *name)
{
	struct agent_controller *c = data;
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	pthread_mutex_lock(&c->lock);
	int have = !c->listed[K_CK] ? -1 : json_object_get(c->cache[K_CK], key) != NULL;
	pthread_mutex_unlock(&c->lock);
	return have;
}

static void sweep_images(struct agent_controller *c)
{
	struct gcr_err err;
	int n = agent_images_sweep(c->images_dir, images_owner(c), ck_exists, c, &err);
	if (n < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "images sweep: %s", err.msg);
	else if (n > 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "images sweep: %d image(s) whose Checkpoint is gone removed", n);
	/* What Images left (agent_ckimage_sweep): less often, it reads every pod's directories. */
	double now = gcr_time_mono_ms();
	if (now - c->last_leftovers < LEFTOVER_SWEEP_MS)
		return;
	c->last_leftovers = now;
	n = agent_ckimage_sweep(c->img, c->alloc_root);
	if (n > 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "leftovers sweep: %d leftover(s) of images removed (partial images, "
			"the kubelet's archives, pods' copies, what pods put in their image directories)", n);
}

/* A new Checkpoint: the pod named in this namespace, its processes from the registry (by the
 * pod's UID), recorded before anything is touched. */
static void new_checkpoint(struct agent_controller *c, struct op *o)
{
	const struct agent_crobj *d = &o->d;
	enum pod_where where;
	char node[256], what[600];
	json_t *pod = find_pod(c, d->ns, d->target, &where, node, sizeof(node));
	if (pod == NULL) {
		snprintf(what, sizeof(what), "pod %s/%s", d->ns, d->target);
		if (where == POD_UNKNOWN)
			retry_later(c, o->key, 0);
		else if (where == POD_MISSING)
			fail(c, o, "PodNotFound", "pod %s/%s not found; nothing was done", d->ns, d->target);
		else if (where == POD_UNSCHEDULED)
			fail(c, o, "PodNotScheduled", "pod %s/%s is not scheduled to a node; nothing was done", d->ns,
			     d->target);
		else
			other_node(c, o, node, what);
		return;
	}
	const char *uid = md_str(pod, "uid");
	char cid[AGENT_CGROUP_CID_LEN + 8] = "";
	if (d->container[0] != '\0') {
		json_t *cst = container_status(pod, d->container, NULL);
		snprintf(cid, sizeof(cid), "%s", cst ? status_container_id(cst) : "");
		if (cid[0] == '\0') {
			fail(c, o, "ContainerNotFound", "pod %s/%s has no running container %s; nothing was done", d->ns,
			     d->target, d->container);
			json_decref(pod);
			return;
		}
	}
	struct agent_registry_proc rp[MAX_PROCS];
	int n = uid && strlen(uid) < AGENT_CROBJ_UID_LEN ? agent_registry_find(c->reg, uid, cid, rp, MAX_PROCS) : 0;
	if (n == 0) {
		fail(c, o, "NoGCRProcess", "pod %s/%s has no process running under the GCR shim on node %s; nothing was done",
		     d->ns, d->target, c->node);
		json_decref(pod);
		return;
	}
	if (d->action == AGENT_ACTION_IMAGE) {
		new_image(c, o, pod, rp, n);
		json_decref(pod);
		return;
	}
	struct agent_record r = { .keep_context = d->keep_context, .state = AGENT_REC_SUSPENDING, .n = n };
	snprintf(r.uid, sizeof(r.uid), "%s", d->uid);
	snprintf(r.ns, sizeof(r.ns), "%s", d->ns);
	snprintf(r.name, sizeof(r.name), "%s", d->name);
	snprintf(r.pod, sizeof(r.pod), "%s", d->target);
	snprintf(r.pod_uid, sizeof(r.pod_uid), "%s", uid);
	struct proc p[MAX_PROCS];
	for (int i = 0; i < n; i++) {
		p[i].pid = r.p[i].pid = rp[i].pid;
		r.p[i].start = rp[i].start;
		container_name_of(pod, rp[i].container_id, p[i].container, sizeof(p[i].container));
		snprintf(r.p[i].container, sizeof(r.p[i].container), "%s", p[i].container);
	}
	json_decref(pod);
	struct gcr_err err;
	if (agent_record_put(c->rec, &r, &err) < 0) {
		fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
		return;
	}
	start_checkpoint(c, o, &r, p, n);
	agent_record_clear(&r);
}

/* A Checkpoint whose record says suspending when a worker takes it: the agent was restarted
 * (or a step was retried). The processes' real state says how far it got. */
static void recover_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	struct proc p[MAX_PROCS];
	int gone, n = verified_procs(c, r, p, &gone);
	enum gcr_cr_mode mode = mode_of(r->keep_context);
	int running = 0, suspended = 0;
	for (int i = 0; i < n; i++) {
		enum gcr_cr_st s = real_state(c, p[i].pid, mode);
		running += s == GCR_CR_ST_RUNNING;
		suspended += s == GCR_CR_ST_SUSPENDED;
	}
	GCR_LOG(GCR_LOG_INFO, "controller",
		"Checkpoint %s/%s recorded as suspending: %d running, %d suspended, %d other, %d gone", r->ns, r->name,
		running, suspended, n - running - suspended, gone);
	if (gone == 0 && suspended == n) {
		json_t *extra = json_pack("{s:o, s:s}", "processes", procs_json(p, n, "Checkpointed"), "mode",
					  mode_api_name(mode));
		finish_checkpoint(c, o, r, 1, "Checkpointed",
				  "all processes were already suspended when the agent restarted; not redone", extra, 0, 0);
	} else if (gone == 0 && running == n) {
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: not started before the restart; running it", r->ns,
			r->name);
		start_checkpoint(c, o, r, p, n);
	} else {
		struct gcr_err err;
		int rc = n > 0 ? resume_all(c, p, n, mode, timeout_ms_of(&o->d), NULL, NULL, &err) : 0;
		char note[1024];
		snprintf(note, sizeof(note), "the agent restarted mid-checkpoint%s; %s%s", gone ? " and a process is gone" : "",
			 rc == 0 ? "partly suspended processes were resumed" : "undo failed: ", rc == 0 ? "" : err.msg);
		finish_checkpoint(c, o, r, 0, "Interrupted", note, NULL, 0, 0);
	}
}

/* Resumes the processes of r that are suspended, for a deletion of its Checkpoint (or a
 * record whose Checkpoint is gone), unless its pod is gone or terminating (then they are
 * about to end). 0 when nothing is left to do (note says what was done), -EAGAIN to retry. */
static int release_processes(struct agent_controller *c, struct agent_record *r, char *note, size_t len)
{
	enum pod_where where;
	char node[256];
	json_t *pod = find_pod(c, r->ns, r->pod, &where, node, sizeof(node));
	if (where == POD_UNKNOWN) {
		snprintf(note, len, "cannot read pod %s/%s", r->ns, r->pod);
		return -EAGAIN;
	}
	const char *uid = md_str(pod, "uid");
	int live = pod != NULL && uid != NULL && strcmp(uid, r->pod_uid) == 0 &&
		   json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp") == NULL;
	json_decref(pod);
	if (!live) {
		snprintf(note, len, "pod %s/%s is gone or terminating: its processes were not resumed", r->ns, r->pod);
		return 0;
	}
	struct proc p[MAX_PROCS];
	int gone, n = verified_procs(c, r, p, &gone);
	struct gcr_err err;
	int rc = n > 0 ? resume_all(c, p, n, mode_of(r->keep_context), DEFAULT_TIMEOUT_MS, NULL, NULL, &err) : 0;
	if (rc < 0) {
		snprintf(note, len, "resuming the processes failed (%s); they stay suspended and restorable, retrying",
			 err.msg);
		return -EAGAIN;
	}
	snprintf(note, len, "%d process(es) running again%s", n, gone ? " (others were gone)" : "");
	r->state = AGENT_REC_RESUMED;
	r->rs_uid[0] = r->rs_name[0] = '\0';
	save(c, r);
	return 0;
}

/* Deletion of a Checkpoint this agent recorded: processes it left suspended are resumed
 * (as deleting a GPUResidency does), then the finalizer lets the object go. */
static void delete_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	char note[1200];
	struct gcr_err err;
	if (r->action == AGENT_REC_ACT_IMAGE) {
		/* An Image holds nothing once over: one cut short is finished first; the record stays
		 * while the sweep has something of it to look after. */
		if (r->state == AGENT_REC_IMAGING)
			run_image(c, o, r);
		if (r->state == AGENT_REC_IMAGING)
			return;
		if (o->d.finalizer && ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT) {
			retry_later(c, o->key, 0);
			return;
		}
		if (!agent_ckimage_pending(r, (long long)time(NULL)))
			agent_record_del(c->rec, r->uid, &err);
		retry_reset(c, o->key);
		return;
	}
	if (r->state != AGENT_REC_FAILED && r->state != AGENT_REC_RESUMED) {
		pthread_mutex_lock(&c->lock);
		int first = json_object_get(c->backoff, o->key) == NULL;
		pthread_mutex_unlock(&c->lock);
		if (release_processes(c, r, note, sizeof(note)) < 0) {
			GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s deleted: %s", r->ns, r->name, note);
			if (first)
				event(c, o->obj, "Checkpoint", "Warning", "ResumeOnDeleteFailed", note);
			retry_later(c, o->key, 0);
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s deleted: %s", r->ns, r->name, note);
		event(c, o->obj, "Checkpoint", "Normal", "ResumedOnDelete", note);
	}
	if (ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT) {
		retry_later(c, o->key, 0);
		return;
	}
	retry_reset(c, o->key);
	agent_record_del(c->rec, r->uid, &err);
}

/* ---- a final phase the agent did not write ---- */


/* Seconds since the epoch of an RFC 3339 time ("2026-11-27T04:48:27Z"); -1 when unreadable. */
static long long rfc3339_s(const char *t)
{
	struct tm tm = { 0 };
	const char *end = t != NULL ? strptime(t, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	return end != NULL ? (long long)timegm(&tm) : -1;
}

/* Whether o carries the mark already (then nothing is written again for each of its events). */
static int forged_marked(const struct op *o)
{
	json_t *conds = json_object_get(json_object_get(o->obj, "status"), "conditions");
	size_t i;
	json_t *cd;
	json_array_foreach(conds, i, cd)
	{
		const char *t = json_string_value(json_object_get(cd, "type"));
		const char *st = json_string_value(json_object_get(cd, "status"));
		if (t != NULL && strcmp(t, FORGED_TYPE) == 0 && st != NULL && strcmp(st, "False") == 0)
			return 1;
	}
	return 0;
}

/* Whether Checkpoint o's final phase (with no record here, nor written by this process) is this
 * agent's to judge and was not written by it: its status names this node, or its pod is on this
 * node; created since this node's records began to cover every Checkpoint the agent ends
 * (agent_record_store_since: an older agent finished some without one); not marked already. */
static int forged_here(struct agent_controller *c, struct op *o)
{
	long long created = rfc3339_s(md_str(o->obj, "creationTimestamp"));
	if (created < 0 || created < agent_record_store_since(c->rec))
		return 0;
	int here = strcmp(o->d.node, c->node) == 0;
	if (!here && o->d.node[0] == '\0') {
		json_t *pod = cache_get(c, K_POD, o->d.ns, o->d.target);
		here = pod != NULL;
		json_decref(pod);
	}
	return here && !forged_marked(o);
}

/* Marks o's final phase as not the agent's (the CRD keeps a final phase final, so it cannot be
 * put right): the condition SetByAgent False, the Complete condition Unknown, both with reason
 * Forged, the message saying so, and a Warning Event. The phase stays what was written;
 * `kubectl get checkpoints -o wide` shows the message, and the printer column SetByAgent. */
static void mark_forged(struct agent_controller *c, struct op *o, const char *why)
{
	char now[40], msg[800];
	agent_kube_time(now, sizeof(now), 0);
	snprintf(msg, sizeof(msg), "FORGED: phase %s was not written by the GCR agent (%s); do not trust this status",
		 agent_phase_name(o->d.phase), why);
	json_t *patch = json_pack("{s:{s:s, s:[{s:s, s:s, s:s, s:s, s:s}, {s:s, s:s, s:s, s:s, s:s}]}}", "status",
				  "message", msg, "conditions", "type", "Complete", "status", "Unknown",
				  "lastTransitionTime", now, "reason", FORGED_REASON, "message", msg, "type", FORGED_TYPE,
				  "status", "False", "lastTransitionTime", now, "reason", FORGED_REASON, "message", msg);
	struct gcr_err err;
	int rc = patch != NULL ? agent_kube_patch_status(c->kube, o->path, patch, &err) : -ENOMEM;
	json_decref(patch);
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: forged phase %s not marked: %s", o->d.ns, o->d.name,
			agent_phase_name(o->d.phase), rc == -ENOMEM ? "out of memory" : err.msg);
		if (rc != -ENOENT)
			retry_later(c, o->key, 0);
		return;
	}
	GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: %s", o->d.ns, o->d.name, msg);
	event(c, o->obj, "Checkpoint", "Warning", "StatusForged", msg);
}

/* A Checkpoint with a record: brings the object in line with it (final status, finalizer). */
static void sync_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	if (r->state == AGENT_REC_SUSPENDING) {
		recover_checkpoint(c, o, r);
		return;
	}
	if (r->state == AGENT_REC_IMAGING) {
		run_image(c, o, r); /* cut short by a restart: finished from its record */
		return;
	}
	if (r->state == AGENT_REC_RESUMING && r->rs_uid[0] != '\0' &&
	    !cache_has_uid(c, K_RS, r->ns, r->rs_name, r->rs_uid)) {
		/* its Restore was deleted mid-way (and the agent restarted): finished here */
		char note[1200];
		if (release_processes(c, r, note, sizeof(note)) < 0) {
			retry_later(c, o->key, 0);
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: its Restore %s is gone: %s", r->ns, r->name,
			r->rs_name, note);
	}
	struct gcr_err err;
	int want = r->state == AGENT_REC_SUSPENDED || r->state == AGENT_REC_RESUMING;
	if (want != o->d.finalizer && ck_finalizer(c, r->ns, r->name, r->uid, want, &err) < 0 && err.code != -ENOENT) {
		retry_later(c, o->key, 0);
		return;
	}
	/* The record's phase is Succeeded or Failed whenever it has a status (agent_record checks). */
	const char *ph = json_string_value(json_object_get(r->ck_status, "phase"));
	enum agent_phase rph = agent_phase_of(ph);
	if (rph != AGENT_PHASE_NONE && rph != o->d.phase) {
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: status says %s, its record %s: written again",
			r->ns, r->name, o->d.phase == AGENT_PHASE_NONE ? "nothing" : agent_phase_name(o->d.phase), ph);
		if (write_status(c, o, r->ck_status) == -EINVAL && !forged_marked(o)) {
			/* A final phase someone else wrote is final for the API server too: marked. */
			char why[300];
			snprintf(why, sizeof(why), "the GCR agent of node %s recorded %s for this Checkpoint", c->node, ph);
			mark_forged(c, o, why);
		}
	}
}

static void reconcile_checkpoint(struct agent_controller *c, struct op *o)
{
	const struct agent_crobj *d = &o->d;
	struct agent_record r;
	if (agent_record_get(c->rec, d->uid, &r) == 0) {
		if (d->deleting)
			delete_checkpoint(c, o, &r);
		else
			sync_checkpoint(c, o, &r);
		agent_record_clear(&r);
		return;
	}
	/* No record: this agent never touched a process for it. Its status may say anything. */
	struct gcr_err err;
	if (d->deleting) {
		if (d->finalizer && ck_finalizer(c, d->ns, d->name, d->uid, 0, &err) < 0 && err.code != -ENOENT)
			retry_later(c, o->key, 0);
		return;
	}
	if (is_done(c, d->uid))
		return; /* a finished object is never redone */
	if (d->phase == AGENT_PHASE_SUCCEEDED || d->phase == AGENT_PHASE_FAILED) {
		/* A Succeeded always has a record (a Suspend's or an Image's, kept until the Checkpoint
		 * goes); a Failed one may have none (nothing touched, nothing recorded), and claims
		 * nothing. */
		if (d->phase == AGENT_PHASE_SUCCEEDED && forged_here(c, o))
			mark_forged(c, o, "the GCR agent has no record of this Checkpoint: nothing was done for it");
		return; /* never redone */
	}
	if (d->node[0] != '\0' && strcmp(d->node, c->node) != 0 && d->phase == AGENT_PHASE_RUNNING)
		return; /* another node's agent took it */
	new_checkpoint(c, o);
}

/* ---- Restore ---- */

/* The Checkpoint from the cache, else from the API: a Restore applied together
 * with its Checkpoint may be seen first. NULL when it does not exist. */
static json_t *find_checkpoint(struct agent_controller *c, const char *ns, const char *name, int *transient)
{
	*transient = 0;
	json_t *ck = cache_get(c, K_CK, ns, name);
	if (ck != NULL)
		return ck;
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/checkpoints/%s", ns, name);
	long st = 0;
	struct gcr_err err;
	if (agent_kube_request(c->kube, "GET", path, NULL, NULL, &st, &ck, &err) < 0 || (st != 200 && st != 404))
		*transient = 1;
	if (st != 200) {
		json_decref(ck);
		return NULL;
	}
	return ck;
}

/* A resume refused for want of GPU memory (-ENOSPC, the processes untouched and restorable):
 * says so (phase stays Running, condition reason WaitingForGPUMemory, one Warning Event) and
 * retries with backoff until room appears or the wait runs out. Returns the last resume's
 * result; -ECANCELED when the agent stops (the record says resuming: finished after the
 * restart). */
static int wait_for_room(struct agent_controller *c, struct op *o, const struct proc *p, int n,
			 enum gcr_cr_mode mode, struct gcr_cr_result *sum, struct gcr_err *err)
{
	double bound = o->d.timeout_s > 0 ? (double)o->d.timeout_s * 1000 : ROOM_WAIT_DEFAULT_MS, t0 = gcr_time_mono_ms();
	int delay = ROOM_RETRY_FIRST_MS, tries = 1, rc = -ENOSPC;
	char msg[1024];
	snprintf(msg, sizeof(msg), "waiting for GPU memory (retrying for up to %.0f s): %s", bound / 1000, err->msg);
	if (set_status(c, o, AGENT_PHASE_RUNNING, "WaitingForGPUMemory", msg, NULL) == -ECANCELED)
		return gcr_err_set(err, -ECANCELED, "agent stopping while waiting for GPU memory");
	event(c, o->obj, "Restore", "Warning", "WaitingForGPUMemory", msg);
	while (rc == -ENOSPC) {
		double left = bound - (gcr_time_mono_ms() - t0);
		if (left <= 0)
			break;
		if (nap(c, delay < left ? delay : (int)left))
			return gcr_err_set(err, -ECANCELED, "agent stopping while waiting for GPU memory");
		delay = delay * 2 < ROOM_RETRY_MAX_MS ? delay * 2 : ROOM_RETRY_MAX_MS;
		tries++;
		rc = resume_all(c, p, n, mode, timeout_ms_of(&o->d), &o->d, sum, err);
		if (rc < 0 && err->code == -ENOSPC)
			rc = -ENOSPC;
		GCR_LOG(GCR_LOG_INFO, "controller", "Restore %s/%s: try %d after waiting for GPU memory: %s", o->d.ns,
			o->d.name, tries, rc == 0 ? "resumed" : err->msg);
	}
	if (rc == -ENOSPC)
		gcr_err_wrap(err, "no GPU memory after %.0f s (%d tries); still suspended, a new Restore retries",
			     (gcr_time_mono_ms() - t0) / 1000, tries);
	return rc;
}

/* Resumes the processes recorded for Checkpoint r (state suspended, or resuming by this
 * Restore before a restart): every one must still be the process suspended. */
static void run_restore(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	const struct agent_crobj *d = &o->d;
	struct proc p[MAX_PROCS];
	int gone, n = verified_procs(c, r, p, &gone);
	enum gcr_cr_mode mode = mode_of(r->keep_context);
	if (gone > 0) {
		fail(c, o, "ProcessGone",
		     "%d process(es) of Checkpoint %s are no longer there (exited, or their pod was deleted); nothing was done",
		     gone, r->name);
		return;
	}
	int recovering = r->state == AGENT_REC_RESUMING;
	if (!recovering) {
		int running = 0;
		for (int i = 0; i < n; i++)
			running += real_state(c, p[i].pid, mode) == GCR_CR_ST_RUNNING;
		if (running == n) {
			fail(c, o, "NotSuspended",
			     "the processes of Checkpoint %s are running (resumed by other means?); nothing was done",
			     r->name);
			return;
		}
		r->state = AGENT_REC_RESUMING;
		snprintf(r->rs_uid, sizeof(r->rs_uid), "%s", d->uid);
		snprintf(r->rs_name, sizeof(r->rs_name), "%s", d->name);
		struct gcr_err err;
		if (agent_record_put(c->rec, r, &err) < 0) {
			fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
			return;
		}
		char msg[256];
		snprintf(msg, sizeof(msg), "resuming %d process(es)", n);
		int rc = set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
				    json_pack("{s:s, s:s, s:o}", "podName", r->pod, "mode", mode_api_name(mode),
					      "processes", procs_json(p, n, "Checkpointed")));
		if (rc == -ENOENT || rc == -EINVAL) { /* the Restore went away before anything was touched */
			r->state = AGENT_REC_SUSPENDED;
			r->rs_uid[0] = r->rs_name[0] = '\0';
			save(c, r);
			return;
		}
		if (rc < 0)
			return; /* stopping: the record says resuming */
	}
	struct gcr_cr_result sum = { 0 };
	struct gcr_err err;
	double t0 = gcr_time_mono_ms();
	test_pause(c, "before-rs");
	int rc = resume_all(c, p, n, mode, timeout_ms_of(d), d, &sum, &err);
	if (rc < 0 && err.code == -ENOSPC)
		rc = wait_for_room(c, o, p, n, mode, &sum, &err);
	double ms = gcr_time_mono_ms() - t0;
	if (rc == -ECANCELED)
		return;
	if (rc < 0) {
		/* still suspended and restorable (gcr_cr_resume's promise): a new Restore retries */
		r->state = AGENT_REC_SUSPENDED;
		r->rs_uid[0] = r->rs_name[0] = '\0';
		save(c, r);
		fail(c, o, err.code == -ENOSPC ? "NoGPUMemory" : "RestoreFailed", "%s", err.msg);
		return;
	}
	test_pause(c, "after-rs");
	char note[256];
	snprintf(note, sizeof(note), "%d process(es) resumed, %lld bytes back to GPU memory%s", n, sum.bytes_moved,
		 recovering ? " (finished after an agent restart)" : "");
	json_t *extra = json_pack("{s:o, s:s, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  procs_json(p, n, "Running"), "podName", r->pod, "mode", mode_api_name(mode), "bytes",
				  "vmm", (json_int_t)sum.bytes_moved, "total", (json_int_t)sum.bytes_moved, "durations",
				  "data", (json_int_t)sum.ms_data, "restore", (json_int_t)sum.ms_restore, "unlock",
				  (json_int_t)sum.ms_unlock, "total", (json_int_t)ms);
	json_t *st = build_status(c, o, AGENT_PHASE_SUCCEEDED, "Restored", note, extra);
	r->state = AGENT_REC_RESUMED;
	agent_record_set_status(&r->rs_status, st);
	save(c, r);
	if (write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Restore %s/%s: Succeeded %s", d->ns, d->name, note);
	json_decref(st);
	event(c, o->obj, "Restore", "Normal", "Restored", note);
	agent_metrics_op(c->metrics, "restore", 1, ms, sum.bytes_moved);
	mark_done(c, d->uid);
	char ckkey[600];
	snprintf(ckkey, sizeof(ckkey), "c:%s/%s", r->ns, r->name);
	if (ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT)
		retry_later(c, ckkey, 0); /* sync_checkpoint takes it off */
}

/* A Restore whose Checkpoint does not exist (yet): objects applied together may arrive in
 * any order, so it waits Pending for the grace period, then fails. */
static void checkpoint_missing(struct agent_controller *c, struct op *o)
{
	double now = gcr_time_mono_ms();
	pthread_mutex_lock(&c->lock);
	json_t *seen = json_object_get(c->first_seen, o->d.uid);
	double first = seen ? (double)json_integer_value(seen) : now;
	if (seen == NULL)
		json_object_set_new(c->first_seen, o->d.uid, json_integer((json_int_t)now));
	pthread_mutex_unlock(&c->lock);
	double left = c->grace_ms - (now - first);
	if (left > 0) {
		if (o->d.phase == AGENT_PHASE_NONE)
			set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
				   "waiting for the Checkpoint to be created", NULL);
		retry_later(c, o->key, (int)left + 1); /* its creation queues this Restore sooner */
		return;
	}
	fail(c, o, "CheckpointNotFound", "Checkpoint %s/%s not found after %d s; nothing was done", o->d.ns, o->d.target,
	     c->grace_ms / 1000);
}

/* A Restore of a Checkpoint this agent has no record of: waits while the Checkpoint is not
 * finished, leaves it to the node that took it, else fails touching nothing. */
static void restore_unrecorded(struct agent_controller *c, struct op *o, json_t *ck, const struct agent_crobj *ckd)
{
	if (ckd->phase == AGENT_PHASE_FAILED) {
		const char *m = status_str(ck, "message");
		fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed (%.600s); there is nothing to restore", o->d.ns,
		     ckd->name, m ? m : "no message");
		return;
	}
	int here = ckd->node[0] == '\0' || strcmp(ckd->node, c->node) == 0;
	if (ckd->phase != AGENT_PHASE_SUCCEEDED) {
		/* Waits for the Checkpoint; its change queues this Restore again. */
		if (here && o->d.phase == AGENT_PHASE_NONE)
			set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
				   "waiting for the Checkpoint to finish", NULL);
		return;
	}
	if (!here) {
		char what[600];
		snprintf(what, sizeof(what), "Checkpoint %s/%s", o->d.ns, ckd->name);
		other_node(c, o, ckd->node, what);
		return;
	}
	fail(c, o, "UnknownCheckpoint",
	     "the GCR agent on node %s did not suspend anything for Checkpoint %s/%s (uid %s); nothing was done", c->node,
	     o->d.ns, ckd->name, ckd->uid);
}

/* ---- Restore of an Image into a new pod (docs/images.md, "Restore into a new pod") ---- */

/* The processes of pod_uid's container cid on this node (host pids, by /proc/<pid>/cgroup),
 * at most max. */
static int container_pids(const char *pod_uid, const char *cid, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;
	while (d != NULL && n < max && (de = readdir(d)) != NULL) {
		char *end;
		long v = strtol(de->d_name, &end, 10);
		if (*end != '\0' || v <= 0)
			continue;
		struct agent_cgroup_pod cp;
		struct gcr_err e;
		if (agent_cgroup_read_pid((pid_t)v, &cp, &e) == 0 && strcmp(cp.pod_uid, pod_uid) == 0 &&
		    strcmp(cp.container_id, cid) == 0)
			out[n++] = (pid_t)v;
	}
	if (d != NULL)
		closedir(d);
	return n;
}

/* Ends every process of the restored container (its init with them, so the runtime sees it
 * exit): what is left of a restore that failed is never left half-running. */
static void end_container(const pid_t *pids, int n)
{
	for (int i = 0; i < n; i++)
		(void)kill(pids[i], SIGKILL);
}

/* The restored GCR process among pids: the one whose shim answers and is suspended (held at
 * its gate, as dumped: gcr_cr_state's suspended in the full mode). 0 when none (yet). */
static pid_t restored_shim(struct agent_controller *c, const pid_t *pids, int n)
{
	struct gcr_cr_opts cro = { .socket_dir = c->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = 5000 };
	for (int i = 0; i < n; i++) {
		struct gcr_cr_proc_state ps;
		struct gcr_err e;
		if (gcr_cr_state(pids[i], &cro, &ps, &e) == 0 && ps.shim && ps.state == GCR_CR_ST_SUSPENDED)
			return pids[i];
	}
	return 0;
}

/* A Restore whose Checkpoint is an Image with the kubelet's CPU side: the new pod spec.podName,
 * created from that checkpoint (the runtime restored its container, the process held at its
 * shim's gate), gets the GPU data: the image checked whole first (manifest, sizes, every
 * checksum), copied into the pod's socket directory, read by the shim, resumed. Any failure
 * ends the restored container (nothing half-running) with a Failed status and a Warning Event. */
/* The container an image was taken from (its manifest's "container"), "" when it names none (an
 * image from before the field) or cannot be read (its check refuses it later). */
static void image_container(const char *path, char *out, size_t len)
{
	char mf[PATH_MAX + 32], *buf = NULL;
	size_t n = 0;
	struct gcr_image_manifest m;
	struct gcr_err err;
	out[0] = '\0';
	snprintf(mf, sizeof(mf), "%s/%s", path, GCR_IMAGE_MANIFEST);
	if (gcr_image_read_file(mf, GCR_IMAGE_MAX_JSON, &buf, &n, &err) == 0 &&
	    gcr_image_manifest_parse(buf, n, &m, &err) == 0) {
		if (agent_crobj_is_label(m.container))
			snprintf(out, len, "%s", m.container);
		gcr_image_manifest_clear(&m);
	}
	free(buf);
}

/* Whether pod's spec declares a container named name. */
static int pod_declares(json_t *pod, const char *name)
{
	size_t i;
	json_t *ct;
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "containers"), i, ct)
	{
		const char *n = json_string_value(json_object_get(ct, "name"));
		if (n != NULL && strcmp(n, name) == 0)
			return 1;
	}
	return 0;
}

/* "a, b" of pod's containers, for a message. */
static void pod_containers(json_t *pod, char *out, size_t len)
{
	size_t i, used = 0;
	json_t *ct;
	out[0] = '\0';
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "containers"), i, ct)
	{
		const char *n = json_string_value(json_object_get(ct, "name"));
		int w = snprintf(out + used, len - used, "%s%.63s", i ? ", " : "", n ? n : "?");
		if (w < 0 || (size_t)w >= len - used)
			break;
		used += (size_t)w;
	}
}

static void restore_image(struct agent_controller *c, struct op *o, const struct agent_crobj *ckd)
{
	const struct agent_crobj *d = &o->d;
	char path[PATH_MAX], inside[PATH_MAX], node[256], what[600], msg[PATH_MAX + 2 * GCR_ERR_MSG_MAX];
	struct gcr_err err = { 0 };
	if (!ckd->cpu_kubelet) {
		fail(c, o, "NotRestorable", "Checkpoint %s/%s is an Image whose CPU side is the agent's CRIU dump: no pod "
		     "can be created from it (spec.cpuCheckpoint Kubelet makes one that can); nothing was done", d->ns,
		     ckd->name);
		return;
	}
	if (d->pod[0] == '\0') {
		fail(c, o, "InvalidSpec", "restoring Image %s needs spec.podName, the new pod created from its checkpoint; "
		     "nothing was done", ckd->name);
		return;
	}
	if (ckd->phase != AGENT_PHASE_SUCCEEDED) {
		if (ckd->phase == AGENT_PHASE_FAILED)
			fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed; there is no image to restore", d->ns, ckd->name);
		else if (d->phase == AGENT_PHASE_NONE)
			set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
				   "waiting for the Checkpoint to finish", NULL);
		return;
	}
	enum pod_where where;
	json_t *pod = find_pod(c, d->ns, d->pod, &where, node, sizeof(node));
	snprintf(what, sizeof(what), "pod %s/%s", d->ns, d->pod);
	if (pod == NULL) {
		if (where == POD_OTHER_NODE)
			other_node(c, o, node, what);
		else if (where == POD_MISSING)
			fail(c, o, "PodNotFound", "pod %s/%s not found; nothing was done", d->ns, d->pod);
		else
			retry_later(c, o->key, 1000); /* unknown, or not scheduled yet */
		return;
	}
	/* Another node's image: here too when the images directory is shared (the image check
	 * below still refuses another GPU model, driver or shim version). */
	if (!c->images_shared && ckd->node[0] != '\0' && strcmp(ckd->node, c->node) != 0) {
		json_decref(pod);
		fail(c, o, "ImageElsewhere", "the image of Checkpoint %s is on node %s, the pod on %s (images are node-local; "
		     "images.shared says a directory every node shares); nothing was done", ckd->name, ckd->node, c->node);
		return;
	}
	/* The restored container: the one the image was taken from, by the name its manifest keeps (a
	 * pod's other containers, sidecars, are never touched); an image from before the field: the
	 * container whose process waits restored at its shim's gate. */
	char cname[GCR_IMAGE_CONTAINER_MAX] = "", cid[AGENT_CGROUP_CID_LEN + 8] = "", uid[AGENT_CROBJ_UID_LEN];
	const char *pu = md_str(pod, "uid");
	snprintf(uid, sizeof(uid), "%s", pu ? pu : "");
	if (agent_images_path(c->images_dir, d->ns, ckd->target, ckd->name, path, sizeof(path), &err) == 0)
		image_container(path, cname, sizeof(cname));
	if (cname[0] != '\0' && !pod_declares(pod, cname)) {
		char names[300];
		pod_containers(pod, names, sizeof(names));
		json_decref(pod);
		fail(c, o, "ContainerNotFound", "the image of Checkpoint %s was taken from container %s; pod %s/%s has no "
		     "container %s (it has: %s); nothing was done", ckd->name, cname, d->ns, d->pod, cname, names);
		return;
	}
	pid_t pids[64], pid = 0;
	int n = 0;
	json_t *css = json_object_get(json_object_get(pod, "status"), "containerStatuses"), *cst;
	size_t ci;
	json_array_foreach(css, ci, cst)
	{
		const char *nm = json_string_value(json_object_get(cst, "name"));
		const char *id = json_object_get(json_object_get(cst, "state"), "running") ? status_container_id(cst) : NULL;
		if (nm == NULL || id == NULL || (cname[0] != '\0' && strcmp(nm, cname) != 0))
			continue;
		snprintf(cid, sizeof(cid), "%s", id);
		n = container_pids(uid, cid, pids, 64);
		pid = n > 0 ? restored_shim(c, pids, n) : 0;
		if (pid != 0 || cname[0] != '\0')
			break;
		n = 0; /* not this one: no container of the pod is ended for another's image */
	}
	json_decref(pod);
	if (pid == 0) {
		/* Not restored yet (the runtime restores when the container starts): wait, bounded. */
		double now = gcr_time_mono_ms();
		pthread_mutex_lock(&c->lock);
		json_t *seen = json_object_get(c->first_seen, d->uid);
		double first = seen ? (double)json_integer_value(seen) : now;
		if (seen == NULL)
			json_object_set_new(c->first_seen, d->uid, json_integer((json_int_t)now));
		pthread_mutex_unlock(&c->lock);
		int bound = d->timeout_s > 0 ? d->timeout_s * 1000 : c->grace_ms;
		if (now - first < bound) {
			if (d->phase == AGENT_PHASE_NONE)
				set_status(c, o, AGENT_PHASE_PENDING, "WaitingForPod",
					   "waiting for the pod's restored process (held at its shim's gate)", NULL);
			retry_later(c, o->key, 500);
			return;
		}
		if (n > 0)
			end_container(pids, n);
		fail(c, o, "NoRestoredProcess", "pod %s/%s has no restored GCR process waiting for its GPU data after %d s "
		     "(was it created from Checkpoint %s's image?)%s", d->ns, d->pod, bound / 1000, ckd->name,
		     n > 0 ? "; its container was ended" : "; nothing was done");
		return;
	}
	double t0 = gcr_time_mono_ms();
	snprintf(msg, sizeof(msg), "restoring the GPU data of Checkpoint %s into pid %d of pod %s", ckd->name, (int)pid,
		 d->pod);
	if (set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg, json_pack("{s:s}", "podName", d->pod)) < 0)
		return;
	int rc = agent_images_path(c->images_dir, d->ns, ckd->target, ckd->name, path, sizeof(path), &err);
	struct gcr_image_manifest m = { 0 };
	struct gcr_image_expect here;
	struct gcr_imagemac_keys keys = { 0 };
	gcr_imgcr_expect_here(&here);
	if (rc == 0 && (rc = load_keys(c, &keys, &err)) == 0 && keys.n > 0)
		here.keys = &keys;
	/* The whole image before anything runs: the process stays held while it is checked. Signed
	 * (shared storage): the manifest's MAC, then every file's SHA-256 where it is read (the GPU
	 * data as it is copied below, the CPU side by containerd against the digest the registry
	 * took from this manifest). */
	if (rc == 0)
		rc = here.keys != NULL ? gcr_image_verify_meta(path, &here, &m, &err) : gcr_image_verify(path, &here, &m, &err);
	if (rc == 0 && strcmp(m.mode, GCR_IMAGE_MODE_RUNTIME) != 0)
		rc = gcr_err_set(&err, -ENOTSUP, "%s is not an image with the kubelet's CPU side (mode %s)", path, m.mode);
	if (rc < 0)
		gcr_err_wrap(&err, "image refused");
	double t_verify = gcr_time_mono_ms() - t0;
	int pfd = -1, sfd = -1;
	struct gcr_imgcr_result rr = { 0 };
	if (rc == 0)
		rc = agent_images_pod_dir(pid, d->uid, &pfd, inside, sizeof(inside), &err);
	if (rc == 0 && (sfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = gcr_err_set(&err, -errno, "cannot open %s: %s", path, strerror(errno));
	if (rc == 0) {
		long long b = agent_images_copy_dir_checked(sfd, pfd, GCR_IMAGE_GPU_DIR, m.signed_ok ? &m : NULL, &err);
		rc = b < 0 ? (int)b : 0;
		if (rc < 0 && m.signed_ok)
			gcr_err_wrap(&err, "image refused");
	}
	gcr_image_manifest_clear(&m);
	gcr_imagemac_clear(&keys);
	if (sfd >= 0)
		close(sfd);
	if (rc == 0) {
		struct gcr_cr_opts cro = { .socket_dir = c->socket_dir, .mode = GCR_CR_FULL,
					   .timeout_ms = timeout_ms_of(d), .call_ms = image_op_ms(d) };
		test_pause(c, "before-rs");
		rc = gcr_imgcr_resume_restored(pid, inside, &cro, &rr, &err);
	}
	if (pfd >= 0) {
		agent_images_pod_remove(pid, inside);
		close(pfd);
	}
	double total = gcr_time_mono_ms() - t0;
	if (rc < 0) {
		n = container_pids(uid, cid, pids, 64);
		end_container(pids, n);
		snprintf(msg, sizeof(msg), "restore of Checkpoint %s into pod %s failed: %s; the restored container was "
			 "ended (nothing left running)", ckd->name, d->pod, err.msg);
		set_status(c, o, AGENT_PHASE_FAILED, "RestoreFailed", msg, json_pack("{s:s}", "podName", d->pod));
		event(c, o->obj, "Restore", "Warning", "RestoreFailed", msg);
		agent_metrics_op(c->metrics, "restore", 0, total, 0);
		mark_done(c, d->uid);
		return;
	}
	snprintf(msg, sizeof(msg), "pid %d of pod %s resumed with the GPU data of Checkpoint %s (%lld bytes)", (int)pid,
		 d->pod, ckd->name, rr.bytes);
	json_t *extra = json_pack("{s:s, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "podName", d->pod, "mode",
				  "Full", "bytes", "vmm", (json_int_t)rr.bytes, "total", (json_int_t)rr.bytes,
				  "durations", "verify", (json_int_t)t_verify, "data", (json_int_t)rr.ms_read,
				  "restore", (json_int_t)rr.ms_resume, "total", (json_int_t)total);
	set_status(c, o, AGENT_PHASE_SUCCEEDED, "Restored", msg, extra);
	event(c, o->obj, "Restore", "Normal", "Restored", msg);
	agent_metrics_op(c->metrics, "restore", 1, total, rr.bytes);
	mark_done(c, d->uid);
}

static void reconcile_restore(struct agent_controller *c, struct op *o)
{
	const struct agent_crobj *d = &o->d;
	if (is_done(c, d->uid) || d->phase == AGENT_PHASE_SUCCEEDED || d->phase == AGENT_PHASE_FAILED)
		return;
	int transient = 0;
	json_t *ck = find_checkpoint(c, d->ns, d->target, &transient);
	if (ck == NULL) {
		if (transient)
			retry_later(c, o->key, 0);
		else
			checkpoint_missing(c, o);
		return;
	}
	struct agent_crobj ckd;
	struct agent_record r;
	struct gcr_err err;
	if (agent_crobj_decode(ck, AGENT_CROBJ_CHECKPOINT, &ckd, &err) < 0) {
		fail(c, o, "CheckpointInvalid", "Checkpoint %s/%s: %s; nothing was done", d->ns, d->target, err.msg);
	} else if (ckd.action == AGENT_ACTION_IMAGE) {
		restore_image(c, o, &ckd);
	} else if (agent_record_get(c->rec, ckd.uid, &r) < 0) {
		restore_unrecorded(c, o, ck, &ckd);
	} else {
		switch (r.state) {
		case AGENT_REC_FAILED:
			fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed; there is nothing to restore", d->ns, r.name);
			break;
		case AGENT_REC_SUSPENDING: /* in flight (or recovered next): its change queues this again */
			retry_later(c, o->key, 0);
			break;
		case AGENT_REC_RESUMED:
			if (strcmp(r.rs_uid, d->uid) == 0 && r.rs_status != NULL) {
				write_status(c, o, r.rs_status); /* a status lost to an API fault */
				mark_done(c, d->uid);
			} else {
				fail(c, o, "NotSuspended", "the processes of Checkpoint %s were resumed already%s%s; nothing was done",
				     r.name, r.rs_name[0] ? " by Restore " : " (its deletion or another way)", r.rs_name);
			}
			break;
		case AGENT_REC_RESUMING:
			if (strcmp(r.rs_uid, d->uid) != 0 && r.rs_uid[0] != '\0' &&
			    cache_has_uid(c, K_RS, r.ns, r.rs_name, r.rs_uid)) {
				fail(c, o, "NotSuspended", "Restore %s is resuming the processes of Checkpoint %s; nothing was done",
				     r.rs_name, r.name);
				break;
			}
			snprintf(r.rs_uid, sizeof(r.rs_uid), "%s", d->uid); /* taken over from a Restore that is gone */
			snprintf(r.rs_name, sizeof(r.rs_name), "%s", d->name);
			run_restore(c, o, &r);
			break;
		default:
			run_restore(c, o, &r);
		}
		agent_record_clear(&r);
	}
	json_decref(ck);
}

/* ---- records whose Checkpoint is gone ---- */

/* The Checkpoint was deleted without its finalizer (removed by hand) or while this agent was
 * away: processes it left suspended are resumed all the same, then the record goes. */
static void reconcile_orphan(struct agent_controller *c, const char *key, const char *uid)
{
	struct agent_record r;
	if (agent_record_get(c->rec, uid, &r) < 0)
		return;
	if (!cache_has_uid(c, K_CK, r.ns, r.name, uid) && r.action == AGENT_REC_ACT_IMAGE) {
		orphan_image(c, key, &r);
	} else if (!cache_has_uid(c, K_CK, r.ns, r.name, uid)) {
		char note[1200];
		struct gcr_err err;
		if (r.state == AGENT_REC_FAILED || r.state == AGENT_REC_RESUMED ||
		    release_processes(c, &r, note, sizeof(note)) == 0) {
			if (r.state != AGENT_REC_FAILED && r.state != AGENT_REC_RESUMED)
				GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s (uid %s) is gone: %s", r.ns, r.name,
					uid, note);
			agent_record_del(c->rec, uid, &err);
			retry_reset(c, key);
		} else {
			GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s (uid %s) is gone: %s", r.ns, r.name, uid, note);
			retry_later(c, key, 0);
		}
	}
	agent_record_clear(&r);
}

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
		const char *u = md_str(json_object_get(c->cache[K_CK], ckkey), "uid");
		snprintf(key, sizeof(key), "o:%s", uid);
		if ((u == NULL || strcmp(u, uid) != 0) && json_object_get(c->retry, key) == NULL)
			enqueue_locked(c, key);
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
	json_t *obj = cache_get(c, key[0] == 'c' ? K_CK : K_RS, ns, name);
	const char *pod = key[0] == 'c' ? spec_str(obj, "podName") : NULL;
	json_t *ck = NULL;
	if (key[0] == 'r' && spec_str(obj, "checkpointName") != NULL) {
		int transient = 0;
		ck = find_checkpoint(c, ns, spec_str(obj, "checkpointName"), &transient);
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

/* Takes pod for this worker, and a worker of its namespace's share: 1 taken; 0 when another
 * worker has the pod, or the namespace holds its whole share of the workers: key is then
 * deferred and queued again once that worker is done with the pod, or the namespace with one
 * of its operations. *told: the namespace's share refused this time, to be told (an Event on
 * the object, once a minute at most); msg (len bytes) says so. */
static int claim(struct agent_controller *c, const char *pod, const char *key, int *told, char *msg, size_t len)
{
	char ns[300];
	struct gcr_err err;
	*told = 0;
	ns_of_pod_key(pod, ns, sizeof(ns));
	pthread_mutex_lock(&c->lock);
	json_t *waiting = json_object_get(c->busy, pod);
	int got = waiting == NULL;
	if (got && c->workers_share != NULL && agent_share_take(c->workers_share, ns, key, told, &err) < 0) {
		json_t *nw = json_object_get(c->ns_waiting, ns);
		if (nw == NULL) {
			nw = json_object();
			json_object_set_new(c->ns_waiting, ns, nw);
		}
		json_object_set_new(nw, key, json_true());
		snprintf(msg, len, "waits for a worker: namespace %.63s runs %d operations at once on node %.100s, its share of the "
			 "node's %d (the other namespaces' operations go on); it runs when one of them ends", ns,
			 agent_share_limit(c->workers_share), c->node, agent_share_capacity(c->workers_share));
		GCR_LOG(GCR_LOG_INFO, "controller", "%s %s", key, msg);
		got = 0;
	} else if (got) {
		json_object_set_new(c->busy, pod, json_object());
	} else {
		json_object_set_new(waiting, key, json_true());
		GCR_LOG(GCR_LOG_INFO, "controller", "%s waits: pod %s has an operation in flight", key, pod);
	}
	pthread_mutex_unlock(&c->lock);
	return got;
}

static void release(struct agent_controller *c, const char *pod)
{
	char ns[300];
	ns_of_pod_key(pod, ns, sizeof(ns));
	pthread_mutex_lock(&c->lock);
	const char *k;
	json_t *v;
	json_object_foreach(json_object_get(c->busy, pod), k, v) enqueue_locked(c, k);
	json_object_del(c->busy, pod);
	if (c->workers_share != NULL) {
		agent_share_give(c->workers_share, ns);
		json_object_foreach(json_object_get(c->ns_waiting, ns), k, v) enqueue_locked(c, k);
		json_object_del(c->ns_waiting, ns);
	}
	pthread_mutex_unlock(&c->lock);
}

/* One queued key, under its pod's claim; the object is read (and decoded) under the claim:
 * a worker that held the pod may have changed it meanwhile. */
static void process(struct agent_controller *c, const char *key)
{
	char pod[700];
	if (strcmp(key, IMAGES_SWEEP_KEY) == 0) {
		sweep_images(c);
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
			obj = cache_get(c, key[0] == 'c' ? K_CK : K_RS, ns, name);
		}
		if (obj != NULL) /* an API call: after the claim's lock */
			event(c, obj, key[0] == 'c' ? "Checkpoint" : "Restore", "Warning", "WorkerShareUsed", msg);
		json_decref(obj);
		return;
	}
	if (key[0] == 'o') {
		reconcile_orphan(c, key, key + 2);
		release(c, pod);
		return;
	}
	enum kind k = key[0] == 'c' ? K_CK : K_RS;
	char ns[300], name[300];
	const char *slash = strchr(key + 2, '/');
	snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key - 2), key + 2);
	snprintf(name, sizeof(name), "%s", slash + 1);
	struct op o = { .kind = k, .obj = cache_get(c, k, ns, name), .key = key };
	struct gcr_err err;
	if (o.obj != NULL) {
		int rc = agent_crobj_decode(o.obj, k == K_CK ? AGENT_CROBJ_CHECKPOINT : AGENT_CROBJ_RESTORE, &o.d, &err);
		op_path(&o, ns, name);
		if (rc < 0 && o.d.uid[0] == '\0')
			GCR_LOG(GCR_LOG_WARN, "controller", "%s: %s; ignored", key, err.msg);
		else if (rc < 0 && !is_done(c, o.d.uid) && o.d.phase != AGENT_PHASE_SUCCEEDED &&
			 o.d.phase != AGENT_PHASE_FAILED)
			fail(c, &o, "InvalidSpec", "%s; nothing was done", err.msg);
		else if (rc == 0 && k == K_CK)
			reconcile_checkpoint(c, &o);
		else if (rc == 0)
			reconcile_restore(c, &o);
	}
	json_decref(o.obj);
	release(c, pod);
}

static void *worker_main(void *data)
{
	struct agent_controller *c = data;
	pthread_mutex_lock(&c->lock);
	while (!atomic_load(&c->stop)) {
		int ready = c->listed[K_POD] && c->listed[K_CK] && c->listed[K_RS];
		double now = gcr_time_mono_ms();
		const char *k;
		void *tmp;
		json_t *v;
		json_object_foreach_safe(c->retry, tmp, k, v)
		{
			if ((double)json_integer_value(v) <= now) {
				enqueue_locked(c, k);
				json_object_del(c->retry, k);
			}
		}
		if (ready && now - c->last_sweep >= SWEEP_MS) {
			c->last_sweep = now;
			sweep_locked(c);
			enqueue_locked(c, IMAGES_SWEEP_KEY);
		}
		if (!ready || json_array_size(c->queue) == 0) {
			struct timespec dl;
			gcr_time_deadline(&dl, 200);
			pthread_cond_timedwait(&c->cond, &c->lock, &dl);
			continue;
		}
		char key[700];
		snprintf(key, sizeof(key), "%s", json_string_value(json_array_get(c->queue, 0)));
		json_array_remove(c->queue, 0);
		json_object_del(c->queued, key);
		pthread_mutex_unlock(&c->lock);
		process(c, key);
		pthread_mutex_lock(&c->lock);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* ---- life cycle ---- */

int agent_controller_new(struct agent_kube *kube, struct agent_registry *reg, struct agent_metrics *m,
			 const struct agent_controller_cfg *cfg, struct agent_controller **out,
			 struct gcr_err *err)
{
	*out = NULL;
	struct agent_controller *c = calloc(1, sizeof(*c));
	if (c == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	pthread_cond_init(&c->pod_changed, NULL);
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
	for (int k = 0; k < NK; k++)
		c->cache[k] = json_object();
	c->queue = json_array();
	c->queued = json_object();
	c->retry = json_object();
	c->backoff = json_object();
	c->done = json_object();
	c->first_seen = json_object();
	c->busy = json_object();
	c->ns_waiting = json_object();
	c->workers_share = cfg->workers;
	c->nworkers = cfg->max_parallel > 0 ? cfg->max_parallel : DEFAULT_PARALLEL;
	if (c->nworkers > MAX_PARALLEL)
		c->nworkers = MAX_PARALLEL;
	if (c->node == NULL || c->busy == NULL || c->ns_waiting == NULL || c->lease_ns == NULL || c->socket_dir == NULL || c->images_dir == NULL ||
	    c->pod_query == NULL ||
	    c->instance == NULL || c->queue == NULL || c->queued == NULL || c->retry == NULL || c->backoff == NULL ||
	    c->done == NULL || c->first_seen == NULL || (cfg->test_pause && c->pause == NULL) ||
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
					  .key_dir = c->key_dir, .copy_bound = copy_bound, .copy_bound_data = c,
					  .pause = image_pause, .pause_data = c };
	rc = agent_ckimage_new(&icfg, &c->img, err);
	if (rc < 0) {
		agent_controller_free(c);
		return rc;
	}
	snprintf(c->pod_query, qn, "fieldSelector=spec.nodeName%%3D%s", cfg->node_name);
	snprintf(c->instance, qn, "gcr-agent-%s", cfg->node_name);
	*out = c;
	return 0;
}

int agent_controller_start(struct agent_controller *c, struct gcr_err *err)
{
	for (int k = 0; k < NK; k++) {
		c->w[k] = (struct watch){ .c = c, .kind = (enum kind)k };
		int rc = pthread_create(&c->w[k].th, NULL, watch_main, &c->w[k]);
		if (rc != 0)
			return gcr_err_set(err, -rc, "cannot start a watch thread: %s", strerror(rc));
		c->w[k].started = 1;
	}
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
	pthread_mutex_lock(&c->lock);
	pthread_cond_broadcast(&c->cond);
	pthread_cond_broadcast(&c->pod_changed);
	pthread_mutex_unlock(&c->lock);
	for (int i = 0; i < c->workers_started; i++) /* each finishes its operation in flight */
		pthread_join(c->workers[i], NULL);
	c->workers_started = 0;
	for (int k = 0; k < NK; k++) {
		if (c->w[k].started) {
			pthread_join(c->w[k].th, NULL);
			c->w[k].started = 0;
		}
	}
}

void agent_controller_free(struct agent_controller *c)
{
	if (c == NULL)
		return;
	agent_controller_stop(c);
	for (int k = 0; k < NK; k++)
		json_decref(c->cache[k]);
	json_decref(c->queue);
	json_decref(c->queued);
	json_decref(c->retry);
	json_decref(c->backoff);
	json_decref(c->done);
	json_decref(c->first_seen);
	json_decref(c->busy);
	json_decref(c->ns_waiting);
	agent_ckimage_free(c->img);
	agent_record_store_free(c->rec);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	pthread_cond_destroy(&c->pod_changed);
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
	pthread_mutex_lock(&c->lock);
	json_object_foreach(c->cache[K_POD], key, pod)
	{
		const char *u = md_str(pod, "uid");
		if (u != NULL && strcmp(u, uid) == 0) {
			found = json_deep_copy(pod);
			break;
		}
	}
	pthread_mutex_unlock(&c->lock);
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
