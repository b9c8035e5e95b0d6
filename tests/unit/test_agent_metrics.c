/* test_agent_metrics: /healthz, /readyz and /metrics over real HTTP (libcurl)
 * on a loopback port, the counters' Prometheus text, address validation, and the server
 * under 2,000 idle connections, past its connection cap, and closing idle ones. */
#include "agent_metrics.h"
#include "util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct buf {
	char data[16384];
	size_t len;
};

static size_t sink(char *p, size_t sz, size_t n, void *d)
{
	struct buf *b = d;
	size_t k = sz * n;
	if (b->len + k >= sizeof(b->data))
		return 0;
	memcpy(b->data + b->len, p, k);
	b->len += k;
	b->data[b->len] = '\0';
	return k;
}

static long get(int port, const char *path, struct buf *b)
{
	char url[128];
	long code = 0;
	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	b->len = 0;
	b->data[0] = '\0';
	CURL *h = curl_easy_init();
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
	if (curl_easy_perform(h) == CURLE_OK)
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
	curl_easy_cleanup(h);
	return code;
}

/* A loopback port nobody listens on right now. */
static int free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	getsockname(fd, (struct sockaddr *)&sa, &len);
	close(fd);
	return ntohs(sa.sin_port);
}

static int gauge(void *data)
{
	return *(int *)data;
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A TCP connection to the server that sends nothing; -1 on failure. */
static int idle_conn(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Waits (bounded by limit_s) until the server holds want connections, or at least want
 * when at_least; returns whether it did. The count changes on the server's own thread:
 * there is no event to wait on from here, so it is read every 10 ms. */
static int wait_conns(struct agent_metrics *m, unsigned int want, int at_least, double limit_s)
{
	double end = mono_s() + limit_s;
	for (;;) {
		unsigned int c = agent_metrics_connections(m);
		if (c == want || (at_least && c > want))
			return 1;
		if (mono_s() > end) {
			fprintf(stderr, "server holds %u connections, want %s%u\n", c, at_least ? ">= " : "", want);
			return 0;
		}
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
}

/* Connections the test opens while the server idles them: more than FD_SETSIZE (1024), the
 * bound of the select() server this replaced, which failed /healthz at about 1,100. */
#define IDLE 2000
/* The cap in this test: room for IDLE and a few requests, small enough to pass with EXTRA. */
#define CAP 2100
#define EXTRA 300
/* A request must be answered within this, in seconds, with IDLE connections open. */
#define ANSWER_S 2.0

static void test_many_idle(void)
{
	struct gcr_err err;
	struct agent_metrics *m = NULL;
	int registered = 7;
	struct buf *b = calloc(1, sizeof(*b));
	static int fds[IDLE + EXTRA];
	/* This process holds both ends of every connection, plus curl's. */
	struct rlimit rl;
	CHECK(getrlimit(RLIMIT_NOFILE, &rl) == 0);
	rl.rlim_cur = rl.rlim_max;
	CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
	CHECK(rl.rlim_cur >= 2 * (IDLE + EXTRA) + 256); /* else the test cannot run here: a failure, not a pass */
	if (rl.rlim_cur < 2 * (IDLE + EXTRA) + 256)
		goto out;

	int port = free_port();
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	/* An idle timeout the test never reaches: the connections must still be open when asked. */
	struct agent_metrics_limits lim = { .max_connections = CAP, .idle_timeout_s = 120 };
	CHECK(agent_metrics_new_limited(addr, gauge, &registered, &lim, &m, &err) == 0);
	if (m == NULL)
		goto out;
	agent_metrics_set_ready(m);
	int opened = 0;
	for (int i = 0; i < IDLE; i++)
		opened += (fds[i] = idle_conn(port)) >= 0;
	CHECK(opened == IDLE);
	CHECK(wait_conns(m, IDLE, 0, 20.0)); /* all accepted: fds above 1024 on the server */

	double t0 = mono_s();
	CHECK(get(port, "/healthz", b) == 200);
	CHECK_STR(b->data, "ok\n");
	CHECK(get(port, "/readyz", b) == 200);
	CHECK_STR(b->data, "ok\n");
	CHECK(get(port, "/metrics", b) == 200);
	CHECK(strstr(b->data, "gcr_agent_registered_processes 7\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_http_connection_limit 2100\n") != NULL);
	const char *hc = strstr(b->data, "\ngcr_agent_http_connections ");
	CHECK(hc != NULL && atoi(hc + strlen("\ngcr_agent_http_connections ")) > IDLE); /* still open */
	double took = mono_s() - t0;
	CHECK(took < 3 * ANSWER_S);
	printf("3 requests with %d idle connections open: %.3f s\n", IDLE, took);

	/* Past the cap: the server keeps CAP at most, refusing or leaving the rest in the
	 * kernel's backlog, and stays up. */
	opened = 0;
	for (int i = IDLE; i < IDLE + EXTRA; i++)
		opened += (fds[i] = idle_conn(port)) >= 0; /* a connect may complete in the backlog */
	CHECK(wait_conns(m, CAP, 0, 20.0));
	CHECK(agent_metrics_connections(m) <= CAP);
	printf("%d connects past the cap completed, the server holds %u\n", opened - (CAP - IDLE),
	       agent_metrics_connections(m));
	/* Freeing slots lets a client in again. */
	for (int i = 0; i < IDLE / 2; i++) {
		close(fds[i]);
		fds[i] = -1;
	}
	t0 = mono_s();
	CHECK(get(port, "/healthz", b) == 200);
	CHECK_STR(b->data, "ok\n");
	CHECK(agent_metrics_connections(m) <= CAP);
	CHECK(mono_s() - t0 < 10.0);
out:
	for (int i = 0; i < IDLE + EXTRA; i++)
		if (fds[i] > 0)
			close(fds[i]);
	agent_metrics_free(m);
	free(b);
}

/* Idle connections are closed after the idle timeout: each one reads EOF. */
static void test_idle_timeout(void)
{
	struct gcr_err err;
	struct agent_metrics *m = NULL;
	int registered = 0;
	enum { N = 50 };
	struct pollfd p[N];
	int port = free_port();
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	struct agent_metrics_limits lim = { .max_connections = 64, .idle_timeout_s = 1 };
	CHECK(agent_metrics_new_limited(addr, gauge, &registered, &lim, &m, &err) == 0);
	if (m == NULL)
		return;
	for (int i = 0; i < N; i++)
		p[i] = (struct pollfd){ .fd = idle_conn(port), .events = POLLIN };
	double t0 = mono_s();
	int closed = 0;
	/* Each EOF is an event: wait on them all, 10 s at most (10 times the timeout). */
	while (closed < N && mono_s() - t0 < 10.0) {
		int left_ms = (int)((10.0 - (mono_s() - t0)) * 1000) + 1;
		if (poll(p, N, left_ms) <= 0)
			break;
		for (int i = 0; i < N; i++) {
			char c;
			if (p[i].fd >= 0 && p[i].revents != 0 && read(p[i].fd, &c, 1) <= 0) {
				close(p[i].fd);
				p[i].fd = -1; /* poll ignores it from now on */
				closed++;
			}
		}
	}
	double took = mono_s() - t0;
	CHECK(closed == N);
	CHECK(took >= 0.5 && took < 10.0); /* closed for idling, not at once */
	printf("%d idle connections closed by the server after %.2f s (timeout 1 s)\n", closed, took);
	CHECK(wait_conns(m, 0, 0, 5.0));
	for (int i = 0; i < N; i++)
		if (p[i].fd >= 0)
			close(p[i].fd);
	struct agent_metrics_limits bad = { .max_connections = 0, .idle_timeout_s = 1 };
	struct agent_metrics *m2 = NULL;
	CHECK(agent_metrics_new_limited(addr, gauge, &registered, &bad, &m2, &err) == -EINVAL && m2 == NULL);
	agent_metrics_free(m);
}

int main(void)
{
	struct gcr_err err;
	struct agent_metrics *m = NULL;
	int registered = 3;
	struct buf *b = calloc(1, sizeof(*b));
	curl_global_init(CURL_GLOBAL_DEFAULT);

	CHECK(agent_metrics_new("127.0.0.1", gauge, &registered, &m, &err) == -EINVAL);
	CHECK(agent_metrics_new("127.0.0.1:99999", gauge, &registered, &m, &err) == -EINVAL);
	CHECK(agent_metrics_new("example.com:80", gauge, &registered, &m, &err) == -EINVAL);
	CHECK(m == NULL);

	int port = free_port();
	char addr[64];
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
	CHECK(agent_metrics_new(addr, gauge, &registered, &m, &err) == 0);
	CHECK(get(port, "/healthz", b) == 200);
	CHECK(get(port, "/readyz", b) == 503);
	agent_metrics_set_ready(m);
	CHECK(get(port, "/readyz", b) == 200);
	CHECK(get(port, "/nope", b) == 404);

	agent_metrics_op(m, "checkpoint", 1, 42.0, 1000);
	agent_metrics_op(m, "checkpoint", 0, 0, 0);
	agent_metrics_op(m, "restore", 1, 2000.0, 500);
	CHECK(get(port, "/metrics", b) == 200);
	CHECK(strstr(b->data, "gcr_agent_operations_total{kind=\"checkpoint\",result=\"succeeded\"} 1\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operations_total{kind=\"checkpoint\",result=\"failed\"} 1\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operation_failures_total{kind=\"restore\"} 0\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operation_duration_seconds_bucket{kind=\"checkpoint\",le=\"0.05\"} 2\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operation_duration_seconds_bucket{kind=\"restore\",le=\"1\"} 0\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operation_duration_seconds_bucket{kind=\"restore\",le=\"5\"} 1\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_operation_duration_seconds_count{kind=\"restore\"} 1\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_bytes_moved_total{kind=\"checkpoint\"} 1000\n") != NULL);
	CHECK(strstr(b->data, "gcr_agent_registered_processes 3\n") != NULL);

	agent_metrics_free(m);
	CHECK(get(port, "/healthz", b) == 0); /* stopped */

	/* An IPv4 pod IP in brackets: the chart's "[$(POD_IP)]:PORT" on an IPv4 cluster. */
	snprintf(addr, sizeof(addr), "[127.0.0.1]:%d", port);
	m = NULL;
	CHECK(agent_metrics_new(addr, gauge, &registered, &m, &err) == 0);
	CHECK(get(port, "/healthz", b) == 200);
	agent_metrics_free(m);
	CHECK(agent_metrics_new("[127.0.0.300]:80", gauge, &registered, &m, &err) == -EINVAL);
	CHECK(agent_metrics_new("[]:80", gauge, &registered, &m, &err) == -EINVAL);

	/* IPv6 literal in brackets (the chart's form); skipped where there is no ::1. */
	snprintf(addr, sizeof(addr), "[::1]:%d", port);
	m = NULL;
	if (agent_metrics_new(addr, gauge, &registered, &m, &err) == 0) {
		char url[64];
		snprintf(url, sizeof(url), "http://[::1]:%d/healthz", port);
		CURL *h = curl_easy_init();
		long code = 0;
		curl_easy_setopt(h, CURLOPT_URL, url);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
		b->len = 0;
		if (curl_easy_perform(h) == CURLE_OK)
			curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
		curl_easy_cleanup(h);
		CHECK(code == 200);
		agent_metrics_free(m);
	}
	CHECK(agent_metrics_new("[::1:80", gauge, &registered, &m, &err) == -EINVAL);
	CHECK(agent_metrics_new("[zz]:80", gauge, &registered, &m, &err) == -EINVAL);
	agent_metrics_free(NULL);
	free(b);
	test_many_idle();
	test_idle_timeout();
	curl_global_cleanup();
	return test_summary("test_agent_metrics");
}
