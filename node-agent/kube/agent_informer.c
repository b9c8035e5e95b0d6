/* agent_informer: shared mirrors on top of agent_objmap. Each (path, query) is one objmap of one
 * kind whose entry per object is an array of the subscribers' views (JSON null: not kept), so a
 * pod is decoded once, kept once, and an object no subscriber keeps costs nothing; the scaler's
 * process watched all pods twice (gate, replace) before this. */
#include "agent_informer.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "agent_objmap.h"
#include "gcr_time.h"

struct agent_informer_sub {
	struct agent_informer *inf;
	int index; /* its view's place in each entry's array */
	struct agent_informer_handler h;
};

struct agent_informer {
	struct agent_informers *set;
	char *path, *query;
	struct agent_objmap *om; /* one kind: "ns/name" -> [view of sub 0, view of sub 1, ...] */
	struct agent_informer_sub subs[AGENT_INFORMER_MAX_SUBS];
	int nsubs;
};

struct agent_informers {
	struct agent_kube *kube;
	pthread_mutex_t lock; /* guards every mirror's map (agent_objmap's owner lock) */
	pthread_cond_t listed; /* broadcast after every list */
	struct agent_informer *inf[AGENT_INFORMER_MAX];
	int n, started;
};

/* sub's view in an entry, NULL for none. */
static json_t *view_of(json_t *entry, int index)
{
	json_t *v = json_array_get(entry, (size_t)index);
	return json_is_null(v) ? NULL : v;
}

/* The objmap's slim: every subscriber's view, NULL when none keeps the object. The subscribers
 * are fixed before the start, so this reads them without the lock. */
static json_t *slim(int kind, json_t *obj, void *data)
{
	struct agent_informer *inf = data;
	(void)kind;
	json_t *entry = json_array();
	int kept = 0;
	if (entry == NULL)
		return NULL; /* out of memory: not kept, as the watch's own failures */
	for (int i = 0; i < inf->nsubs; i++) {
		const struct agent_informer_handler *h = &inf->subs[i].h;
		json_t *v = h->slim != NULL ? h->slim(obj, h->data) : json_incref(obj);
		kept |= v != NULL;
		json_array_append_new(entry, v != NULL ? v : json_null());
	}
	if (!kept) {
		json_decref(entry);
		return NULL;
	}
	return entry;
}

/* Under the lock: each subscriber hears of the change of its own view only. */
static void changed(int kind, const char *key, json_t *old, json_t *cur, void *data)
{
	struct agent_informer *inf = data;
	(void)kind;
	if (key == NULL)
		pthread_cond_broadcast(&inf->set->listed);
	for (int i = 0; i < inf->nsubs; i++) {
		const struct agent_informer_handler *h = &inf->subs[i].h;
		if (h->changed == NULL)
			continue;
		if (key == NULL) {
			h->changed(NULL, NULL, NULL, h->data);
			continue;
		}
		json_t *o = view_of(old, i), *c = view_of(cur, i);
		if ((o == NULL && c == NULL) || (o != NULL && c != NULL && json_equal(o, c)))
			continue; /* a change of what another subscriber keeps */
		h->changed(key, o, c, h->data);
	}
}

struct agent_informers *agent_informers_new(struct agent_kube *kube)
{
	struct agent_informers *set = calloc(1, sizeof(*set));
	if (set == NULL)
		return NULL;
	set->kube = kube;
	pthread_mutex_init(&set->lock, NULL);
	pthread_cond_init(&set->listed, NULL);
	return set;
}

static int same(const char *a, const char *b)
{
	return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static struct agent_informer *find(struct agent_informers *set, const char *path, const char *query)
{
	for (int i = 0; i < set->n; i++)
		if (strcmp(set->inf[i]->path, path) == 0 && same(set->inf[i]->query, query))
			return set->inf[i];
	return NULL;
}

static void informer_free(struct agent_informer *inf)
{
	if (inf == NULL)
		return;
	agent_objmap_free(inf->om);
	free(inf->path);
	free(inf->query);
	free(inf);
}

int agent_informers_subscribe(struct agent_informers *set, const char *path, const char *query,
			      const struct agent_informer_handler *h, struct agent_informer_sub **out,
			      struct gcr_err *err)
{
	*out = NULL;
	if (set->started)
		return gcr_err_set(err, -EBUSY, "a subscription to %s after the mirrors started", path);
	struct agent_informer *inf = find(set, path, query);
	if (inf == NULL) {
		if (set->n == AGENT_INFORMER_MAX)
			return gcr_err_set(err, -ENOSPC, "more than %d mirrors", AGENT_INFORMER_MAX);
		inf = calloc(1, sizeof(*inf));
		if (inf == NULL || (inf->path = strdup(path)) == NULL ||
		    (query != NULL && (inf->query = strdup(query)) == NULL)) {
			informer_free(inf);
			return gcr_err_set(err, -ENOMEM, "out of memory");
		}
		inf->set = set;
		const struct agent_objmap_kind kind = { inf->path, inf->query };
		const struct agent_objmap_ops ops = { .slim = slim, .changed = changed, .data = inf };
		int rc = agent_objmap_new(set->kube, &set->lock, &kind, 1, &ops, &inf->om, err);
		if (rc < 0) {
			informer_free(inf);
			return rc;
		}
		set->inf[set->n++] = inf;
	}
	if (inf->nsubs == AGENT_INFORMER_MAX_SUBS)
		return gcr_err_set(err, -ENOSPC, "more than %d subscribers of %s", AGENT_INFORMER_MAX_SUBS, path);
	struct agent_informer_sub *s = &inf->subs[inf->nsubs];
	*s = (struct agent_informer_sub){ .inf = inf, .index = inf->nsubs, .h = *h };
	inf->nsubs++;
	*out = s;
	return 0;
}

int agent_informers_subscribe_n(struct agent_informers *set, const char *const *paths,
				const struct agent_informer_handler *hs, int n, struct agent_informer_sub **subs,
				struct gcr_err *err)
{
	for (int i = 0; i < n; i++) {
		int rc = agent_informers_subscribe(set, paths[i], NULL, &hs[i], &subs[i], err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int agent_informers_start(struct agent_informers *set, struct gcr_err *err)
{
	set->started = 1;
	for (int i = 0; i < set->n; i++) {
		int rc = agent_objmap_start(set->inf[i]->om, err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

void agent_informers_stop(struct agent_informers *set)
{
	if (set == NULL)
		return;
	for (int i = 0; i < set->n; i++)
		agent_objmap_stop(set->inf[i]->om);
}

void agent_informers_free(struct agent_informers *set)
{
	if (set == NULL)
		return;
	agent_informers_stop(set);
	for (int i = 0; i < set->n; i++)
		informer_free(set->inf[i]);
	pthread_mutex_destroy(&set->lock);
	pthread_cond_destroy(&set->listed);
	free(set);
}

void agent_informers_lock(struct agent_informers *set)
{
	pthread_mutex_lock(&set->lock);
}

void agent_informers_unlock(struct agent_informers *set)
{
	pthread_mutex_unlock(&set->lock);
}

int agent_informers_wait_locked(struct agent_informers *set, pthread_cond_t *cond, const struct timespec *deadline)
{
	return deadline != NULL ? pthread_cond_timedwait(cond, &set->lock, deadline) : pthread_cond_wait(cond, &set->lock);
}

json_t *agent_informer_get_locked(const struct agent_informer_sub *sub, const char *key)
{
	return view_of(json_object_get(agent_objmap_map_locked(sub->inf->om, 0), key), sub->index);
}

void *agent_informer_next_locked(const struct agent_informer_sub *sub, void *it, const char **key, json_t **view)
{
	json_t *map = agent_objmap_map_locked(sub->inf->om, 0);
	for (it = it == NULL ? json_object_iter(map) : json_object_iter_next(map, it); it != NULL;
	     it = json_object_iter_next(map, it)) {
		json_t *v = view_of(json_object_iter_value(it), sub->index);
		if (v != NULL) {
			*key = json_object_iter_key(it);
			*view = v;
			return it;
		}
	}
	return NULL;
}

int agent_informer_synced_locked(const struct agent_informer_sub *sub)
{
	return agent_objmap_synced_locked(sub->inf->om);
}

int agent_informer_synced_all_locked(struct agent_informer_sub *const *subs, int n)
{
	for (int i = 0; i < n; i++)
		if (!agent_objmap_synced_locked(subs[i]->inf->om))
			return 0;
	return 1;
}

int agent_informer_wait_synced(struct agent_informers *set, const struct agent_informer_sub *sub, int timeout_ms)
{
	struct timespec dl;
	gcr_time_deadline(&dl, timeout_ms);
	pthread_mutex_lock(&set->lock);
	while (!agent_objmap_synced_locked(sub->inf->om) && pthread_cond_timedwait(&set->listed, &set->lock, &dl) == 0)
		;
	int synced = agent_objmap_synced_locked(sub->inf->om); /* also a list just as the time ran out */
	pthread_mutex_unlock(&set->lock);
	return synced;
}

int agent_informers_feed_list(struct agent_informers *set, const char *path, const char *query, json_t *items)
{
	struct agent_informer *inf = find(set, path, query);
	if (inf == NULL)
		return -ENOENT;
	agent_objmap_feed_list(inf->om, 0, items);
	return 0;
}

int agent_informers_feed_event(struct agent_informers *set, const char *path, const char *query,
			       enum agent_watch_type type, json_t *obj)
{
	struct agent_informer *inf = find(set, path, query);
	if (inf == NULL)
		return -ENOENT;
	const struct agent_watch_event ev = { .type = type, .object = obj, .resource_version = "" };
	agent_objmap_feed_event(inf->om, 0, &ev);
	return 0;
}
