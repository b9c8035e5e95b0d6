/* agent_lease: the node heartbeat, a coordination.k8s.io/v1 Lease "gcr-agent-<node>"
 * renewed by this node's agent (carrying its pods' activity), and whether another node's agent is alive. */
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

/* Before start: renew every seconds (1 .. AGENT_LEASE_DURATION_S - 1) instead of
 * AGENT_LEASE_RENEW_S. The activity note is sampled at the same pace. */
void agent_lease_set_period(struct agent_lease *l, int seconds);

/* Before start: create (non-zero) the Lease when it is missing, as role all does (no
 * scaler Deployment). Default 0: the scaler creates it (agent_lease_create_idle) and
 * this node's agent only reads and updates it, logging once while it waits. */
void agent_lease_set_create(struct agent_lease *l, int create);

/* Before start: at each renewal note(data) gives the text (malloc'd, or NULL) of the
 * Lease's activity annotation (agent_scalemsg.h), which the leader's scaler reads. */
void agent_lease_set_note(struct agent_lease *l, char *(*note)(void *data), void *data);

/* Starts the renewal thread (the first renewal is attempted on it at once). */
int agent_lease_start(struct agent_lease *l, struct gcr_err *err) __attribute__((warn_unused_result));

/* NULL-safe; stops and joins the thread. The Lease is left to expire. */
void agent_lease_free(struct agent_lease *l);

/* The scaler's part: creates node's heartbeat Lease in ns with no holder (not live until
 * that node's agent renews it). 1 created, 0 it existed, -EIO (message in err). */
int agent_lease_create_idle(struct agent_kube *kube, const char *ns, const char *node, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Whether node's Lease in ns is live now (renewTime + leaseDurationSeconds in
 * the future): 1 live, 0 missing or expired, -EIO (message in err) when it
 * could not be read. */
int agent_lease_node_live(struct agent_kube *kube, const char *ns, const char *node, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* As agent_lease_node_live; when live, *note (may be NULL) gets a copy of the
 * Lease's activity annotation (malloc'd) or NULL when it has none. */
int agent_lease_node_activity(struct agent_kube *kube, const char *ns, const char *node, char **note,
			      struct gcr_err *err) __attribute__((warn_unused_result));

#endif
