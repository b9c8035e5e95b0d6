/* shim_image: per-chunk layout of a staged allocation (see shim_image.h). */
#include "shim_image.h"

#include <stdlib.h>
#include <string.h>

struct shim_image *shim_image_new(uint64_t size)
{
	struct shim_image *img = calloc(1, sizeof(*img));
	if (img == NULL)
		return NULL;
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

void shim_image_clear(struct shim_image *img)
{
	for (size_t c = 0; c < img->nchunks; c++)
		img->off[c] = SHIM_IMAGE_NONE;
	memset(img->zero, 0, img->nchunks);
	img->complete = 0;
	img->have_digests = 0;
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
	free(img->off);
	free(img->zero);
	free(img->dig);
	free(img);
}
