// tests/gpu/rt_test.cu: a CUDA runtime-API workload (cudaMalloc, pitch, async pool, streams per
// thread, memcpy/memset round trips, a graph, indirect writes) that checks its own results on the GPU.
//
// Protocol on stdout (the same as tests/progs/gcr-testprog): "READY pid=<pid> bytes=<n>";
// with --wait it waits for a stdin line "go"; "ITER <n>" while running; "DONE"; with --wait it
// waits for "check"; then "RESULT ok" (exit 0), "RESULT FAIL ..." (exit 1) or "ERROR ..." (exit 2).
// With --hold-after it then waits for "exit".
//
// Every update is affine on uint32 (x -> a*x + c, wrapping), so the host composes the maps
// each element went through and the check kernel compares against A*init(i) + C exactly.
// Round trips (memcpy out, memset, memcpy back) are identities that must not lose data.
#include <cuda_runtime.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

static pthread_mutex_t g_print_lock = PTHREAD_MUTEX_INITIALIZER;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&g_print_lock);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
	fflush(stdout);
	pthread_mutex_unlock(&g_print_lock);
}

// Any CUDA error ends the program with exit status 2 and the failing call on stdout.
#define CK(call)                                                                                   \
	do {                                                                                       \
		cudaError_t e_ = (call);                                                           \
		if (e_ != cudaSuccess) {                                                           \
			say("ERROR %s:%d %s: %s (%s)", __FILE__, __LINE__, #call, cudaGetErrorName(e_), \
			    cudaGetErrorString(e_));                                               \
			exit(2);                                                                   \
		}                                                                                  \
	} while (0)

// ---- device side ---------------------------------------------------------------------------

__host__ __device__ static inline uint32_t init_value(uint64_t i, uint32_t rid)
{
	// A cheap integer hash so every element of every region starts different.
	uint32_t x = (uint32_t)i ^ (uint32_t)(i >> 32) * 0x85ebca6bu ^ (rid * 0x9E3779B9u);
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

__global__ void k_init(uint32_t *p, size_t n, uint32_t rid)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = init_value(i, rid);
}

// Element index i of a pitched 2-D region is row * width + col (padding is never touched).
__global__ void k_init2d(char *base, size_t pitch, size_t width, size_t rows, uint32_t rid)
{
	size_t n = width * rows;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		size_t r = i / width, c = i % width;
		((uint32_t *)(base + r * pitch))[c] = init_value(i, rid);
	}
}

__global__ void k_affine(uint32_t *p, size_t n, uint32_t a, uint32_t c)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = p[i] * a + c;
}

// Rows row0, row0 + step, ... of a pitched region.
__global__ void k_affine2d(char *base, size_t pitch, size_t width, size_t rows, size_t row0, size_t step,
			   uint32_t a, uint32_t c)
{
	size_t nrows = row0 < rows ? (rows - row0 + step - 1) / step : 0;
	size_t n = nrows * width;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		size_t r = row0 + (i / width) * step, c2 = i % width;
		uint32_t *row = (uint32_t *)(base + r * pitch);
		row[c2] = row[c2] * a + c;
	}
}

// Writes through pointers that live in device memory: table[j] is a device pointer.
__global__ void k_indirect(uint32_t *const *table, const size_t *sizes, int nptr)
{
	for (int j = 0; j < nptr; j++) {
		uint32_t *p = table[j];
		size_t n = sizes[j];
		for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
		     i += (size_t)gridDim.x * blockDim.x)
			p[i] = p[i] * 3u + (uint32_t)(j + 1);
	}
}

__global__ void k_check(const uint32_t *p, size_t n, uint32_t rid, uint32_t A, uint32_t C,
			unsigned long long *bad, unsigned long long *first_bad)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		if (p[i] != A * init_value(i, rid) + C) {
			atomicAdd(bad, 1ull);
			atomicMin(first_bad, (unsigned long long)i);
		}
	}
}

__global__ void k_check2d(const char *base, size_t pitch, size_t width, size_t rows, uint32_t rid, uint32_t A,
			  uint32_t C, unsigned long long *bad, unsigned long long *first_bad)
{
	size_t n = width * rows;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		size_t r = i / width, c = i % width;
		if (((const uint32_t *)(base + r * pitch))[c] != A * init_value(i, rid) + C) {
			atomicAdd(bad, 1ull);
			atomicMin(first_bad, (unsigned long long)i);
		}
	}
}

__global__ void k_check_const(const uint32_t *p, size_t n, uint32_t v, unsigned long long *bad,
			      unsigned long long *first_bad)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
		if (p[i] != v) {
			atomicAdd(bad, 1ull);
			atomicMin(first_bad, (unsigned long long)i);
		}
	}
}

static const int kBlocks = 1024, kThreads = 256; // grid-stride loops cover any size

// ---- host side: affine maps ----------------------------------------------------------------

struct Affine {
	uint32_t a = 1, c = 0; // x -> a*x + c
	void then(uint32_t a2, uint32_t c2)
	{
		a = a2 * a;
		c = a2 * c + c2;
	}
};

static const uint32_t LCG_A = 1664525u, LCG_C = 1013904223u; // per iteration k: x*A + C + k
static const uint32_t GRAPH_A = 5u, GRAPH_C = 12345u;
static const uint32_t AUX_MEMSET = 0x01010101u, AUX_ADD = 7u;

// ---- the workload --------------------------------------------------------------------------

struct Options {
	size_t mib = 256;
	int threads = 4;
	int iters = 200;
	long pace_us = 0;
	bool wait = false;
	bool hold_after = false;
};

enum { RID_BIG0 = 1, RID_BIG1, RID_ASYNC, RID_PITCH, RID_GRAPH, RID_SMALL0 };
static const int NSMALL = 4;
static const size_t SMALL_BYTES[NSMALL] = {4096, 16384, 65536, 1 << 20};

struct World {
	Options opt;
	uint32_t *big[2] = {nullptr, nullptr};
	size_t big_n = 0; // elements in each big buffer
	uint32_t *abuf = nullptr; // cudaMallocAsync, kept for the whole run
	size_t abuf_n = 0;
	char *pitched = nullptr;
	size_t pitch = 0, pwidth = 1000, prows = 512; // width in elements
	uint32_t *small[NSMALL] = {};
	uint32_t **d_table = nullptr; // device array of the small buffers' device pointers
	size_t *d_sizes = nullptr;
	uint32_t *gbuf = nullptr, *gaux = nullptr; // written only by the graph
	size_t gbuf_n = 1 << 20, gaux_n = 4096;
	cudaGraphExec_t graph = nullptr;
	cudaStream_t main_stream = nullptr;
	size_t bytes = 0;
};

struct Worker {
	World *w;
	int id;
	cudaStream_t s;
	uint32_t *host_pinned; // 64 KiB
	std::vector<uint32_t> host_pageable;
	pthread_t th;
};

static const size_t PINNED_BYTES = 64 << 10, PAGEABLE_BYTES = 4 << 10, TMP_BYTES = 256 << 10;

// Slice [lo, hi) of n elements owned by worker id out of T.
static void slice(size_t n, int id, int T, size_t *lo, size_t *hi)
{
	*lo = n * id / T;
	*hi = n * (id + 1) / T;
}

// memcpy the first bytes of p out (to tmp), memset p, copy back: an identity on the data.
static void round_trip_device(Worker *wk, uint32_t *p, size_t bytes)
{
	void *tmp = nullptr;
	CK(cudaMallocAsync(&tmp, TMP_BYTES, wk->s));
	if (bytes > TMP_BYTES)
		bytes = TMP_BYTES;
	CK(cudaMemcpyAsync(tmp, p, bytes, cudaMemcpyDeviceToDevice, wk->s));
	CK(cudaMemsetAsync(p, 0xAB, bytes, wk->s));
	CK(cudaMemcpyAsync(p, tmp, bytes, cudaMemcpyDeviceToDevice, wk->s));
	CK(cudaFreeAsync(tmp, wk->s));
}

static void round_trip_host(Worker *wk, uint32_t *p, size_t bytes)
{
	if (bytes > PINNED_BYTES)
		bytes = PINNED_BYTES;
	CK(cudaMemcpyAsync(wk->host_pinned, p, bytes, cudaMemcpyDeviceToHost, wk->s));
	CK(cudaMemsetAsync(p, 0xFF, bytes, wk->s));
	CK(cudaMemcpyAsync(p, wk->host_pinned, bytes, cudaMemcpyHostToDevice, wk->s));
}

static void round_trip_pageable(Worker *wk, uint32_t *p, size_t bytes)
{
	if (bytes > PAGEABLE_BYTES)
		bytes = PAGEABLE_BYTES;
	CK(cudaStreamSynchronize(wk->s));
	CK(cudaMemcpy(wk->host_pageable.data(), p, bytes, cudaMemcpyDeviceToHost));
	CK(cudaMemset(p, 0x5A, bytes));
	CK(cudaMemcpy(p, wk->host_pageable.data(), bytes, cudaMemcpyHostToDevice));
	// A pageable H2D copy may return before its DMA lands, and wk->s does not order against
	// the legacy stream the copy ran on: wait for it before later kernels touch p.
	CK(cudaStreamSynchronize(cudaStreamLegacy));
}

static void *worker_main(void *arg)
{
	Worker *wk = (Worker *)arg;
	World *w = wk->w;
	const int T = w->opt.threads;
	size_t lo, hi, alo, ahi;
	slice(w->big_n, wk->id, T, &lo, &hi);
	slice(w->abuf_n, wk->id, T, &alo, &ahi);
	CK(cudaSetDevice(0));
	for (int k = 0; k < w->opt.iters; k++) {
		uint32_t c = LCG_C + (uint32_t)k;
		for (int b = 0; b < 2; b++) {
			if (hi > lo)
				k_affine<<<kBlocks, kThreads, 0, wk->s>>>(w->big[b] + lo, hi - lo, LCG_A, c);
		}
		if (ahi > alo)
			k_affine<<<kBlocks, kThreads, 0, wk->s>>>(w->abuf + alo, ahi - alo, LCG_A, c);
		k_affine2d<<<kBlocks, kThreads, 0, wk->s>>>(w->pitched, w->pitch, w->pwidth, w->prows,
							    (size_t)wk->id, (size_t)T, LCG_A, c);
		CK(cudaGetLastError());
		if (hi > lo) {
			uint32_t *p = w->big[k & 1] + lo;
			size_t bytes = (hi - lo) * sizeof(uint32_t);
			if (k % 4 == 1)
				round_trip_device(wk, p, bytes);
			if (k % 4 == 3)
				round_trip_host(wk, p, bytes);
			if (k % 16 == 5)
				round_trip_pageable(wk, p, bytes);
		}
		if (wk->id == 0) {
			k_indirect<<<kBlocks, kThreads, 0, wk->s>>>(w->d_table, w->d_sizes, NSMALL);
			CK(cudaGetLastError());
			CK(cudaGraphLaunch(w->graph, wk->s));
		}
		CK(cudaStreamSynchronize(wk->s));
		if (wk->id == 0)
			say("ITER %d", k);
		if (w->opt.pace_us > 0)
			usleep((useconds_t)w->opt.pace_us);
	}
	return nullptr;
}

static void build_graph(World *w)
{
	cudaStream_t s;
	cudaGraph_t g;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
	k_affine<<<kBlocks, kThreads, 0, s>>>(w->gbuf, w->gbuf_n, GRAPH_A, GRAPH_C);
	CK(cudaMemsetAsync(w->gaux, 0x01, w->gaux_n * sizeof(uint32_t), s));
	k_affine<<<64, kThreads, 0, s>>>(w->gaux, w->gaux_n, 1u, AUX_ADD);
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiate(&w->graph, g, 0));
	CK(cudaGraphDestroy(g));
	CK(cudaStreamDestroy(s));
}

static void setup(World *w)
{
	const Options &o = w->opt;
	CK(cudaSetDevice(0));
	CK(cudaStreamCreateWithFlags(&w->main_stream, cudaStreamNonBlocking));
	size_t big_bytes = o.mib * (1u << 20) / 2;
	w->big_n = big_bytes / sizeof(uint32_t);
	for (int b = 0; b < 2; b++) {
		CK(cudaMalloc(&w->big[b], big_bytes));
		w->bytes += big_bytes;
	}
	w->abuf_n = (16u << 20) / sizeof(uint32_t);
	CK(cudaMallocAsync((void **)&w->abuf, w->abuf_n * sizeof(uint32_t), w->main_stream));
	w->bytes += w->abuf_n * sizeof(uint32_t);
	CK(cudaMallocPitch((void **)&w->pitched, &w->pitch, w->pwidth * sizeof(uint32_t), w->prows));
	w->bytes += w->pitch * w->prows;
	for (int j = 0; j < NSMALL; j++) {
		CK(cudaMalloc(&w->small[j], SMALL_BYTES[j]));
		w->bytes += SMALL_BYTES[j];
	}
	CK(cudaMalloc(&w->d_table, sizeof(uint32_t *) * NSMALL));
	CK(cudaMalloc(&w->d_sizes, sizeof(size_t) * NSMALL));
	size_t sizes[NSMALL];
	for (int j = 0; j < NSMALL; j++)
		sizes[j] = SMALL_BYTES[j] / sizeof(uint32_t);
	CK(cudaMemcpy(w->d_table, w->small, sizeof(uint32_t *) * NSMALL, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(w->d_sizes, sizes, sizeof(sizes), cudaMemcpyHostToDevice));
	CK(cudaMalloc(&w->gbuf, w->gbuf_n * sizeof(uint32_t)));
	CK(cudaMalloc(&w->gaux, w->gaux_n * sizeof(uint32_t)));
	w->bytes += (w->gbuf_n + w->gaux_n) * sizeof(uint32_t);

	cudaStream_t s = w->main_stream;
	for (int b = 0; b < 2; b++)
		k_init<<<kBlocks, kThreads, 0, s>>>(w->big[b], w->big_n, RID_BIG0 + b);
	k_init<<<kBlocks, kThreads, 0, s>>>(w->abuf, w->abuf_n, RID_ASYNC);
	k_init2d<<<kBlocks, kThreads, 0, s>>>(w->pitched, w->pitch, w->pwidth, w->prows, RID_PITCH);
	k_init<<<kBlocks, kThreads, 0, s>>>(w->gbuf, w->gbuf_n, RID_GRAPH);
	CK(cudaMemsetAsync(w->gaux, 0, w->gaux_n * sizeof(uint32_t), s));
	for (int j = 0; j < NSMALL; j++)
		k_init<<<kBlocks, kThreads, 0, s>>>(w->small[j], sizes[j], RID_SMALL0 + j);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	build_graph(w);
}

struct Check {
	const char *name;
	unsigned long long bad, first;
};

// Compares every region with what the composed maps predict; returns the number of bad regions.
static int verify(World *w, std::string *report)
{
	const Options &o = w->opt;
	Affine lcg, graph, ind[NSMALL];
	for (int k = 0; k < o.iters; k++) {
		lcg.then(LCG_A, LCG_C + (uint32_t)k);
		graph.then(GRAPH_A, GRAPH_C);
		for (int j = 0; j < NSMALL; j++)
			ind[j].then(3u, (uint32_t)(j + 1));
	}
	const int NCHK = 5 + NSMALL + 1;
	unsigned long long *d_cnt; // [bad, first_bad] per check
	CK(cudaMalloc(&d_cnt, sizeof(unsigned long long) * 2 * NCHK));
	std::vector<unsigned long long> h(2 * NCHK);
	for (int i = 0; i < NCHK; i++) {
		h[2 * i] = 0;
		h[2 * i + 1] = ~0ull;
	}
	CK(cudaMemcpy(d_cnt, h.data(), sizeof(unsigned long long) * 2 * NCHK, cudaMemcpyHostToDevice));
	const char *names[NCHK];
	int c = 0;
	cudaStream_t s = w->main_stream;
	for (int b = 0; b < 2; b++, c++) {
		names[c] = b ? "cudaMalloc big1" : "cudaMalloc big0";
		k_check<<<kBlocks, kThreads, 0, s>>>(w->big[b], w->big_n, RID_BIG0 + b, lcg.a, lcg.c, d_cnt + 2 * c,
						     d_cnt + 2 * c + 1);
	}
	names[c] = "cudaMallocAsync buffer";
	k_check<<<kBlocks, kThreads, 0, s>>>(w->abuf, w->abuf_n, RID_ASYNC, lcg.a, lcg.c, d_cnt + 2 * c, d_cnt + 2 * c + 1);
	c++;
	names[c] = "cudaMallocPitch buffer";
	k_check2d<<<kBlocks, kThreads, 0, s>>>(w->pitched, w->pitch, w->pwidth, w->prows, RID_PITCH, lcg.a, lcg.c,
					       d_cnt + 2 * c, d_cnt + 2 * c + 1);
	c++;
	names[c] = "graph buffer";
	k_check<<<kBlocks, kThreads, 0, s>>>(w->gbuf, w->gbuf_n, RID_GRAPH, graph.a, graph.c, d_cnt + 2 * c,
					     d_cnt + 2 * c + 1);
	c++;
	static const char *small_names[NSMALL] = {"indirect small0", "indirect small1", "indirect small2",
						  "indirect small3"};
	for (int j = 0; j < NSMALL; j++, c++) {
		names[c] = small_names[j];
		k_check<<<kBlocks, kThreads, 0, s>>>(w->small[j], SMALL_BYTES[j] / sizeof(uint32_t), RID_SMALL0 + j,
						     ind[j].a, ind[j].c, d_cnt + 2 * c, d_cnt + 2 * c + 1);
	}
	names[c] = "graph memset+add aux";
	// With zero iterations the graph never ran and aux still holds its initial zeros.
	k_check_const<<<64, kThreads, 0, s>>>(w->gaux, w->gaux_n, o.iters > 0 ? AUX_MEMSET + AUX_ADD : 0u,
					      d_cnt + 2 * c, d_cnt + 2 * c + 1);
	c++;
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(h.data(), d_cnt, sizeof(unsigned long long) * 2 * NCHK, cudaMemcpyDeviceToHost));
	CK(cudaFree(d_cnt));
	int bad_regions = 0;
	char buf[256];
	for (int i = 0; i < c; i++) {
		if (h[2 * i] == 0)
			continue;
		bad_regions++;
		snprintf(buf, sizeof(buf), " [%s: %llu mismatches, first at element %llu]", names[i], h[2 * i],
			 h[2 * i + 1]);
		*report += buf;
	}
	return bad_regions;
}

// Reads stdin until a line equal to word; false on EOF.
static bool wait_for_line(const char *word)
{
	char line[256];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\r\n")] = 0;
		if (strcmp(line, word) == 0)
			return true;
	}
	return false;
}

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s [--mib N] [--threads T] [--iters I] [--pace-us US] [--wait] [--hold-after]\n"
		"  --mib N      size of the two large cudaMalloc buffers together (MiB, default 256)\n"
		"  --pace-us US sleep after each iteration (microseconds) so a run lasts long enough\n",
		argv0);
}

int main(int argc, char **argv)
{
	World w;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		bool has_val = i + 1 < argc;
		if (a == "--mib" && has_val)
			w.opt.mib = strtoull(argv[++i], nullptr, 10);
		else if (a == "--threads" && has_val)
			w.opt.threads = atoi(argv[++i]);
		else if (a == "--iters" && has_val)
			w.opt.iters = atoi(argv[++i]);
		else if (a == "--pace-us" && has_val)
			w.opt.pace_us = atol(argv[++i]);
		else if (a == "--wait")
			w.opt.wait = true;
		else if (a == "--hold-after")
			w.opt.hold_after = true;
		else {
			usage(argv[0]);
			say("ERROR bad argument: %s", argv[i]);
			return 2;
		}
	}
	if (w.opt.threads < 1 || w.opt.threads > 64 || w.opt.iters < 0 || w.opt.mib < 1) {
		say("ERROR bad option values (threads 1..64, iters >= 0, mib >= 1)");
		return 2;
	}
	setup(&w);
	say("READY pid=%d bytes=%zu", (int)getpid(), w.bytes);
	if (w.opt.wait && !wait_for_line("go")) {
		say("ERROR stdin closed before go");
		return 2;
	}
	std::vector<Worker> workers(w.opt.threads);
	for (int t = 0; t < w.opt.threads; t++) {
		Worker &wk = workers[t];
		wk.w = &w;
		wk.id = t;
		CK(cudaStreamCreateWithFlags(&wk.s, cudaStreamNonBlocking));
		CK(cudaMallocHost(&wk.host_pinned, PINNED_BYTES));
		wk.host_pageable.resize(PAGEABLE_BYTES / sizeof(uint32_t));
	}
	for (int t = 0; t < w.opt.threads; t++) {
		if (pthread_create(&workers[t].th, nullptr, worker_main, &workers[t]) != 0) {
			say("ERROR pthread_create failed");
			return 2;
		}
	}
	for (int t = 0; t < w.opt.threads; t++)
		pthread_join(workers[t].th, nullptr);
	CK(cudaDeviceSynchronize());
	say("DONE");
	if (w.opt.wait && !wait_for_line("check")) {
		say("ERROR stdin closed before check");
		return 2;
	}
	std::string report;
	int bad = verify(&w, &report);
	if (bad)
		say("RESULT FAIL %d regions bad:%s", bad, report.c_str());
	else
		say("RESULT ok");
	if (w.opt.hold_after)
		wait_for_line("exit");
	for (int t = 0; t < w.opt.threads; t++) {
		CK(cudaFreeHost(workers[t].host_pinned));
		CK(cudaStreamDestroy(workers[t].s));
	}
	CK(cudaGraphExecDestroy(w.graph));
	CK(cudaFreeAsync(w.abuf, w.main_stream));
	CK(cudaStreamSynchronize(w.main_stream));
	return bad ? 1 : 0;
}
