/* agent_activity: per pod, when its shimmed processes last called the driver, from the
 * shims' existing call counters read at heartbeat time (nothing added to the hot path). */
#ifndef AGENT_ACTIVITY_H
#define AGENT_ACTIVITY_H

#include "agent_registry.h"

/* How long one sample waits for all the shims' replies together, in ms. A shim answers
 * stats from its control thread in well under 1 ms; 500 ms leaves room for a loaded node
 * and keeps the heartbeat (renewed every 10 s, expiring after 40 s) on time whatever the
 * number of stopped processes. */
#define AGENT_ACTIVITY_STATS_MS 500

struct agent_activity;

/* Borrows reg; copies socket_dir. NULL when out of memory. */
struct agent_activity *agent_activity_new(struct agent_registry *reg, const char *socket_dir);
void agent_activity_free(struct agent_activity *a);

/* Before the first sample: wait ms (> 0) for the replies instead of AGENT_ACTIVITY_STATS_MS. */
void agent_activity_set_stats_ms(struct agent_activity *a, int ms);

/* Samples every registered process now (all at once, waiting at most the stats bound
 * for their replies; one that does not answer keeps its last counter) and returns the activity note
 * (agent_scalemsg.h) for this node's Lease, malloc'd, or NULL. Each pod with a
 * registered process is listed (so the leader knows it has the shim), with how many of
 * its processes the shims report in each state (the same stats reply; one that does not
 * answer counts as unknown); a process's counter that grew since the last sample makes
 * now its last activity. Takes
 * void * so it can be the heartbeat's note callback. */
char *agent_activity_note(void *a);

/* When pid was last seen calling the driver, in seconds since the epoch, as of the last sample
 * (0: not sampled yet). NULL-safe (0). */
double agent_activity_last(struct agent_activity *a, pid_t pid);

#endif
