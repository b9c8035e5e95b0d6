/* nccl_stub/cuda_runtime.h: what nccl.h needs of the CUDA runtime's headers (the stream type and
 * the version it tests), so tests/unit/test_nccl_abi.c compiles nccl.h with the driver's headers
 * alone (the nvidia-cuda-runtime wheel lacks the compiler's crt/ headers cuda_runtime.h wants). */
#ifndef GCR_NCCL_STUB_CUDA_RUNTIME_H
#define GCR_NCCL_STUB_CUDA_RUNTIME_H
#include <cuda.h>
#define CUDART_VERSION 13000
typedef struct CUstream_st *cudaStream_t;
#endif
