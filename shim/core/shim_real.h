/* shim_real: the real dlsym/dlvsym (found in libc's own symbol table, never through
 * the dlsym the shim interposes) and the real driver library's handle. */
#ifndef SHIM_REAL_H
#define SHIM_REAL_H

#include <cuda.h>

/* Driver functions the shim calls for its own work but does not interpose. */
#define SHIM_CU_INTERNAL_LIST \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuCtxGetCurrent) X(cuCtxSetCurrent) \
	X(cuCtxGetDevice) X(cuCtxSynchronize) X(cuMemGetAllocationGranularity) \
	X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceCanAccessPeer) X(cuStreamCreate) \
	X(cuStreamSynchronize) X(cuMemHostRegister_v2) X(cuMemHostUnregister) \
	X(cuDevicePrimaryCtxRetain) X(cuGetErrorName) X(cuMemGetInfo_v2) \
	X(cuEventCreate) X(cuEventSynchronize) X(cuEventDestroy_v2) \
	X(cuThreadExchangeStreamCaptureMode) X(cuModuleLoadData) X(cuModuleGetFunction) \
	X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamDestroy_v2) X(cuCtxGetLimit) X(cuCtxSetLimit)

struct shim_cu {
#define X(f) __typeof__(&f) f;
	SHIM_CU_INTERNAL_LIST
#undef X
};
/* Filled with the driver table; a NULL member means the driver lacks it. */
extern struct shim_cu shim_cu;

/* For the shim's own threads: relaxed stream-capture mode, so their driver calls
 * (pinning, synchronising) never invalidate an application's graph capture that
 * runs in global mode (PyTorch's default) on another thread. */
void shim_real_relax_capture(void);

/* Finds libc's dlsym and dlvsym; called from the constructor. 0 or -errno. */
int shim_real_init(void);
void *shim_real_dlsym(void *handle, const char *name);
void *shim_real_dlvsym(void *handle, const char *name, const char *version);
/* libc's dlsym and dlvsym themselves (NULL if not found), for shim_dlsym.c's RTLD_NEXT
 * trampolines, which must jump into them rather than call them. */
void *shim_real_dlsym_ptr(void);
void *shim_real_dlvsym_ptr(void);

/* Opens the driver (the object that holds hint, or "libcuda.so.1" when hint is
 * NULL) once and fills shim_hooks[].real. Returns 0 or -errno. */
int shim_real_load_cuda(const void *hint);
/* The driver's handle, or NULL before shim_real_load_cuda succeeded. */
void *shim_real_cuda_handle(void);

#endif
