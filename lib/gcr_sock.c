/* gcr_sock: Unix socket plumbing shared by the shim, gcrctl and the agent.
 * Every read is bounded in size and time so a bad peer cannot wedge us. */
#include "gcr_sock.h"
#include "gcr_time.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Connections the kernel queues before accept: a burst of clients (the agent's call_all,
 * a flood) waits there instead of being refused while the server is busy with one request. */
#define LISTEN_BACKLOG 128
/* Names tried for a shim's socket before giving up: the plain stem, then random ones. */
#define UNIQUE_TRIES 8

static int fill_addr(struct sockaddr_un *sa, const char *path, struct gcr_err *err)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket path too long: %s", path);
	strcpy(sa->sun_path, path);
	return 0;
}

/* Milliseconds left until deadline (-1: forever). */
static int left_ms(long long deadline)
{
	if (deadline < 0)
		return -1;
	long long left = deadline - (long long)gcr_time_mono_ms();
	return left < 0 ? 0 : (int)left;
}

/* Makes dir (mode dir_mode) if missing, its missing parents too when parents (mode 0755:
 * the way to a shared socket must be open). An existing dir we own gets the search
 * bits dir_mode asks for, so a shared socket is reachable; nothing else of it changes
 * (the device plugin's 01733 socket dirs stay as they are). mkdir's mode passes through
 * the umask, hence the fchmod. */
static int make_dir(char *dir, mode_t dir_mode, bool parents, struct gcr_err *err)
{
	int created = mkdir(dir, dir_mode) == 0;
	if (!created && errno == ENOENT && parents) {
		char *slash = strrchr(dir, '/');
		if (slash != NULL && slash != dir) {
			*slash = '\0';
			int rc = make_dir(dir, 0755, true, err);
			*slash = '/';
			if (rc < 0)
				return rc;
			created = mkdir(dir, dir_mode) == 0;
		}
	}
	if (!created && errno != EEXIST)
		return gcr_err_set(err, -errno, "cannot create %s: %s", dir, strerror(errno));
	/* O_PATH: a device plugin's 01733 dir is searchable and writable for a non-root shim,
	 * not readable, and opening it for reading would fail (found on a real node). */
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return gcr_err_set(err, -e, "cannot open %s: %s", dir, strerror(e));
	}
	close(fd);
	mode_t want = created ? dir_mode : (st.st_mode & 07777) | (dir_mode & 0111);
	int rc = 0;
	/* Only a dir we own changes (a path, not the fd: fchmod does not take an O_PATH fd). */
	if (st.st_uid == geteuid() && (st.st_mode & 07777) != want && chmod(dir, want) < 0)
		rc = gcr_err_set(err, -errno, "cannot chmod %s to %04o: %s", dir, (unsigned)want, strerror(errno));
	return rc;
}

/* bind, chmod, then listen: the file's mode is final before anyone can connect (a socket
 * that does not listen yet refuses every connection), without the umask, which is the
 * whole process's (the shim's host application, the agent's other threads) and racy to
 * change. fchmod on the socket's fd would not reach the file. The directory is ours (or
 * sticky), so nobody swaps the name between bind and chmod. */
static int listen_mode(const char *path, mode_t dir_mode, mode_t sock_mode, bool parents,
		       struct gcr_err *err)
{
	struct sockaddr_un sa;
	int rc = fill_addr(&sa, path, err);
	if (rc < 0)
		return rc;
	char dir[sizeof(sa.sun_path)];
	strcpy(dir, path);
	char *slash = strrchr(dir, '/');
	if (slash != NULL && slash != dir) {
		*slash = '\0';
		rc = make_dir(dir, dir_mode, parents, err);
		if (rc < 0)
			return rc;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return gcr_err_set(err, -errno, "socket: %s", strerror(errno));
	int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	/* A file already there is replaced only when it is a dead socket of ours (never someone
	 * else's file, never a live server's socket). */
	struct gcr_err e2;
	if (b < 0 && errno == EADDRINUSE && gcr_sock_remove_stale(path, &e2) == 1)
		b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (b < 0) {
		rc = errno == EADDRINUSE
			     ? gcr_err_set(err, -EADDRINUSE, "cannot listen on %s: the name is taken by a live "
					   "socket or another user's file; left as it is", path)
			     : gcr_err_set(err, -errno, "cannot listen on %s: %s", path, strerror(errno));
	} else if (chmod(path, sock_mode) < 0) {
		rc = gcr_err_set(err, -errno, "cannot chmod %s to %04o: %s; nothing listens there", path,
				 (unsigned)sock_mode, strerror(errno));
		unlink(path);
	} else if (listen(fd, LISTEN_BACKLOG) < 0) {
		rc = gcr_err_set(err, -errno, "cannot listen on %s: %s", path, strerror(errno));
		unlink(path);
	}
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

int gcr_sock_listen(const char *path, struct gcr_err *err)
{
	return listen_mode(path, 0700, 0600, false, err);
}

int gcr_sock_listen_shared(const char *path, struct gcr_err *err)
{
	return listen_mode(path, 0711, 0666, true, err);
}

int gcr_sock_shim_stem(pid_t pid, pid_t name_pid, char *buf, size_t len, struct gcr_err *err)
{
	char p[64], stat[1024];
	if (pid > 0)
		snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	else
		snprintf(p, sizeof(p), "/proc/self/stat");
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot read %s: %s", p, strerror(errno));
	ssize_t n = read(fd, stat, sizeof(stat) - 1);
	int e = errno;
	close(fd);
	if (n <= 0)
		return gcr_err_set(err, n < 0 ? -e : -EIO, "cannot read %s", p);
	stat[n] = '\0';
	/* comm (field 2) may hold spaces and ')': fields are counted after its last ')'. From
	 * there, field 3 (state) is the first and starttime (field 22) the twentieth. */
	char *f = strrchr(stat, ')');
	unsigned long long start = 0;
	int field = 2;
	while (f != NULL && field < 22) {
		f = strchr(f + 1, ' ');
		field++;
	}
	if (f == NULL || sscanf(f + 1, "%llu", &start) != 1)
		return gcr_err_set(err, -EPROTO, "no start time in %s", p);
	if (snprintf(buf, len, "gcr-%d-%llu", (int)name_pid, start) >= (int)len)
		return gcr_err_set(err, -ENAMETOOLONG, "socket name too long");
	return 0;
}

int gcr_sock_remove_stale(const char *path, struct gcr_err *err)
{
	struct stat before, after;
	if (lstat(path, &before) < 0)
		return errno == ENOENT ? 0 : gcr_err_set(err, -errno, "cannot stat %s: %s", path, strerror(errno));
	if (!S_ISSOCK(before.st_mode) || (before.st_uid != geteuid() && geteuid() != 0))
		return 0; /* not a socket, or another user's: never ours to remove */
	struct sockaddr_un sa;
	int rc = fill_addr(&sa, path, err);
	if (rc < 0)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return gcr_err_set(err, -errno, "socket: %s", strerror(errno));
	/* Only ECONNREFUSED means nobody listens: a live server answers, or is EAGAIN with a
	 * full backlog (a stopped process), and keeps its socket. */
	int c = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	close(fd);
	if (c == 0 || e != ECONNREFUSED)
		return 0;
	/* The same file as the one checked: another cleaner may have removed it meanwhile and a
	 * new server bound the name. */
	if (lstat(path, &after) < 0 || after.st_ino != before.st_ino || after.st_dev != before.st_dev)
		return 0;
	if (unlink(path) < 0)
		return errno == ENOENT ? 0 : gcr_err_set(err, -errno, "cannot remove %s: %s", path, strerror(errno));
	return 1;
}

int gcr_sock_reap(const char *dir, struct gcr_err *err)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return gcr_err_set(err, -errno, "cannot open %s: %s", dir, strerror(errno));
	struct dirent *de;
	int removed = 0;
	while ((de = readdir(d)) != NULL) {
		size_t nl = strlen(de->d_name);
		char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
		struct gcr_err e2;
		if (strncmp(de->d_name, "gcr-", 4) != 0 || nl < 5 || strcmp(de->d_name + nl - 5, ".sock") != 0 ||
		    snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >= (int)sizeof(path))
			continue;
		removed += gcr_sock_remove_stale(path, &e2) == 1;
	}
	closedir(d);
	return removed;
}

int gcr_sock_listen_unique(const char *dir, const char *stem, char *path, size_t len, struct gcr_err *err)
{
	struct sockaddr_un sa;
	char tmp[sizeof(sa.sun_path)];
	int rc = 0, fd = -1;
	unsigned long long r[UNIQUE_TRIES + 1];
	path[0] = '\0';
	/* Random parts make a name nobody can take first; without getrandom (old kernels, no
	 * entropy yet) time and pid still make a squatter's guess unlikely. */
	if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
		for (int i = 0; i <= UNIQUE_TRIES; i++)
			r[i] = (unsigned long long)(long long)gcr_time_mono_ms() * 2654435761u ^ ((unsigned long long)getpid() << 20) ^
			       (unsigned long long)i * 0x9e3779b97f4a7c15ull;
	/* Bound, listening and mode 0600 under a private temporary name first, then given its
	 * public name with link(), which never replaces a file: under the public name the socket
	 * is always a listening one, so a cleaner never takes it for a dead one (a bound but not
	 * yet listening socket refuses connections, as a dead one does). */
	if (snprintf(tmp, sizeof(tmp), "%s/.%s-%016llx.tmp", dir, stem, r[UNIQUE_TRIES]) >= (int)sizeof(tmp))
		return gcr_err_set(err, -ENAMETOOLONG, "socket path too long in %s", dir);
	fd = listen_mode(tmp, 0700, 0600, false, err);
	if (fd < 0)
		return fd;
	for (int i = 0; i < UNIQUE_TRIES; i++) {
		int n = i == 0 ? snprintf(path, len, "%s/%s.sock", dir, stem)
			       : snprintf(path, len, "%s/%s-%016llx.sock", dir, stem, r[i]);
		if (n < 0 || (size_t)n >= len || (size_t)n >= sizeof(sa.sun_path)) {
			rc = gcr_err_set(err, -ENAMETOOLONG, "socket path too long in %s", dir);
			break;
		}
		if (link(tmp, path) == 0) {
			rc = 0;
			break;
		}
		rc = gcr_err_set(err, -errno, "cannot name the socket %s: %s", path, strerror(errno));
		if (errno != EEXIST)
			break;
		/* A dead socket of ours under the plain name (the same pid and start time after a
		 * reboot, in a directory that outlived it) is replaced once. */
		struct gcr_err e2;
		if (i == 0 && gcr_sock_remove_stale(path, &e2) == 1 && link(tmp, path) == 0) {
			rc = 0;
			break;
		}
	}
	unlink(tmp);
	if (rc < 0) {
		close(fd);
		path[0] = '\0';
		return gcr_err_wrap(err, "no control socket in %s after %d names", dir, UNIQUE_TRIES);
	}
	return fd;
}

int gcr_sock_connect(const char *path, int timeout_ms, struct gcr_err *err)
{
	struct sockaddr_un sa;
	int rc = fill_addr(&sa, path, err);
	if (rc < 0)
		return rc;
	/* Blocking connect bounded by SO_SNDTIMEO: a Unix socket's non-blocking connect to a full
	 * backlog fails with EAGAIN and leaves the socket unconnected (poll then reports it
	 * writable and SO_PEERCRED reads pid 0), whereas a blocking one waits for room up to the
	 * send timeout. The socket is made non-blocking once connected. timeout_ms <= 0: no wait. */
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (timeout_ms > 0 ? 0 : SOCK_NONBLOCK), 0);
	if (fd < 0)
		return gcr_err_set(err, -errno, "socket: %s", strerror(errno));
	struct timeval tv = { .tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000L };
	if (timeout_ms > 0 && setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
		rc = gcr_err_set(err, -errno, "SO_SNDTIMEO: %s", strerror(errno));
		close(fd);
		return rc;
	}
	double deadline = gcr_time_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		if (e == EINTR && gcr_time_mono_ms() < deadline)
			continue;
		close(fd);
		if (e == EAGAIN || e == EINTR || e == EINPROGRESS)
			return gcr_err_set(err, -ETIMEDOUT, "cannot connect to %s: timed out (its backlog is full)", path);
		return gcr_err_set(err, -e, "cannot connect to %s: %s", path, strerror(e));
	}
	struct timeval zero = { 0, 0 };
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &zero, sizeof(zero)) < 0) {
		rc = gcr_err_set(err, -errno, "cannot set up the socket to %s: %s", path, strerror(errno));
		close(fd);
		return rc;
	}
	return fd;
}

int gcr_sock_peer(int fd, struct gcr_peer *peer, struct gcr_err *err)
{
	struct ucred uc;
	socklen_t len = sizeof(uc);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0)
		return gcr_err_set(err, -errno, "SO_PEERCRED: %s", strerror(errno));
	peer->pid = uc.pid;
	peer->uid = uc.uid;
	peer->gid = uc.gid;
	return 0;
}

int gcr_sock_write_all(int fd, const char *buf, size_t len, int timeout_ms, struct gcr_err *err)
{
	return gcr_sock_write_fds(fd, buf, len, NULL, 0, timeout_ms, err);
}

int gcr_sock_write_fds(int fd, const char *buf, size_t len, const int *fds, int nfds, int timeout_ms,
		       struct gcr_err *err)
{
	if (nfds < 0 || nfds > GCR_SOCK_MAX_FDS || (nfds > 0 && len == 0))
		return gcr_err_set(err, -EINVAL, "%d descriptors with %zu bytes: at most %d, with a line", nfds, len,
				   GCR_SOCK_MAX_FDS);
	union {
		char b[CMSG_SPACE(GCR_SOCK_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov;
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > 0) { /* they go with the first bytes sent */
		memset(&ctl, 0, sizeof(ctl));
		mh.msg_control = ctl.b;
		mh.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	long long deadline = timeout_ms < 0 ? -1 : (long long)gcr_time_mono_ms() + timeout_ms;
	while (len > 0) {
		iov = (struct iovec){ .iov_base = (void *)buf, .iov_len = len };
		ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			mh.msg_control = NULL;
			mh.msg_controllen = 0;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN)
			return gcr_err_set(err, -errno, "send: %s", strerror(errno));
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int pr = poll(&p, 1, left_ms(deadline));
		if (pr == 0)
			return gcr_err_set(err, -ETIMEDOUT, "send: timed out");
		if (pr < 0 && errno != EINTR)
			return gcr_err_set(err, -errno, "poll: %s", strerror(errno));
	}
	return 0;
}

int gcr_linebuf_init(struct gcr_linebuf *lb, size_t max)
{
	memset(lb, 0, sizeof(*lb));
	lb->max = max;
	return 0;
}

void gcr_linebuf_free(struct gcr_linebuf *lb)
{
	if (lb == NULL)
		return;
	free(lb->buf);
	memset(lb, 0, sizeof(*lb));
}

/* Drops the line handed out last: its '\n' became the buffer's only NUL (NULs from the
 * peer are refused). */
static void drop_taken(struct gcr_linebuf *lb)
{
	char *nul = lb->len ? memchr(lb->buf, '\0', lb->len) : NULL;
	if (nul != NULL) {
		size_t used = (size_t)(nul - lb->buf) + 1;
		memmove(lb->buf, lb->buf + used, lb->len - used);
		lb->len -= used;
	}
}

/* Room for at least one more byte (lb->len < lb->max); returns how many bytes fit. */
static int make_room(struct gcr_linebuf *lb, size_t *room, struct gcr_err *err)
{
	if (lb->cap - lb->len < 4096 && lb->cap < lb->max + 1) {
		size_t ncap = lb->cap ? lb->cap * 2 : 8192;
		if (ncap > lb->max + 1)
			ncap = lb->max + 1;
		char *nb = realloc(lb->buf, ncap);
		if (nb == NULL)
			return gcr_err_set(err, -ENOMEM, "out of memory reading a line");
		lb->buf = nb;
		lb->cap = ncap;
	}
	*room = lb->cap - lb->len;
	if (*room > lb->max - lb->len)
		*room = lb->max - lb->len;
	return 0;
}

int gcr_linebuf_next(struct gcr_linebuf *lb, char **line, struct gcr_err *err)
{
	drop_taken(lb);
	char *nl = lb->len ? memchr(lb->buf, '\n', lb->len) : NULL;
	if (nl != NULL) {
		*nl = '\0';
		*line = lb->buf;
		return 1;
	}
	if (lb->len >= lb->max)
		return gcr_err_set(err, -EMSGSIZE, "line longer than %zu bytes", lb->max);
	return 0;
}

long gcr_linebuf_push(struct gcr_linebuf *lb, const char *data, size_t n, struct gcr_err *err)
{
	drop_taken(lb);
	if (lb->len >= lb->max)
		return memchr(lb->buf, '\n', lb->len) != NULL ? 0 : gcr_err_set(err, -EMSGSIZE, "line longer than %zu bytes", lb->max);
	size_t room;
	int rc = make_room(lb, &room, err);
	if (rc < 0)
		return rc;
	if (n > room)
		n = room;
	if (memchr(data, '\0', n) != NULL)
		return gcr_err_set(err, -EBADMSG, "NUL byte in a protocol line");
	memcpy(lb->buf + lb->len, data, n);
	lb->len += n;
	return (long)n;
}

/* recvmsg into buf, the descriptors that came with it kept in fds (up to max) or closed; fds
 * NULL: no room for any, and the kernel drops what a peer passed. */
static ssize_t recv_fds(int fd, char *buf, size_t room, int *fds, int *nfds, int max)
{
	union {
		char b[CMSG_SPACE(GCR_SOCK_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = room };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = fds != NULL ? ctl.b : NULL,
			     .msg_controllen = fds != NULL ? sizeof(ctl.b) : 0 };
	ssize_t n;
	do
		n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return n;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int got;
			memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (*nfds < max)
				fds[(*nfds)++] = got;
			else
				close(got);
		}
	}
	return n;
}

long gcr_linebuf_fill(struct gcr_linebuf *lb, int fd, struct gcr_err *err)
{
	return gcr_linebuf_fill_fds(lb, fd, NULL, NULL, 0, err);
}

long gcr_linebuf_fill_fds(struct gcr_linebuf *lb, int fd, int *fds, int *nfds, int max, struct gcr_err *err)
{
	drop_taken(lb);
	if (lb->len >= lb->max)
		return memchr(lb->buf, '\n', lb->len) != NULL ? 0 : gcr_err_set(err, -EMSGSIZE, "line longer than %zu bytes", lb->max);
	size_t room;
	int rc = make_room(lb, &room, err);
	if (rc < 0)
		return rc;
	ssize_t n = recv_fds(fd, lb->buf + lb->len, room, fds, nfds, max);
	if (n == 0)
		return gcr_err_set(err, -ECONNRESET, "peer closed the connection");
	if (n < 0)
		return gcr_err_set(err, -errno, "recv: %s", strerror(errno));
	/* A NUL inside a line would confuse the consumer: refuse it. */
	if (memchr(lb->buf + lb->len, '\0', (size_t)n) != NULL)
		return gcr_err_set(err, -EBADMSG, "NUL byte in a protocol line");
	lb->len += (size_t)n;
	return (long)n;
}

int gcr_linebuf_read(struct gcr_linebuf *lb, int fd, int timeout_ms, char **line,
		     struct gcr_err *err)
{
	long long deadline = timeout_ms < 0 ? -1 : (long long)gcr_time_mono_ms() + timeout_ms;
	for (;;) {
		int rc = gcr_linebuf_next(lb, line, err);
		if (rc != 0)
			return rc < 0 ? rc : 0;
		long n = gcr_linebuf_fill(lb, fd, err);
		if (n >= 0)
			continue;
		if (n != -EAGAIN && n != -EWOULDBLOCK)
			return (int)n;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, left_ms(deadline));
		if (pr == 0)
			return gcr_err_set(err, -ETIMEDOUT, "timed out waiting for a reply");
		if (pr < 0 && errno != EINTR)
			return gcr_err_set(err, -errno, "poll: %s", strerror(errno));
	}
}
