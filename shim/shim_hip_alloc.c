/* shim_hip_alloc: HIP allocation wrappers. Each passes the gate, forwards to the runtime and
 * records the result by address or handle, so frees and unmaps keep the counts exact. */
#include "shim_hip_alloc.h"

#include <errno.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim_gate.h"
#include "shim_hip_hook.h"
#include "shim_hook.h"

enum rec_kind { REC_PLAIN, REC_ASYNC, REC_MANAGED, REC_HANDLE, REC_RESERVE, REC_MAP };

/* One record; key is the address (buffers, reservations, mappings) or the handle value. */
struct rec {
	uint64_t key;
	uint64_t size;
	enum rec_kind kind;
};

/* A vector of records sorted by key: lookups are binary searches. */
struct recvec {
	struct rec *v;
	size_t n, cap;
};

static pthread_mutex_t hip_alloc_lock = PTHREAD_MUTEX_INITIALIZER;
static struct recvec bufs, handles, reservations, maps;
static struct shim_hip_alloc_stats stats;
static int used;

static size_t vec_lower(const struct recvec *rv, uint64_t key)
{
	size_t lo = 0, hi = rv->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (rv->v[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int vec_insert(struct recvec *rv, struct rec r)
{
	if (rv->n == rv->cap) {
		size_t ncap = rv->cap ? rv->cap * 2 : 64;
		struct rec *nv = realloc(rv->v, ncap * sizeof(*nv));
		if (nv == NULL)
			return -ENOMEM;
		rv->v = nv;
		rv->cap = ncap;
	}
	size_t i = vec_lower(rv, r.key);
	memmove(&rv->v[i + 1], &rv->v[i], (rv->n - i) * sizeof(*rv->v));
	rv->v[i] = r;
	rv->n++;
	return 0;
}

static void vec_remove_at(struct recvec *rv, size_t i)
{
	memmove(&rv->v[i], &rv->v[i + 1], (rv->n - i - 1) * sizeof(*rv->v));
	rv->n--;
}

/* The counters a record kind adds to. */
static void counters(enum rec_kind k, uint64_t **bytes, uint64_t **count)
{
	switch (k) {
	case REC_PLAIN: *bytes = &stats.plain_bytes; *count = &stats.plain_buffers; break;
	case REC_ASYNC: *bytes = &stats.async_bytes; *count = &stats.async_buffers; break;
	case REC_MANAGED: *bytes = &stats.managed_bytes; *count = &stats.managed_buffers; break;
	case REC_HANDLE: *bytes = &stats.vmm_bytes; *count = &stats.vmm_handles; break;
	case REC_RESERVE: *bytes = &stats.reserved_bytes; *count = &stats.reservations; break;
	default: *bytes = &stats.mapped_bytes; *count = &stats.mappings; break;
	}
}

static struct recvec *table_of(enum rec_kind k)
{
	return k == REC_HANDLE ? &handles : k == REC_RESERVE ? &reservations : k == REC_MAP ? &maps : &bufs;
}

/* Records a successful allocation. Out of memory loses only statistics; the application's
 * call still succeeded, as it did in the runtime. */
static void track(enum rec_kind k, uint64_t key, uint64_t size)
{
	pthread_mutex_lock(&hip_alloc_lock);
	used = 1;
	if (vec_insert(table_of(k), (struct rec){ .key = key, .size = size, .kind = k }) == 0) {
		uint64_t *bytes, *count;
		counters(k, &bytes, &count);
		*bytes += size;
		(*count)++;
	}
	pthread_mutex_unlock(&hip_alloc_lock);
}

static void untrack_at(struct recvec *rv, size_t i)
{
	uint64_t *bytes, *count;
	counters(rv->v[i].kind, &bytes, &count);
	*bytes -= rv->v[i].size;
	(*count)--;
	vec_remove_at(rv, i);
}

static void untrack(struct recvec *rv, uint64_t key)
{
	pthread_mutex_lock(&hip_alloc_lock);
	size_t i = vec_lower(rv, key);
	if (i < rv->n && rv->v[i].key == key)
		untrack_at(rv, i);
	pthread_mutex_unlock(&hip_alloc_lock);
}

void shim_hip_alloc_stats(struct shim_hip_alloc_stats *st)
{
	pthread_mutex_lock(&hip_alloc_lock);
	*st = stats;
	pthread_mutex_unlock(&hip_alloc_lock);
}

int shim_hip_alloc_used(void)
{
	pthread_mutex_lock(&hip_alloc_lock);
	int u = used;
	pthread_mutex_unlock(&hip_alloc_lock);
	return u;
}

#define ADDR(p) ((uint64_t)(uintptr_t)(p))

/* Resolves the real function or answers hipErrorNotFound, then enters the gate. */
#define HIP_ENTER(fn, sym)                                                        \
	__typeof__(&sym) fn = SHIM_HIP_REAL(sym, 0);                              \
	if (fn == NULL)                                                           \
		return hipErrorNotFound;                                          \
	struct shim_thread *gate_t = shim_gate_enter_hip(SHIM_HIP_HOOK_##sym, 0)
#define HIP_LEAVE() shim_gate_exit(gate_t)

SHIM_EXPORT hipError_t hipMalloc(void **ptr, size_t size)
{
	HIP_ENTER(real, hipMalloc);
	hipError_t r = real(ptr, size);
	if (r == hipSuccess && ptr != NULL && *ptr != NULL)
		track(REC_PLAIN, ADDR(*ptr), size);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t sizeBytes, unsigned int flags)
{
	HIP_ENTER(real, hipExtMallocWithFlags);
	hipError_t r = real(ptr, sizeBytes, flags);
	if (r == hipSuccess && ptr != NULL && *ptr != NULL)
		track(REC_PLAIN, ADDR(*ptr), sizeBytes);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	HIP_ENTER(real, hipMallocPitch);
	hipError_t r = real(ptr, pitch, width, height);
	if (r == hipSuccess && ptr != NULL && *ptr != NULL && pitch != NULL)
		track(REC_PLAIN, ADDR(*ptr), (uint64_t)*pitch * height);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMemAllocPitch(hipDeviceptr_t *dptr, size_t *pitch, size_t widthInBytes,
					size_t height, unsigned int elementSizeBytes)
{
	HIP_ENTER(real, hipMemAllocPitch);
	hipError_t r = real(dptr, pitch, widthInBytes, height, elementSizeBytes);
	if (r == hipSuccess && dptr != NULL && *dptr != NULL && pitch != NULL)
		track(REC_PLAIN, ADDR(*dptr), (uint64_t)*pitch * height);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMallocManaged(void **dev_ptr, size_t size, unsigned int flags)
{
	HIP_ENTER(real, hipMallocManaged);
	hipError_t r = real(dev_ptr, size, flags);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		track(REC_MANAGED, ADDR(*dev_ptr), size);
	HIP_LEAVE();
	return r;
}

/* Stream-ordered allocations stay in the runtime's pools; counted so statistics show them. */
SHIM_EXPORT hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream)
{
	HIP_ENTER(real, hipMallocAsync);
	hipError_t r = real(dev_ptr, size, stream);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		track(REC_ASYNC, ADDR(*dev_ptr), size);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size, hipMemPool_t mem_pool,
					      hipStream_t stream)
{
	HIP_ENTER(real, hipMallocFromPoolAsync);
	hipError_t r = real(dev_ptr, size, mem_pool, stream);
	if (r == hipSuccess && dev_ptr != NULL && *dev_ptr != NULL)
		track(REC_ASYNC, ADDR(*dev_ptr), size);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipFree(void *ptr)
{
	HIP_ENTER(real, hipFree);
	hipError_t r = real(ptr);
	if (r == hipSuccess && ptr != NULL)
		untrack(&bufs, ADDR(ptr));
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream)
{
	HIP_ENTER(real, hipFreeAsync);
	hipError_t r = real(dev_ptr, stream);
	if (r == hipSuccess && dev_ptr != NULL)
		untrack(&bufs, ADDR(dev_ptr));
	HIP_LEAVE();
	return r;
}

/* ---- the application's own virtual-memory calls ---- */

SHIM_EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
					    unsigned long long flags)
{
	HIP_ENTER(real, hipMemAddressReserve);
	hipError_t r = real(ptr, size, alignment, addr, flags);
	if (r == hipSuccess && ptr != NULL && *ptr != NULL)
		track(REC_RESERVE, ADDR(*ptr), size);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMemAddressFree(void *devPtr, size_t size)
{
	HIP_ENTER(real, hipMemAddressFree);
	hipError_t r = real(devPtr, size);
	if (r == hipSuccess)
		untrack(&reservations, ADDR(devPtr));
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
				    const hipMemAllocationProp *prop, unsigned long long flags)
{
	HIP_ENTER(real, hipMemCreate);
	hipError_t r = real(handle, size, prop, flags);
	if (r == hipSuccess && handle != NULL)
		track(REC_HANDLE, ADDR(*handle), size);
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
	HIP_ENTER(real, hipMemRelease);
	hipError_t r = real(handle);
	if (r == hipSuccess)
		untrack(&handles, ADDR(handle));
	HIP_LEAVE();
	return r;
}

SHIM_EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
				 unsigned long long flags)
{
	HIP_ENTER(real, hipMemMap);
	hipError_t r = real(ptr, size, offset, handle, flags);
	if (r == hipSuccess)
		track(REC_MAP, ADDR(ptr), size);
	HIP_LEAVE();
	return r;
}

/* Drops every mapping that starts inside [ptr, ptr + size), as the runtime unmaps them. */
SHIM_EXPORT hipError_t hipMemUnmap(void *ptr, size_t size)
{
	HIP_ENTER(real, hipMemUnmap);
	hipError_t r = real(ptr, size);
	if (r == hipSuccess) {
		pthread_mutex_lock(&hip_alloc_lock);
		size_t i = vec_lower(&maps, ADDR(ptr));
		while (i < maps.n && maps.v[i].key < ADDR(ptr) + size)
			untrack_at(&maps, i);
		pthread_mutex_unlock(&hip_alloc_lock);
	}
	HIP_LEAVE();
	return r;
}

/* Passed through and gated; phase 2 records the access per mapping to re-apply at resume. */
SHIM_EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count)
{
	HIP_ENTER(real, hipMemSetAccess);
	hipError_t r = real(ptr, size, desc, count);
	HIP_LEAVE();
	return r;
}
