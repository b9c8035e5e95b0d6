/* test_shim_cr: the shim's suspend/resume state machine (shim_cr). The transition table allows
 * exactly the edges suspend and resume take and refuses every other with both state names, and
 * the same for where the GPU data may be and go; the names on the wire stay; on the stand-in
 * driver a whole cycle keeps every address and byte (converted buffers, an application handle,
 * an all-zero buffer), gives the GPU memory back while suspended, and refuses a second suspend
 * or a resume while running; the restore's need and the wake are taken only while suspended and
 * gone after the resume. */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda_util.h"
#include "gcr_proto.h"
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

/* Where the data may be in each state, and where it may go from each place. */
static void check_places(void)
{
	enum { G = 1 << SHIM_CR_DATA_GPU, H = 1 << SHIM_CR_DATA_HOST, W = 1 << SHIM_CR_DATA_WRITTEN,
	       F = 1 << SHIM_CR_DATA_FILES };
	static const unsigned in[SHIM_CR_NSTATES] = {
		[SHIM_CR_RUNNING] = G, [SHIM_CR_SUSPENDING] = G, [SHIM_CR_SUSPENDED] = H | W | F,
		[SHIM_CR_RESUMING] = H | F, [SHIM_CR_FROZEN] = G, [SHIM_CR_DRAINED] = G,
		[SHIM_CR_DETACHED] = G, [SHIM_CR_REBUILDING] = G, [SHIM_CR_REBUILT] = G,
	};
	static const unsigned to[SHIM_CR_NDATA] = {
		[SHIM_CR_DATA_GPU] = H | W | F, [SHIM_CR_DATA_HOST] = G | W, [SHIM_CR_DATA_WRITTEN] = F,
		[SHIM_CR_DATA_FILES] = G | W,
	};
	for (int st = 0; st < SHIM_CR_NSTATES; st++)
		for (int a = 0; a < SHIM_CR_NDATA; a++)
			for (int b = 0; b < SHIM_CR_NDATA; b++) {
				struct gcr_err err = { 0 };
				int rc = shim_cr_data_check((enum shim_cr_state)st, (enum shim_cr_data)a,
							    (enum shim_cr_data)b, &err);
				int ok = (in[st] & (1u << b)) && (a == b || (to[a] & (1u << b)));
				CHECK(ok ? rc == 0 : rc == -EINVAL && err.code == -EINVAL && err.msg[0] != '\0');
			}
	struct gcr_err err = { 0 };
	CHECK(shim_cr_data_check(SHIM_CR_SUSPENDED, SHIM_CR_DATA_HOST, SHIM_CR_DATA_GPU, &err) == -EINVAL &&
	      strstr(err.msg, "no data gpu while suspended") != NULL);
	CHECK(shim_cr_data_check(SHIM_CR_SUSPENDED, SHIM_CR_DATA_WRITTEN, SHIM_CR_DATA_HOST, &err) == -EINVAL &&
	      strstr(err.msg, "from written to host") != NULL);
	CHECK(shim_cr_data_check(SHIM_CR_SUSPENDED, SHIM_CR_DATA_HOST, (enum shim_cr_data)9, &err) == -EINVAL &&
	      strstr(err.msg, "unknown") != NULL);
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
	CHECK_STR(shim_cr_data_name(SHIM_CR_DATA_GPU), GCR_DATA_GPU);
	CHECK_STR(shim_cr_data_name(SHIM_CR_DATA_HOST), GCR_DATA_HOST);
	CHECK_STR(shim_cr_data_name(SHIM_CR_DATA_WRITTEN), GCR_DATA_WRITTEN);
	CHECK_STR(shim_cr_data_name(SHIM_CR_DATA_FILES), GCR_DATA_FILES);
	CHECK_STR(shim_cr_data_name(SHIM_CR_NDATA), "unknown");
	check_edges();
	check_places();
	CHECK(shim_cr_data() == SHIM_CR_DATA_GPU && shim_cr_wake(NULL) == SHIM_CR_WAKE_OFF);

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
	CHECK(shim_cr_data() == SHIM_CR_DATA_HOST);
	/* The restore's need: taken now, replaced by the next, refused when empty. */
	struct gcr_need need = { .n = 1 }, got;
	snprintf(need.dev[0].uuid, sizeof(need.dev[0].uuid), "GPU-one");
	need.dev[0].bytes = 5 * MIB;
	CHECK(shim_cr_need(&got) == 0);
	CHECK(shim_cr_need_set(&need, &err) == 0);
	need.dev[0].bytes = 6 * MIB;
	CHECK(shim_cr_need_set(&need, &err) == 0 && shim_cr_need(&got) == 1 && got.n == 1 && got.dev[0].bytes == 6 * MIB);
	CHECK_STR(got.dev[0].uuid, "GPU-one");
	struct gcr_need none = { .n = 0 };
	CHECK(shim_cr_need_set(&none, &err) == -EINVAL && shim_cr_need(&got) == 1 && got.dev[0].bytes == 6 * MIB);
	/* A refused second suspend leaves the need of this one. */
	CHECK(shim_cr_suspend(1000, &rep, &err) == -EALREADY && strstr(err.msg, "state suspended") != NULL);
	CHECK(shim_cr_need(&got) == 1);
	/* The wake: armed, then called once, with the first caller's time. */
	double since = -1;
	CHECK(shim_cr_wake_fire(1.0) == 0 && shim_cr_wake(NULL) == SHIM_CR_WAKE_OFF);
	CHECK(shim_cr_wake_arm(&err) == 0 && shim_cr_wake(&since) == SHIM_CR_WAKE_ARMED && since == 0);
	CHECK(shim_cr_wake_fire(123.0) == 1 && shim_cr_wake_fire(456.0) == 0);
	CHECK(shim_cr_wake(&since) == SHIM_CR_WAKE_CALLED && since == 123.0);
	/* The data moves only along the table: image-write's drop, then image-read; a resume is
	 * refused while the data is in files only, and the need stays. */
	CHECK(shim_cr_data_move(SHIM_CR_DATA_GPU, &err) == -EINVAL && shim_cr_data() == SHIM_CR_DATA_HOST);
	CHECK(shim_cr_data_move(SHIM_CR_DATA_FILES, &err) == -EINVAL && shim_cr_data() == SHIM_CR_DATA_HOST);
	CHECK(shim_cr_data_move(SHIM_CR_DATA_WRITTEN, &err) == 0 && shim_cr_data() == SHIM_CR_DATA_WRITTEN);
	CHECK(shim_cr_resume(&rep, &err) == -EINVAL && strstr(err.msg, "image files only") != NULL);
	CHECK(shim_cr_state() == SHIM_CR_SUSPENDED && shim_cr_need(&got) == 1);
	CHECK(shim_cr_wake_arm(&err) == -EINVAL && strstr(err.msg, "data written") != NULL);
	CHECK(shim_cr_data_move(SHIM_CR_DATA_HOST, &err) == -EINVAL && shim_cr_data() == SHIM_CR_DATA_WRITTEN);
	/* No file was attached (src_fd), so the resume still reads the staging: only the label moves. */
	CHECK(shim_cr_data_move(SHIM_CR_DATA_FILES, &err) == 0 && shim_cr_data() == SHIM_CR_DATA_FILES);
	shim_cr_trim();

	CHECK(shim_cr_resume(&rep, &err) == 0 && shim_cr_state() == SHIM_CR_RUNNING);
	CHECK(rep.handles == 3 && rep.mappings == 3);
	/* Back on the GPU: the need and the wake went with the suspend, and neither is taken now. */
	CHECK(shim_cr_data() == SHIM_CR_DATA_GPU && shim_cr_need(&got) == 0 && shim_cr_wake(NULL) == SHIM_CR_WAKE_OFF);
	CHECK(shim_cr_need_set(&need, &err) == -EINVAL && strstr(err.msg, "state running") != NULL);
	CHECK(shim_cr_wake_arm(&err) == -EINVAL && shim_cr_wake(NULL) == SHIM_CR_WAKE_OFF);
	CHECK(shim_cr_data_move(SHIM_CR_DATA_HOST, &err) == -EINVAL && shim_cr_data() == SHIM_CR_DATA_GPU);
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
	CHECK(ns == 4 && nr == 5); /* the refused ones too */

	CHECK(cuMemUnmap(app_va, n3) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS);
	CHECK(cuMemFree_v2(b1) == CUDA_SUCCESS && cuMemFree_v2(b2) == CUDA_SUCCESS && cuMemFree_v2(small) == CUDA_SUCCESS);
	free(s1);
	free(s3);
	free(back);
	fake_teardown();
	return test_summary("test_shim_cr");
}
