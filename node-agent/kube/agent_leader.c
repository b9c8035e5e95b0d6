/* agent_leader: leader election among the agents on a coordination.k8s.io/v1 Lease:
 * acquire, renew and take over with resourceVersion-conditional writes, release on exit. */
#include "agent_leader.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcr_log.h"
#include "gcr_time.h"

#define LEASES "/apis/coordination.k8s.io/v1/namespaces/%s/leases"

struct agent_leader {
	struct agent_kube *kube;
	char *ns, *name, *identity;
	int lease_ms;
	atomic_int stop;
	atomic_int leader;        /* we hold it (last write succeeded) */
	atomic_llong renewed_ms;  /* monotonic time of the last successful write */
	atomic_uint terms;
	char observed_rv[128];    /* the Lease's resourceVersion when last read ... */
	long long observed_ms;    /* ... and when (monotonic) it was first seen */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t th;
	int started;
};

/* Writes obj (PUT to its path, or POST to the collection when create). 1 written,
 * 0 lost to another writer (409), -EIO on other errors. */
static int write_lease(struct agent_leader *l, json_t *obj, int create, struct gcr_err *err)
{
	char path[600];
	snprintf(path, sizeof(path), LEASES "%s%s", l->ns, create ? "" : "/", create ? "" : l->name);
	char *body = json_dumps(obj, JSON_COMPACT);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	long st = 0;
	int rc = agent_kube_request(l->kube, create ? "POST" : "PUT", path, "application/json", body, &st, NULL, err);
	free(body);
	if (rc < 0)
		return -EIO;
	if (st == 200 || st == 201)
		return 1;
	if (st == 409)
		return 0;
	return gcr_err_set(err, -EIO, "%s lease %s/%s: HTTP %ld", create ? "POST" : "PUT", l->ns, l->name, st);
}

/* One round: read the Lease, then create, renew or take it over, or leave it to
 * its live holder. Expiry is judged by our own clock since we saw it change (as
 * client-go does), so clock skew between nodes does not matter. */
static int round_once(struct agent_leader *l, struct gcr_err *err)
{
	char path[600], now[40];
	snprintf(path, sizeof(path), LEASES "/%s", l->ns, l->name);
	long st = 0;
	json_t *cur = NULL;
	if (agent_kube_request(l->kube, "GET", path, NULL, NULL, &st, &cur, err) < 0)
		return -EIO;
	agent_kube_time(now, sizeof(now), 1);
	int lease_s = (l->lease_ms + 999) / 1000;
	int rc;
	if (st == 404) {
		json_decref(cur);
		json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s}, s:{s:s, s:i, s:s, s:s, s:i}}", "apiVersion",
					"coordination.k8s.io/v1", "kind", "Lease", "metadata", "name", l->name,
					"namespace", l->ns, "spec", "holderIdentity", l->identity,
					"leaseDurationSeconds", lease_s, "acquireTime", now, "renewTime", now,
					"leaseTransitions", 0);
		rc = obj ? write_lease(l, obj, 1, err) : gcr_err_set(err, -ENOMEM, "out of memory");
		json_decref(obj);
		return rc;
	}
	if (st != 200 || !json_is_object(cur)) {
		json_decref(cur);
		return gcr_err_set(err, -EIO, "GET lease %s/%s: HTTP %ld", l->ns, l->name, st);
	}
	const char *rv = json_string_value(json_object_get(json_object_get(cur, "metadata"), "resourceVersion"));
	long long t = (long long)gcr_time_mono_ms();
	if (rv != NULL && strcmp(rv, l->observed_rv) != 0) {
		snprintf(l->observed_rv, sizeof(l->observed_rv), "%s", rv);
		l->observed_ms = t;
	}
	json_t *spec = json_object_get(cur, "spec");
	if (!json_is_object(spec)) {
		spec = json_object();
		json_object_set_new(cur, "spec", spec);
	}
	const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
	int mine = holder != NULL && strcmp(holder, l->identity) == 0;
	json_int_t dur = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
	if (dur <= 0)
		dur = lease_s;
	if (!mine && holder != NULL && holder[0] != '\0' && t - l->observed_ms < (long long)dur * 1000) {
		json_decref(cur);
		return 0; /* a live holder */
	}
	/* Renew ours or take it over; cur keeps metadata.resourceVersion, so a write
	 * racing another agent's conflicts (409) instead of both winning. */
	if (!mine) {
		json_int_t tr = json_integer_value(json_object_get(spec, "leaseTransitions"));
		/* Logged first: holder is borrowed from the holderIdentity replaced below. */
		GCR_LOG(GCR_LOG_INFO, "leader", "lease %s/%s: taking over from '%s'", l->ns, l->name,
			holder ? holder : "");
		json_object_set_new(spec, "holderIdentity", json_string(l->identity));
		json_object_set_new(spec, "acquireTime", json_string(now));
		json_object_set_new(spec, "leaseTransitions", json_integer(tr + 1));
	}
	json_object_set_new(spec, "leaseDurationSeconds", json_integer(lease_s));
	json_object_set_new(spec, "renewTime", json_string(now));
	rc = write_lease(l, cur, 0, err);
	json_decref(cur);
	return rc;
}

static void *leader_main(void *data)
{
	struct agent_leader *l = data;
	int period_ms = l->lease_ms / 4 > 100 ? l->lease_ms / 4 : 100;
	pthread_mutex_lock(&l->lock);
	while (!atomic_load(&l->stop)) {
		pthread_mutex_unlock(&l->lock);
		struct gcr_err err = { 0 };
		int rc = round_once(l, &err);
		int was = atomic_load(&l->leader);
		if (rc == 1) {
			atomic_store(&l->renewed_ms, (long long)gcr_time_mono_ms());
			if (!was) {
				atomic_fetch_add(&l->terms, 1);
				GCR_LOG(GCR_LOG_INFO, "leader", "lease %s/%s: leader now (%s)", l->ns, l->name, l->identity);
			}
			atomic_store(&l->leader, 1);
		} else {
			if (rc < 0)
				GCR_LOG(GCR_LOG_WARN, "leader", "lease %s/%s: %s", l->ns, l->name, err.msg);
			/* A failed renewal keeps the term until it lapses (is_leader checks the
			 * time); a lost race or a live other holder ends it now. */
			if (rc == 0 && was) {
				atomic_store(&l->leader, 0);
				GCR_LOG(GCR_LOG_WARN, "leader", "lease %s/%s: lost to another agent", l->ns, l->name);
			}
		}
		pthread_mutex_lock(&l->lock);
		struct timespec dl;
		gcr_time_deadline(&dl, period_ms);
		while (!atomic_load(&l->stop) && pthread_cond_timedwait(&l->cond, &l->lock, &dl) != ETIMEDOUT)
			;
	}
	pthread_mutex_unlock(&l->lock);
	return NULL;
}

int agent_leader_new(struct agent_kube *kube, const char *ns, const char *name, const char *identity,
		     int lease_s, struct agent_leader **out, struct gcr_err *err)
{
	*out = NULL;
	if (lease_s < 1)
		return gcr_err_set(err, -EINVAL, "leader lease of %d s", lease_s);
	struct agent_leader *l = calloc(1, sizeof(*l));
	if (l == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	l->kube = kube;
	l->lease_ms = lease_s * 1000;
	l->ns = strdup(ns);
	l->name = strdup(name);
	l->identity = strdup(identity);
	pthread_mutex_init(&l->lock, NULL);
	pthread_cond_init(&l->cond, NULL);
	if (l->ns == NULL || l->name == NULL || l->identity == NULL) {
		agent_leader_free(l);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	*out = l;
	return 0;
}

int agent_leader_start(struct agent_leader *l, struct gcr_err *err)
{
	int rc = pthread_create(&l->th, NULL, leader_main, l);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the leader election thread: %s", strerror(rc));
	l->started = 1;
	return 0;
}

int agent_leader_is_leader(struct agent_leader *l)
{
	if (l == NULL || !atomic_load(&l->leader))
		return 0;
	return (long long)gcr_time_mono_ms() - atomic_load(&l->renewed_ms) < (long long)l->lease_ms * 2 / 3;
}

unsigned agent_leader_terms(struct agent_leader *l)
{
	return l ? atomic_load(&l->terms) : 0;
}

const char *agent_leader_identity(const struct agent_leader *l)
{
	return l->identity;
}

/* Gives the Lease up: empty holder, 1 s term, conditional on the version we hold. */
static void release(struct agent_leader *l)
{
	char path[600];
	snprintf(path, sizeof(path), LEASES "/%s", l->ns, l->name);
	long st = 0;
	json_t *cur = NULL;
	struct gcr_err err;
	if (agent_kube_request(l->kube, "GET", path, NULL, NULL, &st, &cur, &err) == 0 && st == 200) {
		json_t *spec = json_object_get(cur, "spec");
		const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
		if (json_is_object(spec) && holder != NULL && strcmp(holder, l->identity) == 0) {
			json_object_set_new(spec, "holderIdentity", json_string(""));
			json_object_set_new(spec, "leaseDurationSeconds", json_integer(1));
			if (write_lease(l, cur, 0, &err) == 1)
				GCR_LOG(GCR_LOG_INFO, "leader", "lease %s/%s: released", l->ns, l->name);
		}
	}
	json_decref(cur);
}

void agent_leader_free(struct agent_leader *l)
{
	if (l == NULL)
		return;
	if (l->started) {
		pthread_mutex_lock(&l->lock);
		atomic_store(&l->stop, 1);
		pthread_cond_broadcast(&l->cond);
		pthread_mutex_unlock(&l->lock);
		pthread_join(l->th, NULL);
		if (atomic_load(&l->leader)) {
			atomic_store(&l->leader, 0);
			release(l);
		}
	}
	pthread_mutex_destroy(&l->lock);
	pthread_cond_destroy(&l->cond);
	free(l->ns);
	free(l->name);
	free(l->identity);
	free(l);
}
