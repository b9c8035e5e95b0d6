/* agent_controller: reconciles Checkpoint and Restore objects for pods on this
 * node: caches from three watches (the process's shared mirrors), workers that run C/R
 * through gcr_cr (different pods in parallel, one operation per pod at a time). */
#ifndef AGENT_CONTROLLER_H
#define AGENT_CONTROLLER_H

#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

#include "agent_informer.h"
#include "agent_kube.h"
#include "agent_metrics.h"
#include "agent_registry.h"
#include "agent_share.h"
#include "gcr_error.h"

/* How long a Restore whose Checkpoint does not exist waits (Pending) before it fails, by
 * default: objects applied together reach the agent in any order. */
#define AGENT_CONTROLLER_GRACE_S 30

/* Processes the overcommit policy holds suspended (agent_room), as a Checkpoint may take them over:
 * its owner's Checkpoint of a pod suspended for idling or for another pod holds it from then on,
 * and its Restore resumes it (docs/preemption.md). NULL hooks: none. */
struct agent_controller_adopt {
	/* Whether pid (with its start time) is held: 1 (with *data_only, the mode it was suspended
	 * in), 0 not, < 0 unknown. */
	int (*held)(void *data, pid_t pid, unsigned long long start, int *data_only);
	/* Releases pid from the policy (it stays suspended; the policy no longer resumes it): 0, or
	 * -ENOENT when it was not held (any more), -ETIMEDOUT. */
	int (*release)(void *data, pid_t pid, unsigned long long start, int *data_only, int timeout_ms);
	void *data;
};

struct agent_controller_cfg {
	const char *node_name;
	const char *lease_namespace; /* where other nodes' heartbeat Leases are read */
	const char *socket_dir; /* shims' control sockets */
	const char *record_dir; /* the agent's own records (agent_record), root only */
	int restore_grace_s;    /* 0: AGENT_CONTROLLER_GRACE_S */
	/* Checkpoints with action Image: <images_dir>/<namespace>/<pod>/<name>, images_keep of
	 * them per pod (NULL, 0: /var/lib/gcr/images, 2). */
	const char *images_dir;
	int images_keep;
	/* images_dir is one filesystem every node shares (the operator says so): a Restore takes an
	 * image another node wrote, and retention removes only this node's (the manifest's node). */
	int images_shared;
	/* This node's kubelet, https://HOST:PORT (its checkpoint API: an Image with spec.cpuCheckpoint
	 * Kubelet, restorable into a new pod); NULL or "": none. */
	const char *kubelet_url;
	/* The node's checkpoint-image registry on 127.0.0.1 (agent_ocireg; chart eviction.restore):
	 * a Kubelet image that no eviction made gets status.image.reference there, the checkpoint
	 * image a user's new pod names. 0: none. */
	int registry_port;
	/* Shared images' keys (gcr_imagemac: a directory holding "key" and maybe "previous", read
	 * at every use so that a rotated Secret takes effect): every image written is signed and
	 * every Restore refuses an image not signed by one of them. NULL: neither. */
	const char *images_key_dir;
	/* Test hook (GCR_AGENT_TEST_PAUSE): "before-cr" or "after-cr" makes the
	 * worker sleep pause_s seconds at that point of a Checkpoint, "before-rs" before
	 * a Restore's resume, "after-rs" after it (before its final status); NULL: none. */
	const char *test_pause;
	int pause_s;
	/* Operations run at once, on different pods (one pod's are serialised); 0: 4. */
	int max_parallel;
	/* Each namespace's share of the workers (agent_share, capacity max_parallel; borrowed): an
	 * operation of a namespace that holds its whole share waits (an Event on its object, at most
	 * once a minute per namespace) until one of that namespace's own ends, so a tenant whose
	 * operations hang pins no more than its share. NULL: none. */
	struct agent_share *workers;
	/* The device plugin's socket root (<root>/<id>: each allocation's socket directory, where
	 * the kubelet's route writes a pod's image-<uid>); NULL: none. The sweep removes what no
	 * Image owns there. */
	const char *alloc_root;
	/* Where the kubelet writes its checkpoint archives (NULL: /var/lib/kubelet/checkpoints). */
	const char *kubelet_checkpoints;
	/* "/proc" or a test tree (NULL: /proc): <pid>/cgroup names a process's pod. */
	const char *proc_root;
	struct agent_controller_adopt adopt;
};

struct agent_controller;

/* Borrows kube, inf, registry and metrics; they must outlive the controller. inf: the process's
 * mirrors, not yet started: the controller subscribes to this node's pods, the Checkpoints and
 * the Restores, and takes the set's lock as its own (agent_ctl.h says the lock order); they are
 * stopped before the controller is freed (and not started when this fails). */
int agent_controller_new(struct agent_kube *kube, struct agent_informers *inf, struct agent_registry *reg,
			 struct agent_metrics *m, const struct agent_controller_cfg *cfg, struct agent_controller **out,
			 struct gcr_err *err) __attribute__((warn_unused_result));

/* Starts the workers (the mirrors are started by their owner); they act once the three caches
 * are listed. */
int agent_controller_start(struct agent_controller *c, struct gcr_err *err);

/* Stops taking new work; each worker finishes its operation in flight (an
 * operation is bounded by its timeout), then the threads are joined. */
void agent_controller_stop(struct agent_controller *c);

/* A deep copy of this node's pod with metadata.uid uid from the pods watch (caller decrefs),
 * or NULL when not seen. */
json_t *agent_controller_pod_by_uid(struct agent_controller *c, const char *uid);

/* Waits, on the Checkpoints watch (no API request), until Checkpoint ns/name is final or the wall
 * clock passes until_s: 1 Succeeded (msg: its image's path), 0 Failed, deleted before it ended or
 * not final in time (msg says which), -ECANCELED once *stop (may be NULL) or the controller
 * stops. A Checkpoint not yet in the cache (just created) is waited for. */
int agent_controller_checkpoint_wait(struct agent_controller *c, const char *ns, const char *name, double until_s,
				     atomic_int *stop, char *msg, size_t len);

/* An Event on this node's pod with uid (best effort: logged when it cannot be posted). */
void agent_controller_pod_event(struct agent_controller *c, const char *uid, const char *type, const char *reason,
				const char *action, const char *note);

/* NULL-safe; stops first if needed. */
void agent_controller_free(struct agent_controller *c);

#endif
