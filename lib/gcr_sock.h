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

/* Creates the directory (mode 0700 if new) and a listening socket at path,
 * replacing a stale socket file; the socket file gets mode 0600. */
int gcr_sock_listen(const char *path, struct gcr_err *err);
/* The same for a socket any local process may connect to, whose server trusts only the
 * peer credentials (the agent's registry): directory and missing parents created, the
 * directory searchable by all (0711, made so if it exists and is ours), the socket 0666. */
int gcr_sock_listen_shared(const char *path, struct gcr_err *err);
/* Connects with a timeout; returns the fd or a negative errno. */
int gcr_sock_connect(const char *path, int timeout_ms, struct gcr_err *err);
int gcr_sock_peer(int fd, struct gcr_peer *peer, struct gcr_err *err);

/* Writes all of buf (a line including its '\n') before the deadline. */
int gcr_sock_write_all(int fd, const char *buf, size_t len, int timeout_ms, struct gcr_err *err);

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

#endif
