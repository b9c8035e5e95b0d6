/* shim_config: the shim's settings, read once from the environment at load time
 * (one table row per option in shim_config.c: name, parser, default, accepted range). */
#ifndef SHIM_CONFIG_H
#define SHIM_CONFIG_H

#include <stddef.h>

struct shim_config {
	char socket_dir[200];   /* GCR_SOCKET_DIR */
	size_t vmm_min_bytes;   /* GCR_VMM_MIN_BYTES: smaller cuMemAlloc stays with the driver */
	int vmm;                /* GCR_VMM=0 keeps every cuMemAlloc on the driver path */
	int staging_prepare;    /* GCR_STAGING_PREPARE: fault staging memory in ahead of time */
	int staging_threads;    /* GCR_STAGING_THREADS: copy workers (each two pinned 2 MiB slots) */
	int zero_skip;          /* GCR_ZERO_SKIP: all-zero chunks are recorded, not copied */
	int incremental;        /* GCR_INCREMENTAL: keep the host copy after resume; copy only changes */
	int ctx_shrink;         /* GCR_CTX_SHRINK (1): give the contexts' local memory back while suspended */
	int gate_timeout_ms;    /* GCR_GATE_TIMEOUT_MS */
	int nccl;               /* GCR_NCCL (1): interpose NCCL's communicators */
	int image_writers;      /* GCR_IMAGE_WRITERS: copy workers that write a suspend to an image */
	int image_piece_mib;    /* GCR_IMAGE_PIECE_MIB: the largest write of a suspend to an image */
	int agent_register;     /* reserved for the node agent's registry */
	int overcommit;         /* GCR_OVERCOMMIT=1: ask the agent for room on out-of-memory */
	int room_timeout_ms;    /* GCR_ROOM_TIMEOUT_MS: the bound on that request, in all */
};

extern struct shim_config shim_cfg;

/* Reads the settings once: from the constructor, or earlier from whatever needs them first
 * (a runtime loaded before the constructor ran); later calls keep what was read. */
void shim_config_load(void);

#endif
