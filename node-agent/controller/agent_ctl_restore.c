/* agent_ctl_restore: a Restore: its Checkpoint found and read (an Image's goes on to
 * agent_ctl_podrestore.c), then the processes that Checkpoint suspended resumed in place. */
#include "config.h"

#include "agent_controller.h"
#include "agent_ctl.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "agent_crobj.h"
#include "agent_phase.h"
#include "agent_record.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_time.h"

/* A Restore refused for want of GPU memory (gcr_cr_resume's -ENOSPC: nothing touched) is
 * retried after 1 s, doubling to 30 s, for the Restore's timeoutSeconds or else this long
 * (ms): room usually comes back when a neighbour's job or request ends, within minutes. */
#define ROOM_RETRY_FIRST_MS 1000
#define ROOM_RETRY_MAX_MS 30000
#define ROOM_WAIT_DEFAULT_MS (15 * 60 * 1000)

/* ---- Restore ---- */

/* The Checkpoint from the cache, else from the API: a Restore applied together
 * with its Checkpoint may be seen first. NULL when it does not exist. */
json_t *agent_ctl_find_checkpoint(struct agent_controller *c, const char *ns, const char *name, int *transient)
{
	*transient = 0;
	json_t *ck = agent_ctl_cache_get(c, K_CK, ns, name);
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
	if (agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "WaitingForGPUMemory", msg, NULL) == -ECANCELED)
		return gcr_err_set(err, -ECANCELED, "agent stopping while waiting for GPU memory");
	agent_ctl_event(c, o->obj, "Restore", "Warning", "WaitingForGPUMemory", msg);
	while (rc == -ENOSPC) {
		double left = bound - (gcr_time_mono_ms() - t0);
		if (left <= 0)
			break;
		if (agent_ctl_nap(c, delay < left ? delay : (int)left))
			return gcr_err_set(err, -ECANCELED, "agent stopping while waiting for GPU memory");
		delay = delay * 2 < ROOM_RETRY_MAX_MS ? delay * 2 : ROOM_RETRY_MAX_MS;
		tries++;
		rc = agent_ctl_resume_all(c, p, n, mode, agent_ctl_timeout_ms_of(&o->d), &o->d, sum, err);
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
	int gone, n = agent_ctl_verified_procs(c, r, p, &gone);
	enum gcr_cr_mode mode = agent_ctl_mode_of(r->keep_context);
	if (gone > 0) {
		agent_ctl_fail(c, o, "ProcessGone",
			       "%d process(es) of Checkpoint %s are no longer there (exited, or their pod was deleted); nothing was done",
			       gone, r->name);
		return;
	}
	int recovering = r->state == AGENT_REC_RESUMING;
	if (!recovering) {
		int running = 0;
		for (int i = 0; i < n; i++)
			running += agent_ctl_real_state(c, p[i].pid, mode) == GCR_CR_ST_RUNNING;
		if (running == n) {
			agent_ctl_fail(c, o, "NotSuspended",
				       "the processes of Checkpoint %s are running (resumed by other means?); nothing was done",
				       r->name);
			return;
		}
		r->state = AGENT_REC_RESUMING;
		snprintf(r->rs_uid, sizeof(r->rs_uid), "%s", d->uid);
		snprintf(r->rs_name, sizeof(r->rs_name), "%s", d->name);
		struct gcr_err err;
		if (agent_record_put(c->rec, r, &err) < 0) {
			agent_ctl_fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
			return;
		}
		char msg[256];
		snprintf(msg, sizeof(msg), "resuming %d process(es)", n);
		int rc = agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
					      json_pack("{s:s, s:s, s:o}", "podName", r->pod, "mode", agent_ctl_mode_api_name(mode),
							"processes", agent_ctl_procs_json(p, n, "Checkpointed")));
		if (rc == -ENOENT || rc == -EINVAL) { /* the Restore went away before anything was touched */
			r->state = AGENT_REC_SUSPENDED;
			r->rs_uid[0] = r->rs_name[0] = '\0';
			agent_ctl_save(c, r);
			return;
		}
		if (rc < 0)
			return; /* stopping: the record says resuming */
	}
	struct gcr_cr_result sum = { 0 };
	struct gcr_err err;
	double t0 = gcr_time_mono_ms();
	agent_ctl_test_pause(c, "before-rs");
	int rc = agent_ctl_resume_all(c, p, n, mode, agent_ctl_timeout_ms_of(d), d, &sum, &err);
	if (rc < 0 && err.code == -ENOSPC)
		rc = wait_for_room(c, o, p, n, mode, &sum, &err);
	double ms = gcr_time_mono_ms() - t0;
	if (rc == -ECANCELED)
		return;
	if (rc < 0) {
		/* still suspended and restorable (gcr_cr_resume's promise): a new Restore retries */
		r->state = AGENT_REC_SUSPENDED;
		r->rs_uid[0] = r->rs_name[0] = '\0';
		agent_ctl_save(c, r);
		agent_ctl_fail(c, o, err.code == -ENOSPC ? "NoGPUMemory" : "RestoreFailed", "%s", err.msg);
		return;
	}
	agent_ctl_test_pause(c, "after-rs");
	char note[256];
	snprintf(note, sizeof(note), "%d process(es) resumed, %lld bytes back to GPU memory%s", n, sum.bytes_moved,
		 recovering ? " (finished after an agent restart)" : "");
	json_t *extra = json_pack("{s:o, s:s, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "processes",
				  agent_ctl_procs_json(p, n, "Running"), "podName", r->pod, "mode", agent_ctl_mode_api_name(mode), "bytes",
				  "vmm", (json_int_t)sum.bytes_moved, "total", (json_int_t)sum.bytes_moved, "durations",
				  "data", (json_int_t)sum.ms_data, "restore", (json_int_t)sum.ms_restore, "unlock",
				  (json_int_t)sum.ms_unlock, "total", (json_int_t)ms);
	json_t *st = agent_ctl_build_status(c, o, AGENT_PHASE_SUCCEEDED, "Restored", note, extra);
	r->state = AGENT_REC_RESUMED;
	agent_record_set_status(&r->rs_status, st);
	agent_ctl_save(c, r);
	if (agent_ctl_write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Restore %s/%s: Succeeded %s", d->ns, d->name, note);
	json_decref(st);
	agent_ctl_event(c, o->obj, "Restore", "Normal", "Restored", note);
	agent_metrics_op(c->metrics, "restore", 1, ms, sum.bytes_moved);
	agent_ctl_mark_done(c, d->uid);
	char ckkey[600];
	snprintf(ckkey, sizeof(ckkey), "c:%s/%s", r->ns, r->name);
	if (agent_ctl_ck_finalizer(c, r->ns, r->name, r->uid, 0, &err) < 0 && err.code != -ENOENT)
		agent_ctl_retry_later(c, ckkey, 0); /* sync_checkpoint takes it off */
}

/* A Restore whose Checkpoint does not exist (yet): objects applied together may arrive in
 * any order, so it waits Pending for the grace period, then fails. */
static void checkpoint_missing(struct agent_controller *c, struct op *o)
{
	double now = gcr_time_mono_ms();
	agent_informers_lock(c->inf);
	json_t *seen = json_object_get(c->first_seen, o->d.uid);
	double first = seen ? (double)json_integer_value(seen) : now;
	if (seen == NULL)
		json_object_set_new(c->first_seen, o->d.uid, json_integer((json_int_t)now));
	agent_informers_unlock(c->inf);
	double left = c->grace_ms - (now - first);
	if (left > 0) {
		if (o->d.phase == AGENT_PHASE_NONE)
			agent_ctl_set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
					     "waiting for the Checkpoint to be created", NULL);
		agent_ctl_retry_later(c, o->key, (int)left + 1); /* its creation queues this Restore sooner */
		return;
	}
	agent_ctl_fail(c, o, "CheckpointNotFound", "Checkpoint %s/%s not found after %d s; nothing was done", o->d.ns, o->d.target,
		       c->grace_ms / 1000);
}

/* A Restore of a Checkpoint this agent has no record of: waits while the Checkpoint is not
 * finished, leaves it to the node that took it, else fails touching nothing. */
static void restore_unrecorded(struct agent_controller *c, struct op *o, json_t *ck, const struct agent_crobj *ckd)
{
	if (ckd->phase == AGENT_PHASE_FAILED) {
		const char *m = agent_ctl_status_str(ck, "message");
		agent_ctl_fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed (%.600s); there is nothing to restore", o->d.ns,
			       ckd->name, m ? m : "no message");
		return;
	}
	int here = ckd->node[0] == '\0' || strcmp(ckd->node, c->node) == 0;
	if (ckd->phase != AGENT_PHASE_SUCCEEDED) {
		/* Waits for the Checkpoint; its change queues this Restore again. */
		if (here && o->d.phase == AGENT_PHASE_NONE)
			agent_ctl_set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
					     "waiting for the Checkpoint to finish", NULL);
		return;
	}
	if (!here) {
		char what[600];
		snprintf(what, sizeof(what), "Checkpoint %s/%s", o->d.ns, ckd->name);
		agent_ctl_other_node(c, o, ckd->node, what);
		return;
	}
	agent_ctl_fail(c, o, "UnknownCheckpoint",
		       "the GCR agent on node %s did not suspend anything for Checkpoint %s/%s (uid %s); nothing was done", c->node,
		       o->d.ns, ckd->name, ckd->uid);
}

void agent_ctl_reconcile_restore(struct agent_controller *c, struct op *o)
{
	const struct agent_crobj *d = &o->d;
	if (agent_ctl_is_done(c, d->uid) || d->phase == AGENT_PHASE_SUCCEEDED || d->phase == AGENT_PHASE_FAILED)
		return;
	int transient = 0;
	json_t *ck = agent_ctl_find_checkpoint(c, d->ns, d->target, &transient);
	if (ck == NULL) {
		if (transient)
			agent_ctl_retry_later(c, o->key, 0);
		else
			checkpoint_missing(c, o);
		return;
	}
	struct agent_crobj ckd;
	struct agent_record r;
	struct gcr_err err;
	if (agent_crobj_decode(ck, AGENT_CROBJ_CHECKPOINT, &ckd, &err) < 0) {
		agent_ctl_fail(c, o, "CheckpointInvalid", "Checkpoint %s/%s: %s; nothing was done", d->ns, d->target, err.msg);
	} else if (ckd.action == AGENT_ACTION_IMAGE) {
		agent_ctl_restore_image(c, o, &ckd);
	} else if (agent_record_get(c->rec, ckd.uid, &r) < 0) {
		restore_unrecorded(c, o, ck, &ckd);
	} else {
		switch (r.state) {
		case AGENT_REC_FAILED:
			agent_ctl_fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed; there is nothing to restore", d->ns, r.name);
			break;
		case AGENT_REC_SUSPENDING: /* in flight (or recovered next): its change queues this again */
			agent_ctl_retry_later(c, o->key, 0);
			break;
		case AGENT_REC_RESUMED:
			if (strcmp(r.rs_uid, d->uid) == 0 && r.rs_status != NULL) {
				agent_ctl_write_status(c, o, r.rs_status); /* a status lost to an API fault */
				agent_ctl_mark_done(c, d->uid);
			} else {
				agent_ctl_fail(c, o, "NotSuspended", "the processes of Checkpoint %s were resumed already%s%s; nothing was done",
					       r.name, r.rs_name[0] ? " by Restore " : " (its deletion or another way)", r.rs_name);
			}
			break;
		case AGENT_REC_RESUMING:
			if (strcmp(r.rs_uid, d->uid) != 0 && r.rs_uid[0] != '\0' &&
			    agent_ctl_cache_has_uid(c, K_RS, r.ns, r.rs_name, r.rs_uid)) {
				agent_ctl_fail(c, o, "NotSuspended", "Restore %s is resuming the processes of Checkpoint %s; nothing was done",
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
