/* agent_scaler: the cluster-level GPUResidency controller. Every agent watches the
 * GPUResidency objects; only the elected leader acts: it turns spec.replicas into
 * Checkpoint and Restore objects for chosen pods (which nodes' agents then run) and
 * writes status. All it knows it reads back from the API, so a new leader resumes. */
#ifndef AGENT_SCALER_H
#define AGENT_SCALER_H

#include "agent_informer.h"
#include "agent_kube.h"
#include "agent_leader.h"
#include "gcr_error.h"

/* Label on every Checkpoint and Restore the scaler creates: the GPUResidency's UID. */
#define AGENT_SCALER_LABEL_OWNER "gpucr.dev/residency-uid"
/* Label with the pod's UID, and annotations with the pod's name and the sequence number. */
#define AGENT_SCALER_LABEL_POD "gpucr.dev/pod-uid"
#define AGENT_SCALER_ANN_POD "gpucr.dev/pod"
#define AGENT_SCALER_ANN_SEQ "gpucr.dev/seq"
#define AGENT_SCALER_ANN_RESIDENCY "gpucr.dev/residency"
/* Finalizer the leader puts on every GPUResidency: deleting one resumes the pods it
 * suspended before it goes (docs/scale-to-zero.md, "Deleting a GPUResidency"). */
#define AGENT_SCALER_FINALIZER "gpucr.dev/resume-on-delete"
/* Annotation on the Restores made for that: their failures are the attempts counted. */
#define AGENT_SCALER_ANN_ON_DELETE "gpucr.dev/on-delete"

struct agent_scaler_cfg {
	const char *lease_namespace; /* where the nodes' heartbeat Leases (with activity) are */
	/* Label selector of the node agents' pods in lease_namespace: the leader creates the
	 * heartbeat Lease of each node they run on (the node identity cannot). NULL: none. */
	const char *agent_selector;
	int resync_ms;               /* each object looked at again this often when idle (default 2000) */
};

struct agent_scaler;

/* Borrows kube, inf (the process's mirrors, not yet started: it subscribes to the GPUResidency
 * objects; stopped before this is freed) and leader. */
int agent_scaler_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		     const struct agent_scaler_cfg *cfg, struct agent_scaler **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Starts the worker (the mirrors are started by their owner). */
int agent_scaler_start(struct agent_scaler *s, struct gcr_err *err) __attribute__((warn_unused_result));

/* NULL-safe; stops and joins (a pass in flight finishes its current request). */
void agent_scaler_free(struct agent_scaler *s);

#endif
