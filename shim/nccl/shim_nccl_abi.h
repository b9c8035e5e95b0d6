/* shim_nccl_abi: the NCCL application interface the shim interposes, declared from NCCL's
 * documented API (types, values, prototypes), so the shim and the stand-in NCCL build without
 * NCCL's headers. shim_nccl_check.c compares every prototype and layout here with a real
 * nccl.h where configure finds one (--with-nccl). */
#ifndef SHIM_NCCL_ABI_H
#define SHIM_NCCL_ABI_H

#include <cuda.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
/* cuda_runtime's stream handle is the driver's CUstream (same struct tag). */
typedef struct CUstream_st *cudaStream_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
	char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
	ncclSuccess = 0,
	ncclUnhandledCudaError = 1,
	ncclSystemError = 2,
	ncclInternalError = 3,
	ncclInvalidArgument = 4,
	ncclInvalidUsage = 5,
	ncclRemoteError = 6,
	ncclInProgress = 7,
	ncclNumResults = 8
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_SPLIT_NOCOLOR -1

typedef enum {
	ncclInt8 = 0,
	ncclChar = 0,
	ncclUint8 = 1,
	ncclInt32 = 2,
	ncclInt = 2,
	ncclUint32 = 3,
	ncclInt64 = 4,
	ncclUint64 = 5,
	ncclFloat16 = 6,
	ncclHalf = 6,
	ncclFloat32 = 7,
	ncclFloat = 7,
	ncclFloat64 = 8,
	ncclDouble = 8,
	ncclBfloat16 = 9,
	ncclFloat8e4m3 = 10,
	ncclFloat8e5m2 = 11,
	ncclNumTypes = 12
} ncclDataType_t;

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
	ncclSum = 0,
	ncclProd = 1,
	ncclMax = 2,
	ncclMin = 3,
	ncclAvg = 4,
	ncclNumOps = 5,
	ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

typedef enum {
	ncclStatGpuMemSuspend = 0,
	ncclStatGpuMemSuspended = 1,
	ncclStatGpuMemPersist = 2,
	ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* The communicator configuration (ncclConfig_v22800). Readers go by its "size": an
 * application built against another NCCL may pass a shorter or longer one, which the shim
 * copies whole (up to SHIM_NCCL_CONFIG_MAX bytes) and only reads the fields below. */
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
	int trafficClass;
	const char *commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
	int graphUsageMode;
	int numRmaCtx;
} ncclConfig_t;
#define SHIM_NCCL_API_MAGIC 0xcafebeefu

typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	float estimatedTime;
} ncclSimInfo_t;

typedef struct {
	int opCnt;
	int peer;
	int sigIdx;
	int ctx;
} ncclWaitSignalDesc_t;

/* The device API's host functions that take a communicator; their structures are passed
 * through by pointer (ncclTeam_t by value: three ints). */
typedef struct ncclDevComm ncclDevComm_t;
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclCommProperties ncclCommProperties_t;
typedef struct ncclGinBarrierHandle ncclGinBarrierHandle_t;
typedef struct ncclDevResourceRequirements ncclDevResourceRequirements_t;
typedef struct ncclTeam {
	int nRanks, rank, stride;
} ncclTeam_t;

/* ---- prototypes (the nccl.h ones also exist as pnccl*, the profiling names) ---- */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
const char *ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
				    ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
				      ncclUniqueId *commIds, ncclConfig_t *config);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount, ncclComm_t *newcomm,
			    ncclConfig_t *config, int shrinkFlags);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank, ncclComm_t *newcomm,
			  ncclConfig_t *config);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags);
ncclResult_t ncclCommResume(ncclComm_t comm);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
				      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
			int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
		       cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			   ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
			       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
			   ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
			  ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
			 ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
		      cudaStream_t stream);
ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
			   ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags,
			   ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, ncclDevCommRequirements_t const *reqs, ncclDevComm_t *outDevComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, ncclDevComm_t const *devComm);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nBarriers,
					     ncclGinBarrierHandle_t *outHandle, ncclDevResourceRequirements_t *outReq);

#endif
