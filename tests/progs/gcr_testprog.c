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
	bool ptds, pitch, small, async, vmm, managed, graph, wait, hold_after;
	const char *module;
	unsigned long mib, buffers, threads, iters;
	int device;
} opt = {.api = GCR_API_LINK, .mib = 64, .buffers = 4, .threads = 2, .iters = 20};

static void gcr_usage(FILE *f)
{
	fputs("usage: gcr-testprog [--api link|dlsym|procaddr] [--ptds] [--module PATH]\n"
	      "         [--mib N] [--buffers K] [--pitch] [--small] [--async] [--vmm] [--managed]\n"
	      "         [--device N] [--threads T] [--iters I] [--graph] [--wait] [--hold-after]\n",
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
static CUfunction k_fill, k_step, k_check, k_indirect;
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

	if (each == 0)
		each = 4;
	for (i = 0; i < opt.buffers; i++)
		gcr_add(GCR_BUF_ALLOC, gcr_alloc(each), each);
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

/* ---- verification ---- */

static void gcr_verify_buffer(size_t i, CUdeviceptr counter)
{
	struct gcr_buf *b = &bufs[i];
	unsigned long long bad = 0;
	uint32_t kfirst = 0, nsteps = (uint32_t)opt.iters;
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
			    gcr_expected(b->seed, (c.srcY + r) * b->pitch / 4 + x, 0, (uint32_t)opt.iters))
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

	CU(cuMemAlloc, &counter, sizeof(unsigned long long));
	for (i = 0; i < nbufs; i++) {
		gcr_verify_buffer(i, counter);
		if (bufs[i].kind == GCR_BUF_PITCH)
			gcr_verify_pitch(&bufs[i]);
	}
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

		for (k = 0; opt.graph && k < opt.iters; k++) {
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
	CU(cuModuleLoad, &module, opt.module);
	CU(cuModuleGetFunction, &k_fill, module, "gcr_fill");
	CU(cuModuleGetFunction, &k_step, module, "gcr_step");
	CU(cuModuleGetFunction, &k_check, module, "gcr_check");
	CU(cuModuleGetFunction, &k_indirect, module, "gcr_indirect");

	gcr_alloc_buffers(dev);
	for (t = 0; t < opt.threads; t++) {
		threads[t].index = (int)t;
		gcr_setup_thread(&threads[t]);
	}
	for (size_t i = 0; i < nbufs; i++)
		gcr_launch_fill(&bufs[i], NULL);
	CU(cuStreamSynchronize, NULL);
	for (t = 0; t < opt.threads; t++)
		CU(cuStreamSynchronize, threads[t].stream);

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
	return 0;
}
