/* fuzz_evictmsg: arbitrary bytes as gcr-hold's line on the agent's hold socket and as a pod
 * object from the API, through agent_evictmsg; checks that a refusal says why, that a pod
 * read is always NUL-terminated within its fields, and that the Checkpoint name stays valid. */
#include "agent_evictmsg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_err err = { 0, "" };
	int rc = agent_evictmsg_parse_hold((const char *)data, size, &err);
	if (rc > 0 || (rc < 0 && err.msg[0] == '\0'))
		abort();
	json_t *pod = json_loadb((const char *)data, size, 0, NULL);
	struct agent_evictmsg_pod p;
	err.msg[0] = '\0';
	rc = agent_evictmsg_pod(pod, "gpucr.dev/shim", "abc", &p, &err);
	if (rc < 0 && err.msg[0] == '\0')
		abort();
	if (rc == 0) {
		if (strlen(p.ns) >= sizeof(p.ns) || strlen(p.name) >= sizeof(p.name) || p.ns[0] == '\0' ||
		    p.name[0] == '\0' || p.uid[0] == '\0')
			abort();
		char why[400], name[64];
		int d = agent_evictmsg_decide(&p, why, sizeof(why));
		if (d != 0 && d != 1)
			abort();
		agent_evictmsg_ck_name(p.name, p.uid, name, sizeof(name));
		size_t n = strlen(name);
		if (n > 63 || strncmp(name, "evict-", 6) != 0)
			abort();
		json_t *ck = agent_evictmsg_checkpoint(&p, "node", "gpucr.dev/v1alpha1");
		json_decref(ck);
	}
	json_decref(pod);
	return 0;
}
