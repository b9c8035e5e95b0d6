/* test_gcr_crc32c: the image checksum (lib/gcr_crc32c): known answers, the processor's
 * instruction against the table at every alignment and length, and continuation. */
#include "config.h"
#include "gcr_crc32c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int main(void)
{
	/* Known answers (RFC 3720 appendix B.4 and the common check value). */
	CHECK(gcr_crc32c_update(0, "123456789", 9) == 0xE3069283u);
	CHECK(gcr_crc32c_update_sw(0, "123456789", 9) == 0xE3069283u);
	unsigned char z[32] = { 0 }, ff[32];
	memset(ff, 0xff, sizeof(ff));
	CHECK(gcr_crc32c_update(0, z, sizeof(z)) == 0x8A9136AAu);
	CHECK(gcr_crc32c_update(0, ff, sizeof(ff)) == 0x62A8AB43u);
	CHECK(gcr_crc32c_update(0, "", 0) == 0);

	/* Every alignment and many lengths: the instruction path equals the table path, and a
	 * checksum continued over two pieces equals the one over the whole. */
	enum { N = 4096 + 64 };
	unsigned char *b = malloc(N);
	CHECK(b != NULL);
	if (b == NULL)
		return test_summary("test_gcr_crc32c");
	unsigned s = 12345;
	for (size_t i = 0; i < N; i++) {
		s = s * 1103515245u + 12345u;
		b[i] = (unsigned char)(s >> 16);
	}
	int bad = 0;
	for (size_t off = 0; off < 16; off++)
		for (size_t len = 0; len + off < N && len < 300; len++) {
			uint32_t hw = gcr_crc32c_update(0, b + off, len), sw = gcr_crc32c_update_sw(0, b + off, len);
			size_t cut = len / 3;
			uint32_t two = gcr_crc32c_update(gcr_crc32c_update(0, b + off, cut), b + off + cut, len - cut);
			bad += hw != sw || two != hw;
		}
	CHECK(bad == 0);
	CHECK(gcr_crc32c_update(0, b, 4096) == gcr_crc32c_update_sw(0, b, 4096));

	/* Long buffers take the three-stream path (rounds of 3 x 8 KiB, joined): around its edges. */
	enum { L = 3 * 3 * 8192 + 100 };
	unsigned char *big = malloc(L + 16);
	CHECK(big != NULL);
	if (big != NULL) {
		for (size_t i = 0; i < L + 16; i++) {
			s = s * 1103515245u + 12345u;
			big[i] = (unsigned char)(s >> 16);
		}
		static const size_t lens[] = { 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 1, 6 * 8192 + 7, 9 * 8192, L };
		int bad2 = 0;
		for (size_t off = 0; off < 9; off++)
			for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
				uint32_t hw = gcr_crc32c_update(0, big + off, lens[k]);
				bad2 += hw != gcr_crc32c_update_sw(0, big + off, lens[k]);
				bad2 += hw != gcr_crc32c_update(gcr_crc32c_update(0, big + off, 5000), big + off + 5000,
								lens[k] - 5000);
			}
		CHECK(bad2 == 0);
		free(big);
	}
	/* A single flipped bit changes it. */
	uint32_t before = gcr_crc32c_update(0, b, 4096);
	b[1000] ^= 0x10;
	CHECK(gcr_crc32c_update(0, b, 4096) != before);
	free(b);

	char hex[GCR_CRC32C_HEX];
	uint32_t back = 0;
	gcr_crc32c_to_hex(0x0a0b0c0du, hex);
	CHECK_STR(hex, "0a0b0c0d");
	CHECK(gcr_crc32c_from_hex(hex, &back) == 0 && back == 0x0a0b0c0du);
	CHECK(gcr_crc32c_from_hex("0A0B0C0D", &back) < 0);
	CHECK(gcr_crc32c_from_hex("0a0b0c0", &back) < 0);
	CHECK(gcr_crc32c_from_hex("0a0b0c0dd", &back) < 0);
	CHECK(gcr_crc32c_from_hex("0a0b0c0g", &back) < 0);
	printf("crc32c: processor instruction %s\n", gcr_crc32c_hw() ? "used" : "not available (table)");
	return test_summary("test_gcr_crc32c");
}
