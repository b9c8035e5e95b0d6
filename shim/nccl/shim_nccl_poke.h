/* shim_nccl_poke: wakes NCCL's proxy service threads while the teardown aborts their
 * communicators. Each communicator's two service threads (the socket one and the UDS one) sleep in
 * poll() with a 500 ms timeout and read the abort flag only between polls, and ncclCommAbort joins
 * them; a poke (a datagram to the UDS thread's socket, a connection to the socket thread's
 * listener, both closed at once) ends such a poll early. What to poke is found in the process's
 * own sockets (/proc/self/fd, /proc/self/net/{unix,tcp,tcp6}) before the abort begins. */
#ifndef SHIM_NCCL_POKE_H
#define SHIM_NCCL_POKE_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "gcr_error.h"

#define SHIM_NCCL_POKE_MAX 64 /* sockets of each kind: 2 per communicator a round is plenty */

/* Which threads to poke (GCR_NCCL_POKE: off, uds, all; default all). */
enum shim_nccl_poke_mode { SHIM_NCCL_POKE_OFF = 0, SHIM_NCCL_POKE_UDS, SHIM_NCCL_POKE_ALL };

struct shim_nccl_poke {
	size_t n_uds, n_tcp;
	struct sockaddr_un uds[SHIM_NCCL_POKE_MAX];
	socklen_t uds_len[SHIM_NCCL_POKE_MAX];
	struct sockaddr_storage tcp[SHIM_NCCL_POKE_MAX];
	socklen_t tcp_len[SHIM_NCCL_POKE_MAX];
};

enum shim_nccl_poke_mode shim_nccl_poke_mode(void);

/* Called as the application makes a communicator: the first call notes the listening TCP sockets
 * the process had before NCCL (a rendezvous store, a server), which are never poked. */
void shim_nccl_poke_before_create(void);

/* Called once every communicator is aborted: the listeners left are not a communicator's (NCCL's
 * RAS, the application's own since its first communicator) and are never poked again. */
void shim_nccl_poke_after_teardown(void);

/* Fills p with this process's NCCL service sockets: the UDS sockets NCCL names
 * /tmp/nccl-socket-<rank>-<hex> (abstract ones as "\0tmp/nccl-socket-..."), and the listening TCP
 * sockets of its communicators: every listener of the process but those above (a proxy's, which
 * the poke wakes, and a bootstrap one, where nothing accepts; a connection closed at once leaves
 * both unharmed). At a process's first teardown that includes NCCL's RAS listeners and any the
 * application opened after its first communicator: each gets one connection, closed at once, a
 * port probe's worth. 0 or a negative errno. */
int shim_nccl_poke_find(struct shim_nccl_poke *p, enum shim_nccl_poke_mode mode, struct gcr_err *err);

/* One poke of every socket in p; never blocks for more than a few ms. */
void shim_nccl_poke_send(const struct shim_nccl_poke *p);

/* Parsers of one line of /proc/net/unix and /proc/net/tcp{,6} (exposed for the tests and the
 * fuzz target). 0 when the line is a socket's, -EINVAL otherwise. */
struct shim_nccl_poke_unix {
	unsigned long inode;
	unsigned type; /* SOCK_DGRAM, ... */
	struct sockaddr_un addr;
	socklen_t addr_len; /* 0: no name */
};
int shim_nccl_poke_parse_unix(const char *line, size_t len, struct shim_nccl_poke_unix *out);

struct shim_nccl_poke_tcp {
	unsigned long inode;
	unsigned state; /* 0x0A listen, 0x01 established */
	struct sockaddr_storage local, remote;
	socklen_t len;
};
int shim_nccl_poke_parse_tcp(const char *line, size_t len, int v6, struct shim_nccl_poke_tcp *out);

/* Whether a UDS name is one NCCL's proxy binds (/tmp/nccl-socket-<decimal>-<hex>, abstract or not). */
int shim_nccl_poke_is_nccl_name(const struct shim_nccl_poke_unix *u);

#endif
