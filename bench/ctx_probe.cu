// bench/ctx_probe.cu: a process that holds only a CUDA context, for measuring what the
// driver's checkpoint of the context alone costs (bench/ctx_probe.py drives it).
//
// With --stack BYTES it sets the per-thread stack limit first (the driver sizes the
// context's local memory from it: stack x resident threads of every SM), to see how much of
// the ~0.5 GiB context and of the checkpoint's ~0.3 s that reservation is.
// Prints "READY pid=<pid> stack=<limit> free_mib=<free device memory>", then on stdin
// "check" runs a kernel that uses local memory and prints "RESULT ok" (or "ERROR ...", exit 2).
#include "bench_cuda.h"

#include <chrono>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Indexes a local array with a runtime value so it lives in local memory.
__global__ void k_local(int *out, int k)
{
	int a[64];
	for (int i = 0; i < 64; i++)
		a[i] = i * k;
	out[threadIdx.x] = a[(threadIdx.x * 7 + k) & 63];
}

int main(int argc, char **argv)
{
	long stack = -1, shrink = -1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--stack") && i + 1 < argc)
			stack = atol(argv[++i]);
		else if (!strcmp(argv[i], "--shrink-after") && i + 1 < argc)
			shrink = atol(argv[++i]);
		else {
			printf("ERROR usage: %s [--stack BYTES] [--shrink-after BYTES]\n", argv[0]);
			return 2;
		}
	}
	int *d_out;
	CK(cudaSetDevice(0));
	CK(cudaMalloc(&d_out, 256 * sizeof(int)));
	if (stack >= 0)
		CK(cudaDeviceSetLimit(cudaLimitStackSize, (size_t)stack));
	k_local<<<1, 256>>>(d_out, 3);
	CK(cudaDeviceSynchronize());
	size_t lim = 0, free_b = 0, total_b = 0, orig = 0;
	CK(cudaDeviceGetLimit(&orig, cudaLimitStackSize));
	if (shrink >= 0) {
		// As the shim would before the driver's checkpoint: after kernels ran, lower the
		// limit, and (at "check") put it back, timing both.
		CK(cudaMemGetInfo(&free_b, &total_b));
		size_t before = free_b;
		auto t0 = std::chrono::steady_clock::now();
		CK(cudaDeviceSetLimit(cudaLimitStackSize, (size_t)shrink));
		auto t1 = std::chrono::steady_clock::now();
		CK(cudaMemGetInfo(&free_b, &total_b));
		printf("SHRINK ms=%.3f freed_mib=%lld\n", std::chrono::duration<double, std::milli>(t1 - t0).count(),
		       ((long long)free_b - (long long)before) >> 20);
	}
	CK(cudaDeviceGetLimit(&lim, cudaLimitStackSize));
	CK(cudaMemGetInfo(&free_b, &total_b));
	printf("READY pid=%d stack=%zu free_mib=%zu\n", (int)getpid(), lim, free_b >> 20);
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (strncmp(line, "check", 5) == 0) {
			int h[256];
			if (shrink >= 0) {
				auto t0 = std::chrono::steady_clock::now();
				CK(cudaDeviceSetLimit(cudaLimitStackSize, orig));
				auto t1 = std::chrono::steady_clock::now();
				printf("GROW ms=%.3f\n", std::chrono::duration<double, std::milli>(t1 - t0).count());
			}
			k_local<<<1, 256>>>(d_out, 5);
			CK(cudaMemcpy(h, d_out, sizeof(h), cudaMemcpyDeviceToHost));
			for (int t = 0; t < 256; t++)
				if (h[t] != ((t * 7 + 5) & 63) * 5) {
					printf("RESULT FAIL thread %d got %d\n", t, h[t]);
					return 1;
				}
			printf("RESULT ok\n");
			fflush(stdout);
			return 0;
		}
	}
	printf("ERROR stdin closed\n");
	return 2;
}
