/* shim_procaddr: cuGetProcAddress, the resolver the CUDA runtime uses for every
 * entry point; its answers are swapped for wrappers of the same version and flags. */
#include <stdatomic.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_gate.h"
#include "shim_hook.h"
#include "shim_real.h"

/* The ABI the wrappers were written for (cuda.h 13.0). A lookup for an older
 * version whose answer is not a known real entry point passes through unwrapped:
 * it may be an older ABI of the same name. */
#define SHIM_ABI_VERSION 13000

/* Base name of a hooked symbol: "cuMemcpyHtoD_v2" -> "cuMemcpyHtoD". */
static int base_matches(const char *sym, const char *asked)
{
	size_t n = strlen(asked);
	if (strncmp(sym, asked, n) != 0)
		return 0;
	return sym[n] == '\0' || (sym[n] == '_' && sym[n + 1] == 'v' && sym[n + 2] >= '2' &&
				  sym[n + 2] <= '9' && sym[n + 3] == '\0');
}

static void *by_name(const char *symbol, int version, cuuint64_t flags)
{
	if (version < SHIM_ABI_VERSION)
		return NULL;
	int v = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? 1 : 0;
	int best = -1;
	/* The newest ABI of the name: cuGetProcAddress_v2 over cuGetProcAddress. */
	for (int i = 0; i < SHIM_HOOK_COUNT; i++)
		if (base_matches(shim_hooks[i].name[0], symbol) &&
		    (best < 0 || strlen(shim_hooks[i].name[0]) > strlen(shim_hooks[best].name[0])))
			best = i;
	if (best < 0)
		return NULL;
	return shim_hooks[best].wrapper[v] ? shim_hooks[best].wrapper[v] : shim_hooks[best].wrapper[0];
}

static void swap_answer(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
	atomic_fetch_add_explicit(&shim_lookups.procaddr, 1, memory_order_relaxed);
	void *w = shim_real_wrap(SHIM_CUDA, *pfn);
	if (w != NULL) {
		atomic_fetch_add_explicit(&shim_lookups.procaddr_wrapped, 1, memory_order_relaxed);
		*pfn = w;
		return;
	}
	w = by_name(symbol, version, flags);
	if (w != NULL) {
		atomic_fetch_add_explicit(&shim_lookups.procaddr_by_name, 1, memory_order_relaxed);
		*pfn = w;
		return;
	}
	atomic_fetch_add_explicit(&shim_lookups.procaddr_passthrough, 1, memory_order_relaxed);
}

static CUresult procaddr_v2(int variant, const char *symbol, void **pfn, int cudaVersion,
			    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	__typeof__(&cuGetProcAddress_v2) real = SHIM_REAL(cuGetProcAddress_v2, variant);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	shim_count(shim_thread_self(), SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuGetProcAddress_v2), variant);
	CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
	if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
		swap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}

SHIM_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
					 cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	return procaddr_v2(0, symbol, pfn, cudaVersion, flags, symbolStatus);
}

SHIM_EXPORT CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					      cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	return procaddr_v2(1, symbol, pfn, cudaVersion, flags, symbolStatus);
}

SHIM_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	shim_procaddr_v1_fn real = (shim_procaddr_v1_fn)shim_real_hook(SHIM_CUDA, SHIM_HOOK_cuGetProcAddress, 0);
	if (real == NULL)
		return CUDA_ERROR_NOT_FOUND;
	shim_count(shim_thread_self(), SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuGetProcAddress), 0);
	CUresult r = real(symbol, pfn, cudaVersion, flags);
	if (r == CUDA_SUCCESS && pfn != NULL && *pfn != NULL && symbol != NULL)
		swap_answer(symbol, pfn, cudaVersion, flags);
	return r;
}
