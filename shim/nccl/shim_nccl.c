/* shim_nccl: the NCCL the application loaded, the records behind the shim's communicator
 * handles, and the hold on submissions. Why a hold at the wrapper and not at the CUDA gate: a
 * rank held before it launches collective k leaves every peer's kernel for k spinning, so the
 * members must first agree on how far each communicator goes (freeze: stop and count; drain: go
 * up to the largest count), and that can only be decided before NCCL is entered, holding none of
 * its locks. The fast path is an atomic add and a load of the mode, as the CUDA gate's. */
#include "shim_nccl.h"
#include "shim_nccl_poke.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcr_log.h"
#include "gcr_time.h"
#include "shim_config.h"
#include "shim_cuda_pool.h"
#include "shim_cuda_real.h"
#include "shim_real.h"

#define SHIM_NCCL_MAGIC 0x4e43434cu /* "NCCL" */
#define SHIM_NCCL_REG_MAGIC 0x52454721u

struct shim_nccl_lib shim_nccl_lib;
struct shim_nccl_hold shim_nccl_hold;

static pthread_mutex_t nccl_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t nccl_cond;
static pthread_once_t cond_once = PTHREAD_ONCE_INIT;

static void cond_init(void)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	pthread_cond_init(&nccl_cond, &a);
	pthread_condattr_destroy(&a);
}

void shim_nccl_lock(void)
{
	pthread_once(&cond_once, cond_init);
	pthread_mutex_lock(&nccl_lock);
}

void shim_nccl_unlock(void)
{
	pthread_mutex_unlock(&nccl_lock);
}

void shim_nccl_wake(void)
{
	pthread_cond_broadcast(&nccl_cond);
}

int shim_nccl_wait_until(double deadline_ms)
{
	double left = deadline_ms - gcr_time_mono_ms();
	if (left <= 0)
		return -ETIMEDOUT;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	long long ns = (long long)ts.tv_nsec + (long long)(left * 1e6);
	ts.tv_sec += (time_t)(ns / 1000000000LL);
	ts.tv_nsec = (long)(ns % 1000000000LL);
	return pthread_cond_timedwait(&nccl_cond, &nccl_lock, &ts) == ETIMEDOUT ? -ETIMEDOUT : 0;
}

int shim_nccl_enabled(void)
{
	return shim_cfg.nccl;
}

/* ---- the real library ---- */

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static void *_Atomic nccl_handle;

/* The path of the object holding addr, unless it is the shim itself. */
static const char *object_of(const void *addr)
{
	Dl_info di, self;
	if (addr == NULL || dladdr(addr, &di) == 0 || di.dli_fname == NULL)
		return NULL;
	if (dladdr((void *)&shim_nccl_load, &self) != 0 && self.dli_fbase == di.dli_fbase)
		return NULL;
	return di.dli_fname;
}

static __thread const void *first_caller;

void shim_nccl_note_caller(const void *caller)
{
	if (atomic_load_explicit(&nccl_handle, memory_order_acquire) == NULL)
		first_caller = caller;
}

/* A handle on the object holding addr whose local scope defines NCCL's names (not the shim's). */
static void *caller_scope(const void *addr)
{
	const char *path = object_of(addr);
	void *h = path != NULL ? dlopen(path, RTLD_LAZY | RTLD_NOLOAD) : NULL;
	void *fn = h != NULL ? shim_real_dlsym(h, "ncclCommInitRank") : NULL;
	if (fn == NULL || object_of(fn) == NULL) {
		if (h != NULL)
			dlclose(h);
		return NULL;
	}
	return h;
}

static int find_loaded(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	const char *n = info->dlpi_name, *slash = n != NULL ? strrchr(n, '/') : NULL;
	const char *base = slash != NULL ? slash + 1 : n;
	if (base != NULL && strncmp(base, "libnccl.so", 10) == 0) {
		*(void **)data = dlopen(n, RTLD_LAZY | RTLD_NOLOAD);
		return *(void **)data != NULL;
	}
	return 0;
}

int shim_nccl_load(const void *hint)
{
	if (atomic_load_explicit(&nccl_handle, memory_order_acquire) != NULL)
		return 0;
	pthread_mutex_lock(&load_lock);
	int rc = 0;
	void *h = atomic_load(&nccl_handle);
	const char *path = object_of(hint);
	if (h != NULL)
		goto out;
	if (path != NULL)
		h = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
	if (h == NULL)
		dl_iterate_phdr(find_loaded, &h);
	if (h == NULL && first_caller != NULL)
		h = caller_scope(first_caller);
	if (h == NULL) {
		rc = -ENOENT;
		goto out;
	}
	for (unsigned i = 0; i < SHIM_NCCL_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_nccl_hooks[i].name[v] != NULL)
				shim_nccl_hooks[i].real[v] = shim_real_dlsym(h, shim_nccl_hooks[i].name[v]);
	shim_nccl_lib.GetUniqueId = (__typeof__(&ncclGetUniqueId))shim_real_dlsym(h, "ncclGetUniqueId");
	shim_nccl_lib.GetErrorString = (__typeof__(&ncclGetErrorString))shim_real_dlsym(h, "ncclGetErrorString");
	atomic_store_explicit(&nccl_handle, h, memory_order_release);
	GCR_LOG(GCR_LOG_DEBUG, "shim", "NCCL found%s%s", path ? " in " : "", path ? path : "");
out:
	pthread_mutex_unlock(&load_lock);
	return rc;
}

void *shim_nccl_real(unsigned id, int variant)
{
	if (atomic_load_explicit(&nccl_handle, memory_order_acquire) == NULL && shim_nccl_load(NULL) < 0)
		return NULL;
	return shim_nccl_hooks[id].real[variant];
}

/* ---- records ---- */

static struct shim_nccl_rec recs[SHIM_NCCL_MAX_COMMS];
static uint64_t next_seq = 1;
static struct shim_nccl_reg *regs;

struct shim_nccl_rec *shim_nccl_rec_of(const void *h)
{
	uintptr_t p = (uintptr_t)h, base = (uintptr_t)recs;
	if (p < base || p >= base + sizeof(recs) || (p - base) % sizeof(recs[0]) != 0)
		return NULL;
	struct shim_nccl_rec *r = (struct shim_nccl_rec *)h;
	return r->magic == SHIM_NCCL_MAGIC ? r : NULL;
}

struct shim_nccl_rec *shim_nccl_rec_new(void)
{
	for (size_t i = 0; i < SHIM_NCCL_MAX_COMMS; i++) {
		struct shim_nccl_rec *r = &recs[i];
		if (r->magic == SHIM_NCCL_MAGIC)
			continue;
		memset(r, 0, sizeof(*r));
		r->magic = SHIM_NCCL_MAGIC;
		r->seq = next_seq++;
		r->device = -1;
		r->blocking = 1;
		return r;
	}
	return NULL;
}

void shim_nccl_rec_free(struct shim_nccl_rec *r)
{
	while (r != NULL) {
		struct shim_nccl_rec *parent = r->parent;
		for (struct shim_nccl_reg **pp = &regs; *pp != NULL;) {
			struct shim_nccl_reg *g = *pp;
			if (g->rec == r) {
				*pp = g->next;
				g->magic = 0;
				free(g);
			} else {
				pp = &g->next;
			}
		}
		r->magic = 0;
		r->real = NULL;
		if (parent == NULL || --parent->children > 0 || !parent->app_gone)
			break;
		r = parent; /* destroyed by the application and needed by no split any more */
	}
}

static int by_seq(const void *a, const void *b)
{
	const struct shim_nccl_rec *x = *(struct shim_nccl_rec *const *)a, *y = *(struct shim_nccl_rec *const *)b;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

size_t shim_nccl_recs(struct shim_nccl_rec **out, size_t cap)
{
	size_t n = 0;
	for (size_t i = 0; i < SHIM_NCCL_MAX_COMMS && n < cap; i++)
		if (recs[i].magic == SHIM_NCCL_MAGIC)
			out[n++] = &recs[i];
	qsort(out, n, sizeof(*out), by_seq);
	return n;
}

/* FNV-1a, 64 bits: keys only name communicators across the group's processes. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

uint64_t shim_nccl_key_init(const ncclUniqueId *ids, int nid)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, "init", 4);
	for (int i = 0; i < nid; i++)
		h = fnv(h, ids[i].internal, sizeof(ids[i].internal));
	return h != 0 ? h : 1;
}

uint64_t shim_nccl_key_split(uint64_t parent, uint64_t seq, int color)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, "split", 5);
	h = fnv(h, &parent, sizeof(parent));
	h = fnv(h, &seq, sizeof(seq));
	h = fnv(h, &color, sizeof(color));
	return h != 0 ? h : 1;
}

/* The configuration's fields the shim reads, at their offsets in every ncclConfig_t since
 * 2.14 (size, magic, version, then blocking): the copy is taken by the caller's "size". */
#define CFG_OFF_BLOCKING offsetof(ncclConfig_t, blocking)
#define CFG_OFF_NETNAME offsetof(ncclConfig_t, netName)
#define CFG_OFF_COMMNAME offsetof(ncclConfig_t, commName)

static void copy_str(unsigned char *cfg, size_t len, size_t off, char *dst)
{
	const char *s;
	if (off + sizeof(s) > len)
		return;
	memcpy(&s, cfg + off, sizeof(s));
	if (s == NULL)
		return;
	size_t n = strnlen(s, SHIM_NCCL_NAME_MAX - 1);
	memcpy(dst, s, n);
	dst[n] = '\0';
	s = dst;
	memcpy(cfg + off, &s, sizeof(s));
}

void shim_nccl_rec_config(struct shim_nccl_rec *r, const ncclConfig_t *config, const struct shim_nccl_rec *parent)
{
	int undef = 1, blocking = 1;
	if (config != NULL && config->size >= CFG_OFF_BLOCKING + sizeof(int)) {
		size_t len = config->size < SHIM_NCCL_CONFIG_MAX ? config->size : SHIM_NCCL_CONFIG_MAX;
		memcpy(r->config, config, len);
		((ncclConfig_t *)(void *)r->config)->size = len;
		copy_str(r->config, len, CFG_OFF_NETNAME, r->net_name);
		copy_str(r->config, len, CFG_OFF_COMMNAME, r->comm_name);
		r->has_config = 1;
		undef = config->blocking == NCCL_CONFIG_UNDEF_INT;
		blocking = config->blocking != 0;
	}
	if (undef && parent != NULL) {
		r->blocking = parent->blocking;
		return;
	}
	if (undef) {
		/* NCCL's own default: NCCL_COMM_BLOCKING, else blocking. */
		const char *e = getenv("NCCL_COMM_BLOCKING");
		blocking = !(e != NULL && e[0] == '0' && e[1] == '\0');
	}
	r->blocking = blocking;
}

ncclConfig_t *shim_nccl_rec_cfg(struct shim_nccl_rec *r)
{
	return r->has_config ? (ncclConfig_t *)(void *)r->config : NULL;
}

struct shim_nccl_reg *shim_nccl_reg_of(const void *h)
{
	for (struct shim_nccl_reg *g = regs; g != NULL; g = g->next)
		if (g == h && g->magic == SHIM_NCCL_REG_MAGIC)
			return g;
	return NULL;
}

/* Registrations are made by shim_nccl_hook.c through these (lock held). */
struct shim_nccl_reg *shim_nccl_reg_new(struct shim_nccl_rec *r, void *buff, size_t size, void *real);
void shim_nccl_reg_free(struct shim_nccl_reg *g);
struct shim_nccl_reg *shim_nccl_reg_next(struct shim_nccl_reg *g);

struct shim_nccl_reg *shim_nccl_reg_new(struct shim_nccl_rec *r, void *buff, size_t size, void *real)
{
	struct shim_nccl_reg *g = calloc(1, sizeof(*g));
	if (g == NULL)
		return NULL;
	*g = (struct shim_nccl_reg){ .magic = SHIM_NCCL_REG_MAGIC, .rec = r, .buff = buff, .size = size,
				     .real = real, .next = regs };
	regs = g;
	return g;
}

void shim_nccl_reg_free(struct shim_nccl_reg *g)
{
	for (struct shim_nccl_reg **pp = &regs; *pp != NULL; pp = &(*pp)->next)
		if (*pp == g) {
			*pp = g->next;
			g->magic = 0;
			free(g);
			return;
		}
}

struct shim_nccl_reg *shim_nccl_reg_next(struct shim_nccl_reg *g)
{
	return g == NULL ? regs : g->next;
}

/* ---- the calling thread: its group and whether NCCL is calling itself ---- */

#define GROUP_SET 32
struct nccl_thread {
	int depth;          /* ncclGroupStart nesting */
	int admitted;       /* its top-level group counts in open_groups */
	int drain;          /* the drain let its group begin (one such group at a time) */
	int creates;        /* communicators queued for making in its group */
	int busy;           /* inside a real NCCL call a wrapper made */
	size_t nset;        /* communicators its open group touched */
	struct shim_nccl_rec *set[GROUP_SET];
	struct shim_nccl_rec **more; /* beyond GROUP_SET (rare) */
	size_t nmore, capmore;
};
static __thread struct nccl_thread self __attribute__((tls_model("initial-exec")));

int shim_nccl_busy(void)
{
	return self.busy > 0;
}

void shim_nccl_busy_add(int d)
{
	self.busy += d;
}

int shim_nccl_in_group(void)
{
	return self.depth > 0;
}

static void group_add(struct shim_nccl_rec *r)
{
	for (size_t i = 0; i < self.nset && i < GROUP_SET; i++)
		if (self.set[i] == r)
			return;
	for (size_t i = 0; i < self.nmore; i++)
		if (self.more[i] == r)
			return;
	if (self.nset < GROUP_SET) {
		self.set[self.nset++] = r;
		return;
	}
	if (self.nmore == self.capmore) {
		size_t cap = self.capmore ? 2 * self.capmore : 32;
		struct shim_nccl_rec **m = realloc(self.more, cap * sizeof(*m));
		if (m == NULL)
			return; /* not counted: the drain then sees counts that disagree and thaws */
		self.more = m;
		self.capmore = cap;
	}
	self.more[self.nmore++] = r;
}

/* ---- admission ---- */

/* Whether some live communicator is still below its drain target (lock held). */
static int any_below_target(void)
{
	for (size_t i = 0; i < SHIM_NCCL_MAX_COMMS; i++)
		if (recs[i].magic == SHIM_NCCL_MAGIC && recs[i].state == SHIM_NCCL_LIVE &&
		    atomic_load(&recs[i].count) < recs[i].target)
			return 1;
	return 0;
}

/* What a held call waits for: 1 when admitted (counted as it must be), -1 when the answer is an
 * error (the communicator failed), 0 to wait on. Lock held. */
static int may_go(enum shim_nccl_kind kind, struct shim_nccl_rec *r, int group)
{
	if (r != NULL && r->state == SHIM_NCCL_FAILED)
		return -1;
	int mode = atomic_load(&shim_nccl_hold.mode);
	if (mode == SHIM_NCCL_OPEN)
		return 1;
	if (mode != SHIM_NCCL_DRAINING)
		return 0;
	if (group)
		return !shim_nccl_hold.drain_group && any_below_target();
	/* A bare submission (a split on its parent too) up to the target; nothing else. */
	return (kind == SHIM_NCCL_K_COLL || kind == SHIM_NCCL_K_CREATE) && r != NULL && r->state == SHIM_NCCL_LIVE &&
	       atomic_load(&r->count) < r->target;
}

/* Takes what admission means for this call: a count, a group, a creation. */
static void take(enum shim_nccl_kind kind, struct shim_nccl_rec *r, int group)
{
	if (group) {
		atomic_fetch_add(&shim_nccl_hold.open_groups, 1);
		self.admitted = 1;
		return;
	}
	if (r != NULL && (kind == SHIM_NCCL_K_COLL || (kind == SHIM_NCCL_K_CREATE && r->state == SHIM_NCCL_LIVE)))
		atomic_fetch_add(&r->count, 1); /* a split counts on its parent */
	if (kind == SHIM_NCCL_K_CREATE)
		atomic_fetch_add(&shim_nccl_hold.creating, 1);
	atomic_fetch_add(&shim_nccl_hold.inflight, 1);
}

/* Admission of one call: the fast path, else a wait on the hold. -1: answer ncclRemoteError. */
static int admit(enum shim_nccl_kind kind, struct shim_nccl_rec *r, int group)
{
	atomic_fetch_add(&shim_nccl_hold.admitting, 1);
	if (atomic_load(&shim_nccl_hold.mode) == SHIM_NCCL_OPEN && (r == NULL || r->state != SHIM_NCCL_FAILED)) {
		take(kind, r, group);
		atomic_fetch_sub(&shim_nccl_hold.admitting, 1);
		return 1;
	}
	atomic_fetch_sub(&shim_nccl_hold.admitting, 1);
	shim_nccl_lock();
	int go;
	shim_nccl_hold.waiting++;
	if (r != NULL)
		r->waiters++;
	while ((go = may_go(kind, r, group)) == 0)
		pthread_cond_wait(&nccl_cond, &nccl_lock);
	if (r != NULL)
		r->waiters--;
	shim_nccl_hold.waiting--;
	if (go > 0) {
		take(kind, r, group);
		if (group && atomic_load(&shim_nccl_hold.mode) == SHIM_NCCL_DRAINING) {
			shim_nccl_hold.drain_group = 1;
			self.drain = 1;
		}
	}
	shim_nccl_unlock();
	return go;
}

/* After an admitted call: the drain and the freeze wait on these. */
static void done(enum shim_nccl_kind kind)
{
	if (kind == SHIM_NCCL_K_CREATE)
		atomic_fetch_sub(&shim_nccl_hold.creating, 1);
	atomic_fetch_sub(&shim_nccl_hold.inflight, 1);
	if (atomic_load(&shim_nccl_hold.mode) != SHIM_NCCL_OPEN) {
		shim_nccl_lock();
		shim_nccl_wake();
		shim_nccl_unlock();
	}
}

/* A collective on a stream being captured into a CUDA graph: the graph would keep launching
 * into the communicator's memory after a rebuild replaced it. Only looked at while a capture
 * runs somewhere in the process (one atomic load otherwise). */
static void graph_check(struct shim_nccl_rec *r, cudaStream_t stream)
{
	if (!shim_cuda_capturing())
		return;
	CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
	if (shim_cu.cuStreamIsCapturing((CUstream)stream, &st) == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE) {
		shim_nccl_lock();
		r->unsup |= SHIM_NCCL_U_GRAPH;
		shim_nccl_unlock();
	}
}

ncclResult_t shim_nccl_enter(struct shim_nccl_call *c, unsigned id, int variant, ncclComm_t comm, cudaStream_t stream,
			     enum shim_nccl_kind kind)
{
	*c = (struct shim_nccl_call){ .real = comm, .kind = kind, .fn = shim_nccl_real(id, variant) };
	if (c->fn == NULL)
		return ncclSystemError; /* no NCCL behind the application's call: never a NULL call */
	if (!shim_nccl_enabled() || self.busy > 0)
		return ncclSuccess; /* NCCL calling its own public names: as it came */
	struct shim_nccl_rec *r = shim_nccl_rec_of(comm);
	if (r == NULL && (comm != NULL || kind != SHIM_NCCL_K_CREATE))
		return ncclSuccess; /* not ours: a communicator NCCL passes to its own functions */
	c->rec = r;
	if (kind == SHIM_NCCL_K_CREATE)
		shim_nccl_poke_before_create(); /* the listeners NCCL did not make */
	if (self.depth > 0 && (kind == SHIM_NCCL_K_COLL || kind == SHIM_NCCL_K_CREATE)) {
		/* Inside a group begun while admitted: counted at its end, never held half-way; a
		 * creation there is made at the end too. */
		if (r != NULL && r->state == SHIM_NCCL_FAILED)
			return ncclRemoteError;
		if (r != NULL)
			group_add(r);
		if (kind == SHIM_NCCL_K_CREATE)
			self.creates++;
		atomic_fetch_add(&shim_nccl_hold.inflight, 1);
		c->kind = SHIM_NCCL_K_USE; /* exit: no creation to count down */
	} else if (admit(kind, r, 0) < 0) {
		return ncclRemoteError;
	}
	c->admitted = 1;
	if (kind == SHIM_NCCL_K_COLL && r != NULL && stream != NULL)
		graph_check(r, stream);
	if (r != NULL)
		c->real = r->real;
	self.busy++;
	return ncclSuccess;
}

ncclResult_t shim_nccl_exit(struct shim_nccl_call *c, ncclResult_t r)
{
	if (c->admitted) {
		self.busy--;
		done(c->kind);
	}
	if (c->rec != NULL && r != ncclSuccess && r != ncclInProgress)
		c->rec->sticky = r;
	return r;
}

ncclResult_t shim_nccl_group_start(int variant)
{
	__typeof__(&ncclGroupStart) real = SHIM_NCCL_REAL(ncclGroupStart, variant);
	if (real == NULL)
		return ncclSystemError;
	if (!shim_nccl_enabled() || self.busy > 0)
		return real();
	if (self.depth++ == 0 && admit(SHIM_NCCL_K_COLL, NULL, 1) < 0) {
		self.depth--;
		return ncclRemoteError;
	}
	ncclResult_t r = real();
	if (r != ncclSuccess && --self.depth == 0 && self.admitted) {
		self.admitted = 0;
		atomic_fetch_sub(&shim_nccl_hold.open_groups, 1);
		shim_nccl_lock();
		if (self.drain)
			shim_nccl_hold.drain_group = self.drain = 0;
		shim_nccl_wake();
		shim_nccl_unlock();
	}
	return r;
}

ncclResult_t shim_nccl_group_end(int variant, int simulate, ncclSimInfo_t *info)
{
	__typeof__(&ncclGroupEnd) real = SHIM_NCCL_REAL(ncclGroupEnd, variant);
	__typeof__(&ncclGroupSimulateEnd) sim = SHIM_NCCL_REAL(ncclGroupSimulateEnd, variant);
	if (simulate ? sim == NULL : real == NULL)
		return ncclSystemError;
	if (!shim_nccl_enabled() || self.busy > 0 || self.depth == 0 || --self.depth > 0)
		return simulate ? sim(info) : real();
	/* The outermost end: the group's counts are final before it stops counting as open, so a
	 * freeze that waits for open groups reads them whole. A simulated end launches nothing. */
	for (size_t i = 0; !simulate && i < self.nset; i++)
		atomic_fetch_add(&self.set[i]->count, 1);
	for (size_t i = 0; !simulate && i < self.nmore; i++)
		atomic_fetch_add(&self.more[i]->count, 1);
	int creates = self.creates;
	if (creates > 0)
		atomic_fetch_add(&shim_nccl_hold.creating, 1);
	atomic_fetch_add(&shim_nccl_hold.inflight, 1);
	if (self.admitted) {
		self.admitted = 0;
		atomic_fetch_sub(&shim_nccl_hold.open_groups, 1);
		if (self.drain || atomic_load(&shim_nccl_hold.mode) != SHIM_NCCL_OPEN) {
			shim_nccl_lock();
			shim_nccl_hold.drain_group = self.drain = 0;
			shim_nccl_wake();
			shim_nccl_unlock();
		}
	}
	self.nset = self.nmore = 0;
	self.creates = 0;
	self.busy++;
	ncclResult_t r = simulate ? sim(info) : real();
	self.busy--;
	done(creates > 0 ? SHIM_NCCL_K_CREATE : SHIM_NCCL_K_USE);
	return r;
}
