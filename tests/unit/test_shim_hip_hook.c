/* test_shim_hip_hook: the HIP hook table against the stand-in runtime: every hook resolves to
 * the runtime's function and maps back to its wrapper, wrappers pass the gate (and wait while
 * it is closed), allocation wrappers keep exact counts in the shared table, and runtime
 * errors pass through. */
#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "hip_util.h"
#include "shim_config.h"
#include "shim_alloc.h"
#include "shim_ctl.h"
#include "shim_gate.h"
#include "shim_hip_alloc.h"
#include "shim_hip_hook.h"
#include "gate_util.h"
#include "util.h"

#define MIB ((size_t)1 << 20)

static atomic_int passed;
static hipError_t thread_rc = hipErrorUnknown;

static void *sync_once(void *arg)
{
	(void)arg;
	thread_rc = hipDeviceSynchronize(); /* the shim's wrapper: this binary defines it */
	atomic_store(&passed, 1);
	return NULL;
}

static int is_fake(const void *fn)
{
	Dl_info di;
	return fn != NULL && dladdr(fn, &di) != 0 && di.dli_fname != NULL &&
	       strstr(di.dli_fname, "fakehip/libamdhip64.so.5") != NULL;
}

int main(void)
{
	char dir[] = "/tmp/gcr-hip-hook-XXXXXX";
	CHECK(mkdtemp(dir) != NULL);
	snprintf(shim_cfg.socket_dir, sizeof(shim_cfg.socket_dir), "%s", dir);
	/* The second hipMalloc below fails in the runtime (hipErrorOutOfMemory). */
	setenv("FAKEHIP_FAIL", "hipMalloc:2:2", 1);
	CHECK(test_load_fakehip() != NULL);
	CHECK(shim_real_handle(SHIM_HIP) == NULL); /* nothing HIP is touched before a HIP call */

	/* Every hook: the runtime's own function, distinct from the wrapper, and back. */
	CHECK(SHIM_HIP_HOOK_COUNT > 70);
	int resolved = 0, expected = 0;
	for (int i = 0; i < SHIM_HIP_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++) {
			const char *name = shim_hip_hooks[i].name[v];
			if (name == NULL)
				continue;
			/* HIP 5.x exports the hip_ext.h launches only under their C++ names. */
			int c_name_of_cxx = v == 0 && shim_hip_hooks[i].name[1] != NULL &&
					    strncmp(shim_hip_hooks[i].name[1], "_Z", 2) == 0;
			void *real = shim_real_hook(SHIM_HIP, (unsigned)i, v);
			void *wrapper = shim_hip_hooks[i].wrapper[v];
			if (c_name_of_cxx) {
				CHECK(real == NULL);
				continue;
			}
			expected++;
			if (real == NULL) {
				fprintf(stderr, "unresolved: %s\n", name);
				continue;
			}
			int ok = is_fake(real) && wrapper != NULL && wrapper != real &&
				 shim_real_wrap(SHIM_HIP, real) == wrapper && shim_real_wrap_name(SHIM_HIP, name) == wrapper;
			if (!ok)
				fprintf(stderr, "bad hook: %s\n", name);
			resolved += ok;
		}
	CHECK(expected > 80);
	CHECK(resolved == expected);
	CHECK(shim_real_handle(SHIM_HIP) != NULL);
	/* A name the shim does not interpose, and a pointer that is not a hook. */
	CHECK(shim_real_wrap_name(SHIM_HIP, "hipGetDeviceCount") == NULL);
	CHECK(shim_real_wrap(SHIM_HIP, dlsym(shim_real_handle(SHIM_HIP), "hipGetDeviceCount")) == NULL);
	CHECK(shim_real_wrap(SHIM_HIP, (void *)&main) == NULL);
	/* The first HIP call started the control socket, as cuInit does for CUDA. */
	CHECK(shim_ctl_path()[0] != '\0' && access(shim_ctl_path(), F_OK) == 0);

	/* The gate: open, calls pass and are counted per variant. */
	CHECK(hipDeviceSynchronize() == hipSuccess);
	CHECK(hipStreamSynchronize_spt(NULL) == hipSuccess);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipDeviceSynchronize), 0) == 1);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipStreamSynchronize), 1) == 1);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipStreamSynchronize), 0) == 0);
	/* Closed: a HIP caller waits at the same gate as CUDA callers until it opens. */
	struct gcr_err err;
	CHECK(shim_gate_close(1000, &err) == 0);
	uint64_t waits = shim_gate_waits();
	pthread_t th;
	pthread_create(&th, NULL, sync_once, NULL);
	CHECK(test_gate_wait_seen(waits));
	CHECK(atomic_load(&passed) == 0);
	shim_gate_open();
	pthread_join(th, NULL);
	CHECK(atomic_load(&passed) == 1 && thread_rc == hipSuccess);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipDeviceSynchronize), 0) == 2);

	/* Allocations go into the shared table (shim_alloc): large hipMalloc buffers onto the VMM
	 * API, small ones counted as the runtime's; freed records go; runtime errors pass through. */
	struct shim_alloc_stats st;
	CHECK(shim_hip_alloc_used() == 0);
	void *a = NULL, *b = NULL, *c = NULL;
	CHECK(hipMalloc(&a, 3 * MIB) == hipSuccess && a != NULL); /* converted: no runtime hipMalloc */
	shim_alloc_stats(&st);
	CHECK(st.vmm_bytes == 4 * MIB && st.vmm_buffers == 1 && st.converted_total == 1);
	CHECK(shim_hip_alloc_used());
	memset(a, 0x5a, 3 * MIB); /* the stand-in's device memory is host memory, mapped with access */
	CHECK(hipMalloc(&b, MIB) == hipSuccess && b != NULL); /* the runtime's first hipMalloc */
	CHECK(hipMalloc(&c, MIB) == hipErrorOutOfMemory);     /* its second: the injected fault */
	shim_alloc_stats(&st);
	CHECK(st.driver_bytes == MIB && st.driver_buffers == 1);
	void *m = NULL;
	CHECK(hipMallocManaged(&m, MIB, hipMemAttachGlobal) == hipSuccess);
	void *as = NULL;
	CHECK(hipMallocAsync(&as, 2 * MIB, NULL) == hipSuccess);
	shim_alloc_stats(&st);
	CHECK(st.managed_bytes == MIB && st.async_bytes == 2 * MIB);
	void *pp = NULL;
	size_t pitch = 0;
	CHECK(hipMallocPitch(&pp, &pitch, 1000, 4096) == hipSuccess && pitch == 1024); /* 4 MiB: converted */
	shim_alloc_stats(&st);
	CHECK(st.vmm_buffers == 2 && st.vmm_bytes == 8 * MIB);
	CHECK(hipFree(a) == hipSuccess && hipFree(b) == hipSuccess && hipFree(m) == hipSuccess &&
	      hipFreeAsync(as, NULL) == hipSuccess && hipFree(pp) == hipSuccess);
	CHECK(hipFree((void *)0x1000) != hipSuccess); /* unknown: the runtime's answer */
	shim_alloc_stats(&st);
	CHECK(st.vmm_bytes == 0 && st.vmm_buffers == 0 && st.driver_bytes == 0 && st.driver_buffers == 0 &&
	      st.managed_bytes == 0 && st.async_buffers == 0);

	/* The application's own virtual memory: reserve, create (a handle of the table's), map
	 * twice, access recorded, and back to nothing. */
	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = hipMemAllocationTypePinned;
	prop.location.type = hipMemLocationTypeDevice;
	void *va = NULL;
	hipMemGenericAllocationHandle_t h = NULL;
	CHECK(hipMemAddressReserve(&va, 8 * MIB, 0, NULL, 0) == hipSuccess);
	CHECK(hipMemCreate(&h, 4 * MIB, &prop, 0) == hipSuccess);
	CHECK(((uint64_t)(uintptr_t)h >> 40) == 0x676372); /* "gcr": virtualised */
	CHECK(hipMemMap(va, 4 * MIB, 0, h, 0) == hipSuccess);
	CHECK(hipMemMap((char *)va + 4 * MIB, 4 * MIB, 0, h, 0) == hipSuccess); /* one handle, twice */
	hipMemAccessDesc acc = { .location = prop.location, .flags = hipMemAccessFlagsProtReadWrite };
	CHECK(hipMemSetAccess(va, 8 * MIB, &acc, 1) == hipSuccess);
	shim_alloc_stats(&st);
	CHECK(st.app_vmm_bytes == 4 * MIB && st.app_vmm_handles == 1);
	CHECK(shim_alloc_nmaps() == 2 && shim_alloc_map_at(0)->ndesc == 1 && shim_alloc_map_at(1)->ndesc == 1);
	CHECK(hipMemUnmap(va, 8 * MIB) == hipSuccess);
	CHECK(hipMemRelease(h) == hipSuccess);
	CHECK(hipMemRelease(h) != hipSuccess); /* gone from the table: the runtime refuses the value */
	CHECK(hipMemAddressFree(va, 8 * MIB) == hipSuccess);
	shim_alloc_stats(&st);
	CHECK(st.app_vmm_bytes == 0 && st.app_vmm_handles == 0 && shim_alloc_nmaps() == 0);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipMemMap), 0) == 2);

	unlink(shim_ctl_path());
	rmdir(dir);
	return test_summary("test_shim_hip_hook");
}
