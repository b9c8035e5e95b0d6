/* shim_dlsym: interposes dlsym and dlvsym, because the CUDA runtime and PyTorch
 * find the driver by looking its entry points up on libcuda's own handle (and
 * frameworks built on HIP do the same with libamdhip64's). */
#include <dlfcn.h>
#include <stdatomic.h>

#include "shim_hip_hook.h"
#include "shim_hook.h"
#include "shim_real.h"

/* HIP names: "hip..." and the C++ mangled "_Z<len>hip..." of hip_ext.h's launches. */
__attribute__((no_sanitize("address", "undefined"))) static int is_hip_name(const char *n)
{
	if (n[0] == '_' && n[1] == 'Z')
		for (n += 2; *n >= '0' && *n <= '9'; n++)
			;
	return n[0] == 'h' && n[1] == 'i' && n[2] == 'p';
}

/* HIP lookups: the same swap, against the HIP hook table. */
__attribute__((no_sanitize("address", "undefined"))) static void *filter_hip(void *found)
{
	atomic_fetch_add_explicit(&shim_hip_lookups.dlsym_hip, 1, memory_order_relaxed);
	void *w = shim_hip_hook_wrap_real(found);
	if (w == NULL)
		return found;
	atomic_fetch_add_explicit(&shim_hip_lookups.dlsym_wrapped, 1, memory_order_relaxed);
	return w;
}

/* Any driver or HIP runtime entry point the shim interposes is answered with its
 * wrapper, whatever handle it was looked up on; everything else is left alone. */
__attribute__((no_sanitize("address", "undefined"))) static void *filter(void *found, const char *name)
{
	if (found != NULL && name != NULL && is_hip_name(name))
		return filter_hip(found);
	if (found == NULL || name == NULL || name[0] != 'c' || name[1] != 'u')
		return found;
	atomic_fetch_add_explicit(&shim_lookups.dlsym_cu, 1, memory_order_relaxed);
	void *w = shim_hook_wrap_real(found);
	if (w == NULL)
		return found;
	atomic_fetch_add_explicit(&shim_lookups.dlsym_wrapped, 1, memory_order_relaxed);
	return w;
}

/* RTLD_NEXT is resolved relative to the shim, not the caller: for a program that
 * is preloaded-first this finds the same next object. */
/* Not instrumented: sanitizer runtimes call dlsym before they are initialised. */
__attribute__((no_sanitize("address", "undefined"))) SHIM_EXPORT void *dlsym(void *handle, const char *name)
{
	return filter(shim_real_dlsym(handle, name), name);
}

__attribute__((no_sanitize("address", "undefined"))) SHIM_EXPORT void *dlvsym(void *handle, const char *name,
										const char *version)
{
	return filter(shim_real_dlvsym(handle, name, version), name);
}
