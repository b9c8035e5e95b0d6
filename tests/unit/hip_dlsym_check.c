/* hip_dlsym_check: run by test_shim_hip_dlsym.sh with libgcr.so preloaded: every HIP name the
 * shim interposes, looked up with dlsym or dlvsym on the runtime's own handle, is answered with
 * the shim's wrapper; other names are left to the runtime; a wrapper found so works. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim_hip_hooks.def"
#include "util.h"

/* Only the names: the parameter lists are never expanded, so no HIP header is needed. */
#define SHIM_HIP_GATE(sym, var, params, args) { #sym, #var },
#define SHIM_HIP_CUSTOM(sym, var) { #sym, #var },
static const struct {
	const char *name, *variant;
} hooks[] = { SHIM_HIP_GATE_LIST SHIM_HIP_CUSTOM_LIST };

static int in_shim(const void *p)
{
	Dl_info di;
	return p != NULL && dladdr(p, &di) != 0 && di.dli_fname != NULL && strstr(di.dli_fname, "libgcr.so") != NULL;
}

int main(void)
{
	void *h = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
	CHECK(h != NULL);
	if (h == NULL)
		return test_summary("hip_dlsym_check");
	size_t n = sizeof(hooks) / sizeof(hooks[0]), wrapped = 0, expected = 0;
	for (size_t i = 0; i < n; i++) {
		char twin[128];
		const char *names[2] = { hooks[i].name, NULL };
		if (strcmp(hooks[i].variant, "SPT") == 0) {
			snprintf(twin, sizeof(twin), "%s_spt", hooks[i].name);
			names[1] = twin;
		}
		if (strcmp(hooks[i].variant, "CXX") == 0)
			names[0] = NULL; /* HIP 5.x has no C symbol for these; mangled ones below */
		for (int v = 0; v < 2; v++) {
			if (names[v] == NULL)
				continue;
			expected++;
			void *p = dlsym(h, names[v]);
			if (in_shim(p))
				wrapped++;
			else
				fprintf(stderr, "not wrapped: %s\n", names[v]);
		}
	}
	CHECK(expected > 80 && wrapped == expected);
	CHECK(in_shim(dlsym(h, "_Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j")));
	CHECK(in_shim(dlvsym(h, "hipMalloc", "hip_4.2")) || dlvsym(h, "hipMalloc", "hip_4.2") == NULL);
	/* Not interposed: the runtime's own function. */
	void *count = dlsym(h, "hipGetDeviceCount");
	CHECK(count != NULL && !in_shim(count));
	/* A wrapper found by dlsym passes through to the runtime. */
	int (*sync)(void) = (int (*)(void))dlsym(h, "hipDeviceSynchronize");
	CHECK(sync != NULL && sync() == 0);
	return test_summary("hip_dlsym_check");
}
