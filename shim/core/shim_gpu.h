/* shim_gpu: the vendor-neutral operations the data path (allocation table, staging, suspend
 * and resume) needs from a GPU runtime's virtual-memory API; one table per vendor. */
#ifndef SHIM_GPU_H
#define SHIM_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"

/* The most GPUs of one process the data path keeps per-device state for. */
#define SHIM_MAX_DEVICES 64

/* What a vendor offers beyond the common operations (struct shim_gpu_ops, caps): the
 * vendor-neutral code asks these, never which vendor it is. */
#define SHIM_GPU_CAP_CREATE_PROP 0x1u /* create takes the allocation properties the table recorded */

struct shim_digest;
struct shim_digest_req;

/* Device addresses, physical-memory handles, streams and events as the vendors' own values,
 * widened: a CUdeviceptr or a HIP void *, a CUmemGenericAllocationHandle or a HIP handle
 * pointer, a CUstream or hipStream_t, a CUevent or hipEvent_t. */
typedef uint64_t shim_gpu_va;
typedef uint64_t shim_gpu_handle;
typedef void *shim_gpu_stream;
typedef void *shim_gpu_event;

/* Access of one location to a mapped range, with the vendors' own values: CUmemAccessDesc and
 * hipMemAccessDesc have this layout and these values (checked where each is used), so the
 * table records either vendor's descriptors as they were given. */
struct shim_gpu_access {
	int type;  /* SHIM_GPU_LOC_DEVICE */
	int id;    /* the device */
	int flags; /* SHIM_GPU_PROT_* */
};
#define SHIM_GPU_LOC_DEVICE 1
#define SHIM_GPU_PROT_NONE 0
#define SHIM_GPU_PROT_READ 1
#define SHIM_GPU_PROT_READWRITE 3

/* A vendor's allocation properties as the application gave them (CUDA: a CUmemAllocationProp),
 * opaque here: the table keeps them for a vendor with SHIM_GPU_CAP_CREATE_PROP (prop_size bytes)
 * and gives them back to create at resume. The backend checks its type fits (shim_cuda.c). */
#define SHIM_GPU_PROP_BYTES 64
struct shim_gpu_prop {
	uint64_t words[SHIM_GPU_PROP_BYTES / 8]; /* 8-byte aligned, as the vendors' structs */
};

/* The status codes both vendors share (CUresult / hipError_t): the allocation table returns
 * the vendor's own code to the application, and decides on or answers with these. */
#define SHIM_GPU_INVALID_VALUE 1
#define SHIM_GPU_OUT_OF_MEMORY 2
#define SHIM_GPU_NOT_SUPPORTED 801

/* Every operation returns 0 or -errno with err naming the call and the vendor's error
 * (-ENOMEM for the vendor's out-of-memory, so resume can report what is missing); the vendor's
 * own code of the failure is kept for the thread (last_code). They call the real runtime, never
 * the shim's wrappers, and do not pass the gate. */
struct shim_gpu_ops {
	const char *name; /* "cuda", "hip": what status reports */
	unsigned caps;    /* SHIM_GPU_CAP_* */
	size_t prop_size; /* with SHIM_GPU_CAP_CREATE_PROP: bytes of the vendor's allocation properties */

	/* Called once by shim_real when it opened the runtime (handle, from path), after the hook
	 * table is filled: the backend takes the other functions its own work calls. 1 if the shim
	 * can serve on this runtime; 0: the application runs on it through the wrappers, but the
	 * shim converts no allocation and never serves. NULL: the backend binds when first used. */
	int (*bind)(void *handle, const char *path);
	/* For the calling shim thread once the runtime is loaded: its calls must not invalidate an
	 * application's stream capture in global mode (CUDA: relaxed capture mode). NULL: no capture. */
	void (*relax_capture)(void);
	/* The vendor's own status code (CUresult, hipError_t) of this thread's last failed operation:
	 * what the allocation table returns to the application for its call. */
	int (*last_code)(void);

	/* Whether the process has opened (initialised) this runtime: the one a suspend uses. */
	int (*present)(void);

	/* Opens the runtime if needed and checks what the data path needs; -ENODEV where the
	 * process has none. */
	int (*load)(struct gcr_err *err);
	int (*device_count)(int *count, struct gcr_err *err);
	/* The calling thread's device, and (CUDA) its current context, NULL for HIP. */
	int (*current_device)(int *device, void **ctx, struct gcr_err *err);
	/* Minimum VMM granularity of device memory on dev, bytes. */
	int (*granularity)(int device, size_t *bytes, struct gcr_err *err);
	/* Whether peer may map memory of device (the access list of converted buffers). */
	int (*can_access_peer)(int device, int peer, int *can, struct gcr_err *err);

	int (*reserve)(shim_gpu_va *va, size_t size, size_t align, struct gcr_err *err);
	int (*free_va)(shim_gpu_va va, size_t size, struct gcr_err *err);
	/* Physical device memory on device; size a granularity multiple. prop: the vendor's own
	 * allocation properties to create with (CUDA: the CUmemAllocationProp recorded, struct
	 * shim_gpu_prop), or NULL for pinned memory on device. */
	int (*create)(shim_gpu_handle *h, size_t size, int device, const void *prop, struct gcr_err *err);
	int (*release)(shim_gpu_handle h, struct gcr_err *err);
	int (*map)(shim_gpu_va va, size_t size, size_t offset, shim_gpu_handle h, struct gcr_err *err);
	int (*unmap)(shim_gpu_va va, size_t size, struct gcr_err *err);
	int (*set_access)(shim_gpu_va va, size_t size, const struct shim_gpu_access *acc, size_t n,
			  struct gcr_err *err);

	/* Where the calling thread's next calls go: CUDA: the context the application allocated in
	 * on device; HIP: hipSetDevice. */
	int (*set_device)(int device, struct gcr_err *err);
	/* CUDA contexts as such (the staging's pinned slots are made in one): get and make current.
	 * HIP has none: NULL and 0. */
	int (*ctx_get)(void **ctx, struct gcr_err *err);
	int (*ctx_set)(void *ctx, struct gcr_err *err);
	/* While suspended, the contexts' scratch that holds nothing between kernels (CUDA: local
	 * memory, sized from the stack limit) is given back so the driver does not checkpoint it;
	 * freed: device bytes it returned. unshrink puts every application setting back (and can
	 * be called again after a failure). NULL where the vendor has nothing to give. */
	int (*ctx_shrink)(uint64_t *freed, struct gcr_err *err);
	int (*ctx_unshrink)(struct gcr_err *err);
	/* A non-blocking stream on device for the shim's own copies (CUDA: in the current
	 * context, which set_device chose). */
	int (*stream_create)(int device, shim_gpu_stream *s, struct gcr_err *err);
	int (*stream_destroy)(shim_gpu_stream s, struct gcr_err *err);
	int (*stream_sync)(shim_gpu_stream s, struct gcr_err *err);
	/* Events without timing, for the copy workers' double buffering. */
	int (*event_create)(shim_gpu_event *e, struct gcr_err *err);
	int (*event_record)(shim_gpu_event e, shim_gpu_stream s, struct gcr_err *err);
	int (*event_sync)(shim_gpu_event e, struct gcr_err *err);
	/* Waits for all work the application submitted to device, as the runtime's free does
	 * (CUDA: in the calling thread's current context when it is device's, which stays current). */
	int (*device_sync)(int device, struct gcr_err *err);
	/* Waits for all work the application submitted anywhere (CUDA: every context it allocated
	 * in; HIP: every device). Allocations are gated (no ctx_note runs meanwhile). */
	int (*sync_all)(struct gcr_err *err);
	/* Context tracking is the backend's (CUDA; NULL where the vendor has no contexts): the
	 * application allocated on the calling thread, on device (-1: not device memory). ctx: the
	 * thread's current context if the caller has it (NULL: the backend asks). The backend
	 * remembers it for sync_all and ctx_shrink, and as device's context (the first seen) for
	 * set_device; returns device's context, NULL if none. Called with the table lock held. */
	void *(*ctx_note)(int device, void *ctx);
	int (*copy_dtoh_async)(void *dst, shim_gpu_va src, size_t n, shim_gpu_stream s, struct gcr_err *err);
	int (*copy_htod_async)(shim_gpu_va dst, const void *src, size_t n, shim_gpu_stream s,
			       struct gcr_err *err);
	/* Sets n bytes at dst to zero, on s. */
	int (*memset_async)(shim_gpu_va dst, size_t n, shim_gpu_stream s, struct gcr_err *err);
	/* Pins (page-locks) host memory for the copies, and unpins it. */
	int (*host_register)(void *p, size_t n, struct gcr_err *err);
	int (*host_unregister)(void *p, struct gcr_err *err);
	/* Pinned host memory of n bytes usable from every device, and its release. */
	int (*host_alloc)(void **p, size_t n, struct gcr_err *err);
	void (*host_free)(void *p, size_t n);
	/* Free and total memory of device (CUDA: of the current context's device). */
	int (*mem_info)(int device, size_t *free_bytes, size_t *total_bytes, struct gcr_err *err);
	/* Digests of device buffers (shim_digest.h) where the vendor runs the digest kernel (CUDA: the
	 * embedded PTX); NULL otherwise, and every chunk is copied. preload loads the kernel for
	 * ctx's device ahead of time (the background thread). */
	int (*digest)(const struct shim_digest_req *req, size_t n, struct shim_digest *out, struct gcr_err *err);
	void (*digest_preload)(void *ctx);
	/* The vendor's name for an error code ("hipErrorOutOfMemory"); never NULL. */
	const char *(*error_string)(int code);
};

/* The backends. With the hook tables (shim_hooktab.h), the only symbols of shim/cuda and
 * shim/hip the core names (tests/unit/test_architecture.sh). */
extern const struct shim_gpu_ops shim_cuda_ops; /* shim_cuda.c */
extern const struct shim_gpu_ops shim_hip_ops;  /* shim_hip.c */

#endif
