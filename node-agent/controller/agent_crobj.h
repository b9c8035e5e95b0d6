/* agent_crobj: a Checkpoint or Restore object as the controller may use it, decoded and checked
 * field by field. Users write these objects, status included (RBAC cannot keep a tenant off its
 * own objects' status), so status is decoded only as a hint: a phase that says "finished, leave
 * it", a node that says "another agent's". What the agent acts on comes from its own record
 * (agent_record) and the node (agent_registry), never from status. */
#ifndef AGENT_CROBJ_H
#define AGENT_CROBJ_H

#include <jansson.h>

#include "agent_phase.h"
#include "gcr_driver.h"
#include "gcr_error.h"

/* Buffer sizes with the NUL: a namespace or container name is a DNS label (63), an object,
 * pod or node name a DNS subdomain (253); a uid is a UUID (36), bounded a little above. */
#define AGENT_CROBJ_NS_LEN 64
#define AGENT_CROBJ_NAME_LEN 254
#define AGENT_CROBJ_UID_LEN 64
/* Restore spec.gpuPairs: at most this many (the CRD's maxItems). */
#define AGENT_CROBJ_MAX_PAIRS 16

/* The finalizer the node agent keeps on a Checkpoint while its processes are suspended by it. */
#define AGENT_CROBJ_FINALIZER "gpucr.dev/resume-on-delete"

enum agent_crobj_kind { AGENT_CROBJ_CHECKPOINT, AGENT_CROBJ_RESTORE };

/* Checkpoint spec.action: Suspend (the default) keeps the processes alive with their GPU data in
 * host memory; Image writes an image of them on the node and leaves them running. */
enum agent_crobj_action { AGENT_ACTION_SUSPEND, AGENT_ACTION_IMAGE };

struct agent_crobj {
	enum agent_crobj_kind kind;
	/* metadata: written by the API server (uid) or checked by it */
	char ns[AGENT_CROBJ_NS_LEN], name[AGENT_CROBJ_NAME_LEN], uid[AGENT_CROBJ_UID_LEN];
	char resource_version[AGENT_CROBJ_UID_LEN];
	int deleting;  /* metadata.deletionTimestamp set */
	int finalizer; /* AGENT_CROBJ_FINALIZER among metadata.finalizers */
	/* spec (immutable by the CRD): a Checkpoint's podName, a Restore's checkpointName */
	char target[AGENT_CROBJ_NAME_LEN];
	char container[AGENT_CROBJ_NS_LEN]; /* Checkpoint spec.containerName, "" for all */
	int keep_context;                   /* Checkpoint spec.keepContext */
	enum agent_crobj_action action;     /* Checkpoint spec.action */
	/* Checkpoint spec.cpuCheckpoint Kubelet (action Image): the CPU side by the kubelet's
	 * checkpoint API (the container runtime's), restorable into a new pod; 0: the agent's CRIU */
	int cpu_kubelet;
	/* Restore spec.podName: the new pod (created from the runtime's checkpoint) whose restored
	 * process gets the GPU data of an Image; "" when absent (a Suspend's own processes). */
	char pod[AGENT_CROBJ_NAME_LEN];
	/* Restore spec.targetGPU ("" when absent) or spec.gpuPairs: resume onto other GPUs of the
	 * node (gcr_cr_opts.target_gpu / gpu_pairs). */
	char target_gpu[GCR_DRIVER_UUID_LEN];
	struct gcr_gpu_pair pairs[AGENT_CROBJ_MAX_PAIRS];
	size_t npairs;
	int timeout_s;                      /* spec.timeoutSeconds, 0 when absent */
	/* status: hints only */
	enum agent_phase phase; /* AGENT_PHASE_UNKNOWN (a string the CRD would refuse): treated as none */
	char node[AGENT_CROBJ_NAME_LEN]; /* status.nodeName, "" when absent or malformed */
};

/* Decodes obj. -EINVAL with err set when metadata (namespace, name, uid) is missing or
 * malformed (the object cannot be named, nothing is done about it), or when spec is (the
 * object gets Failed InvalidSpec: the CRD's schema should have refused it). A malformed
 * status never fails: its fields read as absent. */
int agent_crobj_decode(json_t *obj, enum agent_crobj_kind kind, struct agent_crobj *o, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Whether s (len bytes, no NUL counted) is a DNS-1123 label (max 63) or subdomain (max 253). */
int agent_crobj_is_label(const char *s);
int agent_crobj_is_subdomain(const char *s);

/* Whether s is a uid or resourceVersion: 1..63 of [A-Za-z0-9-] (also safe as a file name). */
int agent_crobj_is_token(const char *s);

#endif
