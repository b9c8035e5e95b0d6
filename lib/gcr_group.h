/* gcr_group: suspend and resume of a group of processes that communicate through NCCL, as one
 * bounded operation (docs/design.md, "Groups of processes"): every member goes through the same
 * step, all members at once, before any member starts the next; each step has the caller's
 * bound; a failure brings every member back (thawed, or rebuilt and running), and an error names
 * the member that failed, died or did not answer. gcrctl --group runs it. */
#ifndef GCR_GROUP_H
#define GCR_GROUP_H

#include <sys/types.h>

#include "gcr_cr.h"
#include "gcr_error.h"

/* Members in one group: TP and PP ranks of one node, with room to spare. */
#define GCR_GROUP_MAX_MEMBERS 64

struct gcr_group_opts {
	const char *socket_dir;
	enum gcr_cr_mode mode; /* full, data only, or the driver's checkpoint alone (the baseline) */
	int timeout_ms;        /* each step's bound, per member, all members at once */
	int unchecked;         /* as gcr_cr_opts.unchecked */
};

struct gcr_group_member {
	pid_t pid;
	int rc;           /* 0, or the -errno that stopped this member */
	struct gcr_err err;
	const char *step; /* the step that failed for it ("freeze", "drain", ...), or NULL */
	int gone;         /* the process died during the operation */
	int comms;        /* communicators it holds */
	const char *state; /* its shim's state at the end, as read last ("running", ...) */
	/* its own steps (ms), and its suspend's or resume's data and driver parts */
	double ms_freeze, ms_drain, ms_cr, ms_ids, ms_rebuild, ms_thaw;
	struct gcr_cr_result cr;
};

struct gcr_group_result {
	size_t n;
	struct gcr_group_member m[GCR_GROUP_MAX_MEMBERS];
	int comms;        /* distinct communicators in the group */
	int rolled_back;  /* a failed suspend was undone (or a failed resume's rebuild detached) */
	int failed_comms; /* resume: communicators marked failed (a member did not come back) */
	/* Wall time of each step, all members together, and of the whole operation. */
	double ms_freeze, ms_drain, ms_cr, ms_ids, ms_rebuild, ms_thaw, ms_total;
	long long bytes_moved, bytes_total;
};

/* 0 or -errno with err naming the first member that failed, the step, and the group's state
 * after the undo ("group running again", or what is left and the command that finishes it). A
 * member that died makes resume mark its communicators failed in the others, which then run
 * (an error still names it). -EINVAL: a bad list (a pid twice, too many, none). */
int gcr_group_suspend(const pid_t *pids, size_t n, const struct gcr_group_opts *o, struct gcr_group_result *r,
		      struct gcr_err *err);
int gcr_group_resume(const pid_t *pids, size_t n, const struct gcr_group_opts *o, struct gcr_group_result *r,
		     struct gcr_err *err);
/* Frees what the result owns. */
void gcr_group_result_clear(struct gcr_group_result *r);

/* The processes whose shims in socket_dir hold a communicator pid's shim also holds (pid first),
 * at most cap: what a refused single suspend suggests as the group. *n gets how many. */
int gcr_group_find(const char *socket_dir, pid_t pid, pid_t *out, size_t cap, size_t *n, struct gcr_err *err);

#endif
