/* shim_imagefile: the GPU data of a suspended process to image files and back
 * (docs/images.md): staged chunks written by several threads, zero chunks recorded only,
 * each chunk's SHA-256 in the table gpu/allocs.json; read back into a fresh staging pool
 * after a CRIU restore, every chunk checked. */
#ifndef SHIM_IMAGEFILE_H
#define SHIM_IMAGEFILE_H

#include <jansson.h>

#include "gcr_error.h"

/* While suspended: writes every staged allocation to dir/gpu/ (dir: an existing absolute
 * directory) and the table to dir/gpu/allocs.json, all fsynced. The staging is untouched:
 * shim_imagefile_drop gives it back once the caller knows the files are wanted. *result: a
 * summary (bytes, written, zero, allocs, files, ms). -EINVAL when not suspended. */
int shim_imagefile_write(const char *dir, json_t **result, struct gcr_err *err);
/* Frees the host staging after a write: the data now lives only in the files, and a resume
 * is refused until shim_imagefile_read loads it back. */
void shim_imagefile_drop(void);
/* 1 while the data is in files only (dropped and not read back). */
int shim_imagefile_dropped(void);
/* While suspended: reads dir/gpu/ back into staging (a new pool), checking every chunk's
 * SHA-256 and that the table matches this process's allocations. On failure the process
 * stays suspended with its data in files only. */
int shim_imagefile_read(const char *dir, json_t **result, struct gcr_err *err);

#endif
