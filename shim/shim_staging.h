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

/* One piece of a transfer: size bytes at device address dev <-> staging offset off. */
struct shim_xfer {
	uint64_t off;
	CUdeviceptr dev;
	uint64_t size;
	CUstream stream;
};

/* Moves every piece (out: device to staging; else back), slab by slab, and returns
 * once all copies finished. With unpin, each slab is unpinned as soon as its copies
 * are out, and pinned again just before its copies go in, so (un)pinning overlaps
 * the other slabs' copies: pinned memory slows the driver's own checkpoint step.
 * *ms_pin gets the time spent (un)pinning that was not hidden. */
int shim_staging_transfer(int out, const struct shim_xfer *x, size_t n, int unpin, double *ms_pin,
			  struct gcr_err *err);

/* One synchronous piece; for handles copied through a temporary mapping. */
int shim_staging_copy_sync(int out, uint64_t off, CUdeviceptr dev, uint64_t size, CUstream s,
			   struct gcr_err *err);

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
