/* agent_metrics: the agent's counters and its HTTP endpoints (/healthz, /readyz,
 * Prometheus /metrics) served by libmicrohttpd on a local address. */
#ifndef AGENT_METRICS_H
#define AGENT_METRICS_H

#include "gcr_error.h"

struct agent_metrics;

/* Counts registered processes on each scrape. */
typedef int (*agent_metrics_gauge_fn)(void *data);

/* address "HOST:PORT": an IPv4 literal, "localhost", or either family in brackets ("[::1]",
 * "[10.0.0.7]": the chart passes the pod IP so, not knowing its family). */
int agent_metrics_new(const char *address, agent_metrics_gauge_fn registered, void *data,
		      struct agent_metrics **out, struct gcr_err *err) __attribute__((warn_unused_result));
void agent_metrics_free(struct agent_metrics *m);

/* The watches have listed once: /readyz answers 200 from now on. */
void agent_metrics_set_ready(struct agent_metrics *m);

/* One more condition of /readyz besides the first lists: fn(data) != 0 once it holds;
 * what names it in the 503 body ("device plugin registered with the kubelet"). fn is
 * called from the HTTP thread under the metrics lock; after a call with NULL fn it is never
 * called again, so its data may be freed. */
typedef int (*agent_metrics_ready_fn)(void *data);
void agent_metrics_set_ready_check(struct agent_metrics *m, const char *what, agent_metrics_ready_fn fn,
				   void *data);

/* One finished operation: kind "checkpoint"/"restore", ok or not, its
 * duration in ms and bytes moved. */
void agent_metrics_op(struct agent_metrics *m, const char *kind, int ok, double ms, long long bytes);

#endif
