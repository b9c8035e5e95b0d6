/* fuzz_quantity: arbitrary bytes as a pod's resource quantity through agent_quantity; an
 * accepted one is below 2^63, a refusal changes nothing, and its decimal form parses back to
 * itself. */
#include "agent_quantity.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	unsigned long long v = 42, w = 0;
	int rc = agent_quantity_parse((const char *)data, size, &v);
	if (rc < 0 && (v != 42 || (rc != -EINVAL && rc != -ERANGE)))
		abort();
	if (rc == 0) {
		if (v >= 1ULL << 63)
			abort();
		char s[32];
		int n = snprintf(s, sizeof(s), "%llu", v);
		if (agent_quantity_parse(s, (size_t)n, &w) != 0 || w != v)
			abort();
	}
	return 0;
}
