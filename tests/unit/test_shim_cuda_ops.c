/* test_shim_cuda_ops: the CUDA implementation of struct shim_gpu_ops on the stand-in driver
 * (tests/fakecuda): every operation reaches exactly the driver function the data path called
 * before the table existed (a fault armed on that function, and only it, makes the operation
 * fail with the driver's code), and a whole cycle works: reserve, create, map, access, copy out,
 * unmap, release (0 bytes), re-create, re-map at the same address, copy back, bit-exact. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_gpu.h"
#include "shim_real.h"
#include "fakecuda_util.h"
#include "util.h"

#define MIB ((size_t)1 << 20)
#define FAULT 999 /* CUDA_ERROR_UNKNOWN */

/* Arms one fault on fn; after the operation ran, the fault must have fired (none left) and
 * the operation must report the driver's code. */
static void arm(const char *fn)
{
	char req[96];
	snprintf(req, sizeof(req), "fail %s 1 %d", fn, FAULT);
	CHECK(fake(req) == 0);
}

static int fired(int rc, const struct gcr_err *err, const char *fn)
{
	int ok = rc < 0 && shim_cuda_ops.last_code() == FAULT && strstr(err->msg, fn) != NULL && fake("disarm") == 0;
	if (!ok)
		fprintf(stderr, "operation for %s: rc %d, code %d, \"%s\"\n", fn, rc, shim_cuda_ops.last_code(), err->msg);
	return ok;
}

#define EXPECT_CALL(fn, call)                \
	do {                                 \
		arm(fn);                     \
		CHECK(fired((call), &err, fn)); \
	} while (0)

int main(void)
{
	const struct shim_gpu_ops *o = &shim_cuda_ops;
	struct gcr_err err = { 0 };
	CHECK_STR(o->name, "cuda");
	CUcontext ctx = fake_setup(); /* loads the stand-in, cuInit, device 0's primary context current */
	CHECK(ctx != NULL);
	void *cur = NULL;
	CHECK(o->ctx_get(&cur, &err) == 0 && cur == ctx);
	int d = -1, n = 0, can = 0;
	CHECK(o->current_device(&d, &cur, &err) == 0 && d == 0 && cur == ctx);
	CHECK(o->device_count(&n, &err) == 0 && n >= 1);
	size_t gran = 0;
	CHECK(o->granularity(0, &gran, &err) == 0 && gran == 2 * MIB);

	/* Each operation and the one driver function it calls. */
	EXPECT_CALL("cuCtxGetCurrent", o->ctx_get(&cur, &err));
	EXPECT_CALL("cuCtxSetCurrent", o->ctx_set(ctx, &err));
	EXPECT_CALL("cuCtxGetDevice", o->current_device(&d, &cur, &err));
	EXPECT_CALL("cuDeviceGetCount", o->device_count(&n, &err));
	EXPECT_CALL("cuMemGetAllocationGranularity", o->granularity(0, &gran, &err));
	if (n > 1)
		EXPECT_CALL("cuDeviceCanAccessPeer", o->can_access_peer(0, 1, &can, &err));
	const size_t size = 4 * MIB;
	shim_gpu_va va = 0, tmp = 0;
	shim_gpu_handle h = 0, th = 0;
	shim_gpu_stream s = NULL;
	shim_gpu_event ev = NULL;
	EXPECT_CALL("cuMemAddressReserve", o->reserve(&tmp, size, 0, &err));
	CHECK(o->reserve(&va, size, 0, &err) == 0 && va != 0);
	EXPECT_CALL("cuMemCreate", o->create(&th, size, 0, NULL, &err));
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED, .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CHECK(o->create(&h, size, 0, &prop, &err) == 0 && h != 0);
	EXPECT_CALL("cuMemMap", o->map(va, size, 0, h, &err));
	CHECK(o->map(va, size, 0, h, &err) == 0);
	struct shim_gpu_access acc = { SHIM_GPU_LOC_DEVICE, 0, SHIM_GPU_PROT_READWRITE };
	EXPECT_CALL("cuMemSetAccess", o->set_access(va, size, &acc, 1, &err));
	CHECK(o->set_access(va, size, &acc, 1, &err) == 0);
	EXPECT_CALL("cuStreamCreate", o->stream_create(0, &s, &err));
	CHECK(o->stream_create(0, &s, &err) == 0 && s != NULL);
	EXPECT_CALL("cuEventCreate", o->event_create(&ev, &err));
	CHECK(o->event_create(&ev, &err) == 0 && ev != NULL);
	void *host = NULL, *host2 = NULL;
	EXPECT_CALL("cuMemHostAlloc", o->host_alloc(&host2, size, &err));
	CHECK(o->host_alloc(&host, size, &err) == 0 && host != NULL);

	/* Data in, out through the pinned buffer, as the copy workers move it. */
	uint8_t *src = malloc(size), *back = malloc(size);
	CHECK(src != NULL && back != NULL);
	for (size_t i = 0; i < size; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 12));
	EXPECT_CALL("cuMemcpyHtoDAsync", o->copy_htod_async(va, src, size, s, &err));
	CHECK(o->copy_htod_async(va, src, size, s, &err) == 0);
	EXPECT_CALL("cuMemcpyDtoHAsync", o->copy_dtoh_async(host, va, size, s, &err));
	CHECK(o->copy_dtoh_async(host, va, size, s, &err) == 0);
	EXPECT_CALL("cuEventRecord", o->event_record(ev, s, &err));
	CHECK(o->event_record(ev, s, &err) == 0);
	EXPECT_CALL("cuEventSynchronize", o->event_sync(ev, &err));
	CHECK(o->event_sync(ev, &err) == 0);
	EXPECT_CALL("cuStreamSynchronize", o->stream_sync(s, &err));
	CHECK(o->stream_sync(s, &err) == 0);
	CHECK(memcmp(host, src, size) == 0);
	EXPECT_CALL("cuCtxSynchronize", o->device_sync(0, &err)); /* the table's context for GPU 0 */
	CHECK(o->device_sync(0, &err) == 0);
	size_t free_b = 0, total = 0;
	EXPECT_CALL("cuMemGetInfo", o->mem_info(0, &free_b, &total, &err));
	CHECK(o->mem_info(0, &free_b, &total, &err) == 0 && total > 0);

	/* Released: the address range stays reserved; back at the same address, bit-exact. */
	EXPECT_CALL("cuMemUnmap", o->unmap(va, size, &err));
	CHECK(o->unmap(va, size, &err) == 0);
	EXPECT_CALL("cuMemRelease", o->release(h, &err));
	CHECK(o->release(h, &err) == 0);
	size_t free2 = 0;
	CHECK(o->mem_info(0, &free2, &total, &err) == 0 && free2 == free_b + size);
	CHECK(o->create(&h, size, 0, &prop, &err) == 0 && o->map(va, size, 0, h, &err) == 0 &&
	      o->set_access(va, size, &acc, 1, &err) == 0);
	EXPECT_CALL("cuMemsetD8Async", o->memset_async(va, size, s, &err));
	CHECK(o->memset_async(va, MIB, s, &err) == 0);
	CHECK(o->copy_htod_async(va + MIB, src + MIB, size - MIB, s, &err) == 0);
	CHECK(o->copy_dtoh_async(back, va, size, s, &err) == 0 && o->stream_sync(s, &err) == 0);
	int zero = 1;
	for (size_t i = 0; i < MIB; i++)
		zero &= back[i] == 0;
	CHECK(zero && memcmp(back + MIB, src + MIB, size - MIB) == 0);

	/* Out of memory is -ENOMEM with the driver's code kept, as resume reports it. */
	shim_gpu_handle big = 0;
	CHECK(o->create(&big, (total / gran + 1) * gran, 0, &prop, &err) == -ENOMEM);
	CHECK(o->last_code() == CUDA_ERROR_OUT_OF_MEMORY && strstr(err.msg, "CUDA_ERROR_OUT_OF_MEMORY") != NULL);
	CHECK(strcmp(o->error_string(CUDA_ERROR_OUT_OF_MEMORY), "CUDA_ERROR_OUT_OF_MEMORY") == 0);

	CHECK(o->unmap(va, size, &err) == 0 && o->release(h, &err) == 0);
	EXPECT_CALL("cuMemAddressFree", o->free_va(va, size, &err));
	CHECK(o->free_va(va, size, &err) == 0);
	EXPECT_CALL("cuStreamDestroy", o->stream_destroy(s, &err));
	CHECK(o->stream_destroy(s, &err) == 0);
	o->host_free(host, size);
	free(src);
	free(back);
	char sock[4200];
	snprintf(sock, sizeof(sock), "%s/fakecuda-%d.sock", fake_dir, (int)getpid());
	unlink(sock);
	rmdir(fake_dir);
	return test_summary("test_shim_cuda_ops");
}
