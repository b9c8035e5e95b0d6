/* shim_hip_hook: the generated HIP wrappers for work submission and waits, and the rows of the
 * HIP hook table. libamdhip64 is loaded at run time by shim_real (never linked: NVIDIA and
 * GPU-less nodes load none). */
#include "shim_hip_hook.h"

#include <hip/hip_runtime_api.h>

#include "shim_gate.h"
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

#define SHIM_HIP_GATE_BODY(sym, v, args) \
	SHIM_HOOKTAB_GATED(SHIM_HIP, SHIM_HIP_HOOK_##sym, sym, v, args, hipError_t, hipErrorNotFound)
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
#define SHIM_HIP_WRAP_SPT(sym) &sym##_spt
#define SHIM_HIP_WRAP_CXX(sym) &shim_hip_cxx_##sym
#define SHIM_HIP_ENTRY(sym, var) \
	SHIM_HOOKTAB_ROW(SHIM_HIP_HOOK_##sym, #sym, SHIM_HIP_NAME_##var(sym), &sym, SHIM_HIP_WRAP_##var(sym))
#define SHIM_HIP_GATE(sym, var, params, args) SHIM_HIP_ENTRY(sym, var)
#define SHIM_HIP_CUSTOM(sym, var) SHIM_HIP_ENTRY(sym, var)
struct shim_hook shim_hip_hooks[SHIM_HIP_HOOK_COUNT] = { SHIM_HIP_GATE_LIST SHIM_HIP_CUSTOM_LIST };
#undef SHIM_HIP_GATE
#undef SHIM_HIP_CUSTOM
