/* agent_metrics: the agent's counters and its HTTP endpoints (/healthz, /readyz,
 * Prometheus /metrics) served by libmicrohttpd on a local address. */
#ifndef AGENT_METRICS_H
#define AGENT_METRICS_H

#include <stdio.h>

#include "agent_share.h"
#include "gcr_error.h"

struct agent_metrics;

/* Counts registered processes on each scrape. */
typedef int (*agent_metrics_gauge_fn)(void *data);

/* The HTTP server's connections at most, by default: Prometheus and the kubelet's probes
 * need a handful; 2,000 idle ones must leave them answered. */
#define AGENT_METRICS_MAX_CONNECTIONS 4096u
/* Descriptors the default cap leaves to the rest of the agent: the registry's
 * AGENT_REGISTRY_MAX shims, the device plugin, the kube client, shim stats, files. */
#define AGENT_METRICS_FD_RESERVE 2048ul
/* A connection with no request for this long, in seconds, is closed. */
#define AGENT_METRICS_IDLE_TIMEOUT_S 10u

struct agent_metrics_limits {
	unsigned int max_connections; /* > 0; past it new connections wait in the backlog or are closed */
	unsigned int idle_timeout_s;  /* > 0 */
};

/* address "HOST:PORT": an IPv4 literal, "localhost", or either family in brackets ("[::1]",
 * "[10.0.0.7]": the chart passes the pod IP so, not knowing its family). Raises this process's
 * open files limit to its hard limit first (agent_metrics_raise_nofile) and caps the
 * connections at AGENT_METRICS_MAX_CONNECTIONS, or lower where that limit is too low to
 * keep AGENT_METRICS_FD_RESERVE descriptors for the rest of the agent. */
int agent_metrics_new(const char *address, agent_metrics_gauge_fn registered, void *data,
		      struct agent_metrics **out, struct gcr_err *err) __attribute__((warn_unused_result));

/* As agent_metrics_new with the limits given (tests; the process's limit is left as is). */
int agent_metrics_new_limited(const char *address, agent_metrics_gauge_fn registered, void *data,
			      const struct agent_metrics_limits *lim, struct agent_metrics **out,
			      struct gcr_err *err) __attribute__((warn_unused_result));

/* Raises RLIMIT_NOFILE's soft limit to the hard limit (process-wide), logging the change
 * or why it failed; returns the soft limit now in force. */
unsigned long agent_metrics_raise_nofile(void);

/* Connections the HTTP server holds now. */
unsigned int agent_metrics_connections(struct agent_metrics *m);
void agent_metrics_free(struct agent_metrics *m);

/* The shares of the node's tables (agent_share; borrowed, NULL: none again before it is
 * freed): /metrics shows each table's capacity, share, use and refusals. */
void agent_metrics_set_shares(struct agent_metrics *m, struct agent_shares *ss);

/* The watches have listed once: /readyz answers 200 from now on. */
void agent_metrics_set_ready(struct agent_metrics *m);

/* One more condition of /readyz besides the first lists: fn(data) != 0 once it holds;
 * what names it in the 503 body ("device plugin registered with the kubelet"). fn is
 * called from the HTTP thread under the metrics lock; after a call with NULL fn it is never
 * called again, so its data may be freed. */
typedef int (*agent_metrics_ready_fn)(void *data);
void agent_metrics_set_ready_check(struct agent_metrics *m, const char *what, agent_metrics_ready_fn fn,
				   void *data);

/* A module's own series, printed at every scrape after the agent's (fn(f, data) writes whole
 * "# HELP"/"# TYPE" blocks; called without the metrics lock). At most
 * AGENT_METRICS_SOURCES; fn NULL removes data's source (before data is freed). */
#define AGENT_METRICS_SOURCES 4
typedef void (*agent_metrics_source_fn)(FILE *f, void *data);
void agent_metrics_add_source(struct agent_metrics *m, agent_metrics_source_fn fn, void *data);

/* One finished operation: kind "checkpoint"/"restore", ok or not, its
 * duration in ms and bytes moved. */
void agent_metrics_op(struct agent_metrics *m, const char *kind, int ok, double ms, long long bytes);

/* Pods the overcommit counters keep apart; later ones are counted under pod="other". */
#define AGENT_METRICS_OC_PODS 256
/* One overcommit decision about pod ("namespace/name", else its uid): suspended for another
 * (resumed 0) or resumed after held_s seconds (resumed 1); bytes moved by it. */
void agent_metrics_overcommit(struct agent_metrics *m, const char *pod, int resumed, double held_s, long long bytes);

/* The overcommit wake: pod suspended for idling (idle 1), or resumed on its call after its
 * first caller waited waited_s seconds (idle 0). */
void agent_metrics_overcommit_wake(struct agent_metrics *m, const char *pod, int idle, double waited_s);

/* Eviction imaging (agent_evict): one hold's result, and for a written image the seconds from the
 * hold to its Checkpoint's success. */
enum {
	AGENT_METRICS_EVICT_WRITTEN = 0,
	AGENT_METRICS_EVICT_FAILED,
	AGENT_METRICS_EVICT_NO_TIME,
	AGENT_METRICS_EVICT_SKIPPED, /* nothing to do: not opted in, not preemption or drain, the policy off */
	AGENT_METRICS_EVICT_N,
};
void agent_metrics_eviction(struct agent_metrics *m, int result, double seconds);

#endif
