/* agent_gate: the readiness gate gpucr.dev/resident. Node agents may not write pods (their
 * RBAC has no pods/status), so the scaler's process derives each gated pod's condition from
 * the Checkpoints and Restores naming it, and from the node agents' heartbeat notes (a pod
 * suspended with no Checkpoint: for another pod's room), and writes it; node agents wait for it
 * (controller). */
#include "agent_gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_objmap.h"
#include "agent_phase.h"
#include "agent_podspec.h"
#include "agent_scalemsg.h"
#include "gcr_log.h"
#include "gcr_time.h"

#define API "/apis/gpucr.dev/v1alpha1"
/* Every gated pod is compared again this often, in ms: covers a newly elected leader and a
 * write that failed, without a retry queue of its own. */
#define RESYNC_MS 2000

enum gkind { G_POD, G_CK, G_RS, GN };
static const struct agent_objmap_kind kinds[GN] = {
	{ "/api/v1/pods", NULL }, { API "/checkpoints", NULL }, { API "/restores", NULL } };

struct agent_gate {
	struct agent_kube *kube;
	struct agent_leader *leader;
	atomic_int stop;
	pthread_mutex_t lock; /* guards everything below */
	pthread_cond_t cond;
	/* Only what the gate needs, not the objects: pods declaring the gate ("ns/name" ->
	 * {status, reason} of its condition), Checkpoints ({ns, pod, phase}), Restores
	 * ({ns, ck, phase}). */
	struct agent_objmap *objs;
	json_t *dirty; /* "ns/pod" whose condition is to be compared */
	int all_dirty;
	pthread_t writer;
	int writer_started;
	char *lease_ns; /* where the heartbeat Leases are; NULL: notes not read */
	json_t *notes;  /* their activity notes' texts, listed at each resync */
};

/* The gate's values: a requested or running suspend, a finished one not restored, none, and a
 * suspend its node reports with no Checkpoint. */
static const struct {
	const char *status, *reason, *msg;
} states[] = {
	{ "False", "Suspending", "GPU state being suspended by GCR: not ready, so traffic goes elsewhere" },
	{ "False", "Suspended", "GPU state suspended by GCR" },
	{ "True", "Resident", "GPU state resident (not suspended by GCR)" },
	{ "False", "SuspendedOnNode",
	  "GPU state suspended by GCR on its node without a Checkpoint (to make room for a pod of higher priority)" },
};
enum gstate { S_SUSPENDING, S_SUSPENDED, S_RESIDENT, S_SUSPENDED_ON_NODE };

static const char *at(json_t *o, const char *a, const char *b)
{
	return json_string_value(json_object_get(json_object_get(o, a), b));
}

static void mark_locked(struct agent_gate *g, const char *ns, const char *pod)
{
	char key[600];
	if (ns == NULL || pod == NULL)
		return;
	snprintf(key, sizeof(key), "%s/%s", ns, pod);
	json_object_set_new(g->dirty, key, json_true());
	pthread_cond_signal(&g->cond);
}

/* Seconds since the epoch of an RFC 3339 UTC time (fraction ignored); 0 when absent or malformed. */
static double parse_time(const char *s)
{
	struct tm tm = { 0 };
	return s != NULL && strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) != NULL ? (double)timegm(&tm) : 0;
}

/* The mirror's map of kind k (under the lock). */
static json_t *map_locked(struct agent_gate *g, enum gkind k)
{
	return agent_objmap_map_locked(g->objs, k);
}

/* What the gate keeps of obj, NULL for a pod without the gate (not kept at all). A Checkpoint's
 * or Restore's phase is kept decoded (enum agent_phase), so the passes compare no strings. */
static json_t *slim(int k, json_t *obj, void *data)
{
	(void)data;
	const char *ns = at(obj, "metadata", "namespace");
	if (k == G_POD) {
		if (!agent_podspec_gate_declared(obj))
			return NULL;
		json_t *c = agent_podspec_gate_condition(obj);
		/* Only pods that opted in to overcommit are ever held without a Checkpoint. */
		return json_pack("{s:s?, s:s?, s:s?}", "status", json_string_value(json_object_get(c, "status")), "reason",
				 json_string_value(json_object_get(c, "reason")), "uid",
				 agent_podspec_overcommit(obj) ? at(obj, "metadata", "uid") : NULL);
	}
	int ph = (int)agent_phase_of(at(obj, "status", "phase"));
	if (k == G_CK)
		return json_pack("{s:s?, s:s?, s:i}", "ns", ns, "pod", at(obj, "spec", "podName"), "phase", ph);
	return json_pack("{s:s?, s:s?, s:i, s:f}", "ns", ns, "ck", at(obj, "spec", "checkpointName"), "phase", ph,
			 "done", parse_time(at(obj, "status", "completionTime")));
}

/* The phase an entry of the Checkpoint or Restore map keeps (slim). */
static enum agent_phase phase_of(json_t *e)
{
	return (enum agent_phase)json_integer_value(json_object_get(e, "phase"));
}

/* The pod an entry of map k concerns (a Restore's through its Checkpoint), marked dirty. */
static void touch_locked(struct agent_gate *g, enum gkind k, const char *key, json_t *e)
{
	if (k == G_POD) {
		json_object_set_new(g->dirty, key, json_true());
		pthread_cond_signal(&g->cond);
	} else if (k == G_CK) {
		mark_locked(g, json_string_value(json_object_get(e, "ns")), json_string_value(json_object_get(e, "pod")));
	} else {
		const char *ns = json_string_value(json_object_get(e, "ns")), *ck = json_string_value(json_object_get(e, "ck"));
		char ckey[600];
		snprintf(ckey, sizeof(ckey), "%s/%s", ns ? ns : "", ck ? ck : "");
		mark_locked(g, ns, json_string_value(json_object_get(json_object_get(map_locked(g, G_CK), ckey), "pod")));
	}
}

/* A relist makes every pod's condition to be compared; an object's change (its entry before, a
 * deleted Checkpoint or Restore changing its pod's state too, and after) that of its pod. */
static void changed(int kind, const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_gate *g = data;
	if (key == NULL) {
		g->all_dirty = 1;
		pthread_cond_signal(&g->cond);
		return;
	}
	if (old != NULL)
		touch_locked(g, (enum gkind)kind, key, old);
	if (cur != NULL)
		touch_locked(g, (enum gkind)kind, key, cur);
}

/* The pod's state from the objects naming it: a Checkpoint not yet final (requested or
 * running) means suspending, so traffic leaves before the node agent suspends (it waits for
 * this); a Succeeded one without a Succeeded Restore of it means suspended. */
static enum gstate want_locked(struct agent_gate *g, const char *ns, const char *pod, const char *uid)
{
	enum gstate s = S_RESIDENT;
	double restored_at = 0; /* the last Succeeded Restore's completion: older notes say nothing after it */
	int named = 0;          /* some Checkpoint names the pod */
	const char *ck;
	json_t *c;
	json_object_foreach(map_locked(g, G_CK), ck, c)
	{
		const char *cns = json_string_value(json_object_get(c, "ns")),
			   *cpod = json_string_value(json_object_get(c, "pod"));
		enum agent_phase ph = phase_of(c);
		if (cns == NULL || cpod == NULL || strcmp(cns, ns) != 0 || strcmp(cpod, pod) != 0)
			continue;
		named = 1;
		if (ph == AGENT_PHASE_NONE || ph == AGENT_PHASE_PENDING || ph == AGENT_PHASE_RUNNING)
			return S_SUSPENDING;
		if (ph != AGENT_PHASE_SUCCEEDED)
			continue;
		const char *name = strchr(ck, '/') + 1, *rk;
		json_t *r;
		int restored = 0;
		json_object_foreach(map_locked(g, G_RS), rk, r)
		{
			const char *rns = json_string_value(json_object_get(r, "ns")),
				   *rck = json_string_value(json_object_get(r, "ck"));
			int it = rns && rck && strcmp(rns, ns) == 0 && strcmp(rck, name) == 0 &&
				 phase_of(r) == AGENT_PHASE_SUCCEEDED;
			double done = json_real_value(json_object_get(r, "done"));
			restored |= it;
			if (it && done > restored_at)
				restored_at = done;
		}
		if (!restored)
			s = S_SUSPENDED;
	}
	/* Notes are read only for pods opted in to overcommit (uid NULL otherwise), and a pod
	 * Checkpoints name is judged by them alone: a note taken while a Checkpoint held the pod can
	 * outlive that hold's Restore, and the Restore itself (a GPUResidency removes its objects
	 * when deleted): k8s-agent's GPUResidency cases flapped to SuspendedOnNode. */
	if (s != S_RESIDENT || uid == NULL || named)
		return s;
	/* No Checkpoint says so, but its node reports processes of it suspended, sampled after its
	 * last Restore (both times from the node's clock): suspended for another pod's room
	 * (docs/preemption.md). */
	size_t i;
	json_t *t;
	json_array_foreach(g->notes, i, t)
	{
		struct agent_scalemsg_activity act;
		struct gcr_err err;
		const char *text = json_string_value(t);
		if (agent_scalemsg_activity_find(text, strlen(text), uid, &act, &err) == 0 && act.have_states &&
		    act.procs[GCR_SHIMREPLY_ST_SUSPENDED] + act.procs[GCR_SHIMREPLY_ST_SUSPENDING] > 0 &&
		    act.sampled > restored_at + 1) /* completionTime has whole seconds */
			return S_SUSPENDED_ON_NODE;
	}
	return s;
}

/* The heartbeat Leases' activity notes (texts), NULL when they cannot be listed (logged once per
 * change of outcome: the notes only add a state, the Checkpoints' view stands without them). */
static json_t *read_notes(struct agent_gate *g, int *said)
{
	char path[400];
	snprintf(path, sizeof(path), "/apis/coordination.k8s.io/v1/namespaces/%s/leases", g->lease_ns);
	long st = 0;
	json_t *list = NULL, *out = NULL;
	struct gcr_err err;
	int rc = agent_kube_request(g->kube, "GET", path, NULL, NULL, &st, &list, &err);
	if (rc == 0 && st >= 300)
		rc = gcr_err_set(&err, -EIO, "HTTP %ld", st);
	if (rc == 0 && (out = json_array()) != NULL) {
		size_t i;
		json_t *l;
		json_array_foreach(json_object_get(list, "items"), i, l)
		{
			json_t *t = json_object_get(json_object_get(json_object_get(l, "metadata"), "annotations"),
						    AGENT_SCALEMSG_ACTIVITY_KEY);
			if (json_is_string(t))
				json_array_append(out, t);
		}
	}
	if ((out == NULL) != (*said == 1)) {
		if (out == NULL)
			GCR_LOG(GCR_LOG_WARN, "gate", "heartbeat notes in %s not read (%s): pods suspended without a "
				"Checkpoint stay %s=True", g->lease_ns, rc < 0 ? err.msg : "out of memory", AGENT_PODSPEC_GATE_TYPE);
		*said = out == NULL;
	}
	json_decref(list);
	return out;
}

/* Strategic merge of the one condition (merged by type): nothing else of the pod is written. */
static int write_gate(struct agent_gate *g, const char *key, enum gstate s)
{
	char now[40], path[700], ns[300];
	const char *slash = strchr(key, '/');
	if (slash == NULL)
		return -EINVAL;
	snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key), key);
	agent_kube_time(now, sizeof(now), 0);
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s/status", ns, slash + 1);
	json_t *patch = json_pack("{s:{s:[{s:s, s:s, s:s, s:s, s:s}]}}", "status", "conditions", "type",
				  AGENT_PODSPEC_GATE_TYPE, "status", states[s].status, "reason", states[s].reason, "message",
				  states[s].msg, "lastTransitionTime", now);
	char *body = patch ? json_dumps(patch, JSON_COMPACT) : NULL;
	json_decref(patch);
	long st = 0;
	struct gcr_err err;
	int rc = body ? agent_kube_request(g->kube, "PATCH", path, "application/strategic-merge-patch+json", body, &st,
					   NULL, &err)
		      : gcr_err_set(&err, -ENOMEM, "out of memory");
	free(body);
	if (rc == 0 && st >= 300)
		rc = gcr_err_set(&err, st == 404 ? -ENOENT : -EIO, "HTTP %ld", st);
	if (rc < 0)
		GCR_LOG(GCR_LOG_WARN, "gate", "pod %s: %s=%s not written (%s); compared again in %d ms", key,
			AGENT_PODSPEC_GATE_TYPE, states[s].status, err.msg, RESYNC_MS);
	else
		GCR_LOG(GCR_LOG_INFO, "gate", "pod %s: %s=%s (%s)", key, AGENT_PODSPEC_GATE_TYPE, states[s].status,
			states[s].reason);
	return rc;
}

static void *writer_main(void *data)
{
	struct agent_gate *g = data;
	double last = gcr_time_mono_ms();
	int said = 0;
	pthread_mutex_lock(&g->lock);
	while (!atomic_load(&g->stop)) {
		double now = gcr_time_mono_ms();
		if (now - last >= RESYNC_MS) {
			g->all_dirty = 1;
			last = now;
			if (g->lease_ns != NULL) { /* a request: not under the lock */
				pthread_mutex_unlock(&g->lock);
				json_t *notes = read_notes(g, &said);
				pthread_mutex_lock(&g->lock);
				if (notes != NULL) {
					json_decref(g->notes);
					g->notes = notes;
				}
			}
		}
		int synced = agent_objmap_synced_locked(g->objs);
		if (!synced || (!g->all_dirty && json_object_size(g->dirty) == 0)) {
			struct timespec dl;
			gcr_time_deadline(&dl, 200);
			pthread_cond_timedwait(&g->cond, &g->lock, &dl);
			continue;
		}
		/* Before the lists, a pod would look resident while its Checkpoint is unseen. */
		json_t *todo = g->all_dirty ? json_object() : g->dirty;
		const char *k;
		json_t *v;
		if (g->all_dirty) {
			json_object_foreach(map_locked(g, G_POD), k, v) json_object_set_new(todo, k, json_true());
			json_object_clear(g->dirty);
			g->all_dirty = 0;
		} else {
			g->dirty = json_object();
		}
		json_t *writes = json_object(); /* "ns/pod" -> state to write */
		json_object_foreach(todo, k, v)
		{
			json_t *p = json_object_get(map_locked(g, G_POD), k);
			const char *slash = strchr(k, '/');
			if (p == NULL || slash == NULL)
				continue; /* not (or no longer) a pod declaring the gate */
			char ns[300];
			snprintf(ns, sizeof(ns), "%.*s", (int)(slash - k), k);
			enum gstate s = want_locked(g, ns, slash + 1, json_string_value(json_object_get(p, "uid")));
			const char *cs = json_string_value(json_object_get(p, "status")),
				   *cr = json_string_value(json_object_get(p, "reason"));
			if (cs == NULL || strcmp(cs, states[s].status) != 0 ||
			    (s != S_RESIDENT && (cr == NULL || strcmp(cr, states[s].reason) != 0)))
				json_object_set_new(writes, k, json_integer(s));
		}
		json_decref(todo);
		pthread_mutex_unlock(&g->lock);
		/* Only the leader writes, so two scaler replicas never alternate a condition. */
		int lead = g->leader == NULL || agent_leader_is_leader(g->leader);
		json_object_foreach(writes, k, v)
		{
			enum gstate s = (enum gstate)json_integer_value(v);
			if (!lead || atomic_load(&g->stop) || write_gate(g, k, s) < 0)
				continue;
			pthread_mutex_lock(&g->lock); /* as written, until the pod's own event says so */
			json_t *p = json_object_get(map_locked(g, G_POD), k);
			if (p != NULL) {
				json_object_set_new(p, "status", json_string(states[s].status));
				json_object_set_new(p, "reason", json_string(states[s].reason));
			}
			pthread_mutex_unlock(&g->lock);
		}
		json_decref(writes);
		pthread_mutex_lock(&g->lock);
	}
	pthread_mutex_unlock(&g->lock);
	return NULL;
}

int agent_gate_new(struct agent_kube *kube, struct agent_leader *leader, struct agent_gate **out,
		   struct gcr_err *err)
{
	*out = NULL;
	struct agent_gate *g = calloc(1, sizeof(*g));
	if (g == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	g->kube = kube;
	g->leader = leader;
	pthread_mutex_init(&g->lock, NULL);
	pthread_cond_init(&g->cond, NULL);
	if ((g->dirty = json_object()) == NULL || (g->notes = json_array()) == NULL) {
		agent_gate_free(g);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	struct agent_objmap_ops ops = { .slim = slim, .changed = changed, .data = g };
	int rc = agent_objmap_new(kube, &g->lock, kinds, GN, &ops, &g->objs, err);
	if (rc < 0) {
		agent_gate_free(g);
		return rc;
	}
	*out = g;
	return 0;
}

int agent_gate_read_notes(struct agent_gate *g, const char *lease_ns, struct gcr_err *err)
{
	free(g->lease_ns);
	g->lease_ns = lease_ns != NULL ? strdup(lease_ns) : NULL;
	return lease_ns != NULL && g->lease_ns == NULL ? gcr_err_set(err, -ENOMEM, "out of memory") : 0;
}

int agent_gate_start(struct agent_gate *g, struct gcr_err *err)
{
	int rc = agent_objmap_start(g->objs, err);
	if (rc < 0)
		return rc;
	rc = pthread_create(&g->writer, NULL, writer_main, g);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the gate writer: %s", strerror(rc));
	g->writer_started = 1;
	return 0;
}

int agent_gate_synced(struct agent_gate *g)
{
	pthread_mutex_lock(&g->lock);
	int s = agent_objmap_synced_locked(g->objs);
	pthread_mutex_unlock(&g->lock);
	return s;
}

void agent_gate_free(struct agent_gate *g)
{
	if (g == NULL)
		return;
	atomic_store(&g->stop, 1);
	pthread_mutex_lock(&g->lock);
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
	if (g->writer_started)
		pthread_join(g->writer, NULL);
	agent_objmap_free(g->objs);
	json_decref(g->dirty);
	json_decref(g->notes);
	free(g->lease_ns);
	pthread_mutex_destroy(&g->lock);
	pthread_cond_destroy(&g->cond);
	free(g);
}
