/* agent_scaler_status: what a pass of the GPUResidency controller (agent_scaler.c) writes on its
 * object: the status (counts, each pod's state, lastScale), the Ready and SelectorConflict
 * conditions, and the Events of a conflict that begins, changes or ends and of a target reached.
 * Written only when it differs from what is stored, and only by the leader. */
#include "agent_scaler.h"
#include "agent_scaler_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "gcr_log.h"
#include "gcr_scale.h"

static void fmt_time(char *buf, size_t len, double t)
{
	time_t sec = (time_t)t;
	struct tm tm;
	gmtime_r(&sec, &tm);
	char base[32];
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%06ldZ", base, (long)((t - (double)sec) * 1e6));
}

/* The condition of that type in a status, or NULL. */
static json_t *old_cond(json_t *old_status, const char *type)
{
	size_t i;
	json_t *c, *found = NULL;
	json_array_foreach(json_object_get(old_status, "conditions"), i, c)
	{
		if (agent_scaler_str_at(c, "type", NULL) && strcmp(agent_scaler_str_at(c, "type", NULL), type) == 0)
			found = c;
	}
	return found;
}

static json_t *cond_one(const char *type, const char *status, const char *reason, const char *msg,
			json_t *old_status, json_int_t gen)
{
	char now[40];
	agent_kube_time(now, sizeof(now), 0);
	json_t *old = old_cond(old_status, type);
	const char *since = now;
	if (old != NULL && agent_scaler_str_at(old, "status", NULL) &&
	    strcmp(agent_scaler_str_at(old, "status", NULL), status) == 0 &&
	    agent_scaler_str_at(old, "lastTransitionTime", NULL))
		since = agent_scaler_str_at(old, "lastTransitionTime", NULL);
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:I}", "type", type, "status", status, "reason", reason, "message",
			 msg, "lastTransitionTime", since, "observedGeneration", gen);
}

/* The conditions: Ready first (write_ready compares its message), then SelectorConflict:
 * from this pass when it looked for conflicts, else as it was. */
static json_t *cond_json(const struct pass *p, const char *status, const char *reason, const char *msg,
			 json_t *old_status, json_int_t gen)
{
	json_t *conds = json_pack("[o]", cond_one("Ready", status, reason, msg, old_status, gen));
	json_t *sc = NULL;
	if (p->conflict_checked && p->conflict[0] != '\0')
		sc = cond_one("SelectorConflict", "True", "SelectorConflict", p->conflict, old_status, gen);
	else if (p->conflict_checked)
		sc = cond_one("SelectorConflict", "False", "NoConflict",
			      "no other GPUResidency of the namespace selects any of its pods", old_status, gen);
	else if (old_cond(old_status, "SelectorConflict") != NULL)
		sc = json_deep_copy(old_cond(old_status, "SelectorConflict"));
	if (sc != NULL)
		json_array_append_new(conds, sc);
	return conds;
}

/* Warning Event when a conflict begins or changes, Normal when it ends: once per change,
 * told by the stored condition (an Event lost with a failed status write comes next pass). */
void agent_scaler_conflict_events(struct pass *p)
{
	json_t *old = old_cond(json_object_get(p->res, "status"), "SelectorConflict");
	const char *was = agent_scaler_str_at(old, "status", NULL), *oldmsg = agent_scaler_str_at(old, "message", NULL);
	int was_true = was != NULL && strcmp(was, "True") == 0;
	if (!p->conflict_checked)
		return;
	if (p->conflict[0] != '\0' && (!was_true || oldmsg == NULL || strcmp(oldmsg, p->conflict) != 0))
		agent_scaler_event(p, "Warning", "SelectorConflict", "%s", p->conflict);
	else if (p->conflict[0] == '\0' && was_true)
		agent_scaler_event(p, "Normal", "SelectorConflictResolved", "no other GPUResidency of the namespace "
				   "selects any of its pods any more");
}

/* The status patch: counts, per-pod states, Ready, lastScale. Written only when it
 * differs from what is stored. */
void agent_scaler_write_status(struct pass *p, int replicas, const struct gcr_scale_plan *plan, int busy)
{
	json_t *old = json_object_get(p->res, "status");
	json_int_t gen = json_integer_value(json_object_get(json_object_get(p->res, "metadata"), "generation"));
	int n[5] = { 0 }, selected = 0, external = 0;
	json_t *pods = json_array();
	for (size_t i = 0; i < p->npods; i++) {
		struct podr *r = &p->pods[i];
		if (r->gone)
			continue;
		if (r->selected) {
			n[r->state]++;
			selected++;
			external += r->external && !r->contested;
		}
		json_t *e = json_pack("{s:s, s:s, s:s}", "name", r->name, "uid", r->uid, "state",
				      gcr_scale_state_name(r->state));
		if (r->node)
			json_object_set_new(e, "node", json_string(r->node));
		if (r->op[0])
			json_object_set_new(e, "operation", json_string(r->op));
		if (r->last_active > 0) {
			char t[40];
			fmt_time(t, sizeof(t), r->last_active);
			json_object_set_new(e, "lastActivity", json_string(t));
		}
		if (r->msg[0])
			json_object_set_new(e, "message", json_string(r->msg));
		json_array_append_new(pods, e);
	}
	char msg[600];
	const char *status = "False", *reason;
	int resident = n[GCR_SCALE_RESIDENT];
	if (selected == 0) {
		reason = "NoPodsSelected";
		snprintf(msg, sizeof(msg), "selector %.400s matches no pod in namespace %.120s", p->selector, p->ns);
	} else if (p->lost > 0) {
		/* Whatever the counts, this object does not control those pods: never Ready. */
		reason = "SelectorConflict";
		snprintf(msg, sizeof(msg), "%d of its %d pods are also selected by an older GPUResidency, which acts on "
			 "them (condition SelectorConflict); %d resident of %d wanted", p->lost, selected, resident,
			 replicas);
	} else if (busy) {
		reason = "Scaling";
		snprintf(msg, sizeof(msg), "%d resident of %d wanted: %d suspending, %d resuming%s", resident, replicas,
			 n[GCR_SCALE_SUSPENDING], n[GCR_SCALE_RESUMING],
			 plan->waiting ? ", more once those end" : "");
	} else if (resident < replicas && external > 0) {
		reason = "SuspendedElsewhere";
		snprintf(msg, sizeof(msg), "%d resident of %d wanted: %d pod(s) suspended by other means (a Checkpoint "
			 "or gcrctl not of this GPUResidency) are left alone; see pods[]", resident, replicas, external);
	} else if (resident < replicas && n[GCR_SCALE_SUSPENDED] == 0) {
		reason = "NotEnoughPods";
		snprintf(msg, sizeof(msg), "%d resident of %d wanted: no suspended pod left to resume (%d selected, %d "
			 "of them unmanaged)", resident, replicas, selected, n[GCR_SCALE_UNMANAGED]);
	} else if (resident != replicas) {
		reason = "Retrying";
		snprintf(msg, sizeof(msg), "%d resident of %d wanted: the last operation failed; retried after %d s",
			 resident, replicas, COOLDOWN_S);
	} else {
		status = "True";
		reason = "Scaled";
		snprintf(msg, sizeof(msg), "%d resident, %d suspended%s", resident, n[GCR_SCALE_SUSPENDED],
			 n[GCR_SCALE_UNMANAGED] ? " (and unmanaged pods: see pods[])" : "");
	}
	json_t *st = json_pack("{s:i, s:s, s:i, s:i, s:i, s:i, s:I, s:s, s:o, s:o}", "replicas", resident, "selector",
			       p->selector, "suspended", n[GCR_SCALE_SUSPENDED], "suspending", n[GCR_SCALE_SUSPENDING],
			       "resuming", n[GCR_SCALE_RESUMING], "unmanaged", n[GCR_SCALE_UNMANAGED],
			       "observedGeneration", gen, "leader", agent_leader_identity(p->s->leader), "pods", pods,
			       "conditions", cond_json(p, status, reason, msg, old, gen));
	/* lastScale: from the first pass that sees a new target to the one that finds it reached. */
	json_t *ls = json_deep_copy(json_object_get(old, "lastScale"));
	char now[40];
	agent_kube_time(now, sizeof(now), 1);
	int done_event = 0;
	json_int_t took_ms = 0;
	if (ls == NULL || json_integer_value(json_object_get(ls, "to")) != replicas ||
	    json_object_get(ls, "to") == NULL) {
		json_int_t from = json_is_integer(json_object_get(old, "replicas"))
					  ? json_integer_value(json_object_get(old, "replicas"))
					  : resident;
		json_decref(ls);
		ls = json_pack("{s:I, s:i, s:s, s:n, s:n}", "from", from, "to", replicas, "startTime", now,
			       "completionTime", "durationMs");
	}
	if (strcmp(status, "True") == 0 && json_object_get(ls, "completionTime") == NULL) {
		double t0 = agent_scaler_parse_time(agent_scaler_str_at(ls, "startTime", NULL)),
		       t1 = agent_scaler_parse_time(now);
		json_object_set_new(ls, "completionTime", json_string(now));
		took_ms = t0 > 0 && t1 >= t0 ? (json_int_t)((t1 - t0) * 1000) : 0;
		json_object_set_new(ls, "durationMs", json_integer(took_ms));
		done_event = 1;
	}
	/* Nulls (merge-patch deletions) are not stored: compare without them. */
	json_t *ls_cmp = json_deep_copy(ls);
	if (json_is_null(json_object_get(ls_cmp, "completionTime")))
		json_object_del(ls_cmp, "completionTime");
	if (json_is_null(json_object_get(ls_cmp, "durationMs")))
		json_object_del(ls_cmp, "durationMs");
	json_object_set_new(st, "lastScale", ls);
	json_t *cmp = json_deep_copy(st);
	json_object_set_new(cmp, "lastScale", ls_cmp);
	if (old != NULL && json_equal(cmp, old)) {
		json_decref(cmp);
		json_decref(st);
		return;
	}
	json_decref(cmp);
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/gpuresidencies/%s", p->ns, p->name);
	json_t *patch = json_pack("{s:o}", "status", st);
	struct gcr_err err;
	int rc = agent_leader_is_leader(p->s->leader) ? agent_kube_patch_status(p->s->kube, path, patch, &err)
						      : gcr_err_set(&err, -EPERM, "no longer the leader");
	json_decref(patch);
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: status: %s", p->ns, p->name, err.msg);
		return;
	}
	if (done_event)
		agent_scaler_event(p, "Normal", "Scaled", "%d resident, %d suspended (target %d reached in %lld ms)",
				   resident, n[GCR_SCALE_SUSPENDED], replicas, (long long)took_ms);
}

/* Writes only the Ready condition when nothing else can be known (or while deleting). */
void agent_scaler_write_ready(struct pass *p, const char *status, const char *reason, const char *msg)
{
	char path[700];
	json_int_t gen = json_integer_value(json_object_get(json_object_get(p->res, "metadata"), "generation"));
	json_t *old = json_object_get(p->res, "status");
	const char *oldmsg = agent_scaler_str_at(json_array_get(json_object_get(old, "conditions"), 0), "message", NULL);
	if (oldmsg != NULL && strcmp(oldmsg, msg) == 0)
		return;
	snprintf(path, sizeof(path), API "/namespaces/%s/gpuresidencies/%s", p->ns, p->name);
	json_t *patch = json_pack("{s:{s:I, s:o}}", "status", "observedGeneration", gen, "conditions",
				  cond_json(p, status, reason, msg, old, gen));
	struct gcr_err err;
	if (agent_leader_is_leader(p->s->leader) && agent_kube_patch_status(p->s->kube, path, patch, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "scaler", "%s/%s: status: %s", p->ns, p->name, err.msg);
	json_decref(patch);
}
