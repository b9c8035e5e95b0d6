/* shim_cr: suspend and resume of the process's buffers, keeping virtual addresses:
 * gate -> sync -> digest (shim_digest) -> per chunk zero / unchanged / copy
 * (shim_chunks) -> copy out (shim_staging) -> release; and create -> map -> copy
 * in. Every failure unwinds to the state the operation started in. The process's one GPU
 * backend (CUDA or HIP) does the vendor calls, through struct shim_gpu_ops; a communication
 * library over it (NCCL) is held, torn down and made again through struct shim_comm_ops. */
#include "shim_cr.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_time.h"
#include "shim_alloc.h"
#include "shim_comm.h"
#include "shim_pool.h"
#include "shim_config.h"
#include "shim_gate.h"
#include "shim_gpu.h"
#include "shim_real.h"
#include "shim_digest.h"
#include "shim_chunks.h"
#include "shim_staging.h"

static pthread_mutex_t cr_lock = PTHREAD_MUTEX_INITIALIZER; /* one operation at a time */
/* The machine's state: its state proper, where the GPU data is, the wake and the restore's
 * need. state and data change only in cr_set (cr_lock held); they are read without it. */
static _Atomic int state;
static _Atomic int data;
static const struct shim_gpu_ops *backend; /* chosen at suspend, kept until resumed; cr_lock */
/* The communication library a group member's communicators belong to (one today). */
static const struct shim_comm_ops *const comm_lib = &shim_nccl_ops;
/* A held group member (frozen, drained, rebuilt) thaws by itself at hold_until (monotonic ms, 0:
 * not held), hold_ms after each step of its group's operation; cr_lock. */
static double hold_until;
static int hold_ms;
/* The wake: wake_lock serialises the gate's callers (application threads, which must not wait
 * for cr_lock: a suspend holds it while they queue at the gate); off is stored without it. */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int wake;
static _Atomic double wake_since; /* monotonic ms of the first caller, once called */
/* The restore's need; need_lock (taken after cr_lock, never before it) so that the status reads
 * it without waiting for an operation. */
static pthread_mutex_t need_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gcr_need restore_need;
static int need_have;


/* The state machine: each state's name, the states it may go to, where the GPU data may be
 * while in it, and what it keeps and takes of the wake and the restore's need (a state without
 * a KEEP drops that on entry). Suspend: running -> suspending -> suspended, or back to running
 * when it failed and was undone (or stays suspended when undoing failed too: a resume restores
 * it). Resume: suspended -> resuming -> running, or back to suspended when it failed
 * (retryable). A group member: running -> frozen -> drained (or back to running: thawed) ->
 * detached (communicators torn down) -> suspending -> suspended (or back to detached);
 * resuming -> detached -> rebuilding -> rebuilt (or back to detached) -> running. */
#define EDGE(s) (1u << (s))
#define AT(d) (1u << (d))
enum {
	NEED_KEEP = 1,     /* a restore need outlives entering this state */
	NEED_TAKE = 2,     /* the restore_need op is accepted here */
	WAKE_KEEP = 4,     /* a wake outlives entering this state */
	WAKE_ARM = 8,      /* a wake may be armed here (with the data in host memory) */
};
#define OFF_GPU AT(SHIM_CR_DATA_HOST) | AT(SHIM_CR_DATA_WRITTEN) | AT(SHIM_CR_DATA_FILES)
static const struct {
	const char *name; /* on the wire: status replies */
	unsigned to;      /* EDGE() of every state it may go to */
	unsigned data;    /* AT() of every place the data may be while in it */
	unsigned keeps;   /* NEED_*, WAKE_* */
} states[SHIM_CR_NSTATES] = {
	[SHIM_CR_RUNNING] = { GCR_STATE_RUNNING, EDGE(SHIM_CR_SUSPENDING) | EDGE(SHIM_CR_FROZEN), AT(SHIM_CR_DATA_GPU), 0 },
	/* The data counts as on the GPU until the suspend is done. */
	[SHIM_CR_SUSPENDING] = { GCR_STATE_SUSPENDING, EDGE(SHIM_CR_RUNNING) | EDGE(SHIM_CR_SUSPENDED) | EDGE(SHIM_CR_DETACHED),
				 AT(SHIM_CR_DATA_GPU), 0 },
	[SHIM_CR_SUSPENDED] = { GCR_STATE_SUSPENDED, EDGE(SHIM_CR_RESUMING), OFF_GPU,
				NEED_KEEP | NEED_TAKE | WAKE_KEEP | WAKE_ARM },
	/* Read from where it is until the resume is done; a failed resume keeps the need and the wake. */
	[SHIM_CR_RESUMING] = { GCR_STATE_RESUMING, EDGE(SHIM_CR_RUNNING) | EDGE(SHIM_CR_SUSPENDED) | EDGE(SHIM_CR_DETACHED),
			       AT(SHIM_CR_DATA_HOST) | AT(SHIM_CR_DATA_FILES), NEED_KEEP | WAKE_KEEP },
	[SHIM_CR_FROZEN] = { GCR_STATE_FROZEN, EDGE(SHIM_CR_RUNNING) | EDGE(SHIM_CR_DRAINED), AT(SHIM_CR_DATA_GPU), 0 },
	[SHIM_CR_DRAINED] = { GCR_STATE_DRAINED, EDGE(SHIM_CR_RUNNING) | EDGE(SHIM_CR_DETACHED) | EDGE(SHIM_CR_FROZEN),
			      AT(SHIM_CR_DATA_GPU), 0 },
	[SHIM_CR_DETACHED] = { GCR_STATE_DETACHED, EDGE(SHIM_CR_SUSPENDING) | EDGE(SHIM_CR_REBUILDING), AT(SHIM_CR_DATA_GPU), 0 },
	[SHIM_CR_REBUILDING] = { GCR_STATE_REBUILDING, EDGE(SHIM_CR_REBUILT) | EDGE(SHIM_CR_DETACHED), AT(SHIM_CR_DATA_GPU), 0 },
	[SHIM_CR_REBUILT] = { GCR_STATE_REBUILT, EDGE(SHIM_CR_RUNNING) | EDGE(SHIM_CR_DETACHED), AT(SHIM_CR_DATA_GPU), 0 },
};
/* Where the data may go from each place: out by a suspend (to files: written; undone from the
 * files and that failing: files), image-write and drop, image-read (and its failure), back by
 * a resume. */
static const struct {
	const char *name; /* status "data" */
	unsigned to;      /* AT() of every place it may go to */
} places[SHIM_CR_NDATA] = {
	[SHIM_CR_DATA_GPU] = { GCR_DATA_GPU, AT(SHIM_CR_DATA_HOST) | AT(SHIM_CR_DATA_WRITTEN) | AT(SHIM_CR_DATA_FILES) },
	[SHIM_CR_DATA_HOST] = { GCR_DATA_HOST, AT(SHIM_CR_DATA_GPU) | AT(SHIM_CR_DATA_WRITTEN) },
	[SHIM_CR_DATA_WRITTEN] = { GCR_DATA_WRITTEN, AT(SHIM_CR_DATA_FILES) },
	[SHIM_CR_DATA_FILES] = { GCR_DATA_FILES, AT(SHIM_CR_DATA_GPU) | AT(SHIM_CR_DATA_WRITTEN) },
};
/* Suspend and resume requests that reached this process, refused ones included: what a test
 * reads to show that a process outside an operation's pod was never touched. */
static _Atomic unsigned long long n_suspend, n_resume;

void shim_cr_requests(unsigned long long *suspends, unsigned long long *resumes)
{
	*suspends = n_suspend;
	*resumes = n_resume;
}

enum shim_cr_state shim_cr_state(void)
{
	return (enum shim_cr_state)state;
}

const char *shim_cr_state_name(enum shim_cr_state s)
{
	return (unsigned)s < SHIM_CR_NSTATES ? states[s].name : "unknown";
}

enum shim_cr_data shim_cr_data(void)
{
	return (enum shim_cr_data)data;
}

const char *shim_cr_data_name(enum shim_cr_data d)
{
	return (unsigned)d < SHIM_CR_NDATA ? places[d].name : "unknown";
}

int shim_cr_edge_check(enum shim_cr_state from, enum shim_cr_state to, struct gcr_err *err)
{
	if ((unsigned)from < SHIM_CR_NSTATES && (unsigned)to < SHIM_CR_NSTATES && (states[from].to & EDGE(to)))
		return 0;
	return gcr_err_set(err, -EINVAL, "state machine: no edge from %s to %s", shim_cr_state_name(from),
			   shim_cr_state_name(to));
}

int shim_cr_data_check(enum shim_cr_state s, enum shim_cr_data from, enum shim_cr_data to, struct gcr_err *err)
{
	if ((unsigned)s >= SHIM_CR_NSTATES || (unsigned)from >= SHIM_CR_NDATA || (unsigned)to >= SHIM_CR_NDATA ||
	    !(states[s].data & AT(to)))
		return gcr_err_set(err, -EINVAL, "state machine: no data %s while %s", shim_cr_data_name(to),
				   shim_cr_state_name(s));
	if (from != to && !(places[from].to & AT(to)))
		return gcr_err_set(err, -EINVAL, "state machine: the data cannot go from %s to %s",
				   shim_cr_data_name(from), shim_cr_data_name(to));
	return 0;
}

/* The one place the state and the data change (cr_lock held), together, so a state never
 * holds data where its row says it cannot be. An edge the table does not have is a bug: it is
 * logged and refused, and nothing changes. Entering a state drops what it does not keep. */
static int cr_set(enum shim_cr_state to, enum shim_cr_data at, struct gcr_err *err)
{
	enum shim_cr_state from = (enum shim_cr_state)state;
	int rc = to == from ? 0 : shim_cr_edge_check(from, to, err);
	if (rc == 0)
		rc = shim_cr_data_check(to, (enum shim_cr_data)data, at, err);
	if (rc < 0) {
		GCR_LOG(GCR_LOG_ERROR, "shim", "%s", err->msg);
		return rc;
	}
	data = (int)at;
	state = (int)to;
	if (!(states[to].keeps & WAKE_KEEP))
		atomic_store(&wake, SHIM_CR_WAKE_OFF);
	if (!(states[to].keeps & NEED_KEEP)) {
		pthread_mutex_lock(&need_lock);
		need_have = 0;
		pthread_mutex_unlock(&need_lock);
	}
	return 0;
}

/* A change of state that leaves the data where it is. */
static int cr_move(enum shim_cr_state to, struct gcr_err *err)
{
	return cr_set(to, (enum shim_cr_data)data, err);
}

/* For the unwind paths, whose err already holds the operation's failure. */
static void cr_set_back(enum shim_cr_state to, enum shim_cr_data at)
{
	struct gcr_err e2;
	(void)cr_set(to, at, &e2);
}

static void cr_move_back(enum shim_cr_state to)
{
	cr_set_back(to, (enum shim_cr_data)data);
}

int shim_cr_data_move(enum shim_cr_data to, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = cr_set((enum shim_cr_state)state, to, err);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_need_set(const struct gcr_need *n, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	if (!(states[state].keeps & NEED_TAKE))
		rc = gcr_err_set(err, -EINVAL, "a restore need is kept only while suspended (state %s)",
				 shim_cr_state_name(state));
	if (rc == 0 && (n->n == 0 || n->n > GCR_NEED_MAX_DEVICES))
		rc = gcr_err_set(err, -EINVAL, "a restore need of %zu GPUs", n->n);
	if (rc == 0) {
		pthread_mutex_lock(&need_lock);
		restore_need = *n;
		need_have = 1;
		pthread_mutex_unlock(&need_lock);
	}
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_need(struct gcr_need *out)
{
	pthread_mutex_lock(&need_lock);
	int have = need_have;
	if (have)
		*out = restore_need;
	pthread_mutex_unlock(&need_lock);
	return have;
}

int shim_cr_wake_arm(struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	if (!(states[state].keeps & WAKE_ARM) || data != SHIM_CR_DATA_HOST)
		rc = gcr_err_set(err, -EINVAL, "a wake is armed only while suspended to host memory (state %s, data %s)",
				 shim_cr_state_name(state), shim_cr_data_name(data));
	else if (atomic_load(&wake) == SHIM_CR_WAKE_OFF)
		atomic_store(&wake, SHIM_CR_WAKE_ARMED);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_wake_fire(double since_ms)
{
	int fired = 0;
	pthread_mutex_lock(&wake_lock);
	/* since first, so a status that sees "called" sees its time; a disarm racing this leaves
	 * the wake off (the exchange fails) and since unread. */
	if (atomic_load(&wake) == SHIM_CR_WAKE_ARMED && state == SHIM_CR_SUSPENDED) {
		int armed = SHIM_CR_WAKE_ARMED;
		atomic_store(&wake_since, since_ms);
		fired = atomic_compare_exchange_strong(&wake, &armed, SHIM_CR_WAKE_CALLED);
	}
	pthread_mutex_unlock(&wake_lock);
	return fired;
}

void shim_cr_wake_disarm(void)
{
	atomic_store(&wake, SHIM_CR_WAKE_OFF);
}

enum shim_cr_wake shim_cr_wake(double *since_ms)
{
	enum shim_cr_wake w = (enum shim_cr_wake)atomic_load(&wake);
	if (since_ms != NULL)
		*since_ms = w == SHIM_CR_WAKE_CALLED ? atomic_load(&wake_since) : 0;
	return w;
}

/* Test hook: with GCR_TEST_ALLOC_WINDOW set, a preloaded test library's
 * gcr_failmalloc_window(1) and (0) bracket each suspend and resume, so it can fail each
 * allocation made inside one in turn (tests/flow/test_alloc_sweep.py). Otherwise one
 * getenv per process. */
static void (*alloc_window_fn)(int);
static pthread_once_t alloc_window_once = PTHREAD_ONCE_INIT;

static void alloc_window_find(void)
{
	if (getenv("GCR_TEST_ALLOC_WINDOW") == NULL)
		return;
	union {
		void *ptr;
		void (*fn)(int);
	} u = { .ptr = shim_real_dlsym(RTLD_DEFAULT, "gcr_failmalloc_window") };
	alloc_window_fn = u.fn;
}

static void alloc_window(int open)
{
	pthread_once(&alloc_window_once, alloc_window_find);
	if (alloc_window_fn != NULL)
		alloc_window_fn(open);
}

/* The backends a process may use (a new vendor is one more entry). */
static const struct shim_gpu_ops *const backends[] = { &shim_cuda_ops, &shim_hip_ops };

/* The vendor whose runtime the process uses: one of them. 0, or -ENODEV (none initialised),
 * -ENOTSUP (two: one suspend cannot order two runtimes' control steps). */
static int choose_backend(const struct shim_gpu_ops **out, struct gcr_err *err)
{
	const struct shim_gpu_ops *found = NULL;
	for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++) {
		if (!backends[i]->present())
			continue;
		if (found != NULL)
			return gcr_err_set(err, -ENOTSUP,
					   "the process uses both CUDA and HIP; suspend supports one GPU runtime per process");
		found = backends[i];
	}
	if (found == NULL)
		return gcr_err_set(err, -ENODEV, "the process has not initialised CUDA (or HIP)");
	*out = found;
	return 0;
}

static int phys_device(const struct shim_phys *p)
{
	return p->device;
}

/* One staged allocation during an operation: where its bytes can be read or
 * written, and whether that is a temporary mapping the shim made. */
struct staged {
	struct shim_phys *p;
	shim_gpu_va va;
	int scratch;
	size_t first; /* its first chunk in the operation's digest array */
};

/* Maps p (wholly) at a fresh address, for handles the application did not map
 * whole anywhere. The caller unmaps it with scratch_unmap. */
static int scratch_map(struct staged *st, struct gcr_err *err)
{
	struct shim_phys *p = st->p;
	const struct shim_gpu_ops *g = p->gpu;
	shim_gpu_va va = 0;
	struct shim_gpu_access ad = { SHIM_GPU_LOC_DEVICE, phys_device(p), SHIM_GPU_PROT_READWRITE };
	struct gcr_err e2;
	if (g->reserve(&va, p->size, 0, err) < 0) {
		err->code = -ENOMEM;
		return gcr_err_wrap(err, "scratch range");
	}
	int rc = g->map(va, p->size, 0, p->real, err);
	if (rc == 0) {
		rc = g->set_access(va, p->size, &ad, 1, err);
		if (rc < 0)
			(void)g->unmap(va, p->size, &e2);
	}
	if (rc < 0) {
		(void)g->free_va(va, p->size, &e2);
		err->code = -EIO;
		return gcr_err_wrap(err, "mapping an allocation to copy it");
	}
	st->va = va;
	st->scratch = 1;
	return 0;
}

static void scratch_unmap_all(struct staged *st, size_t n)
{
	struct gcr_err err;
	for (size_t i = 0; i < n; i++) {
		if (!st[i].scratch)
			continue;
		(void)st[i].p->gpu->unmap(st[i].va, st[i].p->size, &err);
		(void)st[i].p->gpu->free_va(st[i].va, st[i].p->size, &err);
		st[i].scratch = 0;
		st[i].va = 0;
	}
}

/* The allocations to stage (live, or released by the app but still mapped), each
 * with its chunk table; with va set where it is wholly mapped. NULL + err on failure. */
struct list_walk {
	struct staged *st;
	size_t n, cap, nch;
	struct gcr_err *err;
};

static int list_one(struct shim_phys *p, uint64_t va, void *arg)
{
	struct list_walk *w = arg;
	if (p->real == 0 && p->nmaps == 0)
		return 0;
	/* Imported or exported between the check and here (those calls are not gated). */
	if (w->n == w->cap || p->shared)
		return gcr_err_set(w->err, -EBUSY, "GPU memory was shared with another process during the suspend");
	if (p->real == 0 && va == 0) /* released by the app, alive through partial mappings only */
		return gcr_err_set(w->err, -ENOTSUP, "a released, partly mapped allocation cannot be staged");
	if (p->chunks == NULL && (p->chunks = shim_chunks_new(p->size)) == NULL)
		return gcr_err_set(w->err, -ENOMEM, "out of host memory for the chunk table of a %zu-byte allocation", p->size);
	w->st[w->n++] = (struct staged){ .p = p, .va = va, .first = w->nch };
	w->nch += p->chunks->nchunks;
	return 0;
}

static struct staged *staged_list(size_t *n_out, size_t *nchunks_out, struct gcr_err *err)
{
	size_t cap = shim_alloc_nphys();
	struct list_walk w = { .st = calloc(cap + 1, sizeof(struct staged)), .cap = cap, .err = err };
	if (w.st == NULL) {
		gcr_err_set(err, -ENOMEM, "out of host memory for the list of allocations to stage");
		return NULL;
	}
	if (shim_alloc_each(SHIM_ALLOC_EACH_VA, list_one, &w) < 0) {
		free(w.st);
		return NULL;
	}
	*n_out = w.n;
	*nchunks_out = w.nch;
	return w.st;
}

/* Every chunk table forgets its placements and the pool starts over (after a failure
 * that may have left the pool half-written, or when not keeping copies). */
static int chunks_clear(struct shim_phys *p, uint64_t va, void *arg)
{
	(void)va;
	(void)arg;
	if (p->chunks != NULL)
		shim_chunks_clear(p->chunks);
	return 0;
}

static void chunks_reset(void)
{
	(void)shim_alloc_each(0, chunks_clear, NULL);
	shim_staging_reset();
}

/* With incremental copies the pool only grows; start over when more than half
 * of it is placements of allocations that are gone. */
static int chunks_placed(struct shim_phys *p, uint64_t va, void *arg)
{
	(void)va;
	if (p->chunks != NULL)
		*(uint64_t *)arg += shim_chunks_placed(p->chunks);
	return 0;
}

static void pool_compact_if_wasteful(void)
{
	struct shim_staging_stats ss;
	shim_staging_stats(&ss);
	uint64_t live = 0;
	(void)shim_alloc_each(0, chunks_placed, &live);
	if (ss.used > 2 * live + (64ull << 20))
		chunks_reset();
}

static uint32_t chunk_size(const struct shim_phys *p, size_t c)
{
	uint64_t lo = (uint64_t)c * GCR_DIGEST_CHUNK;
	return (uint32_t)(p->size - lo < GCR_DIGEST_CHUNK ? p->size - lo : GCR_DIGEST_CHUNK);
}

enum chunk_plan { CHUNK_COPY, CHUNK_ZERO, CHUNK_SAME };

/* What a suspend does with chunk c of ck, whose digest now is d (NULL: no digests):
 * record it as zero, keep the copy already held (incremental), or copy it. */
static enum chunk_plan plan_chunk(const struct shim_chunks *ck, size_t c, const struct shim_digest *d, int keep)
{
	if (d == NULL)
		return CHUNK_COPY;
	if (shim_cfg.zero_skip && d->any == 0)
		return CHUNK_ZERO;
	if (keep && ck->complete && ck->have_digests && !ck->zero[c] && ck->off[c] != SHIM_CHUNKS_NONE &&
	    memcmp(&ck->dig[c], d, sizeof(*d)) == 0)
		return CHUNK_SAME;
	return CHUNK_COPY;
}

/* Releases one staged allocation as soon as its data is off the GPU, while the
 * other copies go on: its temporary mapping, the application's mappings, then
 * the handle (a handle the app released goes with its last mapping). */
struct release_ctx {
	struct staged *st;
	int rc;
	struct gcr_err err;
	double ms;
	size_t released; /* calls made (a failed one may have released part) */
};

static int release_one(size_t k, void *arg)
{
	struct release_ctx *c = arg;
	struct shim_phys *p = c->st[k].p;
	double t0 = gcr_time_mono_ms();
	c->released++;
	scratch_unmap_all(&c->st[k], 1);
	/* Staged even when half done: its data is all in staging, and the unwind re-creates the
	 * handle if it went and re-maps what was unmapped. */
	int r = shim_alloc_release(p, &c->err);
	c->ms += gcr_time_mono_ms() - t0;
	if (r < 0) {
		c->rc = c->err.code = -EIO;
		gcr_err_wrap(&c->err, "releasing GPU memory");
		return 1;
	}
	return 0;
}

/* Suspend's data step after the gate closed and the GPU went idle: digests,
 * decides per chunk (zero / unchanged / copy), copies. On failure nothing on the
 * GPU was touched and the chunk tables are reset. */
static int save_all(struct staged *st, size_t n, size_t nch, const struct shim_cr_sink *sink,
		    size_t *released, struct shim_cr_report *rep, struct gcr_err *err)
{
	int rc = 0;
	struct shim_digest *dig = NULL;
	struct shim_digest_req *req = NULL;
	struct shim_xfer *x = NULL;
	double t0 = gcr_time_mono_ms();
	int keep = shim_cfg.incremental && sink == NULL;
	if (!keep)
		chunks_reset();
	else
		pool_compact_if_wasteful();
	for (size_t i = 0; i < n && rc == 0; i++)
		if (st[i].va == 0)
			rc = scratch_map(&st[i], err);
	int have_dig = 0;
	if (rc == 0 && (shim_cfg.zero_skip || keep)) {
		dig = calloc(nch + 1, sizeof(*dig));
		req = calloc(n + 1, sizeof(*req));
		if (dig == NULL || req == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of host memory for the digests of %zu chunks", nch);
		for (size_t i = 0; i < n && rc == 0; i++)
			req[i] = (struct shim_digest_req){ .va = st[i].va, .size = st[i].p->size,
							   .device = phys_device(st[i].p),
							   .first = st[i].first };
		if (rc == 0) {
			rc = shim_digest_run(backend, req, n, dig, err);
			have_dig = rc == 0;
			if (rc == -ENOMEM)
				GCR_LOG(GCR_LOG_WARN, "shim", "no digests this time (%s): copying every chunk", err->msg);
			/* No kernel here, or no GPU memory left for the digests (a full GPU
			 * must still be suspendable): copy every chunk. Other failures
			 * (the GPU itself failing) stop the suspend. */
			if (rc == -ENOSYS || rc == -ENOMEM)
				rc = 0;
		}
	}
	rep->ms_digest = gcr_time_mono_ms() - t0;
	/* Decide per chunk; count the pool bytes new placements need. */
	uint64_t need = 0;
	for (size_t i = 0; i < n && rc == 0 && sink == NULL; i++) {
		struct shim_chunks *ck = st[i].p->chunks;
		for (size_t c = 0; c < ck->nchunks; c++)
			if (ck->off[c] == SHIM_CHUNKS_NONE &&
			    plan_chunk(ck, c, have_dig ? &dig[st[i].first + c] : NULL, keep) == CHUNK_COPY)
				need += GCR_DIGEST_CHUNK;
	}
	if (rc == 0)
		rc = shim_staging_prepare(backend, need, err);
	size_t nx = 0;
	const uint64_t piece = shim_staging_file_piece();
	if (rc == 0 && (x = calloc(nch + 1, sizeof(*x))) == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of host memory for the copy list of %zu chunks", nch);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct shim_phys *p = st[i].p;
		struct shim_chunks *ck = p->chunks;
		int fd = -1, dfd = -1;
		const char *name = NULL;
		uint64_t foff = 0; /* the file's chunks back to back, in chunk order */
		if (sink != NULL && ((rc = sink->open(p, &fd, &dfd, &name, sink->ctx, err)) < 0 ||
				     (rc = shim_chunks_record(ck, name)) < 0)) {
			if (rc == -ENOMEM)
				gcr_err_set(err, rc, "out of host memory for the chunk table");
			break;
		}
		for (size_t c = 0; c < ck->nchunks && rc == 0; c++) {
			enum chunk_plan what = plan_chunk(ck, c, have_dig ? &dig[st[i].first + c] : NULL, keep);
			rep->bytes += chunk_size(p, c);
			if (what == CHUNK_ZERO) {
				ck->zero[c] = 1;
				rep->zero += chunk_size(p, c);
				continue;
			}
			if (what == CHUNK_SAME) {
				rep->unchanged += chunk_size(p, c);
				continue;
			}
			ck->zero[c] = 0;
			if (sink != NULL) {
				/* Runs of chunks go in one write, up to shim_staging_file_piece(): they lie
				 * back to back on the GPU and in the file. */
				ck->src_off[c] = foff;
				struct shim_xfer *prev = nx > 0 ? &x[nx - 1] : NULL;
				if (prev != NULL && prev->file && prev->group == (uint32_t)i &&
				    prev->dev + prev->size == st[i].va + c * GCR_DIGEST_CHUNK &&
				    prev->size % GCR_DIGEST_CHUNK == 0 &&
				    prev->size + chunk_size(p, c) <= piece)
					prev->size += chunk_size(p, c);
				else
					x[nx++] = (struct shim_xfer){ .off = foff, .dev = st[i].va + c * GCR_DIGEST_CHUNK,
								      .size = chunk_size(p, c),
								      .device = (int16_t)phys_device(p), .group = (uint32_t)i,
								      .file = 1, .fd = fd, .dfd = dfd,
								      .crc_out = &ck->src_crc[c], .name = ck->src_name };
				foff += chunk_size(p, c);
				rep->copied += chunk_size(p, c);
				continue;
			}
			if (ck->off[c] == SHIM_CHUNKS_NONE && (rc = shim_staging_alloc(GCR_DIGEST_CHUNK, &ck->off[c])) < 0) {
				gcr_err_set(err, rc, "staging pool too small");
				break;
			}
			x[nx++] = (struct shim_xfer){ .off = ck->off[c], .dev = st[i].va + c * GCR_DIGEST_CHUNK,
						      .size = chunk_size(p, c), .device = (int16_t)phys_device(p),
						      .group = (uint32_t)i };
			rep->copied += chunk_size(p, c);
		}
		rep->handles++;
	}
	rep->ms_copy_prep = gcr_time_mono_ms() - t0 - rep->ms_digest;
	double t1 = gcr_time_mono_ms();
	struct release_ctx rctx = { .st = st };
	struct shim_staging_groups groups = { .ngroups = n, .done = release_one, .ctx = &rctx };
	if (rc == 0) {
		/* To files: nothing is released until every chunk is written, so a failed write
		 * (a full disk) leaves the GPU as it was. */
		rc = shim_staging_transfer(1, x, nx, sink != NULL ? NULL : &groups, err);
		for (size_t i = 0; rc == 0 && sink != NULL && i < n && rctx.rc == 0; i++)
			(void)release_one(i, &rctx);
		if (rc == 0 && rctx.rc < 0) {
			rc = rctx.rc;
			*err = rctx.err;
		}
	}
	rep->ms_copy = gcr_time_mono_ms() - t1;
	rep->ms_release = rctx.ms;
	*released = rctx.released;
	/* Released handles' data is only in the files now (every chunk was written before any
	 * release): the unwind reads every allocation back from its file, the data still on the GPU
	 * overwritten with the same bytes. */
	if (rc < 0 && sink != NULL && rctx.released > 0)
		sink->attach(sink->ctx);
	if (rc == 0) {
		for (size_t i = 0; i < n; i++) {
			struct shim_chunks *ck = st[i].p->chunks;
			ck->complete = 1;
			ck->have_digests = have_dig;
			if (have_dig)
				memcpy(ck->dig, &dig[st[i].first], ck->nchunks * sizeof(*dig));
		}
	} else {
		scratch_unmap_all(st, n);
	}
	free(x);
	free(req);
	free(dig);
	return rc;
}

/* Copies every staged handle's data back (zero chunks are set on the GPU). */
struct load_walk {
	struct staged *st;
	size_t n, cap, nch;
};

static int load_count(struct shim_phys *p, uint64_t va, void *arg)
{
	(void)va;
	struct load_walk *w = arg;
	if (p->staged)
		w->nch += p->chunks->nchunks;
	return 0;
}

static int load_list(struct shim_phys *p, uint64_t va, void *arg)
{
	struct load_walk *w = arg;
	if (p->staged && w->n < w->cap) /* records made since are not staged */
		w->st[w->n++] = (struct staged){ .p = p, .va = va };
	return 0;
}

static int load_all(struct shim_cr_report *rep, struct gcr_err *err)
{
	size_t cap = shim_alloc_nphys();
	struct load_walk w = { .st = calloc(cap + 1, sizeof(struct staged)), .cap = cap };
	(void)shim_alloc_each(0, load_count, &w);
	struct shim_xfer *x = calloc(w.nch + 1, sizeof(*x));
	int rc = w.st && x ? 0 : gcr_err_set(err, -ENOMEM, "out of host memory for the copy-back list of %zu chunks", w.nch);
	if (rc == 0)
		(void)shim_alloc_each(SHIM_ALLOC_EACH_VA, load_list, &w);
	size_t nx = 0, n = 0;
	for (; n < w.n && rc == 0; n++) {
		struct staged *st = &w.st[n];
		struct shim_phys *p = st->p;
		if (st->va == 0 && (rc = scratch_map(st, err)) < 0)
			break;
		struct shim_chunks *ck = p->chunks;
		for (size_t c = 0; c < ck->nchunks; c++) {
			int file = ck->src_fd >= 0 && !ck->zero[c]; /* after image-read: from the file */
			x[nx++] = (struct shim_xfer){ .off = file ? ck->src_off[c] : ck->off[c],
						      .dev = st->va + c * GCR_DIGEST_CHUNK, .size = chunk_size(p, c),
						      .device = (int16_t)phys_device(p), .zero = ck->zero[c],
						      .file = (int16_t)file, .fd = ck->src_fd,
						      .crc = file ? ck->src_crc[c] : 0, .name = ck->src_name };
			if (ck->zero[c])
				rep->zero += chunk_size(p, c);
			else
				rep->copied += chunk_size(p, c);
			rep->bytes += chunk_size(p, c);
		}
		rep->handles++;
	}
	if (rc == 0)
		rc = shim_staging_transfer(0, x, nx, NULL, err);
	if (w.st != NULL)
		scratch_unmap_all(w.st, n);
	free(x);
	free(w.st);
	return rc;
}

/* Re-creates every staged handle that was released, maps again what was unmapped,
 * and fills them from staging. On failure unmaps and releases what it made, so
 * the process stays suspended and a retry starts clean. Also the unwind of a
 * suspend that failed after releasing some allocations. */
static int remap_all(struct shim_cr_report *rep, struct gcr_err *err)
{
	double t0 = gcr_time_mono_ms();
	int rc = shim_alloc_recreate(err);
	rep->ms_map = gcr_time_mono_ms() - t0;
	t0 = gcr_time_mono_ms();
	if (rc == 0) {
		rc = load_all(rep, err);
		if (rc < 0)
			shim_alloc_recreate_undo(); /* nothing half-restored stays behind */
	}
	rep->ms_copy = gcr_time_mono_ms() - t0;
	if (rc < 0) {
		rep->bytes = rep->copied = rep->zero = 0;
		rep->handles = 0;
	}
	return rc;
}

/* After a resume: handles the app had released go; without incremental copies the
 * chunk tables are dropped (the pool stays faulted in for the next suspend). */
static int chunks_clear_staged(struct shim_phys *p, uint64_t va, void *arg)
{
	return p->staged ? chunks_clear(p, va, arg) : 0;
}

/* Data that came from an image file is not in staging: no incremental copy can build on it. */
static int chunks_clear_file(struct shim_phys *p, uint64_t va, void *arg)
{
	return p->staged && p->chunks != NULL && p->chunks->src_off != NULL ? chunks_clear(p, va, arg) : 0;
}

static void finish_resume(void)
{
	(void)shim_alloc_each(0, chunks_clear_file, NULL);
	if (!shim_cfg.incremental) {
		(void)shim_alloc_each(0, chunks_clear_staged, NULL);
		shim_staging_reset();
	}
	shim_alloc_resumed();
}
static uint64_t host_bytes(void)
{
	struct shim_staging_stats ss;
	shim_staging_stats(&ss);
	return ss.capacity + ss.ring;
}

/* A plain suspend of a process that holds live communicators: its peers' kernels would wait
 * for it forever, and the memory NCCL shares with them cannot move. The whole group goes. */
static int refuse_member(struct gcr_err *err)
{
	struct gcr_group_comms *c = malloc(sizeof(*c));
	int held;
	if (c == NULL)
		return gcr_err_set(err, -EXDEV, "member of an NCCL group; suspend the group: gcrctl suspend --group PID,...");
	shim_cr_comms(c, &held);
	char list[400] = "";
	size_t len = 0, shown = 0;
	for (size_t i = 0; i < c->n && len + 60 < sizeof(list); i++) {
		if (c->c[i].state != GCR_GROUP_COMM_LIVE)
			continue;
		char k[GCR_GROUP_KEY_LEN];
		gcr_groupmsg_key_fmt(c->c[i].key, k);
		len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%s rank %d of %d", shown++ ? ", " : "", k,
					c->c[i].rank, c->c[i].nranks);
	}
	free(c);
	return gcr_err_set(err, -EXDEV, "member of an NCCL group (communicators %s); suspend the group: gcrctl "
			   "suspend --group PID,... (process untouched, running)", list);
}

static int suspend_impl(const struct shim_cr_sink *sink, int timeout_ms, int group, struct shim_cr_report *rep,
			struct gcr_err *err)
{
	memset(rep, 0, sizeof(*rep));
	n_suspend++;
	pthread_mutex_lock(&cr_lock);
	alloc_window(1);
	int rc = 0;
	double t_start = gcr_time_mono_ms(), t0 = t_start;
	/* Where an unwound suspend goes back to: a group member's communicators stay torn down. */
	enum shim_cr_state start = group ? SHIM_CR_DETACHED : SHIM_CR_RUNNING;
	if (group && state != SHIM_CR_DRAINED && state != SHIM_CR_DETACHED) {
		rc = gcr_err_set(err, -EINVAL, "a group suspend needs the member drained (state %s)",
				 shim_cr_state_name(state));
		goto out;
	}
	if (!group && state != SHIM_CR_RUNNING) {
		rc = gcr_err_set(err, -EALREADY, "already suspended (state %s)", shim_cr_state_name(state));
		goto out;
	}
	if (!group) {
		int live, down, failed, held;
		comm_lib->counts(&live, &down, &failed, &held);
		if (live > 0) {
			rc = refuse_member(err);
			goto out;
		}
	}
	if (group && state == SHIM_CR_DRAINED) {
		/* Every member drained before any tears down: no peer's kernel still reads this one's
		 * buffers. ncclCommAbort frees what NCCL exported and imported, so the data step below
		 * meets a plain process. The gate is still open: NCCL's own threads free with it. */
		double t = gcr_time_mono_ms();
		rc = comm_lib->teardown(err);
		if (rc < 0)
			goto out;
		hold_until = 0;
		(void)cr_move(SHIM_CR_DETACHED, err);
		rep->ms_comm = gcr_time_mono_ms() - t;
		t0 = gcr_time_mono_ms(); /* the gate's time is its own */
	}
	rc = choose_backend(&backend, err);
	if (rc < 0)
		goto out;
	rc = shim_alloc_check_movable(backend, err);
	if (rc < 0)
		goto out;
	rc = cr_move(SHIM_CR_SUSPENDING, err);
	if (rc < 0)
		goto out;
	shim_real_relax_capture(); /* our driver calls must not break an app's capture */
	rc = shim_gate_close(timeout_ms, err);
	if (rc < 0) {
		cr_move_back(start);
		goto out;
	}
	rep->ms_gate = gcr_time_mono_ms() - t0;
	t0 = gcr_time_mono_ms();
	/* Allocation calls are gated too, so the table's records stay from here. */
	if (backend->sync_all(err) < 0)
		rc = err->code = -EIO;
	else
		shim_gate_set_quiet(); /* the application's work is all done: its queries get "done" */
	/* Every free has completed now: the arena's idle segments go instead of being copied. */
	if (rc == 0)
		(void)shim_pool_release_idle();
	rep->ms_sync = gcr_time_mono_ms() - t0;
	size_t nstaged = 0, nch = 0;
	struct staged *st = rc == 0 ? staged_list(&nstaged, &nch, err) : NULL;
	if (rc == 0 && st == NULL)
		rc = err->code;
	rep->mappings = shim_alloc_nmaps();
	size_t released = 0;
	if (rc == 0)
		rc = save_all(st, nstaged, nch, sink, &released, rep, err);
	free(st);
	if (rc < 0 && sink != NULL && released == 0) {
		/* To files: nothing was released or unmapped, the data never left the GPU. */
		shim_alloc_resumed();
		chunks_reset();
		goto unwind_gate;
	}
	if (rc < 0) {
		/* What was already released comes back from staging (its data is all
		 * there); the rest never left the GPU. */
		struct gcr_err err2;
		struct shim_cr_report r2;
		memset(&r2, 0, sizeof(r2));
		if (remap_all(&r2, &err2) < 0) {
			GCR_LOG(GCR_LOG_ERROR, "shim", "suspend unwind failed: %s; process stays suspended", err2.msg);
			/* The caller must learn the state too: a resume brings the process back. */
			char first[GCR_ERR_MSG_MAX];
			snprintf(first, sizeof(first), "%s", err->msg);
			gcr_err_set(err, err->code, "%s; undoing it failed too (%s): process left suspended, a resume restores it",
				    first, err2.msg);
			/* To files: save_all attached them once anything was released (their data is
			 * only there). */
			cr_set_back(SHIM_CR_SUSPENDED, sink != NULL ? SHIM_CR_DATA_FILES : SHIM_CR_DATA_HOST);
			goto out;
		}
		finish_resume();
		chunks_reset(); /* the pool may be half-written */
		goto unwind_gate;
	}
	if (shim_cfg.ctx_shrink && backend->ctx_shrink != NULL) {
		/* An optimisation only: on failure the driver checkpoints the scratch as before. */
		struct gcr_err e2 = { 0 };
		t0 = gcr_time_mono_ms();
		if (backend->ctx_shrink(&rep->ctx_freed, &e2) < 0) {
			GCR_LOG(GCR_LOG_WARN, "shim", "context local memory stays (the driver will checkpoint it): %s",
				e2.msg);
			rep->ctx_freed = 0;
			if (backend->ctx_unshrink(&e2) < 0)
				GCR_LOG(GCR_LOG_WARN, "shim", "stack limit not yet restored, retried at resume: %s", e2.msg);
		}
		rep->ms_ctx = gcr_time_mono_ms() - t0;
	}
	rep->ms_total = gcr_time_mono_ms() - t_start;
	{
		/* What stays in host memory once the unused pool is given back (shim_cr_trim). */
		struct shim_staging_stats ss;
		shim_staging_stats(&ss);
		rep->host = ss.used + ss.ring;
	}
	rc = cr_set(SHIM_CR_SUSPENDED, sink != NULL ? SHIM_CR_DATA_WRITTEN : SHIM_CR_DATA_HOST, err);
	goto out;
unwind_gate:
	shim_staging_resume_background();
	cr_move_back(start);
	shim_gate_open();
out:
	alloc_window(0);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_suspend(int timeout_ms, struct shim_cr_report *rep, struct gcr_err *err)
{
	return suspend_impl(NULL, timeout_ms, 0, rep, err);
}

int shim_cr_suspend_group(int timeout_ms, struct shim_cr_report *rep, struct gcr_err *err)
{
	return suspend_impl(NULL, timeout_ms, 1, rep, err);
}

int shim_cr_suspend_to(const struct shim_cr_sink *sink, int timeout_ms, struct shim_cr_report *rep,
		       struct gcr_err *err)
{
	return suspend_impl(sink, timeout_ms, 0, rep, err);
}

void shim_cr_trim(void)
{
	pthread_mutex_lock(&cr_lock);
	if (state == SHIM_CR_SUSPENDED) {
		struct shim_staging_stats ss;
		shim_staging_stats(&ss);
		shim_staging_trim(ss.used);
	}
	pthread_mutex_unlock(&cr_lock);
}

int shim_cr_resume(struct shim_cr_report *rep, struct gcr_err *err)
{
	memset(rep, 0, sizeof(*rep));
	n_resume++;
	pthread_mutex_lock(&cr_lock);
	alloc_window(1);
	int rc = 0, armed = 0;
	double t_start = gcr_time_mono_ms();
	if (state != SHIM_CR_SUSPENDED) {
		rc = gcr_err_set(err, -EINVAL, "not suspended (state %s)", shim_cr_state_name(state));
		goto out;
	}
	if (data == SHIM_CR_DATA_WRITTEN) {
		rc = gcr_err_set(err, -EINVAL, "the data is in image files only (image-write): image-read first; "
				 "process still suspended");
		goto out;
	}
	rc = cr_move(SHIM_CR_RESUMING, err);
	if (rc < 0)
		goto out;
	/* No wake is sent for a process being resumed; one that fails is the agent's again. */
	int exp = SHIM_CR_WAKE_ARMED;
	armed = atomic_compare_exchange_strong(&wake, &exp, SHIM_CR_WAKE_OFF);
	shim_real_relax_capture();
	if (backend != NULL && backend->ctx_unshrink != NULL) {
		/* First, so a failure leaves everything as suspended and the resume can be retried. */
		double t0 = gcr_time_mono_ms();
		rc = backend->ctx_unshrink(err);
		rep->ms_ctx = gcr_time_mono_ms() - t0;
		if (rc < 0)
			goto back;
	}
	shim_staging_quiesce();
	rc = remap_all(rep, err);
	if (rc < 0)
		goto back;
	rep->host = host_bytes();
	rep->mappings = shim_alloc_nmaps();
	finish_resume();
	shim_staging_resume_background();
	/* A group member's communicators are still down: its NCCL calls stay held (the CUDA gate
	 * opens) until its group rebuilds them. */
	int live, down, failed, held;
	comm_lib->counts(&live, &down, &failed, &held);
	rc = cr_set(down > 0 ? SHIM_CR_DETACHED : SHIM_CR_RUNNING, SHIM_CR_DATA_GPU, err);
	shim_gate_open();
	rep->ms_total = gcr_time_mono_ms() - t_start;
	goto out;
back:
	cr_move_back(SHIM_CR_SUSPENDED);
	if (armed)
		atomic_store(&wake, SHIM_CR_WAKE_ARMED);
out:
	alloc_window(0);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

/* ---- a group member (shim_comm.h): the coordinator moves every member through the same step
 * before any goes on; each step here is bounded, and a member left held by a coordinator that
 * went away thaws by itself ---- */

static void hold_arm(void)
{
	hold_until = hold_ms > 0 ? gcr_time_mono_ms() + hold_ms : 0;
}

void shim_cr_comms(struct gcr_group_comms *out, int *held)
{
	int live, down, failed;
	comm_lib->describe(out);
	comm_lib->counts(&live, &down, &failed, held);
}

int shim_cr_freeze(int hold, int wait_ms, struct gcr_group_comms *out, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	out->n = 0;
	if (state != SHIM_CR_RUNNING)
		rc = gcr_err_set(err, -EINVAL, "not running (state %s): nothing to freeze", shim_cr_state_name(state));
	if (rc == 0 && (rc = comm_lib->freeze(wait_ms, err)) < 0)
		gcr_err_wrap(err, "member still running");
	if (rc == 0)
		rc = cr_move(SHIM_CR_FROZEN, err);
	if (rc == 0) {
		hold_ms = hold;
		hold_arm();
		comm_lib->describe(out);
	}
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

/* Back to running from a held state (lock held). */
static void thaw_locked(void)
{
	comm_lib->thaw();
	hold_until = 0;
	cr_move_back(SHIM_CR_RUNNING);
}

int shim_cr_drain(const struct gcr_group_targets *t, int timeout_ms, struct gcr_group_comms *out,
		  struct gcr_group_targets *wants, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	out->n = 0;
	wants->n = 0;
	if (state != SHIM_CR_FROZEN && state != SHIM_CR_DRAINED) {
		rc = gcr_err_set(err, -EINVAL, "not frozen (state %s): nothing to drain", shim_cr_state_name(state));
	} else if ((rc = comm_lib->drain(t, timeout_ms, wants, err)) < 0) {
		thaw_locked();
		gcr_err_wrap(err, "member thawed, running");
	} else {
		if (state != (rc == 0 ? SHIM_CR_DRAINED : SHIM_CR_FROZEN))
			(void)cr_move(rc == 0 ? SHIM_CR_DRAINED : SHIM_CR_FROZEN, err);
		hold_arm();
	}
	comm_lib->describe(out);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_thaw(struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	if (state != SHIM_CR_FROZEN && state != SHIM_CR_DRAINED && state != SHIM_CR_REBUILT)
		rc = gcr_err_set(err, -EINVAL, "not held (state %s): nothing to thaw", shim_cr_state_name(state));
	else
		thaw_locked();
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_detach(struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	if (state != SHIM_CR_DRAINED && state != SHIM_CR_REBUILT)
		rc = gcr_err_set(err, -EINVAL, "neither drained nor rebuilt (state %s): nothing to tear down",
				 shim_cr_state_name(state));
	if (rc == 0 && (rc = comm_lib->teardown(err)) == 0) {
		hold_until = 0;
		rc = cr_move(SHIM_CR_DETACHED, err);
	}
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_ids(const struct gcr_group_keys *keys, struct gcr_group_ids *out, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	out->n = 0;
	if (state != SHIM_CR_DETACHED)
		rc = gcr_err_set(err, -EINVAL, "communicators not torn down (state %s)", shim_cr_state_name(state));
	else
		rc = comm_lib->ids(keys, out, err);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

/* A rebuild that outlived its bound ends here, from the library's thread. */
static void rebuild_late(int rc)
{
	pthread_mutex_lock(&cr_lock);
	if (state == SHIM_CR_REBUILDING) {
		cr_move_back(rc == 0 ? SHIM_CR_REBUILT : SHIM_CR_DETACHED);
		if (rc == 0)
			hold_arm();
		GCR_LOG(rc == 0 ? GCR_LOG_WARN : GCR_LOG_ERROR, "shim", "NCCL communicators made again after the "
			"rebuild's bound: %s", rc == 0 ? "rebuilt (held until thawed)" : "failed; detached");
	}
	pthread_mutex_unlock(&cr_lock);
}

int shim_cr_rebuild(const struct gcr_group_ids *ids, const struct gcr_group_keys *failed, int timeout_ms,
		    struct gcr_group_comms *out, struct gcr_err *err)
{
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	out->n = 0;
	if (state != SHIM_CR_DETACHED)
		rc = gcr_err_set(err, -EINVAL, "not detached (state %s): nothing to rebuild", shim_cr_state_name(state));
	if (rc == 0)
		rc = cr_move(SHIM_CR_REBUILDING, err);
	if (rc == 0) {
		shim_real_relax_capture();
		rc = comm_lib->rebuild(ids, failed, timeout_ms, rebuild_late, err);
		if (rc == 0) {
			rc = cr_move(SHIM_CR_REBUILT, err);
			hold_arm();
		} else if (rc == -ETIMEDOUT) {
			gcr_err_wrap(err, "member rebuilding");
		} else {
			cr_move_back(SHIM_CR_DETACHED);
			gcr_err_wrap(err, "member detached (communicators down, NCCL calls held); retry the rebuild");
		}
	}
	comm_lib->describe(out);
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

void shim_cr_abandon(void)
{
	pthread_mutex_lock(&cr_lock);
	if (state == SHIM_CR_FROZEN || state == SHIM_CR_DRAINED || state == SHIM_CR_REBUILT) {
		GCR_LOG(GCR_LOG_WARN, "shim", "the coordinator of this group member went away while it was %s: thawed",
			shim_cr_state_name(state));
		thaw_locked();
	}
	pthread_mutex_unlock(&cr_lock);
}

double shim_cr_tick(void)
{
	pthread_mutex_lock(&cr_lock);
	double next = hold_until;
	if (next > 0 && gcr_time_mono_ms() >= next &&
	    (state == SHIM_CR_FROZEN || state == SHIM_CR_DRAINED || state == SHIM_CR_REBUILT)) {
		GCR_LOG(GCR_LOG_WARN, "shim", "group member %s for %d ms without its next step: thawed",
			shim_cr_state_name(state), hold_ms);
		thaw_locked();
		next = 0;
	}
	pthread_mutex_unlock(&cr_lock);
	return next;
}
