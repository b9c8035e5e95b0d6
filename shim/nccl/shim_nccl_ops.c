/* shim_nccl_ops: what a group suspend and resume do to NCCL (struct shim_comm_ops): freeze and
 * drain the submissions, tear the communicators down (ncclCommAbort: local, so no member waits
 * for another, and it frees the memory NCCL exported to and imported from its peers), fresh
 * unique ids, and the rebuild, in the order the application made its communicators. Every wait
 * here has a deadline; the one NCCL call that cannot be bounded from outside (a blocking
 * ncclCommInitRank whose peer hangs) runs in a thread of its own, so the caller returns at its
 * deadline and learns the end later. */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcr_log.h"
#include "gcr_time.h"
#include "shim_comm.h"
#include "shim_cuda_real.h"
#include "shim_nccl.h"
#include "shim_nccl_poke.h"
#include "shim_real.h"

/* Registrations are made again after a rebuild (shim_nccl.c owns the list). */
struct shim_nccl_reg *shim_nccl_reg_next(struct shim_nccl_reg *g);

static void key_str(uint64_t key, char *out)
{
	gcr_groupmsg_key_fmt(key, out);
}

static const char *nccl_err(ncclResult_t r)
{
	return shim_nccl_lib.GetErrorString != NULL ? shim_nccl_lib.GetErrorString(r) : "NCCL error";
}

static void pause_us(long us)
{
	struct timespec ts = { 0, us * 1000 };
	nanosleep(&ts, NULL);
}

static void nccl_counts(int *live, int *down, int *failed, int *held)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	*live = *down = *failed = *held = 0;
	shim_nccl_lock();
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	for (size_t i = 0; i < n; i++) {
		const struct shim_nccl_rec *r = all[i];
		if (r->nocolor)
			continue; /* a split this process only took part in */
		if (r->state == SHIM_NCCL_FAILED)
			(*failed)++;
		else if (r->state == SHIM_NCCL_LIVE && r->real != NULL)
			(*live)++;
		else if (r->state == SHIM_NCCL_DOWN && !r->app_gone)
			(*down)++;
	}
	*held = shim_nccl_hold.waiting;
	shim_nccl_unlock();
}

/* Every record a peer may need to know: not the NOCOLOR placeholders (replayed from their
 * parent), the application's destroyed parents included (their children are split from them). */
static void describe_locked(struct gcr_group_comms *out)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	out->n = 0;
	for (size_t i = 0; i < n && out->n < GCR_GROUP_MAX_COMMS; i++) {
		const struct shim_nccl_rec *r = all[i];
		if (r->nocolor || r->nranks <= 0)
			continue;
		enum gcr_group_comm_state st = r->state == SHIM_NCCL_FAILED			       ? GCR_GROUP_COMM_FAILED
					       : r->state == SHIM_NCCL_LIVE && r->real != NULL ? GCR_GROUP_COMM_LIVE
											       : GCR_GROUP_COMM_DOWN;
		long long count = atomic_load(&r->count);
		out->c[out->n++] = (struct gcr_group_comm){
			.key = r->key, .parent = r->parent != NULL ? r->parent->key : 0, .count = count,
			.rank = r->rank, .nranks = r->nranks, .device = r->device, .state = st, .how = r->how };
	}
}

static void nccl_describe(struct gcr_group_comms *out)
{
	shim_nccl_lock();
	describe_locked(out);
	shim_nccl_unlock();
}

static const char *unsup_what(unsigned u)
{
	if (u & SHIM_NCCL_U_WINDOW)
		return "a memory window is registered on it (ncclCommWindowRegister)";
	if (u & SHIM_NCCL_U_DEVCOMM)
		return "it has a device communicator (ncclDevCommCreate, the device API)";
	if (u & SHIM_NCCL_U_REDOP)
		return "a custom reduction op is alive on it (ncclRedOpCreatePreMulSum)";
	if (u & SHIM_NCCL_U_GRAPH)
		return "a collective on it was captured in a CUDA graph, which would replay into the old "
		       "communicator";
	if (u & SHIM_NCCL_U_SHRINK)
		return "it was made by ncclCommShrink or ncclCommGrow, which the shim does not replay";
	return "it was revoked (ncclCommRevoke)";
}

static int nccl_check(struct gcr_err *err)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	int rc = 0;
	shim_nccl_lock();
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct shim_nccl_rec *r = all[i];
		unsigned u = r->unsup | (r->windows > 0 ? SHIM_NCCL_U_WINDOW : 0) |
			     (r->devcomms > 0 ? SHIM_NCCL_U_DEVCOMM : 0) | (r->redops > 0 ? SHIM_NCCL_U_REDOP : 0);
		char k[GCR_GROUP_KEY_LEN];
		key_str(r->key, k);
		if (u != 0 && r->state != SHIM_NCCL_FAILED)
			rc = gcr_err_set(err, -ENOTSUP, "NCCL communicator %s (rank %d of %d) cannot be torn down and "
					 "made again: %s", k, r->rank, r->nranks, unsup_what(u));
		else if (r->state == SHIM_NCCL_LIVE && r->nranks <= 0 && !r->nocolor)
			rc = gcr_err_set(err, -EBUSY, "NCCL communicator %s is still being created; retry", k);
	}
	shim_nccl_unlock();
	/* A communicator created non-blocking and still initialising. */
	__typeof__(&ncclCommGetAsyncError) gae = SHIM_NCCL_REAL(ncclCommGetAsyncError, 0);
	for (size_t i = 0; i < n && rc == 0 && gae != NULL; i++) {
		struct shim_nccl_rec *r = all[i];
		ncclResult_t st = ncclSuccess;
		if (r->blocking || r->state != SHIM_NCCL_LIVE || r->real == NULL)
			continue;
		shim_nccl_busy_add(1);
		(void)gae(r->real, &st);
		shim_nccl_busy_add(-1);
		if (st == ncclInProgress) {
			char k[GCR_GROUP_KEY_LEN];
			key_str(r->key, k);
			rc = gcr_err_set(err, -EBUSY, "NCCL communicator %s has an operation in progress (non-blocking); "
					 "retry", k);
		}
	}
	return rc;
}

static void nccl_thaw(void)
{
	shim_nccl_lock();
	atomic_store(&shim_nccl_hold.mode, SHIM_NCCL_OPEN);
	shim_nccl_wake();
	shim_nccl_unlock();
}

static int nccl_freeze(int wait_ms, struct gcr_err *err)
{
	double deadline = gcr_time_mono_ms() + wait_ms;
	int rc = nccl_check(err);
	if (rc < 0)
		return rc;
	shim_nccl_lock();
	if (atomic_load(&shim_nccl_hold.mode) != SHIM_NCCL_OPEN) {
		shim_nccl_unlock();
		return gcr_err_set(err, -EINVAL, "NCCL submissions are held already");
	}
	atomic_store(&shim_nccl_hold.mode, SHIM_NCCL_FROZEN);
	shim_nccl_unlock();
	/* A thread that read the mode as open before the store takes its count in microseconds:
	 * one moment with none admitting after the store is enough. Later ones read it frozen and
	 * wait; they still pass through `admitting` for an instant, so it is not looked at again
	 * (it was, and a query at that instant failed the freeze at once). */
	int settled;
	while (!(settled = atomic_load(&shim_nccl_hold.admitting) == 0) && gcr_time_mono_ms() < deadline)
		pause_us(20);
	shim_nccl_lock();
	while (atomic_load(&shim_nccl_hold.open_groups) > 0 && shim_nccl_wait_until(deadline) == 0)
		;
	if (!settled)
		rc = gcr_err_set(err, -EBUSY, "an NCCL call was not counted within %d ms of the hold", wait_ms);
	else if (atomic_load(&shim_nccl_hold.open_groups) > 0)
		rc = gcr_err_set(err, -EBUSY, "a thread kept an NCCL group open (ncclGroupStart without its "
				 "ncclGroupEnd) for %d ms", wait_ms);
	else if (atomic_load(&shim_nccl_hold.creating) > 0)
		rc = gcr_err_set(err, -EBUSY, "an NCCL communicator is being created (ncclCommInitRank or "
				 "ncclCommSplit in progress); retry when it is made");
	shim_nccl_unlock();
	if (rc == 0)
		rc = nccl_check(err); /* anything registered while the freeze took hold */
	if (rc < 0)
		nccl_thaw();
	return rc;
}

/* ---- the drain's wait for NCCL's work on the GPU: cuCtxSynchronize in every context that
 * holds a communicator, in a thread of its own so the wait has a deadline ---- */
struct sync_job {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	CUcontext ctx[SHIM_NCCL_MAX_COMMS];
	size_t n;
	int done, abandoned;
	CUresult rc;
};

static void *sync_run(void *arg)
{
	struct sync_job *j = arg;
	CUresult rc = CUDA_SUCCESS;
	shim_real_relax_capture();
	for (size_t i = 0; i < j->n && rc == CUDA_SUCCESS; i++) {
		rc = shim_cu.cuCtxSetCurrent(j->ctx[i]);
		if (rc == CUDA_SUCCESS)
			rc = shim_cu.cuCtxSynchronize();
	}
	pthread_mutex_lock(&j->lock);
	j->rc = rc;
	j->done = 1;
	int gone = j->abandoned;
	pthread_cond_signal(&j->cond);
	pthread_mutex_unlock(&j->lock);
	if (gone) {
		pthread_cond_destroy(&j->cond);
		pthread_mutex_destroy(&j->lock);
		free(j);
	}
	return NULL;
}

/* Waits on job's done flag until deadline; 0 when done, -ETIMEDOUT (the job then frees itself). */
static int job_wait(pthread_mutex_t *lock, pthread_cond_t *cond, int *done, int *abandoned, double deadline)
{
	pthread_mutex_lock(lock);
	while (!*done) {
		double left = deadline - gcr_time_mono_ms();
		if (left <= 0)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		long long ns = (long long)ts.tv_nsec + (long long)(left * 1e6);
		ts.tv_sec += (time_t)(ns / 1000000000LL);
		ts.tv_nsec = (long)(ns % 1000000000LL);
		pthread_cond_timedwait(cond, lock, &ts);
	}
	int ok = *done;
	if (!ok)
		*abandoned = 1;
	pthread_mutex_unlock(lock);
	return ok ? 0 : -ETIMEDOUT;
}

static int job_init(pthread_mutex_t *lock, pthread_cond_t *cond)
{
	pthread_condattr_t a;
	pthread_condattr_init(&a);
	pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
	int rc = pthread_cond_init(cond, &a);
	pthread_condattr_destroy(&a);
	if (rc == 0)
		pthread_mutex_init(lock, NULL);
	return -rc;
}

static int gpu_sync(struct shim_nccl_rec **all, size_t n, double deadline, struct gcr_err *err)
{
	struct sync_job *j = calloc(1, sizeof(*j));
	if (j == NULL || job_init(&j->lock, &j->cond) < 0) {
		free(j);
		return gcr_err_set(err, -ENOMEM, "out of memory for the drain's wait on the GPU");
	}
	for (size_t i = 0; i < n; i++) {
		CUcontext c = all[i]->ctx;
		size_t k = 0;
		while (c != NULL && k < j->n && j->ctx[k] != c)
			k++;
		if (c != NULL && k == j->n)
			j->ctx[j->n++] = c;
	}
	pthread_t th;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int prc = pthread_create(&th, &attr, sync_run, j);
	pthread_attr_destroy(&attr);
	if (prc != 0) {
		pthread_cond_destroy(&j->cond);
		pthread_mutex_destroy(&j->lock);
		free(j);
		return gcr_err_set(err, -prc, "cannot start the drain's wait on the GPU: %s", strerror(prc));
	}
	if (job_wait(&j->lock, &j->cond, &j->done, &j->abandoned, deadline) < 0)
		return gcr_err_set(err, -ETIMEDOUT, "NCCL's work did not finish on the GPU in time (a kernel waits "
				   "for a peer that was not drained?)");
	CUresult rc = j->rc;
	pthread_cond_destroy(&j->cond);
	pthread_mutex_destroy(&j->lock);
	free(j);
	if (rc != CUDA_SUCCESS)
		return gcr_err_set(err, -EIO, "waiting for NCCL's work on the GPU failed (CUDA error %d)", (int)rc);
	return 0;
}

/* Whether every rank of r's communicator is in this process (a communicator of one rank, or
 * ncclCommInitAll's): going one further on it strands no peer. Lock held. */
static int all_local(struct shim_nccl_rec **all, size_t n, const struct shim_nccl_rec *r)
{
	int here = 0;
	for (size_t i = 0; i < n; i++)
		here += all[i]->key == r->key && !all[i]->nocolor;
	return here >= r->nranks;
}

static int nccl_drain(const struct gcr_group_targets *t, int timeout_ms, struct gcr_group_targets *wants,
		      struct gcr_err *err)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	double deadline = gcr_time_mono_ms() + timeout_ms;
	char k[GCR_GROUP_KEY_LEN];
	int rc = 0, stuck = 0;
	wants->n = 0;
	shim_nccl_lock();
	int mode = atomic_load(&shim_nccl_hold.mode);
	if (mode == SHIM_NCCL_OPEN) {
		shim_nccl_unlock();
		return gcr_err_set(err, -EINVAL, "NCCL submissions are not frozen");
	}
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	/* The first round starts from where the freeze stopped; targets only rise after. A
	 * communicator no target names goes no further than it is. */
	for (size_t i = 0; i < n; i++) {
		if (mode == SHIM_NCCL_FROZEN && all[i]->target < atomic_load(&all[i]->count))
			all[i]->target = atomic_load(&all[i]->count);
		for (size_t q = 0; q < t->n; q++)
			if (t->t[q].key == all[i]->key && !all[i]->nocolor && t->t[q].count > all[i]->target)
				all[i]->target = t->t[q].count;
	}
	atomic_store(&shim_nccl_hold.mode, SHIM_NCCL_DRAINING);
	shim_nccl_wake();
	for (;;) {
		struct shim_nccl_rec *below = NULL, *over = NULL;
		for (size_t i = 0; i < n; i++) {
			struct shim_nccl_rec *r = all[i];
			long long c = atomic_load(&r->count);
			if (c > r->target && over == NULL)
				over = r;
			if (c < r->target && r->state == SHIM_NCCL_LIVE && r->real != NULL && below == NULL)
				below = r;
		}
		if (over != NULL) {
			key_str(over->key, k);
			rc = gcr_err_set(err, -EPROTO, "NCCL communicator %s went to %lld submissions, past the group's "
					 "target %lld: its members do not submit in the same order", k,
					 atomic_load(&over->count), over->target);
			break;
		}
		/* A thread held at a communicator at its target while another is below its own: one
		 * more there is needed to get further. Where every rank is here, it goes at once; else
		 * the group decides (every member goes one further on it). */
		int raised = 0;
		for (size_t i = 0; i < n && below != NULL; i++) {
			struct shim_nccl_rec *r = all[i];
			if (r->waiters == 0 || atomic_load(&r->count) < r->target || r->state != SHIM_NCCL_LIVE)
				continue;
			if (all_local(all, n, r)) {
				for (size_t q = 0; q < n; q++)
					if (all[q]->key == r->key)
						all[q]->target = atomic_load(&all[q]->count) + 1;
				raised = 1;
			} else if (wants->n < GCR_GROUP_MAX_COMMS) {
				wants->t[wants->n++] = (struct gcr_group_target){ r->key, atomic_load(&r->count) };
			}
		}
		if (raised) {
			wants->n = 0;
			shim_nccl_wake();
			continue;
		}
		if (wants->n > 0) {
			stuck = 1;
			break;
		}
		int quiet = atomic_load(&shim_nccl_hold.inflight) == 0 && atomic_load(&shim_nccl_hold.open_groups) == 0 &&
			    atomic_load(&shim_nccl_hold.creating) == 0 && !shim_nccl_hold.drain_group;
		if (below == NULL && quiet)
			break;
		if (shim_nccl_wait_until(deadline) == -ETIMEDOUT) {
			if (below != NULL) {
				key_str(below->key, k);
				rc = gcr_err_set(err, -ETIMEDOUT, "NCCL communicator %s reached %lld of its %lld submissions in "
						 "%d ms (this process's thread did not come to the next one)", k,
						 atomic_load(&below->count), below->target, timeout_ms);
			} else {
				rc = gcr_err_set(err, -ETIMEDOUT, "NCCL calls still running after %d ms (a collective "
						 "waiting for a peer?)", timeout_ms);
			}
			break;
		}
	}
	if (stuck) {
		/* Still draining: what can go on goes on while the group raises the targets. */
		shim_nccl_unlock();
		return 1;
	}
	atomic_store(&shim_nccl_hold.mode, rc == 0 ? SHIM_NCCL_CLOSED : SHIM_NCCL_FROZEN);
	shim_nccl_wake();
	shim_nccl_unlock();
	if (rc < 0)
		return rc;
	/* Non-blocking communicators: the last group's launch ends in NCCL's own thread. */
	__typeof__(&ncclCommGetAsyncError) gae = SHIM_NCCL_REAL(ncclCommGetAsyncError, 0);
	for (size_t i = 0; i < n && gae != NULL; i++) {
		struct shim_nccl_rec *r = all[i];
		ncclResult_t st = ncclInProgress;
		while (!r->blocking && r->state == SHIM_NCCL_LIVE && r->real != NULL) {
			shim_nccl_busy_add(1);
			(void)gae(r->real, &st);
			shim_nccl_busy_add(-1);
			if (st != ncclInProgress)
				break;
			if (gcr_time_mono_ms() > deadline) {
				key_str(r->key, k);
				rc = gcr_err_set(err, -ETIMEDOUT, "NCCL communicator %s: its last operation still in "
						 "progress after %d ms", k, timeout_ms);
				break;
			}
			pause_us(100);
		}
	}
	if (rc == 0)
		rc = gpu_sync(all, n, deadline, err);
	if (rc < 0) {
		shim_nccl_lock();
		atomic_store(&shim_nccl_hold.mode, SHIM_NCCL_FROZEN);
		shim_nccl_unlock();
	}
	return rc;
}

/* Makes r's context (the one current when the application made it) current on this thread. */
static int set_ctx(struct shim_nccl_rec *r, struct gcr_err *err)
{
	CUresult cr = r->ctx != NULL ? shim_cu.cuCtxSetCurrent(r->ctx) : CUDA_SUCCESS;
	if (cr != CUDA_SUCCESS) {
		char k[GCR_GROUP_KEY_LEN];
		key_str(r->key, k);
		return gcr_err_set(err, -EIO, "communicator %s: its CUDA context cannot be made current (CUDA error %d)",
				   k, (int)cr);
	}
	return 0;
}

/* One communicator's ncclCommAbort, in a thread of its own. With the communicator's context
 * current: NCCL sets the caller's device back when it is done, and on a thread without one that
 * is device 0, which makes GPU 0's primary context in a rank of another GPU (run 60: 518 MiB on
 * GPU 0 in TP rank 1, which doubled its driver checkpoint). */
struct abort_job {
	struct shim_nccl_rec *r;
	__typeof__(&ncclCommAbort) fn;
	ncclResult_t res;
	pthread_t th;
	int threaded;
	atomic_int entered, done; /* the poker's view of the abort: begun, returned */
	double ms;
};

static void *abort_run(void *arg)
{
	struct abort_job *a = arg;
	struct gcr_err e;
	if (set_ctx(a->r, &e) < 0) /* the abort still frees what it can */
		GCR_LOG(GCR_LOG_WARN, "shim", "%s", e.msg);
	shim_nccl_busy_add(1);
	atomic_store(&a->entered, 1);
	double t0 = gcr_time_mono_ms();
	a->res = a->fn(a->r->real);
	a->ms = gcr_time_mono_ms() - t0;
	atomic_store(&a->done, 1);
	shim_nccl_busy_add(-1);
	return NULL;
}

/* Whether split child c shares its parent's resources (ncclConfig_t.splitShare, else NCCL's
 * default NCCL_COMM_SPLIT_SHARE_RESOURCES, off): then the parent is aborted after it. */
static int shares_parent(struct shim_nccl_rec *c)
{
	const ncclConfig_t *cfg = shim_nccl_rec_cfg(c);
	if (cfg != NULL && cfg->size >= offsetof(ncclConfig_t, splitShare) + sizeof(int) &&
	    cfg->splitShare != NCCL_CONFIG_UNDEF_INT)
		return cfg->splitShare == 1;
	const char *e = getenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
	return e != NULL && strcmp(e, "1") == 0;
}

/* Whether r waits for a live child that shares its resources (children go first then). */
static int has_live_child(struct shim_nccl_rec **all, size_t n, const struct shim_nccl_rec *r)
{
	for (size_t i = 0; i < n; i++)
		if (all[i]->parent == r && all[i]->state == SHIM_NCCL_LIVE && all[i]->real != NULL &&
		    shares_parent(all[i]))
			return 1;
	return 0;
}

static int jobs_all(struct abort_job *jobs, size_t nj, int done)
{
	for (size_t k = 0; k < nj; k++)
		if (jobs[k].threaded && !atomic_load(done ? &jobs[k].done : &jobs[k].entered))
			return 0;
	return 1;
}

/* While a round's aborts run: once each has begun (its abort flag is up 1 ms later), NCCL's
 * service threads are poked every 20 ms until every abort has returned (shim_nccl_poke.c). */
static void poke_round(const struct shim_nccl_poke *pk, struct abort_job *jobs, size_t nj)
{
	if (pk->n_uds + pk->n_tcp == 0)
		return;
	while (!jobs_all(jobs, nj, 0))
		pause_us(100);
	pause_us(1000);
	while (!jobs_all(jobs, nj, 1)) {
		shim_nccl_poke_send(pk);
		for (int i = 0; i < 20 && !jobs_all(jobs, nj, 1); i++)
			pause_us(1000);
	}
}

/* Every live communicator aborted, those of one round at once: each ncclCommAbort waits for
 * NCCL's service threads, which sleep in 500 ms polls; at once the waits overlap, and the pokes
 * end them early. A round is the communicators no live child sharing their resources waits on
 * (NCCL's default shares none: one round). Unpoked, the wait was up to about 0.95 s a member
 * (runs 62, 64). */
static int nccl_teardown(struct gcr_err *err)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	static struct abort_job jobs[SHIM_NCCL_MAX_COMMS]; /* one teardown at a time (the group op) */
	shim_nccl_lock();
	if (atomic_load(&shim_nccl_hold.mode) != SHIM_NCCL_CLOSED || atomic_load(&shim_nccl_hold.inflight) > 0) {
		shim_nccl_unlock();
		return gcr_err_set(err, -EINVAL, "NCCL submissions are not drained");
	}
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	shim_nccl_unlock();
	__typeof__(&ncclCommAbort) abort_fn = SHIM_NCCL_REAL(ncclCommAbort, 0);
	static struct shim_nccl_poke pk; /* one teardown at a time, like jobs */
	struct gcr_err pe = { 0 };
	if (shim_nccl_poke_find(&pk, shim_nccl_poke_mode(), &pe) < 0)
		GCR_LOG(GCR_LOG_WARN, "shim", "NCCL's service threads will not be poked: %s", pe.msg);
	for (;;) {
		size_t nj = 0;
		for (size_t i = 0; i < n; i++) {
			struct shim_nccl_rec *r = all[i];
			if (r->state != SHIM_NCCL_LIVE || has_live_child(all, n, r))
				continue;
			if (r->real == NULL || abort_fn == NULL) {
				r->state = SHIM_NCCL_DOWN;
				continue;
			}
			jobs[nj] = (struct abort_job){ .r = r, .fn = abort_fn };
			jobs[nj].threaded = pthread_create(&jobs[nj].th, NULL, abort_run, &jobs[nj]) == 0;
			if (!jobs[nj].threaded)
				abort_run(&jobs[nj]);
			nj++;
		}
		if (nj == 0)
			break;
		poke_round(&pk, jobs, nj);
		double slowest = 0;
		for (size_t k = 0; k < nj; k++) {
			if (jobs[k].threaded)
				pthread_join(jobs[k].th, NULL);
			if (jobs[k].res != ncclSuccess) {
				char key[GCR_GROUP_KEY_LEN];
				key_str(jobs[k].r->key, key);
				GCR_LOG(GCR_LOG_WARN, "shim", "ncclCommAbort of communicator %s: %s (its resources are "
					"NCCL's now)", key, nccl_err(jobs[k].res));
			}
			jobs[k].r->real = NULL;
			jobs[k].r->state = SHIM_NCCL_DOWN;
			slowest = jobs[k].ms > slowest ? jobs[k].ms : slowest;
		}
		GCR_LOG(GCR_LOG_INFO, "shim", "ncclCommAbort of %zu communicators: the slowest %.0f ms (%zu UDS and "
			"%zu TCP sockets of NCCL poked)", nj, slowest, pk.n_uds, pk.n_tcp);
	}
	shim_nccl_lock();
	for (struct shim_nccl_reg *g = shim_nccl_reg_next(NULL); g != NULL; g = shim_nccl_reg_next(g))
		g->real = NULL;
	shim_nccl_unlock();
	shim_nccl_poke_after_teardown();
	return 0;
}

/* The record of key's rank 0 here (a process may hold several ranks of one communicator). */
static struct shim_nccl_rec *find_root(struct shim_nccl_rec **all, size_t n, uint64_t key)
{
	for (size_t i = 0; i < n; i++)
		if (all[i]->key == key && !all[i]->nocolor && all[i]->rank == 0)
			return all[i];
	return NULL;
}

static int nccl_ids(const struct gcr_group_keys *keys, struct gcr_group_ids *out, struct gcr_err *err)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	char k[GCR_GROUP_KEY_LEN];
	out->n = 0;
	if (shim_nccl_lib.GetUniqueId == NULL)
		return gcr_err_set(err, -ENOENT, "this process has no NCCL");
	shim_nccl_lock();
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	shim_nccl_unlock();
	for (size_t i = 0; i < keys->n; i++) {
		struct shim_nccl_rec *r = find_root(all, n, keys->key[i]);
		key_str(keys->key[i], k);
		if (r == NULL || r->how != GCR_GROUP_HOW_INIT || r->rank != 0 || r->state != SHIM_NCCL_DOWN)
			return gcr_err_set(err, -EINVAL, "communicator %s: not one this process made by init, holds rank 0 "
					   "of, and has torn down", k);
		ncclUniqueId id;
		shim_nccl_busy_add(1);
		ncclResult_t nr = shim_nccl_lib.GetUniqueId(&id);
		shim_nccl_busy_add(-1);
		if (nr != ncclSuccess)
			return gcr_err_set(err, -EIO, "ncclGetUniqueId for communicator %s: %s", k, nccl_err(nr));
		out->v[out->n].key = r->key;
		memcpy(out->v[out->n].id, id.internal, GCR_GROUP_ID_BYTES);
		out->n++;
	}
	return 0;
}

/* ---- the rebuild ---- */
struct rebuild_job {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct gcr_group_ids ids;
	struct shim_nccl_rec *plan[SHIM_NCCL_MAX_COMMS]; /* the records to make, in creation order */
	size_t n;
	double deadline;
	void (*late)(int rc);
	int done, abandoned, rc;
	struct gcr_err err;
};

static _Atomic int rebuild_running;

static const unsigned char *id_for(const struct rebuild_job *j, uint64_t key)
{
	for (size_t i = 0; i < j->ids.n; i++)
		if (j->ids.v[i].key == key)
			return j->ids.v[i].id;
	return NULL;
}

static ncclResult_t wait_ready(ncclComm_t c, double deadline)
{
	__typeof__(&ncclCommGetAsyncError) gae = SHIM_NCCL_REAL(ncclCommGetAsyncError, 0);
	ncclResult_t st = ncclInProgress;
	while (gae != NULL && c != NULL) {
		if (gae(c, &st) != ncclSuccess || st != ncclInProgress)
			return st;
		if (gcr_time_mono_ms() > deadline)
			return ncclInProgress;
		pause_us(200);
	}
	return ncclSuccess;
}

/* Makes every communicator made by init again, all in one NCCL group per blocking mode (NCCL
 * initialises a group's communicators together: the members need not agree on an order). */
static int rebuild_inits(struct rebuild_job *j, int blocking)
{
	__typeof__(&ncclCommInitRankConfig) init_cfg = SHIM_NCCL_REAL(ncclCommInitRankConfig, 0);
	__typeof__(&ncclCommInitRank) init = SHIM_NCCL_REAL(ncclCommInitRank, 0);
	__typeof__(&ncclGroupStart) gstart = SHIM_NCCL_REAL(ncclGroupStart, 0);
	__typeof__(&ncclGroupEnd) gend = SHIM_NCCL_REAL(ncclGroupEnd, 0);
	char k[GCR_GROUP_KEY_LEN];
	size_t count = 0;
	for (size_t i = 0; i < j->n; i++)
		count += j->plan[i]->how == GCR_GROUP_HOW_INIT && j->plan[i]->blocking == blocking;
	if (count == 0)
		return 0;
	if (init_cfg == NULL || init == NULL || gstart == NULL || gend == NULL)
		return gcr_err_set(&j->err, -ENOENT, "this NCCL lacks ncclCommInitRank");
	ncclResult_t nr = gstart();
	int rc = 0;
	for (size_t i = 0; i < j->n && nr == ncclSuccess && rc == 0; i++) {
		struct shim_nccl_rec *r = j->plan[i];
		if (r->how != GCR_GROUP_HOW_INIT || r->blocking != blocking)
			continue;
		ncclUniqueId id;
		memcpy(id.internal, id_for(j, r->key), sizeof(id.internal));
		rc = set_ctx(r, &j->err);
		if (rc == 0) {
			ncclConfig_t *cfg = shim_nccl_rec_cfg(r);
			nr = cfg != NULL ? init_cfg(&r->real, r->nranks, id, r->rank, cfg) : init(&r->real, r->nranks, id, r->rank);
			if (nr != ncclSuccess && nr != ncclInProgress) {
				key_str(r->key, k);
				rc = gcr_err_set(&j->err, -EIO, "ncclCommInitRank of communicator %s (rank %d of %d): %s", k,
						 r->rank, r->nranks, nccl_err(nr));
			}
		}
	}
	ncclResult_t er = gend();
	if (rc == 0 && er != ncclSuccess && er != ncclInProgress)
		rc = gcr_err_set(&j->err, -EIO, "making %zu NCCL communicators again: %s", count, nccl_err(er));
	for (size_t i = 0; i < j->n && rc == 0 && !blocking; i++) {
		struct shim_nccl_rec *r = j->plan[i];
		if (r->how != GCR_GROUP_HOW_INIT || r->blocking)
			continue;
		ncclResult_t st = wait_ready(r->real, j->deadline);
		key_str(r->key, k);
		if (st == ncclInProgress)
			rc = gcr_err_set(&j->err, -ETIMEDOUT, "communicator %s still initialising at the deadline", k);
		else if (st != ncclSuccess)
			rc = gcr_err_set(&j->err, -EIO, "communicator %s: %s", k, nccl_err(st));
	}
	return rc;
}

static int rebuild_locals(struct rebuild_job *j)
{
	__typeof__(&ncclCommInitAll) init_all = SHIM_NCCL_REAL(ncclCommInitAll, 0);
	for (size_t i = 0; i < j->n; i++) {
		struct shim_nccl_rec *r = j->plan[i];
		if (r->how != GCR_GROUP_HOW_LOCAL || r->local_index != 0)
			continue;
		ncclComm_t comms[64] = { 0 };
		if (init_all == NULL || r->local_n > 64)
			return gcr_err_set(&j->err, -ENOENT, "cannot call ncclCommInitAll");
		int rc = set_ctx(r, &j->err);
		if (rc < 0)
			return rc;
		ncclResult_t nr = init_all(comms, r->local_n, r->local_devs);
		if (nr != ncclSuccess)
			return gcr_err_set(&j->err, -EIO, "ncclCommInitAll of %d devices: %s", r->local_n, nccl_err(nr));
		for (size_t q = 0; q < j->n; q++)
			if (j->plan[q]->how == GCR_GROUP_HOW_LOCAL && j->plan[q]->local_group == r->local_group)
				j->plan[q]->real = comms[j->plan[q]->local_index];
	}
	return 0;
}

static int rebuild_splits(struct rebuild_job *j)
{
	__typeof__(&ncclCommSplit) split = SHIM_NCCL_REAL(ncclCommSplit, 0);
	char k[GCR_GROUP_KEY_LEN];
	for (size_t i = 0; i < j->n; i++) {
		struct shim_nccl_rec *r = j->plan[i];
		if (r->how != GCR_GROUP_HOW_SPLIT)
			continue;
		key_str(r->key, k);
		if (split == NULL || r->parent == NULL || r->parent->real == NULL)
			return gcr_err_set(&j->err, -EIO, "communicator %s: its parent was not made again", k);
		int rc = set_ctx(r, &j->err);
		if (rc < 0)
			return rc;
		ncclComm_t c = NULL;
		ncclResult_t nr = split(r->parent->real, r->nocolor ? NCCL_SPLIT_NOCOLOR : r->color, r->split_key, &c,
					shim_nccl_rec_cfg(r));
		if (nr == ncclInProgress)
			nr = wait_ready(r->parent->real, j->deadline);
		if (nr == ncclSuccess && c != NULL)
			nr = wait_ready(c, j->deadline);
		if (nr != ncclSuccess)
			return gcr_err_set(&j->err, nr == ncclInProgress ? -ETIMEDOUT : -EIO,
					   "ncclCommSplit of communicator %s: %s", k, nccl_err(nr));
		r->real = r->nocolor ? NULL : c;
	}
	return 0;
}

/* What NCCL made must be what the application had: same rank, same size. */
static int rebuild_verify(struct rebuild_job *j)
{
	__typeof__(&ncclCommCount) cnt = SHIM_NCCL_REAL(ncclCommCount, 0);
	__typeof__(&ncclCommUserRank) urank = SHIM_NCCL_REAL(ncclCommUserRank, 0);
	for (size_t i = 0; i < j->n && cnt != NULL && urank != NULL; i++) {
		struct shim_nccl_rec *r = j->plan[i];
		int n = -1, rank = -1;
		if (r->nocolor || r->real == NULL)
			continue;
		if (cnt(r->real, &n) != ncclSuccess || urank(r->real, &rank) != ncclSuccess || n != r->nranks ||
		    rank != r->rank) {
			char k[GCR_GROUP_KEY_LEN];
			key_str(r->key, k);
			return gcr_err_set(&j->err, -EIO, "communicator %s came back as rank %d of %d, not %d of %d", k, rank,
					   n, r->rank, r->nranks);
		}
	}
	return 0;
}

static void rebuild_undo(struct rebuild_job *j)
{
	__typeof__(&ncclCommAbort) abort_fn = SHIM_NCCL_REAL(ncclCommAbort, 0);
	for (size_t i = j->n; i-- > 0;) {
		struct shim_nccl_rec *r = j->plan[i];
		if (r->real != NULL && abort_fn != NULL)
			(void)abort_fn(r->real);
		r->real = NULL;
		r->state = SHIM_NCCL_DOWN;
	}
}

static void *rebuild_run(void *arg)
{
	struct rebuild_job *j = arg;
	shim_nccl_busy_add(1); /* this thread's NCCL calls are the shim's: never held */
	shim_real_relax_capture();
	int rc = rebuild_inits(j, 1);
	if (rc == 0)
		rc = rebuild_inits(j, 0);
	if (rc == 0)
		rc = rebuild_locals(j);
	if (rc == 0)
		rc = rebuild_splits(j);
	if (rc == 0)
		rc = rebuild_verify(j);
	if (rc < 0) {
		rebuild_undo(j);
	} else {
		__typeof__(&ncclCommAbort) abort_fn = SHIM_NCCL_REAL(ncclCommAbort, 0);
		__typeof__(&ncclCommRegister) reg = SHIM_NCCL_REAL(ncclCommRegister, 0);
		shim_nccl_lock();
		for (size_t i = 0; i < j->n; i++)
			if (!j->plan[i]->app_gone)
				j->plan[i]->state = SHIM_NCCL_LIVE;
		shim_nccl_unlock();
		/* Parents the application had destroyed served their splits: gone again. */
		for (size_t i = j->n; i-- > 0;) {
			struct shim_nccl_rec *r = j->plan[i];
			if (r->app_gone && r->real != NULL && abort_fn != NULL)
				(void)abort_fn(r->real);
			if (r->app_gone)
				r->real = NULL;
		}
		for (struct shim_nccl_reg *g = shim_nccl_reg_next(NULL); g != NULL && reg != NULL; g = shim_nccl_reg_next(g))
			if (g->rec->state == SHIM_NCCL_LIVE && g->rec->real != NULL && g->real == NULL &&
			    reg(g->rec->real, g->buff, g->size, &g->real) != ncclSuccess)
				GCR_LOG(GCR_LOG_WARN, "shim", "a buffer registered with NCCL could not be registered again: "
					"NCCL will register it at its next use");
	}
	shim_nccl_busy_add(-1);
	/* Free for the next rebuild before the waiter hears this one ended: it may ask at once. */
	atomic_store(&rebuild_running, 0);
	pthread_mutex_lock(&j->lock);
	j->rc = rc;
	j->done = 1;
	int gone = j->abandoned;
	pthread_cond_signal(&j->cond);
	pthread_mutex_unlock(&j->lock);
	if (gone) {
		if (rc < 0)
			GCR_LOG(GCR_LOG_ERROR, "shim", "NCCL rebuild ended after its deadline: %s", j->err.msg);
		void (*late)(int) = j->late;
		pthread_cond_destroy(&j->cond);
		pthread_mutex_destroy(&j->lock);
		free(j);
		if (late != NULL)
			late(rc);
	}
	return NULL;
}

/* Marks r failed, and every record split from it. Lock held. */
static void fail_tree(struct shim_nccl_rec **all, size_t n, struct shim_nccl_rec *r)
{
	r->state = SHIM_NCCL_FAILED;
	r->real = NULL;
	r->sticky = ncclRemoteError;
	snprintf(r->errmsg, sizeof(r->errmsg), "GCR: a process holding a rank of this communicator did not come back "
		 "from a suspend");
	for (size_t i = 0; i < n; i++)
		if (all[i]->parent == r && all[i]->state != SHIM_NCCL_FAILED)
			fail_tree(all, n, all[i]);
}

static int nccl_rebuild(const struct gcr_group_ids *ids, const struct gcr_group_keys *failed, int timeout_ms,
			void (*late)(int rc), struct gcr_err *err)
{
	struct shim_nccl_rec *all[SHIM_NCCL_MAX_COMMS];
	char k[GCR_GROUP_KEY_LEN];
	if (atomic_exchange(&rebuild_running, 1))
		return gcr_err_set(err, -EBUSY, "a rebuild of the NCCL communicators is still running");
	struct rebuild_job *j = calloc(1, sizeof(*j));
	if (j == NULL || job_init(&j->lock, &j->cond) < 0) {
		free(j);
		atomic_store(&rebuild_running, 0);
		return gcr_err_set(err, -ENOMEM, "out of memory for the rebuild");
	}
	j->ids = *ids;
	j->late = late;
	j->deadline = gcr_time_mono_ms() + timeout_ms;
	int rc = 0;
	shim_nccl_lock();
	size_t n = shim_nccl_recs(all, SHIM_NCCL_MAX_COMMS);
	for (size_t q = 0; q < failed->n; q++)
		for (size_t i = 0; i < n; i++)
			if (all[i]->key == failed->key[q] && !all[i]->nocolor && all[i]->state != SHIM_NCCL_FAILED)
				fail_tree(all, n, all[i]);
	for (size_t i = 0; i < n && rc == 0; i++) {
		struct shim_nccl_rec *r = all[i];
		if (r->state != SHIM_NCCL_DOWN)
			continue;
		/* A destroyed parent is made again only for the splits still needing it. */
		if (r->app_gone && r->children == 0)
			continue;
		if (r->how == GCR_GROUP_HOW_INIT && id_for(j, r->key) == NULL) {
			key_str(r->key, k);
			rc = gcr_err_set(err, -EINVAL, "no unique id given for communicator %s", k);
		}
		j->plan[j->n++] = r;
	}
	shim_nccl_unlock();
	pthread_t th;
	pthread_attr_t attr;
	int prc = 0;
	if (rc == 0) {
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		prc = pthread_create(&th, &attr, rebuild_run, j);
		pthread_attr_destroy(&attr);
		if (prc != 0)
			rc = gcr_err_set(err, -prc, "cannot start the rebuild: %s", strerror(prc));
	}
	if (rc < 0) {
		pthread_cond_destroy(&j->cond);
		pthread_mutex_destroy(&j->lock);
		free(j);
		atomic_store(&rebuild_running, 0);
		return rc;
	}
	if (job_wait(&j->lock, &j->cond, &j->done, &j->abandoned, j->deadline) < 0)
		return gcr_err_set(err, -ETIMEDOUT, "the NCCL communicators were not made again within %d ms (a member "
				   "did not join?); the rebuild goes on and ends by itself", timeout_ms);
	rc = j->rc;
	if (rc < 0)
		*err = j->err;
	pthread_cond_destroy(&j->cond);
	pthread_mutex_destroy(&j->lock);
	free(j);
	return rc;
}

static int nccl_rebuilding(void)
{
	return atomic_load(&rebuild_running);
}

static void *nccl_wrap(void *found, const char *name)
{
	if (found == NULL || name == NULL || !shim_nccl_enabled())
		return NULL;
	const char *n = name[0] == 'p' ? name + 1 : name;
	if (strncmp(n, "nccl", 4) != 0 || shim_nccl_load(found) < 0)
		return NULL;
	for (unsigned i = 0; i < SHIM_NCCL_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_nccl_hooks[i].real[v] == found)
				return shim_nccl_hooks[i].wrapper[v];
	return NULL;
}

const struct shim_comm_ops shim_nccl_ops = {
	.name = "nccl",
	.counts = nccl_counts,
	.describe = nccl_describe,
	.check = nccl_check,
	.freeze = nccl_freeze,
	.thaw = nccl_thaw,
	.drain = nccl_drain,
	.teardown = nccl_teardown,
	.ids = nccl_ids,
	.rebuild = nccl_rebuild,
	.rebuilding = nccl_rebuilding,
	.wrap = nccl_wrap,
};
