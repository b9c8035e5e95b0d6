/* gcr_driver: the CUDA driver's process checkpoint API (cuCheckpointProcess*),
 * opened at run time with dlopen; never linked, so GPU-less nodes run the tools. */
#ifndef GCR_DRIVER_H
#define GCR_DRIVER_H

#include <sys/types.h>

#include "gcr_error.h"

enum gcr_driver_state {
	GCR_DRIVER_RUNNING = 0,
	GCR_DRIVER_LOCKED,
	GCR_DRIVER_CHECKPOINTED,
	GCR_DRIVER_FAILED,
	GCR_DRIVER_UNKNOWN
};

const char *gcr_driver_state_name(enum gcr_driver_state s);

/* Opens libcuda.so.1 (GCR_LIBCUDA overrides the path) and calls cuInit, which the
 * driver requires before a restore. -ENOTSUP if the driver lacks the API. Every
 * call below opens the driver first (once), so callers need not. */
int gcr_driver_open(struct gcr_err *err);

int gcr_driver_state(pid_t pid, enum gcr_driver_state *state, struct gcr_err *err);
int gcr_driver_lock(pid_t pid, unsigned int timeout_ms, struct gcr_err *err);
int gcr_driver_checkpoint(pid_t pid, struct gcr_err *err);
/* Restore onto other GPUs: each GPU the process used (from) restored onto another of the same
 * model (to), through the driver's gpuPairs; uuid as NVML and nvidia-smi print it
 * ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"). */
#define GCR_DRIVER_MAX_PAIRS 64
#define GCR_DRIVER_UUID_LEN 96
struct gcr_gpu_pair {
	char from[GCR_DRIVER_UUID_LEN], to[GCR_DRIVER_UUID_LEN];
};
/* Parses "FROM=TO" (outside input: a command line); 0 or -EINVAL with err set. */
int gcr_driver_parse_pair(const char *s, struct gcr_gpu_pair *p, struct gcr_err *err);
/* npairs 0: onto the GPUs it was checkpointed on. */
int gcr_driver_restore(pid_t pid, const struct gcr_gpu_pair *pairs, size_t npairs, struct gcr_err *err);
int gcr_driver_unlock(pid_t pid, struct gcr_err *err);

#endif
