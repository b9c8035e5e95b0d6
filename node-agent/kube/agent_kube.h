/* agent_kube: a small Kubernetes API client on libcurl + jansson: requests,
 * list-then-watch loops with relist on 410 and reconnect backoff, status patches, Events. */
#ifndef AGENT_KUBE_H
#define AGENT_KUBE_H

#include <jansson.h>
#include <stdatomic.h>

#include "agent_kubeconfig.h"
#include "agent_watch.h"
#include "gcr_error.h"

/* One request's bound, in seconds; watches use their own (no total limit). */
#define AGENT_KUBE_REQUEST_TIMEOUT_S 30
/* Reconnect backoff: doubles from MIN to MAX milliseconds, with +-25% jitter. */
#define AGENT_KUBE_BACKOFF_MIN_MS 200
#define AGENT_KUBE_BACKOFF_MAX_MS 10000

struct agent_kube;

/* Takes ownership of kc. NULL when out of memory. */
struct agent_kube *agent_kube_new(struct agent_kubeconfig *kc);
void agent_kube_free(struct agent_kube *k);

/* One request. path starts with '/'; body may be NULL. *status gets the HTTP
 * status; *out (may be NULL) the decoded JSON body or NULL. Returns 0 when the
 * request got an HTTP answer (any status), -EIO on transport errors. */
int agent_kube_request(struct agent_kube *k, const char *method, const char *path,
		       const char *content_type, const char *body, long *status, json_t **out,
		       struct gcr_err *err) __attribute__((warn_unused_result));

/* The same at another server of the cluster (base: "https://host:port", no trailing '/'),
 * with the cluster's CA and the agent's credentials, no body, within timeout_s seconds:
 * the kubelet's API (its checkpoint endpoint, docs/images.md). */
int agent_kube_request_at(struct agent_kube *k, const char *base, const char *method, const char *path,
			  long timeout_s, long *status, json_t **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* PATCH <path>/status with application/merge-patch+json. 0, -ENOENT (404),
 * -EINVAL (422: e.g. the status is already final) or -EIO. */
int agent_kube_patch_status(struct agent_kube *k, const char *path, json_t *patch,
			    struct gcr_err *err) __attribute__((warn_unused_result));

/* Adds (add 1) or removes finalizer on the object at path, of which obj is a recent copy: a
 * merge patch of the whole metadata.finalizers list carrying obj's resourceVersion, so a
 * concurrent change fails (-EAGAIN, 409: read it again) instead of being lost. 0 (also when
 * nothing was to change), -ENOENT (404), -EINVAL (422: e.g. adding to an object being
 * deleted) or -EIO. */
int agent_kube_set_finalizer(struct agent_kube *k, const char *path, json_t *obj, const char *finalizer, int add,
			     struct gcr_err *err);

/* POSTs an events.k8s.io/v1 Event about obj (a namespaced object with
 * apiVersion/kind/metadata). type "Normal" or "Warning". */
int agent_kube_event(struct agent_kube *k, json_t *obj, const char *type, const char *reason,
		     const char *action, const char *note, const char *reporting_instance,
		     struct gcr_err *err);

/* A list-then-watch loop's callbacks; all run on the watch's own thread. */
struct agent_kube_watch_ops {
	/* After every (re)list: items is the list's "items" array (borrowed). */
	void (*on_list)(json_t *items, void *data);
	/* Each ADDED/MODIFIED/DELETED event (bookmarks are absorbed). */
	void (*on_event)(const struct agent_watch_event *ev, void *data);
	void *data;
};

/* "namespace/name" of a namespaced object into key; -EINVAL without them. */
int agent_kube_obj_key(json_t *obj, char *key, size_t len);
/* A new object mapping "namespace/name" to each of items (a list's "items"). */
json_t *agent_kube_index(json_t *items);

/* Runs list + watch on path (e.g. "/api/v1/pods") with an optional extra query
 * ("fieldSelector=..."), until *stop becomes non-zero. Relists on 410 (HTTP or
 * in-stream), reconnects with backoff and jitter. Returns 0 when stopped. */
int agent_kube_watch_loop(struct agent_kube *k, const char *path, const char *query,
			  const struct agent_kube_watch_ops *ops, atomic_int *stop);

/* "2026-01-02T03:04:05Z" (RFC 3339, seconds) and with microseconds for
 * Event.eventTime; buf needs 32 bytes. */
void agent_kube_time(char *buf, size_t len, int micro);

#endif
