/* gcr_sha256: SHA-256 (FIPS 180-4) for image checksums, in the shim and the tools alike:
 * no library dependency inside an LD_PRELOAD shim. Streaming and one-shot. */
#ifndef GCR_SHA256_H
#define GCR_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define GCR_SHA256_LEN 32
#define GCR_SHA256_HEX (2 * GCR_SHA256_LEN + 1) /* hex digits and the NUL */

struct gcr_sha256 {
	uint32_t h[8];
	uint64_t len; /* bytes hashed so far */
	uint8_t buf[64];
	size_t nbuf;
};

void gcr_sha256_init(struct gcr_sha256 *s);
void gcr_sha256_update(struct gcr_sha256 *s, const void *data, size_t n);
void gcr_sha256_final(struct gcr_sha256 *s, uint8_t out[GCR_SHA256_LEN]);
/* One-shot, as lower-case hex (GCR_SHA256_HEX bytes, NUL-terminated). */
void gcr_sha256_hex(const void *data, size_t n, char out[GCR_SHA256_HEX]);
void gcr_sha256_to_hex(const uint8_t d[GCR_SHA256_LEN], char out[GCR_SHA256_HEX]);

#endif
