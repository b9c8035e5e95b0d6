/* agent_kube: a small Kubernetes API client on libcurl + jansson: requests,
 * list-then-watch loops with relist on 410 and reconnect backoff, status patches, Events. */
#include "agent_kube.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "gcr_log.h"

/* A list's body in bytes: far above any list this agent makes, yet bounded. */
#define BODY_MAX (256u * 1024 * 1024)
/* Server-side watch timeout in seconds: the server ends the watch cleanly and
 * we resume from the last resourceVersion, so a silently dead link heals. */
#define WATCH_TIMEOUT_S 240

struct agent_kube {
	struct agent_kubeconfig *kc;
	pthread_mutex_t lock; /* guards kc's token (refreshed from any thread) */
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct agent_kube *agent_kube_new(struct agent_kubeconfig *kc)
{
	struct agent_kube *k = calloc(1, sizeof(*k));
	if (k == NULL)
		return NULL;
	pthread_once(&curl_once, curl_init);
	k->kc = kc;
	pthread_mutex_init(&k->lock, NULL);
	return k;
}

void agent_kube_free(struct agent_kube *k)
{
	if (k == NULL)
		return;
	agent_kubeconfig_free(k->kc);
	pthread_mutex_destroy(&k->lock);
	free(k);
}

void agent_kube_time(char *buf, size_t len, int micro)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char base[32];
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	if (micro)
		snprintf(buf, len, "%s.%06ldZ", base, ts.tv_nsec / 1000);
	else
		snprintf(buf, len, "%sZ", base);
}

/* Sets URL (base, or the API server's when NULL, then path), TLS (always verified, against
 * the cluster's CA) and authentication on h; *hdrs gets the header list the caller frees
 * after the transfer. */
static int setup_at(struct agent_kube *k, CURL *h, const char *base, const char *path, struct curl_slist **hdrs,
		    struct gcr_err *err)
{
	struct agent_kubeconfig *kc = k->kc;
	if (base == NULL)
		base = kc->server;
	size_t n = strlen(base) + strlen(path) + 1;
	char *url = malloc(n);
	if (url == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	snprintf(url, n, "%s%s", base, path);
	curl_easy_setopt(h, CURLOPT_URL, url);
	free(url); /* curl copies it */
	curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
	curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "https");
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
	if (kc->ca_pem != NULL) {
		struct curl_blob b = { .data = kc->ca_pem, .len = kc->ca_pem_len, .flags = CURL_BLOB_COPY };
		curl_easy_setopt(h, CURLOPT_CAINFO_BLOB, &b);
	} else if (kc->ca_file != NULL) {
		curl_easy_setopt(h, CURLOPT_CAINFO, kc->ca_file);
	}
	if (kc->client_cert_pem != NULL) {
		struct curl_blob c = { .data = kc->client_cert_pem, .len = kc->client_cert_pem_len,
				       .flags = CURL_BLOB_COPY };
		struct curl_blob key = { .data = kc->client_key_pem, .len = kc->client_key_pem_len,
					 .flags = CURL_BLOB_COPY };
		curl_easy_setopt(h, CURLOPT_SSLCERT_BLOB, &c);
		curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &key);
	} else if (kc->client_cert_file != NULL) {
		curl_easy_setopt(h, CURLOPT_SSLCERT, kc->client_cert_file);
		curl_easy_setopt(h, CURLOPT_SSLKEY, kc->client_key_file);
	}
	*hdrs = curl_slist_append(NULL, "Accept: application/json");
	pthread_mutex_lock(&k->lock);
	struct gcr_err e2;
	if (agent_kubeconfig_refresh_token(kc, &e2) < 0)
		GCR_LOG(GCR_LOG_WARN, "kube", "token refresh: %s (keeping the old token)", e2.msg);
	if (kc->token != NULL) {
		size_t tn = strlen(kc->token) + 32;
		char *auth = malloc(tn);
		if (auth != NULL) {
			snprintf(auth, tn, "Authorization: Bearer %s", kc->token);
			*hdrs = curl_slist_append(*hdrs, auth);
			explicit_bzero(auth, tn);
			free(auth);
		}
	}
	pthread_mutex_unlock(&k->lock);
	return 0;
}

static int setup(struct agent_kube *k, CURL *h, const char *path, struct curl_slist **hdrs, struct gcr_err *err)
{
	return setup_at(k, h, NULL, path, hdrs, err);
}

struct body {
	char *buf;
	size_t len, cap;
};

static size_t body_write(char *p, size_t sz, size_t nm, void *data)
{
	struct body *b = data;
	size_t n = sz * nm;
	if (b->len + n + 1 > BODY_MAX)
		return 0;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n + 1)
			cap *= 2;
		char *nb = realloc(b->buf, cap);
		if (nb == NULL)
			return 0;
		b->buf = nb;
		b->cap = cap;
	}
	memcpy(b->buf + b->len, p, n);
	b->len += n;
	b->buf[b->len] = '\0';
	return n;
}

static int stop_progress(void *data, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	return atomic_load((atomic_int *)data) ? 1 : 0;
}

/* agent_kube_request at base (NULL: the API server), abandoned early when *stop becomes
 * non-zero (stop may be NULL); timeout_s bounds the whole transfer. */
static int request_at(struct agent_kube *k, const char *base, const char *method, const char *path,
		      const char *content_type, const char *body, long *status, json_t **out, atomic_int *stop,
		      long timeout_s, struct gcr_err *err)
{
	struct body b = { 0 };
	struct curl_slist *hdrs = NULL;
	int rc = 0;
	*status = 0;
	if (out != NULL)
		*out = NULL;
	CURL *h = curl_easy_init();
	if (h == NULL)
		return gcr_err_set(err, -ENOMEM, "curl_easy_init failed");
	rc = setup_at(k, h, base, path, &hdrs, err);
	if (rc < 0)
		goto out;
	if (content_type != NULL) {
		char ct[128];
		snprintf(ct, sizeof(ct), "Content-Type: %s", content_type);
		hdrs = curl_slist_append(hdrs, ct);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
	if (body != NULL)
		curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(h, CURLOPT_TIMEOUT, timeout_s);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
	if (stop != NULL) {
		curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, stop_progress);
		curl_easy_setopt(h, CURLOPT_XFERINFODATA, stop);
	}
	CURLcode cc = curl_easy_perform(h);
	if (cc != CURLE_OK) {
		rc = gcr_err_set(err, -EIO, "%s %s: %s", method, path, curl_easy_strerror(cc));
		goto out;
	}
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
	if (out != NULL && b.len > 0)
		*out = json_loadb(b.buf, b.len, 0, NULL);
	if (*status >= 400) {
		json_t *j = out != NULL ? *out : NULL;
		const char *m = json_string_value(json_object_get(j, "message"));
		gcr_err_set(err, -EIO, "%s %s: HTTP %ld: %s", method, path, *status,
			    m ? m : (b.buf ? b.buf : ""));
	}
out:
	curl_slist_free_all(hdrs);
	curl_easy_cleanup(h);
	free(b.buf);
	return rc;
}

static int request(struct agent_kube *k, const char *method, const char *path, const char *content_type,
		   const char *body, long *status, json_t **out, atomic_int *stop, struct gcr_err *err)
{
	return request_at(k, NULL, method, path, content_type, body, status, out, stop,
			  (long)AGENT_KUBE_REQUEST_TIMEOUT_S, err);
}

int agent_kube_request(struct agent_kube *k, const char *method, const char *path,
		       const char *content_type, const char *body, long *status, json_t **out,
		       struct gcr_err *err)
{
	return request(k, method, path, content_type, body, status, out, NULL, err);
}

int agent_kube_request_at(struct agent_kube *k, const char *base, const char *method, const char *path,
			  long timeout_s, long *status, json_t **out, struct gcr_err *err)
{
	return request_at(k, base, method, path, NULL, NULL, status, out, NULL, timeout_s, err);
}

int agent_kube_patch_status(struct agent_kube *k, const char *path, json_t *patch, struct gcr_err *err)
{
	char *body = json_dumps(patch, JSON_COMPACT);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	char full[1024];
	snprintf(full, sizeof(full), "%s/status", path);
	long st = 0;
	int rc = agent_kube_request(k, "PATCH", full, "application/merge-patch+json", body, &st, NULL, err);
	free(body);
	if (rc < 0)
		return rc;
	if (st == 404)
		return gcr_err_set(err, -ENOENT, "the object is gone (HTTP 404)");
	if (st == 422)
		return gcr_err_set(err, -EINVAL, "refused as invalid (HTTP 422: the phase is final already?)");
	if (st >= 400)
		return gcr_err_set(err, -EIO, "HTTP %ld", st);
	return 0;
}

int agent_kube_set_finalizer(struct agent_kube *k, const char *path, json_t *obj, const char *finalizer, int add,
			     struct gcr_err *err)
{
	json_t *md = json_object_get(obj, "metadata"), *list = json_array();
	size_t i;
	json_t *f;
	int had = 0;
	json_array_foreach(json_object_get(md, "finalizers"), i, f)
	{
		if (json_is_string(f) && strcmp(json_string_value(f), finalizer) == 0)
			had = 1;
		else
			json_array_append(list, f);
	}
	if (had == add) {
		json_decref(list);
		return 0;
	}
	if (add)
		json_array_append_new(list, json_string(finalizer));
	json_t *patch = json_pack("{s:{s:o, s:O*}}", "metadata", "finalizers", list, "resourceVersion",
				  json_object_get(md, "resourceVersion"));
	char *body = patch ? json_dumps(patch, JSON_COMPACT) : NULL;
	json_decref(patch);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	long st = 0;
	int rc = agent_kube_request(k, "PATCH", path, "application/merge-patch+json", body, &st, NULL, err);
	free(body);
	if (rc < 0)
		return rc;
	if (st == 404)
		return gcr_err_set(err, -ENOENT, "the object is gone (HTTP 404)");
	if (st == 409)
		return gcr_err_set(err, -EAGAIN, "changed meanwhile (HTTP 409)");
	if (st == 422)
		return gcr_err_set(err, -EINVAL, "refused (HTTP 422: being deleted?)");
	if (st >= 400)
		return gcr_err_set(err, -EIO, "HTTP %ld", st);
	return 0;
}

int agent_kube_event(struct agent_kube *k, json_t *obj, const char *type, const char *reason,
		     const char *action, const char *note, const char *reporting_instance,
		     struct gcr_err *err)
{
	json_t *md = json_object_get(obj, "metadata");
	const char *ns = json_string_value(json_object_get(md, "namespace"));
	const char *name = json_string_value(json_object_get(md, "name"));
	if (ns == NULL || name == NULL)
		return gcr_err_set(err, -EINVAL, "event about an object without namespace/name");
	char now[40], gen[300], path[512];
	agent_kube_time(now, sizeof(now), 1);
	snprintf(gen, sizeof(gen), "%.240s-", name);
	char notebuf[1024];
	snprintf(notebuf, sizeof(notebuf), "%s", note); /* Event notes are at most 1 KiB */
	json_t *ev = json_pack(
		"{s:s, s:s, s:{s:s, s:s}, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:{s:O*, s:O*, s:s, s:s, s:O*}}",
		"apiVersion", "events.k8s.io/v1", "kind", "Event", "metadata", "generateName", gen,
		"namespace", ns, "eventTime", now, "reportingController", "gpucr.dev/gcr-agent",
		"reportingInstance", reporting_instance, "action", action, "reason", reason, "note",
		notebuf, "type", type, "regarding", "apiVersion", json_object_get(obj, "apiVersion"),
		"kind", json_object_get(obj, "kind"), "namespace", ns, "name", name, "uid",
		json_object_get(md, "uid"));
	if (ev == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	char *body = json_dumps(ev, JSON_COMPACT);
	json_decref(ev);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	snprintf(path, sizeof(path), "/apis/events.k8s.io/v1/namespaces/%s/events", ns);
	long st = 0;
	int rc = agent_kube_request(k, "POST", path, "application/json", body, &st, NULL, err);
	free(body);
	if (rc == 0 && st >= 300)
		rc = -EIO;
	return rc;
}

/* Watch transfer state: the decoder fed from curl's write callback. */
struct watch_xfer {
	struct agent_watch *w;
	CURL *h;
	atomic_int *stop;
	int rc; /* first decoder error */
	struct gcr_err err;
	char status[512]; /* start of a non-200 answer's body (a Status object) */
	size_t status_len;
};

static size_t watch_write(char *p, size_t sz, size_t nm, void *data)
{
	struct watch_xfer *x = data;
	size_t n = sz * nm;
	long code = 0;
	if (x->rc < 0)
		return 0;
	curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &code);
	if (code != 200) { /* not a stream: keep the Status for the log */
		size_t k = n < sizeof(x->status) - 1 - x->status_len ? n : sizeof(x->status) - 1 - x->status_len;
		memcpy(x->status + x->status_len, p, k);
		x->status_len += k;
		x->status[x->status_len] = '\0';
		return n;
	}
	int rc = agent_watch_feed(x->w, p, n, &x->err);
	if (rc < 0) {
		x->rc = rc;
		return 0; /* ends the transfer */
	}
	return n;
}

static int watch_progress(void *data, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
	struct watch_xfer *x = data;
	return atomic_load(x->stop) ? 1 : 0;
}

static void backoff_sleep(int *ms, atomic_int *stop)
{
	/* +-25% jitter so that many agents do not reconnect in step. */
	int j = *ms / 2 > 0 ? rand() % (*ms / 2 + 1) - *ms / 4 : 0;
	int total = *ms + j;
	for (int t = 0; t < total && !atomic_load(stop); t += 50)
		usleep(50 * 1000);
	*ms = *ms * 2 > AGENT_KUBE_BACKOFF_MAX_MS ? AGENT_KUBE_BACKOFF_MAX_MS : *ms * 2;
}

struct watch_ctx {
	const struct agent_kube_watch_ops *ops;
};

static int watch_cb(const struct agent_watch_event *ev, void *data, struct gcr_err *err)
{
	struct watch_ctx *c = data;
	if (ev->type != AGENT_WATCH_BOOKMARK)
		c->ops->on_event(ev, c->ops->data);
	return 0;
}

/* Lists path; on success hands the items over and records the list's version. */
static int do_list(struct agent_kube *k, const char *path, const char *query,
		   const struct agent_kube_watch_ops *ops, struct agent_watch *w, atomic_int *stop,
		   struct gcr_err *err)
{
	char full[1024];
	snprintf(full, sizeof(full), "%s%s%s", path, query ? "?" : "", query ? query : "");
	long st = 0;
	json_t *j = NULL;
	int rc = request(k, "GET", full, NULL, NULL, &st, &j, stop, err);
	if (rc == 0 && st != 200)
		rc = -EIO;
	const char *rv = json_string_value(json_object_get(json_object_get(j, "metadata"), "resourceVersion"));
	json_t *items = json_object_get(j, "items");
	if (rc == 0 && (rv == NULL || !json_is_array(items)))
		rc = gcr_err_set(err, -EPROTO, "GET %s: not a list", full);
	if (rc == 0) {
		ops->on_list(items, ops->data);
		agent_watch_set_resource_version(w, rv);
	}
	json_decref(j);
	return rc;
}

int agent_kube_obj_key(json_t *obj, char *key, size_t len)
{
	json_t *md = json_object_get(obj, "metadata");
	const char *ns = json_string_value(json_object_get(md, "namespace"));
	const char *name = json_string_value(json_object_get(md, "name"));
	if (ns == NULL || name == NULL)
		return -EINVAL;
	snprintf(key, len, "%s/%s", ns, name);
	return 0;
}

json_t *agent_kube_index(json_t *items)
{
	json_t *m = json_object();
	size_t i;
	json_t *it;
	char key[600];
	json_array_foreach(items, i, it)
	{
		if (m != NULL && agent_kube_obj_key(it, key, sizeof(key)) == 0)
			json_object_set(m, key, it);
	}
	return m;
}

int agent_kube_watch_loop(struct agent_kube *k, const char *path, const char *query,
			  const struct agent_kube_watch_ops *ops, atomic_int *stop)
{
	struct watch_ctx ctx = { .ops = ops };
	struct agent_watch *w = agent_watch_new(0, watch_cb, &ctx);
	if (w == NULL)
		return -ENOMEM;
	int need_list = 1, backoff = AGENT_KUBE_BACKOFF_MIN_MS;
	struct gcr_err err;
	while (!atomic_load(stop)) {
		if (need_list) {
			if (do_list(k, path, query, ops, w, stop, &err) < 0) {
				if (atomic_load(stop))
					break;
				GCR_LOG(GCR_LOG_WARN, "kube", "list %s: %s; retrying", path, err.msg);
				backoff_sleep(&backoff, stop);
				continue;
			}
			GCR_LOG(GCR_LOG_INFO, "kube", "listed %s at resourceVersion %s", path,
				agent_watch_resource_version(w));
			need_list = 0;
		}
		char full[1400];
		snprintf(full, sizeof(full),
			 "%s?watch=1&allowWatchBookmarks=true&timeoutSeconds=%d&resourceVersion=%s%s%s", path,
			 WATCH_TIMEOUT_S, agent_watch_resource_version(w), query ? "&" : "", query ? query : "");
		agent_watch_reset(w);
		struct watch_xfer x = { .w = w, .stop = stop };
		struct curl_slist *hdrs = NULL;
		CURL *h = curl_easy_init();
		if (h == NULL || setup(k, h, full, &hdrs, &err) < 0) {
			curl_easy_cleanup(h);
			curl_slist_free_all(hdrs);
			backoff_sleep(&backoff, stop);
			continue;
		}
		x.h = h;
		curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
		curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, watch_write);
		curl_easy_setopt(h, CURLOPT_WRITEDATA, &x);
		curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, watch_progress);
		curl_easy_setopt(h, CURLOPT_XFERINFODATA, &x);
		/* A dead peer shows as no bytes (not even bookmarks) for this long. */
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
		curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)WATCH_TIMEOUT_S + 30);
		curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
		CURLcode cc = curl_easy_perform(h);
		long st = 0;
		curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
		curl_slist_free_all(hdrs);
		curl_easy_cleanup(h);
		if (atomic_load(stop))
			break;
		if (x.rc == 0 && cc == CURLE_OK && st == 200)
			x.rc = agent_watch_finish(w, &x.err);
		if (st == 410 || x.rc == -ESTALE) {
			GCR_LOG(GCR_LOG_INFO, "kube", "watch %s: resourceVersion expired (410); relisting", path);
			need_list = 1;
			backoff = AGENT_KUBE_BACKOFF_MIN_MS;
			continue;
		}
		if (cc == CURLE_OK && st == 200 && x.rc == 0) {
			backoff = AGENT_KUBE_BACKOFF_MIN_MS; /* clean end (timeoutSeconds): resume */
			continue;
		}
		if (x.rc < 0)
			GCR_LOG(GCR_LOG_WARN, "kube", "watch %s: %s; relisting", path, x.err.msg);
		else
			GCR_LOG(GCR_LOG_WARN, "kube", "watch %s: HTTP %ld, %s%s%.200s; reconnecting", path, st,
				curl_easy_strerror(cc), x.status_len ? ": " : "", x.status);
		/* A broken stream or a bad request (400, 404) starts over from a list;
		 * a server that is starting, busy or not yet authorizing (401, 403,
		 * 429, 5xx) is asked again from the same resourceVersion: it answers
		 * 410 if that has expired meanwhile. */
		if (x.rc < 0 || st == 400 || st == 404)
			need_list = 1;
		backoff_sleep(&backoff, stop);
	}
	agent_watch_free(w);
	return 0;
}
