/* test_shim_cuda_pool: stream-ordered allocation through the CUDA entry points (shim_cuda_pool.c)
 * on the stand-in driver: the default pool and a created pool are served by the shim's arena
 * (the driver's pools hold nothing), same-stream reuse at once, a held stream's pending free is
 * not handed to another stream, attributes are answered from the arena, suspend's release of
 * idle segments; graph memory (captured allocations and frees, explicit and generic memory
 * nodes, clones, child graphs, executables: released only after the last holder; suspend moves
 * a graph's memory and its replay after resume uses the same addresses; nothing is the
 * driver's); and the cost of an alloc+free pair through the entry points. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "fakecuda_test.h"
#include "fakecuda_util.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_cr.h"
#include "shim_pool.h"
#include "shim_cuda_real.h"
#include "shim_real.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Stand-in calls the shim does not interpose, straight from it. */
#define REAL(fn) ((__typeof__(&fn))shim_real_dlsym(shim_real_handle(SHIM_CUDA), #fn))

static struct shim_pool_stats pstats(void)
{
	struct shim_pool_stats ps;
	shim_pool_stats(&ps);
	return ps;
}

static int is_block(CUdeviceptr p)
{
	return shim_pool_block(p, NULL, NULL, NULL);
}

/* The driver's own graph memory on device 0 (must stay 0: the arena serves it). */
static cuuint64_t driver_graph_bytes(void)
{
	__typeof__(&cuDeviceGetGraphMemAttribute) get = (__typeof__(&cuDeviceGetGraphMemAttribute))shim_real_dlsym(
		shim_real_handle(SHIM_CUDA), "cuDeviceGetGraphMemAttribute");
	cuuint64_t v = UINT64_MAX;
	if (get == NULL || get(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v) != CUDA_SUCCESS)
		return UINT64_MAX;
	return v;
}

static int all_words(CUdeviceptr p, size_t words, uint32_t want)
{
	static uint32_t h[1 << 16];
	if (words > sizeof(h) / sizeof(h[0]) || cuMemcpyDtoH_v2(h, p, words * 4) != CUDA_SUCCESS)
		return 0;
	for (size_t i = 0; i < words; i++)
		if (h[i] != want)
			return 0;
	return 1;
}

/* A capture that allocates, writes, copies out and frees, replayed; a block allocated outside
 * and freed inside; the memory outlives the graph while a clone, a parent or an executable
 * holds it. */
static void test_captured_graphs(void)
{
	const size_t n = 64 * 1024, words = n / 4;
	CUstream s3 = NULL;
	CHECK(shim_cu.cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CUdeviceptr out = 0, pre = 0, g1 = 0;
	CHECK(cuMemAlloc_v2(&out, n) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&pre, n, s3) == CUDA_SUCCESS && cuStreamSynchronize(s3) == CUDA_SUCCESS);
	struct shim_pool_stats ps0 = pstats();
	CHECK(cuStreamBeginCapture_v2(s3, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&g1, n, s3) == CUDA_SUCCESS && is_block(g1) && g1 != pre);
	CHECK(cuMemsetD32Async(g1, 0xabcu, words, s3) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoDAsync_v2(out, g1, n, s3) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(g1, s3) == CUDA_SUCCESS && cuMemFreeAsync(pre, s3) == CUDA_SUCCESS);
	CUgraph g = NULL;
	CHECK(cuStreamEndCapture(s3, &g) == CUDA_SUCCESS && g != NULL);
	struct shim_pool_stats ps = pstats();
	CHECK(ps.graph_bytes == ps0.graph_bytes + 2 * n && ps.blocks == ps0.blocks + 1);
	CHECK(driver_graph_bytes() == 0);
	struct shim_alloc_stats ast;
	shim_alloc_stats(&ast);
	CHECK(ast.async_buffers == 0);
	/* A free of graph memory outside the graph leaves it to the graph. */
	CHECK(cuMemFreeAsync(pre, s3) == CUDA_SUCCESS && is_block(pre));

	CUgraphExec e = NULL, e2 = NULL;
	CHECK(cuGraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS);
	for (int i = 0; i < 2; i++) {
		CHECK(cuMemsetD32_v2(out, 0, words) == CUDA_SUCCESS);
		CHECK(cuGraphLaunch(e, s3) == CUDA_SUCCESS && cuStreamSynchronize(s3) == CUDA_SUCCESS);
		CHECK(all_words(out, words, 0xabcu));
	}
	/* No other allocation lands in the graph's blocks while it lives. */
	CUdeviceptr o = 0;
	CHECK(cuMemAllocAsync(&o, n, s3) == CUDA_SUCCESS && o != g1 && o != pre);
	CHECK(cuMemFreeAsync(o, s3) == CUDA_SUCCESS && cuStreamSynchronize(s3) == CUDA_SUCCESS);

	CUgraph c = NULL, parent = NULL;
	CUgraphNode child = NULL;
	CHECK(cuGraphClone(&c, g) == CUDA_SUCCESS);
	CHECK(REAL(cuGraphCreate)(&parent, 0) == CUDA_SUCCESS);
	CHECK(cuGraphAddChildGraphNode(&child, parent, NULL, 0, c) == CUDA_SUCCESS);
	CHECK(cuGraphDestroy(g) == CUDA_SUCCESS && is_block(g1) && is_block(pre));
	CHECK(cuGraphExecDestroy(e) == CUDA_SUCCESS && is_block(g1));
	CHECK(cuGraphDestroy(c) == CUDA_SUCCESS && is_block(g1));
	CHECK(cuGraphInstantiateWithFlags(&e2, parent, 0) == CUDA_SUCCESS);
	CHECK(cuGraphDestroy(parent) == CUDA_SUCCESS && is_block(g1));
	CHECK(cuMemsetD32_v2(out, 0, words) == CUDA_SUCCESS);
	CHECK(cuGraphLaunch(e2, s3) == CUDA_SUCCESS && cuStreamSynchronize(s3) == CUDA_SUCCESS);
	CHECK(all_words(out, words, 0xabcu));
	/* The last holder: released, reusable once every stream's work is done. */
	CHECK(cuGraphExecDestroy(e2) == CUDA_SUCCESS && !is_block(g1) && !is_block(pre));
	ps = pstats();
	CHECK(ps.graph_bytes == ps0.graph_bytes && ps.pending_frees >= 2);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	ps = pstats();
	CHECK(ps.pending_frees == 0);
	/* An invalidated capture's memory goes with it. */
	CHECK(cuStreamBeginCapture_v2(s3, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&g1, n, s3) == CUDA_SUCCESS && is_block(g1));
	CUstreamCaptureStatus cs;
	(void)REAL(cuStreamQuery)(s3); /* illegal while capturing: invalidates it */
	CHECK(REAL(cuStreamIsCapturing)(s3, &cs) == CUDA_SUCCESS && cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	CHECK(cuStreamEndCapture(s3, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED && !is_block(g1));
	CHECK(cuMemFree_v2(out) == CUDA_SUCCESS && cuStreamDestroy_v2(s3) == CUDA_SUCCESS);
}

/* Explicit and generic memory nodes: arena blocks behind empty nodes; a node that cannot be
 * added gives its block back at once. */
static void test_explicit_nodes(void)
{
	CUstream s = NULL;
	CHECK(shim_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	struct shim_pool_stats ps0 = pstats();
	CUgraph g = NULL;
	CHECK(REAL(cuGraphCreate)(&g, 0) == CUDA_SUCCESS);
	CUDA_MEM_ALLOC_NODE_PARAMS ap = { .poolProps = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
							 .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } },
					  .bytesize = 3 * MIB };
	CUgraphNode na = NULL, nf = NULL, na2 = NULL, nf2 = NULL, nf3 = NULL;
	CHECK(cuGraphAddMemAllocNode(&na, g, NULL, 0, &ap) == CUDA_SUCCESS && is_block(ap.dptr));
	CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
	CHECK(REAL(cuGraphNodeGetType)(na, &type) == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_EMPTY);
	CHECK(cuGraphAddMemFreeNode(&nf, g, &na, 1, ap.dptr) == CUDA_SUCCESS);
	CUgraphNodeParams np = { .type = CU_GRAPH_NODE_TYPE_MEM_ALLOC };
	np.alloc.poolProps = ap.poolProps;
	np.alloc.bytesize = 4096;
	CHECK(cuGraphAddNode_v2(&na2, g, &nf, NULL, 1, &np) == CUDA_SUCCESS && is_block(np.alloc.dptr));
	CUdeviceptr na2_ptr = np.alloc.dptr;
	np = (CUgraphNodeParams){ .type = CU_GRAPH_NODE_TYPE_MEM_FREE };
	np.free.dptr = na2_ptr;
	CHECK(cuGraphAddNode_v2(&nf2, g, &na2, NULL, 1, &np) == CUDA_SUCCESS);
	/* A block allocated outside, freed by the graph: the graph's from here on. */
	CUdeviceptr out = 0;
	CHECK(cuMemAllocAsync(&out, 8192, s) == CUDA_SUCCESS);
	CHECK(cuGraphAddMemFreeNode(&nf3, g, &nf2, 1, out) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(out, s) == CUDA_SUCCESS && is_block(out));
	struct shim_pool_stats ps = pstats();
	CHECK(ps.graph_bytes == ps0.graph_bytes + 3 * MIB + 4096 + 8192);
	CHECK(driver_graph_bytes() == 0);
	/* A node the driver refuses (a dependency of another graph): no block is kept. */
	CUgraph other = NULL;
	CHECK(REAL(cuGraphCreate)(&other, 0) == CUDA_SUCCESS);
	ap.dptr = 0;
	CHECK(cuGraphAddMemAllocNode(&na, other, &nf, 1, &ap) != CUDA_SUCCESS && ap.dptr == 0);
	ps = pstats();
	CHECK(ps.graph_bytes == ps0.graph_bytes + 3 * MIB + 4096 + 8192);
	CHECK(cuGraphDestroy(other) == CUDA_SUCCESS);
	/* Host-located allocations stay the driver's. */
	CUDA_MEM_ALLOC_NODE_PARAMS hp = ap;
	hp.poolProps.location.type = CU_MEM_LOCATION_TYPE_HOST;
	CHECK(cuGraphAddMemAllocNode(&na, g, NULL, 0, &hp) != CUDA_SUCCESS || !is_block(hp.dptr));

	CUgraphExec e = NULL;
	CHECK(cuGraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS);
	CHECK(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	/* Graph destroyed before its executable: the executable keeps the memory. */
	CHECK(cuGraphDestroy(g) == CUDA_SUCCESS && is_block(na2_ptr) && is_block(out));
	CHECK(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuGraphExecDestroy(e) == CUDA_SUCCESS && !is_block(na2_ptr) && !is_block(out));
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	ps = pstats();
	CHECK(ps.graph_bytes == ps0.graph_bytes && ps.pending_frees == 0);
	CHECK(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

/* Suspend with a graph's memory resident: moved with the rest (no GPU bytes left), and the
 * replay after resume reads and writes the same addresses. */
/* A pool exported to another process: its memory is shared, suspend refuses with the text
 * other shared memory gets, until the pool is gone; the process is not touched. */
static void test_exported_pool(void)
{
	CUmemPoolProps props = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				 .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
				 .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CUmemoryPool pool = NULL;
	CUstream s = NULL;
	CUdeviceptr d = 0;
	struct gcr_err err = { 0 };
	CHECK(shim_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS && !shim_pool_served((uint64_t)(uintptr_t)pool));
	CHECK(cuMemAllocFromPoolAsync(&d, MIB, pool, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == 0);
	int fd = -1;
	CHECK(cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
	err.msg[0] = '\0';
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == -ENOTSUP && strstr(err.msg, "shared") != NULL);
	if (fd >= 0)
		close(fd);
	CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == 0);
	CHECK(shim_cu.cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

static void test_graph_suspend(void)
{
	const size_t n = 256 * 1024, words = n / 4;
	CUstream s = NULL;
	CHECK(shim_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CUdeviceptr gb = 0, out = 0;
	CHECK(cuMemAlloc_v2(&out, n) == CUDA_SUCCESS);
	CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&gb, n, s) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoDAsync_v2(out, gb, n, s) == CUDA_SUCCESS);  /* reads what gb held */
	CHECK(cuMemsetD32Async(gb, 0x11u, words, s) == CUDA_SUCCESS); /* then writes it */
	CUgraph g = NULL;
	CUgraphExec e = NULL;
	CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && cuGraphInstantiateWithFlags(&e, g, 0) == CUDA_SUCCESS);
	CHECK(cuMemsetD32_v2(gb, 0x5au, words) == CUDA_SUCCESS); /* the graph's memory, held */
	struct shim_cr_report rep;
	struct gcr_err err = { 0 };
	size_t free0 = fake_free_bytes();
	CHECK(shim_cr_suspend(10000, &rep, &err) == 0);
	if (err.msg[0] != '\0')
		fprintf(stderr, "suspend: %s\n", err.msg);
	/* gb's segment (2 MiB) is the shim's and moved; out is small, the driver's. Idle
	 * segments were released, not moved: resume re-creates gb's alone. */
	size_t free1 = fake_free_bytes();
	uint64_t moved = rep.bytes;
	CHECK(moved >= 2 * MIB && free1 >= free0 + 2 * MIB);
	err.msg[0] = '\0';
	CHECK(shim_cr_resume(&rep, &err) == 0);
	if (err.msg[0] != '\0')
		fprintf(stderr, "resume: %s\n", err.msg);
	CHECK(fake_free_bytes() <= free1 - moved); /* (and the context's scratch) */
	CHECK(all_words(gb, words, 0x5au));
	CHECK(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(all_words(out, words, 0x5au) && all_words(gb, words, 0x11u));
	/* Never freed in its graph: the allocation outlives the graph, the application frees it. */
	CHECK(cuGraphExecDestroy(e) == CUDA_SUCCESS && cuGraphDestroy(g) == CUDA_SUCCESS && is_block(gb));
	CHECK(cuMemFreeAsync(gb, s) == CUDA_SUCCESS && !is_block(gb) && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemFree_v2(out) == CUDA_SUCCESS && cuStreamDestroy_v2(s) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS && driver_graph_bytes() == 0);
}

int main(void)
{
	CHECK(fake_setup() != NULL);
	shim_cfg.vmm = 1;
	shim_cfg.vmm_min_bytes = 2 * MIB;
	shim_cfg.staging_prepare = 0;

	/* The stand-in is reached through the shim, as in an application. */
	CUstream s1 = NULL, s2 = NULL;
	CHECK(shim_cu.cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(shim_cu.cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	__typeof__(&fake_stream_hold) hold =
		(__typeof__(&fake_stream_hold))shim_real_dlsym(shim_real_handle(SHIM_CUDA), "fake_stream_hold");
	CHECK(hold != NULL);
	if (hold == NULL)
		return test_summary("test_shim_cuda_pool");
	CUdeviceptr a = 0, b = 0, c = 0;
	CHECK(cuMemAllocAsync(&a, MIB, s1) == CUDA_SUCCESS && a != 0);
	struct shim_pool_stats ps;
	struct shim_alloc_stats st;
	shim_pool_stats(&ps);
	shim_alloc_stats(&st);
	CHECK(ps.pools == 1 && ps.blocks == 1 && st.pool_segs == 1 && st.async_buffers == 0);
	uint8_t buf[4096], back[4096];
	memset(buf, 0x5a, sizeof(buf));
	CHECK(cuMemcpyHtoD_v2(a, buf, sizeof(buf)) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoH_v2(back, a, sizeof(back)) == CUDA_SUCCESS && memcmp(buf, back, sizeof(buf)) == 0);
	CUdeviceptr base = 0;
	size_t size = 0;
	CHECK(cuMemGetAddressRange_v2(&base, &size, a + 100) == CUDA_SUCCESS && base == a && size == MIB);

	/* Same stream: the pending block at once. A held stream's free is not another's. */
	CHECK(hold(s1, 1) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(a, s1) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&b, MIB, s2) == CUDA_SUCCESS && b != a);
	CHECK(cuMemAllocAsync(&c, MIB, s2) == CUDA_SUCCESS && c != a);
	CHECK(cuMemAllocAsync(&a, MIB, s1) == CUDA_SUCCESS && a == base);
	CHECK(cuMemFreeAsync(a, s1) == CUDA_SUCCESS);
	shim_pool_stats(&ps);
	CHECK(ps.pending_frees == 1);
	CHECK(hold(s1, 0) == CUDA_SUCCESS && cuStreamSynchronize(s1) == CUDA_SUCCESS);
	CUdeviceptr d = 0;
	CHECK(cuMemFreeAsync(c, s2) == CUDA_SUCCESS && cuMemFreeAsync(b, s2) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s2) == CUDA_SUCCESS);

	/* A created pool: served, attributes from the arena, trim. */
	CUmemPoolProps props = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
				 .handleTypes = CU_MEM_HANDLE_TYPE_NONE,
				 .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CUmemoryPool pool = NULL;
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS && shim_pool_served((uint64_t)(uintptr_t)pool));
	cuuint64_t thr = UINT64_MAX, v = 0;
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr) == CUDA_SUCCESS);
	CHECK(cuMemAllocFromPoolAsync(&d, 3 * MIB, pool, s2) == CUDA_SUCCESS);
	CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v) == CUDA_SUCCESS && v == 3 * MIB);
	CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS && v == 32 * MIB);
	CHECK(cuMemFreeAsync(d, s2) == CUDA_SUCCESS && cuStreamSynchronize(s2) == CUDA_SUCCESS);
	CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS && v == 32 * MIB);
	CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
	CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_SUCCESS && v == 0);
	/* cudaFree on pool memory. */
	CHECK(cuMemAllocFromPoolAsync(&d, 4096, pool, s2) == CUDA_SUCCESS && cuMemFree_v2(d) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS && !shim_pool_served((uint64_t)(uintptr_t)pool));

	/* The default pool keeps its memory (as PyTorch sets it), for the suspend below. */
	__typeof__(&cuDeviceGetDefaultMemPool) get_default = (__typeof__(&cuDeviceGetDefaultMemPool))shim_real_dlsym(
		shim_real_handle(SHIM_CUDA), "cuDeviceGetDefaultMemPool");
	CUmemoryPool def = NULL;
	CHECK(get_default != NULL && get_default(&def, 0) == CUDA_SUCCESS);
	CHECK(cuMemPoolSetAttribute(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr) == CUDA_SUCCESS);

	/* Cost of a pair through the entry points, same stream (the marker's event record included). */
	const int n = 200000;
	double t0 = now_ns();
	int fails = 0;
	for (int i = 0; i < n; i++) {
		CUdeviceptr p = 0;
		fails += cuMemAllocAsync(&p, (size_t)(1 + i % 8) * 65536, s1) != CUDA_SUCCESS;
		fails += cuMemFreeAsync(p, s1) != CUDA_SUCCESS;
	}
	double ns = (now_ns() - t0) / n;
	CHECK(fails == 0);
	printf("cuMemAllocAsync+cuMemFreeAsync through the shim on the stand-in: %.0f ns per pair\n", ns);
	CHECK(cuStreamSynchronize(s1) == CUDA_SUCCESS);

	test_captured_graphs();
	test_explicit_nodes();
	test_graph_suspend();
	test_exported_pool();

	/* Suspend's release: every idle segment goes. */
	CHECK(shim_pool_release_idle() > 0);
	shim_alloc_stats(&st);
	CHECK(st.pool_segs == 0 && st.pool_seg_bytes == 0);
	fake_teardown();
	return test_summary("test_shim_cuda_pool");
}
