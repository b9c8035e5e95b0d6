/* shim_hip_alloc: HIP allocation wrappers on the shared table (shim_alloc), as the CUDA ones:
 * hipMalloc/hipMallocPitch/hipMemAllocPitch of GCR_VMM_MIN_BYTES or more become VMM buffers
 * (reserve, create, map, access), the application's hipMemCreate handles are virtualised, the
 * rest goes to the runtime and is counted. Each passes the gate. */
#include "shim_hip_alloc.h"

#include <hip/hip_runtime_api.h>
#include <stdatomic.h>
#include <stdint.h>

#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_gate.h"
#include "shim_gpu.h"
#include "shim_hip_hook.h"

static atomic_int used;

int shim_hip_alloc_used(void)
{
	return atomic_load(&used);
}

#define ADDR(p) ((uint64_t)(uintptr_t)(p))
#define PTR(a) ((void *)(uintptr_t)(a))

/* Each wrapper resolves the real function (hipErrorNotFound without one), then enters the gate
 * here, which also notes that the application uses the HIP allocation calls. */
static struct shim_thread *hip_enter(enum shim_hip_hook_id id)
{
	atomic_store_explicit(&used, 1, memory_order_relaxed);
	return shim_gate_enter(SHIM_HOOK_ROW(SHIM_HIP, id), 0);
}

static int convert(size_t bytes)
{
	return shim_cfg.vmm && bytes >= shim_cfg.vmm_min_bytes;
}

/* A converted buffer, or SHIM_GPU_NOT_SUPPORTED when the caller should ask the runtime. */
static hipError_t try_convert(void **ptr, size_t bytes)
{
	uint64_t va = 0;
	if (ptr == NULL || !convert(bytes))
		return hipErrorNotSupported;
	hipError_t r = (hipError_t)shim_alloc_buf_new(&shim_hip_ops, &va, bytes);
	if (r == hipSuccess)
		*ptr = PTR(va);
	return r;
}

SHIM_EXPORT hipError_t hipMalloc(void **ptr, size_t size)
{
	__typeof__(&hipMalloc) real = SHIM_HIP_REAL(hipMalloc, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMalloc);
	hipError_t r = try_convert(ptr, size);
	if (r == hipErrorNotSupported) {
		r = real(ptr, size);
		if (r == hipSuccess && ptr != NULL && *ptr != NULL)
			shim_alloc_note(&shim_hip_ops, ADDR(*ptr), size, SHIM_ALLOC_PLAIN);
	}
	shim_gate_exit(t);
	return r;
}

/* Flags ask for kinds of memory (fine-grained, uncached) the VMM path does not make: left to
 * the runtime. */
SHIM_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t sizeBytes, unsigned int flags)
{
	__typeof__(&hipExtMallocWithFlags) real = SHIM_HIP_REAL(hipExtMallocWithFlags, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipExtMallocWithFlags);
	hipError_t r = real(ptr, sizeBytes, flags);
	if (r == hipSuccess && ptr != NULL && *ptr != NULL)
		shim_alloc_note(&shim_hip_ops, ADDR(*ptr), sizeBytes, SHIM_ALLOC_PLAIN);
	shim_gate_exit(t);
	return r;
}

/* Pitch as cuMemAllocPitch's wrapper picks it; any pitch >= width is valid. */
#define HIP_PITCH_ALIGN 512

static hipError_t pitched(void **ptr, size_t *pitch, size_t width, size_t height)
{
	if (ptr == NULL || pitch == NULL || width == 0 || height == 0)
		return hipErrorNotSupported;
	size_t p = (width + HIP_PITCH_ALIGN - 1) / HIP_PITCH_ALIGN * HIP_PITCH_ALIGN;
	if (height > SIZE_MAX / p)
		return hipErrorNotSupported;
	hipError_t r = try_convert(ptr, p * height);
	if (r == hipSuccess)
		*pitch = p;
	return r;
}

SHIM_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	__typeof__(&hipMallocPitch) real = SHIM_HIP_REAL(hipMallocPitch, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMallocPitch);
	hipError_t r = pitched(ptr, pitch, width, height);
	if (r == hipErrorNotSupported) {
		r = real(ptr, pitch, width, height);
		if (r == hipSuccess && ptr != NULL && *ptr != NULL && pitch != NULL)
			shim_alloc_note(&shim_hip_ops, ADDR(*ptr), (uint64_t)*pitch * height, SHIM_ALLOC_PLAIN);
	}
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMemAllocPitch(hipDeviceptr_t *dptr, size_t *pitch, size_t widthInBytes,
					size_t height, unsigned int elementSizeBytes)
{
	__typeof__(&hipMemAllocPitch) real = SHIM_HIP_REAL(hipMemAllocPitch, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemAllocPitch);
	hipError_t r = elementSizeBytes == 4 || elementSizeBytes == 8 || elementSizeBytes == 16
			       ? pitched(dptr, pitch, widthInBytes, height)
			       : hipErrorNotSupported;
	if (r == hipErrorNotSupported) {
		r = real(dptr, pitch, widthInBytes, height, elementSizeBytes);
		if (r == hipSuccess && dptr != NULL && *dptr != NULL && pitch != NULL)
			shim_alloc_note(&shim_hip_ops, ADDR(*dptr), (uint64_t)*pitch * height, SHIM_ALLOC_PLAIN);
	}
	shim_gate_exit(t);
	return r;
}

/* Managed memory cannot be moved: counted, and suspend refuses while any is held. */
SHIM_EXPORT hipError_t hipMallocManaged(void **dev_ptr, size_t size, unsigned int flags)
{
	__typeof__(&hipMallocManaged) real = SHIM_HIP_REAL(hipMallocManaged, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMallocManaged);
	hipError_t r = real(dev_ptr, size, flags);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		shim_alloc_note(&shim_hip_ops, ADDR(*dev_ptr), size, SHIM_ALLOC_MANAGED);
	shim_gate_exit(t);
	return r;
}

/* Stream-ordered allocations stay in the runtime's pools (its control step moves them);
 * counted so statistics show them. */
SHIM_EXPORT hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream)
{
	__typeof__(&hipMallocAsync) real = SHIM_HIP_REAL(hipMallocAsync, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMallocAsync);
	hipError_t r = real(dev_ptr, size, stream);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		shim_alloc_note(&shim_hip_ops, ADDR(*dev_ptr), size, SHIM_ALLOC_ASYNC);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size, hipMemPool_t mem_pool,
					      hipStream_t stream)
{
	__typeof__(&hipMallocFromPoolAsync) real = SHIM_HIP_REAL(hipMallocFromPoolAsync, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMallocFromPoolAsync);
	hipError_t r = real(dev_ptr, size, mem_pool, stream);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		shim_alloc_note(&shim_hip_ops, ADDR(*dev_ptr), size, SHIM_ALLOC_ASYNC);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipFree(void *ptr)
{
	__typeof__(&hipFree) real = SHIM_HIP_REAL(hipFree, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipFree);
	int ours = 0;
	hipError_t r = (hipError_t)shim_alloc_buf_free(&shim_hip_ops, ADDR(ptr), &ours);
	if (!ours) {
		r = real(ptr);
		if (r == hipSuccess && ptr != NULL)
			shim_alloc_forget(ADDR(ptr));
	}
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream)
{
	__typeof__(&hipFreeAsync) real = SHIM_HIP_REAL(hipFreeAsync, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipFreeAsync);
	hipError_t r = real(dev_ptr, stream);
	if (r == hipSuccess && dev_ptr != NULL)
		shim_alloc_forget(ADDR(dev_ptr));
	shim_gate_exit(t);
	return r;
}

/* ---- the application's own virtual-memory calls ---- */

/* Reservations are address space only: passed through (the range stays reserved across a
 * suspend, as the application made it). */
SHIM_EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
					    unsigned long long flags)
{
	__typeof__(&hipMemAddressReserve) real = SHIM_HIP_REAL(hipMemAddressReserve, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemAddressReserve);
	hipError_t r = real(ptr, size, alignment, addr, flags);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMemAddressFree(void *devPtr, size_t size)
{
	__typeof__(&hipMemAddressFree) real = SHIM_HIP_REAL(hipMemAddressFree, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemAddressFree);
	hipError_t r = real(devPtr, size);
	shim_gate_exit(t);
	return r;
}

/* The application gets a handle value of the table's, so it stays valid when the physical
 * memory behind it is re-created at resume. */
SHIM_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
				    const hipMemAllocationProp *prop, unsigned long long flags)
{
	__typeof__(&hipMemCreate) real = SHIM_HIP_REAL(hipMemCreate, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemCreate);
	hipMemGenericAllocationHandle_t h = NULL;
	int dev = shim_hip_prop_device(prop);
	hipError_t r;
	if (handle == NULL || dev < 0) {
		r = real(handle, size, prop, flags); /* not device memory: the runtime's own */
	} else {
		r = real(&h, size, prop, flags);
		uint64_t app = 0;
		if (r == hipSuccess &&
		    (r = (hipError_t)shim_alloc_handle_new(&shim_hip_ops, ADDR(h), size, dev, NULL, &app)) != hipSuccess)
			SHIM_HIP_REAL(hipMemRelease, 0)(h);
		if (r == hipSuccess)
			*handle = (hipMemGenericAllocationHandle_t)PTR(app);
	}
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
	__typeof__(&hipMemRelease) real = SHIM_HIP_REAL(hipMemRelease, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemRelease);
	int ours = 0;
	hipError_t r = (hipError_t)shim_alloc_handle_release(&shim_hip_ops, ADDR(handle), &ours);
	if (!ours)
		r = real(handle);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
				 unsigned long long flags)
{
	__typeof__(&hipMemMap) real = SHIM_HIP_REAL(hipMemMap, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemMap);
	int ours = 0;
	hipError_t r = (hipError_t)shim_alloc_handle_map(&shim_hip_ops, ADDR(ptr), size, offset, ADDR(handle), &ours);
	if (!ours)
		r = real(ptr, size, offset, handle, flags);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT hipError_t hipMemUnmap(void *ptr, size_t size)
{
	__typeof__(&hipMemUnmap) real = SHIM_HIP_REAL(hipMemUnmap, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemUnmap);
	hipError_t r = real(ptr, size);
	if (r == hipSuccess)
		shim_alloc_unmapped(ADDR(ptr), size);
	shim_gate_exit(t);
	return r;
}

/* Recorded per mapping, to apply the same access at resume. */
SHIM_EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count)
{
	__typeof__(&hipMemSetAccess) real = SHIM_HIP_REAL(hipMemSetAccess, 0);
	if (real == NULL)
		return hipErrorNotFound;
	struct shim_thread *t = hip_enter(SHIM_HIP_HOOK_hipMemSetAccess);
	hipError_t r = real(ptr, size, desc, count);
	if (r == hipSuccess && desc != NULL) {
		struct shim_gpu_access acc[8];
		size_t n = 0;
		for (size_t i = 0; i < count && n < 8; i++)
			acc[n++] = (struct shim_gpu_access){ .type = (int)desc[i].location.type,
							     .id = desc[i].location.id,
							     .flags = (int)desc[i].flags };
		shim_alloc_access_set(ADDR(ptr), size, acc, n);
	}
	shim_gate_exit(t);
	return r;
}
