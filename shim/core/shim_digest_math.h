/* shim_digest_math: the chunk digest, one definition shared by the GPU kernel
 * (shim_digest_kernel.cu), the stand-in driver's emulation of it and the tests.
 *
 * A chunk's digest is (h1, h2, any): h1 and h2 are sums, mod 2^64, of a bijective
 * mix of each 64-bit word with its index, under two different keys; any is the OR
 * of all words. Sums make the digest independent of the order threads add in;
 * the bijection means a change to any single word always changes both sums, and
 * several changes cancel in both only with probability about 2^-128. any == 0
 * exactly when the chunk is all zero bytes. */
#ifndef SHIM_DIGEST_MATH_H
#define SHIM_DIGEST_MATH_H

#ifdef __CUDACC__
#define GCR_DIGEST_FN static __device__ __forceinline__
typedef unsigned long long gcr_digest_u64;
#else
#include <stdint.h>
#define GCR_DIGEST_FN static inline
typedef uint64_t gcr_digest_u64;
#endif

/* Bytes per chunk: the VMM granularity of current GPUs, and the unit that is
 * skipped when zero or unchanged. */
#define GCR_DIGEST_CHUNK (2ull << 20)
/* Blocks per chunk in the kernel, and threads per block. */
#define GCR_DIGEST_SLICES 32
#define GCR_DIGEST_THREADS 256

/* splitmix64's finalizer: a bijection on 64-bit values. */
GCR_DIGEST_FN gcr_digest_u64 gcr_digest_mix(gcr_digest_u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* What word w at word index i (within its chunk) adds to h1 and to h2. */
GCR_DIGEST_FN gcr_digest_u64 gcr_digest_term1(gcr_digest_u64 w, gcr_digest_u64 i)
{
	return gcr_digest_mix(w ^ (i * 0x9e3779b97f4a7c15ull) ^ 0x243f6a8885a308d3ull);
}

GCR_DIGEST_FN gcr_digest_u64 gcr_digest_term2(gcr_digest_u64 w, gcr_digest_u64 i)
{
	return gcr_digest_mix((w + i * 0xc2b2ae3d27d4eb4full) ^ 0x13198a2e03707344ull);
}

#endif
