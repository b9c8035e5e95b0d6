/* shim_hook: the table of interposed entry points (from shim_hooks.def): their
 * symbol names, the shim's wrappers and the real driver's functions. */
#ifndef SHIM_HOOK_H
#define SHIM_HOOK_H

#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>

#include "shim_hooks.def"

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

enum shim_hook_id {
#define SHIM_GATE(sym, var, params, args) SHIM_HOOK_##sym,
#define SHIM_CUSTOM(sym, var) SHIM_HOOK_##sym,
	SHIM_GATE_LIST SHIM_CUSTOM_LIST
#undef SHIM_GATE
#undef SHIM_CUSTOM
	SHIM_HOOK_COUNT
};

/* Variant 0 is the legacy-stream symbol, 1 its per-thread-default-stream twin. */
struct shim_hook {
	const char *name[2]; /* name[1] NULL when the driver has no twin */
	void *wrapper[2];
	void *real[2]; /* filled by shim_real_load_cuda(); NULL if the driver lacks it */
};

extern struct shim_hook shim_hooks[SHIM_HOOK_COUNT];

#define SHIM_EXPORT __attribute__((visibility("default")))

/* The real driver function for a hook, typed as cuda.h declares it; NULL when the
 * driver could not be loaded or lacks the symbol. */
#define SHIM_REAL(sym, variant) \
	((__typeof__(&sym))shim_hook_real(SHIM_HOOK_##sym, (variant)))

void *shim_hook_real(enum shim_hook_id id, int variant);

/* Given a real driver function pointer, the shim's wrapper for it (NULL if the
 * shim does not interpose it). Loads the driver table first if needed. */
void *shim_hook_wrap_real(void *real_fn);
/* The wrapper for an exported driver symbol name (NULL if not interposed). */
void *shim_hook_wrap_name(const char *name);

/* Counters of what the shim saw, per hook and variant (see shim_gate.h). */
const char *shim_hook_name(enum shim_hook_id id, int variant);

/* How programs found the driver: lookups by dlsym and through cuGetProcAddress,
 * and how many answers were the shim's wrappers. */
struct shim_lookups {
	_Atomic uint64_t dlsym_cu, dlsym_wrapped;
	_Atomic uint64_t procaddr, procaddr_wrapped, procaddr_by_name, procaddr_passthrough;
};
extern struct shim_lookups shim_lookups;

#endif
