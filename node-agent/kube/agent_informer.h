/* agent_informer: the process's shared mirrors (client-go's shared informers): one list-and-watch
 * per (path, query), whatever the number of roles that follow it; each subscriber keeps only its
 * own view of every object (its slim, or the watch's object itself, shared), in the one map. */
#ifndef AGENT_INFORMER_H
#define AGENT_INFORMER_H

#include <jansson.h>
#include <pthread.h>
#include <time.h>

#include "agent_kube.h"
#include "gcr_error.h"

/* Mirrors one process keeps at most, and subscribers of one mirror at most. */
#define AGENT_INFORMER_MAX 16
#define AGENT_INFORMER_MAX_SUBS 8

struct agent_informer_handler {
	/* What this subscriber keeps of obj (borrowed, not to be changed): a new reference, or NULL
	 * (nothing). NULL function: obj itself, shared by reference with the other subscribers (so
	 * never changed in place). Called without the lock, from the watch thread. */
	json_t *(*slim)(json_t *obj, void *data);
	/* Under the set's lock, once this subscriber's view changed: key NULL after a (re)list (the
	 * whole view is new); else the object's key, old its view before (NULL: none) and cur after
	 * (NULL: none now), both borrowed, never equal. May be NULL. Must not block: queue work. */
	void (*changed)(const char *key, json_t *old, json_t *cur, void *data);
	void *data;
};

struct agent_informers;
struct agent_informer_sub;

/* The process's set (one lock for every mirror in it). Borrows kube; NULL kube: no watch
 * threads, the caller feeds the mirrors (agent_informers_feed_*: unit tests). NULL: out of
 * memory. */
struct agent_informers *agent_informers_new(struct agent_kube *kube);

/* Subscribes h to the mirror of (path, query), made at its first subscriber (query NULL: none;
 * both copied). Before agent_informers_start only. *out is the set's, valid until it is freed. */
int agent_informers_subscribe(struct agent_informers *set, const char *path, const char *query,
			      const struct agent_informer_handler *h, struct agent_informer_sub **out,
			      struct gcr_err *err) __attribute__((warn_unused_result));

/* agent_informers_subscribe for each of n (path, no query, handler) pairs, subs[i] getting the
 * i-th: a role that follows several kinds. */
int agent_informers_subscribe_n(struct agent_informers *set, const char *const *paths,
				const struct agent_informer_handler *hs, int n, struct agent_informer_sub **subs,
				struct gcr_err *err) __attribute__((warn_unused_result));

/* Starts every mirror's watch thread; on failure those started run until stop. */
int agent_informers_start(struct agent_informers *set, struct gcr_err *err) __attribute__((warn_unused_result));

/* Stops and joins the watch threads (each within its watch request's bound): no hook is called
 * after it returns, the views stay. The caller must not hold the lock. NULL-safe, idempotent. */
void agent_informers_stop(struct agent_informers *set);

/* Stops, then frees every mirror and subscription. NULL-safe. */
void agent_informers_free(struct agent_informers *set);

/* The set's lock: it guards every view (read under it; a subscriber may change its own slim
 * views in place under it, never a shared object). */
void agent_informers_lock(struct agent_informers *set);
void agent_informers_unlock(struct agent_informers *set);

/* Waits on cond, the caller's, with the set's lock (held, and held again on return): a
 * subscriber whose state the lock guards too waits for what its hooks signal (broadcast under
 * the lock). deadline NULL: no bound. 0 woken (maybe spuriously), else ETIMEDOUT. */
int agent_informers_wait_locked(struct agent_informers *set, pthread_cond_t *cond, const struct timespec *deadline);

/* sub's view of key (borrowed; under the lock), NULL when it keeps none. */
json_t *agent_informer_get_locked(const struct agent_informer_sub *sub, const char *key);

/* Walks sub's view under the lock: it NULL for the first entry, else the last answer; NULL at
 * the end. *key and *view are borrowed. Nothing may change the mirror meanwhile (the lock held
 * throughout). */
void *agent_informer_next_locked(const struct agent_informer_sub *sub, void *it, const char **key, json_t **view);

/* 1 once sub's mirror has had its first list (before, an empty view means nothing), else 0;
 * under the lock. */
int agent_informer_synced_locked(const struct agent_informer_sub *sub);

/* 1 once every one of subs (n) is synced, else 0; under the lock. A role that compares kinds
 * with each other must wait for all their lists: before one, its objects would look absent. */
int agent_informer_synced_all_locked(struct agent_informer_sub *const *subs, int n);

/* Waits at most timeout_ms for sub's mirror to be listed: 1 synced, 0 not yet. Without the lock. */
int agent_informer_wait_synced(struct agent_informers *set, const struct agent_informer_sub *sub, int timeout_ms);

/* Feeds the mirror of (path, query) as its watch thread would: a list's items (borrowed), or one
 * event (type AGENT_WATCH_ADDED / MODIFIED / DELETED, obj borrowed). For a set made with kube
 * NULL; without the lock. -ENOENT: no such mirror. */
int agent_informers_feed_list(struct agent_informers *set, const char *path, const char *query, json_t *items);
int agent_informers_feed_event(struct agent_informers *set, const char *path, const char *query,
			       enum agent_watch_type type, json_t *obj);

#endif
