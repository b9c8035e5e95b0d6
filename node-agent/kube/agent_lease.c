/* agent_lease: the node heartbeat, a coordination.k8s.io/v1 Lease "gcr-agent-<node>"
 * renewed by this node's agent (carrying its pods' activity), and whether another node's agent is alive.
 * The scaler creates the Lease (agent_lease_create_idle), so the node identity needs no create. */
#include "agent_lease.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent_scalemsg.h"
#include "gcr_log.h"

#define LEASES "/apis/coordination.k8s.io/v1/namespaces/%s/leases"
/* Attempts of one renewal when the update conflicts (someone else wrote it). */
#define CONFLICT_TRIES 3

struct agent_lease {
	struct agent_kube *kube;
	char *ns, *node;
	atomic_int stop;
	int period_s;
	int create; /* 404: create the Lease (role all) instead of waiting for the scaler to */
	char *(*note)(void *data); /* the activity annotation's text, or NULL */
	void *note_data;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t th;
	int started;
};

static void lease_path(char *buf, size_t len, const char *ns, const char *node)
{
	snprintf(buf, len, LEASES "/gcr-agent-%s", ns, node);
}

/* Sets (text non-NULL) the activity note on obj's metadata.annotations. */
static void set_note(json_t *obj, const char *text)
{
	if (obj == NULL || text == NULL)
		return;
	json_t *md = json_object_get(obj, "metadata");
	json_t *an = json_object_get(md, "annotations");
	if (!json_is_object(an)) {
		an = json_object();
		json_object_set_new(md, "annotations", an);
	}
	json_object_set_new(an, AGENT_SCALEMSG_ACTIVITY_KEY, json_string(text));
}

/* One renewal: GET; 404 -> POST a new Lease when l->create, else -ENOENT (the scaler
 * creates it); else PUT with the resourceVersion read (409 -> read again). note: the
 * activity annotation (NULL: left as it is). 0 or negative errno with the message in err. */
static int renew(struct agent_lease *l, const char *note, struct gcr_err *err)
{
	char path[600], coll[600], now[40], name[300];
	lease_path(path, sizeof(path), l->ns, l->node);
	snprintf(coll, sizeof(coll), LEASES, l->ns);
	snprintf(name, sizeof(name), "gcr-agent-%s", l->node);
	int rc = -EIO;
	for (int i = 0; i < CONFLICT_TRIES; i++) {
		long st = 0;
		json_t *cur = NULL;
		if (agent_kube_request(l->kube, "GET", path, NULL, NULL, &st, &cur, err) < 0)
			return -EIO;
		if (st != 200 && st != 404) {
			json_decref(cur);
			return gcr_err_set(err, -EIO, "GET lease %s/%s: HTTP %ld", l->ns, name, st);
		}
		agent_kube_time(now, sizeof(now), 1);
		json_t *obj;
		const char *method = "PUT", *where = path;
		if (st == 404 && !l->create) {
			/* A PUT would be authorized as a create, which the node identity lacks. */
			json_decref(cur);
			return gcr_err_set(err, -ENOENT,
					   "waiting for the scaler to create lease %s/%s (it does for every node running "
					   "an agent pod); retrying every %d s",
					   l->ns, name, l->period_s);
		}
		if (st == 404) {
			obj = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:i, s:s, s:s}}", "apiVersion",
					"coordination.k8s.io/v1", "kind", "Lease", "metadata", "name", name, "namespace",
					l->ns, "spec", "holderIdentity", l->node, "leaseDurationSeconds",
					AGENT_LEASE_DURATION_S, "acquireTime", now, "renewTime", now);
			method = "POST";
			where = coll;
			json_decref(cur);
		} else {
			obj = cur; /* keeps metadata.resourceVersion: a stale write conflicts */
			json_t *spec = json_object_get(obj, "spec");
			if (!json_is_object(spec)) {
				spec = json_object();
				json_object_set_new(obj, "spec", spec);
			}
			json_object_set_new(spec, "holderIdentity", json_string(l->node));
			json_object_set_new(spec, "leaseDurationSeconds", json_integer(AGENT_LEASE_DURATION_S));
			json_object_set_new(spec, "renewTime", json_string(now));
		}
		set_note(obj, note);
		char *body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
		json_decref(obj);
		if (body == NULL)
			return gcr_err_set(err, -ENOMEM, "out of memory");
		st = 0;
		rc = agent_kube_request(l->kube, method, where, "application/json", body, &st, NULL, err);
		free(body);
		if (rc < 0)
			return -EIO;
		if (st == 200 || st == 201)
			return 0;
		rc = gcr_err_set(err, -EIO, "%s lease %s/%s: HTTP %ld", method, l->ns, name, st);
		if (st != 409)
			return rc; /* 409: updated or created meanwhile; read again */
	}
	return rc;
}

static void *lease_main(void *data)
{
	struct agent_lease *l = data;
	int failing = 0; /* 1: a renewal failed; 2: the Lease is missing (said once) */
	pthread_mutex_lock(&l->lock);
	while (!atomic_load(&l->stop)) {
		/* The next renewal is due a period after this one starts, whatever this one takes. */
		struct timespec dl;
		clock_gettime(CLOCK_REALTIME, &dl);
		dl.tv_sec += l->period_s;
		pthread_mutex_unlock(&l->lock);
		struct gcr_err err;
		/* The note waits for no shim past its own bound (agent_activity: all at once, 500 ms
		 * in all), so stopped processes cannot delay the renewal past its Lease's expiry. */
		char *note = l->note ? l->note(l->note_data) : NULL;
		int rc = renew(l, note, &err);
		free(note);
		if (rc == -ENOENT) {
			if (failing != 2) /* once, not every period: the scaler may take a while */
				GCR_LOG(GCR_LOG_WARN, "lease", "node heartbeat: %s", err.msg);
			failing = 2;
		} else if (rc < 0) {
			GCR_LOG(GCR_LOG_WARN, "lease", "node heartbeat: %s", err.msg);
			failing = 1;
		} else if (failing) {
			GCR_LOG(GCR_LOG_INFO, "lease", "node heartbeat renewed again");
			failing = 0;
		}
		pthread_mutex_lock(&l->lock);
		while (!atomic_load(&l->stop) && pthread_cond_timedwait(&l->cond, &l->lock, &dl) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int agent_lease_new(struct agent_kube *kube, const char *ns, const char *node, struct agent_lease **out,
		    struct gcr_err *err)
{
	*out = NULL;
	struct agent_lease *l = calloc(1, sizeof(*l));
	if (l == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	l->kube = kube;
	l->ns = strdup(ns);
	l->node = strdup(node);
	l->period_s = AGENT_LEASE_RENEW_S;
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cond, NULL);
	if (l->ns == NULL || l->node == NULL) {
		agent_lease_free(l);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	*out = l;
	return 0;
}

void agent_lease_set_period(struct agent_lease *l, int seconds)
{
	if (seconds >= 1 && seconds < AGENT_LEASE_DURATION_S)
		l->period_s = seconds;
}

void agent_lease_set_create(struct agent_lease *l, int create)
{
	l->create = create;
}

void agent_lease_set_note(struct agent_lease *l, char *(*note)(void *data), void *data)
{
	l->note = note;
	l->note_data = data;
}

int agent_lease_start(struct agent_lease *l, struct gcr_err *err)
{
	int rc = pthread_create(&l->th, NULL, lease_main, l);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the lease thread: %s", strerror(rc));
	l->started = 1;
	return 0;
}

void agent_lease_free(struct agent_lease *l)
{
	if (l == NULL)
		return;
	if (l->started) {
		pthread_mutex_lock(&l->lock);
		atomic_store(&l->stop, 1);
		pthread_cond_broadcast(&l->cond);
		pthread_mutex_unlock(&l->lock);
		pthread_join(l->th, NULL);
	}
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	free(l->ns);
	free(l->node);
	free(l);
}

int agent_lease_create_idle(struct agent_kube *kube, const char *ns, const char *node, struct gcr_err *err)
{
	char coll[600], name[300];
	snprintf(coll, sizeof(coll), LEASES, ns);
	snprintf(name, sizeof(name), "gcr-agent-%s", node);
	/* No holder and no renewTime: read as not live until the node's agent renews it. */
	json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:i}}", "apiVersion", "coordination.k8s.io/v1", "kind",
				"Lease", "metadata", "name", name, "namespace", ns, "spec", "leaseDurationSeconds",
				AGENT_LEASE_DURATION_S);
	char *body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
	json_decref(obj);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	long st = 0;
	int rc = agent_kube_request(kube, "POST", coll, "application/json", body, &st, NULL, err);
	free(body);
	if (rc < 0)
		return -EIO;
	if (st == 201)
		return 1;
	if (st == 409)
		return 0; /* created meanwhile (by the node's agent in role all, or a previous leader) */
	return gcr_err_set(err, -EIO, "POST lease %s/%s: HTTP %ld; node %s's agent keeps waiting for it", ns, name,
			   st, node);
}

/* Seconds since the epoch of an RFC 3339 UTC time ("...T..:..:..[.ffffff]Z"), -1 when malformed. */
static time_t parse_time(const char *s)
{
	struct tm tm = { 0 };
	const char *end = s ? strptime(s, "%Y-%m-%dT%H:%M:%S", &tm) : NULL;
	if (end == NULL)
		return -1;
	return timegm(&tm);
}

int agent_lease_node_activity(struct agent_kube *kube, const char *ns, const char *node, char **note,
			      struct gcr_err *err)
{
	char path[600];
	lease_path(path, sizeof(path), ns, node);
	long st = 0;
	json_t *lease = NULL;
	if (note != NULL)
		*note = NULL;
	if (agent_kube_request(kube, "GET", path, NULL, NULL, &st, &lease, err) < 0)
		return -EIO;
	int rc;
	if (st == 404) {
		rc = 0;
	} else if (st != 200) {
		rc = gcr_err_set(err, -EIO, "GET lease %s/gcr-agent-%s: HTTP %ld", ns, node, st);
	} else {
		json_t *spec = json_object_get(lease, "spec");
		time_t renewed = parse_time(json_string_value(json_object_get(spec, "renewTime")));
		json_int_t dur = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
		rc = renewed >= 0 && dur > 0 && renewed + (time_t)dur > time(NULL);
		const char *text = json_string_value(json_object_get(
			json_object_get(json_object_get(lease, "metadata"), "annotations"), AGENT_SCALEMSG_ACTIVITY_KEY));
		if (rc == 1 && note != NULL && text != NULL && (*note = strdup(text)) == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of memory");
	}
	json_decref(lease);
	return rc;
}

int agent_lease_node_live(struct agent_kube *kube, const char *ns, const char *node, struct gcr_err *err)
{
	return agent_lease_node_activity(kube, ns, node, NULL, err);
}
