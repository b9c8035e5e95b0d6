/* gcr_scale: scale-to-zero policy shared by gcrctl and the agent's scaler: which
 * processes (or pods) to suspend or resume to reach a resident count, and running them. */
#ifndef GCR_SCALE_H
#define GCR_SCALE_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_cr.h"
#include "gcr_error.h"
#include "gcr_shimreply.h"

/* Where a member stands. SUSPENDING and RESUMING are operations in flight: the
 * plan counts them as already done and never starts another on that member. */
enum gcr_scale_state {
	GCR_SCALE_RESIDENT = 0,
	GCR_SCALE_SUSPENDED,
	GCR_SCALE_SUSPENDING,
	GCR_SCALE_RESUMING,
	GCR_SCALE_UNMANAGED, /* cannot be suspended (no shim, no agent): counted apart */
};

enum gcr_scale_action { GCR_SCALE_NONE = 0, GCR_SCALE_SUSPEND, GCR_SCALE_RESUME };

struct gcr_scale_member {
	const char *id;        /* pod name or pid, borrowed; breaks ties so a plan is deterministic */
	enum gcr_scale_state state;
	double last_active;    /* seconds since the epoch when activity was last seen; 0: never */
	long long recent_calls; /* calls in the last sampling interval: ties of last_active */
	int pinned;            /* counted as its state but not acted on this round (e.g. a recent failure) */
	enum gcr_scale_action action; /* out */
};

struct gcr_scale_plan {
	int resident, suspended, suspending, resuming, unmanaged; /* counts found */
	int to_suspend, to_resume; /* actions chosen */
	int waiting; /* the target also needs operations now in flight to end first */
};

const char *gcr_scale_state_name(enum gcr_scale_state s);

/* Where a process stands for scaling, from its state (gcr_cr_state): running is resident;
 * suspended and half-way (a resume finishes it) are suspended; without a shim, unmanaged. */
enum gcr_scale_state gcr_scale_state_of(enum gcr_cr_st s);
const char *gcr_scale_action_name(enum gcr_scale_action a);

/* Chooses actions so that resident + resuming reaches replicas: suspends the
 * least recently active resident members first, resumes the most recently active
 * suspended ones first. Members in flight are left alone, so a new target while a
 * scale runs only adds work once they end. Sets every m[i].action.
 * 0, or -EINVAL (replicas < 0). */
int gcr_scale_plan(struct gcr_scale_member *m, size_t n, int replicas, struct gcr_scale_plan *out,
		   struct gcr_err *err) __attribute__((warn_unused_result));

/* One process of gcr_scale_run. */
struct gcr_scale_proc {
	pid_t pid;
	enum gcr_scale_action action; /* NONE: skipped */
	int rc;                       /* out: 0 or -errno */
	struct gcr_err err;           /* out: why rc < 0 */
	struct gcr_cr_result r;       /* out: owned; gcr_scale_procs_clear frees */
	double ms_done;               /* out: from the start of the run to this one's end */
};

/* Runs every action at once, one thread per process, through gcr_cr_suspend /
 * gcr_cr_resume. *ms_wall: from the start to the last one's end. Returns 0 when
 * all succeeded, else the first failure's code (each proc has its own). A
 * failed suspend leaves that process running (gcr_cr's guarantee); the caller
 * decides whether to resume the others. */
int gcr_scale_run(struct gcr_scale_proc *p, size_t n, const struct gcr_cr_opts *o, double *ms_wall);

void gcr_scale_procs_clear(struct gcr_scale_proc *p, size_t n);

/* The shim's cumulative count of intercepted calls of pid (the sum of its stats
 * "calls" map): read at the caller's pace, it adds nothing to the shim's hot path.
 * 0, or -errno (no shim: -ENOENT / -ESRCH; counters that are not 0 .. 2^50: -EPROTO). */
int gcr_scale_calls(pid_t pid, const char *socket_dir, long long *calls, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* gcr_scale_calls of every pids[i] at once (gcr_client_call_all): one deadline, timeout_ms
 * from the call, for them all, so stopped processes cost it once, not once each.
 * calls[i] and rcs[i] 0, or calls[i] 0 and rcs[i] -errno (-ETIMEDOUT: no reply in time;
 * -EPROTO: a reply without readable counters, which counts as no answer). states (NULL:
 * not wanted): states[i] the process's state from the same reply (its "status"), UNKNOWN
 * when it did not answer or the state is missing or unreadable.
 * Returns how many answered, or -ENOMEM with the message in err. */
int gcr_scale_calls_all(const pid_t *pids, size_t n, const char *socket_dir, int timeout_ms, long long *calls,
			int *rcs, enum gcr_shimreply_st *states, struct gcr_err *err) __attribute__((warn_unused_result));

#endif
