/* shim_pool: the shim's own stream-ordered arena, vendor-neutral, behind cuMemAllocAsync,
 * cuMemAllocFromPoolAsync and the pools (shim_cuda_pool.c): segments the allocation table moves at
 * suspend, carved into blocks; a freed block is pending on its stream until its marker completes.
 * It reaches the GPU only through struct shim_pool_ops, so a unit test drives it without a driver. */
#ifndef SHIM_POOL_H
#define SHIM_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_gpu.h"

/* What the arena needs from the GPU. Called with the arena's lock held; none may call back
 * into shim_pool. Each returns 0 or -errno (-ENOMEM: the GPU is out of memory). */
struct shim_pool_ops {
	/* A segment of size bytes (a granularity multiple) on device, with access acc[n]
	 * (n 0: the device alone); its address in *va. */
	int (*seg_new)(int device, size_t size, const struct shim_gpu_access *acc, size_t n, uint64_t *va);
	void (*seg_free)(uint64_t va, size_t size);
	int (*seg_access)(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n);
	/* A marker: an event recorded now on (stream, variant), after the free it marks. */
	int (*mark)(uint64_t stream, int variant, void **ev);
	/* 1: the marked work has completed; 0: not yet (an error counts as not yet). */
	int (*done)(void *ev);
	/* Makes (stream, variant) wait for ev. */
	int (*wait)(uint64_t stream, int variant, void *ev);
	/* The marker's event is no longer needed (back to the caller's cache). */
	void (*unmark)(void *ev);
};

/* A stream as the application named it: the handle, the variant of the call (1: the
 * per-thread-default-stream twin) and, for a per-thread default stream, the thread. The CUDA
 * side folds the aliases (shim_cuda_pool.c), so equal keys mean the same stream. */
struct shim_pool_stream {
	uint64_t handle;
	uint64_t thread;
	int variant;
};

/* Attributes kept by the arena (the vendor keeps its own copy too). */
enum shim_pool_attr {
	SHIM_POOL_REUSE_FOLLOW_EVENTS, /* accepted, not used: cross-stream reuse waits or polls */
	SHIM_POOL_REUSE_OPPORTUNISTIC,
	SHIM_POOL_REUSE_INTERNAL_DEPS,
	SHIM_POOL_RELEASE_THRESHOLD,
	SHIM_POOL_RESERVED_CURRENT,
	SHIM_POOL_RESERVED_HIGH, /* set (to 0): resets to current */
	SHIM_POOL_USED_CURRENT,
	SHIM_POOL_USED_HIGH,
};

/* Block placement: 512-byte alignment; requests up to SMALL_MAX bytes come from SMALL_SEG
 * segments, up to MEDIUM_MAX from MEDIUM_SEG segments, larger ones get a segment each. */
#define SHIM_POOL_ALIGN 512u
#define SHIM_POOL_SMALL_MAX ((size_t)1 << 20)
#define SHIM_POOL_SMALL_SEG ((size_t)2 << 20)
#define SHIM_POOL_MEDIUM_MAX ((size_t)32 << 20)
#define SHIM_POOL_MEDIUM_SEG ((size_t)32 << 20)

/* Allocation and free flags. */
#define SHIM_POOL_GRAPH 0x1u /* a capture: a graph-owned block, never from pending extents */
#define SHIM_POOL_DONE 0x2u  /* free: its device was synchronised, the block is reusable now */

/* A new arena for the vendor's pool key on device; gran: the device's VMM granularity (bytes).
 * -EEXIST when key has one. */
int shim_pool_add(uint64_t key, int device, size_t gran, const struct shim_pool_ops *ops);
/* The pool is destroyed: the key is forgotten at once, idle segments go now, the others when
 * their last block is freed. -ENOENT when key is not served. */
int shim_pool_remove(uint64_t key);
int shim_pool_served(uint64_t key);

/* A block of bytes from key's arena, ordered on s. -ENOENT: key not served; -ENOMEM: no room
 * on the GPU; -EINVAL: bytes 0; else the ops' code. */
int shim_pool_alloc(uint64_t key, size_t bytes, const struct shim_pool_stream *s, unsigned flags,
		    uint64_t *va);
/* Frees the block at va on s (flags SHIM_POOL_DONE: s unused). -ENOENT: not a block. */
int shim_pool_free(uint64_t va, const struct shim_pool_stream *s, unsigned flags);
/* Whether va lies in a live block: its address, size asked for and device (any may be NULL). */
int shim_pool_block(uint64_t va, uint64_t *base, size_t *size, int *device);

int shim_pool_set_attr(uint64_t key, enum shim_pool_attr a, uint64_t value);
int shim_pool_get_attr(uint64_t key, enum shim_pool_attr a, uint64_t *value);
/* Releases idle segments whose frees completed until at most keep bytes stay reserved. */
int shim_pool_trim(uint64_t key, size_t keep);
/* The pool's access list, applied to every segment and to new ones; and read back (*n in: room). */
int shim_pool_set_access(uint64_t key, const struct shim_gpu_access *acc, size_t n);
int shim_pool_get_access(uint64_t key, struct shim_gpu_access *acc, size_t *n);

/* A synchronisation returned: s NULL: every stream's work is done, else s's. Frees pending
 * there become reusable, and pools above their release threshold shrink. Cheap to guard with
 * shim_pool_sync_wanted(), one atomic load. */
void shim_pool_synced(const struct shim_pool_stream *s);
extern atomic_int shim_pool_want_release;
static inline int shim_pool_sync_wanted(void)
{
	return atomic_load_explicit(&shim_pool_want_release, memory_order_relaxed) != 0;
}
/* The stream is destroyed: its pending frees complete on their own; its key may be reused. */
void shim_pool_stream_gone(const struct shim_pool_stream *s);

/* Suspend, after every context was synchronised: all frees have completed; idle segments are
 * released so they are not copied. Returns the bytes released. */
uint64_t shim_pool_release_idle(void);

struct shim_pool_stats {
	uint64_t pools;
	uint64_t reserved_bytes, used_bytes; /* segments, and blocks handed out (rounded) */
	uint64_t blocks, segments, pending_frees;
	uint64_t graph_bytes;
	uint64_t grows, reuses_same_stream, reuses_done, reuses_waited;
};
void shim_pool_stats(struct shim_pool_stats *st);

/* For tests: forgets every arena (no ops are called). */
void shim_pool_reset(void);

#endif
