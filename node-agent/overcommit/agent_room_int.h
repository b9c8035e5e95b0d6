/* agent_room_int: what the overcommit engine's files share, internal to node-agent/overcommit/
 * (nothing outside it includes this): the engine's state (struct agent_room), a hold, a queued
 * request and wake, and the functions that the worker (agent_room.c), the request side
 * (agent_room_request.c) and the holds' side (agent_room_hold.c) call across files. Include
 * agent_room.h first: included here, the two would include each other (an include cycle, which
 * tests/unit/test_architecture.sh refuses). */
#ifndef AGENT_ROOM_INT_H
#define AGENT_ROOM_INT_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#include "agent_registry.h"
#include "agent_roompolicy.h"
#include "agent_victims.h"
#include "gcr_error.h"
#include "gcr_nvml.h"

/* Processes held at once at most (a node's GPU processes: the registry's bound). */
#define MAX_HELD AGENT_REGISTRY_MAX
/* How long a candidate's shim may take to say what it holds (ms), in data-only mode. */
#define STATUS_MS 1000
/* Pods a refusal by policy or back-off is told to (an Event) at most once per TELL_MS each. */
#define TOLD_MAX 64
#define TELL_MS 60000
/* A pod's key: its uid, or "pid/<pid>" outside pods. */
#define KEY_LEN (AGENT_CGROUP_UID_LEN + 16)

/* One process suspended for another. */
struct hold {
	pid_t pid;
	unsigned long long start; /* 0: not known */
	char pod[AGENT_CGROUP_UID_LEN + 1];
	int priority;
	unsigned long long bytes; /* on the GPU, when suspended */
	double since;             /* CLOCK_REALTIME seconds */
	pid_t for_pid;
	unsigned long long for_start;
	char for_pod[AGENT_CGROUP_UID_LEN + 1];
	char uuid[GCR_NVML_UUID_LEN];
	int said; /* the last resume failure logged (its -errno), so each is said once */
	int data_only; /* suspended in data-only mode: resumed in the same */
	double room_since; /* monotonic ms since its GPU has had room for it, requester alive; 0: not */
	int idle;          /* suspended for idling, for its victims (for_pid 0); resumed only when woken */
	double woken;      /* monotonic ms its first caller reached the gate (a wake); 0: not woken */
	int woken_said;    /* "stays suspended" of the wake logged */
	int recovered;     /* read back from an earlier agent's record: a wake it was sent may be lost, so
			    * its shim's status is asked until it says (agent_room_monitor) */
};

struct request {
	struct agent_registry_proc p;
	int fd;
	struct agent_roommsg_room req;
	double queued; /* monotonic ms */
};

/* A wake waiting for the worker (one per process at most). */
struct wake {
	struct agent_registry_proc p;
	double at; /* monotonic ms its first caller reached the gate */
};

/* Room given to a requester by suspends, waiting to be seen used (AGENT_ROOM_USE_MS). */
struct grant {
	pid_t pid;
	unsigned long long start;
	char key[KEY_LEN], pod[AGENT_CGROUP_UID_LEN + 1], uuid[GCR_NVML_UUID_LEN];
	unsigned long long before, asked; /* its bytes on the GPU when it asked; what it asked */
	double at;                        /* monotonic ms of the grant */
};

/* A pod that did not use the room it was given: no priority until then. */
struct penalty {
	char key[KEY_LEN];
	double until; /* monotonic ms */
};

/* A requester's driver calls, sampled every check_ms while others are held for it. */
struct watch {
	pid_t pid;
	long long calls;
	double since; /* monotonic ms the count last changed (or watching began) */
};

/* A requester's state, read once per pass of agent_room_monitor: every hold made for it sees the
 * same, so a requester that ends between two of its holds cannot let a lower one resume before a
 * higher. */
struct req_seen {
	pid_t pid;
	unsigned long long start;
	int resident, alive;
};

struct agent_room {
	struct agent_registry *reg;
	struct agent_activity *act;
	struct agent_metrics *m;
	struct agent_room_cfg cfg;
	char *socket_dir, *dir; /* dir: <record_dir>/overcommit */
	char *proc_root;        /* cfg.proc_root's copy (NULL: none) */
	struct agent_room_hooks hooks;
	pthread_t th;
	int started;
	pthread_mutex_t lock; /* guards q, nq, nudge, stop */
	pthread_cond_t cv;
	struct request q[AGENT_ROOM_QUEUE];
	int nq, nudge, stop;
	struct wake *wq; /* MAX_HELD: a process's second wake replaces its first */
	int nw;
	struct watch *watch; /* the worker's own: MAX_HELD */
	int nwatch;
	/* Events decided by the worker, posted after its reply (the worker's own). */
	struct {
		char uid[AGENT_CGROUP_UID_LEN + 1], type[8], reason[40], note[640];
	} ev[2 * AGENT_ROOM_EVENTS];
	int nev;
	/* The worker's own, read by agent_room_held under hlock. */
	pthread_mutex_t hlock;
	struct hold *held;
	int nheld;
	/* The worker's own: room given and not yet seen used; pods without priority for a while;
	 * when a pod was last told a refusal by policy or back-off. */
	struct agent_roompolicy policy;
	struct grant *grants; /* MAX_HELD */
	int ngrants;
	struct penalty *pen; /* MAX_HELD */
	int npen;
	struct {
		char key[KEY_LEN];
		double at;
	} told[TOLD_MAX];
	struct req_seen seen[MAX_HELD]; /* agent_room_monitor's memo of requesters, one pass long */
	/* A hold given up to a Checkpoint (agent_room_release), done by the worker under lock. */
	pthread_mutex_t rel_lock; /* one release at a time */
	pthread_cond_t rel_cv;
	struct {
		int pending, done, found, data_only;
		pid_t pid;
		unsigned long long start;
	} rel;
};

/* agent_room.c: what both sides use. */
int agent_room_alive(struct agent_room *r, pid_t pid, unsigned long long start);
void agent_room_pod_label(struct agent_room *r, const char *uid, pid_t pid, char *out, size_t len);
void agent_room_event(struct agent_room *r, const char *uid, const char *type, const char *reason, const char *note);
void agent_room_settings_of(struct agent_room *r, const struct agent_registry_proc *p, int *opted, int *prio,
			    int *preemptible, char *ns);

/* agent_room_request.c: a room request, the GPU's numbers, the victims, the back-off. */
void agent_room_key_of(const char *uid, pid_t pid, char *out);
double agent_room_penalty_left(struct agent_room *r, const char *key);
void agent_room_reply(int fd, long long id, int granted, int suspended, unsigned long long freed, const char *reason);
int agent_room_gpu_of(pid_t pid, char *uuid, struct gcr_err *err);
unsigned long long agent_room_bytes_on(pid_t pid, const char *uuid);
unsigned long long agent_room_data_bytes(struct agent_room *r, pid_t pid, unsigned long long on_gpu);
unsigned long long agent_room_free_on(const char *uuid, unsigned long long *total);
int agent_room_suspend_victims(struct agent_room *r, const struct agent_registry_proc *req, int req_prio,
			       const struct agent_registry_proc *cand, const struct agent_victim *v, const int *pick,
			       int k, const char *uuid, unsigned long long *freed);
int agent_room_gather(struct agent_room *r, pid_t self, const char *req_ns, const char *uuid,
		      struct agent_registry_proc *cand, struct agent_victim *v, char *seen, size_t len, int *by_policy);
void agent_room_grants_check(struct agent_room *r, pid_t returned);
void agent_room_handle(struct agent_room *r, struct request *q);

/* agent_room_hold.c: the records and the table of holds, resumes, wakes, idle requesters. */
void agent_room_records_load(struct agent_room *r);
int agent_room_hold_of(struct agent_room *r, pid_t pid);
int agent_room_is_held(struct agent_room *r, pid_t pid);
void agent_room_set_hold(struct agent_room *r, const struct hold *h);
void agent_room_drop_hold(struct agent_room *r, int i);
int agent_room_resume_one(struct agent_room *r, int i, const char *why, struct gcr_err *err);
void agent_room_wake(struct agent_room *r, const struct wake *w);
void agent_room_monitor(struct agent_room *r);

#endif
