/* test_nccl_abi: the NCCL interface the shim declares itself (shim/nccl/shim_nccl_abi.h, the
 * prototypes of shim_nccl_hooks.def) against a real nccl.h (configure's --with-nccl, or the
 * headers of the nvidia-nccl wheel scripts/install-deps.sh unpacks): every prototype the list has
 * for this NCCL version, and every layout and value the shim reads. It fails to compile on a
 * difference; running it only reports what it checked. */
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>

#include "shim_nccl_hooks.def"

/* A check per entry, for the versions whose nccl.h declares it; the device API's host functions
 * are declared in C++ headers only (DEV: not checked). */
#define CHECK_FN(sym, ret, params) \
	_Static_assert(__builtin_types_compatible_p(__typeof__(sym), ret params), #sym " differs from nccl.h");
#define SINCE_0(sym, ret, params) CHECK_FN(sym, ret, params) checked++;
#if NCCL_VERSION_CODE >= 22900
#define SINCE_22900(sym, ret, params) CHECK_FN(sym, ret, params) checked++;
#else
#define SINCE_22900(sym, ret, params) skipped++;
#endif
#define SINCE_DEV(sym, ret, params) skipped++;
#define SHIM_NCCL_COLL(sym, var, since, params, args) SINCE_##since(sym, ncclResult_t, params)
#define SHIM_NCCL_USE(sym, var, since, params, args) SINCE_##since(sym, ncclResult_t, params)
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params) SINCE_##since(sym, ret, params)

/* Layouts and values shim_nccl_abi.h gives (the shim copies configurations by their size and
 * reads these fields; the stand-in and the test program use the same header). */
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId");
_Static_assert(offsetof(ncclConfig_t, size) == 0 && offsetof(ncclConfig_t, blocking) == 16, "ncclConfig_t");
_Static_assert(offsetof(ncclConfig_t, netName) == 32 && offsetof(ncclConfig_t, commName) == 48, "ncclConfig_t");
_Static_assert(ncclSuccess == 0 && ncclSystemError == 2 && ncclInvalidArgument == 4 && ncclRemoteError == 6 &&
		       ncclInProgress == 7,
	       "ncclResult_t");
_Static_assert(ncclUint32 == 3 && ncclFloat32 == 7 && ncclBfloat16 == 9 && ncclSum == 0 && ncclAvg == 4 &&
		       ncclNumOps == 5,
	       "data types and ops");
_Static_assert(NCCL_SPLIT_NOCOLOR == -1 && NCCL_CONFIG_UNDEF_INT == (-2147483647 - 1), "constants");

int main(void)
{
	int checked = 0, skipped = 0;
	SHIM_NCCL_COLL_LIST SHIM_NCCL_USE_LIST SHIM_NCCL_CUSTOM_LIST
	printf("test_nccl_abi: nccl.h %d.%d.%d: %d prototypes the same, %d not in this version or C++ only\n",
	       NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, checked, skipped);
	/* Every check above is made by the compiler; an empty list would check nothing. */
	printf("test_nccl_abi: %d passed, %d failed\n", checked + 6, checked == 0);
	return checked > 0 ? 0 : 1;
}
