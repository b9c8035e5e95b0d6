/* fuzz_cgroup: agent_cgroup_parse on arbitrary /proc/<pid>/cgroup text; checks
 * that a success always yields a well-formed pod UID and container ID. */
#include "agent_cgroup.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int all_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_cgroup_pod pod;
	struct gcr_err err = { 0, "" };
	int rc = agent_cgroup_parse((const char *)data, size, &pod, &err);
	if (rc == 0) {
		size_t u = strlen(pod.pod_uid), c = strlen(pod.container_id);
		if ((u != 36 && u != 32) || (c != 0 && c != 64) || !all_hex(pod.container_id, c))
			abort();
	} else if (err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL) {
		abort();
	}
	/* The whole input as one path, too. */
	rc = agent_cgroup_parse_path((const char *)data, size, &pod, NULL);
	if (rc != 0 && pod.pod_uid[0] != '\0')
		abort();
	return 0;
}
