/* agent_lease: the node heartbeat, a coordination.k8s.io/v1 Lease "gcr-agent-<node>"
 * renewed by this node's agent, and the check whether another node's agent is alive. */
#ifndef AGENT_LEASE_H
#define AGENT_LEASE_H

#include "agent_kube.h"
#include "gcr_error.h"

/* A Lease not renewed for this long, in seconds, means no agent serves its node. */
#define AGENT_LEASE_DURATION_S 40
/* How often the heartbeat renews it, in seconds. */
#define AGENT_LEASE_RENEW_S 10

struct agent_lease;

/* Borrows kube (it must outlive the heartbeat); copies ns and node. */
int agent_lease_new(struct agent_kube *kube, const char *ns, const char *node, struct agent_lease **out,
		    struct gcr_err *err) __attribute__((warn_unused_result));

/* Starts the renewal thread (the first renewal is attempted on it at once). */
int agent_lease_start(struct agent_lease *l, struct gcr_err *err) __attribute__((warn_unused_result));

/* NULL-safe; stops and joins the thread. The Lease is left to expire. */
void agent_lease_free(struct agent_lease *l);

/* Whether node's Lease in ns is live now (renewTime + leaseDurationSeconds in
 * the future): 1 live, 0 missing or expired, -EIO (message in err) when it
 * could not be read. */
int agent_lease_node_live(struct agent_kube *kube, const char *ns, const char *node, struct gcr_err *err)
	__attribute__((warn_unused_result));

#endif
