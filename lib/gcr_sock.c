/* gcr_sock: Unix socket plumbing shared by the shim, gcrctl and the agent.
 * Every read is bounded in size and time so a bad peer cannot wedge us. */
#include "gcr_sock.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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

int gcr_sock_listen(const char *path, struct gcr_err *err)
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
		if (mkdir(dir, 0700) < 0 && errno != EEXIST)
			return gcr_err_set(err, -errno, "cannot create %s: %s", dir, strerror(errno));
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return gcr_err_set(err, -errno, "socket: %s", strerror(errno));
	unlink(path); /* a stale file from a dead process with our pid */
	mode_t old = umask(0177);
	int b = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	int e = errno;
	umask(old);
	if (b < 0 || listen(fd, 16) < 0) {
		if (b == 0)
			e = errno;
		close(fd);
		return gcr_err_set(err, -e, "cannot listen on %s: %s", path, strerror(e));
	}
	return fd;
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
