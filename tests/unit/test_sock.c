/* test_sock: the line reader is bounded in size and time, peer credentials report this
 * process, socket names are unique and never taken from others, dead sockets are cleaned. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "gcr_sock.h"
#include "util.h"

/* A socket bound at path and closed at once: a dead one, as a killed process leaves it. */
static int dead_socket(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	close(fd);
	return rc;
}

static void test_steps(void)
{
	struct gcr_err err;
	struct gcr_linebuf lb;
	char *line;
	gcr_linebuf_init(&lb, 16);
	CHECK(gcr_linebuf_push(&lb, "ab\ncd", 5, &err) == 5);
	CHECK(gcr_linebuf_next(&lb, &line, &err) == 1);
	CHECK_STR(line, "ab");
	CHECK(gcr_linebuf_next(&lb, &line, &err) == 0);
	CHECK(gcr_linebuf_push(&lb, "e\n", 2, &err) == 2);
	CHECK(gcr_linebuf_next(&lb, &line, &err) == 1);
	CHECK_STR(line, "cde");
	/* 15 bytes without a newline fit; the 16th makes the line too long. */
	CHECK(gcr_linebuf_push(&lb, "0123456789abcdefXYZ", 19, &err) == 16);
	CHECK(gcr_linebuf_next(&lb, &line, &err) == -EMSGSIZE);
	gcr_linebuf_free(&lb);
	gcr_linebuf_init(&lb, 16);
	CHECK(gcr_linebuf_push(&lb, "a\0\n", 3, &err) == -EBADMSG);
	gcr_linebuf_free(&lb);
}

static void test_names(const char *dir)
{
	struct gcr_err err;
	char stem[64], want[64], path[256], path2[256];
	/* The same name from our pid as from /proc/self. */
	CHECK(gcr_sock_shim_stem(0, getpid(), stem, sizeof(stem), &err) == 0);
	CHECK(gcr_sock_shim_stem(getpid(), getpid(), want, sizeof(want), &err) == 0);
	CHECK_STR(stem, want);
	snprintf(want, sizeof(want), "gcr-%d-", (int)getpid());
	CHECK(strncmp(stem, want, strlen(want)) == 0 && strlen(stem) > strlen(want));
	CHECK(gcr_sock_shim_stem(999999999, 1, stem, sizeof(stem), &err) < 0);

	/* The umask is the whole process's: making sockets leaves it alone, the modes are exact. */
	mode_t old = umask(027);
	int fd = gcr_sock_listen_unique(dir, "gcr-1-2", path, sizeof(path), &err);
	CHECK(fd >= 0);
	snprintf(want, sizeof(want), "%s/gcr-1-2.sock", dir);
	CHECK_STR(path, want);
	CHECK(umask(027) == 027);
	struct stat st;
	CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
	/* The name is taken by a live socket: another one, never that one replaced. */
	int fd2 = gcr_sock_listen_unique(dir, "gcr-1-2", path2, sizeof(path2), &err);
	CHECK(fd2 >= 0 && strcmp(path, path2) != 0 && strncmp(path2, want, strlen(want) - 5) == 0);
	CHECK(gcr_sock_connect(path, 1000, &err) >= 0); /* still the first's */
	/* A plain file at a name: left, another name taken. */
	char plain[256];
	snprintf(plain, sizeof(plain), "%s/gcr-3-4.sock", dir);
	close(open(plain, O_CREAT | O_WRONLY, 0600));
	int fd3 = gcr_sock_listen_unique(dir, "gcr-3-4", path2, sizeof(path2), &err);
	CHECK(fd3 >= 0 && strcmp(path2, plain) != 0 && access(plain, F_OK) == 0);
	/* Our own dead socket at the name is replaced. */
	char dead[256];
	snprintf(dead, sizeof(dead), "%s/gcr-5-6.sock", dir);
	CHECK(dead_socket(dead) == 0);
	int fd4 = gcr_sock_listen_unique(dir, "gcr-5-6", path2, sizeof(path2), &err);
	CHECK(fd4 >= 0);
	CHECK_STR(path2, dead);
	/* gcr_sock_listen: a live socket at the path is -EADDRINUSE and stays. */
	CHECK(gcr_sock_listen(path, &err) == -EADDRINUSE);
	CHECK(gcr_sock_connect(path, 1000, &err) >= 0);
	umask(old);

	/* Reaping: dead sockets go; live ones, plain files and other names stay. */
	char d1[256], d2[256];
	snprintf(d1, sizeof(d1), "%s/gcr-7-8.sock", dir);
	snprintf(d2, sizeof(d2), "%s/other-7-8.sock", dir);
	CHECK(dead_socket(d1) == 0 && dead_socket(d2) == 0);
	CHECK(gcr_sock_reap(dir, &err) == 1);
	CHECK(access(d1, F_OK) < 0 && access(d2, F_OK) == 0 && access(plain, F_OK) == 0);
	CHECK(access(path, F_OK) == 0 && access(dead, F_OK) == 0);
	/* Another user's dead socket (root's, seen by nobody): only root removes it. */
	if (geteuid() == 0) {
		CHECK(dead_socket(d1) == 0);
		CHECK(chmod(dir, 0777) == 0 && seteuid(65534) == 0);
		CHECK(gcr_sock_remove_stale(d1, &err) == 0 && access(d1, F_OK) == 0);
		CHECK(seteuid(0) == 0);
		CHECK(gcr_sock_remove_stale(d1, &err) == 1 && access(d1, F_OK) < 0);
	}
	close(fd);
	close(fd2);
	close(fd3);
	close(fd4);
}

/* A listener whose backlog is full: a connect that finds no room fails (before the fix it
 * returned an unconnected fd, whose peer read as pid 0); once one is accepted, it connects
 * to the right peer and comes back non-blocking. */
static void test_full_backlog(const char *dir)
{
	struct gcr_err err;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/full.sock", dir);
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(l, 0) == 0);
	int queued[64], n = 0;
	while (n < 64) {
		int c = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (connect(c, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			CHECK(errno == EAGAIN);
			close(c);
			break;
		}
		queued[n++] = c;
	}
	CHECK(n > 0 && n < 64);
	CHECK(gcr_sock_connect(sa.sun_path, 0, &err) == -ETIMEDOUT);
	CHECK(gcr_sock_connect(sa.sun_path, 100, &err) == -ETIMEDOUT);
	CHECK(strstr(err.msg, "backlog") != NULL);
	int a = accept(l, NULL, NULL);
	CHECK(a >= 0);
	int fd = gcr_sock_connect(sa.sun_path, 1000, &err);
	CHECK(fd >= 0);
	struct gcr_peer peer;
	CHECK(gcr_sock_peer(fd, &peer, &err) == 0 && peer.pid == getpid());
	CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
	close(fd);
	close(a);
	for (int i = 0; i < n; i++)
		close(queued[i]);
	close(l);
	unlink(sa.sun_path);
}

/* Whether fd is open (fcntl answers). */
static int is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* Descriptors passed with a line: taken by gcr_linebuf_fill_fds (close-on-exec, up to its
 * bound, the rest closed), dropped by the kernel for a plain gcr_linebuf_fill. */
static void test_fds(void)
{
	struct gcr_err err;
	int sv[2], p[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	CHECK(pipe(p) == 0);
	int pass[3] = { p[0], p[1], p[0] };
	CHECK(gcr_sock_write_fds(sv[1], "files\n", 6, pass, 3, 1000, &err) == 0);
	struct gcr_linebuf lb;
	gcr_linebuf_init(&lb, 64);
	int got[2] = { -1, -1 }, n = 0;
	CHECK(gcr_linebuf_fill_fds(&lb, sv[0], got, &n, 2, &err) == 6);
	char *line;
	CHECK(gcr_linebuf_next(&lb, &line, &err) == 1);
	CHECK_STR(line, "files");
	CHECK(n == 2 && got[0] != p[0] && got[1] != p[1] && (fcntl(got[0], F_GETFD) & FD_CLOEXEC));
	/* The passed write end reaches the passed read end. */
	CHECK(write(got[1], "z", 1) == 1);
	char c = 0;
	CHECK(read(got[0], &c, 1) == 1 && c == 'z');
	close(got[0]);
	close(got[1]);
	/* The third, past the bound, was closed, and a plain fill installs none: after both the
	 * lowest free number is still the one the first passed descriptor had. */
	int before = got[0] < got[1] ? got[0] : got[1];
	CHECK(gcr_sock_write_fds(sv[1], "x\n", 2, pass, 1, 1000, &err) == 0);
	CHECK(gcr_linebuf_fill(&lb, sv[0], &err) == 2);
	int probe = dup(0);
	CHECK(probe == before); /* the lowest free number: nothing new was installed */
	close(probe);
	CHECK(gcr_sock_write_fds(sv[1], "x\n", 2, pass, GCR_SOCK_MAX_FDS + 1, 1000, &err) == -EINVAL);
	CHECK(is_open(p[0]) && is_open(p[1]));
	gcr_linebuf_free(&lb);
	close(p[0]);
	close(p[1]);
	close(sv[0]);
	close(sv[1]);
}

int main(void)
{
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	struct gcr_err err;
	struct gcr_linebuf lb;
	gcr_linebuf_init(&lb, 64);
	char *line;

	/* Two lines in one write, then a line split across writes. */
	CHECK(write(sv[1], "one\ntwo\nthr", 11) == 11);
	CHECK(gcr_linebuf_read(&lb, sv[0], 1000, &line, &err) == 0);
	CHECK_STR(line, "one");
	CHECK(gcr_linebuf_read(&lb, sv[0], 1000, &line, &err) == 0);
	CHECK_STR(line, "two");
	CHECK(write(sv[1], "ee\n", 3) == 3);
	CHECK(gcr_linebuf_read(&lb, sv[0], 1000, &line, &err) == 0);
	CHECK_STR(line, "three");

	/* Nothing more: the read times out rather than blocking. */
	CHECK(gcr_linebuf_read(&lb, sv[0], 50, &line, &err) == -ETIMEDOUT);

	/* A line longer than the bound is refused. */
	char big[200];
	memset(big, 'x', sizeof(big));
	CHECK(write(sv[1], big, sizeof(big)) == (ssize_t)sizeof(big));
	CHECK(gcr_linebuf_read(&lb, sv[0], 1000, &line, &err) == -EMSGSIZE);
	gcr_linebuf_free(&lb);

	/* A NUL byte inside a line is refused. */
	gcr_linebuf_init(&lb, 64);
	int sv2[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv2) == 0);
	CHECK(write(sv2[1], "a\0b\n", 4) == 4);
	CHECK(gcr_linebuf_read(&lb, sv2[0], 1000, &line, &err) == -EBADMSG);
	close(sv2[1]);
	close(sv2[0]);
	gcr_linebuf_free(&lb);

	/* EOF before a newline (a fresh pair: the oversize line is still queued on sv). */
	gcr_linebuf_init(&lb, 64);
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv2) == 0);
	CHECK(write(sv2[1], "partial", 7) == 7);
	close(sv2[1]);
	CHECK(gcr_linebuf_read(&lb, sv2[0], 1000, &line, &err) == -ECONNRESET);
	close(sv2[0]);
	gcr_linebuf_free(&lb);
	close(sv[1]);

	struct gcr_peer peer;
	CHECK(gcr_sock_peer(sv[0], &peer, &err) == 0 && peer.pid == getpid() && peer.uid == getuid());
	close(sv[0]);

	test_steps();
	test_fds();
	char dir[] = "/tmp/gcr-test-sock-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	test_names(dir);
	test_full_backlog(dir);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return test_summary("test_sock");
}
