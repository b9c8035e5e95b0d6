/* agent_evict: images an opted-in pod's GPU process when the pod is deleted for preemption or
 * drain (docs/preemption.md, "Eviction without loss"): gcr-hold, the pod's preStop hook, holds
 * the kubelet's SIGTERM on this module's socket while a Checkpoint of the pod is carried out. */
#ifndef AGENT_EVICT_H
#define AGENT_EVICT_H

#include <stdatomic.h>
#include <stddef.h>

#include "agent_kube.h"
#include "agent_metrics.h"
#include "agent_registry.h"
#include "agent_share.h"
#include "gcr_error.h"

/* Defaults of struct agent_evict_cfg's numbers (0 there means these). */
#define AGENT_EVICT_RATE_MIB_S 200 /* GPU data written, MiB/s: well under a local disk's rate */
#define AGENT_EVICT_FIXED_S 15     /* the kubelet's CRIU dump of the container, its archive, the copy */
#define AGENT_EVICT_MAX_HOLDS 64   /* connections served at once; more are answered "nothing" */

struct agent_evict_cfg {
	const char *socket_path;   /* gcr-hold's socket (the registry's directory, AGENT_EVICTMSG_SOCKET_NAME) */
	const char *proc_root;     /* "/proc" or a test tree: <pid>/cgroup names the caller's pod */
	const char *node_name;
	const char *resource_name; /* the device plugin's resource (gpucr.dev/shim) */
	const char *api_version;   /* the Checkpoint's (gpucr.dev/v1alpha1) */
	int enabled;               /* 0: every hold is answered "nothing" at once */
	double rate_mib_s;
	double fixed_s;
	/* Each pod's share of the holds (agent_share, capacity AGENT_EVICT_MAX_HOLDS; borrowed):
	 * a pod past it is answered "nothing" alone, the others' holds go on. NULL: none. */
	struct agent_share *share;
};

/* This node's pods and Checkpoints as another role watches them (the controller, wired by the
 * daemon): eviction reads them, tells pods' owners through them and waits on them, and so
 * depends on no other role and polls nothing. */
struct agent_evict_hooks {
	/* A copy of this node's pod with metadata.uid uid (caller decrefs), NULL when not seen. */
	json_t *(*by_uid)(void *data, const char *uid);
	/* An Event on that pod (best effort). */
	void (*event)(void *data, const char *uid, const char *type, const char *reason, const char *action,
		      const char *note);
	/* Until Checkpoint ns/name is final or the wall clock passes until_s: 1 Succeeded (msg: the
	 * image's path), 0 Failed, deleted or late (msg says which), -ECANCELED once *stop. */
	int (*ck_wait)(void *data, const char *ns, const char *name, double until_s, atomic_int *stop, char *msg,
		       size_t len);
	void *data;
};

struct agent_evict;

/* Borrows kube, hooks (copied; its data must outlive it), reg (the pod's processes) and m (may be
 * NULL); they must outlive it. Listens on cfg->socket_path (open to every local user: a caller is
 * only ever about its own pod, named by its peer credentials). */
int agent_evict_new(struct agent_kube *kube, const struct agent_evict_hooks *hooks, struct agent_registry *reg,
		    struct agent_metrics *m, const struct agent_evict_cfg *cfg, struct agent_evict **out,
		    struct gcr_err *err) __attribute__((warn_unused_result));

/* Starts the accept thread. */
int agent_evict_start(struct agent_evict *e, struct gcr_err *err) __attribute__((warn_unused_result));

/* Stops taking holds; holds in flight are closed unanswered within a poll period (gcr-hold
 * asks again, and the next agent waits for the Checkpoint made); removes the socket. NULL-safe. */
void agent_evict_free(struct agent_evict *e);

#endif
