/* shim_comm: what the suspend/resume state machine (shim_cr) needs from a communication library
 * that runs over the GPU runtime (NCCL: shim/nccl/shim_nccl.c): hold its submissions, bring its
 * communicators to matching counts, tear them down and make them again. The core never includes
 * the library's headers; it calls this table. */
#ifndef SHIM_COMM_H
#define SHIM_COMM_H

#include "gcr_error.h"
#include "gcr_groupmsg.h"

struct shim_comm_ops {
	const char *name; /* "nccl": what status reports */

	/* Communicators the process holds: with a live library communicator, torn down (rebuilt at
	 * resume), failed, and application threads waiting at the held wrappers now. */
	void (*counts)(int *live, int *down, int *failed, int *held);
	/* Every communicator, as status and the group ops report them. */
	void (*describe)(struct gcr_group_comms *out);
	/* Refuses (-ENOTSUP, err says what) when a communicator uses what cannot be torn down and
	 * made again (windows, the device API, custom reduction ops, CUDA-graph capture, shrink and
	 * grow), or -EBUSY while one is still being created. */
	int (*check)(struct gcr_err *err);

	/* New submissions wait at the wrappers; returns once no group is half-built (wait_ms), else
	 * -EBUSY (thawed). Counts are final from then on. */
	int (*freeze)(int wait_ms, struct gcr_err *err);
	/* Held submissions go on (after freeze, drain, or a rebuild). */
	void (*thaw)(void);
	/* Lets submissions through until each communicator reaches its target (targets of other
	 * members' communicators are ignored), then waits for the library's work on the GPU; all
	 * within timeout_ms: 0. Returns 1 instead, submissions still let through up to the targets,
	 * when a thread waits at a communicator at its target while another is below its own: the
	 * group must go one further on those (wants: key and count), and drains again with the
	 * raised targets (which only rise). -ETIMEDOUT, or -EPROTO for a count past its target; held
	 * either way. */
	int (*drain)(const struct gcr_group_targets *t, int timeout_ms, struct gcr_group_targets *wants,
		     struct gcr_err *err);
	/* Tears every live communicator down (local: no peer is waited for); calls stay held. */
	int (*teardown)(struct gcr_err *err);
	/* Fresh unique ids for the communicators named, whose rank 0 this process holds. */
	int (*ids)(const struct gcr_group_keys *keys, struct gcr_group_ids *out, struct gcr_err *err);
	/* Makes the torn-down communicators again (ids: one per communicator made by init; failed:
	 * marked failed instead), bounded by timeout_ms; calls stay held. Past the bound it returns
	 * -ETIMEDOUT and the work goes on: late(rc) is called from the library's thread when it
	 * ends. */
	int (*rebuild)(const struct gcr_group_ids *ids, const struct gcr_group_keys *failed, int timeout_ms,
		       void (*late)(int rc), struct gcr_err *err);
	/* Whether a rebuild is still running after its bound. */
	int (*rebuilding)(void);

	/* dlsym: the wrapper for a real function of the library looked up by name, or NULL. */
	void *(*wrap)(void *found, const char *name);
};

extern const struct shim_comm_ops shim_nccl_ops; /* shim/nccl/shim_nccl.c */

#endif
