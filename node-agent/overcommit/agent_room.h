/* agent_room: GPU memory overcommit by suspend (docs/preemption.md): a shim's "room" request
 * makes the agent suspend lower-priority processes on that GPU, just enough of them; they are
 * resumed, highest priority first, once the process they were suspended for is gone, idles (it
 * is suspended then, and woken by its next call), or once their GPU has had room for them for a
 * while (the requester freed memory). */
#ifndef AGENT_ROOM_H
#define AGENT_ROOM_H

#include <jansson.h>
#include <sys/types.h>

#include "agent_activity.h"
#include "agent_metrics.h"
#include "agent_registry.h"
#include "agent_roompolicy.h"
#include "agent_share.h"
#include "gcr_error.h"

/* Defaults of struct agent_room_cfg's numbers (0 there means these). */
#define AGENT_ROOM_TIMEOUT_MS 10000 /* each suspend and resume: the gate and the driver's lock */
#define AGENT_ROOM_CHECK_MS 500     /* how often held processes are looked at */
#define AGENT_ROOM_RETURN_MS 2000   /* room seen free this long gives a victim back (return_ms) */
#define AGENT_ROOM_QUEUE 64         /* room requests waiting at most; more are answered -EBUSY */
#define AGENT_ROOM_EVENTS 64        /* Events one decision posts at most (two per victim) */
/* The gate's bound when an idle requester is suspended (ms): a thread inside a long call (a
 * synchronize on a long kernel) is not idle; the worker must not wait for it long. */
#define AGENT_ROOM_IDLE_GATE_MS 2000
/* Bytes asked beyond the allocation, its size rounded up to this (the VMM granularity). */
#define AGENT_ROOM_GRANULE (2ULL << 20)
/* A requester others were suspended for must show the room used (NVML: its bytes on that GPU
 * grown by what it asked, less a granule) within this long after the grant (ms), else it loses
 * its priority for unused_backoff_ms. The shim allocates again as soon as the grant arrives. */
#define AGENT_ROOM_USE_MS 3000
#define AGENT_ROOM_UNUSED_BACKOFF_MS 60000

struct agent_room_cfg {
	const char *socket_dir; /* the shims' control sockets (gcr_cr) */
	const char *record_dir; /* <record_dir>/overcommit/<pid>.json: who is held for whom (root only) */
	const char *proc_root;  /* <proc_root>/meminfo: the host memory an idle requester's buffers need;
				 * NULL or unreadable: not checked */
	int enabled;            /* 0: every request is refused (the policy is off) */
	int timeout_ms;
	int check_ms;
	unsigned long long margin; /* bytes asked beyond the allocation (rounded), for the driver's own */
	/* 1: victims are suspended data only (gcr_cr's GCR_CR_DATA_ONLY: their buffers leave the GPU,
	 * their context stays; a suspend and a resume each skip the driver's checkpoint step, about
	 * 0.5 s and 1 s for 16 GiB on the H100) and their bytes are what the shim holds on its fast
	 * path; 0: the whole process leaves the GPU (NVML's bytes). */
	int data_only;
	/* 1: a process whose pod Kubernetes does not show (outside pods, or the API not listed yet)
	 * is judged by its environment (GCR_OVERCOMMIT, GCR_PRIORITY, GCR_PREEMPTIBLE); 0: it takes
	 * no part (the chart's setting: there the device plugin gives every container
	 * GCR_OVERCOMMIT=1, and only the pod's label opts in). */
	int trust_env;
	/* A held process whose requester still runs is resumed once its GPU has had its bytes plus
	 * the margin free for this long (ms): the requester freed memory. The wait keeps an
	 * allocator that frees and soon allocates again from suspending the victim at each turn.
	 * 0 means AGENT_ROOM_RETURN_MS; negative: only when the requester ends. */
	int return_ms;
	/* A requester (a process others are held for) that has made no driver call for this long
	 * (ms) is suspended itself, so that they resume by priority; its next call wakes it (the
	 * shim's "wake"), which suspends them again. 0: off. The calls are the shim's counters,
	 * read every check_ms: an idle time is known to within check_ms. */
	int idle_ms;
	/* A pod (a process outside pods) that was given room by suspends and did not use it within
	 * AGENT_ROOM_USE_MS loses its priority this long (ms): its requests are refused, and the
	 * processes held for it resume at once. 0 means AGENT_ROOM_UNUSED_BACKOFF_MS; negative: off. */
	int unused_backoff_ms;
	/* Which namespaces may take room from which (copied); NULL: each from itself only. */
	const struct agent_roompolicy *policy;
	/* Each pod's share of the queued room requests (agent_share, capacity AGENT_ROOM_QUEUE;
	 * borrowed): past it, that pod's request is refused at once (-EBUSY). NULL: the queue only. */
	struct agent_share *share;
};

/* What Kubernetes says of a pod (its opt-in: agent_podspec_overcommit). */
#define AGENT_ROOM_NEVER_KEY "gpucr.dev/preemptible"
struct agent_room_pod {
	int overcommit; /* label or annotation gpucr.dev/overcommit: suspend */
	int has_priority;
	int priority;  /* spec.priority */
	int never;     /* annotation gpucr.dev/preemptible: "false" */
	char name[320]; /* "namespace/name" */
	char ns[64];    /* its namespace (the room policy's) */
};

struct agent_room_hooks {
	/* The pod of uid: 0 and *out filled, or -ENOENT (not known: the process's environ rules). */
	int (*pod)(void *data, const char *pod_uid, struct agent_room_pod *out);
	/* An Event on the pod of uid: type "Normal" or "Warning". Called from the worker after the
	 * decision's reply has gone (an API call must not delay an allocation). */
	void (*event)(void *data, const char *pod_uid, const char *type, const char *reason, const char *note);
	void *data;
};

struct agent_room;

/* Borrows reg, act (may be NULL: no activity, least recently active unknown) and m (may be
 * NULL); copies cfg and hooks (may be NULL). Reads the records of an earlier agent: processes
 * it held stay held, and are resumed when their requester is gone. */
int agent_room_new(struct agent_registry *reg, struct agent_activity *act, struct agent_metrics *m,
		   const struct agent_room_cfg *cfg, const struct agent_room_hooks *hooks, struct agent_room **out,
		   struct gcr_err *err) __attribute__((warn_unused_result));

/* Takes the registry's room requests (agent_registry_set_handler: before the registry's
 * thread starts) and starts the worker thread. */
int agent_room_start(struct agent_room *r, struct gcr_err *err);

/* Stops the thread (the suspend or resume in flight ends first); NULL-safe. Held processes
 * stay suspended with their records: the next agent resumes them. */
void agent_room_free(struct agent_room *r);

/* Processes suspended for another and not resumed yet. */
int agent_room_held(struct agent_room *r);

/* Whether pid (start: its start time, 0 unknown) is held suspended by the policy: 1 with
 * *data_only the mode it was suspended in, else 0. */
int agent_room_holds(struct agent_room *r, pid_t pid, unsigned long long start, int *data_only);

/* Gives pid's hold up to its owner's Checkpoint (docs/preemption.md, "Taken over by a
 * Checkpoint"): the policy forgets it (record included) and never resumes it; it stays
 * suspended. 0 (with *data_only), -ENOENT when not held, -ETIMEDOUT when the policy's worker,
 * busy with a suspend or resume, did not take it within timeout_ms (nothing changed then). */
int agent_room_release(struct agent_room *r, pid_t pid, unsigned long long start, int *data_only, int timeout_ms);

#endif
