/* gcr-testprog: a driver-API workload that runs unchanged on the stand-in driver and on a GPU:
 * many kinds of buffers, per-thread streams, kernels, copies, graphs, and an exact final check. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr_kernels.h"

#define GCR_CUDA_VERSION 13000 /* what procaddr mode asks for, like a CUDA 13 runtime */
#define GCR_SCRATCH_WORDS 16384 /* per-thread round-trip area: 64 KiB */
#define GCR_TARGET_BYTES ((size_t)2 << 20) /* per-thread area the indirect kernel writes */
#define GCR_TARGETS 8                      /* pointers in each thread's device pointer table */
#define GCR_SMALL_BUFFERS 3
#define GCR_SMALL_BYTES 4096
#define GCR_SAMPLE_WORDS 16384 /* words read back to the host from each end of a buffer */
#define GCR_BLOCK 256
#define GCR_MAX_GRID 4096
#define GCR_MAX_THREADS 64

/* Per-thread-default-stream entry points: cuda.h declares them only for PTDS builds. */
extern __typeof__(cuMemAllocAsync) cuMemAllocAsync_ptsz;
extern __typeof__(cuMemFreeAsync) cuMemFreeAsync_ptsz;
extern __typeof__(cuMemcpyHtoD_v2) cuMemcpyHtoD_v2_ptds;
extern __typeof__(cuMemcpyDtoH_v2) cuMemcpyDtoH_v2_ptds;
extern __typeof__(cuMemcpyHtoDAsync_v2) cuMemcpyHtoDAsync_v2_ptsz;
extern __typeof__(cuMemcpyDtoHAsync_v2) cuMemcpyDtoHAsync_v2_ptsz;
extern __typeof__(cuMemcpy2D_v2) cuMemcpy2D_v2_ptds;
extern __typeof__(cuMemsetD32_v2) cuMemsetD32_v2_ptds;
extern __typeof__(cuMemsetD8_v2) cuMemsetD8_v2_ptds;
extern __typeof__(cuMemcpyDtoD_v2) cuMemcpyDtoD_v2_ptds;
extern __typeof__(cuMemsetD32Async) cuMemsetD32Async_ptsz;
extern __typeof__(cuStreamSynchronize) cuStreamSynchronize_ptsz;
extern __typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
extern __typeof__(cuStreamBeginCapture_v2) cuStreamBeginCapture_v2_ptsz;
extern __typeof__(cuStreamEndCapture) cuStreamEndCapture_ptsz;
extern __typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

/* Every entry point used: X(name as the API documents it, exported symbol, per-thread symbol).
 * The field is named after the first (cuda.h macros turn it into the versioned name, the same
 * way at declaration and at use), and the field's type is the symbol's own prototype. */
#define GCR_API(X)                                                                          \
	X(cuInit, cuInit, cuInit)                                                           \
	X(cuGetErrorName, cuGetErrorName, cuGetErrorName)                                   \
	X(cuDriverGetVersion, cuDriverGetVersion, cuDriverGetVersion)                       \
	X(cuDeviceGet, cuDeviceGet, cuDeviceGet)                                            \
	X(cuDeviceGetName, cuDeviceGetName, cuDeviceGetName)                                \
	X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain)     \
	X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2) \
	X(cuCtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent)                                \
	X(cuCtxGetLimit, cuCtxGetLimit, cuCtxGetLimit)                                      \
	X(cuCtxSetLimit, cuCtxSetLimit, cuCtxSetLimit)                                      \
	X(cuMemAlloc, cuMemAlloc_v2, cuMemAlloc_v2)                                         \
	X(cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch_v2)                          \
	X(cuMemFree, cuMemFree_v2, cuMemFree_v2)                                            \
	X(cuMemAllocAsync, cuMemAllocAsync, cuMemAllocAsync_ptsz)                           \
	X(cuMemFreeAsync, cuMemFreeAsync, cuMemFreeAsync_ptsz)                              \
	X(cuMemAllocManaged, cuMemAllocManaged, cuMemAllocManaged)                          \
	X(cuMemAllocHost, cuMemAllocHost_v2, cuMemAllocHost_v2)                             \
	X(cuMemFreeHost, cuMemFreeHost, cuMemFreeHost)                                      \
	X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity,                     \
	  cuMemGetAllocationGranularity)                                                    \
	X(cuMemAddressReserve, cuMemAddressReserve, cuMemAddressReserve)                    \
	X(cuMemAddressFree, cuMemAddressFree, cuMemAddressFree)                             \
	X(cuMemCreate, cuMemCreate, cuMemCreate)                                            \
	X(cuMemRelease, cuMemRelease, cuMemRelease)                                         \
	X(cuMemMap, cuMemMap, cuMemMap)                                                     \
	X(cuMemUnmap, cuMemUnmap, cuMemUnmap)                                               \
	X(cuMemSetAccess, cuMemSetAccess, cuMemSetAccess)                                   \
	X(cuMemcpyHtoD, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds)                              \
	X(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds)                              \
	X(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz)               \
	X(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz)               \
	X(cuMemcpy2D, cuMemcpy2D_v2, cuMemcpy2D_v2_ptds)                                    \
	X(cuMemsetD32, cuMemsetD32_v2, cuMemsetD32_v2_ptds)                                 \
	X(cuMemsetD8, cuMemsetD8_v2, cuMemsetD8_v2_ptds)                                    \
	X(cuMemcpyDtoD, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds)                              \
	X(cuMemsetD32Async, cuMemsetD32Async, cuMemsetD32Async_ptsz)                        \
	X(cuStreamCreate, cuStreamCreate, cuStreamCreate)                                   \
	X(cuStreamDestroy, cuStreamDestroy_v2, cuStreamDestroy_v2)                          \
	X(cuStreamSynchronize, cuStreamSynchronize, cuStreamSynchronize_ptsz)               \
	X(cuModuleLoad, cuModuleLoad, cuModuleLoad)                                         \
	X(cuModuleUnload, cuModuleUnload, cuModuleUnload)                                   \
	X(cuModuleGetFunction, cuModuleGetFunction, cuModuleGetFunction)                    \
	X(cuLaunchKernel, cuLaunchKernel, cuLaunchKernel_ptsz)                              \
	X(cuStreamBeginCapture, cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz)      \
	X(cuStreamEndCapture, cuStreamEndCapture, cuStreamEndCapture_ptsz)                  \
	X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags,                         \
	  cuGraphInstantiateWithFlags)                                                      \
	X(cuGraphLaunch, cuGraphLaunch, cuGraphLaunch_ptsz)                                 \
	X(cuGraphExecDestroy, cuGraphExecDestroy, cuGraphExecDestroy)                       \
	X(cuGraphDestroy, cuGraphDestroy, cuGraphDestroy)

#define GCR_FIELD(name, sym, ptsym) __typeof__(&sym) name;
static struct {
	GCR_API(GCR_FIELD)
} api;

/* Calls an entry point through the table; any error ends the program with exit code 2. */
#define CU(fn, ...) gcr_cu(api.fn(__VA_ARGS__), #fn)

static void gcr_cu(CUresult rc, const char *call)
{
	const char *name = NULL;

	if (rc == CUDA_SUCCESS)
		return;
	if (api.cuGetErrorName == NULL || api.cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
		name = "CUDA_ERROR_UNKNOWN";
	printf("ERROR %s %s\n", call, name);
	fflush(stdout);
	exit(2);
}

/* ---- options ---- */

enum gcr_api_mode { GCR_API_LINK, GCR_API_DLSYM, GCR_API_PROCADDR };

static struct {
	enum gcr_api_mode api;
	bool ptds, pitch, small, async, vmm, managed, graph, wait, hold_after, linger, chunks;
	const char *module;
	unsigned long mib, buffers, threads, iters, write_mib, stack;
	int device;
} opt = {.api = GCR_API_LINK, .mib = 64, .buffers = 4, .threads = 2, .iters = 20, .write_mib = ~0UL};

static void gcr_usage(FILE *f)
{
	fputs("usage: gcr-testprog [--api link|dlsym|procaddr] [--ptds] [--module PATH]\n"
	      "         [--mib N] [--buffers K] [--pitch] [--small] [--async] [--vmm] [--managed]\n"
	      "         [--device N] [--threads T] [--iters I] [--graph] [--wait] [--hold-after] [--linger]\n"
	      "         [--chunks] [--write-mib W] [--stack BYTES]\n"
	      "--stack: set the context's stack limit and step with a kernel that uses local memory;\n"
	      "  the final check wants the limit unchanged (the shim lowers it while suspended and\n"
	      "  must put it back)\n"
	      "--chunks: the --mib buffers are 2 MiB chunks of known content; after DONE, stdin\n"
	      "  'mutate KIND COUNT SEED' (KIND: random indirect graph streams memset memcpy) and\n"
	      "  'verify' until 'check'. --write-mib W (implies --chunks): only the first W MiB are\n"
	      "  written, the rest zeroed (reserved, never written).\n",
	      f);
}

static unsigned long gcr_number(const char *s, unsigned long min, unsigned long max)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s != NULL ? s : "", &end, 10);
	if (s == NULL || errno != 0 || end == s || *end != '\0' || v < min || v > max) {
		fprintf(stderr, "gcr-testprog: bad number '%s'\n", s != NULL ? s : "");
		gcr_usage(stderr);
		exit(1);
	}
	return v;
}

static void gcr_options(int argc, char **argv)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--api") == 0 && v != NULL) {
			i++;
			if (strcmp(v, "link") == 0)
				opt.api = GCR_API_LINK;
			else if (strcmp(v, "dlsym") == 0)
				opt.api = GCR_API_DLSYM;
			else if (strcmp(v, "procaddr") == 0)
				opt.api = GCR_API_PROCADDR;
			else
				goto bad;
		} else if (strcmp(a, "--module") == 0 && v != NULL) {
			opt.module = argv[++i];
		} else if (strcmp(a, "--mib") == 0) {
			opt.mib = gcr_number(v, 1, 1UL << 20), i++;
		} else if (strcmp(a, "--buffers") == 0) {
			opt.buffers = gcr_number(v, 1, 4096), i++;
		} else if (strcmp(a, "--threads") == 0) {
			opt.threads = gcr_number(v, 1, GCR_MAX_THREADS), i++;
		} else if (strcmp(a, "--iters") == 0) {
			opt.iters = gcr_number(v, 0, 1000000), i++;
		} else if (strcmp(a, "--stack") == 0) {
			opt.stack = gcr_number(v, 1, 1UL << 20), i++;
		} else if (strcmp(a, "--device") == 0) {
			opt.device = (int)gcr_number(v, 0, 1023), i++;
		} else if (strcmp(a, "--ptds") == 0) {
			opt.ptds = true;
		} else if (strcmp(a, "--pitch") == 0) {
			opt.pitch = true;
		} else if (strcmp(a, "--small") == 0) {
			opt.small = true;
		} else if (strcmp(a, "--async") == 0) {
			opt.async = true;
		} else if (strcmp(a, "--vmm") == 0) {
			opt.vmm = true;
		} else if (strcmp(a, "--managed") == 0) {
			opt.managed = true;
		} else if (strcmp(a, "--graph") == 0) {
			opt.graph = true;
		} else if (strcmp(a, "--wait") == 0) {
			opt.wait = true;
		} else if (strcmp(a, "--hold-after") == 0) {
			opt.hold_after = true;
		} else if (strcmp(a, "--linger") == 0) {
			opt.linger = true;
		} else if (strcmp(a, "--chunks") == 0) {
			opt.chunks = true;
		} else if (strcmp(a, "--write-mib") == 0) {
			opt.write_mib = gcr_number(v, 0, 1UL << 20), i++;
			opt.chunks = true;
		} else if (strcmp(a, "--help") == 0) {
			gcr_usage(stdout);
			exit(0);
		} else {
			goto bad;
		}
	}
	if (opt.module == NULL) {
		fprintf(stderr, "gcr-testprog: --module PATH is required\n");
		gcr_usage(stderr);
		exit(1);
	}
	return;
bad:
	fprintf(stderr, "gcr-testprog: bad option '%s'\n", argv[i]);
	gcr_usage(stderr);
	exit(1);
}

/* ---- filling the entry-point table ---- */

static void gcr_missing(const char *what, const char *name)
{
	printf("ERROR %s(%s) CUDA_ERROR_NOT_FOUND\n", what, name);
	fflush(stdout);
	exit(2);
}

static void gcr_load_api(void)
{
	union {
		void *ptr;
		__typeof__(&cuGetProcAddress_v2) fn;
	} gpa;
	CUdriverProcAddressQueryResult status;
	cuuint64_t flags = opt.ptds ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
				    : CU_GET_PROC_ADDRESS_LEGACY_STREAM;
	void *h = NULL, *p;

	if (opt.api == GCR_API_LINK) {
#define GCR_LINK(name, sym, ptsym) api.name = opt.ptds ? &ptsym : &sym;
		GCR_API(GCR_LINK)
		return;
	}
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		printf("ERROR dlopen(libcuda.so.1) CUDA_ERROR_NOT_FOUND\n");
		fprintf(stderr, "gcr-testprog: %s\n", dlerror());
		exit(2);
	}
	if (opt.api == GCR_API_DLSYM) {
#define GCR_DLSYM(name, sym, ptsym)                                  \
	p = dlsym(h, opt.ptds ? #ptsym : #sym);                      \
	if (p == NULL)                                               \
		gcr_missing("dlsym", opt.ptds ? #ptsym : #sym);      \
	memcpy(&api.name, &p, sizeof(p));
		GCR_API(GCR_DLSYM)
		return;
	}
	/* As the CUDA runtime does: only the resolver by name, everything else through it. */
	gpa.ptr = dlsym(h, "cuGetProcAddress_v2");
	if (gpa.ptr == NULL)
		gcr_missing("dlsym", "cuGetProcAddress_v2");
#define GCR_PROCADDR(name, sym, ptsym)                                                  \
	p = NULL;                                                                       \
	if (gpa.fn(#name, &p, GCR_CUDA_VERSION, flags, &status) != CUDA_SUCCESS || p == NULL) \
		gcr_missing("cuGetProcAddress", #name);                                 \
	memcpy(&api.name, &p, sizeof(p));
	GCR_API(GCR_PROCADDR)
}

/* ---- the workload ---- */

enum gcr_buf_kind {
	GCR_BUF_ALLOC,
	GCR_BUF_PITCH,
	GCR_BUF_SMALL,
	GCR_BUF_ASYNC,
	GCR_BUF_VMM,
	GCR_BUF_MANAGED,
};

static const char *const gcr_kind_name[] = {"cuMemAlloc",      "cuMemAllocPitch", "small",
					    "cuMemAllocAsync", "vmm",             "cuMemAllocManaged"};

struct gcr_buf {
	enum gcr_buf_kind kind;
	CUdeviceptr ptr;
	uint64_t words; /* the whole allocation, rows and padding of a pitched one included */
	uint32_t seed;
	size_t pitch, width, height; /* pitched buffer: bytes, bytes, rows */
	bool chunked;                /* --chunks: a data buffer, its content kept per chunk */
};

struct gcr_thread {
	int index;
	pthread_t tid;
	CUstream stream;
	CUdeviceptr scratch, targets, table;
	uint32_t *h1, *h2, *h3; /* pinned host buffers of the round trip */
	uint32_t value;         /* what the indirect kernel adds */
	CUgraphExec *steps;     /* --graph: one captured graph per iteration */
	CUgraphExec common;
	CUgraph *step_graphs, common_graph;
};

static CUcontext gcr_ctx;
static size_t gcr_stack; /* the context's stack limit after set-up: checked at the end */
static CUfunction k_fill, k_step, k_check, k_indirect, k_check_const, k_step_table;
static struct gcr_buf *bufs;
static size_t nbufs;
static struct gcr_thread threads[GCR_MAX_THREADS];
static unsigned long long total_bytes;
static struct {
	CUdeviceptr base;
	size_t reserved, mapped, granularity;
	CUmemGenericAllocationHandle handles[2];
} vmm;

static unsigned int gcr_grid(uint64_t n)
{
	uint64_t g = (n + GCR_BLOCK - 1) / GCR_BLOCK;

	return g > GCR_MAX_GRID ? GCR_MAX_GRID : g == 0 ? 1 : (unsigned int)g;
}

static void gcr_launch(CUfunction f, uint64_t n, CUstream s, void **args)
{
	CU(cuLaunchKernel, f, gcr_grid(n), 1, 1, GCR_BLOCK, 1, 1, 0, s, args, NULL);
}

static void gcr_launch_fill(struct gcr_buf *b, CUstream s)
{
	void *args[] = {&b->ptr, &b->words, &b->seed};

	gcr_launch(k_fill, b->words, s, args);
}

static void gcr_launch_step(struct gcr_buf *b, uint32_t k, CUstream s)
{
	void *args[] = {&b->ptr, &b->words, &k};

	gcr_launch(k_step, b->words, s, args);
}

static struct gcr_buf *gcr_add(enum gcr_buf_kind kind, CUdeviceptr ptr, size_t bytes)
{
	struct gcr_buf *b;

	bufs = realloc(bufs, (nbufs + 1) * sizeof(*bufs));
	if (bufs == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	b = &bufs[nbufs];
	memset(b, 0, sizeof(*b));
	b->kind = kind;
	b->ptr = ptr;
	b->words = bytes / 4;
	b->seed = 0x9e37u + (uint32_t)nbufs * 7919u;
	nbufs++;
	return b;
}

static CUdeviceptr gcr_alloc(size_t bytes)
{
	CUdeviceptr p;

	CU(cuMemAlloc, &p, bytes);
	total_bytes += bytes;
	return p;
}

/* An application-owned VMM segment, as PyTorch's expandable segments: a reservation twice the
 * size, two physical handles mapped back to back at its start, read-write for the device. */
static void gcr_alloc_vmm(CUdevice dev)
{
	CUmemAllocationProp prop = {0};
	CUmemAccessDesc access = {0};
	size_t half;
	int i;

	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	CU(cuMemGetAllocationGranularity, &vmm.granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	half = vmm.granularity;
	vmm.mapped = 2 * half;
	vmm.reserved = 2 * vmm.mapped;
	CU(cuMemAddressReserve, &vmm.base, vmm.reserved, 0, 0, 0);
	for (i = 0; i < 2; i++) {
		CU(cuMemCreate, &vmm.handles[i], half, &prop, 0);
		CU(cuMemMap, vmm.base + (size_t)i * half, half, 0, vmm.handles[i], 0);
	}
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	CU(cuMemSetAccess, vmm.base, vmm.mapped, &access, 1);
	gcr_add(GCR_BUF_VMM, vmm.base, vmm.mapped);
	total_bytes += vmm.mapped;
}

static void gcr_alloc_buffers(CUdevice dev)
{
	size_t each = ((size_t)opt.mib << 20) / opt.buffers / 4 * 4;
	CUdeviceptr p;
	struct gcr_buf *b;
	size_t pitch;
	unsigned long i;

	if (opt.chunks)
		each = each / ((size_t)2 << 20) * ((size_t)2 << 20);
	if (each == 0)
		each = opt.chunks ? (size_t)2 << 20 : 4;
	for (i = 0; i < opt.buffers; i++)
		gcr_add(GCR_BUF_ALLOC, gcr_alloc(each), each)->chunked = opt.chunks;
	if (opt.pitch) {
		/* 1000 words wide: the rows get padding the check must cover too. */
		CU(cuMemAllocPitch, &p, &pitch, 4000, 257, 4);
		b = gcr_add(GCR_BUF_PITCH, p, pitch * 257);
		b->pitch = pitch;
		b->width = 4000;
		b->height = 257;
		total_bytes += pitch * 257;
	}
	for (i = 0; opt.small && i < GCR_SMALL_BUFFERS; i++)
		gcr_add(GCR_BUF_SMALL, gcr_alloc(GCR_SMALL_BYTES), GCR_SMALL_BYTES);
	if (opt.async) {
		CU(cuMemAllocAsync, &p, (size_t)1 << 20, NULL);
		CU(cuStreamSynchronize, NULL);
		gcr_add(GCR_BUF_ASYNC, p, (size_t)1 << 20);
		total_bytes += (size_t)1 << 20;
	}
	if (opt.vmm)
		gcr_alloc_vmm(dev);
	if (opt.managed) {
		CU(cuMemAllocManaged, &p, (size_t)1 << 20, CU_MEM_ATTACH_GLOBAL);
		gcr_add(GCR_BUF_MANAGED, p, (size_t)1 << 20);
		total_bytes += (size_t)1 << 20;
	}
}

/* The scratch round trip and the indirect writes: the same every iteration, so a graph of
 * them can be replayed. */
static void gcr_enqueue_common(struct gcr_thread *t)
{
	const size_t bytes = GCR_SCRATCH_WORDS * 4;
	uint32_t count = GCR_TARGETS;
	void *args[] = {&t->table, &count, &t->value};

	CU(cuMemsetD32Async, t->scratch, 0x5a5a0000u + (uint32_t)t->index, GCR_SCRATCH_WORDS, t->stream);
	CU(cuMemcpyDtoHAsync, t->h1, t->scratch, bytes, t->stream);
	CU(cuMemcpyHtoDAsync, t->scratch, t->h2, bytes, t->stream);
	CU(cuMemcpyDtoHAsync, t->h3, t->scratch, bytes, t->stream);
	CU(cuLaunchKernel, k_indirect, 1, 1, 1, 1, 1, 1, 0, t->stream, args, NULL);
}

static void gcr_enqueue_steps(struct gcr_thread *t, uint32_t k)
{
	size_t i;

	if (opt.chunks) /* the data changes only by the mutations */
		return;
	for (i = (size_t)t->index; i < nbufs; i += opt.threads)
		gcr_launch_step(&bufs[i], k, t->stream);
}

static void gcr_capture(struct gcr_thread *t, CUgraph *graph, CUgraphExec *exec, int k)
{
	CU(cuStreamBeginCapture, t->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
	if (k < 0)
		gcr_enqueue_common(t);
	else
		gcr_enqueue_steps(t, (uint32_t)k);
	CU(cuStreamEndCapture, t->stream, graph);
	CU(cuGraphInstantiateWithFlags, exec, *graph, 0);
}

static void gcr_setup_thread(struct gcr_thread *t)
{
	uint64_t table[GCR_TARGETS];
	unsigned long k;
	int j;

	CU(cuStreamCreate, &t->stream, CU_STREAM_NON_BLOCKING);
	t->scratch = gcr_alloc(GCR_SCRATCH_WORDS * 4);
	t->targets = gcr_alloc(GCR_TARGET_BYTES);
	t->table = gcr_alloc(sizeof(table));
	t->value = 3u + (uint32_t)t->index;
	CU(cuMemAllocHost, (void **)&t->h1, GCR_SCRATCH_WORDS * 4);
	CU(cuMemAllocHost, (void **)&t->h2, GCR_SCRATCH_WORDS * 4);
	CU(cuMemAllocHost, (void **)&t->h3, GCR_SCRATCH_WORDS * 4);
	for (j = 0; j < GCR_SCRATCH_WORDS; j++)
		t->h2[j] = gcr_pattern(0xabcu + (uint32_t)t->index, (uint64_t)j);
	CU(cuMemsetD32, t->targets, 0, GCR_TARGET_BYTES / 4);
	for (j = 0; j < GCR_TARGETS; j++)
		table[j] = t->targets + (uint64_t)j * (GCR_TARGET_BYTES / GCR_TARGETS);
	CU(cuMemcpyHtoD, t->table, table, sizeof(table));
	if (!opt.graph)
		return;
	if (opt.chunks) {
		gcr_capture(t, &t->common_graph, &t->common, -1);
		return;
	}
	t->steps = calloc(opt.iters + 1, sizeof(*t->steps));
	t->step_graphs = calloc(opt.iters + 1, sizeof(*t->step_graphs));
	if (t->steps == NULL || t->step_graphs == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	for (k = 0; k < opt.iters; k++)
		gcr_capture(t, &t->step_graphs[k], &t->steps[k], (int)k);
	gcr_capture(t, &t->common_graph, &t->common, -1);
}

static void gcr_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void gcr_fail(const char *fmt, ...)
{
	va_list ap;

	printf("RESULT FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

static void *gcr_thread_main(void *arg)
{
	struct gcr_thread *t = arg;
	unsigned long k;
	int j;

	CU(cuCtxSetCurrent, gcr_ctx);
	for (k = 0; k < opt.iters; k++) {
		memset(t->h1, 0, GCR_SCRATCH_WORDS * 4);
		memset(t->h3, 0, GCR_SCRATCH_WORDS * 4);
		if (opt.graph) {
			if (!opt.chunks)
				CU(cuGraphLaunch, t->steps[k], t->stream);
			CU(cuGraphLaunch, t->common, t->stream);
		} else {
			gcr_enqueue_steps(t, (uint32_t)k);
			gcr_enqueue_common(t);
		}
		CU(cuStreamSynchronize, t->stream);
		for (j = 0; j < GCR_SCRATCH_WORDS; j++) {
			if (t->h1[j] != 0x5a5a0000u + (uint32_t)t->index)
				gcr_fail("thread %d iteration %lu: memset/DtoH word %d is %#x", t->index, k, j,
					 t->h1[j]);
			if (t->h3[j] != t->h2[j])
				gcr_fail("thread %d iteration %lu: HtoD/DtoH word %d is %#x, not %#x",
					 t->index, k, j, t->h3[j], t->h2[j]);
		}
		if (t->index == 0) {
			printf("ITER %lu\n", k + 1);
			fflush(stdout);
		}
	}
	return NULL;
}

/* ---- chunk mode (--chunks): the data buffers as 2 MiB chunks of known content ----
 *
 * What incremental suspend must not miss. Each chunk's expected content is a small
 * descriptor: a pattern (gcr_expected(seed, i, kfirst, nsteps) at word i of the chunk) or a
 * constant word, plus sorted single-word edits on top. Mutations (stdin "mutate KIND COUNT
 * SEED" after DONE) change chunks on the device by one mechanism each and the descriptors on
 * the host to match; "verify" checks every chunk bit-exact (the GPU compares edit-free chunks
 * with their descriptor, the host reads back and compares chunks with edits). A chunk counts
 * as changed when its content differs, word by word, from what it held at the last verify
 * (a harness verifies right after each resume, so that is what the last suspend saved). */

#define GCR_CHUNK ((uint64_t)2 << 20) /* bytes: the shim's digest chunk */
#define GCR_CHUNK_WORDS (GCR_CHUNK / 4)
#define GCR_MUT_MAX 1024        /* chunks one mutation may write through a device-side table */
#define GCR_CMP_WORDS 4096      /* words compared per step when looking for a difference */

struct gcr_edit {
	uint32_t word, value;
};

struct gcr_chunk {
	CUdeviceptr ptr;
	bool is_const;
	uint32_t value;                /* is_const: every word */
	uint32_t seed, kfirst, nsteps; /* otherwise: gcr_expected(seed, i, kfirst, nsteps) */
	struct gcr_edit *edits;        /* sorted by word */
	size_t nedits, cap;
	struct gcr_chunk *saved; /* content at the last verify, kept once the chunk is touched */
};

static struct {
	struct gcr_chunk *c;
	size_t n;
	CUdeviceptr counters;         /* one mismatch count per chunk */
	CUdeviceptr table, graph_args; /* device-side pointer tables */
	uint64_t *graph_host;          /* pinned: what the graph's copy node reads at each replay */
	uint32_t *staging;             /* pinned: one chunk, for host-to-device writes */
	CUstream stream;
	CUgraph graph;
	CUgraphExec exec;
	uint64_t rng;
} ck;

static uint64_t gcr_rand(void)
{
	uint64_t z = (ck.rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void *gcr_xrealloc(void *p, size_t n)
{
	p = realloc(p, n);
	if (p == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	return p;
}

/* Index of the first edit at or after word w. */
static size_t gcr_edit_find(const struct gcr_chunk *c, uint32_t w)
{
	size_t lo = 0, hi = c->nedits;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (c->edits[mid].word < w)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Expected words [first, first + n) of chunk c. */
static void gcr_chunk_words(const struct gcr_chunk *c, uint32_t first, uint32_t n, uint32_t *out)
{
	size_t e;
	uint32_t i;

	for (i = 0; i < n; i++)
		out[i] = c->is_const ? c->value : gcr_expected(c->seed, first + i, c->kfirst, c->nsteps);
	for (e = gcr_edit_find(c, first); e < c->nedits && c->edits[e].word < first + n; e++)
		out[c->edits[e].word - first] = c->edits[e].value;
}

static uint32_t gcr_chunk_word(const struct gcr_chunk *c, uint32_t w)
{
	uint32_t v;

	gcr_chunk_words(c, w, 1, &v);
	return v;
}

/* Whether the two descriptors give different content anywhere (exact; stops at the first). */
static bool gcr_chunk_differs(const struct gcr_chunk *a, const struct gcr_chunk *b)
{
	static uint32_t wa[GCR_CMP_WORDS], wb[GCR_CMP_WORDS];
	uint32_t w;

	if (a->nedits == 0 && b->nedits == 0 && a->is_const == b->is_const &&
	    (a->is_const ? a->value == b->value
			 : a->seed == b->seed && a->kfirst == b->kfirst && a->nsteps == b->nsteps))
		return false;
	for (w = 0; w < GCR_CHUNK_WORDS; w += GCR_CMP_WORDS) {
		gcr_chunk_words(a, w, GCR_CMP_WORDS, wa);
		gcr_chunk_words(b, w, GCR_CMP_WORDS, wb);
		if (memcmp(wa, wb, sizeof(wa)) != 0)
			return true;
	}
	return false;
}

static bool gcr_chunk_zero(const struct gcr_chunk *c)
{
	size_t e;

	if (!c->is_const || c->value != 0)
		return false; /* a pattern chunk is all zero with probability about 2^-(2^24) */
	for (e = 0; e < c->nedits; e++)
		if (c->edits[e].value != 0)
			return false;
	return true;
}

static void gcr_chunk_copy(struct gcr_chunk *dst, const struct gcr_chunk *src)
{
	struct gcr_edit *edits = dst->edits;
	size_t cap = dst->cap;
	struct gcr_chunk *saved = dst->saved;
	CUdeviceptr ptr = dst->ptr;

	if (cap < src->nedits) {
		cap = src->nedits;
		edits = gcr_xrealloc(edits, cap * sizeof(*edits));
	}
	*dst = *src;
	dst->edits = edits;
	dst->cap = cap;
	dst->saved = saved;
	dst->ptr = ptr;
	if (src->nedits > 0)
		memcpy(dst->edits, src->edits, src->nedits * sizeof(*edits));
}

/* Before the first change since the last verify, keep what the chunk held. */
static void gcr_chunk_touch(struct gcr_chunk *c)
{
	if (c->saved != NULL)
		return;
	c->saved = calloc(1, sizeof(*c->saved));
	if (c->saved == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	gcr_chunk_copy(c->saved, c);
	c->saved->saved = NULL;
}

static void gcr_chunk_set_pattern(struct gcr_chunk *c, uint32_t seed)
{
	gcr_chunk_touch(c);
	c->is_const = false;
	c->seed = seed;
	c->kfirst = c->nsteps = 0;
	c->nedits = 0;
}

static void gcr_chunk_set_const(struct gcr_chunk *c, uint32_t value)
{
	gcr_chunk_touch(c);
	c->is_const = true;
	c->value = value;
	c->nedits = 0;
}

static void gcr_chunk_edit(struct gcr_chunk *c, uint32_t w, uint32_t value)
{
	size_t e = gcr_edit_find(c, w);

	gcr_chunk_touch(c);
	if (e < c->nedits && c->edits[e].word == w) {
		c->edits[e].value = value;
		return;
	}
	if (c->nedits == c->cap) {
		c->cap = c->cap ? 2 * c->cap : 16;
		c->edits = gcr_xrealloc(c->edits, c->cap * sizeof(*c->edits));
	}
	memmove(&c->edits[e + 1], &c->edits[e], (c->nedits - e) * sizeof(*c->edits));
	c->edits[e] = (struct gcr_edit){w, value};
	c->nedits++;
}

/* The k the next whole-chunk step must use for the descriptor to stay one pattern. */
static uint32_t gcr_chunk_next_k(const struct gcr_chunk *c)
{
	uint32_t k;

	if (!c->is_const)
		return c->nsteps > 0 ? c->kfirst + c->nsteps : (uint32_t)gcr_rand();
	for (k = (uint32_t)gcr_rand();; k++)
		if (gcr_step_value(c->value, k) != c->value) /* else the constant would not change */
			return k;
}

static void gcr_chunk_step(struct gcr_chunk *c, uint32_t k)
{
	size_t e;

	gcr_chunk_touch(c);
	if (c->is_const) {
		c->value = gcr_step_value(c->value, k);
	} else {
		if (c->nsteps == 0)
			c->kfirst = k;
		c->nsteps++;
	}
	for (e = 0; e < c->nedits; e++)
		c->edits[e].value = gcr_step_value(c->edits[e].value, k);
}

static uint32_t gcr_chunk_seed(uint64_t index, uint32_t generation)
{
	return gcr_pattern(0x5eedu + generation, index) | 1u;
}

static void gcr_chunks_alloc(void)
{
	size_t i, j, k = 0;
	uint64_t written = (uint64_t)opt.write_mib << 20;

	for (i = 0; i < nbufs; i++)
		if (bufs[i].chunked)
			ck.n += bufs[i].words * 4 / GCR_CHUNK;
	ck.c = calloc(ck.n, sizeof(*ck.c));
	if (ck.c == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	for (i = 0; i < nbufs; i++) {
		if (!bufs[i].chunked)
			continue;
		/* cuMemAlloc memory is not zeroed on a GPU: "reserved, never written" is zero as
		 * frameworks see it (they zero on allocation or never read it). */
		CU(cuMemsetD8, bufs[i].ptr, 0, bufs[i].words * 4);
		for (j = 0; j < bufs[i].words * 4 / GCR_CHUNK; j++, k++) {
			struct gcr_chunk *c = &ck.c[k];
			uint64_t words = GCR_CHUNK_WORDS;

			c->ptr = bufs[i].ptr + j * GCR_CHUNK;
			c->is_const = true;
			if ((uint64_t)k * GCR_CHUNK >= written)
				continue;
			c->is_const = false;
			c->seed = gcr_chunk_seed(k, 0);
			{
				void *args[] = {&c->ptr, &words, &c->seed};

				gcr_launch(k_fill, words, NULL, args);
			}
		}
	}
	CU(cuMemAlloc, &ck.counters, ck.n * sizeof(unsigned long long));
	CU(cuMemsetD8, ck.counters, 0, ck.n * sizeof(unsigned long long));
	CU(cuStreamSynchronize, NULL);
}

/* Device-side tables and the graph the mutations use: a copy from pinned host memory into
 * a device table, then gcr_step_table on it, captured once and replayed. */
static void gcr_chunks_setup_mutations(void)
{
	size_t args_bytes = (1 + 3 * GCR_MUT_MAX) * sizeof(uint64_t);
	uint64_t words = GCR_CHUNK_WORDS;
	void *args[] = {&ck.graph_args};

	CU(cuMemAlloc, &ck.table, GCR_MUT_MAX * sizeof(uint64_t));
	CU(cuMemAlloc, &ck.graph_args, args_bytes);
	CU(cuMemAllocHost, (void **)&ck.graph_host, args_bytes);
	CU(cuMemAllocHost, (void **)&ck.staging, GCR_CHUNK);
	memset(ck.graph_host, 0, args_bytes);
	CU(cuStreamCreate, &ck.stream, CU_STREAM_NON_BLOCKING);
	CU(cuStreamBeginCapture, ck.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
	CU(cuMemcpyHtoDAsync, ck.graph_args, ck.graph_host, args_bytes, ck.stream);
	CU(cuLaunchKernel, k_step_table, gcr_grid(words), 1, 1, GCR_BLOCK, 1, 1, 0, ck.stream, args, NULL);
	CU(cuStreamEndCapture, ck.stream, &ck.graph);
	CU(cuGraphInstantiateWithFlags, &ck.exec, ck.graph, 0);
}

/* COUNT distinct chunks, seeded (a partial Fisher-Yates shuffle). */
static size_t gcr_pick(size_t count, size_t *out)
{
	size_t *all = malloc(ck.n * sizeof(*all)), i;

	if (all == NULL) {
		perror("gcr-testprog");
		exit(1);
	}
	if (count > ck.n)
		count = ck.n;
	for (i = 0; i < ck.n; i++)
		all[i] = i;
	for (i = 0; i < count; i++) {
		size_t j = i + (size_t)(gcr_rand() % (ck.n - i)), t = all[i];

		all[i] = all[j];
		all[j] = t;
		out[i] = all[i];
	}
	free(all);
	return count;
}

static void gcr_op_fill(struct gcr_chunk *c, CUstream s, uint32_t seed)
{
	uint64_t words = GCR_CHUNK_WORDS;
	void *args[] = {&c->ptr, &words, &seed};

	if (!c->is_const && c->seed == seed && c->nsteps == 0 && c->nedits == 0)
		seed += 2;
	gcr_launch(k_fill, words, s, args);
	gcr_chunk_set_pattern(c, seed);
}

static void gcr_op_step(struct gcr_chunk *c, CUstream s)
{
	uint64_t words = GCR_CHUNK_WORDS;
	uint32_t k = gcr_chunk_next_k(c);
	void *args[] = {&c->ptr, &words, &k};

	gcr_launch(k_step, words, s, args);
	gcr_chunk_step(c, k);
}

/* One word set to a different value, by a 4-byte host-to-device copy. */
static void gcr_op_poke(struct gcr_chunk *c)
{
	uint32_t w = (uint32_t)(gcr_rand() % GCR_CHUNK_WORDS);
	uint32_t v = gcr_chunk_word(c, w) ^ ((uint32_t)gcr_rand() | 1u);

	CU(cuMemcpyHtoD, c->ptr + (uint64_t)w * 4, &v, 4);
	gcr_chunk_edit(c, w, v);
}

/* n words from word w set by cuMemsetD32 (n < chunk) or cuMemsetD8 (bytes, value replicated). */
static void gcr_op_memset_range(struct gcr_chunk *c, uint32_t w, uint32_t n, bool bytes)
{
	uint32_t v = (uint32_t)gcr_rand(), i;

	if (bytes)
		v = (v & 0xffu) * 0x01010101u;
	if (v == gcr_chunk_word(c, w)) /* the first word at least must change */
		v ^= bytes ? 0x01010101u : 1u;
	if (bytes)
		CU(cuMemsetD8, c->ptr + (uint64_t)w * 4, (unsigned char)v, (size_t)n * 4);
	else
		CU(cuMemsetD32, c->ptr + (uint64_t)w * 4, v, n);
	if (w == 0 && n == GCR_CHUNK_WORDS) {
		gcr_chunk_set_const(c, v);
		return;
	}
	for (i = 0; i < n; i++)
		gcr_chunk_edit(c, w + i, v);
}

static uint32_t gcr_rand_range_start(uint32_t n)
{
	return (uint32_t)(gcr_rand() % (GCR_CHUNK_WORDS - n + 1));
}

/* Writes through a table of device pointers read from device memory (gcr_indirect). */
static void gcr_mut_indirect(const size_t *pick, size_t n)
{
	uint64_t ptrs[GCR_MUT_MAX];
	uint32_t value = (uint32_t)gcr_rand() | 1u, count = (uint32_t)n;
	void *args[] = {&ck.table, &count, &value};
	size_t i;

	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]];
		uint32_t w = (uint32_t)(gcr_rand() % GCR_CHUNK_WORDS);

		ptrs[i] = c->ptr + (uint64_t)w * 4;
		gcr_chunk_edit(c, w, gcr_chunk_word(c, w) + value);
	}
	CU(cuMemcpyHtoD, ck.table, ptrs, n * sizeof(uint64_t));
	CU(cuLaunchKernel, k_indirect, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL);
	CU(cuStreamSynchronize, NULL);
}

/* One replay of the graph captured at start: its copy node takes the table from pinned host
 * memory, its kernel steps every chunk the table names. */
static void gcr_mut_graph(const size_t *pick, size_t n)
{
	size_t i;

	ck.graph_host[0] = n;
	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]];
		uint32_t k = gcr_chunk_next_k(c);

		ck.graph_host[1 + 3 * i] = c->ptr;
		ck.graph_host[2 + 3 * i] = GCR_CHUNK_WORDS;
		ck.graph_host[3 + 3 * i] = k;
		gcr_chunk_step(c, k);
	}
	CU(cuGraphLaunch, ck.exec, ck.stream);
	CU(cuStreamSynchronize, ck.stream);
}

struct gcr_mut_job {
	struct gcr_thread *t;
	const size_t *pick;
	size_t n, stride;
	uint32_t *seeds, *values; /* per picked chunk, chosen by the main thread */
	uint32_t *ks;
	pthread_barrier_t *start;
};

/* A thread's share of a "streams" mutation on its own stream: fill, step or set whole chunks. */
static void *gcr_mut_streams_thread(void *arg)
{
	struct gcr_mut_job *j = arg;
	uint64_t words = GCR_CHUNK_WORDS;
	size_t i;

	CU(cuCtxSetCurrent, gcr_ctx);
	pthread_barrier_wait(j->start);
	for (i = (size_t)j->t->index; i < j->n; i += j->stride) {
		CUdeviceptr p = ck.c[j->pick[i]].ptr;

		if (i % 3 == 0) {
			void *args[] = {&p, &words, &j->seeds[i]};

			gcr_launch(k_fill, words, j->t->stream, args);
		} else if (i % 3 == 1) {
			void *args[] = {&p, &words, &j->ks[i]};

			gcr_launch(k_step, words, j->t->stream, args);
		} else {
			CU(cuMemsetD32Async, p, j->values[i], GCR_CHUNK_WORDS, j->t->stream);
		}
	}
	CU(cuStreamSynchronize, j->t->stream);
	return NULL;
}

static void gcr_mut_streams(const size_t *pick, size_t n)
{
	struct gcr_mut_job jobs[GCR_MAX_THREADS];
	uint32_t *seeds = calloc(n + 1, 4), *values = calloc(n + 1, 4), *ks = calloc(n + 1, 4);
	pthread_barrier_t start;
	unsigned long t;
	size_t i;

	if (seeds == NULL || values == NULL || ks == NULL)
		gcr_fail("out of host memory");
	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]];

		if (i % 3 == 0) {
			seeds[i] = (uint32_t)gcr_rand() | 1u;
			if (!c->is_const && c->seed == seeds[i])
				seeds[i] += 2;
			gcr_chunk_set_pattern(c, seeds[i]);
		} else if (i % 3 == 1) {
			ks[i] = gcr_chunk_next_k(c);
			gcr_chunk_step(c, ks[i]);
		} else {
			values[i] = (uint32_t)gcr_rand() | 1u;
			if (c->is_const && c->value == values[i])
				values[i] += 2;
			gcr_chunk_set_const(c, values[i]);
		}
	}
	if (pthread_barrier_init(&start, NULL, (unsigned)opt.threads) != 0)
		gcr_fail("pthread_barrier_init");
	for (t = 0; t < opt.threads; t++) {
		jobs[t] = (struct gcr_mut_job){&threads[t], pick, n, opt.threads, seeds, values, ks, &start};
		if (pthread_create(&threads[t].tid, NULL, gcr_mut_streams_thread, &jobs[t]) != 0)
			gcr_fail("pthread_create");
	}
	for (t = 0; t < opt.threads; t++)
		pthread_join(threads[t].tid, NULL);
	pthread_barrier_destroy(&start);
	free(seeds);
	free(values);
	free(ks);
}

/* Whole-chunk cuMemsetD32, part of a chunk by cuMemsetD8, and whole chunks to zero in turn. */
static void gcr_mut_memset(const size_t *pick, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]];

		if (i % 3 == 0) {
			gcr_op_memset_range(c, 0, GCR_CHUNK_WORDS, false);
		} else if (i % 3 == 1) {
			uint32_t len = 64 + (uint32_t)(gcr_rand() % 4096);

			gcr_op_memset_range(c, gcr_rand_range_start(len), len, true);
		} else if (gcr_chunk_zero(c)) {
			gcr_op_memset_range(c, 0, GCR_CHUNK_WORDS, false);
		} else {
			CU(cuMemsetD8, c->ptr, 0, GCR_CHUNK);
			gcr_chunk_set_const(c, 0);
		}
	}
}

/* Device-to-device copies of whole chunks from chunks that differ, whole chunks written from
 * the host, and part of a chunk written from the host, in turn. */
static void gcr_mut_memcpy(const size_t *pick, size_t n)
{
	size_t i, tries;

	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]], *src = NULL;
		uint32_t w, len, j;

		switch (i % 3) {
		case 0:
			for (tries = 0; tries < 64 && src == NULL; tries++) {
				src = &ck.c[gcr_rand() % ck.n];
				if (src == c || !gcr_chunk_differs(src, c))
					src = NULL;
			}
			if (src != NULL) {
				CU(cuMemcpyDtoD, c->ptr, src->ptr, GCR_CHUNK);
				gcr_chunk_touch(c);
				gcr_chunk_copy(c, src);
				break;
			}
			/* every other chunk holds the same: write it from the host instead */
			/* fall through */
		case 1: {
			uint32_t seed = (uint32_t)gcr_rand() | 1u;

			if (!c->is_const && c->seed == seed)
				seed += 2;
			for (j = 0; j < GCR_CHUNK_WORDS; j++)
				ck.staging[j] = gcr_pattern(seed, j);
			CU(cuMemcpyHtoD, c->ptr, ck.staging, GCR_CHUNK);
			gcr_chunk_set_pattern(c, seed);
			break;
		}
		default:
			len = 1 + (uint32_t)(gcr_rand() % 2048);
			w = gcr_rand_range_start(len);
			for (j = 0; j < len; j++) {
				ck.staging[j] = (uint32_t)gcr_rand();
				if (j == 0 && ck.staging[0] == gcr_chunk_word(c, w))
					ck.staging[0] ^= 1u;
			}
			CU(cuMemcpyHtoD, c->ptr + (uint64_t)w * 4, ck.staging, (size_t)len * 4);
			for (j = 0; j < len; j++)
				gcr_chunk_edit(c, w + j, ck.staging[j]);
		}
	}
}

/* Chunks picked at random, each changed one way picked at random: rewritten by a kernel,
 * stepped by a kernel, one word written from the host, or a few words set. */
static void gcr_mut_random(const size_t *pick, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		struct gcr_chunk *c = &ck.c[pick[i]];
		uint32_t len;

		switch (gcr_rand() % 4) {
		case 0: gcr_op_fill(c, NULL, (uint32_t)gcr_rand() | 1u); break;
		case 1: gcr_op_step(c, NULL); break;
		case 2: gcr_op_poke(c); break;
		default:
			len = 1 + (uint32_t)(gcr_rand() % 256);
			gcr_op_memset_range(c, gcr_rand_range_start(len), len, false);
		}
	}
	CU(cuStreamSynchronize, NULL);
}

/* Chunks whose content differs from the last verify, and how many of them are all zero. */
static size_t gcr_chunks_changed(size_t *zero)
{
	size_t i, n = 0;

	*zero = 0;
	for (i = 0; i < ck.n; i++) {
		if (ck.c[i].saved == NULL || !gcr_chunk_differs(ck.c[i].saved, &ck.c[i]))
			continue;
		n++;
		*zero += gcr_chunk_zero(&ck.c[i]);
	}
	return n;
}

static uint64_t gcr_chunks_zero_bytes(void)
{
	uint64_t z = 0;
	size_t i;

	for (i = 0; i < ck.n; i++)
		z += gcr_chunk_zero(&ck.c[i]) ? GCR_CHUNK : 0;
	return z;
}

static const struct {
	const char *name;
	void (*fn)(const size_t *pick, size_t n);
} gcr_mutations[] = {
	{"random", gcr_mut_random},   {"indirect", gcr_mut_indirect}, {"graph", gcr_mut_graph},
	{"streams", gcr_mut_streams}, {"memset", gcr_mut_memset},     {"memcpy", gcr_mut_memcpy},
};

/* "mutate KIND COUNT SEED" -> "MUTATED kind=K targets=T changed=M zero=Z zero_bytes=B":
 * T chunks written now; M chunks differ from the last verify, Z of them all zero now; B bytes
 * of data chunks are all zero now. */
static void gcr_mutate(const char *kind, unsigned long count, unsigned long long seed)
{
	size_t pick[GCR_MUT_MAX], n, zero, changed, i;

	for (i = 0; i < sizeof(gcr_mutations) / sizeof(gcr_mutations[0]); i++)
		if (strcmp(gcr_mutations[i].name, kind) == 0)
			break;
	if (i == sizeof(gcr_mutations) / sizeof(gcr_mutations[0]) || count == 0 || count > GCR_MUT_MAX) {
		printf("ERROR mutate %s %lu: unknown kind or count not in 1..%d\n", kind, count, GCR_MUT_MAX);
		return;
	}
	ck.rng = seed * 0x2545f4914f6cdd1dull + i;
	n = gcr_pick(count, pick);
	gcr_mutations[i].fn(pick, n);
	CU(cuStreamSynchronize, NULL);
	changed = gcr_chunks_changed(&zero);
	printf("MUTATED kind=%s targets=%zu changed=%zu zero=%zu zero_bytes=%" PRIu64 "\n", kind, n, changed,
	       zero, gcr_chunks_zero_bytes());
}

/* Every chunk bit-exact: edit-free chunks by a GPU compare (one counter each, one readback),
 * chunks with edits, and the first and the last, read back and compared on the host. The
 * counters are zero again afterwards, and what every chunk holds now is the new reference. */
static void gcr_chunks_verify(void)
{
	unsigned long long *bad = calloc(ck.n, sizeof(*bad));
	uint32_t *host = malloc(GCR_CHUNK), *want = malloc(GCR_CHUNK);
	size_t i, w;

	if (bad == NULL || host == NULL || want == NULL)
		gcr_fail("out of host memory");
	for (i = 0; i < ck.n; i++) {
		struct gcr_chunk *c = &ck.c[i];
		CUdeviceptr counter = ck.counters + i * sizeof(unsigned long long);
		uint64_t words = GCR_CHUNK_WORDS;

		if (c->nedits > 0)
			continue;
		if (c->is_const) {
			void *args[] = {&c->ptr, &words, &c->value, &counter};

			gcr_launch(k_check_const, words, NULL, args);
		} else {
			void *args[] = {&c->ptr, &words, &c->seed, &c->kfirst, &c->nsteps, &counter};

			gcr_launch(k_check, words, NULL, args);
		}
	}
	CU(cuStreamSynchronize, NULL);
	CU(cuMemcpyDtoH, bad, ck.counters, ck.n * sizeof(*bad));
	CU(cuMemsetD8, ck.counters, 0, ck.n * sizeof(*bad));
	for (i = 0; i < ck.n; i++)
		if (bad[i] != 0)
			gcr_fail("chunk %zu: %llu of %" PRIu64 " words wrong (%s)", i, bad[i], GCR_CHUNK_WORDS,
				 ck.c[i].is_const ? "constant" : "pattern");
	for (i = 0; i < ck.n; i++) {
		struct gcr_chunk *c = &ck.c[i];

		if (c->nedits == 0 && i != 0 && i != ck.n - 1)
			continue;
		CU(cuMemcpyDtoH, host, c->ptr, GCR_CHUNK);
		gcr_chunk_words(c, 0, GCR_CHUNK_WORDS, want);
		for (w = 0; w < GCR_CHUNK_WORDS; w++)
			if (host[w] != want[w])
				gcr_fail("chunk %zu: host readback of word %zu is %#x, not %#x (%zu edits)", i, w,
					 host[w], want[w], c->nedits);
	}
	for (i = 0; i < ck.n; i++) {
		if (ck.c[i].saved != NULL) {
			free(ck.c[i].saved->edits);
			free(ck.c[i].saved);
			ck.c[i].saved = NULL;
		}
	}
	free(bad);
	free(host);
	free(want);
}

static void gcr_chunks_free(void)
{
	size_t i;

	for (i = 0; i < ck.n; i++) {
		if (ck.c[i].saved != NULL)
			free(ck.c[i].saved->edits);
		free(ck.c[i].saved);
		free(ck.c[i].edits);
	}
	free(ck.c);
	CU(cuMemFree, ck.counters);
	if (ck.exec != NULL) {
		CU(cuGraphExecDestroy, ck.exec);
		CU(cuGraphDestroy, ck.graph);
		CU(cuStreamDestroy, ck.stream);
		CU(cuMemFree, ck.table);
		CU(cuMemFree, ck.graph_args);
		CU(cuMemFreeHost, ck.graph_host);
		CU(cuMemFreeHost, ck.staging);
	}
}

/* After DONE in chunk mode: mutations and checks until "check" (or end of input). */
static void gcr_chunks_commands(void)
{
	char line[256], kind[32];
	unsigned long count;
	unsigned long long seed;

	while (fgets(line, sizeof(line), stdin) != NULL) {
		line[strcspn(line, "\r\n")] = '\0';
		if (strcmp(line, "check") == 0)
			return;
		if (strcmp(line, "verify") == 0) {
			gcr_chunks_verify();
			printf("VERIFIED chunks=%zu zero_bytes=%" PRIu64 "\n", ck.n, gcr_chunks_zero_bytes());
		} else if (sscanf(line, "mutate %31s %lu %llu", kind, &count, &seed) == 3) {
			gcr_mutate(kind, count, seed);
		} else if (line[0] != '\0') {
			printf("ERROR unknown command '%s'\n", line);
		}
	}
	fprintf(stderr, "gcr-testprog: stdin closed while waiting for 'check'\n");
	exit(1);
}

/* ---- verification ---- */

static void gcr_verify_buffer(size_t i, CUdeviceptr counter)
{
	struct gcr_buf *b = &bufs[i];
	unsigned long long bad = 0;
	uint32_t kfirst = 0, nsteps = opt.chunks ? 0 : (uint32_t)opt.iters;
	void *args[] = {&b->ptr, &b->words, &b->seed, &kfirst, &nsteps, &counter};
	uint32_t *host;
	uint64_t n, first, j;

	CU(cuMemsetD32, counter, 0, 2);
	gcr_launch(k_check, b->words, NULL, args);
	CU(cuStreamSynchronize, NULL);
	CU(cuMemcpyDtoH, &bad, counter, sizeof(bad));
	if (bad != 0)
		gcr_fail("buffer %zu (%s): %llu of %" PRIu64 " words wrong", i, gcr_kind_name[b->kind],
			 bad, b->words);
	/* The same on the host, from both ends, in case the device-side check is broken. */
	n = b->words < GCR_SAMPLE_WORDS ? b->words : GCR_SAMPLE_WORDS;
	host = malloc(n * 4);
	if (host == NULL)
		gcr_fail("out of host memory");
	for (first = 0;; first = b->words - n) {
		CU(cuMemcpyDtoH, host, b->ptr + first * 4, n * 4);
		for (j = 0; j < n; j++)
			if (host[j] != gcr_expected(b->seed, first + j, 0, nsteps))
				gcr_fail("buffer %zu (%s): host readback of word %" PRIu64 " is %#x", i,
					 gcr_kind_name[b->kind], first + j, host[j]);
		if (first == b->words - n)
			break;
	}
	free(host);
}

/* A 2-D readback of the used part of each row of the pitched buffer. */
static void gcr_verify_pitch(struct gcr_buf *b)
{
	CUDA_MEMCPY2D c = {0};
	size_t rows = b->height < 8 ? b->height : 8, r, x;
	uint32_t *host = malloc(rows * b->width);

	if (host == NULL)
		gcr_fail("out of host memory");
	c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c.srcDevice = b->ptr;
	c.srcPitch = b->pitch;
	c.srcY = b->height - rows;
	c.dstMemoryType = CU_MEMORYTYPE_HOST;
	c.dstHost = host;
	c.dstPitch = b->width;
	c.WidthInBytes = b->width;
	c.Height = rows;
	CU(cuMemcpy2D, &c);
	for (r = 0; r < rows; r++)
		for (x = 0; x < b->width / 4; x++)
			if (host[r * b->width / 4 + x] !=
			    gcr_expected(b->seed, (c.srcY + r) * b->pitch / 4 + x, 0,
					 opt.chunks ? 0 : (uint32_t)opt.iters))
				gcr_fail("pitched buffer: 2-D readback row %zu word %zu", c.srcY + r, x);
	free(host);
}

static void gcr_verify(void)
{
	CUdeviceptr counter;
	uint32_t got;
	unsigned long t;
	size_t i;
	int j;

	size_t stack = 0;
	CU(cuCtxGetLimit, &stack, CU_LIMIT_STACK_SIZE);
	if (stack != gcr_stack)
		gcr_fail("stack limit %zu at the end, %zu at the start", stack, gcr_stack);
	CU(cuMemAlloc, &counter, sizeof(unsigned long long));
	for (i = 0; i < nbufs; i++) {
		if (bufs[i].chunked)
			continue;
		gcr_verify_buffer(i, counter);
		if (bufs[i].kind == GCR_BUF_PITCH)
			gcr_verify_pitch(&bufs[i]);
	}
	if (opt.chunks)
		gcr_chunks_verify();
	for (t = 0; t < opt.threads; t++) {
		for (j = 0; j < GCR_TARGETS; j++) {
			CU(cuMemcpyDtoH, &got, threads[t].targets + (uint64_t)j * (GCR_TARGET_BYTES / GCR_TARGETS),
			   sizeof(got));
			if (got != (uint32_t)(threads[t].value * opt.iters))
				gcr_fail("thread %lu: indirect target %d is %u, not %u", t, j, got,
					 (uint32_t)(threads[t].value * opt.iters));
		}
	}
	CU(cuMemFree, counter);
}

/* ---- teardown: exercises the release paths (the shim must see them too) ---- */

static void gcr_teardown(CUmodule module, CUdevice dev)
{
	unsigned long t, k;
	size_t i;
	int h;

	for (t = 0; t < opt.threads; t++) {
		struct gcr_thread *th = &threads[t];

		for (k = 0; opt.graph && !opt.chunks && k < opt.iters; k++) {
			CU(cuGraphExecDestroy, th->steps[k]);
			CU(cuGraphDestroy, th->step_graphs[k]);
		}
		if (opt.graph) {
			CU(cuGraphExecDestroy, th->common);
			CU(cuGraphDestroy, th->common_graph);
		}
		free(th->steps);
		free(th->step_graphs);
		CU(cuMemFree, th->scratch);
		CU(cuMemFree, th->targets);
		CU(cuMemFree, th->table);
		CU(cuMemFreeHost, th->h1);
		CU(cuMemFreeHost, th->h2);
		CU(cuMemFreeHost, th->h3);
		CU(cuStreamDestroy, th->stream);
	}
	for (i = 0; i < nbufs; i++) {
		if (bufs[i].kind == GCR_BUF_VMM) {
			CU(cuMemUnmap, vmm.base, vmm.mapped);
			for (h = 0; h < 2; h++)
				CU(cuMemRelease, vmm.handles[h]);
			CU(cuMemAddressFree, vmm.base, vmm.reserved);
		} else if (bufs[i].kind == GCR_BUF_ASYNC) {
			CU(cuMemFreeAsync, bufs[i].ptr, NULL);
			CU(cuStreamSynchronize, NULL);
		} else {
			CU(cuMemFree, bufs[i].ptr);
		}
	}
	free(bufs);
	if (opt.chunks)
		gcr_chunks_free();
	CU(cuModuleUnload, module);
	CU(cuDevicePrimaryCtxRelease, dev);
}

/* Reads stdin lines until want; EOF first is an error unless eof_ok. */
static void gcr_wait_for(const char *want, bool eof_ok)
{
	char line[64];

	while (fgets(line, sizeof(line), stdin) != NULL) {
		line[strcspn(line, "\r\n")] = '\0';
		if (strcmp(line, want) == 0)
			return;
	}
	if (eof_ok)
		return;
	fprintf(stderr, "gcr-testprog: stdin closed while waiting for '%s'\n", want);
	exit(1);
}

int main(int argc, char **argv)
{
	char name[128];
	CUdevice dev;
	CUmodule module;
	unsigned long t;
	int version;

	setvbuf(stdout, NULL, _IOLBF, 0);
	gcr_options(argc, argv);
	gcr_load_api();
	CU(cuInit, 0);
	CU(cuDriverGetVersion, &version);
	CU(cuDeviceGet, &dev, opt.device);
	CU(cuDeviceGetName, name, sizeof(name), dev);
	fprintf(stderr, "gcr-testprog: %s, driver %d, api %s%s\n", name, version,
		opt.api == GCR_API_LINK ? "link" : opt.api == GCR_API_DLSYM ? "dlsym" : "procaddr",
		opt.ptds ? " (per-thread default stream)" : "");
	CU(cuDevicePrimaryCtxRetain, &gcr_ctx, dev);
	CU(cuCtxSetCurrent, gcr_ctx);
	if (opt.stack > 0)
		CU(cuCtxSetLimit, CU_LIMIT_STACK_SIZE, opt.stack);
	CU(cuCtxGetLimit, &gcr_stack, CU_LIMIT_STACK_SIZE);
	CU(cuModuleLoad, &module, opt.module);
	CU(cuModuleGetFunction, &k_fill, module, "gcr_fill");
	/* With --stack the steps use local memory, so they depend on the stack the shim restores. */
	CU(cuModuleGetFunction, &k_step, module, opt.stack > 0 ? "gcr_step_local" : "gcr_step");
	CU(cuModuleGetFunction, &k_check, module, "gcr_check");
	CU(cuModuleGetFunction, &k_indirect, module, "gcr_indirect");
	if (opt.chunks) {
		CU(cuModuleGetFunction, &k_check_const, module, "gcr_check_const");
		CU(cuModuleGetFunction, &k_step_table, module, "gcr_step_table");
	}

	gcr_alloc_buffers(dev);
	for (t = 0; t < opt.threads; t++) {
		threads[t].index = (int)t;
		gcr_setup_thread(&threads[t]);
	}
	for (size_t i = 0; i < nbufs; i++)
		if (!bufs[i].chunked)
			gcr_launch_fill(&bufs[i], NULL);
	if (opt.chunks) {
		gcr_chunks_alloc();
		if (opt.wait)
			gcr_chunks_setup_mutations();
	}
	CU(cuStreamSynchronize, NULL);
	for (t = 0; t < opt.threads; t++)
		CU(cuStreamSynchronize, threads[t].stream);

	if (opt.chunks)
		printf("READY pid=%d bytes=%llu chunks=%zu zero_bytes=%" PRIu64 "\n", (int)getpid(), total_bytes,
		       ck.n, gcr_chunks_zero_bytes());
	else
		printf("READY pid=%d bytes=%llu\n", (int)getpid(), total_bytes);
	if (opt.wait)
		gcr_wait_for("go", false);
	for (t = 0; t < opt.threads; t++) {
		if (pthread_create(&threads[t].tid, NULL, gcr_thread_main, &threads[t]) != 0)
			gcr_fail("pthread_create");
	}
	for (t = 0; t < opt.threads; t++)
		pthread_join(threads[t].tid, NULL);
	if (opt.wait) {
		printf("DONE\n");
		if (opt.chunks)
			gcr_chunks_commands();
		else
			gcr_wait_for("check", false);
	}
	gcr_verify();
	/* With --hold-after everything stays allocated for the harness to inspect until "exit". */
	if (opt.hold_after) {
		printf("RESULT ok\n");
		gcr_wait_for("exit", true);
	}
	gcr_teardown(module, dev);
	if (!opt.hold_after)
		printf("RESULT ok\n");
	/* With --linger the process lives on with its GPU memory freed until "exit" (overcommit: a
	 * requester that frees memory without ending). */
	if (opt.linger) {
		printf("FREED\n");
		gcr_wait_for("exit", true);
	}
	return 0;
}
