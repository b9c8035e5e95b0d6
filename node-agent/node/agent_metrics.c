/* agent_metrics: the agent's counters and its HTTP endpoints (/healthz, /readyz,
 * Prometheus /metrics) served by libmicrohttpd on a local address.
 * The server waits with epoll (poll where epoll is missing), never select(): select()
 * cannot watch a descriptor numbered 1024 or more (FD_SETSIZE), so about 1,100 idle
 * connections made /healthz fail. Its connections are capped and idle ones closed, so a
 * flood cannot take the descriptors the registry, device plugin and kube client need. */
#include "agent_metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "gcr_log.h"

/* Histogram bucket bounds of operation durations, in seconds. */
static const double buckets[] = { 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60 };
#define NBUCKETS (sizeof(buckets) / sizeof(buckets[0]))
enum { KIND_CHECKPOINT, KIND_RESTORE, NKINDS };
static const char *const kind_names[NKINDS] = { "checkpoint", "restore" };

/* One pod's overcommit counters. */
struct oc_row {
	char pod[128];
	unsigned long long suspended, resumed, bytes;
	double held_s;
	unsigned long long idle, wakes; /* suspended for idling; woken by a call */
	double wake_s;                  /* the woken calls' waits */
};

/* The per-pod overcommit series: gcr_agent_overcommit_<name>, one row each. */
static const struct {
	const char *name, *help;
	size_t off;
	int real; /* a double (seconds), else an unsigned long long */
} oc_metrics[] = {
	{ "suspensions_total", "Times a pod was suspended to make room for a pod of higher priority.",
	  offsetof(struct oc_row, suspended), 0 },
	{ "resumes_total", "Times a pod suspended for another was resumed.", offsetof(struct oc_row, resumed), 0 },
	{ "held_seconds_total", "Time pods spent suspended for another, counted at their resume.",
	  offsetof(struct oc_row, held_s), 1 },
	{ "bytes_moved_total", "Bytes moved by overcommit suspends and resumes.", offsetof(struct oc_row, bytes), 0 },
	{ "idle_suspensions_total", "Times a pod that others were suspended for was suspended itself for making "
	  "no GPU call.", offsetof(struct oc_row, idle), 0 },
	{ "wakes_total", "Times a pod suspended by the agent was resumed after it called the GPU.",
	  offsetof(struct oc_row, wakes), 0 },
	{ "wake_wait_seconds_total", "Time the woken calls waited at the gate, from the first caller's arrival to "
	  "the resume's end.", offsetof(struct oc_row, wake_s), 1 },
};

struct agent_metrics {
	struct MHD_Daemon *d;
	unsigned int max_connections;
	atomic_llong log_second;    /* CLOCK_MONOTONIC second of the last libmicrohttpd line logged */
	atomic_uint log_suppressed; /* lines dropped since */
	agent_metrics_gauge_fn registered;
	void *data;
	struct agent_shares *shares; /* guarded by lock; NULL: none */
	atomic_int ready;
	agent_metrics_ready_fn ready_fn; /* guarded by lock, with ready_data and ready_what */
	void *ready_data;
	const char *ready_what;
	pthread_mutex_t lock; /* guards the counters below */
	unsigned long long ops[NKINDS][2]; /* [kind][ok] */
	unsigned long long bucket[NKINDS][NBUCKETS];
	double sum_s[NKINDS];
	unsigned long long count[NKINDS];
	unsigned long long bytes[NKINDS];
	/* Overcommit by suspend, per pod (agent_metrics_overcommit). */
	struct oc_row oc[AGENT_METRICS_OC_PODS + 1]; /* the last: "other" */
	int noc;
	/* Eviction imaging: holds by outcome (AGENT_METRICS_EVICT_*) and seconds to a written image. */
	unsigned long long evict[AGENT_METRICS_EVICT_N];
	double evict_s;
	/* Other modules' series (agent_metrics_add_source): guarded by src_lock, which a scrape
	 * holds while it calls them, so a removed source is never called again. */
	pthread_mutex_t src_lock;
	agent_metrics_source_fn src_fn[AGENT_METRICS_SOURCES];
	void *src_data[AGENT_METRICS_SOURCES];
};

/* /readyz: 200 "ok" once the lists are done and the extra check holds; else 503 naming
 * every condition still missing, one per line. */
static char *readyz(struct agent_metrics *m, unsigned int *code)
{
	/* fn runs under the lock: agent_metrics_set_ready_check(NULL) then frees its data safely. */
	pthread_mutex_lock(&m->lock);
	int extra = m->ready_fn == NULL || m->ready_fn(m->ready_data) != 0;
	const char *what = m->ready_what;
	pthread_mutex_unlock(&m->lock);
	int lists = atomic_load(&m->ready);
	char *body = NULL;
	if (lists && extra) {
		*code = MHD_HTTP_OK;
		return strdup("ok\n");
	}
	*code = MHD_HTTP_SERVICE_UNAVAILABLE;
	if (asprintf(&body, "%s%s%s%s", lists ? "" : "not ready: waiting for the first lists\n",
		     extra ? "" : "not ready: waiting for: ", extra ? "" : what, extra ? "" : "\n") < 0)
		return NULL;
	return body;
}

/* One table's share lines (agent_shares_each's callback). */
static void share_lines(void *data, const struct agent_share_stat *st)
{
	FILE *f = data;
	fprintf(f, "gcr_agent_share_capacity{table=\"%s\"} %d\n", st->name, st->capacity);
	fprintf(f, "gcr_agent_share_per_owner{table=\"%s\"} %d\n", st->name, st->per_owner);
	fprintf(f, "gcr_agent_share_in_use{table=\"%s\"} %d\n", st->name, st->in_use);
	fprintf(f, "gcr_agent_share_owners{table=\"%s\"} %d\n", st->name, st->owners);
	fprintf(f, "gcr_agent_share_refused_total{table=\"%s\"} %llu\n", st->name, st->refused);
}

static char *render(struct agent_metrics *m)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (f == NULL)
		return NULL;
	pthread_mutex_lock(&m->lock);
	fprintf(f, "# HELP gcr_agent_operations_total Checkpoint and restore operations by result.\n"
		   "# TYPE gcr_agent_operations_total counter\n");
	for (int k = 0; k < NKINDS; k++)
		for (int ok = 1; ok >= 0; ok--)
			fprintf(f, "gcr_agent_operations_total{kind=\"%s\",result=\"%s\"} %llu\n", kind_names[k],
				ok ? "succeeded" : "failed", m->ops[k][ok]);
	fprintf(f, "# HELP gcr_agent_operation_failures_total Failed operations.\n"
		   "# TYPE gcr_agent_operation_failures_total counter\n");
	for (int k = 0; k < NKINDS; k++)
		fprintf(f, "gcr_agent_operation_failures_total{kind=\"%s\"} %llu\n", kind_names[k], m->ops[k][0]);
	fprintf(f, "# HELP gcr_agent_operation_duration_seconds Duration of operations.\n"
		   "# TYPE gcr_agent_operation_duration_seconds histogram\n");
	for (int k = 0; k < NKINDS; k++) {
		unsigned long long cum = 0;
		for (size_t b = 0; b < NBUCKETS; b++) {
			cum += m->bucket[k][b];
			fprintf(f, "gcr_agent_operation_duration_seconds_bucket{kind=\"%s\",le=\"%g\"} %llu\n",
				kind_names[k], buckets[b], cum);
		}
		fprintf(f, "gcr_agent_operation_duration_seconds_bucket{kind=\"%s\",le=\"+Inf\"} %llu\n",
			kind_names[k], m->count[k]);
		fprintf(f, "gcr_agent_operation_duration_seconds_sum{kind=\"%s\"} %.6f\n", kind_names[k],
			m->sum_s[k]);
		fprintf(f, "gcr_agent_operation_duration_seconds_count{kind=\"%s\"} %llu\n", kind_names[k],
			m->count[k]);
	}
	/* "other" sits right after the AGENT_METRICS_OC_PODS named pods, once they are all taken. */
	int oc_rows = m->noc + (m->oc[AGENT_METRICS_OC_PODS].pod[0] != '\0');
	for (size_t k = 0; k < sizeof(oc_metrics) / sizeof(oc_metrics[0]); k++) {
		fprintf(f, "# HELP gcr_agent_overcommit_%s %s\n# TYPE gcr_agent_overcommit_%s counter\n", oc_metrics[k].name,
			oc_metrics[k].help, oc_metrics[k].name);
		for (int i = 0; i < oc_rows; i++) {
			const char *v = (const char *)&m->oc[i] + oc_metrics[k].off;
			if (oc_metrics[k].real)
				fprintf(f, "gcr_agent_overcommit_%s{pod=\"%s\"} %.3f\n", oc_metrics[k].name, m->oc[i].pod,
					*(const double *)(const void *)v);
			else
				fprintf(f, "gcr_agent_overcommit_%s{pod=\"%s\"} %llu\n", oc_metrics[k].name, m->oc[i].pod,
					*(const unsigned long long *)(const void *)v);
		}
	}
	static const char *const evict_names[AGENT_METRICS_EVICT_N] = { "written", "failed", "no_time", "skipped" };
	fprintf(f, "# HELP gcr_agent_eviction_images_total Pods being deleted that held their SIGTERM for an image "
		   "(gcr-hold), by result.\n# TYPE gcr_agent_eviction_images_total counter\n");
	for (int i = 0; i < AGENT_METRICS_EVICT_N; i++)
		fprintf(f, "gcr_agent_eviction_images_total{result=\"%s\"} %llu\n", evict_names[i], m->evict[i]);
	fprintf(f, "# HELP gcr_agent_eviction_image_seconds_total Time from the hold to a written image, summed.\n"
		   "# TYPE gcr_agent_eviction_image_seconds_total counter\n"
		   "gcr_agent_eviction_image_seconds_total %.3f\n", m->evict_s);
	if (m->shares != NULL) {
		fprintf(f, "# HELP gcr_agent_share_capacity Entries of a per-node table or pool (docs/install.md, \"Shares "
			   "per pod\").\n# TYPE gcr_agent_share_capacity gauge\n"
			   "# HELP gcr_agent_share_per_owner Entries one pod (workers: one namespace) may hold at once.\n"
			   "# TYPE gcr_agent_share_per_owner gauge\n"
			   "# HELP gcr_agent_share_in_use Entries held now.\n# TYPE gcr_agent_share_in_use gauge\n"
			   "# HELP gcr_agent_share_owners Pods (workers: namespaces) holding entries now.\n"
			   "# TYPE gcr_agent_share_owners gauge\n"
			   "# HELP gcr_agent_share_refused_total Requests refused because their pod (namespace) held its "
			   "whole share, or the table was full.\n# TYPE gcr_agent_share_refused_total counter\n");
		agent_shares_each(m->shares, share_lines, f);
	}
	fprintf(f, "# HELP gcr_agent_bytes_moved_total Bytes moved between GPU and host memory.\n"
		   "# TYPE gcr_agent_bytes_moved_total counter\n");
	for (int k = 0; k < NKINDS; k++)
		fprintf(f, "gcr_agent_bytes_moved_total{kind=\"%s\"} %llu\n", kind_names[k], m->bytes[k]);
	pthread_mutex_unlock(&m->lock);
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
	fprintf(f, "# HELP gcr_agent_http_connections Connections the metrics server holds, this one included.\n"
		   "# TYPE gcr_agent_http_connections gauge\n"
		   "gcr_agent_http_connections %u\n"
		   "# HELP gcr_agent_http_connection_limit Connections the metrics server holds at most.\n"
		   "# TYPE gcr_agent_http_connection_limit gauge\n"
		   "gcr_agent_http_connection_limit %u\n",
		info ? info->num_connections : 0, m->max_connections);
	fprintf(f, "# HELP gcr_agent_registered_processes Processes registered by their shim.\n"
		   "# TYPE gcr_agent_registered_processes gauge\n"
		   "gcr_agent_registered_processes %d\n",
		m->registered ? m->registered(m->data) : 0);
	pthread_mutex_lock(&m->src_lock);
	for (int i = 0; i < AGENT_METRICS_SOURCES; i++)
		if (m->src_fn[i] != NULL)
			m->src_fn[i](f, m->src_data[i]);
	pthread_mutex_unlock(&m->src_lock);
	fclose(f);
	return buf;
}

void agent_metrics_add_source(struct agent_metrics *m, agent_metrics_source_fn fn, void *data)
{
	pthread_mutex_lock(&m->src_lock);
	int done = 0;
	for (int i = 0; i < AGENT_METRICS_SOURCES && !done; i++) {
		if (fn == NULL && m->src_data[i] == data && m->src_fn[i] != NULL) {
			m->src_fn[i] = NULL;
			m->src_data[i] = NULL;
			done = 1;
		} else if (fn != NULL && m->src_fn[i] == NULL) {
			m->src_fn[i] = fn;
			m->src_data[i] = data;
			done = 1;
		}
	}
	pthread_mutex_unlock(&m->src_lock);
	if (fn != NULL && !done)
		GCR_LOG(GCR_LOG_WARN, "metrics", "more than %d metric sources: one is left out", AGENT_METRICS_SOURCES);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			      const char *version, const char *upload, size_t *upload_len, void **ctx)
{
	struct agent_metrics *m = cls;
	unsigned int code = MHD_HTTP_OK;
	char *body = NULL;
	const char *ctype = "text/plain; charset=utf-8";
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
		code = MHD_HTTP_METHOD_NOT_ALLOWED;
		body = strdup("method not allowed\n");
	} else if (strcmp(url, "/healthz") == 0) {
		body = strdup("ok\n");
	} else if (strcmp(url, "/readyz") == 0) {
		body = readyz(m, &code);
	} else if (strcmp(url, "/metrics") == 0) {
		body = render(m);
		ctype = "text/plain; version=0.0.4; charset=utf-8";
	} else {
		code = MHD_HTTP_NOT_FOUND;
		body = strdup("not found\n");
	}
	if (body == NULL)
		return MHD_NO;
	struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
	if (r == NULL) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", ctype);
	enum MHD_Result ret = MHD_queue_response(c, code, r);
	MHD_destroy_response(r);
	return ret;
}

/* libmicrohttpd's messages, one line each at WARN; at most one a second, since a flood
 * past the connection cap makes one per refused connection. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct agent_metrics *m = cls;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	long long last = atomic_load(&m->log_second);
	if (ts.tv_sec == last || !atomic_compare_exchange_strong(&m->log_second, &last, (long long)ts.tv_sec)) {
		atomic_fetch_add(&m->log_suppressed, 1);
		return;
	}
	char line[512];
	vsnprintf(line, sizeof(line), fmt, ap);
	line[strcspn(line, "\r\n")] = '\0';
	unsigned int dropped = atomic_exchange(&m->log_suppressed, 0);
	GCR_LOG(GCR_LOG_WARN, "metrics", "http server: %s (%u similar lines dropped)", line, dropped);
}

unsigned long agent_metrics_raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	rlim_t was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			GCR_LOG(GCR_LOG_WARN, "metrics", "cannot raise the open files limit from %llu to %llu: %s",
				(unsigned long long)was, (unsigned long long)rl.rlim_max, strerror(errno));
			rl.rlim_cur = was;
		} else {
			GCR_LOG(GCR_LOG_INFO, "metrics", "open files limit raised from %llu to the hard limit %llu",
				(unsigned long long)was, (unsigned long long)rl.rlim_cur);
		}
	}
	return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)ULONG_MAX ? ULONG_MAX : (unsigned long)rl.rlim_cur;
}

/* The default cap for a process allowed nofile descriptors: AGENT_METRICS_MAX_CONNECTIONS,
 * less when the descriptors kept for the rest of the agent would not be left; where the
 * limit is very low, a quarter of it, so that probes still get through. */
static unsigned int default_cap(unsigned long nofile)
{
	unsigned long cap = nofile > AGENT_METRICS_FD_RESERVE ? nofile - AGENT_METRICS_FD_RESERVE : 0;
	if (cap < nofile / 4)
		cap = nofile / 4;
	return cap < AGENT_METRICS_MAX_CONNECTIONS ? (unsigned int)cap : AGENT_METRICS_MAX_CONNECTIONS;
}

int agent_metrics_new(const char *address, agent_metrics_gauge_fn registered, void *data,
		      struct agent_metrics **out, struct gcr_err *err)
{
	struct agent_metrics_limits lim = { .max_connections = default_cap(agent_metrics_raise_nofile()),
					    .idle_timeout_s = AGENT_METRICS_IDLE_TIMEOUT_S };
	return agent_metrics_new_limited(address, registered, data, &lim, out, err);
}

int agent_metrics_new_limited(const char *address, agent_metrics_gauge_fn registered, void *data,
			      const struct agent_metrics_limits *lim, struct agent_metrics **out, struct gcr_err *err)
{
	*out = NULL;
	if (lim->max_connections == 0 || lim->idle_timeout_s == 0)
		return gcr_err_set(err, -EINVAL, "metrics server: connection limit and idle timeout must be > 0");
	char host[64];
	const char *colon = strrchr(address, ':');
	if (colon == NULL || (size_t)(colon - address) >= sizeof(host))
		return gcr_err_set(err, -EINVAL, "metrics address '%s' is not HOST:PORT", address);
	memcpy(host, address, (size_t)(colon - address));
	host[colon - address] = '\0';
	char *end;
	long port = strtol(colon + 1, &end, 10);
	if (*end != '\0' || port < 0 || port > 65535)
		return gcr_err_set(err, -EINVAL, "metrics address '%s': bad port", address);
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct sockaddr_in6 sa6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port) };
	struct sockaddr *bind_sa = (struct sockaddr *)&sa;
	/* epoll, else poll: never select() (see the top of this file). */
	unsigned int flags = MHD_USE_ERROR_LOG | (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES
							  ? MHD_USE_EPOLL_INTERNAL_THREAD
							  : MHD_USE_POLL_INTERNAL_THREAD);
	size_t hl = strlen(host);
	if (strcmp(host, "localhost") == 0)
		strcpy(host, "127.0.0.1");
	/* "[::1]:9464", and "[10.0.0.7]:9464" too: the chart writes "[$(POD_IP)]:PORT" without
	 * knowing the pod IP's family, so brackets may hold either. */
	if (hl > 2 && host[0] == '[' && host[hl - 1] == ']') {
		host[hl - 1] = '\0';
		memmove(host, host + 1, hl - 1);
		if (inet_pton(AF_INET, host, &sa.sin_addr) == 1)
			goto bind_ok;
		if (inet_pton(AF_INET6, host, &sa6.sin6_addr) != 1)
			return gcr_err_set(err, -EINVAL, "metrics address '%s': bad IP address", address);
		bind_sa = (struct sockaddr *)&sa6;
		flags |= MHD_USE_IPv6;
	} else if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
		return gcr_err_set(err, -EINVAL, "metrics address '%s': host must be an IP address", address);
	}
bind_ok:;
	struct agent_metrics *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	pthread_mutex_init(&m->lock, NULL);
	pthread_mutex_init(&m->src_lock, NULL);
	m->registered = registered;
	m->data = data;
	m->max_connections = lim->max_connections;
	/* The logger first: libmicrohttpd uses it only for what follows it. */
	m->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, answer, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, m,
				MHD_OPTION_SOCK_ADDR, bind_sa, MHD_OPTION_CONNECTION_LIMIT, lim->max_connections,
				MHD_OPTION_CONNECTION_TIMEOUT, lim->idle_timeout_s, MHD_OPTION_END);
	if (m->d == NULL) {
		agent_metrics_free(m);
		return gcr_err_set(err, -EADDRINUSE, "cannot serve metrics on %s", address);
	}
	GCR_LOG(GCR_LOG_INFO, "metrics", "serving http://%s with %s, at most %u connections, idle ones closed after %u s",
		address, (flags & MHD_USE_EPOLL) ? "epoll" : "poll", lim->max_connections, lim->idle_timeout_s);
	*out = m;
	return 0;
}

unsigned int agent_metrics_connections(struct agent_metrics *m)
{
	const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
	return info ? info->num_connections : 0;
}

void agent_metrics_free(struct agent_metrics *m)
{
	if (m == NULL)
		return;
	if (m->d != NULL)
		MHD_stop_daemon(m->d);
	pthread_mutex_destroy(&m->lock);
	pthread_mutex_destroy(&m->src_lock);
	free(m);
}

void agent_metrics_set_ready_check(struct agent_metrics *m, const char *what, agent_metrics_ready_fn fn,
				   void *data)
{
	pthread_mutex_lock(&m->lock);
	m->ready_fn = fn;
	m->ready_data = data;
	m->ready_what = what ? what : "?";
	pthread_mutex_unlock(&m->lock);
}

void agent_metrics_set_shares(struct agent_metrics *m, struct agent_shares *ss)
{
	pthread_mutex_lock(&m->lock);
	m->shares = ss;
	pthread_mutex_unlock(&m->lock);
}

void agent_metrics_set_ready(struct agent_metrics *m)
{
	atomic_store(&m->ready, 1);
}

void agent_metrics_op(struct agent_metrics *m, const char *kind, int ok, double ms, long long bytes)
{
	int k = strcmp(kind, "restore") == 0 ? KIND_RESTORE : KIND_CHECKPOINT;
	double s = ms / 1000.0;
	pthread_mutex_lock(&m->lock);
	m->ops[k][ok ? 1 : 0]++;
	for (size_t b = 0; b < NBUCKETS; b++)
		if (s <= buckets[b]) {
			m->bucket[k][b]++;
			break;
		}
	m->sum_s[k] += s;
	m->count[k]++;
	if (bytes > 0)
		m->bytes[k] += (unsigned long long)bytes;
	pthread_mutex_unlock(&m->lock);
}

/* The row of pod's overcommit counters (added when new, "other" past the bound); under m->lock. */
static int oc_row(struct agent_metrics *m, const char *pod)
{
	/* A label value: only characters of namespaces, names and uids (no quote, no newline). */
	char label[128];
	size_t n = 0;
	for (const char *c = pod; *c != '\0' && n < sizeof(label) - 1; c++)
		if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
		    *c == '.' || *c == '/' || *c == '_')
			label[n++] = *c;
	label[n] = '\0';
	int i = 0;
	while (i < m->noc && strcmp(m->oc[i].pod, label) != 0)
		i++;
	if (i == m->noc) {
		if (m->noc == AGENT_METRICS_OC_PODS) {
			i = AGENT_METRICS_OC_PODS;
			snprintf(m->oc[i].pod, sizeof(m->oc[i].pod), "other");
		} else {
			snprintf(m->oc[i].pod, sizeof(m->oc[i].pod), "%s", label);
		}
		if (m->noc < AGENT_METRICS_OC_PODS)
			m->noc++;
	}
	return i;
}

void agent_metrics_overcommit(struct agent_metrics *m, const char *pod, int resumed, double held_s, long long bytes)
{
	if (m == NULL)
		return;
	pthread_mutex_lock(&m->lock);
	int i = oc_row(m, pod);
	if (resumed) {
		m->oc[i].resumed++;
		m->oc[i].held_s += held_s;
	} else {
		m->oc[i].suspended++;
	}
	if (bytes > 0)
		m->oc[i].bytes += (unsigned long long)bytes;
	pthread_mutex_unlock(&m->lock);
}

void agent_metrics_overcommit_wake(struct agent_metrics *m, const char *pod, int idle, double waited_s)
{
	if (m == NULL)
		return;
	pthread_mutex_lock(&m->lock);
	int i = oc_row(m, pod);
	if (idle) {
		m->oc[i].idle++;
	} else {
		m->oc[i].wakes++;
		m->oc[i].wake_s += waited_s;
	}
	pthread_mutex_unlock(&m->lock);
}

void agent_metrics_eviction(struct agent_metrics *m, int result, double seconds)
{
	if (m == NULL || result < 0 || result >= AGENT_METRICS_EVICT_N)
		return;
	pthread_mutex_lock(&m->lock);
	m->evict[result]++;
	if (result == AGENT_METRICS_EVICT_WRITTEN)
		m->evict_s += seconds;
	pthread_mutex_unlock(&m->lock);
}
