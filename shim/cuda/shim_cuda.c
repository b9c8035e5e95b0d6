/* shim_cuda: struct shim_gpu_ops on the CUDA driver: exactly the driver calls the data path made
 * before the operations table existed (SHIM_REAL for interposed entry points, shim_cu for the
 * rest: shim_cuda_real.h), with the same arguments, so the CUDA path behaves as it did. */
#include "shim_gpu.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gcr_log.h"
#include "shim_cuda_digest.h"
#include "shim_cuda_real.h"
#include "shim_hook.h"

/* The table records CUmemAccessDesc as struct shim_gpu_access and passes it back as is. */
_Static_assert(sizeof(struct shim_gpu_access) == sizeof(CUmemAccessDesc), "access layout");
_Static_assert(offsetof(CUmemAccessDesc, location.type) == offsetof(struct shim_gpu_access, type), "type");
_Static_assert(offsetof(CUmemAccessDesc, location.id) == offsetof(struct shim_gpu_access, id), "id");
_Static_assert(offsetof(CUmemAccessDesc, flags) == offsetof(struct shim_gpu_access, flags), "flags");
_Static_assert(CU_MEM_LOCATION_TYPE_DEVICE == SHIM_GPU_LOC_DEVICE, "device location");
_Static_assert(CU_MEM_ACCESS_FLAGS_PROT_READ == SHIM_GPU_PROT_READ, "read");
_Static_assert(CU_MEM_ACCESS_FLAGS_PROT_READWRITE == SHIM_GPU_PROT_READWRITE, "read-write");
_Static_assert(CUDA_ERROR_INVALID_VALUE == SHIM_GPU_INVALID_VALUE, "invalid value");
_Static_assert(CUDA_ERROR_OUT_OF_MEMORY == SHIM_GPU_OUT_OF_MEMORY, "out of memory");
_Static_assert(CUDA_ERROR_NOT_SUPPORTED == SHIM_GPU_NOT_SUPPORTED, "not supported");
/* The table keeps a CUmemAllocationProp as struct shim_gpu_prop and gives it back to create. */
_Static_assert(sizeof(CUmemAllocationProp) <= sizeof(struct shim_gpu_prop), "properties fit");
_Static_assert(_Alignof(CUmemAllocationProp) <= _Alignof(struct shim_gpu_prop), "properties aligned");

static const char *cuda_error_string(int code)
{
	const char *name = NULL;
	if (shim_cu.cuGetErrorName == NULL || shim_cu.cuGetErrorName((CUresult)code, &name) != CUDA_SUCCESS)
		name = NULL;
	return name ? name : "CUDA error";
}

/* One driver result as 0 / -errno with the message shim_cr and shim_staging always gave. */
static int cu_rc(CUresult r, const char *what, struct gcr_err *err)
{
	if (r == CUDA_SUCCESS)
		return 0;
	shim_cuda_set_last_code((int)r);
	int code = r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : r == CUDA_ERROR_NOT_SUPPORTED ? -ENOTSUP : -EIO;
	return gcr_err_set(err, code, "%s failed: %s (%d)", what, cuda_error_string((int)r), (int)r);
}

/* A driver entry point the driver lacks is an error, never a NULL call. */
#define CU_NEED(fn, name)                                                                  \
	do {                                                                               \
		if ((fn) == NULL) {                                                        \
			shim_cuda_set_last_code(CUDA_ERROR_NOT_FOUND);                     \
			return gcr_err_set(err, -ENOSYS, "the driver lacks %s", name);     \
		}                                                                          \
	} while (0)

static int cuda_load(struct gcr_err *err)
{
	if (shim_real_handle(SHIM_CUDA) == NULL && shim_real_load(SHIM_CUDA, NULL) < 0)
		return gcr_err_set(err, -ENODEV, "the process has no CUDA driver");
	if (SHIM_REAL(cuMemcpyDtoHAsync_v2, 0) == NULL || SHIM_REAL(cuMemcpyHtoDAsync_v2, 0) == NULL ||
	    SHIM_REAL(cuMemsetD8Async, 0) == NULL || SHIM_REAL(cuEventRecord, 0) == NULL)
		return gcr_err_set(err, -ENOSYS, "the driver lacks async copies");
	return 0;
}

static int cuda_device_count(int *count, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuDeviceGetCount, "cuDeviceGetCount");
	return cu_rc(shim_cu.cuDeviceGetCount(count), "cuDeviceGetCount", err);
}

static int cuda_current_device(int *device, void **ctx_out, struct gcr_err *err)
{
	CUcontext ctx = NULL;
	CUdevice dev = 0;
	CU_NEED(shim_cu.cuCtxGetCurrent, "cuCtxGetCurrent");
	int rc = cu_rc(shim_cu.cuCtxGetCurrent(&ctx), "cuCtxGetCurrent", err);
	if (rc == 0 && ctx == NULL)
		rc = gcr_err_set(err, -ENODEV, "no current CUDA context");
	if (rc == 0)
		rc = cu_rc(shim_cu.cuCtxGetDevice(&dev), "cuCtxGetDevice", err);
	if (rc == 0) {
		*device = dev;
		*ctx_out = ctx;
	}
	return rc;
}

static int cuda_granularity(int device, size_t *bytes, struct gcr_err *err)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, device } };
	return cu_rc(shim_cu.cuMemGetAllocationGranularity(bytes, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		     "cuMemGetAllocationGranularity", err);
}

static int cuda_can_access_peer(int device, int peer, int *can, struct gcr_err *err)
{
	return cu_rc(shim_cu.cuDeviceCanAccessPeer(can, peer, device), "cuDeviceCanAccessPeer", err);
}

static int cuda_reserve(shim_gpu_va *va, size_t size, size_t align, struct gcr_err *err)
{
	CUdeviceptr p = 0;
	int rc = cu_rc(shim_cu.cuMemAddressReserve(&p, size, align, 0, 0), "cuMemAddressReserve", err);
	if (rc == 0)
		*va = p;
	return rc;
}

static int cuda_free_va(shim_gpu_va va, size_t size, struct gcr_err *err)
{
	return cu_rc(shim_cu.cuMemAddressFree(va, size), "cuMemAddressFree", err);
}

static int cuda_create(shim_gpu_handle *h, size_t size, int device, const void *prop, struct gcr_err *err)
{
	CUmemAllocationProp own = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				    .location = { CU_MEM_LOCATION_TYPE_DEVICE, device } };
	CUmemGenericAllocationHandle out = 0;
	int rc = cu_rc(SHIM_REAL(cuMemCreate, 0)(&out, size, prop ? prop : &own, 0), "cuMemCreate", err);
	if (rc == 0)
		*h = out;
	return rc;
}

static int cuda_release(shim_gpu_handle h, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemRelease, 0)(h), "cuMemRelease", err);
}

static int cuda_map(shim_gpu_va va, size_t size, size_t offset, shim_gpu_handle h, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemMap, 0)(va, size, offset, h, 0), "cuMemMap", err);
}

static int cuda_unmap(shim_gpu_va va, size_t size, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemUnmap, 0)(va, size), "cuMemUnmap", err);
}

static int cuda_set_access(shim_gpu_va va, size_t size, const struct shim_gpu_access *acc, size_t n,
			   struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemSetAccess, 0)(va, size, (const CUmemAccessDesc *)(const void *)acc, n),
		     "cuMemSetAccess", err);
}

/* ---- contexts: those the application allocated in (waited for at suspend, their scratch given
 * back), and per device the one the shim's own work runs in. Written by ctx_note under the table
 * lock; read by the data path, while allocations are gated. ---- */
#define CUDA_MAX_CTX 64
static CUcontext app_ctxs[CUDA_MAX_CTX];
static size_t napp_ctxs;
static CUcontext dev_ctx[SHIM_MAX_DEVICES];

static void *cuda_ctx_note(int device, void *ctx_in)
{
	CUcontext ctx = ctx_in;
	if (ctx == NULL && shim_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		ctx = NULL;
	if (ctx != NULL) {
		size_t i = 0;
		while (i < napp_ctxs && app_ctxs[i] != ctx)
			i++;
		if (i == napp_ctxs && napp_ctxs < CUDA_MAX_CTX)
			app_ctxs[napp_ctxs++] = ctx;
	}
	if (device < 0 || device >= SHIM_MAX_DEVICES)
		return NULL;
	if (dev_ctx[device] == NULL && ctx != NULL) {
		CUdevice cur;
		if (shim_cu.cuCtxGetDevice(&cur) == CUDA_SUCCESS && cur == device)
			dev_ctx[device] = ctx;
	}
	return dev_ctx[device];
}

/* Whether dev's primary context is not made yet: a retain now makes it. */
static int cuda_primary_new(CUdevice dev)
{
	unsigned int flags = 0;
	int active = 1;
	return shim_cu.cuDevicePrimaryCtxGetState != NULL &&
	       shim_cu.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && !active;
}

/* Says which thread made GPU dev's primary context, and from which libraries: the driver's
 * checkpoint copies every context a process holds (~0.5 GiB each), so one on a GPU the process
 * does not compute on doubles its driver step (run 60: a tensor-parallel rank held 518 MiB on
 * GPU 0 besides its own GPU). One line, at info, only when a context is made. */
static void cuda_primary_made(CUdevice dev, const char *by)
{
	char name[32] = "?", where[512] = "";
	(void)pthread_getname_np(pthread_self(), name, sizeof(name));
	void *frames[12];
	int n = backtrace(frames, 12), len = 0;
	for (int i = 1; i < n && len < (int)sizeof(where) - 64; i++) {
		Dl_info di;
		if (dladdr(frames[i], &di) == 0 || di.dli_fname == NULL)
			continue;
		const char *base = strrchr(di.dli_fname, '/');
		len += snprintf(where + len, sizeof(where) - (size_t)len, " %s+0x%lx", base ? base + 1 : di.dli_fname,
				(unsigned long)((const char *)frames[i] - (const char *)di.dli_fbase));
	}
	GCR_LOG(GCR_LOG_INFO, "shim", "GPU %d's primary context made by %s, thread %ld (%s), from:%s", (int)dev, by,
		(long)gettid(), name, where);
}

/* retain (the driver's cuDevicePrimaryCtxRetain) of dev's primary context, for by (the
 * application or the shim), logging it when this call makes the context. */
static CUresult cuda_primary_retain(__typeof__(&cuDevicePrimaryCtxRetain) retain, CUcontext *pctx, CUdevice dev,
				    const char *by)
{
	if (retain == NULL)
		return CUDA_ERROR_NOT_FOUND;
	int made = cuda_primary_new(dev);
	CUresult r = retain(pctx, dev);
	if (r == CUDA_SUCCESS && made)
		cuda_primary_made(dev, by);
	return r;
}

SHIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	return cuda_primary_retain(SHIM_REAL(cuDevicePrimaryCtxRetain, 0), pctx, dev, "the application");
}

/* device's context: the first the application allocated in there, else the primary one. */
static CUcontext cuda_device_ctx(int device)
{
	if (device < 0 || device >= SHIM_MAX_DEVICES)
		return NULL;
	CUdevice d;
	if (dev_ctx[device] == NULL && shim_cu.cuDeviceGet(&d, device) == CUDA_SUCCESS)
		(void)cuda_primary_retain(shim_cu.cuDevicePrimaryCtxRetain, &dev_ctx[device], d, "the shim");
	return dev_ctx[device];
}

static int cuda_present(void)
{
	return shim_real_handle(SHIM_CUDA) != NULL;
}

static int cuda_set_device(int device, struct gcr_err *err)
{
	CUcontext ctx = cuda_device_ctx(device);
	return cu_rc(ctx != NULL ? shim_cu.cuCtxSetCurrent(ctx) : CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent", err);
}

static int cuda_ctx_get(void **ctx, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuCtxGetCurrent, "cuCtxGetCurrent");
	CUcontext c = NULL;
	int rc = cu_rc(shim_cu.cuCtxGetCurrent(&c), "cuCtxGetCurrent", err);
	*ctx = c;
	return rc;
}

static int cuda_ctx_set(void *ctx, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuCtxSetCurrent, "cuCtxSetCurrent");
	return cu_rc(shim_cu.cuCtxSetCurrent((CUcontext)ctx), "cuCtxSetCurrent", err);
}

static int cuda_stream_create(int device, shim_gpu_stream *s, struct gcr_err *err)
{
	(void)device; /* the current context's: set_device chose it */
	CUstream st = NULL;
	int rc = cu_rc(shim_cu.cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), "cuStreamCreate", err);
	if (rc == 0)
		*s = st;
	return rc;
}

static int cuda_stream_destroy(shim_gpu_stream s, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuStreamDestroy_v2, "cuStreamDestroy");
	return cu_rc(shim_cu.cuStreamDestroy_v2((CUstream)s), "cuStreamDestroy", err);
}

static int cuda_stream_sync(shim_gpu_stream s, struct gcr_err *err)
{
	return cu_rc(shim_cu.cuStreamSynchronize((CUstream)s), "cuStreamSynchronize", err);
}

static int cuda_event_create(shim_gpu_event *e, struct gcr_err *err)
{
	CUevent ev = NULL;
	int rc = cu_rc(shim_cu.cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate", err);
	if (rc == 0)
		*e = ev;
	return rc;
}

static int cuda_event_record(shim_gpu_event e, shim_gpu_stream s, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuEventRecord, 0)((CUevent)e, (CUstream)s), "cuEventRecord", err);
}

static int cuda_event_sync(shim_gpu_event e, struct gcr_err *err)
{
	return cu_rc(shim_cu.cuEventSynchronize((CUevent)e), "cuEventSynchronize", err);
}

/* As cuMemFree synchronises: the calling thread's context when it is device's (the common case,
 * and the one call cuMemFree's wrapper made before the table had an API); otherwise device's
 * context, then the caller's context is made current again. */
static int cuda_device_sync(int device, struct gcr_err *err)
{
	CUcontext cur = NULL;
	CUdevice d = -1;
	if (shim_cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL &&
	    shim_cu.cuCtxGetDevice(&d) == CUDA_SUCCESS && d == device)
		return cu_rc(shim_cu.cuCtxSynchronize(), "cuCtxSynchronize", err);
	int rc = cuda_set_device(device, err);
	if (rc == 0)
		rc = cu_rc(shim_cu.cuCtxSynchronize(), "cuCtxSynchronize", err);
	if (cur != NULL)
		(void)shim_cu.cuCtxSetCurrent(cur);
	return rc;
}

/* Local memory: the driver reserves stack limit x resident threads of every SM in each context
 * (264 MiB of the ~520 MiB a context holds on the H100 at the default 1 KiB) and its checkpoint
 * copies that like data, though nothing lives there between kernels. With the limit at 0 while
 * suspended the driver's checkpoint took ~150 ms less and its restore ~50 ms less; lowering and
 * raising it took 0.3-0.5 ms (bench/ctx_probe, docs/results/2026-11-21-h100-ctx-probe). Kernels
 * whose frames need more still get it at launch; resume restores the application's limit
 * before any of its work runs. On by default; GCR_CTX_SHRINK=0 turns it off. Saved limits:
 * cr_lock (shim_cr) serialises the callers. */
static struct {
	CUcontext ctx;
	size_t stack;
} lmem_saved[CUDA_MAX_CTX];
static size_t lmem_nsaved;

static int cuda_ctx_shrink(uint64_t *freed, struct gcr_err *err)
{
	*freed = 0;
	if (shim_cu.cuCtxGetLimit == NULL || shim_cu.cuCtxSetLimit == NULL)
		return 0; /* a driver without limits: nothing to give back */
	if (lmem_nsaved > 0)
		return gcr_err_set(err, -EALREADY, "context limits from an earlier suspend not yet restored");
	CUcontext *ctxs = app_ctxs;
	for (size_t i = 0; i < napp_ctxs; i++) {
		size_t stack = 0, free0 = 0, free1 = 0, total = 0;
		CUresult r = shim_cu.cuCtxSetCurrent(ctxs[i]);
		if (r == CUDA_SUCCESS)
			r = shim_cu.cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE);
		if (r != CUDA_SUCCESS)
			return cu_rc(r, "cuCtxGetLimit(CU_LIMIT_STACK_SIZE)", err);
		if (stack == 0)
			continue;
		(void)shim_cu.cuMemGetInfo_v2(&free0, &total);
		/* Saved first: a limit changed by a call that then fails is still put back. */
		lmem_saved[lmem_nsaved].ctx = ctxs[i];
		lmem_saved[lmem_nsaved++].stack = stack;
		r = shim_cu.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0);
		if (r != CUDA_SUCCESS)
			return cu_rc(r, "cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0)", err);
		if (shim_cu.cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS && free1 > free0)
			*freed += free1 - free0;
	}
	return 0;
}

static int cuda_ctx_unshrink(struct gcr_err *err)
{
	while (lmem_nsaved > 0) {
		size_t i = lmem_nsaved - 1;
		CUresult r = shim_cu.cuCtxSetCurrent(lmem_saved[i].ctx);
		if (r == CUDA_SUCCESS)
			r = shim_cu.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, lmem_saved[i].stack);
		if (r != CUDA_SUCCESS)
			return cu_rc(r, "cuCtxSetLimit(CU_LIMIT_STACK_SIZE) back to the application's value", err);
		lmem_nsaved = i;
	}
	return 0;
}

/* Every context the application allocated in (work in a context that never allocated is not
 * waited for: docs/design.md, known limits). */
static int cuda_sync_all(struct gcr_err *err)
{
	for (size_t i = 0; i < napp_ctxs; i++) {
		CUresult r = shim_cu.cuCtxSetCurrent(app_ctxs[i]);
		if (r == CUDA_SUCCESS)
			r = shim_cu.cuCtxSynchronize();
		if (r != CUDA_SUCCESS)
			return cu_rc(r, "cuCtxSynchronize (application work failed?)", err);
	}
	return 0;
}

static int cuda_copy_dtoh_async(void *dst, shim_gpu_va src, size_t n, shim_gpu_stream s, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemcpyDtoHAsync_v2, 0)(dst, src, n, (CUstream)s), "cuMemcpyDtoHAsync", err);
}

static int cuda_copy_htod_async(shim_gpu_va dst, const void *src, size_t n, shim_gpu_stream s,
				struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemcpyHtoDAsync_v2, 0)(dst, src, n, (CUstream)s), "cuMemcpyHtoDAsync", err);
}

static int cuda_memset_async(shim_gpu_va dst, size_t n, shim_gpu_stream s, struct gcr_err *err)
{
	return cu_rc(SHIM_REAL(cuMemsetD8Async, 0)(dst, 0, n, (CUstream)s), "cuMemsetD8Async", err);
}

static int cuda_host_register(void *p, size_t n, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuMemHostRegister_v2, "cuMemHostRegister");
	return cu_rc(shim_cu.cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_PORTABLE), "cuMemHostRegister", err);
}

static int cuda_host_unregister(void *p, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuMemHostUnregister, "cuMemHostUnregister");
	return cu_rc(shim_cu.cuMemHostUnregister(p), "cuMemHostUnregister", err);
}

static int cuda_host_alloc(void **p, size_t n, struct gcr_err *err)
{
	CU_NEED(shim_cu.cuMemHostAlloc, "cuMemHostAlloc");
	return cu_rc(shim_cu.cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc (copy slot)", err);
}

static void cuda_host_free(void *p, size_t n)
{
	(void)n;
	if (shim_cu.cuMemFreeHost != NULL)
		shim_cu.cuMemFreeHost(p);
}

static int cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes, struct gcr_err *err)
{
	(void)device; /* the current context's device, as resume asked before the table existed */
	CU_NEED(shim_cu.cuMemGetInfo_v2, "cuMemGetInfo");
	return cu_rc(shim_cu.cuMemGetInfo_v2(free_bytes, total_bytes), "cuMemGetInfo", err);
}

const struct shim_gpu_ops shim_cuda_ops = {
	.name = "cuda",
	.caps = SHIM_GPU_CAP_CREATE_PROP,
	.prop_size = sizeof(CUmemAllocationProp),
	.bind = shim_cuda_real_bind,
	.relax_capture = shim_cuda_real_relax_capture,
	.last_code = shim_cuda_last_code,
	.present = cuda_present,
	.load = cuda_load,
	.device_count = cuda_device_count,
	.current_device = cuda_current_device,
	.granularity = cuda_granularity,
	.can_access_peer = cuda_can_access_peer,
	.reserve = cuda_reserve,
	.free_va = cuda_free_va,
	.create = cuda_create,
	.release = cuda_release,
	.map = cuda_map,
	.unmap = cuda_unmap,
	.set_access = cuda_set_access,
	.set_device = cuda_set_device,
	.ctx_get = cuda_ctx_get,
	.ctx_set = cuda_ctx_set,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.stream_sync = cuda_stream_sync,
	.event_create = cuda_event_create,
	.event_record = cuda_event_record,
	.event_sync = cuda_event_sync,
	.device_sync = cuda_device_sync,
	.sync_all = cuda_sync_all,
	.ctx_note = cuda_ctx_note,
	.ctx_shrink = cuda_ctx_shrink,
	.ctx_unshrink = cuda_ctx_unshrink,
	.copy_dtoh_async = cuda_copy_dtoh_async,
	.copy_htod_async = cuda_copy_htod_async,
	.memset_async = cuda_memset_async,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.mem_info = cuda_mem_info,
	.digest = shim_cuda_digest,
	.digest_preload = shim_cuda_digest_preload,
	.error_string = cuda_error_string,
};
