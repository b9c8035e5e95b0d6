/* agent_objmap: mirrors of Kubernetes objects, one list-and-watch thread per kind: each object
 * reduced by its owner's slim function to what the owner needs, kept in a map "namespace/name"
 * -> that under the owner's lock, and each change told to the owner under that lock. */
#ifndef AGENT_OBJMAP_H
#define AGENT_OBJMAP_H

#include <jansson.h>
#include <pthread.h>

#include "agent_kube.h"
#include "gcr_error.h"

/* Kinds one mirror watches at most. */
#define AGENT_OBJMAP_MAX_KINDS 4

struct agent_objmap_kind {
	const char *path;  /* the list and watch path, "/api/v1/pods" */
	const char *query; /* an extra query ("labelSelector=..."), NULL none */
};

struct agent_objmap_ops {
	/* What is kept of obj of kind k: a new reference, or NULL (not kept). Called without the
	 * lock, from the kind's thread. */
	json_t *(*slim)(int kind, json_t *obj, void *data);
	/* Under the lock, once the map of kind changed: key NULL after a (re)list (the whole map is
	 * new); else the object's key, old its entry before (NULL: none) and cur after (NULL:
	 * removed), both borrowed for the call. May be NULL. */
	void (*changed)(int kind, const char *key, json_t *old, json_t *cur, void *data);
	void *data;
};

struct agent_objmap;

/* Borrows kube, lock (the owner's: it guards the maps) and the strings of kinds (n of them, at
 * most AGENT_OBJMAP_MAX_KINDS), which must outlive the mirror. kube NULL: no watch threads, the
 * caller feeds the mirror (agent_objmap_feed_*: a fake watch feed for unit tests). */
int agent_objmap_new(struct agent_kube *kube, pthread_mutex_t *lock, const struct agent_objmap_kind *kinds, int n,
		     const struct agent_objmap_ops *ops, struct agent_objmap **out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Starts the threads; on failure those started run until agent_objmap_free. */
int agent_objmap_start(struct agent_objmap *m, struct gcr_err *err) __attribute__((warn_unused_result));

/* What kind's watch thread does with a list's items (borrowed) and with one event; for a mirror
 * made with kube NULL. Take the lock themselves: the caller must not hold it. */
void agent_objmap_feed_list(struct agent_objmap *m, int kind, json_t *items);
void agent_objmap_feed_event(struct agent_objmap *m, int kind, const struct agent_watch_event *ev);

/* The map of kind (borrowed; the caller holds the lock and may change entries in place). */
json_t *agent_objmap_map_locked(struct agent_objmap *m, int kind);

/* 1 once every kind was listed (a map before its list would look empty), else 0; under the lock. */
int agent_objmap_synced_locked(const struct agent_objmap *m);

/* Stops and joins the threads (each within its watch request's bound); the maps stay, no longer
 * changed. The caller must not hold the lock. NULL-safe, idempotent. */
void agent_objmap_stop(struct agent_objmap *m);

/* Stops (agent_objmap_stop), then frees the maps. NULL-safe. */
void agent_objmap_free(struct agent_objmap *m);

#endif
