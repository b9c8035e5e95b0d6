/* shim_hooktab: the one hook-table layout for every GPU runtime the shim interposes (CUDA's
 * driver, HIP's runtime). Each vendor lists its entry points in its own .def file; this header
 * turns the lists into ids and gate-counter rows, gives every table the same row layout, and
 * holds the generators the vendor modules (shim_hook.c, shim_hip_hook.c) expand into their
 * wrappers and rows. It needs no vendor header: only the names of the lists are used here. */
#ifndef SHIM_HOOKTAB_H
#define SHIM_HOOKTAB_H

#include <stddef.h>

#include "shim_hip_hooks.def"
#include "shim_hooks.def"

/* The runtimes, each with its own hook table, handle and ids. */
enum shim_vendor { SHIM_CUDA, SHIM_HIP, SHIM_VENDORS };

enum shim_hook_id {
#define SHIM_GATE(sym, var, params, args) SHIM_HOOK_##sym,
#define SHIM_CUSTOM(sym, var) SHIM_HOOK_##sym,
	SHIM_GATE_LIST SHIM_CUSTOM_LIST
#undef SHIM_GATE
#undef SHIM_CUSTOM
	SHIM_HOOK_COUNT
};

enum shim_hip_hook_id {
#define SHIM_HIP_GATE(sym, var, params, args) SHIM_HIP_HOOK_##sym,
#define SHIM_HIP_CUSTOM(sym, var) SHIM_HIP_HOOK_##sym,
	SHIM_HIP_GATE_LIST SHIM_HIP_CUSTOM_LIST
#undef SHIM_HIP_GATE
#undef SHIM_HIP_CUSTOM
	SHIM_HIP_HOOK_COUNT
};

/* The gate counts calls per row: the CUDA hooks, then the HIP hooks (one gate serves both).
 * With a constant vendor the row is a constant: the hot path computes nothing. */
#define SHIM_HOOK_ROWS ((unsigned)SHIM_HOOK_COUNT + (unsigned)SHIM_HIP_HOOK_COUNT)
#define SHIM_HOOK_ROW(vendor, id) \
	((vendor) == SHIM_HIP ? (unsigned)SHIM_HOOK_COUNT + (unsigned)(id) : (unsigned)(id))

/* One interposed entry point. Variant 0 is the plain symbol; 1 its other exported name
 * (CUDA: the per-thread-default-stream twin _ptds/_ptsz; HIP: the _spt twin or the C++
 * mangled name), name[1] NULL when there is none. */
struct shim_hook {
	const char *name[2];
	void *wrapper[2];
	void *real[2]; /* filled when the runtime is loaded (shim_real); NULL if it lacks one */
};

/* The tables, indexed by the vendor's id; rows defined by the vendor modules. */
extern struct shim_hook shim_hooks[SHIM_HOOK_COUNT];         /* shim_hook.c */
extern struct shim_hook shim_hip_hooks[SHIM_HIP_HOOK_COUNT]; /* shim_hip_hook.c */

#define SHIM_EXPORT __attribute__((visibility("default")))

/* A table row, for the vendor modules' initialisers. */
#define SHIM_HOOKTAB_ROW(id, name0, name1, wrap0, wrap1) \
	[id] = { { (name0), (name1) }, { (void *)(wrap0), (void *)(wrap1) }, { NULL, NULL } },

/* A gated wrapper's body (work submission): pass the gate, call the real entry point of the
 * same variant. A missing real function is the vendor's error result, never a NULL call.
 * Expanded where shim_real.h, shim_gate.h and the vendor's header are included. */
#define SHIM_HOOKTAB_GATED(vendor, id, sym, v, args, result_t, missing)                              \
	{                                                                                             \
		__typeof__(&sym) real_fn = (__typeof__(&sym))shim_real_hook((vendor), (unsigned)(id), (v)); \
		if (real_fn == NULL)                                                                  \
			return (missing);                                                             \
		struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW((vendor), (id)), (v));          \
		result_t r = real_fn args;                                                            \
		shim_gate_exit(t);                                                                    \
		return r;                                                                             \
	}

#endif
