/* shim_hip_hook: the generated HIP wrappers for work submission and waits, the hook table,
 * and the run-time loading of libamdhip64 (never linked: NVIDIA and GPU-less nodes load none). */
#include "shim_hip_hook.h"

#include <dlfcn.h>
#include <errno.h>
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_ctl.h"
#include "shim_gate.h"
#include "shim_hook.h"
#include "shim_real.h"

/* Deprecated calls (hipMemcpyToArray, ...) are still made by applications, so they are
 * interposed like the rest; the header's deprecation warning is not for us. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* hip_ext.h is C++ only; these are its prototypes without the default arguments. HIP 5.x
 * exports them only under their C++ mangled names (variant 1 below). */
hipError_t hipExtModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
				    uint32_t globalWorkSizeZ, uint32_t localWorkSizeX, uint32_t localWorkSizeY,
				    uint32_t localWorkSizeZ, size_t sharedMemBytes, hipStream_t hStream,
				    void **kernelParams, void **extra, hipEvent_t startEvent,
				    hipEvent_t stopEvent, uint32_t flags);
hipError_t hipHccModuleLaunchKernel(hipFunction_t f, uint32_t globalWorkSizeX, uint32_t globalWorkSizeY,
				    uint32_t globalWorkSizeZ, uint32_t localWorkSizeX, uint32_t localWorkSizeY,
				    uint32_t localWorkSizeZ, size_t sharedMemBytes, hipStream_t hStream,
				    void **kernelParams, void **extra, hipEvent_t startEvent,
				    hipEvent_t stopEvent);
#define SHIM_HIP_CXX_hipExtModuleLaunchKernel \
	"_Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j"
#define SHIM_HIP_CXX_hipHccModuleLaunchKernel \
	"_Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_"

/* A gated wrapper: count, pass the gate, call the real entry point of the same variant.
 * A missing real function is an error result, never a NULL call. */
#define SHIM_HIP_GATE_BODY(sym, v, args)                                        \
	{                                                                       \
		__typeof__(&sym) real_fn = SHIM_HIP_REAL(sym, v);               \
		if (real_fn == NULL)                                            \
			return hipErrorNotFound;                                \
		struct shim_thread *t = shim_gate_enter_hip(SHIM_HIP_HOOK_##sym, v); \
		hipError_t r = real_fn args;                                    \
		shim_gate_exit(t);                                              \
		return r;                                                       \
	}
#define SHIM_HIP_TWIN_NONE(sym, params, args)
#define SHIM_HIP_TWIN_SPT(sym, params, args) \
	SHIM_EXPORT hipError_t sym##_spt params SHIM_HIP_GATE_BODY(sym, 1, args)
/* The mangled twin: a C function exported under the C++ name. */
#define SHIM_HIP_TWIN_CXX(sym, params, args)                                       \
	SHIM_EXPORT hipError_t shim_hip_cxx_##sym params __asm__(SHIM_HIP_CXX_##sym); \
	hipError_t shim_hip_cxx_##sym params SHIM_HIP_GATE_BODY(sym, 1, args)
#define SHIM_HIP_GATE(sym, var, params, args)                          \
	SHIM_EXPORT hipError_t sym params SHIM_HIP_GATE_BODY(sym, 0, args) \
	SHIM_HIP_TWIN_##var(sym, params, args)
SHIM_HIP_GATE_LIST
#undef SHIM_HIP_GATE

/* The custom wrappers (shim_hip_alloc.c) have the runtime's own prototypes; those never have
 * a twin, so the table needs only their names. */
#define SHIM_HIP_NAME_NONE(sym) NULL
#define SHIM_HIP_NAME_SPT(sym) #sym "_spt"
#define SHIM_HIP_NAME_CXX(sym) SHIM_HIP_CXX_##sym
#define SHIM_HIP_WRAP_NONE(sym) NULL
#define SHIM_HIP_WRAP_SPT(sym) (void *)&sym##_spt
#define SHIM_HIP_WRAP_CXX(sym) (void *)&shim_hip_cxx_##sym
#define SHIM_HIP_ENTRY(sym, var)                                                       \
	[SHIM_HIP_HOOK_##sym] = { { #sym, SHIM_HIP_NAME_##var(sym) },                  \
				  { (void *)&sym, SHIM_HIP_WRAP_##var(sym) }, { NULL, NULL } },
#define SHIM_HIP_GATE(sym, var, params, args) SHIM_HIP_ENTRY(sym, var)
#define SHIM_HIP_CUSTOM(sym, var) SHIM_HIP_ENTRY(sym, var)
struct shim_hip_hook shim_hip_hooks[SHIM_HIP_HOOK_COUNT] = { SHIM_HIP_GATE_LIST SHIM_HIP_CUSTOM_LIST };
#undef SHIM_HIP_GATE
#undef SHIM_HIP_CUSTOM

struct shim_hip_lookups shim_hip_lookups;

static pthread_mutex_t hip_lock = PTHREAD_MUTEX_INITIALIZER;
static void *hip_handle; /* written once under hip_lock, then read lock-free */
static atomic_int ctl_started;

/* The object holding addr, if it is a HIP runtime and not the shim itself. */
static const char *runtime_of(const void *addr)
{
	Dl_info di, self;
	if (addr == NULL || dladdr(addr, &di) == 0 || di.dli_fname == NULL)
		return NULL;
	if (dladdr((void *)&shim_hip_load, &self) != 0 && self.dli_fbase == di.dli_fbase)
		return NULL;
	return strstr(di.dli_fname, "libamdhip64") != NULL ? di.dli_fname : NULL;
}

int shim_hip_load(const void *hint)
{
	if (__atomic_load_n(&hip_handle, __ATOMIC_ACQUIRE) != NULL)
		return 0;
	pthread_mutex_lock(&hip_lock);
	int rc = 0;
	if (hip_handle != NULL)
		goto out;
	const char *path = runtime_of(hint);
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
	static const char *const sonames[] = SHIM_HIP_SONAMES;
	const size_t n = sizeof(sonames) / sizeof(sonames[0]);
	/* The runtime the application already loaded wins over any newer one on disk. */
	for (size_t i = 0; h == NULL && i < n; i++)
		if ((h = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD)) != NULL)
			path = sonames[i];
	for (size_t i = 0; h == NULL && i < n; i++)
		if ((h = dlopen(sonames[i], RTLD_NOW)) != NULL)
			path = sonames[i];
	if (h == NULL) {
		GCR_LOG(GCR_LOG_ERROR, "shim", "cannot open the HIP runtime (libamdhip64.so.7/6/5)");
		rc = -ENOENT;
		goto out;
	}
	for (int i = 0; i < SHIM_HIP_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hip_hooks[i].name[v] != NULL)
				shim_hip_hooks[i].real[v] = shim_real_dlsym(h, shim_hip_hooks[i].name[v]);
	__atomic_store_n(&hip_handle, h, __ATOMIC_RELEASE);
	GCR_LOG(GCR_LOG_DEBUG, "shim", "HIP runtime loaded from %s", path);
out:
	pthread_mutex_unlock(&hip_lock);
	return rc;
}

void *shim_hip_handle(void)
{
	return __atomic_load_n(&hip_handle, __ATOMIC_ACQUIRE);
}

void *shim_hip_hook_real(enum shim_hip_hook_id id, int variant)
{
	if (shim_hip_handle() == NULL && shim_hip_load(NULL) < 0)
		return NULL;
	if (!atomic_load_explicit(&ctl_started, memory_order_relaxed)) {
		atomic_store(&ctl_started, 1);
		shim_ctl_start();
	}
	return shim_hip_hooks[id].real[variant];
}

void *shim_hip_hook_wrap_real(void *real_fn)
{
	if (real_fn == NULL)
		return NULL;
	if (shim_hip_handle() == NULL && (runtime_of(real_fn) == NULL || shim_hip_load(real_fn) < 0))
		return NULL;
	for (int i = 0; i < SHIM_HIP_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hip_hooks[i].real[v] == real_fn)
				return shim_hip_hooks[i].wrapper[v];
	return NULL;
}

void *shim_hip_hook_wrap_name(const char *name)
{
	for (int i = 0; i < SHIM_HIP_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hip_hooks[i].name[v] != NULL && strcmp(shim_hip_hooks[i].name[v], name) == 0)
				return shim_hip_hooks[i].wrapper[v];
	return NULL;
}

const char *shim_hip_hook_name(enum shim_hip_hook_id id, int variant)
{
	return shim_hip_hooks[id].name[variant];
}
