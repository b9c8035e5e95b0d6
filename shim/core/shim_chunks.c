/* shim_chunks: the chunk table of a staged allocation (see shim_chunks.h). */
#include "shim_chunks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct shim_chunks *shim_chunks_new(uint64_t size)
{
	struct shim_chunks *ck = calloc(1, sizeof(*ck));
	if (ck == NULL)
		return NULL;
	ck->src_fd = -1;
	ck->nchunks = shim_digest_nchunks(size);
	ck->off = malloc(ck->nchunks * sizeof(*ck->off));
	ck->zero = calloc(ck->nchunks, 1);
	ck->dig = calloc(ck->nchunks, sizeof(*ck->dig));
	if (ck->off == NULL || ck->zero == NULL || ck->dig == NULL) {
		shim_chunks_free(ck);
		return NULL;
	}
	shim_chunks_clear(ck);
	return ck;
}

/* Closes and frees the file source (shim_chunks_record / src_fd). */
static void source_drop(struct shim_chunks *ck)
{
	if (ck->src_fd >= 0)
		close(ck->src_fd);
	ck->src_fd = -1;
	free(ck->src_name);
	free(ck->src_off);
	free(ck->src_crc);
	ck->src_name = NULL;
	ck->src_off = NULL;
	ck->src_crc = NULL;
}

void shim_chunks_clear(struct shim_chunks *ck)
{
	for (size_t c = 0; c < ck->nchunks; c++)
		ck->off[c] = SHIM_CHUNKS_NONE;
	memset(ck->zero, 0, ck->nchunks);
	ck->complete = 0;
	ck->have_digests = 0;
	source_drop(ck);
}

int shim_chunks_record(struct shim_chunks *ck, const char *name)
{
	shim_chunks_clear(ck);
	ck->src_name = strdup(name);
	ck->src_off = calloc(ck->nchunks + 1, sizeof(*ck->src_off));
	ck->src_crc = calloc(ck->nchunks + 1, sizeof(*ck->src_crc));
	if (ck->src_name == NULL || ck->src_off == NULL || ck->src_crc == NULL) {
		shim_chunks_clear(ck);
		return -ENOMEM;
	}
	return 0;
}

uint64_t shim_chunks_placed(const struct shim_chunks *ck)
{
	uint64_t n = 0;
	for (size_t c = 0; c < ck->nchunks; c++)
		n += ck->off[c] != SHIM_CHUNKS_NONE;
	return n * GCR_DIGEST_CHUNK;
}

void shim_chunks_free(struct shim_chunks *ck)
{
	if (ck == NULL)
		return;
	source_drop(ck);
	free(ck->off);
	free(ck->zero);
	free(ck->dig);
	free(ck);
}
