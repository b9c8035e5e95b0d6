/* shim_nccl_poke: wakes NCCL's proxy service threads while the teardown aborts their
 * communicators (shim_nccl_poke.h says why). NCCL 2.28's ncclCommAbort sets the abort flag, closes
 * its own connections and joins both service threads; neither is woken. The UDS thread leaves at
 * its next poll tick (up to 500 ms); the socket thread, when its last peer closed before it read
 * the flag, enters one more full 500 ms poll. A datagram, or a connection that the listener's
 * accept drops (no handshake: NCCL discards it), ends such a poll, and a thread woken after the
 * flag is up leaves at once. Pokes are only sent once the abort has begun (the flag is its first
 * step), so NCCL never takes one for a request it must answer. */
#include "shim_nccl_poke.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr_log.h"

#define LINE_MAX_LEN 512
#define TCP_LISTEN 0x0A
#define NCCL_UDS_PREFIX "/tmp/nccl-socket-" /* NCCL_IPC_SOCKNAME_STR (2.19 to 2.29) */

enum shim_nccl_poke_mode shim_nccl_poke_mode(void)
{
	const char *e = getenv("GCR_NCCL_POKE");
	if (e == NULL || *e == '\0' || strcmp(e, "all") == 0)
		return SHIM_NCCL_POKE_ALL;
	if (strcmp(e, "uds") == 0)
		return SHIM_NCCL_POKE_UDS;
	return SHIM_NCCL_POKE_OFF;
}

/* A bounded, NUL-terminated copy of one line (the parsers take raw bytes). */
static int line_copy(const char *line, size_t len, char *buf)
{
	if (len >= LINE_MAX_LEN || memchr(line, '\0', len) != NULL)
		return -EINVAL;
	memcpy(buf, line, len);
	buf[len] = '\0';
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
		buf[--len] = '\0';
	return 0;
}

int shim_nccl_poke_parse_unix(const char *line, size_t len, struct shim_nccl_poke_unix *out)
{
	char buf[LINE_MAX_LEN];
	unsigned long num;
	unsigned refs, proto, flags, type, st;
	int off = -1;
	memset(out, 0, sizeof(*out));
	if (line_copy(line, len, buf) < 0)
		return -EINVAL;
	if (sscanf(buf, "%lx: %x %x %x %x %x %lu%n", &num, &refs, &proto, &flags, &type, &st, &out->inode, &off) != 7 ||
	    off < 0)
		return -EINVAL;
	out->type = type;
	const char *p = buf + off;
	if (*p == '\0')
		return 0; /* unnamed */
	if (*p != ' ')
		return -EINVAL;
	p++;
	size_t n = strlen(p);
	if (n == 0 || n > sizeof(out->addr.sun_path))
		return -EINVAL;
	out->addr.sun_family = AF_UNIX;
	if (p[0] == '@') {
		/* Abstract: the kernel shows every NUL of the name (the first, and those after a name
		 * bound with the whole sun_path, as NCCL binds) as '@'; the address is those bytes. */
		for (size_t i = 0; i < n; i++)
			out->addr.sun_path[i] = p[i] == '@' ? '\0' : p[i];
		out->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
	} else {
		if (n >= sizeof(out->addr.sun_path))
			return -EINVAL;
		memcpy(out->addr.sun_path, p, n);
		out->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
	}
	return 0;
}

int shim_nccl_poke_is_nccl_name(const struct shim_nccl_poke_unix *u)
{
	if (u->addr_len == 0)
		return 0;
	size_t max = u->addr_len - offsetof(struct sockaddr_un, sun_path);
	const char *s = u->addr.sun_path, *prefix = NCCL_UDS_PREFIX;
	if (max > 0 && s[0] == '\0') {
		/* Abstract: NCCL writes the path, then overwrites its leading '/' with the NUL that
		 * makes it abstract: the name is "tmp/nccl-socket-...", up to its first NUL. */
		s++;
		max--;
		prefix++;
	}
	size_t n = strnlen(s, max), pl = strlen(prefix);
	if (n <= pl || strncmp(s, prefix, pl) != 0)
		return 0;
	for (size_t k = n; k < max; k++) /* NCCL zeroes the rest of sun_path */
		if (s[k] != '\0')
			return 0;
	size_t i = pl, d = 0, h = 0;
	while (i < n && s[i] >= '0' && s[i] <= '9') {
		i++;
		d++;
	}
	if (d == 0 || i >= n || s[i++] != '-')
		return 0;
	while (i < n && ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) {
		i++;
		h++;
	}
	return h > 0 && h <= 16 && i == n;
}

/* Hex of /proc/net/tcp: each 32-bit word as the kernel's %08X of its raw value. */
static int addr_hex(const char *hex, unsigned char *out, size_t bytes)
{
	if (strlen(hex) != bytes * 2)
		return -EINVAL;
	for (size_t w = 0; w < bytes / 4; w++) {
		char word[9];
		memcpy(word, hex + w * 8, 8);
		word[8] = '\0';
		char *end;
		uint32_t v = (uint32_t)strtoul(word, &end, 16);
		if (*end != '\0')
			return -EINVAL;
		memcpy(out + w * 4, &v, 4);
	}
	return 0;
}

static int sockaddr_of(const char *hex, unsigned port, int v6, struct sockaddr_storage *ss, socklen_t *len)
{
	memset(ss, 0, sizeof(*ss));
	if (port > 0xffff)
		return -EINVAL;
	if (v6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)port);
		*len = sizeof(*a);
		return addr_hex(hex, a->sin6_addr.s6_addr, 16);
	}
	struct sockaddr_in *a = (struct sockaddr_in *)ss;
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)port);
	*len = sizeof(*a);
	return addr_hex(hex, (unsigned char *)&a->sin_addr.s_addr, 4);
}

int shim_nccl_poke_parse_tcp(const char *line, size_t len, int v6, struct shim_nccl_poke_tcp *out)
{
	char buf[LINE_MAX_LEN], la[40], ra[40];
	unsigned sl, lp, rp, st;
	memset(out, 0, sizeof(*out));
	if (line_copy(line, len, buf) < 0)
		return -EINVAL;
	if (sscanf(buf, " %u: %39[0-9A-Fa-f]:%x %39[0-9A-Fa-f]:%x %x %*s %*s %*s %*s %*s %lu", &sl, la, &lp, ra, &rp, &st,
		   &out->inode) != 7 || st > 0xff)
		return -EINVAL;
	out->state = st;
	socklen_t l2;
	if (sockaddr_of(la, lp, v6, &out->local, &out->len) < 0 || sockaddr_of(ra, rp, v6, &out->remote, &l2) < 0)
		return -EINVAL;
	return 0;
}

/* ---- the process's own sockets ---- */

struct inodes {
	unsigned long *v;
	size_t n, cap;
};

static int cmp_ul(const void *a, const void *b)
{
	unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
	return x < y ? -1 : x > y;
}

static int inodes_has(const struct inodes *s, unsigned long ino)
{
	return s->n > 0 && bsearch(&ino, s->v, s->n, sizeof(*s->v), cmp_ul) != NULL;
}

/* The inodes of every socket in this process's fd table, sorted. */
static int own_sockets(struct inodes *s, struct gcr_err *err)
{
	*s = (struct inodes){ 0 };
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return gcr_err_set(err, -errno, "/proc/self/fd: %s", strerror(errno));
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char l[64];
		ssize_t n = readlinkat(dirfd(d), e->d_name, l, sizeof(l) - 1);
		if (n <= 0)
			continue;
		l[n] = '\0';
		unsigned long ino;
		char tail;
		if (sscanf(l, "socket:[%lu%c", &ino, &tail) != 2 || tail != ']')
			continue;
		if (s->n == s->cap) {
			size_t cap = s->cap ? s->cap * 2 : 64;
			unsigned long *v = realloc(s->v, cap * sizeof(*v));
			if (v == NULL) {
				closedir(d);
				free(s->v);
				*s = (struct inodes){ 0 };
				return gcr_err_set(err, -ENOMEM, "no memory for the socket list");
			}
			s->v = v;
			s->cap = cap;
		}
		s->v[s->n++] = ino;
	}
	closedir(d);
	if (s->n > 0)
		qsort(s->v, s->n, sizeof(*s->v), cmp_ul);
	return 0;
}

typedef void (*tcp_fn)(const struct shim_nccl_poke_tcp *t, void *arg);

/* Every line of /proc/self/net/tcp and tcp6 that is one of own's sockets, to fn. */
static void own_tcp(const struct inodes *own, tcp_fn fn, void *arg)
{
	static const char *const files[2] = { "/proc/self/net/tcp", "/proc/self/net/tcp6" };
	for (int v6 = 0; v6 < 2; v6++) {
		FILE *f = fopen(files[v6], "re");
		if (f == NULL)
			continue; /* no IPv6 in this kernel or namespace */
		char line[LINE_MAX_LEN];
		while (fgets(line, sizeof(line), f) != NULL) {
			struct shim_nccl_poke_tcp t;
			if (shim_nccl_poke_parse_tcp(line, strlen(line), v6, &t) == 0 && inodes_has(own, t.inode))
				fn(&t, arg);
		}
		fclose(f);
	}
}

/* Listeners that are not a communicator's, never poked: those the process had before its first
 * communicator (a rendezvous store, a server), and those that outlived a teardown in which every
 * communicator was aborted (NCCL's RAS, what the application opened since). */
struct lset {
	int overflow;
	size_t n;
	unsigned long v[SHIM_NCCL_POKE_MAX];
};
static struct {
	pthread_once_t once;
	int taken;
	struct lset set;
} before = { .once = PTHREAD_ONCE_INIT };
static struct lset survivors; /* written and read by the teardown alone (one at a time) */

static int lset_has(const struct lset *s, unsigned long ino)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->v[i] == ino)
			return 1;
	return 0;
}

static void lset_add(const struct shim_nccl_poke_tcp *t, void *arg)
{
	struct lset *s = arg;
	if (t->state != TCP_LISTEN)
		return;
	if (s->n == SHIM_NCCL_POKE_MAX)
		s->overflow = 1;
	else
		s->v[s->n++] = t->inode;
}

/* Every listener of this process into s (emptied first); 0 or a negative errno. */
static int lset_take(struct lset *s, struct gcr_err *err)
{
	struct inodes own;
	memset(s, 0, sizeof(*s));
	int rc = own_sockets(&own, err);
	if (rc < 0)
		return rc;
	own_tcp(&own, lset_add, s);
	free(own.v);
	return 0;
}

static void before_take(void)
{
	struct gcr_err e = { 0 };
	if (lset_take(&before.set, &e) < 0)
		GCR_LOG(GCR_LOG_DEBUG, "shim", "NCCL pokes: %s; no listener will be poked", e.msg);
	else
		before.taken = 1;
}

void shim_nccl_poke_before_create(void)
{
	(void)pthread_once(&before.once, before_take);
}

void shim_nccl_poke_after_teardown(void)
{
	struct gcr_err e = { 0 };
	if (lset_take(&survivors, &e) < 0) {
		survivors.overflow = 1; /* unknown: poke no listener from now on */
		GCR_LOG(GCR_LOG_DEBUG, "shim", "NCCL pokes: %s; no listener will be poked", e.msg);
	}
}

/* Where to connect to reach listener l: its address, or loopback for a wildcard one. */
static void target_of(const struct shim_nccl_poke_tcp *l, struct sockaddr_storage *to, socklen_t *len)
{
	*to = l->local;
	*len = l->len;
	if (to->ss_family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)to;
		if (a->sin_addr.s_addr == htonl(INADDR_ANY))
			a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)to;
		if (IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr))
			a->sin6_addr = in6addr_loopback;
	}
}

/* A communicator's listener (every one but those above) into the poke p. */
static void scan_add(const struct shim_nccl_poke_tcp *t, void *arg)
{
	struct shim_nccl_poke *p = arg;
	if (t->state == TCP_LISTEN && !lset_has(&before.set, t->inode) && !lset_has(&survivors, t->inode) &&
	    p->n_tcp < SHIM_NCCL_POKE_MAX) {
		target_of(t, &p->tcp[p->n_tcp], &p->tcp_len[p->n_tcp]);
		p->n_tcp++;
	}
}

int shim_nccl_poke_find(struct shim_nccl_poke *p, enum shim_nccl_poke_mode mode, struct gcr_err *err)
{
	memset(p, 0, sizeof(*p));
	if (mode == SHIM_NCCL_POKE_OFF)
		return 0;
	struct inodes own;
	int rc = own_sockets(&own, err);
	if (rc < 0)
		return rc;
	FILE *f = fopen("/proc/self/net/unix", "re");
	if (f != NULL) {
		char line[LINE_MAX_LEN];
		while (fgets(line, sizeof(line), f) != NULL && p->n_uds < SHIM_NCCL_POKE_MAX) {
			struct shim_nccl_poke_unix u;
			if (shim_nccl_poke_parse_unix(line, strlen(line), &u) == 0 && u.type == SOCK_DGRAM &&
			    inodes_has(&own, u.inode) && shim_nccl_poke_is_nccl_name(&u)) {
				p->uds[p->n_uds] = u.addr;
				p->uds_len[p->n_uds++] = u.addr_len;
			}
		}
		fclose(f);
	}
	if (mode == SHIM_NCCL_POKE_ALL && before.taken && !before.set.overflow && !survivors.overflow)
		own_tcp(&own, scan_add, p);
	free(own.v);
	return 0;
}

void shim_nccl_poke_send(const struct shim_nccl_poke *p)
{
	if (p->n_uds > 0) {
		int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd >= 0) {
			for (size_t i = 0; i < p->n_uds; i++)
				(void)sendto(fd, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)&p->uds[i],
					     p->uds_len[i]);
			close(fd);
		}
	}
	for (size_t i = 0; i < p->n_tcp; i++) {
		int fd = socket(p->tcp[i].ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			continue;
		if (connect(fd, (const struct sockaddr *)&p->tcp[i], p->tcp_len[i]) < 0 && errno == EINPROGRESS) {
			struct pollfd pf = { .fd = fd, .events = POLLOUT };
			(void)poll(&pf, 1, 5); /* loopback or the node's own address: at once */
		}
		close(fd);
	}
}
