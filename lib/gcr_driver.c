/* gcr_driver: thin, type-checked calls into the dlopen'd driver. Prototypes come
 * from cuda.h through __typeof__, so a changed signature fails the build. */
#include "gcr_driver.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static struct {
	void *h;
	__typeof__(&cuInit) init;
	__typeof__(&cuGetErrorName) error_name;
	__typeof__(&cuCheckpointProcessGetState) get_state;
	__typeof__(&cuCheckpointProcessLock) lock;
	__typeof__(&cuCheckpointProcessCheckpoint) checkpoint;
	__typeof__(&cuCheckpointProcessRestore) restore;
	__typeof__(&cuCheckpointProcessUnlock) unlock;
} drv;

static pthread_mutex_t drv_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *const state_names[] = { "running", "locked", "checkpointed", "failed", "unknown" };

const char *gcr_driver_state_name(enum gcr_driver_state s)
{
	return (unsigned)s <= GCR_DRIVER_UNKNOWN ? state_names[s] : "unknown";
}

/* Loads one symbol into a typed slot without a cast between object and function
 * pointers (the union idiom of libnvidia-container). */
#define LOAD(slot, name)                                  \
	do {                                              \
		union {                                   \
			void *ptr;                        \
			__typeof__(drv.slot) fn;          \
		} u_ = { .ptr = dlsym(drv.h, name) };     \
		drv.slot = u_.fn;                         \
	} while (0)

int gcr_driver_open(struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&drv_lock);
	if (drv.h != NULL)
		goto out;
	const char *path = getenv("GCR_LIBCUDA");
	void *h = dlopen(path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		rc = gcr_err_set(err, -ENODEV, "cannot open the CUDA driver (%s): %s", path ? path : "libcuda.so.1",
				 dlerror());
		goto out;
	}
	drv.h = h;
	LOAD(init, "cuInit");
	LOAD(error_name, "cuGetErrorName");
	LOAD(get_state, "cuCheckpointProcessGetState");
	LOAD(lock, "cuCheckpointProcessLock");
	LOAD(checkpoint, "cuCheckpointProcessCheckpoint");
	LOAD(restore, "cuCheckpointProcessRestore");
	LOAD(unlock, "cuCheckpointProcessUnlock");
	if (drv.init == NULL || drv.get_state == NULL || drv.lock == NULL || drv.checkpoint == NULL ||
	    drv.restore == NULL || drv.unlock == NULL) {
		rc = gcr_err_set(err, -ENOTSUP,
				 "the CUDA driver has no checkpoint API (cuCheckpointProcess*; driver 550 or newer needed)");
		goto fail;
	}
	CUresult r = drv.init(0);
	if (r != CUDA_SUCCESS) {
		rc = gcr_err_set(err, -ENODEV, "cuInit failed (%d): no usable GPU driver", (int)r);
		goto fail;
	}
	goto out;
fail:
	dlclose(h);
	memset(&drv, 0, sizeof(drv));
out:
	pthread_mutex_unlock(&drv_lock);
	return rc;
}

static int cu_err(struct gcr_err *err, CUresult r, const char *what, pid_t pid)
{
	const char *name = NULL;
	if (drv.error_name == NULL || drv.error_name(r, &name) != CUDA_SUCCESS)
		name = "unknown error";
	int code = r == CUDA_ERROR_OUT_OF_MEMORY	? -ENOMEM
		   : r == CUDA_ERROR_ILLEGAL_STATE	? -EALREADY
		   : r == CUDA_ERROR_NOT_SUPPORTED	? -ENOTSUP
		   : r == CUDA_ERROR_NOT_READY		? -ETIMEDOUT
		   : r == CUDA_ERROR_INVALID_VALUE	? -ESRCH
							: -EIO;
	return gcr_err_set(err, code, "%s(pid %d) failed: %s (%d)", what, (int)pid, name, (int)r);
}

int gcr_driver_state(pid_t pid, enum gcr_driver_state *state, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	CUprocessState s;
	CUresult r = drv.get_state(pid, &s);
	if (r != CUDA_SUCCESS)
		return cu_err(err, r, "cuCheckpointProcessGetState", pid);
	switch (s) {
	case CU_PROCESS_STATE_RUNNING: *state = GCR_DRIVER_RUNNING; break;
	case CU_PROCESS_STATE_LOCKED: *state = GCR_DRIVER_LOCKED; break;
	case CU_PROCESS_STATE_CHECKPOINTED: *state = GCR_DRIVER_CHECKPOINTED; break;
	case CU_PROCESS_STATE_FAILED: *state = GCR_DRIVER_FAILED; break;
	default: *state = GCR_DRIVER_UNKNOWN; break;
	}
	return 0;
}

int gcr_driver_lock(pid_t pid, unsigned int timeout_ms, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	CUcheckpointLockArgs args;
	memset(&args, 0, sizeof(args));
	args.timeoutMs = timeout_ms;
	CUresult r = drv.lock(pid, &args);
	return r == CUDA_SUCCESS ? 0 : cu_err(err, r, "cuCheckpointProcessLock", pid);
}

int gcr_driver_checkpoint(pid_t pid, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	CUresult r = drv.checkpoint(pid, NULL);
	return r == CUDA_SUCCESS ? 0 : cu_err(err, r, "cuCheckpointProcessCheckpoint", pid);
}

int gcr_driver_restore(pid_t pid, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	CUresult r = drv.restore(pid, NULL);
	return r == CUDA_SUCCESS ? 0 : cu_err(err, r, "cuCheckpointProcessRestore", pid);
}

int gcr_driver_unlock(pid_t pid, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	CUresult r = drv.unlock(pid, NULL);
	return r == CUDA_SUCCESS ? 0 : cu_err(err, r, "cuCheckpointProcessUnlock", pid);
}
