/* shim_digest: per-chunk digests of device buffers, computed on the GPU by the
 * embedded kernel (shim_digest_kernel.cu, math in shim_digest_math.h). They make
 * chunks the application never wrote free to save, and incremental suspends
 * exact: a chunk is skipped only when its content digests the same as the copy
 * already held. */
#ifndef SHIM_DIGEST_H
#define SHIM_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_digest_math.h"
#include "shim_gpu.h"

struct shim_digest {
	uint64_t h1, h2, any; /* any == 0: the chunk is all zero bytes */
};

/* Loads gpu's kernel for ctx's device (CUDA: the driver JIT-compiles the PTX: done in the
 * background so no suspend pays for it). Failures are logged once; no-op without a kernel. */
void shim_digest_preload(const struct shim_gpu_ops *gpu, void *ctx);

/* One buffer to digest: size bytes at va on GPU device; its chunks' digests go
 * to out[first ...]. */
struct shim_digest_req {
	shim_gpu_va va;
	uint64_t size;
	int device;
	size_t first;
};

static inline size_t shim_digest_nchunks(uint64_t size)
{
	return (size_t)((size + GCR_DIGEST_CHUNK - 1) / GCR_DIGEST_CHUNK);
}

/* Digests every request (one launch each, one copy back per GPU). 0, -ENOSYS
 * when the kernel cannot run here (the caller then copies every chunk): always on
 * a vendor other than CUDA (the kernel is PTX; docs/amd.md), or another -errno.
 * The application's work must be finished (the gate is closed). */
int shim_digest_run(const struct shim_gpu_ops *gpu, const struct shim_digest_req *req, size_t n,
		    struct shim_digest *out, struct gcr_err *err);

#endif
