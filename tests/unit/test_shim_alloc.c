/* test_shim_alloc: the allocation table (shim_alloc) through the CUDA entry points
 * (shim_cuda_alloc.c) and its own API, on the stand-in driver: large cuMemAlloc buffers become
 * VMM buffers and small ones stay with the driver; application handles are virtualised; the
 * iterator visits every record once; release and recreate keep every address (and recreate
 * undoes itself when it fails); what cannot be moved is refused with the reason; the legacy IPC
 * export of a managed buffer is refused, of a driver buffer passed on. */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_util.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_gpu.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

struct walk {
	struct shim_phys *seen[16];
	uint64_t va[16];
	size_t n, dup;
};

static int visit(struct shim_phys *p, uint64_t va, void *arg)
{
	struct walk *w = arg;
	for (size_t i = 0; i < w->n; i++)
		w->dup += w->seen[i] == p;
	if (w->n < 16) {
		w->va[w->n] = va;
		w->seen[w->n++] = p;
	}
	return 0;
}

static int visit_map(const struct shim_map *m, void *arg)
{
	(void)m;
	(*(size_t *)arg)++;
	return 0;
}

static int stop_at_second(struct shim_phys *p, uint64_t va, void *arg)
{
	(void)p;
	(void)va;
	return ++*(int *)arg == 2 ? 7 : 0;
}

static uint64_t va_of(const struct walk *w, const struct shim_phys *p)
{
	for (size_t i = 0; i < w->n; i++)
		if (w->seen[i] == p)
			return w->va[i];
	return UINT64_MAX;
}

/* The record whose whole is mapped at va (from a walk with SHIM_ALLOC_EACH_VA). */
static struct shim_phys *phys_at(const struct walk *w, uint64_t va)
{
	for (size_t i = 0; i < w->n; i++)
		if (w->va[i] == va)
			return w->seen[i];
	return NULL;
}

static int fill_check(CUdeviceptr va, size_t n, uint8_t seed)
{
	uint8_t *src = malloc(n), *back = malloc(n);
	int ok = src != NULL && back != NULL;
	for (size_t i = 0; ok && i < n; i++)
		src[i] = (uint8_t)(i * 7 + seed);
	ok = ok && cuMemcpyHtoD_v2(va, src, n) == CUDA_SUCCESS && cuMemcpyDtoH_v2(back, va, n) == CUDA_SUCCESS &&
	     memcmp(src, back, n) == 0;
	free(src);
	free(back);
	return ok;
}

int main(void)
{
	struct gcr_err err = { 0 };
	CHECK(fake_setup() != NULL);
	shim_cfg.vmm = 1;
	shim_cfg.vmm_min_bytes = 2 * MIB;
	shim_cfg.staging_prepare = 0; /* no background pool for this test */

	/* A large buffer is converted (the table answers for its range), a small one is not. */
	CUdeviceptr big = 0, small = 0, base = 0;
	size_t size = 0;
	CHECK(cuMemAlloc_v2(&big, 5 * MIB) == CUDA_SUCCESS && big != 0);
	CHECK(cuMemAlloc_v2(&small, 4096) == CUDA_SUCCESS && small != 0);
	CHECK(shim_alloc_buf_range(big + MIB, NULL, NULL) == 1 && shim_alloc_buf_range(small, NULL, NULL) == 0);
	CHECK(cuMemGetAddressRange_v2(&base, &size, big + 4096) == CUDA_SUCCESS && base == big && size == 5 * MIB);
	struct shim_alloc_stats st;
	shim_alloc_stats(&st);
	CHECK(st.vmm_buffers == 1 && st.vmm_bytes == 6 * MIB && st.driver_buffers == 1 && st.converted_total == 1);
	CHECK(fill_check(big, 5 * MIB, 1));

	/* The application's own handles: a tagged value of the table's, the driver's behind it. */
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CUmemGenericAllocationHandle h1 = 0, h2 = 0, again = 0;
	CUdeviceptr app_va = 0;
	CHECK(cuMemCreate(&h1, 2 * MIB, &prop, 0) == CUDA_SUCCESS && (h1 >> 40) == 0x676372);
	CHECK(cuMemCreate(&h2, 2 * MIB, &prop, 0) == CUDA_SUCCESS && h2 != h1);
	CHECK(shim_cu.cuMemAddressReserve(&app_va, 2 * MIB, 0, 0, 0) == CUDA_SUCCESS);
	CHECK(cuMemMap(app_va, 2 * MIB, 0, h1, 0) == CUDA_SUCCESS);
	CUmemAccessDesc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CHECK(cuMemSetAccess(app_va, 2 * MIB, &acc, 1) == CUDA_SUCCESS);
	CHECK(cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(app_va + 4096)) == CUDA_SUCCESS && again == h1);
	CHECK(cuMemRelease(again) == CUDA_SUCCESS);
	CUmemAllocationProp got = { 0 };
	CHECK(cuMemGetAllocationPropertiesFromHandle(&got, h2) == CUDA_SUCCESS && got.location.id == 0 &&
	      got.type == CU_MEM_ALLOCATION_TYPE_PINNED);
	CHECK(fill_check(app_va, 2 * MIB, 2));

	/* The iterator visits each record once: the converted buffer and both handles. */
	struct walk w = { 0 };
	CHECK(shim_alloc_each(SHIM_ALLOC_EACH_VA, visit, &w) == 0);
	CHECK(w.n == 3 && w.dup == 0);
	struct shim_phys *pbig = phys_at(&w, big), *p1 = phys_at(&w, app_va);
	CHECK(pbig != NULL && p1 != NULL && pbig != p1);
	int unmapped_seen = 0;
	for (size_t i = 0; i < w.n; i++)
		unmapped_seen += w.va[i] == 0; /* h2: never mapped */
	CHECK(unmapped_seen == 1);
	size_t nmaps = 0;
	CHECK(shim_alloc_each_map(visit_map, &nmaps) == 0 && nmaps == 2 && shim_alloc_nmaps() == 2);
	int calls = 0;
	CHECK(shim_alloc_each(0, stop_at_second, &calls) == 7 && calls == 2);

	/* Movable: nothing managed or shared, one vendor. Another vendor is refused by name. */
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == 0);
	CHECK(shim_alloc_check_movable(&shim_hip_ops, &err) == -ENOTSUP && strstr(err.msg, "other than hip") != NULL);
	CUdeviceptr managed = 0;
	CHECK(cuMemAllocManaged(&managed, MIB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == -ENOTSUP && strstr(err.msg, "managed") != NULL);
	CHECK(cuMemFree_v2(managed) == CUDA_SUCCESS && shim_alloc_check_movable(&shim_cuda_ops, &err) == 0);

	/* Release gives the memory back and keeps the addresses; recreate maps at the same ones. */
	size_t free0 = fake_free_bytes();
	CHECK(shim_alloc_release(pbig, &err) == 0 && shim_alloc_release(p1, &err) == 0);
	CHECK(pbig->real == 0 && p1->real == 0 && pbig->staged && p1->staged);
	CHECK(fake_free_bytes() == free0 + 8 * MIB);
	uint64_t b64 = 0;
	CHECK(shim_alloc_buf_range(big, &b64, &size) == 1 && b64 == big && size == 5 * MIB);

	/* A recreate that fails half way undoes itself: nothing stays created or mapped. */
	CHECK(fake("fail cuMemMap 2 999") == 0);
	CHECK(shim_alloc_recreate(&err) == -EIO && strstr(err.msg, "cuMemMap") != NULL);
	fake("disarm");
	CHECK(pbig->real == 0 && p1->real == 0 && fake_free_bytes() == free0 + 8 * MIB);
	CHECK(shim_alloc_recreate(&err) == 0 && pbig->real != 0 && p1->real != 0);
	CHECK(fake_free_bytes() == free0);
	w = (struct walk){ 0 };
	CHECK(shim_alloc_each(SHIM_ALLOC_EACH_VA, visit, &w) == 0 && va_of(&w, pbig) == big && va_of(&w, p1) == app_va);
	CHECK(fill_check(big, 5 * MIB, 3) && fill_check(app_va, 2 * MIB, 4));
	/* An undo after a successful recreate (the copies failed) releases it all again. */
	shim_alloc_recreate_undo();
	CHECK(pbig->real == 0 && p1->real == 0 && fake_free_bytes() == free0 + 8 * MIB);
	CHECK(shim_alloc_recreate(&err) == 0);
	shim_alloc_resumed();
	CHECK(!pbig->staged && !p1->staged && pbig->real != 0);

	/* Legacy IPC: refused on the converted buffer (anywhere in it), passed on for the small one. */
	CUipcMemHandle ipc;
	CHECK(cuIpcGetMemHandle(&ipc, big) == CUDA_ERROR_NOT_SUPPORTED);
	CHECK(cuIpcGetMemHandle(&ipc, big + 3 * MIB) == CUDA_ERROR_NOT_SUPPORTED);
	memset(&ipc, 0, sizeof(ipc));
	CHECK(cuIpcGetMemHandle(&ipc, small) == CUDA_SUCCESS && strncmp(ipc.reserved, "fakecuda-ipc", 12) == 0);
	CHECK(shim_alloc_check_movable(&shim_cuda_ops, &err) == 0); /* nothing of the table is shared */

	/* Handles: a second release of the same reference is invalid; unmap drops the mapping. */
	CHECK(cuMemUnmap(app_va, 2 * MIB) == CUDA_SUCCESS && shim_alloc_nmaps() == 1);
	CHECK(cuMemRelease(h1) == CUDA_SUCCESS && cuMemRelease(h1) == CUDA_ERROR_INVALID_VALUE);
	CHECK(cuMemRelease(h2) == CUDA_SUCCESS);
	CHECK(shim_cu.cuMemAddressFree(app_va, 2 * MIB) == CUDA_SUCCESS);
	CHECK(cuMemFree_v2(big) == CUDA_SUCCESS && shim_alloc_buf_range(big, NULL, NULL) == 0);
	CHECK(cuMemFree_v2(small) == CUDA_SUCCESS);
	shim_alloc_stats(&st);
	CHECK(st.vmm_buffers == 0 && st.vmm_bytes == 0 && st.driver_buffers == 0 && st.app_vmm_handles == 0);
	w = (struct walk){ 0 };
	CHECK(shim_alloc_each(0, visit, &w) == 0 && w.n == 0);
	fake_teardown();
	return test_summary("test_shim_alloc");
}
