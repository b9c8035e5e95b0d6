/* shim_cuda_digest: the digest kernel on the CUDA driver, behind shim_cuda_ops.digest and
 * .digest_preload (shim_digest.h says what the digests are). */
#ifndef SHIM_CUDA_DIGEST_H
#define SHIM_CUDA_DIGEST_H

#include <stddef.h>

#include "gcr_error.h"
#include "shim_digest.h"

/* Loads the kernel for ctx's device (the driver JIT-compiles the PTX); failures are logged once. */
void shim_cuda_digest_preload(void *ctx);
/* Digests every request (one launch each, one copy back per GPU); 0, -ENOSYS when the kernel
 * cannot be loaded, or another -errno. */
int shim_cuda_digest(const struct shim_digest_req *req, size_t n, struct shim_digest *out, struct gcr_err *err);

#endif
