/* agent_phase: status.phase of a Checkpoint or Restore (the CRDs' enum Pending, Running,
 * Succeeded, Failed), decoded once where the object's JSON is read so that everything after
 * compares an enum, not strings. A pod's status.phase uses the same names (its "Unknown" reads
 * as AGENT_PHASE_UNKNOWN). */
#ifndef AGENT_PHASE_H
#define AGENT_PHASE_H

enum agent_phase {
	AGENT_PHASE_NONE, /* no status.phase (0: a zeroed struct has none) */
	AGENT_PHASE_PENDING,
	AGENT_PHASE_RUNNING,
	AGENT_PHASE_SUCCEEDED,
	AGENT_PHASE_FAILED,
	AGENT_PHASE_UNKNOWN, /* a string that is none of the above (the CRDs refuse it), "" too */
};

/* The phase named s, exactly (case-sensitive, as the API server compares): NULL gives
 * AGENT_PHASE_NONE, any other string AGENT_PHASE_UNKNOWN. NONE and UNKNOWN stay apart because
 * callers treat an absent phase as "not started yet" and a foreign one as nothing. */
enum agent_phase agent_phase_of(const char *s);

/* The API name of p; "" for AGENT_PHASE_NONE, AGENT_PHASE_UNKNOWN and out-of-range values. */
const char *agent_phase_name(enum agent_phase p);

#endif
