/* shim_cuda_pool: the CUDA driver's stream-ordered allocation and memory pools on the shim's own
 * arena (shim_pool): cuMemAllocAsync/cuMemAllocFromPoolAsync/cuMemFreeAsync on served pools (a
 * device's default pool and pools created pinned on a device without handle types) never reach
 * the driver; the pool calls keep the arena and the driver's pool object in step. */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gcr_log.h"
#include "shim_agent.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_cuda_pool.h"
#include "shim_gate.h"
#include "shim_gpu.h"
#include "shim_hook.h"
#include "shim_pool.h"
#include "shim_real.h"

/* Driver functions the arena needs that the shim does not interpose, found once. */
static struct {
	__typeof__(&cuEventQuery) event_query;
	__typeof__(&cuStreamGetDevice) stream_device;
	__typeof__(&cuDeviceGetMemPool) device_pool;
	__typeof__(&cuDeviceGetDefaultMemPool) default_pool;
	__typeof__(&cuStreamIsCapturing) is_capturing;
	__typeof__(&cuStreamGetCtx) stream_ctx;
	__typeof__(&cuCtxPushCurrent_v2) ctx_push;
	__typeof__(&cuCtxPopCurrent_v2) ctx_pop;
	__typeof__(&cuStreamGetCaptureInfo_v3) capture_info;
	__typeof__(&cuThreadExchangeStreamCaptureMode) exchange_mode;
} rf;
static pthread_once_t rf_once = PTHREAD_ONCE_INIT;

static void rf_load(void)
{
	void *h = shim_real_handle(SHIM_CUDA);
	if (h == NULL)
		return;
	rf.event_query = (__typeof__(rf.event_query))shim_real_dlsym(h, "cuEventQuery");
	rf.stream_device = (__typeof__(rf.stream_device))shim_real_dlsym(h, "cuStreamGetDevice");
	rf.device_pool = (__typeof__(rf.device_pool))shim_real_dlsym(h, "cuDeviceGetMemPool");
	rf.default_pool = (__typeof__(rf.default_pool))shim_real_dlsym(h, "cuDeviceGetDefaultMemPool");
	rf.is_capturing = (__typeof__(rf.is_capturing))shim_real_dlsym(h, "cuStreamIsCapturing");
	rf.stream_ctx = (__typeof__(rf.stream_ctx))shim_real_dlsym(h, "cuStreamGetCtx");
	rf.ctx_push = (__typeof__(rf.ctx_push))shim_real_dlsym(h, "cuCtxPushCurrent_v2");
	rf.ctx_pop = (__typeof__(rf.ctx_pop))shim_real_dlsym(h, "cuCtxPopCurrent_v2");
	rf.capture_info = (__typeof__(rf.capture_info))shim_real_dlsym(h, "cuStreamGetCaptureInfo_v3");
	rf.exchange_mode =
		(__typeof__(rf.exchange_mode))shim_real_dlsym(h, "cuThreadExchangeStreamCaptureMode");
}

/* ---- markers: pooled events without timing, per context ---- */

struct cev {
	CUevent ev;
	CUcontext ctx;
	struct cev *next;
};

/* Touched only from the arena's callbacks, which run under its lock. */
#define CEV_CTXS 64
static struct {
	CUcontext ctx;
	struct cev *free;
} cev_cache[CEV_CTXS];

static struct cev *cev_get(CUcontext ctx)
{
	for (int i = 0; i < CEV_CTXS && cev_cache[i].ctx != NULL; i++)
		if (cev_cache[i].ctx == ctx && cev_cache[i].free != NULL) {
			struct cev *e = cev_cache[i].free;
			cev_cache[i].free = e->next;
			return e;
		}
	struct cev *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return NULL;
	if (shim_cu.cuEventCreate(&e->ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
		free(e);
		return NULL;
	}
	e->ctx = ctx;
	return e;
}

static void cev_put(struct cev *e)
{
	for (int i = 0; i < CEV_CTXS; i++)
		if (cev_cache[i].ctx == NULL || cev_cache[i].ctx == e->ctx) {
			cev_cache[i].ctx = e->ctx;
			e->next = cev_cache[i].free;
			cev_cache[i].free = e;
			return;
		}
	(void)shim_cu.cuEventDestroy_v2(e->ev);
	free(e);
}

static CUresult record(struct cev *e, CUstream s)
{
	__typeof__(&cuEventRecord) rec = SHIM_REAL(cuEventRecord, 0);
	return rec == NULL ? CUDA_ERROR_NOT_FOUND : rec(e->ev, s);
}

static atomic_int captures; /* captures begun and not ended, process-wide */

int shim_cuda_capturing(void)
{
	return atomic_load_explicit(&captures, memory_order_relaxed) != 0;
}

static int cp_mark(const struct shim_pool_stream *k, void **out)
{
	CUstream s = (CUstream)(uintptr_t)k->handle;
	int legacy = k->handle == (uint64_t)(uintptr_t)CU_STREAM_LEGACY;
	/* A lazy marker is recorded from whichever thread wants the block. While anything captures,
	 * that could join a capture (or, on the legacy stream, invalidate one): not now. */
	if (k->handle != (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD &&
	    atomic_load_explicit(&captures, memory_order_relaxed) != 0)
		return -EBUSY;
	CUcontext ctx = NULL, popped = NULL;
	(void)shim_cu.cuCtxGetCurrent(&ctx);
	/* The legacy stream is its context's (the key keeps which). */
	int pushed = 0;
	if (legacy && k->thread != 0 && (uint64_t)(uintptr_t)ctx != k->thread) {
		if (rf.ctx_push == NULL || rf.ctx_pop == NULL || rf.ctx_push((CUcontext)(uintptr_t)k->thread) != CUDA_SUCCESS)
			return -EBUSY;
		pushed = 1;
		ctx = (CUcontext)(uintptr_t)k->thread;
	}
	struct cev *e = cev_get(ctx);
	if (e == NULL) {
		if (pushed)
			(void)rf.ctx_pop(&popped);
		return -ENOMEM;
	}
	if (e == NULL)
		return -ENOMEM;
	CUresult r = record(e, s);
	if (pushed)
		(void)rf.ctx_pop(&popped);
	if ((r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_CONTEXT) && !legacy && rf.stream_ctx != NULL &&
	    rf.ctx_push != NULL && rf.ctx_pop != NULL) {
		/* The stream is another context's: an event of that context. */
		CUcontext sctx = NULL;
		cev_put(e);
		e = NULL;
		if (rf.stream_ctx(s, &sctx) == CUDA_SUCCESS && rf.ctx_push(sctx) == CUDA_SUCCESS) {
			e = cev_get(sctx);
			r = e != NULL ? record(e, s) : CUDA_ERROR_OUT_OF_MEMORY;
			(void)rf.ctx_pop(&popped);
		}
	}
	if (r != CUDA_SUCCESS) {
		if (e != NULL)
			cev_put(e);
		shim_cuda_set_last_code((int)r);
		return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EINVAL;
	}
	*out = e;
	return 0;
}

static int cp_done(void *ev)
{
	return rf.event_query != NULL && rf.event_query(((struct cev *)ev)->ev) == CUDA_SUCCESS;
}

static int cp_wait(uint64_t stream, int variant, void *ev)
{
	(void)variant;
	__typeof__(&cuStreamWaitEvent) w = SHIM_REAL(cuStreamWaitEvent, 0);
	return w != NULL && w((CUstream)(uintptr_t)stream, ((struct cev *)ev)->ev, 0) == CUDA_SUCCESS ? 0 : -EIO;
}

static void cp_unmark(void *ev)
{
	cev_put(ev);
}

static int cp_seg_new(int device, size_t size, const struct shim_gpu_access *acc, size_t n, uint64_t *va)
{
	return shim_alloc_seg_new(&shim_cuda_ops, device, size, acc, n, va);
}

static void cp_seg_free(uint64_t va, size_t size)
{
	(void)size;
	shim_alloc_seg_free(va);
}

static int cp_seg_access(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n)
{
	return shim_alloc_set_access(&shim_cuda_ops, va, size, acc, n) == CUDA_SUCCESS ? 0 : -EIO;
}

static const struct shim_pool_ops cuda_pool_ops = { cp_seg_new, cp_seg_free, cp_seg_access, cp_mark,
						    cp_done, cp_wait, cp_unmark };

/* ---- streams and the pool each allocates from ---- */

/* Handle 0 is the legacy stream for plain calls and the thread's own stream for _ptsz ones:
 * both become the explicit handles, which also name them in the driver's calls. */
/* The legacy stream is one per context, the per-thread one per thread: the key says which. */
static struct shim_pool_stream stream_key(CUstream h, int v)
{
	uint64_t x = (uint64_t)(uintptr_t)h, who = 0;
	if (x == 0)
		x = v ? (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD : (uint64_t)(uintptr_t)CU_STREAM_LEGACY;
	if (x == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD) {
		who = (uint64_t)pthread_self();
	} else if (x == (uint64_t)(uintptr_t)CU_STREAM_LEGACY) {
		CUcontext ctx = NULL;
		(void)shim_cu.cuCtxGetCurrent(&ctx);
		who = (uint64_t)(uintptr_t)ctx;
	}
	return (struct shim_pool_stream){ .handle = x, .thread = who };
}

static int is_default_stream(uint64_t h)
{
	return h == (uint64_t)(uintptr_t)CU_STREAM_LEGACY || h == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD;
}

/* Bumped whenever a stream's pool may have changed (set, destroy); the per-thread cache below
 * checks it, so the hot path asks the driver nothing. */
static atomic_uint pool_gen;
static __thread struct {
	unsigned gen;
	uint64_t stream;
	CUcontext ctx;
	CUmemoryPool pool;
	int valid;
} tcache;

/* 1: k is capturing, 2: its capture was invalidated (*id: the capture's id; 0 when the driver
 * cannot say, then the capture's memory stays the driver's); 0: not. One atomic load while
 * nothing captures. */
static int capturing(const struct shim_pool_stream *k, cuuint64_t *id)
{
	*id = 0;
	if (atomic_load_explicit(&captures, memory_order_relaxed) == 0)
		return 0;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	CUstream s = (CUstream)(uintptr_t)k->handle;
	if (rf.capture_info != NULL) {
		if (rf.capture_info(s, &st, id, NULL, NULL, NULL, NULL) != CUDA_SUCCESS)
			return 0;
		return st == CU_STREAM_CAPTURE_STATUS_NONE ? 0 : st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? 1 : 2;
	}
	return rf.is_capturing != NULL && rf.is_capturing(s, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static void serve_pool(CUmemoryPool pool, int device)
{
	size_t gran = 0;
	struct gcr_err err;
	if (shim_cuda_ops.granularity(device, &gran, &err) < 0)
		return; /* no VMM: the driver keeps this pool */
	int r = shim_pool_add((uint64_t)(uintptr_t)pool, device, gran, &cuda_pool_ops);
	if (r < 0 && r != -EEXIST)
		GCR_LOG(GCR_LOG_WARN, "shim", "memory pool %p stays the driver's: %d", (void *)pool, r);
}

int shim_cuda_pool_graph_alloc(uint64_t pool, int dev, size_t bytes, uint64_t holder, uint64_t *va)
{
	pthread_once(&rf_once, rf_load);
	if (!shim_cfg.vmm)
		return -ENOENT;
	if (pool == 0) {
		/* An explicit allocation node: the device's default pool's arena. */
		CUmemoryPool def = NULL;
		if (rf.default_pool == NULL || rf.default_pool(&def, dev) != CUDA_SUCCESS)
			return -ENOENT;
		pool = (uint64_t)(uintptr_t)def;
		if (!shim_pool_served(pool))
			serve_pool(def, dev);
	}
	/* A new segment maps memory, which a global-mode capture forbids; it is no stream work. */
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	int exchanged = rf.exchange_mode != NULL && rf.exchange_mode(&mode) == CUDA_SUCCESS;
	int rc = shim_pool_graph_alloc(pool, bytes, holder, va);
	if (exchanged)
		(void)rf.exchange_mode(&mode);
	return rc;
}

int shim_cuda_pool_graph_pass(uint64_t to, uint64_t from)
{
	int rc = shim_pool_graph_share(to, from);
	(void)shim_pool_graph_drop(from);
	return rc;
}

/* The pool cuMemAllocAsync on k allocates from: its device's current pool. 0 when it is not
 * served (the driver answers). */
static int stream_pool(const struct shim_pool_stream *k, CUmemoryPool *out)
{
	/* A default stream's device follows the current context; stream_key has already read it
	 * for the legacy stream (its key holds it), so only the per-thread stream asks again. */
	CUcontext ctx = NULL;
	if (k->handle == (uint64_t)(uintptr_t)CU_STREAM_LEGACY)
		ctx = (CUcontext)(uintptr_t)k->thread;
	else if (is_default_stream(k->handle))
		(void)shim_cu.cuCtxGetCurrent(&ctx);
	unsigned gen = atomic_load_explicit(&pool_gen, memory_order_acquire);
	if (tcache.valid && tcache.gen == gen && tcache.stream == k->handle && tcache.ctx == ctx) {
		*out = tcache.pool;
		return tcache.pool != NULL;
	}
	CUdevice dev = -1;
	CUmemoryPool pool = NULL, def = NULL;
	CUresult r = rf.stream_device != NULL ? rf.stream_device((CUstream)(uintptr_t)k->handle, &dev)
					      : CUDA_ERROR_NOT_FOUND;
	if (r == CUDA_ERROR_NOT_FOUND || (r != CUDA_SUCCESS && is_default_stream(k->handle)))
		r = shim_cu.cuCtxGetDevice(&dev); /* a driver before 12.8: the stream is the context's */
	if (r == CUDA_SUCCESS && rf.device_pool != NULL && rf.device_pool(&pool, dev) == CUDA_SUCCESS &&
	    !shim_pool_served((uint64_t)(uintptr_t)pool) && rf.default_pool != NULL &&
	    rf.default_pool(&def, dev) == CUDA_SUCCESS && def == pool)
		serve_pool(pool, dev);
	if (pool != NULL && !shim_pool_served((uint64_t)(uintptr_t)pool))
		pool = NULL;
	tcache.valid = 1;
	tcache.gen = gen;
	tcache.stream = k->handle;
	tcache.ctx = ctx;
	tcache.pool = pool;
	*out = pool;
	return pool != NULL;
}

static CUresult code_of(int rc)
{
	if (rc == -ENOMEM)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (rc == -EINVAL)
		return shim_cuda_last_code() ? (CUresult)shim_cuda_last_code() : CUDA_ERROR_INVALID_VALUE;
	return CUDA_ERROR_UNKNOWN;
}

/* ---- allocation and free ---- */

/* pool NULL: the stream's device's current pool. -ENOENT from the arena: the driver's. */
static CUresult alloc_async_once(int v, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream,
			    int from_pool)
{
	__typeof__(&cuMemAllocAsync) real_a = SHIM_REAL(cuMemAllocAsync, v);
	__typeof__(&cuMemAllocFromPoolAsync) real_p = SHIM_REAL(cuMemAllocFromPoolAsync, v);
	if ((from_pool ? (void *)real_p : (void *)real_a) == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(
		SHIM_HOOK_ROW(SHIM_CUDA, from_pool ? SHIM_HOOK_cuMemAllocFromPoolAsync : SHIM_HOOK_cuMemAllocAsync), v);
	pthread_once(&rf_once, rf_load);
	struct shim_pool_stream k = stream_key(hStream, v);
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	cuuint64_t cap = 0;
	int in_capture = capturing(&k, &cap);
	/* An invalidated capture: the driver answers (and fails). */
	if (dptr != NULL && shim_cfg.vmm && bytesize > 0 && (in_capture == 0 || (in_capture == 1 && cap != 0)) &&
	    (from_pool ? shim_pool_served((uint64_t)(uintptr_t)pool) : stream_pool(&k, &pool))) {
		uint64_t va = 0;
		/* Inside a capture: a block of the capture, the graph's once it ends. */
		int rc = in_capture ? shim_cuda_pool_graph_alloc((uint64_t)(uintptr_t)pool, -1, bytesize,
								 SHIM_CUDA_HOLD_CAPTURE(cap), &va)
				    : shim_pool_alloc((uint64_t)(uintptr_t)pool, bytesize, &k, 0, &va);
		if (rc == 0) {
			*dptr = va;
			r = CUDA_SUCCESS;
		} else if (rc != -ENOENT) {
			r = code_of(rc);
		}
	}
	if (r == CUDA_ERROR_NOT_SUPPORTED) {
		/* Not served. */
		r = from_pool ? real_p(dptr, bytesize, pool, hStream) : real_a(dptr, bytesize, hStream);
		if (r == CUDA_SUCCESS)
			shim_alloc_note(&shim_cuda_ops, *dptr, bytesize, SHIM_ALLOC_ASYNC);
	}
	shim_gate_exit(t);
	return r;
}

/* Overcommit (shim_agent): out of memory asks the agent for room, then tries again. */
static CUresult alloc_async(int v, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream,
			    int from_pool)
{
	int tries = 0;
	CUresult r;
	do
		r = alloc_async_once(v, dptr, bytesize, pool, hStream, from_pool);
	while (r == CUDA_ERROR_OUT_OF_MEMORY && shim_agent_room_retry(bytesize, -1, &tries));
	return r;
}

SHIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(0, dptr, bytesize, NULL, hStream, 0);
}

SHIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(1, dptr, bytesize, NULL, hStream, 0);
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					     CUstream hStream)
{
	return alloc_async(0, dptr, bytesize, pool, hStream, 1);
}

SHIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
						  CUstream hStream)
{
	return alloc_async(1, dptr, bytesize, pool, hStream, 1);
}

/* Pointers imported from another process's pool: shared memory while they live. */
#define IMPORTS_MAX 256
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t imports[IMPORTS_MAX];
static uint64_t exported[IMPORTS_MAX];

static int shared_forget(uint64_t *set, uint64_t v)
{
	int hit = 0;
	pthread_mutex_lock(&shared_lock);
	for (int i = 0; i < IMPORTS_MAX && v != 0 && !hit; i++)
		if (set[i] == v) {
			set[i] = 0;
			hit = 1;
		}
	pthread_mutex_unlock(&shared_lock);
	if (hit)
		shim_alloc_shared_pool(-1);
	return hit;
}

static void shared_note(uint64_t *set, uint64_t v)
{
	pthread_mutex_lock(&shared_lock);
	int i = 0;
	while (i < IMPORTS_MAX && set[i] != 0 && set[i] != v)
		i++;
	int fresh = i < IMPORTS_MAX && set[i] == 0;
	if (fresh)
		set[i] = v;
	pthread_mutex_unlock(&shared_lock);
	if (fresh || i == IMPORTS_MAX)
		shim_alloc_shared_pool(1); /* past the table: never forgotten, suspend stays refused */
}

static CUresult free_async(int v, CUdeviceptr dptr, CUstream hStream)
{
	__typeof__(&cuMemFreeAsync) real = SHIM_REAL(cuMemFreeAsync, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemFreeAsync), v);
	pthread_once(&rf_once, rf_load);
	struct shim_pool_stream k = stream_key(hStream, v);
	cuuint64_t cap = 0;
	/* Inside a capture the free is the graph's: the block is held by the capture (and its
	 * graph) until the last of them goes. */
	int rc = capturing(&k, &cap) && cap != 0 ? shim_pool_graph_adopt(dptr, SHIM_CUDA_HOLD_CAPTURE(cap))
						 : shim_pool_free(dptr, &k,
								  k.handle == (uint64_t)(uintptr_t)CU_STREAM_PER_THREAD
									  ? 0
									  : SHIM_POOL_LAZY);
	CUresult r = rc == 0 ? CUDA_SUCCESS : code_of(rc);
	uint64_t base = 0;
	if (rc == -ENOENT && shim_alloc_buf_range(dptr, &base, NULL) && base == dptr) {
		/* A converted cuMemAlloc buffer: freed once the stream reached the free. */
		int ours = 0;
		r = shim_cu.cuStreamSynchronize((CUstream)(uintptr_t)k.handle);
		if (r == CUDA_SUCCESS)
			r = (CUresult)shim_alloc_buf_free(&shim_cuda_ops, dptr, &ours);
	} else if (rc == -ENOENT) {
		r = real(dptr, hStream);
		if (r == CUDA_SUCCESS) {
			shim_alloc_forget(dptr);
			(void)shared_forget(imports, dptr);
		}
	}
	shim_gate_exit(t);
	return r;
}

SHIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(0, dptr, hStream);
}

SHIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(1, dptr, hStream);
}

/* ---- pools ---- */

SHIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
	__typeof__(&cuMemPoolCreate) real = SHIM_REAL(cuMemPoolCreate, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(pool, poolProps);
	/* Served: pinned device memory nobody else can import, without a size cap or special use. */
	if (r == CUDA_SUCCESS && shim_cfg.vmm && poolProps->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
	    poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE && poolProps->handleTypes == CU_MEM_HANDLE_TYPE_NONE &&
	    poolProps->maxSize == 0 && poolProps->usage == 0 && poolProps->location.id >= 0 &&
	    poolProps->location.id < SHIM_MAX_DEVICES)
		serve_pool(*pool, poolProps->location.id);
	return r;
}

SHIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	__typeof__(&cuMemPoolDestroy) real = SHIM_REAL(cuMemPoolDestroy, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(pool);
	if (r == CUDA_SUCCESS) {
		(void)shim_pool_remove((uint64_t)(uintptr_t)pool);
		(void)shared_forget(exported, (uint64_t)(uintptr_t)pool);
		atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
	}
	return r;
}

SHIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	__typeof__(&cuDeviceSetMemPool) real = SHIM_REAL(cuDeviceSetMemPool, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(dev, pool);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
	return r;
}

static int attr_of(CUmemPool_attribute a, enum shim_pool_attr *out)
{
	switch (a) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
		*out = SHIM_POOL_REUSE_FOLLOW_EVENTS;
		return 1;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
		*out = SHIM_POOL_REUSE_OPPORTUNISTIC;
		return 1;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		*out = SHIM_POOL_REUSE_INTERNAL_DEPS;
		return 1;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		*out = SHIM_POOL_RELEASE_THRESHOLD;
		return 1;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*out = SHIM_POOL_RESERVED_CURRENT;
		return 1;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		*out = SHIM_POOL_RESERVED_HIGH;
		return 1;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*out = SHIM_POOL_USED_CURRENT;
		return 1;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*out = SHIM_POOL_USED_HIGH;
		return 1;
	default:
		return 0;
	}
}

/* The REUSE_* flags are ints, the rest cuuint64_t (cuda.h). */
static int attr_is_int(enum shim_pool_attr a)
{
	return a == SHIM_POOL_REUSE_FOLLOW_EVENTS || a == SHIM_POOL_REUSE_OPPORTUNISTIC ||
	       a == SHIM_POOL_REUSE_INTERNAL_DEPS;
}

/* Passed to the driver too, so its own object agrees; the arena keeps what it serves by. */
SHIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	__typeof__(&cuMemPoolSetAttribute) real = SHIM_REAL(cuMemPoolSetAttribute, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(pool, attr, value);
	enum shim_pool_attr a;
	if (r == CUDA_SUCCESS && value != NULL && attr_of(attr, &a)) {
		uint64_t v = attr_is_int(a) ? (uint64_t)*(int *)value : *(cuuint64_t *)value;
		(void)shim_pool_set_attr((uint64_t)(uintptr_t)pool, a, v);
	}
	return r;
}

SHIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	__typeof__(&cuMemPoolGetAttribute) real = SHIM_REAL(cuMemPoolGetAttribute, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	enum shim_pool_attr a;
	uint64_t v = 0;
	if (value == NULL || !attr_of(attr, &a) || shim_pool_get_attr((uint64_t)(uintptr_t)pool, a, &v) < 0)
		return real(pool, attr, value);
	if (attr_is_int(a))
		*(int *)value = (int)v;
	else
		*(cuuint64_t *)value = v;
	return CUDA_SUCCESS;
}

SHIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	__typeof__(&cuMemPoolTrimTo) real = SHIM_REAL(cuMemPoolTrimTo, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	pthread_once(&rf_once, rf_load);
	(void)shim_pool_trim((uint64_t)(uintptr_t)pool, minBytesToKeep);
	return real(pool, minBytesToKeep);
}

/* Applied to every segment through the allocation table (so resume applies it again) and
 * recorded for new ones; the driver's pool gets it too and answers cuMemPoolGetAccess. */
SHIM_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
	__typeof__(&cuMemPoolSetAccess) real = SHIM_REAL(cuMemPoolSetAccess, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(pool, map, count);
	if (r == CUDA_SUCCESS && map != NULL && count > 0 &&
	    shim_pool_set_access((uint64_t)(uintptr_t)pool, (const struct shim_gpu_access *)(const void *)map,
				 count) == -EIO)
		r = shim_cuda_last_code() ? (CUresult)shim_cuda_last_code() : CUDA_ERROR_UNKNOWN;
	return r;
}

SHIM_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool,
						      CUmemAllocationHandleType handleType, unsigned long long flags)
{
	__typeof__(&cuMemPoolExportToShareableHandle) real = SHIM_REAL(cuMemPoolExportToShareableHandle, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(handle_out, pool, handleType, flags);
	if (r == CUDA_SUCCESS)
		shared_note(exported, (uint64_t)(uintptr_t)pool);
	return r;
}

SHIM_EXPORT CUresult cuMemPoolImportPointer(CUdeviceptr *ptr_out, CUmemoryPool pool,
					    CUmemPoolPtrExportData *shareData)
{
	__typeof__(&cuMemPoolImportPointer) real = SHIM_REAL(cuMemPoolImportPointer, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(ptr_out, pool, shareData);
	if (r == CUDA_SUCCESS && ptr_out != NULL)
		shared_note(imports, *ptr_out);
	return r;
}

/* cuMemFree_v2 on an imported pointer ends the import too (shim_cuda_alloc.c). */
void shim_cuda_pool_forget_import(uint64_t va)
{
	(void)shared_forget(imports, va);
}

/* ---- synchronisation, streams, capture ---- */

static void synced(const struct shim_pool_stream *k)
{
	if (shim_pool_sync_wanted())
		shim_pool_synced(k);
}

static CUresult stream_sync(int v, CUstream hStream)
{
	__typeof__(&cuStreamSynchronize) real = SHIM_REAL(cuStreamSynchronize, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hStream);
	if (r == CUDA_SUCCESS && shim_pool_sync_wanted()) {
		struct shim_pool_stream k = stream_key(hStream, v);
		/* Only k's frees are known done (the legacy stream does not wait for non-blocking
		 * streams); the others are asked about. */
		shim_pool_synced(&k);
	}
	return r;
}

SHIM_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
	return stream_sync(0, hStream);
}

SHIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	return stream_sync(1, hStream);
}

SHIM_EXPORT CUresult cuCtxSynchronize(void)
{
	__typeof__(&cuCtxSynchronize) real = SHIM_REAL(cuCtxSynchronize, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real();
	if (r == CUDA_SUCCESS)
		synced(NULL);
	return r;
}

/* Which stream the event was on is unknown: the arena asks its markers (one query each). */
SHIM_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
	__typeof__(&cuEventSynchronize) real = SHIM_REAL(cuEventSynchronize, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hEvent);
	if (r == CUDA_SUCCESS) {
		struct shim_pool_stream none = { .handle = 0 };
		synced(&none);
	}
	return r;
}

/* Queries while the closed gate's GPU is quiet (shim_gate_set_quiet): every event and stream
 * the application can name has finished its work, and the driver may be locked for its
 * checkpoint, which would hold the caller until resume. */
SHIM_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
	if (shim_gate_quiet())
		return CUDA_SUCCESS;
	__typeof__(&cuEventQuery) real = SHIM_REAL(cuEventQuery, 0);
	return real != NULL ? real(hEvent) : CUDA_ERROR_NOT_FOUND;
}

static CUresult stream_query(int v, CUstream hStream)
{
	if (shim_gate_quiet())
		return CUDA_SUCCESS;
	__typeof__(&cuStreamQuery) real = SHIM_REAL(cuStreamQuery, v);
	return real != NULL ? real(hStream) : CUDA_ERROR_NOT_FOUND;
}

SHIM_EXPORT CUresult cuStreamQuery(CUstream hStream)
{
	return stream_query(0, hStream);
}

SHIM_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream)
{
	return stream_query(1, hStream);
}

SHIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
	__typeof__(&cuStreamDestroy_v2) real = SHIM_REAL(cuStreamDestroy_v2, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	struct shim_pool_stream k = stream_key(hStream, 0);
	if (hStream != NULL)
		shim_pool_stream_close(&k);
	CUresult r = real(hStream);
	if (r == CUDA_SUCCESS && hStream != NULL) {
		shim_pool_stream_gone(&k);
		atomic_fetch_add_explicit(&pool_gen, 1, memory_order_release);
	}
	return r;
}

static CUresult begin_capture(int v, CUstream hStream, CUstreamCaptureMode mode)
{
	__typeof__(&cuStreamBeginCapture_v2) real = SHIM_REAL(cuStreamBeginCapture_v2, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hStream, mode);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&captures, 1, memory_order_relaxed);
	return r;
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	return begin_capture(0, hStream, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	return begin_capture(1, hStream, mode);
}

static CUresult begin_capture_to_graph(int v, CUstream hStream, CUgraph hGraph, const CUgraphNode *deps,
				       const CUgraphEdgeData *data, size_t n, CUstreamCaptureMode mode)
{
	__typeof__(&cuStreamBeginCaptureToGraph) real = SHIM_REAL(cuStreamBeginCaptureToGraph, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	CUresult r = real(hStream, hGraph, deps, data, n, mode);
	if (r == CUDA_SUCCESS)
		atomic_fetch_add_explicit(&captures, 1, memory_order_relaxed);
	return r;
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph, const CUgraphNode *dependencies,
						 const CUgraphEdgeData *dependencyData, size_t numDependencies,
						 CUstreamCaptureMode mode)
{
	return begin_capture_to_graph(0, hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
}

SHIM_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
						      const CUgraphNode *dependencies,
						      const CUgraphEdgeData *dependencyData,
						      size_t numDependencies, CUstreamCaptureMode mode)
{
	return begin_capture_to_graph(1, hStream, hGraph, dependencies, dependencyData, numDependencies, mode);
}

static CUresult end_capture(int v, CUstream hStream, CUgraph *phGraph)
{
	__typeof__(&cuStreamEndCapture) real = SHIM_REAL(cuStreamEndCapture, v);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	pthread_once(&rf_once, rf_load);
	struct shim_pool_stream k = stream_key(hStream, v);
	cuuint64_t cap = 0;
	(void)capturing(&k, &cap);
	CUresult r = real(hStream, phGraph);
	/* An invalidated or unjoined capture ends too. Never one too many: the count must not
	 * reach 0 while a capture runs (a stale extra only costs a query). */
	if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED || r == CUDA_ERROR_STREAM_CAPTURE_UNJOINED) {
		/* The capture's memory is the graph's now; without a graph it goes. */
		if (cap != 0 && r == CUDA_SUCCESS && *phGraph != NULL)
			(void)shim_cuda_pool_graph_pass(SHIM_CUDA_HOLD_GRAPH(*phGraph), SHIM_CUDA_HOLD_CAPTURE(cap));
		else if (cap != 0)
			(void)shim_pool_graph_discard(SHIM_CUDA_HOLD_CAPTURE(cap));
		int c = atomic_load_explicit(&captures, memory_order_relaxed);
		while (c > 0 && !atomic_compare_exchange_weak(&captures, &c, c - 1))
			;
	}
	return r;
}

SHIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	return end_capture(0, hStream, phGraph);
}

SHIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	return end_capture(1, hStream, phGraph);
}
