/* hip_util: for unit tests built from the shim's sources: loads the stand-in HIP runtime
 * (tests/fakehip) by path before the shim looks for libamdhip64.so.5 by soname, so the shim
 * finds the stand-in, never a real runtime installed on the machine. */
#ifndef GCR_TEST_HIP_UTIL_H
#define GCR_TEST_HIP_UTIL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static inline void *test_load_fakehip(void)
{
	const char *b = getenv("top_builddir");
	char path[4096];
	snprintf(path, sizeof(path), "%s/tests/fakehip/libamdhip64.so.5", b ? b : ".");
	void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
	if (h == NULL)
		fprintf(stderr, "cannot load the stand-in HIP runtime: %s\n", dlerror());
	return h;
}

#endif
