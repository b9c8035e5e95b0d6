/* shim_main: libgcr.so's entry: the load-time constructor (settings, the real
 * dlsym; nothing that touches a GPU runtime) and the one place that starts the control
 * socket: when cuInit succeeds, or on HIP's first call (through shim_real_serve). */
#include <cuda.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_ctl.h"
#include "shim_gate.h"
#include "shim_hooktab.h"
#include "shim_real.h"

/* Runs in every process the preload reaches (shells, compilers, ...), so it only
 * reads settings and finds libc's dlsym. */
__attribute__((constructor)) static void shim_main_init(void)
{
	gcr_log_init(GCR_LOG_ERROR);
	shim_config_load();
	shim_real_init();
	shim_real_on_serve(shim_ctl_start);
}

SHIM_EXPORT CUresult cuInit(unsigned int Flags)
{
	__typeof__(&cuInit) real = SHIM_REAL(cuInit, 0);
	if (real == NULL)
		return CUDA_ERROR_NO_DEVICE;
	shim_count(shim_thread_self(), SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuInit), 0);
	CUresult r = real(Flags);
	if (r == CUDA_SUCCESS)
		shim_real_serve(SHIM_CUDA);
	return r;
}
