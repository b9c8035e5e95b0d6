/* agent_objmap: the list-and-watch threads behind a mirror of objects (agent_objmap.h), beneath
 * the process's shared mirrors (agent_informer) that the controller, the GPUResidency scaler, the
 * readiness gate and the replacement pod's scaler subscribe to. */
#include "agent_objmap.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "namespace/name" keys: a namespace (63) and a name (253) fit. */
#define KEY_MAX 600

struct watcher {
	struct agent_objmap *m;
	int kind;
	pthread_t th;
	int started;
};

struct agent_objmap {
	struct agent_kube *kube;
	pthread_mutex_t *lock; /* the owner's: guards map and listed */
	struct agent_objmap_kind kinds[AGENT_OBJMAP_MAX_KINDS];
	int n;
	struct agent_objmap_ops ops;
	atomic_int stop;
	json_t *map[AGENT_OBJMAP_MAX_KINDS];
	int listed[AGENT_OBJMAP_MAX_KINDS];
	struct watcher w[AGENT_OBJMAP_MAX_KINDS];
};

static void on_list(json_t *items, void *data)
{
	struct watcher *w = data;
	struct agent_objmap *m = w->m;
	json_t *fresh = json_object(), *it;
	size_t i;
	char key[KEY_MAX];
	if (fresh == NULL)
		return; /* out of memory: the map stays as it was until the next list */
	json_array_foreach(items, i, it)
	{
		json_t *e = m->ops.slim(w->kind, it, m->ops.data);
		if (e != NULL && agent_kube_obj_key(it, key, sizeof(key)) == 0)
			json_object_set_new(fresh, key, e);
		else
			json_decref(e);
	}
	pthread_mutex_lock(m->lock);
	json_decref(m->map[w->kind]);
	m->map[w->kind] = fresh;
	m->listed[w->kind] = 1;
	if (m->ops.changed != NULL)
		m->ops.changed(w->kind, NULL, NULL, NULL, m->ops.data);
	pthread_mutex_unlock(m->lock);
}

static void on_event(const struct agent_watch_event *ev, void *data)
{
	struct watcher *w = data;
	struct agent_objmap *m = w->m;
	char key[KEY_MAX];
	if (agent_kube_obj_key(ev->object, key, sizeof(key)) < 0)
		return;
	json_t *cur = ev->type == AGENT_WATCH_DELETED ? NULL : m->ops.slim(w->kind, ev->object, m->ops.data);
	pthread_mutex_lock(m->lock);
	json_t *old = json_incref(json_object_get(m->map[w->kind], key));
	if (cur != NULL)
		json_object_set(m->map[w->kind], key, cur);
	else
		json_object_del(m->map[w->kind], key);
	if (m->ops.changed != NULL && (old != NULL || cur != NULL))
		m->ops.changed(w->kind, key, old, cur, m->ops.data);
	pthread_mutex_unlock(m->lock);
	json_decref(old);
	json_decref(cur);
}

void agent_objmap_feed_list(struct agent_objmap *m, int kind, json_t *items)
{
	if (kind >= 0 && kind < m->n)
		on_list(items, &m->w[kind]);
}

void agent_objmap_feed_event(struct agent_objmap *m, int kind, const struct agent_watch_event *ev)
{
	if (kind >= 0 && kind < m->n)
		on_event(ev, &m->w[kind]);
}

static void *watch_main(void *data)
{
	struct watcher *w = data;
	struct agent_kube_watch_ops ops = { .on_list = on_list, .on_event = on_event, .data = w };
	agent_kube_watch_loop(w->m->kube, w->m->kinds[w->kind].path, w->m->kinds[w->kind].query, &ops, &w->m->stop);
	return NULL;
}

int agent_objmap_new(struct agent_kube *kube, pthread_mutex_t *lock, const struct agent_objmap_kind *kinds, int n,
		     const struct agent_objmap_ops *ops, struct agent_objmap **out, struct gcr_err *err)
{
	*out = NULL;
	if (n <= 0 || n > AGENT_OBJMAP_MAX_KINDS || ops->slim == NULL)
		return gcr_err_set(err, -EINVAL, "a mirror of %d kinds (1..%d) needs a slim function", n,
				   AGENT_OBJMAP_MAX_KINDS);
	struct agent_objmap *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	m->kube = kube;
	m->lock = lock;
	m->n = n;
	m->ops = *ops;
	for (int k = 0; k < n; k++) {
		m->kinds[k] = kinds[k];
		m->w[k] = (struct watcher){ .m = m, .kind = k };
		if ((m->map[k] = json_object()) == NULL) {
			agent_objmap_free(m);
			return gcr_err_set(err, -ENOMEM, "out of memory");
		}
	}
	*out = m;
	return 0;
}

int agent_objmap_start(struct agent_objmap *m, struct gcr_err *err)
{
	if (m->kube == NULL)
		return 0; /* fed by the caller */
	for (int k = 0; k < m->n; k++) {
		int rc = pthread_create(&m->w[k].th, NULL, watch_main, &m->w[k]);
		if (rc != 0)
			return gcr_err_set(err, -rc, "cannot start the watch of %s: %s", m->kinds[k].path, strerror(rc));
		m->w[k].started = 1;
	}
	return 0;
}

json_t *agent_objmap_map_locked(struct agent_objmap *m, int kind)
{
	return kind >= 0 && kind < m->n ? m->map[kind] : NULL;
}

int agent_objmap_synced_locked(const struct agent_objmap *m)
{
	for (int k = 0; k < m->n; k++)
		if (!m->listed[k])
			return 0;
	return 1;
}

void agent_objmap_stop(struct agent_objmap *m)
{
	if (m == NULL)
		return;
	atomic_store(&m->stop, 1);
	for (int k = 0; k < m->n; k++) {
		if (m->w[k].started)
			pthread_join(m->w[k].th, NULL);
		m->w[k].started = 0;
	}
}

void agent_objmap_free(struct agent_objmap *m)
{
	if (m == NULL)
		return;
	agent_objmap_stop(m);
	for (int k = 0; k < m->n; k++)
		json_decref(m->map[k]);
	free(m);
}
