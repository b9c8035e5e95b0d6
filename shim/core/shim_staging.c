/* shim_staging: the host side of the data path (see shim_staging.h).
 *
 * Why this shape (docs/design.md, measured on the H100 with bench/staging_probe.c):
 * registering 16 GiB of host memory costs 0.4-1 s and memory left registered
 * slows the driver's own checkpoint and restore, so the pool that holds the data
 * is ordinary memory, faulted in (huge pages where the kernel gives them) by a
 * background thread. Copy workers move 2 MiB pieces through two pinned slots
 * each, memcpy'ing one slot while the other's DMA runs: 12 workers reach ~49 GB/s
 * each way (the pinned floor is ~55) with 48 MiB pinned, which the driver's
 * checkpoint does not measurably notice. Vendor calls go through struct shim_gpu_ops (the
 * process's one backend, from the first allocation that noted bytes). */
#include "shim_staging.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gcr_crc32c.h"
#include "gcr_image.h"
#include "gcr_log.h"
#include "gcr_meminfo.h"
#include "gcr_time.h"
#include "shim_config.h"
#include "shim_digest.h"
#include "shim_gpu.h"
#include "shim_real.h"

#define SLAB_MIN (64ull << 20) /* fewer, larger slabs fault in faster */
#define SLAB_MAX (1ull << 30)
#define MAX_SLABS 4096
#define MAX_WORKERS 32
/* Pinned slots may cost at most this share of the bytes to stage (the issue's
 * 1.05x host-memory bound leaves room for the pool's rounding). */
#define RING_SHARE 0.03

struct slab {
	char *base;
	uint64_t start, size; /* logical range [start, start + size) */
};

struct worker {
	pthread_t th;
	unsigned seen; /* last job generation taken */
	char *slot[2];
	shim_gpu_stream stream[SHIM_MAX_DEVICES];
	shim_gpu_event ev[SHIM_MAX_DEVICES][2];
	int used[SHIM_MAX_DEVICES]; /* issued work on that device in this job */
};

/* One transfer in progress; workers pick pieces with next. */
struct job {
	int out;
	const struct shim_xfer *x;
	size_t n;
	uint32_t piece; /* the largest piece: above SHIM_STAGING_CHUNK, workers use big slots */
	int nactive;    /* workers 0..nactive-1 take part; the others only report done */
	int to_files;   /* out, and some pieces go to image files */
	/* With pieces on several GPUs: the order workers take them in, the devices in turn, so
	 * every GPU's link is busy at once (in table order one GPU's pieces would all come first). */
	size_t *order;
	atomic_size_t next;
	atomic_int failed;
	int rc;
	struct gcr_err err;
	/* Groups: pieces left per group; finished groups queue up for the caller. */
	atomic_uint *left;
	size_t *doneq, ndone; /* under job_lock */
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_cond = PTHREAD_COND_INITIALIZER;
static struct slab slabs[MAX_SLABS];
static int nslabs;
static uint64_t capacity, cursor, target, noted, grown_inline;
static uint64_t base_keep, base_noted; /* after a trim: target = keep + later growth */
static int trimmed;
static double fault_ms;
static const struct shim_gpu_ops *gpu; /* set once, before any worker starts */
static void *pin_ctx;                  /* CUDA: the context the pinned slots are made in */
static int thread_started, growing, paused, digest_loaded, trim_pending;
static uint64_t devices_noted; /* bit d: an allocation on GPU d was noted */
_Static_assert(SHIM_MAX_DEVICES <= 64, "one bit per GPU in devices_noted");

static struct worker workers[MAX_WORKERS];
static int nworkers, starting_workers;
static struct job *job; /* under job_lock */
static unsigned job_gen;
static int job_left;
static pthread_mutex_t job_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t job_cond = PTHREAD_COND_INITIALIZER, done_cond = PTHREAD_COND_INITIALIZER;

/* Says which step of the data path a vendor call failed in. */
static int step_fail(struct gcr_err *err, const char *what)
{
	return gcr_err_wrap(err, "%s", what);
}

/* GCR_STAGING_THREADS per GPU the process allocated on (run 60: one process with 8 GiB on each
 * of two H200s moved its data at one GPU's rate with 12 workers for both). */
static int workers_wanted(uint64_t bytes)
{
	uint64_t w = (uint64_t)((double)bytes * RING_SHARE) / (2 * SHIM_STAGING_CHUNK);
	int ndev = __builtin_popcountll(devices_noted);
	long per = shim_cfg.staging_threads, all = per * (ndev > 1 ? ndev : 1);
	int max = all < MAX_WORKERS ? (int)all : MAX_WORKERS;
	if (max < 1)
		max = 1;
	return w < 2 ? (max < 2 ? max : 2) : w > (uint64_t)max ? max : (int)w;
}

/* ---- the pool ---- */

/* Maps and faults in one slab. Runs without pool_lock: faulting a GiB takes ~0.2 s. */
static int slab_make(uint64_t size, struct slab *out, struct gcr_err *err)
{
	size = (size + SHIM_STAGING_CHUNK - 1) / SHIM_STAGING_CHUNK * SHIM_STAGING_CHUNK;
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
	*out = (struct slab){ .base = p, .size = size };
	return 0;
}

/* What the pool may still fault in, and what bounds it: host memory available less a reserve
 * (1/16 of the machine, at least 2 GiB), and the container's memory limit (cgroup v2 or v1, as
 * the container sees its own) less what it uses (page cache left out: the kernel reclaims it
 * first) and 1/16 of the limit. Pre-faulting is a bet that a suspend comes, and the suspend
 * itself is refused rather than grown past this (shim_staging_prepare): neither may get the
 * process killed by the kernel's or the cgroup's OOM killer (a process taking most of a GPU on a
 * host not much bigger than the GPU did; a pod whose limit is below its GPU bytes would). */
struct host_room {
	uint64_t room;
	int by_cgroup; /* the cgroup's limit, not the host, is the bound */
	struct gcr_memcg cg;
	uint64_t avail, reserve;
};

static struct host_room host_room(void)
{
	struct host_room r = { 0 };
	uint64_t total = gcr_meminfo_bytes(NULL, "MemTotal");
	r.avail = gcr_meminfo_bytes(NULL, "MemAvailable");
	r.reserve = total / 16 > (2ull << 30) ? total / 16 : 2ull << 30;
	r.room = total == 0 ? UINT64_MAX : r.avail > r.reserve ? r.avail - r.reserve : 0;
	if (gcr_meminfo_cgroup(NULL, &r.cg) == 0) {
		uint64_t keep = r.cg.used + r.cg.limit / 16, cg = r.cg.limit > keep ? r.cg.limit - keep : 0;
		if (cg < r.room) {
			r.room = cg;
			r.by_cgroup = 1;
		}
	}
	return r;
}

/* Grows the pool by size bytes; called and returns with pool_lock held, drops it
 * while faulting. One grower at a time. */
static int pool_grow(uint64_t size, struct gcr_err *err)
{
	if (nslabs == MAX_SLABS)
		return gcr_err_set(err, -ENOMEM, "staging pool has too many slabs");
	growing = 1;
	pthread_mutex_unlock(&pool_lock);
	double t0 = gcr_time_mono_ms();
	struct slab sl;
	int rc = slab_make(size, &sl, err);
	double dt = gcr_time_mono_ms() - t0;
	pthread_mutex_lock(&pool_lock);
	if (rc == 0) {
		sl.start = capacity;
		slabs[nslabs++] = sl;
		capacity += sl.size;
	}
	fault_ms += dt;
	growing = 0;
	pthread_cond_broadcast(&pool_cond);
	return rc;
}

/* Host address of pool offset off (pool_lock held or the pool stable). */
static char *host_at(uint64_t off)
{
	int lo = 0, hi = nslabs - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (slabs[mid].start <= off)
			lo = mid;
		else
			hi = mid - 1;
	}
	return slabs[lo].base + (off - slabs[lo].start);
}

/* Gives back the pool beyond what holds data (trim_pending set by
 * shim_staging_trim). pool_lock held; dropped around munmap, which only touches
 * memory no placement refers to. */
static void pool_trim_locked(void)
{
	trim_pending = 0;
	uint64_t keep = base_keep > cursor ? base_keep : cursor;
	keep = (keep + SHIM_STAGING_CHUNK - 1) / SHIM_STAGING_CHUNK * SHIM_STAGING_CHUNK;
	while (nslabs > 0 && capacity > keep) {
		struct slab *sl = &slabs[nslabs - 1];
		uint64_t drop = capacity - keep < sl->size ? capacity - keep : sl->size;
		char *at = sl->base + (sl->size - drop);
		sl->size -= drop;
		capacity -= drop;
		if (sl->size == 0)
			nslabs--;
		growing = 1;
		pthread_mutex_unlock(&pool_lock);
		munmap(at, drop);
		pthread_mutex_lock(&pool_lock);
		growing = 0;
		pthread_cond_broadcast(&pool_cond);
	}
}

/* ---- copy workers ---- */

static shim_gpu_stream worker_stream(struct worker *w, int dev, struct gcr_err *err)
{
	if (dev < 0 || dev >= SHIM_MAX_DEVICES) {
		gcr_err_set(err, -EINVAL, "GPU %d out of range", dev);
		return NULL;
	}
	int rc = gpu->set_device(dev, err);
	/* Each piece is made only if missing: a set-up that failed half-way (no memory for an
	 * event) is finished by the next operation instead of leaving a stream without events. */
	if (rc == 0 && w->stream[dev] == NULL)
		rc = gpu->stream_create(dev, &w->stream[dev], err);
	for (int k = 0; k < 2 && rc == 0; k++)
		if (w->ev[dev][k] == NULL)
			rc = gpu->event_create(&w->ev[dev][k], err);
	if (rc < 0) {
		step_fail(err, "copy stream set-up");
		return NULL;
	}
	w->used[dev] = 1;
	return w->stream[dev];
}

static void job_fail(struct job *j, const struct gcr_err *e)
{
	int expect = 0;
	if (atomic_compare_exchange_strong(&j->failed, &expect, 1)) {
		j->rc = e->code;
		j->err = *e;
	}
}

/* The checksums of a piece being written: a second thread per writer takes them while the
 * writer waits on the disk, so a writer's turn is the longer of the two rather than their sum
 * (CRC-32C of 64 MiB ~5 ms beside a ~26 ms write). */
struct crc_pipe {
	pthread_t th;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const char *src; /* under lock: the piece to sum, NULL when none is waiting */
	const struct shim_xfer *x;
	int busy, stop;
};

static void crc_piece(const char *slot, const struct shim_xfer *x)
{
	/* One checksum per chunk: a piece is whole chunks, the last one maybe short. */
	for (uint32_t k = 0; k < x->size; k += SHIM_STAGING_CHUNK)
		x->crc_out[k / SHIM_STAGING_CHUNK] =
			gcr_crc32c_update(0, slot + k, x->size - k < SHIM_STAGING_CHUNK ? x->size - k : SHIM_STAGING_CHUNK);
}

static void *crc_main(void *arg)
{
	struct crc_pipe *c = arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (c->src == NULL && !c->stop)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->src == NULL)
			break;
		const char *src = c->src;
		const struct shim_xfer *x = c->x;
		pthread_mutex_unlock(&c->lock);
		crc_piece(src, x);
		pthread_mutex_lock(&c->lock);
		c->src = NULL;
		c->busy = 0;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

/* 0, or -1 when no thread could be made: the writer then sums the pieces itself. */
static int crc_pipe_start(struct crc_pipe *c)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (pthread_create(&c->th, NULL, crc_main, c) == 0)
		return 0;
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	return -1;
}

static void crc_pipe_stop(struct crc_pipe *c)
{
	pthread_mutex_lock(&c->lock);
	c->stop = 1;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	pthread_join(c->th, NULL);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
}

/* A chunk from a pinned slot straight to its image file (suspend to an image: no staging).
 * Direct I/O where offset and length allow (the slot is page-aligned): the disk's own speed,
 * where the page cache's write-back reached about half of it (1.4 of 2.2 GB/s on the H200
 * machine). The checksums go to c's thread (NULL: here) while the write runs. */
static int file_drain(const char *slot, const struct shim_xfer *x, struct crc_pipe *c, struct gcr_err *err)
{
	if (c != NULL) {
		pthread_mutex_lock(&c->lock);
		c->src = slot;
		c->x = x;
		c->busy = 1;
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
	}
	int rc = gcr_image_pwrite(x->fd, x->dfd, slot, x->size, x->off); /* the slot is page-aligned */
	if (c != NULL) {
		/* Always waited for, even after a failed write: the slot is reused next. */
		pthread_mutex_lock(&c->lock);
		while (c->busy)
			pthread_cond_wait(&c->cond, &c->lock);
		pthread_mutex_unlock(&c->lock);
	} else if (rc == 0) {
		crc_piece(slot, x);
	}
	if (rc < 0)
		return gcr_err_set(err, rc, "writing %s at %llu: %s", x->name, (unsigned long long)x->off, strerror(-rc));
	return 0;
}

/* Device to pool: DMA into one slot while memcpy'ing the other out. */
static int run_out(struct worker *w, struct job *j, struct gcr_err *err)
{
	long pend[2] = { -1, -1 };
	int cur = 0, rc = 0;
	struct crc_pipe pipe, *crc = NULL;
	if (j->to_files && crc_pipe_start(&pipe) == 0)
		crc = &pipe;
	for (;;) {
		size_t i = atomic_load(&j->failed) || rc ? j->n : atomic_fetch_add(&j->next, 1);
		if (i < j->n && j->order != NULL)
			i = j->order[i];
		if (i < j->n) {
			const struct shim_xfer *x = &j->x[i];
			shim_gpu_stream s = worker_stream(w, x->device, err);
			if (s == NULL)
				rc = err->code;
			else if (gpu->copy_dtoh_async(w->slot[cur], x->dev, x->size, s, err) < 0 ||
				 gpu->event_record(w->ev[x->device][cur], s, err) < 0)
				rc = step_fail(err, "copy to staging");
			if (rc == 0)
				pend[cur] = (long)i;
		}
		for (int pass = 0; pass < 2; pass++) {
			/* The other slot first; on the way out, this one too. */
			int k = pass == 0 ? cur ^ 1 : cur;
			if (pass == 1 && i < j->n && rc == 0)
				break;
			if (pend[k] < 0)
				continue;
			const struct shim_xfer *x = &j->x[pend[k]];
			struct gcr_err e2;
			if (gpu->event_sync(w->ev[x->device][k], &e2) < 0 && rc == 0) {
				*err = e2;
				rc = step_fail(err, "copy to staging");
			}
			if (rc == 0 && x->file)
				rc = file_drain(w->slot[k], x, crc, err);
			else if (rc == 0)
				memcpy(host_at(x->off), w->slot[k], x->size);
			if (rc == 0 && j->left != NULL && atomic_fetch_sub(&j->left[x->group], 1) == 1) {
				pthread_mutex_lock(&job_lock);
				j->doneq[j->ndone++] = x->group;
				pthread_cond_broadcast(&done_cond);
				pthread_mutex_unlock(&job_lock);
			}
			pend[k] = -1;
		}
		if (i >= j->n || rc)
			break;
		cur ^= 1;
	}
	if (crc != NULL)
		crc_pipe_stop(crc);
	return rc;
}

/* An image file's chunk straight into a pinned slot, checked: a corrupt chunk never
 * reaches the GPU. The page cache's copy is the only copy the host makes. */
static int file_fill(char *slot, const struct shim_xfer *x, struct gcr_err *err)
{
	int rc = gcr_image_pread(x->fd, slot, x->size, x->off);
	if (rc < 0)
		return gcr_err_set(err, rc, "reading %s at %llu: %s", x->name, (unsigned long long)x->off,
				   rc == -EIO ? "file too short" : strerror(-rc));
	if (gcr_crc32c_update(0, slot, x->size) != x->crc)
		return gcr_err_set(err, -EIO, "%s: the chunk at %llu does not match its CRC-32C (" GCR_IMAGE_CORRUPT ")",
				   x->name, (unsigned long long)x->off);
	return 0;
}

/* Pool (or image file) to device: fill one slot while the other's DMA runs. */
static int run_in(struct worker *w, struct job *j, struct gcr_err *err)
{
	int pend_dev[2] = { -1, -1 };
	int cur = 0, rc = 0;
	while (rc == 0 && !atomic_load(&j->failed)) {
		size_t i = atomic_fetch_add(&j->next, 1);
		if (i >= j->n)
			break;
		const struct shim_xfer *x = &j->x[j->order != NULL ? j->order[i] : i];
		shim_gpu_stream s = worker_stream(w, x->device, err);
		if (s == NULL) {
			rc = err->code;
			break;
		}
		if (x->zero) {
			if (gpu->memset_async(x->dev, x->size, s, err) < 0)
				rc = step_fail(err, "zeroing a chunk");
			continue;
		}
		if (pend_dev[cur] >= 0 && gpu->event_sync(w->ev[pend_dev[cur]][cur], err) < 0) {
			rc = step_fail(err, "copy from staging");
			break;
		}
		if (x->file) {
			if ((rc = file_fill(w->slot[cur], x, err)) < 0)
				break;
		} else {
			memcpy(w->slot[cur], host_at(x->off), x->size);
		}
		if (gpu->copy_htod_async(x->dev, w->slot[cur], x->size, s, err) < 0 ||
		    gpu->event_record(w->ev[x->device][cur], s, err) < 0) {
			rc = step_fail(err, "copy from staging");
			break;
		}
		pend_dev[cur] = x->device;
		cur ^= 1;
	}
	return rc;
}

/* One job's share for one worker: its pieces, then its streams drained. */
static void worker_run(struct worker *w, struct job *j)
{
	struct gcr_err err = { 0 };
	memset(w->used, 0, sizeof(w->used));
	/* Pieces larger than a slot (a suspend to files writes up to shim_staging_file_piece()
	 * at once: the disk takes larger writes faster) get two pinned slots of that size for this
	 * job only, so no more memory stays pinned than usual. */
	char *small[2] = { w->slot[0], w->slot[1] }, *big[2] = { NULL, NULL };
	int rc = 0;
	if (j->piece > SHIM_STAGING_CHUNK && pin_ctx != NULL) /* pinned in the slots' context */
		rc = gpu->ctx_set(pin_ctx, &err);
	for (int k = 0; k < 2 && j->piece > SHIM_STAGING_CHUNK && rc == 0; k++)
		if ((rc = gpu->host_alloc((void **)&big[k], j->piece, &err)) == 0)
			w->slot[k] = big[k];
	if (rc < 0)
		job_fail(j, &err);
	else
		rc = j->out ? run_out(w, j, &err) : run_in(w, j, &err);
	for (int d = 0; d < SHIM_MAX_DEVICES; d++) {
		if (!w->used[d])
			continue;
		struct gcr_err e2;
		int r = gpu->set_device(d, &e2);
		if (r == 0)
			r = gpu->stream_sync(w->stream[d], &e2);
		if (r < 0 && rc == 0) {
			err = e2;
			rc = err.code;
		}
	}
	/* After the streams drained: no copy into them is left in flight. */
	w->slot[0] = small[0];
	w->slot[1] = small[1];
	for (int k = 0; k < 2; k++)
		if (big[k] != NULL)
			gpu->host_free(big[k], j->piece);
	if (rc < 0)
		job_fail(j, &err);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	shim_real_relax_capture();
	pthread_mutex_lock(&job_lock);
	unsigned seen = w->seen;
	for (;;) {
		while (job_gen == seen)
			pthread_cond_wait(&job_cond, &job_lock);
		seen = job_gen;
		struct job *j = job;
		pthread_mutex_unlock(&job_lock);
		if (w - workers < j->nactive)
			worker_run(w, j);
		pthread_mutex_lock(&job_lock);
		if (--job_left == 0)
			pthread_cond_broadcast(&done_cond);
	}
	return NULL;
}

/* Allocates worker i's pinned slots and starts it. Called without pool_lock. */
static int worker_start(int i, void *ctx, struct gcr_err *err)
{
	struct worker *w = &workers[i];
	memset(w, 0, sizeof(*w));
	if (ctx != NULL)
		(void)gpu->ctx_set(ctx, err);
	for (int k = 0; k < 2; k++) {
		int rc = gpu->host_alloc((void **)&w->slot[k], SHIM_STAGING_CHUNK, err);
		if (rc < 0) {
			if (k == 1)
				gpu->host_free(w->slot[0], SHIM_STAGING_CHUNK);
			return rc;
		}
	}
	/* Workers start only while no transfer runs (the background thread is
	 * paused during suspend and resume), so the next job is this one's first. */
	pthread_mutex_lock(&job_lock);
	w->seen = job_gen;
	pthread_mutex_unlock(&job_lock);
	int prc = pthread_create(&w->th, NULL, worker_main, w);
	if (prc != 0) {
		gpu->host_free(w->slot[0], SHIM_STAGING_CHUNK);
		gpu->host_free(w->slot[1], SHIM_STAGING_CHUNK);
		return gcr_err_set(err, -prc, "cannot start a copy worker: %s", strerror(prc));
	}
	pthread_detach(w->th);
	return 0;
}

/* Starts workers up to want; pool_lock held on entry and exit, dropped meanwhile. */
static int workers_grow(int want, struct gcr_err *err)
{
	int rc = 0;
	while (rc == 0 && nworkers + starting_workers < want) {
		int i = nworkers + starting_workers++;
		void *ctx = pin_ctx;
		pthread_mutex_unlock(&pool_lock);
		rc = worker_start(i, ctx, err);
		pthread_mutex_lock(&pool_lock);
		starting_workers--;
		if (rc == 0)
			nworkers++;
		pthread_cond_broadcast(&pool_cond);
	}
	return rc;
}

/* ---- background thread: workers, the digest module, then the pool ---- */

static uint64_t target_now(void)
{
	if (!trimmed)
		return noted;
	return base_keep + (noted > base_noted ? noted - base_noted : 0);
}

static void *grow_thread(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	shim_real_relax_capture();
	pthread_mutex_lock(&pool_lock);
	int warned = 0;
	for (;;) {
		if (trim_pending && !growing) {
			pool_trim_locked(); /* no driver calls: allowed while paused */
			continue;
		}
		target = target_now();
		int want = workers_wanted(noted);
		while (!paused && !growing && nworkers < want && !warned) {
			struct gcr_err err;
			if (workers_grow(want, &err) < 0) {
				GCR_LOG(GCR_LOG_WARN, "shim", "staging: %s", err.msg);
				warned = 1;
			}
		}
		if (!paused && !growing && pin_ctx != NULL && !digest_loaded) {
			void *ctx = pin_ctx; /* CUDA only: HIP has no contexts, and no digest kernel */
			growing = 1; /* prepare waits for this driver work to finish */
			pthread_mutex_unlock(&pool_lock);
			shim_digest_preload(gpu, ctx); /* JIT-compiles once, off the critical path */
			pthread_mutex_lock(&pool_lock);
			growing = 0;
			digest_loaded = 1;
			pthread_cond_broadcast(&pool_cond);
		}
		target = target_now();
		if (paused || growing || capacity >= target) {
			pthread_cond_wait(&pool_cond, &pool_lock);
			continue;
		}
		uint64_t need = target - capacity;
		need = need < SLAB_MIN ? SLAB_MIN : need > SLAB_MAX ? SLAB_MAX : need;
		uint64_t room = host_room().room;
		if (need > room)
			need = room / SLAB_MIN * SLAB_MIN;
		struct gcr_err err;
		if (need == 0) {
			GCR_LOG(GCR_LOG_WARN, "shim",
				"staging: host memory is short (%llu MiB may still be faulted in, %llu MiB wanted): "
				"the rest is faulted in at suspend",
				(unsigned long long)(room >> 20), (unsigned long long)((target - capacity) >> 20));
			uint64_t t = noted; /* look again when the process allocates or frees */
			while (noted == t)
				pthread_cond_wait(&pool_cond, &pool_lock);
		} else if (pool_grow(need, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "shim", "staging: %s; will fault in at suspend instead", err.msg);
			uint64_t t = noted; /* no retry loop: wait for new growth */
			while (noted == t)
				pthread_cond_wait(&pool_cond, &pool_lock);
		}
	}
	return NULL;
}

void shim_staging_note_bytes(uint64_t bytes, int device, const struct shim_gpu_ops *g, void *ctx)
{
	if (!shim_cfg.staging_prepare)
		return;
	pthread_mutex_lock(&pool_lock);
	int new_gpu = device >= 0 && device < SHIM_MAX_DEVICES && !(devices_noted & (1ull << device));
	devices_noted |= new_gpu ? 1ull << device : 0; /* a new GPU may want more workers */
	if (gpu == NULL)
		gpu = g;
	if (pin_ctx == NULL && g == gpu)
		pin_ctx = ctx;
	if (bytes != noted || new_gpu) {
		noted = bytes;
		if (!thread_started) {
			pthread_t th;
			thread_started = pthread_create(&th, NULL, grow_thread, NULL) == 0;
			if (thread_started)
				pthread_detach(th);
		}
		pthread_cond_broadcast(&pool_cond);
	}
	pthread_mutex_unlock(&pool_lock);
}

#define MIB(b) ((unsigned long long)((b) >> 20))

/* Whether more bytes may be faulted in for a suspend moving need bytes: 0, or -ENOMEM with a
 * message naming the bound, so the suspend is refused before anything left the GPU. */
static int room_for(uint64_t more, uint64_t need, struct gcr_err *err)
{
	struct host_room r = host_room();
	if (more <= r.room)
		return 0;
	if (r.by_cgroup)
		return gcr_err_set(err, -ENOMEM,
				   "the container's memory limit (%llu MiB, cgroup v%d) cannot hold the suspend's %llu MiB "
				   "of GPU data: it uses %llu MiB, %llu MiB more may be faulted in (1/16 of the limit kept "
				   "free), %llu MiB more needed; process left running: raise its memory limit by at least "
				   "%llu MiB (docs/install.md)",
				   MIB(r.cg.limit), r.cg.version, MIB(need), MIB(r.cg.used), MIB(r.room), MIB(more),
				   MIB(more - r.room) + 1);
	return gcr_err_set(err, -ENOMEM,
			   "host memory cannot hold the suspend's %llu MiB of GPU data: %llu MiB available, %llu MiB "
			   "of it kept in reserve, %llu MiB more needed; process left running",
			   MIB(need), MIB(r.avail), MIB(r.reserve), MIB(more));
}

int shim_staging_prepare(const struct shim_gpu_ops *g, uint64_t need, struct gcr_err *err)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	if (gpu == NULL)
		gpu = g;
	if (gpu != g) {
		pthread_mutex_unlock(&pool_lock);
		return gcr_err_set(err, -ENOTSUP, "staging was set up for %s, not %s", gpu->name, g->name);
	}
	if (pin_ctx == NULL) {
		struct gcr_err e2;
		(void)gpu->ctx_get(&pin_ctx, &e2);
	}
	while (growing || starting_workers > 0 || trim_pending)
		pthread_cond_wait(&pool_cond, &pool_lock);
	/* Paused before this drops the lock to start workers or fault memory in: otherwise the
	 * background thread spins (lock held) on the workers this starts, or starts one that joins
	 * the next transfer uncounted. Stays paused until resume: the process may be locked by the
	 * driver next. */
	paused = 1;
	if (nworkers == 0) {
		GCR_LOG(GCR_LOG_INFO, "shim", "staging: starting copy workers on the critical path");
		rc = workers_grow(workers_wanted(need), err);
	}
	if (rc == 0 && capacity < cursor + need)
		rc = room_for(cursor + need - capacity, need, err);
	while (rc == 0 && capacity < cursor + need) {
		uint64_t more = cursor + need - capacity;
		more = more > SLAB_MAX ? SLAB_MAX : more;
		grown_inline += more;
		rc = pool_grow(more, err);
	}
	if (grown_inline > 0 && rc == 0)
		GCR_LOG(GCR_LOG_INFO, "shim", "staging: %llu bytes faulted in on the critical path so far",
			(unsigned long long)grown_inline);
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

void shim_staging_reset(void)
{
	pthread_mutex_lock(&pool_lock);
	cursor = 0;
	pthread_mutex_unlock(&pool_lock);
}

uint64_t shim_staging_file_piece(void)
{
	uint64_t n = (uint64_t)shim_cfg.image_piece_mib << 20;
	n = n / SHIM_STAGING_CHUNK * SHIM_STAGING_CHUNK;
	return n < SHIM_STAGING_CHUNK ? SHIM_STAGING_CHUNK : n > SHIM_STAGING_FILE_PIECE ? SHIM_STAGING_FILE_PIECE : n;
}

int shim_staging_alloc(uint64_t size, uint64_t *off)
{
	size = (size + SHIM_STAGING_CHUNK - 1) / SHIM_STAGING_CHUNK * SHIM_STAGING_CHUNK;
	pthread_mutex_lock(&pool_lock);
	int rc = cursor + size <= capacity ? 0 : -ENOSPC;
	if (rc == 0) {
		*off = cursor;
		cursor += size;
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_staging_order(const struct shim_xfer *x, size_t n, size_t **order, struct gcr_err *err)
{
	size_t per[SHIM_MAX_DEVICES] = { 0 }, ndev = 0;
	*order = NULL;
	for (size_t i = 0; i < n; i++) {
		int d = x[i].device;
		if (d < 0 || d >= SHIM_MAX_DEVICES)
			return gcr_err_set(err, -EINVAL, "a piece on GPU %d (at most %d GPUs)", d, SHIM_MAX_DEVICES);
		ndev += per[d]++ == 0;
	}
	if (ndev < 2)
		return 0;
	size_t *o = malloc(n * sizeof(*o));
	if (o == NULL)
		return gcr_err_set(err, -ENOMEM, "out of host memory for the copy order of %zu pieces", n);
	size_t next[SHIM_MAX_DEVICES] = { 0 }, k = 0; /* next[d]: GPU d's first piece not placed */
	while (k < n) {
		for (int d = 0; d < SHIM_MAX_DEVICES && k < n; d++) {
			if (per[d] == 0)
				continue;
			while (next[d] < n && x[next[d]].device != d)
				next[d]++;
			if (next[d] < n)
				o[k++] = next[d]++;
		}
	}
	*order = o;
	return 0;
}

int shim_staging_transfer(int out, const struct shim_xfer *x, size_t n, const struct shim_staging_groups *g,
			  struct gcr_err *err)
{
	pthread_mutex_lock(&pool_lock);
	int nw = nworkers;
	const struct shim_gpu_ops *ops = gpu;
	pthread_mutex_unlock(&pool_lock);
	if (n > 0) {
		if (ops == NULL || nw == 0)
			return gcr_err_set(err, -ENODEV, "no copy workers (staging not prepared)");
		int lrc = ops->load(err);
		if (lrc < 0)
			return lrc;
	}
	struct job j = { .out = out, .x = x, .n = n, .nactive = nw };
	for (size_t i = 0; i < n; i++) {
		if (x[i].size > SHIM_STAGING_FILE_PIECE || (x[i].size > SHIM_STAGING_CHUNK && !(out && x[i].file)))
			return gcr_err_set(err, -EINVAL, "a piece of %u bytes (only a write to a file may exceed %llu)",
					   x[i].size, (unsigned long long)SHIM_STAGING_CHUNK);
		j.piece = x[i].size > j.piece ? x[i].size : j.piece;
		j.to_files |= out && x[i].file;
	}
	/* Writes to an image: the disk, not PCIe, sets the pace, and it prefers a few streams. */
	if (j.to_files && shim_cfg.image_writers < nw)
		j.nactive = shim_cfg.image_writers;
	int orc = shim_staging_order(x, n, &j.order, err);
	if (orc < 0)
		return orc;
	size_t ng = out && g != NULL ? g->ngroups : 0, reported = 0;
	int cb_stop = 0;
	if (ng > 0) {
		j.left = calloc(ng, sizeof(*j.left));
		j.doneq = calloc(ng, sizeof(*j.doneq));
		if (j.left == NULL || j.doneq == NULL) {
			free(j.left);
			free(j.doneq);
			return gcr_err_set(err, -ENOMEM, "out of host memory for the copy groups of %zu allocations", ng);
		}
		for (size_t i = 0; i < n; i++)
			j.left[x[i].group]++;
		for (size_t k = 0; k < ng; k++)
			if (j.left[k] == 0)
				j.doneq[j.ndone++] = k;
	}
	pthread_mutex_lock(&job_lock);
	if (n > 0) {
		job = &j;
		job_left = nw;
		job_gen++;
		pthread_cond_broadcast(&job_cond);
	}
	for (;;) {
		/* Finished groups first: their callbacks overlap the copies still running. */
		while (reported < j.ndone) {
			size_t k = j.doneq[reported++];
			if (cb_stop)
				continue;
			pthread_mutex_unlock(&job_lock);
			cb_stop = g->done(k, g->ctx) != 0;
			pthread_mutex_lock(&job_lock);
		}
		if (n == 0 || job_left == 0)
			break;
		pthread_cond_wait(&done_cond, &job_lock);
	}
	job = NULL;
	pthread_mutex_unlock(&job_lock);
	free(j.order);
	free(j.left);
	free(j.doneq);
	if (j.rc < 0)
		*err = j.err;
	return j.rc;
}

void shim_staging_trim(uint64_t keep)
{
	pthread_mutex_lock(&pool_lock);
	base_keep = keep;
	base_noted = noted;
	trimmed = 1;
	trim_pending = capacity > keep;
	if (trim_pending && !thread_started)
		pool_trim_locked(); /* no background thread: do it here */
	target = target_now();
	pthread_cond_broadcast(&pool_cond);
	pthread_mutex_unlock(&pool_lock);
}

void shim_staging_quiesce(void)
{
	pthread_mutex_lock(&pool_lock);
	while (growing || trim_pending)
		pthread_cond_wait(&pool_cond, &pool_lock);
	pthread_mutex_unlock(&pool_lock);
}

void shim_staging_resume_background(void)
{
	pthread_mutex_lock(&pool_lock);
	paused = 0;
	pthread_cond_broadcast(&pool_cond);
	pthread_mutex_unlock(&pool_lock);
}

char *shim_staging_host(uint64_t off)
{
	pthread_mutex_lock(&pool_lock);
	char *p = off < capacity ? host_at(off) : NULL;
	pthread_mutex_unlock(&pool_lock);
	return p;
}

void shim_staging_drop(void)
{
	shim_staging_reset();
	shim_staging_trim(0);
	shim_staging_quiesce();
}

void shim_staging_stats(struct shim_staging_stats *st)
{
	pthread_mutex_lock(&pool_lock);
	*st = (struct shim_staging_stats){ .capacity = capacity, .used = cursor,
					   .ring = (uint64_t)nworkers * 2 * SHIM_STAGING_CHUNK,
					   .target = target_now(), .grown_inline = grown_inline,
					   .workers = nworkers, .fault_ms = fault_ms };
	/* No digest kernel to load off CUDA (shim_digest). */
	st->ready = capacity >= st->target && nworkers >= workers_wanted(noted) &&
		    (digest_loaded || !thread_started || (gpu != NULL && gpu->digest_preload == NULL)) && !trim_pending;
	pthread_mutex_unlock(&pool_lock);
}
