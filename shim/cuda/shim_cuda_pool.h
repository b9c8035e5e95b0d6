/* shim_cuda_pool: the CUDA driver's stream-ordered allocation and pools on the shim's arena
 * (shim_pool); what the other CUDA allocation wrappers (shim_cuda_alloc.c) need from it. */
#ifndef SHIM_CUDA_POOL_H
#define SHIM_CUDA_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Holders of graph memory (shim_pool_graph_*): a capture by its id, a graph, an executable.
 * Handles are user-space pointers (below 2^62), ids small: the tags keep the kinds apart. */
#define SHIM_CUDA_HOLD_CAPTURE(id) ((uint64_t)(id) | (1ull << 63))
#define SHIM_CUDA_HOLD_GRAPH(g) ((uint64_t)(uintptr_t)(g) | (1ull << 62))
#define SHIM_CUDA_HOLD_EXEC(e) ((uint64_t)(uintptr_t)(e) | (3ull << 62))

/* A graph-owned block of bytes for holder from the served pool (0: device dev's default pool,
 * served from here on), a new segment mapped in relaxed capture mode. -ENOENT: not served. */
int shim_cuda_pool_graph_alloc(uint64_t pool, int dev, size_t bytes, uint64_t holder, uint64_t *va);
/* to takes over every block from holds (a capture ending in a graph). */
int shim_cuda_pool_graph_pass(uint64_t to, uint64_t from);

/* The application freed a pointer it imported from another process's pool (cuMemFree_v2). */
void shim_cuda_pool_forget_import(uint64_t va);

/* Whether a stream capture runs anywhere in the process now (one atomic load). */
int shim_cuda_capturing(void);

#endif
