/* gcr_kernels.cu: the test kernels gcr-testprog loads on a GPU (the stand-in driver has the
 * same ones built in): nvcc -fatbin -arch=sm_90 -o gcr_kernels.fatbin tests/progs/gcr_kernels.cu */
#include <stdint.h>

#include "gcr_kernels.h"

/* Grid-stride loops with 64-bit indices: any grid covers any n. */
#define GCR_FOR_EACH(i, n)                                                          \
	for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (uint64_t)blockDim.x * gridDim.x)

extern "C" __global__ void gcr_fill(uint32_t *buf, uint64_t n, uint32_t seed)
{
	GCR_FOR_EACH(i, n)
		buf[i] = gcr_pattern(seed, i);
}

extern "C" __global__ void gcr_step(uint32_t *buf, uint64_t n, uint32_t k)
{
	GCR_FOR_EACH(i, n)
		buf[i] = gcr_step_value(buf[i], k);
}

/* gcr_step through a per-thread array indexed at run time, which the compiler must place in
 * local memory: with gcr-testprog --stack every step needs the local memory the shim gives
 * back to the driver while suspended (GCR_CTX_SHRINK) and must find again after resume. */
extern "C" __global__ void gcr_step_local(uint32_t *buf, uint64_t n, uint32_t k)
{
	volatile uint32_t scratch[64];

	GCR_FOR_EACH(i, n) {
		uint32_t slot = (uint32_t)(i % 64);

		scratch[slot] = buf[i];
		buf[i] = gcr_step_value(scratch[slot], k);
	}
}

extern "C" __global__ void gcr_check(const uint32_t *buf, uint64_t n, uint32_t seed, uint32_t kfirst,
				     uint32_t nsteps, unsigned long long *mismatches)
{
	unsigned long long bad = 0;

	GCR_FOR_EACH(i, n)
		bad += buf[i] != gcr_expected(seed, i, kfirst, nsteps);
	if (bad != 0)
		atomicAdd(mismatches, bad);
}

extern "C" __global__ void gcr_check_const(const uint32_t *buf, uint64_t n, uint32_t value,
					   unsigned long long *mismatches)
{
	unsigned long long bad = 0;

	GCR_FOR_EACH(i, n)
		bad += buf[i] != value;
	if (bad != 0)
		atomicAdd(mismatches, bad);
}

/* table[0] entries of (pointer, words, k) follow: each range gets one step with its k. Where
 * the kernel writes is read from device memory, so a graph captured once writes wherever the
 * table, rewritten between replays, points. */
extern "C" __global__ void gcr_step_table(const uint64_t *table)
{
	for (uint64_t j = 0; j < table[0]; j++) {
		uint32_t *buf = (uint32_t *)(uintptr_t)table[1 + 3 * j];
		uint32_t k = (uint32_t)table[3 + 3 * j];

		GCR_FOR_EACH(i, table[2 + 3 * j])
			buf[i] = gcr_step_value(buf[i], k);
	}
}

/* ptrs is a device array of device pointers: the writes go through pointers the kernel reads
 * from device memory, which a checkpoint must keep valid (same addresses after restore). */
extern "C" __global__ void gcr_indirect(uint64_t *ptrs, uint32_t count, uint32_t value)
{
	if (blockIdx.x != 0 || threadIdx.x != 0)
		return;
	for (uint32_t j = 0; j < count; j++)
		*(uint32_t *)(uintptr_t)ptrs[j] += value;
}
