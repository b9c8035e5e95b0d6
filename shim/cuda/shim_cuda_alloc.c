/* shim_cuda_alloc: the CUDA driver's allocation entry points, on the vendor-neutral table
 * (shim_alloc), as shim_hip_alloc.c is HIP's: cuMemAlloc/cuMemAllocPitch of GCR_VMM_MIN_BYTES or
 * more become VMM buffers, the application's cuMemCreate handles are virtualised, the rest goes
 * to the driver and is counted (stream-ordered allocation: shim_cuda_pool.c). Each wrapper resolves the real function (CUDA_ERROR_NOT_FOUND
 * without one) and passes the gate where the driver call could touch memory a suspend moves. */
#include <cuda.h>
#include <stdint.h>

#include "gcr_log.h"
#include "shim_agent.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_cuda_pool.h"
#include "shim_gate.h"
#include "shim_gpu.h"
#include "shim_hook.h"
#include "shim_pool.h"

/* The table records CUDA's access descriptors as they are (layout checked in shim_cuda.c). */
static const struct shim_gpu_access *access_of(const CUmemAccessDesc *d)
{
	return (const struct shim_gpu_access *)(const void *)d;
}

static int convert(size_t bytes)
{
	return shim_cfg.vmm && bytes >= shim_cfg.vmm_min_bytes;
}

/* The current context's device for a room request (-1 unknown); only asked after an
 * out-of-memory. */
static int cur_device(void)
{
	int dev = -1;
	void *ctx = NULL;
	struct gcr_err err;
	if (shim_cuda_ops.current_device(&dev, &ctx, &err) < 0)
		return -1;
	return dev;
}

static CUresult mem_alloc_once(CUdeviceptr *dptr, size_t bytesize)
{
	__typeof__(&cuMemAlloc_v2) real = SHIM_REAL(cuMemAlloc_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (dptr == NULL)
		return real(dptr, bytesize);
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemAlloc_v2), 0);
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	uint64_t va = 0;
	if (convert(bytesize)) {
		r = (CUresult)shim_alloc_buf_new(&shim_cuda_ops, &va, bytesize);
		if (r == CUDA_SUCCESS)
			*dptr = va;
	}
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		r = real(dptr, bytesize);
		if (r == CUDA_SUCCESS)
			shim_alloc_note(&shim_cuda_ops, *dptr, bytesize, SHIM_ALLOC_PLAIN);
	}
	shim_gate_exit(t);
	return r;
}

/* Overcommit (shim_agent): out of memory asks the agent for room, then tries again. */
SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	int tries = 0;
	CUresult r;
	do
		r = mem_alloc_once(dptr, bytesize);
	while (r == CUDA_ERROR_OUT_OF_MEMORY && shim_agent_room_retry(bytesize, cur_device(), &tries));
	return r;
}

/* Pitch as the driver picks it for these devices; any pitch >= width is valid
 * for a program that uses the returned value. */
#define SHIM_PITCH_ALIGN 512

static CUresult mem_alloc_pitch_once(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
				     unsigned int ElementSizeBytes)
{
	__typeof__(&cuMemAllocPitch_v2) real = SHIM_REAL(cuMemAllocPitch_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0 ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
		return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemAllocPitch_v2), 0);
	size_t pitch = (WidthInBytes + SHIM_PITCH_ALIGN - 1) / SHIM_PITCH_ALIGN * SHIM_PITCH_ALIGN;
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	uint64_t va = 0;
	if (Height <= SIZE_MAX / pitch && convert(pitch * Height)) {
		r = (CUresult)shim_alloc_buf_new(&shim_cuda_ops, &va, pitch * Height);
		if (r == CUDA_SUCCESS) {
			*dptr = va;
			*pPitch = pitch;
		}
	}
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
		if (r == CUDA_SUCCESS)
			shim_alloc_note(&shim_cuda_ops, *dptr, *pPitch * Height, SHIM_ALLOC_PLAIN);
	}
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
					size_t Height, unsigned int ElementSizeBytes)
{
	int tries = 0;
	CUresult r;
	do
		r = mem_alloc_pitch_once(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	while (r == CUDA_ERROR_OUT_OF_MEMORY &&
	       shim_agent_room_retry(Height <= SIZE_MAX / (WidthInBytes | 1) ? WidthInBytes * Height : SIZE_MAX,
				     cur_device(), &tries));
	return r;
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	__typeof__(&cuMemFree_v2) real = SHIM_REAL(cuMemFree_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemFree_v2), 0);
	int ours = 0, device = 0;
	uint64_t base = 0;
	CUresult r = CUDA_SUCCESS;
	if (dptr != 0 && shim_pool_block(dptr, &base, NULL, &device) && base == dptr) {
		/* A block of the shim's arena (cudaFree on pool memory): after its device's work. */
		struct gcr_err err;
		(void)shim_cuda_ops.device_sync(device, &err);
		ours = shim_pool_free(dptr, NULL, SHIM_POOL_DONE) == 0;
	}
	if (!ours)
		r = (CUresult)shim_alloc_buf_free(&shim_cuda_ops, dptr, &ours);
	if (!ours) {
		r = real(dptr);
		if (r == CUDA_SUCCESS && dptr != 0) {
			shim_alloc_forget(dptr);
			shim_cuda_pool_forget_import(dptr);
		}
	}
	shim_gate_exit(t);
	return r;
}

/* Managed memory cannot be moved: counted, and suspend refuses while any is held. */
SHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	__typeof__(&cuMemAllocManaged) real = SHIM_REAL(cuMemAllocManaged, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemAllocManaged), 0);
	CUresult r = real(dptr, bytesize, flags);
	if (r == CUDA_SUCCESS)
		shim_alloc_note(&shim_cuda_ops, *dptr, bytesize, SHIM_ALLOC_MANAGED);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	__typeof__(&cuMemGetAddressRange_v2) real = SHIM_REAL(cuMemGetAddressRange_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t base = 0;
	size_t req = 0;
	if (!shim_pool_block(dptr, &base, &req, NULL) && !shim_alloc_buf_range(dptr, &base, &req))
		return real(pbase, psize, dptr);
	if (pbase != NULL)
		*pbase = base;
	if (psize != NULL)
		*psize = req; /* what cuMemAlloc was asked for, as the driver reports */
	return CUDA_SUCCESS;
}

/* ---- the application's own virtual-memory allocations ---- */

/* The device prop's memory is on, -1 when it names none (the table records 0 then). */
static int prop_device(const CUmemAllocationProp *prop)
{
	return prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
}

static CUresult mem_create_once(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
				unsigned long long flags)
{
	__typeof__(&cuMemCreate) real = SHIM_REAL(cuMemCreate, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (handle == NULL || prop == NULL)
		return real(handle, size, prop, flags);
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemCreate), 0);
	CUmemGenericAllocationHandle h = 0;
	CUresult r = real(&h, size, prop, flags);
	if (r == CUDA_SUCCESS) {
		CUmemAllocationProp rec = *prop;
		rec.win32HandleMetaData = NULL; /* the table keeps no pointer of the application's */
		uint64_t app = 0;
		r = (CUresult)shim_alloc_handle_new(&shim_cuda_ops, h, size, prop_device(prop), &rec, &app);
		if (r == CUDA_SUCCESS)
			*handle = app;
		else
			SHIM_REAL(cuMemRelease, 0)(h);
	}
	shim_gate_exit(t);
	return r;
}

/* PyTorch's expandable segments grow through here. */
SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				 const CUmemAllocationProp *prop, unsigned long long flags)
{
	int tries = 0;
	CUresult r;
	do
		r = mem_create_once(handle, size, prop, flags);
	while (r == CUDA_ERROR_OUT_OF_MEMORY &&
	       shim_agent_room_retry(size,
				     prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE
					     ? prop->location.id
					     : -1,
				     &tries));
	return r;
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	__typeof__(&cuMemRelease) real = SHIM_REAL(cuMemRelease, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemRelease), 0);
	int ours = 0;
	CUresult r = (CUresult)shim_alloc_handle_release(&shim_cuda_ops, handle, &ours);
	if (!ours)
		r = real(handle);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	__typeof__(&cuMemMap) real = SHIM_REAL(cuMemMap, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemMap), 0);
	int ours = 0;
	CUresult r = (CUresult)shim_alloc_handle_map(&shim_cuda_ops, ptr, size, offset, handle, &ours);
	if (!ours)
		r = real(ptr, size, offset, handle, flags);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	if (SHIM_REAL(cuMemUnmap, 0) == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemUnmap), 0);
	CUresult r = (CUresult)shim_alloc_unmap(&shim_cuda_ops, ptr, size); /* the unmap and the records as one */
	shim_gate_exit(t);
	return r;
}

/* Recorded per mapping, to apply the same access at resume. */
SHIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	if (SHIM_REAL(cuMemSetAccess, 0) == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemSetAccess), 0);
	CUresult r = (CUresult)shim_alloc_set_access(&shim_cuda_ops, ptr, size, access_of(desc), count);
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	__typeof__(&cuMemRetainAllocationHandle) real = SHIM_REAL(cuMemRetainAllocationHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t h = 0;
	if (handle == NULL || !shim_alloc_handle_retain((uint64_t)(uintptr_t)addr, &h))
		return real(handle, addr);
	*handle = h;
	return CUDA_SUCCESS;
}

SHIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							    CUmemGenericAllocationHandle handle)
{
	__typeof__(&cuMemGetAllocationPropertiesFromHandle) real = SHIM_REAL(cuMemGetAllocationPropertiesFromHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUmemAllocationProp rec;
	if (!shim_alloc_handle_prop(handle, &rec, sizeof(rec)))
		return real(prop, handle);
	if (prop == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*prop = rec;
	return CUDA_SUCCESS;
}

/* Memory shared with another process cannot move: re-created memory would no
 * longer be shared. Such handles make suspend refuse, with the reason. */
SHIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
						  CUmemAllocationHandleType handleType, unsigned long long flags)
{
	__typeof__(&cuMemExportToShareableHandle) real = SHIM_REAL(cuMemExportToShareableHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t rh = 0;
	int ours = shim_alloc_handle_export(handle, &rh);
	if (ours && rh == 0)
		return CUDA_ERROR_INVALID_VALUE; /* released */
	CUresult r = real(shareableHandle, ours ? rh : handle, handleType, flags);
	if (r == CUDA_SUCCESS && ours)
		shim_alloc_handle_shared(handle);
	return r;
}

SHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						    CUmemAllocationHandleType shHandleType)
{
	__typeof__(&cuMemImportFromShareableHandle) real = SHIM_REAL(cuMemImportFromShareableHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	if (handle == NULL)
		return real(handle, osHandle, shHandleType);
	CUmemGenericAllocationHandle h = 0;
	CUresult r = real(&h, osHandle, shHandleType);
	if (r != CUDA_SUCCESS)
		return r;
	CUmemAllocationProp prop = { 0 };
	SHIM_REAL(cuMemGetAllocationPropertiesFromHandle, 0)(&prop, h);
	prop.win32HandleMetaData = NULL;
	uint64_t app = 0;
	r = (CUresult)shim_alloc_handle_import(&shim_cuda_ops, h, prop_device(&prop), &prop, &app);
	if (r == CUDA_SUCCESS)
		*handle = app;
	else
		SHIM_REAL(cuMemRelease, 0)(h);
	return r;
}

/* Legacy IPC export of a buffer the shim manages is refused: another process that opened the
 * handle would keep the memory mapped, so a suspend could neither release it (the other
 * process's view would go) nor keep it (the suspend would not free the GPU), and nothing here
 * learns when that process closes it. Refusing the export never loses data, where refusing the
 * suspend instead would leave the process unsuspendable for good. The real driver cannot export
 * VMM memory this way either; the line says how to keep such a buffer on the driver's path.
 * Buffers left to the driver export as before. */
SHIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	__typeof__(&cuIpcGetMemHandle) real = SHIM_REAL(cuIpcGetMemHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	uint64_t base = 0;
	size_t req = 0;
	if (!shim_alloc_buf_range(dptr, &base, &req))
		return real(pHandle, dptr);
	GCR_LOG(GCR_LOG_WARN, "shim",
		"cuIpcGetMemHandle refused (CUDA_ERROR_NOT_SUPPORTED): the %zu-byte buffer at 0x%llx is on the "
		"VMM path, which suspend releases; keep buffers shared by IPC below GCR_VMM_MIN_BYTES=%zu or "
		"set GCR_VMM=0",
		req, (unsigned long long)base, shim_cfg.vmm_min_bytes);
	return CUDA_ERROR_NOT_SUPPORTED;
}
