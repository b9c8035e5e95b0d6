/* shim_hook: the generated wrappers for work submission and the hook table that
 * maps driver symbols and real function pointers to the shim's wrappers. */
#include "shim_hook.h"

#include <string.h>

#include "shim_gate.h"
#include "shim_real.h"

/* A gated wrapper: count, pass the gate, call the real entry point of the same
 * variant. A missing real function is an error result, never a NULL call. */
#define SHIM_GATE_BODY(sym, v, args)                                           \
	{                                                                      \
		__typeof__(&sym) real_fn = SHIM_REAL(sym, v);                  \
		if (real_fn == NULL)                                           \
			return CUDA_ERROR_NOT_FOUND;                           \
		struct shim_thread *t = shim_gate_enter(SHIM_HOOK_##sym, v);   \
		CUresult r = real_fn args;                                     \
		shim_gate_exit(t);                                             \
		return r;                                                      \
	}
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

#define SHIM_NAME_NONE(sym) NULL
#define SHIM_NAME_PTDS(sym) #sym "_ptds"
#define SHIM_NAME_PTSZ(sym) #sym "_ptsz"
#define SHIM_WRAP_NONE(sym) NULL
#define SHIM_WRAP_PTDS(sym) (void *)&sym##_ptds
#define SHIM_WRAP_PTSZ(sym) (void *)&sym##_ptsz
#define SHIM_ENTRY(sym, var) \
	[SHIM_HOOK_##sym] = { { #sym, SHIM_NAME_##var(sym) }, { (void *)&sym, SHIM_WRAP_##var(sym) }, { NULL, NULL } },
#define SHIM_GATE(sym, var, params, args) SHIM_ENTRY(sym, var)
#define SHIM_CUSTOM(sym, var) SHIM_ENTRY(sym, var)
struct shim_hook shim_hooks[SHIM_HOOK_COUNT] = { SHIM_GATE_LIST SHIM_CUSTOM_LIST };
#undef SHIM_GATE
#undef SHIM_CUSTOM

struct shim_lookups shim_lookups;

void *shim_hook_real(enum shim_hook_id id, int variant)
{
	if (shim_real_cuda_handle() == NULL && shim_real_load_cuda(NULL) < 0)
		return NULL;
	return shim_hooks[id].real[variant];
}

void *shim_hook_wrap_real(void *real_fn)
{
	if (real_fn == NULL)
		return NULL;
	if (shim_real_cuda_handle() == NULL && shim_real_load_cuda(real_fn) < 0)
		return NULL;
	for (int i = 0; i < SHIM_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hooks[i].real[v] == real_fn)
				return shim_hooks[i].wrapper[v];
	return NULL;
}

void *shim_hook_wrap_name(const char *name)
{
	for (int i = 0; i < SHIM_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hooks[i].name[v] != NULL && strcmp(shim_hooks[i].name[v], name) == 0)
				return shim_hooks[i].wrapper[v];
	return NULL;
}

const char *shim_hook_name(enum shim_hook_id id, int variant)
{
	return shim_hooks[id].name[variant];
}
