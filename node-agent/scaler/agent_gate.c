/* agent_gate: the readiness gate gpucr.dev/resident. Node agents may not write pods (their
 * RBAC has no pods/status), so the scaler's process derives each gated pod's condition from
 * the Checkpoints and Restores naming it, and from the node agents' heartbeat notes (a pod
 * suspended with no Checkpoint: for another pod's room), and writes it; node agents wait for it
 * (controller). The objects come from the process's shared mirrors (kube/agent_informer); each
 * change queues its pod's key "g:ns/pod" on a work queue (kube/agent_workq), whose one worker
 * compares and writes. */
#include "agent_gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_workq.h"
#include "agent_phase.h"
#include "agent_podspec.h"
#include "agent_scalemsg.h"
#include "gcr_log.h"

#define API "/apis/gpucr.dev/v1alpha1"
/* Every gated pod is compared again this often, in ms (the key RESYNC_KEY): the heartbeat notes
 * are read then (they are polled, not watched), and a newly elected leader writes within it. */
#define RESYNC_MS 2000
#define RESYNC_KEY "g-resync"
/* A write that failed is tried again after this, doubling per pod up to RESYNC_MS (ms). */
#define RETRY_MS 500

enum gkind { G_POD, G_CK, G_RS, GN };
static const char *const paths[GN] = { "/api/v1/pods", API "/checkpoints", API "/restores" };

struct agent_gate {
	struct agent_kube *kube;
	struct agent_leader *leader;
	/* The shared mirrors (borrowed; their lock guards the views). Only what the gate needs is
	 * kept, not the objects: pods declaring the gate ("ns/name" -> {status, reason} of its
	 * condition), Checkpoints ({ns, pod, phase}), Restores ({ns, ck, phase, done}). */
	struct agent_informers *inf;
	struct agent_informer_sub *sub[GN];
	struct agent_workq *q; /* "g:ns/pod": its condition to compare; RESYNC_KEY */
	pthread_t worker;
	int worker_started;
	/* The worker's alone: */
	char *lease_ns; /* where the heartbeat Leases are; NULL: notes not read */
	json_t *notes;  /* their activity notes' texts, listed at each resync */
	int said;       /* the notes' failure was logged */
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

/* Queues the comparison of pod key ("ns/name"). */
static void mark(struct agent_gate *g, const char *key)
{
	char qk[AGENT_WORKQ_KEY_MAX];
	snprintf(qk, sizeof(qk), "g:%s", key);
	if (agent_workq_add(g->q, qk) < 0)
		GCR_LOG(GCR_LOG_WARN, "gate", "pod %.300s: not queued (out of memory, or too long a name); compared at the "
			"next resync", key);
}

static void mark_pod(struct agent_gate *g, const char *ns, const char *pod)
{
	char key[600];
	if (ns == NULL || pod == NULL)
		return;
	snprintf(key, sizeof(key), "%s/%s", ns, pod);
	mark(g, key);
}

/* Every gated pod queued (under the mirrors' lock): after a list, and at each resync. */
static void mark_all_locked(struct agent_gate *g)
{
	const char *k;
	json_t *v;
	for (void *it = agent_informer_next_locked(g->sub[G_POD], NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(g->sub[G_POD], it, &k, &v))
		mark(g, k);
}

/* Seconds since the epoch of an RFC 3339 UTC time (fraction ignored); 0 when absent or malformed. */
static double parse_time(const char *s)
{
	struct tm tm = { 0 };
	return s != NULL && strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) != NULL ? (double)timegm(&tm) : 0;
}

/* A view's entry (under the lock). */
static json_t *get_locked(struct agent_gate *g, enum gkind k, const char *key)
{
	return agent_informer_get_locked(g->sub[k], key);
}

/* What the gate keeps of a pod: NULL for one without the gate (not kept at all). */
static json_t *slim_pod(json_t *obj, void *data)
{
	(void)data;
	if (!agent_podspec_gate_declared(obj))
		return NULL;
	json_t *c = agent_podspec_gate_condition(obj);
	/* Only pods that opted in to overcommit are ever held without a Checkpoint. */
	return json_pack("{s:s?, s:s?, s:s?}", "status", json_string_value(json_object_get(c, "status")), "reason",
			 json_string_value(json_object_get(c, "reason")), "uid",
			 agent_podspec_overcommit(obj) ? at(obj, "metadata", "uid") : NULL);
}

/* A Checkpoint's or Restore's phase is kept decoded (enum agent_phase), so the comparisons
 * test no strings. */
static json_t *slim_ck(json_t *obj, void *data)
{
	(void)data;
	return json_pack("{s:s?, s:s?, s:i}", "ns", at(obj, "metadata", "namespace"), "pod", at(obj, "spec", "podName"),
			 "phase", (int)agent_phase_of(at(obj, "status", "phase")));
}

static json_t *slim_rs(json_t *obj, void *data)
{
	(void)data;
	return json_pack("{s:s?, s:s?, s:i, s:f}", "ns", at(obj, "metadata", "namespace"), "ck",
			 at(obj, "spec", "checkpointName"), "phase", (int)agent_phase_of(at(obj, "status", "phase")),
			 "done", parse_time(at(obj, "status", "completionTime")));
}

/* The phase an entry of the Checkpoint or Restore map keeps (slim). */
static enum agent_phase phase_of(json_t *e)
{
	return (enum agent_phase)json_integer_value(json_object_get(e, "phase"));
}

/* The mirrors' hooks, under their lock. A list makes every pod's condition to be compared; an
 * object's change (its entry before, a deleted Checkpoint or Restore changing its pod's state
 * too, and after) that of its pod, a Restore's through its Checkpoint. */
static void changed_pod(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_gate *g = data;
	(void)old, (void)cur;
	if (key == NULL)
		mark_all_locked(g);
	else
		mark(g, key);
}

static void changed_ck(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_gate *g = data;
	if (key == NULL) {
		mark_all_locked(g);
		return;
	}
	json_t *e[2] = { old, cur };
	for (int i = 0; i < 2; i++)
		if (e[i] != NULL)
			mark_pod(g, json_string_value(json_object_get(e[i], "ns")),
				 json_string_value(json_object_get(e[i], "pod")));
}

static void changed_rs(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_gate *g = data;
	if (key == NULL) {
		mark_all_locked(g);
		return;
	}
	json_t *e[2] = { old, cur };
	for (int i = 0; i < 2; i++) {
		if (e[i] == NULL)
			continue;
		const char *ns = json_string_value(json_object_get(e[i], "ns")),
			   *ck = json_string_value(json_object_get(e[i], "ck"));
		char ckey[600];
		snprintf(ckey, sizeof(ckey), "%s/%s", ns ? ns : "", ck ? ck : "");
		mark_pod(g, ns, json_string_value(json_object_get(get_locked(g, G_CK, ckey), "pod")));
	}
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
	for (void *ci = agent_informer_next_locked(g->sub[G_CK], NULL, &ck, &c); ci != NULL;
	     ci = agent_informer_next_locked(g->sub[G_CK], ci, &ck, &c)) {
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
		for (void *ri = agent_informer_next_locked(g->sub[G_RS], NULL, &rk, &r); ri != NULL;
		     ri = agent_informer_next_locked(g->sub[G_RS], ri, &rk, &r)) {
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

/* Strategic merge of the one condition (merged by type): nothing else of the pod is written.
 * qkey: the pod's queue key, backed off after a failure. */
static int write_gate(struct agent_gate *g, const char *key, const char *qkey, enum gstate s)
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
	if (rc < 0) {
		int ms = rc == -ENOENT ? 0 : agent_workq_backoff(g->q, qkey); /* a pod gone is not retried */
		GCR_LOG(GCR_LOG_WARN, "gate", "pod %s: %s=%s not written (%s); compared again in %d ms", key,
			AGENT_PODSPEC_GATE_TYPE, states[s].status, err.msg, ms > 0 ? ms : RESYNC_MS);
		return rc;
	}
	agent_workq_forget(g->q, qkey);
	GCR_LOG(GCR_LOG_INFO, "gate", "pod %s: %s=%s (%s)", key, AGENT_PODSPEC_GATE_TYPE, states[s].status,
			states[s].reason);
	return rc;
}

/* The resync: the notes read again (a request: without the lock), every gated pod queued, and
 * the next resync in RESYNC_MS. */
static void resync(struct agent_gate *g)
{
	if (g->lease_ns != NULL) {
		json_t *notes = read_notes(g, &g->said);
		if (notes != NULL) {
			json_decref(g->notes);
			g->notes = notes;
		}
	}
	agent_informers_lock(g->inf);
	mark_all_locked(g);
	agent_informers_unlock(g->inf);
	if (agent_workq_add_after(g->q, RESYNC_KEY, RESYNC_MS) < 0)
		GCR_LOG(GCR_LOG_ERROR, "gate", "out of memory: no further resync");
}

/* Compares one pod's condition with what its objects say, and writes it when they differ. */
static void compare(struct agent_gate *g, const char *qkey)
{
	const char *key = qkey + 2, *slash = strchr(key, '/');
	enum gstate s = S_RESIDENT;
	int write = 0;
	agent_informers_lock(g->inf);
	/* Before the three lists, a pod would look resident while its Checkpoint is unseen; the
	 * last list to come queues every pod again. */
	int synced = agent_informer_synced_all_locked(g->sub, GN);
	json_t *p = synced && slash != NULL ? get_locked(g, G_POD, key) : NULL; /* NULL: no gate (any more) */
	if (p != NULL) {
		char ns[300];
		snprintf(ns, sizeof(ns), "%.*s", (int)(slash - key), key);
		s = want_locked(g, ns, slash + 1, json_string_value(json_object_get(p, "uid")));
		const char *cs = json_string_value(json_object_get(p, "status")),
			   *cr = json_string_value(json_object_get(p, "reason"));
		write = cs == NULL || strcmp(cs, states[s].status) != 0 ||
			(s != S_RESIDENT && (cr == NULL || strcmp(cr, states[s].reason) != 0));
	}
	agent_informers_unlock(g->inf);
	/* Only the leader writes, so two scaler replicas never alternate a condition; a new one
	 * compares every pod at its first resync. */
	if (!write || (g->leader != NULL && !agent_leader_is_leader(g->leader)) || write_gate(g, key, qkey, s) < 0)
		return;
	agent_informers_lock(g->inf); /* as written, until the pod's own event says so */
	p = get_locked(g, G_POD, key);
	if (p != NULL) {
		json_object_set_new(p, "status", json_string(states[s].status));
		json_object_set_new(p, "reason", json_string(states[s].reason));
	}
	agent_informers_unlock(g->inf);
}

static void *worker_main(void *data)
{
	struct agent_gate *g = data;
	char key[AGENT_WORKQ_KEY_MAX];
	while (agent_workq_get(g->q, key, sizeof(key)) == 1) {
		if (strcmp(key, RESYNC_KEY) == 0)
			resync(g);
		else
			compare(g, key);
		agent_workq_done(g->q, key);
	}
	return NULL;
}

int agent_gate_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		   struct agent_gate **out, struct gcr_err *err)
{
	*out = NULL;
	struct agent_gate *g = calloc(1, sizeof(*g));
	if (g == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	g->kube = kube;
	g->inf = inf;
	g->leader = leader;
	if ((g->q = agent_workq_new(RETRY_MS, RESYNC_MS)) == NULL || (g->notes = json_array()) == NULL) {
		agent_gate_free(g);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	const struct agent_informer_handler hs[GN] = {
		{ .slim = slim_pod, .changed = changed_pod, .data = g },
		{ .slim = slim_ck, .changed = changed_ck, .data = g },
		{ .slim = slim_rs, .changed = changed_rs, .data = g },
	};
	int rc = agent_informers_subscribe_n(inf, paths, hs, GN, g->sub, err);
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
	if (agent_workq_add_after(g->q, RESYNC_KEY, RESYNC_MS) < 0)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = pthread_create(&g->worker, NULL, worker_main, g);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the gate's worker: %s", strerror(rc));
	g->worker_started = 1;
	return 0;
}

int agent_gate_synced(struct agent_gate *g)
{
	agent_informers_lock(g->inf);
	int s = agent_informer_synced_all_locked(g->sub, GN);
	agent_informers_unlock(g->inf);
	return s;
}

void agent_gate_free(struct agent_gate *g)
{
	if (g == NULL)
		return;
	if (g->q != NULL)
		agent_workq_shutdown(g->q); /* the worker ends after the pod in hand */
	if (g->worker_started)
		pthread_join(g->worker, NULL);
	agent_workq_free(g->q);
	json_decref(g->notes);
	free(g->lease_ns);
	free(g);
}
