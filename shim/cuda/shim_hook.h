/* shim_hook: the CUDA driver's hook table (rows from shim_hooks.def, layout and loading in
 * shim_hooktab.h and shim_real): the declarations its wrappers need and typed access to the
 * real driver functions. */
#ifndef SHIM_HOOK_H
#define SHIM_HOOK_H

#include <cuda.h>

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

/* The real driver function for a hook, typed as cuda.h declares it; NULL when the
 * driver could not be loaded or lacks the symbol. Variant 0 is the legacy-stream symbol,
 * 1 its per-thread-default-stream twin. */
#define SHIM_REAL(sym, variant) \
	((__typeof__(&sym))shim_real_hook(SHIM_CUDA, SHIM_HOOK_##sym, (variant)))

/* compat: removed after merge */
static inline void *shim_hook_real(enum shim_hook_id id, int variant)
{
	return shim_real_hook(SHIM_CUDA, id, variant);
}

#endif
