/* agent_ctl_suspend: a Checkpoint that suspends its pod's processes: recorded before any process is
 * touched, recovered from its record after a restart, its processes resumed when it (or, without
 * it, its record) goes; and the mark on a final phase the agent did not write. */
#include "config.h"

#include "agent_controller.h"
#include "agent_ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent_ckimage.h"
#include "agent_crobj.h"
#include "agent_phase.h"
#include "agent_podspec.h"
#include "agent_record.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_scale.h"
#include "gcr_time.h"

/* Longest wait for the scaler's process to mark a gated pod not ready before its suspend,
 * in ms: traffic should leave first, but a missing scaler must not stop the suspend. */
#define GATE_WAIT_MS 10000

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
	agent_informers_lock(c->inf);
	json_t *pod = agent_ctl_cached_locked(c, K_POD, key);
	int declared = agent_podspec_gate_declared(pod), rc = 0;
	while (declared && rc == 0 && !atomic_load(&c->stop)) {
		const char *st = agent_podspec_gate_status(agent_ctl_cached_locked(c, K_POD, key));
		if (st != NULL && strcmp(st, "False") == 0)
			break;
		rc = agent_informers_wait_locked(c->inf, &c->pod_changed, &dl);
	}
	agent_informers_unlock(c->inf);
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
	json_t *st = agent_ctl_build_status(c, o, ok ? AGENT_PHASE_SUCCEEDED : AGENT_PHASE_FAILED, reason, note, extra);
	agent_record_set_status(&r->ck_status, st);
	r->state = ok ? AGENT_REC_SUSPENDED : AGENT_REC_FAILED;
	agent_ctl_save(c, r);
	if (agent_ctl_write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s (%s) %s", o->d.ns, o->d.name,
			ok ? "Succeeded" : "Failed", reason, note);
	json_decref(st);
	agent_ctl_event(c, o->obj, "Checkpoint", ok ? "Normal" : "Warning", reason, note);
	agent_metrics_op(c->metrics, "checkpoint", ok, ms_total, bytes);
	struct gcr_err err;
	if (!ok && agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT)
		agent_ctl_retry_later(c, o->key, 0); /* sync_checkpoint takes it off */
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
		if ((rc = c->adopt.release(c->adopt.data, p[taken].pid, r->p[taken].start, &d, agent_ctl_timeout_ms_of(&o->d))) < 0)
			gcr_err_set(&err, rc, "pid %d: %s", (int)p[taken].pid,
				    rc == -ETIMEDOUT ? "the overcommit policy did not give it up in time" : "no longer held");
	r->keep_context = mode;
	char note[1024];
	if (rc < 0 && taken == 0)
		return 0;
	if (rc < 0) {
		struct gcr_err e2;
		int urc = agent_ctl_resume_all(c, p, taken, agent_ctl_mode_of(mode), agent_ctl_timeout_ms_of(&o->d), NULL, NULL, &e2);
		snprintf(note, sizeof(note), "taking over processes the overcommit policy held failed at %s; the %d taken "
			 "over were %s", err.msg, taken, urc == 0 ? "resumed" : "left suspended (resume failed)");
		finish_checkpoint(c, o, r, 0, "CheckpointFailed", note, NULL, 0, 0);
		return 1;
	}
	snprintf(note, sizeof(note), "%d process(es) already suspended by the overcommit policy%s: this Checkpoint holds "
		 "them now (the policy no longer resumes them); a Restore resumes them", n,
		 mode ? ", data only (CUDA context kept on the GPU)" : "");
	json_t *extra = json_pack("{s:o, s:s}", "processes", agent_ctl_procs_json(p, n, "Checkpointed"), "mode",
				  agent_ctl_mode_api_name(agent_ctl_mode_of(mode)));
	finish_checkpoint(c, o, r, 1, "Checkpointed", note, extra, 0, 0);
	return 1;
}

static void run_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r, const struct proc *p,
			   int n)
{
	if (take_over(c, o, r, p, n))
		return;
	enum gcr_cr_mode mode = agent_ctl_mode_of(r->keep_context);
	struct gcr_cr_opts opts = { .socket_dir = c->socket_dir, .mode = mode, .timeout_ms = agent_ctl_timeout_ms_of(&o->d),
				    .call_ms = agent_ctl_timeout_ms_of(&o->d) + GATE_SLACK_MS };
	struct gcr_cr_result sum = { 0 };
	double t0 = gcr_time_mono_ms();
	agent_ctl_test_pause(c, "before-cr");
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
		int urc = nu > 0 ? agent_ctl_resume_all(c, undo, nu, mode, opts.timeout_ms, NULL, NULL, &e2) : 0;
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
	agent_ctl_test_pause(c, "after-cr");
	double ms = gcr_time_mono_ms() - t0;
	snprintf(note, sizeof(note), "%d process(es) suspended, %lld bytes to host memory%s", n, sum.bytes_moved,
		 mode == GCR_CR_DATA_ONLY ? "; CUDA context kept on the GPU" : "");
	json_t *extra = json_pack("{s:o, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  agent_ctl_procs_json(p, n, "Checkpointed"), "mode", agent_ctl_mode_api_name(mode), "bytes", "vmm",
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
	int rc = agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 1, &err);
	if (rc == -ENOENT || rc == -EINVAL) { /* gone, or being deleted: never started */
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s; nothing was done", r->ns, r->name, err.msg);
		agent_record_del(c->rec, r->uid, &err);
		return;
	}
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: finalizer: %s; retrying", r->ns, r->name, err.msg);
		agent_ctl_retry_later(c, o->key, 0);
		return;
	}
	char msg[256];
	enum gcr_cr_mode mode = agent_ctl_mode_of(r->keep_context);
	snprintf(msg, sizeof(msg), "suspending %d process(es)%s", n,
		 mode == GCR_CR_DATA_ONLY ? ", keeping the CUDA context" : "");
	rc = agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
				  json_pack("{s:o, s:s}", "processes", agent_ctl_procs_json(p, n, "Running"), "mode", agent_ctl_mode_api_name(mode)));
	if (rc == -ECANCELED)
		return; /* stopping: the record brings it back after the restart */
	if (rc < 0) { /* gone, or someone wrote a final phase: it is not run */
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: not run (its status cannot be written)", r->ns,
			r->name);
		if (agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) == 0 || err.code == -ENOENT)
			agent_record_del(c->rec, r->uid, &err);
		return;
	}
	wait_gate(c, r->ns, r->pod, agent_ctl_timeout_ms_of(&o->d));
	run_checkpoint(c, o, r, p, n);
}

/* A new Checkpoint: the pod named in this namespace, its processes from the registry (by the
 * pod's UID), recorded before anything is touched. */
static void new_checkpoint(struct agent_controller *c, struct op *o)
{
	const struct agent_crobj *d = &o->d;
	enum pod_where where;
	char node[256], what[600];
	json_t *pod = agent_ctl_find_pod(c, d->ns, d->target, &where, node, sizeof(node));
	if (pod == NULL) {
		snprintf(what, sizeof(what), "pod %s/%s", d->ns, d->target);
		if (where == POD_UNKNOWN)
			agent_ctl_retry_later(c, o->key, 0);
		else if (where == POD_MISSING)
			agent_ctl_fail(c, o, "PodNotFound", "pod %s/%s not found; nothing was done", d->ns, d->target);
		else if (where == POD_UNSCHEDULED)
			agent_ctl_fail(c, o, "PodNotScheduled", "pod %s/%s is not scheduled to a node; nothing was done", d->ns,
				       d->target);
		else
			agent_ctl_other_node(c, o, node, what);
		return;
	}
	const char *uid = agent_ctl_md_str(pod, "uid");
	char cid[AGENT_CGROUP_CID_LEN + 8] = "";
	if (d->container[0] != '\0') {
		json_t *cst = agent_ctl_container_status(pod, d->container, NULL);
		snprintf(cid, sizeof(cid), "%s", cst ? agent_ctl_status_container_id(cst) : "");
		if (cid[0] == '\0') {
			agent_ctl_fail(c, o, "ContainerNotFound", "pod %s/%s has no running container %s; nothing was done", d->ns,
				       d->target, d->container);
			json_decref(pod);
			return;
		}
	}
	struct agent_registry_proc rp[MAX_PROCS];
	int n = uid && strlen(uid) < AGENT_CROBJ_UID_LEN ? agent_registry_find(c->reg, uid, cid, rp, MAX_PROCS) : 0;
	if (n == 0) {
		agent_ctl_fail(c, o, "NoGCRProcess", "pod %s/%s has no process running under the GCR shim on node %s; nothing was done",
			       d->ns, d->target, c->node);
		json_decref(pod);
		return;
	}
	if (d->action == AGENT_ACTION_IMAGE) {
		agent_ctl_new_image(c, o, pod, rp, n);
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
		agent_ctl_container_name_of(pod, rp[i].container_id, p[i].container, sizeof(p[i].container));
		snprintf(r.p[i].container, sizeof(r.p[i].container), "%s", p[i].container);
	}
	json_decref(pod);
	struct gcr_err err;
	if (agent_record_put(c->rec, &r, &err) < 0) {
		agent_ctl_fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
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
	int gone, n = agent_ctl_verified_procs(c, r, p, &gone);
	enum gcr_cr_mode mode = agent_ctl_mode_of(r->keep_context);
	int running = 0, suspended = 0;
	for (int i = 0; i < n; i++) {
		enum gcr_cr_st s = agent_ctl_real_state(c, p[i].pid, mode);
		running += s == GCR_CR_ST_RUNNING;
		suspended += s == GCR_CR_ST_SUSPENDED;
	}
	GCR_LOG(GCR_LOG_INFO, "controller",
		"Checkpoint %s/%s recorded as suspending: %d running, %d suspended, %d other, %d gone", r->ns, r->name,
		running, suspended, n - running - suspended, gone);
	if (gone == 0 && suspended == n) {
		json_t *extra = json_pack("{s:o, s:s}", "processes", agent_ctl_procs_json(p, n, "Checkpointed"), "mode",
					  agent_ctl_mode_api_name(mode));
		finish_checkpoint(c, o, r, 1, "Checkpointed",
				  "all processes were already suspended when the agent restarted; not redone", extra, 0, 0);
	} else if (gone == 0 && running == n) {
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: not started before the restart; running it", r->ns,
			r->name);
		start_checkpoint(c, o, r, p, n);
	} else {
		struct gcr_err err;
		int rc = n > 0 ? agent_ctl_resume_all(c, p, n, mode, agent_ctl_timeout_ms_of(&o->d), NULL, NULL, &err) : 0;
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
	json_t *pod = agent_ctl_find_pod(c, r->ns, r->pod, &where, node, sizeof(node));
	if (where == POD_UNKNOWN) {
		snprintf(note, len, "cannot read pod %s/%s", r->ns, r->pod);
		return -EAGAIN;
	}
	const char *uid = agent_ctl_md_str(pod, "uid");
	int live = pod != NULL && uid != NULL && strcmp(uid, r->pod_uid) == 0 &&
		   json_object_get(json_object_get(pod, "metadata"), "deletionTimestamp") == NULL;
	json_decref(pod);
	if (!live) {
		snprintf(note, len, "pod %s/%s is gone or terminating: its processes were not resumed", r->ns, r->pod);
		return 0;
	}
	struct proc p[MAX_PROCS];
	int gone, n = agent_ctl_verified_procs(c, r, p, &gone);
	struct gcr_err err;
	int rc = n > 0 ? agent_ctl_resume_all(c, p, n, agent_ctl_mode_of(r->keep_context), DEFAULT_TIMEOUT_MS, NULL, NULL, &err) : 0;
	if (rc < 0) {
		snprintf(note, len, "resuming the processes failed (%s); they stay suspended and restorable, retrying",
			 err.msg);
		return -EAGAIN;
	}
	snprintf(note, len, "%d process(es) running again%s", n, gone ? " (others were gone)" : "");
	r->state = AGENT_REC_RESUMED;
	r->rs_uid[0] = r->rs_name[0] = '\0';
	agent_ctl_save(c, r);
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
			agent_ctl_run_image(c, o, r);
		if (r->state == AGENT_REC_IMAGING)
			return;
		if (o->d.finalizer && agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT) {
			agent_ctl_retry_later(c, o->key, 0);
			return;
		}
		if (!agent_ckimage_pending(r, (long long)time(NULL)))
			agent_record_del(c->rec, r->uid, &err);
		agent_ctl_retry_reset(c, o->key);
		return;
	}
	if (r->state != AGENT_REC_FAILED && r->state != AGENT_REC_RESUMED) {
		int first = !agent_ctl_retrying(c, o->key);
		if (release_processes(c, r, note, sizeof(note)) < 0) {
			GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s deleted: %s", r->ns, r->name, note);
			if (first)
				agent_ctl_event(c, o->obj, "Checkpoint", "Warning", "ResumeOnDeleteFailed", note);
			agent_ctl_retry_later(c, o->key, 0);
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s deleted: %s", r->ns, r->name, note);
		agent_ctl_event(c, o->obj, "Checkpoint", "Normal", "ResumedOnDelete", note);
	}
	if (agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT) {
		agent_ctl_retry_later(c, o->key, 0);
		return;
	}
	agent_ctl_retry_reset(c, o->key);
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
	long long created = rfc3339_s(agent_ctl_md_str(o->obj, "creationTimestamp"));
	if (created < 0 || created < agent_record_store_since(c->rec))
		return 0;
	int here = strcmp(o->d.node, c->node) == 0;
	if (!here && o->d.node[0] == '\0') {
		json_t *pod = agent_ctl_cache_get(c, K_POD, o->d.ns, o->d.target);
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
			agent_ctl_retry_later(c, o->key, 0);
		return;
	}
	GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: %s", o->d.ns, o->d.name, msg);
	agent_ctl_event(c, o->obj, "Checkpoint", "Warning", "StatusForged", msg);
}

/* A Checkpoint with a record: brings the object in line with it (final status, finalizer). */
static void sync_checkpoint(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	if (r->state == AGENT_REC_SUSPENDING) {
		recover_checkpoint(c, o, r);
		return;
	}
	if (r->state == AGENT_REC_IMAGING) {
		agent_ctl_run_image(c, o, r); /* cut short by a restart: finished from its record */
		return;
	}
	if (r->state == AGENT_REC_RESUMING && r->rs_uid[0] != '\0' &&
	    !agent_ctl_cache_has_uid(c, K_RS, r->ns, r->rs_name, r->rs_uid)) {
		/* its Restore was deleted mid-way (and the agent restarted): finished here */
		char note[1200];
		if (release_processes(c, r, note, sizeof(note)) < 0) {
			agent_ctl_retry_later(c, o->key, 0);
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: its Restore %s is gone: %s", r->ns, r->name,
			r->rs_name, note);
	}
	struct gcr_err err;
	int want = r->state == AGENT_REC_SUSPENDED || r->state == AGENT_REC_RESUMING;
	if (want != o->d.finalizer && agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, want, &err) < 0 && err.code != -ENOENT) {
		agent_ctl_retry_later(c, o->key, 0);
		return;
	}
	/* The record's phase is Succeeded or Failed whenever it has a status (agent_record checks). */
	const char *ph = json_string_value(json_object_get(r->ck_status, "phase"));
	enum agent_phase rph = agent_phase_of(ph);
	if (rph != AGENT_PHASE_NONE && rph != o->d.phase) {
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: status says %s, its record %s: written again",
			r->ns, r->name, o->d.phase == AGENT_PHASE_NONE ? "nothing" : agent_phase_name(o->d.phase), ph);
		if (agent_ctl_write_status(c, o, r->ck_status) == -EINVAL && !forged_marked(o)) {
			/* A final phase someone else wrote is final for the API server too: marked. */
			char why[300];
			snprintf(why, sizeof(why), "the GCR agent of node %s recorded %s for this Checkpoint", c->node, ph);
			mark_forged(c, o, why);
		}
	}
}

void agent_ctl_reconcile_checkpoint(struct agent_controller *c, struct op *o)
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
		if (d->finalizer && agent_ctl_ck_finalizer(c, d->ns, d->name, d->uid, 0, &err) < 0 && err.code != -ENOENT)
			agent_ctl_retry_later(c, o->key, 0);
		return;
	}
	if (agent_ctl_is_done(c, d->uid))
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

/* ---- records whose Checkpoint is gone ---- */

/* The Checkpoint was deleted without its finalizer (removed by hand) or while this agent was
 * away: processes it left suspended are resumed all the same, then the record goes. */
void agent_ctl_reconcile_orphan(struct agent_controller *c, const char *key, const char *uid)
{
	struct agent_record r;
	if (agent_record_get(c->rec, uid, &r) < 0)
		return;
	if (!agent_ctl_cache_has_uid(c, K_CK, r.ns, r.name, uid) && r.action == AGENT_REC_ACT_IMAGE) {
		agent_ctl_orphan_image(c, key, &r);
	} else if (!agent_ctl_cache_has_uid(c, K_CK, r.ns, r.name, uid)) {
		char note[1200];
		struct gcr_err err;
		if (r.state == AGENT_REC_FAILED || r.state == AGENT_REC_RESUMED ||
		    release_processes(c, &r, note, sizeof(note)) == 0) {
			if (r.state != AGENT_REC_FAILED && r.state != AGENT_REC_RESUMED)
				GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s (uid %s) is gone: %s", r.ns, r.name,
					uid, note);
			agent_record_del(c->rec, uid, &err);
			agent_ctl_retry_reset(c, key);
		} else {
			GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s (uid %s) is gone: %s", r.ns, r.name, uid, note);
			agent_ctl_retry_later(c, key, 0);
		}
	}
	agent_record_clear(&r);
}
