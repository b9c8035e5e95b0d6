/* test_fakecuda_api: the stand-in driver's own semantics the shim relies on: VMM mapping and
 * release rules, faults on unbacked memory, accounting, cuGetProcAddress resolution, capture,
 * held streams, stream-ordered pools. */
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../unit/util.h"
#include "fakecuda_test.h"
#include "shim_digest_math.h"
#include "shim_digest_ptx.h"

extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuMemcpyHtoD_v2) cuMemcpyHtoD_v2_ptds;
extern __typeof__(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;

#define MIB ((size_t)1 << 20)

/* Whether writing p in a child process dies of SIGSEGV, as a GPU access to it would fault. */
static int faults(CUdeviceptr p)
{
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		signal(SIGSEGV, SIG_DFL); /* not a sanitizer's handler */
		*(volatile uint32_t *)(uintptr_t)p = 1;
		_exit(0);
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return 0;
	return WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV;
}

static size_t free_bytes(void)
{
	size_t f = 0, t = 0;

	return cuMemGetInfo(&f, &t) == CUDA_SUCCESS ? f : 0;
}

static void *resolve(const char *name, int version, cuuint64_t flags, CUresult *rc,
		     CUdriverProcAddressQueryResult *st)
{
	void *p = NULL;

	*rc = cuGetProcAddress(name, &p, version, flags, st);
	return p;
}

static void test_procaddr(void)
{
	CUdriverProcAddressQueryResult st;
	CUresult rc;

	CHECK(resolve("cuMemAlloc", 13000, 0, &rc, &st) == (void *)&cuMemAlloc_v2 && rc == CUDA_SUCCESS &&
	      st == CU_GET_PROC_ADDRESS_SUCCESS);
	CHECK(resolve("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &st) ==
	      (void *)&cuLaunchKernel_ptsz);
	CHECK(resolve("cuLaunchKernel", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &rc, &st) ==
	      (void *)&cuLaunchKernel);
	CHECK(resolve("cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &st) ==
	      (void *)&cuMemcpyHtoD_v2_ptds);
	CHECK(resolve("cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &rc, &st) ==
	      (void *)&cuMemAlloc_v2);
	CHECK(resolve("cuGetProcAddress", 12000, 0, &rc, &st) == (void *)&cuGetProcAddress_v2);
	CHECK(resolve("cuGetProcAddress", 11030, 0, &rc, &st) != (void *)&cuGetProcAddress_v2 &&
	      rc == CUDA_SUCCESS);
	CHECK(resolve("cuCtxSynchronize", 12080, 0, &rc, &st) == (void *)&cuCtxSynchronize);
	CHECK(resolve("cuCtxSynchronize", 13000, 0, &rc, &st) == (void *)&cuCtxSynchronize_v2);
	/* As driver 580: success, a NULL pointer, the reason in the status. */
	CHECK(resolve("cuMemCreate", 9000, 0, &rc, &st) == NULL && rc == CUDA_SUCCESS &&
	      st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
	CHECK(resolve("cuNoSuchCall", 13000, 0, &rc, &st) == NULL && rc == CUDA_SUCCESS &&
	      st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
	CHECK(resolve("cuMemAlloc", 13000, 8, &rc, &st) == NULL && rc == CUDA_ERROR_INVALID_VALUE);
	CHECK(resolve("cuMemAllocFromPoolAsync", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
		      &rc, &st) == (void *)&cuMemAllocFromPoolAsync_ptsz);
	CHECK(resolve("cuMemPoolTrimTo", 11020, 0, &rc, &st) == (void *)&cuMemPoolTrimTo);
	CHECK(resolve("cuMemPoolCreate", 11000, 0, &rc, &st) == NULL &&
	      st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

static void test_vmm(void)
{
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc access = {0};
	CUmemGenericAllocationHandle h, h2;
	CUdeviceptr va, va2;
	size_t g = 0, before;
	uint32_t word = 0;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	CHECK(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS &&
	      g == 2 * MIB);
	CHECK(cuMemAddressReserve(&va, 3 * MIB, 0, 0, 0) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemAddressReserve(&va, 8 * MIB, 0, 0, 0) == CUDA_SUCCESS && va % g == 0);
	CHECK(cuMemCreate(&h, MIB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
	before = free_bytes();
	CHECK(cuMemCreate(&h, 2 * MIB, &prop, 0) == CUDA_SUCCESS);
	CHECK(free_bytes() == before - 2 * MIB);
	CHECK(cuMemMap(va + MIB, 2 * MIB, 0, h, 0) == CUDA_ERROR_INVALID_VALUE); /* misaligned */
	CHECK(cuMemMap(va, 2 * MIB, 0, h, 0) == CUDA_SUCCESS);
	CHECK(cuMemMap(va, 2 * MIB, 0, h, 0) == CUDA_ERROR_INVALID_VALUE); /* already mapped */
	CHECK(faults(va)); /* mapped, no access yet: kernels fault, copies are refused */
	CHECK(cuMemsetD32(va, 1, 4) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemcpyHtoD(va, &word, 4) == CUDA_ERROR_INVALID_VALUE);
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CHECK(cuMemSetAccess(va, 2 * MIB, &access, 1) == CUDA_SUCCESS);
	CHECK(!faults(va));
	CHECK(cuMemsetD32(va, 0xfeedu, 2 * MIB / 4) == CUDA_SUCCESS);
	/* Released but still mapped: the memory lives on. */
	CHECK(cuMemRelease(h) == CUDA_SUCCESS);
	CHECK(cuMemRelease(h) == CUDA_ERROR_INVALID_VALUE);
	CHECK(free_bytes() == before - 2 * MIB);
	CHECK(cuMemcpyDtoH(&word, va + MIB, 4) == CUDA_SUCCESS && word == 0xfeedu);
	CHECK(cuMemcpyHtoD(va + 2 * MIB - 2, &word, 4) == CUDA_ERROR_INVALID_VALUE); /* runs past */
	CHECK(cuMemGetAddressRange(NULL, NULL, va) == CUDA_ERROR_NOT_FOUND); /* not for VMM */
	CHECK(cuMemRetainAllocationHandle(&h2, (void *)(uintptr_t)(va + 4096)) == CUDA_SUCCESS);
	CHECK(cuMemRelease(h2) == CUDA_SUCCESS);
	CHECK(cuMemUnmap(va, 4 * MIB) == CUDA_ERROR_INVALID_VALUE); /* a hole in the range */
	CHECK(cuMemAddressFree(va, 8 * MIB) == CUDA_ERROR_INVALID_VALUE); /* still mapped */
	CHECK(cuMemUnmap(va, 2 * MIB) == CUDA_SUCCESS);
	CHECK(free_bytes() == before); /* unmapped and released: gone */
	CHECK(faults(va));
	CHECK(cuMemcpyHtoD(va, &word, 4) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemAddressFree(va, 8 * MIB) == CUDA_SUCCESS);
	CHECK(cuMemAddressReserve(&va2, 4 * MIB, 0, va, 0) == CUDA_SUCCESS && va2 == va);
	CHECK(cuMemAddressFree(va2, 4 * MIB) == CUDA_SUCCESS);
}

static void test_memory(void)
{
	CUdeviceptr p, base = 0;
	size_t size = 0;
	uint32_t host[4] = {1, 2, 3, 4}, back[4] = {0};

	CHECK(cuMemAlloc(&p, (size_t)1 << 50) == CUDA_ERROR_OUT_OF_MEMORY);
	CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemAlloc(&p, 1000) == CUDA_SUCCESS);
	CHECK(cuMemGetAddressRange(&base, &size, p + 10) == CUDA_SUCCESS && base == p && size == 1000);
	CHECK(cuMemcpyHtoD(p + 996, host, 8) == CUDA_ERROR_INVALID_VALUE); /* past the end */
	CHECK(cuMemcpyHtoD((CUdeviceptr)(uintptr_t)back, host, 8) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemcpyHtoD(p, host, sizeof(host)) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoH(back, p, sizeof(back)) == CUDA_SUCCESS && back[3] == 4);
	CHECK(cuMemFree(p) == CUDA_SUCCESS);
	CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
}

static void test_capture(void)
{
	CUstream s;
	CUgraph g;
	CUgraphExec e;
	CUdeviceptr p;
	uint32_t word = 7;
	CUstreamCaptureStatus st;

	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&p, 64) == CUDA_SUCCESS);
	CHECK(cuMemsetD32(p, 0, 16) == CUDA_SUCCESS);
	CHECK(cuStreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
	      CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuStreamIsCapturing(s, &st) == CUDA_SUCCESS && st == CU_STREAM_CAPTURE_STATUS_ACTIVE);
	CHECK(cuMemsetD32Async(p, 42, 16, s) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoH(&word, p, 4) == CUDA_SUCCESS && word == 0); /* recorded, not run */
	CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
	CHECK(cuGraphInstantiate(&e, g, 0) == CUDA_SUCCESS);
	CHECK(cuGraphLaunch(e, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoH(&word, p, 4) == CUDA_SUCCESS && word == 42);
	/* A synchronisation inside a capture breaks it. */
	CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	CHECK(cuStreamEndCapture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	CHECK(cuGraphExecDestroy(e) == CUDA_SUCCESS);
	CHECK(cuMemFree(p) == CUDA_SUCCESS);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

static uint32_t word_at(CUdeviceptr p)
{
	uint32_t w = 0xdeadbeefu;

	return cuMemcpyDtoH(&w, p, 4) == CUDA_SUCCESS ? w : 0xdeadbeefu;
}

/* A held stream queues its work; events recorded there stay pending and streams that wait for
 * them queue behind; releasing or synchronising runs everything in order. */
static void test_hold(CUcontext ctx)
{
	CUstream s, t;
	CUevent e;
	CUdeviceptr p;

	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&p, 64) == CUDA_SUCCESS && cuMemsetD32(p, 0, 16) == CUDA_SUCCESS);
	CHECK(fake_stream_hold(NULL, 1) == CUDA_ERROR_INVALID_HANDLE);
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS);
	CHECK(cuMemsetD32Async(p, 5, 16, s) == CUDA_SUCCESS);
	CHECK(cuEventRecord(e, s) == CUDA_SUCCESS);
	CHECK(word_at(p) == 0);
	CHECK(cuEventQuery(e) == CUDA_ERROR_NOT_READY && cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
	CHECK(cuStreamWaitEvent(t, e, 0) == CUDA_SUCCESS);
	CHECK(cuMemsetD32Async(p, 7, 1, t) == CUDA_SUCCESS); /* behind s's memset */
	CHECK(cuStreamQuery(t) == CUDA_ERROR_NOT_READY && word_at(p) == 0);
	CHECK(fake_stream_hold(s, 0) == CUDA_SUCCESS);
	CHECK(word_at(p) == 7 && word_at(p + 4) == 5);
	CHECK(cuEventQuery(e) == CUDA_SUCCESS && cuStreamQuery(t) == CUDA_SUCCESS);
	/* Synchronising held work releases it: a stream, a stream waiting for it, an event, the
	 * context. */
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS && cuMemsetD32Async(p, 9, 1, s) == CUDA_SUCCESS);
	CHECK(word_at(p) == 7 && cuStreamSynchronize(s) == CUDA_SUCCESS && word_at(p) == 9);
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS && cuEventRecord(e, s) == CUDA_SUCCESS);
	CHECK(cuStreamWaitEvent(t, e, 0) == CUDA_SUCCESS && cuMemsetD32Async(p, 10, 1, t) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(t) == CUDA_SUCCESS && word_at(p) == 10);
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS && cuEventRecord(e, s) == CUDA_SUCCESS);
	CHECK(cuEventSynchronize(e) == CUDA_SUCCESS && cuEventQuery(e) == CUDA_SUCCESS);
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS && cuMemsetD32Async(p, 11, 1, s) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS && word_at(p) == 11);
	/* A destroyed stream's queued work still runs. */
	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS && cuMemsetD32Async(p, 12, 1, s) == CUDA_SUCCESS);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS && word_at(p) == 12);
	CHECK(cuMemFree(p) == CUDA_SUCCESS);
	CHECK(cuEventDestroy(e) == CUDA_SUCCESS && cuStreamDestroy(t) == CUDA_SUCCESS);
	(void)ctx;
}

static cuuint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
	cuuint64_t v = ~0ull;

	return cuMemPoolGetAttribute(pool, attr, &v) == CUDA_SUCCESS ? v : ~0ull;
}

static CUmemPoolProps device_pool_props(void)
{
	CUmemPoolProps props;

	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	return props;
}

static void test_pool_props(void)
{
	CUmemPoolProps props = device_pool_props();
	CUmemoryPool def, cur, pool;
	CUmemAccess_flags flags;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_NONE};
	cuuint64_t v;
	int on = -1;

	CHECK(cuDeviceGetDefaultMemPool(&def, 0) == CUDA_SUCCESS && def != NULL);
	CHECK(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS && cur == def);
	CHECK(cuDeviceGetDefaultMemPool(&def, 99) == CUDA_ERROR_INVALID_DEVICE);
	CHECK(cuMemPoolDestroy(def) == CUDA_ERROR_INVALID_VALUE); /* the default pool stays */
	props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_VALUE);
	props = device_pool_props();
	props.reserved[3] = 1;
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_VALUE);
	props = device_pool_props();
	props.location.id = 99;
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_VALUE);
	props = device_pool_props();
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
	CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &on) == CUDA_SUCCESS &&
	      on == 1);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);
	v = 5;
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &v) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v) == CUDA_SUCCESS &&
	      pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 5);
	CHECK(cuMemPoolGetAccess(&flags, pool, &loc) == CUDA_SUCCESS &&
	      flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	CHECK(cuMemPoolSetAccess(pool, &acc, 1) == CUDA_ERROR_INVALID_VALUE); /* its own device */
	CHECK(cuDeviceSetMemPool(0, pool) == CUDA_SUCCESS);
	CHECK(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS && cur == pool);
	CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(pool) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuDeviceGetMemPool(&cur, 0) == CUDA_SUCCESS && cur == def); /* back to the default */
}

/* Stream order: a free pending on a held stream is reusable at once on that stream, not on
 * another; a completed free is reusable anywhere (opportunistically, or after a synchronize);
 * cached memory counts as the device's and goes at a synchronize above the threshold or a trim. */
static void test_pool_order(void)
{
	CUmemPoolProps props = device_pool_props();
	const cuuint64_t threshold = 64 * MIB;
	CUmemoryPool pool;
	CUstream s, t;
	CUdeviceptr a, b, c, d, base = 0;
	size_t before, size = 0;
	int off = 0;

	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, (void *)&threshold) ==
	      CUDA_SUCCESS);
	before = free_bytes();
	CHECK(cuMemAllocFromPoolAsync(&a, MIB, pool, s) == CUDA_SUCCESS);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == MIB &&
	      pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == MIB);
	CHECK(free_bytes() == before - MIB);
	CHECK(cuMemsetD32Async(a, 3, MIB / 4, s) == CUDA_SUCCESS && word_at(a + 100) == 3);
	CHECK(cuMemGetAddressRange(&base, &size, a + 10) == CUDA_SUCCESS && base == a && size == MIB);

	CHECK(fake_stream_hold(s, 1) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
	CHECK(cuMemAllocFromPoolAsync(&b, MIB, pool, t) == CUDA_SUCCESS && b != a); /* pending on s */
	CHECK(cuMemAllocFromPoolAsync(&c, MIB, pool, s) == CUDA_SUCCESS && c == a); /* stream order */
	CHECK(cuMemFreeAsync(c, s) == CUDA_SUCCESS);
	CHECK(fake_stream_hold(s, 0) == CUDA_SUCCESS); /* both frees run; the first is stale */
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 2 * MIB &&
	      pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == MIB);
	CHECK(cuMemAllocFromPoolAsync(&c, MIB, pool, t) == CUDA_SUCCESS && c == a); /* completed */
	CHECK(cuMemFreeAsync(c, t) == CUDA_SUCCESS);

	/* Without opportunistic reuse, a free completed on t waits for a synchronize. */
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, &off) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(b, t) == CUDA_SUCCESS);
	CHECK(cuMemAllocFromPoolAsync(&d, MIB, pool, s) == CUDA_SUCCESS && d != a && d != b);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 3 * MIB);
	CHECK(cuMemFreeAsync(d, s) == CUDA_SUCCESS && cuStreamSynchronize(t) == CUDA_SUCCESS);
	CHECK(cuMemAllocFromPoolAsync(&c, MIB, pool, s) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(c, s) == CUDA_SUCCESS);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == 3 * MIB); /* under threshold */
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 2 * MIB);
	CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &(cuuint64_t){0}) ==
	      CUDA_SUCCESS && pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 0);
	CHECK(cuMemPoolTrimTo(pool, MIB) == CUDA_SUCCESS &&
	      pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == MIB);
	CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS && free_bytes() == before);
	CHECK(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == 3 * MIB);

	/* The default pool's threshold is 0: a synchronize gives cached memory back. */
	CHECK(cuMemAllocAsync(&a, 3 * MIB, s) == CUDA_SUCCESS && free_bytes() == before - 3 * MIB);
	CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS && free_bytes() == before - 3 * MIB);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS && free_bytes() == before);

	/* cuMemFree frees pool memory at once; cuMemFreeAsync frees a cuMemAlloc buffer in order. */
	CHECK(cuMemAllocFromPoolAsync(&a, 4096, pool, s) == CUDA_SUCCESS && cuMemFree(a) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(a, s) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemAlloc(&a, 4096) == CUDA_SUCCESS && fake_stream_hold(s, 1) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS);
	CHECK(cuMemGetAddressRange(NULL, NULL, a) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemGetAddressRange(NULL, NULL, a) == CUDA_ERROR_NOT_FOUND);

	/* A destroyed pool's live blocks stay valid until freed. */
	CHECK(cuMemAllocFromPoolAsync(&a, MIB, pool, s) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
	CHECK(cuMemAllocFromPoolAsync(&b, MIB, pool, s) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemsetD32Async(a, 4, MIB / 4, s) == CUDA_SUCCESS && word_at(a) == 4);
	CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS && free_bytes() == before);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS && cuStreamDestroy(t) == CUDA_SUCCESS);
}

/* Only pools with a handle type export; pointers import in the same process. */
static void test_pool_export(void)
{
	CUmemPoolProps props = device_pool_props();
	CUmemPoolPtrExportData data;
	CUmemoryPool plain, shared;
	CUdeviceptr a, b = 0;
	int fd = -1;

	CHECK(cuMemPoolCreate(&plain, &props) == CUDA_SUCCESS);
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CHECK(cuMemPoolCreate(&shared, &props) == CUDA_SUCCESS);
	CHECK(cuMemPoolExportToShareableHandle(&fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
	      CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemPoolExportToShareableHandle(&fd, shared, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
	      CUDA_SUCCESS && fd >= 0);
	if (fd >= 0)
		close(fd);
	CHECK(cuMemAllocFromPoolAsync(&a, 4096, plain, NULL) == CUDA_SUCCESS);
	CHECK(cuMemPoolExportPointer(&data, a) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemFreeAsync(a, NULL) == CUDA_SUCCESS);
	CHECK(cuMemAllocFromPoolAsync(&a, 4096, shared, NULL) == CUDA_SUCCESS);
	CHECK(cuMemPoolExportPointer(&data, a) == CUDA_SUCCESS);
	CHECK(cuMemPoolImportPointer(&b, shared, &data) == CUDA_SUCCESS && b == a);
	CHECK(cuMemFreeAsync(a, NULL) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(plain) == CUDA_SUCCESS && cuMemPoolDestroy(shared) == CUDA_SUCCESS);
}

static cuuint64_t graph_mem(void)
{
	cuuint64_t v = ~0ull;

	return cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v) == CUDA_SUCCESS ? v : ~0ull;
}

/* Graph memory: captured cuMemAllocAsync/cuMemFreeAsync and explicit alloc/free nodes get an
 * address at capture, valid while the graph, its clones, parents or executables live. */
static void test_graph_memory(void)
{
	CUDA_MEM_ALLOC_NODE_PARAMS ap, got;
	CUgraphNodeParams np;
	CUstreamCaptureStatus cs;
	CUgraphNode n1, n2, n3, n4;
	CUgraphNodeType type;
	CUgraph g, e, clone, parent, cg;
	CUgraphExec x;
	CUstream s;
	CUdeviceptr p, q, blk;
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	cuuint64_t id = 0, base = graph_mem();
	size_t before = free_bytes(), nd = 1;
	const CUgraphNode *deps = NULL;

	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS && mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
	CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS && mode == CU_STREAM_CAPTURE_MODE_RELAXED);
	CHECK(cuMemAllocAsync(&blk, 4096, s) == CUDA_SUCCESS);
	CHECK(cuStreamGetCaptureInfo(s, &cs, &id, &cg, &deps, NULL, &nd) == CUDA_SUCCESS &&
	      cs == CU_STREAM_CAPTURE_STATUS_NONE);
	CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
	CHECK(cuStreamGetCaptureInfo(s, &cs, &id, &cg, &deps, NULL, &nd) == CUDA_SUCCESS &&
	      cs == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0 && cg != NULL && nd == 0);
	CHECK(cuMemAllocAsync(&p, 8192, s) == CUDA_SUCCESS);
	CHECK(graph_mem() == base + 8192 && free_bytes() == before - 4096 - 8192); /* fixed at capture */
	CHECK(cuMemsetD32Async(p, 6, 2048, s) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(p, s) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(blk, s) == CUDA_SUCCESS); /* allocated outside: freed when run */
	CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS);
	CHECK(word_at(p) == 0 && cuMemGetAddressRange(NULL, NULL, blk) == CUDA_SUCCESS);
	CHECK(cuGraphClone(&clone, g) == CUDA_SUCCESS);
	CHECK(cuGraphInstantiate(&x, clone, 0) == CUDA_SUCCESS);
	CHECK(cuGraphDestroy(g) == CUDA_SUCCESS && cuGraphDestroy(clone) == CUDA_SUCCESS);
	CHECK(graph_mem() == base + 8192); /* the executable holds it */
	CHECK(cuGraphLaunch(x, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(word_at(p + 4) == 6);
	CHECK(cuGraphExecDestroy(x) == CUDA_SUCCESS && graph_mem() == base && free_bytes() == before);

	/* Explicit nodes; a child graph's memory is held by its parent. */
	CHECK(cuGraphCreate(&e, 0) == CUDA_SUCCESS);
	memset(&ap, 0, sizeof(ap));
	ap.poolProps = device_pool_props();
	ap.bytesize = 3 * 4096;
	CHECK(cuGraphAddEmptyNode(&n1, e, NULL, 0) == CUDA_SUCCESS);
	CHECK(cuGraphAddMemAllocNode(&n2, e, &n1, 1, &ap) == CUDA_SUCCESS && ap.dptr != 0);
	CHECK(cuGraphMemAllocNodeGetParams(n2, &got) == CUDA_SUCCESS && got.dptr == ap.dptr &&
	      got.bytesize == 3 * 4096);
	CHECK(cuGraphMemAllocNodeGetParams(n1, &got) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuGraphNodeGetType(n2, &type) == CUDA_SUCCESS && type == CU_GRAPH_NODE_TYPE_MEM_ALLOC);
	memset(&np, 0, sizeof(np));
	np.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
	np.alloc.poolProps = device_pool_props();
	np.alloc.bytesize = 4096;
	CHECK(cuGraphAddNode(&n3, e, &n2, NULL, 1, &np) == CUDA_SUCCESS && np.alloc.dptr != 0);
	q = np.alloc.dptr;
	CHECK(cuGraphAddMemFreeNode(&n4, e, &n3, 1, ap.dptr) == CUDA_SUCCESS);
	CHECK(cuGraphAddMemFreeNode(&n4, e, &n3, 1, 12345) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuGraphAddMemFreeNode(&n4, e, &n1, 1, (CUdeviceptr)n1) == CUDA_ERROR_INVALID_VALUE);
	CHECK(graph_mem() == base + 4 * 4096);
	CHECK(cuGraphCreate(&parent, 0) == CUDA_SUCCESS);
	CHECK(cuGraphAddChildGraphNode(&n1, parent, NULL, 0, e) == CUDA_SUCCESS);
	CHECK(cuGraphDestroy(e) == CUDA_SUCCESS && graph_mem() == base + 4 * 4096);
	CHECK(cuMemsetD32(q, 1, 1024) == CUDA_SUCCESS);
	CHECK(cuGraphInstantiate(&x, parent, 0) == CUDA_SUCCESS);
	CHECK(cuGraphLaunch(x, s) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuGraphDestroy(parent) == CUDA_SUCCESS && cuGraphExecDestroy(x) == CUDA_SUCCESS);
	CHECK(graph_mem() == base && free_bytes() == before);
	CHECK(cuDeviceGraphMemTrim(0) == CUDA_SUCCESS);
	CHECK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &(cuuint64_t){0}) ==
	      CUDA_SUCCESS);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

/* ---- the checkpoint lock waits for calls in flight, up to its timeout ---- */

static int hold[2], started[2];

static void blocking_hostfn(void *arg)
{
	char c = 0;

	if (write(started[1], "s", 1) != 1 || read(hold[0], &c, 1) != 1)
		abort();
}

static void *launch_blocking(void *ctx)
{
	if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS ||
	    cuLaunchHostFunc(NULL, blocking_hostfn, NULL) != CUDA_SUCCESS)
		abort();
	return NULL;
}

static void test_lock_timeout(CUcontext ctx)
{
	CUcheckpointLockArgs args = {0};
	CUprocessState st;
	pthread_t t;
	char c = 0;

	if (pipe(hold) != 0 || pipe(started) != 0 ||
	    pthread_create(&t, NULL, launch_blocking, ctx) != 0)
		abort();
	CHECK(read(started[0], &c, 1) == 1); /* the host function is running: a call in flight */
	args.timeoutMs = 50;
	CHECK(cuCheckpointProcessLock(getpid(), &args) == CUDA_ERROR_NOT_READY);
	CHECK(cuCheckpointProcessGetState(getpid(), &st) == CUDA_SUCCESS &&
	      st == CU_PROCESS_STATE_RUNNING);
	args.reserved0 = 1;
	CHECK(cuCheckpointProcessLock(getpid(), &args) == CUDA_ERROR_INVALID_VALUE);
	CHECK(write(hold[1], "x", 1) == 1);
	pthread_join(t, NULL);
	args.reserved0 = 0;
	args.timeoutMs = 0;
	CHECK(cuCheckpointProcessLock(getpid(), &args) == CUDA_SUCCESS);
	CHECK(cuCheckpointProcessGetState(getpid(), &st) == CUDA_SUCCESS &&
	      st == CU_PROCESS_STATE_LOCKED);
	CHECK(cuCheckpointProcessUnlock(getpid(), NULL) == CUDA_SUCCESS);
	CHECK(cuCheckpointProcessGetState(getpid(), &st) == CUDA_SUCCESS &&
	      st == CU_PROCESS_STATE_RUNNING);
}

/* What the driver answers for processes that are not CUDA processes; no cuInit needed. */
/* Host reference of the digest, word by word (the kernel goes by 16-byte pairs and slices):
 * words of chunk c up to the last whole 16-byte pair of the buffer. */
static void digest_ref(const uint64_t *w, size_t nbytes, size_t c, uint64_t out[3])
{
	size_t words = GCR_DIGEST_CHUNK / 8, end = nbytes / 16 * 2, i;

	out[0] = out[1] = out[2] = 0;
	for (i = 0; i < words && c * words + i < end; i++) {
		out[0] += gcr_digest_term1(w[c * words + i], i);
		out[1] += gcr_digest_term2(w[c * words + i], i);
		out[2] |= w[c * words + i];
	}
}

static CUresult digest_launch(CUfunction f, CUstream s, CUdeviceptr buf, size_t nbytes, CUdeviceptr out,
			      unsigned gx, unsigned gy, unsigned bx)
{
	unsigned long long n = nbytes;
	void *args[] = {&buf, &n, &out};

	return cuLaunchKernel(f, gx, gy, 1, bx, 1, 1, 0, s, args, NULL);
}

/* The shim's digest kernel, loaded from its embedded PTX: the stand-in computes what the GPU
 * does (shim_digest_math.h), per chunk, the partial last chunk included, all-zero chunks with
 * any == 0, and refuses launches the GPU would fault on or compute garbage from. */
static void test_digest(void)
{
	const size_t nbytes = 2 * GCR_DIGEST_CHUNK + 1000; /* 62 whole pairs and 8 bytes in chunk 2 */
	const unsigned grid = 3 * GCR_DIGEST_SLICES;
	uint64_t *host = calloc(1, nbytes + 8), got[9], again[9], want[3];
	CUdeviceptr buf, out;
	CUmodule mod;
	CUfunction f;
	CUstream s;
	size_t i, c;

	CHECK(host != NULL);
	if (host == NULL)
		return;
	for (i = 0; i < GCR_DIGEST_CHUNK / 8; i++)
		host[i] = i * 0x9e3779b97f4a7c15ull + 1;
	for (i = 2 * GCR_DIGEST_CHUNK / 8; i < nbytes / 8; i++)
		host[i] = ~i;
	CHECK(cuModuleLoadData(&mod, shim_digest_ptx) == CUDA_SUCCESS);
	CHECK(cuModuleGetFunction(&f, mod, "gcr_chunk_digest") == CUDA_SUCCESS);
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&buf, nbytes) == CUDA_SUCCESS && cuMemAlloc(&out, sizeof(got)) == CUDA_SUCCESS);
	CHECK(cuMemcpyHtoD(buf, host, nbytes) == CUDA_SUCCESS);
	CHECK(cuMemsetD8Async(out, 0, sizeof(got), s) == CUDA_SUCCESS);
	CHECK(digest_launch(f, s, buf, nbytes, out, grid, 1, GCR_DIGEST_THREADS) == CUDA_SUCCESS);
	CHECK(cuMemcpyDtoHAsync(got, out, sizeof(got), s) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	for (c = 0; c < 3; c++) {
		digest_ref(host, nbytes, c, want);
		CHECK(got[3 * c] == want[0] && got[3 * c + 1] == want[1] && got[3 * c + 2] == want[2]);
	}
	CHECK(got[5] == 0 && got[2] != 0 && got[8] != 0); /* chunk 1 is all zero */
	CHECK(got[3] != 0 && got[4] != 0);                 /* a zero chunk's sums are not zero */

	/* One word of chunk 2 changed: both of its sums change, the other chunks' do not. The
	 * 8 bytes after the last whole pair are not read. */
	host[2 * GCR_DIGEST_CHUNK / 8 + 7] ^= 1;
	host[nbytes / 8 - 1] ^= 0xff;
	CHECK(cuMemcpyHtoD(buf, host, nbytes) == CUDA_SUCCESS);
	CHECK(cuMemsetD8(out, 0, sizeof(again)) == CUDA_SUCCESS);
	CHECK(digest_launch(f, s, buf, nbytes, out, grid, 1, GCR_DIGEST_THREADS) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS && cuMemcpyDtoH(again, out, sizeof(again)) == CUDA_SUCCESS);
	CHECK(memcmp(again, got, 6 * sizeof(uint64_t)) == 0);
	CHECK(again[6] != got[6] && again[7] != got[7]);
	digest_ref(host, nbytes, 2, want);
	CHECK(again[6] == want[0] && again[7] == want[1]);

	/* Grid semantics: two planes of blocks add twice; a grid of one chunk digests only it. */
	CHECK(cuMemsetD8(out, 0, sizeof(got)) == CUDA_SUCCESS);
	CHECK(digest_launch(f, s, buf, nbytes, out, grid, 2, GCR_DIGEST_THREADS) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS && cuMemcpyDtoH(got, out, sizeof(got)) == CUDA_SUCCESS);
	CHECK(got[0] == 2 * again[0] && got[7] == 2 * again[7] && got[8] == again[8]);
	CHECK(cuMemsetD8(out, 0, sizeof(got)) == CUDA_SUCCESS);
	CHECK(digest_launch(f, s, buf, nbytes, out, GCR_DIGEST_SLICES, 1, GCR_DIGEST_THREADS) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS && cuMemcpyDtoH(got, out, sizeof(got)) == CUDA_SUCCESS);
	CHECK(got[0] == again[0] && got[2] == again[2] && got[3] == 0 && got[6] == 0 && got[8] == 0);

	/* Refused: the wrong block size, an output array too small for the grid, an unaligned
	 * or unmapped input. */
	CHECK(digest_launch(f, s, buf, nbytes, out, grid, 1, 128) == CUDA_ERROR_INVALID_VALUE);
	CHECK(digest_launch(f, s, buf, nbytes, out, grid, 1, 512) == CUDA_ERROR_INVALID_VALUE);
	CHECK(digest_launch(f, s, buf, nbytes, out, grid + GCR_DIGEST_SLICES, 1, GCR_DIGEST_THREADS) ==
	      CUDA_ERROR_ILLEGAL_ADDRESS);
	CHECK(digest_launch(f, s, buf + 8, nbytes - 16, out, grid, 1, GCR_DIGEST_THREADS) ==
	      CUDA_ERROR_MISALIGNED_ADDRESS);
	CHECK(digest_launch(f, s, buf, nbytes + GCR_DIGEST_CHUNK, out, grid, 1, GCR_DIGEST_THREADS) ==
	      CUDA_ERROR_ILLEGAL_ADDRESS);
	CHECK(cuMemFree(buf) == CUDA_SUCCESS && cuMemFree(out) == CUDA_SUCCESS);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS && cuModuleUnload(mod) == CUDA_SUCCESS);
	free(host);
}

static void test_foreign_pids(void)
{
	CUprocessState st;
	pid_t gone = fork();

	if (gone == 0)
		_exit(0);
	waitpid(gone, NULL, 0);
	CHECK(cuCheckpointProcessGetState(getppid(), &st) == CUDA_ERROR_NOT_INITIALIZED);
	CHECK(cuCheckpointProcessLock(getppid(), NULL) == CUDA_ERROR_NOT_INITIALIZED);
	CHECK(cuCheckpointProcessGetState(gone, &st) == CUDA_ERROR_OPERATING_SYSTEM);
}

int main(void)
{
	CUcontext ctx;
	CUdeviceptr p;
	int version = 0;

	CHECK(cuMemAlloc(&p, 16) == CUDA_ERROR_NOT_INITIALIZED);
	test_foreign_pids();
	CHECK(cuDriverGetVersion(&version) == CUDA_SUCCESS && version == 13000);
	CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuInit(0) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&p, 16) == CUDA_ERROR_INVALID_CONTEXT);
	CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
	CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	test_procaddr();
	test_memory();
	test_vmm();
	test_capture();
	test_hold(ctx);
	test_pool_props();
	test_pool_order();
	test_pool_export();
	test_graph_memory();
	test_digest();
	test_lock_timeout(ctx);
	return test_summary("test_fakecuda_api");
}
