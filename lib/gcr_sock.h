/* gcr_sock: Unix stream sockets for the control protocol: listen, connect, peer
 * credentials, and bounded line I/O with deadlines. */
#ifndef GCR_SOCK_H
#define GCR_SOCK_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_error.h"

struct gcr_peer {
	pid_t pid; /* as this process's PID namespace sees it */
	uid_t uid;
	gid_t gid;
};

/* Creates the directory (mode 0700 if new) and a listening socket at path; the socket
 * file gets mode 0600. A file already at path is replaced only when it is a dead socket
 * the caller may remove (gcr_sock_remove_stale); else -EADDRINUSE, the file untouched. */
int gcr_sock_listen(const char *path, struct gcr_err *err);
/* The same for a socket any local process may connect to, whose server trusts only the
 * peer credentials (the agent's registry): directory and missing parents created, the
 * directory searchable by all (0711, made so if it exists and is ours), the socket 0666. */
int gcr_sock_listen_shared(const char *path, struct gcr_err *err);
/* A shim's socket name without ".sock": "gcr-<name_pid>-<start>", start being the start
 * time of process pid (0: this one) in clock ticks since boot (/proc/<pid>/stat field 22).
 * The start time reads the same from every PID namespace, so the name is the same whether
 * the shim computes it with its own pid or a client with the pid the shim has there. */
int gcr_sock_shim_stem(pid_t pid, pid_t name_pid, char *buf, size_t len, struct gcr_err *err);
/* Listens (as gcr_sock_listen, dir mode 0700 if new, socket 0600) at "<dir>/<stem>.sock";
 * if that name is taken by anything but a dead socket of ours, at "<dir>/<stem>-<64 random
 * bits>.sock", which nobody can take first. Never replaces another user's or a live file.
 * The name chosen is in path (len bytes). Returns the fd. */
int gcr_sock_listen_unique(const char *dir, const char *stem, char *path, size_t len, struct gcr_err *err);
/* Removes path when it is a socket nobody listens on (connect: ECONNREFUSED) owned by the
 * caller, or any such socket when the caller is root. 1: removed; 0: left (live, not a
 * socket, another user's, gone); <0: error. */
int gcr_sock_remove_stale(const char *path, struct gcr_err *err);
/* gcr_sock_remove_stale on every "gcr-*.sock" in dir: the sockets of killed shims.
 * Returns how many were removed. */
int gcr_sock_reap(const char *dir, struct gcr_err *err);
/* Connects, waiting up to timeout_ms for room in the listener's backlog (<= 0: not at all);
 * returns a connected, non-blocking fd or a negative errno (-ETIMEDOUT: no room in time). */
int gcr_sock_connect(const char *path, int timeout_ms, struct gcr_err *err);
int gcr_sock_peer(int fd, struct gcr_peer *peer, struct gcr_err *err);

/* Writes all of buf (a line including its '\n') before the deadline. */
int gcr_sock_write_all(int fd, const char *buf, size_t len, int timeout_ms, struct gcr_err *err);
/* The same with nfds descriptors passed along (SCM_RIGHTS, with the line's first bytes), at most
 * GCR_SOCK_MAX_FDS. The caller keeps and closes its own. */
#define GCR_SOCK_MAX_FDS 128
int gcr_sock_write_fds(int fd, const char *buf, size_t len, const int *fds, int nfds, int timeout_ms,
		       struct gcr_err *err);

/* Line reader with a fixed maximum; one per connection. */
struct gcr_linebuf {
	char *buf;
	size_t len, cap, max;
};
int gcr_linebuf_init(struct gcr_linebuf *lb, size_t max);
void gcr_linebuf_free(struct gcr_linebuf *lb);
/* Reads until a full line is buffered; on success *line points into lb (NUL
 * terminated, without '\n') and stays valid until the next call. A line longer
 * than max is -EMSGSIZE; EOF before a newline is -ECONNRESET; timeout_ms < 0
 * waits forever. */
int gcr_linebuf_read(struct gcr_linebuf *lb, int fd, int timeout_ms, char **line,
		     struct gcr_err *err);
/* The same in steps, for an event loop: gcr_linebuf_fill reads what fd has now without
 * waiting (bytes read; 0 no room until buffered lines are taken; -EAGAIN nothing yet;
 * -ECONNRESET EOF; -EMSGSIZE, -EBADMSG as above); gcr_linebuf_push appends bytes from
 * memory (how many fitted, the same rules); gcr_linebuf_next hands out the next buffered line: 1 with *line set (valid
 * until the next call on lb), 0 none complete yet, -EMSGSIZE. */
long gcr_linebuf_fill(struct gcr_linebuf *lb, int fd, struct gcr_err *err);
/* gcr_linebuf_fill that also takes descriptors passed with the bytes (SCM_RIGHTS, close-on-exec),
 * appended to fds[*nfds] up to max; any beyond are closed at once. gcr_linebuf_fill never takes
 * them: a peer's descriptors there are dropped by the kernel. */
long gcr_linebuf_fill_fds(struct gcr_linebuf *lb, int fd, int *fds, int *nfds, int max, struct gcr_err *err);
long gcr_linebuf_push(struct gcr_linebuf *lb, const char *data, size_t n, struct gcr_err *err);
int gcr_linebuf_next(struct gcr_linebuf *lb, char **line, struct gcr_err *err);

#endif
