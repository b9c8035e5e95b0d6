/* agent_replace: the replacement pod of an evicted pod's owner restored from the eviction's
 * image (docs/preemption.md, "The replacement pod"). Run by the scaler's leader: it holds pods
 * carrying the scheduling gate gpucr.dev/restore until their owner's eviction Checkpoint is
 * final, points them at that image on its node's registry (agent_ocireg), and creates the
 * Restore that gives the restored process its GPU data. */
#ifndef AGENT_REPLACE_H
#define AGENT_REPLACE_H

#include "agent_informer.h"
#include "agent_kube.h"
#include "agent_leader.h"
#include "gcr_error.h"

/* The scheduling gate a pod template carries to be held for its image. */
#define AGENT_REPLACE_GATE "gpucr.dev/restore"
/* Annotation on the patched pod: the Checkpoint it is restored from. */
#define AGENT_REPLACE_ANN_FROM "gpucr.dev/restore-from"
/* Labels of the contract: the owner's uid on the Checkpoint, the opt-in on the pod. */
#define AGENT_REPLACE_LABEL_OWNER "gpucr.dev/owner-uid"
#define AGENT_REPLACE_LABEL_EVICT "gpucr.dev/evict"

struct agent_replace_cfg {
	int registry_port; /* the nodes' registries: 127.0.0.1:<port> (agent_ocireg) */
	/* How long a gated pod waits, in seconds, for an eviction Checkpoint in progress (or about
	 * to be made: a pod of its owner being deleted), and a restored pod for its container. */
	int wait_s;
	/* The images directory is one filesystem on every node (--images-shared): the replacement
	 * is not pinned to the image's node; any node's registry serves the image. */
	int images_shared;
};

struct agent_replace;

/* Borrows kube, inf (the process's mirrors, not yet started: it subscribes to pods, Checkpoints
 * and Restores; stopped before this is freed) and leader (only the leader writes). */
int agent_replace_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_leader *leader,
		      const struct agent_replace_cfg *cfg, struct agent_replace **out, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* Starts the worker (the mirrors are started by their owner). */
int agent_replace_start(struct agent_replace *r, struct gcr_err *err) __attribute__((warn_unused_result));
/* NULL-safe; stops and joins the worker. */
void agent_replace_free(struct agent_replace *r);

#endif
