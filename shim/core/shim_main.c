/* shim_main: libgcr.so's entry: the load-time constructor (settings, the real
 * dlsym; nothing that touches CUDA) and cuInit, which starts the control socket. */
#include <cuda.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_ctl.h"
#include "shim_gate.h"
#include "shim_hook.h"
#include "shim_real.h"

/* Runs in every process the preload reaches (shells, compilers, ...), so it only
 * reads settings and finds libc's dlsym. */
__attribute__((constructor)) static void shim_main_init(void)
{
	gcr_log_init(GCR_LOG_ERROR);
	shim_config_load();
	shim_real_init();
}

SHIM_EXPORT CUresult cuInit(unsigned int Flags)
{
	__typeof__(&cuInit) real = SHIM_REAL(cuInit, 0);
	if (real == NULL)
		return CUDA_ERROR_NO_DEVICE;
	shim_count(shim_thread_self(), SHIM_HOOK_cuInit, 0);
	CUresult r = real(Flags);
	if (r == CUDA_SUCCESS)
		shim_ctl_start();
	return r;
}
