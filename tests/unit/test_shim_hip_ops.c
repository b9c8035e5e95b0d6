/* test_shim_hip_ops: the HIP implementation of struct shim_gpu_ops on the stand-in runtime,
 * through the whole data-path cycle: reserve, create, map, access, copy out, unmap, release
 * (0 bytes held, the address range kept and faulting), re-create, re-map at the same address,
 * copy back, bit-exact; and the errors it reports. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hip_util.h"
#include "shim_config.h"
#include "shim_ctl.h"
#include "shim_gpu.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

int main(void)
{
	const struct shim_gpu_ops *o = &shim_hip_ops;
	struct gcr_err err = { 0 };
	char dir[] = "/tmp/gcr-hip-ops-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	snprintf(shim_cfg.socket_dir, sizeof(shim_cfg.socket_dir), "%s", dir);
	CHECK(test_load_fakehip() != NULL);
	CHECK_STR(o->name, "hip");
	CHECK(o->load(&err) == 0);

	int n = 0, can = 1;
	size_t gran = 0, free0 = 0, total = 0, free1 = 0;
	CHECK(o->device_count(&n, &err) == 0 && n == 1);
	CHECK(o->granularity(0, &gran, &err) == 0 && gran == 2 * MIB);
	CHECK(o->granularity(5, &gran, &err) == -EIO && strstr(err.msg, "hipErrorInvalidValue") != NULL);
	CHECK(o->can_access_peer(0, 0, &can, &err) == 0 && can == 0);
	CHECK(o->mem_info(0, &free0, &total, &err) == 0 && total > 0 && free0 <= total);

	const size_t size = 4 * MIB;
	shim_gpu_va va = 0;
	shim_gpu_handle h = 0;
	shim_gpu_stream s = NULL;
	struct shim_gpu_access acc = { .type = SHIM_GPU_LOC_DEVICE, .id = 0, .flags = SHIM_GPU_PROT_READWRITE };
	CHECK(o->reserve(&va, size, 0, &err) == 0 && va != 0);
	CHECK(o->create(&h, size, 0, NULL, &err) == 0 && h != 0);
	CHECK(o->map(va, size, 0, h, &err) == 0);
	CHECK(o->set_access(va, size, &acc, 1, &err) == 0);
	CHECK(o->set_access(va, size, &acc, 0, &err) == -EINVAL);
	CHECK(o->mem_info(0, &free1, &total, &err) == 0 && free1 == free0 - size);
	CHECK(o->stream_create(0, &s, &err) == 0 && s != NULL);

	/* Data in, out to pinned host memory. */
	uint8_t *src = malloc(size), *out = malloc(size), *back = malloc(size);
	CHECK(src != NULL && out != NULL && back != NULL);
	for (size_t i = 0; i < size; i++)
		src[i] = (uint8_t)(i * 131 + (i >> 12));
	CHECK(o->host_register(out, size, &err) == 0);
	CHECK(o->copy_htod_async(va, src, size, s, &err) == 0);
	CHECK(o->copy_dtoh_async(out, va, size, s, &err) == 0);
	CHECK(o->stream_sync(s, &err) == 0);
	CHECK(memcmp(out, src, size) == 0);

	/* Released: the runtime holds 0 bytes of it; the range stays reserved but unusable. */
	CHECK(o->device_sync(0, &err) == 0);
	CHECK(o->unmap(va, size, &err) == 0);
	CHECK(o->release(h, &err) == 0);
	size_t free2 = 0;
	CHECK(o->mem_info(0, &free2, &total, &err) == 0 && free2 == free0);
	CHECK(o->copy_dtoh_async(back, va, size, s, &err) == -EIO && strstr(err.msg, "hipMemcpyDtoHAsync") != NULL);
	CHECK(o->release(h, &err) == -EIO); /* a released handle is gone */

	/* Back at the same address, bit-exact. */
	shim_gpu_handle h2 = 0;
	CHECK(o->create(&h2, size, 0, NULL, &err) == 0);
	CHECK(o->map(va, size, 0, h2, &err) == 0);
	/* Mapped without access: copies are refused until access is set again. */
	CHECK(o->copy_htod_async(va, out, size, s, &err) == -EIO);
	CHECK(o->set_access(va, size, &acc, 1, &err) == 0);
	CHECK(o->copy_htod_async(va, out, size, s, &err) == 0);
	CHECK(o->host_unregister(out, &err) == 0);
	CHECK(o->host_unregister(out, &err) == -EIO);
	memset(back, 0, size);
	CHECK(o->copy_dtoh_async(back, va, size, s, &err) == 0);
	CHECK(o->stream_sync(s, &err) == 0);
	CHECK(memcmp(back, src, size) == 0);
	CHECK(((volatile uint8_t *)(uintptr_t)va)[size - 1] == src[size - 1]); /* the same address */

	/* Out of memory is -ENOMEM, as resume needs to tell the user. */
	shim_gpu_handle big = 0;
	CHECK(o->create(&big, (total / gran + 1) * gran, 0, NULL, &err) == -ENOMEM);
	CHECK(o->last_code() == SHIM_GPU_OUT_OF_MEMORY);
	CHECK(strstr(err.msg, "hipErrorOutOfMemory") != NULL);
	CHECK(strcmp(o->error_string(2), "hipErrorOutOfMemory") == 0);

	CHECK(o->unmap(va, size, &err) == 0);
	CHECK(o->release(h2, &err) == 0);
	CHECK(o->free_va(va, size, &err) == 0);
	CHECK(o->stream_destroy(s, &err) == 0);
	free(src);
	free(out);
	free(back);
	unlink(shim_ctl_path());
	rmdir(dir);
	return test_summary("test_shim_hip_ops");
}
