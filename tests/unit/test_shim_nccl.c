/* test_shim_nccl: the shim's NCCL module (shim/nccl) inside one process, on the stand-in driver
 * and the stand-in NCCL: the application holds the shim's handles (never NCCL's) and queries are
 * answered from them; submissions are counted once (a group once per communicator, ncclBcast
 * once though NCCL forwards it to ncclBroadcast); a freeze holds a submitting thread, a drain lets
 * exactly its target through and a thaw the rest; threads polling the communicator's error never
 * fail a freeze; a group left open stops a freeze; what cannot be
 * made again refuses; torn down, a communicator and its split child are made again under the same
 * handles; failed ones answer ncclRemoteError and can still be destroyed. Two ranks of one
 * communicator live in two threads here, so a rank held before a collective holds its peer. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda_util.h"
#include "shim_comm.h"
#include "shim_nccl.h"
#include "util.h"

static CUcontext ctx;

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Waits (bounded: 10 s, test_ms) until cond() holds; what a test observes of another thread. */
static int wait_until(int (*cond)(void))
{
	double end = now_ms() + (double)test_ms(10000);
	while (!cond() && now_ms() < end) {
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	return cond();
}

static int one_waiting(void)
{
	shim_nccl_lock();
	int w = shim_nccl_hold.waiting;
	shim_nccl_unlock();
	return w >= 1;
}

static long long count_of(ncclComm_t c)
{
	struct shim_nccl_rec *r = shim_nccl_rec_of(c);
	return r != NULL ? atomic_load(&r->count) : -1;
}

/* A thread that submits n all-reduces on comm, each to completion (one rank: no peer). */
struct worker {
	ncclComm_t comm;
	int n, done;
	CUdeviceptr buf;
	ncclResult_t last;
	pthread_t th;
};

static void *work(void *arg)
{
	struct worker *w = arg;
	shim_cu.cuCtxSetCurrent(ctx);
	for (int i = 0; i < w->n; i++)
		w->last = ncclAllReduce((void *)w->buf, (void *)w->buf, 16, ncclFloat, ncclSum, w->comm, NULL);
	__atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static ncclComm_t init1(ncclUniqueId *id)
{
	ncclComm_t c = NULL;
	CHECK(shim_nccl_lib.GetUniqueId(id) == ncclSuccess);
	CHECK(ncclCommInitRank(&c, 1, *id, 0) == ncclSuccess && c != NULL);
	return c;
}

static void test_handles(CUdeviceptr buf)
{
	ncclUniqueId id;
	ncclComm_t c = init1(&id);
	struct shim_nccl_rec *r = shim_nccl_rec_of(c);
	CHECK(r != NULL && r->real != NULL && (void *)r->real != (void *)c && r->how == GCR_GROUP_HOW_INIT);
	CHECK(r->key == shim_nccl_key_init(&id, 1) && r->rank == 0 && r->nranks == 1 && r->device == 0);
	int n = -1, rank = -1, dev = -1;
	CHECK(ncclCommCount(c, &n) == ncclSuccess && n == 1);
	CHECK(ncclCommUserRank(c, &rank) == ncclSuccess && rank == 0);
	CHECK(ncclCommCuDevice(c, &dev) == ncclSuccess && dev == 0);
	/* NCCL's own communicator passes through the wrappers unmapped. */
	n = -1;
	CHECK(ncclCommCount(r->real, &n) == ncclSuccess && n == 1);
	/* Counted once each: collectives, ncclBcast (NCCL forwards it to ncclBroadcast), a group of
	 * two, a split on its parent. */
	for (int i = 0; i < 3; i++)
		CHECK(ncclAllReduce((void *)buf, (void *)buf, 16, ncclFloat, ncclSum, c, NULL) == ncclSuccess);
	CHECK(count_of(c) == 3);
	CHECK(ncclBcast((void *)buf, 16, ncclFloat, 0, c, NULL) == ncclSuccess && count_of(c) == 4);
	CHECK(ncclGroupStart() == ncclSuccess);
	CHECK(ncclAllReduce((void *)buf, (void *)buf, 16, ncclFloat, ncclSum, c, NULL) == ncclSuccess);
	CHECK(ncclBroadcast((void *)buf, (void *)buf, 16, ncclFloat, 0, c, NULL) == ncclSuccess);
	CHECK(count_of(c) == 4); /* counted at the group's end */
	CHECK(ncclGroupEnd() == ncclSuccess && count_of(c) == 5);
	ncclComm_t child = NULL;
	CHECK(ncclCommSplit(c, 3, 0, &child, NULL) == ncclSuccess && shim_nccl_rec_of(child) != NULL);
	CHECK(count_of(c) == 6 && shim_nccl_rec_of(child)->parent == r && r->children == 1);
	/* Destroying the parent first keeps its record for the child's sake. */
	CHECK(ncclCommDestroy(c) == ncclSuccess && shim_nccl_rec_of(c) == r && r->app_gone);
	CHECK(ncclCommDestroy(child) == ncclSuccess && shim_nccl_rec_of(child) == NULL && shim_nccl_rec_of(c) == NULL);
}

static void test_freeze_drain(CUdeviceptr buf)
{
	ncclUniqueId id;
	ncclComm_t c = init1(&id);
	struct gcr_err err = { 0 };
	struct gcr_group_targets t = { 0 }, wants;
	CHECK(shim_nccl_ops.freeze(1000, &err) == 0);
	long long frozen_at = count_of(c);
	struct worker w = { .comm = c, .n = 5, .buf = buf };
	CHECK(pthread_create(&w.th, NULL, work, &w) == 0);
	CHECK(wait_until(one_waiting));
	CHECK(count_of(c) == frozen_at && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE));
	/* A query while held: from the record, no NCCL call. */
	ncclResult_t ae = ncclInternalError;
	CHECK(ncclCommGetAsyncError(c, &ae) == ncclSuccess && ae == ncclSuccess);
	t.n = 1;
	t.t[0] = (struct gcr_group_target){ shim_nccl_rec_of(c)->key, frozen_at + 2 };
	CHECK(shim_nccl_ops.drain(&t, (int)test_ms(5000), &wants, &err) == 0);
	CHECK(count_of(c) == frozen_at + 2 && wait_until(one_waiting) && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE));
	shim_nccl_ops.thaw();
	pthread_join(w.th, NULL);
	CHECK(w.done && w.last == ncclSuccess && count_of(c) == frozen_at + 5);
	/* A drain whose target the thread never reaches: bounded, and still held. */
	CHECK(shim_nccl_ops.freeze(1000, &err) == 0);
	t.t[0].count = count_of(c) + 1;
	double t0 = now_ms();
	CHECK(shim_nccl_ops.drain(&t, 200, &wants, &err) == -ETIMEDOUT && now_ms() - t0 < test_ms(5000));
	CHECK(strstr(err.msg, "of its") != NULL);
	shim_nccl_ops.thaw();
	CHECK(ncclCommDestroy(c) == ncclSuccess);
}

/* A thread querying the communicator (PyTorch's watchdog polls its error every 100 ms, the test
 * program after every step) passes through the hold's admission for an instant on each query; a
 * freeze that looked at that instant failed at once as "a thread kept an NCCL group open" (seen
 * in a local run of devices-3-split; before the fix, this test failed so in each of 6 runs,
 * between the 1st and the 3023rd freeze). Every freeze of 5000 beside four such threads holds. */
#define NPOLLERS 4
static struct {
	ncclComm_t comm;
	int stop, polling; /* polling: threads past their first query */
} queries;

static void *poll_run(void *arg)
{
	(void)arg;
	shim_cu.cuCtxSetCurrent(ctx);
	for (int first = 1; !__atomic_load_n(&queries.stop, __ATOMIC_ACQUIRE); first = 0) {
		ncclResult_t ae = ncclSuccess;
		(void)ncclCommGetAsyncError(queries.comm, &ae);
		if (first)
			__atomic_add_fetch(&queries.polling, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static int all_polling(void)
{
	return __atomic_load_n(&queries.polling, __ATOMIC_ACQUIRE) == NPOLLERS;
}

static void test_freeze_beside_queries(void)
{
	ncclUniqueId id;
	pthread_t th[NPOLLERS];
	struct gcr_err err = { 0 };
	const int tries = 5000;
	queries.comm = init1(&id);
	for (int k = 0; k < NPOLLERS; k++)
		CHECK(pthread_create(&th[k], NULL, poll_run, NULL) == 0);
	CHECK(wait_until(all_polling));
	int i;
	for (i = 0; i < tries && shim_nccl_ops.freeze((int)test_ms(5000), &err) == 0; i++)
		shim_nccl_ops.thaw();
	if (i < tries)
		fprintf(stderr, "freeze %d of %d beside %d polling threads: %s\n", i + 1, tries, NPOLLERS, err.msg);
	__atomic_store_n(&queries.stop, 1, __ATOMIC_RELEASE);
	for (int k = 0; k < NPOLLERS; k++)
		pthread_join(th[k], NULL);
	CHECK(i == tries);
	CHECK(ncclCommDestroy(queries.comm) == ncclSuccess);
}

/* Two ranks of one communicator in two threads: the one held before a collective leaves the
 * other inside NCCL (the stand-in's collective waits for every rank), as on a GPU. */
struct rank_arg {
	ncclUniqueId id;
	int rank;
	ncclComm_t comm;
	CUdeviceptr buf;
	int steps, done;
	ncclResult_t rc;
};

static void *rank_run(void *arg)
{
	struct rank_arg *a = arg;
	shim_cu.cuCtxSetCurrent(ctx);
	a->rc = a->comm != NULL ? ncclSuccess : ncclCommInitRank(&a->comm, 2, a->id, a->rank);
	for (int i = 0; i < a->steps && a->rc == ncclSuccess; i++)
		a->rc = ncclAllReduce((void *)a->buf, (void *)a->buf, 16, ncclFloat, ncclSum, a->comm, NULL);
	__atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void test_two_ranks(CUdeviceptr buf)
{
	struct rank_arg a[2] = { { .rank = 0, .buf = buf, .steps = 3 }, { .rank = 1, .buf = buf + 4096, .steps = 3 } };
	pthread_t th[2];
	struct gcr_err err = { 0 };
	CHECK(shim_nccl_lib.GetUniqueId(&a[0].id) == ncclSuccess);
	a[1].id = a[0].id;
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&th[i], NULL, rank_run, &a[i]) == 0);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(a[0].rc == ncclSuccess && a[1].rc == ncclSuccess);
	/* Both ranks are here: the group this process is, alone, can tear it down and make it again. */
	struct shim_nccl_rec *r0 = shim_nccl_rec_of(a[0].comm), *r1 = shim_nccl_rec_of(a[1].comm);
	CHECK(r0 != NULL && r1 != NULL && r0->key == r1->key && r0->rank == 0 && r1->rank == 1);
	struct gcr_group_targets t = { 0 }, wants;
	CHECK(shim_nccl_ops.freeze(1000, &err) == 0 && shim_nccl_ops.drain(&t, 5000, &wants, &err) == 0);
	CHECK(shim_nccl_ops.teardown(&err) == 0 && r0->real == NULL && r0->state == SHIM_NCCL_DOWN);
	int live, down, failed, held;
	shim_nccl_ops.counts(&live, &down, &failed, &held);
	CHECK(live == 0 && down == 2 && failed == 0);
	struct gcr_group_keys keys = { .n = 1, .key = { r0->key } };
	struct gcr_group_ids ids = { 0 };
	CHECK(shim_nccl_ops.ids(&keys, &ids, &err) == 0 && ids.n == 1 && ids.v[0].key == r0->key);
	struct gcr_group_keys none = { 0 };
	CHECK(shim_nccl_ops.rebuild(&ids, &none, 10000, NULL, &err) == 0);
	CHECK(r0->state == SHIM_NCCL_LIVE && r0->real != NULL && r1->real != NULL);
	shim_nccl_ops.thaw();
	/* The same handles all-reduce again, counted on from where they were. */
	long long before = count_of(a[0].comm);
	for (int i = 0; i < 2; i++) {
		a[i].steps = 2;
		a[i].done = 0;
		CHECK(pthread_create(&th[i], NULL, rank_run, &a[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	CHECK(a[0].rc == ncclSuccess && a[1].rc == ncclSuccess && count_of(a[0].comm) == before + 2);
	for (int i = 0; i < 2; i++)
		CHECK(ncclCommDestroy(a[i].comm) == ncclSuccess);
}

static void test_rebuild_failed(CUdeviceptr buf)
{
	ncclUniqueId id;
	struct gcr_err err = { 0 };
	ncclComm_t c = init1(&id), child = NULL;
	CHECK(ncclCommSplit(c, 0, 0, &child, NULL) == ncclSuccess && child != NULL);
	struct gcr_group_targets t = { 0 }, wants;
	CHECK(shim_nccl_ops.freeze(1000, &err) == 0 && shim_nccl_ops.drain(&t, 5000, &wants, &err) == 0);
	CHECK(shim_nccl_ops.teardown(&err) == 0);
	struct shim_nccl_rec *r = shim_nccl_rec_of(c), *rc = shim_nccl_rec_of(child);
	struct gcr_group_keys keys = { .n = 1, .key = { r->key } }, none = { 0 };
	struct gcr_group_ids ids = { 0 };
	/* A rebuild without an id for a communicator made by init is refused. */
	CHECK(shim_nccl_ops.rebuild(&ids, &none, 1000, NULL, &err) == -EINVAL && r->state == SHIM_NCCL_DOWN);
	CHECK(shim_nccl_ops.ids(&keys, &ids, &err) == 0);
	CHECK(shim_nccl_ops.rebuild(&ids, &none, 10000, NULL, &err) == 0 && rc->state == SHIM_NCCL_LIVE && rc->real);
	shim_nccl_ops.thaw();
	CHECK(ncclAllReduce((void *)buf, (void *)buf, 16, ncclFloat, ncclSum, child, NULL) == ncclSuccess);
	/* Down again, and this time its peers are gone: failed, the child with it. */
	CHECK(shim_nccl_ops.freeze(1000, &err) == 0 && shim_nccl_ops.drain(&t, 5000, &wants, &err) == 0);
	CHECK(shim_nccl_ops.teardown(&err) == 0);
	ids.n = 0;
	CHECK(shim_nccl_ops.rebuild(&ids, &keys, 1000, NULL, &err) == 0);
	shim_nccl_ops.thaw();
	CHECK(r->state == SHIM_NCCL_FAILED && rc->state == SHIM_NCCL_FAILED);
	ncclResult_t ae = ncclSuccess;
	CHECK(ncclAllReduce((void *)buf, (void *)buf, 16, ncclFloat, ncclSum, child, NULL) == ncclRemoteError);
	CHECK(ncclCommGetAsyncError(c, &ae) == ncclSuccess && ae == ncclRemoteError);
	CHECK(strstr(ncclGetLastError(c), "did not come back") != NULL);
	CHECK(ncclCommDestroy(child) == ncclSuccess && ncclCommDestroy(c) == ncclSuccess && shim_nccl_rec_of(c) == NULL);
}

static int group_open;
static void *open_group(void *arg)
{
	int *fds = arg;
	char b;
	ncclGroupStart();
	__atomic_store_n(&group_open, 1, __ATOMIC_RELEASE);
	if (read(fds[0], &b, 1) != 1)
		b = 0;
	ncclGroupEnd();
	return NULL;
}

static int is_open(void)
{
	return __atomic_load_n(&group_open, __ATOMIC_ACQUIRE);
}

static void test_refusals(CUdeviceptr buf)
{
	ncclUniqueId id;
	struct gcr_err err = { 0 };
	ncclComm_t c = init1(&id);
	ncclWindow_t win = NULL;
	CHECK(ncclCommWindowRegister(c, (void *)buf, 4096, &win, 0) == ncclSuccess);
	CHECK(shim_nccl_ops.check(&err) == -ENOTSUP && strstr(err.msg, "window") != NULL);
	CHECK(shim_nccl_ops.freeze(1000, &err) == -ENOTSUP); /* and nothing held */
	CHECK(ncclAllReduce((void *)buf, (void *)buf, 16, ncclFloat, ncclSum, c, NULL) == ncclSuccess);
	CHECK(ncclCommWindowDeregister(c, win) == ncclSuccess && shim_nccl_ops.check(&err) == 0);
	ncclRedOp_t op;
	float scalar = 2;
	CHECK(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, c) == ncclSuccess);
	CHECK(shim_nccl_ops.check(&err) == -ENOTSUP && strstr(err.msg, "reduction op") != NULL);
	CHECK(ncclRedOpDestroy(op, c) == ncclSuccess && shim_nccl_ops.check(&err) == 0);
	/* A group begun and not ended stops a freeze, which then holds nothing. */
	int fds[2];
	pthread_t th;
	CHECK(pipe(fds) == 0 && pthread_create(&th, NULL, open_group, fds) == 0);
	CHECK(wait_until(is_open));
	double t0 = now_ms();
	CHECK(shim_nccl_ops.freeze(100, &err) == -EBUSY && strstr(err.msg, "group open") != NULL &&
	      now_ms() - t0 < test_ms(5000));
	CHECK(atomic_load(&shim_nccl_hold.mode) == SHIM_NCCL_OPEN);
	CHECK(write(fds[1], "x", 1) == 1);
	pthread_join(th, NULL);
	close(fds[0]);
	close(fds[1]);
	CHECK(ncclCommDestroy(c) == ncclSuccess);
}

int main(void)
{
	char path[4096];
	const char *b = getenv("top_builddir");
	ctx = fake_setup();
	CHECK(ctx != NULL);
	snprintf(path, sizeof(path), "%s/tests/fakenccl/libnccl.so.2", b ? b : ".");
	void *h = ctx != NULL ? dlopen(path, RTLD_NOW | RTLD_GLOBAL) : NULL;
	CHECK(h != NULL);
	if (h == NULL) {
		fprintf(stderr, "%s\n", dlerror());
		return test_summary("test_shim_nccl");
	}
	CHECK(shim_nccl_load(NULL) == 0 && shim_nccl_lib.GetUniqueId != NULL);
	CUdeviceptr buf = 0;
	CHECK(shim_cu.cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	__typeof__(&cuMemAlloc_v2) alloc = (__typeof__(&cuMemAlloc_v2))shim_real_dlsym(shim_real_handle(SHIM_CUDA),
										     "cuMemAlloc_v2");
	CHECK(alloc != NULL && alloc(&buf, 1 << 16) == CUDA_SUCCESS);
	test_handles(buf);
	test_freeze_drain(buf);
	test_freeze_beside_queries();
	test_two_ranks(buf);
	test_rebuild_failed(buf);
	test_refusals(buf);
	fake_teardown();
	return test_summary("test_shim_nccl");
}
