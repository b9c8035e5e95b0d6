/* fuzz_roommsg: arbitrary bytes as a line a shim sends on the agent's registry socket and as a
 * process's environ, through agent_roommsg; checks that every accepted room request and wake is within
 * the bounds protocol.h gives, and that the environ's settings are always one of their values. */
#include "agent_roommsg.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "gcr/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_err err = { 0, "" };
	struct agent_roommsg_room r;
	int rc = agent_roommsg_parse((const char *)data, size, &r, &err);
	if (rc == AGENT_ROOMMSG_ROOM &&
	    (r.bytes < 1 || r.bytes > (unsigned long long)GCR_ROOM_MAX_BYTES || r.device < -1 ||
	     r.device > GCR_ROOM_MAX_DEVICE || r.id < 0))
		abort();
	if (rc == AGENT_ROOMMSG_WAKE &&
	    (r.waited_ms < 0 || r.waited_ms > GCR_WAKE_MAX_WAITED_MS || r.bytes != 0 || r.device != -1 || r.id < 0))
		abort();
	if (rc != AGENT_ROOMMSG_ROOM && rc != AGENT_ROOMMSG_WAKE && rc != AGENT_ROOMMSG_OTHER &&
	    (rc >= 0 || err.msg[0] == '\0'))
		abort(); /* a refusal always says why */
	struct agent_roommsg_env e;
	agent_roommsg_environ((const char *)data, size, &e);
	if ((e.overcommit != 0 && e.overcommit != 1) || (e.preemptible != 0 && e.preemptible != 1) ||
	    (e.bad != 0 && e.bad != 1))
		abort();
	return 0;
}
