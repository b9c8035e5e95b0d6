/* agent_ocisrv: the registry's HTTPS server. One thread owns the listening socket and every
 * connection until its TLS handshake has shown the node's client certificate (non-blocking,
 * poll); each authenticated connection then gets a thread of its own for its requests
 * (blocking reads and file sends, bounded by timeouts).
 * Why admission by eviction instead of a connection limit: a limit lets whoever opens
 * connections first keep everyone else out (32 idle connections refused every pull). Here a
 * new connection is always taken; when the handshake table is full, the oldest handshake of
 * the user holding the most goes (the connecting socket's uid, from the kernel's sock_diag),
 * and no user but root may hold more than a few. A handshake has seconds, and containerd's
 * takes milliseconds, so another user cannot keep a pull out; root can only by opening tens of
 * connections within each of containerd's handshakes. Authenticated connections are root's
 * with the client key (containerd's); an idle one makes way for a new one. */
#include "agent_ocisrv.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr_log.h"
#include "gcr_time.h"

#define ACCEPT_BURST 64   /* accepts per poll round, so handshakes in flight keep moving */
#define HINT_EVERY_MS 60000 /* a misconfiguration hint is logged at most this often */
#define SEND_CHUNK (64u << 10)

struct pend {
	int fd;
	gnutls_session_t s;
	long uid;
	double since, deadline; /* monotonic ms */
	int peeked;             /* the first bytes were looked at (plain HTTP?) */
};

struct agent_ocisrv_conn {
	struct agent_ocisrv *srv;
	int fd;
	gnutls_session_t s;
	long uid;
	int idle, closing;  /* under srv->lock */
	double idle_since;  /* under srv->lock */
	int head_only, keep_alive, replied, broken; /* the connection's thread only */
	struct agent_ocisrv_conn *next; /* srv->conns, under srv->lock */
};

struct agent_ocisrv {
	struct agent_ocisrv_cfg cfg;
	gnutls_priority_t prio;
	int lfd, wake[2];
	pthread_t th;
	int th_started;
	atomic_int stop;
	/* The handshake table: the front thread's alone. */
	struct pend *pend;
	unsigned int npend;
	pthread_mutex_t lock; /* guards conns, nserving, st, and each conn's idle state */
	pthread_cond_t gone;  /* a serving thread ended */
	struct agent_ocisrv_conn *conns;
	unsigned int nserving;
	struct agent_ocisrv_stats st;
	double last_hint[3];
	unsigned long who_inode; /* the taken port's socket last named, and by whom (front thread) */
	char who[160];
};

enum { HINT_PLAIN, HINT_NOCERT, HINT_REFUSED };

static void count(struct agent_ocisrv *s, unsigned long long *field)
{
	pthread_mutex_lock(&s->lock);
	(*field)++;
	pthread_mutex_unlock(&s->lock);
}

/* ---- the kernel's view of sockets (sock_diag) ---- */

/* One request on a NETLINK_SOCK_DIAG socket; calls each(msg, data) per inet_diag_msg answered
 * until it returns nonzero or the answer ends. 0, or -errno. */
static int diag(const struct inet_diag_req_v2 *r, int dump, int (*each)(const struct inet_diag_msg *, void *),
		void *data)
{
	int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (fd < 0)
		return -errno;
	struct {
		struct nlmsghdr h;
		struct inet_diag_req_v2 r;
	} req = { .h = { .nlmsg_len = sizeof(req), .nlmsg_type = SOCK_DIAG_BY_FAMILY,
			 .nlmsg_flags = (unsigned short)(NLM_F_REQUEST | (dump ? NLM_F_DUMP : 0)) },
		  .r = *r };
	struct sockaddr_nl nl = { .nl_family = AF_NETLINK };
	int rc = 0;
	if (sendto(fd, &req, sizeof(req), 0, (struct sockaddr *)&nl, sizeof(nl)) < 0)
		rc = -errno;
	static const struct timeval tv = { .tv_sec = 1 };
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	long buf[8192 / sizeof(long)];
	for (int done = 0; rc == 0 && !done;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			rc = n < 0 ? -errno : -EIO;
			break;
		}
		/* Every length from the kernel checked before use, as any input. */
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE) {
				done = 1;
				break;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				const struct nlmsgerr *e = NLMSG_DATA(h);
				rc = h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error < 0 ? e->error : -EIO;
				break;
			}
			if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY && h->nlmsg_len >= NLMSG_LENGTH(sizeof(struct inet_diag_msg)) &&
			    each(NLMSG_DATA(h), data)) {
				done = 1;
				break;
			}
		}
		if (!dump)
			done = 1;
	}
	close(fd);
	return rc;
}

static int take_uid(const struct inet_diag_msg *m, void *data)
{
	*(long *)data = (long)m->idiag_uid;
	return 1;
}

/* The uid of the socket connected to us from peer (its own end: the client's). */
static long peer_uid(const struct sockaddr_in *peer, int port)
{
	struct inet_diag_req_v2 r = { .sdiag_family = AF_INET, .sdiag_protocol = IPPROTO_TCP, .idiag_states = ~0u };
	r.id.idiag_sport = peer->sin_port;
	r.id.idiag_dport = htons((uint16_t)port);
	r.id.idiag_src[0] = peer->sin_addr.s_addr;
	r.id.idiag_dst[0] = htonl(INADDR_LOOPBACK);
	r.id.idiag_cookie[0] = r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	long uid = -1;
	return diag(&r, 0, take_uid, &uid) < 0 ? -1 : uid;
}

struct listener {
	int port;
	long uid;
	unsigned long inode;
};

static int take_listener(const struct inet_diag_msg *m, void *data)
{
	struct listener *l = data;
	if (ntohs(m->id.idiag_sport) != l->port)
		return 0;
	l->uid = (long)m->idiag_uid;
	l->inode = m->idiag_inode;
	return 1;
}

/* Who holds port: "by pid P (uid U)" as far as the kernel and /proc tell. The pid costs a walk of
 * every process's descriptors, so it is looked for once per listening socket (*inode: the last
 * one named, out kept from then). */
static void who_listens(const char *proc_root, int port, unsigned long *inode, char *out, size_t len)
{
	struct listener l = { .port = port, .uid = -1 };
	for (int fam = AF_INET; l.uid < 0 && fam != 0; fam = fam == AF_INET ? AF_INET6 : 0) {
		struct inet_diag_req_v2 r = { .sdiag_family = (unsigned char)fam, .sdiag_protocol = IPPROTO_TCP,
					      .idiag_states = 1u << 10 /* TCP_LISTEN */ };
		(void)diag(&r, 1, take_listener, &l);
	}
	if (l.uid < 0) {
		*inode = 0;
		snprintf(out, len, "by a socket the kernel did not name");
		return;
	}
	if (l.inode == *inode && out[0] != '\0')
		return;
	*inode = l.inode;
	/* The process: whose descriptor is socket:[inode] (hostPID: every process of the node). */
	long pid = -1;
	char want[64];
	snprintf(want, sizeof(want), "socket:[%lu]", l.inode);
	DIR *pd = opendir(proc_root);
	struct dirent *pe;
	while (pid < 0 && pd != NULL && (pe = readdir(pd)) != NULL) {
		if (pe->d_name[0] < '1' || pe->d_name[0] > '9')
			continue;
		char fdp[PATH_MAX];
		snprintf(fdp, sizeof(fdp), "%s/%s/fd", proc_root, pe->d_name);
		DIR *fd = opendir(fdp);
		struct dirent *fe;
		while (fd != NULL && (fe = readdir(fd)) != NULL) {
			char lp[PATH_MAX + 300], tgt[80];
			snprintf(lp, sizeof(lp), "%s/%s", fdp, fe->d_name);
			ssize_t n = readlink(lp, tgt, sizeof(tgt) - 1);
			if (n > 0 && (size_t)n == strlen(want) && memcmp(tgt, want, (size_t)n) == 0) {
				pid = strtol(pe->d_name, NULL, 10);
				break;
			}
		}
		if (fd != NULL)
			closedir(fd);
	}
	if (pd != NULL)
		closedir(pd);
	if (pid > 0)
		snprintf(out, len, "by pid %ld (uid %ld)", pid, l.uid);
	else
		snprintf(out, len, "by a socket of uid %ld (inode %lu)", l.uid, l.inode);
}

/* ---- the listener ---- */

static int try_listen(struct agent_ocisrv *s, char *why, size_t len)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(why, len, "socket: %s", strerror(errno));
		return -errno;
	}
	/* SO_REUSEADDR so that our own old connections in TIME_WAIT do not hold the port after a
	 * restart; never SO_REUSEPORT, which would let another socket of the same user share it.
	 * A socket listening on the port (whoever's) still makes bind fail. */
	int one = 1;
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)s->cfg.port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK); /* loopback only: nothing here is for another machine */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		int e = errno;
		close(fd);
		if (e == EADDRINUSE) {
			who_listens(s->cfg.proc_root, s->cfg.port, &s->who_inode, s->who, sizeof(s->who));
			snprintf(why, len, "127.0.0.1:%d is taken %s", s->cfg.port, s->who);
		} else {
			snprintf(why, len, "127.0.0.1:%d: %s", s->cfg.port, strerror(e));
		}
		return -e;
	}
	s->lfd = fd;
	return 0;
}

/* ---- connections ---- */

/* A misconfiguration, logged once a minute at most: which says what it looks like. */
static void hint(struct agent_ocisrv *s, int which, const char *detail)
{
	static const char *const what[] = {
		[HINT_PLAIN] = "a plain HTTP request: is containerd's registry host configuration in place (its "
			       "config_path naming the directory the agent writes hosts.toml to; docs/install.md)?",
		[HINT_NOCERT] = "a TLS client without the node's client certificate: containerd reads it from the "
				"hosts.toml the agent writes; is that directory containerd's config_path?",
		[HINT_REFUSED] = "every serving slot is busy with a request; a new connection was closed (containerd "
				 "retries)",
	};
	double now = gcr_time_mono_ms();
	if (s->last_hint[which] != 0 && now - s->last_hint[which] < HINT_EVERY_MS)
		return;
	s->last_hint[which] = now;
	GCR_LOG(GCR_LOG_WARN, "ocireg", "127.0.0.1:%d: %s%s%s", s->cfg.port, what[which], detail[0] ? " " : "", detail);
}

static void drop_pend(struct agent_ocisrv *s, unsigned int i)
{
	gnutls_deinit(s->pend[i].s);
	close(s->pend[i].fd);
	s->pend[i] = s->pend[--s->npend];
}

/* Takes fd into the handshake table, making room by the rule in the file's comment. */
static void admit(struct agent_ocisrv *s, int fd, long uid)
{
	unsigned int mine = 0, victim = UINT_MAX;
	for (unsigned int i = 0; i < s->npend; i++) {
		if (s->pend[i].uid != uid)
			continue;
		mine++;
		if (victim == UINT_MAX || s->pend[i].since < s->pend[victim].since)
			victim = i;
	}
	unsigned int cap = uid == 0 ? s->cfg.pending_root : s->cfg.pending_per_uid;
	if (mine < cap)
		victim = UINT_MAX;
	if (victim == UINT_MAX && s->npend >= s->cfg.pending_max) {
		/* The busiest user's oldest. */
		unsigned int best = 0;
		for (unsigned int i = 0; i < s->npend; i++) {
			unsigned int n = 0, old = i;
			for (unsigned int j = 0; j < s->npend; j++) {
				if (s->pend[j].uid != s->pend[i].uid)
					continue;
				n++;
				if (s->pend[j].since < s->pend[old].since)
					old = j;
			}
			if (n > best) {
				best = n;
				victim = old;
			}
		}
	}
	if (victim != UINT_MAX) {
		drop_pend(s, victim);
		count(s, &s->st.evicted);
	}
	gnutls_session_t ss;
	if (gnutls_init(&ss, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL) < 0) {
		close(fd);
		return;
	}
	if (gnutls_priority_set(ss, s->prio) < 0 ||
	    gnutls_credentials_set(ss, GNUTLS_CRD_CERTIFICATE, agent_regtls_cred(s->cfg.tls)) < 0) {
		gnutls_deinit(ss);
		close(fd);
		return;
	}
	gnutls_certificate_server_set_request(ss, GNUTLS_CERT_REQUIRE);
	gnutls_transport_set_int(ss, fd);
	double now = gcr_time_mono_ms();
	s->pend[s->npend++] = (struct pend){ .fd = fd, .s = ss, .uid = uid, .since = now,
					    .deadline = now + s->cfg.handshake_ms };
}

static void *serve(void *arg);

/* An authenticated connection: a thread of its own, room made from an idle one. */
static void handoff(struct agent_ocisrv *s, int fd, gnutls_session_t ss, long uid)
{
	struct agent_ocisrv_conn *c = calloc(1, sizeof(*c));
	int fl = fcntl(fd, F_GETFL);
	struct timeval rt = { .tv_sec = s->cfg.idle_ms / 1000, .tv_usec = (s->cfg.idle_ms % 1000) * 1000 };
	struct timeval wt = { .tv_sec = s->cfg.send_ms / 1000, .tv_usec = (s->cfg.send_ms % 1000) * 1000 };
	if (c == NULL || fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &wt, sizeof(wt)) < 0) {
		free(c);
		gnutls_deinit(ss);
		close(fd);
		return;
	}
	*c = (struct agent_ocisrv_conn){ .srv = s, .fd = fd, .s = ss, .uid = uid, .idle = 1,
					 .idle_since = gcr_time_mono_ms() };
	pthread_mutex_lock(&s->lock);
	unsigned int closing = 0;
	struct agent_ocisrv_conn *old = NULL;
	for (struct agent_ocisrv_conn *o = s->conns; o != NULL; o = o->next) {
		closing += (unsigned int)o->closing;
		if (o->idle && !o->closing && (old == NULL || o->idle_since < old->idle_since))
			old = o;
	}
	if (s->nserving - closing >= s->cfg.serving_max) {
		if (old == NULL) {
			s->st.refused++;
			pthread_mutex_unlock(&s->lock);
			hint(s, HINT_REFUSED, "");
			gnutls_deinit(ss);
			close(fd);
			free(c);
			return;
		}
		old->closing = 1;
		(void)shutdown(old->fd, SHUT_RDWR); /* its thread sees the end and leaves */
		s->st.evicted++;
	}
	c->next = s->conns;
	s->conns = c;
	s->nserving++;
	s->st.authenticated++;
	pthread_mutex_unlock(&s->lock);
	pthread_attr_t at;
	pthread_t th;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256u << 10);
	int rc = pthread_create(&th, &at, serve, c);
	pthread_attr_destroy(&at);
	if (rc != 0) {
		c->broken = 1;
		serve(c); /* tears it down at once: it has nothing to read without a thread */
	}
}

/* Plain HTTP where TLS was expected: containerd has no host configuration for the port (or a
 * curl by hand). Says so in the log and on the wire, then drops it. 1 when it was. */
static int plain_http(struct agent_ocisrv *s, struct pend *p)
{
	char b[5];
	ssize_t n = recv(p->fd, b, sizeof(b), MSG_PEEK | MSG_DONTWAIT);
	if (n < 4 || (memcmp(b, "GET ", 4) != 0 && memcmp(b, "HEAD", 4) != 0))
		return 0;
	static const char msg[] = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
				  "Content-Length: 72\r\n\r\n"
				  "this registry speaks TLS only, with the client certificate of hosts.toml\n";
	(void)send(p->fd, msg, sizeof(msg) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	hint(s, HINT_PLAIN, "");
	return 1;
}

/* One step of a handshake; 1 when the entry is done with (handed off or dropped). */
static int step(struct agent_ocisrv *s, unsigned int i)
{
	struct pend *p = &s->pend[i];
	if (!p->peeked) {
		p->peeked = 1;
		if (plain_http(s, p)) {
			count(s, &s->st.handshake_failed);
			drop_pend(s, i);
			return 1;
		}
	}
	int rc = gnutls_handshake(p->s);
	if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED)
		return 0;
	struct gcr_err err = { 0 };
	if (rc == 0 && agent_regtls_check_client(p->s, &err) == 0) {
		int fd = p->fd;
		gnutls_session_t ss = p->s;
		long uid = p->uid;
		s->pend[i] = s->pend[--s->npend];
		handoff(s, fd, ss, uid);
		return 1;
	}
	if (rc == GNUTLS_E_NO_CERTIFICATE_FOUND || rc == GNUTLS_E_CERTIFICATE_REQUIRED || rc == 0)
		hint(s, HINT_NOCERT, rc == 0 ? err.msg : gnutls_strerror(rc));
	else
		GCR_LOG(GCR_LOG_DEBUG, "ocireg", "handshake failed (uid %ld): %s", p->uid, gnutls_strerror(rc));
	count(s, &s->st.handshake_failed);
	drop_pend(s, i);
	return 1;
}

static void report(struct agent_ocisrv *s, int listening, const char *why)
{
	pthread_mutex_lock(&s->lock);
	s->st.listening = listening;
	pthread_mutex_unlock(&s->lock);
	if (s->cfg.state != NULL)
		s->cfg.state(s->cfg.data, listening, why);
}

static void *front(void *arg)
{
	struct agent_ocisrv *s = arg;
	struct pollfd *pfd = calloc(s->cfg.pending_max + 2, sizeof(*pfd));
	double next_try = 0;
	int backoff = s->cfg.backoff_min_ms, reported = -1;
	unsigned long long misses = 0;
	char why[300] = "", last_why[300] = "";
	while (pfd != NULL && !atomic_load(&s->stop)) {
		double now = gcr_time_mono_ms();
		if (s->lfd < 0 && now >= next_try) {
			if (try_listen(s, why, sizeof(why)) == 0) {
				GCR_LOG(GCR_LOG_INFO, "ocireg", "listening on https://127.0.0.1:%d (TLS, client certificate "
					"required)%s", s->cfg.port, misses ? " now that the port is free" : "");
				misses = 0;
				backoff = s->cfg.backoff_min_ms;
				last_why[0] = '\0';
				if (reported != 1)
					report(s, 1, NULL);
				reported = 1;
			} else {
				count(s, &s->st.bind_failures);
				/* One line when it starts or changes, then every 10th try (back-off capped). */
				if (misses++ % 10 == 0 || strcmp(why, last_why) != 0)
					GCR_LOG(GCR_LOG_WARN, "ocireg", "%s: checkpoint images are not served; trying again "
						"in %d ms (try %llu; the agent runs on)", why, backoff, misses);
				snprintf(last_why, sizeof(last_why), "%s", why);
				if (reported != 0)
					report(s, 0, why);
				reported = 0;
				next_try = now + backoff;
				backoff = backoff * 2 < s->cfg.backoff_max_ms ? backoff * 2 : s->cfg.backoff_max_ms;
			}
		}
		nfds_t n = 0;
		pfd[n++] = (struct pollfd){ .fd = s->wake[0], .events = POLLIN };
		int lslot = -1;
		if (s->lfd >= 0) {
			lslot = (int)n;
			pfd[n++] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
		}
		double until = s->lfd < 0 ? next_try : now + 60000;
		for (unsigned int i = 0; i < s->npend; i++) {
			pfd[n++] = (struct pollfd){ .fd = s->pend[i].fd,
						    .events = gnutls_record_get_direction(s->pend[i].s) ? POLLOUT : POLLIN };
			if (s->pend[i].deadline < until)
				until = s->pend[i].deadline;
		}
		int timeout = until <= now ? 0 : (int)(until - now) + 1;
		int pr = poll(pfd, n, timeout);
		if (pr < 0 && errno != EINTR)
			break;
		if (pr > 0 && (pfd[0].revents & POLLIN)) {
			char b[64];
			while (read(s->wake[0], b, sizeof(b)) > 0)
				;
		}
		/* Handshakes first (their slots may move), by descriptor since the table changes. */
		unsigned int np = (unsigned int)(n - (nfds_t)(lslot >= 0 ? 2 : 1));
		for (unsigned int k = 0; pr > 0 && k < np; k++) {
			struct pollfd *q = &pfd[n - np + k];
			if (q->revents == 0)
				continue;
			for (unsigned int i = 0; i < s->npend; i++)
				if (s->pend[i].fd == q->fd) {
					step(s, i);
					break;
				}
		}
		now = gcr_time_mono_ms();
		for (unsigned int i = 0; i < s->npend;) {
			if (s->pend[i].deadline <= now) {
				GCR_LOG(GCR_LOG_DEBUG, "ocireg", "a handshake not done in %d ms (uid %ld): closed",
					s->cfg.handshake_ms, s->pend[i].uid);
				count(s, &s->st.handshake_failed);
				drop_pend(s, i);
			} else {
				i++;
			}
		}
		if (lslot >= 0 && (pfd[lslot].revents & POLLIN)) {
			for (int k = 0; k < ACCEPT_BURST; k++) {
				struct sockaddr_in peer;
				socklen_t pl = sizeof(peer);
				int fd = accept4(s->lfd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
				if (fd < 0)
					break;
				count(s, &s->st.accepted);
				long uid = pl == sizeof(peer) && peer.sin_family == AF_INET ? peer_uid(&peer, s->cfg.port) : -1;
				admit(s, fd, uid);
			}
		}
	}
	while (s->npend > 0)
		drop_pend(s, s->npend - 1);
	if (s->lfd >= 0)
		close(s->lfd);
	s->lfd = -1;
	free(pfd);
	return NULL;
}

/* ---- one authenticated connection ---- */

static int send_all(struct agent_ocisrv_conn *c, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = gnutls_record_send(c->s, p, len);
		if (n == GNUTLS_E_INTERRUPTED)
			continue;
		if (n <= 0) {
			c->broken = 1;
			return -EPIPE;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static const char *reason(int code)
{
	switch (code) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	default: return "Internal Server Error";
	}
}

static int head(struct agent_ocisrv_conn *c, int code, const char *ctype, const char *digest, long long len)
{
	char h[512];
	c->replied = 1;
	int n = snprintf(h, sizeof(h),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %lld\r\n"
			 "Docker-Distribution-API-Version: registry/2.0\r\n%s%s%sConnection: %s\r\n\r\n",
			 code, reason(code), ctype, len, digest ? "Docker-Content-Digest: " : "", digest ? digest : "",
			 digest ? "\r\n" : "", c->keep_alive ? "keep-alive" : "close");
	if (n < 0 || (size_t)n >= sizeof(h)) {
		c->broken = 1;
		return -EINVAL;
	}
	return send_all(c, h, (size_t)n);
}

int agent_ocisrv_reply(struct agent_ocisrv_conn *c, int code, const char *ctype, const char *digest,
		       const void *body, size_t len)
{
	int rc = head(c, code, ctype, digest, (long long)len);
	if (rc == 0 && !c->head_only && len > 0)
		rc = send_all(c, body, len);
	return rc;
}

int agent_ocisrv_reply_fd(struct agent_ocisrv_conn *c, int code, const char *ctype, const char *digest, int fd,
			  long long size)
{
	int rc = head(c, code, ctype, digest, size);
	char *buf = rc == 0 && !c->head_only ? malloc(SEND_CHUNK) : NULL;
	if (rc == 0 && !c->head_only && buf == NULL)
		rc = -ENOMEM;
	for (long long off = 0; rc == 0 && buf != NULL && off < size;) {
		size_t want = size - off < (long long)SEND_CHUNK ? (size_t)(size - off) : SEND_CHUNK;
		ssize_t n = pread(fd, buf, want, off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) { /* the file ended early (changed): the client sees a short body */
			rc = n < 0 ? -errno : -EIO;
			break;
		}
		rc = send_all(c, buf, (size_t)n);
		off += n;
	}
	free(buf);
	close(fd);
	if (rc < 0)
		c->broken = 1;
	return rc;
}

long agent_ocisrv_peer_uid(const struct agent_ocisrv_conn *c)
{
	return c->uid;
}

/* Marks c idle or busy; 0 when it is being closed for another. */
static int set_idle(struct agent_ocisrv_conn *c, int idle)
{
	struct agent_ocisrv *s = c->srv;
	pthread_mutex_lock(&s->lock);
	int ok = !c->closing;
	c->idle = idle;
	if (idle)
		c->idle_since = gcr_time_mono_ms();
	else if (ok)
		s->st.requests++;
	pthread_mutex_unlock(&s->lock);
	return ok;
}

static void *serve(void *arg)
{
	struct agent_ocisrv_conn *c = arg;
	struct agent_ocisrv *s = c->srv;
	struct agent_ocisrv_req *req = malloc(sizeof(*req));
	char *buf = malloc(AGENT_OCIDIST_HEAD_MAX);
	size_t have = 0;
	while (req != NULL && buf != NULL && !c->broken && !atomic_load(&s->stop)) {
		struct agent_ocihead h;
		struct gcr_err err = { 0 };
		int rc;
		while ((rc = agent_ocidist_head(buf, have, &h, &err)) == -EAGAIN) {
			ssize_t n = gnutls_record_recv(c->s, buf + have, AGENT_OCIDIST_HEAD_MAX - have);
			if (n == GNUTLS_E_INTERRUPTED)
				continue;
			if (n <= 0) { /* the end, an error, or idle past the timeout */
				c->broken = n != 0;
				goto done;
			}
			have += (size_t)n;
		}
		if (!set_idle(c, 0))
			break;
		c->replied = 0;
		c->keep_alive = 0;
		c->head_only = 0;
		if (rc < 0) {
			GCR_LOG(GCR_LOG_DEBUG, "ocireg", "bad request head: %s", err.msg);
			agent_ocisrv_reply(c, rc == -E2BIG ? 431 : 400, "text/plain", NULL, "bad request\n", 12);
			break;
		}
		c->keep_alive = h.keep_alive;
		c->head_only = h.method == AGENT_OCIMETHOD_HEAD;
		memcpy(req->target, buf + h.target_off, h.target_len);
		req->target[h.target_len] = '\0';
		req->target_len = h.target_len;
		req->method = h.method;
		if (h.method == AGENT_OCIMETHOD_OTHER)
			agent_ocisrv_reply(c, 405, "text/plain", NULL, "read-only registry\n", 19);
		else
			s->cfg.fn(s->cfg.data, c, req);
		if (!c->replied)
			agent_ocisrv_reply(c, 500, "text/plain", NULL, "no answer\n", 10);
		if (!c->keep_alive)
			break;
		memmove(buf, buf + h.len, have - h.len);
		have -= h.len;
		if (!set_idle(c, 1))
			break;
	}
	if (!c->broken)
		(void)gnutls_bye(c->s, GNUTLS_SHUT_WR);
done:
	free(req);
	free(buf);
	gnutls_deinit(c->s);
	close(c->fd);
	pthread_mutex_lock(&s->lock);
	for (struct agent_ocisrv_conn **pp = &s->conns; *pp != NULL; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	s->nserving--;
	pthread_cond_broadcast(&s->gone);
	pthread_mutex_unlock(&s->lock);
	free(c);
	return NULL;
}

/* ---- the server ---- */

int agent_ocisrv_start(const struct agent_ocisrv_cfg *cfg, struct agent_ocisrv **out, struct gcr_err *err)
{
	*out = NULL;
	if (cfg->port <= 0 || cfg->port > 65535 || cfg->tls == NULL || cfg->fn == NULL)
		return gcr_err_set(err, -EINVAL, "registry server: port %d out of 1..65535, or no TLS or handler",
				   cfg->port);
	struct agent_ocisrv *s = calloc(1, sizeof(*s));
	if (s == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	s->cfg = *cfg;
#define DEF(f, v) (s->cfg.f = s->cfg.f > 0 ? s->cfg.f : (v))
	DEF(pending_max, AGENT_OCISRV_PENDING_MAX);
	DEF(pending_per_uid, AGENT_OCISRV_PENDING_PER_UID);
	DEF(pending_root, AGENT_OCISRV_PENDING_ROOT);
	DEF(serving_max, AGENT_OCISRV_SERVING_MAX);
	DEF(handshake_ms, AGENT_OCISRV_HANDSHAKE_MS);
	DEF(idle_ms, AGENT_OCISRV_IDLE_MS);
	DEF(send_ms, AGENT_OCISRV_SEND_MS);
	DEF(backoff_min_ms, AGENT_OCISRV_BACKOFF_MIN_MS);
	DEF(backoff_max_ms, AGENT_OCISRV_BACKOFF_MAX_MS);
#undef DEF
	if (s->cfg.proc_root == NULL)
		s->cfg.proc_root = "/proc";
	s->lfd = -1;
	s->wake[0] = s->wake[1] = -1;
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->gone, NULL);
	int rc = 0;
	const char *epos = NULL;
	s->pend = calloc(s->cfg.pending_max, sizeof(*s->pend));
	if (s->pend == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
	else if (pipe2(s->wake, O_NONBLOCK | O_CLOEXEC) < 0)
		rc = gcr_err_set(err, -errno, "pipe: %s", strerror(errno));
	/* TLS 1.2 and 1.3 (containerd's Go speaks both). */
	else if (gnutls_priority_init(&s->prio, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:%SERVER_PRECEDENCE", &epos) < 0)
		rc = gcr_err_set(err, -EINVAL, "TLS priority string refused at %s", epos ? epos : "?");
	else if ((rc = pthread_create(&s->th, NULL, front, s)) != 0)
		rc = gcr_err_set(err, -rc, "cannot start the registry's thread: %s", strerror(rc));
	else
		s->th_started = 1;
	if (rc < 0) {
		agent_ocisrv_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

void agent_ocisrv_free(struct agent_ocisrv *s)
{
	if (s == NULL)
		return;
	atomic_store(&s->stop, 1);
	if (s->wake[1] >= 0)
		(void)write(s->wake[1], "x", 1);
	if (s->th_started)
		pthread_join(s->th, NULL);
	/* The serving threads: their sockets shut, each leaves its loop and says so. */
	pthread_mutex_lock(&s->lock);
	for (struct agent_ocisrv_conn *c = s->conns; c != NULL; c = c->next) {
		c->closing = 1;
		(void)shutdown(c->fd, SHUT_RDWR);
	}
	while (s->nserving > 0)
		pthread_cond_wait(&s->gone, &s->lock);
	pthread_mutex_unlock(&s->lock);
	if (s->prio != NULL)
		gnutls_priority_deinit(s->prio);
	for (int i = 0; i < 2; i++)
		if (s->wake[i] >= 0)
			close(s->wake[i]);
	free(s->pend);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->gone);
	free(s);
}

void agent_ocisrv_stats(struct agent_ocisrv *s, struct agent_ocisrv_stats *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->st;
	out->serving = s->nserving;
	pthread_mutex_unlock(&s->lock);
	/* The front thread's own table, read without a lock: a gauge. */
	out->pending = __atomic_load_n(&s->npend, __ATOMIC_RELAXED);
}
