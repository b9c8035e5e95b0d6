/* shim_main: libgcr.so's entry: the load-time constructor (settings, the real
 * dlsym; nothing that touches a GPU runtime) and the one place that starts the control
 * socket: when cuInit succeeds, or on HIP's first call (through shim_real_serve). */
#include <cuda.h>
#include <pthread.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_ctl.h"
#include "shim_gate.h"
#include "shim_hooktab.h"
#include "shim_real.h"

/* Runs in every process the preload reaches (shells, compilers, ...), so it only
 * reads settings and finds libc's dlsym. */
static void setup(void)
{
	gcr_log_init(GCR_LOG_ERROR);
	shim_config_load();
	shim_real_init();
	shim_real_on_serve(shim_ctl_start);
}

static pthread_once_t setup_once = PTHREAD_ONCE_INIT;

/* The constructor, or cuInit if it comes first: a library whose own constructor initialises
 * CUDA runs before this one (dependencies are initialised before the preloaded shim). */
__attribute__((constructor)) static void shim_main_init(void)
{
	pthread_once(&setup_once, setup);
}

SHIM_EXPORT CUresult cuInit(unsigned int Flags)
{
	__typeof__(&cuInit) real = SHIM_REAL(cuInit, 0);
	if (real == NULL)
		return CUDA_ERROR_NO_DEVICE;
	shim_count(shim_thread_self(), SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuInit), 0);
	CUresult r = real(Flags);
	if (r == CUDA_SUCCESS) {
		pthread_once(&setup_once, setup);
		shim_real_serve(SHIM_CUDA);
	}
	return r;
}
