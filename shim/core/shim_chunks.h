/* shim_chunks: the host-side chunk table of one physical allocation while it is staged (and,
 * with GCR_INCREMENTAL, kept after resume): per 2 MiB chunk, where its bytes sit
 * in the staging pool or that they are all zero, and the digest they had. */
#ifndef SHIM_CHUNKS_H
#define SHIM_CHUNKS_H

#include <stddef.h>
#include <stdint.h>

#include "shim_digest.h"

#define SHIM_CHUNKS_NONE UINT64_MAX /* no placement in the pool yet */

struct shim_chunks {
	size_t nchunks;
	int complete;      /* every chunk's bytes are in the pool or zero, matching dig */
	int have_digests;  /* dig holds real digests (the kernel ran) */
	uint64_t *off;     /* pool offset per chunk, or SHIM_CHUNKS_NONE */
	uint8_t *zero;     /* 1: the chunk is all zero (nothing in the pool) */
	struct shim_digest *dig;
	/* After image-read: the data is read from this image file by the resume itself (no
	 * staging): chunk c's bytes at src_off[c], CRC-32C src_crc[c]. src_fd -1: staging. */
	int src_fd;
	char *src_name;    /* owned: the file, for messages */
	uint64_t *src_off; /* owned */
	uint32_t *src_crc; /* owned */
};

/* A chunk table for size bytes, no placements; NULL when out of memory. */
struct shim_chunks *shim_chunks_new(uint64_t size);
/* Forgets placements, content and the file source (the pool was reset). */
void shim_chunks_clear(struct shim_chunks *ck);
/* Bytes of pool placed for this table. */
uint64_t shim_chunks_placed(const struct shim_chunks *ck);
void shim_chunks_free(struct shim_chunks *ck); /* NULL-safe */
/* Forgets everything (shim_chunks_clear) and makes room for a file's chunk offsets and checksums
 * (src_off, src_crc, zeroed), no file attached yet (src_fd -1): the suspend to an image fills
 * them, image-read fills them and sets src_fd. 0 or -ENOMEM. */
int shim_chunks_record(struct shim_chunks *ck, const char *name);

#endif
