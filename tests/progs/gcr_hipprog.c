/* gcr-hipprog: a HIP program for the stand-in runtime (tests/fakehip): buffers from hipMalloc
 * and from HIP's virtual-memory API, filled and summed by "kernels" (host functions, as the
 * stand-in runs them), checked by checksum; with --wait it holds them for a controller.
 * Protocol on stdout/stdin: "READY pid=N", then each "check" line answers "RESULT ok|bad".
 * --threads N: N threads keep launching kernels on their own buffer (rewrite it, sum it, check
 * the sum) from READY until a "stop" line, answered "STOPPED iters=N bad=N": a suspend arrives
 * while they launch, and any launch that got past the gate would touch released memory. */
#include <hip/hip_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakehip.h"

#define MIB ((size_t)1 << 20)

static uint32_t word(uint64_t seed, uint64_t i)
{
	uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ULL ^ (i * 0xbf58476d1ce4e5b9ULL);
	x ^= x >> 31;
	return (uint32_t)(x * 0x94d049bb133111ebULL >> 32);
}

/* fill(p, n, seed): p[i] = word(seed, i) for n 32-bit words. */
static void k_fill(dim3 grid, dim3 block, void **args)
{
	uint32_t *p = *(uint32_t **)args[0];
	uint64_t n = *(uint64_t *)args[1], seed = *(uint64_t *)args[2];
	for (uint64_t i = 0; i < n; i++)
		p[i] = word(seed, i);
}

/* sum(p, n, out): *out = a position-weighted sum of the words (device memory). */
static void k_sum(dim3 grid, dim3 block, void **args)
{
	const uint32_t *p = *(const uint32_t **)args[0];
	uint64_t n = *(uint64_t *)args[1], s = 0;
	for (uint64_t i = 0; i < n; i++)
		s += (uint64_t)p[i] * (i + 1);
	**(uint64_t **)args[2] = s;
}

static uint64_t expected_sum(uint64_t seed, uint64_t n)
{
	uint64_t s = 0;
	for (uint64_t i = 0; i < n; i++)
		s += (uint64_t)word(seed, i) * (i + 1);
	return s;
}

#define TRY(call)                                                                          \
	do {                                                                               \
		hipError_t r_ = (call);                                                    \
		if (r_ != hipSuccess) {                                                    \
			fprintf(stderr, "gcr-hipprog: %s: %s (%d)\n", #call, hipGetErrorName(r_), \
				(int)r_);                                                  \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

struct buf {
	void *p;
	size_t size;
	uint64_t seed;
	hipMemGenericAllocationHandle_t h; /* VMM buffers only */
};

static const dim3 one = { 1, 1, 1 };

struct launcher {
	pthread_t th;
	struct buf b;
	uint64_t *dsum; /* device word for its sums */
	long iters, bad;
};
static atomic_int stop;

static void *launch_loop(void *arg)
{
	struct launcher *l = arg;
	hipStream_t s;
	TRY(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
	uint64_t n = l->b.size / 4, want = expected_sum(l->b.seed, n);
	while (!atomic_load(&stop)) {
		uint64_t got = 0;
		void *fill[] = { &l->b.p, &n, &l->b.seed };
		void *sum[] = { &l->b.p, &n, &l->dsum };
		TRY(hipLaunchKernel((const void *)k_fill, one, one, fill, 0, s));
		TRY(hipLaunchKernel((const void *)k_sum, one, one, sum, 0, s));
		TRY(hipMemcpyDtoHAsync(&got, l->dsum, sizeof(got), s));
		TRY(hipStreamSynchronize(s));
		l->bad += got != want;
		l->iters++;
	}
	TRY(hipStreamDestroy(s));
	return NULL;
}

/* Verifies one buffer twice: on the device (sum kernel) and on the host (copied back). */
static int verify(const struct buf *b, uint64_t *dsum, uint32_t *host, hipStream_t s)
{
	uint64_t n = b->size / 4, want = expected_sum(b->seed, n), got = 0;
	void *args[] = { (void *)&b->p, &n, &dsum };
	TRY(hipLaunchKernel((const void *)k_sum, one, one, args, 0, s));
	TRY(hipStreamSynchronize(s));
	TRY(hipMemcpyDtoH(&got, dsum, sizeof(got)));
	TRY(hipMemcpy(host, b->p, b->size, hipMemcpyDeviceToHost));
	uint64_t hs = 0;
	for (uint64_t i = 0; i < n; i++)
		hs += (uint64_t)host[i] * (i + 1);
	return got == want && hs == want;
}

int main(int argc, char **argv)
{
	size_t mib = 4;
	int nbufs = 2, wait = 0, nthreads = 0;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
			mib = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--buffers") == 0 && i + 1 < argc)
			nbufs = atoi(argv[++i]);
		else if (strcmp(argv[i], "--wait") == 0)
			wait = 1;
		else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
			nthreads = atoi(argv[++i]);
		else {
			fprintf(stderr, "usage: gcr-hipprog [--mib N] [--buffers N] [--threads N] [--wait]\n");
			return 2;
		}
	}
	if (mib == 0 || nbufs < 1 || nbufs > 64 || nthreads < 0 || nthreads > 16 || (nthreads > 0 && !wait))
		return 2;
	struct buf *b = calloc((size_t)nbufs + 1, sizeof(*b));
	uint32_t *host = malloc(mib * MIB);
	if (b == NULL || host == NULL)
		return 1;
	hipStream_t s;
	TRY(hipSetDevice(0));
	TRY(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
	uint64_t *dsum;
	TRY(hipMalloc((void **)&dsum, sizeof(*dsum)));
	for (int i = 0; i < nbufs; i++) {
		b[i] = (struct buf){ .size = mib * MIB, .seed = (uint64_t)i + 1 };
		TRY(hipMalloc(&b[i].p, b[i].size));
	}
	/* One buffer the way expandable allocators make them: reserve, create, map, access. */
	struct buf *v = &b[nbufs];
	*v = (struct buf){ .size = mib * MIB, .seed = 100 };
	hipMemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = hipMemAllocationTypePinned;
	prop.location.type = hipMemLocationTypeDevice;
	prop.location.id = 0;
	size_t gran = 0;
	TRY(hipMemGetAllocationGranularity(&gran, &prop, hipMemAllocationGranularityMinimum));
	v->size = (v->size + gran - 1) / gran * gran;
	hipMemAccessDesc acc = { .location = prop.location, .flags = hipMemAccessFlagsProtReadWrite };
	TRY(hipMemAddressReserve(&v->p, v->size, 0, NULL, 0));
	TRY(hipMemCreate(&v->h, v->size, &prop, 0));
	TRY(hipMemMap(v->p, v->size, 0, v->h, 0));
	TRY(hipMemSetAccess(v->p, v->size, &acc, 1));
	/* Fill: a memset first (overwritten), then the kernel; launch paths differ per buffer. */
	for (int i = 0; i <= nbufs; i++) {
		uint64_t n = b[i].size / 4;
		void *args[] = { &b[i].p, &n, &b[i].seed };
		TRY(hipMemsetAsync(b[i].p, 0xab, b[i].size, s));
		if (i == nbufs)
			TRY(hipModuleLaunchKernel((hipFunction_t)(void *)k_fill, 1, 1, 1, 1, 1, 1, 0, s, args, NULL));
		else
			TRY(hipLaunchKernel((const void *)k_fill, one, one, args, 0, s));
	}
	TRY(hipDeviceSynchronize());
	int ok = 1;
	for (int i = 0; i <= nbufs; i++)
		ok &= verify(&b[i], dsum, host, s);
	if (!wait) {
		printf("RESULT %s\n", ok ? "ok" : "bad");
		return ok ? 0 : 1;
	}
	struct launcher *ls = calloc((size_t)nthreads + 1, sizeof(*ls));
	if (ls == NULL)
		return 1;
	for (int i = 0; i < nthreads; i++) {
		ls[i].b = (struct buf){ .size = mib * MIB, .seed = 1000 + (uint64_t)i };
		TRY(hipMalloc(&ls[i].b.p, ls[i].b.size));
		TRY(hipMalloc((void **)&ls[i].dsum, sizeof(uint64_t)));
		if (pthread_create(&ls[i].th, NULL, launch_loop, &ls[i]) != 0)
			return 1;
	}
	printf("READY pid=%d\n", (int)getpid());
	fflush(stdout);
	char line[64];
	while (fgets(line, sizeof(line), stdin) != NULL) {
		if (strncmp(line, "stop", 4) == 0) {
			long iters = 0, bad = 0;
			atomic_store(&stop, 1);
			for (int i = 0; i < nthreads; i++) {
				pthread_join(ls[i].th, NULL);
				iters += ls[i].iters;
				bad += ls[i].bad;
				TRY(hipFree(ls[i].b.p));
				TRY(hipFree(ls[i].dsum));
			}
			nthreads = 0;
			printf("STOPPED iters=%ld bad=%ld\n", iters, bad);
			fflush(stdout);
			continue;
		}
		if (strncmp(line, "check", 5) != 0)
			continue;
		ok = 1;
		for (int i = 0; i <= nbufs; i++)
			ok &= verify(&b[i], dsum, host, s);
		printf("RESULT %s\n", ok ? "ok" : "bad");
		fflush(stdout);
	}
	TRY(hipMemUnmap(v->p, v->size));
	TRY(hipMemRelease(v->h));
	TRY(hipMemAddressFree(v->p, v->size));
	for (int i = 0; i < nbufs; i++)
		TRY(hipFree(b[i].p));
	TRY(hipFree(dsum));
	TRY(hipStreamDestroy(s));
	atomic_store(&stop, 1);
	for (int i = 0; i < nthreads; i++)
		pthread_join(ls[i].th, NULL);
	free(ls);
	free(b);
	free(host);
	return 0;
}
