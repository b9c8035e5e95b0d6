/* test_agent_phase: status.phase names to the enum and back; an absent phase (NULL) apart from
 * a string that names none, and no name matched but exactly. */
#include "agent_phase.h"
#include "util.h"

int main(void)
{
	/* Round trip of every phase the CRDs allow. */
	for (int p = AGENT_PHASE_PENDING; p < AGENT_PHASE_UNKNOWN; p++) {
		const char *n = agent_phase_name((enum agent_phase)p);
		CHECK(n[0] != '\0');
		CHECK(agent_phase_of(n) == (enum agent_phase)p);
	}
	CHECK_STR(agent_phase_name(AGENT_PHASE_PENDING), "Pending");
	CHECK_STR(agent_phase_name(AGENT_PHASE_RUNNING), "Running");
	CHECK_STR(agent_phase_name(AGENT_PHASE_SUCCEEDED), "Succeeded");
	CHECK_STR(agent_phase_name(AGENT_PHASE_FAILED), "Failed");

	/* Absent: NONE, which callers read as "not started yet"; a zeroed struct has it too. */
	CHECK(agent_phase_of(NULL) == AGENT_PHASE_NONE);
	CHECK(AGENT_PHASE_NONE == 0);

	/* Anything else: UNKNOWN, never a phase by a looser match. */
	const char *bad[] = { "", "succeeded", "SUCCEEDED", "failed", "pending", "running", "Succeeded ",
			      " Failed", "Succ", "Succeededx", "Unknown", "None" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(agent_phase_of(bad[i]) == AGENT_PHASE_UNKNOWN);

	/* No name for NONE, UNKNOWN or a value out of range (log messages print ""). */
	CHECK_STR(agent_phase_name(AGENT_PHASE_NONE), "");
	CHECK_STR(agent_phase_name(AGENT_PHASE_UNKNOWN), "");
	CHECK_STR(agent_phase_name((enum agent_phase)42), "");
	CHECK_STR(agent_phase_name((enum agent_phase)-1), "");
	return test_summary("test_agent_phase");
}
