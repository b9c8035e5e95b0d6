/* gcr_sha256: SHA-256 (FIPS 180-4), streaming, for OCI content digests (the checkpoint image
 * the agent's registry serves: containerd checks every blob against its sha256 digest). */
#ifndef GCR_SHA256_H
#define GCR_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define GCR_SHA256_LEN 32
#define GCR_SHA256_HEX 65 /* 64 lower-case hex digits and the NUL */

struct gcr_sha256 {
	uint32_t h[8];
	uint64_t bytes;
	uint8_t buf[64];
	size_t n;
};

void gcr_sha256_init(struct gcr_sha256 *s);
void gcr_sha256_update(struct gcr_sha256 *s, const void *data, size_t len);
void gcr_sha256_final(struct gcr_sha256 *s, uint8_t out[GCR_SHA256_LEN]);
/* One call over len bytes, as lower-case hex. */
void gcr_sha256_hex(const void *data, size_t len, char out[GCR_SHA256_HEX]);
void gcr_sha256_to_hex(const uint8_t d[GCR_SHA256_LEN], char out[GCR_SHA256_HEX]);

#endif
