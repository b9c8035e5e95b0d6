/* gcr_crc32c: CRC-32C (see gcr_crc32c.h). The reflected polynomial 0x82F63B78; the table
 * version processes 8 bytes per step (slicing-by-8); on x86-64 with SSE4.2 the CRC32
 * instruction does 8 bytes per instruction on three streams at once, chosen once at run time
 * so one build runs on every x86-64. */
#include "gcr_crc32c.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t tab[8][256];
static pthread_once_t tab_once = PTHREAD_ONCE_INIT;

static void tab_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
		tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			tab[t][i] = (tab[t - 1][i] >> 8) ^ tab[0][tab[t - 1][i] & 0xff];
}

/* c: the running register (already inverted). */
static uint32_t sw_run(uint32_t c, const unsigned char *p, size_t n)
{
	while (n > 0 && ((uintptr_t)p & 7) != 0) {
		c = (c >> 8) ^ tab[0][(c ^ *p++) & 0xff];
		n--;
	}
	while (n >= 8) {
		uint32_t lo, hi;
		memcpy(&lo, p, 4);
		memcpy(&hi, p + 4, 4);
		lo ^= c; /* little-endian: the CRC register lines up with the first four bytes */
		c = tab[7][lo & 0xff] ^ tab[6][(lo >> 8) & 0xff] ^ tab[5][(lo >> 16) & 0xff] ^ tab[4][lo >> 24] ^
		    tab[3][hi & 0xff] ^ tab[2][(hi >> 8) & 0xff] ^ tab[1][(hi >> 16) & 0xff] ^ tab[0][hi >> 24];
		p += 8;
		n -= 8;
	}
	while (n-- > 0)
		c = (c >> 8) ^ tab[0][(c ^ *p++) & 0xff];
	return c;
}

uint32_t gcr_crc32c_update_sw(uint32_t crc, const void *data, size_t n)
{
	pthread_once(&tab_once, tab_init);
	return ~sw_run(~crc, data, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>

/* Three streams at once: the instruction's latency is three cycles but it issues every cycle,
 * so one stream reaches a third of its speed. Each round checksums three BLK-byte blocks with
 * their own registers and joins them: the register is linear, so reg(r, A||B) =
 * shift(reg(r, A)) ^ reg(0, B), where shift is the register's change over BLK zero bytes, a
 * GF(2) linear map kept as four byte tables. */
#define BLK 8192

static uint32_t shift_tab[4][256];
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint32_t hw_zeros(uint32_t r, size_t n)
{
	uint64_t c = r;
	for (size_t i = 0; i < n / 8; i++)
		c = _mm_crc32_u64(c, 0);
	return (uint32_t)c;
}

static void shift_init(void)
{
	uint32_t basis[32];
	for (int i = 0; i < 32; i++)
		basis[i] = hw_zeros(1u << i, BLK);
	for (int k = 0; k < 4; k++)
		for (uint32_t b = 0; b < 256; b++) {
			uint32_t v = 0;
			for (int j = 0; j < 8; j++)
				if (b & (1u << j))
					v ^= basis[8 * k + j];
			shift_tab[k][b] = v;
		}
}

static inline uint32_t shift(uint32_t r)
{
	return shift_tab[0][r & 0xff] ^ shift_tab[1][(r >> 8) & 0xff] ^ shift_tab[2][(r >> 16) & 0xff] ^
	       shift_tab[3][r >> 24];
}

__attribute__((target("sse4.2"))) static uint32_t hw_run(uint32_t crc, const unsigned char *p, size_t n)
{
	uint64_t c = crc;
	while (n > 0 && ((uintptr_t)p & 7) != 0) {
		c = _mm_crc32_u8((uint32_t)c, *p++);
		n--;
	}
	if (n >= 3 * BLK)
		pthread_once(&shift_once, shift_init);
	while (n >= 3 * BLK) {
		uint64_t c1 = 0, c2 = 0;
		for (size_t i = 0; i < BLK; i += 8) {
			uint64_t v0, v1, v2;
			memcpy(&v0, p + i, 8);
			memcpy(&v1, p + BLK + i, 8);
			memcpy(&v2, p + 2 * BLK + i, 8);
			c = _mm_crc32_u64(c, v0);
			c1 = _mm_crc32_u64(c1, v1);
			c2 = _mm_crc32_u64(c2, v2);
		}
		c = shift(shift((uint32_t)c) ^ (uint32_t)c1) ^ (uint32_t)c2;
		p += 3 * BLK;
		n -= 3 * BLK;
	}
	while (n >= 8) {
		uint64_t v;
		memcpy(&v, p, 8);
		c = _mm_crc32_u64(c, v);
		p += 8;
		n -= 8;
	}
	while (n-- > 0)
		c = _mm_crc32_u8((uint32_t)c, *p++);
	return (uint32_t)c;
}

static int hw_ok(void)
{
	static int known = -1; /* a benign race: every thread computes the same answer */
	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("sse4.2") ? 1 : 0;
	}
	return known;
}
#else
static uint32_t hw_run(uint32_t crc, const unsigned char *p, size_t n)
{
	return sw_run(crc, p, n);
}

static int hw_ok(void)
{
	return 0;
}
#endif

int gcr_crc32c_hw(void)
{
	return hw_ok();
}

uint32_t gcr_crc32c_update(uint32_t crc, const void *data, size_t n)
{
	if (hw_ok())
		return ~hw_run(~crc, data, n);
	return gcr_crc32c_update_sw(crc, data, n);
}

void gcr_crc32c_to_hex(uint32_t crc, char out[GCR_CRC32C_HEX])
{
	snprintf(out, GCR_CRC32C_HEX, "%08x", crc);
}

int gcr_crc32c_from_hex(const char *s, uint32_t *crc)
{
	if (s == NULL || strlen(s) != 8)
		return -1;
	uint32_t v = 0;
	for (int i = 0; i < 8; i++) {
		char ch = s[i];
		uint32_t d = ch >= '0' && ch <= '9' ? (uint32_t)(ch - '0') : ch >= 'a' && ch <= 'f' ? (uint32_t)(ch - 'a' + 10) : 16;
		if (d > 15)
			return -1;
		v = v << 4 | d;
	}
	*crc = v;
	return 0;
}
