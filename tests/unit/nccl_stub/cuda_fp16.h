/* nccl_stub/cuda_fp16.h: empty: nccl.h includes it, nothing of it is checked. */
