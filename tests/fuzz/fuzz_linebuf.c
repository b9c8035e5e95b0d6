/* fuzz_linebuf: arbitrary bytes (a peer's stream) through the control socket's line reader
 * (lib/gcr_sock.c), in chunks from memory and over a socketpair: every line handed out must
 * be exactly the bytes sent up to a '\n', without NULs, within the bound, and a refusal
 * must be the error the reader documents for that input. */
#include "gcr_sock.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The error that must end reading in[0..n) under bound max (0: none, the input ran out).
 * A line without its '\n' is refused once max bytes of it are buffered, before the byte
 * after them is looked at; a NUL is refused when it arrives. Lines before the refusal may
 * or may not be handed out (a NUL refuses the whole chunk that carried it). */
static int expected_error(const char *in, size_t n, size_t max)
{
	size_t start = 0;
	for (size_t i = 0; i < n; i++) {
		if (i - start >= max)
			return -EMSGSIZE;
		if (in[i] == '\0')
			return -EBADMSG;
		if (in[i] == '\n')
			start = i + 1;
	}
	return n - start >= max ? -EMSGSIZE : 0;
}

/* Checks a line handed out against the input at *pos; advances *pos past its '\n'. */
static void check_line(const char *line, const char *in, size_t n, size_t *pos, size_t max)
{
	size_t len = strlen(line);
	if (len >= max || *pos + len >= n || memcmp(line, in + *pos, len) != 0 || in[*pos + len] != '\n')
		abort();
	*pos += len + 1;
}

static void from_memory(const char *in, size_t n, size_t max, size_t chunk)
{
	struct gcr_linebuf lb;
	struct gcr_err err;
	gcr_linebuf_init(&lb, max);
	size_t fed = 0, pos = 0;
	int rc = 0;
	while (rc == 0) {
		char *line;
		int r = gcr_linebuf_next(&lb, &line, &err);
		if (r == 1) {
			check_line(line, in, n, &pos, max);
			continue;
		}
		if (r < 0) {
			rc = r;
			break;
		}
		if (fed == n)
			break;
		size_t want = n - fed < chunk ? n - fed : chunk;
		long got = gcr_linebuf_push(&lb, in + fed, want, &err);
		if (got < 0)
			rc = (int)got;
		else if (got == 0 || (size_t)got > want)
			abort(); /* no line buffered (next said so), so there was room */
		else
			fed += (size_t)got;
	}
	int want_rc = expected_error(in, n, max);
	/* A NUL is seen by push when its chunk arrives, a too-long line when the buffer fills:
	 * either way, the first problem in the stream is the one reported. */
	if (rc != want_rc)
		abort();
	if (rc < 0 && err.msg[0] == '\0')
		abort();
	gcr_linebuf_free(&lb);
}

static void from_socket(const char *in, size_t n, size_t max)
{
	int sv[2];
	if (n > 65536 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return;
	if (write(sv[1], in, n) != (ssize_t)n) {
		close(sv[0]);
		close(sv[1]);
		return;
	}
	close(sv[1]);
	struct gcr_linebuf lb;
	struct gcr_err err;
	gcr_linebuf_init(&lb, max);
	size_t pos = 0;
	int rc;
	for (;;) {
		char *line;
		rc = gcr_linebuf_read(&lb, sv[0], 0, &line, &err);
		if (rc < 0)
			break;
		check_line(line, in, n, &pos, max);
	}
	int want_rc = expected_error(in, n, max);
	/* The stream ends with EOF: clean input ends -ECONNRESET. */
	if (rc != (want_rc == 0 ? -ECONNRESET : want_rc))
		abort();
	gcr_linebuf_free(&lb);
	close(sv[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	/* Small bounds reach the edges (a line of max-1 bytes, of max) in few bytes. */
	size_t max = 1 + data[0] % 64;
	size_t chunk = 1 + data[1] % 32;
	const char *in = (const char *)data + 2;
	size_t n = size - 2;
	from_memory(in, n, max, chunk);
	from_socket(in, n, max);
	return 0;
}
