/* test_agent_metrics: /healthz, /readyz and /metrics over real HTTP (libcurl)
 * on a loopback port, the counters' Prometheus text, and address validation. */
#include "agent_metrics.h"
#include "util.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
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
	curl_global_cleanup();
	return test_summary("test_agent_metrics");
}
