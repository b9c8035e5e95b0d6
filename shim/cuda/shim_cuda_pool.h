/* shim_cuda_pool: the CUDA driver's stream-ordered allocation and pools on the shim's arena
 * (shim_pool); what the other CUDA allocation wrappers (shim_cuda_alloc.c) need from it. */
#ifndef SHIM_CUDA_POOL_H
#define SHIM_CUDA_POOL_H

#include <stdint.h>

/* The application freed a pointer it imported from another process's pool (cuMemFree_v2). */
void shim_cuda_pool_forget_import(uint64_t va);

#endif
