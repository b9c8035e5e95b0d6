/* gcr_nvml_abi: the few NVML entry points GCR calls, declared from NVML's documented C ABI
 * (no nvml.h is needed to build); the stand-in tests/fakecuda/fakenvml.c is checked against them. */
#ifndef GCR_NVML_ABI_H
#define GCR_NVML_ABI_H

typedef int gcr_nvml_return; /* nvmlReturn_t: 0 is NVML_SUCCESS */
#define GCR_NVML_SUCCESS 0
#define GCR_NVML_ERROR_NOT_FOUND 6
#define GCR_NVML_ERROR_INSUFFICIENT_SIZE 7
/* usedGpuMemory when NVML cannot tell (NVML_VALUE_NOT_AVAILABLE). */
#define GCR_NVML_VALUE_NOT_AVAILABLE (~0ULL)
/* NVML_DEVICE_UUID_V2_BUFFER_SIZE: "GPU-" + 36 characters, room to spare. */
#define GCR_NVML_UUID_LEN 96

typedef struct gcr_nvml_device_st *gcr_nvml_device; /* nvmlDevice_t */

struct gcr_nvml_memory { /* nvmlMemory_t, bytes */
	unsigned long long total, free, used;
};

struct gcr_nvml_process_info { /* nvmlProcessInfo_t as _v2 and _v3 fill it */
	unsigned int pid;
	unsigned long long used_gpu_memory; /* bytes, or GCR_NVML_VALUE_NOT_AVAILABLE */
	unsigned int gpu_instance_id, compute_instance_id;
};

typedef gcr_nvml_return gcr_nvml_init_fn(void);                       /* nvmlInit_v2 */
typedef const char *gcr_nvml_error_string_fn(gcr_nvml_return r);       /* nvmlErrorString */
typedef gcr_nvml_return gcr_nvml_count_fn(unsigned int *count);        /* nvmlDeviceGetCount_v2 */
typedef gcr_nvml_return gcr_nvml_by_index_fn(unsigned int i, gcr_nvml_device *dev); /* _ByIndex_v2 */
typedef gcr_nvml_return gcr_nvml_uuid_fn(gcr_nvml_device dev, char *uuid, unsigned int len);
typedef gcr_nvml_return gcr_nvml_memory_fn(gcr_nvml_device dev, struct gcr_nvml_memory *mem);
typedef gcr_nvml_return gcr_nvml_procs_fn(gcr_nvml_device dev, unsigned int *count,
					  struct gcr_nvml_process_info *infos); /* _v3 / _v2 */

#endif
