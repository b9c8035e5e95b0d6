/* shim_hip_alloc: the HIP allocation entry points and the HIP-side record of what the
 * application holds (phase 1: forwarded to the runtime and counted, not yet moved). */
#ifndef SHIM_HIP_ALLOC_H
#define SHIM_HIP_ALLOC_H

#include <stdint.h>

/* Byte and object counts by path, for status and statistics. */
struct shim_hip_alloc_stats {
	uint64_t plain_bytes, plain_buffers;     /* hipMalloc, hipExtMallocWithFlags, pitch */
	uint64_t async_bytes, async_buffers;     /* stream-ordered and pool allocations */
	uint64_t managed_bytes, managed_buffers; /* hipMallocManaged */
	uint64_t vmm_bytes, vmm_handles;         /* the application's own hipMemCreate */
	uint64_t reserved_bytes, reservations;   /* hipMemAddressReserve */
	uint64_t mapped_bytes, mappings;         /* hipMemMap */
};

void shim_hip_alloc_stats(struct shim_hip_alloc_stats *st);

/* Whether the process ever allocated through HIP (so its control state is the HIP runtime's). */
int shim_hip_alloc_used(void);

#endif
