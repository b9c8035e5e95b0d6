/* shim_pool: segments carved into extents (address-ordered list per segment); free extents are
 * indexed by (size, address) in treaps, one per size class for completed frees and one per
 * stream and class for frees still pending there, so the alloc/free path is one lock, O(log n)
 * and no GPU call when the block is reused on the same stream or from completed frees. */
#include "shim_pool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NCLASS 3 /* small, medium, large (a segment each) */
#define GRAPH 0x100u /* shim_pool_alloc's flag for a graph-owned block */

enum ext_state { EXT_DONE, EXT_PENDING, EXT_LIVE, EXT_GRAPH };

struct marker;
struct sstream;
struct segment;

struct extent {
	uint64_t va;
	size_t size;
	size_t req; /* live: bytes asked for */
	enum ext_state state;
	struct segment *seg;
	struct extent *prev, *next;   /* address order in the segment */
	struct extent *tl, *tr;       /* treap children (free extents) */
	uint32_t prio;
	struct marker *mk;            /* pending: the free's marker */
	struct extent *mprev, *mnext; /* the marker's extents */
	struct extent *hnext;         /* live/graph: hash chain */
	uint32_t grefs;               /* graph: its holders */
	int gfreed;                   /* graph: freed (in the graph or by the application) */
};

/* The position of one free in its stream; completes in stream order. open: a lazy marker not
 * recorded yet (it takes every later free on the stream until it is). */
struct marker {
	void *ev;
	int open;
	uint64_t seq;
	struct sstream *st;
	struct extent *exts;
	struct marker *older, *newer;
};

struct sstream {
	struct shim_pool_stream key;
	struct extent *pend[NCLASS];
	struct marker *oldest, *newest;
	uint64_t npend;
};

struct segment {
	uint64_t va; /* first: sorted by address */
	size_t size;
	int cls;
	int nused; /* live and graph-owned extents */
	struct pool *pool;
	struct extent *first;
	struct segment *pnext, *pprev; /* the pool's segments */
};

struct pool {
	uint64_t key;
	int device, removed;
	size_t gran;
	const struct shim_pool_ops *ops;
	struct extent *done[NCLASS];
	struct sstream **streams; /* sorted by key */
	size_t nstreams, cap_streams;
	struct segment *segs;
	struct sstream *dev_st; /* released graph blocks: pending until every stream's work is done */
	uint64_t reserved, used, reserved_high, used_high, threshold;
	int opportunistic, internal_deps, follow_events;
	int nidle, wants; /* idle segments; counted in shim_pool_want_release */
	int nacc;
	struct shim_gpu_access acc[SHIM_MAX_DEVICES];
};

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
atomic_int shim_pool_want_release;
static struct pool **pools; /* live (not removed), sorted by key */
static size_t npools, cap_pools;
static struct pool **gone; /* removed, with segments still in use */
static size_t ngone, cap_gone;
static struct segment **segv; /* every segment, sorted by address */
static size_t nsegv, cap_segv;
static struct extent **hash;  /* live and graph-owned blocks by address */
static size_t hash_cap, hash_n;
static uint64_t seq_next, rng = 0x9e3779b97f4a7c15ULL;
static struct shim_pool_stats counts; /* grows, reuses; the rest is summed on demand */

/* A holder of graph-owned blocks (a capture, a graph, an executable: the caller's keys). */
struct holder {
	uint64_t key;
	struct extent **b;
	size_t n, cap;
};
static struct holder *holders; /* sorted by key */
static size_t nholders, cap_holders;
/* The stream key of released graph blocks: no marker, no stream a caller names. */
static const struct shim_pool_stream dev_key = { .handle = UINT64_MAX, .thread = 0, .variant = 0 };

/* ---- small helpers ---- */

static int grow_vec(void **v, size_t *cap, size_t n, size_t elem)
{
	if (n < *cap)
		return 0;
	size_t ncap = *cap ? *cap * 2 : 16;
	void *nv = realloc(*v, ncap * elem);
	if (nv == NULL)
		return -ENOMEM;
	*v = nv;
	*cap = ncap;
	return 0;
}

static uint32_t rand32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)rng;
}

static int size_class(size_t need)
{
	return need <= SHIM_POOL_SMALL_MAX ? 0 : need <= SHIM_POOL_MEDIUM_MAX ? 1 : 2;
}

/* ---- treaps of free extents, keyed by (size, va) ---- */

static int key_less(const struct extent *a, const struct extent *b)
{
	return a->size < b->size || (a->size == b->size && a->va < b->va);
}

static struct extent *tr_join(struct extent *l, struct extent *r)
{
	if (l == NULL)
		return r;
	if (r == NULL)
		return l;
	if (l->prio > r->prio) {
		l->tr = tr_join(l->tr, r);
		return l;
	}
	r->tl = tr_join(l, r->tl);
	return r;
}

static struct extent *tr_insert(struct extent *root, struct extent *x)
{
	if (root == NULL) {
		x->tl = x->tr = NULL;
		return x;
	}
	if (key_less(x, root)) {
		root->tl = tr_insert(root->tl, x);
		if (root->tl->prio > root->prio) {
			struct extent *l = root->tl;
			root->tl = l->tr;
			l->tr = root;
			return l;
		}
	} else {
		root->tr = tr_insert(root->tr, x);
		if (root->tr->prio > root->prio) {
			struct extent *r = root->tr;
			root->tr = r->tl;
			r->tl = root;
			return r;
		}
	}
	return root;
}

static struct extent *tr_remove(struct extent *root, struct extent *x)
{
	if (root == NULL)
		return NULL;
	if (root == x)
		return tr_join(x->tl, x->tr);
	if (key_less(x, root))
		root->tl = tr_remove(root->tl, x);
	else
		root->tr = tr_remove(root->tr, x);
	return root;
}

/* The smallest extent of at least need bytes (the lowest address among equals). */
static struct extent *tr_fit(struct extent *n, size_t need)
{
	struct extent *best = NULL;
	while (n != NULL) {
		if (n->size >= need) {
			best = n;
			n = n->tl;
		} else {
			n = n->tr;
		}
	}
	return best;
}

/* ---- the block hash ---- */

static size_t hslot(uint64_t va)
{
	return (size_t)(((va >> 9) * 0x9e3779b97f4a7c15ULL) >> 20) & (hash_cap - 1);
}

static int hash_put(struct extent *x)
{
	if (hash_n >= hash_cap) {
		size_t ncap = hash_cap ? hash_cap * 2 : 1024;
		struct extent **nh = calloc(ncap, sizeof(*nh));
		if (nh == NULL)
			return -ENOMEM;
		struct extent **old = hash;
		size_t ocap = hash_cap;
		hash = nh;
		hash_cap = ncap;
		for (size_t i = 0; i < ocap; i++)
			for (struct extent *e = old[i], *nx; e != NULL; e = nx) {
				nx = e->hnext;
				e->hnext = hash[hslot(e->va)];
				hash[hslot(e->va)] = e;
			}
		free(old);
	}
	size_t i = hslot(x->va);
	x->hnext = hash[i];
	hash[i] = x;
	hash_n++;
	return 0;
}

static struct extent *hash_get(uint64_t va)
{
	if (hash_cap == 0)
		return NULL;
	struct extent *e = hash[hslot(va)];
	while (e != NULL && e->va != va)
		e = e->hnext;
	return e;
}

static void hash_del(struct extent *x)
{
	struct extent **pp = &hash[hslot(x->va)];
	while (*pp != NULL && *pp != x)
		pp = &(*pp)->hnext;
	if (*pp == x) {
		*pp = x->hnext;
		hash_n--;
	}
}

/* ---- pools, streams, segments ---- */

static size_t pool_lower(uint64_t key)
{
	size_t lo = 0, hi = npools;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (pools[mid]->key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct pool *pool_get(uint64_t key)
{
	size_t i = pool_lower(key);
	return i < npools && pools[i]->key == key ? pools[i] : NULL;
}

static int skey_cmp(const struct shim_pool_stream *a, const struct shim_pool_stream *b)
{
	if (a->handle != b->handle)
		return a->handle < b->handle ? -1 : 1;
	if (a->thread != b->thread)
		return a->thread < b->thread ? -1 : 1;
	return a->variant - b->variant;
}

static size_t stream_lower(const struct pool *p, const struct shim_pool_stream *k)
{
	size_t lo = 0, hi = p->nstreams;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (skey_cmp(&p->streams[mid]->key, k) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct sstream *stream_get(struct pool *p, const struct shim_pool_stream *k, int make)
{
	size_t i = stream_lower(p, k);
	if (i < p->nstreams && skey_cmp(&p->streams[i]->key, k) == 0)
		return p->streams[i];
	if (!make || grow_vec((void **)&p->streams, &p->cap_streams, p->nstreams, sizeof(*p->streams)) < 0)
		return NULL;
	struct sstream *st = calloc(1, sizeof(*st));
	if (st == NULL)
		return NULL;
	st->key = *k;
	memmove(&p->streams[i + 1], &p->streams[i], (p->nstreams - i) * sizeof(*p->streams));
	p->streams[i] = st;
	p->nstreams++;
	return st;
}

static void stream_drop(struct pool *p, size_t i)
{
	free(p->streams[i]);
	memmove(&p->streams[i], &p->streams[i + 1], (p->nstreams - i - 1) * sizeof(*p->streams));
	p->nstreams--;
}

static size_t segv_lower(uint64_t va)
{
	size_t lo = 0, hi = nsegv;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (segv[mid]->va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Keeps shim_pool_want_release counting pools that may have something to give back. */
static void pool_want_update(struct pool *p)
{
	int w = (p->nidle > 0 && (p->removed || p->reserved > p->threshold)) ||
		(p->dev_st != NULL && p->dev_st->oldest != NULL);
	if (w != p->wants) {
		atomic_fetch_add_explicit(&shim_pool_want_release, w ? 1 : -1, memory_order_relaxed);
		p->wants = w;
	}
}

static void seg_used(struct segment *s, int delta)
{
	if (s->nused == 0 && delta > 0)
		s->pool->nidle--;
	s->nused += delta;
	if (s->nused == 0)
		s->pool->nidle++;
}

/* ---- free extents: which tree, markers, coalescing ---- */

static struct extent **tree_of(struct pool *p, struct extent *x)
{
	return x->state == EXT_DONE ? &p->done[x->seg->cls] : &x->mk->st->pend[x->seg->cls];
}

static void mk_unlink(struct pool *p, struct extent *x)
{
	struct marker *m = x->mk;
	if (x->mprev != NULL)
		x->mprev->mnext = x->mnext;
	else
		m->exts = x->mnext;
	if (x->mnext != NULL)
		x->mnext->mprev = x->mprev;
	x->mk = NULL;
	x->mprev = x->mnext = NULL;
	m->st->npend--;
	if (m->exts == NULL) {
		/* No extent waits on it any more: the event goes back. */
		struct sstream *st = m->st;
		if (m->older != NULL)
			m->older->newer = m->newer;
		else
			st->oldest = m->newer;
		if (m->newer != NULL)
			m->newer->older = m->older;
		else
			st->newest = m->older;
		if (m->ev != NULL)
			p->ops->unmark(m->ev);
		free(m);
	}
}

static void mk_link(struct extent *x, struct marker *m)
{
	x->mk = m;
	x->mprev = NULL;
	x->mnext = m->exts;
	if (m->exts != NULL)
		m->exts->mprev = x;
	m->exts = x;
	m->st->npend++;
}

/* A new marker at st's newest position (ev NULL: one no stream records, see dev_key). */
static struct marker *mk_push(struct sstream *st, void *ev)
{
	struct marker *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return NULL;
	m->ev = ev;
	m->seq = ++seq_next;
	m->st = st;
	m->older = st->newest;
	if (st->newest != NULL)
		st->newest->newer = m;
	else
		st->oldest = m;
	st->newest = m;
	return m;
}

static int mergeable(const struct extent *a, const struct extent *b)
{
	if (a->state == EXT_DONE && b->state == EXT_DONE)
		return 1;
	return a->state == EXT_PENDING && b->state == EXT_PENDING && a->mk->st == b->mk->st;
}

/* b (a's next neighbour) joins a; both out of their trees. The later marker stays. */
static void absorb(struct pool *p, struct extent *a, struct extent *b)
{
	if (a->state == EXT_PENDING) {
		/* a joins the later marker first, so unlinking b never frees it. */
		struct marker *later = a->mk->seq > b->mk->seq ? a->mk : b->mk;
		if (a->mk != later) {
			mk_unlink(p, a);
			mk_link(a, later);
		}
		mk_unlink(p, b);
	}
	a->size += b->size;
	a->next = b->next;
	if (b->next != NULL)
		b->next->prev = a;
	free(b);
}

/* x (free, in no tree) joins its neighbours where their reuse conditions allow, and its tree. */
static void free_insert(struct pool *p, struct extent *x)
{
	struct extent *n = x->next;
	if (n != NULL && mergeable(x, n)) {
		*tree_of(p, n) = tr_remove(*tree_of(p, n), n);
		absorb(p, x, n);
	}
	struct extent *v = x->prev;
	if (v != NULL && mergeable(v, x)) {
		*tree_of(p, v) = tr_remove(*tree_of(p, v), v);
		absorb(p, v, x);
		x = v;
	}
	x->prio = rand32();
	*tree_of(p, x) = tr_insert(*tree_of(p, x), x);
}

/* Every marker of st up to and including m has completed: their extents become reusable by all. */
static void complete_upto(struct pool *p, struct sstream *st, const struct marker *m)
{
	uint64_t upto = m != NULL ? m->seq : UINT64_MAX;
	while (st->oldest != NULL && st->oldest->seq <= upto) {
		struct marker *o = st->oldest;
		/* Unlinking the last extent frees o; take them one at a time. */
		while (st->oldest == o) {
			struct extent *x = o->exts;
			st->pend[x->seg->cls] = tr_remove(st->pend[x->seg->cls], x);
			mk_unlink(p, x);
			x->state = EXT_DONE;
			free_insert(p, x);
		}
	}
}

/* A lazy marker gets its event now: a point in its stream after every free it holds. */
static int mk_record(struct pool *p, struct marker *m)
{
	if (!m->open)
		return 0;
	void *ev = NULL;
	int rc = p->ops->mark(&m->st->key, &ev);
	if (rc < 0)
		return rc;
	m->ev = ev;
	m->open = 0;
	return 0;
}

/* Asks the GPU which frees completed, oldest first per stream (stream order: the first not
 * done ends that stream's walk). A lazy marker is recorded on the way, and answers later. */
static void poll_streams(struct pool *p)
{
	for (size_t i = 0; i < p->nstreams; i++) {
		struct sstream *st = p->streams[i];
		struct marker *last = NULL;
		for (struct marker *m = st->oldest; m != NULL; m = m->newer) {
			if (m->open && mk_record(p, m) < 0)
				break;
			if (m->ev == NULL || p->ops->done(m->ev) != 1)
				break;
			last = m;
		}
		if (last != NULL)
			complete_upto(p, st, last);
	}
}

/* ---- segments ---- */

static struct segment *seg_new(struct pool *p, int cls, size_t need, int *rc)
{
	size_t size = cls == 0 ? SHIM_POOL_SMALL_SEG : cls == 1 ? SHIM_POOL_MEDIUM_SEG : need;
	size = (size + p->gran - 1) / p->gran * p->gran;
	struct segment *s = calloc(1, sizeof(*s));
	struct extent *x = calloc(1, sizeof(*x));
	*rc = -ENOMEM;
	if (s == NULL || x == NULL || grow_vec((void **)&segv, &cap_segv, nsegv, sizeof(*segv)) < 0)
		goto fail;
	uint64_t va = 0;
	*rc = p->ops->seg_new(p->device, size, p->acc, (size_t)p->nacc, &va);
	if (*rc < 0)
		goto fail;
	*s = (struct segment){ .va = va, .size = size, .cls = cls, .pool = p, .first = x };
	*x = (struct extent){ .va = va, .size = size, .state = EXT_DONE, .seg = s, .prio = rand32() };
	size_t i = segv_lower(va);
	memmove(&segv[i + 1], &segv[i], (nsegv - i) * sizeof(*segv));
	segv[i] = s;
	nsegv++;
	s->pnext = p->segs;
	if (p->segs != NULL)
		p->segs->pprev = s;
	p->segs = s;
	p->nidle++;
	p->reserved += size;
	if (p->reserved > p->reserved_high)
		p->reserved_high = p->reserved;
	p->done[cls] = tr_insert(p->done[cls], x);
	counts.grows++;
	return s;
fail:
	free(s);
	free(x);
	return NULL;
}

static int seg_idle(const struct segment *s)
{
	return s->nused == 0 && s->first->state == EXT_DONE && s->first->size == s->size;
}

static void seg_drop(struct pool *p, struct segment *s)
{
	p->done[s->cls] = tr_remove(p->done[s->cls], s->first);
	free(s->first);
	p->ops->seg_free(s->va, s->size);
	size_t i = segv_lower(s->va);
	memmove(&segv[i], &segv[i + 1], (nsegv - i - 1) * sizeof(*segv));
	nsegv--;
	if (s->pprev != NULL)
		s->pprev->pnext = s->pnext;
	else
		p->segs = s->pnext;
	if (s->pnext != NULL)
		s->pnext->pprev = s->pprev;
	p->nidle--;
	p->reserved -= s->size;
	free(s);
}

/* Releases idle segments (frees completed) while more than keep bytes are reserved; skip: a
 * segment to keep (the one a caller is about to use). */
static uint64_t release_down(struct pool *p, uint64_t keep)
{
	uint64_t freed = 0;
	for (struct segment *s = p->segs, *nx; s != NULL && p->reserved > keep; s = nx) {
		nx = s->pnext;
		if (seg_idle(s)) {
			freed += s->size;
			seg_drop(p, s);
		}
	}
	return freed;
}

static void pool_free_record(struct pool *p)
{
	for (size_t i = 0; i < p->nstreams; i++)
		free(p->streams[i]);
	free(p->streams);
	free(p);
}

/* A removed pool goes once its last segment did. */
static void gone_sweep(void)
{
	for (size_t i = 0; i < ngone;) {
		struct pool *p = gone[i];
		poll_streams(p);
		release_down(p, 0);
		pool_want_update(p);
		if (p->segs == NULL) {
			if (p->wants)
				atomic_fetch_sub_explicit(&shim_pool_want_release, 1, memory_order_relaxed);
			pool_free_record(p);
			gone[i] = gone[--ngone];
		} else {
			i++;
		}
	}
}

/* ---- the public operations ---- */

int shim_pool_add(uint64_t key, int device, size_t gran, const struct shim_pool_ops *ops)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	size_t i = pool_lower(key);
	struct pool *p = NULL;
	if (i < npools && pools[i]->key == key) {
		rc = -EEXIST;
	} else if (grow_vec((void **)&pools, &cap_pools, npools, sizeof(*pools)) < 0 ||
		   (p = calloc(1, sizeof(*p))) == NULL) {
		rc = -ENOMEM;
	} else {
		*p = (struct pool){ .key = key, .device = device, .gran = gran ? gran : SHIM_POOL_SMALL_SEG,
				    .ops = ops, .opportunistic = 1, .internal_deps = 1, .follow_events = 1 };
		memmove(&pools[i + 1], &pools[i], (npools - i) * sizeof(*pools));
		pools[i] = p;
		npools++;
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_remove(uint64_t key)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	size_t i = pool_lower(key);
	if (i == npools || pools[i]->key != key) {
		rc = -ENOENT;
	} else if (grow_vec((void **)&gone, &cap_gone, ngone, sizeof(*gone)) < 0) {
		rc = -ENOMEM;
	} else {
		struct pool *p = pools[i];
		memmove(&pools[i], &pools[i + 1], (npools - i - 1) * sizeof(*pools));
		npools--;
		p->removed = 1;
		gone[ngone++] = p;
		gone_sweep();
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_served(uint64_t key)
{
	pthread_mutex_lock(&pool_lock);
	int r = pool_get(key) != NULL;
	pthread_mutex_unlock(&pool_lock);
	return r;
}

/* x (free, size >= need, in its tree) becomes a live block of need bytes; the rest stays
 * free with x's reuse condition. */
static int carve(struct pool *p, struct extent *x, size_t need, size_t req, enum ext_state to)
{
	struct extent **t = tree_of(p, x);
	if (x->size > need) {
		struct extent *y = calloc(1, sizeof(*y));
		if (y == NULL)
			return -ENOMEM;
		*t = tr_remove(*t, x);
		*y = (struct extent){ .va = x->va + need, .size = x->size - need, .state = x->state,
				      .seg = x->seg, .prev = x, .next = x->next, .prio = rand32() };
		if (x->next != NULL)
			x->next->prev = y;
		x->next = y;
		x->size = need;
		if (x->state == EXT_PENDING)
			mk_link(y, x->mk);
		*t = tr_insert(*t, y);
	} else {
		*t = tr_remove(*t, x);
	}
	if (hash_put(x) < 0) {
		x->prio = rand32();
		free_insert(p, x); /* back as it was (joins the rest again) */
		return -ENOMEM;
	}
	if (x->state == EXT_PENDING)
		mk_unlink(p, x);
	x->state = to;
	x->req = req;
	x->gfreed = 0;
	seg_used(x->seg, 1);
	p->used += need;
	if (p->used > p->used_high)
		p->used_high = p->used;
	return 0;
}

/* Another stream's pending extent, with the GPU made to wait for its free (internal
 * dependencies), when nothing else is left. */
static struct extent *fit_with_wait(struct pool *p, const struct sstream *self, int cls, size_t need,
				    const struct shim_pool_stream *s)
{
	for (size_t i = 0; i < p->nstreams; i++) {
		struct sstream *st = p->streams[i];
		if (st == self)
			continue;
		struct extent *x = tr_fit(st->pend[cls], need);
		/* Waiting for st's newest free covers every free of st before it. */
		if (x != NULL && mk_record(p, st->newest) == 0 && st->newest->ev != NULL &&
		    p->ops->wait(s->handle, s->variant, st->newest->ev) == 0)
			return x;
	}
	return NULL;
}

int shim_pool_alloc(uint64_t key, size_t bytes, const struct shim_pool_stream *s, unsigned flags,
		    uint64_t *va)
{
	if (bytes == 0)
		return -EINVAL;
	if (bytes > SIZE_MAX - SHIM_POOL_ALIGN)
		return -ENOMEM;
	size_t need = (bytes + SHIM_POOL_ALIGN - 1) & ~(size_t)(SHIM_POOL_ALIGN - 1);
	int cls = size_class(need);
	enum ext_state to = (flags & GRAPH) ? EXT_GRAPH : EXT_LIVE;
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	struct sstream *st = NULL;
	struct extent *x = NULL;
	if (p == NULL) {
		rc = -ENOENT;
		goto out;
	}
	/* 1. Stream order: this stream's own pending frees (not inside a capture: the graph may
	 * replay after the stream's later work). */
	if (!(flags & GRAPH)) {
		st = stream_get(p, s, 0);
		if (st != NULL && (x = tr_fit(st->pend[cls], need)) != NULL) {
			counts.reuses_same_stream++;
			goto take;
		}
	}
	/* 2. Completed frees, then those found complete by asking the GPU. */
	if ((x = tr_fit(p->done[cls], need)) != NULL) {
		counts.reuses_done++;
		goto take;
	}
	if (p->opportunistic || (flags & GRAPH)) {
		poll_streams(p);
		if ((x = tr_fit(p->done[cls], need)) != NULL) {
			counts.reuses_done++;
			goto take;
		}
	}
	/* 3. A new segment; when the GPU is full, idle segments of every pool go first. */
	struct segment *sg = seg_new(p, cls, need, &rc);
	if (sg == NULL && rc == -ENOMEM) {
		for (size_t i = 0; i < npools; i++)
			release_down(pools[i], 0);
		sg = seg_new(p, cls, need, &rc);
	}
	if (sg != NULL) {
		x = sg->first;
		goto take;
	}
	/* 4. Out of memory: wait on the GPU for another stream's free. */
	if (rc == -ENOMEM && p->internal_deps && !(flags & GRAPH) &&
	    (x = fit_with_wait(p, stream_get(p, s, 0), cls, need, s)) != NULL) {
		counts.reuses_waited++;
		goto take;
	}
	goto out;
take:
	rc = carve(p, x, need, bytes, to);
	if (rc == 0)
		*va = x->va;
out:
	if (p != NULL)
		pool_want_update(p);
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

/* A live or graph-owned block goes back: pending under m, or completed (m NULL). */
static void block_free(struct pool *p, struct extent *x, struct marker *m)
{
	hash_del(x);
	p->used -= x->size;
	seg_used(x->seg, -1);
	x->req = 0;
	if (m != NULL) {
		x->state = EXT_PENDING;
		mk_link(x, m);
	} else {
		x->state = EXT_DONE;
	}
	free_insert(p, x);
	if (p->removed)
		gone_sweep();
	else
		pool_want_update(p);
}

int shim_pool_free(uint64_t va, const struct shim_pool_stream *s, unsigned flags)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct extent *x = va ? hash_get(va) : NULL;
	if (x == NULL) {
		rc = -ENOENT;
		goto out;
	}
	struct pool *p = x->seg->pool;
	if (x->state == EXT_GRAPH) {
		/* Its graphs may still replay into it: it goes with the last of them. */
		x->gfreed = 1;
		goto out;
	}
	struct marker *m = NULL;
	if (!(flags & SHIM_POOL_DONE)) {
		struct sstream *st = stream_get(p, s, 1);
		void *ev = NULL;
		if (st == NULL) {
			rc = -ENOMEM;
			goto out;
		}
		if (flags & SHIM_POOL_LAZY) {
			/* The stream's open marker takes this free too; a new one when there is none. */
			m = st->newest != NULL && st->newest->open ? st->newest : mk_push(st, NULL);
			if (m == NULL) {
				rc = -ENOMEM;
				goto out;
			}
			m->open = 1;
			goto marked;
		}
		rc = p->ops->mark(s, &ev);
		if (rc < 0)
			goto out; /* the block stays allocated, as the driver leaves it on an error */
		if ((m = mk_push(st, ev)) == NULL) {
			p->ops->unmark(ev);
			rc = -ENOMEM;
			goto out;
		}
	}
marked:
	block_free(p, x, m);
out:
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

/* ---- graph memory ---- */

static size_t holder_lower(uint64_t key)
{
	size_t lo = 0, hi = nholders;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (holders[mid].key < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The holder's record (make: created when missing). Creating one moves the others. */
static struct holder *holder_get(uint64_t key, int make)
{
	size_t i = holder_lower(key);
	if (i < nholders && holders[i].key == key)
		return &holders[i];
	if (!make || grow_vec((void **)&holders, &cap_holders, nholders, sizeof(*holders)) < 0)
		return NULL;
	memmove(&holders[i + 1], &holders[i], (nholders - i) * sizeof(*holders));
	holders[i] = (struct holder){ .key = key };
	nholders++;
	return &holders[i];
}

static void holder_del(struct holder *h)
{
	size_t i = (size_t)(h - holders);
	free(h->b);
	memmove(&holders[i], &holders[i + 1], (nholders - i - 1) * sizeof(*holders));
	nholders--;
}

/* h holds x (once). */
static int holder_add(struct holder *h, struct extent *x)
{
	for (size_t i = 0; i < h->n; i++)
		if (h->b[i] == x)
			return 0;
	if (grow_vec((void **)&h->b, &h->cap, h->n, sizeof(*h->b)) < 0)
		return -ENOMEM;
	h->b[h->n++] = x;
	x->grefs++;
	return 0;
}

/* x's last holder is gone: free, completed (done) or pending until every stream's work is. */
static void graph_release(struct extent *x, int done)
{
	struct pool *p = x->seg->pool;
	struct marker *m = NULL;
	if (!done) {
		if (p->dev_st == NULL)
			p->dev_st = stream_get(p, &dev_key, 1);
		if (p->dev_st == NULL || (m = mk_push(p->dev_st, NULL)) == NULL)
			return; /* stays graph-owned: a leak, never a block reused under a replay */
	}
	x->grefs = 0;
	block_free(p, x, m);
}

int shim_pool_graph_alloc(uint64_t key, size_t bytes, uint64_t holder, uint64_t *va)
{
	uint64_t b = 0;
	int rc = shim_pool_alloc(key, bytes, &dev_key, GRAPH, &b);
	if (rc < 0)
		return rc;
	/* Between the two locks the block is graph-owned with no holder: nobody frees it. */
	pthread_mutex_lock(&pool_lock);
	struct holder *h = holder_get(holder, 1);
	struct extent *x = hash_get(b);
	rc = h == NULL ? -ENOMEM : holder_add(h, x);
	if (rc < 0)
		graph_release(x, 1);
	else
		*va = b;
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_graph_adopt(uint64_t va, uint64_t holder)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct extent *x = va ? hash_get(va) : NULL;
	struct holder *h = x != NULL ? holder_get(holder, 1) : NULL;
	if (x == NULL) {
		rc = -ENOENT;
	} else if (h == NULL || (rc = holder_add(h, x)) < 0) {
		rc = -ENOMEM;
	} else {
		if (x->state == EXT_LIVE)
			x->state = EXT_GRAPH; /* still counted as used: the graph frees it on every replay */
		x->gfreed = 1;
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_graph_share(uint64_t to, uint64_t from)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	if (to != from && holder_get(from, 0) != NULL) {
		struct holder *ht = holder_get(to, 1);
		struct holder *hf = holder_get(from, 0); /* after: creating ht moves the records */
		for (size_t i = 0; ht != NULL && i < hf->n && rc == 0; i++)
			rc = holder_add(ht, hf->b[i]);
		if (ht == NULL)
			rc = -ENOMEM;
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

/* keep: blocks never freed in their graphs outlive it (the application's); else all go. */
static int graph_drop(uint64_t holder, int keep)
{
	int released = 0;
	pthread_mutex_lock(&pool_lock);
	struct holder *h = holder_get(holder, 0);
	if (h != NULL) {
		struct extent **b = h->b;
		size_t n = h->n;
		h->b = NULL;
		holder_del(h);
		for (size_t i = 0; i < n; i++) {
			if (--b[i]->grefs != 0)
				continue;
			if (keep && !b[i]->gfreed) {
				/* Allocated in a graph and never freed there: as with the driver, the
				 * allocation outlives its graphs and is the application's to free. */
				b[i]->state = EXT_LIVE;
				continue;
			}
			graph_release(b[i], 0);
			released++;
		}
		free(b);
	}
	pthread_mutex_unlock(&pool_lock);
	return released;
}

int shim_pool_graph_drop(uint64_t holder)
{
	return graph_drop(holder, 1);
}

int shim_pool_graph_discard(uint64_t holder)
{
	return graph_drop(holder, 0);
}

int shim_pool_graph_undo(uint64_t va, uint64_t holder)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&pool_lock);
	struct extent *x = va ? hash_get(va) : NULL;
	struct holder *h = holder_get(holder, 0);
	for (size_t i = 0; x != NULL && h != NULL && i < h->n; i++)
		if (h->b[i] == x) {
			h->b[i] = h->b[--h->n];
			if (h->n == 0)
				holder_del(h);
			if (--x->grefs == 0)
				graph_release(x, 1);
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_block(uint64_t va, uint64_t *base, size_t *size, int *device)
{
	int hit = 0;
	pthread_mutex_lock(&pool_lock);
	size_t i = segv_lower(va + 1);
	struct segment *s = i > 0 ? segv[i - 1] : NULL;
	if (s != NULL && va >= s->va && va < s->va + s->size && s->nused > 0) {
		struct extent *x = s->first;
		while (x != NULL && x->va + x->size <= va)
			x = x->next;
		hit = x != NULL && (x->state == EXT_LIVE || x->state == EXT_GRAPH) && va < x->va + x->req;
		if (hit) {
			if (base != NULL)
				*base = x->va;
			if (size != NULL)
				*size = x->req;
			if (device != NULL)
				*device = s->pool->device;
		}
	}
	pthread_mutex_unlock(&pool_lock);
	return hit;
}

int shim_pool_set_attr(uint64_t key, enum shim_pool_attr a, uint64_t value)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	if (p == NULL) {
		rc = -ENOENT;
		goto out;
	}
	switch (a) {
	case SHIM_POOL_REUSE_FOLLOW_EVENTS:
		p->follow_events = value != 0;
		break;
	case SHIM_POOL_REUSE_OPPORTUNISTIC:
		p->opportunistic = value != 0;
		break;
	case SHIM_POOL_REUSE_INTERNAL_DEPS:
		p->internal_deps = value != 0;
		break;
	case SHIM_POOL_RELEASE_THRESHOLD:
		p->threshold = value;
		break;
	case SHIM_POOL_RESERVED_HIGH:
		p->reserved_high = p->reserved;
		break;
	case SHIM_POOL_USED_HIGH:
		p->used_high = p->used;
		break;
	default:
		rc = -EINVAL; /* the current values cannot be set */
	}
	pool_want_update(p);
out:
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_get_attr(uint64_t key, enum shim_pool_attr a, uint64_t *value)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	if (p == NULL) {
		rc = -ENOENT;
		goto out;
	}
	switch (a) {
	case SHIM_POOL_REUSE_FOLLOW_EVENTS:
		*value = (uint64_t)p->follow_events;
		break;
	case SHIM_POOL_REUSE_OPPORTUNISTIC:
		*value = (uint64_t)p->opportunistic;
		break;
	case SHIM_POOL_REUSE_INTERNAL_DEPS:
		*value = (uint64_t)p->internal_deps;
		break;
	case SHIM_POOL_RELEASE_THRESHOLD:
		*value = p->threshold;
		break;
	case SHIM_POOL_RESERVED_CURRENT:
		*value = p->reserved;
		break;
	case SHIM_POOL_RESERVED_HIGH:
		*value = p->reserved_high;
		break;
	case SHIM_POOL_USED_CURRENT:
		*value = p->used;
		break;
	case SHIM_POOL_USED_HIGH:
		*value = p->used_high;
		break;
	}
out:
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_trim(uint64_t key, size_t keep)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	if (p == NULL) {
		rc = -ENOENT;
	} else {
		poll_streams(p);
		release_down(p, keep);
		pool_want_update(p);
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_set_access(uint64_t key, const struct shim_gpu_access *acc, size_t n)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	if (p == NULL) {
		rc = -ENOENT;
		goto out;
	}
	for (struct segment *s = p->segs; s != NULL && rc == 0; s = s->pnext)
		rc = p->ops->seg_access(s->va, s->size, acc, n);
	if (rc < 0)
		goto out;
	/* The record: the last flags per location, as the driver keeps them. */
	for (size_t k = 0; k < n; k++) {
		int j = 0;
		while (j < p->nacc && (p->acc[j].type != acc[k].type || p->acc[j].id != acc[k].id))
			j++;
		if (j == p->nacc && p->nacc < SHIM_MAX_DEVICES)
			p->nacc++;
		if (j < p->nacc)
			p->acc[j] = acc[k];
	}
out:
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

int shim_pool_get_access(uint64_t key, struct shim_gpu_access *acc, size_t *n)
{
	int rc = 0;
	pthread_mutex_lock(&pool_lock);
	struct pool *p = pool_get(key);
	if (p == NULL) {
		rc = -ENOENT;
	} else {
		size_t k = (size_t)p->nacc < *n ? (size_t)p->nacc : *n;
		memcpy(acc, p->acc, k * sizeof(*acc));
		*n = (size_t)p->nacc;
	}
	pthread_mutex_unlock(&pool_lock);
	return rc;
}

void shim_pool_synced(const struct shim_pool_stream *s)
{
	pthread_mutex_lock(&pool_lock);
	for (size_t i = 0; i < npools; i++) {
		struct pool *p = pools[i];
		if (!p->wants)
			continue;
		if (s == NULL) {
			for (size_t k = 0; k < p->nstreams; k++)
				complete_upto(p, p->streams[k], NULL);
		} else {
			struct sstream *st = stream_get(p, s, 0);
			if (st != NULL)
				complete_upto(p, st, NULL);
			poll_streams(p);
		}
		release_down(p, p->threshold);
		pool_want_update(p);
	}
	gone_sweep();
	pthread_mutex_unlock(&pool_lock);
}

void shim_pool_stream_close(const struct shim_pool_stream *s)
{
	pthread_mutex_lock(&pool_lock);
	for (size_t i = 0; i < npools + ngone; i++) {
		struct pool *p = i < npools ? pools[i] : gone[i - npools];
		struct sstream *st = stream_get(p, s, 0);
		/* Unrecorded, its frees would wait for a device-wide synchronise. */
		if (st != NULL && st->newest != NULL)
			(void)mk_record(p, st->newest);
	}
	pthread_mutex_unlock(&pool_lock);
}

void shim_pool_stream_gone(const struct shim_pool_stream *s)
{
	pthread_mutex_lock(&pool_lock);
	for (size_t i = 0; i < npools + ngone; i++) {
		struct pool *p = i < npools ? pools[i] : gone[i - npools];
		size_t k = stream_lower(p, s);
		if (k == p->nstreams || skey_cmp(&p->streams[k]->key, s) != 0)
			continue;
		struct sstream *st = p->streams[k];
		if (st->oldest == NULL) {
			stream_drop(p, k);
			continue;
		}
		/* Its frees still complete (the driver finishes the stream's work): the record stays,
		 * under a key no live stream has, so a new stream with the same handle starts fresh. */
		st->key.handle = UINT64_MAX;
		st->key.thread = ++seq_next;
		memmove(&p->streams[k], &p->streams[k + 1], (p->nstreams - k - 1) * sizeof(*p->streams));
		p->nstreams--;
		size_t j = stream_lower(p, &st->key);
		memmove(&p->streams[j + 1], &p->streams[j], (p->nstreams - j) * sizeof(*p->streams));
		p->streams[j] = st;
		p->nstreams++;
	}
	pthread_mutex_unlock(&pool_lock);
}

uint64_t shim_pool_release_idle(void)
{
	uint64_t freed = 0;
	pthread_mutex_lock(&pool_lock);
	for (size_t i = 0; i < npools + ngone; i++) {
		struct pool *p = i < npools ? pools[i] : gone[i - npools];
		for (size_t k = 0; k < p->nstreams; k++)
			complete_upto(p, p->streams[k], NULL);
		freed += release_down(p, 0);
		pool_want_update(p);
	}
	gone_sweep();
	pthread_mutex_unlock(&pool_lock);
	return freed;
}

static void pool_count(const struct pool *p, struct shim_pool_stats *st)
{
	st->reserved_bytes += p->reserved;
	st->used_bytes += p->used;
	for (const struct segment *s = p->segs; s != NULL; s = s->pnext) {
		st->segments++;
		for (const struct extent *x = s->first; x != NULL; x = x->next) {
			st->blocks += x->state == EXT_LIVE || x->state == EXT_GRAPH;
			st->graph_bytes += x->state == EXT_GRAPH ? x->size : 0;
		}
	}
	for (size_t k = 0; k < p->nstreams; k++)
		st->pending_frees += p->streams[k]->npend;
}

void shim_pool_stats(struct shim_pool_stats *st)
{
	pthread_mutex_lock(&pool_lock);
	*st = counts;
	st->pools = npools;
	for (size_t i = 0; i < npools; i++)
		pool_count(pools[i], st);
	for (size_t i = 0; i < ngone; i++)
		pool_count(gone[i], st);
	pthread_mutex_unlock(&pool_lock);
}

void shim_pool_reset(void)
{
	pthread_mutex_lock(&pool_lock);
	for (size_t i = 0; i < npools + ngone; i++) {
		struct pool *p = i < npools ? pools[i] : gone[i - npools];
		for (struct segment *s = p->segs, *nx; s != NULL; s = nx) {
			nx = s->pnext;
			for (struct extent *x = s->first, *xn; x != NULL; x = xn) {
				xn = x->next;
				free(x);
			}
			free(s);
		}
		for (size_t k = 0; k < p->nstreams; k++)
			for (struct marker *m = p->streams[k]->oldest, *mn; m != NULL; m = mn) {
				mn = m->newer;
				free(m);
			}
		pool_free_record(p);
	}
	for (size_t i = 0; i < nholders; i++)
		free(holders[i].b);
	npools = ngone = nsegv = nholders = 0;
	free(hash);
	hash = NULL;
	hash_cap = hash_n = 0;
	memset(&counts, 0, sizeof(counts));
	atomic_store(&shim_pool_want_release, 0);
	pthread_mutex_unlock(&pool_lock);
}
