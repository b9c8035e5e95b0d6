/* fuzz_criu: arbitrary bytes as `criu --version` output through gcr_criu_parse_version
 * (what a CRIU binary on the node prints is outside input); a version it accepts must
 * be non-negative. */
#include "gcr_criu.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size + 1);
	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	s[size] = '\0';
	struct gcr_err err = { 0, "" };
	int major = -1, minor = -1, patch = -1;
	int rc = gcr_criu_parse_version(s, &major, &minor, &patch, &err);
	if (rc == 0 && (major < 0 || minor < 0 || patch < 0))
		abort();
	if (rc != 0 && (rc != -EINVAL || err.msg[0] == '\0'))
		abort(); /* a refusal is -EINVAL with a message */
	free(s);
	return 0;
}
