/* fakecuda_pool_async: the driver's stream-ordered allocator: memory pools (default, current,
 * created), cuMemAllocAsync / FromPoolAsync / FreeAsync in stream order, attributes, trimming. */
#include "fakecuda.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_POOL_ALIGN ((size_t)4096) /* blocks are whole host pages here */

/* A block is LIVE (the application's), PENDING (freed on a stream that has not reached the
 * free yet) or FREE (cached by the pool: reserved, not used). */
enum fake_block_state { FAKE_BLOCK_LIVE, FAKE_BLOCK_PENDING, FAKE_BLOCK_FREE };

/* Where a free happened: the stream, and for the per-thread default stream the thread. */
struct fake_skey {
	CUstream stream;
	pthread_t thread;
	bool tagged; /* FREE: reusable by other streams only once synchronised or opportunistically */
};

struct fake_block {
	struct fake_block *next;
	CUdeviceptr ptr;
	size_t size; /* as its latest allocation asked */
	size_t len;  /* bytes reserved */
	enum fake_block_state state;
	uint64_t gen; /* bumped at each allocation: a stale free op is ignored */
	struct fake_skey key;
};

struct fake_mempool {
	struct fake_mempool *next;
	CUmemPoolProps props;
	int dev; /* -1: a host-location pool */
	bool is_default, destroyed, exported;
	int reuse_follow, reuse_opportunistic, reuse_internal;
	cuuint64_t threshold, reserved, reserved_high, used, used_high;
	CUmemAccess_flags access[FAKE_MAX_DEVICES];
	struct fake_block *blocks;
};

/* Lock order: fake_pool_mu, then the device lock (the memory table's calls take it). Ops are
 * submitted with fake_pool_mu released: an unheld stream runs a free op at once. */
static pthread_mutex_t fake_pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fake_mempool *fake_pools;
static struct fake_mempool *fake_default_pool[FAKE_MAX_DEVICES];
static struct fake_mempool *fake_current_pool[FAKE_MAX_DEVICES];
/* Whether any pool may hold cached memory above its threshold or tagged frees: the check at
 * every synchronize is then one load. */
static bool fake_pool_dirty;

static bool fake_pool_listed(const struct fake_mempool *p)
{
	const struct fake_mempool *q;

	for (q = fake_pools; q != NULL; q = q->next)
		if (q == p)
			return true;
	return false;
}

/* A pool handle the application may use; fake_pool_mu held. */
static struct fake_mempool *fake_pool_get(CUmemoryPool handle)
{
	struct fake_mempool *p = (struct fake_mempool *)handle;

	return p != NULL && fake_pool_listed(p) && !p->destroyed ? p : NULL;
}

static struct fake_mempool *fake_pool_new(const CUmemPoolProps *props)
{
	struct fake_mempool *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return NULL;
	p->props = *props;
	p->dev = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? props->location.id : -1;
	p->reuse_follow = p->reuse_opportunistic = p->reuse_internal = 1;
	if (p->dev >= 0)
		p->access[p->dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	p->next = fake_pools;
	fake_pools = p;
	return p;
}

/* The device's default pool, made at first use; fake_pool_mu held. */
static struct fake_mempool *fake_pool_default(int dev)
{
	CUmemPoolProps props = {0};

	if (fake_default_pool[dev] == NULL) {
		props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
		props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		props.location.id = dev;
		fake_default_pool[dev] = fake_pool_new(&props);
		if (fake_default_pool[dev] != NULL)
			fake_default_pool[dev]->is_default = true;
	}
	return fake_default_pool[dev];
}

static struct fake_mempool *fake_pool_current(int dev)
{
	return fake_current_pool[dev] != NULL ? fake_current_pool[dev] : fake_pool_default(dev);
}

static CUresult fake_dev_check(CUdevice dev)
{
	return dev >= 0 && dev < fake_device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* fake_pool_mu held. */
static void fake_pool_unlink(struct fake_mempool *p)
{
	struct fake_mempool **pp;

	for (pp = &fake_pools; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			free(p);
			return;
		}
	}
}

/* Gives a FREE block's memory back; fake_pool_mu held. */
static void fake_block_release(struct fake_mempool *p, struct fake_block **pp)
{
	struct fake_block *b = *pp;

	*pp = b->next;
	p->reserved -= b->len;
	fake_mem_pool_unmap(b->ptr);
	free(b);
}

/* Releases FREE blocks (completed frees) while the pool reserves more than keep bytes;
 * fake_pool_mu held. */
static void fake_pool_trim(struct fake_mempool *p, size_t keep)
{
	struct fake_block **pp = &p->blocks;

	while (*pp != NULL && p->reserved > keep) {
		if ((*pp)->state == FAKE_BLOCK_FREE)
			fake_block_release(p, pp);
		else
			pp = &(*pp)->next;
	}
	if (p->destroyed && p->blocks == NULL)
		fake_pool_unlink(p);
}

static void fake_pool_mark_used(struct fake_mempool *p, size_t add)
{
	p->used += add;
	if (p->used > p->used_high)
		p->used_high = p->used;
	if (p->reserved > p->reserved_high)
		p->reserved_high = p->reserved;
}

static struct fake_skey fake_skey(CUstream s)
{
	struct fake_skey k = {.stream = s};

	if (s == CU_STREAM_PER_THREAD)
		k.thread = pthread_self();
	return k;
}

static bool fake_skey_same(const struct fake_skey *a, const struct fake_skey *b)
{
	return a->stream == b->stream &&
	       (a->stream != CU_STREAM_PER_THREAD || pthread_equal(a->thread, b->thread));
}

/* The best cached block for an allocation of len bytes on stream k: same stream first (a
 * pending free there is reusable in stream order), then completed frees; the smallest that
 * fits and wastes at most half. fake_pool_mu held. */
static struct fake_block *fake_pool_find(struct fake_mempool *p, size_t len,
					 const struct fake_skey *k)
{
	struct fake_block *b, *best = NULL;

	for (b = p->blocks; b != NULL; b = b->next) {
		bool same = fake_skey_same(&b->key, k), ok;

		if (b->len < len || b->len > 2 * len)
			continue;
		if (b->state == FAKE_BLOCK_PENDING)
			ok = same;
		else if (b->state == FAKE_BLOCK_FREE)
			ok = same || !b->key.tagged || p->reuse_opportunistic;
		else
			ok = false;
		if (ok && (best == NULL || b->len < best->len ||
			   (b->len == best->len && same && !fake_skey_same(&best->key, k))))
			best = b;
	}
	return best;
}

static CUresult fake_pool_alloc(struct fake_mempool *p, size_t size, CUstream s, CUdeviceptr *out)
{
	size_t len = (size + FAKE_POOL_ALIGN - 1) / FAKE_POOL_ALIGN * FAKE_POOL_ALIGN;
	struct fake_skey k = fake_skey(s);
	struct fake_block *b;
	CUresult rc = CUDA_SUCCESS;

	b = fake_pool_find(p, len, &k);
	if (b != NULL) {
		b->state = FAKE_BLOCK_LIVE;
		b->gen++;
		b->size = size;
		fake_mem_pool_resize(b->ptr, size);
		fake_pool_mark_used(p, b->len);
		*out = b->ptr;
		return CUDA_SUCCESS;
	}
	b = calloc(1, sizeof(*b));
	if (b == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (p->props.maxSize != 0 && p->reserved + len > p->props.maxSize)
		fake_pool_trim(p, p->props.maxSize > len ? p->props.maxSize - len : 0);
	if (p->props.maxSize != 0 && p->reserved + len > p->props.maxSize)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	if (rc == CUDA_SUCCESS)
		rc = fake_mem_pool_map(p->dev, len, &b->ptr);
	if (rc == CUDA_ERROR_OUT_OF_MEMORY && p->reserved > 0) {
		/* As the driver: cached memory goes back before an allocation fails. */
		fake_pool_trim(p, 0);
		rc = fake_mem_pool_map(p->dev, len, &b->ptr);
	}
	if (rc != CUDA_SUCCESS) {
		free(b);
		return rc;
	}
	if (size < len)
		fake_mem_pool_resize(b->ptr, size);
	b->size = size;
	b->len = len;
	b->state = FAKE_BLOCK_LIVE;
	b->gen = 1;
	b->next = p->blocks;
	p->blocks = b;
	p->reserved += len;
	fake_pool_mark_used(p, len);
	*out = b->ptr;
	return CUDA_SUCCESS;
}

/* The live block at p and its pool; fake_pool_mu held. */
static struct fake_block *fake_block_find(CUdeviceptr ptr, struct fake_mempool **pool)
{
	struct fake_mempool *p;
	struct fake_block *b;

	for (p = fake_pools; p != NULL; p = p->next) {
		for (b = p->blocks; b != NULL; b = b->next) {
			if (b->ptr == ptr) {
				*pool = p;
				return b;
			}
		}
	}
	return NULL;
}

/* A block whose free completed: cached, or gone if its pool was destroyed; fake_pool_mu held. */
static void fake_block_completed(struct fake_mempool *p, struct fake_block *b)
{
	struct fake_block **pp;

	b->state = FAKE_BLOCK_FREE;
	b->key.tagged = true;
	fake_pool_dirty = true;
	if (!p->destroyed)
		return;
	for (pp = &p->blocks; *pp != b; pp = &(*pp)->next)
		;
	fake_block_release(p, pp);
	if (p->blocks == NULL)
		fake_pool_unlink(p);
}

void fake_pool_free_done(CUdeviceptr ptr, uint64_t gen)
{
	struct fake_mempool *p;
	struct fake_block *b;

	pthread_mutex_lock(&fake_pool_mu);
	b = fake_block_find(ptr, &p);
	if (b != NULL && gen == FAKE_FREE_LIVE && b->state == FAKE_BLOCK_LIVE) {
		p->used -= b->len;
		b->key = fake_skey(NULL);
		fake_block_completed(p, b);
	} else if (b != NULL && b->state == FAKE_BLOCK_PENDING && b->gen == gen) {
		fake_block_completed(p, b);
	}
	pthread_mutex_unlock(&fake_pool_mu);
	if (b == NULL && gen == 0) /* a cuMemAlloc buffer freed with cuMemFreeAsync */
		fake_mem_free_alloc(ptr);
}

bool fake_pool_owns(CUdeviceptr ptr)
{
	struct fake_mempool *p;
	struct fake_block *b;
	bool owns;

	pthread_mutex_lock(&fake_pool_mu);
	b = fake_block_find(ptr, &p);
	owns = b != NULL && b->state == FAKE_BLOCK_LIVE;
	pthread_mutex_unlock(&fake_pool_mu);
	return owns;
}

CUresult fake_pool_free_now(CUdeviceptr ptr)
{
	struct fake_mempool *p;
	struct fake_block *b;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	pthread_mutex_lock(&fake_pool_mu);
	b = fake_block_find(ptr, &p);
	if (b != NULL && b->state == FAKE_BLOCK_LIVE) {
		p->used -= b->len;
		b->key = fake_skey(NULL);
		fake_block_completed(p, b);
		rc = CUDA_SUCCESS;
	}
	pthread_mutex_unlock(&fake_pool_mu);
	return rc;
}

void fake_pool_on_sync(void)
{
	struct fake_mempool *p, *next;
	struct fake_block *b;

	if (!__atomic_load_n(&fake_pool_dirty, __ATOMIC_ACQUIRE))
		return;
	pthread_mutex_lock(&fake_pool_mu);
	fake_pool_dirty = false;
	for (p = fake_pools; p != NULL; p = next) {
		next = p->next;
		for (b = p->blocks; b != NULL; b = b->next)
			if (b->state == FAKE_BLOCK_FREE)
				b->key.tagged = false;
		if (p->reserved > p->threshold)
			fake_pool_trim(p, p->threshold);
	}
	pthread_mutex_unlock(&fake_pool_mu);
}

/* ---- devices' pools ---- */

FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult rc;

	FAKE_ENTER("cuDeviceGetDefaultMemPool");
	if (pool == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_dev_check(dev);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	pthread_mutex_lock(&fake_pool_mu);
	*pool = (CUmemoryPool)fake_pool_default(dev);
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(*pool != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

FAKE_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	CUresult rc;

	FAKE_ENTER("cuDeviceGetMemPool");
	if (pool == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_dev_check(dev);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	pthread_mutex_lock(&fake_pool_mu);
	*pool = (CUmemoryPool)fake_pool_current(dev);
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(*pool != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY);
}

FAKE_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	struct fake_mempool *p;
	CUresult rc;

	FAKE_ENTER("cuDeviceSetMemPool");
	rc = fake_dev_check(dev);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL || p->dev != dev)
		rc = CUDA_ERROR_INVALID_VALUE; /* a pool of another device, or of the host */
	else
		fake_current_pool[dev] = p;
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

/* ---- pools ---- */

/* As the driver validates: pinned memory on a device (or the host), known handle types, the
 * Windows field and the reserved bytes zero. */
static CUresult fake_props_check(const CUmemPoolProps *props)
{
	const unsigned int handles = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR | CU_MEM_HANDLE_TYPE_FABRIC;
	size_t i;

	if (props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    (props->handleTypes & ~handles) || props->win32SecurityAttributes != NULL ||
	    (props->usage & ~(unsigned int)CU_MEM_POOL_CREATE_USAGE_HW_DECOMPRESS))
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < sizeof(props->reserved); i++)
		if (props->reserved[i] != 0)
			return CUDA_ERROR_INVALID_VALUE;
	switch (props->location.type) {
	case CU_MEM_LOCATION_TYPE_DEVICE:
		return fake_dev_check(props->location.id) == CUDA_SUCCESS ? CUDA_SUCCESS
									  : CUDA_ERROR_INVALID_VALUE;
	case CU_MEM_LOCATION_TYPE_HOST:
	case CU_MEM_LOCATION_TYPE_HOST_NUMA:
		return props->location.id == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	struct fake_mempool *p;
	CUresult rc;

	FAKE_ENTER("cuMemPoolCreate");
	if (pool == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_props_check(props);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_new(props);
	pthread_mutex_unlock(&fake_pool_mu);
	if (p == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	*pool = (CUmemoryPool)p;
	return fake_leave(CUDA_SUCCESS);
}

/* Live blocks stay valid until freed; cached memory goes now, the rest as it is freed. A
 * device whose current pool this was goes back to its default pool. */
FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;
	int d;

	FAKE_ENTER("cuMemPoolDestroy");
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL || p->is_default) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		for (d = 0; d < FAKE_MAX_DEVICES; d++)
			if (fake_current_pool[d] == p)
				fake_current_pool[d] = NULL;
		p->destroyed = true;
		fake_pool_trim(p, 0); /* unlinks it when nothing is left */
	}
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemPoolSetAttribute");
	if (value == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		switch (attr) {
		case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
			p->reuse_follow = *(int *)value != 0;
			break;
		case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
			p->reuse_opportunistic = *(int *)value != 0;
			break;
		case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
			p->reuse_internal = *(int *)value != 0;
			break;
		case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
			p->threshold = *(cuuint64_t *)value;
			fake_pool_dirty = true;
			break;
		case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: /* only a reset to the current value */
		case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
			if (*(cuuint64_t *)value != 0)
				rc = CUDA_ERROR_INVALID_VALUE;
			else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
				p->reserved_high = p->reserved;
			else
				p->used_high = p->used;
			break;
		default: /* the current values are read-only */
			rc = CUDA_ERROR_INVALID_VALUE;
		}
	}
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemPoolGetAttribute");
	if (value == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		switch (attr) {
		case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
			*(int *)value = p->reuse_follow;
			break;
		case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
			*(int *)value = p->reuse_opportunistic;
			break;
		case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
			*(int *)value = p->reuse_internal;
			break;
		case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
			*(cuuint64_t *)value = p->threshold;
			break;
		case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
			*(cuuint64_t *)value = p->reserved;
			break;
		case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
			*(cuuint64_t *)value = p->reserved_high;
			break;
		case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
			*(cuuint64_t *)value = p->used;
			break;
		case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
			*(cuuint64_t *)value = p->used_high;
			break;
		default:
			rc = CUDA_ERROR_INVALID_VALUE;
		}
	}
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemPoolTrimTo");
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	else
		fake_pool_trim(p, keep);
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

/* The owning device keeps read-write access; others get none or read-write (no read-only). */
FAKE_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;
	size_t i;

	FAKE_ENTER("cuMemPoolSetAccess");
	if (map == NULL && count > 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < count; i++)
		if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
		    fake_dev_check(map[i].location.id) != CUDA_SUCCESS ||
		    (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		     map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
			return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	for (i = 0; rc == CUDA_SUCCESS && i < count; i++)
		if (map[i].location.id == p->dev && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			rc = CUDA_ERROR_INVALID_VALUE;
	for (i = 0; rc == CUDA_SUCCESS && i < count; i++)
		p->access[map[i].location.id] = map[i].flags;
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool pool,
					CUmemLocation *location)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemPoolGetAccess");
	if (flags == NULL || location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    fake_dev_check(location->id) != CUDA_SUCCESS)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	else
		*flags = p->access[location->id];
	pthread_mutex_unlock(&fake_pool_mu);
	return fake_leave(rc);
}

/* ---- stream-ordered allocation ---- */

static CUresult fake_alloc_from(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
{
	struct fake_mempool *p;
	struct fake_ctx *ctx;
	CUresult rc;
	int dev = 0;

	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (dptr == NULL || size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_stream_device(s, &dev);
	if (rc != CUDA_SUCCESS)
		return rc;
	pthread_mutex_lock(&fake_pool_mu);
	p = pool != NULL ? fake_pool_get(pool) : fake_pool_current(dev);
	if (p == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (!fake_stream_capturing(s))
		rc = fake_pool_alloc(p, size, s, dptr);
	else
		dev = p->dev;
	pthread_mutex_unlock(&fake_pool_mu);
	if (rc == CUDA_SUCCESS && fake_stream_capturing(s))
		rc = dev < 0 ? CUDA_ERROR_NOT_SUPPORTED : fake_capture_alloc(s, dev, size, dptr);
	return rc;
}

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s)
{
	FAKE_ENTER("cuMemAllocAsync");
	return fake_leave(fake_alloc_from(dptr, size, NULL, s));
}

FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream s)
{
	FAKE_ENTER("cuMemAllocAsync");
	return fake_leave(fake_alloc_from(dptr, size, NULL, s == NULL ? CU_STREAM_PER_THREAD : s));
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
					     CUstream s)
{
	FAKE_ENTER("cuMemAllocFromPoolAsync");
	if (pool == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_alloc_from(dptr, size, pool, s));
}

FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size,
						  CUmemoryPool pool, CUstream s)
{
	FAKE_ENTER("cuMemAllocFromPoolAsync");
	if (pool == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_alloc_from(dptr, size, pool, s == NULL ? CU_STREAM_PER_THREAD : s));
}

/* A pool block turns pending on s and returns to its pool when s reaches the free; a cuMemAlloc
 * buffer is freed when s reaches it too (the driver accepts both). */
static CUresult fake_free_async(CUdeviceptr ptr, CUstream s)
{
	struct fake_op op = {.kind = FAKE_OP_FREE};
	struct fake_mempool *p;
	struct fake_block *b;
	CUresult rc = fake_stream_check(s);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (ptr == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_stream_capturing(s))
		return fake_capture_free(s, ptr, fake_pool_owns(ptr));
	pthread_mutex_lock(&fake_pool_mu);
	b = fake_block_find(ptr, &p);
	if (b != NULL && b->state == FAKE_BLOCK_LIVE) {
		b->state = FAKE_BLOCK_PENDING;
		b->key = fake_skey(s);
		p->used -= b->len;
		op.u.free.ptr = ptr;
		op.u.free.gen = b->gen;
	} else {
		rc = CUDA_ERROR_INVALID_VALUE;
	}
	pthread_mutex_unlock(&fake_pool_mu);
	if (rc != CUDA_SUCCESS && fake_mem_is_alloc(ptr)) {
		op.u.free.ptr = ptr;
		op.u.free.gen = 0;
		rc = CUDA_SUCCESS;
	}
	return rc == CUDA_SUCCESS ? fake_submit(s, &op) : rc;
}

FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s)
{
	FAKE_ENTER("cuMemFreeAsync");
	return fake_leave(fake_free_async(ptr, s));
}

FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s)
{
	FAKE_ENTER("cuMemFreeAsync");
	return fake_leave(fake_free_async(ptr, s == NULL ? CU_STREAM_PER_THREAD : s));
}

/* ---- sharing (minimal: the export is checked, importing works only in the same process) ---- */

#define FAKE_EXPORT_MAGIC "fakecuda-pool-ptr"

struct fake_export_data {
	char magic[sizeof(FAKE_EXPORT_MAGIC)];
	int pid;
	CUdeviceptr ptr;
};
_Static_assert(sizeof(struct fake_export_data) <= sizeof(CUmemPoolPtrExportData), "fits");

FAKE_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle, CUmemoryPool pool,
						      CUmemAllocationHandleType type,
						      unsigned long long flags)
{
	struct fake_mempool *p;
	CUresult rc = CUDA_SUCCESS;
	int fd = -1;

	FAKE_ENTER("cuMemPoolExportToShareableHandle");
	if (handle == NULL || flags != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	p = fake_pool_get(pool);
	if (p == NULL || !(p->props.handleTypes & type) || type == CU_MEM_HANDLE_TYPE_NONE)
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		rc = CUDA_ERROR_NOT_SUPPORTED;
	else if ((fd = memfd_create("fakecuda-mempool", MFD_CLOEXEC)) < 0)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else
		p->exported = true;
	pthread_mutex_unlock(&fake_pool_mu);
	if (rc == CUDA_SUCCESS)
		*(int *)handle = fd;
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle,
							CUmemAllocationHandleType type,
							unsigned long long flags)
{
	FAKE_ENTER("cuMemPoolImportFromShareableHandle");
	if (pool == NULL || handle == NULL || flags != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(CUDA_ERROR_NOT_SUPPORTED);
}

FAKE_EXPORT CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr ptr)
{
	struct fake_export_data d = {FAKE_EXPORT_MAGIC, 0, 0};
	struct fake_mempool *p;
	struct fake_block *b;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemPoolExportPointer");
	if (data == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	pthread_mutex_lock(&fake_pool_mu);
	b = fake_block_find(ptr, &p);
	if (b == NULL || b->state != FAKE_BLOCK_LIVE || p->props.handleTypes == CU_MEM_HANDLE_TYPE_NONE)
		rc = CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_unlock(&fake_pool_mu);
	if (rc == CUDA_SUCCESS) {
		d.pid = (int)getpid();
		d.ptr = ptr;
		memset(data, 0, sizeof(*data));
		memcpy(data, &d, sizeof(d));
	}
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr, CUmemoryPool pool,
					    CUmemPoolPtrExportData *data)
{
	struct fake_export_data d;
	bool ok;

	FAKE_ENTER("cuMemPoolImportPointer");
	if (ptr == NULL || data == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	memcpy(&d, data, sizeof(d));
	pthread_mutex_lock(&fake_pool_mu);
	ok = fake_pool_get(pool) != NULL;
	pthread_mutex_unlock(&fake_pool_mu);
	if (!ok || memcmp(d.magic, FAKE_EXPORT_MAGIC, sizeof(d.magic)) != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (d.pid != (int)getpid())
		return fake_leave(CUDA_ERROR_NOT_SUPPORTED);
	*ptr = d.ptr;
	return fake_leave(CUDA_SUCCESS);
}
