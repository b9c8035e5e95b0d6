/* agent_activity: per pod, when its shimmed processes last called the driver, from the
 * shims' existing call counters read at heartbeat time (nothing added to the hot path). */
#ifndef AGENT_ACTIVITY_H
#define AGENT_ACTIVITY_H

#include "agent_registry.h"

struct agent_activity;

/* Borrows reg; copies socket_dir. NULL when out of memory. */
struct agent_activity *agent_activity_new(struct agent_registry *reg, const char *socket_dir);
void agent_activity_free(struct agent_activity *a);

/* Samples every registered process now and returns the activity note
 * (agent_scalemsg.h) for this node's Lease, malloc'd, or NULL. Each pod with a
 * registered process is listed (so the leader knows it has the shim); a process's
 * counter that grew since the last sample makes now its last activity. Takes
 * void * so it can be the heartbeat's note callback. */
char *agent_activity_note(void *a);

#endif
