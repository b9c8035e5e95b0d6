/* shim_staging: the host memory that holds GPU buffers while suspended. Pinned
 * ahead of time by a background thread so no pinning sits on the critical path. */
#ifndef SHIM_STAGING_H
#define SHIM_STAGING_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"

/* The allocation path reports the bytes that may need staging; the background
 * thread grows the pinned pool to match. ctx is used to register memory. */
void shim_staging_note_bytes(uint64_t bytes, CUcontext ctx);

/* Makes at least total bytes of pinned staging available (growing on the spot if
 * the background thread is behind) and restarts allocation at offset 0. */
int shim_staging_prepare(uint64_t total, struct gcr_err *err);
/* Reserves size bytes; returns the logical offset to pass to the copies. */
uint64_t shim_staging_take(uint64_t size);

/* Queue copies between device memory and staging; a range may span pool slabs. */
int shim_staging_copy_out(uint64_t off, CUdeviceptr src, uint64_t size, CUstream s, struct gcr_err *err);
int shim_staging_copy_in(uint64_t off, CUdeviceptr dst, uint64_t size, CUstream s, struct gcr_err *err);

/* GCR_STAGING_UNPIN: unregister before the driver's step (pinned memory slows it)
 * and register again before copying back. */
int shim_staging_unpin(struct gcr_err *err);
int shim_staging_repin(struct gcr_err *err);

/* After resume (or a failed suspend): background pinning may go on. */
void shim_staging_resume_background(void);

struct shim_staging_stats {
	uint64_t capacity;      /* bytes mapped */
	uint64_t registered;    /* bytes pinned */
	uint64_t target;        /* bytes the allocation path asked for */
	uint64_t grown_inline;  /* bytes pinned on the critical path (should stay 0) */
	double pin_ms;          /* time spent pinning, all of it */
};
void shim_staging_stats(struct shim_staging_stats *st);

#endif
