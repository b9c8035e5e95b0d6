/* agent_phase: phase names to the enum and back (agent_phase.h). */
#include "agent_phase.h"

#include <string.h>

static const char *const phase_names[] = { "", "Pending", "Running", "Succeeded", "Failed", "" };

enum agent_phase agent_phase_of(const char *s)
{
	if (s == NULL)
		return AGENT_PHASE_NONE;
	for (int p = AGENT_PHASE_PENDING; p < AGENT_PHASE_UNKNOWN; p++)
		if (strcmp(s, phase_names[p]) == 0)
			return (enum agent_phase)p;
	return AGENT_PHASE_UNKNOWN;
}

const char *agent_phase_name(enum agent_phase p)
{
	return (unsigned)p <= AGENT_PHASE_UNKNOWN ? phase_names[p] : "";
}
