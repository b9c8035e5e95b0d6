/* shim_digest_kernel: the GPU side of shim_digest. One launch digests a whole
 * buffer: block b covers slice (b % SLICES) of chunk (b / SLICES), and adds its
 * partial sums into out[3 * chunk ...] (zeroed by the caller). Compiled to PTX
 * by scripts/gen-digest-ptx.sh; the shim embeds the PTX and the driver JIT-compiles
 * it for whatever GPU it runs on. */
#include "shim_digest_math.h"

extern "C" __global__ void __launch_bounds__(GCR_DIGEST_THREADS)
gcr_chunk_digest(const ulonglong2 *base, unsigned long long nbytes, unsigned long long *out)
{
	const unsigned long long pairs_per_chunk = GCR_DIGEST_CHUNK / 16;
	const unsigned long long pairs_per_slice = pairs_per_chunk / GCR_DIGEST_SLICES;
	unsigned long long chunk = blockIdx.x / GCR_DIGEST_SLICES;
	unsigned long long slice = blockIdx.x % GCR_DIGEST_SLICES;
	unsigned long long npairs = nbytes / 16;
	unsigned long long h1 = 0, h2 = 0, any = 0;
	for (unsigned long long j = slice * pairs_per_slice + threadIdx.x; j < (slice + 1) * pairs_per_slice;
	     j += GCR_DIGEST_THREADS) {
		unsigned long long g = chunk * pairs_per_chunk + j;
		if (g >= npairs)
			break;
		ulonglong2 v = base[g];
		h1 += gcr_digest_term1(v.x, 2 * j) + gcr_digest_term1(v.y, 2 * j + 1);
		h2 += gcr_digest_term2(v.x, 2 * j) + gcr_digest_term2(v.y, 2 * j + 1);
		any |= v.x | v.y;
	}
	__shared__ unsigned long long s1[GCR_DIGEST_THREADS], s2[GCR_DIGEST_THREADS], s3[GCR_DIGEST_THREADS];
	s1[threadIdx.x] = h1;
	s2[threadIdx.x] = h2;
	s3[threadIdx.x] = any;
	__syncthreads();
	for (unsigned int n = GCR_DIGEST_THREADS / 2; n > 0; n /= 2) {
		if (threadIdx.x < n) {
			s1[threadIdx.x] += s1[threadIdx.x + n];
			s2[threadIdx.x] += s2[threadIdx.x + n];
			s3[threadIdx.x] |= s3[threadIdx.x + n];
		}
		__syncthreads();
	}
	if (threadIdx.x == 0) {
		atomicAdd(&out[3 * chunk], s1[0]);
		atomicAdd(&out[3 * chunk + 1], s2[0]);
		if (s3[0] != 0)
			atomicOr(&out[3 * chunk + 2], s3[0]);
	}
}
