/* shim_hip_hook: the HIP runtime's hook table (rows from shim_hip_hooks.def, layout and
 * loading in shim_hooktab.h and shim_real) and SHIM_HIP_REAL, typed access to the real
 * libamdhip64 functions. The rows and wrappers are in shim_hip_hook.c. This header needs no
 * HIP header: the .def list carries every prototype (SHIM_HIP_REAL's callers include
 * hip_runtime_api.h). */
#ifndef SHIM_HIP_HOOK_H
#define SHIM_HIP_HOOK_H

#include "shim_hooktab.h"
#include "shim_real.h"

/* The real function behind a HIP hook, typed as hip_runtime_api.h declares it; NULL when the
 * runtime cannot be loaded or lacks the symbol. Variant 0 is the plain symbol, 1 its twin
 * (struct shim_hook). */
#define SHIM_HIP_REAL(sym, variant) \
	((__typeof__(&sym))shim_real_hook(SHIM_HIP, SHIM_HIP_HOOK_##sym, (variant)))

/* The device a HIP application's hipMemAllocationProp names (in the running runtime's layout),
 * or -1 when it is not device memory (shim_hip.c). */
int shim_hip_prop_device(const void *prop);

#endif
