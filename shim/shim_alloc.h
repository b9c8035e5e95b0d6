/* shim_alloc: the allocation table. Large cuMemAlloc/pitch buffers are put on the
 * virtual-memory API; application VMM handles are virtualised; the rest is counted. */
#ifndef SHIM_ALLOC_H
#define SHIM_ALLOC_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_image.h"

#define SHIM_MAX_DEVICES 64
#define SHIM_MAX_ACCESS 8

/* One physical allocation (a cuMemCreate handle), the unit that is staged. */
struct shim_phys {
	uint64_t app_handle;               /* handle value the application holds; 0 if shim-owned */
	CUmemGenericAllocationHandle real; /* 0 while released (suspended) */
	size_t size;
	CUmemAllocationProp prop;
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
	CUmemAccessDesc desc[SHIM_MAX_ACCESS];
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

#endif
