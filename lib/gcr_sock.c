/* gcr_sock: Unix socket plumbing shared by the shim, gcrctl and the agent.
 * Every read is bounded in size and time so a bad peer cannot wedge us. */
#include "gcr_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static int fill_addr(struct sockaddr_un *sa, const char *path, struct gcr_err *err)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	if (strlen(path) >= sizeof(sa->sun_path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket path too long: %s", path);
	strcpy(sa->sun_path, path);
	return 0;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until deadline (-1: forever). */
static int left_ms(long long deadline)
{
	if (deadline < 0)
		return -1;
	long long left = deadline - now_ms();
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
	unlink(path); /* a stale file from a dead process with our pid */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		rc = gcr_err_set(err, -errno, "cannot listen on %s: %s", path, strerror(errno));
	} else if (chmod(path, sock_mode) < 0) {
		rc = gcr_err_set(err, -errno, "cannot chmod %s to %04o: %s; nothing listens there", path,
				 (unsigned)sock_mode, strerror(errno));
		unlink(path);
	} else if (listen(fd, 16) < 0) {
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

int gcr_sock_connect(const char *path, int timeout_ms, struct gcr_err *err)
{
	struct sockaddr_un sa;
	int rc = fill_addr(&sa, path, err);
	if (rc < 0)
		return rc;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return gcr_err_set(err, -errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno != EINPROGRESS && errno != EAGAIN) {
			int e = errno;
			close(fd);
			return gcr_err_set(err, -e, "cannot connect to %s: %s", path, strerror(e));
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		int so = 0;
		socklen_t sl = sizeof(so);
		if (poll(&p, 1, timeout_ms) <= 0 ||
		    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0 || so != 0) {
			close(fd);
			return gcr_err_set(err, -ETIMEDOUT, "cannot connect to %s: timed out", path);
		}
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
	long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	while (len > 0) {
		ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			buf += n;
			len -= (size_t)n;
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

int gcr_linebuf_read(struct gcr_linebuf *lb, int fd, int timeout_ms, char **line,
		     struct gcr_err *err)
{
	long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
	/* Drop the line handed out by the previous call. */
	char *nl = lb->len ? memchr(lb->buf, '\0', lb->len) : NULL;
	if (nl != NULL) {
		size_t used = (size_t)(nl - lb->buf) + 1;
		memmove(lb->buf, lb->buf + used, lb->len - used);
		lb->len -= used;
	}
	for (;;) {
		nl = lb->len ? memchr(lb->buf, '\n', lb->len) : NULL;
		if (nl != NULL) {
			*nl = '\0';
			*line = lb->buf;
			return 0;
		}
		if (lb->len >= lb->max)
			return gcr_err_set(err, -EMSGSIZE, "line longer than %zu bytes", lb->max);
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
		size_t room = lb->cap - lb->len;
		if (room > lb->max - lb->len)
			room = lb->max - lb->len;
		ssize_t n = recv(fd, lb->buf + lb->len, room, MSG_DONTWAIT);
		if (n > 0) {
			/* A NUL inside a line would confuse the consumer: refuse it. */
			if (memchr(lb->buf + lb->len, '\0', (size_t)n) != NULL)
				return gcr_err_set(err, -EBADMSG, "NUL byte in a protocol line");
			lb->len += (size_t)n;
			continue;
		}
		if (n == 0)
			return gcr_err_set(err, -ECONNRESET, "peer closed the connection");
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return gcr_err_set(err, -errno, "recv: %s", strerror(errno));
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, left_ms(deadline));
		if (pr == 0)
			return gcr_err_set(err, -ETIMEDOUT, "timed out waiting for a reply");
		if (pr < 0 && errno != EINTR)
			return gcr_err_set(err, -errno, "poll: %s", strerror(errno));
	}
}
