/* agent_workq: a work queue with client-go's semantics in plain C (agent_workq.h).
 *
 * The tables are arrays searched linearly: a node's agent holds a key per object of its own node
 * (hundreds at most), so a hash would only add code. */
#include "agent_workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcr_time.h"

struct item {
	char *key;
	int queued;     /* in fifo */
	int processing; /* handed out by get, not yet done */
	int dirty;      /* added while processing: queued again at done */
	double due;     /* > 0: queued at this monotonic time (ms) */
	int backoff_ms; /* the last backoff delay; 0: none */
};

struct park { /* keys waiting on one place (an owner, or any name) */
	char *place;
	char **keys;
	int n, cap;
};

struct agent_workq {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int first_ms, max_ms, shut;
	struct item **items; /* every key with some state */
	int n_items, cap_items;
	struct item **fifo; /* queued keys, oldest first */
	int n_fifo, cap_fifo;
	char **owners; /* claimed owners */
	int n_owners, cap_owners;
	struct park *parks;
	int n_parks, cap_parks;
};

/* Grows an array of elem-byte elements to hold one more; 0 or -ENOMEM. */
static int grow(void **arr, int *cap, int n, size_t elem)
{
	if (n < *cap)
		return 0;
	int nc = *cap ? *cap * 2 : 16;
	void *p = realloc(*arr, (size_t)nc * elem);
	if (p == NULL)
		return -ENOMEM;
	*arr = p;
	*cap = nc;
	return 0;
}

static struct item *find(struct agent_workq *q, const char *key)
{
	for (int i = 0; i < q->n_items; i++)
		if (strcmp(q->items[i]->key, key) == 0)
			return q->items[i];
	return NULL;
}

static struct item *find_or_add(struct agent_workq *q, const char *key)
{
	struct item *it = find(q, key);
	if (it != NULL)
		return it;
	if (grow((void **)&q->items, &q->cap_items, q->n_items, sizeof(*q->items)) < 0)
		return NULL;
	it = calloc(1, sizeof(*it));
	if (it == NULL || (it->key = strdup(key)) == NULL) {
		free(it);
		return NULL;
	}
	q->items[q->n_items++] = it;
	return it;
}

/* Drops it once nothing remains of it. */
static void gc(struct agent_workq *q, struct item *it)
{
	if (it->queued || it->processing || it->due > 0 || it->backoff_ms != 0)
		return;
	for (int i = 0; i < q->n_items; i++) {
		if (q->items[i] == it) {
			q->items[i] = q->items[--q->n_items];
			break;
		}
	}
	free(it->key);
	free(it);
}

static int check_key(const char *key)
{
	return strlen(key) >= AGENT_WORKQ_KEY_MAX ? -ENAMETOOLONG : 0;
}

/* Queues it now (or marks it for its done). Caller holds the lock. */
static int push_locked(struct agent_workq *q, struct item *it)
{
	if (it->processing) {
		it->dirty = 1;
		return 0;
	}
	if (it->queued)
		return 0;
	if (grow((void **)&q->fifo, &q->cap_fifo, q->n_fifo, sizeof(*q->fifo)) < 0)
		return -ENOMEM;
	q->fifo[q->n_fifo++] = it;
	it->queued = 1;
	pthread_cond_signal(&q->cond);
	return 0;
}

static int add_locked(struct agent_workq *q, const char *key)
{
	if (q->shut)
		return 0;
	struct item *it = find_or_add(q, key);
	return it != NULL ? push_locked(q, it) : -ENOMEM;
}

struct agent_workq *agent_workq_new(int first_ms, int max_ms)
{
	if (first_ms <= 0 || max_ms < first_ms)
		return NULL;
	struct agent_workq *q = calloc(1, sizeof(*q));
	if (q == NULL)
		return NULL;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->cond, NULL);
	q->first_ms = first_ms;
	q->max_ms = max_ms;
	return q;
}

void agent_workq_free(struct agent_workq *q)
{
	if (q == NULL)
		return;
	for (int i = 0; i < q->n_items; i++) {
		free(q->items[i]->key);
		free(q->items[i]);
	}
	for (int i = 0; i < q->n_owners; i++)
		free(q->owners[i]);
	for (int i = 0; i < q->n_parks; i++) {
		for (int k = 0; k < q->parks[i].n; k++)
			free(q->parks[i].keys[k]);
		free(q->parks[i].keys);
		free(q->parks[i].place);
	}
	free(q->items);
	free(q->fifo);
	free(q->owners);
	free(q->parks);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
	free(q);
}

int agent_workq_add(struct agent_workq *q, const char *key)
{
	int rc = check_key(key);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&q->lock);
	rc = add_locked(q, key);
	pthread_mutex_unlock(&q->lock);
	return rc;
}

static int add_after_locked(struct agent_workq *q, const char *key, int ms)
{
	if (ms <= 0)
		return add_locked(q, key);
	if (q->shut)
		return 0;
	struct item *it = find_or_add(q, key);
	if (it == NULL)
		return -ENOMEM;
	double due = gcr_time_mono_ms() + ms;
	if (it->due <= 0 || due < it->due)
		it->due = due;
	pthread_cond_broadcast(&q->cond); /* a waiting get sleeps until the earliest due */
	return 0;
}

int agent_workq_add_after(struct agent_workq *q, const char *key, int ms)
{
	int rc = check_key(key);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&q->lock);
	rc = add_after_locked(q, key, ms);
	pthread_mutex_unlock(&q->lock);
	return rc;
}

int agent_workq_backoff(struct agent_workq *q, const char *key)
{
	int rc = check_key(key);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&q->lock);
	struct item *it = find_or_add(q, key);
	int ms = -ENOMEM;
	if (it != NULL) {
		ms = it->backoff_ms == 0 ? q->first_ms : it->backoff_ms > q->max_ms / 2 ? q->max_ms : it->backoff_ms * 2;
		it->backoff_ms = ms;
		rc = add_after_locked(q, key, ms);
		if (rc < 0)
			ms = rc;
	}
	pthread_mutex_unlock(&q->lock);
	return ms;
}

void agent_workq_forget(struct agent_workq *q, const char *key)
{
	pthread_mutex_lock(&q->lock);
	struct item *it = find(q, key);
	if (it != NULL) {
		it->backoff_ms = 0;
		gc(q, it);
	}
	pthread_mutex_unlock(&q->lock);
}

int agent_workq_backoff_ms(struct agent_workq *q, const char *key)
{
	pthread_mutex_lock(&q->lock);
	struct item *it = find(q, key);
	int ms = it != NULL ? it->backoff_ms : 0;
	pthread_mutex_unlock(&q->lock);
	return ms;
}

int agent_workq_waiting(struct agent_workq *q, const char *key)
{
	pthread_mutex_lock(&q->lock);
	struct item *it = find(q, key);
	int w = it != NULL && it->due > 0;
	pthread_mutex_unlock(&q->lock);
	return w;
}

/* Queues the keys whose time came; returns the earliest time still ahead (0: none). */
static double promote_locked(struct agent_workq *q, double now)
{
	double next = 0;
	for (int i = 0; i < q->n_items; i++) {
		struct item *it = q->items[i];
		if (it->due <= 0)
			continue;
		if (it->due <= now) {
			it->due = 0;
			if (push_locked(q, it) < 0) /* out of memory: it waits a little more, not lost */
				it->due = now + q->first_ms;
		} else if (next == 0 || it->due < next) {
			next = it->due;
		}
	}
	return next;
}

int agent_workq_get(struct agent_workq *q, char *key, size_t len)
{
	pthread_mutex_lock(&q->lock);
	for (;;) {
		if (q->shut) {
			pthread_mutex_unlock(&q->lock);
			return 0;
		}
		double now = gcr_time_mono_ms(), next = promote_locked(q, now);
		if (q->n_fifo > 0) {
			struct item *it = q->fifo[0];
			memmove(q->fifo, q->fifo + 1, (size_t)(q->n_fifo - 1) * sizeof(*q->fifo));
			q->n_fifo--;
			it->queued = 0;
			it->processing = 1;
			it->dirty = 0;
			size_t n = strlen(it->key);
			if (len > 0) {
				n = n < len - 1 ? n : len - 1;
				memcpy(key, it->key, n);
				key[n] = '\0';
			}
			pthread_mutex_unlock(&q->lock);
			return 1;
		}
		if (next > 0) {
			struct timespec dl;
			gcr_time_deadline(&dl, (long)(next - now) + 1);
			pthread_cond_timedwait(&q->cond, &q->lock, &dl);
		} else {
			pthread_cond_wait(&q->cond, &q->lock);
		}
	}
}

void agent_workq_done(struct agent_workq *q, const char *key)
{
	pthread_mutex_lock(&q->lock);
	struct item *it = find(q, key);
	if (it != NULL && it->processing) {
		it->processing = 0;
		if (it->dirty) {
			it->dirty = 0;
			if (push_locked(q, it) < 0) /* out of memory: try again soon rather than lose it */
				it->due = gcr_time_mono_ms() + q->first_ms;
		}
		gc(q, it);
	}
	pthread_mutex_unlock(&q->lock);
}

static int owner_index(struct agent_workq *q, const char *owner)
{
	for (int i = 0; i < q->n_owners; i++)
		if (strcmp(q->owners[i], owner) == 0)
			return i;
	return -1;
}

static int park_locked(struct agent_workq *q, const char *place, const char *key)
{
	struct park *p = NULL;
	for (int i = 0; i < q->n_parks && p == NULL; i++)
		if (strcmp(q->parks[i].place, place) == 0)
			p = &q->parks[i];
	if (p == NULL) {
		if (grow((void **)&q->parks, &q->cap_parks, q->n_parks, sizeof(*q->parks)) < 0)
			return -ENOMEM;
		p = &q->parks[q->n_parks];
		*p = (struct park){ .place = strdup(place) };
		if (p->place == NULL)
			return -ENOMEM;
		q->n_parks++;
	}
	for (int k = 0; k < p->n; k++)
		if (strcmp(p->keys[k], key) == 0)
			return 0;
	if (grow((void **)&p->keys, &p->cap, p->n, sizeof(*p->keys)) < 0 || (p->keys[p->n] = strdup(key)) == NULL)
		return -ENOMEM;
	p->n++;
	return 0;
}

static void unpark_locked(struct agent_workq *q, const char *place)
{
	for (int i = 0; i < q->n_parks; i++) {
		struct park *p = &q->parks[i];
		if (strcmp(p->place, place) != 0)
			continue;
		for (int k = 0; k < p->n; k++) {
			if (add_locked(q, p->keys[k]) < 0) /* out of memory: a timer rather than a lost key */
				add_after_locked(q, p->keys[k], q->first_ms);
			free(p->keys[k]);
		}
		free(p->keys);
		free(p->place);
		q->parks[i] = q->parks[--q->n_parks];
		return;
	}
}

int agent_workq_claim(struct agent_workq *q, const char *owner, const char *key)
{
	int rc = check_key(key) < 0 ? -ENAMETOOLONG : check_key(owner);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&q->lock);
	if (owner_index(q, owner) >= 0) {
		rc = park_locked(q, owner, key);
	} else if (grow((void **)&q->owners, &q->cap_owners, q->n_owners, sizeof(*q->owners)) < 0 ||
		   (q->owners[q->n_owners] = strdup(owner)) == NULL) {
		rc = -ENOMEM;
	} else {
		q->n_owners++;
		rc = 1;
	}
	pthread_mutex_unlock(&q->lock);
	return rc;
}

void agent_workq_release(struct agent_workq *q, const char *owner)
{
	pthread_mutex_lock(&q->lock);
	int i = owner_index(q, owner);
	if (i >= 0) {
		free(q->owners[i]);
		q->owners[i] = q->owners[--q->n_owners];
	}
	unpark_locked(q, owner);
	pthread_mutex_unlock(&q->lock);
}

int agent_workq_park(struct agent_workq *q, const char *place, const char *key)
{
	int rc = check_key(key) < 0 ? -ENAMETOOLONG : check_key(place);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&q->lock);
	rc = park_locked(q, place, key);
	pthread_mutex_unlock(&q->lock);
	return rc;
}

void agent_workq_unpark(struct agent_workq *q, const char *place)
{
	pthread_mutex_lock(&q->lock);
	unpark_locked(q, place);
	pthread_mutex_unlock(&q->lock);
}

int agent_workq_len(struct agent_workq *q)
{
	pthread_mutex_lock(&q->lock);
	promote_locked(q, gcr_time_mono_ms());
	int n = q->n_fifo;
	pthread_mutex_unlock(&q->lock);
	return n;
}

void agent_workq_shutdown(struct agent_workq *q)
{
	pthread_mutex_lock(&q->lock);
	q->shut = 1;
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}
