/* shim_alloc: the allocation table, vendor-neutral, shared by CUDA and HIP. Large
 * cuMemAlloc/hipMalloc (and pitch) buffers are put on the virtual-memory API; application VMM
 * handles are virtualised; the rest is counted. The vendors' entry points (shim_cuda_alloc.c,
 * shim_hip_alloc.c) and suspend/resume (shim_cr) reach the records only through the functions
 * below, each of which takes the table's lock itself. Vendor calls go through struct
 * shim_gpu_ops. Records use neutral types: addresses and handles widened to 64 bits, access as
 * struct shim_gpu_access (both vendors' layout and values, checked in shim_cuda.c and
 * shim_hip.c), the vendor's allocation properties as opaque bytes (struct shim_gpu_prop). */
#ifndef SHIM_ALLOC_H
#define SHIM_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_chunks.h"
#include "shim_gpu.h"

#define SHIM_MAX_ACCESS 8

/* One physical allocation (a cuMemCreate/hipMemCreate handle), the unit that is staged. Read by
 * shim_cr inside shim_alloc_each; real, staged and the counts are written by the table only. */
struct shim_phys {
	const struct shim_gpu_ops *gpu;    /* the vendor it belongs to */
	uint64_t app_handle;               /* handle value the application holds; 0 if shim-owned */
	shim_gpu_handle real;     /* the vendor's handle; 0 while released (suspended) */
	size_t size;
	int device;               /* the GPU its memory is on (0 when its properties name none) */
	int has_prop;             /* prop holds the vendor's properties (SHIM_GPU_CAP_CREATE_PROP) */
	struct shim_gpu_prop prop; /* as created; else create makes pinned memory on device */
	int app_refs;      /* application references; at 0 the app has released it */
	int nmaps;         /* mappings referencing it */
	int shim_owned;    /* backs a converted cuMemAlloc buffer */
	int shared;        /* exported to / imported from another process: not movable */
	int staged;              /* its data is in staging (suspended) */
	struct shim_chunks *chunks; /* owned: where its data sits in staging (shim_cr makes it) */
	uint32_t slot, gen;
	int remade; /* re-created by the last shim_alloc_recreate (undone by its undo) */
};

/* One mapping of (part of) a physical allocation at a virtual address. */
struct shim_map {
	shim_gpu_va va; /* first: sorted-vector key */
	size_t size, offset;
	struct shim_phys *phys;
	int unmapped; /* by a suspend, to be mapped again by resume or its unwind */
	int remapped; /* mapped again by the last shim_alloc_recreate */
	int ndesc;
	struct shim_gpu_access desc[SHIM_MAX_ACCESS]; /* as the vendor's own descriptors were given */
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
	uint64_t pool_seg_bytes, pool_segs; /* segments of the shim's stream-ordered arena (shim_pool) */
	uint64_t shared_pools; /* exported pools and imported pool pointers (not movable) */
};

void shim_alloc_stats(struct shim_alloc_stats *st);

/* ---- for the vendors' entry points: each returns the vendor's own status code for the
 * application's call (0: success) ---- */
enum shim_alloc_kind { SHIM_ALLOC_PLAIN, SHIM_ALLOC_ASYNC, SHIM_ALLOC_MANAGED };
/* A converted buffer of at least bytes on the calling thread's device; SHIM_GPU_NOT_SUPPORTED:
 * the caller allocates with the runtime instead (and counts it with shim_alloc_note). */
int shim_alloc_buf_new(const struct shim_gpu_ops *gpu, uint64_t *va, size_t bytes);
/* Frees a converted buffer after waiting for its device, as the runtime's free does; sets
 * *ours to 0 (and does nothing) when va is not one. */
int shim_alloc_buf_free(const struct shim_gpu_ops *gpu, uint64_t va, int *ours);
/* Whether va lies in a converted buffer; then its address and the bytes the application asked
 * for (either pointer may be NULL). */
int shim_alloc_buf_range(uint64_t va, uint64_t *base, size_t *req);
/* A segment for the stream-ordered arena (shim_pool): size bytes (a granularity multiple) on
 * device with access acc[n] (n 0: the device and its peers, as converted buffers), moved by
 * suspend like a converted buffer but never answered for by shim_alloc_buf_free/_range. Returns
 * 0 or -errno (-ENOMEM: the GPU is full); the vendor's code is kept (gpu->last_code). */
int shim_alloc_seg_new(const struct shim_gpu_ops *gpu, int device, size_t size,
		       const struct shim_gpu_access *acc, size_t n, uint64_t *va);
/* Unmaps and releases a segment (no synchronisation: the arena knows it is idle). */
void shim_alloc_seg_free(uint64_t va);
/* A pool exported to another process, or a pointer imported from one, appeared (+1) or went
 * (-1): suspend refuses while any is held, as for shared handles. */
void shim_alloc_shared_pool(int delta);
/* Counts a buffer left to the runtime, and forgets it when freed. */
void shim_alloc_note(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, enum shim_alloc_kind kind);
void shim_alloc_forget(uint64_t va);
/* The application's own physical allocations: real (the runtime's handle, size bytes on
 * device, -1 when its properties name no device) becomes *app_handle; on failure the caller
 * releases real. prop: the vendor's properties as created (gpu->prop_size bytes, recorded as
 * they are: the caller clears what must not be kept, such as pointers) where it has
 * SHIM_GPU_CAP_CREATE_PROP, else NULL (pinned memory on device). */
int shim_alloc_handle_new(const struct shim_gpu_ops *gpu, uint64_t real, size_t size, int device,
			  const void *prop, uint64_t *app_handle);
/* A handle imported from another process (shared: suspend refuses while it exists); device and
 * prop as for shim_alloc_handle_new. On failure the caller releases real. */
int shim_alloc_handle_import(const struct shim_gpu_ops *gpu, uint64_t real, int device, const void *prop,
			     uint64_t *app_handle);
/* Release and map of an application handle; *ours 0: not a handle of the table (the caller
 * passes the call to the runtime). */
int shim_alloc_handle_release(const struct shim_gpu_ops *gpu, uint64_t h, int *ours);
int shim_alloc_handle_map(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, size_t offset,
			  uint64_t h, int *ours);
/* A new application reference to the handle mapped at va (the runtime's
 * cuMemRetainAllocationHandle); 0 when the table does not answer for va. */
int shim_alloc_handle_retain(uint64_t va, uint64_t *h);
/* The recorded properties of handle h (as created: the first size bytes, zero where none were
 * recorded) into prop; 0 when h is not the table's. */
int shim_alloc_handle_prop(uint64_t h, void *prop, size_t size);
/* Export of an application handle: 0 when h is not the table's; else 1 with *real the runtime's
 * handle to export (0: released, the export is invalid). After the runtime exported it,
 * shim_alloc_handle_shared marks it (suspend then refuses). */
int shim_alloc_handle_export(uint64_t h, uint64_t *real);
void shim_alloc_handle_shared(uint64_t h);
/* The application's unmap and access change: in the runtime and in the records as one (the
 * runtime's code returned). Or, after the runtime call succeeded, the records only. */
int shim_alloc_unmap(const struct shim_gpu_ops *gpu, uint64_t va, size_t size);
int shim_alloc_set_access(const struct shim_gpu_ops *gpu, uint64_t va, size_t size,
			  const struct shim_gpu_access *acc, size_t n);
void shim_alloc_unmapped(uint64_t va, size_t size);
void shim_alloc_access_set(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n);

/* ---- for suspend and resume (shim_cr). Allocation calls are gated meanwhile, so the records
 * they visit stay. ---- */
/* Refuses (-ENOTSUP, with the reason) when something cannot be moved by gpu: managed memory,
 * handles shared with other processes, records of another vendor. */
int shim_alloc_check_movable(const struct shim_gpu_ops *gpu, struct gcr_err *err);
/* Visits every physical allocation once, in slot order, with the table lock held (fn must not
 * call the table). With SHIM_ALLOC_EACH_VA, va is an address where the whole of p is mapped
 * and accessible (0: none), else 0. fn returning non-zero stops the walk; that is returned. */
#define SHIM_ALLOC_EACH_VA 1u
int shim_alloc_each(unsigned flags, int (*fn)(struct shim_phys *p, uint64_t va, void *arg), void *arg);
/* The same over every mapping, in address order. */
int shim_alloc_each_map(int (*fn)(const struct shim_map *m, void *arg), void *arg);
/* Upper bounds: physical allocations (for arrays a walk fills) and mappings. */
size_t shim_alloc_nphys(void);
size_t shim_alloc_nmaps(void);
/* The i-th mapping in address order, NULL past the end: for tests, which run no allocation
 * meanwhile (tests/unit/test_shim_hip_hook.c). */
const struct shim_map *shim_alloc_map_at(size_t i);
/* Suspend, once p's data is all in staging: unmaps its mappings and releases its handle. p is
 * staged from then on even when this fails half way: shim_alloc_recreate puts back what went. */
int shim_alloc_release(struct shim_phys *p, struct gcr_err *err);
/* Resume (and the unwind of a failed suspend): re-creates every staged handle that was released
 * and maps again what was unmapped, with the recorded access. On failure it undoes itself (the
 * process stays suspended); -ENOMEM names the GPU and the bytes missing. */
int shim_alloc_recreate(struct gcr_err *err);
/* Undoes the last shim_alloc_recreate (the copies after it failed): unmaps what it mapped,
 * releases what it created. */
void shim_alloc_recreate_undo(void);
/* After a resume: nothing is staged; handles the application had released go from the
 * runtime now that they were re-mapped, as the real semantics require. */
void shim_alloc_resumed(void);

#endif
