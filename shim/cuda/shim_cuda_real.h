/* shim_cuda_real: the CUDA driver as the CUDA backend calls it for its own work: the driver
 * functions it calls but does not interpose (shim_cu), bound when shim_real opens the driver,
 * typed access to the real interposed ones (SHIM_REAL), and this thread's last driver error. */
#ifndef SHIM_CUDA_REAL_H
#define SHIM_CUDA_REAL_H

#include <cuda.h>

#include "shim_hooktab.h"
#include "shim_real.h"

/* Driver functions the shim calls for its own work but does not interpose, with cuda.h's
 * parameter lists (each stub in shim_cuda_real.c is checked against the header's prototype).
 * The driver must have every one of SHIM_CU_INTERNAL_LIST, or the shim does not serve in the
 * process; SHIM_CU_OPTIONAL_LIST may be missing (older drivers, the stand-in). Either way, once
 * the driver is loaded no member of shim_cu is NULL: a missing one is a stub answering
 * CUDA_ERROR_NOT_FOUND, so callers need no NULL checks. */
#define SHIM_CU_INTERNAL_LIST \
	X(cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
	X(cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
	X(cuCtxGetCurrent, (CUcontext *pctx)) \
	X(cuCtxSetCurrent, (CUcontext ctx)) \
	X(cuCtxGetDevice, (CUdevice *device)) \
	X(cuCtxSynchronize, (void)) \
	X(cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option)) \
	X(cuDeviceGetCount, (int *count)) \
	X(cuDeviceGet, (CUdevice *device, int ordinal)) \
	X(cuStreamCreate, (CUstream *phStream, unsigned int Flags)) \
	X(cuStreamSynchronize, (CUstream hStream)) \
	X(cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags)) \
	X(cuMemHostUnregister, (void *p)) \
	X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
	X(cuGetErrorName, (CUresult error, const char **pStr)) \
	X(cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes)) \
	X(cuEventCreate, (CUevent *phEvent, unsigned int Flags)) \
	X(cuEventSynchronize, (CUevent hEvent)) \
	X(cuEventDestroy_v2, (CUevent hEvent)) \
	X(cuModuleLoadData, (CUmodule *module, const void *image)) \
	X(cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name)) \
	X(cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags)) \
	X(cuMemFreeHost, (void *p)) \
	X(cuStreamDestroy_v2, (CUstream hStream)) \
	X(cuCtxGetLimit, (size_t *pvalue, CUlimit limit)) \
	X(cuCtxSetLimit, (CUlimit limit, size_t value))
/* The relaxed capture mode is only needed where capture exists; a single-device process
 * never asks about peers; a primary context's state only says who made one (a log line). */
#define SHIM_CU_OPTIONAL_LIST \
	X(cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active)) \
	X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode)) \
	X(cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus)) \
	X(cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev))

struct shim_cu {
#define X(f, params) __typeof__(&f) f;
	SHIM_CU_INTERNAL_LIST SHIM_CU_OPTIONAL_LIST
#undef X
};
/* Filled when the CUDA driver is loaded (shim_real_load calls shim_cuda_ops.bind). */
extern struct shim_cu shim_cu;

/* shim_cuda_ops.bind: fills shim_cu from the driver h (path: for the message). 1 if the shim
 * can serve on it; 0 when it lacks a function the shim's own work needs: the application runs
 * on it through the wrappers, but the shim converts no allocation and never serves. */
int shim_cuda_real_bind(void *h, const char *path);
/* shim_cuda_ops.relax_capture: relaxed stream-capture mode for the calling (shim) thread. */
void shim_cuda_real_relax_capture(void);

/* The driver's status code (CUresult) of this thread's last failed call the backend made
 * (shim_cuda_ops.last_code reads it). */
int shim_cuda_last_code(void);
void shim_cuda_set_last_code(int code);

/* The real function behind a CUDA hook, typed as cuda.h declares it; NULL when the driver
 * cannot be loaded or lacks the symbol. Variant 0 is the plain symbol, 1 its twin
 * (struct shim_hook). */
#define SHIM_REAL(sym, variant) \
	((__typeof__(&sym))shim_real_hook(SHIM_CUDA, SHIM_HOOK_##sym, (variant)))

#endif
