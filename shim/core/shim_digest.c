/* shim_digest: the vendor-neutral entry to the digests (see shim_digest.h); the vendor that has
 * a kernel runs it (shim_gpu_ops.digest: CUDA's is shim/cuda/shim_cuda_digest.c). */
#include "shim_digest.h"

#include <errno.h>

void shim_digest_preload(const struct shim_gpu_ops *gpu, void *ctx)
{
	if (gpu->digest_preload != NULL)
		gpu->digest_preload(ctx);
}

int shim_digest_run(const struct shim_gpu_ops *gpu, const struct shim_digest_req *req, size_t n,
		    struct shim_digest *out, struct gcr_err *err)
{
	if (gpu->digest == NULL)
		return gcr_err_set(err, -ENOSYS, "no digest kernel for %s: every chunk is copied", gpu->name);
	return gpu->digest(req, n, out, err);
}
