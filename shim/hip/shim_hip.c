/* shim_hip: struct shim_gpu_ops on AMD's HIP runtime (libamdhip64, opened at run time): the
 * virtual-memory, stream, event, copy and pinning calls the data path makes for its own work. */
#include "shim_gpu.h"

#include <errno.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>

#include "shim_hip_hook.h"
#include "shim_real.h"

/* Runtime functions the shim calls for its own work but does not interpose. */
#define SHIM_HIP_INTERNAL_LIST                                                                  \
	X(hipGetDeviceCount) X(hipSetDevice) X(hipGetDevice) X(hipDeviceCanAccessPeer)           \
	X(hipMemGetAllocationGranularity) X(hipStreamCreateWithFlags) X(hipStreamDestroy)        \
	X(hipHostRegister) X(hipHostUnregister) X(hipMemGetInfo) X(hipGetErrorName)              \
	X(hipRuntimeGetVersion) X(hipEventCreateWithFlags)

static struct {
#define X(f) __typeof__(&f) f;
	SHIM_HIP_INTERNAL_LIST
#undef X
	int prop_v6; /* the runtime lays hipMemAllocationProp out as ROCm 6 does */
} rt;
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
static int rt_rc = -ENODEV;

/* ROCm 6 reordered hipMemAllocationProp to CUDA's layout; Debian's 5.2 header has the old
 * one. This is the ROCm 6 layout, used when the runtime reports version 6 or newer. */
struct shim_hip_prop_v6 {
	hipMemAllocationType type;
	hipMemAllocationHandleType requestedHandleType;
	hipMemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
	} allocFlags;
};

static void rt_init(void)
{
	void *h = shim_real_handle(SHIM_HIP);
	if (h == NULL && shim_real_load(SHIM_HIP, NULL) == 0)
		h = shim_real_handle(SHIM_HIP);
	if (h == NULL)
		return;
#define X(f) rt.f = (__typeof__(&f))shim_real_dlsym(h, #f);
	SHIM_HIP_INTERNAL_LIST
#undef X
	int v = 0;
	/* HIP_VERSION: major * 10000000 + minor * 100000 + patch. */
	if (rt.hipRuntimeGetVersion != NULL && rt.hipRuntimeGetVersion(&v) == hipSuccess)
		rt.prop_v6 = v >= 60000000;
	rt_rc = 0;
}

/* The table records hipMemAccessDesc as struct shim_gpu_access (shim_gpu.h): same values. */
_Static_assert(hipMemLocationTypeDevice == SHIM_GPU_LOC_DEVICE, "device location");
_Static_assert(hipMemAccessFlagsProtRead == SHIM_GPU_PROT_READ, "read");
_Static_assert(hipMemAccessFlagsProtReadWrite == SHIM_GPU_PROT_READWRITE, "read-write");
_Static_assert(hipErrorInvalidValue == SHIM_GPU_INVALID_VALUE, "invalid value");
_Static_assert(hipErrorOutOfMemory == SHIM_GPU_OUT_OF_MEMORY, "out of memory");
_Static_assert(hipErrorNotSupported == SHIM_GPU_NOT_SUPPORTED, "not supported");

/* The runtime's code of this thread's last failed call (shim_hip_ops.last_code). */
static __thread int last_code __attribute__((tls_model("initial-exec")));

static int hip_last_code(void)
{
	return last_code;
}

static const char *hip_error_string(int code)
{
	const char *s = rt.hipGetErrorName != NULL ? rt.hipGetErrorName((hipError_t)code) : NULL;
	return s != NULL ? s : "HIP error";
}

/* The result of one runtime call as 0 / -errno with a message. */
static int hip_rc(hipError_t r, const char *what, struct gcr_err *err)
{
	if (r == hipSuccess)
		return 0;
	last_code = (int)r;
	int code = r == hipErrorOutOfMemory ? -ENOMEM : r == hipErrorNotSupported ? -ENOTSUP : -EIO;
	return gcr_err_set(err, code, "%s failed: %s (%d)", what, hip_error_string(r), (int)r);
}

static int hip_load(struct gcr_err *err)
{
	pthread_once(&rt_once, rt_init);
	if (rt_rc < 0)
		return gcr_err_set(err, rt_rc, "the process has no HIP runtime (libamdhip64)");
	return 0;
}

/* Resolves a function of the runtime or fails with a message (never a NULL call). */
#define NEED(fn, what)                                                                    \
	do {                                                                              \
		int need_rc_ = hip_load(err);                                             \
		if (need_rc_ < 0)                                                         \
			return need_rc_;                                                  \
		if ((fn) == NULL) {                                                       \
			last_code = hipErrorNotFound;                                     \
			return gcr_err_set(err, -ENOTSUP, "the HIP runtime lacks %s", what); \
		}                                                                         \
	} while (0)

#define PTR(va) ((void *)(uintptr_t)(va))
#define HANDLE(h) ((hipMemGenericAllocationHandle_t)(uintptr_t)(h))

static int hip_device_count(int *count, struct gcr_err *err)
{
	NEED(rt.hipGetDeviceCount, "hipGetDeviceCount");
	return hip_rc(rt.hipGetDeviceCount(count), "hipGetDeviceCount", err);
}

/* The allocation properties of pinned device memory on device, in the runtime's layout. */
static void device_prop(int device, hipMemAllocationProp *p5, struct shim_hip_prop_v6 *p6)
{
	memset(p5, 0, sizeof(*p5));
	memset(p6, 0, sizeof(*p6));
	p5->type = p6->type = hipMemAllocationTypePinned;
	p5->location.type = p6->location.type = hipMemLocationTypeDevice;
	p5->location.id = p6->location.id = device;
}

static int hip_granularity(int device, size_t *bytes, struct gcr_err *err)
{
	NEED(rt.hipMemGetAllocationGranularity, "hipMemGetAllocationGranularity");
	hipMemAllocationProp p5;
	struct shim_hip_prop_v6 p6;
	device_prop(device, &p5, &p6);
	const hipMemAllocationProp *p = rt.prop_v6 ? (const hipMemAllocationProp *)(const void *)&p6 : &p5;
	return hip_rc(rt.hipMemGetAllocationGranularity(bytes, p, hipMemAllocationGranularityMinimum),
		      "hipMemGetAllocationGranularity", err);
}

static int hip_can_access_peer(int device, int peer, int *can, struct gcr_err *err)
{
	NEED(rt.hipDeviceCanAccessPeer, "hipDeviceCanAccessPeer");
	return hip_rc(rt.hipDeviceCanAccessPeer(can, peer, device), "hipDeviceCanAccessPeer", err);
}

static int hip_reserve(shim_gpu_va *va, size_t size, size_t align, struct gcr_err *err)
{
	__typeof__(&hipMemAddressReserve) fn = SHIM_HIP_REAL(hipMemAddressReserve, 0);
	NEED(fn, "hipMemAddressReserve");
	void *p = NULL;
	int rc = hip_rc(fn(&p, size, align, NULL, 0), "hipMemAddressReserve", err);
	if (rc == 0)
		*va = (shim_gpu_va)(uintptr_t)p;
	return rc;
}

static int hip_free_va(shim_gpu_va va, size_t size, struct gcr_err *err)
{
	__typeof__(&hipMemAddressFree) fn = SHIM_HIP_REAL(hipMemAddressFree, 0);
	NEED(fn, "hipMemAddressFree");
	return hip_rc(fn(PTR(va), size), "hipMemAddressFree", err);
}

/* prop is ignored: HIP handles are re-created as pinned memory on their device (the
 * application's other properties are not recorded: docs/amd.md). */
static int hip_create(shim_gpu_handle *h, size_t size, int device, const void *prop, struct gcr_err *err)
{
	(void)prop;
	__typeof__(&hipMemCreate) fn = SHIM_HIP_REAL(hipMemCreate, 0);
	NEED(fn, "hipMemCreate");
	hipMemAllocationProp p5;
	struct shim_hip_prop_v6 p6;
	device_prop(device, &p5, &p6);
	const hipMemAllocationProp *p = rt.prop_v6 ? (const hipMemAllocationProp *)(const void *)&p6 : &p5;
	hipMemGenericAllocationHandle_t out = NULL;
	int rc = hip_rc(fn(&out, size, p, 0), "hipMemCreate", err);
	if (rc == 0)
		*h = (shim_gpu_handle)(uintptr_t)out;
	return rc;
}

static int hip_release(shim_gpu_handle h, struct gcr_err *err)
{
	__typeof__(&hipMemRelease) fn = SHIM_HIP_REAL(hipMemRelease, 0);
	NEED(fn, "hipMemRelease");
	return hip_rc(fn(HANDLE(h)), "hipMemRelease", err);
}

static int hip_map(shim_gpu_va va, size_t size, size_t offset, shim_gpu_handle h, struct gcr_err *err)
{
	__typeof__(&hipMemMap) fn = SHIM_HIP_REAL(hipMemMap, 0);
	NEED(fn, "hipMemMap");
	return hip_rc(fn(PTR(va), size, offset, HANDLE(h), 0), "hipMemMap", err);
}

static int hip_unmap(shim_gpu_va va, size_t size, struct gcr_err *err)
{
	__typeof__(&hipMemUnmap) fn = SHIM_HIP_REAL(hipMemUnmap, 0);
	NEED(fn, "hipMemUnmap");
	return hip_rc(fn(PTR(va), size), "hipMemUnmap", err);
}

/* At most this many devices in one access list (as shim_alloc's SHIM_MAX_ACCESS). */
#define HIP_MAX_ACCESS 8

static int hip_set_access(shim_gpu_va va, size_t size, const struct shim_gpu_access *acc, size_t n,
			  struct gcr_err *err)
{
	__typeof__(&hipMemSetAccess) fn = SHIM_HIP_REAL(hipMemSetAccess, 0);
	NEED(fn, "hipMemSetAccess");
	if (n == 0 || n > HIP_MAX_ACCESS)
		return gcr_err_set(err, -EINVAL, "hipMemSetAccess: %zu access entries (1..%d)", n, HIP_MAX_ACCESS);
	hipMemAccessDesc d[HIP_MAX_ACCESS];
	memset(d, 0, sizeof(d));
	for (size_t i = 0; i < n; i++) {
		d[i].location.type = (hipMemLocationType)acc[i].type;
		d[i].location.id = acc[i].id;
		d[i].flags = (hipMemAccessFlags)acc[i].flags;
	}
	return hip_rc(fn(PTR(va), size, d, n), "hipMemSetAccess", err);
}

static int hip_stream_create(int device, shim_gpu_stream *s, struct gcr_err *err)
{
	NEED(rt.hipStreamCreateWithFlags, "hipStreamCreateWithFlags");
	NEED(rt.hipSetDevice, "hipSetDevice");
	int rc = hip_rc(rt.hipSetDevice(device), "hipSetDevice", err);
	hipStream_t st = NULL;
	if (rc == 0)
		rc = hip_rc(rt.hipStreamCreateWithFlags(&st, hipStreamNonBlocking), "hipStreamCreateWithFlags", err);
	if (rc == 0)
		*s = st;
	return rc;
}

static int hip_stream_destroy(shim_gpu_stream s, struct gcr_err *err)
{
	NEED(rt.hipStreamDestroy, "hipStreamDestroy");
	return hip_rc(rt.hipStreamDestroy(s), "hipStreamDestroy", err);
}

static int hip_stream_sync(shim_gpu_stream s, struct gcr_err *err)
{
	__typeof__(&hipStreamSynchronize) fn = SHIM_HIP_REAL(hipStreamSynchronize, 0);
	NEED(fn, "hipStreamSynchronize");
	return hip_rc(fn(s), "hipStreamSynchronize", err);
}

static int hip_device_sync(int device, struct gcr_err *err)
{
	__typeof__(&hipDeviceSynchronize) fn = SHIM_HIP_REAL(hipDeviceSynchronize, 0);
	NEED(fn, "hipDeviceSynchronize");
	NEED(rt.hipSetDevice, "hipSetDevice");
	int rc = hip_rc(rt.hipSetDevice(device), "hipSetDevice", err);
	return rc < 0 ? rc : hip_rc(fn(), "hipDeviceSynchronize", err);
}

static int hip_copy_dtoh_async(void *dst, shim_gpu_va src, size_t n, shim_gpu_stream s, struct gcr_err *err)
{
	__typeof__(&hipMemcpyDtoHAsync) fn = SHIM_HIP_REAL(hipMemcpyDtoHAsync, 0);
	NEED(fn, "hipMemcpyDtoHAsync");
	return hip_rc(fn(dst, PTR(src), n, s), "hipMemcpyDtoHAsync", err);
}

static int hip_copy_htod_async(shim_gpu_va dst, const void *src, size_t n, shim_gpu_stream s,
			       struct gcr_err *err)
{
	__typeof__(&hipMemcpyHtoDAsync) fn = SHIM_HIP_REAL(hipMemcpyHtoDAsync, 0);
	NEED(fn, "hipMemcpyHtoDAsync");
	/* HIP's prototype takes a non-const host pointer; it only reads it. */
	return hip_rc(fn(PTR(dst), (void *)(uintptr_t)src, n, s), "hipMemcpyHtoDAsync", err);
}

static int hip_host_register(void *p, size_t n, struct gcr_err *err)
{
	NEED(rt.hipHostRegister, "hipHostRegister");
	return hip_rc(rt.hipHostRegister(p, n, hipHostRegisterDefault), "hipHostRegister", err);
}

static int hip_host_unregister(void *p, struct gcr_err *err)
{
	NEED(rt.hipHostUnregister, "hipHostUnregister");
	return hip_rc(rt.hipHostUnregister(p), "hipHostUnregister", err);
}

static int hip_mem_info(int device, size_t *free_bytes, size_t *total_bytes, struct gcr_err *err)
{
	NEED(rt.hipMemGetInfo, "hipMemGetInfo");
	NEED(rt.hipSetDevice, "hipSetDevice");
	int rc = hip_rc(rt.hipSetDevice(device), "hipSetDevice", err);
	return rc < 0 ? rc : hip_rc(rt.hipMemGetInfo(free_bytes, total_bytes), "hipMemGetInfo", err);
}

static int hip_current_device(int *device, void **ctx, struct gcr_err *err)
{
	NEED(rt.hipGetDevice, "hipGetDevice");
	*ctx = NULL;
	return hip_rc(rt.hipGetDevice(device), "hipGetDevice", err);
}

static int hip_set_device(int device, struct gcr_err *err)
{
	NEED(rt.hipSetDevice, "hipSetDevice");
	return hip_rc(rt.hipSetDevice(device), "hipSetDevice", err);
}

/* HIP has no contexts the shim selects: devices are chosen with set_device. */
static int hip_ctx_get(void **ctx, struct gcr_err *err)
{
	(void)err;
	*ctx = NULL;
	return 0;
}

static int hip_ctx_set(void *ctx, struct gcr_err *err)
{
	(void)ctx;
	(void)err;
	return 0;
}

static int hip_event_create(shim_gpu_event *e, struct gcr_err *err)
{
	NEED(rt.hipEventCreateWithFlags, "hipEventCreateWithFlags");
	hipEvent_t ev = NULL;
	int rc = hip_rc(rt.hipEventCreateWithFlags(&ev, hipEventDisableTiming), "hipEventCreateWithFlags", err);
	if (rc == 0)
		*e = ev;
	return rc;
}

static int hip_event_record(shim_gpu_event e, shim_gpu_stream s, struct gcr_err *err)
{
	__typeof__(&hipEventRecord) fn = SHIM_HIP_REAL(hipEventRecord, 0);
	NEED(fn, "hipEventRecord");
	return hip_rc(fn(e, s), "hipEventRecord", err);
}

static int hip_event_sync(shim_gpu_event e, struct gcr_err *err)
{
	__typeof__(&hipEventSynchronize) fn = SHIM_HIP_REAL(hipEventSynchronize, 0);
	NEED(fn, "hipEventSynchronize");
	return hip_rc(fn(e), "hipEventSynchronize", err);
}

/* Every device: HIP work is per device, and the table does not know every device a kernel
 * ran on. */
static int hip_sync_all(struct gcr_err *err)
{
	int n = 0;
	int rc = hip_device_count(&n, err);
	for (int d = 0; d < n && rc == 0; d++)
		rc = hip_device_sync(d, err);
	if (rc < 0)
		gcr_err_wrap(err, "waiting for the application's work (application work failed?)");
	return rc;
}

static int hip_memset_async(shim_gpu_va dst, size_t n, shim_gpu_stream s, struct gcr_err *err)
{
	__typeof__(&hipMemsetD8Async) fn = SHIM_HIP_REAL(hipMemsetD8Async, 0);
	NEED(fn, "hipMemsetD8Async");
	return hip_rc(fn(PTR(dst), 0, n, s), "hipMemsetD8Async", err);
}

/* Page-aligned memory, registered: what hipHostMalloc gives, from calls the stand-in has too. */
static int hip_host_alloc(void **p, size_t n, struct gcr_err *err)
{
	void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return gcr_err_set(err, -ENOMEM, "cannot map %zu bytes of host memory", n);
	int rc = hip_host_register(m, n, err);
	if (rc < 0) {
		munmap(m, n);
		return rc;
	}
	*p = m;
	return 0;
}

static void hip_host_free(void *p, size_t n)
{
	struct gcr_err err;
	if (p == NULL)
		return;
	(void)hip_host_unregister(p, &err);
	munmap(p, n);
}

int shim_hip_prop_device(const void *prop)
{
	struct gcr_err err;
	if (prop == NULL || hip_load(&err) < 0)
		return -1;
	const hipMemLocation *loc = rt.prop_v6 ? &((const struct shim_hip_prop_v6 *)prop)->location
					       : &((const hipMemAllocationProp *)prop)->location;
	return loc->type == hipMemLocationTypeDevice ? loc->id : -1;
}

static int hip_present(void)
{
	return shim_real_handle(SHIM_HIP) != NULL;
}

const struct shim_gpu_ops shim_hip_ops = {
	.name = "hip",
	.caps = 0, /* the runtime builds its own properties; no digest kernel (it is PTX) */
	.last_code = hip_last_code, /* bind: NULL, the backend binds on first use (hip_load) */
	.present = hip_present,
	.load = hip_load,
	.device_count = hip_device_count,
	.current_device = hip_current_device,
	.granularity = hip_granularity,
	.can_access_peer = hip_can_access_peer,
	.reserve = hip_reserve,
	.free_va = hip_free_va,
	.create = hip_create,
	.release = hip_release,
	.map = hip_map,
	.unmap = hip_unmap,
	.set_access = hip_set_access,
	.set_device = hip_set_device,
	.ctx_get = hip_ctx_get,
	.ctx_set = hip_ctx_set,
	.stream_create = hip_stream_create,
	.stream_destroy = hip_stream_destroy,
	.stream_sync = hip_stream_sync,
	.event_create = hip_event_create,
	.event_record = hip_event_record,
	.event_sync = hip_event_sync,
	.device_sync = hip_device_sync,
	.sync_all = hip_sync_all,
	.copy_dtoh_async = hip_copy_dtoh_async,
	.copy_htod_async = hip_copy_htod_async,
	.memset_async = hip_memset_async,
	.host_register = hip_host_register,
	.host_unregister = hip_host_unregister,
	.host_alloc = hip_host_alloc,
	.host_free = hip_host_free,
	.mem_info = hip_mem_info,
	.error_string = hip_error_string,
};
