/* gcr-hold: a pod's preStop hook (docs/preemption.md, "Eviction without loss"): tells the GCR
 * agent "my pod is terminating" and blocks until it answers, so the kubelet's SIGTERM waits
 * while the pod's GPU process is imaged. Static and libc-only: it runs in any container image.
 *
 *   lifecycle: {preStop: {exec: {command: ["/opt/gcr/lib/gcr-hold"]}}}
 *
 * Exits 0 once the agent answered, whatever the answer (its Events on the pod say what
 * happened). A connection that drops unanswered (the agent restarting: its DaemonSet's next pod
 * waits for the same Checkpoint) is made again and the hold asked again, until the agent has been
 * away for --reconnect-s seconds (default 120); the kubelet ends the hook at the end of the grace
 * period in any case. Exits 1 when the agent cannot be reached at first or stays away, so the
 * kubelet's FailedPreStopHook Event carries why (the container is then stopped as usual). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
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
/* How often a dropped hold tries the agent's socket again (ms): a DaemonSet's new agent pod
 * listens within seconds, so 4 tries a second cost nothing and lose little of the grace period. */
#define RECONNECT_MS 250
/* How long the agent may stay away before the hold gives up (s): the agent pod's restart. */
#define RECONNECT_S_DEFAULT 120

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Connects to path and sends the hold line: the socket, or -1 with errno set. */
static int ask(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, path, strlen(path) + 1);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	const char *line = HOLD_LINE;
	size_t off = 0, n = strlen(line);
	while (off < n) {
		ssize_t w = send(fd, line + off, n - off, MSG_NOSIGNAL); /* a closed peer: an error, not SIGPIPE */
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			errno = w == 0 ? EPIPE : errno;
			goto fail;
		}
		off += (size_t)w;
	}
	return fd;
fail:;
	int saved = errno;
	close(fd);
	errno = saved;
	return -1;
}

/* Reads the answer line into buf (len bytes) until deadline (monotonic ms): 1 answered, 0 the
 * connection dropped unanswered, -1 no answer by the deadline. */
static int await_answer(int fd, char *buf, size_t len, double deadline)
{
	size_t got = 0;
	while (got < len - 1) {
		double left = deadline - now_ms();
		if (left <= 0)
			return -1;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int pr = poll(&p, 1, (int)left + 1);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr < 0)
			return 0;
		if (pr == 0)
			continue; /* the deadline, checked above */
		ssize_t r = read(fd, buf + got, len - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		got += (size_t)r;
		if (memchr(buf, '\n', got) != NULL)
			break;
	}
	buf[got] = '\0';
	return 1;
}

int main(int argc, char **argv)
{
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)] = "";
	long reconnect_s = RECONNECT_S_DEFAULT;
	int i = 1;
	for (; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--socket") == 0 && strlen(argv[i + 1]) < sizeof(path)) {
			snprintf(path, sizeof(path), "%s", argv[i + 1]);
		} else if (strcmp(argv[i], "--reconnect-s") == 0) {
			char *end;
			reconnect_s = strtol(argv[i + 1], &end, 10);
			if (*end != '\0' || reconnect_s < 0 || reconnect_s > 3600)
				break;
		} else {
			break;
		}
	}
	if (i != argc) {
		fprintf(stderr, "usage: gcr-hold [--socket PATH] [--reconnect-s 0..3600]\n");
		return 2;
	}
	if (path[0] == '\0') {
		const char *reg = getenv("GCR_AGENT_SOCKET");
		if (reg == NULL || reg[0] != '/')
			reg = DEFAULT_AGENT_SOCKET;
		const char *slash = strrchr(reg, '/');
		if ((size_t)(slash - reg) + sizeof(HOLD_SOCKET_NAME) + 1 > sizeof(path)) {
			fprintf(stderr, "gcr-hold: GCR_AGENT_SOCKET %s is too long\n", reg);
			return 1;
		}
		snprintf(path, sizeof(path), "%.*s/%s", (int)(slash - reg), reg, HOLD_SOCKET_NAME);
	}
	double deadline = now_ms() + WAIT_MAX_MS;
	int fd = ask(path);
	if (fd < 0) {
		fprintf(stderr, "gcr-hold: cannot reach the GCR agent at %s: %s; the pod ends without an image\n", path,
			strerror(errno));
		return 1;
	}
	char buf[REPLY_MAX];
	int asks = 1;
	for (;;) {
		int rc = await_answer(fd, buf, sizeof(buf), deadline);
		close(fd);
		if (rc == 1)
			break;
		if (rc < 0) {
			fprintf(stderr, "gcr-hold: no answer from %s in %d s; the pod ends\n", path, WAIT_MAX_MS / 1000);
			return 1;
		}
		/* Dropped unanswered: the agent is stopping or restarting. Ask its successor. */
		fprintf(stderr, "gcr-hold: the agent at %s closed the hold unanswered; asking again (up to %ld s)\n",
			path, reconnect_s);
		double away_until = now_ms() + (double)reconnect_s * 1000;
		while ((fd = ask(path)) < 0) {
			if (now_ms() >= away_until || now_ms() >= deadline) {
				fprintf(stderr, "gcr-hold: the agent at %s stayed away %ld s (%s); the pod ends without an "
					"answer\n", path, reconnect_s, strerror(errno));
				return 1;
			}
			struct timespec ts = { 0, RECONNECT_MS * 1000000L };
			nanosleep(&ts, NULL);
		}
		asks++;
	}
	/* The answer as the agent wrote it (one JSON line): the kubelet shows it only on failure,
	 * the pod's Events say the same. */
	fputs(buf, stdout);
	if (asks > 1)
		fprintf(stderr, "gcr-hold: answered at the %d. asking\n", asks);
	return 0;
}
