/* shim_alloc: the allocation table, shared by CUDA and HIP. Large cuMemAlloc/hipMalloc (and
 * pitch) buffers are put on the virtual-memory API; application VMM handles are virtualised;
 * the rest is counted. Vendor calls go through struct shim_gpu_ops. */
#ifndef SHIM_ALLOC_H
#define SHIM_ALLOC_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_gpu.h"
#include "shim_image.h"

#define SHIM_MAX_DEVICES 64
#define SHIM_MAX_ACCESS 8

/* One physical allocation (a cuMemCreate/hipMemCreate handle), the unit that is staged. */
struct shim_phys {
	const struct shim_gpu_ops *gpu;    /* the vendor it belongs to */
	uint64_t app_handle;               /* handle value the application holds; 0 if shim-owned */
	CUmemGenericAllocationHandle real; /* the vendor's handle; 0 while released (suspended) */
	size_t size;
	CUmemAllocationProp prop; /* CUDA: as created; HIP: type and location only (same values) */
	int app_refs;      /* application references; at 0 the app has released it */
	int nmaps;         /* mappings referencing it */
	int shim_owned;    /* backs a converted cuMemAlloc buffer */
	int shared;        /* exported to / imported from another process: not movable */
	int staged;              /* its data is in staging (suspended) */
	struct shim_image *img;  /* owned: where its data sits in staging (shim_image) */
	uint32_t slot, gen;
};

/* One mapping of (part of) a physical allocation at a virtual address. */
struct shim_map {
	CUdeviceptr va; /* first: sorted-vector key */
	size_t size, offset;
	struct shim_phys *phys;
	int unmapped; /* by a suspend, to be mapped again by resume or its unwind */
	int ndesc;
	CUmemAccessDesc desc[SHIM_MAX_ACCESS]; /* HIP's are recorded with the same layout and values */
};

/* Byte and object counts by path, for status and statistics. */
struct shim_alloc_stats {
	uint64_t vmm_bytes, vmm_buffers;       /* converted cuMemAlloc/pitch buffers */
	uint64_t app_vmm_bytes, app_vmm_handles; /* the application's own cuMemCreate */
	uint64_t driver_bytes, driver_buffers; /* small/odd cuMemAlloc left to the driver */
	uint64_t async_bytes, async_buffers;   /* stream-ordered / pool allocations */
	uint64_t managed_bytes, managed_buffers;
	uint64_t shared_handles;
	uint64_t converted_total, fallback_total; /* lifetime counts of decisions */
};

/* The table lock; shim_cr holds it for the whole suspend or resume. */
extern pthread_mutex_t shim_alloc_lock;

void shim_alloc_stats(struct shim_alloc_stats *st);

/* Iteration for suspend/resume, with shim_alloc_lock held. */
size_t shim_alloc_nphys(void);
struct shim_phys *shim_alloc_phys_at(size_t i); /* NULL for free slots */
size_t shim_alloc_nmaps(void);
struct shim_map *shim_alloc_map_at(size_t i);

/* Contexts the application allocated in (synchronised before copying out), and
 * per device the context the shim copies in. */
size_t shim_alloc_contexts(CUcontext *out, size_t max);
CUcontext shim_alloc_device_ctx(int device);

/* Refuses (-ENOTSUP, with the reason) when something cannot be moved: managed
 * memory, handles shared with other processes. Lock held. */
int shim_alloc_check_movable(struct gcr_err *err);

/* Called after resume: handles the application had released are dropped from the
 * driver as soon as they are re-mapped, as the real semantics require. Lock held. */
void shim_alloc_after_remap(struct shim_phys *p);

/* The same table operations the CUDA entry points of shim_alloc.c do, for another vendor's
 * wrappers (shim_hip_alloc.c). Each takes the table lock and returns the vendor's own status
 * code for the application's call (0: success). */
enum shim_alloc_kind { SHIM_ALLOC_PLAIN, SHIM_ALLOC_ASYNC, SHIM_ALLOC_MANAGED };
/* A converted buffer of at least bytes on the calling thread's device; SHIM_GPU_NOT_SUPPORTED:
 * the caller allocates with the runtime instead (and counts it with shim_alloc_note). */
int shim_alloc_buf_new(const struct shim_gpu_ops *gpu, uint64_t *va, size_t bytes);
/* Frees a converted buffer after waiting for its device, as the runtime's free does; sets
 * *ours to 0 (and does nothing) when va is not one. */
int shim_alloc_buf_free(const struct shim_gpu_ops *gpu, uint64_t va, int *ours);
/* Counts a buffer left to the runtime, and forgets it when freed. */
void shim_alloc_note(uint64_t va, size_t size, enum shim_alloc_kind kind);
void shim_alloc_forget(uint64_t va);
/* The application's own physical allocations: real (the runtime's handle, size bytes on
 * device) becomes *app_handle; on failure the caller releases real. */
int shim_alloc_handle_new(const struct shim_gpu_ops *gpu, uint64_t real, size_t size, int device,
			  uint64_t *app_handle);
/* Release and map of an application handle; *ours 0: not a handle of the table (the caller
 * passes the call to the runtime). */
int shim_alloc_handle_release(const struct shim_gpu_ops *gpu, uint64_t h, int *ours);
int shim_alloc_handle_map(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, size_t offset,
			  uint64_t h, int *ours);
/* After the application's own unmap or access change succeeded in the runtime: the records. */
void shim_alloc_unmapped(uint64_t va, size_t size);
void shim_alloc_access_set(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n);
/* Whether any table record belongs to a vendor other than gpu (lock held). */
int shim_alloc_other_vendor(const struct shim_gpu_ops *gpu);

#endif
