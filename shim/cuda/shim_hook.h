/* shim_hook: the CUDA driver's hook table (rows from shim_hooks.def, layout and loading in
 * shim_hooktab.h and shim_real): the declarations its wrappers need. SHIM_REAL, typed access
 * to the real driver functions, is in shim_cuda_real.h. */
#ifndef SHIM_HOOK_H
#define SHIM_HOOK_H

#include <cuda.h>

#include "shim_cuda_real.h"
#include "shim_hooktab.h"
#include "shim_real.h"

/* cuda.h maps the old name to cuGetProcAddress_v2; the driver still exports the
 * 4-argument original, which the runtime asks for by name. */
#undef cuGetProcAddress
typedef CUresult (*shim_procaddr_v1_fn)(const char *symbol, void **pfn, int cudaVersion,
					cuuint64_t flags);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

/* Per-thread twins are not declared by cuda.h unless a program opts into them;
 * declare them with the legacy prototype so their wrappers are type-checked too. */
#define SHIM_TWIN_NONE(sym)
#define SHIM_TWIN_PTDS(sym) extern __typeof__(sym) sym##_ptds;
#define SHIM_TWIN_PTSZ(sym) extern __typeof__(sym) sym##_ptsz;
#define SHIM_GATE(sym, var, params, args) SHIM_TWIN_##var(sym)
#define SHIM_CUSTOM(sym, var) SHIM_TWIN_##var(sym)
SHIM_GATE_LIST
SHIM_CUSTOM_LIST
#undef SHIM_GATE
#undef SHIM_CUSTOM

#endif
