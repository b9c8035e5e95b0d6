/* gcr_uuid: GPU UUID text (gcr_uuid.h). */
#include "gcr_uuid.h"

#include <string.h>

int gcr_uuid_parse(const char *s, unsigned char out[16])
{
	if (s == NULL || strncmp(s, "GPU-", 4) != 0)
		return -1;
	size_t n = 0;
	for (const char *c = s + 4; *c != '\0'; c++) {
		if (*c == '-')
			continue;
		int v = *c >= '0' && *c <= '9' ? *c - '0' : *c >= 'a' && *c <= 'f' ? *c - 'a' + 10
			: *c >= 'A' && *c <= 'F' ? *c - 'A' + 10 : -1;
		if (v < 0 || n >= 32)
			return -1;
		out[n / 2] = (unsigned char)(n % 2 == 0 ? v << 4 : out[n / 2] | v);
		n++;
	}
	return n == 32 ? 0 : -1;
}

int gcr_uuid_valid(const char *s)
{
	unsigned char b[16];
	return s != NULL && strnlen(s, GCR_UUID_TEXT_LEN) < GCR_UUID_TEXT_LEN && gcr_uuid_parse(s, b) == 0;
}
