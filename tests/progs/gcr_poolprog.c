/* gcr-poolprog: a driver-API workload on stream-ordered memory (issue 19) that runs unchanged on
 * the stand-in driver and on a GPU: an explicit pool and the device's default pool, allocations
 * and frees on different streams, pool trimming, a captured graph that allocates and frees inside,
 * and an explicit graph with memory nodes. Every result is checked exactly at the end, and a
 * DIGEST of the long-lived data lets a harness compare runs with and without suspends.
 *
 * Protocol (as gcr-testprog): "READY pid=<pid> bytes=<n>"; with --wait a stdin line "go";
 * "STEP <n>" per step (thread 0); "DONE"; with --wait a stdin line "check"; then
 * "DIGEST <64 hex>" and "RESULT ok" (exit 0), "RESULT FAIL ..." (1) or "ERROR <call> <code>" (2).
 *
 * --hold (the stand-in driver only, whose work otherwise runs at submission): the second stream
 * is held for POOL_HOLD_STEPS steps at a time (fake_stream_hold), so its copies and frees stay
 * queued across steps and at a suspend. An allocator that handed a block freed there to the next
 * step's allocation would let the next fill overwrite it before the queued copy reads it: the
 * sink check fails. */
#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcr_kernels.h"

#define POOL_BLOCK 256
#define POOL_MAX_GRID 4096
#define POOL_MAX_THREADS 8
#define POOL_LONG_PER_THREAD 4       /* long-lived buffers per thread, half from each pool */
#define POOL_SINK_WORDS 1024         /* words of each step's temporary kept in the sink */
#define POOL_GRAPH_BYTES ((size_t)2 << 20)
#define POOL_GRAPH_STEP 7u           /* the step the graphs apply to their own allocation */
#define POOL_TRIM_EVERY 10
#define POOL_HOLD_STEPS 4

static struct {
	const char *module;
	unsigned long mib, threads, steps, pace_us;
	bool wait, hold;
} opt = {.mib = 256, .threads = 2, .steps = 100};

struct pool_thread {
	int index;
	pthread_t tid;
	CUstream s, s2;     /* work and the second stream that frees the temporaries */
	CUevent ev;
	CUdeviceptr lived[POOL_LONG_PER_THREAD];
	uint64_t lived_words;
	uint32_t lived_seed[POOL_LONG_PER_THREAD];
	CUdeviceptr sink;   /* steps x POOL_SINK_WORDS: each step's temporary, copied on s2 */
	CUdeviceptr gres;   /* the captured graph's output */
	CUgraph cap_graph, node_graph;
	CUgraphExec cap_exec, node_exec;
};

static CUcontext ctx;
static CUmemoryPool pool;     /* created by this program */
static CUmemoryPool def_pool; /* the device's default pool */
static CUfunction k_fill, k_step, k_check;
static CUdeviceptr counters; /* mismatch counters: [0] the explicit graph's checks, [1] final checks */
static struct pool_thread threads[POOL_MAX_THREADS];
static unsigned long long total_bytes;
static CUresult (*hold_fn)(CUstream, int); /* the stand-in's fake_stream_hold, with --hold */

#define CU(call) pool_cu((call), #call)

static void pool_cu(CUresult rc, const char *call)
{
	const char *name = NULL;
	char fn[64];
	size_t n = strcspn(call, "(");

	if (rc == CUDA_SUCCESS)
		return;
	if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
		name = "CUDA_ERROR_UNKNOWN";
	snprintf(fn, sizeof(fn), "%.*s", (int)(n < sizeof(fn) ? n : sizeof(fn) - 1), call);
	printf("ERROR %s %s\n", fn, name);
	fflush(stdout);
	exit(2);
}

static void pool_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void pool_fail(const char *fmt, ...)
{
	va_list ap;

	printf("RESULT FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static void pool_usage(FILE *f)
{
	fputs("usage: gcr-poolprog --module PATH [--mib N] [--threads T] [--steps N] [--pace-us U] [--wait]\n"
	      "                    [--hold]\n", f);
}

static unsigned long pool_num(const char *s)
{
	char *end = NULL;
	unsigned long v = strtoul(s, &end, 10);

	if (s[0] == '\0' || *end != '\0') {
		fprintf(stderr, "gcr-poolprog: not a number: '%s'\n", s);
		exit(1);
	}
	return v;
}

static void pool_options(int argc, char **argv)
{
	const char *a = "";

	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		a = argv[i];
		if (strcmp(a, "--wait") == 0 || strcmp(a, "--hold") == 0) {
			*(a[2] == 'w' ? &opt.wait : &opt.hold) = true;
			continue;
		}
		if (strcmp(a, "--help") == 0) {
			pool_usage(stdout);
			exit(0);
		}
		if (v == NULL)
			goto bad;
		if (strcmp(a, "--module") == 0)
			opt.module = v;
		else if (strcmp(a, "--mib") == 0)
			opt.mib = pool_num(v);
		else if (strcmp(a, "--threads") == 0)
			opt.threads = pool_num(v);
		else if (strcmp(a, "--steps") == 0)
			opt.steps = pool_num(v);
		else if (strcmp(a, "--pace-us") == 0)
			opt.pace_us = pool_num(v);
		else
			goto bad;
		i++;
	}
	if (opt.module == NULL || opt.threads < 1 || opt.threads > POOL_MAX_THREADS || opt.steps < 1 ||
	    opt.mib < 1)
		goto usage;
	return;
bad:
	fprintf(stderr, "gcr-poolprog: bad option '%s'\n", a);
usage:
	pool_usage(stderr);
	exit(1);
}

static unsigned int pool_grid(uint64_t n)
{
	uint64_t g = (n + POOL_BLOCK - 1) / POOL_BLOCK;

	return g > POOL_MAX_GRID ? POOL_MAX_GRID : g == 0 ? 1 : (unsigned int)g;
}

static void pool_fill(CUdeviceptr p, uint64_t words, uint32_t seed, CUstream s)
{
	void *args[] = {&p, &words, &seed};

	CU(cuLaunchKernel(k_fill, pool_grid(words), 1, 1, POOL_BLOCK, 1, 1, 0, s, args, NULL));
}

static void pool_step(CUdeviceptr p, uint64_t words, uint32_t k, CUstream s)
{
	void *args[] = {&p, &words, &k};

	CU(cuLaunchKernel(k_step, pool_grid(words), 1, 1, POOL_BLOCK, 1, 1, 0, s, args, NULL));
}

/* Adds to *counter the words of p that differ from gcr_expected(seed, i, kfirst, nsteps). */
static void pool_check(CUdeviceptr p, uint64_t words, uint32_t seed, uint32_t kfirst, uint32_t nsteps,
		       CUdeviceptr counter, CUstream s)
{
	void *args[] = {&p, &words, &seed, &kfirst, &nsteps, &counter};

	CU(cuLaunchKernel(k_check, pool_grid(words), 1, 1, POOL_BLOCK, 1, 1, 0, s, args, NULL));
}

static uint32_t pool_tmp_seed(int t, unsigned long k)
{
	return 0x51ed0000u ^ ((uint32_t)t << 20) ^ (uint32_t)k;
}

/* The captured graph: allocate inside the capture, fill, step, keep a sample, free inside. */
static void pool_capture(struct pool_thread *t)
{
	CUdeviceptr g;
	uint64_t words = POOL_GRAPH_BYTES / 4;

	CU(cuStreamBeginCapture(t->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
	CU(cuMemAllocAsync(&g, POOL_GRAPH_BYTES, t->s));
	pool_fill(g, words, 0x6a000000u + (uint32_t)t->index, t->s);
	pool_step(g, words, POOL_GRAPH_STEP, t->s);
	CU(cuMemcpyDtoDAsync(t->gres, g, POOL_SINK_WORDS * 4, t->s));
	CU(cuMemFreeAsync(g, t->s));
	CU(cuStreamEndCapture(t->s, &t->cap_graph));
	CU(cuGraphInstantiateWithFlags(&t->cap_exec, t->cap_graph, 0));
}

static CUgraphNode pool_kernel_node(CUgraph g, CUgraphNode dep, CUfunction f, uint64_t words, void **args)
{
	CUDA_KERNEL_NODE_PARAMS kp;
	CUgraphNode n;

	memset(&kp, 0, sizeof(kp));
	kp.func = f;
	kp.gridDimX = pool_grid(words);
	kp.gridDimY = kp.gridDimZ = 1;
	kp.blockDimX = POOL_BLOCK;
	kp.blockDimY = kp.blockDimZ = 1;
	kp.kernelParams = args;
	CU(cuGraphAddKernelNode(&n, g, &dep, 1, &kp));
	return n;
}

/* The explicit graph: a memory allocation node, fill, step and check kernels on it, a free node.
 * The check counts into counters[0], which must stay 0. */
static void pool_node_graph(struct pool_thread *t, CUdevice dev)
{
	static uint64_t words = POOL_GRAPH_BYTES / 4;
	static uint32_t kstep = POOL_GRAPH_STEP, kfirst = POOL_GRAPH_STEP, nsteps = 1;
	static CUdeviceptr counter;
	static uint32_t seeds[POOL_MAX_THREADS];
	static CUdeviceptr ptrs[POOL_MAX_THREADS];
	CUDA_MEM_ALLOC_NODE_PARAMS ap;
	CUgraphNode alloc, fill, step, check, freed;

	counter = counters;
	seeds[t->index] = 0x7b000000u + (uint32_t)t->index;
	CU(cuGraphCreate(&t->node_graph, 0));
	memset(&ap, 0, sizeof(ap));
	ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ap.poolProps.location.id = dev;
	ap.bytesize = POOL_GRAPH_BYTES;
	CU(cuGraphAddMemAllocNode(&alloc, t->node_graph, NULL, 0, &ap));
	ptrs[t->index] = ap.dptr;
	{
		void *fa[] = {&ptrs[t->index], &words, &seeds[t->index]};
		void *sa[] = {&ptrs[t->index], &words, &kstep};
		void *ca[] = {&ptrs[t->index], &words, &seeds[t->index], &kfirst, &nsteps, &counter};

		/* The parameters are copied when each node is added. */
		fill = pool_kernel_node(t->node_graph, alloc, k_fill, words, fa);
		step = pool_kernel_node(t->node_graph, fill, k_step, words, sa);
		check = pool_kernel_node(t->node_graph, step, k_check, words, ca);
	}
	CU(cuGraphAddMemFreeNode(&freed, t->node_graph, &check, 1, ap.dptr));
	CU(cuGraphInstantiateWithFlags(&t->node_exec, t->node_graph, 0));
}

static void pool_setup_thread(struct pool_thread *t, CUdevice dev, size_t each)
{
	CU(cuStreamCreate(&t->s, CU_STREAM_NON_BLOCKING));
	CU(cuStreamCreate(&t->s2, CU_STREAM_NON_BLOCKING));
	CU(cuEventCreate(&t->ev, CU_EVENT_DISABLE_TIMING));
	t->lived_words = each / 4;
	for (int j = 0; j < POOL_LONG_PER_THREAD; j++) {
		if (j % 2 == 0)
			CU(cuMemAllocFromPoolAsync(&t->lived[j], each, pool, t->s));
		else
			CU(cuMemAllocAsync(&t->lived[j], each, t->s));
		t->lived_seed[j] = 0x9e370000u + (uint32_t)(t->index * POOL_LONG_PER_THREAD + j) * 7919u;
		pool_fill(t->lived[j], t->lived_words, t->lived_seed[j], t->s);
		total_bytes += each;
	}
	CU(cuMemAllocFromPoolAsync(&t->sink, opt.steps * POOL_SINK_WORDS * 4, pool, t->s));
	CU(cuMemAllocAsync(&t->gres, POOL_SINK_WORDS * 4, t->s));
	CU(cuMemsetD32Async(t->sink, 0, opt.steps * POOL_SINK_WORDS, t->s));
	CU(cuMemsetD32Async(t->gres, 0, POOL_SINK_WORDS, t->s));
	total_bytes += opt.steps * POOL_SINK_WORDS * 4 + POOL_SINK_WORDS * 4;
	CU(cuStreamSynchronize(t->s));
	pool_capture(t);
	pool_node_graph(t, dev);
}

/* One step: the long-lived data steps on s; a temporary from the explicit pool is filled on s
 * and copied to the sink and freed on s2 (a cross-stream free, still pending when the next
 * step allocates on s); a small one from the default pool is used and freed on s (same-stream
 * reuse); both graphs replay. Only s is synchronised per step. */
static void pool_one_step(struct pool_thread *t, unsigned long k)
{
	size_t tmp_bytes = ((size_t)1 + k % 5) * (256u << 10);
	CUdeviceptr tmp, small;

	if (hold_fn != NULL && k % POOL_HOLD_STEPS == 0) {
		CU(hold_fn(t->s2, 0));
		CU(hold_fn(t->s2, 1));
	}
	for (int j = 0; j < POOL_LONG_PER_THREAD; j++)
		pool_step(t->lived[j], t->lived_words, (uint32_t)k, t->s);
	CU(cuMemAllocFromPoolAsync(&tmp, tmp_bytes, pool, t->s));
	pool_fill(tmp, tmp_bytes / 4, pool_tmp_seed(t->index, k), t->s);
	CU(cuEventRecord(t->ev, t->s));
	CU(cuStreamWaitEvent(t->s2, t->ev, 0));
	CU(cuMemcpyDtoDAsync(t->sink + (CUdeviceptr)k * POOL_SINK_WORDS * 4, tmp, POOL_SINK_WORDS * 4, t->s2));
	CU(cuMemFreeAsync(tmp, t->s2));
	CU(cuMemAllocAsync(&small, 64u << 10, t->s));
	CU(cuMemsetD32Async(small, (uint32_t)k, (64u << 10) / 4, t->s));
	CU(cuMemFreeAsync(small, t->s));
	CU(cuGraphLaunch(t->cap_exec, t->s));
	CU(cuGraphLaunch(t->node_exec, t->s));
	if (t->index == 0 && k % POOL_TRIM_EVERY == POOL_TRIM_EVERY - 1)
		CU(cuMemPoolTrimTo(pool, 0));
	CU(cuStreamSynchronize(t->s));
}

static void *pool_thread_main(void *arg)
{
	struct pool_thread *t = arg;

	CU(cuCtxSetCurrent(ctx));
	for (unsigned long k = 0; k < opt.steps; k++) {
		pool_one_step(t, k);
		if (t->index == 0) {
			printf("STEP %lu\n", k + 1);
			fflush(stdout);
		}
		if (opt.pace_us > 0) {
			struct timespec ts = {(time_t)(opt.pace_us / 1000000), (long)(opt.pace_us % 1000000) * 1000};

			nanosleep(&ts, NULL);
		}
	}
	if (hold_fn != NULL)
		CU(hold_fn(t->s2, 0));
	CU(cuStreamSynchronize(t->s2));
	return NULL;
}

static void pool_wait_for(const char *word)
{
	char line[256];

	while (fgets(line, sizeof(line), stdin) != NULL) {
		line[strcspn(line, "\r\n")] = '\0';
		if (strcmp(line, word) == 0)
			return;
	}
	pool_fail("stdin closed before '%s'", word);
}

/* Four 64-bit FNV-1a lanes over the bytes: a 256-bit value for the DIGEST line. */
struct pool_digest {
	uint64_t h[4];
};

static void pool_digest_add(struct pool_digest *d, const void *buf, size_t n)
{
	const unsigned char *p = buf;

	for (size_t i = 0; i < n; i++) {
		uint64_t *h = &d->h[i & 3];

		*h = (*h ^ p[i]) * 0x100000001b3ull;
	}
}

static void pool_digest_dev(struct pool_digest *d, CUdeviceptr p, size_t bytes)
{
	static uint32_t host[1 << 18];

	for (size_t off = 0; off < bytes; off += sizeof(host)) {
		size_t n = bytes - off < sizeof(host) ? bytes - off : sizeof(host);

		CU(cuMemcpyDtoH(host, p + off, n));
		pool_digest_add(d, host, n);
	}
}

/* Exact checks of everything, then the digest. */
static void pool_verify(void)
{
	unsigned long long bad[2];
	struct pool_digest d = {{0xcbf29ce484222325ull, 0x84222325cbf29ce4ull, 0x100000001b3ull, 0x1ull}};

	CU(cuCtxSynchronize());
	for (unsigned long i = 0; i < opt.threads; i++) {
		struct pool_thread *t = &threads[i];

		for (int j = 0; j < POOL_LONG_PER_THREAD; j++)
			pool_check(t->lived[j], t->lived_words, t->lived_seed[j], 0, (uint32_t)opt.steps,
				   counters + 8, NULL);
		for (unsigned long k = 0; k < opt.steps; k++)
			pool_check(t->sink + (CUdeviceptr)k * POOL_SINK_WORDS * 4, POOL_SINK_WORDS,
				   pool_tmp_seed(t->index, k), 0, 0, counters + 8, NULL);
		pool_check(t->gres, POOL_SINK_WORDS, 0x6a000000u + (uint32_t)t->index, POOL_GRAPH_STEP, 1,
			   counters + 8, NULL);
	}
	CU(cuCtxSynchronize());
	CU(cuMemcpyDtoH(bad, counters, sizeof(bad)));
	if (bad[0] != 0)
		pool_fail("the explicit graph's allocation held %llu wrong words over the steps", bad[0]);
	if (bad[1] != 0)
		pool_fail("%llu words differ from what the steps must leave (long-lived buffers, the sink of "
			  "each step's temporary, the captured graph's output)", bad[1]);
	for (unsigned long i = 0; i < opt.threads; i++) {
		struct pool_thread *t = &threads[i];

		for (int j = 0; j < POOL_LONG_PER_THREAD; j++)
			pool_digest_dev(&d, t->lived[j], t->lived_words * 4);
		pool_digest_dev(&d, t->sink, opt.steps * POOL_SINK_WORDS * 4);
		pool_digest_dev(&d, t->gres, POOL_SINK_WORDS * 4);
	}
	printf("DIGEST %016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "\n", d.h[0], d.h[1], d.h[2],
	       d.h[3]);
}

static void pool_teardown(void)
{
	for (unsigned long i = 0; i < opt.threads; i++) {
		struct pool_thread *t = &threads[i];

		CU(cuGraphExecDestroy(t->cap_exec));
		CU(cuGraphExecDestroy(t->node_exec));
		CU(cuGraphDestroy(t->cap_graph));
		CU(cuGraphDestroy(t->node_graph));
		for (int j = 0; j < POOL_LONG_PER_THREAD; j++)
			CU(cuMemFreeAsync(t->lived[j], t->s));
		CU(cuMemFreeAsync(t->sink, t->s));
		CU(cuMemFreeAsync(t->gres, t->s));
		CU(cuStreamSynchronize(t->s));
		CU(cuEventDestroy(t->ev));
		CU(cuStreamDestroy(t->s));
		CU(cuStreamDestroy(t->s2));
	}
	CU(cuMemFree(counters));
	CU(cuMemPoolDestroy(pool));
}

int main(int argc, char **argv)
{
	CUmemPoolProps props;
	CUdevice dev;
	CUmodule module;
	cuuint64_t threshold = 64u << 20;
	int on = 1;
	size_t each;

	setvbuf(stdout, NULL, _IOLBF, 0);
	pool_options(argc, argv);
	CU(cuInit(0));
	CU(cuDeviceGet(&dev, 0));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	if (opt.hold) {
		void *p = dlsym(RTLD_DEFAULT, "fake_stream_hold");

		if (p == NULL) {
			printf("ERROR --hold needs the stand-in driver (no fake_stream_hold)\n");
			return 2;
		}
		memcpy(&hold_fn, &p, sizeof(p));
	}
	CU(cuModuleLoad(&module, opt.module));
	CU(cuModuleGetFunction(&k_fill, module, "gcr_fill"));
	CU(cuModuleGetFunction(&k_step, module, "gcr_step"));
	CU(cuModuleGetFunction(&k_check, module, "gcr_check"));

	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = dev;
	CU(cuMemPoolCreate(&pool, &props));
	CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on));
	CU(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES, &on));
	CU(cuDeviceGetDefaultMemPool(&def_pool, dev));
	threshold = UINT64_MAX; /* as PyTorch's cudaMallocAsync backend sets it */
	CU(cuMemPoolSetAttribute(def_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold));
	CU(cuMemAlloc(&counters, 64));
	CU(cuMemsetD32(counters, 0, 16));

	each = ((size_t)opt.mib << 20) / (opt.threads * POOL_LONG_PER_THREAD) / 4 * 4;
	if (each == 0)
		each = 4;
	for (unsigned long i = 0; i < opt.threads; i++) {
		threads[i].index = (int)i;
		pool_setup_thread(&threads[i], dev, each);
	}
	CU(cuCtxSynchronize());
	printf("READY pid=%d bytes=%llu\n", (int)getpid(), total_bytes);
	if (opt.wait)
		pool_wait_for("go");
	for (unsigned long i = 0; i < opt.threads; i++)
		if (pthread_create(&threads[i].tid, NULL, pool_thread_main, &threads[i]) != 0)
			pool_fail("pthread_create");
	for (unsigned long i = 0; i < opt.threads; i++)
		pthread_join(threads[i].tid, NULL);
	printf("DONE\n");
	if (opt.wait)
		pool_wait_for("check");
	pool_verify();
	pool_teardown();
	CU(cuModuleUnload(module));
	CU(cuDevicePrimaryCtxRelease(dev));
	printf("RESULT ok\n");
	return 0;
}
