/* test_sock: the line reader is bounded in size and time, and peer credentials
 * report this process. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gcr_sock.h"
#include "util.h"

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
	return test_summary("test_sock");
}
