/* shim_main: libgcr.so's entry: the load-time constructor (settings, the real dlsym; nothing
 * that touches a GPU runtime) and the one function that starts the control socket, which
 * shim_real calls when a runtime is first used (CUDA: cuInit succeeded, in shim_hook.c; HIP:
 * its first call). */
#include "shim_main.h"

#include <pthread.h>

#include "gcr_log.h"
#include "shim_config.h"
#include "shim_ctl.h"
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

void shim_main_setup(void)
{
	pthread_once(&setup_once, setup);
}

/* The constructor, or a runtime's initialisation if it comes first: a library whose own
 * constructor initialises CUDA runs before this one (dependencies are initialised before the
 * preloaded shim). */
__attribute__((constructor)) static void shim_main_init(void)
{
	shim_main_setup();
}
