/* test_shim_staging: the host side of the data path (shim_staging) on the stand-in driver:
 * bytes copied out of device memory into the pool come back bit-exact, to the same or another
 * address; a piece marked zero is set to zero on the GPU; every group's done callback runs
 * exactly once, and a callback that asks to stop is not called again; placement refuses past
 * the pool's capacity and starts over after reset; pieces on several GPUs are taken one GPU
 * after another in turn. */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_util.h"
#include "shim_config.h"
#include "shim_gpu.h"
#include "shim_staging.h"
#include "util.h"

#define MIB ((size_t)1 << 20)
#define CH SHIM_STAGING_CHUNK
#define NGROUPS 3

struct done_log {
	int calls[NGROUPS];
	int stop_at; /* group whose callback returns non-zero, or -1 */
	int after_stop;
	int stopped;
};

static int on_done(size_t group, void *ctx)
{
	struct done_log *d = ctx;
	if (d->stopped)
		d->after_stop++;
	d->calls[group]++;
	if ((int)group == d->stop_at) {
		d->stopped = 1;
		return 1;
	}
	return 0;
}

/* A device buffer of n bytes (a granularity multiple) through the operations table. */
static shim_gpu_va dev_buf(size_t n, shim_gpu_handle *h)
{
	const struct shim_gpu_ops *o = &shim_cuda_ops;
	struct gcr_err err;
	shim_gpu_va va = 0;
	struct shim_gpu_access acc = { SHIM_GPU_LOC_DEVICE, 0, SHIM_GPU_PROT_READWRITE };
	if (o->reserve(&va, n, 0, &err) < 0 || o->create(h, n, 0, NULL, &err) < 0 || o->map(va, n, 0, *h, &err) < 0 ||
	    o->set_access(va, n, &acc, 1, &err) < 0)
		return 0;
	return va;
}

int main(void)
{
	struct gcr_err err = { 0 };
	shim_cfg.staging_threads = 2;
	shim_cfg.staging_prepare = 1;
	CUcontext ctx = fake_setup();
	CHECK(ctx != NULL);
	const struct shim_gpu_ops *o = &shim_cuda_ops;

	/* Pieces on GPUs 0, 0, 0, 2, 2, 5: taken 0, 2, 5 in turn, each GPU's in table order. */
	struct shim_xfer mix[6] = { { .device = 0 }, { .device = 0 }, { .device = 0 },
				    { .device = 2 }, { .device = 2 }, { .device = 5 } };
	size_t *ord = NULL, want[6] = { 0, 3, 5, 1, 4, 2 };
	CHECK(shim_staging_order(mix, 6, &ord, &err) == 0 && ord != NULL);
	CHECK(memcmp(ord, want, sizeof(want)) == 0);
	free(ord);
	CHECK(shim_staging_order(mix, 3, &ord, &err) == 0 && ord == NULL); /* one GPU: table order */
	mix[5].device = SHIM_MAX_DEVICES;
	CHECK(shim_staging_order(mix, 6, &ord, &err) == -EINVAL && ord == NULL);

	/* Three groups: 4 MiB + 1 byte (three pieces, the last 1 byte long), 2 MiB, and none. */
	const size_t n = 10 * MIB;
	shim_gpu_handle h1 = 0, h2 = 0;
	shim_gpu_va a = dev_buf(n, &h1), b = dev_buf(n, &h2);
	CHECK(a != 0 && b != 0);
	uint8_t *src = malloc(n), *back = malloc(n);
	CHECK(src != NULL && back != NULL);
	for (size_t i = 0; i < n; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 12) + 1);
	CHECK(cuMemcpyHtoD_v2(a, src, n) == CUDA_SUCCESS);

	shim_staging_note_bytes(2 * n, 0, o, ctx);
	CHECK(shim_staging_prepare(o, 4 * CH, &err) == 0);
	struct shim_staging_stats ss;
	shim_staging_stats(&ss);
	CHECK(ss.workers >= 1 && ss.capacity >= 4 * CH);

	struct shim_xfer x[4];
	uint32_t sizes[4] = { CH, CH, 1, CH };
	shim_gpu_va devs[4] = { a, a + CH, a + 2 * CH, a + 4 * CH };
	uint32_t groups[4] = { 0, 0, 0, 1 };
	for (int i = 0; i < 4; i++) {
		uint64_t off = 0;
		CHECK(shim_staging_alloc(sizes[i], &off) == 0 && off % CH == 0);
		x[i] = (struct shim_xfer){ .off = off, .dev = devs[i], .size = sizes[i], .device = 0, .group = groups[i] };
	}
	struct done_log d = { .stop_at = -1 };
	struct shim_staging_groups g = { .ngroups = NGROUPS, .done = on_done, .ctx = &d };
	CHECK(shim_staging_transfer(1, x, 4, &g, &err) == 0);
	CHECK(d.calls[0] == 1 && d.calls[1] == 1 && d.calls[2] == 1);

	/* Back to another buffer: the same bytes where they were copied, the rest untouched. */
	CHECK(cuMemsetD8_v2(b, 0xee, n) == CUDA_SUCCESS);
	for (int i = 0; i < 4; i++)
		x[i].dev = devs[i] - a + b;
	CHECK(shim_staging_transfer(0, x, 4, NULL, &err) == 0);
	CHECK(cuMemcpyDtoH_v2(back, b, n) == CUDA_SUCCESS);
	CHECK(memcmp(back, src, 2 * CH + 1) == 0 && back[2 * CH + 1] == 0xee);
	CHECK(memcmp(back + 4 * CH, src + 4 * CH, CH) == 0 && back[3 * CH] == 0xee);

	/* Back in place after the application's bytes were lost; one piece recorded as zero. */
	CHECK(cuMemsetD8_v2(a, 0x55, n) == CUDA_SUCCESS);
	for (int i = 0; i < 4; i++)
		x[i].dev = devs[i];
	x[1].zero = 1;
	CHECK(shim_staging_transfer(0, x, 4, NULL, &err) == 0);
	CHECK(cuMemcpyDtoH_v2(back, a, n) == CUDA_SUCCESS);
	int zero = 1;
	for (size_t i = CH; i < 2 * CH; i++)
		zero &= back[i] == 0;
	CHECK(zero && memcmp(back, src, CH) == 0 && back[2 * CH] == src[2 * CH]);
	x[1].zero = 0;

	/* A callback that asks to stop is not called again; the copies still finish. */
	d = (struct done_log){ .stop_at = 2 }; /* group 2 has no pieces: reported first */
	CHECK(shim_staging_transfer(1, x, 4, &g, &err) == 0);
	CHECK(d.calls[2] == 1 && d.after_stop == 0 && d.calls[0] + d.calls[1] == 0);

	/* Placement: refused past capacity, from the start again after reset. */
	shim_staging_stats(&ss);
	uint64_t off = 0, first = 0;
	CHECK(shim_staging_alloc(ss.capacity - ss.used + 1, &off) == -ENOSPC);
	shim_staging_reset();
	CHECK(shim_staging_alloc(CH, &first) == 0 && first == 0);
	shim_staging_resume_background();

	CHECK(o->unmap(a, n, &err) == 0 && o->release(h1, &err) == 0 && o->free_va(a, n, &err) == 0);
	CHECK(o->unmap(b, n, &err) == 0 && o->release(h2, &err) == 0 && o->free_va(b, n, &err) == 0);
	free(src);
	free(back);
	fake_teardown();
	return test_summary("test_shim_staging");
}
