/* test_shim_cr: the shim's suspend/resume state machine (shim_cr). The transition table allows
 * exactly the edges suspend and resume take and refuses every other with both state names; the
 * state names on the wire stay; on the stand-in driver a whole cycle keeps every address and
 * byte (converted buffers, an application handle, an all-zero buffer), gives the GPU memory back
 * while suspended, and refuses a second suspend or a resume while running. */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_util.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_cr.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

static void check_edges(void)
{
	static const int allowed[SHIM_CR_NSTATES][SHIM_CR_NSTATES] = {
		[SHIM_CR_RUNNING] = { [SHIM_CR_SUSPENDING] = 1, [SHIM_CR_FROZEN] = 1 },
		[SHIM_CR_SUSPENDING] = { [SHIM_CR_RUNNING] = 1, [SHIM_CR_SUSPENDED] = 1, [SHIM_CR_DETACHED] = 1 },
		[SHIM_CR_SUSPENDED] = { [SHIM_CR_RESUMING] = 1 },
		[SHIM_CR_RESUMING] = { [SHIM_CR_RUNNING] = 1, [SHIM_CR_SUSPENDED] = 1, [SHIM_CR_DETACHED] = 1 },
		/* a member of a group of NCCL processes */
		[SHIM_CR_FROZEN] = { [SHIM_CR_RUNNING] = 1, [SHIM_CR_DRAINED] = 1 },
		[SHIM_CR_DRAINED] = { [SHIM_CR_RUNNING] = 1, [SHIM_CR_DETACHED] = 1, [SHIM_CR_FROZEN] = 1 },
		[SHIM_CR_DETACHED] = { [SHIM_CR_SUSPENDING] = 1, [SHIM_CR_REBUILDING] = 1 },
		[SHIM_CR_REBUILDING] = { [SHIM_CR_REBUILT] = 1, [SHIM_CR_DETACHED] = 1 },
		[SHIM_CR_REBUILT] = { [SHIM_CR_RUNNING] = 1, [SHIM_CR_DETACHED] = 1 },
	};
	for (int from = 0; from < SHIM_CR_NSTATES; from++)
		for (int to = 0; to < SHIM_CR_NSTATES; to++) {
			struct gcr_err err = { 0 };
			int rc = shim_cr_edge_check((enum shim_cr_state)from, (enum shim_cr_state)to, &err);
			if (allowed[from][to]) {
				CHECK(rc == 0);
				continue;
			}
			/* Refused, naming both states in order. */
			char want[96];
			snprintf(want, sizeof(want), "from %s to %s", shim_cr_state_name((enum shim_cr_state)from),
				 shim_cr_state_name((enum shim_cr_state)to));
			CHECK(rc == -EINVAL && err.code == -EINVAL && strstr(err.msg, want) != NULL);
		}
	struct gcr_err err = { 0 };
	CHECK(shim_cr_edge_check(SHIM_CR_RUNNING, (enum shim_cr_state)42, &err) == -EINVAL &&
	      strstr(err.msg, "from running to unknown") != NULL);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i >> 3) * 31 + seed + (i >> 20));
}

int main(void)
{
	struct gcr_err err = { 0 };
	struct shim_cr_report rep;

	/* The names on the wire, and the table. */
	CHECK_STR(shim_cr_state_name(SHIM_CR_RUNNING), "running");
	CHECK_STR(shim_cr_state_name(SHIM_CR_SUSPENDING), "suspending");
	CHECK_STR(shim_cr_state_name(SHIM_CR_SUSPENDED), "suspended");
	CHECK_STR(shim_cr_state_name(SHIM_CR_RESUMING), "resuming");
	CHECK_STR(shim_cr_state_name(SHIM_CR_FROZEN), "frozen");
	CHECK_STR(shim_cr_state_name(SHIM_CR_DRAINED), "drained");
	CHECK_STR(shim_cr_state_name(SHIM_CR_DETACHED), "detached");
	CHECK_STR(shim_cr_state_name(SHIM_CR_REBUILDING), "rebuilding");
	CHECK_STR(shim_cr_state_name(SHIM_CR_REBUILT), "rebuilt");
	CHECK_STR(shim_cr_state_name(SHIM_CR_NSTATES), "unknown");
	check_edges();

	/* Nothing to suspend before a runtime is loaded; the state stays. */
	CHECK(shim_cr_suspend(1000, &rep, &err) == -ENODEV && shim_cr_state() == SHIM_CR_RUNNING);
	CHECK(shim_cr_resume(&rep, &err) == -EINVAL && strstr(err.msg, "not suspended (state running)") != NULL);

	shim_cfg.staging_threads = 2;
	CHECK(fake_setup() != NULL);
	shim_cfg.vmm = 1;
	shim_cfg.vmm_min_bytes = 2 * MIB;

	/* Two converted buffers (one all zero), an application handle mapped whole, a small one. */
	const size_t n1 = 9 * MIB + 4096, n2 = 4 * MIB, n3 = 2 * MIB;
	CUdeviceptr b1 = 0, b2 = 0, app_va = 0, small = 0;
	CHECK(cuMemAlloc_v2(&b1, n1) == CUDA_SUCCESS && cuMemAlloc_v2(&b2, n2) == CUDA_SUCCESS);
	CHECK(cuMemAlloc_v2(&small, 1000) == CUDA_SUCCESS);
	CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
				     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
	CUmemGenericAllocationHandle h = 0;
	CUmemAccessDesc acc = { { CU_MEM_LOCATION_TYPE_DEVICE, 0 }, CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CHECK(cuMemCreate(&h, n3, &prop, 0) == CUDA_SUCCESS &&
	      shim_cu.cuMemAddressReserve(&app_va, n3, 0, 0, 0) == CUDA_SUCCESS &&
	      cuMemMap(app_va, n3, 0, h, 0) == CUDA_SUCCESS && cuMemSetAccess(app_va, n3, &acc, 1) == CUDA_SUCCESS);
	uint8_t *s1 = malloc(n1), *s3 = malloc(n3), *back = malloc(n1);
	CHECK(s1 != NULL && s3 != NULL && back != NULL);
	fill(s1, n1, 5);
	fill(s3, n3, 9);
	CHECK(cuMemcpyHtoD_v2(b1, s1, n1) == CUDA_SUCCESS && cuMemcpyHtoD_v2(app_va, s3, n3) == CUDA_SUCCESS);
	CHECK(cuMemsetD8_v2(b2, 0, n2) == CUDA_SUCCESS);

	size_t free0 = fake_free_bytes();
	err = (struct gcr_err){ 0 };
	CHECK(shim_cr_suspend(10000, &rep, &err) == 0);
	if (err.msg[0] != '\0')
		fprintf(stderr, "suspend: %s\n", err.msg);
	CHECK(shim_cr_state() == SHIM_CR_SUSPENDED);
	CHECK(rep.handles == 3 && rep.bytes == 10 * MIB + 4 * MIB + 2 * MIB); /* b1 rounds up to 10 MiB */
	CHECK(rep.zero >= n2 && rep.copied + rep.zero + rep.unchanged == rep.bytes);
	CHECK(fake_free_bytes() >= free0 + 16 * MIB);
	CHECK(shim_cr_suspend(1000, &rep, &err) == -EALREADY && strstr(err.msg, "state suspended") != NULL);
	shim_cr_trim();

	CHECK(shim_cr_resume(&rep, &err) == 0 && shim_cr_state() == SHIM_CR_RUNNING);
	CHECK(rep.handles == 3 && rep.mappings == 3);
	CHECK(fake_free_bytes() == free0);
	/* The same addresses hold the same bytes. */
	uint64_t base = 0;
	size_t req = 0;
	CHECK(shim_alloc_buf_range(b1, &base, &req) == 1 && base == b1 && req == n1);
	CHECK(cuMemcpyDtoH_v2(back, b1, n1) == CUDA_SUCCESS && memcmp(back, s1, n1) == 0);
	CHECK(cuMemcpyDtoH_v2(back, app_va, n3) == CUDA_SUCCESS && memcmp(back, s3, n3) == 0);
	memset(back, 0xff, n2);
	int zero = cuMemcpyDtoH_v2(back, b2, n2) == CUDA_SUCCESS;
	for (size_t i = 0; zero && i < n2; i++)
		zero = back[i] == 0;
	CHECK(zero);
	CHECK(shim_cr_resume(&rep, &err) == -EINVAL && strstr(err.msg, "state running") != NULL);

	/* A second cycle after the application changed a buffer. */
	fill(s1, n1, 77);
	CHECK(cuMemcpyHtoD_v2(b1, s1, n1) == CUDA_SUCCESS);
	CHECK(shim_cr_suspend(10000, &rep, &err) == 0 && shim_cr_resume(&rep, &err) == 0);
	CHECK(cuMemcpyDtoH_v2(back, b1, n1) == CUDA_SUCCESS && memcmp(back, s1, n1) == 0);
	unsigned long long ns = 0, nr = 0;
	shim_cr_requests(&ns, &nr);
	CHECK(ns == 4 && nr == 4);

	CHECK(cuMemUnmap(app_va, n3) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS);
	CHECK(cuMemFree_v2(b1) == CUDA_SUCCESS && cuMemFree_v2(b2) == CUDA_SUCCESS && cuMemFree_v2(small) == CUDA_SUCCESS);
	free(s1);
	free(s3);
	free(back);
	fake_teardown();
	return test_summary("test_shim_cr");
}
