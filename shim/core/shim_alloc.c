/* shim_alloc: the allocation table behind both vendors' entry points (shim_cuda_alloc.c,
 * shim_hip_alloc.c) and suspend/resume (shim_cr). The application sees the same addresses and
 * handle values across suspend and resume. One lock, private to this file, guards everything;
 * each public function takes it. */
#include "shim_alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim_staging.h"

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;

/* Handles the application gets are ours: tag in the high bits, then generation
 * and slot, so a stale or foreign value is recognised and never aliases a live one. */
#define HANDLE_TAG 0x6763720000000000ULL /* "gcr" */
#define HANDLE_TAG_MASK 0xffffff0000000000ULL

/* A vector of pointers to structs whose first member is their shim_gpu_va key,
 * kept sorted so lookups by address are binary searches. */
struct ptrvec {
	void **v;
	size_t n, cap;
};

struct shim_buf {
	shim_gpu_va va; /* first: sorted-vector key */
	size_t req;     /* bytes the application asked for */
	size_t size;    /* reserved and mapped (granularity multiple) */
	struct shim_phys *phys;
	struct shim_map *map;
	int pool_seg; /* a segment of shim_pool: not an application buffer */
};

struct shim_drv {
	shim_gpu_va va; /* first: sorted-vector key */
	size_t size;
	enum { DRV_PLAIN, DRV_ASYNC, DRV_MANAGED } kind;
};

struct dev_info {
	int known;
	const struct shim_gpu_ops *gpu; /* the vendor gran and access were read from */
	size_t gran;
	int naccess;
	struct shim_gpu_access access[SHIM_MAX_ACCESS];
};

static struct shim_phys **phys_slots;
static size_t phys_cap;
static struct ptrvec maps, bufs, drvs;
static struct dev_info devs[SHIM_MAX_DEVICES];
static struct shim_alloc_stats stats;

static shim_gpu_va key_of(const void *p)
{
	return *(const shim_gpu_va *)p;
}

/* Index of the first element with key >= va. */
static size_t vec_lower(const struct ptrvec *pv, shim_gpu_va va)
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

static void *vec_find(const struct ptrvec *pv, shim_gpu_va va)
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

/* prop: the vendor's properties to keep (used only where it has SHIM_GPU_CAP_CREATE_PROP), or
 * NULL: pinned memory on device. */
static struct shim_phys *phys_new(const struct shim_gpu_ops *gpu, shim_gpu_handle real, size_t size,
				  int device, const void *prop, int shim_owned)
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
	p->device = device >= 0 ? device : 0;
	if ((gpu->caps & SHIM_GPU_CAP_CREATE_PROP) && prop != NULL) {
		memcpy(&p->prop, prop, gpu->prop_size < sizeof(p->prop) ? gpu->prop_size : sizeof(p->prop));
		p->has_prop = 1;
	}
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
	shim_chunks_free(p->chunks);
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

/* ---- devices ---- */

/* Granularity and the access list (the device and every peer that can reach it,
 * as cuMemAlloc/hipMalloc memory is reachable by peers) of the current device. */
static struct dev_info *current_dev(const struct shim_gpu_ops *gpu, int *device_out, void **ctx_out)
{
	struct gcr_err err;
	void *ctx = NULL;
	int dev = 0;
	if (gpu->current_device(&dev, &ctx, &err) < 0 || dev < 0 || dev >= SHIM_MAX_DEVICES)
		return NULL;
	*ctx_out = gpu->ctx_note != NULL ? gpu->ctx_note(dev, ctx) : NULL;
	struct dev_info *d = &devs[dev];
	if (!d->known || d->gpu != gpu) {
		if (gpu->granularity(dev, &d->gran, &err) < 0 || d->gran == 0)
			return NULL;
		d->gpu = gpu;
		d->access[0] = (struct shim_gpu_access){ SHIM_GPU_LOC_DEVICE, dev, SHIM_GPU_PROT_READWRITE };
		d->naccess = 1;
		int count = 0;
		(void)gpu->device_count(&count, &err);
		for (int peer = 0; peer < count && d->naccess < SHIM_MAX_ACCESS; peer++) {
			int can = 0;
			if (peer != dev && gpu->can_access_peer(dev, peer, &can, &err) == 0 && can)
				d->access[d->naccess++] =
					(struct shim_gpu_access){ SHIM_GPU_LOC_DEVICE, peer, SHIM_GPU_PROT_READWRITE };
		}
		d->known = 1;
	}
	*device_out = dev;
	return d;
}

/* ---- converted buffers ---- */

/* Returns the vendor's status code: the failing call's, SHIM_GPU_NOT_SUPPORTED when there is
 * no device to put the buffer on (the caller falls back), SHIM_GPU_OUT_OF_MEMORY for the shim's
 * own memory. */
static int vmm_alloc_on(const struct shim_gpu_ops *gpu, shim_gpu_va *dptr, size_t bytes, int dev,
			struct dev_info *d, void *dctx, const struct shim_gpu_access *acc, size_t nacc,
			int pool_seg)
{
	size_t size = (bytes + d->gran - 1) / d->gran * d->gran;
	shim_gpu_va va = 0;
	shim_gpu_handle h = 0;
	struct gcr_err err;
	struct shim_buf *b = calloc(1, sizeof(*b));
	struct shim_map *m = calloc(1, sizeof(*m));
	struct shim_phys *p = NULL;
	int r = SHIM_GPU_OUT_OF_MEMORY;
	if (b == NULL || m == NULL)
		goto fail;
	if (gpu->reserve(&va, size, 0, &err) < 0) {
		r = gpu->last_code();
		goto fail;
	}
	/* Pinned memory on dev, as the table recreates it (no properties recorded). */
	if (gpu->create(&h, size, dev, NULL, &err) < 0) {
		r = gpu->last_code();
		goto fail_va;
	}
	if (gpu->map(va, size, 0, h, &err) < 0) {
		r = gpu->last_code();
		goto fail_h;
	}
	if (acc == NULL || nacc == 0) {
		acc = d->access;
		nacc = (size_t)d->naccess;
	}
	if (nacc > SHIM_MAX_ACCESS)
		nacc = SHIM_MAX_ACCESS;
	if (gpu->set_access(va, size, acc, nacc, &err) < 0) {
		r = gpu->last_code();
		goto fail_map;
	}
	p = phys_new(gpu, h, size, dev, NULL, 1);
	r = SHIM_GPU_OUT_OF_MEMORY;
	if (p == NULL)
		goto fail_map;
	*m = (struct shim_map){ .va = va, .size = size, .offset = 0, .phys = p, .ndesc = (int)nacc };
	memcpy(m->desc, acc, nacc * sizeof(m->desc[0]));
	*b = (struct shim_buf){ .va = va, .req = bytes, .size = size, .phys = p, .map = m, .pool_seg = pool_seg };
	if (vec_insert(&maps, m) < 0)
		goto fail_phys;
	if (vec_insert(&bufs, b) < 0) {
		vec_remove(&maps, m);
		goto fail_phys;
	}
	p->nmaps = 1;
	if (pool_seg) {
		stats.pool_seg_bytes += size;
		stats.pool_segs++;
	} else {
		stats.vmm_bytes += size;
		stats.vmm_buffers++;
		stats.converted_total++;
	}
	*dptr = va;
	shim_staging_note_bytes(stats.vmm_bytes + stats.app_vmm_bytes + stats.pool_seg_bytes, dev, gpu, dctx);
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

static int vmm_alloc(const struct shim_gpu_ops *gpu, shim_gpu_va *dptr, size_t bytes)
{
	int dev = 0;
	void *dctx = NULL;
	struct dev_info *d = current_dev(gpu, &dev, &dctx);
	if (d == NULL)
		return SHIM_GPU_NOT_SUPPORTED; /* no context or no VMM: the caller falls back */
	return vmm_alloc_on(gpu, dptr, bytes, dev, d, dctx, NULL, 0, 0);
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
	if (b->pool_seg) {
		stats.pool_seg_bytes -= b->size;
		stats.pool_segs--;
	} else {
		stats.vmm_bytes -= b->size;
		stats.vmm_buffers--;
	}
	free(b->map);
	phys_free(p);
	free(b);
}

static void drv_track(const struct shim_gpu_ops *gpu, shim_gpu_va va, size_t size, int kind)
{
	struct shim_drv *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return; /* only statistics are lost; managed detection errs on the safe side below */
	*d = (struct shim_drv){ .va = va, .size = size, .kind = kind };
	if (vec_insert(&drvs, d) < 0) {
		free(d);
		return;
	}
	if (gpu->ctx_note != NULL)
		(void)gpu->ctx_note(-1, NULL); /* its context is waited for at suspend */
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

/* Remembers the last access per device for each mapping in the range, to apply the same at
 * resume. Lock held. */
static void access_locked(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n)
{
	for (size_t i = vec_lower(&maps, va); acc != NULL && i < maps.n && key_of(maps.v[i]) < va + size; i++) {
		struct shim_map *m = maps.v[i];
		for (size_t k = 0; k < n; k++) {
			int j = 0;
			while (j < m->ndesc && (m->desc[j].type != acc[k].type || m->desc[j].id != acc[k].id))
				j++;
			if (j == m->ndesc && m->ndesc < SHIM_MAX_ACCESS)
				m->ndesc++;
			if (j < m->ndesc)
				m->desc[j] = acc[k];
		}
	}
}

/* The mapping at or before va that contains it, or NULL. Lock held. */
static struct shim_map *map_containing(uint64_t va)
{
	size_t i = vec_lower(&maps, va + 1);
	struct shim_map *m = i > 0 ? maps.v[i - 1] : NULL;
	return m != NULL && va >= m->va && va < m->va + m->size ? m : NULL;
}

/* ---- statistics ---- */

void shim_alloc_stats(struct shim_alloc_stats *st)
{
	pthread_mutex_lock(&table_lock);
	*st = stats;
	pthread_mutex_unlock(&table_lock);
}

/* ---- the vendors' entry points ---- */

int shim_alloc_buf_new(const struct shim_gpu_ops *gpu, uint64_t *va, size_t bytes)
{
	shim_gpu_va p = 0;
	pthread_mutex_lock(&table_lock);
	int r = vmm_alloc(gpu, &p, bytes);
	if (r == SHIM_GPU_NOT_SUPPORTED)
		stats.fallback_total++;
	pthread_mutex_unlock(&table_lock);
	if (r == 0)
		*va = p;
	return r;
}

int shim_alloc_buf_free(const struct shim_gpu_ops *gpu, uint64_t va, int *ours)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	struct shim_buf *b = va ? vec_find(&bufs, va) : NULL;
	if (b != NULL && b->pool_seg)
		b = NULL; /* the arena's: not the application's to free */
	*ours = b != NULL;
	if (b != NULL) {
		/* The runtime's free synchronises before releasing; kept for converted memory. */
		struct gcr_err err;
		(void)gpu->device_sync(b->phys->device, &err);
		vmm_free(b);
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_buf_range(uint64_t va, uint64_t *base, size_t *req)
{
	pthread_mutex_lock(&table_lock);
	size_t i = vec_lower(&bufs, va + 1);
	struct shim_buf *b = i > 0 ? bufs.v[i - 1] : NULL;
	int hit = b != NULL && !b->pool_seg && va >= b->va && va < b->va + b->req;
	if (hit) {
		if (base != NULL)
			*base = b->va;
		if (req != NULL)
			*req = b->req;
	}
	pthread_mutex_unlock(&table_lock);
	return hit;
}

int shim_alloc_seg_new(const struct shim_gpu_ops *gpu, int device, size_t size,
		       const struct shim_gpu_access *acc, size_t n, uint64_t *va)
{
	struct gcr_err err;
	int r = -ENODEV;
	pthread_mutex_lock(&table_lock);
	if (device >= 0 && device < SHIM_MAX_DEVICES) {
		struct dev_info *d = &devs[device];
		void *ctx = gpu->ctx_note != NULL ? gpu->ctx_note(device, NULL) : NULL;
		if (!d->known || d->gpu != gpu) {
			/* The device's access list is read as for a converted buffer on it. */
			int cur = -1;
			void *cctx = NULL;
			(void)gpu->current_device(&cur, &cctx, &err);
			if (cur == device)
				(void)current_dev(gpu, &cur, &cctx);
		}
		if (!d->known && gpu->granularity(device, &d->gran, &err) == 0 && d->gran != 0) {
			d->gpu = gpu;
			d->access[0] = (struct shim_gpu_access){ SHIM_GPU_LOC_DEVICE, device, SHIM_GPU_PROT_READWRITE };
			d->naccess = 1;
			d->known = 1;
		}
		shim_gpu_va p = 0;
		r = d->known ? vmm_alloc_on(gpu, &p, size, device, d, ctx, acc, n, 1) : SHIM_GPU_NOT_SUPPORTED;
		if (r == 0)
			*va = p;
		else
			r = r == SHIM_GPU_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

void shim_alloc_seg_free(uint64_t va)
{
	pthread_mutex_lock(&table_lock);
	struct shim_buf *b = va ? vec_find(&bufs, va) : NULL;
	if (b != NULL && b->pool_seg)
		vmm_free(b);
	pthread_mutex_unlock(&table_lock);
}

void shim_alloc_shared_pool(int delta)
{
	pthread_mutex_lock(&table_lock);
	stats.shared_pools += (uint64_t)(int64_t)delta;
	pthread_mutex_unlock(&table_lock);
}

void shim_alloc_note(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, enum shim_alloc_kind kind)
{
	pthread_mutex_lock(&table_lock);
	drv_track(gpu, va, size, kind == SHIM_ALLOC_MANAGED ? DRV_MANAGED : kind == SHIM_ALLOC_ASYNC ? DRV_ASYNC : DRV_PLAIN);
	pthread_mutex_unlock(&table_lock);
}

void shim_alloc_forget(uint64_t va)
{
	pthread_mutex_lock(&table_lock);
	struct shim_drv *d = va ? vec_find(&drvs, va) : NULL;
	if (d != NULL)
		drv_untrack(d);
	pthread_mutex_unlock(&table_lock);
}

int shim_alloc_handle_new(const struct shim_gpu_ops *gpu, uint64_t real, size_t size, int device,
			  const void *prop, uint64_t *app_handle)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_new(gpu, real, size, device, prop, 0);
	if (p == NULL) {
		r = SHIM_GPU_OUT_OF_MEMORY;
	} else {
		*app_handle = p->app_handle;
		stats.app_vmm_bytes += size;
		stats.app_vmm_handles++;
		if (device >= 0 && device < SHIM_MAX_DEVICES) {
			void *ctx = gpu->ctx_note != NULL ? gpu->ctx_note(device, NULL) : NULL;
			shim_staging_note_bytes(stats.vmm_bytes + stats.app_vmm_bytes + stats.pool_seg_bytes, device, gpu,
						ctx);
		}
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_handle_import(const struct shim_gpu_ops *gpu, uint64_t real, int device, const void *prop,
			     uint64_t *app_handle)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_new(gpu, real, 0, device, prop, 0);
	if (p == NULL) {
		r = SHIM_GPU_OUT_OF_MEMORY;
	} else {
		p->shared = 1;
		stats.shared_handles++;
		stats.app_vmm_handles++;
		*app_handle = p->app_handle;
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

/* The table counts the application's references; the runtime's one reference goes when they
 * reach zero (the runtime keeps mapped memory until its last unmap). */
int shim_alloc_handle_release(const struct shim_gpu_ops *gpu, uint64_t h, int *ours)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_lookup(h);
	*ours = p != NULL;
	if (p == NULL) {
	} else if (p->app_refs <= 0) {
		r = SHIM_GPU_INVALID_VALUE;
	} else if (--p->app_refs == 0) {
		struct gcr_err err;
		if (p->real != 0 && gpu->release(p->real, &err) < 0)
			r = gpu->last_code();
		if (r == 0) {
			p->real = 0;
			phys_maybe_drop(p);
		} else {
			p->app_refs++;
		}
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_handle_map(const struct shim_gpu_ops *gpu, uint64_t va, size_t size, size_t offset,
			  uint64_t h, int *ours)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_lookup(h);
	*ours = p != NULL;
	if (p == NULL) {
	} else if (p->real == 0 || p->app_refs == 0) {
		r = SHIM_GPU_INVALID_VALUE; /* mapping a released handle is invalid */
	} else {
		struct gcr_err err;
		struct shim_map *m = calloc(1, sizeof(*m));
		if (m == NULL)
			r = SHIM_GPU_OUT_OF_MEMORY;
		else if (gpu->map(va, size, offset, p->real, &err) < 0)
			r = gpu->last_code();
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
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_handle_retain(uint64_t va, uint64_t *h)
{
	pthread_mutex_lock(&table_lock);
	struct shim_map *m = map_containing(va);
	int hit = h != NULL && m != NULL && !m->phys->shim_owned;
	if (hit) {
		/* The record counts application references itself; the runtime's single
		 * reference is released when the count drops to zero. */
		if (m->phys->app_refs == 0 && m->phys->real != 0)
			hit = 0; /* released by the app but mapped: let the runtime answer */
		else {
			m->phys->app_refs++;
			*h = m->phys->app_handle;
		}
	}
	pthread_mutex_unlock(&table_lock);
	return hit;
}

int shim_alloc_handle_prop(uint64_t h, void *prop, size_t size)
{
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_lookup(h);
	if (p != NULL && prop != NULL)
		memcpy(prop, &p->prop, size < sizeof(p->prop) ? size : sizeof(p->prop));
	pthread_mutex_unlock(&table_lock);
	return p != NULL;
}

int shim_alloc_handle_export(uint64_t h, uint64_t *real)
{
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_lookup(h);
	if (p != NULL)
		*real = p->real;
	pthread_mutex_unlock(&table_lock);
	return p != NULL;
}

void shim_alloc_handle_shared(uint64_t h)
{
	pthread_mutex_lock(&table_lock);
	struct shim_phys *p = phys_lookup(h);
	if (p != NULL && !p->shared) {
		p->shared = 1;
		stats.shared_handles++;
	}
	pthread_mutex_unlock(&table_lock);
}

int shim_alloc_unmap(const struct shim_gpu_ops *gpu, uint64_t va, size_t size)
{
	struct gcr_err err;
	pthread_mutex_lock(&table_lock);
	int r = gpu->unmap(va, size, &err) < 0 ? gpu->last_code() : 0;
	if (r == 0)
		unmapped_locked(va, size);
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_set_access(const struct shim_gpu_ops *gpu, uint64_t va, size_t size,
			  const struct shim_gpu_access *acc, size_t n)
{
	struct gcr_err err;
	pthread_mutex_lock(&table_lock);
	int r = gpu->set_access(va, size, acc, n, &err) < 0 ? gpu->last_code() : 0;
	if (r == 0)
		access_locked(va, size, acc, n);
	pthread_mutex_unlock(&table_lock);
	return r;
}

void shim_alloc_unmapped(uint64_t va, size_t size)
{
	pthread_mutex_lock(&table_lock);
	unmapped_locked(va, size);
	pthread_mutex_unlock(&table_lock);
}

void shim_alloc_access_set(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n)
{
	pthread_mutex_lock(&table_lock);
	access_locked(va, size, acc, n);
	pthread_mutex_unlock(&table_lock);
}

/* ---- suspend and resume ---- */

int shim_alloc_check_movable(const struct shim_gpu_ops *gpu, struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&table_lock);
	if (stats.managed_buffers > 0)
		rc = gcr_err_set(err, -ENOTSUP,
				 "managed (UVM) memory in use (%llu bytes in %llu allocations); "
				 "the driver cannot checkpoint it",
				 (unsigned long long)stats.managed_bytes, (unsigned long long)stats.managed_buffers);
	if (rc == 0 && stats.shared_pools > 0)
		rc = gcr_err_set(err, -ENOTSUP,
				 "GPU memory shared with another process (exported or imported handle) cannot "
				 "be moved");
	for (size_t i = 0; i < phys_cap && rc == 0; i++)
		if (phys_slots[i] != NULL && phys_slots[i]->shared)
			rc = gcr_err_set(err, -ENOTSUP,
					 "GPU memory shared with another process (exported or imported "
					 "handle) cannot be moved");
	for (size_t i = 0; i < phys_cap && rc == 0; i++)
		if (phys_slots[i] != NULL && phys_slots[i]->gpu != gpu)
			rc = gcr_err_set(err, -ENOTSUP, "the process holds GPU memory of a runtime other than %s",
					 gpu->name);
	pthread_mutex_unlock(&table_lock);
	return rc;
}

/* A device address where the whole of p is mapped and accessible, or 0. Lock held. */
static shim_gpu_va covering_va(const struct shim_phys *p)
{
	for (size_t i = 0; i < maps.n; i++) {
		struct shim_map *m = maps.v[i];
		if (m->phys == p && m->offset == 0 && m->size >= p->size && m->ndesc > 0)
			return m->va;
	}
	return 0;
}

int shim_alloc_each(unsigned flags, int (*fn)(struct shim_phys *p, uint64_t va, void *arg), void *arg)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < phys_cap && r == 0; i++) {
		struct shim_phys *p = phys_slots[i];
		if (p != NULL)
			r = fn(p, (flags & SHIM_ALLOC_EACH_VA) ? covering_va(p) : 0, arg);
	}
	pthread_mutex_unlock(&table_lock);
	return r;
}

int shim_alloc_each_map(int (*fn)(const struct shim_map *m, void *arg), void *arg)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < maps.n && r == 0; i++)
		r = fn(maps.v[i], arg);
	pthread_mutex_unlock(&table_lock);
	return r;
}

const struct shim_map *shim_alloc_map_at(size_t i)
{
	pthread_mutex_lock(&table_lock);
	const struct shim_map *m = i < maps.n ? maps.v[i] : NULL;
	pthread_mutex_unlock(&table_lock);
	return m;
}

size_t shim_alloc_nphys(void)
{
	pthread_mutex_lock(&table_lock);
	size_t n = phys_cap;
	pthread_mutex_unlock(&table_lock);
	return n;
}

size_t shim_alloc_nmaps(void)
{
	pthread_mutex_lock(&table_lock);
	size_t n = maps.n;
	pthread_mutex_unlock(&table_lock);
	return n;
}

int shim_alloc_release(struct shim_phys *p, struct gcr_err *err)
{
	int r = 0;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < maps.n && r == 0; i++) {
		struct shim_map *m = maps.v[i];
		if (m->phys == p && !m->unmapped) {
			r = p->gpu->unmap(m->va, m->size, err);
			m->unmapped = r == 0;
		}
	}
	if (r == 0 && p->real != 0) {
		r = p->gpu->release(p->real, err);
		if (r == 0)
			p->real = 0;
	}
	p->staged = 1;
	pthread_mutex_unlock(&table_lock);
	return r;
}

static void recreate_undo_locked(void)
{
	struct gcr_err e2;
	for (size_t i = 0; i < maps.n; i++) {
		struct shim_map *m = maps.v[i];
		if (m->remapped) {
			(void)m->phys->gpu->unmap(m->va, m->size, &e2);
			m->unmapped = 1;
			m->remapped = 0;
		}
	}
	for (size_t i = 0; i < phys_cap; i++) {
		struct shim_phys *p = phys_slots[i];
		if (p != NULL && p->remade) {
			if (p->real != 0)
				(void)p->gpu->release(p->real, &e2);
			p->real = 0;
			p->remade = 0;
		}
	}
}

int shim_alloc_recreate(struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < phys_cap && rc == 0; i++) {
		struct shim_phys *p = phys_slots[i];
		if (p == NULL || !p->staged || p->real != 0)
			continue;
		shim_gpu_handle h = 0;
		int r = p->gpu->create(&h, p->size, p->device, p->has_prop ? &p->prop : NULL, err);
		if (r == -ENOMEM) {
			size_t free_b = 0, total_b = 0;
			struct gcr_err e2;
			(void)p->gpu->mem_info(p->device, &free_b, &total_b, &e2);
			rc = gcr_err_set(err, -ENOMEM, "not enough GPU memory on GPU %d: need %zu more bytes, %zu free",
					 p->device, p->size, free_b);
		} else if (r < 0) {
			rc = err->code = -EIO;
		}
		p->real = r == 0 ? h : 0;
		p->remade = r == 0;
	}
	for (size_t i = 0; i < maps.n && rc == 0; i++) {
		struct shim_map *m = maps.v[i];
		if (!m->unmapped)
			continue;
		const struct shim_gpu_ops *g = m->phys->gpu;
		int r = g->map(m->va, m->size, m->offset, m->phys->real, err);
		if (r == 0) {
			m->remapped = 1;
			m->unmapped = 0;
			if (m->ndesc > 0)
				r = g->set_access(m->va, m->size, m->desc, (size_t)m->ndesc, err);
		}
		if (r < 0) {
			rc = err->code = -EIO;
			gcr_err_wrap(err, "cuMemMap/cuMemSetAccess");
		}
	}
	if (rc < 0)
		recreate_undo_locked();
	pthread_mutex_unlock(&table_lock);
	return rc;
}

void shim_alloc_recreate_undo(void)
{
	pthread_mutex_lock(&table_lock);
	recreate_undo_locked();
	pthread_mutex_unlock(&table_lock);
}

void shim_alloc_resumed(void)
{
	pthread_mutex_lock(&table_lock);
	for (size_t i = 0; i < maps.n; i++)
		((struct shim_map *)maps.v[i])->remapped = 0;
	for (size_t i = 0; i < phys_cap; i++) {
		struct shim_phys *p = phys_slots[i];
		if (p == NULL)
			continue;
		p->remade = 0;
		if (!p->staged)
			continue;
		p->staged = 0;
		if (!p->shim_owned && p->app_refs == 0 && p->real != 0) {
			struct gcr_err err;
			(void)p->gpu->release(p->real, &err);
			p->real = 0;
		}
	}
	pthread_mutex_unlock(&table_lock);
}
