/* shim_cuda_digest: CUDA's digest operations (shim_gpu_ops.digest, .digest_preload): run the
 * embedded PTX kernel (shim_digest_kernel.cu, math in shim_digest_math.h; see shim_digest.h). */
#include "shim_cuda_digest.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_digest.h"
#include "shim_digest_ptx.h"
#include "shim_gpu.h"
#include "shim_hook.h"
#include "shim_real.h"

static pthread_mutex_t digest_lock = PTHREAD_MUTEX_INITIALIZER;
static CUmodule mods[SHIM_MAX_DEVICES];
static CUfunction fns[SHIM_MAX_DEVICES];
static CUstream streams[SHIM_MAX_DEVICES];
static int failed[SHIM_MAX_DEVICES]; /* the load failed once: do not retry */

static int cu_fail(struct gcr_err *err, int code, CUresult r, const char *what)
{
	return gcr_err_set(err, code, "%s failed: %s (%d)", what, shim_cuda_ops.error_string((int)r), (int)r);
}

/* With digest_lock held and dev's context current. */
static int load_locked(int dev, struct gcr_err *err)
{
	if (fns[dev] != NULL)
		return 0;
	if (failed[dev])
		return gcr_err_set(err, -ENOSYS, "the digest kernel could not be loaded on GPU %d", dev);
	if (shim_cu.cuModuleLoadData == NULL || shim_cu.cuModuleGetFunction == NULL ||
	    SHIM_REAL(cuLaunchKernel, 0) == NULL) {
		failed[dev] = 1;
		return gcr_err_set(err, -ENOSYS, "the driver lacks module loading");
	}
	CUresult r = shim_cu.cuModuleLoadData(&mods[dev], shim_digest_ptx);
	if (r == CUDA_SUCCESS)
		r = shim_cu.cuModuleGetFunction(&fns[dev], mods[dev], "gcr_chunk_digest");
	if (r == CUDA_SUCCESS && streams[dev] == NULL)
		r = shim_cu.cuStreamCreate(&streams[dev], CU_STREAM_NON_BLOCKING);
	if (r != CUDA_SUCCESS) {
		failed[dev] = 1;
		fns[dev] = NULL;
		cu_fail(err, -ENOSYS, r, "loading the digest kernel");
		GCR_LOG(GCR_LOG_WARN, "shim", "%s; suspends copy every chunk", err->msg);
		return err->code;
	}
	return 0;
}

void shim_cuda_digest_preload(void *ctx)
{
	CUdevice dev;
	if (ctx == NULL || shim_cu.cuCtxSetCurrent((CUcontext)ctx) != CUDA_SUCCESS ||
	    shim_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 || dev >= SHIM_MAX_DEVICES)
		return;
	struct gcr_err err;
	pthread_mutex_lock(&digest_lock);
	(void)load_locked(dev, &err);
	pthread_mutex_unlock(&digest_lock);
}

/* Digests dev's requests into out. digest_lock held. */
static int run_device(int dev, const struct shim_digest_req *req, size_t n, struct shim_digest *out,
		      struct gcr_err *err)
{
	CUresult r;
	int rc = shim_cuda_ops.set_device(dev, err);
	if (rc < 0) {
		err->code = -EIO;
		return gcr_err_wrap(err, "selecting the GPU's context");
	}
	rc = load_locked(dev, err);
	if (rc < 0)
		return rc;
	size_t total = 0;
	for (size_t i = 0; i < n; i++)
		if (req[i].device == dev)
			total += shim_digest_nchunks(req[i].size);
	if (total == 0)
		return 0;
	size_t bytes = total * sizeof(struct shim_digest);
	struct shim_digest *host = malloc(bytes);
	if (host == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	CUdeviceptr buf = 0;
	CUstream s = streams[dev];
	r = SHIM_REAL(cuMemAlloc_v2, 0)(&buf, bytes);
	if (r != CUDA_SUCCESS) {
		free(host);
		return cu_fail(err, -ENOMEM, r, "cuMemAlloc (digests)");
	}
	r = SHIM_REAL(cuMemsetD8Async, 0)(buf, 0, bytes, s);
	size_t at = 0;
	for (size_t i = 0; i < n && r == CUDA_SUCCESS; i++) {
		if (req[i].device != dev)
			continue;
		size_t nch = shim_digest_nchunks(req[i].size);
		CUdeviceptr va = req[i].va, outp = buf + at * sizeof(struct shim_digest);
		unsigned long long nbytes = req[i].size;
		void *args[] = { &va, &nbytes, &outp };
		r = SHIM_REAL(cuLaunchKernel, 0)(fns[dev], (unsigned)(nch * GCR_DIGEST_SLICES), 1, 1,
						 GCR_DIGEST_THREADS, 1, 1, 0, s, args, NULL);
		at += nch;
	}
	if (r == CUDA_SUCCESS)
		r = SHIM_REAL(cuMemcpyDtoHAsync_v2, 0)(host, buf, bytes, s);
	if (r == CUDA_SUCCESS)
		r = shim_cu.cuStreamSynchronize(s);
	if (r != CUDA_SUCCESS)
		rc = cu_fail(err, -EIO, r, "digesting buffers");
	SHIM_REAL(cuMemFree_v2, 0)(buf);
	at = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (req[i].device != dev)
			continue;
		size_t nch = shim_digest_nchunks(req[i].size);
		memcpy(&out[req[i].first], &host[at], nch * sizeof(*host));
		at += nch;
	}
	free(host);
	return rc;
}

int shim_cuda_digest(const struct shim_digest_req *req, size_t n, struct shim_digest *out, struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&digest_lock);
	for (int dev = 0; dev < SHIM_MAX_DEVICES && rc == 0; dev++) {
		size_t i;
		for (i = 0; i < n && req[i].device != dev; i++)
			;
		if (i < n)
			rc = run_device(dev, req, n, out, err);
	}
	pthread_mutex_unlock(&digest_lock);
	return rc;
}
