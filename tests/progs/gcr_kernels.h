/* gcr_kernels: the deterministic data the test kernels write and check, shared by the CUDA
 * kernels (gcr_kernels.cu), the stand-in driver's built-in kernels and host-side checks. */
#ifndef GCR_KERNELS_H
#define GCR_KERNELS_H

#include <stdint.h>

#ifdef __CUDACC__
#define GCR_HD __host__ __device__
#else
#define GCR_HD
#endif

/* The value the fill kernel writes at index i: a murmur3 fmix64 of index and seed, folded to
 * 32 bits, so every word of every buffer differs and a misplaced page cannot go unnoticed. */
static inline GCR_HD uint32_t gcr_pattern(uint32_t seed, uint64_t i)
{
	uint64_t h = i * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32 | seed);

	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return (uint32_t)(h ^ (h >> 32));
}

/* One step of the step kernel: a linear congruential update plus the iteration number, so
 * a step applied twice, skipped or replayed with the wrong k changes the result. */
static inline GCR_HD uint32_t gcr_step_value(uint32_t x, uint32_t k)
{
	return x * 1664525u + 1013904223u + k;
}

/* The value at i after fill(seed) and steps k = kfirst .. kfirst + nsteps - 1. */
static inline GCR_HD uint32_t gcr_expected(uint32_t seed, uint64_t i, uint32_t kfirst,
					   uint32_t nsteps)
{
	uint32_t x = gcr_pattern(seed, i);
	uint32_t s;

	for (s = 0; s < nsteps; s++)
		x = gcr_step_value(x, kfirst + s);
	return x;
}

#endif
