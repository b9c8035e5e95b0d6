/* fakecuda: what the modules of the stand-in libcuda.so.1 share: the per-call gate, the device
 * lock, contexts, the work operations that streams run or graphs record, and the memory table. */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

/* Entry points the real driver exports. Everything else in the library is hidden
 * (-fvisibility=hidden), and -Bsymbolic keeps our own references (the cuGetProcAddress
 * table) bound to these definitions even when a preloaded shim exports the same names. */
#define FAKE_EXPORT __attribute__((visibility("default")))

/* The per-thread-default-stream variants: cuda.h declares them only when compiled with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM, so declare them from the legacy prototypes. */
extern __typeof__(cuMemcpy) cuMemcpy_ptds;
extern __typeof__(cuMemcpyAsync) cuMemcpyAsync_ptsz;
extern __typeof__(cuMemcpyHtoD_v2) cuMemcpyHtoD_v2_ptds;
extern __typeof__(cuMemcpyDtoH_v2) cuMemcpyDtoH_v2_ptds;
extern __typeof__(cuMemcpyDtoD_v2) cuMemcpyDtoD_v2_ptds;
extern __typeof__(cuMemcpyHtoDAsync_v2) cuMemcpyHtoDAsync_v2_ptsz;
extern __typeof__(cuMemcpyDtoHAsync_v2) cuMemcpyDtoHAsync_v2_ptsz;
extern __typeof__(cuMemcpyDtoDAsync_v2) cuMemcpyDtoDAsync_v2_ptsz;
extern __typeof__(cuMemcpy2D_v2) cuMemcpy2D_v2_ptds;
extern __typeof__(cuMemcpy2DAsync_v2) cuMemcpy2DAsync_v2_ptsz;
extern __typeof__(cuMemsetD8_v2) cuMemsetD8_v2_ptds;
extern __typeof__(cuMemsetD16_v2) cuMemsetD16_v2_ptds;
extern __typeof__(cuMemsetD32_v2) cuMemsetD32_v2_ptds;
extern __typeof__(cuMemsetD8Async) cuMemsetD8Async_ptsz;
extern __typeof__(cuMemsetD16Async) cuMemsetD16Async_ptsz;
extern __typeof__(cuMemsetD32Async) cuMemsetD32Async_ptsz;
extern __typeof__(cuMemsetD2D8_v2) cuMemsetD2D8_v2_ptds;
extern __typeof__(cuMemsetD2D32_v2) cuMemsetD2D32_v2_ptds;
extern __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
extern __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
extern __typeof__(cuMemAllocFromPoolAsync) cuMemAllocFromPoolAsync_ptsz;
extern __typeof__(cuStreamSynchronize) cuStreamSynchronize_ptsz;
extern __typeof__(cuStreamQuery) cuStreamQuery_ptsz;
extern __typeof__(cuStreamWaitEvent) cuStreamWaitEvent_ptsz;
extern __typeof__(cuEventRecord) cuEventRecord_ptsz;
extern __typeof__(cuEventRecordWithFlags) cuEventRecordWithFlags_ptsz;
extern __typeof__(cuLaunchHostFunc) cuLaunchHostFunc_ptsz;
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuLaunchKernelEx) cuLaunchKernelEx_ptsz;
extern __typeof__(cuLaunchCooperativeKernel) cuLaunchCooperativeKernel_ptsz;
extern __typeof__(cuStreamBeginCapture_v2) cuStreamBeginCapture_v2_ptsz;
extern __typeof__(cuStreamEndCapture) cuStreamEndCapture_ptsz;
extern __typeof__(cuStreamIsCapturing) cuStreamIsCapturing_ptsz;
extern __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;
extern __typeof__(cuStreamGetCaptureInfo_v3) cuStreamGetCaptureInfo_v3_ptsz;

/* Older ABI versions the real driver still exports under their plain names, which cuda.h 13
 * maps elsewhere; defined under asm labels, their types checked against cudaTypedefs.h. */
FAKE_EXPORT CUresult fake_legacy_get_proc_address(const char *symbol, void **pfn, int ver,
						  cuuint64_t flags) __asm__("cuGetProcAddress");
FAKE_EXPORT CUresult fake_legacy_ctx_create_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
	__asm__("cuCtxCreate_v2");
FAKE_EXPORT CUresult fake_legacy_ctx_create_v3(CUcontext *pctx, CUexecAffinityParam *params,
					       int nparams, unsigned int flags, CUdevice dev)
	__asm__("cuCtxCreate_v3");
FAKE_EXPORT CUresult fake_legacy_device_get_uuid(CUuuid *uuid, CUdevice dev)
	__asm__("cuDeviceGetUuid");
FAKE_EXPORT CUresult fake_legacy_primary_ctx_release(CUdevice dev)
	__asm__("cuDevicePrimaryCtxRelease");
FAKE_EXPORT CUresult fake_legacy_event_elapsed_time(float *ms, CUevent start, CUevent end)
	__asm__("cuEventElapsedTime");
FAKE_EXPORT CUresult fake_legacy_stream_begin_capture(CUstream stream)
	__asm__("cuStreamBeginCapture");
FAKE_EXPORT CUresult fake_legacy_stream_begin_capture_ptsz(CUstream stream)
	__asm__("cuStreamBeginCapture_ptsz");
FAKE_EXPORT CUresult fake_legacy_graph_instantiate(CUgraphExec *exec, CUgraph graph,
						   CUgraphNode *err_node, char *log,
						   size_t log_size) __asm__("cuGraphInstantiate");
FAKE_EXPORT CUresult fake_legacy_graph_instantiate_v2(CUgraphExec *exec, CUgraph graph,
						      CUgraphNode *err_node, char *log,
						      size_t log_size) __asm__("cuGraphInstantiate_v2");
FAKE_EXPORT CUresult fake_legacy_capture_info(CUstream s, CUstreamCaptureStatus *status,
					      cuuint64_t *id) __asm__("cuStreamGetCaptureInfo");
FAKE_EXPORT CUresult fake_legacy_capture_info_ptsz(CUstream s, CUstreamCaptureStatus *status,
						   cuuint64_t *id) __asm__("cuStreamGetCaptureInfo_ptsz");
FAKE_EXPORT CUresult fake_legacy_capture_info_v2(CUstream s, CUstreamCaptureStatus *status,
						 cuuint64_t *id, CUgraph *graph,
						 const CUgraphNode **deps, size_t *ndeps)
	__asm__("cuStreamGetCaptureInfo_v2");
FAKE_EXPORT CUresult fake_legacy_capture_info_v2_ptsz(CUstream s, CUstreamCaptureStatus *status,
						      cuuint64_t *id, CUgraph *graph,
						      const CUgraphNode **deps, size_t *ndeps)
	__asm__("cuStreamGetCaptureInfo_v2_ptsz");
FAKE_EXPORT CUresult fake_legacy_graph_add_node(CUgraphNode *node, CUgraph graph,
						const CUgraphNode *deps, size_t ndeps,
						CUgraphNodeParams *params) __asm__("cuGraphAddNode");

/* A client's request to another process's service thread (used by fakesmi too). Returns the
 * CUresult the target answered, or as the driver does: CUDA_ERROR_NOT_INITIALIZED for a
 * process that never called cuInit, CUDA_ERROR_OPERATING_SYSTEM for no such process; the rest
 * of the answer line (a value) goes to reply. */
FAKE_EXPORT CUresult fake_service_request(int pid, const char *request, char *reply, size_t len);

#define FAKE_MAX_DEVICES 8
#define FAKE_GRANULARITY ((size_t)2 << 20) /* VMM granularity, bytes, as on H100 */

/* ---- core: init, gate, faults, devices, contexts (fakecuda_core.c) ---- */

/* Every gated entry point starts with FAKE_ENTER("baseName") and returns through
 * fake_leave(): before cuInit it answers CUDA_ERROR_NOT_INITIALIZED; while the process is
 * locked by the checkpoint API it blocks; an armed fault for baseName answers instead. */
CUresult fake_enter(const char *base);
CUresult fake_leave(CUresult rc);
#define FAKE_ENTER(base)                                          \
	do {                                                      \
		CUresult fake_enter_rc_ = fake_enter(base);       \
		if (fake_enter_rc_ != CUDA_SUCCESS)               \
			return fake_enter_rc_;                    \
	} while (0)

bool fake_initialized(void);
/* Counts one call of base against armed faults; non-zero: the injected error. */
CUresult fake_fault_take(const char *base);
CUresult fake_fault_arm(const char *name, unsigned nth, int code);
/* Removes every armed fault; returns how many had not fired. */
unsigned int fake_fault_disarm(void);

/* The gate the checkpoint lock closes: close waits until no call is in flight (timeout_ms 0:
 * forever) and answers CUDA_ERROR_NOT_READY, gate open again, on timeout. */
CUresult fake_gate_close(unsigned timeout_ms);
void fake_gate_open(void);

/* One lock for every table (devices, memory, objects). Work itself runs outside it. */
void fake_lock(void);
void fake_unlock(void);

int fake_device_count(void);
size_t fake_device_total(int dev);
/* FAKECUDA_POPULATE=1: device memory is taken at cuMemCreate (fakecuda_mem.c). */
bool fake_device_populate(void);
void fake_device_uuid(int dev, CUuuid *uuid);

struct fake_ctx {
	struct fake_ctx *next;
	int dev;
	unsigned int flags;
	bool primary;
	unsigned int refs; /* primary only: retain count */
	bool destroyed;    /* handles stay readable: other threads may still hold them */
	bool stack_set;    /* stack: CU_LIMIT_STACK_SIZE once set (FAKE_STACK_DEFAULT before) */
	size_t stack;
};
/* Local memory as the real driver sizes it: the stack limit x this many threads, counted in
 * cuMemGetInfo's free bytes (the H100 has 2048 x 132; a 4 GiB stand-in a thousand). */
#define FAKE_STACK_DEFAULT 1024
#define FAKE_LMEM_THREADS 1024
/* Local-memory bytes of the contexts on dev. */
size_t fake_ctx_lmem(int dev);
/* The calling thread's current context, or CUDA_ERROR_INVALID_CONTEXT. */
CUresult fake_ctx_current(struct fake_ctx **ctx);

/* ---- checkpoint service (fakecuda_ckpt.c) ---- */

/* Starts the thread that answers other processes' cuCheckpointProcess* calls. */
CUresult fake_service_start(void);

/* ---- memory (fakecuda_mem.c) ---- */

/* Whether a copy or set may use [p, p + len): inside one allocation (device, managed, pinned or
 * registered host memory), or inside one VMM reservation and wholly mapped with read (write:
 * read-write) access, as the driver checks; CUDA_ERROR_INVALID_VALUE if not. host_ok: a range
 * the driver does not know is host memory (unified addressing: cuMemcpy). Locks. */
CUresult fake_mem_check(CUdeviceptr p, size_t len, bool write, bool host_ok);
void fake_mem_free_ctx(struct fake_ctx *ctx);
/* Called by the checkpoint service with the gate closed. */
CUresult fake_mem_checkpoint(void);
CUresult fake_mem_restore(void);
size_t fake_mem_used(void);
/* Memory of the stream-ordered pools (fakecuda_pool_async.c): an allocation of the table
 * (found by copies, address ranges, pointer attributes; moved by checkpoints) owned by no
 * context; dev -1: host memory (a host-location pool), not charged to a device. The pool
 * keeps it while it caches it. Lock not held. */
CUresult fake_mem_pool_map(int dev, size_t len, CUdeviceptr *p);
void fake_mem_pool_unmap(CUdeviceptr p);
/* The size cuMemGetAddressRange answers for a block reused for a smaller request. */
void fake_mem_pool_resize(CUdeviceptr p, size_t size);
/* Whether p is the start of a cuMemAlloc buffer (cuMemFreeAsync frees those too), and the
 * free when the stream reaches it. */
bool fake_mem_is_alloc(CUdeviceptr p);
void fake_mem_free_alloc(CUdeviceptr p);

/* ---- stream-ordered pools (fakecuda_pool_async.c) ---- */

/* A FAKE_OP_FREE reached by its stream: the block returns to its pool unless it has been
 * reallocated since (gen). Lock not held. */
void fake_pool_free_done(CUdeviceptr p, uint64_t gen);
/* After a successful synchronize: pools release cached memory above their release threshold,
 * and completed frees become reusable by every stream. */
void fake_pool_on_sync(void);
/* Whether p is a live block of a pool; cuMemFree_v2 frees those into their pool at once. */
bool fake_pool_owns(CUdeviceptr p);
CUresult fake_pool_free_now(CUdeviceptr p);

/* ---- work: operations a stream runs or a graph records (fakecuda_exec.c) ---- */

struct fake_kernel;
struct fake_event;

/* WAIT: a held stream's queue waits there for an event's record (cuStreamWaitEvent); FREE: a
 * stream-ordered free; NOP: a node that does nothing when run (empty, memory alloc/free). */
enum fake_op_kind {
	FAKE_OP_COPY,
	FAKE_OP_SET,
	FAKE_OP_KERNEL,
	FAKE_OP_HOSTFN,
	FAKE_OP_EVENT,
	FAKE_OP_WAIT,
	FAKE_OP_FREE,
	FAKE_OP_NOP
};

#define FAKE_MAX_ARGS 8
#define FAKE_FREE_LIVE UINT64_MAX

/* A launch's grid and block, as given (kernels that depend on them see them). */
struct fake_dims {
	unsigned int gx, gy, gz, bx, by, bz, shared;
};

struct fake_op {
	enum fake_op_kind kind;
	union {
		struct { /* 2-D; a linear copy has height 1 */
			char *dst;
			const char *src;
			size_t dpitch, spitch, width, height; /* bytes */
		} copy;
		struct {
			char *dst;
			size_t pitch, width, height; /* pitch in bytes, width in elements */
			uint32_t value;
			unsigned int elem; /* 1, 2 or 4 bytes */
		} set;
		struct {
			const struct fake_kernel *kernel;
			uint64_t args[FAKE_MAX_ARGS]; /* one 8-byte slot per parameter */
			struct fake_dims dims;
		} kernel;
		struct {
			CUhostFn fn;
			void *data;
		} hostfn;
		struct { /* EVENT and WAIT: seq, the record's number, is given at submission */
			struct fake_event *ev;
			uint64_t seq;
		} event;
		struct { /* gen FAKE_FREE_LIVE: a graph's free node of a live pool block */
			CUdeviceptr ptr;
			uint64_t gen;
		} free;
	} u;
};

/* Runs op on stream now, or records it when the stream is being captured. */
CUresult fake_submit(CUstream stream, const struct fake_op *op);
/* Validates a stream handle (NULL, the legacy and per-thread handles included). */
CUresult fake_stream_check(CUstream stream);
/* Capture must refuse what it cannot record (asynchronous allocation). */
bool fake_stream_capturing(CUstream stream);
/* The device of a stream's context (a default stream: of the current context). */
CUresult fake_stream_device(CUstream stream, int *dev);
/* Stream-ordered allocation inside a capture: graph memory, its address fixed now and valid
 * while the graph, its clones, parents and executables live; a free records a node (of a pool
 * block allocated outside the graph: freed when the graph runs). */
CUresult fake_capture_alloc(CUstream stream, int dev, size_t size, CUdeviceptr *out);
CUresult fake_capture_free(CUstream stream, CUdeviceptr p, bool pool_block);
/* Synchronisation of held work (fakecuda_test.h): releases every held stream and runs what
 * they queued. The checkpoint lock and context synchronisation call it. Lock not held. */
void fake_exec_release_all(void);

#endif
