/* agent_scaler: the cluster-level GPUResidency controller. Every agent watches the
 * GPUResidency objects; only the elected leader acts: it turns spec.replicas into
 * Checkpoint and Restore objects for chosen pods (which nodes' agents then run) and
 * writes status. All it knows it reads back from the API, so a new leader resumes. The status
 * a pass writes is agent_scaler_status.c's; what the two share, agent_scaler_int.h. The objects
 * come from the process's shared mirror (kube/agent_informer); each is a key "s:ns/name" on a
 * work queue (kube/agent_workq), looked at again after BUSY_MS or the resync period, since its
 * pods and their nodes' notes are read, not watched. */
#include "agent_scaler.h"
#include "agent_scaler_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_lease.h"
#include "agent_phase.h"
#include "agent_scalemsg.h"
#include "gcr_log.h"
#include "gcr_time.h"
#include "gcr_scale.h"

/* While anything is in flight, passes run this often (ms): Checkpoints and Restores
 * end in well under a second, and the status should say so soon after. */
#define BUSY_MS 250
#define RESYNC_MS_DEFAULT 2000
/* Selected pods handled per GPUResidency at most (the CRD's status.pods maxItems). */
#define MAX_PODS 10000
/* Deleting a GPUResidency: Restores made per pod at most (failures counted from the API),
 * and the bound of the whole resume in s from metadata.deletionTimestamp; a pod still not
 * back then is given up on, so that a deletion never hangs. */
#define DELETE_ATTEMPTS 3
#define DELETE_BOUND_S 600
/* A node's note tells the state an operation of ours left only when sampled at least this
 * long (s) after the operation's completionTime, which has whole seconds: earlier, it may
 * predate the operation. */
#define NOTE_AFTER_S 1.0
/* Names listed in one SelectorConflict message at most (the rest are counted). */
#define CONFLICT_NAMES 8
/* How often (s) the leader makes sure every node running an agent pod has its heartbeat
 * Lease (the key LEASES_KEY): a new node's agent waits at most this (plus one heartbeat) to be
 * seen as live. */
#define KEEP_LEASES_S 5
#define LEASES_KEY "s-leases"

/* ---- small helpers ---- */

const char *agent_scaler_str_at(json_t *o, const char *a, const char *b)
{
	json_t *x = json_object_get(o, a);
	return json_string_value(b ? json_object_get(x, b) : x);
}

/* Seconds since the epoch of an RFC 3339 UTC time with optional fraction; -1 when malformed. */
double agent_scaler_parse_time(const char *s)
{
	struct tm tm = { 0 };
	const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (end == NULL)
		return -1;
	double frac = 0;
	if (*end == '.') {
		double scale = 0.1;
		for (end++; *end >= '0' && *end <= '9'; end++, scale /= 10)
			frac += (*end - '0') * scale;
	}
	return (double)timegm(&tm) + frac;
}

/* A request with a JSON body (stolen, may be NULL); the leader check comes first so
 * that an agent that lost its term writes nothing. 0 with *st, or -EIO / -EPERM. */
static int api(struct agent_scaler *s, const char *method, const char *path, const char *ctype, json_t *body,
	       long *st, json_t **out, struct gcr_err *err)
{
	char *text = NULL;
	if (out != NULL)
		*out = NULL;
	if (strcmp(method, "GET") != 0 && !agent_leader_is_leader(s->leader)) {
		json_decref(body);
		return gcr_err_set(err, -EPERM, "no longer the leader");
	}
	if (body != NULL) {
		text = json_dumps(body, JSON_COMPACT);
		json_decref(body);
		if (text == NULL)
			return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	int rc = agent_kube_request(s->kube, method, path, ctype, text, st, out, err);
	free(text);
	return rc;
}

/* ---- the GPUResidency objects (every agent follows them; cheap: few objects) ---- */

static void enqueue(struct agent_scaler *s, const char *key)
{
	char qk[AGENT_WORKQ_KEY_MAX];
	snprintf(qk, sizeof(qk), "s:%s", key);
	if (agent_workq_add(s->q, qk) < 0)
		GCR_LOG(GCR_LOG_WARN, "scaler", "%.300s: not queued (out of memory, or too long a name)", key);
}

/* The mirror's hook, under its lock: a change queues its object, a list every object. The view
 * is the watch's object itself (shared, so only read). */
static void res_changed(const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_scaler *s = data;
	const char *k;
	json_t *v;
	(void)old, (void)cur;
	if (key != NULL) {
		enqueue(s, key);
		return;
	}
	for (void *it = agent_informer_next_locked(s->sub, NULL, &k, &v); it != NULL;
	     it = agent_informer_next_locked(s->sub, it, &k, &v))
		enqueue(s, k);
}

/* ---- one GPUResidency ---- */

static int is_final(const struct opr *o)
{
	return o->phase == AGENT_PHASE_SUCCEEDED || o->phase == AGENT_PHASE_FAILED;
}

void agent_scaler_event(struct pass *p, const char *type, const char *reason, const char *fmt, ...)
{
	char note[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(note, sizeof(note), fmt, ap);
	va_end(ap);
	json_object_set_new(p->res, "apiVersion", json_string("gpucr.dev/v1alpha1"));
	json_object_set_new(p->res, "kind", json_string("GPUResidency"));
	struct gcr_err err;
	if (agent_kube_event(p->s->kube, p->res, type, reason, "Scale", note, agent_leader_identity(p->s->leader),
			     &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "scaler", "event for %s/%s: %s", p->ns, p->name, err.msg);
	GCR_LOG(GCR_LOG_INFO, "scaler", "%s/%s: %s: %s", p->ns, p->name, reason, note);
}

/* GET of a list into *out; 0 or -EIO. */
static int list(struct pass *p, const char *path, json_t **out)
{
	long st = 0;
	struct gcr_err err;
	if (api(p->s, "GET", path, NULL, NULL, &st, out, &err) < 0 || st != 200 ||
	    !json_is_array(json_object_get(*out, "items"))) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: GET %s: %s", p->ns, p->name, path,
			st ? "unexpected answer" : err.msg);
		return -EIO;
	}
	return 0;
}

static void add_ops(struct pass *p, json_t *items, enum okind kind)
{
	size_t i;
	json_t *it;
	json_array_foreach(items, i, it)
	{
		json_t *md = json_object_get(it, "metadata");
		const char *seq = agent_scaler_str_at(json_object_get(md, "annotations"), AGENT_SCALER_ANN_SEQ, NULL);
		const char *uid = agent_scaler_str_at(json_object_get(md, "labels"), AGENT_SCALER_LABEL_POD, NULL);
		const char *pod = agent_scaler_str_at(json_object_get(md, "annotations"), AGENT_SCALER_ANN_POD, NULL);
		if (seq == NULL || uid == NULL || pod == NULL || agent_scaler_str_at(md, "name", NULL) == NULL)
			continue; /* not one of ours after all */
		struct opr *o = &p->ops[p->nops++];
		*o = (struct opr){ .obj = it, .kind = kind, .seq = strtol(seq, NULL, 10),
				   .name = agent_scaler_str_at(md, "name", NULL), .pod_uid = uid, .pod_name = pod,
				   .phase = agent_phase_of(agent_scaler_str_at(it, "status", "phase")),
				   .message = agent_scaler_str_at(it, "status", "message") };
		json_t *conds = json_object_get(json_object_get(it, "status"), "conditions");
		o->reason = agent_scaler_str_at(json_array_get(conds, 0), "reason", NULL);
		const char *ct = agent_scaler_str_at(it, "status", "completionTime");
		o->completed = ct ? agent_scaler_parse_time(ct) : 0;
		o->on_delete =
			agent_scaler_str_at(json_object_get(md, "annotations"), AGENT_SCALER_ANN_ON_DELETE, NULL) != NULL;
	}
}

static struct podr *pod_of(struct pass *p, const char *uid)
{
	for (size_t i = 0; i < p->npods; i++)
		if (strcmp(p->pods[i].uid, uid) == 0)
			return &p->pods[i];
	return NULL;
}

/* Liveness and activity note of node (cached per pass): 1 live, 0 not, -EIO unknown. */
static int node_info(struct pass *p, const char *node, const char **note)
{
	json_t *e = json_object_get(p->nodes, node);
	if (e == NULL) {
		char *text = NULL;
		struct gcr_err err;
		int live = agent_lease_node_activity(p->s->kube, p->s->lease_ns, node, &text, &err);
		if (live < 0)
			GCR_LOG(GCR_LOG_WARN, "scaler", "node %s: %s", node, err.msg);
		e = json_pack("{s:i, s:s*}", "live", live, "note", text);
		free(text);
		json_object_set_new(p->nodes, node, e);
	}
	*note = agent_scaler_str_at(e, "note", NULL);
	return (int)json_integer_value(json_object_get(e, "live"));
}

/* The pod's state as its node's shims report it, from the note's per-state process counts;
 * -1 when unknown (no states, no process, or one that did not answer). *partial: some of
 * its processes suspended and some running. */
static int node_state(const struct agent_scalemsg_activity *a, int *partial)
{
	int total = 0;
	*partial = 0;
	for (int i = 0; i < GCR_SHIMREPLY_ST_N; i++)
		total += a->procs[i];
	if (!a->have_states || total == 0 || a->procs[GCR_SHIMREPLY_ST_UNKNOWN] > 0)
		return -1;
	/* A group member between steps of its group's operation counts as that operation. */
	if (a->procs[GCR_SHIMREPLY_ST_SUSPENDING] > 0 || a->procs[GCR_SHIMREPLY_ST_FROZEN] > 0 ||
	    a->procs[GCR_SHIMREPLY_ST_DRAINED] > 0)
		return GCR_SCALE_SUSPENDING;
	if (a->procs[GCR_SHIMREPLY_ST_RESUMING] > 0 || a->procs[GCR_SHIMREPLY_ST_DETACHED] > 0 ||
	    a->procs[GCR_SHIMREPLY_ST_REBUILDING] > 0 || a->procs[GCR_SHIMREPLY_ST_REBUILT] > 0)
		return GCR_SCALE_RESUMING;
	if (a->procs[GCR_SHIMREPLY_ST_RUNNING] == total)
		return GCR_SCALE_RESIDENT;
	*partial = a->procs[GCR_SHIMREPLY_ST_SUSPENDED] < total;
	return GCR_SCALE_SUSPENDED;
}

/* Status from the node's truth, not only from our operations: the state the latest one
 * left (r->state) is replaced by what the shims report when the note was sampled after it
 * ended and the two differ. A pod suspended (or being suspended or resumed) by anything
 * else, a user's Checkpoint or gcrctl on the node, is external: counted as it is, never
 * acted on (pinned), so the scaler neither suspends it again nor resumes what it did not
 * suspend. One we suspended that was resumed by other means is resident again. Our
 * operations in flight, and notes without states (older agents), leave r as it was. */
static void node_truth(struct podr *r, const struct agent_scalemsg_activity *a)
{
	int partial;
	int real = node_state(a, &partial);
	if (real < 0 || r->state == GCR_SCALE_UNMANAGED || r->state == GCR_SCALE_SUSPENDING ||
	    r->state == GCR_SCALE_RESUMING)
		return;
	if (r->latest != NULL && (!is_final(r->latest) || a->sampled < r->latest->completed + NOTE_AFTER_S))
		return; /* the note may predate what our operation did */
	if (real == (int)r->state && !partial)
		return;
	if (real == GCR_SCALE_RESIDENT) {
		snprintf(r->msg, sizeof(r->msg), "resumed by other means after %.150s", r->op[0] ? r->op : "its suspend");
		r->state = GCR_SCALE_RESIDENT;
		r->op[0] = '\0';
		return;
	}
	r->state = (enum gcr_scale_state)real;
	r->external = 1;
	r->pinned = 1;
	r->op[0] = '\0';
	if (partial)
		snprintf(r->msg, sizeof(r->msg), "%d of its %d processes suspended by other means (not by this "
			 "GPUResidency): left alone", a->procs[GCR_SHIMREPLY_ST_SUSPENDED],
			 a->procs[GCR_SHIMREPLY_ST_SUSPENDED] + a->procs[GCR_SHIMREPLY_ST_RUNNING]);
	else
		snprintf(r->msg, sizeof(r->msg), "%s by other means (a Checkpoint or gcrctl not of this "
			 "GPUResidency), as its node reports: left alone",
			 real == GCR_SCALE_SUSPENDED ? "suspended" : real == GCR_SCALE_SUSPENDING ? "being suspended"
											 : "being resumed");
}

/* Resident pods can be managed only with a live agent on their node listing a
 * shimmed process of theirs; fills activity either way. */
static void check_managed(struct pass *p, struct podr *r)
{
	const char *note = NULL;
	if (r->node == NULL || r->node[0] == '\0') {
		r->state = GCR_SCALE_UNMANAGED;
		snprintf(r->msg, sizeof(r->msg), "not scheduled to a node");
		return;
	}
	int live = node_info(p, r->node, &note);
	struct agent_scalemsg_activity act;
	struct gcr_err err;
	int found = note ? agent_scalemsg_activity_find(note, strlen(note), r->uid, &act, &err) : -ENOENT;
	if (found == 0) {
		r->last_active = act.last_active;
		r->calls = act.calls;
		if (live > 0)
			node_truth(r, &act);
	}
	if (r->state != GCR_SCALE_RESIDENT)
		return;
	if (live == 0) {
		r->state = GCR_SCALE_UNMANAGED;
		snprintf(r->msg, sizeof(r->msg), "no GCR agent on node %s (no live Lease)", r->node);
	} else if (live > 0 && found != 0) {
		r->state = GCR_SCALE_UNMANAGED;
		snprintf(r->msg, sizeof(r->msg), "no process under the GCR shim on node %s", r->node);
	} else if (live < 0) {
		r->pinned = 1; /* cannot tell: leave it this round */
	}
}

/* ---- selectors that overlap ---- */

/* Whether GPUResidency a is older than b, the rule for a pod both select: the oldest by
 * metadata.creationTimestamp acts on it, the name breaking ties (creationTimestamp has
 * whole seconds). Every leader computes the same answer from the objects alone. */
static int older(json_t *a, json_t *b)
{
	double ta = agent_scaler_parse_time(agent_scaler_str_at(a, "metadata", "creationTimestamp"));
	double tb = agent_scaler_parse_time(agent_scaler_str_at(b, "metadata", "creationTimestamp"));
	if (ta != tb)
		return ta < tb;
	return strcmp(agent_scaler_str_at(a, "metadata", "name"), agent_scaler_str_at(b, "metadata", "name")) < 0;
}

/* Another GPUResidency of p's namespace that may act on pods: a valid spec (an invalid one
 * acts on nothing) and not p's own object. Being deleted still counts: it resumes what it
 * suspended, and a shared pod is left to it until it is gone. */
static int rival(const struct pass *p, json_t *o)
{
	const char *ns = agent_scaler_str_at(o, "metadata", "namespace"), *uid = agent_scaler_str_at(o, "metadata", "uid");
	json_t *rj = json_object_get(json_object_get(o, "spec"), "replicas");
	return ns != NULL && uid != NULL && agent_scaler_str_at(o, "metadata", "name") != NULL && strcmp(ns, p->ns) == 0 &&
	       strcmp(uid, p->uid) != 0 && json_is_integer(rj) && json_integer_value(rj) >= 0;
}

/* Finds the selected pods another GPUResidency of the namespace selects too (its selector
 * read from the watch cache all, matched against the pods' labels here). A pod also
 * selected by an older one is contested: this one leaves it alone. Fills p->conflict with
 * the SelectorConflict condition's message (empty: none) and p->lost. */
static void find_conflicts(struct pass *p, json_t *all)
{
	size_t len = 0;
	const char *k;
	json_t *o;
	p->conflict[0] = '\0';
	json_object_foreach(all, k, o)
	{
		if (!rival(p, o))
			continue;
		json_t *sel = json_object_get(json_object_get(o, "spec"), "selector");
		int wins = older(o, p->res), shared = 0;
		char names[600] = "";
		size_t nl = 0;
		struct gcr_err err;
		for (size_t i = 0; i < p->npods; i++) {
			struct podr *r = &p->pods[i];
			if (!r->selected || agent_scalemsg_selector_match(sel, r->labels, &err) != 1)
				continue;
			if (wins && !r->contested) {
				r->contested = 1;
				r->winner = agent_scaler_str_at(o, "metadata", "name");
				p->lost++;
			}
			if (shared++ < CONFLICT_NAMES && nl < sizeof(names))
				nl += (size_t)snprintf(names + nl, sizeof(names) - nl, "%s%s", shared > 1 ? ", " : "", r->name);
		}
		if (shared == 0 || len >= sizeof(p->conflict))
			continue;
		len += (size_t)snprintf(p->conflict + len, sizeof(p->conflict) - len,
					"%sGPUResidency %s selects %d of the same pods (%s%s): %s", len ? "; " : "",
					agent_scaler_str_at(o, "metadata", "name"), shared, names,
					shared > CONFLICT_NAMES ? ", ..." : "",
					wins ? "it is older and acts on them, this one leaves them alone"
					     : "this one is older and acts on them, it leaves them alone");
	}
	p->conflict_checked = 1;
}

/* The state an operation leaves its pod in. */
static void state_from_op(struct podr *r, const struct opr *o, double now)
{
	snprintf(r->op, sizeof(r->op), "%s/%s", o->kind == O_CK ? "Checkpoint" : "Restore", o->name);
	int cool = o->completed > 0 && now - o->completed < COOLDOWN_S;
	if (o->kind == O_CK) {
		if (o->phase == AGENT_PHASE_SUCCEEDED) {
			r->state = GCR_SCALE_SUSPENDED;
		} else if (o->phase == AGENT_PHASE_FAILED) {
			r->state = GCR_SCALE_RESIDENT; /* a failed suspend leaves the process running */
			r->pinned = cool;
			snprintf(r->msg, sizeof(r->msg), "suspend failed: %.250s", o->message ? o->message : "");
		} else {
			r->state = GCR_SCALE_SUSPENDING;
		}
		return;
	}
	if (o->phase == AGENT_PHASE_SUCCEEDED) {
		r->state = GCR_SCALE_RESIDENT;
	} else if (o->phase == AGENT_PHASE_FAILED) {
		/* The process is not (or no longer) suspended: running, or gone and replaced. */
		static const char *const not_suspended[] = { "NotSuspended", "ProcessGone", "NoProcesses",
							     "CheckpointNotFound", "CheckpointFailed" };
		r->state = GCR_SCALE_SUSPENDED;
		for (size_t i = 0; i < sizeof(not_suspended) / sizeof(not_suspended[0]); i++)
			if (o->reason != NULL && strcmp(o->reason, not_suspended[i]) == 0)
				r->state = GCR_SCALE_RESIDENT;
		r->pinned = cool;
		snprintf(r->msg, sizeof(r->msg), "resume failed: %.250s", o->message ? o->message : "");
	} else {
		r->state = GCR_SCALE_RESUMING;
	}
}

/* The latest Succeeded Checkpoint of a pod: what a Restore restores. */
static const struct opr *last_checkpoint(struct pass *p, const char *uid)
{
	const struct opr *best = NULL;
	for (size_t i = 0; i < p->nops; i++) {
		const struct opr *o = &p->ops[i];
		if (o->kind == O_CK && strcmp(o->pod_uid, uid) == 0 && o->phase == AGENT_PHASE_SUCCEEDED &&
		    (best == NULL || o->seq > best->seq))
			best = o;
	}
	return best;
}

/* Creates the next operation of r: a Checkpoint (suspend) or a Restore of ck.
 * Deterministic name gcr-<pod uid>-<seq>: two leaders racing make one (409). */
static int create_op(struct pass *p, struct podr *r, enum okind kind, const char *ck)
{
	char name[128], seq[24], path[700];
	long n = r->max_seq + 1;
	snprintf(name, sizeof(name), "gcr-%s-%ld", r->uid, n);
	snprintf(seq, sizeof(seq), "%ld", n);
	json_t *spec = kind == O_CK ? json_pack("{s:s}", "podName", r->name) : json_pack("{s:s}", "checkpointName", ck);
	json_t *to = json_object_get(json_object_get(p->res, "spec"), "timeoutSeconds");
	if (json_is_integer(to))
		json_object_set(spec, "timeoutSeconds", to);
	/* Owned by the pod: when it is deleted, the garbage collector removes these too
	 * (the leader also does, for clusters without one). */
	json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:s, s:s}, s:[{s:s, s:s, s:s, s:s}]}, s:o}",
				"apiVersion", "gpucr.dev/v1alpha1", "kind", kind == O_CK ? "Checkpoint" : "Restore",
				"metadata", "name", name, "namespace", p->ns, "labels", AGENT_SCALER_LABEL_OWNER, p->uid,
				AGENT_SCALER_LABEL_POD, r->uid, "annotations", AGENT_SCALER_ANN_POD, r->name,
				AGENT_SCALER_ANN_SEQ, seq, AGENT_SCALER_ANN_RESIDENCY, p->name, "ownerReferences",
				"apiVersion", "v1", "kind", "Pod", "name", r->name, "uid", r->uid, "spec", spec);
	if (p->deleting)
		json_object_set_new(json_object_get(json_object_get(obj, "metadata"), "annotations"),
				    AGENT_SCALER_ANN_ON_DELETE, json_string("true"));
	snprintf(path, sizeof(path), API "/namespaces/%s/%s", p->ns, kind == O_CK ? "checkpoints" : "restores");
	long st = 0;
	struct gcr_err err;
	int rc = api(p->s, "POST", path, "application/json", obj, &st, NULL, &err);
	if (rc == 0 && st != 201 && st != 409)
		rc = -EIO;
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: create %s %s: %s", p->ns, p->name,
			kind == O_CK ? "Checkpoint" : "Restore", name, err.msg);
		p->errors++;
		return rc;
	}
	GCR_LOG(GCR_LOG_INFO, "scaler", "%s/%s: pod %s: %s %s%s", p->ns, p->name, r->name,
		kind == O_CK ? "suspend: Checkpoint" : "resume: Restore", name, st == 409 ? " (existed)" : "");
	r->max_seq = n;
	snprintf(r->op, sizeof(r->op), "%s/%s", kind == O_CK ? "Checkpoint" : "Restore", name);
	r->state = kind == O_CK ? GCR_SCALE_SUSPENDING : GCR_SCALE_RESUMING;
	r->msg[0] = '\0';
	p->created++;
	return 0;
}

static void delete_op(struct pass *p, const struct opr *o)
{
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/%s/%s", p->ns, o->kind == O_CK ? "checkpoints" : "restores",
		 o->name);
	long st = 0;
	struct gcr_err err;
	if (api(p->s, "DELETE", path, NULL, NULL, &st, NULL, &err) < 0 || (st != 200 && st != 202 && st != 404)) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: delete %s: %s", p->ns, p->name, o->name,
			st ? "unexpected answer" : err.msg);
		p->errors++;
		return;
	}
	p->deleted++;
}

/* Removes what no longer decides anything: every finished operation of r other than
 * its latest and the Checkpoint that one restores. Never one in flight. */
static void prune(struct pass *p, const struct podr *r)
{
	/* A Restore in flight or failed still needs its Checkpoint; a Succeeded one does not. */
	const char *keep_ck = r->latest && r->latest->kind == O_RS && r->latest->phase != AGENT_PHASE_SUCCEEDED
				      ? agent_scaler_str_at(r->latest->obj, "spec", "checkpointName")
				      : NULL;
	for (size_t i = 0; i < p->nops; i++) {
		const struct opr *o = &p->ops[i];
		if (strcmp(o->pod_uid, r->uid) != 0 || o == r->latest || !is_final(o))
			continue;
		if (keep_ck != NULL && o->kind == O_CK && strcmp(o->name, keep_ck) == 0)
			continue;
		if (!r->gone && r->state == GCR_SCALE_SUSPENDED && o == last_checkpoint(p, r->uid))
			continue; /* what a later Restore needs */
		delete_op(p, o);
	}
}

/* A pod with operations that the selector no longer picks (or any, while deleting):
 * deleted (its operations go; its staging memory went with its process) or
 * relabelled (with resume: resumed if suspended, then let go). Fills r. */
static void not_selected(struct pass *p, struct podr *r, int resume)
{
	char path[700];
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", p->ns, r->name);
	long st = 0;
	json_t *pod = NULL;
	struct gcr_err err;
	if (api(p->s, "GET", path, NULL, NULL, &st, &pod, &err) < 0 || (st != 200 && st != 404)) {
		r->pinned = 1;
		p->errors++;
		json_decref(pod);
		return;
	}
	const char *uid = agent_scaler_str_at(pod, "metadata", "uid");
	r->gone = st == 404 || uid == NULL || strcmp(uid, r->uid) != 0 ||
		  json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp") != NULL;
	if (!r->gone && json_array_append(p->keep, pod) == 0) {
		if (r->node == NULL)
			r->node = agent_scaler_str_at(pod, "spec", "nodeName");
		r->phase = agent_phase_of(agent_scaler_str_at(pod, "status", "phase"));
	}
	json_decref(pod);
	if (r->gone) {
		int was_suspended = r->state == GCR_SCALE_SUSPENDED || r->state == GCR_SCALE_SUSPENDING;
		snprintf(r->msg, sizeof(r->msg), "pod deleted%s", was_suspended ? " while suspended" : "");
		for (size_t i = 0; i < p->nops; i++)
			if (strcmp(p->ops[i].pod_uid, r->uid) == 0)
				delete_op(p, &p->ops[i]);
		agent_scaler_event(p, "Normal", "PodGone",
				   "pod %s (uid %s) was deleted%s; its Checkpoint and Restore objects were removed, its "
				   "host staging memory went with its process",
				   r->name, r->uid, was_suspended ? " while suspended" : "");
		return;
	}
	if (!resume)
		return;
	snprintf(r->msg, sizeof(r->msg), "no longer selected%s",
		 r->state == GCR_SCALE_SUSPENDED ? ": resuming it before letting go" : "");
	if (r->state == GCR_SCALE_SUSPENDED && !r->pinned) {
		const struct opr *ck = last_checkpoint(p, r->uid);
		if (ck != NULL)
			create_op(p, r, O_RS, ck->name);
	} else if (r->state == GCR_SCALE_RESIDENT) {
		r->latest = NULL; /* let go: every finished operation is removed */
		prune(p, r);
	}
}

/* ---- deletion: the finalizer ---- */

static int has_finalizer(json_t *res)
{
	size_t i;
	json_t *f;
	json_array_foreach(json_object_get(json_object_get(res, "metadata"), "finalizers"), i, f)
	{
		if (json_is_string(f) && strcmp(json_string_value(f), AGENT_SCALER_FINALIZER) == 0)
			return 1;
	}
	return 0;
}

/* Adds or removes our finalizer (agent_kube_set_finalizer: the whole list with the
 * resourceVersion read, so a concurrent change fails with 409 and is redone next pass). */
static int set_finalizer(struct pass *p, int add)
{
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/gpuresidencies/%s", p->ns, p->name);
	struct gcr_err err;
	int rc = agent_leader_is_leader(p->s->leader)
			 ? agent_kube_set_finalizer(p->s->kube, path, p->res, AGENT_SCALER_FINALIZER, add, &err)
			 : gcr_err_set(&err, -EPERM, "no longer the leader");
	if (rc < 0)
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: %s finalizer %s: %s", p->ns, p->name, add ? "add" : "remove",
			AGENT_SCALER_FINALIZER, err.msg);
	else
		GCR_LOG(GCR_LOG_INFO, "scaler", "%s/%s: finalizer %s %s", p->ns, p->name, AGENT_SCALER_FINALIZER,
			add ? "added" : "removed");
	return rc;
}

/* Failed Restores the finalizer made for r: its attempts so far. */
static int delete_attempts(const struct pass *p, const struct podr *r)
{
	int n = 0;
	for (size_t i = 0; i < p->nops; i++) {
		const struct opr *o = &p->ops[i];
		n += o->kind == O_RS && o->on_delete && o->phase == AGENT_PHASE_FAILED && strcmp(o->pod_uid, r->uid) == 0;
	}
	return n;
}

/* One pass over a GPUResidency being deleted. Every pod it suspended that still exists is
 * resumed (Restores as for a scale-up); pods gone, not Running or never suspended are
 * skipped. A pod is given up on (left suspended, its operations kept so that a Restore of
 * its Checkpoint can still be made by hand; they go with the pod) after DELETE_ATTEMPTS
 * failed Restores, when its node has no live agent, or DELETE_BOUND_S after the deletion
 * began; then a Warning Event and the Ready condition say so. Once nothing is in flight
 * the other operations are removed, then the finalizer. Returns 1 while work is left. */
static int finalize(struct pass *p, double now)
{
	int pending = 0, given_up = 0, resumed = 0;
	char names[600] = "";
	double since =
		agent_scaler_parse_time(agent_scaler_str_at(json_object_get(p->res, "metadata"), "deletionTimestamp", NULL));
	int overdue = since > 0 && now - since > DELETE_BOUND_S;
	for (size_t i = 0; i < p->npods; i++) {
		struct podr *r = &p->pods[i];
		if (r->latest != NULL)
			state_from_op(r, r->latest, now);
		not_selected(p, r, 0);
		if (r->gone || p->errors > 0)
			continue; /* gone: its operations removed; an API error: next pass */
		if (r->latest != NULL && r->latest->on_delete && r->latest->phase == AGENT_PHASE_SUCCEEDED)
			resumed++;
		if (r->state == GCR_SCALE_RESIDENT || r->phase != AGENT_PHASE_RUNNING)
			continue; /* nothing to resume, or no process to resume */
		const char *note = NULL;
		int attempts = delete_attempts(p, r);
		if (r->state == GCR_SCALE_SUSPENDING || r->state == GCR_SCALE_RESUMING) {
			if (!overdue) {
				pending++;
				continue;
			}
			note = "still in flight when the deletion's time ran out";
		} else if (attempts >= DELETE_ATTEMPTS) {
			note = "its Restores failed";
		} else if (overdue) {
			note = "the deletion's time ran out";
		} else if (r->node == NULL || node_info(p, r->node, &note) == 0) {
			note = "no live GCR agent on its node";
		} else if (r->pinned) {
			note = NULL; /* the cool-down after a failed Restore */
			pending++;
			continue;
		} else {
			note = NULL;
			const struct opr *ck = last_checkpoint(p, r->uid);
			if (ck == NULL) {
				note = "no Succeeded Checkpoint to restore";
			} else {
				create_op(p, r, O_RS, ck->name);
				pending++; /* an API error is retried next pass */
				continue;
			}
		}
		r->given_up = 1;
		given_up++;
		size_t len = strlen(names);
		snprintf(names + len, sizeof(names) - len, "%s%s (%s%s%s)", len ? ", " : "", r->name, note,
			 r->latest ? "; last: " : "", r->latest ? r->op : "");
	}
	char msg[800];
	if (pending > 0 || p->errors > 0) {
		snprintf(msg, sizeof(msg), "being deleted: resuming the pods it suspended (%d in flight)", pending);
		agent_scaler_write_ready(p, "False", "Deleting", msg);
		return 1;
	}
	if (given_up > 0) {
		snprintf(msg, sizeof(msg), "being deleted: %d pod(s) left suspended: %.600s", given_up, names);
		agent_scaler_write_ready(p, "False", "ResumeOnDeleteFailed", msg);
	}
	for (size_t i = 0; i < p->nops; i++) {
		const struct podr *r = pod_of(p, p->ops[i].pod_uid);
		if (r == NULL || (!r->gone && !r->given_up))
			delete_op(p, &p->ops[i]); /* a gone pod's went in not_selected */
	}
	if (p->errors > 0 || set_finalizer(p, 0) < 0)
		return 1;
	if (given_up > 0)
		agent_scaler_event(p, "Warning", "ResumeOnDeleteFailed",
				   "deleted with %d pod(s) left suspended: %s; their Checkpoints are kept (create a "
				   "Restore of one to resume its pod)", given_up, names);
	else
		agent_scaler_event(p, "Normal", "ResumedOnDelete",
				   "deleted: %d pod(s) resumed first; the Checkpoints and Restores it made were removed",
				   resumed);
	return 0;
}

/* One pass over one GPUResidency. Returns 1 when work is in flight (come back soon). */
static int reconcile(struct agent_scaler *s, json_t *res, json_t *all)
{
	struct pass p = { .s = s, .res = res, .ns = agent_scaler_str_at(res, "metadata", "namespace"),
			  .name = agent_scaler_str_at(res, "metadata", "name"),
			  .uid = agent_scaler_str_at(res, "metadata", "uid") };
	int busy = 0;
	if (p.ns == NULL || p.name == NULL || p.uid == NULL)
		return 0;
	p.deleting = json_object_get(json_object_get(res, "metadata"), "deletionTimestamp") != NULL;
	if (p.deleting && !has_finalizer(res))
		return 0; /* released already (or never held) */
	/* Nothing is suspended before the finalizer is on, so a deletion always finds its pods. */
	if (!p.deleting && !has_finalizer(res) && set_finalizer(&p, 1) < 0)
		return 1;
	json_t *spec = json_object_get(res, "spec");
	json_t *rj = json_object_get(spec, "replicas");
	int replicas = json_is_integer(rj) ? (int)json_integer_value(rj) : -1;
	struct gcr_err err;
	char q[3 * AGENT_SCALEMSG_SELECTOR_MAX], path[4 * AGENT_SCALEMSG_SELECTOR_MAX], own[200], ownq[400];
	if (!p.deleting) { /* deleting: only the pods of its operations matter, whatever the spec */
		if (agent_scalemsg_selector(json_object_get(spec, "selector"), p.selector, sizeof(p.selector),
					    &err) < 0) {
			agent_scaler_write_ready(&p, "False", "InvalidSelector", err.msg);
			return 0;
		}
		if (replicas < 0) {
			agent_scaler_write_ready(&p, "False", "InvalidSpec", "spec.replicas is missing or negative");
			return 0;
		}
		if (agent_scalemsg_query_escape(p.selector, q, sizeof(q)) < 0)
			return 0;
		snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods?labelSelector=%s", p.ns, q);
		if (list(&p, path, &p.pods_list) < 0)
			goto out;
	}
	snprintf(own, sizeof(own), AGENT_SCALER_LABEL_OWNER "=%s", p.uid);
	if (agent_scalemsg_query_escape(own, ownq, sizeof(ownq)) < 0)
		goto out;
	snprintf(path, sizeof(path), API "/namespaces/%s/checkpoints?labelSelector=%s", p.ns, ownq);
	if (list(&p, path, &p.ck_list) < 0)
		goto out;
	snprintf(path, sizeof(path), API "/namespaces/%s/restores?labelSelector=%s", p.ns, ownq);
	if (list(&p, path, &p.rs_list) < 0)
		goto out;
	json_t *pitems = json_object_get(p.pods_list, "items"), *citems = json_object_get(p.ck_list, "items"),
	       *ritems = json_object_get(p.rs_list, "items");
	size_t nops = json_array_size(citems) + json_array_size(ritems);
	size_t npods = json_array_size(pitems) + nops; /* plus pods known only from operations */
	if (npods > MAX_PODS)
		npods = MAX_PODS;
	p.ops = calloc(nops ? nops : 1, sizeof(*p.ops));
	p.pods = calloc(npods ? npods : 1, sizeof(*p.pods));
	p.nodes = json_object();
	p.keep = json_array();
	if (p.ops == NULL || p.pods == NULL || p.nodes == NULL || p.keep == NULL)
		goto out;
	add_ops(&p, citems, O_CK);
	add_ops(&p, ritems, O_RS);
	double now = gcr_time_wall_s();
	size_t i;
	json_t *it;
	json_array_foreach(pitems, i, it)
	{
		const char *uid = agent_scaler_str_at(it, "metadata", "uid"),
			   *name = agent_scaler_str_at(it, "metadata", "name");
		if (p.npods >= npods || uid == NULL || name == NULL ||
		    json_object_get(json_object_get(it, "metadata"), "deletionTimestamp") != NULL)
			continue; /* going away: handled below, as not selected */
		struct podr *r = &p.pods[p.npods++];
		*r = (struct podr){ .name = name, .uid = uid, .node = agent_scaler_str_at(it, "spec", "nodeName"),
				    .selected = 1,
				    .labels = json_object_get(json_object_get(it, "metadata"), "labels"),
				    .state = GCR_SCALE_RESIDENT };
		const char *phase = agent_scaler_str_at(it, "status", "phase");
		if (agent_phase_of(phase) != AGENT_PHASE_RUNNING) {
			r->state = GCR_SCALE_UNMANAGED;
			snprintf(r->msg, sizeof(r->msg), "pod is %s, not Running", phase ? phase : "without a phase");
		}
	}
	for (i = 0; i < p.nops; i++) {
		struct podr *r = pod_of(&p, p.ops[i].pod_uid);
		if (r == NULL && p.npods < npods) {
			r = &p.pods[p.npods++];
			*r = (struct podr){ .name = p.ops[i].pod_name, .uid = p.ops[i].pod_uid, .state = GCR_SCALE_RESIDENT };
		}
		if (r == NULL)
			continue;
		if (p.ops[i].seq > r->max_seq)
			r->max_seq = p.ops[i].seq;
		if (r->latest == NULL || p.ops[i].seq > r->latest->seq)
			r->latest = &p.ops[i];
	}
	if (p.deleting) {
		busy = finalize(&p, now);
		goto out;
	}
	find_conflicts(&p, all);
	/* States from the latest operation, then the node's truth and who is manageable. */
	struct gcr_scale_member *m = calloc(p.npods ? p.npods : 1, sizeof(*m));
	struct podr **mp = calloc(p.npods ? p.npods : 1, sizeof(*mp));
	size_t nm = 0;
	if (m == NULL || mp == NULL) {
		free(m);
		free(mp);
		goto out;
	}
	for (i = 0; i < p.npods; i++) {
		struct podr *r = &p.pods[i];
		if (r->latest != NULL && r->state != GCR_SCALE_UNMANAGED)
			state_from_op(r, r->latest, now);
		if (!r->selected) {
			not_selected(&p, r, 1);
			busy |= !r->gone && (r->state == GCR_SCALE_SUSPENDING || r->state == GCR_SCALE_RESUMING ||
					     r->state == GCR_SCALE_SUSPENDED);
			continue;
		}
		check_managed(&p, r);
		if (r->contested) {
			/* Left to the older object; what this one suspended itself it resumes first,
			 * as for a pod leaving the selection, so that nothing stays suspended by an
			 * object that no longer acts on it. */
			const struct opr *ck = last_checkpoint(&p, r->uid);
			if (r->state == GCR_SCALE_SUSPENDED && !r->external && !r->pinned && ck != NULL)
				create_op(&p, r, O_RS, ck->name);
			snprintf(r->msg, sizeof(r->msg), "also selected by GPUResidency %.200s, which is older and acts on "
				 "it: left alone%s", r->winner, r->state == GCR_SCALE_RESUMING ? " once resumed" : "");
			continue;
		}
		m[nm] = (struct gcr_scale_member){ .id = r->name, .state = r->state, .last_active = r->last_active,
						   .recent_calls = r->calls, .pinned = r->pinned };
		mp[nm++] = r;
	}
	struct gcr_scale_plan plan;
	if (gcr_scale_plan(m, nm, replicas, &plan, &err) < 0) {
		free(m);
		free(mp);
		goto out;
	}
	for (i = 0; i < nm; i++) {
		struct podr *r = mp[i];
		if (m[i].action == GCR_SCALE_SUSPEND) {
			create_op(&p, r, O_CK, NULL);
		} else if (m[i].action == GCR_SCALE_RESUME) {
			const struct opr *ck = last_checkpoint(&p, r->uid);
			if (ck != NULL)
				create_op(&p, r, O_RS, ck->name);
		}
	}
	free(m);
	free(mp);
	for (i = 0; i < p.npods; i++)
		if (p.pods[i].selected)
			prune(&p, &p.pods[i]);
	for (i = 0; i < p.npods; i++) {
		struct podr *r = &p.pods[i];
		if (r->selected && (r->state == GCR_SCALE_SUSPENDING || r->state == GCR_SCALE_RESUMING))
			busy = 1;
	}
	busy |= plan.waiting > 0 || p.created > 0;
	agent_scaler_conflict_events(&p);
	agent_scaler_write_status(&p, replicas, &plan, busy);
	busy |= p.errors > 0;
out:
	free(p.ops);
	free(p.pods);
	json_decref(p.pods_list);
	json_decref(p.ck_list);
	json_decref(p.rs_list);
	json_decref(p.nodes);
	json_decref(p.keep);
	return busy;
}

/* ---- the nodes' heartbeat Leases ---- */

/* Creates the missing heartbeat Lease of every node where an agent pod (agent_selq) is
 * scheduled. The node identity may only get and update Leases (the API server authorizes a
 * PUT on a missing object as a create), so the first one comes from here. A Lease whose
 * node's agent pod is gone is left: expired, it reads as "no agent" just as a missing one
 * does, and deleting it would race a re-created agent pod for no gain. */
static void keep_leases(struct agent_scaler *s)
{
	char path[AGENT_SCALEMSG_SELECTOR_MAX + 200];
	long st = 0;
	struct gcr_err err;
	json_t *pods = NULL, *leases = NULL, *have = json_object();
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods?labelSelector=%s&resourceVersion=0", s->lease_ns,
		 s->agent_selq);
	if (have == NULL || api(s, "GET", path, NULL, NULL, &st, &pods, &err) < 0 || st != 200) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "agent pods in %s: %s", s->lease_ns,
			st ? "unexpected answer to the list" : err.msg);
		goto out;
	}
	snprintf(path, sizeof(path), "/apis/coordination.k8s.io/v1/namespaces/%s/leases?resourceVersion=0",
		 s->lease_ns);
	st = 0;
	if (api(s, "GET", path, NULL, NULL, &st, &leases, &err) < 0 || st != 200) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "leases in %s: %s", s->lease_ns,
			st ? "unexpected answer to the list" : err.msg);
		goto out;
	}
	size_t i;
	json_t *it;
	json_array_foreach(json_object_get(leases, "items"), i, it)
	{
		const char *n = agent_scaler_str_at(json_object_get(it, "metadata"), "name", NULL);
		if (n != NULL)
			json_object_set_new(have, n, json_true());
	}
	json_array_foreach(json_object_get(pods, "items"), i, it)
	{
		const char *node = agent_scaler_str_at(json_object_get(it, "spec"), "nodeName", NULL);
		char name[300];
		if (node == NULL || node[0] == '\0')
			continue; /* not scheduled yet */
		snprintf(name, sizeof(name), "gcr-agent-%s", node);
		if (json_object_get(have, name) != NULL)
			continue;
		if (!agent_leader_is_leader(s->leader) || atomic_load(&s->stop))
			break;
		int rc = agent_lease_create_idle(s->kube, s->lease_ns, node, &err);
		if (rc < 0)
			GCR_LOG(GCR_LOG_WARN, "scaler", "%s; retrying in %d s", err.msg, KEEP_LEASES_S);
		else if (rc == 1)
			GCR_LOG(GCR_LOG_INFO, "scaler", "created heartbeat lease %s/%s for agent pod %s", s->lease_ns,
				name, agent_scaler_str_at(it, "metadata", "name"));
		json_object_set_new(have, name, json_true()); /* one attempt per node per round */
	}
out:
	json_decref(pods);
	json_decref(leases);
	json_decref(have);
}

/* ---- worker ---- */

/* One GPUResidency (key "s:ns/name"), by the leader: reconciled, then looked at again after
 * BUSY_MS while work is in flight, else after the resync period. A follower only keeps its key
 * coming, so that it acts within a period of winning a term. Gone: dropped. */
static void process_res(struct agent_scaler *s, const char *key)
{
	json_t *res = NULL, *all = json_object();
	const char *k;
	json_t *v;
	int lead = agent_leader_is_leader(s->leader);
	agent_informers_lock(s->inf);
	json_t *cur = agent_informer_get_locked(s->sub, key + 2);
	if (cur != NULL && lead) {
		res = json_deep_copy(cur); /* the pass writes on it (an Event's kind) */
		for (void *it = agent_informer_next_locked(s->sub, NULL, &k, &v); it != NULL && all != NULL;
		     it = agent_informer_next_locked(s->sub, it, &k, &v))
			json_object_set(all, k, v); /* shared, only read: the other objects' selectors */
	}
	agent_informers_unlock(s->inf);
	int busy = 0;
	if (res != NULL && all != NULL)
		busy = reconcile(s, res, all);
	else if (cur != NULL && lead)
		busy = 1; /* out of memory: soon again */
	json_decref(res);
	json_decref(all);
	if (cur != NULL && agent_workq_add_after(s->q, key, busy ? BUSY_MS : s->resync_ms) < 0)
		GCR_LOG(GCR_LOG_WARN, "scaler", "%.300s: not queued again (out of memory)", key);
}

static void *worker_main(void *data)
{
	struct agent_scaler *s = data;
	char key[AGENT_WORKQ_KEY_MAX];
	while (agent_workq_get(s->q, key, sizeof(key)) == 1) {
		if (strcmp(key, LEASES_KEY) == 0) {
			int lead = agent_leader_is_leader(s->leader);
			if (s->agent_selq != NULL && lead)
				keep_leases(s);
			/* A follower looks again as often as at its objects, to begin soon after a win. */
			if (agent_workq_add_after(s->q, LEASES_KEY, lead ? KEEP_LEASES_S * 1000 : s->resync_ms) < 0)
				GCR_LOG(GCR_LOG_ERROR, "scaler", "out of memory: heartbeat Leases no longer made");
		} else {
			process_res(s, key);
		}
		agent_workq_done(s->q, key);
	}
	return NULL;
}

/* ---- life cycle ---- */

int agent_scaler_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		     const struct agent_scaler_cfg *cfg, struct agent_scaler **out, struct gcr_err *err)
{
	*out = NULL;
	struct agent_scaler *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	s->kube = kube;
	s->inf = inf;
	s->leader = leader;
	s->resync_ms = cfg->resync_ms > 0 ? cfg->resync_ms : RESYNC_MS_DEFAULT;
	s->lease_ns = strdup(cfg->lease_namespace ? cfg->lease_namespace : "gcr-system");
	s->q = agent_workq_new(BUSY_MS, s->resync_ms);
	if (s->lease_ns == NULL || s->q == NULL) {
		agent_scaler_free(s);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	/* Every agent follows them (cheap: few objects); the leader acts on them. */
	const struct agent_informer_handler h = { .changed = res_changed, .data = s };
	int rc = agent_informers_subscribe(inf, API "/gpuresidencies", NULL, &h, &s->sub, err);
	if (rc < 0) {
		agent_scaler_free(s);
		return rc;
	}
	if (cfg->agent_selector != NULL && cfg->agent_selector[0] != '\0') {
		char q[AGENT_SCALEMSG_SELECTOR_MAX];
		if (agent_scalemsg_query_escape(cfg->agent_selector, q, sizeof(q)) < 0 ||
		    (s->agent_selq = strdup(q)) == NULL) {
			agent_scaler_free(s);
			return gcr_err_set(err, -EINVAL, "--agent-selector: too long or out of memory");
		}
	}
	*out = s;
	return 0;
}

int agent_scaler_start(struct agent_scaler *s, struct gcr_err *err)
{
	if (agent_workq_add(s->q, LEASES_KEY) < 0)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = pthread_create(&s->worker, NULL, worker_main, s);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the scaler: %s", strerror(rc));
	s->worker_started = 1;
	return 0;
}

void agent_scaler_free(struct agent_scaler *s)
{
	if (s == NULL)
		return;
	atomic_store(&s->stop, 1); /* a keep_leases in flight ends early */
	if (s->q != NULL)
		agent_workq_shutdown(s->q); /* the worker ends after the object in hand */
	if (s->worker_started)
		pthread_join(s->worker, NULL);
	agent_workq_free(s->q);
	free(s->lease_ns);
	free(s->agent_selq);
	free(s);
}
