/* shim_image: per-chunk layout of a staged allocation (see shim_chunks.h). */
#include "shim_chunks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct shim_image *shim_image_new(uint64_t size)
{
	struct shim_image *img = calloc(1, sizeof(*img));
	if (img == NULL)
		return NULL;
	img->src_fd = -1;
	img->nchunks = shim_digest_nchunks(size);
	img->off = malloc(img->nchunks * sizeof(*img->off));
	img->zero = calloc(img->nchunks, 1);
	img->dig = calloc(img->nchunks, sizeof(*img->dig));
	if (img->off == NULL || img->zero == NULL || img->dig == NULL) {
		shim_image_free(img);
		return NULL;
	}
	shim_image_clear(img);
	return img;
}

/* Closes and frees the file source (shim_image_record / src_fd). */
static void source_drop(struct shim_image *img)
{
	if (img->src_fd >= 0)
		close(img->src_fd);
	img->src_fd = -1;
	free(img->src_name);
	free(img->src_off);
	free(img->src_crc);
	img->src_name = NULL;
	img->src_off = NULL;
	img->src_crc = NULL;
}

void shim_image_clear(struct shim_image *img)
{
	for (size_t c = 0; c < img->nchunks; c++)
		img->off[c] = SHIM_IMAGE_NONE;
	memset(img->zero, 0, img->nchunks);
	img->complete = 0;
	img->have_digests = 0;
	source_drop(img);
}

int shim_image_record(struct shim_image *img, const char *name)
{
	shim_image_clear(img);
	img->src_name = strdup(name);
	img->src_off = calloc(img->nchunks + 1, sizeof(*img->src_off));
	img->src_crc = calloc(img->nchunks + 1, sizeof(*img->src_crc));
	if (img->src_name == NULL || img->src_off == NULL || img->src_crc == NULL) {
		shim_image_clear(img);
		return -ENOMEM;
	}
	return 0;
}

uint64_t shim_image_placed(const struct shim_image *img)
{
	uint64_t n = 0;
	for (size_t c = 0; c < img->nchunks; c++)
		n += img->off[c] != SHIM_IMAGE_NONE;
	return n * GCR_DIGEST_CHUNK;
}

void shim_image_free(struct shim_image *img)
{
	if (img == NULL)
		return;
	source_drop(img);
	free(img->off);
	free(img->zero);
	free(img->dig);
	free(img);
}
