/* gcr-hold: a pod's preStop hook (docs/preemption.md, "Eviction without loss"): tells the GCR
 * agent "my pod is terminating" and blocks until it answers, so the kubelet's SIGTERM waits
 * while the pod's GPU process is imaged. Static and libc-only: it runs in any container image.
 *
 *   lifecycle: {preStop: {exec: {command: ["/opt/gcr/lib/gcr-hold"]}}}
 *
 * Exits 0 once the agent answered, whatever the answer (its Events on the pod say what
 * happened); 1 when the agent cannot be reached or dropped the connection unanswered, so the
 * kubelet's FailedPreStopHook Event carries why (the container is then stopped as usual). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The registry socket the device plugin names in every gpucr.dev/shim container; the hold
 * socket is evict.sock beside it (agent_evictmsg.h). */
#define DEFAULT_AGENT_SOCKET "/run/gcr/agent/agent.sock"
#define HOLD_SOCKET_NAME "evict.sock"
#define HOLD_LINE "{\"op\":\"evict-hold\",\"v\":1}\n"
/* The longest answer read (bytes); the agent's is under 2 KiB. */
#define REPLY_MAX 4096
/* The kubelet ends the hook at the end of the grace period; this bounds a hold it forgot (ms). */
#define WAIT_MAX_MS (3600 * 1000)

static int fail(const char *what, const char *path)
{
	fprintf(stderr, "gcr-hold: %s %s: %s; the pod ends without an image\n", what, path,
		errno ? strerror(errno) : "no answer");
	return 1;
}

int main(int argc, char **argv)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	if (argc == 3 && strcmp(argv[1], "--socket") == 0) {
		snprintf(path, sizeof(path), "%s", argv[2]);
	} else if (argc == 1) {
		const char *reg = getenv("GCR_AGENT_SOCKET");
		if (reg == NULL || reg[0] != '/')
			reg = DEFAULT_AGENT_SOCKET;
		const char *slash = strrchr(reg, '/');
		if ((size_t)(slash - reg) + sizeof(HOLD_SOCKET_NAME) + 1 > sizeof(path)) {
			fprintf(stderr, "gcr-hold: GCR_AGENT_SOCKET %s is too long\n", reg);
			return 1;
		}
		snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - reg), reg, HOLD_SOCKET_NAME);
	} else {
		fprintf(stderr, "usage: gcr-hold [--socket PATH]\n");
		return 2;
	}
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	errno = 0;
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return fail("cannot reach the GCR agent at", path);
	const char *line = HOLD_LINE;
	size_t off = 0, n = strlen(line);
	while (off < n) {
		ssize_t w = send(fd, line + off, n - off, MSG_NOSIGNAL); /* a closed peer: an error, not SIGPIPE */
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return fail("cannot write to", path);
		off += (size_t)w;
	}
	char buf[REPLY_MAX];
	size_t got = 0;
	while (got < sizeof(buf) - 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, WAIT_MAX_MS);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0) {
			errno = pr == 0 ? ETIMEDOUT : errno;
			return fail("no answer from", path);
		}
		ssize_t r = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			errno = r == 0 ? 0 : errno;
			return fail("the agent closed", path);
		}
		got += (size_t)r;
		if (memchr(buf, '\n', got) != NULL)
			break;
	}
	buf[got] = '\0';
	/* The answer as the agent wrote it (one JSON line): the kubelet shows it only on failure,
	 * the pod's Events say the same. */
	fputs(buf, stdout);
	close(fd);
	return 0;
}
