/* test_shim_cuda_pool: stream-ordered allocation through the CUDA entry points (shim_cuda_pool.c)
 * on the stand-in driver: the default pool and a created pool are served by the shim's arena
 * (the driver's pools hold nothing), same-stream reuse at once, a held stream's pending free is
 * not handed to another stream, attributes are answered from the arena, suspend's release of
 * idle segments; and the cost of an alloc+free pair through the entry points. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fakecuda_test.h"
#include "fakecuda_util.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_pool.h"
#include "shim_real.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
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

	/* Suspend's release: every idle segment goes. */
	CHECK(shim_pool_release_idle() > 0);
	shim_alloc_stats(&st);
	CHECK(st.pool_segs == 0 && st.pool_seg_bytes == 0);
	fake_teardown();
	return test_summary("test_shim_cuda_pool");
}
