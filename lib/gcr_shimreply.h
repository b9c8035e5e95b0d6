/* gcr_shimreply: reading the fields gcrctl and the agent act on out of a shim's replies.
 * The workload owns the shim's socket, so every value is checked before it is used. */
#ifndef GCR_SHIMREPLY_H
#define GCR_SHIMREPLY_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"
#include "gcr_proto.h"

/* Any byte count a shim reports is below 2^50 (1 PiB): more than any host's GPUs hold, and
 * a sum of a few thousand of them still fits a long long. */
#define GCR_SHIMREPLY_BYTES_MAX (1LL << 50)
/* A call counter is below the same bound: 10^15 calls, about 30 years at a million per second. */
#define GCR_SHIMREPLY_CALLS_MAX (1LL << 50)
/* The shim's state names ("running", "suspended", ...), with their NUL. */
#define GCR_SHIMREPLY_STATE_LEN 32
/* Entries in a stats reply's "calls" map: two per hook (plain and per-thread), a few
 * hundred hooks today; the bound keeps the sum below LLONG_MAX. */
#define GCR_SHIMREPLY_MAX_CALLS 4096

/* The shim's process states, one enum for every reader (the names are shim_cr's). UNKNOWN:
 * no answer, or a name this reader does not know. */
enum gcr_shimreply_st {
	GCR_SHIMREPLY_ST_RUNNING = 0,
	GCR_SHIMREPLY_ST_SUSPENDING,
	GCR_SHIMREPLY_ST_SUSPENDED,
	GCR_SHIMREPLY_ST_RESUMING,
	/* a member of a group of NCCL processes (include/gcr/protocol.h, "groups") */
	GCR_SHIMREPLY_ST_FROZEN,
	GCR_SHIMREPLY_ST_DRAINED,
	GCR_SHIMREPLY_ST_DETACHED,
	GCR_SHIMREPLY_ST_REBUILDING,
	GCR_SHIMREPLY_ST_REBUILT,
	GCR_SHIMREPLY_ST_UNKNOWN,
	GCR_SHIMREPLY_ST_N
};

/* "running", "suspending", "suspended", "resuming", "frozen", "drained", "detached",
 * "rebuilding", "rebuilt", "unknown". */
const char *gcr_shimreply_st_name(enum gcr_shimreply_st s);

/* The state named name (NULL-safe); GCR_SHIMREPLY_ST_UNKNOWN for any other string. */
enum gcr_shimreply_st gcr_shimreply_st_of(const char *name);

/* Each function returns 0, -ENOENT when the field is absent (an older shim, or a reply of
 * another kind), or -EPROTO when it is there but malformed; on any error the outputs hold
 * their "nothing known" values (NULL, 0) and err says which field was wrong. */

/* A status or report's "state": *state points into reply (lives as long as it), 1 ..
 * GCR_SHIMREPLY_STATE_LEN - 1 printable ASCII characters without spaces. */
int gcr_shimreply_state(json_t *reply, const char **state, struct gcr_err *err) __attribute__((warn_unused_result));

/* Whether a status says the process uses HIP and not CUDA (its control step is CRIU's).
 * A status without "backends" (older shims) is CUDA: *hip = 0, returns 0. */
int gcr_shimreply_is_hip(json_t *status, int *hip, struct gcr_err *err) __attribute__((warn_unused_result));

/* A suspend or resume report's byte counts: "bytes" (the staged buffers) and "copied"
 * (what crossed PCIe; the whole of bytes when absent, as older shims sent). */
int gcr_shimreply_bytes(json_t *report, long long *total, long long *moved, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* A status's "bytes" object summed for display: the fast path (vmm + app_vmm) and what is
 * left to the driver (driver + async); members an older shim lacks count 0. */
int gcr_shimreply_sizes(json_t *status, long long *fast, long long *driver, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* A status's "restore_need": {"devices": [{"uuid": s, "bytes": n}, ...]}, at least one, as the
 * restore_need op takes it (gcr_proto_need_parse). */
int gcr_shimreply_restore_need(json_t *status, struct gcr_need *need, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* A status's (or a group op's reply's) "comms": the NCCL communicators of a group member,
 * checked by gcr_groupmsg_comms; -ENOENT without any (no NCCL), -EPROTO malformed. */
struct gcr_group_comms;
int gcr_shimreply_comms(json_t *reply, struct gcr_group_comms *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Where a process's GPU data is (a status's "data", protocol.h GCR_DATA_*). Older shims say it
 * only while suspended. */
enum gcr_shimreply_data {
	GCR_SHIMREPLY_DATA_HOST = 0, /* host memory: a resume brings it back */
	GCR_SHIMREPLY_DATA_WRITTEN,  /* image files only: image-read, then resume */
	GCR_SHIMREPLY_DATA_FILES,    /* image files attached: a resume reads them */
	GCR_SHIMREPLY_DATA_GPU,      /* on the GPU: not suspended */
};
int gcr_shimreply_data(json_t *status, enum gcr_shimreply_data *data, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* A status's "wake" (a wake suspend in effect): *called 1 when a thread has called since it
 * (the wake sent, or tried), with *waited_ms since that first call (0 .. 2^50 - 1); 0 while
 * armed. */
int gcr_shimreply_wake(json_t *status, int *called, long long *waited_ms, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The sum of a stats reply's "calls" map of hook name to count: 0 .. LLONG_MAX. Every shim
 * sends the map, so its absence is -EPROTO too (-ENOENT would read as "no shim" to callers). */
int gcr_shimreply_calls(json_t *stats, long long *sum, struct gcr_err *err) __attribute__((warn_unused_result));

#endif
