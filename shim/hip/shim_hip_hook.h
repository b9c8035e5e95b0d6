/* shim_hip_hook: the table of interposed HIP runtime entry points (from shim_hip_hooks.def):
 * their symbol names, the shim's wrappers and the real libamdhip64 functions. */
#ifndef SHIM_HIP_HOOK_H
#define SHIM_HIP_HOOK_H

#include <stdatomic.h>
#include <stdint.h>

#include "shim_hip_hooks.def"

/* The ids need no HIP header (only the names are used), so the gate can size its counters
 * without every shim module including hip_runtime_api.h. */
enum shim_hip_hook_id {
#define SHIM_HIP_GATE(sym, var, params, args) SHIM_HIP_HOOK_##sym,
#define SHIM_HIP_CUSTOM(sym, var) SHIM_HIP_HOOK_##sym,
	SHIM_HIP_GATE_LIST SHIM_HIP_CUSTOM_LIST
#undef SHIM_HIP_GATE
#undef SHIM_HIP_CUSTOM
	SHIM_HIP_HOOK_COUNT
};

/* Variant 0 is the plain C symbol; 1 its other exported name: the _spt twin (per-thread
 * default stream) or the C++ mangled name. name[1] NULL when there is none. */
struct shim_hip_hook {
	const char *name[2];
	void *wrapper[2];
	void *real[2]; /* filled by shim_hip_load(); NULL if the runtime lacks it */
};

extern struct shim_hip_hook shim_hip_hooks[SHIM_HIP_HOOK_COUNT];

/* The real runtime function for a hook, typed as hip_runtime_api.h declares it (only in files
 * that include it); NULL when the runtime cannot be loaded or lacks the symbol. */
#define SHIM_HIP_REAL(sym, variant) \
	((__typeof__(&sym))shim_hip_hook_real(SHIM_HIP_HOOK_##sym, (variant)))

/* Loads the runtime on first use and starts the control socket (a HIP process is one the
 * shim must be reachable in, as cuInit does for CUDA). */
void *shim_hip_hook_real(enum shim_hip_hook_id id, int variant);

/* Given a real libamdhip64 function pointer, the shim's wrapper for it, or NULL. Loads the
 * runtime from the object holding real_fn if none is loaded and that object is libamdhip64. */
void *shim_hip_hook_wrap_real(void *real_fn);
/* The wrapper for an exported HIP symbol name (NULL if not interposed). */
void *shim_hip_hook_wrap_name(const char *name);
const char *shim_hip_hook_name(enum shim_hip_hook_id id, int variant);

/* Opens libamdhip64 once (the object holding hint if it is one, else the first soname of
 * SHIM_HIP_SONAMES already loaded, else the first that loads) and fills the table.
 * 0 or -errno. Nothing HIP is touched on a process that never calls it. */
int shim_hip_load(const void *hint);
/* The runtime's handle, or NULL before shim_hip_load succeeded. */
void *shim_hip_handle(void);

/* Newest first: ROCm 7, 6, then Debian bookworm's 5.2. */
#define SHIM_HIP_SONAMES { "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5" }

/* Lookups of HIP names through dlsym, and how many answers were wrappers. */
struct shim_hip_lookups {
	_Atomic uint64_t dlsym_hip, dlsym_wrapped;
};
extern struct shim_hip_lookups shim_hip_lookups;

#endif
