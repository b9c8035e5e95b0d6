/* agent_registry: the shims' registry socket: who connected (host pid from peer
 * credentials), which pod and container (from <procRoot>/<pid>/cgroup). */
#ifndef AGENT_REGISTRY_H
#define AGENT_REGISTRY_H

#include <sys/types.h>

#include "agent_cgroup.h"
#include "agent_roommsg.h"
#include "agent_share.h"
#include "gcr_error.h"

/* Processes one agent tracks at most (one node's GPU processes). */
#define AGENT_REGISTRY_MAX 1024

struct agent_registry_proc {
	pid_t pid;
	char pod_uid[AGENT_CGROUP_UID_LEN + 1];
	char container_id[AGENT_CGROUP_CID_LEN + 1];
	/* starttime of <procRoot>/<pid>/stat (0 when unreadable): with the pid, names one process
	 * for good, so a record made before a restart never matches a later process with its pid. */
	unsigned long long start;
	/* Overcommit settings from <procRoot>/<pid>/environ (agent_roommsg), read once. */
	struct agent_roommsg_env env;
};

/* What the overcommit policy hears from the registry's thread; each callback must return at
 * once (queue the work). */
struct agent_registry_handler {
	/* A valid room request from p. fd is a duplicate of p's connection, owned by the callee: it
	 * replies there (one line with req->id) and closes it. */
	void (*room)(void *data, const struct agent_registry_proc *p, int fd, const struct agent_roommsg_room *req);
	/* A valid wake from p (a thread of it reached the gate of a suspend the agent made; no
	 * reply). */
	void (*wake)(void *data, const struct agent_registry_proc *p, const struct agent_roommsg_room *w);
	/* p's registry connection closed: the process is gone (or dropped it for a CRIU dump). */
	void (*gone)(void *data, const struct agent_registry_proc *p);
	void *data;
};

struct agent_registry;

/* agent_registry_new's flags: also take processes outside pods (gcr-agent on a machine without
 * Kubernetes, --processes-outside-pods): their pod uid and container id are "". */
#define AGENT_REGISTRY_OUTSIDE_PODS 1

/* Listens on socket_path; proc_root is "/proc" or a test tree. Then scans socket_dir, and
 * each directory in alloc_root (the device plugin's socket root; NULL: none), for shims
 * that registered with an earlier agent (gcr_client_list). */
int agent_registry_new(const char *socket_path, const char *socket_dir, const char *alloc_root,
		       const char *proc_root, int flags, struct agent_registry **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Each pod's share of the table (agent_share; borrowed, must outlive r): a registration past
 * its pod's share is refused (the connection closed, the pod told). Set before
 * agent_registry_start; the start-up scan's entries are counted once it is set. NULL: none. */
void agent_registry_set_share(struct agent_registry *r, struct agent_share *s);

/* Sets (or, all NULL, clears) the overcommit handler; once this returns, the old one is never
 * called again. Without one, room requests are answered "not granted" at once. */
void agent_registry_set_handler(struct agent_registry *r, const struct agent_registry_handler *h);

/* Start time of pid as <procRoot>/<pid>/stat says (0 when unreadable): with the pid, one process. */
unsigned long long agent_registry_start_time(struct agent_registry *r, pid_t pid);

/* Starts the server thread. */
int agent_registry_start(struct agent_registry *r, struct gcr_err *err);

/* Stops the thread, closes every connection, removes the socket. NULL-safe. */
void agent_registry_free(struct agent_registry *r);

/* Copies up to max live processes of pod_uid (every pod when NULL; and
 * container_id unless NULL or "") into out; returns how many. */
int agent_registry_find(struct agent_registry *r, const char *pod_uid, const char *container_id,
			struct agent_registry_proc *out, int max);

/* The entry of pid, if registered and alive: 0, else -ENOENT. */
int agent_registry_get(struct agent_registry *r, pid_t pid, struct agent_registry_proc *out);

/* Live registered processes. */
int agent_registry_count(struct agent_registry *r);

#endif
