/* agent_evictmsg: what eviction imaging reads from outside and decides from it: gcr-hold's
 * line, the pod object (opt-in, deletion, cause), the time estimate, the Checkpoint it makes. */
#ifndef AGENT_EVICTMSG_H
#define AGENT_EVICTMSG_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"

/* The pod's opt-in: label gpucr.dev/evict: image. */
#define AGENT_EVICTMSG_LABEL "gpucr.dev/evict"
#define AGENT_EVICTMSG_LABEL_VALUE "image"
/* Annotation gpucr.dev/evict-on: any-deletion: every deletion images, not only preemption or drain. */
#define AGENT_EVICTMSG_ON_KEY "gpucr.dev/evict-on"
#define AGENT_EVICTMSG_ON_ANY "any-deletion"
/* The Checkpoint's labels and annotation (docs/preemption.md, "Eviction without loss"). */
#define AGENT_EVICTMSG_L_EVICTION "gpucr.dev/eviction"
#define AGENT_EVICTMSG_L_POD "gpucr.dev/evicted-pod"
#define AGENT_EVICTMSG_L_OWNER "gpucr.dev/owner-uid"
#define AGENT_EVICTMSG_L_NODE "gpucr.dev/node"
#define AGENT_EVICTMSG_A_CAUSE "gpucr.dev/evict-cause"
/* gcr-hold's socket: this name in the registry socket's directory (which the device plugin
 * mounts into every gpucr.dev/shim container). */
#define AGENT_EVICTMSG_SOCKET_NAME "evict.sock"
/* gcr-hold's one line: {"op":"evict-hold","v":1}; nothing else is accepted. */
#define AGENT_EVICTMSG_OP "evict-hold"
#define AGENT_EVICTMSG_VERSION 1
/* Longest line gcr-hold sends (bytes); its line is 26. */
#define AGENT_EVICTMSG_MAX_LINE 256

/* 0 when line (len bytes, no newline) is exactly a hold request of this version; -EMSGSIZE,
 * -EBADMSG (not a JSON object, a field missing, of the wrong type or unknown) or -EPROTO (another
 * op or version) with err saying which. */
int agent_evictmsg_parse_hold(const char *line, size_t len, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* How a hold ended: the "outcome" of the reply gcr-hold prints. */
enum agent_evictmsg_outcome {
	AGENT_EVICTMSG_NOTHING = 0, /* not opted in, not preemption or drain, the policy off */
	AGENT_EVICTMSG_WRITTEN,     /* the image is whole */
	AGENT_EVICTMSG_FAILED,      /* the Checkpoint failed, or was not final in time */
	AGENT_EVICTMSG_NO_TIME,     /* the grace period left is shorter than the estimate: no image */
};
const char *agent_evictmsg_outcome_name(enum agent_evictmsg_outcome o);

/* The reply line, '\n'-terminated: {"outcome":"<name>","message":"<message>"} (caller frees;
 * NULL when out of memory). */
char *agent_evictmsg_reply(enum agent_evictmsg_outcome o, const char *message);

enum agent_evictmsg_cause {
	AGENT_EVICTMSG_CAUSE_NONE = 0,
	AGENT_EVICTMSG_CAUSE_PREEMPTION, /* DisruptionTarget, reason PreemptionByScheduler */
	AGENT_EVICTMSG_CAUSE_EVICTION,   /* DisruptionTarget, reason EvictionByEvictionAPI (drain) */
	AGENT_EVICTMSG_CAUSE_ANY,        /* the any-deletion annotation */
};
/* "PreemptionByScheduler", "EvictionByEvictionAPI", "AnyDeletion" or "" (none). */
const char *agent_evictmsg_cause_name(enum agent_evictmsg_cause c);

/* What a pod object says, as far as eviction imaging is concerned. */
struct agent_evictmsg_pod {
	char ns[64], name[254], uid[40], owner_uid[40];
	char container[64]; /* the container asking for the GCR resource ("" none) */
	int opted;          /* the label */
	int any_deletion;   /* the annotation */
	long long deletion; /* metadata.deletionTimestamp, Unix seconds; 0: not being deleted */
	enum agent_evictmsg_cause cause;
};

/* Reads pod (an API object). resource: the GCR extended resource (gpucr.dev/shim); cid: the
 * container id the hold ran in ("" unknown), preferred when several containers ask for the
 * resource. -EBADMSG when metadata.namespace, name or uid is missing or too long, or
 * deletionTimestamp is not RFC 3339. */
int agent_evictmsg_pod(json_t *pod, const char *resource, const char *cid, struct agent_evictmsg_pod *out,
		       struct gcr_err *err) __attribute__((warn_unused_result));

/* 1: image it; 0: nothing, why (len bytes) says why in a sentence. */
int agent_evictmsg_decide(const struct agent_evictmsg_pod *p, char *why, size_t len);

/* Seconds an image of bytes GPU bytes needs, conservatively: fixed_s (the CRIU dump of the
 * container, the kubelet's archive, the copy) plus bytes at rate_mib_s MiB/s. */
double agent_evictmsg_needed_s(unsigned long long bytes, double rate_mib_s, double fixed_s);

/* "evict-<pod name, cut>-<first 8 hex of uid>", at most 63 bytes, a valid object name
 * (out needs 64 bytes). */
void agent_evictmsg_ck_name(const char *pod, const char *uid, char *out, size_t len);

/* The Checkpoint of docs/preemption.md's contract (caller decrefs; NULL when out of memory). */
json_t *agent_evictmsg_checkpoint(const struct agent_evictmsg_pod *p, const char *node, const char *api_version);

#endif
