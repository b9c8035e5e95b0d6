/* shim_hip_hook: the HIP runtime's hook table (rows from shim_hip_hooks.def, layout and
 * loading in shim_hooktab.h and shim_real; SHIM_HIP_REAL, typed access to the real
 * libamdhip64 functions, is in shim_real.h). The rows and wrappers are in shim_hip_hook.c;
 * this header is kept for the names below. */
#ifndef SHIM_HIP_HOOK_H
#define SHIM_HIP_HOOK_H

#include "shim_hooktab.h"
#include "shim_real.h"

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
