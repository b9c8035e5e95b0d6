/* shim_alloc: the CUDA allocation entry points and the table behind them (HIP's wrappers,
 * shim_hip_alloc.c, use the same table). The application sees the same addresses and handle
 * values across suspend and resume. */
#include "shim_alloc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_gate.h"
#include "shim_hook.h"
#include "shim_real.h"
#include "shim_staging.h"

pthread_mutex_t shim_alloc_lock = PTHREAD_MUTEX_INITIALIZER;

/* Handles the application gets are ours: tag in the high bits, then generation
 * and slot, so a stale or foreign value is recognised and never aliases a live one. */
#define HANDLE_TAG 0x6763720000000000ULL /* "gcr" */
#define HANDLE_TAG_MASK 0xffffff0000000000ULL

/* A vector of pointers to structs whose first member is their CUdeviceptr key,
 * kept sorted so lookups by address are binary searches. */
struct ptrvec {
	void **v;
	size_t n, cap;
};

struct shim_buf {
	CUdeviceptr va; /* first: sorted-vector key */
	size_t req;     /* bytes the application asked for */
	size_t size;    /* reserved and mapped (granularity multiple) */
	struct shim_phys *phys;
	struct shim_map *map;
};

struct shim_drv {
	CUdeviceptr va;
	size_t size;
	enum { DRV_PLAIN, DRV_ASYNC, DRV_MANAGED } kind;
};

struct dev_info {
	int known;
	const struct shim_gpu_ops *gpu; /* the vendor gran and access were read from */
	size_t gran;
	CUcontext ctx;
	int naccess;
	CUmemAccessDesc access[SHIM_MAX_ACCESS];
};

static struct shim_phys **phys_slots;
static size_t phys_cap;
static struct ptrvec maps, bufs, drvs;
static struct dev_info devs[SHIM_MAX_DEVICES];
static CUcontext ctxs[64];
static size_t nctxs;
static struct shim_alloc_stats stats;

static CUdeviceptr key_of(const void *p)
{
	return *(const CUdeviceptr *)p;
}

/* Index of the first element with key >= va. */
static size_t vec_lower(const struct ptrvec *pv, CUdeviceptr va)
{
	size_t lo = 0, hi = pv->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (key_of(pv->v[mid]) < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int vec_insert(struct ptrvec *pv, void *item)
{
	if (pv->n == pv->cap) {
		size_t ncap = pv->cap ? pv->cap * 2 : 64;
		void **nv = realloc(pv->v, ncap * sizeof(*nv));
		if (nv == NULL)
			return -ENOMEM;
		pv->v = nv;
		pv->cap = ncap;
	}
	size_t i = vec_lower(pv, key_of(item));
	memmove(&pv->v[i + 1], &pv->v[i], (pv->n - i) * sizeof(*pv->v));
	pv->v[i] = item;
	pv->n++;
	return 0;
}

static void *vec_find(const struct ptrvec *pv, CUdeviceptr va)
{
	size_t i = vec_lower(pv, va);
	return i < pv->n && key_of(pv->v[i]) == va ? pv->v[i] : NULL;
}

static void vec_remove(struct ptrvec *pv, const void *item)
{
	size_t i = vec_lower(pv, key_of(item));
	for (; i < pv->n && key_of(pv->v[i]) == key_of(item); i++)
		if (pv->v[i] == item) {
			memmove(&pv->v[i], &pv->v[i + 1], (pv->n - i - 1) * sizeof(*pv->v));
			pv->n--;
			return;
		}
}

/* ---- physical allocations ---- */

static struct shim_phys *phys_new(const struct shim_gpu_ops *gpu, CUmemGenericAllocationHandle real,
				  size_t size, const CUmemAllocationProp *prop, int shim_owned)
{
	size_t slot = 0;
	while (slot < phys_cap && phys_slots[slot] != NULL)
		slot++;
	if (slot == phys_cap) {
		size_t ncap = phys_cap ? phys_cap * 2 : 256;
		if (ncap > 0xffffff)
			return NULL;
		struct shim_phys **ns = realloc(phys_slots, ncap * sizeof(*ns));
		if (ns == NULL)
			return NULL;
		memset(ns + phys_cap, 0, (ncap - phys_cap) * sizeof(*ns));
		phys_slots = ns;
		phys_cap = ncap;
	}
	struct shim_phys *p = calloc(1, sizeof(*p));
	if (p == NULL)
		return NULL;
	static uint32_t next_gen;
	p->gpu = gpu;
	p->real = real;
	p->size = size;
	p->prop = *prop;
	p->prop.win32HandleMetaData = NULL;
	p->shim_owned = shim_owned;
	p->app_refs = shim_owned ? 0 : 1;
	p->slot = (uint32_t)slot;
	p->gen = ++next_gen & 0xffff;
	p->app_handle = shim_owned ? 0 : HANDLE_TAG | ((uint64_t)p->gen << 24) | slot;
	phys_slots[slot] = p;
	return p;
}

static struct shim_phys *phys_lookup(uint64_t app_handle)
{
	if ((app_handle & HANDLE_TAG_MASK) != HANDLE_TAG)
		return NULL;
	size_t slot = app_handle & 0xffffff;
	if (slot >= phys_cap || phys_slots[slot] == NULL)
		return NULL;
	struct shim_phys *p = phys_slots[slot];
	return p->app_handle == app_handle ? p : NULL;
}

static void phys_free(struct shim_phys *p)
{
	phys_slots[p->slot] = NULL;
	shim_image_free(p->img);
	free(p);
}

/* Drops the record once the application released it and nothing maps it. */
static void phys_maybe_drop(struct shim_phys *p)
{
	if (p->app_refs == 0 && p->nmaps == 0 && !p->shim_owned) {
		stats.app_vmm_bytes -= p->size;
		stats.app_vmm_handles--;
		phys_free(p);
	}
}

void shim_alloc_after_remap(struct shim_phys *p)
{
	if (!p->shim_owned && p->app_refs == 0 && p->real != 0) {
		struct gcr_err err;
		(void)p->gpu->release(p->real, &err);
		p->real = 0;
	}
}

/* ---- devices and contexts ---- */

static void note_context(CUcontext ctx)
{
	if (ctx == NULL)
		return;
	for (size_t i = 0; i < nctxs; i++)
		if (ctxs[i] == ctx)
			return;
	if (nctxs < sizeof(ctxs) / sizeof(ctxs[0]))
		ctxs[nctxs++] = ctx;
}

/* Granularity and the access list (the device and every peer that can reach it,
 * as cuMemAlloc/hipMalloc memory is reachable by peers) of the current device. */
static struct dev_info *current_dev(const struct shim_gpu_ops *gpu, int *device_out)
{
	struct gcr_err err;
	void *ctx = NULL;
	int dev = 0;
	if (gpu->current_device(&dev, &ctx, &err) < 0 || dev < 0 || dev >= SHIM_MAX_DEVICES)
		return NULL;
	note_context(ctx);
	struct dev_info *d = &devs[dev];
	if (!d->known || d->gpu != gpu) {
		if (gpu->granularity(dev, &d->gran, &err) < 0 || d->gran == 0)
			return NULL;
		d->gpu = gpu;
		d->ctx = ctx;
		d->access[0] = (CUmemAccessDesc){ { CU_MEM_LOCATION_TYPE_DEVICE, dev },
						  CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		d->naccess = 1;
		int count = 0;
		(void)gpu->device_count(&count, &err);
		for (int peer = 0; peer < count && d->naccess < SHIM_MAX_ACCESS; peer++) {
			int can = 0;
			if (peer != dev && gpu->can_access_peer(dev, peer, &can, &err) == 0 && can)
				d->access[d->naccess++] = (CUmemAccessDesc){
					{ CU_MEM_LOCATION_TYPE_DEVICE, peer }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
		}
		d->known = 1;
	}
	*device_out = dev;
	return d;
}

size_t shim_alloc_contexts(CUcontext *out, size_t max)
{
	size_t n = nctxs < max ? nctxs : max;
	memcpy(out, ctxs, n * sizeof(*out));
	return n;
}

CUcontext shim_alloc_device_ctx(int device)
{
	if (device < 0 || device >= SHIM_MAX_DEVICES)
		return NULL;
	if (devs[device].ctx == NULL && shim_cu.cuDevicePrimaryCtxRetain != NULL) {
		CUdevice d;
		if (shim_cu.cuDeviceGet(&d, device) == CUDA_SUCCESS)
			shim_cu.cuDevicePrimaryCtxRetain(&devs[device].ctx, d);
	}
	return devs[device].ctx;
}

/* ---- converted buffers ---- */

/* The recorded access list as the operations table takes it (same layout: shim_cuda.c). */
static const struct shim_gpu_access *access_of(const CUmemAccessDesc *d)
{
	return (const struct shim_gpu_access *)(const void *)d;
}

/* Returns the vendor's status code: the failing call's, SHIM_GPU_NOT_SUPPORTED when there is
 * no device to put the buffer on (the caller falls back), SHIM_GPU_OUT_OF_MEMORY for the shim's
 * own memory. */
static int vmm_alloc(const struct shim_gpu_ops *gpu, CUdeviceptr *dptr, size_t bytes)
{
	int dev = 0;
	struct dev_info *d = current_dev(gpu, &dev);
	if (d == NULL)
		return SHIM_GPU_NOT_SUPPORTED; /* no context or no VMM: the caller falls back */
	size_t size = (bytes + d->gran - 1) / d->gran * d->gran;
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, dev } };
	shim_gpu_va va = 0;
	shim_gpu_handle h = 0;
	struct gcr_err err;
	struct shim_buf *b = calloc(1, sizeof(*b));
	struct shim_map *m = calloc(1, sizeof(*m));
	struct shim_phys *p = NULL;
	int r = SHIM_GPU_OUT_OF_MEMORY;
	if (b == NULL || m == NULL)
		goto fail;
	/* CUDA keeps its own properties (the table recreates with them); HIP builds them. */
	if (gpu->reserve(&va, size, 0, &err) < 0) {
		r = shim_gpu_last_code();
		goto fail;
	}
	if (gpu->create(&h, size, dev, gpu == &shim_cuda_ops ? &prop : NULL, &err) < 0) {
		r = shim_gpu_last_code();
		goto fail_va;
	}
	if (gpu->map(va, size, 0, h, &err) < 0) {
		r = shim_gpu_last_code();
		goto fail_h;
	}
	if (gpu->set_access(va, size, access_of(d->access), (size_t)d->naccess, &err) < 0) {
		r = shim_gpu_last_code();
		goto fail_map;
	}
	p = phys_new(gpu, h, size, &prop, 1);
	r = SHIM_GPU_OUT_OF_MEMORY;
	if (p == NULL)
		goto fail_map;
	*m = (struct shim_map){ .va = va, .size = size, .offset = 0, .phys = p, .ndesc = d->naccess };
	memcpy(m->desc, d->access, sizeof(m->desc));
	*b = (struct shim_buf){ .va = va, .req = bytes, .size = size, .phys = p, .map = m };
	if (vec_insert(&maps, m) < 0)
		goto fail_phys;
	if (vec_insert(&bufs, b) < 0) {
		vec_remove(&maps, m);
		goto fail_phys;
	}
	p->nmaps = 1;
	stats.vmm_bytes += size;
	stats.vmm_buffers++;
	stats.converted_total++;
	*dptr = va;
	shim_staging_note_bytes(stats.vmm_bytes + stats.app_vmm_bytes, gpu, d->ctx);
	return 0;
fail_phys:
	phys_free(p);
fail_map:
	(void)gpu->unmap(va, size, &err);
fail_h:
	(void)gpu->release(h, &err);
fail_va:
	(void)gpu->free_va(va, size, &err);
fail:
	free(b);
	free(m);
	return r;
}

static void vmm_free(struct shim_buf *b)
{
	struct shim_phys *p = b->phys;
	const struct shim_gpu_ops *gpu = p->gpu;
	struct gcr_err err;
	if (p->real != 0) {
		(void)gpu->unmap(b->va, b->size, &err);
		(void)gpu->release(p->real, &err);
	}
	(void)gpu->free_va(b->va, b->size, &err);
	vec_remove(&maps, b->map);
	vec_remove(&bufs, b);
	stats.vmm_bytes -= b->size;
	stats.vmm_buffers--;
	free(b->map);
	phys_free(p);
	free(b);
}

static void drv_track(CUdeviceptr va, size_t size, int kind)
{
	struct shim_drv *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return; /* only statistics are lost; managed detection errs on the safe side below */
	*d = (struct shim_drv){ .va = va, .size = size, .kind = kind };
	if (vec_insert(&drvs, d) < 0) {
		free(d);
		return;
	}
	CUcontext ctx = NULL;
	if (shim_cu.cuCtxGetCurrent != NULL && shim_cu.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS)
		note_context(ctx);
	uint64_t *bytes = kind == DRV_MANAGED ? &stats.managed_bytes
			  : kind == DRV_ASYNC ? &stats.async_bytes : &stats.driver_bytes;
	uint64_t *count = kind == DRV_MANAGED ? &stats.managed_buffers
			  : kind == DRV_ASYNC ? &stats.async_buffers : &stats.driver_buffers;
	*bytes += size;
	(*count)++;
}

static void drv_untrack(struct shim_drv *d)
{
	uint64_t *bytes = d->kind == DRV_MANAGED ? &stats.managed_bytes
			  : d->kind == DRV_ASYNC ? &stats.async_bytes : &stats.driver_bytes;
	uint64_t *count = d->kind == DRV_MANAGED ? &stats.managed_buffers
			  : d->kind == DRV_ASYNC ? &stats.async_buffers : &stats.driver_buffers;
	*bytes -= d->size;
	(*count)--;
	vec_remove(&drvs, d);
	free(d);
}

/* ---- interposed entry points ---- */

#define ENTER(sym, v) struct shim_thread *gate_t = shim_gate_enter(SHIM_HOOK_##sym, (v))
#define LEAVE() shim_gate_exit(gate_t)
#define REAL_OR_FAIL(fn, sym, v)                      \
	__typeof__(&sym) fn = SHIM_REAL(sym, v);      \
	if (fn == NULL)                               \
		return CUDA_ERROR_NOT_FOUND

SHIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	REAL_OR_FAIL(real, cuMemAlloc_v2, 0);
	if (dptr == NULL)
		return real(dptr, bytesize);
	ENTER(cuMemAlloc_v2, 0);
	pthread_mutex_lock(&shim_alloc_lock);
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	if (shim_cfg.vmm && bytesize >= shim_cfg.vmm_min_bytes)
		r = (CUresult)vmm_alloc(&shim_cuda_ops, dptr, bytesize);
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		if (shim_cfg.vmm && bytesize >= shim_cfg.vmm_min_bytes)
			stats.fallback_total++;
		r = real(dptr, bytesize);
		if (r == CUDA_SUCCESS)
			drv_track(*dptr, bytesize, DRV_PLAIN);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

/* Pitch as the driver picks it for these devices; any pitch >= width is valid
 * for a program that uses the returned value. */
#define SHIM_PITCH_ALIGN 512

SHIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
					size_t Height, unsigned int ElementSizeBytes)
{
	REAL_OR_FAIL(real, cuMemAllocPitch_v2, 0);
	if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0 ||
	    (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
		return real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	ENTER(cuMemAllocPitch_v2, 0);
	size_t pitch = (WidthInBytes + SHIM_PITCH_ALIGN - 1) / SHIM_PITCH_ALIGN * SHIM_PITCH_ALIGN;
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&shim_alloc_lock);
	if (shim_cfg.vmm && Height <= SIZE_MAX / pitch && pitch * Height >= shim_cfg.vmm_min_bytes) {
		r = (CUresult)vmm_alloc(&shim_cuda_ops, dptr, pitch * Height);
		if (r == CUDA_SUCCESS)
			*pPitch = pitch;
	}
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		r = real(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
		if (r == CUDA_SUCCESS)
			drv_track(*dptr, *pPitch * Height, DRV_PLAIN);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	REAL_OR_FAIL(real, cuMemFree_v2, 0);
	ENTER(cuMemFree_v2, 0);
	CUresult r;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_buf *b = dptr ? vec_find(&bufs, dptr) : NULL;
	if (b != NULL) {
		/* cuMemFree synchronises before releasing; keep that for converted memory. */
		shim_cu.cuCtxSynchronize();
		vmm_free(b);
		r = CUDA_SUCCESS;
	} else {
		r = real(dptr);
		struct shim_drv *d = dptr ? vec_find(&drvs, dptr) : NULL;
		if (r == CUDA_SUCCESS && d != NULL)
			drv_untrack(d);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	REAL_OR_FAIL(real, cuMemAllocManaged, 0);
	ENTER(cuMemAllocManaged, 0);
	CUresult r = real(dptr, bytesize, flags);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&shim_alloc_lock);
		drv_track(*dptr, bytesize, DRV_MANAGED);
		pthread_mutex_unlock(&shim_alloc_lock);
	}
	LEAVE();
	return r;
}

/* Stream-ordered allocations stay in the driver's pools (the driver checkpoints
 * them); they are counted so statistics show the bytes on that path. */
static CUresult async_alloc(enum shim_hook_id id, int v, CUresult r, CUdeviceptr *dptr, size_t bytes)
{
	(void)id;
	(void)v;
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&shim_alloc_lock);
		drv_track(*dptr, bytes, DRV_ASYNC);
		pthread_mutex_unlock(&shim_alloc_lock);
	}
	return r;
}

#define SHIM_ASYNC_ALLOC(name, v)                                                        \
	SHIM_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)  \
	{                                                                                \
		REAL_OR_FAIL(real, cuMemAllocAsync, v);                                  \
		ENTER(cuMemAllocAsync, v);                                               \
		CUresult r = async_alloc(SHIM_HOOK_cuMemAllocAsync, v,                   \
					 real(dptr, bytesize, hStream), dptr, bytesize); \
		LEAVE();                                                                 \
		return r;                                                                \
	}
SHIM_ASYNC_ALLOC(cuMemAllocAsync, 0)
SHIM_ASYNC_ALLOC(cuMemAllocAsync_ptsz, 1)

#define SHIM_POOL_ALLOC(name, v)                                                               \
	SHIM_EXPORT CUresult name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,       \
				  CUstream hStream)                                            \
	{                                                                                      \
		REAL_OR_FAIL(real, cuMemAllocFromPoolAsync, v);                                \
		ENTER(cuMemAllocFromPoolAsync, v);                                             \
		CUresult r = async_alloc(SHIM_HOOK_cuMemAllocFromPoolAsync, v,                 \
					 real(dptr, bytesize, pool, hStream), dptr, bytesize); \
		LEAVE();                                                                       \
		return r;                                                                      \
	}
SHIM_POOL_ALLOC(cuMemAllocFromPoolAsync, 0)
SHIM_POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz, 1)

#define SHIM_ASYNC_FREE(name, v)                                             \
	SHIM_EXPORT CUresult name(CUdeviceptr dptr, CUstream hStream)        \
	{                                                                    \
		REAL_OR_FAIL(real, cuMemFreeAsync, v);                       \
		ENTER(cuMemFreeAsync, v);                                    \
		CUresult r = real(dptr, hStream);                            \
		if (r == CUDA_SUCCESS) {                                     \
			pthread_mutex_lock(&shim_alloc_lock);                \
			struct shim_drv *d = vec_find(&drvs, dptr);          \
			if (d != NULL)                                       \
				drv_untrack(d);                              \
			pthread_mutex_unlock(&shim_alloc_lock);              \
		}                                                            \
		LEAVE();                                                     \
		return r;                                                    \
	}
SHIM_ASYNC_FREE(cuMemFreeAsync, 0)
SHIM_ASYNC_FREE(cuMemFreeAsync_ptsz, 1)

SHIM_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	REAL_OR_FAIL(real, cuMemGetAddressRange_v2, 0);
	pthread_mutex_lock(&shim_alloc_lock);
	size_t i = vec_lower(&bufs, dptr + 1);
	struct shim_buf *b = i > 0 ? bufs.v[i - 1] : NULL;
	int hit = b != NULL && dptr >= b->va && dptr < b->va + b->req;
	if (hit) {
		if (pbase != NULL)
			*pbase = b->va;
		if (psize != NULL)
			*psize = b->req; /* what cuMemAlloc was asked for, as the driver reports */
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return hit ? CUDA_SUCCESS : real(pbase, psize, dptr);
}

/* ---- the application's own virtual-memory allocations ---- */

SHIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				 const CUmemAllocationProp *prop, unsigned long long flags)
{
	REAL_OR_FAIL(real, cuMemCreate, 0);
	if (handle == NULL || prop == NULL)
		return real(handle, size, prop, flags);
	ENTER(cuMemCreate, 0);
	CUmemGenericAllocationHandle h = 0;
	CUresult r = real(&h, size, prop, flags);
	if (r == CUDA_SUCCESS) {
		pthread_mutex_lock(&shim_alloc_lock);
		struct shim_phys *p = phys_new(&shim_cuda_ops, h, size, prop, 0);
		if (p == NULL) {
			SHIM_REAL(cuMemRelease, 0)(h);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*handle = p->app_handle;
			stats.app_vmm_bytes += size;
			stats.app_vmm_handles++;
			if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
			    prop->location.id >= 0 && prop->location.id < SHIM_MAX_DEVICES) {
				CUcontext ctx = NULL;
				shim_cu.cuCtxGetCurrent(&ctx);
				note_context(ctx);
				if (devs[prop->location.id].ctx == NULL && ctx != NULL) {
					CUdevice cur;
					if (shim_cu.cuCtxGetDevice(&cur) == CUDA_SUCCESS && cur == prop->location.id)
						devs[cur].ctx = ctx;
				}
				shim_staging_note_bytes(stats.vmm_bytes + stats.app_vmm_bytes, &shim_cuda_ops,
							devs[prop->location.id].ctx);
			}
		}
		pthread_mutex_unlock(&shim_alloc_lock);
	}
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	REAL_OR_FAIL(real, cuMemRelease, 0);
	ENTER(cuMemRelease, 0);
	CUresult r;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(handle);
	if (p == NULL) {
		r = real(handle);
	} else if (p->app_refs <= 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		r = CUDA_SUCCESS;
		if (--p->app_refs == 0) {
			/* The driver keeps mapped memory alive until its last unmap. */
			if (p->real != 0)
				r = real(p->real);
			if (r == CUDA_SUCCESS)
				p->real = 0;
			else
				p->app_refs++;
			if (r == CUDA_SUCCESS)
				phys_maybe_drop(p);
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	REAL_OR_FAIL(real, cuMemMap, 0);
	ENTER(cuMemMap, 0);
	CUresult r;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(handle);
	if (p == NULL) {
		r = real(ptr, size, offset, handle, flags);
	} else if (p->real == 0 || p->app_refs == 0) {
		r = CUDA_ERROR_INVALID_VALUE; /* mapping a released handle is invalid */
	} else {
		struct shim_map *m = calloc(1, sizeof(*m));
		r = m ? real(ptr, size, offset, p->real, flags) : CUDA_ERROR_OUT_OF_MEMORY;
		if (r == CUDA_SUCCESS) {
			*m = (struct shim_map){ .va = ptr, .size = size, .offset = offset, .phys = p };
			if (vec_insert(&maps, m) < 0) {
				SHIM_REAL(cuMemUnmap, 0)(ptr, size);
				free(m);
				r = CUDA_ERROR_OUT_OF_MEMORY;
			} else {
				p->nmaps++;
			}
		} else {
			free(m);
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

/* The application unmapped [va, va + size): its mappings there leave the table
 * (the shim's own mappings of converted buffers stay). Lock held. */
static void unmapped_locked(uint64_t va, size_t size)
{
	size_t i = vec_lower(&maps, va);
	while (i < maps.n && key_of(maps.v[i]) < va + size) {
		struct shim_map *m = maps.v[i];
		if (m->phys->shim_owned) {
			i++;
			continue;
		}
		memmove(&maps.v[i], &maps.v[i + 1], (maps.n - i - 1) * sizeof(*maps.v));
		maps.n--;
		m->phys->nmaps--;
		phys_maybe_drop(m->phys);
		free(m);
	}
}

SHIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	REAL_OR_FAIL(real, cuMemUnmap, 0);
	ENTER(cuMemUnmap, 0);
	pthread_mutex_lock(&shim_alloc_lock); /* the unmap and the table change as one */
	CUresult r = real(ptr, size);
	if (r == CUDA_SUCCESS)
		unmapped_locked(ptr, size);
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				    size_t count)
{
	REAL_OR_FAIL(real, cuMemSetAccess, 0);
	ENTER(cuMemSetAccess, 0);
	pthread_mutex_lock(&shim_alloc_lock);
	CUresult r = real(ptr, size, desc, count);
	if (r == CUDA_SUCCESS && desc != NULL) {
		/* Remember the last access per device for each mapping in the range, to
		 * apply the same at resume. */
		for (size_t i = vec_lower(&maps, ptr); i < maps.n && key_of(maps.v[i]) < ptr + size; i++) {
			struct shim_map *m = maps.v[i];
			for (size_t k = 0; k < count; k++) {
				int j = 0;
				while (j < m->ndesc && (m->desc[j].location.type != desc[k].location.type ||
							m->desc[j].location.id != desc[k].location.id))
					j++;
				if (j == m->ndesc && m->ndesc < SHIM_MAX_ACCESS)
					m->ndesc++;
				if (j < m->ndesc)
					m->desc[j] = desc[k];
			}
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	LEAVE();
	return r;
}

SHIM_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	REAL_OR_FAIL(real, cuMemRetainAllocationHandle, 0);
	CUdeviceptr a = (CUdeviceptr)(uintptr_t)addr;
	pthread_mutex_lock(&shim_alloc_lock);
	size_t i = vec_lower(&maps, a + 1);
	struct shim_map *m = i > 0 ? maps.v[i - 1] : NULL;
	int hit = handle != NULL && m != NULL && a >= m->va && a < m->va + m->size &&
		  !m->phys->shim_owned;
	if (hit) {
		/* The record counts application references itself; the driver's single
		 * reference is released when the count drops to zero. */
		if (m->phys->app_refs == 0 && m->phys->real != 0)
			hit = 0; /* released by the app but mapped: let the driver answer */
		else {
			m->phys->app_refs++;
			*handle = m->phys->app_handle;
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return hit ? CUDA_SUCCESS : real(handle, addr);
}

SHIM_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							    CUmemGenericAllocationHandle handle)
{
	REAL_OR_FAIL(real, cuMemGetAllocationPropertiesFromHandle, 0);
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(handle);
	if (p != NULL && prop != NULL)
		*prop = p->prop;
	pthread_mutex_unlock(&shim_alloc_lock);
	return p != NULL ? (prop ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE) : real(prop, handle);
}

/* Memory shared with another process cannot move: re-created memory would no
 * longer be shared. Such handles make suspend refuse, with the reason. */
SHIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
						  CUmemGenericAllocationHandle handle,
						  CUmemAllocationHandleType handleType,
						  unsigned long long flags)
{
	REAL_OR_FAIL(real, cuMemExportToShareableHandle, 0);
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(handle);
	CUresult r;
	if (p != NULL && p->real == 0) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else {
		r = real(shareableHandle, p ? p->real : handle, handleType, flags);
		if (r == CUDA_SUCCESS && p != NULL && !p->shared) {
			p->shared = 1;
			stats.shared_handles++;
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return r;
}

SHIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						    CUmemAllocationHandleType shHandleType)
{
	REAL_OR_FAIL(real, cuMemImportFromShareableHandle, 0);
	if (handle == NULL)
		return real(handle, osHandle, shHandleType);
	CUmemGenericAllocationHandle h = 0;
	CUresult r = real(&h, osHandle, shHandleType);
	if (r != CUDA_SUCCESS)
		return r;
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	size_t size = 0;
	SHIM_REAL(cuMemGetAllocationPropertiesFromHandle, 0)(&prop, h);
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_new(&shim_cuda_ops, h, size, &prop, 0);
	if (p == NULL) {
		SHIM_REAL(cuMemRelease, 0)(h);
		r = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		p->shared = 1;
		stats.shared_handles++;
		stats.app_vmm_handles++;
		*handle = p->app_handle;
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return r;
}

/* ---- views for suspend/resume and statistics ---- */

void shim_alloc_stats(struct shim_alloc_stats *st)
{
	pthread_mutex_lock(&shim_alloc_lock);
	*st = stats;
	pthread_mutex_unlock(&shim_alloc_lock);
}

size_t shim_alloc_nphys(void)
{
	return phys_cap;
}

struct shim_phys *shim_alloc_phys_at(size_t i)
{
	return i < phys_cap ? phys_slots[i] : NULL;
}

size_t shim_alloc_nmaps(void)
{
	return maps.n;
}

struct shim_map *shim_alloc_map_at(size_t i)
{
	return i < maps.n ? maps.v[i] : NULL;
}

int shim_alloc_check_movable(struct gcr_err *err)
{
	if (stats.managed_buffers > 0)
		return gcr_err_set(err, -ENOTSUP,
				   "managed (UVM) memory in use (%llu bytes in %llu allocations); "
				   "the driver cannot checkpoint it",
				   (unsigned long long)stats.managed_bytes,
				   (unsigned long long)stats.managed_buffers);
	for (size_t i = 0; i < phys_cap; i++)
		if (phys_slots[i] != NULL && phys_slots[i]->shared)
			return gcr_err_set(err, -ENOTSUP,
					   "GPU memory shared with another process (exported or imported "
					   "handle) cannot be moved");
	return 0;
}

/* ---- the same table operations for another vendor's wrappers (shim_hip_alloc.c) ---- */

int shim_alloc_buf_new(const struct shim_gpu_ops *gpu, uint64_t *va, size_t bytes)
{
	CUdeviceptr p = 0;
	pthread_mutex_lock(&shim_alloc_lock);
	int r = vmm_alloc(gpu, &p, bytes);
	if (r == SHIM_GPU_NOT_SUPPORTED)
		stats.fallback_total++;
	pthread_mutex_unlock(&shim_alloc_lock);
	if (r == 0)
		*va = p;
	return r;
}

int shim_alloc_buf_free(const struct shim_gpu_ops *gpu, uint64_t va, int *ours)
{
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_buf *b = va ? vec_find(&bufs, va) : NULL;
	*ours = b != NULL;
	if (b != NULL) {
		struct gcr_err err;
		(void)gpu->device_sync(b->phys->prop.location.id, &err);
		vmm_free(b);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return 0;
}

void shim_alloc_note(uint64_t va, size_t size, enum shim_alloc_kind kind)
{
	pthread_mutex_lock(&shim_alloc_lock);
	drv_track(va, size, kind == SHIM_ALLOC_MANAGED ? DRV_MANAGED : kind == SHIM_ALLOC_ASYNC ? DRV_ASYNC : DRV_PLAIN);
	pthread_mutex_unlock(&shim_alloc_lock);
}

void shim_alloc_forget(uint64_t va)
{
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_drv *d = va ? vec_find(&drvs, va) : NULL;
	if (d != NULL)
		drv_untrack(d);
	pthread_mutex_unlock(&shim_alloc_lock);
}

int shim_alloc_handle_new(const struct shim_gpu_ops *gpu, uint64_t real, size_t size, int device,
			  uint64_t *app_handle)
{
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, device } };
	int r = 0;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_new(gpu, real, size, &prop, 0);
	if (p == NULL) {
		r = SHIM_GPU_OUT_OF_MEMORY;
	} else {
		*app_handle = p->app_handle;
		stats.app_vmm_bytes += size;
		stats.app_vmm_handles++;
		shim_staging_note_bytes(stats.vmm_bytes + stats.app_vmm_bytes, gpu, NULL);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return r;
}

/* As cuMemRelease above: the table counts the application's references; the runtime's one
 * reference goes when they reach zero (the runtime keeps mapped memory until its last unmap). */
int shim_alloc_handle_release(const struct shim_gpu_ops *gpu, uint64_t h, int *ours)
{
	int r = 0;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(h);
	*ours = p != NULL;
	if (p == NULL) {
	} else if (p->app_refs <= 0) {
		r = CUDA_ERROR_INVALID_VALUE; /* hipErrorInvalidValue has the same value */
	} else if (--p->app_refs == 0) {
		struct gcr_err err;
		if (p->real != 0 && gpu->release(p->real, &err) < 0)
			r = shim_gpu_last_code();
		if (r == 0) {
			p->real = 0;
			phys_maybe_drop(p);
		} else {
			p->app_refs++;
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return r;
}

int shim_alloc_handle_map(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, size_t offset,
			  uint64_t h, int *ours)
{
	int r = 0;
	pthread_mutex_lock(&shim_alloc_lock);
	struct shim_phys *p = phys_lookup(h);
	*ours = p != NULL;
	if (p == NULL) {
	} else if (p->real == 0 || p->app_refs == 0) {
		r = CUDA_ERROR_INVALID_VALUE; /* mapping a released handle is invalid */
	} else {
		struct gcr_err err;
		struct shim_map *m = calloc(1, sizeof(*m));
		if (m == NULL)
			r = SHIM_GPU_OUT_OF_MEMORY;
		else if (gpu->map(va, size, offset, p->real, &err) < 0)
			r = shim_gpu_last_code();
		if (r == 0) {
			*m = (struct shim_map){ .va = va, .size = size, .offset = offset, .phys = p };
			if (vec_insert(&maps, m) < 0) {
				(void)gpu->unmap(va, size, &err);
				r = SHIM_GPU_OUT_OF_MEMORY;
			} else {
				p->nmaps++;
				m = NULL;
			}
		}
		free(m);
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	return r;
}

void shim_alloc_unmapped(uint64_t va, size_t size)
{
	pthread_mutex_lock(&shim_alloc_lock);
	unmapped_locked(va, size);
	pthread_mutex_unlock(&shim_alloc_lock);
}

void shim_alloc_access_set(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n)
{
	pthread_mutex_lock(&shim_alloc_lock);
	for (size_t i = vec_lower(&maps, va); acc != NULL && i < maps.n && key_of(maps.v[i]) < va + size; i++) {
		struct shim_map *m = maps.v[i];
		for (size_t k = 0; k < n; k++) {
			int j = 0;
			while (j < m->ndesc && ((int)m->desc[j].location.type != acc[k].type ||
						m->desc[j].location.id != acc[k].id))
				j++;
			if (j == m->ndesc && m->ndesc < SHIM_MAX_ACCESS)
				m->ndesc++;
			if (j < m->ndesc)
				m->desc[j] = (CUmemAccessDesc){ { (CUmemLocationType)acc[k].type, acc[k].id },
								(CUmemAccess_flags)acc[k].flags };
		}
	}
	pthread_mutex_unlock(&shim_alloc_lock);
}

int shim_alloc_other_vendor(const struct shim_gpu_ops *gpu)
{
	for (size_t i = 0; i < phys_cap; i++)
		if (phys_slots[i] != NULL && phys_slots[i]->gpu != gpu)
			return 1;
	return 0;
}
