/* agent_ocisrv: the transport of the node's checkpoint-image registry (agent_ocireg): HTTPS on
 * 127.0.0.1:<port> with a required client certificate (agent_regtls), a port that may be taken
 * (retried with back-off and reported, never fatal), and connections admitted so that no client
 * can keep another's pull out: unauthenticated connections only have a handshake's time and
 * the oldest of the busiest user is dropped for a new one; authenticated idle ones go first
 * when the serving slots are full (docs/install.md, "The image registry"). */
#ifndef AGENT_OCISRV_H
#define AGENT_OCISRV_H

#include <stddef.h>
#include <sys/types.h>

#include "agent_ocidist.h"
#include "agent_regtls.h"
#include "gcr_error.h"

/* Defaults (agent_ocisrv_cfg's zero fields). */
#define AGENT_OCISRV_PENDING_MAX 64     /* connections still in their TLS handshake */
#define AGENT_OCISRV_PENDING_PER_UID 8  /* of them, per user of the connecting socket (not root) */
#define AGENT_OCISRV_PENDING_ROOT 48    /* per root (containerd is root) */
#define AGENT_OCISRV_SERVING_MAX 32     /* authenticated connections, a thread each */
#define AGENT_OCISRV_HANDSHAKE_MS 3000  /* a handshake's time from accept (loopback: ms) */
#define AGENT_OCISRV_IDLE_MS 10000      /* an authenticated connection without a request */
#define AGENT_OCISRV_SEND_MS 60000      /* a send that makes no progress */
#define AGENT_OCISRV_BACKOFF_MIN_MS 500 /* a taken port is tried again after this, doubling */
#define AGENT_OCISRV_BACKOFF_MAX_MS 30000

struct agent_ocisrv;
struct agent_ocisrv_conn;

struct agent_ocisrv_req {
	enum agent_ocimethod method; /* GET or HEAD (others are answered 405 before the handler) */
	char target[AGENT_OCIDIST_HEAD_MAX]; /* the request target as sent, NUL-terminated */
	size_t target_len;
};

/* Answers one request: exactly one agent_ocisrv_reply* call (none: 500). Runs on the
 * connection's own thread, so it may block (read a file, ask the API server). */
typedef void (*agent_ocisrv_fn)(void *data, struct agent_ocisrv_conn *c, const struct agent_ocisrv_req *req);

/* The listener came or went: listening 1, or 0 with why (the port taken: by whom when the
 * kernel says). Called from the server's thread, not under its locks. */
typedef void (*agent_ocisrv_state_fn)(void *data, int listening, const char *why);

struct agent_ocisrv_cfg {
	int port;                        /* on 127.0.0.1 */
	const struct agent_regtls *tls;  /* borrowed, outlives the server */
	const char *proc_root;           /* "/proc": who holds a taken port */
	agent_ocisrv_fn fn;
	agent_ocisrv_state_fn state;     /* may be NULL */
	void *data;
	/* 0: the defaults above. */
	unsigned int pending_max, pending_per_uid, pending_root, serving_max;
	int handshake_ms, idle_ms, send_ms, backoff_min_ms, backoff_max_ms;
};

/* Starts the server's thread; a taken port is not an error (it is retried and reported).
 * 0 or -errno (no thread, no memory). */
int agent_ocisrv_start(const struct agent_ocisrv_cfg *cfg, struct agent_ocisrv **out, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* NULL-safe; closes every connection, waits for their threads. */
void agent_ocisrv_free(struct agent_ocisrv *s);

struct agent_ocisrv_stats {
	int listening;
	unsigned int pending, serving;
	unsigned long long bind_failures;  /* attempts that found the port taken */
	unsigned long long accepted;       /* connections */
	unsigned long long authenticated;  /* handshakes with the client certificate */
	unsigned long long evicted;        /* dropped for another: pending ones, then idle serving ones */
	unsigned long long handshake_failed; /* no client certificate, not TLS, expired */
	unsigned long long refused;        /* authenticated, no serving slot free (all busy) */
	unsigned long long requests;
};
void agent_ocisrv_stats(struct agent_ocisrv *s, struct agent_ocisrv_stats *out);

/* The reply: code, content type, the Docker-Content-Digest header (NULL: none), a body of len
 * bytes (sent unless the request was HEAD; Content-Length is len either way). 0 or -errno. */
int agent_ocisrv_reply(struct agent_ocisrv_conn *c, int code, const char *ctype, const char *digest,
		       const void *body, size_t len);
/* The same with size bytes of the open file fd as the body (fd taken and closed); a file that
 * ends early closes the connection (the client sees a short body and fails the pull). */
int agent_ocisrv_reply_fd(struct agent_ocisrv_conn *c, int code, const char *ctype, const char *digest, int fd,
			  long long size);
/* The uid of the connection's peer socket (the kernel's sock_diag), -1 when not known. */
long agent_ocisrv_peer_uid(const struct agent_ocisrv_conn *c);

#endif
