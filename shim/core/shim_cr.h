/* shim_cr: the shim's side of suspend and resume, an explicit state machine:
 * RUNNING -> (gate, sync, copy out, release) -> SUSPENDED -> (create, map, copy in) -> RUNNING;
 * a member of a group of NCCL processes goes RUNNING -> FROZEN -> DRAINED -> (communicators torn
 * down) -> SUSPENDED -> DETACHED -> REBUILDING -> REBUILT -> RUNNING (docs/design.md, "Groups"). */
#ifndef SHIM_CR_H
#define SHIM_CR_H

#include <stdint.h>

#include "gcr_error.h"
#include "gcr_groupmsg.h"

/* The states; their names (what status reports) and the edges allowed between them are one
 * table in shim_cr.c, so a new state is a row there. */
enum shim_cr_state {
	SHIM_CR_RUNNING = 0,
	SHIM_CR_SUSPENDING,
	SHIM_CR_SUSPENDED,
	SHIM_CR_RESUMING,
	SHIM_CR_FROZEN,     /* a group member: NCCL submissions held, counts reported */
	SHIM_CR_DRAINED,    /* counts at the group's targets, NCCL's work done */
	SHIM_CR_DETACHED,   /* communicators torn down, NCCL calls held, CUDA running */
	SHIM_CR_REBUILDING, /* communicators being made again */
	SHIM_CR_REBUILT,    /* made again, NCCL calls held until thawed */
	SHIM_CR_NSTATES
};

struct shim_cr_report {
	double ms_gate, ms_sync, ms_digest, ms_copy_prep, ms_copy, ms_release;
	double ms_map, ms_ctx, ms_total;
	double ms_comm; /* a group member's suspend: its communicators torn down (ncclCommAbort) */
	uint64_t bytes;     /* bytes of the allocations staged */
	uint64_t copied;    /* of which moved over PCIe */
	uint64_t zero;      /* of which all zero: recorded, not copied */
	uint64_t unchanged; /* of which unchanged since the copy kept (GCR_INCREMENTAL) */
	uint64_t host;      /* host bytes the staging holds (pool + pinned slots) */
	uint64_t handles;   /* physical allocations staged */
	uint64_t mappings;
	uint64_t ctx_freed; /* device bytes of context scratch given back while suspended */
};

/* Where the process's GPU data is (status "data", protocol.h GCR_DATA_*): part of the machine's
 * state, moved with it (the table says which places each state allows and which moves there are). */
enum shim_cr_data {
	SHIM_CR_DATA_GPU = 0,
	SHIM_CR_DATA_HOST,    /* the host staging: a resume brings it back */
	SHIM_CR_DATA_WRITTEN, /* image files only: resume refused until an image-read attaches them */
	SHIM_CR_DATA_FILES,   /* image files attached: the next resume reads them */
	SHIM_CR_NDATA
};

/* The overcommit wake (protocol.h "wake"), also the machine's: armed by a suspend with "wake" to
 * host memory, called once by the first thread that reaches the closed gate, off at the resume. */
enum shim_cr_wake {
	SHIM_CR_WAKE_OFF = 0,
	SHIM_CR_WAKE_ARMED,
	SHIM_CR_WAKE_CALLED,
};

enum shim_cr_state shim_cr_state(void);
const char *shim_cr_state_name(enum shim_cr_state s); /* "unknown" out of range */
enum shim_cr_data shim_cr_data(void);
const char *shim_cr_data_name(enum shim_cr_data d); /* "unknown" out of range */
/* Whether the machine may go from one state to another: 0, or -EINVAL with err naming both
 * states. Every change of state goes through it. */
int shim_cr_edge_check(enum shim_cr_state from, enum shim_cr_state to, struct gcr_err *err);
/* Whether, in state s (the state after the move), the data may go from one place to the other
 * (from == to: whether s allows it there): 0, or -EINVAL with err naming them. Every move of
 * the data goes through it. */
int shim_cr_data_check(enum shim_cr_state s, enum shim_cr_data from, enum shim_cr_data to, struct gcr_err *err);
/* While suspended, the image files move the data without a change of state (shim_imagefile):
 * image-write's drop (host -> written), image-read (written or files -> files, and back to
 * written when it fails), a suspend to files undone (written -> files). 0 or -EINVAL. */
int shim_cr_data_move(enum shim_cr_data to, struct gcr_err *err);

/* The GPU memory the driver's restore needs (the restore_need op): accepted only while
 * suspended (-EINVAL otherwise, err naming the state); kept through a resume that fails, gone
 * at the next suspend or the resume that succeeds. shim_cr_need: 1 with *out filled when one
 * is kept, else 0. */
struct gcr_need;
int shim_cr_need_set(const struct gcr_need *need, struct gcr_err *err);
int shim_cr_need(struct gcr_need *out);

/* The wake: armed only while suspended with the data in host memory (-EINVAL otherwise: an
 * image's process is dumped, nothing of it calls). fire is for the gate's wait hook (an
 * application thread, no cr_lock): 1 when this call took the wake from armed to called (the
 * caller then sends it), with since_ms (monotonic) the first caller's arrival; 0 otherwise. A
 * resume takes an armed wake off while it runs and puts it back when it fails. */
int shim_cr_wake_arm(struct gcr_err *err);
int shim_cr_wake_fire(double since_ms);
void shim_cr_wake_disarm(void); /* a suspend being undone, or a forked child: no lock taken */
enum shim_cr_wake shim_cr_wake(double *since_ms);
/* Suspend and resume requests received so far (refused ones too). */
void shim_cr_requests(unsigned long long *suspends, unsigned long long *resumes);

/* Each returns 0 or -errno with err set; on failure the process is left running
 * (suspend) or suspended and resumable (resume). A process holding live NCCL communicators is
 * refused (-EXDEV): its group is suspended with shim_cr_suspend_group. A resume of a process
 * whose communicators were torn down ends DETACHED, waiting for its group's rebuild. A resume
 * with the data in image files only (SHIM_CR_DATA_WRITTEN) is refused (-EINVAL). */
int shim_cr_suspend(int timeout_ms, struct shim_cr_report *rep, struct gcr_err *err);
int shim_cr_resume(struct shim_cr_report *rep, struct gcr_err *err);

/* ---- a member of a group of processes that communicate through NCCL (shim_comm.h; the
 * coordinator is lib/gcr_group.c). Each returns 0 or -errno with err saying the state left. ---- */
/* running -> frozen; out: the communicators and their counts. The member thaws by itself
 * hold_ms after the freeze (and after the drain, and after a rebuild) unless the group moved
 * on, or when shim_cr_abandon says its coordinator is gone. */
int shim_cr_freeze(int hold_ms, int wait_ms, struct gcr_group_comms *out, struct gcr_err *err);
/* frozen (or drained: targets raised) -> drained: 0. 1: stays frozen, still draining, and wants
 * lists the communicators the group must go one further on (shim_comm_ops.drain). On failure
 * thawed (running). */
int shim_cr_drain(const struct gcr_group_targets *t, int timeout_ms, struct gcr_group_comms *out,
		  struct gcr_group_targets *wants, struct gcr_err *err);
/* frozen, drained or rebuilt -> running. */
int shim_cr_thaw(struct gcr_err *err);
/* drained or rebuilt -> detached (communicators torn down). */
int shim_cr_detach(struct gcr_err *err);
/* drained (torn down first) or detached -> suspended; on failure detached. */
int shim_cr_suspend_group(int timeout_ms, struct shim_cr_report *rep, struct gcr_err *err);
/* detached: fresh unique ids for the communicators named (rank 0 here). */
int shim_cr_ids(const struct gcr_group_keys *keys, struct gcr_group_ids *out, struct gcr_err *err);
/* detached -> rebuilding -> rebuilt; -ETIMEDOUT leaves it rebuilding until NCCL ends; other
 * failures detached. */
int shim_cr_rebuild(const struct gcr_group_ids *ids, const struct gcr_group_keys *failed, int timeout_ms,
		    struct gcr_group_comms *out, struct gcr_err *err);
/* The communicators now (status). */
void shim_cr_comms(struct gcr_group_comms *out, int *held);
/* A held member's coordinator has gone (the connection that froze it closed): thaw now. */
void shim_cr_abandon(void);
/* Thaws a member held past its bound; returns the next such bound (monotonic ms), 0 for none.
 * The control thread calls it as it goes round. */
double shim_cr_tick(void);

/* Suspend to an image (shim_imagefile): each copied chunk goes from its pinned slot to a file,
 * no staging. open gives each staged allocation's file (fd; dfd the same opened O_DIRECT, or
 * -1) and a name for messages (kept until the suspend returns). On success each chunk table holds,
 * for the image's table, zero[c] and (shim_chunks_record) the file offset and CRC-32C of every other
 * chunk, back to back in chunk order; the handles are released only once every chunk is
 * written, so on failure nothing left the GPU and the process runs on. */
struct shim_phys;
struct shim_cr_sink {
	int (*open)(struct shim_phys *p, int *fd, int *dfd, const char **name, void *ctx, struct gcr_err *err);
	/* Makes every chunk table read its file on the next resume (sets src_fd): the unwind of a suspend
	 * that failed after releasing handles, whose data is then only in the files. */
	void (*attach)(void *ctx);
	void *ctx;
};
int shim_cr_suspend_to(const struct shim_cr_sink *sink, int timeout_ms, struct shim_cr_report *rep,
		       struct gcr_err *err);

/* Once the whole suspend is over (the driver's checkpoint included: giving memory
 * back while it runs slows it), the staging pool beyond the saved data is returned
 * to the system in the background. No-op unless suspended. */
void shim_cr_trim(void);

#endif
