/* shim_staging: a pool of pinned host slabs seen as one logical byte range, so a
 * buffer's copy may span slabs and any capacity >= the bytes to save suffices. */
#include "shim_staging.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_hook.h"
#include "shim_real.h"

#define SLAB_ALIGN (2ull << 20)  /* huge-page size */
#define SLAB_MIN (64ull << 20)   /* fewer, larger slabs register faster */
/* Slabs are (un)pinned one by one while the others' copies run: a cap keeps
 * that pipeline fine-grained (1 GiB copies in ~20 ms, pins in ~25 ms). */
#define SLAB_MAX (1ull << 30)
#define MAX_SLABS 4096

struct slab {
	char *base;
	uint64_t size;
	int registered;
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cond = PTHREAD_COND_INITIALIZER;
static struct slab slabs[MAX_SLABS];
static int nslabs;
static uint64_t capacity, registered, target, cursor, grown_inline;
static double pin_ms;
static CUcontext pin_ctx;
static int thread_started;
static int growing; /* a slab is being pinned outside the lock */
static int paused;  /* suspended: the background thread must not call the driver */

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Maps, faults in (huge pages where the kernel gives them) and pins one slab.
 * Runs without pool_lock: pinning a GiB takes a while and the application's
 * allocation path must never wait for it. */
static int slab_make(uint64_t size, CUcontext ctx, struct slab *out, struct gcr_err *err)
{
	size = (size + SLAB_ALIGN - 1) / SLAB_ALIGN * SLAB_ALIGN;
	char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return gcr_err_set(err, -ENOMEM, "cannot map %llu bytes of staging memory",
				   (unsigned long long)size);
	madvise(p, size, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
	if (madvise(p, size, MADV_POPULATE_WRITE) != 0)
#endif
		for (uint64_t o = 0; o < size; o += 4096)
			p[o] = 0;
	CUresult r = CUDA_ERROR_NOT_INITIALIZED;
	if (shim_cu.cuMemHostRegister_v2 != NULL) {
		if (ctx != NULL)
			shim_cu.cuCtxSetCurrent(ctx);
		r = shim_cu.cuMemHostRegister_v2(p, size, CU_MEMHOSTREGISTER_PORTABLE);
	}
	if (r != CUDA_SUCCESS) {
		munmap(p, size);
		return gcr_err_set(err, -ENOMEM, "cannot pin %llu bytes of staging memory (CUDA error %d)",
				   (unsigned long long)size, (int)r);
	}
	*out = (struct slab){ .base = p, .size = size, .registered = 1 };
	return 0;
}

/* Grows the pool by size bytes; called and returns with pool_lock held, drops it
 * while pinning. Only one grower at a time (growing). */
static int pool_grow(uint64_t size, struct gcr_err *err)
{
	if (nslabs == MAX_SLABS)
		return gcr_err_set(err, -ENOMEM, "staging pool has too many slabs");
	growing = 1;
	CUcontext ctx = pin_ctx;
	pthread_mutex_unlock(&pool_lock);
	double t0 = now_ms();
	struct slab sl;
	int rc = slab_make(size, ctx, &sl, err);
	double dt = now_ms() - t0;
	pthread_mutex_lock(&pool_lock);
	if (rc == 0) {
		slabs[nslabs++] = sl;
		capacity += sl.size;
		registered += sl.size;
	}
	pin_ms += dt;
	growing = 0;
	pthread_cond_broadcast(&pool_cond);
	return rc;
}

static void *grow_thread(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_mutex_lock(&pool_lock);
	int relaxed = 0;
	for (;;) {
		while (capacity >= target || growing || paused)
			pthread_cond_wait(&pool_cond, &pool_lock);
		if (!relaxed) {
			shim_real_relax_capture();
			relaxed = 1;
		}
		uint64_t need = target - capacity;
		need = need < SLAB_MIN ? SLAB_MIN : need > SLAB_MAX ? SLAB_MAX : need;
		struct gcr_err err;
		if (pool_grow(need, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "shim", "staging: %s; will pin at suspend instead", err.msg);
			/* No retry loop: wait for the next growth report. */
			uint64_t t = target;
			while (target == t)
				pthread_cond_wait(&pool_cond, &pool_lock);
		}
	}
	return NULL;
}

void shim_staging_note_bytes(uint64_t bytes, CUcontext ctx)
{
	if (!shim_cfg.staging_prepare)
		return;
	pthread_mutex_lock(&pool_lock);
	if (pin_ctx == NULL)
		pin_ctx = ctx;
	if (bytes > target) {
		target = bytes;
		if (!thread_started) {
			pthread_t th;
			thread_started = pthread_create(&th, NULL, grow_thread, NULL) == 0;
			if (thread_started)
				pthread_detach(th);
		}
		pthread_cond_signal(&pool_cond);
	}
	pthread_mutex_unlock(&pool_lock);
}

int shim_staging_prepare(uint64_t total, struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	if (pin_ctx == NULL && shim_cu.cuCtxGetCurrent != NULL)
		shim_cu.cuCtxGetCurrent(&pin_ctx);
	while (growing)
		pthread_cond_wait(&pool_cond, &pool_lock);
	if (capacity < total) {
		uint64_t need = total - capacity;
		grown_inline += need;
		GCR_LOG(GCR_LOG_INFO, "shim", "staging: pinning %llu bytes on the critical path",
			(unsigned long long)need);
		while (rc == 0 && capacity < total) {
			need = total - capacity;
			rc = pool_grow(need > SLAB_MAX ? SLAB_MAX : need, err);
		}
	}
	/* Stays paused until resume: the process may be locked by the driver. */
	paused = 1;
	cursor = 0;
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

uint64_t shim_staging_take(uint64_t size)
{
	pthread_mutex_lock(&pool_lock);
	uint64_t off = cursor;
	cursor += size;
	pthread_mutex_unlock(&pool_lock);
	return off;
}

static int cu_fail(struct gcr_err *err, CUresult r, const char *what)
{
	return gcr_err_set(err, -EIO, "%s failed: CUDA error %d", what, (int)r);
}

/* Queues the parts of the pieces that fall in slab i (which starts at logical
 * offset base). *one ends up the single stream used, NULL once several are. */
static int queue_slab(int out, int i, uint64_t base, const struct shim_xfer *x, size_t n,
		      CUstream *one, int *mixed, struct gcr_err *err)
{
	__typeof__(&cuMemcpyDtoHAsync_v2) d2h = SHIM_REAL(cuMemcpyDtoHAsync_v2, 0);
	__typeof__(&cuMemcpyHtoDAsync_v2) h2d = SHIM_REAL(cuMemcpyHtoDAsync_v2, 0);
	if (d2h == NULL || h2d == NULL)
		return gcr_err_set(err, -ENOSYS, "driver lacks async copies");
	struct slab *sl = &slabs[i];
	uint64_t lo = base, hi = base + sl->size;
	for (size_t j = 0; j < n; j++) {
		uint64_t a = x[j].off > lo ? x[j].off : lo;
		uint64_t b = x[j].off + x[j].size < hi ? x[j].off + x[j].size : hi;
		if (a >= b)
			continue;
		char *host = sl->base + (a - lo);
		CUdeviceptr dev = x[j].dev + (a - x[j].off);
		CUresult r = out ? d2h(host, dev, b - a, x[j].stream) : h2d(dev, host, b - a, x[j].stream);
		if (r != CUDA_SUCCESS)
			return cu_fail(err, r, out ? "copy to staging" : "copy from staging");
		if (*one == NULL && !*mixed) {
			*one = x[j].stream;
		} else if (*one != x[j].stream) {
			*one = NULL;
			*mixed = 1;
		}
	}
	return 0;
}

static int sync_all(const struct shim_xfer *x, size_t n, struct gcr_err *err)
{
	int rc = 0;
	for (size_t j = 0; j < n; j++) {
		int seen = 0;
		for (size_t k = 0; k < j && !seen; k++)
			seen = x[k].stream == x[j].stream;
		if (seen)
			continue;
		CUresult r = shim_cu.cuStreamSynchronize(x[j].stream);
		if (r != CUDA_SUCCESS && rc == 0)
			rc = cu_fail(err, r, "cuStreamSynchronize");
	}
	return rc;
}

int shim_staging_transfer(int out, const struct shim_xfer *x, size_t n, int unpin, double *ms_pin,
			  struct gcr_err *err)
{
	*ms_pin = 0;
	pthread_mutex_lock(&pool_lock);
	CUevent *ev = calloc((size_t)nslabs + 1, sizeof(*ev));
	int rc = ev ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
	CUstream one = NULL;
	int mixed = 0;
	uint64_t base = 0;
	for (int i = 0; i < nslabs && rc == 0; base += slabs[i].size, i++) {
		if (!slabs[i].registered && shim_cu.cuMemHostRegister_v2 != NULL) {
			/* Pins slab i while the copies of slab i-1 run (resume; or a
			 * suspend after one that failed half-way). */
			double t0 = now_ms();
			CUresult r = shim_cu.cuMemHostRegister_v2(slabs[i].base, slabs[i].size,
								  CU_MEMHOSTREGISTER_PORTABLE);
			*ms_pin += now_ms() - t0;
			if (r == CUDA_SUCCESS) {
				slabs[i].registered = 1;
				registered += slabs[i].size;
			} /* else copies from pageable memory still work, only slower */
		}
		rc = queue_slab(out, i, base, x, n, &one, &mixed, err);
		/* One stream (one GPU): an event per slab says when it may be unpinned. */
		if (rc == 0 && out && unpin && one != NULL && !mixed &&
		    shim_cu.cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
		    SHIM_REAL(cuEventRecord, 0)(ev[i], one) != CUDA_SUCCESS) {
			shim_cu.cuEventDestroy_v2(ev[i]);
			ev[i] = NULL;
		}
	}
	if (rc == 0 && out && unpin) {
		for (int i = 0; i < nslabs && rc == 0; i++) {
			CUresult r = ev[i] != NULL ? shim_cu.cuEventSynchronize(ev[i]) : CUDA_SUCCESS;
			if (r != CUDA_SUCCESS)
				rc = cu_fail(err, r, "cuEventSynchronize");
			else if (ev[i] == NULL)
				rc = sync_all(x, n, err);
			double t0 = now_ms();
			if (rc == 0 && slabs[i].registered &&
			    shim_cu.cuMemHostUnregister(slabs[i].base) == CUDA_SUCCESS) {
				slabs[i].registered = 0;
				registered -= slabs[i].size;
			}
			*ms_pin += now_ms() - t0;
		}
	}
	int rc2 = sync_all(x, n, err);
	if (rc == 0)
		rc = rc2;
	for (int i = 0; ev != NULL && i < nslabs; i++)
		if (ev[i] != NULL)
			shim_cu.cuEventDestroy_v2(ev[i]);
	free(ev);
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_staging_copy_sync(int out, uint64_t off, CUdeviceptr dev, uint64_t size, CUstream s,
			   struct gcr_err *err)
{
	struct shim_xfer x = { .off = off, .dev = dev, .size = size, .stream = s };
	double ms;
	return shim_staging_transfer(out, &x, 1, 0, &ms, err);
}

void shim_staging_resume_background(void)
{
	pthread_mutex_lock(&pool_lock);
	paused = 0;
	pthread_cond_broadcast(&pool_cond);
	pthread_mutex_unlock(&pool_lock);
}

void shim_staging_stats(struct shim_staging_stats *st)
{
	pthread_mutex_lock(&pool_lock);
	*st = (struct shim_staging_stats){ .capacity = capacity, .registered = registered,
					   .target = target, .grown_inline = grown_inline,
					   .pin_ms = pin_ms };
	pthread_mutex_unlock(&pool_lock);
}
