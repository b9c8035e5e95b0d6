/* agent_controller: reconciles Checkpoint and Restore objects for pods on this
 * node: caches from three watches, workers that run C/R through gcr_cr (different
 * pods in parallel, one operation per pod at a time). */
#include "agent_controller.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent_gate.h"
#include "agent_lease.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_time.h"
#include "gcr_scale.h"
#include "gcr_shimreply.h"

#define API "/apis/gpucr.dev/v1alpha1"
/* Processes of one pod acted on at most (the CRD's processes maxItems). */
#define MAX_PROCS 64
/* Default bound of one gate/driver-lock step in ms when the spec has no timeoutSeconds. */
#define DEFAULT_TIMEOUT_MS 60000
/* Waiting work (a Restore whose Checkpoint is not finished, transient API
 * errors) is retried this often, in ms. */
#define RETRY_MS 2000
/* Longest wait for the scaler's process to mark a gated pod not ready before its suspend,
 * in ms: traffic should leave first, but a missing scaler must not stop the suspend. */
#define GATE_WAIT_MS 10000
/* A Restore refused for want of GPU memory (gcr_cr_resume's -ENOSPC: nothing touched) is
 * retried after 1 s, doubling to 30 s, for the Restore's timeoutSeconds or else this long
 * (ms): room usually comes back when a neighbour's job or request ends, within minutes. */
#define ROOM_RETRY_FIRST_MS 1000
#define ROOM_RETRY_MAX_MS 30000
#define ROOM_WAIT_DEFAULT_MS (15 * 60 * 1000)
/* Operations run at once by default, and at most (different pods only). */
#define DEFAULT_PARALLEL 4
#define MAX_PARALLEL 64

enum kind { K_POD, K_CK, K_RS, NK };
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
	char *node, *lease_ns, *socket_dir, *pause, *pod_query, *instance;
	int pause_s;
	atomic_int stop;
	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;
	pthread_cond_t pod_changed; /* a pod event arrived (wait_gate) */
	/* "ns/name" -> object: this node's pods (field selector); the Checkpoints and Restores
	 * not yet taken by a node, or taken by this one, whole; those another node took only as
	 * far as needed to recognise them (slim_locked). */
	json_t *cache[NK];
	int listed[NK];
	json_t *queue;   /* array of "c:ns/name" / "r:ns/name" */
	json_t *queued;  /* the same keys as a set */
	json_t *retry;   /* keys to retry after RETRY_MS */
	struct timespec last_retry; /* CLOCK_MONOTONIC: when retry was last queued */
	json_t *done;    /* metadata.uid of objects finished by this process */
	/* "ns/pod" of each pod a worker is acting on -> keys deferred until it is done, so
	 * that operations on one pod never overlap (its processes' state machine is one). */
	json_t *busy;
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

/* A Checkpoint or Restore another node's agent took (status.nodeName): this agent never acts
 * on it, it only has to recognise it (phase, node, the pod or Checkpoint it names, the
 * message a waiting Restore quotes), so the rest (processes, conditions, managed fields)
 * is not kept: a node's memory does not grow with the whole cluster's requests. Stolen. */
static json_t *slim(struct agent_controller *c, enum kind k, json_t *obj)
{
	const char *node = status_str(obj, "nodeName");
	if (k == K_POD || node == NULL || strcmp(node, c->node) == 0)
		return obj;
	json_t *md = json_object_get(obj, "metadata"), *spec = json_object_get(obj, "spec"),
	       *st = json_object_get(obj, "status");
	json_t *s = json_pack("{s:{s:O*, s:O*, s:O*, s:O*}, s:{s:O*, s:O*}, s:{s:O*, s:O*, s:O*, s:O*}}", "metadata",
			      "namespace", json_object_get(md, "namespace"), "name", json_object_get(md, "name"), "uid",
			      json_object_get(md, "uid"), "resourceVersion", json_object_get(md, "resourceVersion"),
			      "spec", "podName", json_object_get(spec, "podName"), "checkpointName",
			      json_object_get(spec, "checkpointName"), "status", "phase", json_object_get(st, "phase"),
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
	if (ev->type == AGENT_WATCH_DELETED && md_str(ev->object, "uid") != NULL)
		json_object_del(c->done, md_str(ev->object, "uid")); /* a uid is never reused */
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

static void mark_done(struct agent_controller *c, json_t *obj)
{
	const char *uid = md_str(obj, "uid");
	if (uid == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	json_object_set_new(c->done, uid, json_true());
	pthread_mutex_unlock(&c->lock);
}

static int is_done(struct agent_controller *c, json_t *obj)
{
	const char *uid = md_str(obj, "uid");
	pthread_mutex_lock(&c->lock);
	int d = uid != NULL && json_object_get(c->done, uid) != NULL;
	pthread_mutex_unlock(&c->lock);
	return d;
}

static void retry_later(struct agent_controller *c, const char *key)
{
	pthread_mutex_lock(&c->lock);
	json_object_set_new(c->retry, key, json_true());
	pthread_mutex_unlock(&c->lock);
}

/* ---- status and events ---- */

struct op {
	enum kind kind;
	json_t *obj; /* owned copy */
	const char *ns, *name, *kind_name; /* borrowed from obj */
	char path[700];
};

static const char *action_of(const struct op *o)
{
	return o->kind == K_CK ? "Checkpoint" : "Restore";
}

/* Merge-patches status: phase, message, the Complete condition, nodeName and
 * the timestamps; extra (stolen, may be NULL) adds fields. Without a
 * resourceVersion a merge patch never conflicts: the last writer wins, and only
 * this node's agent writes these fields. */
static int set_status(struct agent_controller *c, struct op *o, const char *phase, const char *reason,
		      const char *message, json_t *extra)
{
	char now[40];
	agent_kube_time(now, sizeof(now), 0);
	int final = strcmp(phase, "Succeeded") == 0 || strcmp(phase, "Failed") == 0;
	const char *cs = strcmp(phase, "Succeeded") == 0 ? "True" : strcmp(phase, "Failed") == 0 ? "False" : "Unknown";
	json_t *st = extra != NULL ? extra : json_object();
	json_object_set_new(st, "phase", json_string(phase));
	json_object_set_new(st, "nodeName", json_string(c->node));
	json_object_set_new(st, "message", json_string(message));
	json_t *gen = json_object_get(json_object_get(o->obj, "metadata"), "generation");
	if (json_is_integer(gen))
		json_object_set(st, "observedGeneration", gen);
	if (status_str(o->obj, "startTime") == NULL)
		json_object_set_new(st, "startTime", json_string(now));
	if (final)
		json_object_set_new(st, "completionTime", json_string(now));
	json_object_set_new(st, "conditions",
			    json_pack("[{s:s, s:s, s:s, s:s, s:s}]", "type", "Complete", "status", cs,
				      "lastTransitionTime", now, "reason", reason, "message", message));
	json_t *patch = json_pack("{s:o}", "status", st);
	struct gcr_err err;
	int rc = agent_kube_patch_status(c->kube, o->path, patch, &err);
	json_decref(patch);
	if (rc < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "%s %s/%s: status %s: %s", action_of(o), o->ns, o->name,
			phase, err.msg);
	else
		GCR_LOG(GCR_LOG_INFO, "controller", "%s %s/%s: %s (%s) %s", action_of(o), o->ns, o->name, phase,
			reason, message);
	/* Remember that phase locally too, so that a later event of the older
	 * version does not look like work left over. */
	json_t *s = json_object_get(o->obj, "status");
	if (!json_is_object(s)) {
		s = json_object();
		json_object_set_new(o->obj, "status", s);
	}
	json_object_set_new(s, "phase", json_string(phase));
	if (status_str(o->obj, "startTime") == NULL)
		json_object_set_new(s, "startTime", json_string(now));
	return rc;
}

static void event(struct agent_controller *c, struct op *o, const char *type, const char *reason,
		  const char *note)
{
	struct gcr_err err;
	if (agent_kube_event(c->kube, o->obj, type, reason, action_of(o), note, c->instance, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "event for %s/%s: %s", o->ns, o->name, err.msg);
}

/* Final failure: phase Failed, a Warning Event, metrics; the process was not touched
 * (or was put back as it was). */
static void fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	set_status(c, o, "Failed", reason, msg, NULL);
	event(c, o, "Warning", reason, msg);
	agent_metrics_op(c->metrics, o->kind == K_CK ? "checkpoint" : "restore", 0, 0, 0);
	mark_done(c, o->obj);
}

static void test_pause(struct agent_controller *c, const char *where)
{
	if (c->pause == NULL || strcmp(c->pause, where) != 0)
		return;
	GCR_LOG(GCR_LOG_WARN, "controller", "test hook: pausing %d s at %s", c->pause_s, where);
	for (int i = 0; i < c->pause_s * 10 && !atomic_load(&c->stop); i++)
		usleep(100 * 1000);
}

/* ---- processes ---- */

struct proc {
	pid_t pid;
	char container[64];
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

/* The container ID of container cname ("" when the pod does not list it). */
static void container_id_of(json_t *pod, const char *cname, char *out, size_t len)
{
	json_t *st = container_status(pod, cname, NULL);
	snprintf(out, len, "%s", st ? status_container_id(st) : "");
}

/* The container name of a container ID ("" when the pod does not list it). */
static void container_name_of(json_t *pod, const char *cid, char *out, size_t len)
{
	json_t *st = container_status(pod, NULL, cid);
	const char *n = st ? json_string_value(json_object_get(st, "name")) : NULL;
	snprintf(out, len, "%s", n ? n : "");
}

static json_t *procs_json(const struct proc *p, int n, const char *state)
{
	json_t *a = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(a, json_pack("{s:i, s:s, s:s}", "pid", (int)p[i].pid, "containerName",
						   p[i].container, "state", state));
	return a;
}

/* Processes recorded in status.processes. */
static int procs_from_status(json_t *obj, struct proc *out, int max)
{
	json_t *a = json_object_get(json_object_get(obj, "status"), "processes");
	size_t i;
	json_t *e;
	int n = 0;
	json_array_foreach(a, i, e)
	{
		if (n >= max)
			break;
		json_int_t pid = json_integer_value(json_object_get(e, "pid"));
		if (pid <= 0)
			continue;
		out[n].pid = (pid_t)pid;
		const char *cn = json_string_value(json_object_get(e, "containerName"));
		snprintf(out[n].container, sizeof(out[n].container), "%s", cn ? cn : "");
		n++;
	}
	return n;
}

/* ---- modes ---- */

/* A Checkpoint's spec.keepContext asks for GCR_CR_DATA_ONLY: the shim moves the data and
 * releases the buffers, the CUDA context stays resident (no driver checkpoint). The mode is
 * chosen from the spec once, recorded in status.mode (with the processes, before anything is
 * touched), and from then on read back from there: by a recovery and by every Restore, so a
 * resume always matches its suspend. */
static enum gcr_cr_mode mode_of_spec(json_t *ck)
{
	return json_is_true(json_object_get(json_object_get(ck, "spec"), "keepContext")) ? GCR_CR_DATA_ONLY
											 : GCR_CR_FULL;
}

/* status.mode; a Checkpoint without one was suspended by an agent that knew only Full. */
static enum gcr_cr_mode mode_recorded(json_t *ck)
{
	const char *m = status_str(ck, "mode");
	return m != NULL && strcmp(m, "KeepContext") == 0 ? GCR_CR_DATA_ONLY : GCR_CR_FULL;
}

static const char *mode_api_name(enum gcr_cr_mode m)
{
	return m == GCR_CR_DATA_ONLY ? "KeepContext" : "Full";
}

enum pstate { P_RUNNING, P_SUSPENDED, P_PARTIAL, P_GONE };

/* The process's real state, from its shim and the driver. Suspended in mode DATA_ONLY means
 * the shim suspended with the driver still running (the context stayed resident). */
static enum pstate real_state(struct agent_controller *c, pid_t pid, enum gcr_cr_mode mode)
{
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = 10000 };
	json_t *st = NULL;
	struct gcr_err err;
	if (gcr_cr_status(pid, &opts, &st, &err) < 0)
		return P_GONE;
	const char *shim;
	if (gcr_shimreply_state(json_object_get(st, "shim"), &shim, &err) == -EPROTO)
		GCR_LOG(GCR_LOG_WARN, "controller", "pid %d: %s", (int)pid, err.msg); /* then as no shim */
	const char *drv = json_string_value(json_object_get(st, "driver"));
	/* "none": a HIP process, whose control state is CRIU's (lib/gcr_cr.c); "criu": CRIU dumped
	 * it (it is gone until restored). */
	int no_driver = drv != NULL && strcmp(drv, "none") == 0;
	enum pstate r = P_PARTIAL;
	if (shim == NULL)
		r = json_object_get(st, "criu") != NULL ? P_SUSPENDED : P_GONE;
	else if (strcmp(shim, "running") == 0 && drv != NULL && (strcmp(drv, "running") == 0 || no_driver))
		r = P_RUNNING;
	else if (strcmp(shim, "suspended") == 0 && drv != NULL &&
		 (strcmp(drv, mode == GCR_CR_DATA_ONLY ? "running" : "checkpointed") == 0 || no_driver))
		r = P_SUSPENDED;
	GCR_LOG(GCR_LOG_INFO, "controller", "pid %d: shim %s, driver %s", (int)pid, shim ? shim : "-",
		drv ? drv : "-");
	json_decref(st);
	return r;
}

static int timeout_ms_of(json_t *obj)
{
	json_int_t t = json_integer_value(json_object_get(json_object_get(obj, "spec"), "timeoutSeconds"));
	return t > 0 ? (int)(t * 1000) : DEFAULT_TIMEOUT_MS;
}

/* Resumes every process of p that is not running (undo, or a Restore) in the mode they
 * were suspended in, all at once (gcr_scale_run: one thread per process). Returns 0 or
 * the first error, with its message in err. */
static int resume_all(struct agent_controller *c, const struct proc *p, int n, enum gcr_cr_mode mode,
		      int timeout_ms, struct gcr_cr_result *sum, struct gcr_err *err)
{
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode, .timeout_ms = timeout_ms };
	struct gcr_scale_proc sp[MAX_PROCS];
	int k = 0;
	for (int i = 0; i < n && k < MAX_PROCS; i++)
		if (real_state(c, p[i].pid, mode) != P_RUNNING)
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

/* ---- readiness gate ---- */

/* A pod declaring the readiness gate is marked not ready by the scaler's process (agent_gate:
 * node agents may not write pods) as soon as its Checkpoint exists; the suspend waits for
 * that to reach this node's pod watch, bounded, so traffic leaves before the threads stop. */
static void wait_gate(struct agent_controller *c, const char *ns, const char *name)
{
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name ? name : "");
	struct timespec dl;
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += GATE_WAIT_MS / 1000;
	pthread_mutex_lock(&c->lock);
	json_t *pod = json_object_get(c->cache[K_POD], key);
	int declared = agent_gate_declared(pod), rc = 0;
	while (declared && rc == 0 && !atomic_load(&c->stop)) {
		const char *st = agent_gate_status(json_object_get(c->cache[K_POD], key));
		if (st != NULL && strcmp(st, "False") == 0)
			break;
		rc = pthread_cond_timedwait(&c->pod_changed, &c->lock, &dl);
	}
	pthread_mutex_unlock(&c->lock);
	if (declared && rc != 0)
		GCR_LOG(GCR_LOG_WARN, "controller",
			"pod %s: %s still not False after %d ms (is the scaler running?); suspending anyway", key,
			AGENT_GATE_TYPE, GATE_WAIT_MS);
}

/* ---- Checkpoint ---- */

static void finish_checkpoint(struct agent_controller *c, struct op *o, const struct proc *p, int n,
			      enum gcr_cr_mode mode, const struct gcr_cr_result *sum, double ms_total,
			      const char *note)
{
	json_t *extra = json_pack("{s:o, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  procs_json(p, n, "Checkpointed"), "mode", mode_api_name(mode), "bytes", "vmm",
				  (json_int_t)sum->bytes_moved, "total", (json_int_t)sum->bytes_moved, "durations", "data",
				  (json_int_t)sum->ms_data, "lock", (json_int_t)sum->ms_lock, "checkpoint",
				  (json_int_t)sum->ms_checkpoint, "total", (json_int_t)ms_total);
	set_status(c, o, "Succeeded", "Checkpointed", note, extra);
	event(c, o, "Normal", "Checkpointed", note);
	agent_metrics_op(c->metrics, "checkpoint", 1, ms_total, sum->bytes_moved);
	mark_done(c, o->obj);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Suspends p[0..n) all at once (gcr_scale_run, as gcrctl scale does) in mode (the one
 * recorded in status.mode); on a failure resumes those this run suspended. */
static void run_checkpoint(struct agent_controller *c, struct op *o, const struct proc *p, int n,
			   enum gcr_cr_mode mode)
{
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode,
				    .timeout_ms = timeout_ms_of(o->obj) };
	struct gcr_cr_result sum = { 0 };
	double t0 = now_ms();
	test_pause(c, "before-cr");
	struct gcr_scale_proc sp[MAX_PROCS];
	for (int i = 0; i < n; i++)
		sp[i] = (struct gcr_scale_proc){ .pid = p[i].pid, .action = GCR_SCALE_SUSPEND };
	int rc = gcr_scale_run(sp, (size_t)n, &opts, NULL);
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
		int urc = nu > 0 ? resume_all(c, undo, nu, mode, opts.timeout_ms, NULL, &e2) : 0;
		fail(c, o, rc == -EALREADY ? "AlreadySuspended" : "CheckpointFailed", "suspend of pid %d failed: %s%s%s",
		     (int)sp[bad].pid, sp[bad].err.msg,
		     nu == 0 ? "" : urc == 0 ? "; processes already suspended were resumed" : "; undo failed: ",
		     nu > 0 && urc < 0 ? e2.msg : "");
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
	char note[256];
	snprintf(note, sizeof(note), "%d process(es) suspended, %lld bytes to host memory%s", n, sum.bytes_moved,
		 mode == GCR_CR_DATA_ONLY ? "; CUDA context kept on the GPU" : "");
	finish_checkpoint(c, o, p, n, mode, &sum, now_ms() - t0, note);
}

/* A Checkpoint this node's agent left Running (it was killed or restarted):
 * the processes' real state says how far it got. */
static void recover_checkpoint(struct agent_controller *c, struct op *o)
{
	struct proc p[MAX_PROCS];
	int n = procs_from_status(o->obj, p, MAX_PROCS);
	enum gcr_cr_mode mode = mode_recorded(o->obj);
	int running = 0, suspended = 0, other = 0;
	for (int i = 0; i < n; i++) {
		enum pstate s = real_state(c, p[i].pid, mode);
		running += s == P_RUNNING;
		suspended += s == P_SUSPENDED;
		other += s != P_RUNNING && s != P_SUSPENDED;
	}
	GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s found Running: %d running, %d suspended, %d other",
		o->ns, o->name, running, suspended, other);
	if (n == 0) {
		fail(c, o, "Interrupted", "the agent restarted before recording the processes; nothing was done");
	} else if (suspended == n) {
		struct gcr_cr_result sum = { 0 };
		finish_checkpoint(c, o, p, n, mode, &sum, 0,
				  "all processes were already suspended when the agent restarted; not redone");
	} else if (running == n) {
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: not started before the restart; running it",
			o->ns, o->name);
		run_checkpoint(c, o, p, n, mode);
	} else {
		struct gcr_err err;
		int rc = resume_all(c, p, n, mode, timeout_ms_of(o->obj), NULL, &err);
		if (rc == 0)
			fail(c, o, "Interrupted",
			     "the agent restarted mid-checkpoint; partly suspended processes were resumed");
		else
			fail(c, o, "Interrupted", "the agent restarted mid-checkpoint; undo failed: %s", err.msg);
	}
}

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
static void other_node(struct agent_controller *c, struct op *o, const char *key, const char *node,
		       const char *what)
{
	struct gcr_err err;
	int live = agent_lease_node_live(c->kube, c->lease_ns, node, &err);
	if (live < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "%s %s/%s: node %s: %s; retrying", action_of(o), o->ns,
			o->name, node, err.msg);
		retry_later(c, key);
	} else if (live) {
		GCR_LOG(GCR_LOG_DEBUG, "controller", "%s %s/%s: %s on node %s, whose agent is live; left to it",
			action_of(o), o->ns, o->name, what, node);
	} else {
		fail(c, o, "NoAgentOnNode",
		     "%s is on node %s, where no GCR agent is running (no live Lease %s/gcr-agent-%s); nothing was done",
		     what, node, c->lease_ns, node);
	}
}

static void reconcile_checkpoint(struct agent_controller *c, struct op *o, const char *key)
{
	const char *phase = status_str(o->obj, "phase");
	const char *snode = status_str(o->obj, "nodeName");
	if (phase != NULL && strcmp(phase, "Running") == 0) {
		if (snode != NULL && strcmp(snode, c->node) == 0)
			recover_checkpoint(c, o);
		return;
	}
	const char *pod_name = spec_str(o->obj, "podName");
	const char *cname = spec_str(o->obj, "containerName");
	if (pod_name == NULL) {
		fail(c, o, "InvalidSpec", "spec.podName is missing");
		return;
	}
	enum pod_where where;
	char node[256], what[600];
	json_t *pod = find_pod(c, o->ns, pod_name, &where, node, sizeof(node));
	if (pod == NULL) {
		snprintf(what, sizeof(what), "pod %s/%s", o->ns, pod_name);
		if (where == POD_UNKNOWN)
			retry_later(c, key);
		else if (where == POD_MISSING)
			fail(c, o, "PodNotFound", "pod %s/%s not found; nothing was done", o->ns, pod_name);
		else if (where == POD_UNSCHEDULED)
			fail(c, o, "PodNotScheduled", "pod %s/%s is not scheduled to a node; nothing was done",
			     o->ns, pod_name);
		else
			other_node(c, o, key, node, what);
		return;
	}
	const char *uid = md_str(pod, "uid");
	char cid[AGENT_CGROUP_CID_LEN + 8] = "";
	if (cname != NULL) {
		container_id_of(pod, cname, cid, sizeof(cid));
		if (cid[0] == '\0') {
			fail(c, o, "ContainerNotFound", "pod %s/%s has no running container %s; nothing was done",
			     o->ns, pod_name, cname);
			json_decref(pod);
			return;
		}
	}
	struct agent_registry_proc rp[MAX_PROCS];
	int n = uid ? agent_registry_find(c->reg, uid, cid, rp, MAX_PROCS) : 0;
	if (n == 0) {
		fail(c, o, "NoGCRProcess",
		     "pod %s/%s has no process running under the GCR shim on node %s; nothing was done", o->ns,
		     pod_name, c->node);
		json_decref(pod);
		return;
	}
	struct proc p[MAX_PROCS];
	for (int i = 0; i < n; i++) {
		p[i].pid = rp[i].pid;
		container_name_of(pod, rp[i].container_id, p[i].container, sizeof(p[i].container));
	}
	json_decref(pod);
	char msg[256];
	enum gcr_cr_mode mode = mode_of_spec(o->obj);
	snprintf(msg, sizeof(msg), "suspending %d process(es)%s", n,
		 mode == GCR_CR_DATA_ONLY ? ", keeping the CUDA context" : "");
	/* Running with the processes and the mode is recorded before anything is touched,
	 * so that an agent restarted mid-way knows what to look at, and how. */
	if (set_status(c, o, "Running", "InProgress", msg,
		       json_pack("{s:o, s:s}", "processes", procs_json(p, n, "Running"), "mode",
				 mode_api_name(mode))) < 0) {
		retry_later(c, key);
		return;
	}
	wait_gate(c, o->ns, pod_name);
	run_checkpoint(c, o, p, n, mode);
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

/* A resume refused for want of GPU memory (-ENOSPC, the processes untouched and restorable):
 * says so (phase stays Running, condition reason WaitingForGPUMemory, one Warning Event) and
 * retries with backoff until room appears or the wait runs out. Returns the last resume's
 * result; -ECANCELED when the agent stops (the Restore, Running on this node, is finished
 * after its restart). */
static int wait_for_room(struct agent_controller *c, struct op *o, const struct proc *p, int n,
			 enum gcr_cr_mode mode, struct gcr_cr_result *sum, struct gcr_err *err)
{
	json_int_t ts = json_integer_value(json_object_get(json_object_get(o->obj, "spec"), "timeoutSeconds"));
	double bound = ts > 0 ? (double)ts * 1000 : ROOM_WAIT_DEFAULT_MS, t0 = now_ms();
	int delay = ROOM_RETRY_FIRST_MS, tries = 1, rc = -ENOSPC;
	char msg[1024];
	snprintf(msg, sizeof(msg), "waiting for GPU memory (retrying for up to %.0f s): %s", bound / 1000, err->msg);
	set_status(c, o, "Running", "WaitingForGPUMemory", msg, NULL);
	event(c, o, "Warning", "WaitingForGPUMemory", msg);
	while (rc == -ENOSPC) {
		double left = bound - (now_ms() - t0);
		if (left <= 0)
			break;
		if (nap(c, delay < left ? delay : (int)left))
			return gcr_err_set(err, -ECANCELED, "agent stopping while waiting for GPU memory");
		delay = delay * 2 < ROOM_RETRY_MAX_MS ? delay * 2 : ROOM_RETRY_MAX_MS;
		tries++;
		rc = resume_all(c, p, n, mode, timeout_ms_of(o->obj), sum, err);
		if (rc < 0 && err->code == -ENOSPC)
			rc = -ENOSPC;
		GCR_LOG(GCR_LOG_INFO, "controller", "Restore %s/%s: try %d after waiting for GPU memory: %s", o->ns,
			o->name, tries, rc == 0 ? "resumed" : err->msg);
	}
	if (rc == -ENOSPC)
		gcr_err_wrap(err, "no GPU memory after %.0f s (%d tries); still suspended, a new Restore retries",
			     (now_ms() - t0) / 1000, tries);
	return rc;
}

static void reconcile_restore(struct agent_controller *c, struct op *o, const char *key)
{
	const char *phase = status_str(o->obj, "phase");
	const char *snode = status_str(o->obj, "nodeName");
	int recovering = 0;
	if (phase != NULL && strcmp(phase, "Running") == 0) {
		if (snode == NULL || strcmp(snode, c->node) != 0)
			return;
		recovering = 1;
	}
	const char *ckname = spec_str(o->obj, "checkpointName");
	int transient = 0;
	json_t *ck = ckname ? find_checkpoint(c, o->ns, ckname, &transient) : NULL;
	if (ck == NULL) {
		if (transient)
			retry_later(c, key);
		else
			fail(c, o, "CheckpointNotFound", "Checkpoint %s/%s not found; nothing was done", o->ns,
			     ckname ? ckname : "");
		return;
	}
	const char *ckphase = status_str(ck, "phase"), *cknode = status_str(ck, "nodeName");
	if (ckphase != NULL && strcmp(ckphase, "Failed") == 0) {
		fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed (%s); there is nothing to restore", o->ns,
		     ckname, status_str(ck, "message") ? status_str(ck, "message") : "no message");
		goto out;
	}
	if (ckphase == NULL || strcmp(ckphase, "Succeeded") != 0) {
		/* Waits for the Checkpoint; its change enqueues this Restore again. */
		if (cknode == NULL || strcmp(cknode, c->node) == 0) {
			if (phase == NULL)
				set_status(c, o, "Pending", "WaitingForCheckpoint",
					   "waiting for the Checkpoint to finish", NULL);
		}
		goto out;
	}
	if (cknode == NULL || strcmp(cknode, c->node) != 0) {
		if (cknode != NULL && !recovering) {
			char what[600];
			snprintf(what, sizeof(what), "Checkpoint %s/%s", o->ns, ckname);
			other_node(c, o, key, cknode, what);
		}
		goto out; /* another node's */
	}
	struct proc p[MAX_PROCS];
	int n = procs_from_status(ck, p, MAX_PROCS);
	enum gcr_cr_mode mode = mode_recorded(ck); /* never a Restore's own choice */
	if (!recovering) {
		/* Every process must still be the one the Checkpoint suspended. */
		for (int i = 0; i < n; i++) {
			struct agent_registry_proc rp;
			if (agent_registry_get(c->reg, p[i].pid, &rp) < 0) {
				fail(c, o, "ProcessGone", "pid %d of Checkpoint %s is no longer registered; nothing was done",
				     (int)p[i].pid, ckname);
				goto out;
			}
		}
		if (n == 0) {
			fail(c, o, "NoProcesses", "Checkpoint %s recorded no processes", ckname);
			goto out;
		}
		int running = 0;
		for (int i = 0; i < n; i++)
			running += real_state(c, p[i].pid, mode) == P_RUNNING;
		if (running == n) {
			fail(c, o, "NotSuspended",
			     "the processes of Checkpoint %s are running (restored already?); nothing was done", ckname);
			goto out;
		}
		char msg[256];
		snprintf(msg, sizeof(msg), "resuming %d process(es)", n);
		if (set_status(c, o, "Running", "InProgress", msg,
			       json_pack("{s:s*, s:s, s:o}", "podName", spec_str(ck, "podName"), "mode",
					 mode_api_name(mode), "processes", procs_json(p, n, "Checkpointed"))) < 0) {
			retry_later(c, key);
			goto out;
		}
	}
	struct gcr_cr_result sum = { 0 };
	struct gcr_err err;
	double t0 = now_ms();
	test_pause(c, "before-rs");
	int rc = resume_all(c, p, n, mode, timeout_ms_of(o->obj), &sum, &err);
	if (rc < 0 && err.code == -ENOSPC)
		rc = wait_for_room(c, o, p, n, mode, &sum, &err);
	double ms = now_ms() - t0;
	if (rc == -ECANCELED)
		goto out;
	if (rc < 0) {
		fail(c, o, err.code == -ENOSPC ? "NoGPUMemory" : "RestoreFailed", "%s", err.msg);
		goto out;
	}
	char note[256];
	snprintf(note, sizeof(note), "%d process(es) resumed, %lld bytes back to GPU memory%s", n, sum.bytes_moved,
		 recovering ? " (finished after an agent restart)" : "");
	json_t *extra = json_pack("{s:o, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  procs_json(p, n, "Running"), "mode", mode_api_name(mode), "bytes", "vmm",
				  (json_int_t)sum.bytes_moved, "total", (json_int_t)sum.bytes_moved, "durations", "data",
				  (json_int_t)sum.ms_data, "restore", (json_int_t)sum.ms_restore, "unlock",
				  (json_int_t)sum.ms_unlock, "total", (json_int_t)ms);
	set_status(c, o, "Succeeded", "Restored", note, extra);
	event(c, o, "Normal", "Restored", note);
	agent_metrics_op(c->metrics, "restore", 1, ms, sum.bytes_moved);
	mark_done(c, o->obj);
out:
	json_decref(ck);
}

/* ---- worker ---- */

/* The pod an operation acts on, as "ns/pod" in out: a Checkpoint's spec.podName, a
 * Restore's Checkpoint's. A Restore whose Checkpoint cannot be read touches no process
 * (it fails or is retried): it gets a key of its own. */
static void pod_key(struct agent_controller *c, enum kind k, json_t *obj, const char *ns, const char *name,
		    char *out, size_t len)
{
	const char *pod = k == K_CK ? spec_str(obj, "podName") : NULL;
	json_t *ck = NULL;
	if (k == K_RS && spec_str(obj, "checkpointName") != NULL) {
		int transient = 0;
		ck = find_checkpoint(c, ns, spec_str(obj, "checkpointName"), &transient);
		pod = spec_str(ck, "podName");
	}
	if (pod != NULL)
		snprintf(out, len, "%s/%s", ns, pod);
	else
		snprintf(out, len, "%s/%c:%s", ns, k == K_CK ? 'c' : 'r', name); /* no pod is named so */
	json_decref(ck);
}

/* Takes pod for this worker; 0 when another worker has it: key is then deferred and
 * queued again once that worker is done with the pod. */
static int claim(struct agent_controller *c, const char *pod, const char *key)
{
	pthread_mutex_lock(&c->lock);
	json_t *waiting = json_object_get(c->busy, pod);
	int got = waiting == NULL;
	if (got) {
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
	pthread_mutex_lock(&c->lock);
	const char *k;
	json_t *v;
	json_object_foreach(json_object_get(c->busy, pod), k, v) enqueue_locked(c, k);
	json_object_del(c->busy, pod);
	pthread_mutex_unlock(&c->lock);
}

static void process(struct agent_controller *c, const char *key)
{
	enum kind k = key[0] == 'c' ? K_CK : K_RS;
	char ns[300], name[300], pod[620];
	const char *slash = strchr(key + 2, '/');
	if (slash == NULL)
		return;
	snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key - 2), key + 2);
	snprintf(name, sizeof(name), "%s", slash + 1);
	struct op o = { .kind = k, .obj = cache_get(c, k, ns, name) };
	if (o.obj == NULL)
		return; /* deleted */
	pod_key(c, k, o.obj, ns, name, pod, sizeof(pod));
	if (!claim(c, pod, key)) {
		json_decref(o.obj);
		return;
	}
	/* Read again under the claim: a worker that held the pod may have finished this very
	 * object meanwhile (is_done below), so it is never redone. */
	json_decref(o.obj);
	o.obj = cache_get(c, k, ns, name);
	if (o.obj == NULL) {
		release(c, pod);
		return;
	}
	o.ns = ns;
	o.name = name;
	snprintf(o.path, sizeof(o.path), API "/namespaces/%s/%s/%s", ns, k == K_CK ? "checkpoints" : "restores",
		 name);
	const char *phase = status_str(o.obj, "phase");
	if (!is_done(c, o.obj) &&
	    (phase == NULL || (strcmp(phase, "Succeeded") != 0 && strcmp(phase, "Failed") != 0))) {
		if (k == K_CK) /* (a finished resource is never redone) */
			reconcile_checkpoint(c, &o, key);
		else
			reconcile_restore(c, &o, key);
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
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((now.tv_sec - c->last_retry.tv_sec) * 1000 + (now.tv_nsec - c->last_retry.tv_nsec) / 1000000 >=
		    RETRY_MS) {
			const char *k;
			json_t *v;
			json_object_foreach(c->retry, k, v) enqueue_locked(c, k);
			json_object_clear(c->retry);
			c->last_retry = now;
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
	c->node = strdup(cfg->node_name);
	c->lease_ns = strdup(cfg->lease_namespace ? cfg->lease_namespace : "gcr-system");
	c->socket_dir = strdup(cfg->socket_dir);
	c->pause = cfg->test_pause ? strdup(cfg->test_pause) : NULL;
	size_t qn = strlen(cfg->node_name) + 64;
	c->pod_query = malloc(qn);
	c->instance = malloc(qn);
	for (int k = 0; k < NK; k++)
		c->cache[k] = json_object();
	c->queue = json_array();
	c->queued = json_object();
	c->retry = json_object();
	c->done = json_object();
	c->busy = json_object();
	clock_gettime(CLOCK_MONOTONIC, &c->last_retry);
	c->nworkers = cfg->max_parallel > 0 ? cfg->max_parallel : DEFAULT_PARALLEL;
	if (c->nworkers > MAX_PARALLEL)
		c->nworkers = MAX_PARALLEL;
	if (c->node == NULL || c->busy == NULL || c->lease_ns == NULL || c->socket_dir == NULL || c->pod_query == NULL || c->instance == NULL ||
	    c->queue == NULL || c->queued == NULL || c->retry == NULL || c->done == NULL ||
	    (cfg->test_pause && c->pause == NULL)) {
		agent_controller_free(c);
		return gcr_err_set(err, -ENOMEM, "out of memory");
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
	json_decref(c->done);
	json_decref(c->busy);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	pthread_cond_destroy(&c->pod_changed);
	free(c->node);
	free(c->lease_ns);
	free(c->socket_dir);
	free(c->pause);
	free(c->pod_query);
	free(c->instance);
	free(c);
}
