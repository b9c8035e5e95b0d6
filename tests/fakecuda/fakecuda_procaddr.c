/* fakecuda_procaddr: cuGetProcAddress (both ABIs): a base name, a CUDA version and the
 * per-thread flag resolve through one table to the entry point the real driver would return. */
#include "fakecuda.h"

#include <cudaTypedefs.h>
#include <string.h>

/* One row per ABI version of a base name: introduced in CUDA version `since` (from the
 * PFN_<name>_v<since> typedefs of cudaTypedefs.h); ptsz is the per-thread-default-stream
 * variant, NULL where the call has none. Rows of a name are in increasing `since`. */
struct fake_proc {
	const char *name;
	int since;
	void *legacy;
	void *ptsz;
};

#define FAKE_P(name, since, sym) {name, since, (void *)&sym, NULL}
#define FAKE_PT(name, since, sym, ptsz) {name, since, (void *)&sym, (void *)&ptsz}

static const struct fake_proc fake_procs[] = {
	FAKE_P("cuInit", 2000, cuInit),
	FAKE_P("cuDriverGetVersion", 2020, cuDriverGetVersion),
	FAKE_P("cuDeviceGet", 2000, cuDeviceGet),
	FAKE_P("cuDeviceGetCount", 2000, cuDeviceGetCount),
	FAKE_P("cuDeviceGetName", 2000, cuDeviceGetName),
	FAKE_P("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
	FAKE_P("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
	FAKE_P("cuDeviceGetUuid", 9020, fake_legacy_device_get_uuid),
	FAKE_P("cuDeviceGetUuid", 11040, cuDeviceGetUuid_v2),
	FAKE_P("cuGetErrorString", 6000, cuGetErrorString),
	FAKE_P("cuGetErrorName", 6000, cuGetErrorName),
	FAKE_P("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
	FAKE_P("cuDevicePrimaryCtxRelease", 7000, fake_legacy_primary_ctx_release),
	FAKE_P("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
	FAKE_P("cuCtxCreate", 3020, fake_legacy_ctx_create_v2),
	FAKE_P("cuCtxCreate", 11040, fake_legacy_ctx_create_v3),
	FAKE_P("cuCtxCreate", 12050, cuCtxCreate_v4),
	FAKE_P("cuCtxDestroy", 4000, cuCtxDestroy_v2),
	FAKE_P("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
	FAKE_P("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
	FAKE_P("cuCtxGetDevice", 2000, cuCtxGetDevice),
	FAKE_P("cuCtxGetDevice", 13000, cuCtxGetDevice_v2),
	FAKE_P("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
	FAKE_P("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
	FAKE_P("cuCtxGetLimit", 3010, cuCtxGetLimit),
	FAKE_P("cuCtxSetLimit", 3010, cuCtxSetLimit),
	FAKE_P("cuCtxSynchronize", 2000, cuCtxSynchronize),
	FAKE_P("cuCtxSynchronize", 13000, cuCtxSynchronize_v2),
	FAKE_P("cuMemAlloc", 3020, cuMemAlloc_v2),
	FAKE_P("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
	FAKE_P("cuMemFree", 3020, cuMemFree_v2),
	FAKE_P("cuMemAllocManaged", 6000, cuMemAllocManaged),
	FAKE_PT("cuMemAllocAsync", 11020, cuMemAllocAsync, cuMemAllocAsync_ptsz),
	FAKE_PT("cuMemFreeAsync", 11020, cuMemFreeAsync, cuMemFreeAsync_ptsz),
	FAKE_PT("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz),
	FAKE_P("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
	FAKE_P("cuDeviceGetMemPool", 11020, cuDeviceGetMemPool),
	FAKE_P("cuDeviceSetMemPool", 11020, cuDeviceSetMemPool),
	FAKE_P("cuMemPoolCreate", 11020, cuMemPoolCreate),
	FAKE_P("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
	FAKE_P("cuMemPoolSetAttribute", 11020, cuMemPoolSetAttribute),
	FAKE_P("cuMemPoolGetAttribute", 11020, cuMemPoolGetAttribute),
	FAKE_P("cuMemPoolTrimTo", 11020, cuMemPoolTrimTo),
	FAKE_P("cuMemPoolSetAccess", 11020, cuMemPoolSetAccess),
	FAKE_P("cuMemPoolGetAccess", 11020, cuMemPoolGetAccess),
	FAKE_P("cuMemPoolExportToShareableHandle", 11020, cuMemPoolExportToShareableHandle),
	FAKE_P("cuMemPoolImportFromShareableHandle", 11020, cuMemPoolImportFromShareableHandle),
	FAKE_P("cuMemPoolExportPointer", 11020, cuMemPoolExportPointer),
	FAKE_P("cuMemPoolImportPointer", 11020, cuMemPoolImportPointer),
	FAKE_P("cuMemGetInfo", 3020, cuMemGetInfo_v2),
	FAKE_P("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
	FAKE_P("cuIpcGetMemHandle", 4010, cuIpcGetMemHandle),
	FAKE_P("cuMemAllocHost", 3020, cuMemAllocHost_v2),
	FAKE_P("cuMemHostAlloc", 2020, cuMemHostAlloc),
	FAKE_P("cuMemFreeHost", 2000, cuMemFreeHost),
	FAKE_P("cuMemHostRegister", 6050, cuMemHostRegister_v2),
	FAKE_P("cuMemHostUnregister", 4000, cuMemHostUnregister),
	FAKE_P("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
	FAKE_P("cuMemAddressReserve", 10020, cuMemAddressReserve),
	FAKE_P("cuMemAddressFree", 10020, cuMemAddressFree),
	FAKE_P("cuMemCreate", 10020, cuMemCreate),
	FAKE_P("cuMemRelease", 10020, cuMemRelease),
	FAKE_P("cuMemMap", 10020, cuMemMap),
	FAKE_P("cuMemUnmap", 10020, cuMemUnmap),
	FAKE_P("cuMemSetAccess", 10020, cuMemSetAccess),
	FAKE_P("cuMemGetAccess", 10020, cuMemGetAccess),
	FAKE_P("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
	FAKE_P("cuMemGetAllocationPropertiesFromHandle", 10020, cuMemGetAllocationPropertiesFromHandle),
	FAKE_P("cuMemRetainAllocationHandle", 11000, cuMemRetainAllocationHandle),
	FAKE_P("cuMemExportToShareableHandle", 10020, cuMemExportToShareableHandle),
	FAKE_P("cuMemImportFromShareableHandle", 10020, cuMemImportFromShareableHandle),
	FAKE_PT("cuMemcpy", 4000, cuMemcpy, cuMemcpy_ptds),
	FAKE_PT("cuMemcpyAsync", 4000, cuMemcpyAsync, cuMemcpyAsync_ptsz),
	FAKE_PT("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds),
	FAKE_PT("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds),
	FAKE_PT("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds),
	FAKE_PT("cuMemcpyHtoDAsync", 3020, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz),
	FAKE_PT("cuMemcpyDtoHAsync", 3020, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz),
	FAKE_PT("cuMemcpyDtoDAsync", 3020, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz),
	FAKE_PT("cuMemcpy2D", 3020, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds),
	FAKE_PT("cuMemcpy2DAsync", 3020, cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz),
	FAKE_PT("cuMemsetD8", 3020, cuMemsetD8_v2, cuMemsetD8_v2_ptds),
	FAKE_PT("cuMemsetD16", 3020, cuMemsetD16_v2, cuMemsetD16_v2_ptds),
	FAKE_PT("cuMemsetD32", 3020, cuMemsetD32_v2, cuMemsetD32_v2_ptds),
	FAKE_PT("cuMemsetD8Async", 3020, cuMemsetD8Async, cuMemsetD8Async_ptsz),
	FAKE_PT("cuMemsetD16Async", 3020, cuMemsetD16Async, cuMemsetD16Async_ptsz),
	FAKE_PT("cuMemsetD32Async", 3020, cuMemsetD32Async, cuMemsetD32Async_ptsz),
	FAKE_PT("cuMemsetD2D8", 3020, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds),
	FAKE_PT("cuMemsetD2D32", 3020, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds),
	FAKE_P("cuStreamCreate", 2000, cuStreamCreate),
	FAKE_P("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
	FAKE_P("cuStreamDestroy", 4000, cuStreamDestroy_v2),
	FAKE_PT("cuStreamSynchronize", 2000, cuStreamSynchronize, cuStreamSynchronize_ptsz),
	FAKE_PT("cuStreamQuery", 2000, cuStreamQuery, cuStreamQuery_ptsz),
	FAKE_PT("cuStreamWaitEvent", 3020, cuStreamWaitEvent, cuStreamWaitEvent_ptsz),
	FAKE_P("cuEventCreate", 2000, cuEventCreate),
	FAKE_PT("cuEventRecord", 2000, cuEventRecord, cuEventRecord_ptsz),
	FAKE_PT("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz),
	FAKE_P("cuEventQuery", 2000, cuEventQuery),
	FAKE_P("cuEventSynchronize", 2000, cuEventSynchronize),
	FAKE_P("cuEventDestroy", 4000, cuEventDestroy_v2),
	FAKE_P("cuEventElapsedTime", 2000, fake_legacy_event_elapsed_time),
	FAKE_P("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
	FAKE_PT("cuLaunchHostFunc", 10000, cuLaunchHostFunc, cuLaunchHostFunc_ptsz),
	FAKE_P("cuModuleLoad", 2000, cuModuleLoad),
	FAKE_P("cuModuleLoadData", 2000, cuModuleLoadData),
	FAKE_P("cuModuleLoadDataEx", 2010, cuModuleLoadDataEx),
	FAKE_P("cuModuleLoadFatBinary", 2000, cuModuleLoadFatBinary),
	FAKE_P("cuModuleUnload", 2000, cuModuleUnload),
	FAKE_P("cuModuleGetFunction", 2000, cuModuleGetFunction),
	FAKE_PT("cuLaunchKernel", 4000, cuLaunchKernel, cuLaunchKernel_ptsz),
	FAKE_PT("cuLaunchKernelEx", 11060, cuLaunchKernelEx, cuLaunchKernelEx_ptsz),
	FAKE_PT("cuLaunchCooperativeKernel", 9000, cuLaunchCooperativeKernel,
		cuLaunchCooperativeKernel_ptsz),
	FAKE_PT("cuStreamBeginCapture", 10000, fake_legacy_stream_begin_capture,
		fake_legacy_stream_begin_capture_ptsz),
	FAKE_PT("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz),
	FAKE_PT("cuStreamEndCapture", 10000, cuStreamEndCapture, cuStreamEndCapture_ptsz),
	FAKE_PT("cuStreamIsCapturing", 10000, cuStreamIsCapturing, cuStreamIsCapturing_ptsz),
	FAKE_PT("cuStreamGetCaptureInfo", 10010, fake_legacy_capture_info, fake_legacy_capture_info_ptsz),
	FAKE_PT("cuStreamGetCaptureInfo", 11030, fake_legacy_capture_info_v2,
		fake_legacy_capture_info_v2_ptsz),
	FAKE_PT("cuStreamGetCaptureInfo", 12030, cuStreamGetCaptureInfo_v3, cuStreamGetCaptureInfo_v3_ptsz),
	FAKE_P("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
	FAKE_P("cuGraphCreate", 10000, cuGraphCreate),
	FAKE_P("cuGraphAddEmptyNode", 10000, cuGraphAddEmptyNode),
	FAKE_P("cuGraphAddKernelNode", 12000, cuGraphAddKernelNode_v2),
	FAKE_P("cuGraphAddMemAllocNode", 11040, cuGraphAddMemAllocNode),
	FAKE_P("cuGraphAddMemFreeNode", 11040, cuGraphAddMemFreeNode),
	FAKE_P("cuGraphAddNode", 12020, fake_legacy_graph_add_node),
	FAKE_P("cuGraphAddNode", 12030, cuGraphAddNode_v2),
	FAKE_P("cuGraphMemAllocNodeGetParams", 11040, cuGraphMemAllocNodeGetParams),
	FAKE_P("cuGraphNodeGetType", 10000, cuGraphNodeGetType),
	FAKE_P("cuGraphClone", 10000, cuGraphClone),
	FAKE_P("cuGraphAddChildGraphNode", 10000, cuGraphAddChildGraphNode),
	FAKE_P("cuGraphInstantiateWithParams", 12000, cuGraphInstantiateWithParams),
	FAKE_P("cuDeviceGraphMemTrim", 11040, cuDeviceGraphMemTrim),
	FAKE_P("cuDeviceGetGraphMemAttribute", 11040, cuDeviceGetGraphMemAttribute),
	FAKE_P("cuDeviceSetGraphMemAttribute", 11040, cuDeviceSetGraphMemAttribute),
	FAKE_P("cuGraphInstantiate", 10000, fake_legacy_graph_instantiate),
	FAKE_P("cuGraphInstantiate", 11000, fake_legacy_graph_instantiate_v2),
	FAKE_P("cuGraphInstantiate", 12000, cuGraphInstantiateWithFlags),
	FAKE_P("cuGraphInstantiateWithFlags", 11040, cuGraphInstantiateWithFlags),
	FAKE_PT("cuGraphLaunch", 10000, cuGraphLaunch, cuGraphLaunch_ptsz),
	FAKE_P("cuGraphExecDestroy", 10000, cuGraphExecDestroy),
	FAKE_P("cuGraphDestroy", 10000, cuGraphDestroy),
	FAKE_P("cuGetProcAddress", 11030, fake_legacy_get_proc_address),
	FAKE_P("cuGetProcAddress", 12000, cuGetProcAddress_v2),
	FAKE_P("cuCheckpointProcessGetState", 12080, cuCheckpointProcessGetState),
	FAKE_P("cuCheckpointProcessLock", 12080, cuCheckpointProcessLock),
	FAKE_P("cuCheckpointProcessCheckpoint", 12080, cuCheckpointProcessCheckpoint),
	FAKE_P("cuCheckpointProcessRestore", 12080, cuCheckpointProcessRestore),
	FAKE_P("cuCheckpointProcessUnlock", 12080, cuCheckpointProcessUnlock),
	FAKE_P("cuCheckpointProcessGetRestoreThreadId", 12080, cuCheckpointProcessGetRestoreThreadId),
};

/* Like the driver, no cuInit is needed: the runtime asks for cuInit through this. */
static CUresult fake_resolve(const char *symbol, void **pfn, int version, cuuint64_t flags,
			     bool status_form, CUdriverProcAddressQueryResult *status)
{
	const struct fake_proc *best = NULL;
	bool known = false;
	size_t i;

	if (status != NULL)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	if (symbol == NULL || pfn == NULL ||
	    (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
				   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < sizeof(fake_procs) / sizeof(fake_procs[0]); i++) {
		if (strcmp(fake_procs[i].name, symbol) != 0)
			continue;
		known = true;
		if (fake_procs[i].since <= version)
			best = &fake_procs[i];
	}
	if (best == NULL) {
		if (status_form)
			*pfn = NULL;
		if (status != NULL && known)
			*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		/* Driver 580: the CUDA 12 form answers success with a NULL pointer and the reason
		 * in *status; the CUDA 11.3 form answers CUDA_ERROR_NOT_FOUND. */
		return status_form ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
	}
	/* DEFAULT means the legacy default stream, unless compiled for per-thread. */
	*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptsz != NULL
		       ? best->ptsz
		       : best->legacy;
	if (status != NULL)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
					 cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
	CUresult rc = fake_initialized() ? fake_fault_take("cuGetProcAddress") : CUDA_SUCCESS;

	if (rc != CUDA_SUCCESS)
		return rc;
	return fake_resolve(symbol, pfn, version, flags, true, status);
}

static const PFN_cuGetProcAddress_v11030 fake_check_procaddr_v1 __attribute__((unused)) =
	fake_legacy_get_proc_address;
CUresult fake_legacy_get_proc_address(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	CUresult rc = fake_initialized() ? fake_fault_take("cuGetProcAddress") : CUDA_SUCCESS;

	if (rc != CUDA_SUCCESS)
		return rc;
	return fake_resolve(symbol, pfn, version, flags, false, NULL);
}
