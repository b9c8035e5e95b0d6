/* agent_leader: leader election among the agents on a coordination.k8s.io/v1 Lease:
 * acquire, renew and take over with resourceVersion-conditional writes, release on exit. */
#ifndef AGENT_LEADER_H
#define AGENT_LEADER_H

#include "agent_kube.h"
#include "gcr_error.h"

/* Default term of the leader Lease, in seconds: another agent takes over this long
 * after it last saw the Lease change. */
#define AGENT_LEADER_LEASE_S 15

struct agent_leader;

/* Borrows kube; copies ns, name and identity (unique per agent process). lease_s >= 1. */
int agent_leader_new(struct agent_kube *kube, const char *ns, const char *name, const char *identity,
		     int lease_s, struct agent_leader **out, struct gcr_err *err) __attribute__((warn_unused_result));

/* Starts the election thread (tries at once, then every lease_s/4). */
int agent_leader_start(struct agent_leader *l, struct gcr_err *err) __attribute__((warn_unused_result));

/* 1 while this agent holds the Lease and renewed it within two thirds of its term
 * (so it stops acting before anyone else may start), else 0. */
int agent_leader_is_leader(struct agent_leader *l);

/* Leadership terms won so far by this agent: a change means "rebuild from the API". */
unsigned agent_leader_terms(struct agent_leader *l);

const char *agent_leader_identity(const struct agent_leader *l);

/* NULL-safe; stops the thread and, if leader, releases the Lease (empty holder) so
 * another agent takes over at once. */
void agent_leader_free(struct agent_leader *l);

#endif
