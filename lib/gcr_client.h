/* gcr_client: finds the control socket of a process by its pid (as this PID
 * namespace sees it) and speaks the control protocol to it. */
#ifndef GCR_CLIENT_H
#define GCR_CLIENT_H

#include <jansson.h>
#include <sys/types.h>

#include "gcr_error.h"
#include "gcr_proto.h"

struct gcr_client {
	int fd;
	pid_t pid;
	long long next_id;
	char path[256];
};

/* Connects to the shim of pid: first "<dir>/gcr-<pid>-<start>.sock" (start: the process's
 * start time, gcr_sock_shim_stem); then the socket as the process names it in its own
 * namespaces ("/proc/<pid>/root<its GCR_SOCKET_DIR>/gcr-<its own pid>-<start>.sock": a
 * container); else every "gcr-*.sock" in dir (a shim whose name was taken chose a random one). A socket counts only when its
 * peer credentials carry pid and run as root or the process's owner. -ESRCH: no such
 * process; -EPERM: its socket is served by another user; -ENOENT: no shim answers for it. */
int gcr_client_open(struct gcr_client *c, const char *dir, pid_t pid, struct gcr_err *err);
void gcr_client_close(struct gcr_client *c);

/* Sends one request and waits up to timeout_ms (< 0: no bound) for its reply. args (may be
 * NULL) is stolen, on every path: the caller never decrefs it. On success
 * *result is the reply's result object (caller decrefs). A reply with ok=false
 * becomes its negative errno with the shim's message in err. A process seen stopped (state T
 * or t: SIGSTOP, a debugger) for a second of the wait is given up on at once: -ETIMEDOUT with
 * a message that names the state. */
int gcr_client_call(struct gcr_client *c, enum gcr_op op, json_t *args, int timeout_ms,
		    json_t **result, struct gcr_err *err);
/* The same with descriptors passed along with the request (at most GCR_SOCK_MAX_FDS; the caller
 * keeps its own). */
int gcr_client_call_fds(struct gcr_client *c, enum gcr_op op, json_t *args, const int *fds, int nfds,
			int timeout_ms, json_t **result, struct gcr_err *err);

/* Sends op (args borrowed, may be NULL) to the shim of every pids[i] at once and waits
 * for the replies with one deadline, timeout_ms from the call, shared by them all: a
 * stopped process (SIGSTOP, or frozen by its cgroup) costs that deadline once however
 * many there are, where one gcr_client_call each would cost its timeout each. Connects
 * never wait: a shim whose listen backlog is full has not accepted for a while and counts
 * as not answering. Sockets are found as gcr_client_open finds them, the directory read
 * at most once. results[i] gets pid i's result object (caller decrefs) with rcs[i] 0, or
 * NULL with rcs[i] its -errno: -ETIMEDOUT no reply in time, -ENOENT no shim, -ESRCH no
 * process. Returns how many answered, or -ENOMEM with the message in err. */
int gcr_client_call_all(const char *dir, const pid_t *pids, size_t n, enum gcr_op op, json_t *args,
			int timeout_ms, json_t **results, int *rcs, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The state letter of /proc/<pid>/stat ('R', 'S', 'T' stopped, 't' traced, 'Z'...), 0 when
 * unreadable. */
char gcr_client_proc_state(pid_t pid);

/* Calls fn for each live shim socket in dir with the pid its peer credentials show. */
int gcr_client_list(const char *dir, void (*fn)(pid_t pid, const char *path, void *data),
		    void *data, struct gcr_err *err);

#endif
