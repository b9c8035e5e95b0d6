/* agent_gate: the readiness gate gpucr.dev/resident, written by the scaler's process (the one
 * identity allowed to patch pods/status) from the Checkpoints and Restores naming each pod. */
#ifndef AGENT_GATE_H
#define AGENT_GATE_H

#include <jansson.h>

#include "agent_informer.h"
#include "agent_kube.h"
#include "agent_leader.h"
#include "gcr_error.h"

struct agent_gate;

/* Borrows kube, inf (the process's mirrors, not yet started: the gate subscribes to pods,
 * Checkpoints and Restores; stopped before the gate is freed) and leader (only the leader
 * writes; NULL: always write). */
int agent_gate_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		   struct agent_gate **out, struct gcr_err *err) __attribute__((warn_unused_result));

/* Before start: also read the node agents' heartbeat notes on the Leases in lease_ns (listed
 * every resync), so that a pod the node reports suspended without a Checkpoint (for another
 * pod's room, docs/preemption.md) is not resident. */
int agent_gate_read_notes(struct agent_gate *g, const char *lease_ns, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Starts the worker (the mirrors are started by their owner). */
int agent_gate_start(struct agent_gate *g, struct gcr_err *err) __attribute__((warn_unused_result));

/* 1 once all three mirrors have listed. */
int agent_gate_synced(struct agent_gate *g);

/* NULL-safe; stops and joins the worker. */
void agent_gate_free(struct agent_gate *g);

#endif
