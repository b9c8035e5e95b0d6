/* shim_real: where the shim finds the real entry points: the real dlsym/dlvsym (found in
 * libc's own symbol table, never through the dlsym the shim interposes), and the GPU runtimes
 * (libcuda, libamdhip64): both handles, the loading that fills every vendor's hook table (and
 * hands the runtime to its backend, shim_gpu_ops.bind), and whether the shim serves. No vendor
 * header: the typed access to a runtime's functions is its backend's (shim_cuda_real.h,
 * shim_hip_hook.h). */
#ifndef SHIM_REAL_H
#define SHIM_REAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "shim_hooktab.h"

/* For the shim's own threads: relaxed stream-capture mode in every loaded runtime that has
 * one (shim_gpu_ops.relax_capture), so their driver calls (pinning, synchronising) never
 * invalidate an application's graph capture that runs in global mode (PyTorch's default) on
 * another thread. */
void shim_real_relax_capture(void);

/* Finds libc's dlsym and dlvsym; called from the constructor. 0 or -errno. */
int shim_real_init(void);
void *shim_real_dlsym(void *handle, const char *name);
void *shim_real_dlvsym(void *handle, const char *name, const char *version);
/* libc's dlsym and dlvsym themselves (NULL if not found), for shim_dlsym.c's RTLD_NEXT
 * trampolines, which must jump into them rather than call them. */
void *shim_real_dlsym_ptr(void);
void *shim_real_dlvsym_ptr(void);

/* Newest first: ROCm 7, 6, then Debian bookworm's 5.2. */
#define SHIM_HIP_SONAMES { "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5" }

/* Opens a vendor's runtime once, fills its hook table and binds its backend (shim_gpu_ops.bind).
 * CUDA: the object holding hint (the very library the application opened), else
 * "libcuda.so.1". HIP: the object holding hint if it is libamdhip64, else the first of
 * SHIM_HIP_SONAMES already loaded, else the first that loads. Nothing of a vendor is
 * touched in a process that never calls it. 0 or -errno. */
int shim_real_load(enum shim_vendor vendor, const void *hint);
/* The runtime's handle, or NULL before shim_real_load succeeded. */
void *shim_real_handle(enum shim_vendor vendor);

/* Set once a vendor's hooks may be answered without the slow path below. Read-only after
 * that: the hot path reads it, never writes it. */
extern atomic_int shim_real_ready[SHIM_VENDORS];
void *shim_real_hook_slow(enum shim_vendor vendor, unsigned id, int variant);

/* The real function behind a vendor's hook (id from shim_hooktab.h), loading the runtime on
 * first use; NULL when the runtime cannot be loaded or lacks the symbol. A HIP process is
 * one the shim must be reachable in, so HIP's first use also calls shim_real_serve (as the
 * cuInit wrapper does for CUDA). Inline: every wrapped launch and copy takes this path. */
static inline void *shim_real_hook(enum shim_vendor vendor, unsigned id, int variant)
{
	if (__builtin_expect(!atomic_load_explicit(&shim_real_ready[vendor], memory_order_acquire), 0))
		return shim_real_hook_slow(vendor, id, variant);
	return (vendor == SHIM_HIP ? shim_hip_hooks : shim_hooks)[id].real[variant];
}

/* Given a real runtime function pointer, the shim's wrapper for it, or NULL (not a hook).
 * Loads the runtime first if needed: CUDA from the object holding real_fn, HIP only when
 * that object is libamdhip64. */
void *shim_real_wrap(enum shim_vendor vendor, void *real_fn);
/* The wrapper for an exported symbol name of the vendor (NULL if not interposed). */
void *shim_real_wrap_name(enum shim_vendor vendor, const char *name);
/* The vendor's table: its rows, and how many. */
struct shim_hook *shim_real_hooks(enum shim_vendor vendor, unsigned *count);

/* The process uses a vendor's runtime (CUDA: cuInit succeeded; HIP: a first call): the shim
 * starts serving it (the control socket) through the function set by shim_real_on_serve,
 * unless the runtime lacks what the shim needs (said once, when it was loaded). */
void shim_real_serve(enum shim_vendor vendor);
/* Set once, by the library's constructor (shim_main.c): the one place that starts serving. */
void shim_real_on_serve(void (*serve)(void));

/* How programs found the runtimes: lookups by dlsym (per vendor) and through
 * cuGetProcAddress, and how many answers were the shim's wrappers. */
struct shim_lookups {
	_Atomic uint64_t dlsym[SHIM_VENDORS], dlsym_wrapped[SHIM_VENDORS];
	_Atomic uint64_t procaddr, procaddr_wrapped, procaddr_by_name, procaddr_passthrough;
};
extern struct shim_lookups shim_lookups;

#endif
