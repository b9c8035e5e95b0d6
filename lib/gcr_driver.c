/* gcr_driver: thin, type-checked calls into the dlopen'd driver. Prototypes come
 * from cuda.h through __typeof__, so a changed signature fails the build. */
#include "gcr_driver.h"
#include "gcr_uuid.h"

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
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

/* "GPU-" and 32 hex digits, dashes anywhere between them ignored, into the 16 bytes of a CUuuid. */
int gcr_driver_parse_pair(const char *s, struct gcr_gpu_pair *p, struct gcr_err *err)
{
	const char *eq = s != NULL ? strchr(s, '=') : NULL;
	unsigned char b[16];
	if (eq == NULL || (size_t)(eq - s) >= sizeof(p->from) || strlen(eq + 1) >= sizeof(p->to))
		return gcr_err_set(err, -EINVAL, "GPU pair '%s': expected FROM=TO, two GPU UUIDs", s ? s : "");
	memcpy(p->from, s, (size_t)(eq - s));
	p->from[eq - s] = '\0';
	snprintf(p->to, sizeof(p->to), "%s", eq + 1);
	if (gcr_uuid_parse(p->from, b) < 0 || gcr_uuid_parse(p->to, b) < 0)
		return gcr_err_set(err, -EINVAL, "GPU pair '%s': each side must be a GPU UUID (GPU-xxxxxxxx-...)", s);
	return 0;
}

int gcr_driver_restore(pid_t pid, const struct gcr_gpu_pair *pairs, size_t npairs, struct gcr_err *err)
{
	int rc = gcr_driver_open(err);
	if (rc < 0)
		return rc;
	if (npairs > GCR_DRIVER_MAX_PAIRS)
		return gcr_err_set(err, -EINVAL, "%zu GPU pairs: at most %d", npairs, GCR_DRIVER_MAX_PAIRS);
	CUcheckpointGpuPair gp[GCR_DRIVER_MAX_PAIRS];
	CUcheckpointRestoreArgs args;
	memset(&args, 0, sizeof(args)); /* the reserved fields must be zero */
	for (size_t i = 0; i < npairs; i++)
		if (gcr_uuid_parse(pairs[i].from, (unsigned char *)gp[i].oldUuid.bytes) < 0 ||
		    gcr_uuid_parse(pairs[i].to, (unsigned char *)gp[i].newUuid.bytes) < 0)
			return gcr_err_set(err, -EINVAL, "GPU pair %s=%s: not GPU UUIDs", pairs[i].from, pairs[i].to);
	args.gpuPairs = gp;
	args.gpuPairsCount = (unsigned int)npairs;
	CUresult r = drv.restore(pid, npairs > 0 ? &args : NULL);
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
