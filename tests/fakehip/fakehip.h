/* fakehip: the contract between the stand-in HIP runtime (libamdhip64.so.5 on host memory)
 * and the programs that run on it: how a "kernel" is a host function, and the service. */
#ifndef FAKEHIP_H
#define FAKEHIP_H

#include <hip/hip_runtime_api.h>

/* A kernel on the stand-in is a host function: what hipLaunchKernel and hipModuleLaunchKernel
 * are given as the function (or hipFunction_t) is a pointer to one, called once per launch
 * with the launch shape and the argument array. A fault in it (an unmapped or inaccessible
 * device address) is a real SIGSEGV, as an illegal address is fatal on a GPU. */
typedef void (*fakehip_kernel_fn)(dim3 grid, dim3 block, void **args);

/* The per-process service: $FAKEHIP_DIR/fakehip-<pid>.sock (only when FAKEHIP_DIR is set).
 * One request line per connection, answered "<hipError_t> [value]\n": "mem" (device bytes
 * held), "registered" (pinned host bytes), "fail <function> <nth> <hipError_t>" (the nth next
 * call of function answers that error). */
#define FAKEHIP_SOCK_FMT "%s/fakehip-%d.sock"

#endif
