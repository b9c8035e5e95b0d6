/* fuzz_ctrdump: arbitrary bytes as /proc/<pid>/status through gcr_ctrdump_parse_status (the
 * status of a workload's process is outside input: its name line is the workload's choice), and
 * as /proc/<pid>/mountinfo through gcr_ctrdump_externals (a privileged workload's mounts are its
 * own choice); each line it writes must be an "external mnt[P]:P" line.
 * The input is copied to a buffer of exactly its size, so a read past it is caught; what the
 * parser accepts must be in range. */
#include "gcr_ctrdump.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *s = malloc(size ? size : 1);
	if (s == NULL)
		return 0;
	memcpy(s, data, size);
	struct gcr_err err = { 0, "" };
	struct gcr_ctrdump_status st;
	int rc = gcr_ctrdump_parse_status(s, size, &st, &err);
	if (rc == 0 && (st.ppid < 0 || st.nspid_levels < 0 || st.nspid_levels > 32 ||
			(st.nspid_levels > 0 && (st.nspid_outer < 1 || st.nspid_inner < 1))))
		abort();
	if (rc != 0 && (rc != -EINVAL || err.msg[0] == '\0'))
		abort(); /* a refusal is -EINVAL with a message */
	char out[2048];
	int n = -1;
	rc = gcr_ctrdump_externals(s, size, out, sizeof(out), &n, &err);
	if (rc == 0) {
		int lines = 0;
		for (const char *p = out; *p != '\0'; lines++) {
			const char *nl = strchr(p, '\n');
			if (nl == NULL || strncmp(p, "external mnt[/", 14) != 0)
				abort();
			p = nl + 1;
		}
		if (lines != n)
			abort();
	} else if ((rc != -EINVAL && rc != -ENOSPC) || err.msg[0] == '\0') {
		abort();
	}
	free(s);
	return 0;
}
