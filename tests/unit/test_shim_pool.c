/* test_shim_pool: the stream-ordered arena (shim_pool) on fake GPU callbacks, no driver: reuse
 * on the same stream at once and by other streams only once the free completed (or after a
 * wait, when the GPU is full); coalescing, trim, release threshold, pool removal, stream
 * destruction, suspend's release; a random walk over three streams checking that no block is
 * handed out overlapping another or a free still pending elsewhere; and the cost of a pair. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shim_pool.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

/* ---- the fake GPU ---- */

struct fev {
	int done, live;
	uint64_t stream;
	struct fev *all; /* every event made, freed by fresh(): tests read them after unmark */
};
static struct fev *fevs;

static void fevs_free(void)
{
	while (fevs != NULL) {
		struct fev *n = fevs->all;
		free(fevs);
		fevs = n;
	}
}

static struct {
	uint64_t next_va;
	size_t cap, used; /* device bytes: seg_new fails with -ENOMEM past cap */
	int segs, seg_news, seg_frees, marks, unmarks, queries, waits, accesses;
	uint64_t waited_stream;
	struct fev *waited_ev;
	int fail_mark;
} gpu;

static int f_seg_new(int device, size_t size, const struct shim_gpu_access *acc, size_t n, uint64_t *va)
{
	(void)device;
	(void)acc;
	(void)n;
	if (gpu.used + size > gpu.cap)
		return -ENOMEM;
	gpu.used += size;
	*va = gpu.next_va;
	gpu.next_va += size + 2 * MIB; /* a hole between segments: no accidental adjacency */
	gpu.segs++;
	gpu.seg_news++;
	return 0;
}

static void f_seg_free(uint64_t va, size_t size)
{
	(void)va;
	gpu.used -= size;
	gpu.segs--;
	gpu.seg_frees++;
}

static int f_seg_access(uint64_t va, size_t size, const struct shim_gpu_access *acc, size_t n)
{
	(void)va;
	(void)size;
	(void)acc;
	(void)n;
	gpu.accesses++;
	return 0;
}

static int f_mark(const struct shim_pool_stream *s, void **ev)
{
	uint64_t stream = s->handle;
	if (gpu.fail_mark)
		return -EINVAL;
	struct fev *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return -ENOMEM;
	e->all = fevs;
	fevs = e;
	e->live = 1;
	e->stream = stream;
	*ev = e;
	gpu.marks++;
	return 0;
}

/* Events are kept until the next fresh() so the random walk can still read them after unmark. */
static int f_done(void *ev)
{
	gpu.queries++;
	return ((struct fev *)ev)->done;
}

static int f_wait(uint64_t stream, int variant, void *ev)
{
	(void)variant;
	gpu.waits++;
	gpu.waited_stream = stream;
	gpu.waited_ev = ev;
	return 0;
}

static void f_unmark(void *ev)
{
	((struct fev *)ev)->live = 0;
	gpu.unmarks++;
}

static const struct shim_pool_ops fops = { f_seg_new, f_seg_free, f_seg_access, f_mark, f_done, f_wait, f_unmark };

static void fresh(size_t cap)
{
	shim_pool_reset();
	fevs_free();
	memset(&gpu, 0, sizeof(gpu));
	gpu.next_va = 0x700000000000ULL;
	gpu.cap = cap;
}

static struct shim_pool_stream S(uint64_t h)
{
	return (struct shim_pool_stream){ .handle = h };
}

/* The newest marker the fake handed out (the free just made). */
static struct fev *last_ev;
static int mark_spy(const struct shim_pool_stream *s, void **ev)
{
	int r = f_mark(s, ev);
	if (r == 0)
		last_ev = *ev;
	return r;
}

static const struct shim_pool_ops sops = { f_seg_new, f_seg_free, f_seg_access, mark_spy, f_done, f_wait, f_unmark };

static void test_stream_order(void)
{
	fresh(1024 * MIB);
	struct shim_pool_stream s1 = S(0x10), s2 = S(0x20);
	uint64_t a = 0, b = 0, c = 0, d = 0;
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == 0);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == -EEXIST);
	CHECK(shim_pool_served(1) && !shim_pool_served(2));
	CHECK(shim_pool_alloc(2, 100, &s1, 0, &a) == -ENOENT);
	CHECK(shim_pool_alloc(1, 0, &s1, 0, &a) == -EINVAL);
	CHECK(shim_pool_alloc(1, MIB, &s1, 0, &a) == 0 && a % 512 == 0);
	CHECK(gpu.seg_news == 1 && gpu.used == 2 * MIB);
	CHECK(shim_pool_free(a, &s1, 0) == 0);
	struct fev *ev_a = last_ev;
	CHECK(shim_pool_free(a, &s1, 0) == -ENOENT); /* twice: not a block any more */
	/* Same stream: at once, no GPU call. */
	int q = gpu.queries, m = gpu.marks;
	CHECK(shim_pool_alloc(1, MIB - 100, &s1, 0, &b) == 0 && b == a);
	CHECK(gpu.queries == q && gpu.marks == m && gpu.seg_news == 1);
	CHECK(shim_pool_free(b, &s1, 0) == 0);
	ev_a = last_ev;
	/* Another stream: the rest of the segment, then a new one, never the pending block. */
	CHECK(shim_pool_alloc(1, MIB, &s2, 0, &c) == 0 && c == a + MIB);
	CHECK(shim_pool_alloc(1, MIB, &s2, 0, &d) == 0 && d != a && gpu.seg_news == 2);
	uint64_t d2 = 0;
	CHECK(shim_pool_alloc(1, MIB, &s2, 0, &d2) == 0 && d2 == d + MIB);
	CHECK(shim_pool_free(d, &s2, 0) == 0);
	/* Once the free completed on the GPU, any stream may take it (opportunistic). */
	ev_a->done = 1;
	uint64_t e = 0;
	struct shim_pool_stream s3 = S(0x30);
	CHECK(shim_pool_alloc(1, MIB, &s3, 0, &e) == 0 && e == a);
	/* With opportunistic reuse off, completed-but-unknown frees are not asked about. */
	CHECK(shim_pool_set_attr(1, SHIM_POOL_REUSE_OPPORTUNISTIC, 0) == 0);
	last_ev->done = 1; /* d's free */
	q = gpu.queries;
	uint64_t f = 0;
	CHECK(shim_pool_alloc(1, MIB, &s3, 0, &f) == 0 && f != d && gpu.queries == q);
	uint64_t v = 9;
	CHECK(shim_pool_get_attr(1, SHIM_POOL_REUSE_OPPORTUNISTIC, &v) == 0 && v == 0);
	CHECK(shim_pool_get_attr(1, SHIM_POOL_USED_CURRENT, &v) == 0 && v == 4 * MIB);
	CHECK(shim_pool_get_attr(1, SHIM_POOL_RESERVED_CURRENT, &v) == 0 && v == 6 * MIB);
	/* Lookups: interior pointers, the size asked for, nothing past it. */
	uint64_t base = 0;
	size_t sz = 0;
	int dev = -1;
	CHECK(shim_pool_block(c + 4096, &base, &sz, &dev) && base == c && sz == MIB && dev == 0);
	CHECK(!shim_pool_block(d + 16, NULL, NULL, NULL)); /* freed */
	CHECK(!shim_pool_block(0x1000, NULL, NULL, NULL));
}

static void test_variants_and_threads(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &fops) == 0);
	struct shim_pool_stream legacy = { 1, 0, 0 }, pt1 = { 2, 111, 1 }, pt2 = { 2, 222, 1 };
	uint64_t a = 0, b = 0;
	CHECK(shim_pool_alloc(1, 4096, &pt1, 0, &a) == 0 && shim_pool_free(a, &pt1, 0) == 0);
	/* Another thread's per-thread stream, and the legacy stream, are other streams. */
	CHECK(shim_pool_alloc(1, 4096, &pt2, 0, &b) == 0 && b != a);
	CHECK(shim_pool_alloc(1, 4096, &legacy, 0, &b) == 0 && b != a);
	CHECK(shim_pool_alloc(1, 4096, &pt1, 0, &b) == 0 && b == a);
}

static void test_out_of_memory_waits(void)
{
	fresh(4 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == 0);
	struct shim_pool_stream s1 = S(0x10), s2 = S(0x20);
	uint64_t a = 0, b = 0, c = 0;
	CHECK(shim_pool_alloc(1, 2 * MIB, &s1, 0, &a) == -ENOMEM); /* medium: a 32 MiB segment does not fit */
	fresh(64 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == 0);
	CHECK(shim_pool_alloc(1, 20 * MIB, &s1, 0, &a) == 0 && shim_pool_alloc(1, 20 * MIB, &s1, 0, &b) == 0);
	CHECK(gpu.used == 64 * MIB);
	CHECK(shim_pool_free(a, &s1, 0) == 0);
	struct fev *ev = last_ev;
	/* Internal dependencies off: the GPU is full and the free is pending elsewhere. */
	CHECK(shim_pool_set_attr(1, SHIM_POOL_REUSE_INTERNAL_DEPS, 0) == 0);
	CHECK(shim_pool_alloc(1, 20 * MIB, &s2, 0, &c) == -ENOMEM);
	CHECK(shim_pool_set_attr(1, SHIM_POOL_REUSE_INTERNAL_DEPS, 1) == 0);
	CHECK(shim_pool_alloc(1, 20 * MIB, &s2, 0, &c) == 0 && c == a);
	CHECK(gpu.waits == 1 && gpu.waited_stream == 0x20 && gpu.waited_ev == ev);
	/* Idle segments of other pools go before the GPU counts as full. */
	CHECK(shim_pool_add(2, 0, 2 * MIB, &sops) == 0);
	struct shim_pool_stats st;
	shim_pool_stats(&st);
	CHECK(st.pools == 2 && st.reuses_waited == 1);
}

static void test_coalesce_trim_threshold(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == 0);
	struct shim_pool_stream s1 = S(0x10);
	uint64_t x[4];
	for (int i = 0; i < 4; i++)
		CHECK(shim_pool_alloc(1, 512 * 1024, &s1, 0, &x[i]) == 0);
	CHECK(gpu.seg_news == 1);
	/* Out of order, pending on one stream: they coalesce under the newest marker. */
	int um = gpu.unmarks;
	CHECK(shim_pool_free(x[1], &s1, 0) == 0 && shim_pool_free(x[3], &s1, 0) == 0);
	CHECK(shim_pool_free(x[2], &s1, 0) == 0 && shim_pool_free(x[0], &s1, 0) == 0);
	CHECK(gpu.unmarks == um + 3); /* the three older markers went back */
	uint64_t big = 0;
	CHECK(shim_pool_alloc(1, MIB, &s1, 0, &big) == 0 && big == x[0] && gpu.seg_news == 1);
	CHECK(shim_pool_free(big, &s1, 0) == 0);
	struct shim_pool_stats st;
	shim_pool_stats(&st);
	CHECK(st.pending_frees == 1 && st.blocks == 0 && st.segments == 1);
	/* Trim does not release what is pending on the GPU, and does once it completed. */
	CHECK(shim_pool_trim(1, 0) == 0 && gpu.seg_frees == 0);
	last_ev->done = 1;
	CHECK(shim_pool_trim(1, 0) == 0 && gpu.seg_frees == 1 && gpu.used == 0);
	CHECK(gpu.marks == gpu.unmarks);
	/* Release threshold: a synchronisation shrinks the pool down to it. */
	CHECK(shim_pool_set_attr(1, SHIM_POOL_RELEASE_THRESHOLD, 3 * MIB) == 0);
	uint64_t a[3];
	for (int i = 0; i < 3; i++)
		CHECK(shim_pool_alloc(1, MIB + 1, &s1, 0, &a[i]) == 0); /* three 2 MiB segments? no: medium */
	CHECK(gpu.seg_news == 2 && gpu.used == 32 * MIB);
	CHECK(!shim_pool_sync_wanted());
	for (int i = 0; i < 3; i++)
		CHECK(shim_pool_free(a[i], &s1, 0) == 0);
	CHECK(shim_pool_sync_wanted());
	shim_pool_synced(&s1);
	CHECK(gpu.used == 0 && !shim_pool_sync_wanted());
	/* The threshold keeps segments: small ones, 2 MiB each. */
	uint64_t k[3];
	for (int i = 0; i < 3; i++)
		CHECK(shim_pool_alloc(1, MIB, &s1, 0, &k[i]) == 0);
	CHECK(gpu.used == 4 * MIB);
	for (int i = 0; i < 3; i++)
		CHECK(shim_pool_free(k[i], &s1, SHIM_POOL_DONE) == 0);
	CHECK(shim_pool_sync_wanted());
	shim_pool_synced(NULL);
	CHECK(gpu.used == 2 * MIB); /* 4 MiB > 3 MiB: one segment went */
	uint64_t v = 0;
	CHECK(shim_pool_get_attr(1, SHIM_POOL_RESERVED_HIGH, &v) == 0 && v == 32 * MIB);
	CHECK(shim_pool_set_attr(1, SHIM_POOL_RESERVED_HIGH, 0) == 0);
	CHECK(shim_pool_get_attr(1, SHIM_POOL_RESERVED_HIGH, &v) == 0 && v == 2 * MIB);
	CHECK(shim_pool_set_attr(1, SHIM_POOL_USED_CURRENT, 0) == -EINVAL);
}

static void test_large_access_remove(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(7, 3, 2 * MIB, &fops) == 0);
	struct shim_pool_stream s1 = S(0x10);
	uint64_t big = 0, small = 0;
	CHECK(shim_pool_alloc(7, 33 * MIB + 5, &s1, 0, &big) == 0 && gpu.used == 34 * MIB);
	CHECK(shim_pool_alloc(7, 10, &s1, 0, &small) == 0);
	struct shim_gpu_access acc[2] = { { SHIM_GPU_LOC_DEVICE, 3, SHIM_GPU_PROT_READWRITE },
					  { SHIM_GPU_LOC_DEVICE, 4, SHIM_GPU_PROT_READ } };
	CHECK(shim_pool_set_access(7, acc, 2) == 0 && gpu.accesses == 2); /* each segment */
	acc[1].flags = SHIM_GPU_PROT_READWRITE;
	CHECK(shim_pool_set_access(7, &acc[1], 1) == 0);
	struct shim_gpu_access got[4];
	size_t n = 4;
	CHECK(shim_pool_get_access(7, got, &n) == 0 && n == 2 && got[1].id == 4 &&
	      got[1].flags == SHIM_GPU_PROT_READWRITE);
	/* Destroyed with live blocks: the key goes, blocks stay valid until freed. */
	CHECK(shim_pool_remove(7) == 0 && !shim_pool_served(7) && shim_pool_remove(7) == -ENOENT);
	CHECK(gpu.used == 36 * MIB);
	CHECK(shim_pool_block(big, NULL, NULL, NULL));
	CHECK(shim_pool_free(big, NULL, SHIM_POOL_DONE) == 0 && gpu.used == 2 * MIB);
	CHECK(shim_pool_free(small, &s1, 0) == 0 && gpu.used == 2 * MIB); /* pending */
	CHECK(shim_pool_release_idle() == 2 * MIB && gpu.used == 0);
	struct shim_pool_stats st;
	shim_pool_stats(&st);
	CHECK(st.pools == 0 && st.segments == 0 && st.reserved_bytes == 0);
	CHECK(gpu.marks == gpu.unmarks);
}

static void test_stream_gone_graph_mark_failure(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &fops) == 0);
	struct shim_pool_stream s1 = S(0x10);
	uint64_t a = 0, b = 0;
	CHECK(shim_pool_alloc(1, 4096, &s1, 0, &a) == 0 && shim_pool_free(a, &s1, 0) == 0);
	/* A new stream with the destroyed one's handle is another stream. */
	shim_pool_stream_gone(&s1);
	CHECK(shim_pool_alloc(1, 4096, &s1, 0, &b) == 0 && b != a);
	/* A capture takes no pending extent, even its own stream's. */
	CHECK(shim_pool_free(b, &s1, 0) == 0);
	uint64_t g = 0;
	CHECK(shim_pool_graph_alloc(1, 4096, 0x77, &g) == 0 && g != b && g != a);
	CHECK(shim_pool_graph_adopt(g, 0x77) == 0);
	struct shim_pool_stats st;
	shim_pool_stats(&st);
	CHECK(st.graph_bytes == 4096 && st.blocks == 1 && st.pending_frees == 2);
	/* A marker that cannot be recorded leaves the block allocated. */
	uint64_t c = 0;
	CHECK(shim_pool_alloc(1, 4096, &s1, 0, &c) == 0 && c == b);
	gpu.fail_mark = 1;
	CHECK(shim_pool_free(c, &s1, 0) == -EINVAL && shim_pool_block(c, NULL, NULL, NULL));
	gpu.fail_mark = 0;
	CHECK(shim_pool_free(c, &s1, 0) == 0);
	/* Suspend: every free has completed, idle segments go; the graph's block keeps its own. */
	CHECK(shim_pool_release_idle() == 0 && gpu.used == 2 * MIB);
	shim_pool_stats(&st);
	CHECK(st.pending_frees == 0);
}

/* Graph-owned blocks: capture -> graph -> clone, parent, executable; released only when the
 * last holder goes, and then only after every stream's work is done; never reused while held. */
static void test_graph_holders(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &sops) == 0);
	struct shim_pool_stream s1 = S(0x10);
	enum { CAP = 1, GR, CLONE, PARENT, EXEC, EXEC2 };
	uint64_t a = 0, b = 0, l = 0, x = 0;
	/* Another stream's pending free is not a capture's (the replay may run before it). */
	CHECK(shim_pool_alloc(1, 4096, &s1, 0, &x) == 0 && shim_pool_free(x, &s1, 0) == 0);
	CHECK(shim_pool_graph_alloc(1, 4096, CAP, &a) == 0 && a != x);
	/* A block allocated outside and freed inside the capture becomes the capture's. */
	CHECK(shim_pool_alloc(1, 8192, &s1, 0, &l) == 0);
	CHECK(shim_pool_graph_adopt(l, CAP) == 0 && shim_pool_graph_adopt(a, CAP) == 0);
	CHECK(shim_pool_graph_adopt(0x1234, CAP) == -ENOENT);
	/* A free outside the graph leaves it to the graph. */
	CHECK(shim_pool_free(l, &s1, 0) == 0 && shim_pool_block(l, NULL, NULL, NULL));
	struct shim_pool_stats st;
	shim_pool_stats(&st);
	CHECK(st.graph_bytes == 4096 + 8192 && st.blocks == 2);
	/* End of capture: the graph holds them, the capture id no more. */
	CHECK(shim_pool_graph_share(GR, CAP) == 0 && shim_pool_graph_drop(CAP) == 0);
	CHECK(shim_pool_graph_share(CLONE, GR) == 0 && shim_pool_graph_share(PARENT, CLONE) == 0);
	CHECK(shim_pool_graph_share(EXEC, GR) == 0 && shim_pool_graph_share(EXEC2, PARENT) == 0);
	CHECK(shim_pool_graph_share(EXEC, 999) == 0); /* holds nothing: nothing shared */
	/* An explicit node's block: b, undone when the node could not be added. */
	CHECK(shim_pool_graph_alloc(1, 4096, GR, &b) == 0 && b != a && b != l);
	CHECK(shim_pool_graph_undo(b, GR) == 0 && !shim_pool_block(b, NULL, NULL, NULL));
	CHECK(shim_pool_graph_undo(b, GR) == -ENOENT);
	/* Each holder but the last: nothing released. */
	CHECK(shim_pool_graph_drop(GR) == 0 && shim_pool_graph_drop(EXEC) == 0);
	CHECK(shim_pool_graph_drop(CLONE) == 0 && shim_pool_graph_drop(PARENT) == 0);
	CHECK(shim_pool_block(a, NULL, NULL, NULL) && shim_pool_block(l, NULL, NULL, NULL));
	uint64_t c = 0;
	CHECK(shim_pool_alloc(1, 4096, &s1, 0, &c) == 0 && c != a && c != l);
	CHECK(shim_pool_free(c, &s1, 0) == 0);
	CHECK(shim_pool_graph_drop(EXEC2) == 2 && shim_pool_graph_drop(EXEC2) == 0);
	CHECK(!shim_pool_block(a, NULL, NULL, NULL) && !shim_pool_block(l, NULL, NULL, NULL));
	shim_pool_stats(&st);
	CHECK(st.graph_bytes == 0 && st.blocks == 0 && st.pending_frees >= 2);
	/* Released, but a replay may still run: no other stream gets them, even polling. */
	struct shim_pool_stream s2 = S(0x20);
	uint64_t d = 0, e = 0;
	last_ev->done = 1;
	CHECK(shim_pool_alloc(1, 4096, &s2, 0, &d) == 0 && d != a && d != l);
	CHECK(shim_pool_graph_alloc(1, 4096, CAP, &e) == 0 && e != a && e != l);
	/* A stream synchronize says nothing of the graph's replays; a device-wide one does. (c, a and l
	 * are adjacent, 16 KiB together: the best fit for 12 KiB once they are all free.) */
	shim_pool_synced(&s2);
	CHECK(shim_pool_alloc(1, 8192 + 4096, &s2, 0, &x) == 0 && x != a && x != l);
	shim_pool_synced(NULL);
	uint64_t f = 0;
	CHECK(shim_pool_alloc(1, 8192 + 4096, &s2, 0, &f) == 0 && f == c); /* c, a and l joined */
	shim_pool_stats(&st);
	CHECK(st.pending_frees == 0);
	/* A removed pool keeps a held block until its graph goes; suspend then releases all. */
	CHECK(shim_pool_remove(1) == 0 && shim_pool_block(e, NULL, NULL, NULL));
	CHECK(shim_pool_free(d, &s2, 0) == 0 && shim_pool_free(x, &s2, 0) == 0 && shim_pool_free(f, &s2, 0) == 0);
	CHECK(gpu.segs == 1);
	/* e was never freed in its graph: as with the driver it outlives the graph, the
	 * application's to free (PyTorch frees such tensors after the graph is gone). */
	CHECK(shim_pool_graph_drop(CAP) == 0 && shim_pool_block(e, NULL, NULL, NULL) && gpu.segs == 1);
	CHECK(shim_pool_free(e, &s2, 0) == 0 && !shim_pool_block(e, NULL, NULL, NULL));
	CHECK(shim_pool_release_idle() == 2 * MIB && gpu.segs == 0);
	shim_pool_stats(&st);
	CHECK(st.segments == 0 && st.pending_frees == 0 && gpu.marks == gpu.unmarks);
}

/* ---- random walk ---- */

struct live {
	uint64_t va;
	size_t n;
	uint64_t stream;
};
struct freed {
	uint64_t va;
	size_t n;
	uint64_t stream;
	size_t pos;  /* events its stream had recorded before the free: it is done once one more is */
	size_t fidx; /* its index among its stream's frees: done once a synchronise came after it */
};

/* Every event a stream recorded, in order: the fake GPU completes them in that order. */
static struct fev *evs[3][200000];
static size_t nev[3], upto[3];

static int walk_mark(const struct shim_pool_stream *s, void **ev)
{
	int r = mark_spy(s, ev);
	size_t k = s->handle / 0x10 - 1;
	if (r == 0 && k < 3 && nev[k] < 200000)
		evs[k][nev[k]++] = *ev;
	return r;
}

static const struct shim_pool_ops wops = { f_seg_new, f_seg_free, f_seg_access, walk_mark, f_done, f_wait, f_unmark };

/* lazy: frees with SHIM_POOL_LAZY (the marker is recorded when another stream wants the block). */
static void test_random_walk(int lazy)
{
	fresh(96 * MIB);
	memset(nev, 0, sizeof(nev));
	memset(upto, 0, sizeof(upto));
	CHECK(shim_pool_add(1, 0, 2 * MIB, &wops) == 0);
	enum { NL = 256, NF = 4096 };
	static struct live lv[NL];
	static struct freed fr[NF];
	size_t nl = 0, nf = 0;
	int bad_overlap = 0, bad_order = 0, ooms = 0, frees = 0;
	size_t nfree[3] = { 0 }, synced[3] = { 0 };
	srand(19);
	for (int it = 0; it < 200000; it++) {
		int op = rand() % 100;
		uint64_t sh = 0x10 * (1 + (uint64_t)(rand() % 3));
		struct shim_pool_stream s = S(sh);
		if (op < 5) {
			for (int k = 0; k < 3; k++)
				for (size_t stop = upto[k] + (size_t)rand() % 8; upto[k] < nev[k] && upto[k] < stop;)
					evs[k][upto[k]++]->done = 1;
		} else if (op < 50 && nl < NL) {
			size_t n = rand() % 4 == 0 ? (size_t)(rand() % (40 << 20)) + 1 : (size_t)(rand() % 65536) + 1;
			uint64_t va = 0;
			gpu.waited_ev = NULL;
			int r = shim_pool_alloc(1, n, &s, 0, &va);
			if (r == -ENOMEM) {
				ooms++;
				continue;
			}
			CHECK(r == 0);
			for (size_t i = 0; i < nl; i++)
				bad_overlap += va < lv[i].va + lv[i].n && lv[i].va < va + n;
			for (size_t i = 0; i < nf; i++) {
				if (!(va < fr[i].va + fr[i].n && fr[i].va < va + n))
					continue;
				size_t k = fr[i].stream / 0x10 - 1;
				int ok = fr[i].stream == sh || upto[k] > fr[i].pos || synced[k] > fr[i].fidx ||
					 (gpu.waited_ev != NULL && gpu.waited_ev->stream == fr[i].stream);
				bad_order += !ok;
				fr[i] = fr[--nf]; /* reused: that free is settled */
				i--;
			}
			lv[nl++] = (struct live){ va, n, sh };
		} else if (nl > 0) {
			size_t i = (size_t)rand() % nl;
			/* A free on another stream than the allocation, sometimes. */
			size_t pos = nev[sh / 0x10 - 1];
			frees++;
			CHECK(shim_pool_free(lv[i].va, &s, lazy ? SHIM_POOL_LAZY : 0) == 0);
			if (nf < NF)
				fr[nf++] = (struct freed){ lv[i].va, lv[i].n, sh, pos, nfree[sh / 0x10 - 1] };
			nfree[sh / 0x10 - 1]++;
			lv[i] = lv[--nl];
		}
		if (op == 99) {
			/* A synchronisation: that stream's (or every stream's) work is done. */
			int all = rand() % 2;
			for (int k = 0; k < 3; k++)
				if (all || (uint64_t)(k + 1) * 0x10 == sh) {
					while (upto[k] < nev[k])
						evs[k][upto[k]++]->done = 1;
					synced[k] = nfree[k];
				}
			shim_pool_synced(all ? NULL : &s);
		}
	}
	CHECK(bad_overlap == 0);
	CHECK(bad_order == 0);
	/* Lazy: markers only where another stream wanted a block, far fewer than frees. */
	CHECK(!lazy || gpu.marks < frees / 2);
	printf("random walk (%s markers): %d out-of-memory answers, %d segment creations, %d markers for %d frees\n",
	       lazy ? "lazy" : "eager", ooms, gpu.seg_news, gpu.marks, frees);
	for (size_t i = 0; i < nl; i++)
		CHECK(shim_pool_free(lv[i].va, NULL, SHIM_POOL_DONE) == 0);
	CHECK(shim_pool_release_idle() > 0 && gpu.used == 0 && gpu.marks == gpu.unmarks);
}

/* ---- cost of the fast path ---- */

static struct fev bench_ev;
static int bench_mark(const struct shim_pool_stream *s, void **ev)
{
	(void)s;
	*ev = &bench_ev;
	return 0;
}
static void bench_unmark(void *ev)
{
	(void)ev;
}
static const struct shim_pool_ops bops = { f_seg_new, f_seg_free, f_seg_access, bench_mark, f_done, f_wait, bench_unmark };

static void bench_pair(void)
{
	fresh(1024 * MIB);
	CHECK(shim_pool_add(1, 0, 2 * MIB, &bops) == 0);
	struct shim_pool_stream s = S(0x10);
	uint64_t keep[64];
	for (int i = 0; i < 64; i++) /* a realistic table: other blocks live */
		CHECK(shim_pool_alloc(1, (size_t)(i + 1) * 4096, &s, 0, &keep[i]) == 0);
	const int n = 1000000;
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	int fails = 0;
	for (int i = 0; i < n; i++) {
		uint64_t va = 0;
		fails += shim_pool_alloc(1, (size_t)(1 + i % 8) * 65536, &s, 0, &va) != 0;
		fails += shim_pool_free(va, &s, 0) != 0;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	CHECK(fails == 0);
	double ns = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / n;
	printf("arena alloc+free pair, same stream (fake marker): %.0f ns\n", ns);
}

int main(void)
{
	test_stream_order();
	test_variants_and_threads();
	test_out_of_memory_waits();
	test_coalesce_trim_threshold();
	test_large_access_remove();
	test_stream_gone_graph_mark_failure();
	test_graph_holders();
	test_random_walk(0);
	test_random_walk(1);
	bench_pair();
	shim_pool_reset();
	shim_pool_reset();
	fevs_free();
	return test_summary("test_shim_pool");
}
