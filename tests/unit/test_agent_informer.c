/* test_agent_informer: the shared mirrors, fed as their watch threads would be (no cluster): one
 * mirror per (path, query) whatever the subscribers, each subscriber's own view (a slim one, or the
 * watch's object shared, never copied), hooks told only of their own view's changes, the synced
 * signal (bounded waits), a subscriber's own condition waited on with the set's lock, and no
 * subscription once started. */
#include "agent_informer.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "gcr_time.h"

#define PODS "/api/v1/pods"

/* Subscriber "a" keeps the name of pods labelled a=yes; "b" keeps every pod whole. */
struct sub {
	int lists, calls;
	char key[200];
	int had_old, has_cur;
};

static json_t *slim_a(json_t *obj, void *data)
{
	(void)data;
	json_t *md = json_object_get(obj, "metadata");
	const char *a = json_string_value(json_object_get(json_object_get(md, "labels"), "a"));
	if (a == NULL || strcmp(a, "yes") != 0)
		return NULL;
	return json_pack("{s:O}", "name", json_object_get(md, "name"));
}

static void changed(const char *key, json_t *old, json_t *cur, void *data)
{
	struct sub *s = data;
	if (key == NULL) {
		s->lists++;
		return;
	}
	s->calls++;
	snprintf(s->key, sizeof(s->key), "%s", key);
	s->had_old = old != NULL;
	s->has_cur = cur != NULL;
}

static json_t *pod(const char *name, const char *a, const char *phase)
{
	return json_pack("{s:{s:s, s:s, s:{s:s?}}, s:{s:s}}", "metadata", "namespace", "ns", "name", name, "labels",
			 "a", a, "status", "phase", phase);
}

struct waiter {
	struct agent_informers *set;
	struct agent_informer_sub *sub;
	int synced;
};

static void *waiter_main(void *data)
{
	struct waiter *w = data;
	w->synced = agent_informer_wait_synced(w->set, w->sub, 10000);
	return NULL;
}

/* A subscriber whose own state the set's lock guards (the controller's): its hook records, under
 * the lock, that it saw its pod and broadcasts its condition; its waiter waits on that
 * condition with the set's lock. */
struct own {
	struct agent_informers *set;
	pthread_cond_t cond;
	int seen, rc;
};

static void changed_own(const char *key, json_t *old, json_t *cur, void *data)
{
	struct own *o = data;
	(void)old;
	if (key != NULL && strcmp(key, "ns/p6") == 0 && cur != NULL) {
		o->seen = 1;
		pthread_cond_broadcast(&o->cond);
	}
}

static void *own_main(void *data)
{
	struct own *o = data;
	struct timespec dl;
	gcr_time_deadline(&dl, 10000);
	agent_informers_lock(o->set);
	while (!o->seen && o->rc == 0)
		o->rc = agent_informers_wait_locked(o->set, &o->cond, &dl);
	agent_informers_unlock(o->set);
	return NULL;
}

int main(void)
{
	struct agent_informers *set = agent_informers_new(NULL);
	struct agent_informer_sub *sa = NULL, *sb = NULL, *sq = NULL, *late = NULL;
	struct sub a = { 0 }, b = { 0 }, q = { 0 };
	struct gcr_err err;
	CHECK(set != NULL);
	const struct agent_informer_handler ha = { .slim = slim_a, .changed = changed, .data = &a },
					    hb = { .changed = changed, .data = &b },
					    hq = { .changed = changed, .data = &q };
	CHECK(agent_informers_subscribe(set, PODS, NULL, &ha, &sa, &err) == 0);
	CHECK(agent_informers_subscribe(set, PODS, NULL, &hb, &sb, &err) == 0);
	CHECK(agent_informers_subscribe(set, PODS, "labelSelector=a%3Dyes", &hq, &sq, &err) == 0);
	struct own own = { .set = set };
	struct agent_informer_sub *so = NULL;
	pthread_cond_init(&own.cond, NULL);
	const struct agent_informer_handler ho = { .changed = changed_own, .data = &own };
	CHECK(agent_informers_subscribe(set, PODS, NULL, &ho, &so, &err) == 0 && so != NULL);
	CHECK(agent_informers_start(set, &err) == 0);
	/* Started: no more subscribers (their views would be missing from every entry). */
	CHECK(agent_informers_subscribe(set, PODS, NULL, &hb, &late, &err) == -EBUSY && late == NULL);

	/* Not listed yet: not synced, and a wait for it ends in its time. */
	agent_informers_lock(set);
	CHECK(agent_informer_synced_locked(sa) == 0);
	agent_informers_unlock(set);
	CHECK(agent_informer_wait_synced(set, sa, 20) == 0);
	/* A waiter started before the list is woken by it (either order ends in 1). */
	struct waiter w = { .set = set, .sub = sb };
	pthread_t th;
	CHECK(pthread_create(&th, NULL, waiter_main, &w) == 0);

	json_t *items = json_pack("[o, o, o]", pod("p1", "yes", "Running"), pod("p2", NULL, "Running"),
				  pod("p3", "yes", "Pending"));
	CHECK(agent_informers_feed_list(set, PODS, NULL, items) == 0);
	pthread_join(th, NULL);
	CHECK(w.synced == 1);
	CHECK(a.lists == 1 && b.lists == 1);
	CHECK(q.lists == 0); /* another query: another mirror, not listed by this */
	CHECK(agent_informers_feed_list(set, PODS, "fieldSelector=x", items) == -ENOENT);
	agent_informers_lock(set);
	CHECK(agent_informer_synced_locked(sa) == 1 && agent_informer_synced_locked(sq) == 0);
	/* a's slim view; b's is the listed object itself, shared, not a copy. */
	json_t *va = agent_informer_get_locked(sa, "ns/p1");
	CHECK(va != NULL && json_object_size(va) == 1);
	CHECK_STR(json_string_value(json_object_get(va, "name")), "p1");
	CHECK(agent_informer_get_locked(sa, "ns/p2") == NULL);
	CHECK(agent_informer_get_locked(sb, "ns/p2") == json_array_get(items, 1));
	CHECK(agent_informer_get_locked(sb, "ns/p9") == NULL);
	/* Walks: a's view holds p1 and p3 only, b's all three. */
	int na = 0, nb = 0;
	const char *k;
	json_t *v;
	for (void *it = agent_informer_next_locked(sa, NULL, &k, &v); it; it = agent_informer_next_locked(sa, it, &k, &v))
	{
		na++;
		CHECK(strcmp(k, "ns/p2") != 0 && json_object_get(v, "name") != NULL);
	}
	for (void *it = agent_informer_next_locked(sb, NULL, &k, &v); it; it = agent_informer_next_locked(sb, it, &k, &v))
		nb++;
	CHECK(na == 2 && nb == 3);
	agent_informers_unlock(set);
	json_decref(items);

	/* p1's phase changes: only b keeps it, so only b is told. */
	json_t *p1 = pod("p1", "yes", "Succeeded");
	CHECK(agent_informers_feed_event(set, PODS, NULL, AGENT_WATCH_MODIFIED, p1) == 0);
	CHECK(a.calls == 0 && b.calls == 1 && b.had_old && b.has_cur);
	CHECK_STR(b.key, "ns/p1");
	json_decref(p1);
	/* p2 gains the label: a sees it appear (no old view), b sees it change. */
	json_t *p2 = pod("p2", "yes", "Running");
	CHECK(agent_informers_feed_event(set, PODS, NULL, AGENT_WATCH_MODIFIED, p2) == 0);
	CHECK(a.calls == 1 && !a.had_old && a.has_cur && b.calls == 2);
	CHECK_STR(a.key, "ns/p2");
	/* Deleted: both told, with no view after. */
	CHECK(agent_informers_feed_event(set, PODS, NULL, AGENT_WATCH_DELETED, p2) == 0);
	CHECK(a.calls == 2 && a.had_old && !a.has_cur && b.calls == 3 && !b.has_cur);
	json_decref(p2);
	/* An object without a namespace has no key: nobody is told. */
	json_t *bad = json_pack("{s:{s:s}}", "metadata", "name", "x");
	CHECK(agent_informers_feed_event(set, PODS, NULL, AGENT_WATCH_ADDED, bad) == 0);
	CHECK(a.calls == 2 && b.calls == 3);
	json_decref(bad);
	agent_informers_lock(set);
	CHECK(agent_informer_get_locked(sa, "ns/p2") == NULL && agent_informer_get_locked(sb, "ns/p2") == NULL);
	agent_informers_unlock(set);

	/* A relist replaces the views and tells each subscriber once. */
	items = json_pack("[o]", pod("p4", "yes", "Running"));
	CHECK(agent_informers_feed_list(set, PODS, NULL, items) == 0);
	json_decref(items);
	CHECK(a.lists == 2 && b.lists == 2);
	agent_informers_lock(set);
	CHECK(agent_informer_get_locked(sa, "ns/p1") == NULL && agent_informer_get_locked(sa, "ns/p4") != NULL);
	agent_informers_unlock(set);

	/* The other query's mirror is its own. */
	items = json_pack("[o]", pod("p5", "yes", "Running"));
	CHECK(agent_informers_feed_list(set, PODS, "labelSelector=a%3Dyes", items) == 0);
	json_decref(items);
	CHECK(q.lists == 1 && a.lists == 2);
	agent_informers_lock(set);
	CHECK(agent_informer_get_locked(sq, "ns/p5") != NULL && agent_informer_get_locked(sb, "ns/p5") == NULL);
	agent_informers_unlock(set);

	/* The own condition: a bounded wait nobody signals ends in its time, the lock held again;
	 * a waiter is woken by the hook's broadcast (either order ends in seen). */
	struct timespec dl;
	gcr_time_deadline(&dl, 20);
	agent_informers_lock(set);
	CHECK(agent_informers_wait_locked(set, &own.cond, &dl) == ETIMEDOUT);
	CHECK(agent_informer_synced_locked(so) == 1); /* the lock is held: the view is read */
	agent_informers_unlock(set);
	CHECK(pthread_create(&th, NULL, own_main, &own) == 0);
	json_t *p6 = pod("p6", NULL, "Running");
	CHECK(agent_informers_feed_event(set, PODS, NULL, AGENT_WATCH_ADDED, p6) == 0);
	json_decref(p6);
	pthread_join(th, NULL);
	CHECK(own.seen == 1 && own.rc == 0);
	agent_informers_lock(set);
	CHECK(agent_informer_get_locked(so, "ns/p6") != NULL && agent_informer_get_locked(sa, "ns/p6") == NULL);
	agent_informers_unlock(set);
	pthread_cond_destroy(&own.cond);

	agent_informers_stop(set);
	agent_informers_stop(set); /* idempotent */
	agent_informers_free(set);
	agent_informers_free(NULL);
	return test_summary("test_agent_informer");
}
