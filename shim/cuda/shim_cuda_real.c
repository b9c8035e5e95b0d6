/* shim_cuda_real: binds the driver functions the CUDA backend calls for its own work (shim_cu)
 * when shim_real opens the driver, with a stub for each one missing, and keeps the thread's last
 * driver error. */
#include "shim_cuda_real.h"

#include <unistd.h>

#include "gcr_log.h"
#include "shim_config.h"

struct shim_cu shim_cu;

static __thread int last_code __attribute__((tls_model("initial-exec")));

int shim_cuda_last_code(void)
{
	return last_code;
}

void shim_cuda_set_last_code(int code)
{
	last_code = code;
}

/* Stand-ins for driver functions the driver lacks: an error, never a NULL call. */
#define X(f, params) \
	static CUresult missing_##f params { return CUDA_ERROR_NOT_FOUND; }
SHIM_CU_INTERNAL_LIST SHIM_CU_OPTIONAL_LIST
#undef X

/* Fills shim_cu from the driver h; returns the first required function it lacks, or NULL. */
static const char *bind_cu(void *h)
{
	const char *lacks = NULL;
#define X(f, params)                                                          \
	shim_cu.f = (__typeof__(&f))shim_real_dlsym(h, #f);                   \
	if (shim_cu.f == NULL) {                                              \
		shim_cu.f = missing_##f;                                      \
		if (lacks == NULL && required)                                \
			lacks = #f;                                           \
	}
	int required = 1;
	SHIM_CU_INTERNAL_LIST
	required = 0;
	SHIM_CU_OPTIONAL_LIST
#undef X
	return lacks;
}

int shim_cuda_real_bind(void *h, const char *path)
{
	const char *lacks = bind_cu(h);
	if (lacks == NULL)
		return 1;
	shim_config_load(); /* first, so reading the settings later cannot undo this */
	shim_cfg.vmm = 0;
	gcr_log_problem("shim", "pid %d: the CUDA driver %s lacks %s; the process runs without GCR and "
			"cannot be suspended", (int)getpid(), path, lacks);
	return 0;
}

void shim_cuda_real_relax_capture(void)
{
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	shim_cu.cuThreadExchangeStreamCaptureMode(&mode);
}
