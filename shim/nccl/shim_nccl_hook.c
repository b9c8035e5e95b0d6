/* shim_nccl_hook: the NCCL wrappers: generated for submissions and uses (shim_nccl_hooks.def),
 * written here for what makes, destroys, registers on or describes a communicator, and the rows
 * of the NCCL hook table. Every wrapper passes a handle that is not the shim's straight through:
 * NCCL calls its own public names (ncclBcast calls ncclBroadcast, ncclCommAbort calls
 * ncclCommGetAsyncError) with its real communicators, and those calls land here too. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gcr_log.h"
#include "shim_hooktab.h"
#include "shim_nccl.h"
#include "shim_cuda_real.h"
#include "shim_real.h"

/* The profiling twins are declared with the plain prototype, so their wrappers are checked too. */
#define SHIM_NCCL_DECL_P(sym) extern __typeof__(sym) p##sym;
#define SHIM_NCCL_DECL_NONE(sym)
#define SHIM_NCCL_COLL(sym, var, since, params, args) SHIM_NCCL_DECL_##var(sym)
#define SHIM_NCCL_USE(sym, var, since, params, args) SHIM_NCCL_DECL_##var(sym)
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params) SHIM_NCCL_DECL_##var(sym)
SHIM_NCCL_COLL_LIST SHIM_NCCL_USE_LIST SHIM_NCCL_CUSTOM_LIST
#undef SHIM_NCCL_COLL
#undef SHIM_NCCL_USE
#undef SHIM_NCCL_CUSTOM

/* The hand-written wrappers' prototypes (shim_nccl_abi.h) are the list's (which
 * tests/unit/test_nccl_abi.c checks against a real nccl.h). */
#define SHIM_NCCL_COLL(sym, var, since, params, args)
#define SHIM_NCCL_USE(sym, var, since, params, args)
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(sym), ret params), #sym " differs from its list entry");
SHIM_NCCL_CUSTOM_LIST
#undef SHIM_NCCL_COLL
#undef SHIM_NCCL_USE
#undef SHIM_NCCL_CUSTOM

/* ---- generated: map "comm", wait for admission, call the real function of the same name ---- */
#define SHIM_NCCL_BODY(sym, v, kind, strm, args)                                                  \
	{                                                                                        \
		SHIM_NCCL_NOTE_CALLER();                                                         \
		struct shim_nccl_call call_;                                                     \
		ncclResult_t r_ = shim_nccl_enter(&call_, SHIM_NCCL_HOOK_##sym, (v), comm, (strm), (kind)); \
		if (r_ != ncclSuccess)                                                           \
			return r_;                                                               \
		comm = call_.real;                                                               \
		return shim_nccl_exit(&call_, ((__typeof__(&sym))call_.fn) args);                \
	}
#define SHIM_NCCL_TWIN_P(sym, params, body) SHIM_EXPORT ncclResult_t p##sym params body
#define SHIM_NCCL_TWIN_NONE(sym, params, body)
#define SHIM_NCCL_COLL(sym, var, since, params, args)                                              \
	SHIM_EXPORT ncclResult_t sym params SHIM_NCCL_BODY(sym, 0, SHIM_NCCL_K_COLL, stream, args) \
	SHIM_NCCL_TWIN_##var(sym, params, SHIM_NCCL_BODY(sym, 1, SHIM_NCCL_K_COLL, stream, args))
#define SHIM_NCCL_USE(sym, var, since, params, args)                                             \
	SHIM_EXPORT ncclResult_t sym params SHIM_NCCL_BODY(sym, 0, SHIM_NCCL_K_USE, NULL, args) \
	SHIM_NCCL_TWIN_##var(sym, params, SHIM_NCCL_BODY(sym, 1, SHIM_NCCL_K_USE, NULL, args))
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params)
SHIM_NCCL_COLL_LIST SHIM_NCCL_USE_LIST
#undef SHIM_NCCL_COLL
#undef SHIM_NCCL_USE
#undef SHIM_NCCL_CUSTOM

/* ---- creation: the application gets a record's address as its communicator ---- */

/* Communicators the shim could not record (its table full): they pass through unmapped, and a
 * group suspend refuses while any lives. */
_Atomic int shim_nccl_unmanaged;

static void where(struct shim_nccl_rec *r)
{
	CUdevice d = -1;
	if (shim_real_handle(SHIM_CUDA) == NULL)
		return;
	if (shim_cu.cuCtxGetCurrent(&r->ctx) != CUDA_SUCCESS)
		r->ctx = NULL;
	if (r->ctx != NULL && shim_cu.cuCtxGetDevice(&d) == CUDA_SUCCESS)
		r->device = (int)d;
}

/* rank and size from NCCL once the communicator is made (a split, a group's or a non-blocking
 * creation learns them only then). */
static void fill_ranks(struct shim_nccl_rec *r)
{
	__typeof__(&ncclCommCount) cnt = SHIM_NCCL_REAL(ncclCommCount, 0);
	__typeof__(&ncclCommUserRank) urank = SHIM_NCCL_REAL(ncclCommUserRank, 0);
	__typeof__(&ncclCommGetAsyncError) gae = SHIM_NCCL_REAL(ncclCommGetAsyncError, 0);
	ncclResult_t st = ncclSuccess;
	int n = 0, rank = -1;
	if (r->nranks > 0 || r->real == NULL || cnt == NULL || urank == NULL || gae == NULL)
		return;
	shim_nccl_busy_add(1);
	if (gae(r->real, &st) == ncclSuccess && st == ncclSuccess && cnt(r->real, &n) == ncclSuccess &&
	    urank(r->real, &rank) == ncclSuccess && n > 0 && rank >= 0 && rank < n) {
		r->rank = rank;
		r->nranks = n;
	}
	shim_nccl_busy_add(-1);
}

/* A record for a communicator NCCL just made (real); *out gets the application's handle. */
static struct shim_nccl_rec *record(ncclComm_t real, ncclComm_t *out)
{
	shim_nccl_lock();
	struct shim_nccl_rec *r = shim_nccl_rec_new();
	if (r == NULL) {
		shim_nccl_unlock();
		atomic_fetch_add(&shim_nccl_unmanaged, 1);
		GCR_LOG(GCR_LOG_WARN, "shim", "more than %d NCCL communicators: this one passes through unmapped, and "
			"the process cannot be suspended while it lives", SHIM_NCCL_MAX_COMMS);
		*out = real;
		return NULL;
	}
	r->real = real;
	r->state = SHIM_NCCL_LIVE;
	where(r);
	*out = (ncclComm_t)r;
	return r; /* the caller fills the rest, then unlocks */
}

static ncclResult_t init_one(unsigned id, int v, ncclComm_t *comm, int nranks, const ncclUniqueId *ids, int nid,
			     int rank, ncclConfig_t *config, int with_config)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, id, v, NULL, NULL, SHIM_NCCL_K_CREATE);
	if (nr != ncclSuccess)
		return nr;
	ncclComm_t real = NULL;
	if (id == SHIM_NCCL_HOOK_ncclCommInitRankScalable)
		nr = ((__typeof__(&ncclCommInitRankScalable))c.fn)(&real, nranks, rank, nid, (ncclUniqueId *)ids, config);
	else if (with_config)
		nr = ((__typeof__(&ncclCommInitRankConfig))c.fn)(&real, nranks, ids[0], rank, config);
	else
		nr = ((__typeof__(&ncclCommInitRank))c.fn)(&real, nranks, ids[0], rank);
	if (comm == NULL || !c.admitted || real == NULL || (nr != ncclSuccess && nr != ncclInProgress)) {
		if (comm != NULL)
			*comm = real;
		return shim_nccl_exit(&c, nr);
	}
	struct shim_nccl_rec *r = record(real, comm);
	if (r != NULL) {
		r->how = GCR_GROUP_HOW_INIT;
		r->key = shim_nccl_key_init(ids, nid);
		r->id = ids[0];
		r->rank = rank;
		r->nranks = nranks;
		shim_nccl_rec_config(r, config, NULL);
		shim_nccl_unlock();
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
						ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_one(SHIM_NCCL_HOOK_ncclCommInitRankConfig, 0, comm, nranks, &commId, 1, rank, config, 1);
}

SHIM_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
						 ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_one(SHIM_NCCL_HOOK_ncclCommInitRankConfig, 1, comm, nranks, &commId, 1, rank, config, 1);
}

SHIM_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_one(SHIM_NCCL_HOOK_ncclCommInitRank, 0, comm, nranks, &commId, 1, rank, NULL, 0);
}

SHIM_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_one(SHIM_NCCL_HOOK_ncclCommInitRank, 1, comm, nranks, &commId, 1, rank, NULL, 0);
}

static ncclResult_t init_scalable(int v, ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds,
				  ncclConfig_t *config)
{
	if (nId < 1 || commIds == NULL) {
		__typeof__(&ncclCommInitRankScalable) fn = SHIM_NCCL_REAL(ncclCommInitRankScalable, v);
		return fn != NULL ? fn(newcomm, nranks, myrank, nId, commIds, config) : ncclSystemError;
	}
	return init_one(SHIM_NCCL_HOOK_ncclCommInitRankScalable, v, newcomm, nranks, commIds, nId, myrank, config, 1);
}

SHIM_EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
						  ncclUniqueId *commIds, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_scalable(0, newcomm, nranks, myrank, nId, commIds, config);
}

SHIM_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
						   ncclUniqueId *commIds, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_scalable(1, newcomm, nranks, myrank, nId, commIds, config);
}

/* ncclCommInitAll: every rank in this process; made again by the same call at resume. */
static ncclResult_t init_all(int v, ncclComm_t *comm, int ndev, const int *devlist)
{
	static uint64_t calls;
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommInitAll, v, NULL, NULL, SHIM_NCCL_K_CREATE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclCommInitAll))c.fn)(comm, ndev, devlist);
	if (!c.admitted || nr != ncclSuccess || comm == NULL || ndev <= 0)
		return shim_nccl_exit(&c, nr);
	if (ndev > 64) {
		atomic_fetch_add(&shim_nccl_unmanaged, ndev);
		return shim_nccl_exit(&c, nr); /* unmapped: more devices than a record keeps */
	}
	uint64_t group = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
	for (int i = 0; i < ndev; i++) {
		struct shim_nccl_rec *r = record(comm[i], &comm[i]);
		if (r == NULL)
			continue;
		/* One communicator, all its ranks here: one key, a record per rank. */
		pid_t pid = getpid();
		uint64_t key = 0xcbf29ce484222325ull ^ (uint64_t)pid;
		key = key * 0x100000001b3ull ^ group;
		r->how = GCR_GROUP_HOW_LOCAL;
		r->key = key != 0 ? key : 1;
		r->rank = i;
		r->nranks = ndev;
		r->device = devlist != NULL ? devlist[i] : i;
		r->local_group = group;
		r->local_index = i;
		r->local_n = ndev;
		for (int k = 0; k < ndev; k++)
			r->local_devs[k] = devlist != NULL ? devlist[k] : k;
		shim_nccl_unlock();
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_all(0, comm, ndev, devlist);
}

SHIM_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
	SHIM_NCCL_NOTE_CALLER();
	return init_all(1, comm, ndev, devlist);
}

/* A split is a submission on its parent (every rank of the parent takes part, in the same
 * order) and makes a communicator named by the parent's key, split number and colour. A rank
 * that takes part with NCCL_SPLIT_NOCOLOR gets no communicator but must take part again when
 * the parent is rebuilt: it keeps a record without a handle. */
static ncclResult_t split(int v, unsigned id, ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
			  ncclConfig_t *config, int *excl, int nexcl, int flags)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, id, v, comm, NULL, SHIM_NCCL_K_CREATE);
	if (nr != ncclSuccess)
		return nr;
	ncclComm_t real = NULL;
	if (id == SHIM_NCCL_HOOK_ncclCommShrink)
		nr = ((__typeof__(&ncclCommShrink))c.fn)(c.real, excl, nexcl, &real, config, flags);
	else
		nr = ((__typeof__(&ncclCommSplit))c.fn)(c.real, color, key, &real, config);
	if (newcomm == NULL || c.rec == NULL || (nr != ncclSuccess && nr != ncclInProgress)) {
		if (newcomm != NULL)
			*newcomm = real;
		return shim_nccl_exit(&c, nr);
	}
	struct shim_nccl_rec *p = c.rec;
	int nocolor = id == SHIM_NCCL_HOOK_ncclCommSplit && color == NCCL_SPLIT_NOCOLOR;
	if (real == NULL && !nocolor) {
		*newcomm = NULL;
		return shim_nccl_exit(&c, nr);
	}
	ncclComm_t handle = NULL;
	struct shim_nccl_rec *r = record(real, &handle);
	if (r != NULL) {
		r->how = GCR_GROUP_HOW_SPLIT;
		r->parent = p;
		p->children++;
		r->split_seq = p->next_split++;
		r->color = id == SHIM_NCCL_HOOK_ncclCommShrink ? -2 : color;
		r->split_key = key;
		r->key = shim_nccl_key_split(p->key, r->split_seq, r->color);
		r->nocolor = nocolor;
		if (id == SHIM_NCCL_HOOK_ncclCommShrink)
			r->unsup |= SHIM_NCCL_U_SHRINK;
		shim_nccl_rec_config(r, config, p);
		if (nocolor)
			handle = NULL;
		shim_nccl_unlock();
		if (nr == ncclSuccess && !nocolor && !shim_nccl_in_group())
			fill_ranks(r);
	}
	*newcomm = handle;
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return split(0, SHIM_NCCL_HOOK_ncclCommSplit, comm, color, key, newcomm, config, NULL, 0, 0);
}

SHIM_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return split(1, SHIM_NCCL_HOOK_ncclCommSplit, comm, color, key, newcomm, config, NULL, 0, 0);
}

SHIM_EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
					ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return split(0, SHIM_NCCL_HOOK_ncclCommShrink, comm, 0, 0, newcomm, config, excludeRanksList,
		     excludeRanksCount, shrinkFlags);
}

SHIM_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
					 ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return split(1, SHIM_NCCL_HOOK_ncclCommShrink, comm, 0, 0, newcomm, config, excludeRanksList,
		     excludeRanksCount, shrinkFlags);
}

/* ncclCommGrow: new ranks come in with comm NULL; the shim cannot replay a grow, so the result
 * only stops a suspend. */
static ncclResult_t grow(int v, ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
			 ncclComm_t *newcomm, ncclConfig_t *config)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommGrow, v, comm, NULL, SHIM_NCCL_K_CREATE);
	if (nr != ncclSuccess)
		return nr;
	ncclComm_t real = NULL;
	nr = ((__typeof__(&ncclCommGrow))c.fn)(c.real, nRanks, uniqueId, rank, &real, config);
	if (newcomm == NULL || !c.admitted || real == NULL || (nr != ncclSuccess && nr != ncclInProgress)) {
		if (newcomm != NULL)
			*newcomm = real;
		return shim_nccl_exit(&c, nr);
	}
	struct shim_nccl_rec *r = record(real, newcomm);
	if (r != NULL) {
		r->how = GCR_GROUP_HOW_INIT;
		r->unsup |= SHIM_NCCL_U_SHRINK;
		r->key = uniqueId != NULL ? shim_nccl_key_init(uniqueId, 1) : shim_nccl_key_split(c.rec ? c.rec->key : 1, 0, -3);
		shim_nccl_rec_config(r, config, c.rec);
		shim_nccl_unlock();
		if (nr == ncclSuccess)
			fill_ranks(r);
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
				      ncclComm_t *newcomm, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return grow(0, comm, nRanks, uniqueId, rank, newcomm, config);
}

SHIM_EXPORT ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
				       ncclComm_t *newcomm, ncclConfig_t *config)
{
	SHIM_NCCL_NOTE_CALLER();
	return grow(1, comm, nRanks, uniqueId, rank, newcomm, config);
}

/* ---- destruction ---- */

/* Destroy and abort: the record goes (kept while a split still names it as parent). A failed
 * communicator has nothing behind it to destroy. */
static ncclResult_t destroy(unsigned id, int v, ncclComm_t comm)
{
	struct shim_nccl_rec *r = shim_nccl_enabled() && !shim_nccl_busy() ? shim_nccl_rec_of(comm) : NULL;
	if (r != NULL && r->state == SHIM_NCCL_FAILED) {
		shim_nccl_lock();
		if (r->children > 0)
			r->app_gone = 1;
		else
			shim_nccl_rec_free(r);
		shim_nccl_unlock();
		return ncclSuccess;
	}
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, id, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclCommDestroy))c.fn)(c.real);
	if (c.rec != NULL && (nr == ncclSuccess || nr == ncclInProgress)) {
		shim_nccl_lock();
		c.rec->real = NULL;
		if (c.rec->children > 0)
			c.rec->app_gone = 1;
		else
			shim_nccl_rec_free(c.rec);
		shim_nccl_unlock();
		c.rec = NULL; /* gone: exit keeps no error on it */
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return destroy(SHIM_NCCL_HOOK_ncclCommDestroy, 0, comm);
}

SHIM_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return destroy(SHIM_NCCL_HOOK_ncclCommDestroy, 1, comm);
}

SHIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return destroy(SHIM_NCCL_HOOK_ncclCommAbort, 0, comm);
}

SHIM_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return destroy(SHIM_NCCL_HOOK_ncclCommAbort, 1, comm);
}

static ncclResult_t comm_revoke(int v, ncclComm_t comm, int flags)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommRevoke, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclCommRevoke))c.fn)(c.real, flags);
	if (c.rec != NULL && nr == ncclSuccess) {
		shim_nccl_lock();
		c.rec->unsup |= SHIM_NCCL_U_REVOKED;
		shim_nccl_unlock();
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return comm_revoke(0, comm, revokeFlags);
}

SHIM_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return comm_revoke(1, comm, revokeFlags);
}

/* ---- queries: from the record while the process is held (the communicator may be torn
 * down), so a watchdog polling them sees no error; from NCCL otherwise ---- */

/* 1: forward to NCCL with r->real (counted as a call in flight: a teardown waits for it); 0:
 * answer from the record. */
static int query_live(struct shim_nccl_rec *r)
{
	atomic_fetch_add(&shim_nccl_hold.admitting, 1);
	int live = atomic_load(&shim_nccl_hold.mode) == SHIM_NCCL_OPEN && r->state == SHIM_NCCL_LIVE && r->real != NULL;
	if (live)
		atomic_fetch_add(&shim_nccl_hold.inflight, 1);
	atomic_fetch_sub(&shim_nccl_hold.admitting, 1);
	if (live)
		shim_nccl_busy_add(1);
	return live;
}

static void query_done(void)
{
	shim_nccl_busy_add(-1);
	atomic_fetch_sub(&shim_nccl_hold.inflight, 1);
	if (atomic_load(&shim_nccl_hold.mode) != SHIM_NCCL_OPEN) {
		shim_nccl_lock();
		shim_nccl_wake();
		shim_nccl_unlock();
	}
}

static ncclResult_t get_async_error(int v, ncclComm_t comm, ncclResult_t *asyncError)
{
	__typeof__(&ncclCommGetAsyncError) fn = SHIM_NCCL_REAL(ncclCommGetAsyncError, v);
	if (fn == NULL)
		return ncclSystemError;
	struct shim_nccl_rec *r = shim_nccl_enabled() && !shim_nccl_busy() ? shim_nccl_rec_of(comm) : NULL;
	if (r == NULL)
		return fn(comm, asyncError);
	if (asyncError == NULL)
		return ncclInvalidArgument;
	if (r->state == SHIM_NCCL_FAILED) {
		*asyncError = ncclRemoteError;
		return ncclSuccess;
	}
	if (!query_live(r)) {
		*asyncError = r->sticky;
		return ncclSuccess;
	}
	ncclResult_t nr = fn(r->real, asyncError);
	query_done();
	if (nr == ncclSuccess && *asyncError != ncclSuccess && *asyncError != ncclInProgress)
		r->sticky = *asyncError;
	return nr;
}

SHIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	SHIM_NCCL_NOTE_CALLER();
	return get_async_error(0, comm, asyncError);
}

SHIM_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
	SHIM_NCCL_NOTE_CALLER();
	return get_async_error(1, comm, asyncError);
}

static const char *last_error(int v, ncclComm_t comm)
{
	__typeof__(&ncclGetLastError) fn = SHIM_NCCL_REAL(ncclGetLastError, v);
	struct shim_nccl_rec *r = shim_nccl_enabled() && !shim_nccl_busy() ? shim_nccl_rec_of(comm) : NULL;
	if (r == NULL)
		return fn != NULL ? fn(comm) : "";
	if (fn == NULL || !query_live(r))
		return r->errmsg;
	const char *s = fn(r->real);
	query_done();
	return s;
}

SHIM_EXPORT const char *ncclGetLastError(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return last_error(0, comm);
}

SHIM_EXPORT const char *pncclGetLastError(ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return last_error(1, comm);
}

/* Count, rank and device: from the record once known; asked of NCCL while it is not. */
enum which { COUNT, RANK, DEVICE };

static ncclResult_t describe_one(unsigned id, int v, const ncclComm_t comm, int *out, enum which w)
{
	__typeof__(&ncclCommCount) fn = (__typeof__(&ncclCommCount))shim_nccl_real(id, v);
	if (fn == NULL)
		return ncclSystemError;
	struct shim_nccl_rec *r = shim_nccl_enabled() && !shim_nccl_busy() ? shim_nccl_rec_of(comm) : NULL;
	if (r == NULL)
		return fn(comm, out);
	if (out == NULL)
		return ncclInvalidArgument;
	if (r->nranks <= 0 && query_live(r)) {
		fill_ranks(r);
		query_done();
	}
	if (w == DEVICE && r->device >= 0) {
		*out = r->device;
		return ncclSuccess;
	}
	if (w != DEVICE && r->nranks > 0) {
		*out = w == COUNT ? r->nranks : r->rank;
		return ncclSuccess;
	}
	if (!query_live(r))
		return r->state == SHIM_NCCL_FAILED ? ncclRemoteError : ncclInvalidUsage;
	ncclResult_t nr = fn(r->real, out);
	query_done();
	return nr;
}

SHIM_EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommCount, 0, comm, count, COUNT);
}

SHIM_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int *count)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommCount, 1, comm, count, COUNT);
}

SHIM_EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommUserRank, 0, comm, rank, RANK);
}

SHIM_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommUserRank, 1, comm, rank, RANK);
}

SHIM_EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommCuDevice, 0, comm, device, DEVICE);
}

SHIM_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device)
{
	SHIM_NCCL_NOTE_CALLER();
	return describe_one(SHIM_NCCL_HOOK_ncclCommCuDevice, 1, comm, device, DEVICE);
}

/* ---- registrations, windows, reduction ops, device communicators ---- */

struct shim_nccl_reg *shim_nccl_reg_new(struct shim_nccl_rec *r, void *buff, size_t size, void *real);
void shim_nccl_reg_free(struct shim_nccl_reg *g);

static ncclResult_t reg(int v, const ncclComm_t comm, void *buff, size_t size, void **handle)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommRegister, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	void *real = NULL;
	nr = ((__typeof__(&ncclCommRegister))c.fn)(c.real, buff, size, &real);
	if (handle != NULL)
		*handle = real;
	if (c.rec != NULL && nr == ncclSuccess && handle != NULL) {
		shim_nccl_lock();
		struct shim_nccl_reg *g = shim_nccl_reg_new(c.rec, buff, size, real);
		shim_nccl_unlock();
		if (g != NULL)
			*handle = g; /* else the real handle: deregistered as it came */
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
	SHIM_NCCL_NOTE_CALLER();
	return reg(0, comm, buff, size, handle);
}

SHIM_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
	SHIM_NCCL_NOTE_CALLER();
	return reg(1, comm, buff, size, handle);
}

static ncclResult_t dereg(int v, const ncclComm_t comm, void *handle)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommDeregister, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	struct shim_nccl_reg *g = NULL;
	if (c.rec != NULL) {
		shim_nccl_lock();
		g = shim_nccl_reg_of(handle);
		shim_nccl_unlock();
	}
	void *real = g != NULL ? g->real : handle;
	nr = real != NULL ? ((__typeof__(&ncclCommDeregister))c.fn)(c.real, real) : ncclSuccess;
	if (g != NULL && nr == ncclSuccess) {
		shim_nccl_lock();
		shim_nccl_reg_free(g);
		shim_nccl_unlock();
	}
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle)
{
	SHIM_NCCL_NOTE_CALLER();
	return dereg(0, comm, handle);
}

SHIM_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
	SHIM_NCCL_NOTE_CALLER();
	return dereg(1, comm, handle);
}

/* What lives on a communicator and cannot be made again: counted, so a suspend refuses while
 * any lives. */
static void tally(struct shim_nccl_rec *r, int *field, int d)
{
	if (r == NULL)
		return;
	shim_nccl_lock();
	if (*field + d >= 0)
		*field += d;
	shim_nccl_unlock();
}

static ncclResult_t win_reg(int v, ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int flags)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommWindowRegister, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclCommWindowRegister))c.fn)(c.real, buff, size, win, flags);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->windows, 1);
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return win_reg(0, comm, buff, size, win, winFlags);
}

SHIM_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
						 int winFlags)
{
	SHIM_NCCL_NOTE_CALLER();
	return win_reg(1, comm, buff, size, win, winFlags);
}

static ncclResult_t win_dereg(int v, ncclComm_t comm, ncclWindow_t win)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclCommWindowDeregister, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclCommWindowDeregister))c.fn)(c.real, win);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->windows, -1);
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
	SHIM_NCCL_NOTE_CALLER();
	return win_dereg(0, comm, win);
}

SHIM_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
	SHIM_NCCL_NOTE_CALLER();
	return win_dereg(1, comm, win);
}

static ncclResult_t redop_create(int v, ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
				 ncclScalarResidence_t residence, ncclComm_t comm)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclRedOpCreatePreMulSum, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclRedOpCreatePreMulSum))c.fn)(op, scalar, datatype, residence, c.real);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->redops, 1);
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
						  ncclScalarResidence_t residence, ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return redop_create(0, op, scalar, datatype, residence, comm);
}

SHIM_EXPORT ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
						   ncclScalarResidence_t residence, ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return redop_create(1, op, scalar, datatype, residence, comm);
}

static ncclResult_t redop_destroy(int v, ncclRedOp_t op, ncclComm_t comm)
{
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclRedOpDestroy, v, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclRedOpDestroy))c.fn)(op, c.real);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->redops, -1);
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return redop_destroy(0, op, comm);
}

SHIM_EXPORT ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
	SHIM_NCCL_NOTE_CALLER();
	return redop_destroy(1, op, comm);
}

SHIM_EXPORT ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const *reqs,
					   ncclDevComm_t *outDevComm)
{
	SHIM_NCCL_NOTE_CALLER();
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclDevCommCreate, 0, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclDevCommCreate))c.fn)(c.real, reqs, outDevComm);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->devcomms, 1);
	return shim_nccl_exit(&c, nr);
}

SHIM_EXPORT ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const *devComm)
{
	SHIM_NCCL_NOTE_CALLER();
	struct shim_nccl_call c;
	ncclResult_t nr = shim_nccl_enter(&c, SHIM_NCCL_HOOK_ncclDevCommDestroy, 0, comm, NULL, SHIM_NCCL_K_USE);
	if (nr != ncclSuccess)
		return nr;
	nr = ((__typeof__(&ncclDevCommDestroy))c.fn)(c.real, devComm);
	if (nr == ncclSuccess && c.rec != NULL)
		tally(c.rec, &c.rec->devcomms, -1);
	return shim_nccl_exit(&c, nr);
}

/* ---- groups ---- */

SHIM_EXPORT ncclResult_t ncclGroupStart(void)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_start(0);
}

SHIM_EXPORT ncclResult_t pncclGroupStart(void)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_start(1);
}

SHIM_EXPORT ncclResult_t ncclGroupEnd(void)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_end(0, 0, NULL);
}

SHIM_EXPORT ncclResult_t pncclGroupEnd(void)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_end(1, 0, NULL);
}

SHIM_EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_end(0, 1, simInfo);
}

SHIM_EXPORT ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
	SHIM_NCCL_NOTE_CALLER();
	return shim_nccl_group_end(1, 1, simInfo);
}

/* ---- the table ---- */
#define SHIM_NCCL_NAME_P(sym) "p" #sym
#define SHIM_NCCL_NAME_NONE(sym) NULL
#define SHIM_NCCL_WRAP_P(sym) (void *)&p##sym
#define SHIM_NCCL_WRAP_NONE(sym) NULL
#define SHIM_NCCL_ROW(sym, var) \
	[SHIM_NCCL_HOOK_##sym] = { { #sym, SHIM_NCCL_NAME_##var(sym) }, { (void *)&sym, SHIM_NCCL_WRAP_##var(sym) }, { NULL, NULL } },
#define SHIM_NCCL_COLL(sym, var, since, params, args) SHIM_NCCL_ROW(sym, var)
#define SHIM_NCCL_USE(sym, var, since, params, args) SHIM_NCCL_ROW(sym, var)
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params) SHIM_NCCL_ROW(sym, var)
struct shim_nccl_hook shim_nccl_hooks[SHIM_NCCL_HOOK_COUNT] = { SHIM_NCCL_COLL_LIST SHIM_NCCL_USE_LIST
									 SHIM_NCCL_CUSTOM_LIST };
#undef SHIM_NCCL_COLL
#undef SHIM_NCCL_USE
#undef SHIM_NCCL_CUSTOM
