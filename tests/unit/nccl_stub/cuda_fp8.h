/* nccl_stub/cuda_fp8.h: empty: nccl.h includes it, nothing of it is checked. */
