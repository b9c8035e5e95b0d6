// bench/launch_bench.cu: a launch-bound microbenchmark for the shim's per-call overhead.
//
// Three variants, measured in short batches that alternate between variants so slow drift
// (clocks, other tenants) lands on all of them alike; each variant's figure is the median
// over its batches, which a stray interrupt or page fault cannot move:
//   submit         host time to submit SUBMIT_BATCH empty kernels (few enough that the
//                  queue never fills, so the figure is the CPU cost of one launch call,
//                  which is where an interposer's cost lives); the drain is not timed
//   kernel         BATCH empty kernels, first launch to stream idle
//   kernel+memcpy  BATCH x (empty kernel + 4-byte cudaMemcpyAsync), first launch to idle
//
// Prints "READY pid=<pid>", then per variant
//   "LAUNCH_STATS <variant> <batches> <median_ns_per_launch> <p10> <p90>"
// and finally "RESULT ok" (exit 0), or "ERROR ..." (exit 2).
//
// --turns: for two processes (with and without the shim) that take turns, so drift of the
// machine lands on both: after the warm-up it prints "BENCH_READY" and runs what stdin asks,
// "block R" -> R rounds of batches -> "BLOCK_NS <submit> <kernel> <kernel+memcpy>" (medians
// over the block), until "end"; LAUNCH_STATS then cover every batch of every block.
#include "bench_cuda.h"

#include <algorithm>
#include <chrono>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <vector>

__global__ void k_empty(void) {}

enum variant { V_SUBMIT, V_KERNEL, V_KERNEL_MEMCPY, V_COUNT };
static const char *const variant_name[V_COUNT] = { "submit", "kernel", "kernel+memcpy" };

typedef std::chrono::steady_clock clk;

static double secs(clk::time_point a, clk::time_point b)
{
	return std::chrono::duration<double>(b - a).count();
}

static long kernel_n = 1000, submit_n = 64; // launches per batch: --batch, --submit-batch

static long batch_size(enum variant v)
{
	return v == V_SUBMIT ? submit_n : kernel_n;
}

// One batch of variant v; returns nanoseconds per launch.
static double batch(enum variant v, cudaStream_t s, long n, int *d_word, int *h_word)
{
	auto t0 = clk::now();
	for (long i = 0; i < n; i++) {
		k_empty<<<1, 1, 0, s>>>();
		if (v == V_KERNEL_MEMCPY)
			CK(cudaMemcpyAsync(h_word, d_word, sizeof(int), cudaMemcpyDeviceToHost, s));
	}
	auto t1 = clk::now();
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	auto t2 = clk::now();
	return (v == V_SUBMIT ? secs(t0, t1) : secs(t0, t2)) * 1e9 / (double)n;
}

static double quantile(std::vector<double> v, double q)
{
	std::sort(v.begin(), v.end());
	size_t i = (size_t)(q * (double)(v.size() - 1) + 0.5);
	return v[std::min(i, v.size() - 1)];
}

// Pins the calling (launching) thread to the first CPU it may run on: a launch loop that
// migrates between cores measures the migrations. The driver's own threads keep the rest.
static int pin_self(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return -1;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (CPU_ISSET(c, &set)) {
			cpu_set_t one;
			CPU_ZERO(&one);
			CPU_SET(c, &one);
			return sched_setaffinity(0, sizeof(one), &one) == 0 ? c : -1;
		}
	}
	return -1;
}

// Round b: one batch of each variant, rotating which goes first so none always follows the
// same one; appends ns per launch to all[v] and, where given, to block[v].
static void round_of_batches(int b, cudaStream_t s, int *d_word, int *h_word, std::vector<double> *all,
			     std::vector<double> *block)
{
	for (int k = 0; k < V_COUNT; k++) {
		int v = (b + k) % V_COUNT;
		double ns = batch((enum variant)v, s, batch_size((enum variant)v), d_word, h_word);
		all[v].push_back(ns);
		if (block != NULL)
			block[v].push_back(ns);
	}
}

int main(int argc, char **argv)
{
	int batches = 300, pin = 0, turns = 0;
	double warmup_s = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--batch") && i + 1 < argc)
			kernel_n = atol(argv[++i]);
		else if (!strcmp(argv[i], "--submit-batch") && i + 1 < argc)
			submit_n = atol(argv[++i]);
		else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
			batches = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--warmup-s") && i + 1 < argc)
			warmup_s = atof(argv[++i]);
		else if (!strcmp(argv[i], "--pin"))
			pin = 1;
		else if (!strcmp(argv[i], "--turns"))
			turns = 1;
		else {
			printf("ERROR usage: %s [--batch N] [--submit-batch N] [--batches B] [--warmup-s S] [--pin] "
			       "[--turns]\n",
			       argv[0]);
			return 2;
		}
	}
	if (kernel_n < 1 || submit_n < 1 || batches < 1 || warmup_s < 0) {
		printf("ERROR --batch, --submit-batch and --batches must be positive, --warmup-s not negative\n");
		return 2;
	}
	cudaStream_t s;
	int *d_word, *h_word;
	CK(cudaSetDevice(0));
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaMalloc(&d_word, sizeof(int)));
	CK(cudaMallocHost(&h_word, sizeof(int)));
	CK(cudaMemset(d_word, 0, sizeof(int)));
	// Pinned after CUDA is up, so the driver's (and the shim's) threads, created during
	// initialisation, keep the whole CPU set.
	if (pin) {
		int cpu = pin_self();
		if (cpu < 0) {
			printf("ERROR --pin: cannot pin the launching thread\n");
			return 2;
		}
		printf("PINNED cpu=%d\n", cpu);
	}
	printf("READY pid=%d\n", (int)getpid());
	fflush(stdout);
	// Warm-up: module load, first-launch costs, and (--warmup-s) time for one-time start-up
	// work of the process (under the shim: its staging threads, its kernel JIT) to finish.
	auto w0 = clk::now();
	do
		for (int v = 0; v < V_COUNT; v++)
			batch((enum variant)v, s, batch_size((enum variant)v), d_word, h_word);
	while (secs(w0, clk::now()) < warmup_s);
	std::vector<double> ns[V_COUNT];
	int b = 0;
	if (!turns) {
		for (; b < batches; b++)
			round_of_batches(b, s, d_word, h_word, ns, NULL);
	} else {
		char line[64];
		printf("BENCH_READY\n");
		fflush(stdout);
		while (fgets(line, sizeof(line), stdin) != NULL && strncmp(line, "end", 3) != 0) {
			int rounds = 0;
			if (sscanf(line, "block %d", &rounds) != 1 || rounds < 1 || rounds > 100000) {
				printf("ERROR expected 'block R' (1..100000) or 'end', got: %s", line);
				return 2;
			}
			std::vector<double> blk[V_COUNT];
			for (int r = 0; r < rounds; r++, b++)
				round_of_batches(b, s, d_word, h_word, ns, blk);
			printf("BLOCK_NS %.2f %.2f %.2f\n", quantile(blk[V_SUBMIT], 0.5), quantile(blk[V_KERNEL], 0.5),
			       quantile(blk[V_KERNEL_MEMCPY], 0.5));
			fflush(stdout);
		}
		if (b == 0) {
			printf("ERROR --turns: no block was run\n");
			return 2;
		}
	}
	for (int v = 0; v < V_COUNT; v++)
		printf("LAUNCH_STATS %s %d %.2f %.2f %.2f\n", variant_name[v], b, quantile(ns[v], 0.5),
		       quantile(ns[v], 0.1), quantile(ns[v], 0.9));
	CK(cudaFreeHost(h_word));
	CK(cudaFree(d_word));
	CK(cudaStreamDestroy(s));
	printf("RESULT ok\n");
	fflush(stdout);
	return 0;
}
