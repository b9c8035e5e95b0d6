/* shim_hip_hook: the HIP runtime's hook table (rows from shim_hip_hooks.def, layout and
 * loading in shim_hooktab.h and shim_real; SHIM_HIP_REAL, typed access to the real
 * libamdhip64 functions, is in shim_real.h). The rows and wrappers are in shim_hip_hook.c.
 * HIP's headers are never needed: the .def list carries every prototype. */
#ifndef SHIM_HIP_HOOK_H
#define SHIM_HIP_HOOK_H

#include "shim_hooktab.h"
#include "shim_real.h"

#endif
