/* nccl_stub/cuda_bf16.h: empty: nccl.h includes it, nothing of it is checked. */
