/* fakecuda_core: driver initialisation, the per-call gate the checkpoint lock closes, fault
 * injection, devices, contexts and error strings of the stand-in libcuda.so.1. */
#include "fakecuda.h"

#include <cudaTypedefs.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FAKE_DRIVER_VERSION 13000
#define FAKE_CTX_STACK 16
#define FAKE_MAX_FAULTS 16

/* ---- initialisation ---- */

static pthread_once_t fake_init_once = PTHREAD_ONCE_INIT;
static CUresult fake_init_rc = CUDA_ERROR_NOT_INITIALIZED;
static atomic_bool fake_ready;
static int fake_ndevices = 1;
static size_t fake_total_bytes = (size_t)4096 << 20;
static bool fake_populate_on;

static long fake_env_long(const char *name, long dflt, long min, long max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (s == NULL || *s == '\0')
		return dflt;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max) {
		fprintf(stderr, "fakecuda: ignoring %s=%s\n", name, s);
		return dflt;
	}
	return v;
}

static void fake_do_init(void)
{
	fake_ndevices = (int)fake_env_long("FAKECUDA_DEVICES", 1, 0, FAKE_MAX_DEVICES);
	fake_total_bytes = (size_t)fake_env_long("FAKECUDA_MEM_MIB", 4096, 1, 1L << 30) << 20;
	fake_populate_on = fake_env_long("FAKECUDA_POPULATE", 0, 0, 1) == 1;
	fake_init_rc = fake_ndevices == 0 ? CUDA_ERROR_NO_DEVICE : fake_service_start();
	if (fake_init_rc == CUDA_SUCCESS)
		atomic_store(&fake_ready, true);
}

bool fake_initialized(void)
{
	return atomic_load_explicit(&fake_ready, memory_order_acquire);
}

FAKE_EXPORT CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&fake_init_once, fake_do_init);
	if (fake_init_rc != CUDA_SUCCESS)
		return fake_init_rc;
	return fake_fault_take("cuInit");
}

FAKE_EXPORT CUresult cuDriverGetVersion(int *version)
{
	if (version == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*version = FAKE_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

/* ---- the device lock ---- */

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;

void fake_lock(void)
{
	pthread_mutex_lock(&fake_mu);
}

void fake_unlock(void)
{
	pthread_mutex_unlock(&fake_mu);
}

/* ---- the gate: calls block while the process is locked by the checkpoint API ---- */

static pthread_mutex_t fake_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_gate_opened = PTHREAD_COND_INITIALIZER;
static pthread_cond_t fake_gate_idle = PTHREAD_COND_INITIALIZER;
static bool fake_gate_closed;
static unsigned int fake_inflight; /* calls between fake_enter and fake_leave */

CUresult fake_enter(const char *base)
{
	CUresult rc;

	if (!fake_initialized())
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&fake_gate_mu);
	while (fake_gate_closed)
		pthread_cond_wait(&fake_gate_opened, &fake_gate_mu);
	fake_inflight++;
	pthread_mutex_unlock(&fake_gate_mu);
	rc = fake_fault_take(base);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	return CUDA_SUCCESS;
}

CUresult fake_leave(CUresult rc)
{
	pthread_mutex_lock(&fake_gate_mu);
	if (--fake_inflight == 0)
		pthread_cond_broadcast(&fake_gate_idle);
	pthread_mutex_unlock(&fake_gate_mu);
	return rc;
}

CUresult fake_gate_close(unsigned int timeout_ms)
{
	struct timespec deadline;
	CUresult rc = CUDA_SUCCESS;

	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += timeout_ms / 1000;
	deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&fake_gate_mu);
	fake_gate_closed = true;
	while (fake_inflight > 0) {
		if (timeout_ms == 0) {
			pthread_cond_wait(&fake_gate_idle, &fake_gate_mu);
		} else if (pthread_cond_timedwait(&fake_gate_idle, &fake_gate_mu, &deadline) ==
				   ETIMEDOUT &&
			   fake_inflight > 0) {
			/* Like the driver: a lock that times out leaves the process running. */
			fake_gate_closed = false;
			pthread_cond_broadcast(&fake_gate_opened);
			rc = CUDA_ERROR_NOT_READY;
			break;
		}
	}
	pthread_mutex_unlock(&fake_gate_mu);
	return rc;
}

void fake_gate_open(void)
{
	pthread_mutex_lock(&fake_gate_mu);
	fake_gate_closed = false;
	pthread_cond_broadcast(&fake_gate_opened);
	pthread_mutex_unlock(&fake_gate_mu);
}

/* ---- fault injection ---- */

struct fake_fault {
	char name[64];     /* base name: no _vN, _ptsz or _ptds suffix */
	unsigned int left; /* calls until it fires, this one included */
	CUresult code;
};

static pthread_mutex_t fake_fault_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_fault fake_faults[FAKE_MAX_FAULTS];
static atomic_int fake_nfaults; /* read without the lock on every call: 0 is the fast path */

/* "cuMemcpyHtoDAsync_v2_ptsz" -> "cuMemcpyHtoDAsync": faults count all variants of a call. */
static void fake_base_name(const char *in, char *out, size_t len)
{
	size_t n;

	snprintf(out, len, "%s", in);
	n = strlen(out);
	if (n > 5 && (strcmp(out + n - 5, "_ptsz") == 0 || strcmp(out + n - 5, "_ptds") == 0))
		out[n -= 5] = '\0';
	while (n > 0 && out[n - 1] >= '0' && out[n - 1] <= '9')
		n--;
	if (n > 2 && n < strlen(out) && out[n - 1] == 'v' && out[n - 2] == '_')
		out[n - 2] = '\0';
}

CUresult fake_fault_take(const char *base)
{
	CUresult rc = CUDA_SUCCESS;
	int i;

	if (atomic_load(&fake_nfaults) == 0)
		return CUDA_SUCCESS;
	pthread_mutex_lock(&fake_fault_mu);
	for (i = 0; i < atomic_load(&fake_nfaults); i++) {
		if (strcmp(fake_faults[i].name, base) != 0 || --fake_faults[i].left > 0)
			continue;
		if (rc == CUDA_SUCCESS)
			rc = fake_faults[i].code;
		fake_faults[i] = fake_faults[atomic_load(&fake_nfaults) - 1];
		atomic_fetch_sub(&fake_nfaults, 1);
		i--;
	}
	pthread_mutex_unlock(&fake_fault_mu);
	return rc;
}

unsigned int fake_fault_disarm(void)
{
	unsigned int n;

	pthread_mutex_lock(&fake_fault_mu);
	n = (unsigned int)atomic_exchange(&fake_nfaults, 0);
	pthread_mutex_unlock(&fake_fault_mu);
	return n;
}

CUresult fake_fault_arm(const char *name, unsigned int nth, int code)
{
	CUresult rc = CUDA_SUCCESS;
	int n;

	if (nth == 0 || code <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&fake_fault_mu);
	n = atomic_load(&fake_nfaults);
	if (n == FAKE_MAX_FAULTS) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		fake_base_name(name, fake_faults[n].name, sizeof(fake_faults[n].name));
		fake_faults[n].left = nth;
		fake_faults[n].code = (CUresult)code;
		atomic_store(&fake_nfaults, n + 1);
	}
	pthread_mutex_unlock(&fake_fault_mu);
	return rc;
}

/* ---- devices ---- */

int fake_device_count(void)
{
	return fake_ndevices;
}

size_t fake_device_total(int dev)
{
	(void)dev;
	return fake_total_bytes;
}

bool fake_device_populate(void)
{
	return fake_populate_on;
}

void fake_device_uuid(int dev, CUuuid *uuid)
{
	static const char prefix[] = "fakecuda-dev-";

	memset(uuid->bytes, 0, sizeof(uuid->bytes));
	memcpy(uuid->bytes, prefix, sizeof(prefix) - 1);
	uuid->bytes[15] = (char)dev;
}

static bool fake_device_valid(CUdevice dev)
{
	return dev >= 0 && dev < fake_ndevices;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	FAKE_ENTER("cuDeviceGet");
	if (device == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_device_valid(ordinal))
		return fake_leave(CUDA_ERROR_INVALID_DEVICE);
	*device = ordinal;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuDeviceGetCount(int *count)
{
	FAKE_ENTER("cuDeviceGetCount");
	if (count == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	*count = fake_ndevices;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	FAKE_ENTER("cuDeviceGetName");
	if (name == NULL || len <= 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_device_valid(dev))
		return fake_leave(CUDA_ERROR_INVALID_DEVICE);
	snprintf(name, (size_t)len, "FakeCUDA H100 (host memory) %d", dev);
	return fake_leave(CUDA_SUCCESS);
}

/* Values of an H100 SXM where a program might care; every other valid attribute reads 0. */
static int fake_attribute(CUdevice_attribute attr)
{
	switch (attr) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
	case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
	case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
	case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 2;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
	case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
	case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
	case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
	case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x1b;
	default: return 0;
	}
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	FAKE_ENTER("cuDeviceGetAttribute");
	if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_device_valid(dev))
		return fake_leave(CUDA_ERROR_INVALID_DEVICE);
	*pi = fake_attribute(attrib);
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	FAKE_ENTER("cuDeviceTotalMem");
	if (bytes == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_device_valid(dev))
		return fake_leave(CUDA_ERROR_INVALID_DEVICE);
	*bytes = fake_device_total(dev);
	return fake_leave(CUDA_SUCCESS);
}

static CUresult fake_get_uuid(CUuuid *uuid, CUdevice dev)
{
	if (uuid == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fake_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fake_device_uuid(dev, uuid);
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	FAKE_ENTER("cuDeviceGetUuid");
	return fake_leave(fake_get_uuid(uuid, dev));
}

static const PFN_cuDeviceGetUuid_v9020 fake_check_uuid_v1 __attribute__((unused)) =
	fake_legacy_device_get_uuid;
CUresult fake_legacy_device_get_uuid(CUuuid *uuid, CUdevice dev)
{
	FAKE_ENTER("cuDeviceGetUuid");
	return fake_leave(fake_get_uuid(uuid, dev));
}

/* ---- contexts ---- */

static struct fake_ctx fake_primary[FAKE_MAX_DEVICES];
static struct fake_ctx *fake_ctxs; /* created with cuCtxCreate, under the device lock */
static _Thread_local struct fake_ctx *fake_ctx_stack[FAKE_CTX_STACK];
static _Thread_local int fake_ctx_depth;

static bool fake_ctx_valid(CUcontext handle)
{
	struct fake_ctx *ctx = (struct fake_ctx *)handle;
	struct fake_ctx *c;
	bool found = false;

	if (ctx >= fake_primary && ctx < fake_primary + fake_ndevices)
		return true;
	fake_lock();
	for (c = fake_ctxs; c != NULL && !found; c = c->next)
		found = c == ctx;
	fake_unlock();
	return found;
}

static size_t fake_ctx_stack_of(const struct fake_ctx *c)
{
	return c->stack_set ? c->stack : FAKE_STACK_DEFAULT;
}

size_t fake_ctx_lmem(int dev)
{
	size_t n = 0;
	struct fake_ctx *c;

	fake_lock();
	if (dev >= 0 && dev < fake_ndevices && fake_primary[dev].refs > 0)
		n += fake_ctx_stack_of(&fake_primary[dev]) * FAKE_LMEM_THREADS;
	for (c = fake_ctxs; c != NULL; c = c->next)
		if (c->dev == dev && !c->destroyed)
			n += fake_ctx_stack_of(c) * FAKE_LMEM_THREADS;
	fake_unlock();
	return n;
}

CUresult fake_ctx_current(struct fake_ctx **ctx)
{
	struct fake_ctx *c = fake_ctx_depth > 0 ? fake_ctx_stack[fake_ctx_depth - 1] : NULL;

	if (c == NULL || c->destroyed)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctx = c;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FAKE_ENTER("cuDevicePrimaryCtxRetain");
	if (pctx == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_device_valid(dev))
		return fake_leave(CUDA_ERROR_INVALID_DEVICE);
	fake_lock();
	fake_primary[dev].dev = dev;
	fake_primary[dev].primary = true;
	fake_primary[dev].refs++;
	fake_unlock();
	*pctx = (CUcontext)&fake_primary[dev];
	return fake_leave(CUDA_SUCCESS);
}

static CUresult fake_primary_release(CUdevice dev)
{
	CUresult rc = CUDA_SUCCESS;

	if (!fake_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	fake_lock();
	if (fake_primary[dev].refs == 0)
		rc = CUDA_ERROR_INVALID_CONTEXT;
	else
		fake_primary[dev].refs--;
	fake_unlock();
	return rc;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	FAKE_ENTER("cuDevicePrimaryCtxRelease");
	return fake_leave(fake_primary_release(dev));
}

static const PFN_cuDevicePrimaryCtxRelease_v11000 fake_check_release_v1 __attribute__((unused)) =
	fake_legacy_primary_ctx_release;
CUresult fake_legacy_primary_ctx_release(CUdevice dev)
{
	FAKE_ENTER("cuDevicePrimaryCtxRelease");
	return fake_leave(fake_primary_release(dev));
}

static CUresult fake_ctx_push(struct fake_ctx *ctx)
{
	if (fake_ctx_depth == FAKE_CTX_STACK)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fake_ctx_stack[fake_ctx_depth++] = ctx;
	return CUDA_SUCCESS;
}

static CUresult fake_ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	struct fake_ctx *ctx;
	CUresult rc;

	if (pctx == NULL || flags > 0xff)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fake_device_valid(dev))
		return CUDA_ERROR_INVALID_DEVICE;
	ctx = calloc(1, sizeof(*ctx));
	if (ctx == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	ctx->dev = dev;
	ctx->flags = flags;
	rc = fake_ctx_push(ctx);
	if (rc != CUDA_SUCCESS) {
		free(ctx);
		return rc;
	}
	fake_lock();
	ctx->next = fake_ctxs;
	fake_ctxs = ctx;
	fake_unlock();
	*pctx = (CUcontext)ctx;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
				    CUdevice dev)
{
	FAKE_ENTER("cuCtxCreate");
	/* Execution affinity and CIG parameters do not change anything here. */
	(void)params;
	return fake_leave(fake_ctx_create(pctx, flags, dev));
}

static const PFN_cuCtxCreate_v3020 fake_check_ctx_v2 __attribute__((unused)) =
	fake_legacy_ctx_create_v2;
CUresult fake_legacy_ctx_create_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FAKE_ENTER("cuCtxCreate");
	return fake_leave(fake_ctx_create(pctx, flags, dev));
}

static const PFN_cuCtxCreate_v11040 fake_check_ctx_v3 __attribute__((unused)) =
	fake_legacy_ctx_create_v3;
CUresult fake_legacy_ctx_create_v3(CUcontext *pctx, CUexecAffinityParam *params, int nparams,
				   unsigned int flags, CUdevice dev)
{
	FAKE_ENTER("cuCtxCreate");
	return fake_leave(fake_ctx_create(pctx, flags, dev));
}

FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext handle)
{
	struct fake_ctx *ctx = (struct fake_ctx *)handle;
	struct fake_ctx **pp;
	int i, j;

	FAKE_ENTER("cuCtxDestroy");
	if (ctx == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (!fake_ctx_valid(handle) || ctx->primary)
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	fake_lock();
	for (pp = &fake_ctxs; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == ctx) {
			*pp = ctx->next;
			break;
		}
	}
	/* The struct is never freed: another thread may still have it current, and must see
	 * CUDA_ERROR_INVALID_CONTEXT rather than read freed memory. */
	ctx->destroyed = true;
	fake_unlock();
	fake_mem_free_ctx(ctx);
	for (i = j = 0; i < fake_ctx_depth; i++)
		if (fake_ctx_stack[i] != ctx)
			fake_ctx_stack[j++] = fake_ctx_stack[i];
	fake_ctx_depth = j;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
	FAKE_ENTER("cuCtxSetCurrent");
	if (ctx != NULL && !fake_ctx_valid(ctx))
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	if (fake_ctx_depth == 0) {
		if (ctx != NULL)
			fake_ctx_stack[fake_ctx_depth++] = (struct fake_ctx *)ctx;
	} else {
		fake_ctx_stack[fake_ctx_depth - 1] = (struct fake_ctx *)ctx;
	}
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	FAKE_ENTER("cuCtxGetCurrent");
	if (pctx == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	*pctx = fake_ctx_depth > 0 ? (CUcontext)fake_ctx_stack[fake_ctx_depth - 1] : NULL;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	FAKE_ENTER("cuCtxPushCurrent");
	if (ctx == NULL || !fake_ctx_valid(ctx))
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	return fake_leave(fake_ctx_push((struct fake_ctx *)ctx));
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	CUcontext top;

	FAKE_ENTER("cuCtxPopCurrent");
	if (fake_ctx_depth == 0)
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	top = (CUcontext)fake_ctx_stack[--fake_ctx_depth];
	if (pctx != NULL)
		*pctx = top;
	return fake_leave(CUDA_SUCCESS);
}

/* ctx NULL: the current context; otherwise a valid handle. */
static CUresult fake_ctx_resolve(CUcontext handle, struct fake_ctx **ctx)
{
	if (handle == NULL)
		return fake_ctx_current(ctx);
	if (!fake_ctx_valid(handle) || ((struct fake_ctx *)handle)->destroyed)
		return CUDA_ERROR_INVALID_CONTEXT;
	*ctx = (struct fake_ctx *)handle;
	return CUDA_SUCCESS;
}

static CUresult fake_ctx_device(CUdevice *device, CUcontext handle)
{
	struct fake_ctx *ctx;
	CUresult rc;

	if (device == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_ctx_resolve(handle, &ctx);
	if (rc == CUDA_SUCCESS)
		*device = ctx->dev;
	return rc;
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
	FAKE_ENTER("cuCtxGetDevice");
	if (device == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_ctx_device(device, NULL));
}

FAKE_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
	FAKE_ENTER("cuCtxGetDevice");
	return fake_leave(fake_ctx_device(device, ctx));
}

/* Only the stack limit is kept (the shim lowers it while suspended); the others read 0. */
FAKE_EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit)
{
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuCtxGetLimit");
	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	if (value == NULL || limit < CU_LIMIT_STACK_SIZE || limit >= CU_LIMIT_MAX)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	*value = limit == CU_LIMIT_STACK_SIZE ? fake_ctx_stack_of(ctx) : 0;
	fake_unlock();
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuCtxSetLimit");
	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	if (limit != CU_LIMIT_STACK_SIZE)
		return fake_leave(limit < CU_LIMIT_MAX ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
	if (value > ((size_t)1 << 20))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	ctx->stack = value;
	ctx->stack_set = true;
	fake_unlock();
	return fake_leave(CUDA_SUCCESS);
}

/* Work runs at submission; only held streams (fakecuda_test.h) have work to wait for. */
static CUresult fake_ctx_sync(CUresult rc)
{
	if (rc == CUDA_SUCCESS) {
		fake_exec_release_all();
		fake_pool_on_sync();
	}
	return rc;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void)
{
	struct fake_ctx *ctx;

	FAKE_ENTER("cuCtxSynchronize");
	return fake_leave(fake_ctx_sync(fake_ctx_current(&ctx)));
}

FAKE_EXPORT CUresult cuCtxSynchronize_v2(CUcontext handle)
{
	struct fake_ctx *ctx;

	FAKE_ENTER("cuCtxSynchronize");
	return fake_leave(fake_ctx_sync(fake_ctx_resolve(handle, &ctx)));
}

/* ---- error strings ---- */

#define FAKE_ERRORS(X) \
	X(CUDA_SUCCESS) \
	X(CUDA_ERROR_INVALID_VALUE) \
	X(CUDA_ERROR_OUT_OF_MEMORY) \
	X(CUDA_ERROR_NOT_INITIALIZED) \
	X(CUDA_ERROR_DEINITIALIZED) \
	X(CUDA_ERROR_PROFILER_DISABLED) \
	X(CUDA_ERROR_PROFILER_NOT_INITIALIZED) \
	X(CUDA_ERROR_PROFILER_ALREADY_STARTED) \
	X(CUDA_ERROR_PROFILER_ALREADY_STOPPED) \
	X(CUDA_ERROR_STUB_LIBRARY) \
	X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER) \
	X(CUDA_ERROR_DEVICE_UNAVAILABLE) \
	X(CUDA_ERROR_NO_DEVICE) \
	X(CUDA_ERROR_INVALID_DEVICE) \
	X(CUDA_ERROR_DEVICE_NOT_LICENSED) \
	X(CUDA_ERROR_INVALID_IMAGE) \
	X(CUDA_ERROR_INVALID_CONTEXT) \
	X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT) \
	X(CUDA_ERROR_MAP_FAILED) \
	X(CUDA_ERROR_UNMAP_FAILED) \
	X(CUDA_ERROR_ARRAY_IS_MAPPED) \
	X(CUDA_ERROR_ALREADY_MAPPED) \
	X(CUDA_ERROR_NO_BINARY_FOR_GPU) \
	X(CUDA_ERROR_ALREADY_ACQUIRED) \
	X(CUDA_ERROR_NOT_MAPPED) \
	X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY) \
	X(CUDA_ERROR_NOT_MAPPED_AS_POINTER) \
	X(CUDA_ERROR_ECC_UNCORRECTABLE) \
	X(CUDA_ERROR_UNSUPPORTED_LIMIT) \
	X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE) \
	X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) \
	X(CUDA_ERROR_INVALID_PTX) \
	X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT) \
	X(CUDA_ERROR_NVLINK_UNCORRECTABLE) \
	X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND) \
	X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION) \
	X(CUDA_ERROR_JIT_COMPILATION_DISABLED) \
	X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY) \
	X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC) \
	X(CUDA_ERROR_CONTAINED) \
	X(CUDA_ERROR_INVALID_SOURCE) \
	X(CUDA_ERROR_FILE_NOT_FOUND) \
	X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND) \
	X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED) \
	X(CUDA_ERROR_OPERATING_SYSTEM) \
	X(CUDA_ERROR_INVALID_HANDLE) \
	X(CUDA_ERROR_ILLEGAL_STATE) \
	X(CUDA_ERROR_LOSSY_QUERY) \
	X(CUDA_ERROR_NOT_FOUND) \
	X(CUDA_ERROR_NOT_READY) \
	X(CUDA_ERROR_ILLEGAL_ADDRESS) \
	X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES) \
	X(CUDA_ERROR_LAUNCH_TIMEOUT) \
	X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING) \
	X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) \
	X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED) \
	X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE) \
	X(CUDA_ERROR_CONTEXT_IS_DESTROYED) \
	X(CUDA_ERROR_ASSERT) \
	X(CUDA_ERROR_TOO_MANY_PEERS) \
	X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) \
	X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) \
	X(CUDA_ERROR_HARDWARE_STACK_ERROR) \
	X(CUDA_ERROR_ILLEGAL_INSTRUCTION) \
	X(CUDA_ERROR_MISALIGNED_ADDRESS) \
	X(CUDA_ERROR_INVALID_ADDRESS_SPACE) \
	X(CUDA_ERROR_INVALID_PC) \
	X(CUDA_ERROR_LAUNCH_FAILED) \
	X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) \
	X(CUDA_ERROR_TENSOR_MEMORY_LEAK) \
	X(CUDA_ERROR_NOT_PERMITTED) \
	X(CUDA_ERROR_NOT_SUPPORTED) \
	X(CUDA_ERROR_SYSTEM_NOT_READY) \
	X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH) \
	X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE) \
	X(CUDA_ERROR_MPS_CONNECTION_FAILED) \
	X(CUDA_ERROR_MPS_RPC_FAILURE) \
	X(CUDA_ERROR_MPS_SERVER_NOT_READY) \
	X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED) \
	X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED) \
	X(CUDA_ERROR_MPS_CLIENT_TERMINATED) \
	X(CUDA_ERROR_CDP_NOT_SUPPORTED) \
	X(CUDA_ERROR_CDP_VERSION_MISMATCH) \
	X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) \
	X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) \
	X(CUDA_ERROR_STREAM_CAPTURE_MERGE) \
	X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED) \
	X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED) \
	X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION) \
	X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) \
	X(CUDA_ERROR_CAPTURED_EVENT) \
	X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) \
	X(CUDA_ERROR_TIMEOUT) \
	X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) \
	X(CUDA_ERROR_EXTERNAL_DEVICE) \
	X(CUDA_ERROR_INVALID_CLUSTER_SIZE) \
	X(CUDA_ERROR_FUNCTION_NOT_LOADED) \
	X(CUDA_ERROR_INVALID_RESOURCE_TYPE) \
	X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) \
	X(CUDA_ERROR_KEY_ROTATION) \
	X(CUDA_ERROR_UNKNOWN)

struct fake_error {
	CUresult code;
	const char *name;
};

#define FAKE_ERROR_ROW(e) {e, #e},
static const struct fake_error fake_errors[] = {FAKE_ERRORS(FAKE_ERROR_ROW)};

/* The driver's wording for the codes a test is likely to print; the rest use the name. */
static const struct fake_error fake_error_text[] = {
	{CUDA_SUCCESS, "no error"},
	{CUDA_ERROR_INVALID_VALUE, "invalid argument"},
	{CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
	{CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
	{CUDA_ERROR_DEINITIALIZED, "driver shutting down"},
	{CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"},
	{CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"},
	{CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"},
	{CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
	{CUDA_ERROR_FILE_NOT_FOUND, "file not found"},
	{CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"},
	{CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
	{CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state"},
	{CUDA_ERROR_NOT_FOUND, "named symbol not found"},
	{CUDA_ERROR_NOT_READY, "device not ready"},
	{CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"},
	{CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"},
	{CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
	 "part or all of the requested memory range is already mapped"},
	{CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
	 "pointer does not correspond to a registered memory region"},
	{CUDA_ERROR_NOT_PERMITTED, "operation not permitted"},
	{CUDA_ERROR_NOT_SUPPORTED, "operation not supported"},
	{CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"},
	{CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"},
	{CUDA_ERROR_TIMEOUT, "timeout occurred"},
	{CUDA_ERROR_UNKNOWN, "unknown error"},
};

static const char *fake_error_lookup(const struct fake_error *table, size_t n, CUresult code)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (table[i].code == code)
			return table[i].name;
	return NULL;
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char **pstr)
{
	if (pstr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*pstr = fake_error_lookup(fake_errors, sizeof(fake_errors) / sizeof(fake_errors[0]), error);
	return *pstr != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char **pstr)
{
	const char *name;

	if (pstr == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	name = fake_error_lookup(fake_errors, sizeof(fake_errors) / sizeof(fake_errors[0]), error);
	*pstr = fake_error_lookup(fake_error_text,
				  sizeof(fake_error_text) / sizeof(fake_error_text[0]), error);
	if (*pstr == NULL)
		*pstr = name;
	return *pstr != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
