/* shim_hip_hook: the HIP runtime's hook table (rows from shim_hip_hooks.def, layout and
 * loading in shim_hooktab.h and shim_real): typed access to the real libamdhip64 functions. */
#ifndef SHIM_HIP_HOOK_H
#define SHIM_HIP_HOOK_H

#include "shim_hooktab.h"
#include "shim_real.h"

/* The real runtime function for a hook, typed as hip_runtime_api.h declares it (only in files
 * that include it); NULL when the runtime cannot be loaded or lacks the symbol. Variant 0 is
 * the plain C symbol; 1 the _spt twin or the C++ mangled name. The first use loads the
 * runtime and starts serving (shim_real_hook). */
#define SHIM_HIP_REAL(sym, variant) \
	((__typeof__(&sym))shim_real_hook(SHIM_HIP, SHIM_HIP_HOOK_##sym, (variant)))

/* compat: removed after merge */
static inline int shim_hip_load(const void *hint)
{
	return shim_real_load(SHIM_HIP, hint);
}

/* compat: removed after merge */
static inline void *shim_hip_handle(void)
{
	return shim_real_handle(SHIM_HIP);
}

#endif
