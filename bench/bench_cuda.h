// bench/bench_cuda.h: the CUDA runtime error check the single-file benchmark programs share:
// any error prints "ERROR file:line call: text" (the harness reads it) and exits 2.
#ifndef BENCH_CUDA_H
#define BENCH_CUDA_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(call)                                                                                     \
	do {                                                                                         \
		cudaError_t e_ = (call);                                                             \
		if (e_ != cudaSuccess) {                                                             \
			printf("ERROR %s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			fflush(stdout);                                                              \
			exit(2);                                                                     \
		}                                                                                    \
	} while (0)

#endif
