/* gcr_crc32c: CRC-32C (Castagnoli) for image checksums, in the shim and the tools alike. Why
 * not SHA-256 (format 1): one core hashes SHA-256 at ~0.3 GB/s, so checking a 16 GiB image
 * took longer than reading it; CRC-32C runs in the processor (SSE4.2) at several GB/s per
 * core. It guards against corruption and truncation, not against someone who can write the
 * image (they could rewrite the manifest too): the image directory's permissions do that. */
#ifndef GCR_CRC32C_H
#define GCR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#define GCR_CRC32C_HEX 9 /* 8 lower-case hex digits and the NUL */

/* Continues crc (0 to start) over n bytes: crc(a||b) == update(update(0, a), b). */
uint32_t gcr_crc32c_update(uint32_t crc, const void *data, size_t n);
/* The table-driven version, always (tests compare it with the processor's). */
uint32_t gcr_crc32c_update_sw(uint32_t crc, const void *data, size_t n);
/* 1 when gcr_crc32c_update uses the processor's CRC32 instruction. */
int gcr_crc32c_hw(void);
void gcr_crc32c_to_hex(uint32_t crc, char out[GCR_CRC32C_HEX]);
/* Parses exactly 8 lower-case hex digits; 0 or -1. */
int gcr_crc32c_from_hex(const char *s, uint32_t *crc);

#endif
