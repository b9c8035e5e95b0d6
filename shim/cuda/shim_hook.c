/* shim_hook: the generated CUDA wrappers for work submission, cuInit (where the shim starts
 * serving a CUDA process), and the rows of the CUDA hook table that maps driver symbols and real
 * function pointers to the shim's wrappers. */
#include "shim_hook.h"

#include "shim_gate.h"
#include "shim_main.h"
#include "shim_real.h"

#define SHIM_GATE_BODY(sym, v, args) \
	SHIM_HOOKTAB_GATED(SHIM_CUDA, SHIM_HOOK_##sym, sym, v, args, CUresult, CUDA_ERROR_NOT_FOUND)
#define SHIM_GATE_TWIN_NONE(sym, params, args)
#define SHIM_GATE_TWIN_PTDS(sym, params, args) \
	SHIM_EXPORT CUresult sym##_ptds params SHIM_GATE_BODY(sym, 1, args)
#define SHIM_GATE_TWIN_PTSZ(sym, params, args) \
	SHIM_EXPORT CUresult sym##_ptsz params SHIM_GATE_BODY(sym, 1, args)
#define SHIM_GATE(sym, var, params, args)                        \
	SHIM_EXPORT CUresult sym params SHIM_GATE_BODY(sym, 0, args) \
	SHIM_GATE_TWIN_##var(sym, params, args)
#define SHIM_CUSTOM(sym, var)
SHIM_GATE_LIST
#undef SHIM_GATE
#undef SHIM_CUSTOM

/* The shim serves (the control socket) once the application's cuInit succeeded. */
SHIM_EXPORT CUresult cuInit(unsigned int Flags)
{
	__typeof__(&cuInit) real = SHIM_REAL(cuInit, 0);
	if (real == NULL)
		return CUDA_ERROR_NO_DEVICE;
	shim_count(shim_thread_self(), SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuInit), 0);
	CUresult r = real(Flags);
	if (r == CUDA_SUCCESS) {
		shim_main_setup();
		shim_real_serve(SHIM_CUDA);
	}
	return r;
}

#define SHIM_NAME_NONE(sym) NULL
#define SHIM_NAME_PTDS(sym) #sym "_ptds"
#define SHIM_NAME_PTSZ(sym) #sym "_ptsz"
#define SHIM_WRAP_NONE(sym) NULL
#define SHIM_WRAP_PTDS(sym) &sym##_ptds
#define SHIM_WRAP_PTSZ(sym) &sym##_ptsz
#define SHIM_ENTRY(sym, var) \
	SHIM_HOOKTAB_ROW(SHIM_HOOK_##sym, #sym, SHIM_NAME_##var(sym), &sym, SHIM_WRAP_##var(sym))
#define SHIM_GATE(sym, var, params, args) SHIM_ENTRY(sym, var)
#define SHIM_CUSTOM(sym, var) SHIM_ENTRY(sym, var)
struct shim_hook shim_hooks[SHIM_HOOK_COUNT] = { SHIM_GATE_LIST SHIM_CUSTOM_LIST };
#undef SHIM_GATE
#undef SHIM_CUSTOM
