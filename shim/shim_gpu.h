/* shim_gpu: the vendor-neutral operations the data path (allocation table, staging, suspend
 * and resume) needs from a GPU runtime's virtual-memory API; one table per vendor. */
#ifndef SHIM_GPU_H
#define SHIM_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"

/* Device addresses, physical-memory handles and streams as the vendors' own values, widened:
 * a CUdeviceptr or a HIP void *, a CUmemGenericAllocationHandle or a HIP handle pointer. */
typedef uint64_t shim_gpu_va;
typedef uint64_t shim_gpu_handle;
typedef void *shim_gpu_stream;

enum shim_gpu_prot { SHIM_GPU_PROT_NONE = 0, SHIM_GPU_PROT_READ, SHIM_GPU_PROT_READWRITE };

/* Access of one device to a mapped range (the vendor's access descriptor, neutral). */
struct shim_gpu_access {
	int device;
	enum shim_gpu_prot prot;
};

/* Every operation returns 0 or -errno with err naming the call and the vendor's error
 * (-ENOMEM for the vendor's out-of-memory, so resume can report what is missing). They call
 * the real runtime, never the shim's wrappers, and do not pass the gate. */
struct shim_gpu_ops {
	const char *name; /* "cuda", "hip": what status reports */

	/* Opens the runtime if needed; -ENODEV where the process has none. */
	int (*load)(struct gcr_err *err);
	int (*device_count)(int *count, struct gcr_err *err);
	/* Minimum VMM granularity of device memory on dev, bytes. */
	int (*granularity)(int device, size_t *bytes, struct gcr_err *err);
	/* Whether peer may map memory of device (the access list of converted buffers). */
	int (*can_access_peer)(int device, int peer, int *can, struct gcr_err *err);

	int (*reserve)(shim_gpu_va *va, size_t size, size_t align, struct gcr_err *err);
	int (*free_va)(shim_gpu_va va, size_t size, struct gcr_err *err);
	/* Pinned device memory on device; size a granularity multiple. */
	int (*create)(shim_gpu_handle *h, size_t size, int device, struct gcr_err *err);
	int (*release)(shim_gpu_handle h, struct gcr_err *err);
	int (*map)(shim_gpu_va va, size_t size, size_t offset, shim_gpu_handle h, struct gcr_err *err);
	int (*unmap)(shim_gpu_va va, size_t size, struct gcr_err *err);
	int (*set_access)(shim_gpu_va va, size_t size, const struct shim_gpu_access *acc, size_t n,
			  struct gcr_err *err);

	/* A non-blocking stream on device for the shim's own copies. */
	int (*stream_create)(int device, shim_gpu_stream *s, struct gcr_err *err);
	int (*stream_destroy)(shim_gpu_stream s, struct gcr_err *err);
	int (*stream_sync)(shim_gpu_stream s, struct gcr_err *err);
	/* Waits for all work the application submitted to device. */
	int (*device_sync)(int device, struct gcr_err *err);
	int (*copy_dtoh_async)(void *dst, shim_gpu_va src, size_t n, shim_gpu_stream s, struct gcr_err *err);
	int (*copy_htod_async)(shim_gpu_va dst, const void *src, size_t n, shim_gpu_stream s,
			       struct gcr_err *err);
	/* Pins (page-locks) host memory for the copies, and unpins it. */
	int (*host_register)(void *p, size_t n, struct gcr_err *err);
	int (*host_unregister)(void *p, struct gcr_err *err);
	int (*mem_info)(int device, size_t *free_bytes, size_t *total_bytes, struct gcr_err *err);
	/* The vendor's name for an error code ("hipErrorOutOfMemory"); never NULL. */
	const char *(*error_string)(int code);
};

/* The HIP implementation (shim_hip.c); the CUDA one comes with phase 2 (docs/amd.md). */
extern const struct shim_gpu_ops shim_hip_ops;

#endif
