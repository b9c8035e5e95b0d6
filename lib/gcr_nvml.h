/* gcr_nvml: what GCR asks NVML (libnvidia-ml.so.1, opened at run time, never linked): a
 * process's device memory per GPU, and a GPU's free memory. The restore room check uses both. */
#ifndef GCR_NVML_H
#define GCR_NVML_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_error.h"
#include "gcr_nvml_abi.h"

#define GCR_NVML_MAX_DEVICES 64

struct gcr_nvml_use {
	char uuid[GCR_NVML_UUID_LEN];
	unsigned long long bytes; /* the process's usedGpuMemory on that GPU */
};

/* Opens NVML once: $GCR_LIBNVML, else libnvidia-ml.so.1 beside $GCR_LIBCUDA (the chart's
 * hostPath mode names the driver's directory that way), else libnvidia-ml.so.1 on the
 * loader's path; then nvmlInit_v2. -ENOENT when there is no NVML; err says why. */
int gcr_nvml_open(struct gcr_err *err);

/* The GPUs pid uses and its bytes on each (*n of them, at most max). 0 with *n == 0 when NVML
 * lists pid on no GPU. */
int gcr_nvml_proc_use(pid_t pid, struct gcr_nvml_use *out, int max, int *n, struct gcr_err *err);

/* Free and total bytes of the GPU with this UUID; -ENODEV when no GPU has it. */
int gcr_nvml_mem(const char *uuid, unsigned long long *free_bytes, unsigned long long *total,
		 struct gcr_err *err);

/* The UUIDs of the node's GPUs in NVML's order (*n of them, at most max). */
int gcr_nvml_gpus(char (*uuids)[GCR_NVML_UUID_LEN], int max, int *n, struct gcr_err *err);

/* GPU index's model name and the driver's version ("unknown" where this NVML cannot say;
 * the stand-in has neither). 0, or -ENOENT without NVML (both "unknown"). */
int gcr_nvml_gpu_ident(unsigned int index, char *model, size_t mlen, char *driver, size_t dlen,
		       struct gcr_err *err);

/* The model name of the GPU with this UUID ("unknown" where NVML cannot say); -ENODEV when no
 * GPU has it, -ENOENT without NVML. */
int gcr_nvml_model(const char *uuid, char *model, size_t mlen, struct gcr_err *err);

#endif
