/* test_shim_real: the runtimes' loading (shim_real). Nothing of a vendor is touched before
 * it is used; a HIP lookup loads HIP only from a HIP runtime; a CUDA driver that lacks a
 * function the shim's own work needs is loaded for the application (its wrappers answer),
 * every shim_cu member is still callable (a stub's error, never NULL), the shim converts no
 * allocation, says so in one line, and never starts the control socket for it. */
#include <cuda.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hip_util.h"
#include "shim_config.h"
#include "shim_ctl.h"
#include "shim_cuda_real.h"
#include "shim_real.h"
#include "util.h"

/* Runs load with stderr going to a file; what it printed, in buf. */
static int load_capturing(enum shim_vendor vendor, const void *hint, char *buf, size_t len)
{
	char path[] = "/tmp/gcr-shim-real-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	fflush(stderr);
	dup2(fd, 2);
	int rc = shim_real_load(vendor, hint);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	ssize_t n = pread(fd, buf, len - 1, 0);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	unlink(path);
	return rc;
}

static int count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
		n++;
	return n;
}

static char dir[] = "/tmp/gcr-shim-real-dir-XXXXXX";

/* Registered before the shim's own socket removal, so it runs after it: the directory is empty. */
static void remove_dir(void)
{
	rmdir(dir);
}

int main(void)
{
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dir);
	snprintf(shim_cfg.socket_dir, sizeof(shim_cfg.socket_dir), "%s", dir);
	CHECK(shim_real_handle(SHIM_CUDA) == NULL && shim_real_handle(SHIM_HIP) == NULL);
	void *hip = test_load_fakehip();
	CHECK(hip != NULL);
	void *hip_malloc = hip ? dlsym(hip, "hipMalloc") : NULL;
	CHECK(hip_malloc != NULL);

	/* Not a HIP runtime's function: nothing is loaded for it. */
	CHECK(shim_real_wrap(SHIM_HIP, (void *)&main) == NULL);
	CHECK(shim_real_handle(SHIM_HIP) == NULL);

	/* The stand-in HIP runtime, taken for a CUDA driver: it has none of the driver's functions. */
	CHECK(shim_cfg.vmm == 1);
	char out[4096];
	CHECK(load_capturing(SHIM_CUDA, hip_malloc, out, sizeof(out)) == 0);
	CHECK(shim_real_handle(SHIM_CUDA) == hip);
	CHECK(count(out, "gcr: ") == 1 && count(out, "\n") == 1);
	CHECK(strstr(out, "lacks cuMemAddressReserve") != NULL && strstr(out, "cannot be suspended") != NULL);
#define X(f, params) CHECK(shim_cu.f != NULL);
	SHIM_CU_INTERNAL_LIST SHIM_CU_OPTIONAL_LIST
#undef X
	CUcontext ctx = NULL;
	CHECK(shim_cu.cuCtxGetCurrent(&ctx) == CUDA_ERROR_NOT_FOUND && ctx == NULL);
	CHECK(shim_cu.cuCtxSynchronize() == CUDA_ERROR_NOT_FOUND);
	shim_real_relax_capture(); /* a stub: no call through NULL */
	CHECK(shim_cfg.vmm == 0);
	/* Its hooks: none resolved, so the wrappers answer an error, never call NULL. */
	CHECK(SHIM_REAL(cuLaunchKernel, 0) == NULL);
	CHECK(cuMemsetD8_v2(0, 0, 1) == CUDA_ERROR_NOT_FOUND);
	CHECK(cuInit(0) == CUDA_ERROR_NOT_FOUND || cuInit(0) == CUDA_ERROR_NO_DEVICE);
	shim_real_serve(SHIM_CUDA);
	CHECK(shim_ctl_path()[0] == '\0'); /* not served */
	/* Loaded once: a second load is a no-op and says nothing. */
	CHECK(load_capturing(SHIM_CUDA, NULL, out, sizeof(out)) == 0 && out[0] == '\0');

	/* HIP: the lookup of a runtime function loads that runtime and answers the wrapper; the
	 * first call through a hook serves (the control socket), as cuInit does for CUDA. */
	void *w = shim_real_wrap(SHIM_HIP, hip_malloc);
	CHECK(shim_real_handle(SHIM_HIP) == hip);
	CHECK(w != NULL && w == shim_hip_hooks[SHIM_HIP_HOOK_hipMalloc].wrapper[0] && w != hip_malloc);
	CHECK(shim_ctl_path()[0] == '\0');
	CHECK(shim_real_hook(SHIM_HIP, SHIM_HIP_HOOK_hipMalloc, 0) == hip_malloc);
	CHECK(shim_ctl_path()[0] != '\0' && access(shim_ctl_path(), F_OK) == 0);
	CHECK(atomic_load(&shim_real_ready[SHIM_HIP]) == 1);
	return test_summary("test_shim_real");
}
