/* fakecuda_exec: streams, events, modules, the built-in test kernels, launches and graphs.
 * Work runs on the submitting thread at submission; a capturing stream records it instead, and
 * a held stream (fakecuda_test.h) queues it until released or synchronised. */
#include "fakecuda.h"
#include "fakecuda_test.h"

#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcr_kernels.h"
#include "shim_digest_math.h"

#define FAKE_MAX_THREADS_PER_BLOCK 1024u
#define FAKE_MAX_DYNAMIC_SHARED 232448u /* bytes, H100 opt-in maximum */

/* ---- built-in kernels: the ones of tests/progs/gcr_kernels.cu, same names and parameters,
 * and the shim's digest kernel (shim/cuda/shim_digest_kernel.cu) ---- */

struct fake_kernel {
	const char *name;
	unsigned int nparams;
	unsigned char size[FAKE_MAX_ARGS]; /* bytes of each parameter */
	/* Most test kernels are grid-stride loops and ignore d; the digest kernel does not. */
	void (*run)(const uint64_t *args, const struct fake_dims *d);
	/* At launch, what the GPU would fault on or the driver refuse; NULL: nothing to check. */
	CUresult (*check)(const uint64_t *args, const struct fake_dims *d);
};

static void *fake_arg_ptr(uint64_t slot)
{
	return (void *)(uintptr_t)slot;
}

/* gcr_fill(uint32_t *buf, uint64_t n, uint32_t seed) */
static void fake_k_fill(const uint64_t *a, const struct fake_dims *d)
{
	uint32_t *buf = fake_arg_ptr(a[0]);
	uint32_t seed = (uint32_t)a[2];
	uint64_t i;

	(void)d;
	for (i = 0; i < a[1]; i++)
		buf[i] = gcr_pattern(seed, i);
}

/* gcr_step(uint32_t *buf, uint64_t n, uint32_t k) */
static void fake_k_step(const uint64_t *a, const struct fake_dims *d)
{
	uint32_t *buf = fake_arg_ptr(a[0]);
	uint32_t k = (uint32_t)a[2];
	uint64_t i;

	(void)d;
	for (i = 0; i < a[1]; i++)
		buf[i] = gcr_step_value(buf[i], k);
}

/* gcr_check(const uint32_t *buf, uint64_t n, uint32_t seed, uint32_t kfirst, uint32_t nsteps,
 *           unsigned long long *mismatches) */
static void fake_k_check(const uint64_t *a, const struct fake_dims *d)
{
	const uint32_t *buf = fake_arg_ptr(a[0]);
	unsigned long long *mismatches = fake_arg_ptr(a[5]);
	unsigned long long bad = 0;
	uint64_t i;

	(void)d;
	for (i = 0; i < a[1]; i++)
		bad += buf[i] != gcr_expected((uint32_t)a[2], i, (uint32_t)a[3], (uint32_t)a[4]);
	__atomic_fetch_add(mismatches, bad, __ATOMIC_RELAXED);
}

/* gcr_check_const(const uint32_t *buf, uint64_t n, uint32_t value, unsigned long long *mismatches) */
static void fake_k_check_const(const uint64_t *a, const struct fake_dims *d)
{
	const uint32_t *buf = fake_arg_ptr(a[0]);
	unsigned long long *mismatches = fake_arg_ptr(a[3]);
	unsigned long long bad = 0;
	uint64_t i;

	(void)d;
	for (i = 0; i < a[1]; i++)
		bad += buf[i] != (uint32_t)a[2];
	__atomic_fetch_add(mismatches, bad, __ATOMIC_RELAXED);
}

/* gcr_indirect(uint64_t *ptrs, uint32_t count, uint32_t value): writes through pointers that
 * are themselves read from device memory. */
static void fake_k_indirect(const uint64_t *a, const struct fake_dims *d)
{
	const uint64_t *ptrs = fake_arg_ptr(a[0]);
	uint32_t j;

	(void)d;
	for (j = 0; j < (uint32_t)a[1]; j++)
		*(uint32_t *)fake_arg_ptr(ptrs[j]) += (uint32_t)a[2];
}

/* gcr_step_table(const uint64_t *table): table[0] entries of (pointer, words, k) follow; each
 * range gets one step with its k. Everything, even where it writes, is read from device memory. */
static void fake_k_step_table(const uint64_t *a, const struct fake_dims *d)
{
	const uint64_t *t = fake_arg_ptr(a[0]);
	uint64_t j, i;

	(void)d;
	for (j = 0; j < t[0]; j++) {
		uint32_t *buf = fake_arg_ptr(t[1 + 3 * j]);

		for (i = 0; i < t[2 + 3 * j]; i++)
			buf[i] = gcr_step_value(buf[i], (uint32_t)t[3 + 3 * j]);
	}
}

/* gcr_chunk_digest(const ulonglong2 *base, unsigned long long nbytes, unsigned long long *out),
 * block by block as the GPU runs it: block x digests pairs [x * P, (x + 1) * P) of the buffer
 * (P pairs of 16 bytes per slice; slice x % SLICES of chunk x / SLICES), stopping at the last
 * whole pair (a tail of fewer than 16 bytes is not read), and adds into out[3 * chunk ...].
 * Every (y, z) plane of blocks repeats the x blocks, so a grid with gy * gz > 1 adds that many
 * times, as on the GPU. Atomics: launches on several streams may share out. */
static void fake_k_digest(const uint64_t *a, const struct fake_dims *d)
{
	const uint64_t *w = fake_arg_ptr(a[0]);
	const uint64_t npairs = a[1] / 16, per_slice = GCR_DIGEST_CHUNK / 16 / GCR_DIGEST_SLICES;
	const uint64_t planes = (uint64_t)d->gy * d->gz;
	uint64_t *out = fake_arg_ptr(a[2]);
	uint64_t x, j;

	for (x = 0; x < d->gx; x++) {
		uint64_t chunk = x / GCR_DIGEST_SLICES, slice = x % GCR_DIGEST_SLICES;
		uint64_t h1 = 0, h2 = 0, any = 0;

		for (j = slice * per_slice; j < (slice + 1) * per_slice; j++) {
			uint64_t g = chunk * (GCR_DIGEST_CHUNK / 16) + j, lo, hi;

			if (g >= npairs)
				break;
			lo = w[2 * g];
			hi = w[2 * g + 1];
			h1 += gcr_digest_term1(lo, 2 * j) + gcr_digest_term1(hi, 2 * j + 1);
			h2 += gcr_digest_term2(lo, 2 * j) + gcr_digest_term2(hi, 2 * j + 1);
			any |= lo | hi;
		}
		__atomic_fetch_add(&out[3 * chunk], h1 * planes, __ATOMIC_RELAXED);
		__atomic_fetch_add(&out[3 * chunk + 1], h2 * planes, __ATOMIC_RELAXED);
		if (any != 0)
			__atomic_fetch_or(&out[3 * chunk + 2], any, __ATOMIC_RELAXED);
	}
}

/* What the GPU would not survive, refused at launch (a real GPU faults later, at the next
 * synchronisation; the stand-in is stricter, never silently wrong): a block other than
 * (GCR_DIGEST_THREADS, 1, 1) (more threads exceed the kernel's launch bounds; fewer leave
 * shared-memory slots of the reduction unwritten, garbage on a GPU), a misaligned or
 * unreadable input range, an output array smaller than the grid writes. */
static CUresult fake_k_digest_check(const uint64_t *a, const struct fake_dims *d)
{
	const uint64_t npairs = a[1] / 16, per_slice = GCR_DIGEST_CHUNK / 16 / GCR_DIGEST_SLICES;
	uint64_t read = (uint64_t)d->gx * per_slice, chunks = (d->gx + GCR_DIGEST_SLICES - 1) / GCR_DIGEST_SLICES;

	if (d->bx != GCR_DIGEST_THREADS || d->by != 1 || d->bz != 1)
		return CUDA_ERROR_INVALID_VALUE;
	if (a[0] % 16 != 0 || a[2] % 8 != 0)
		return CUDA_ERROR_MISALIGNED_ADDRESS;
	if (read > npairs)
		read = npairs;
	if (read > 0 && fake_mem_check(a[0], read * 16, false, false) != CUDA_SUCCESS)
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	if (fake_mem_check(a[2], chunks * 3 * sizeof(uint64_t), true, false) != CUDA_SUCCESS)
		return CUDA_ERROR_ILLEGAL_ADDRESS;
	return CUDA_SUCCESS;
}

static const struct fake_kernel fake_kernels[] = {
	{"gcr_fill", 3, {8, 8, 4}, fake_k_fill, NULL},
	{"gcr_step", 3, {8, 8, 4}, fake_k_step, NULL},
	{"gcr_step_local", 3, {8, 8, 4}, fake_k_step, NULL}, /* same result; no local memory here */
	{"gcr_check", 6, {8, 8, 4, 4, 4, 8}, fake_k_check, NULL},
	{"gcr_check_const", 4, {8, 8, 4, 8}, fake_k_check_const, NULL},
	{"gcr_indirect", 3, {8, 4, 4}, fake_k_indirect, NULL},
	{"gcr_step_table", 1, {8}, fake_k_step_table, NULL},
	{"gcr_chunk_digest", 3, {8, 8, 8}, fake_k_digest, fake_k_digest_check},
};
#define FAKE_NKERNELS (sizeof(fake_kernels) / sizeof(fake_kernels[0]))

/* ---- objects; all lists under the device lock, handles validated by lookup ---- */

/* Graph memory: one allocation of a graph, shared by the graph, its clones, the graphs that
 * hold it as a child and the executables of any of them; freed with the last. */
struct fake_gbuf {
	unsigned int refs; /* device lock */
	CUdeviceptr ptr;
	size_t len;
	int dev;
};

struct fake_graph;

/* A node added through the explicit API (captured work has no handles). */
struct fake_gnode {
	struct fake_graph *graph;
	CUgraphNodeType type;
	CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* MEM_ALLOC: as given, dptr set */
};

/* Nodes run in creation order (dependencies are always on earlier nodes); a child graph's ops
 * are copied in. */
struct fake_graph {
	struct fake_graph *next;
	struct fake_op *ops;
	size_t n, cap;
	struct fake_gnode **nodes;
	size_t nn, ncap;
	struct fake_gbuf **bufs;
	size_t nb, bcap;
};

struct fake_exec {
	struct fake_exec *next;
	struct fake_op *ops;
	size_t n;
	struct fake_gbuf **bufs;
	size_t nb;
};

struct fake_stream {
	struct fake_stream *next;
	struct fake_ctx *ctx;
	unsigned int flags;
	int priority;
	struct fake_graph *capture; /* non-NULL while capturing */
	bool invalidated;           /* a capture that an illegal call broke */
	cuuint64_t capture_id;      /* unique per capture, as cuStreamGetCaptureInfo reports */
	/* Work waiting to run, in order: queue[qhead, qn). It queues while the stream is held,
	 * while anything is queued, and while a pump runs one of its ops (draining). */
	bool held, draining;
	struct fake_op *queue;
	size_t qhead, qn, qcap;
};

struct fake_event {
	struct fake_event *next;
	unsigned int flags;
	bool recorded;
	uint64_t submitted, done; /* records submitted and completed: pending while done < submitted */
	struct timespec when;
};

struct fake_module;

struct fake_function {
	const struct fake_kernel *kernel;
	struct fake_module *module;
};

struct fake_module {
	struct fake_module *next;
	struct fake_function fns[FAKE_NKERNELS];
};

static struct fake_stream *fake_streams;
static struct fake_event *fake_events;
static struct fake_module *fake_modules;
static struct fake_graph *fake_graphs;
static struct fake_exec *fake_execs;

/* Generic list helpers: every object struct starts with its next pointer. */
struct fake_node {
	struct fake_node *next;
};

static bool fake_list_has(void *head, const void *obj)
{
	struct fake_node *n;

	for (n = head; n != NULL; n = n->next)
		if (n == obj)
			return true;
	return false;
}

static bool fake_list_remove(void *headp, const void *obj)
{
	struct fake_node **pp;

	for (pp = headp; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == obj) {
			*pp = (*pp)->next;
			return true;
		}
	}
	return false;
}

static void fake_list_push(void *headp, void *obj)
{
	struct fake_node **head = headp, *n = obj;

	n->next = *head;
	*head = n;
}

static bool fake_stream_pseudo(CUstream s)
{
	return s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD;
}

CUresult fake_stream_check(CUstream s)
{
	bool ok;

	if (fake_stream_pseudo(s))
		return CUDA_SUCCESS;
	fake_lock();
	ok = fake_list_has(fake_streams, s);
	fake_unlock();
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult fake_stream_device(CUstream s, int *dev)
{
	struct fake_ctx *ctx;
	CUresult rc = CUDA_SUCCESS;

	if (fake_stream_pseudo(s)) {
		rc = fake_ctx_current(&ctx);
		if (rc == CUDA_SUCCESS)
			*dev = ctx->dev;
		return rc;
	}
	fake_lock();
	if (fake_list_has(fake_streams, s))
		*dev = ((struct fake_stream *)s)->ctx->dev;
	else
		rc = CUDA_ERROR_INVALID_HANDLE;
	fake_unlock();
	return rc;
}

bool fake_stream_capturing(CUstream s)
{
	bool capturing;

	if (fake_stream_pseudo(s))
		return false;
	fake_lock();
	capturing = fake_list_has(fake_streams, s) && ((struct fake_stream *)s)->capture != NULL;
	fake_unlock();
	return capturing;
}

/* ---- running work ---- */

static void fake_run(const struct fake_op *op)
{
	size_t r, i;

	switch (op->kind) {
	case FAKE_OP_COPY:
		for (r = 0; r < op->u.copy.height; r++)
			memmove(op->u.copy.dst + r * op->u.copy.dpitch,
				op->u.copy.src + r * op->u.copy.spitch, op->u.copy.width);
		break;
	case FAKE_OP_SET:
		for (r = 0; r < op->u.set.height; r++) {
			char *row = op->u.set.dst + r * op->u.set.pitch;

			if (op->u.set.elem == 1)
				memset(row, (int)(op->u.set.value & 0xff), op->u.set.width);
			else if (op->u.set.elem == 2)
				for (i = 0; i < op->u.set.width; i++)
					((uint16_t *)row)[i] = (uint16_t)op->u.set.value;
			else
				for (i = 0; i < op->u.set.width; i++)
					((uint32_t *)row)[i] = op->u.set.value;
		}
		break;
	case FAKE_OP_KERNEL:
		op->u.kernel.kernel->run(op->u.kernel.args, &op->u.kernel.dims);
		break;
	case FAKE_OP_HOSTFN:
		op->u.hostfn.fn(op->u.hostfn.data);
		break;
	case FAKE_OP_EVENT:
		fake_lock();
		if (fake_list_has(fake_events, op->u.event.ev)) {
			struct fake_event *ev = op->u.event.ev;

			ev->recorded = true;
			if (op->u.event.seq > ev->done)
				ev->done = op->u.event.seq;
			clock_gettime(CLOCK_MONOTONIC, &ev->when);
		}
		fake_unlock();
		break;
	case FAKE_OP_FREE:
		fake_pool_free_done(op->u.free.ptr, op->u.free.gen);
		break;
	case FAKE_OP_WAIT: /* only in queues, where the pump handles it */
	case FAKE_OP_NOP:
		break;
	}
}

/* ---- held streams: queues and the pump that runs them ---- */

static bool fake_stream_queued(const struct fake_stream *st)
{
	return st->held || st->draining || st->qn > st->qhead;
}

/* Device lock held. */
static CUresult fake_queue_append(struct fake_stream *st, const struct fake_op *ops, size_t n)
{
	if (st->qhead == st->qn)
		st->qhead = st->qn = 0;
	if (st->qn + n > st->qcap) {
		size_t cap = (st->qn + n) * 2;
		struct fake_op *p = realloc(st->queue, cap * sizeof(*p));

		if (p == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		st->queue = p;
		st->qcap = cap;
	}
	memcpy(st->queue + st->qn, ops, n * sizeof(*ops));
	st->qn += n;
	return CUDA_SUCCESS;
}

/* Whether an event has a record that has not run yet; device lock held. */
static bool fake_event_pending(const struct fake_event *ev, uint64_t seq)
{
	return fake_list_has(fake_events, ev) && ev->done < seq;
}

/* Runs queued work of streams that are not held, one op at a time and outside the lock, until
 * nothing can run: a queue stops at a wait for an event still pending. */
static void fake_pump(void)
{
	for (;;) {
		struct fake_stream *st, *run = NULL;
		struct fake_op op;

		fake_lock();
		for (st = fake_streams; st != NULL && run == NULL; st = st->next) {
			while (!st->held && !st->draining && st->qhead < st->qn) {
				const struct fake_op *head = &st->queue[st->qhead];

				if (head->kind == FAKE_OP_WAIT) {
					if (fake_event_pending(head->u.event.ev, head->u.event.seq))
						break;
					st->qhead++;
					continue;
				}
				op = *head;
				st->qhead++;
				st->draining = true;
				run = st;
				break;
			}
		}
		fake_unlock();
		if (run == NULL)
			return;
		fake_run(&op);
		fake_lock();
		if (fake_list_has(fake_streams, run))
			run->draining = false;
		fake_unlock();
	}
}

void fake_exec_release_all(void)
{
	struct fake_stream *st;

	fake_lock();
	for (st = fake_streams; st != NULL; st = st->next)
		st->held = false;
	fake_unlock();
	fake_pump();
}

FAKE_EXPORT CUresult fake_stream_hold(CUstream s, int on)
{
	struct fake_stream *st = (struct fake_stream *)s;
	bool ok;

	if (fake_stream_pseudo(s))
		return CUDA_ERROR_INVALID_HANDLE;
	fake_lock();
	ok = fake_list_has(fake_streams, st);
	if (ok)
		st->held = on != 0;
	fake_unlock();
	if (ok && !on)
		fake_pump();
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult fake_graph_append(struct fake_graph *g, const struct fake_op *ops, size_t n)
{
	if (g->n + n > g->cap) {
		size_t cap = (g->n + n) * 2;
		struct fake_op *p = realloc(g->ops, cap * sizeof(*p));

		if (p == NULL)
			return CUDA_ERROR_OUT_OF_MEMORY;
		g->ops = p;
		g->cap = cap;
	}
	memcpy(g->ops + g->n, ops, n * sizeof(*ops));
	g->n += n;
	return CUDA_SUCCESS;
}

/* Runs ops, queues them behind a held stream's work, or appends them to the stream's capture.
 * Event records get their number here, so a replayed graph's records are new records. */
static CUresult fake_submit_ops(CUstream stream, const struct fake_op *ops, size_t n)
{
	struct fake_op local[4], *copy = n <= 4 ? local : malloc(n * sizeof(*copy));
	struct fake_stream *st = NULL;
	CUresult rc = CUDA_SUCCESS;
	bool done = false, events = false;
	size_t i;

	if (copy == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fake_lock();
	if (!fake_stream_pseudo(stream)) {
		if (!fake_list_has(fake_streams, stream))
			rc = CUDA_ERROR_INVALID_HANDLE;
		else
			st = (struct fake_stream *)stream;
	}
	if (rc == CUDA_SUCCESS && st != NULL && st->capture != NULL) {
		done = true;
		rc = st->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
				     : fake_graph_append(st->capture, ops, n);
	}
	if (rc == CUDA_SUCCESS && !done) {
		memcpy(copy, ops, n * sizeof(*ops));
		for (i = 0; i < n; i++) {
			if (copy[i].kind == FAKE_OP_EVENT && fake_list_has(fake_events, copy[i].u.event.ev)) {
				copy[i].u.event.seq = ++copy[i].u.event.ev->submitted;
				events = true;
			}
		}
		if (st != NULL && fake_stream_queued(st)) {
			done = true;
			rc = fake_queue_append(st, copy, n);
		}
	}
	fake_unlock();
	if (rc == CUDA_SUCCESS && !done) {
		for (i = 0; i < n; i++)
			fake_run(&copy[i]);
		/* A stream may have queued a wait for a record that was numbered but not yet run. */
		if (events)
			fake_pump();
	}
	if (copy != local)
		free(copy);
	return rc;
}

CUresult fake_submit(CUstream stream, const struct fake_op *op)
{
	return fake_submit_ops(stream, op, 1);
}

/* ---- streams ---- */

static CUresult fake_stream_create(CUstream *ps, unsigned int flags, int priority)
{
	struct fake_stream *st;
	struct fake_ctx *ctx;
	CUresult rc;

	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (ps == NULL || (flags != CU_STREAM_DEFAULT && flags != CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	st = calloc(1, sizeof(*st));
	if (st == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	st->ctx = ctx;
	st->flags = flags;
	/* Clamped to the H100 range [-5, 0], as the driver does. */
	st->priority = priority < -5 ? -5 : priority > 0 ? 0 : priority;
	fake_lock();
	fake_list_push(&fake_streams, st);
	fake_unlock();
	*ps = (CUstream)st;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
	FAKE_ENTER("cuStreamCreate");
	return fake_leave(fake_stream_create(ps, flags, 0));
}

FAKE_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority)
{
	FAKE_ENTER("cuStreamCreateWithPriority");
	return fake_leave(fake_stream_create(ps, flags, priority));
}

static size_t fake_gmem_used[FAKE_MAX_DEVICES], fake_gmem_high[FAKE_MAX_DEVICES]; /* device lock */

/* Grows an array to hold need elements. */
static bool fake_grow(void *arrp, size_t *cap, size_t need, size_t elem)
{
	void **arr = arrp, *p;
	size_t n;

	if (need <= *cap)
		return true;
	n = need * 2;
	p = realloc(*arr, n * elem);
	if (p == NULL)
		return false;
	*arr = p;
	*cap = n;
	return true;
}

/* Drops one reference to each buffer; lock not held (freeing takes it). */
static void fake_gbufs_put(struct fake_gbuf **bufs, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct fake_gbuf *b = bufs[i];
		bool last;

		fake_lock();
		last = --b->refs == 0;
		if (last)
			fake_gmem_used[b->dev] -= b->len;
		fake_unlock();
		if (last) {
			fake_mem_pool_unmap(b->ptr);
			free(b);
		}
	}
}

/* Adds references to bufs to g's set, each buffer once; device lock held. */
static CUresult fake_graph_take_bufs(struct fake_graph *g, struct fake_gbuf **bufs, size_t n)
{
	size_t i, j;

	if (!fake_grow(&g->bufs, &g->bcap, g->nb + n, sizeof(*g->bufs)))
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (i = 0; i < n; i++) {
		for (j = 0; j < g->nb && g->bufs[j] != bufs[i]; j++)
			;
		if (j < g->nb)
			continue;
		bufs[i]->refs++;
		g->bufs[g->nb++] = bufs[i];
	}
	return CUDA_SUCCESS;
}

static void fake_graph_free(struct fake_graph *g)
{
	size_t i;

	if (g == NULL)
		return;
	fake_gbufs_put(g->bufs, g->nb);
	for (i = 0; i < g->nn; i++)
		free(g->nodes[i]);
	free(g->nodes);
	free(g->bufs);
	free(g->ops);
	free(g);
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
	struct fake_stream *st = (struct fake_stream *)s;
	bool found;

	FAKE_ENTER("cuStreamDestroy");
	if (fake_stream_pseudo(s))
		return fake_leave(CUDA_ERROR_INVALID_HANDLE);
	/* The driver finishes a destroyed stream's work: run what it queued first. */
	if (fake_stream_hold(s, 0) == CUDA_SUCCESS) {
		fake_lock();
		if (fake_list_has(fake_streams, st) && fake_stream_queued(st)) {
			fake_unlock();
			fake_exec_release_all();
		} else {
			fake_unlock();
		}
	}
	fake_lock();
	found = fake_list_remove(&fake_streams, st);
	fake_unlock();
	if (!found)
		return fake_leave(CUDA_ERROR_INVALID_HANDLE);
	fake_graph_free(st->capture);
	free(st->queue);
	free(st);
	return fake_leave(CUDA_SUCCESS);
}

/* Synchronising (or querying) a capturing stream is illegal and breaks the capture, as in the
 * driver. A query of queued work answers NOT_READY; a synchronize releases it (the stream's own
 * hold first, every hold when it waits for another held stream; the legacy stream waits for all). */
static CUresult fake_stream_sync(CUstream s, bool query)
{
	struct fake_stream *st = (struct fake_stream *)s;
	CUresult rc = CUDA_SUCCESS;
	bool queued = false;

	if (s == NULL || s == CU_STREAM_LEGACY) {
		if (!query)
			fake_exec_release_all();
		return CUDA_SUCCESS;
	}
	if (fake_stream_pseudo(s))
		return CUDA_SUCCESS;
	fake_lock();
	if (!fake_list_has(fake_streams, st)) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (st->capture != NULL) {
		st->invalidated = true;
		rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	} else {
		queued = fake_stream_queued(st);
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS || !queued)
		return rc;
	if (query)
		return CUDA_ERROR_NOT_READY;
	fake_stream_hold(s, 0);
	fake_lock();
	queued = fake_list_has(fake_streams, st) && fake_stream_queued(st);
	fake_unlock();
	if (queued)
		fake_exec_release_all();
	return CUDA_SUCCESS;
}

static CUresult fake_stream_synchronize(CUstream s)
{
	CUresult rc = fake_stream_sync(s, false);

	if (rc == CUDA_SUCCESS)
		fake_pool_on_sync();
	return rc;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
	FAKE_ENTER("cuStreamSynchronize");
	return fake_leave(fake_stream_synchronize(s));
}

FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s)
{
	FAKE_ENTER("cuStreamSynchronize");
	return fake_leave(fake_stream_synchronize(s));
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream s)
{
	FAKE_ENTER("cuStreamQuery");
	return fake_leave(fake_stream_sync(s, true));
}

FAKE_EXPORT CUresult cuStreamQuery_ptsz(CUstream s)
{
	FAKE_ENTER("cuStreamQuery");
	return fake_leave(fake_stream_sync(s, true));
}

/* An event whose record is still queued: a stream of ours queues behind it; a default stream
 * cannot queue, so the holds are released (the default stream waits for the work). */
static CUresult fake_stream_wait_event(CUstream s, CUevent ev, unsigned int flags)
{
	struct fake_op op = {.kind = FAKE_OP_WAIT};
	struct fake_stream *st = (struct fake_stream *)s;
	struct fake_event *e = (struct fake_event *)ev;
	CUresult rc = fake_stream_check(s);
	bool release = false;

	if (rc != CUDA_SUCCESS)
		return rc;
	if (flags & ~(unsigned int)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	if (!fake_list_has(fake_events, e)) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (e->done < e->submitted) {
		if (fake_stream_pseudo(s) || !fake_list_has(fake_streams, st)) {
			release = true;
		} else if (st->capture == NULL) {
			op.u.event.ev = e;
			op.u.event.seq = e->submitted;
			rc = fake_queue_append(st, &op, 1);
		}
	}
	fake_unlock();
	if (release)
		fake_exec_release_all();
	return rc;
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream s, CUevent ev, unsigned int flags)
{
	FAKE_ENTER("cuStreamWaitEvent");
	return fake_leave(fake_stream_wait_event(s, ev, flags));
}

FAKE_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags)
{
	FAKE_ENTER("cuStreamWaitEvent");
	return fake_leave(fake_stream_wait_event(s, ev, flags));
}

static CUresult fake_host_func(CUstream s, CUhostFn fn, void *data)
{
	struct fake_op op = {.kind = FAKE_OP_HOSTFN};
	struct fake_ctx *ctx;
	CUresult rc = fake_ctx_current(&ctx);

	if (rc != CUDA_SUCCESS)
		return rc;
	if (fn == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	op.u.hostfn.fn = fn;
	op.u.hostfn.data = data;
	return fake_submit(s, &op);
}

FAKE_EXPORT CUresult cuLaunchHostFunc(CUstream s, CUhostFn fn, void *data)
{
	FAKE_ENTER("cuLaunchHostFunc");
	return fake_leave(fake_host_func(s, fn, data));
}

FAKE_EXPORT CUresult cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void *data)
{
	FAKE_ENTER("cuLaunchHostFunc");
	return fake_leave(fake_host_func(s == NULL ? CU_STREAM_PER_THREAD : s, fn, data));
}

/* ---- events ---- */

FAKE_EXPORT CUresult cuEventCreate(CUevent *pev, unsigned int flags)
{
	const unsigned int known =
		CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	struct fake_event *ev;
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuEventCreate");
	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	if (pev == NULL || (flags & ~known) ||
	    ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING)))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	ev = calloc(1, sizeof(*ev));
	if (ev == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	ev->flags = flags;
	fake_lock();
	fake_list_push(&fake_events, ev);
	fake_unlock();
	*pev = (CUevent)ev;
	return fake_leave(CUDA_SUCCESS);
}

static CUresult fake_event_record(CUevent ev, CUstream s, unsigned int flags)
{
	struct fake_op op = {.kind = FAKE_OP_EVENT};
	bool ok;

	if (flags & ~(unsigned int)CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	ok = fake_list_has(fake_events, ev);
	fake_unlock();
	if (!ok)
		return CUDA_ERROR_INVALID_HANDLE;
	op.u.event.ev = (struct fake_event *)ev;
	return fake_submit(s, &op);
}

FAKE_EXPORT CUresult cuEventRecord(CUevent ev, CUstream s)
{
	FAKE_ENTER("cuEventRecord");
	return fake_leave(fake_event_record(ev, s, 0));
}

FAKE_EXPORT CUresult cuEventRecord_ptsz(CUevent ev, CUstream s)
{
	FAKE_ENTER("cuEventRecord");
	return fake_leave(fake_event_record(ev, s == NULL ? CU_STREAM_PER_THREAD : s, 0));
}

FAKE_EXPORT CUresult cuEventRecordWithFlags(CUevent ev, CUstream s, unsigned int flags)
{
	FAKE_ENTER("cuEventRecordWithFlags");
	return fake_leave(fake_event_record(ev, s, flags));
}

FAKE_EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent ev, CUstream s, unsigned int flags)
{
	FAKE_ENTER("cuEventRecordWithFlags");
	return fake_leave(fake_event_record(ev, s == NULL ? CU_STREAM_PER_THREAD : s, flags));
}

static CUresult fake_event_check(CUevent ev)
{
	bool ok;

	fake_lock();
	ok = fake_list_has(fake_events, ev);
	fake_unlock();
	return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* Whether the event's latest record is still queued on a held stream. */
static bool fake_event_queued(CUevent ev)
{
	struct fake_event *e = (struct fake_event *)ev;
	bool pending;

	fake_lock();
	pending = fake_list_has(fake_events, e) && e->done < e->submitted;
	fake_unlock();
	return pending;
}

FAKE_EXPORT CUresult cuEventQuery(CUevent ev)
{
	CUresult rc;

	FAKE_ENTER("cuEventQuery");
	rc = fake_event_check(ev);
	if (rc == CUDA_SUCCESS && fake_event_queued(ev))
		rc = CUDA_ERROR_NOT_READY;
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent ev)
{
	CUresult rc;

	FAKE_ENTER("cuEventSynchronize");
	rc = fake_event_check(ev);
	if (rc == CUDA_SUCCESS && fake_event_queued(ev))
		fake_exec_release_all();
	if (rc == CUDA_SUCCESS)
		fake_pool_on_sync();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent ev)
{
	bool found;

	FAKE_ENTER("cuEventDestroy");
	fake_lock();
	found = fake_list_remove(&fake_events, ev);
	fake_unlock();
	if (found)
		free(ev);
	return fake_leave(found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

static CUresult fake_elapsed(float *ms, CUevent start, CUevent end)
{
	struct fake_event *a = (struct fake_event *)start, *b = (struct fake_event *)end;
	CUresult rc = CUDA_SUCCESS;

	if (ms == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	if (!fake_list_has(fake_events, a) || !fake_list_has(fake_events, b) || !a->recorded ||
	    !b->recorded || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
		rc = CUDA_ERROR_INVALID_HANDLE;
	else
		*ms = (float)((double)(b->when.tv_sec - a->when.tv_sec) * 1e3 +
			      (double)(b->when.tv_nsec - a->when.tv_nsec) / 1e6);
	fake_unlock();
	return rc;
}

FAKE_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
	FAKE_ENTER("cuEventElapsedTime");
	return fake_leave(fake_elapsed(ms, start, end));
}

static const PFN_cuEventElapsedTime_v2000 fake_check_elapsed_v1 __attribute__((unused)) =
	fake_legacy_event_elapsed_time;
CUresult fake_legacy_event_elapsed_time(float *ms, CUevent start, CUevent end)
{
	FAKE_ENTER("cuEventElapsedTime");
	return fake_leave(fake_elapsed(ms, start, end));
}

/* ---- modules: contents are ignored, functions are the built-in kernels ---- */

static CUresult fake_module_new(CUmodule *pm)
{
	struct fake_module *m;
	struct fake_ctx *ctx;
	CUresult rc = fake_ctx_current(&ctx);
	size_t i;

	if (rc != CUDA_SUCCESS)
		return rc;
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	for (i = 0; i < FAKE_NKERNELS; i++) {
		m->fns[i].kernel = &fake_kernels[i];
		m->fns[i].module = m;
	}
	fake_lock();
	fake_list_push(&fake_modules, m);
	fake_unlock();
	*pm = (CUmodule)m;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuModuleLoad(CUmodule *pm, const char *fname)
{
	FAKE_ENTER("cuModuleLoad");
	if (pm == NULL || fname == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (access(fname, R_OK) != 0)
		return fake_leave(CUDA_ERROR_FILE_NOT_FOUND);
	return fake_leave(fake_module_new(pm));
}

FAKE_EXPORT CUresult cuModuleLoadData(CUmodule *pm, const void *image)
{
	FAKE_ENTER("cuModuleLoadData");
	if (pm == NULL || image == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_module_new(pm));
}

FAKE_EXPORT CUresult cuModuleLoadDataEx(CUmodule *pm, const void *image, unsigned int nopts,
					CUjit_option *opts, void **values)
{
	FAKE_ENTER("cuModuleLoadDataEx");
	if (pm == NULL || image == NULL || (nopts > 0 && (opts == NULL || values == NULL)))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_module_new(pm));
}

FAKE_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *pm, const void *fatbin)
{
	FAKE_ENTER("cuModuleLoadFatBinary");
	if (pm == NULL || fatbin == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_module_new(pm));
}

FAKE_EXPORT CUresult cuModuleUnload(CUmodule m)
{
	bool found;

	FAKE_ENTER("cuModuleUnload");
	fake_lock();
	found = fake_list_remove(&fake_modules, m);
	fake_unlock();
	if (found)
		free(m);
	return fake_leave(found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction *pf, CUmodule m, const char *name)
{
	struct fake_module *mod = (struct fake_module *)m;
	CUresult rc = CUDA_ERROR_NOT_FOUND;
	bool ok;
	size_t i;

	FAKE_ENTER("cuModuleGetFunction");
	if (pf == NULL || name == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	ok = fake_list_has(fake_modules, mod);
	fake_unlock();
	if (!ok)
		return fake_leave(CUDA_ERROR_INVALID_HANDLE);
	for (i = 0; i < FAKE_NKERNELS; i++) {
		if (strcmp(fake_kernels[i].name, name) == 0) {
			*pf = (CUfunction)&mod->fns[i];
			rc = CUDA_SUCCESS;
		}
	}
	return fake_leave(rc);
}

/* ---- launches ---- */

static const struct fake_kernel *fake_function_kernel(CUfunction f)
{
	const struct fake_function *fn = (const struct fake_function *)f;
	const struct fake_kernel *k = NULL;
	struct fake_module *m;

	fake_lock();
	for (m = fake_modules; m != NULL && k == NULL; m = m->next)
		if (fn >= m->fns && fn < m->fns + FAKE_NKERNELS)
			k = fn->kernel;
	fake_unlock();
	return k;
}

/* Parameters come either as kernelParams (one pointer per parameter) or packed in the
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer of extra, each at its natural alignment. */
static CUresult fake_kernel_args(const struct fake_kernel *k, void **params, void **extra,
				 uint64_t *slots)
{
	const char *buf = NULL;
	size_t bufsize = 0, off = 0;
	unsigned int i;

	if (params != NULL && extra != NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (params != NULL) {
		for (i = 0; i < k->nparams; i++) {
			if (params[i] == NULL)
				return CUDA_ERROR_INVALID_VALUE;
			memcpy(&slots[i], params[i], k->size[i]);
		}
		return CUDA_SUCCESS;
	}
	for (i = 0; extra != NULL && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
		if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
			buf = extra[i + 1];
		else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE)
			bufsize = *(size_t *)extra[i + 1];
		else
			return CUDA_ERROR_INVALID_VALUE;
	}
	if (buf == NULL)
		return k->nparams == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < k->nparams; i++) {
		off = (off + k->size[i] - 1) / k->size[i] * k->size[i];
		if (off + k->size[i] > bufsize)
			return CUDA_ERROR_INVALID_VALUE;
		memcpy(&slots[i], buf + off, k->size[i]);
		off += k->size[i];
	}
	return CUDA_SUCCESS;
}

/* A launch's op, checked as the driver checks a launch (or a kernel node). */
static CUresult fake_kernel_op(CUfunction f, const struct fake_dims *d, void **params, void **extra,
			       struct fake_op *op)
{
	const struct fake_kernel *k;
	struct fake_ctx *ctx;
	CUresult rc;

	*op = (struct fake_op){.kind = FAKE_OP_KERNEL};
	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	k = fake_function_kernel(f);
	if (k == NULL)
		return CUDA_ERROR_INVALID_HANDLE;
	if (d->gx == 0 || d->gy == 0 || d->gz == 0 || d->bx == 0 || d->by == 0 || d->bz == 0 ||
	    d->gy > 65535 || d->gz > 65535 || d->bx > 1024 || d->by > 1024 || d->bz > 64 ||
	    (unsigned long long)d->bx * d->by * d->bz > FAKE_MAX_THREADS_PER_BLOCK ||
	    d->shared > FAKE_MAX_DYNAMIC_SHARED)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_kernel_args(k, params, extra, op->u.kernel.args);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (k->check != NULL) {
		rc = k->check(op->u.kernel.args, d);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	op->u.kernel.kernel = k;
	op->u.kernel.dims = *d;
	return CUDA_SUCCESS;
}

static CUresult fake_launch(CUfunction f, const struct fake_dims *d, CUstream s, void **params,
			    void **extra)
{
	struct fake_op op;
	struct fake_ctx *ctx;
	CUresult rc;

	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS && fake_function_kernel(f) == NULL)
		rc = CUDA_ERROR_INVALID_HANDLE;
	if (rc == CUDA_SUCCESS)
		rc = fake_kernel_op(f, d, params, extra, &op);
	if (rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_SUCCESS) {
		CUresult src = fake_stream_check(s); /* a bad stream before bad arguments */

		if (src != CUDA_SUCCESS)
			return src;
	}
	return rc != CUDA_SUCCESS ? rc : fake_submit(s, &op);
}

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				    unsigned int bx, unsigned int by, unsigned int bz,
				    unsigned int shared, CUstream s, void **params, void **extra)
{
	struct fake_dims d = {gx, gy, gz, bx, by, bz, shared};

	FAKE_ENTER("cuLaunchKernel");
	return fake_leave(fake_launch(f, &d, s, params, extra));
}

FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					 unsigned int gz, unsigned int bx, unsigned int by,
					 unsigned int bz, unsigned int shared, CUstream s,
					 void **params, void **extra)
{
	struct fake_dims d = {gx, gy, gz, bx, by, bz, shared};

	FAKE_ENTER("cuLaunchKernel");
	return fake_leave(fake_launch(f, &d, s == NULL ? CU_STREAM_PER_THREAD : s, params, extra));
}

static CUresult fake_launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra,
			       bool ptsz)
{
	struct fake_dims d;

	if (c == NULL || (c->numAttrs > 0 && c->attrs == NULL))
		return CUDA_ERROR_INVALID_VALUE;
	d = (struct fake_dims){c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
			       c->blockDimY, c->blockDimZ, c->sharedMemBytes};
	return fake_launch(f, &d, ptsz && c->hStream == NULL ? CU_STREAM_PER_THREAD : c->hStream,
			   params, extra);
}

FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
				      void **extra)
{
	FAKE_ENTER("cuLaunchKernelEx");
	return fake_leave(fake_launch_ex(config, f, params, extra, false));
}

FAKE_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
					   void **params, void **extra)
{
	FAKE_ENTER("cuLaunchKernelEx");
	return fake_leave(fake_launch_ex(config, f, params, extra, true));
}

FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
					       unsigned int gz, unsigned int bx, unsigned int by,
					       unsigned int bz, unsigned int shared, CUstream s,
					       void **params)
{
	struct fake_dims d = {gx, gy, gz, bx, by, bz, shared};

	FAKE_ENTER("cuLaunchCooperativeKernel");
	return fake_leave(fake_launch(f, &d, s, params, NULL));
}

FAKE_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
						    unsigned int gy, unsigned int gz,
						    unsigned int bx, unsigned int by,
						    unsigned int bz, unsigned int shared,
						    CUstream s, void **params)
{
	struct fake_dims d = {gx, gy, gz, bx, by, bz, shared};

	FAKE_ENTER("cuLaunchCooperativeKernel");
	return fake_leave(fake_launch(f, &d, s == NULL ? CU_STREAM_PER_THREAD : s, params, NULL));
}

/* ---- stream capture and graphs ---- */

static CUresult fake_begin_capture(CUstream s, CUstreamCaptureMode mode)
{
	struct fake_stream *st = (struct fake_stream *)s;
	struct fake_graph *g;
	CUresult rc = CUDA_SUCCESS;

	if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
	    mode != CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_stream_pseudo(s))
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the default streams cannot capture */
	g = calloc(1, sizeof(*g));
	if (g == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fake_lock();
	if (!fake_list_has(fake_streams, st)) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (st->capture != NULL) {
		rc = CUDA_ERROR_ILLEGAL_STATE;
	} else {
		static cuuint64_t ids;

		st->capture = g;
		st->invalidated = false;
		st->capture_id = ++ids;
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS)
		free(g);
	return rc;
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode)
{
	FAKE_ENTER("cuStreamBeginCapture");
	return fake_leave(fake_begin_capture(s, mode));
}

FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode)
{
	FAKE_ENTER("cuStreamBeginCapture");
	return fake_leave(fake_begin_capture(s, mode));
}

/* The CUDA 10.0 form, without a mode: global capture (prototype from cuda.h's legacy list). */
CUresult fake_legacy_stream_begin_capture(CUstream s)
{
	FAKE_ENTER("cuStreamBeginCapture");
	return fake_leave(fake_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

CUresult fake_legacy_stream_begin_capture_ptsz(CUstream s)
{
	FAKE_ENTER("cuStreamBeginCapture");
	return fake_leave(fake_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

static CUresult fake_end_capture(CUstream s, CUgraph *pg)
{
	struct fake_stream *st = (struct fake_stream *)s;
	struct fake_graph *g = NULL;
	CUresult rc = CUDA_SUCCESS;

	if (pg == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (fake_stream_pseudo(s))
		return CUDA_ERROR_ILLEGAL_STATE;
	fake_lock();
	if (!fake_list_has(fake_streams, st)) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (st->capture == NULL) {
		rc = CUDA_ERROR_ILLEGAL_STATE;
	} else {
		g = st->capture;
		st->capture = NULL;
		if (st->invalidated) {
			rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
			st->invalidated = false;
		} else {
			fake_list_push(&fake_graphs, g);
		}
	}
	fake_unlock();
	if (rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) {
		fake_graph_free(g);
		*pg = NULL;
	} else if (rc == CUDA_SUCCESS) {
		*pg = (CUgraph)g;
	}
	return rc;
}

FAKE_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *pg)
{
	FAKE_ENTER("cuStreamEndCapture");
	return fake_leave(fake_end_capture(s, pg));
}

FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *pg)
{
	FAKE_ENTER("cuStreamEndCapture");
	return fake_leave(fake_end_capture(s, pg));
}

static CUresult fake_is_capturing(CUstream s, CUstreamCaptureStatus *status)
{
	struct fake_stream *st = (struct fake_stream *)s;
	CUresult rc = CUDA_SUCCESS;

	if (status == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*status = CU_STREAM_CAPTURE_STATUS_NONE;
	if (fake_stream_pseudo(s))
		return CUDA_SUCCESS;
	fake_lock();
	if (!fake_list_has(fake_streams, st))
		rc = CUDA_ERROR_INVALID_HANDLE;
	else if (st->capture != NULL)
		*status = st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
					  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
	fake_unlock();
	return rc;
}

FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
	FAKE_ENTER("cuStreamIsCapturing");
	return fake_leave(fake_is_capturing(s, status));
}

FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *status)
{
	FAKE_ENTER("cuStreamIsCapturing");
	return fake_leave(fake_is_capturing(s, status));
}

static CUresult fake_instantiate(CUgraphExec *pe, CUgraph graph)
{
	struct fake_graph *g = (struct fake_graph *)graph;
	struct fake_exec *e;
	CUresult rc = CUDA_SUCCESS;

	if (pe == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	e = calloc(1, sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fake_lock();
	if (!fake_list_has(fake_graphs, g)) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (g->n > 0 && (e->ops = malloc(g->n * sizeof(*e->ops))) == NULL) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else if (g->nb > 0 && (e->bufs = malloc(g->nb * sizeof(*e->bufs))) == NULL) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		size_t i;

		if (g->n > 0)
			memcpy(e->ops, g->ops, g->n * sizeof(*e->ops));
		e->n = g->n;
		for (i = 0; i < g->nb; i++) {
			e->bufs[i] = g->bufs[i];
			e->bufs[i]->refs++;
		}
		e->nb = g->nb;
		fake_list_push(&fake_execs, e);
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		free(e->bufs);
		free(e->ops);
		free(e);
		return rc;
	}
	*pe = (CUgraphExec)e;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph graph,
						 unsigned long long flags)
{
	const unsigned long long known = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
					 CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD |
					 CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |
					 CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;

	FAKE_ENTER("cuGraphInstantiateWithFlags");
	if (flags & ~known)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	return fake_leave(fake_instantiate(pe, graph));
}

/* The CUDA 10 and 11 forms (prototypes from cuda.h's legacy list). */
CUresult fake_legacy_graph_instantiate(CUgraphExec *pe, CUgraph graph, CUgraphNode *err_node,
				       char *log, size_t log_size)
{
	FAKE_ENTER("cuGraphInstantiate");
	if (log != NULL && log_size > 0)
		log[0] = '\0';
	return fake_leave(fake_instantiate(pe, graph));
}

CUresult fake_legacy_graph_instantiate_v2(CUgraphExec *pe, CUgraph graph, CUgraphNode *err_node,
					  char *log, size_t log_size)
{
	FAKE_ENTER("cuGraphInstantiate");
	if (log != NULL && log_size > 0)
		log[0] = '\0';
	return fake_leave(fake_instantiate(pe, graph));
}

static CUresult fake_graph_launch(CUgraphExec exec, CUstream s)
{
	struct fake_exec *e = (struct fake_exec *)exec;
	bool ok;

	fake_lock();
	ok = fake_list_has(fake_execs, e);
	fake_unlock();
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	if (e->n == 0)
		return fake_stream_check(s);
	return fake_submit_ops(s, e->ops, e->n);
}

FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
	FAKE_ENTER("cuGraphLaunch");
	return fake_leave(fake_graph_launch(exec, s));
}

FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s)
{
	FAKE_ENTER("cuGraphLaunch");
	return fake_leave(fake_graph_launch(exec, s == NULL ? CU_STREAM_PER_THREAD : s));
}

FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
	struct fake_exec *e = (struct fake_exec *)exec;
	bool found;

	FAKE_ENTER("cuGraphExecDestroy");
	fake_lock();
	found = fake_list_remove(&fake_execs, e);
	fake_unlock();
	if (!found)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_gbufs_put(e->bufs, e->nb);
	free(e->bufs);
	free(e->ops);
	free(e);
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuGraphDestroy(CUgraph graph)
{
	bool found;

	FAKE_ENTER("cuGraphDestroy");
	fake_lock();
	found = fake_list_remove(&fake_graphs, graph);
	fake_unlock();
	if (!found)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_graph_free((struct fake_graph *)graph);
	return fake_leave(CUDA_SUCCESS);
}

/* ---- explicit graphs and graph memory ---- */

static bool fake_stream_capture_of(const struct fake_graph *g);

/* Whether every dependency is a node of g; device lock held. */
static bool fake_deps_ok(struct fake_graph *g, const CUgraphNode *deps, size_t ndeps)
{
	size_t i, j;

	if (ndeps > 0 && deps == NULL)
		return false;
	for (i = 0; i < ndeps; i++) {
		for (j = 0; j < g->nn && (CUgraphNode)g->nodes[j] != deps[i]; j++)
			;
		if (j == g->nn)
			return false;
	}
	return true;
}

/* Appends a node running ops (a NOP when n is 0) to an explicit graph. */
static CUresult fake_graph_add(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
			       size_t ndeps, CUgraphNodeType type, const struct fake_op *ops, size_t n,
			       struct fake_gnode **out)
{
	const struct fake_op nop = {.kind = FAKE_OP_NOP};
	struct fake_graph *g = (struct fake_graph *)graph;
	struct fake_gnode *node;
	CUresult rc = CUDA_SUCCESS;

	if (pnode == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	node = calloc(1, sizeof(*node));
	if (node == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	node->graph = g;
	node->type = type;
	fake_lock();
	if (!fake_list_has(fake_graphs, g) || !fake_deps_ok(g, deps, ndeps))
		rc = CUDA_ERROR_INVALID_VALUE;
	else if (!fake_grow(&g->nodes, &g->ncap, g->nn + 1, sizeof(*g->nodes)))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	else
		rc = n == 0 ? fake_graph_append(g, &nop, 1) : fake_graph_append(g, ops, n);
	if (rc == CUDA_SUCCESS)
		g->nodes[g->nn++] = node;
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		free(node);
		return rc;
	}
	*pnode = (CUgraphNode)node;
	if (out != NULL)
		*out = node;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
	struct fake_graph *g;

	FAKE_ENTER("cuGraphCreate");
	if (pg == NULL || flags != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	g = calloc(1, sizeof(*g));
	if (g == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	fake_lock();
	fake_list_push(&fake_graphs, g);
	fake_unlock();
	*pg = (CUgraph)g;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuGraphAddEmptyNode(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
					 size_t ndeps)
{
	FAKE_ENTER("cuGraphAddEmptyNode");
	return fake_leave(fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_EMPTY, NULL, 0,
					 NULL));
}

static CUresult fake_add_kernel(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
				size_t ndeps, const CUDA_KERNEL_NODE_PARAMS *p)
{
	struct fake_dims d;
	struct fake_op op;
	CUresult rc;

	if (p == NULL || p->func == NULL) /* CUkernel handles are not modelled */
		return CUDA_ERROR_INVALID_VALUE;
	d = (struct fake_dims){p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX,
			       p->blockDimY, p->blockDimZ, p->sharedMemBytes};
	rc = fake_kernel_op(p->func, &d, p->kernelParams, p->extra, &op);
	if (rc != CUDA_SUCCESS)
		return rc;
	return fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_KERNEL, &op, 1, NULL);
}

FAKE_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *pnode, CUgraph graph,
					     const CUgraphNode *deps, size_t ndeps,
					     const CUDA_KERNEL_NODE_PARAMS *p)
{
	FAKE_ENTER("cuGraphAddKernelNode");
	return fake_leave(fake_add_kernel(pnode, graph, deps, ndeps, p));
}

/* Graph memory on dev: charged now, at a fixed address, held by g; device lock not held. */
static CUresult fake_gbuf_new(struct fake_graph *g, int dev, size_t size, CUdeviceptr *out)
{
	struct fake_gbuf *b = calloc(1, sizeof(*b));
	CUresult rc;

	if (b == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	b->len = (size + 4095) / 4096 * 4096;
	b->dev = dev;
	rc = fake_mem_pool_map(dev, b->len, &b->ptr);
	if (rc != CUDA_SUCCESS) {
		free(b);
		return rc;
	}
	fake_lock();
	if (!fake_list_has(fake_graphs, g) && !fake_stream_capture_of(g)) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (!fake_grow(&g->bufs, &g->bcap, g->nb + 1, sizeof(*g->bufs))) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		b->refs = 1;
		g->bufs[g->nb++] = b;
		fake_gmem_used[dev] += b->len;
		if (fake_gmem_used[dev] > fake_gmem_high[dev])
			fake_gmem_high[dev] = fake_gmem_used[dev];
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		fake_mem_pool_unmap(b->ptr);
		free(b);
		return rc;
	}
	*out = b->ptr;
	return CUDA_SUCCESS;
}

/* As the driver checks a graph allocation: pinned device memory, no handle types. */
static CUresult fake_alloc_params_check(const CUmemPoolProps *pp, size_t bytesize)
{
	if (pp->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    pp->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
	    pp->handleTypes != CU_MEM_HANDLE_TYPE_NONE || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (pp->location.id < 0 || pp->location.id >= fake_device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

static CUresult fake_add_mem_alloc(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
				   size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	struct fake_graph *g = (struct fake_graph *)graph;
	struct fake_gnode *node;
	CUdeviceptr ptr;
	CUresult rc;
	bool ok;

	if (p == NULL || pnode == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_alloc_params_check(&p->poolProps, p->bytesize);
	if (rc != CUDA_SUCCESS)
		return rc;
	fake_lock();
	ok = fake_list_has(fake_graphs, g) && fake_deps_ok(g, deps, ndeps);
	fake_unlock();
	if (!ok)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_gbuf_new(g, p->poolProps.location.id, p->bytesize, &ptr);
	if (rc != CUDA_SUCCESS)
		return rc;
	rc = fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_MEM_ALLOC, NULL, 0, &node);
	if (rc != CUDA_SUCCESS)
		return rc; /* the buffer stays the graph's */
	p->dptr = ptr;
	node->alloc = *p;
	node->alloc.accessDescs = NULL; /* the caller's array */
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *pnode, CUgraph graph,
					    const CUgraphNode *deps, size_t ndeps,
					    CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
	FAKE_ENTER("cuGraphAddMemAllocNode");
	return fake_leave(fake_add_mem_alloc(pnode, graph, deps, ndeps, p));
}

/* Whether p lies in memory graph g holds; device lock held. */
static bool fake_graph_owns(const struct fake_graph *g, CUdeviceptr p)
{
	size_t i;

	for (i = 0; i < g->nb; i++)
		if (p >= g->bufs[i]->ptr && p < g->bufs[i]->ptr + g->bufs[i]->len)
			return true;
	return false;
}

/* A free node: of the graph's own memory, nothing to do when run (the memory lives with the
 * graph); of a live pool block, the block is freed when the graph runs. */
static CUresult fake_add_mem_free(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
				  size_t ndeps, CUdeviceptr ptr)
{
	struct fake_graph *g = (struct fake_graph *)graph;
	struct fake_op op = {.kind = FAKE_OP_NOP};
	bool own;

	fake_lock();
	own = fake_list_has(fake_graphs, g) && fake_graph_owns(g, ptr);
	fake_unlock();
	if (!own && !fake_pool_owns(ptr))
		return CUDA_ERROR_INVALID_VALUE;
	if (!own) {
		op.kind = FAKE_OP_FREE;
		op.u.free.ptr = ptr;
		op.u.free.gen = FAKE_FREE_LIVE;
	}
	return fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_MEM_FREE, &op, 1, NULL);
}

FAKE_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *pnode, CUgraph graph,
					   const CUgraphNode *deps, size_t ndeps, CUdeviceptr ptr)
{
	FAKE_ENTER("cuGraphAddMemFreeNode");
	return fake_leave(fake_add_mem_free(pnode, graph, deps, ndeps, ptr));
}

static CUresult fake_add_node(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
			      size_t ndeps, CUgraphNodeParams *p)
{
	CUDA_KERNEL_NODE_PARAMS k;
	CUDA_MEM_ALLOC_NODE_PARAMS a;
	CUresult rc;

	if (p == NULL || p->reserved0[0] || p->reserved0[1] || p->reserved0[2] || p->reserved2)
		return CUDA_ERROR_INVALID_VALUE;
	switch (p->type) {
	case CU_GRAPH_NODE_TYPE_EMPTY:
		return fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_EMPTY, NULL, 0, NULL);
	case CU_GRAPH_NODE_TYPE_KERNEL:
		memset(&k, 0, sizeof(k));
		k.func = p->kernel.func;
		k.gridDimX = p->kernel.gridDimX;
		k.gridDimY = p->kernel.gridDimY;
		k.gridDimZ = p->kernel.gridDimZ;
		k.blockDimX = p->kernel.blockDimX;
		k.blockDimY = p->kernel.blockDimY;
		k.blockDimZ = p->kernel.blockDimZ;
		k.sharedMemBytes = p->kernel.sharedMemBytes;
		k.kernelParams = p->kernel.kernelParams;
		k.extra = p->kernel.extra;
		return fake_add_kernel(pnode, graph, deps, ndeps, &k);
	case CU_GRAPH_NODE_TYPE_MEM_ALLOC:
		memset(&a, 0, sizeof(a));
		a.poolProps = p->alloc.poolProps;
		a.accessDescs = p->alloc.accessDescs;
		a.accessDescCount = p->alloc.accessDescCount;
		a.bytesize = p->alloc.bytesize;
		rc = fake_add_mem_alloc(pnode, graph, deps, ndeps, &a);
		if (rc == CUDA_SUCCESS)
			p->alloc.dptr = a.dptr;
		return rc;
	case CU_GRAPH_NODE_TYPE_MEM_FREE:
		return fake_add_mem_free(pnode, graph, deps, ndeps, p->free.dptr);
	default:
		return CUDA_ERROR_NOT_SUPPORTED;
	}
}

FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
				       const CUgraphEdgeData *edges, size_t ndeps,
				       CUgraphNodeParams *p)
{
	size_t i;

	FAKE_ENTER("cuGraphAddNode");
	for (i = 0; edges != NULL && i < ndeps; i++)
		if (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT)
			return fake_leave(CUDA_ERROR_NOT_SUPPORTED);
	return fake_leave(fake_add_node(pnode, graph, deps, ndeps, p));
}

static const PFN_cuGraphAddNode_v12020 fake_check_add_node_v1 __attribute__((unused)) =
	fake_legacy_graph_add_node;
CUresult fake_legacy_graph_add_node(CUgraphNode *pnode, CUgraph graph, const CUgraphNode *deps,
				    size_t ndeps, CUgraphNodeParams *p)
{
	FAKE_ENTER("cuGraphAddNode");
	return fake_leave(fake_add_node(pnode, graph, deps, ndeps, p));
}

/* The node handle, if it is one of a live graph; device lock held. */
static struct fake_gnode *fake_gnode_find(CUgraphNode handle)
{
	struct fake_graph *g;
	size_t i;

	for (g = fake_graphs; g != NULL; g = g->next)
		for (i = 0; i < g->nn; i++)
			if ((CUgraphNode)g->nodes[i] == handle)
				return g->nodes[i];
	return NULL;
}

FAKE_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *out)
{
	struct fake_gnode *n;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuGraphMemAllocNodeGetParams");
	if (out == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	n = fake_gnode_find(node);
	if (n == NULL || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
		rc = CUDA_ERROR_INVALID_VALUE;
	else
		*out = n->alloc;
	fake_unlock();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type)
{
	struct fake_gnode *n;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuGraphNodeGetType");
	if (type == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	n = fake_gnode_find(node);
	if (n == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	else
		*type = n->type;
	fake_unlock();
	return fake_leave(rc);
}

/* A copy of g's ops and nodes sharing its memory; device lock held. */
static CUresult fake_graph_copy(struct fake_graph *g, struct fake_graph **out)
{
	struct fake_graph *c = calloc(1, sizeof(*c));
	CUresult rc = CUDA_SUCCESS;
	size_t i;

	if (c == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (g->n > 0)
		rc = fake_graph_append(c, g->ops, g->n);
	if (rc == CUDA_SUCCESS && !fake_grow(&c->nodes, &c->ncap, g->nn, sizeof(*c->nodes)))
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	for (i = 0; rc == CUDA_SUCCESS && i < g->nn; i++) {
		struct fake_gnode *n = malloc(sizeof(*n));

		if (n == NULL) {
			rc = CUDA_ERROR_OUT_OF_MEMORY;
			break;
		}
		*n = *g->nodes[i];
		n->graph = c;
		c->nodes[c->nn++] = n;
	}
	if (rc == CUDA_SUCCESS)
		rc = fake_graph_take_bufs(c, g->bufs, g->nb);
	if (rc != CUDA_SUCCESS) {
		for (i = 0; i < c->nn; i++)
			free(c->nodes[i]);
		free(c->nodes);
		free(c->ops);
		free(c->bufs); /* references are taken only on success */
		free(c);
		return rc;
	}
	*out = c;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGraphClone(CUgraph *pclone, CUgraph graph)
{
	struct fake_graph *g = (struct fake_graph *)graph, *c = NULL;
	CUresult rc;

	FAKE_ENTER("cuGraphClone");
	if (pclone == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	rc = fake_list_has(fake_graphs, g) ? fake_graph_copy(g, &c) : CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS)
		fake_list_push(&fake_graphs, c);
	fake_unlock();
	if (rc == CUDA_SUCCESS)
		*pclone = (CUgraph)c;
	return fake_leave(rc);
}

/* The child's work is copied in (the driver clones the child); its memory is held by the
 * parent too. */
FAKE_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *pnode, CUgraph graph,
					      const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
	struct fake_graph *g = (struct fake_graph *)graph, *c = (struct fake_graph *)child;
	struct fake_op *ops = NULL;
	size_t n = 0;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuGraphAddChildGraphNode");
	fake_lock();
	if (!fake_list_has(fake_graphs, g) || !fake_list_has(fake_graphs, c) || g == c) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (c->n > 0 && (ops = malloc(c->n * sizeof(*ops))) == NULL) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		n = c->n;
		if (n > 0)
			memcpy(ops, c->ops, n * sizeof(*ops));
		rc = fake_graph_take_bufs(g, c->bufs, c->nb);
	}
	fake_unlock();
	if (rc == CUDA_SUCCESS)
		rc = fake_graph_add(pnode, graph, deps, ndeps, CU_GRAPH_NODE_TYPE_GRAPH, ops, n, NULL);
	free(ops);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph graph,
						  CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
	CUresult rc;

	FAKE_ENTER("cuGraphInstantiateWithParams");
	if (p == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_instantiate(pe, graph);
	p->hErrNode_out = NULL;
	p->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
	return fake_leave(rc);
}

/* Graph memory is never cached apart from the graphs that hold it: nothing to trim. */
FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
	FAKE_ENTER("cuDeviceGraphMemTrim");
	return fake_leave(dev >= 0 && dev < fake_device_count() ? CUDA_SUCCESS
							       : CUDA_ERROR_INVALID_DEVICE);
}

static CUresult fake_graph_mem_attr(CUdevice dev, CUgraphMem_attribute attr, void *value, bool set)
{
	CUresult rc = CUDA_SUCCESS;
	cuuint64_t *v = value;

	if (dev < 0 || dev >= fake_device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	if (v == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	switch (attr) {
	case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
		if (set)
			rc = CUDA_ERROR_INVALID_VALUE;
		else
			*v = fake_gmem_used[dev];
		break;
	case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
	case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: /* a reset only */
		if (set && *v != 0)
			rc = CUDA_ERROR_INVALID_VALUE;
		else if (set)
			fake_gmem_high[dev] = fake_gmem_used[dev];
		else
			*v = fake_gmem_high[dev];
		break;
	default:
		rc = CUDA_ERROR_INVALID_VALUE;
	}
	fake_unlock();
	return rc;
}

FAKE_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
	FAKE_ENTER("cuDeviceGetGraphMemAttribute");
	return fake_leave(fake_graph_mem_attr(dev, attr, value, false));
}

FAKE_EXPORT CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
	FAKE_ENTER("cuDeviceSetGraphMemAttribute");
	return fake_leave(fake_graph_mem_attr(dev, attr, value, true));
}

/* ---- stream-ordered memory inside a capture ---- */

/* The stream capturing into g, if any; device lock held. */
static bool fake_stream_capture_of(const struct fake_graph *g)
{
	struct fake_stream *st;

	for (st = fake_streams; st != NULL; st = st->next)
		if (st->capture == g)
			return true;
	return false;
}

/* The graph a stream captures into; device lock held. */
static CUresult fake_capture_graph(CUstream s, struct fake_graph **g)
{
	struct fake_stream *st = (struct fake_stream *)s;

	if (fake_stream_pseudo(s) || !fake_list_has(fake_streams, st) || st->capture == NULL)
		return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	if (st->invalidated)
		return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
	*g = st->capture;
	return CUDA_SUCCESS;
}

CUresult fake_capture_alloc(CUstream s, int dev, size_t size, CUdeviceptr *out)
{
	const struct fake_op nop = {.kind = FAKE_OP_NOP};
	struct fake_graph *g = NULL;
	CUresult rc;

	fake_lock();
	rc = fake_capture_graph(s, &g);
	fake_unlock();
	if (rc == CUDA_SUCCESS)
		rc = fake_gbuf_new(g, dev, size, out);
	return rc == CUDA_SUCCESS ? fake_submit(s, &nop) : rc;
}

CUresult fake_capture_free(CUstream s, CUdeviceptr p, bool pool_block)
{
	struct fake_op op = {.kind = FAKE_OP_NOP};
	struct fake_graph *g = NULL;
	CUresult rc;

	fake_lock();
	rc = fake_capture_graph(s, &g);
	if (rc == CUDA_SUCCESS && !fake_graph_owns(g, p) && !pool_block)
		rc = CUDA_ERROR_INVALID_VALUE;
	fake_unlock();
	if (rc != CUDA_SUCCESS)
		return rc;
	if (pool_block) {
		op.kind = FAKE_OP_FREE;
		op.u.free.ptr = p;
		op.u.free.gen = FAKE_FREE_LIVE;
	}
	return fake_submit(s, &op);
}

/* ---- capture information and modes ---- */

static _Thread_local CUstreamCaptureMode fake_thread_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	CUstreamCaptureMode old;

	FAKE_ENTER("cuThreadExchangeStreamCaptureMode");
	if (mode == NULL || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
			     *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
			     *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	old = fake_thread_capture_mode;
	fake_thread_capture_mode = *mode;
	*mode = old;
	return fake_leave(CUDA_SUCCESS);
}

/* Dependencies are not tracked: an active capture reports none. */
static CUresult fake_capture_info(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
				  CUgraph *graph, const CUgraphNode **deps,
				  const CUgraphEdgeData **edges, size_t *ndeps)
{
	struct fake_stream *st = (struct fake_stream *)s;
	CUresult rc = CUDA_SUCCESS;

	if (status == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	*status = CU_STREAM_CAPTURE_STATUS_NONE;
	if (graph != NULL)
		*graph = NULL;
	if (deps != NULL)
		*deps = NULL;
	if (edges != NULL)
		*edges = NULL;
	if (ndeps != NULL)
		*ndeps = 0;
	if (fake_stream_pseudo(s))
		return CUDA_SUCCESS;
	fake_lock();
	if (!fake_list_has(fake_streams, st)) {
		rc = CUDA_ERROR_INVALID_HANDLE;
	} else if (st->capture != NULL) {
		*status = st->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
					  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
		if (id != NULL)
			*id = st->capture_id;
		if (graph != NULL)
			*graph = (CUgraph)st->capture;
	}
	fake_unlock();
	return rc;
}

FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status,
					       cuuint64_t *id, CUgraph *graph,
					       const CUgraphNode **deps,
					       const CUgraphEdgeData **edges, size_t *ndeps)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, graph, deps, edges, ndeps));
}

FAKE_EXPORT CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus *status,
						    cuuint64_t *id, CUgraph *graph,
						    const CUgraphNode **deps,
						    const CUgraphEdgeData **edges, size_t *ndeps)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, graph, deps, edges, ndeps));
}

static const PFN_cuStreamGetCaptureInfo_v11030 fake_check_capture_info_v2 __attribute__((unused)) =
	fake_legacy_capture_info_v2;
CUresult fake_legacy_capture_info_v2(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
				     CUgraph *graph, const CUgraphNode **deps, size_t *ndeps)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, graph, deps, NULL, ndeps));
}

CUresult fake_legacy_capture_info_v2_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id,
					  CUgraph *graph, const CUgraphNode **deps, size_t *ndeps)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, graph, deps, NULL, ndeps));
}

static const PFN_cuStreamGetCaptureInfo_v10010 fake_check_capture_info_v1 __attribute__((unused)) =
	fake_legacy_capture_info;
CUresult fake_legacy_capture_info(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, NULL, NULL, NULL, NULL));
}

CUresult fake_legacy_capture_info_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id)
{
	FAKE_ENTER("cuStreamGetCaptureInfo");
	return fake_leave(fake_capture_info(s, status, id, NULL, NULL, NULL, NULL));
}
