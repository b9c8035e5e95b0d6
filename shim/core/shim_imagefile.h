/* shim_imagefile: the GPU data of a suspended process to image files and back
 * (docs/images.md): staged chunks written by several threads, zero chunks recorded only,
 * each chunk's CRC-32C in the table gpu/allocs.json; after a CRIU restore the files become
 * the source of the next resume, which reads and checks every chunk on its way to the GPU. */
#ifndef SHIM_IMAGEFILE_H
#define SHIM_IMAGEFILE_H

#include <jansson.h>

#include "gcr_error.h"

/* While suspended: writes every staged allocation to dir/gpu/ (dir: an existing absolute
 * directory) and the table to dir/gpu/allocs.json, all fsynced. The staging is untouched:
 * shim_imagefile_drop gives it back once the caller knows the files are wanted. *result: a
 * summary (bytes, written, zero, allocs, files, ms). -EINVAL when not suspended. */
int shim_imagefile_write(const char *dir, json_t **result, struct gcr_err *err);
/* Suspends straight to dir (an existing absolute directory): every copied chunk goes from the
 * copy workers' pinned slots to dir/gpu/ (no staging), zero chunks recorded only, then the
 * table dir/gpu/allocs.json; all fsynced; the staging pool is given back. On failure the
 * process runs on (nothing was released before every chunk was written). rep: the suspend's
 * report; *result: bytes, written, zero, allocs, table, ms. Resume is refused until an
 * image-read attaches the files. */
struct shim_cr_report;
int shim_imagefile_suspend(const char *dir, int timeout_ms, struct shim_cr_report *rep, json_t **result,
			   struct gcr_err *err);
/* Frees the host staging after a write: the data now lives only in the files (shim_cr's
 * SHIM_CR_DATA_WRITTEN), and a resume is refused until shim_imagefile_read loads it back. On
 * failure (not suspended with the data in host memory) the staging is kept. */
int shim_imagefile_drop(struct gcr_err *err);
/* While suspended with the data in files (after drop): checks that dir/gpu/allocs.json matches
 * this process's allocations and that every data file has its size, and makes the files the
 * source of the next resume (shim_staging_transfer reads each chunk into a pinned slot and
 * checks its CRC-32C before it goes to the GPU). On failure the process stays suspended with
 * its data in files only. */
/* src (else NULL: dir's files): the image's files as descriptors the node agent passed, names[i]
 * (as the table names them, GCR_IMAGE_TABLE among them) open as fds[i]; each is dup'ed, the
 * caller closes its own. */
struct shim_imagefile_src {
	const char **names;
	const int *fds;
	int n;
};
int shim_imagefile_read(const char *dir, const struct shim_imagefile_src *src, json_t **result, struct gcr_err *err);

#endif
