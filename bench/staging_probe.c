/* staging_probe: measures the candidate staging designs for the shim's data path
 * on a real GPU (issue 5), so the design is chosen from numbers, not guesses:
 *   pinned      one registered host buffer, one stream (the PCIe floor)
 *   pageable    cuMemcpy straight to/from ordinary memory, T threads
 *   memcpy      host memcpy bandwidth, T threads (no GPU)
 *   ring        a small registered ring per worker thread feeding ordinary,
 *               pre-faulted memory with memcpy, T workers, chunk size S
 *   register    cost of cuMemHostRegister/Unregister by size
 *   ckpt        the driver's checkpoint+restore of a child process holding X bytes
 *               of registered host memory (does a small registered ring slow it?)
 * Build (GPU machine, in bench/): gcc -O2 -pthread -I/usr/local/cuda/include -I../lib staging_probe.c
 *   ../lib/gcr_time.c -lcuda
 * Output: one JSON object per line. Not part of the product. */
#define _GNU_SOURCE
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gcr_time.h"

#define CK(x)                                                                      \
	do {                                                                       \
		CUresult r_ = (x);                                                 \
		if (r_ != CUDA_SUCCESS) {                                          \
			fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, r_); \
			exit(1);                                                   \
		}                                                                  \
	} while (0)

static CUcontext ctx;
static CUdeviceptr dev;
static char *host; /* pageable, pre-faulted, THP */
static size_t total;

static char *map_faulted(size_t n)
{
	char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	madvise(p, n, MADV_HUGEPAGE);
	if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
		memset(p, 0, n);
	return p;
}

/* ---- ring workers ---- */
struct ring_job {
	int out, nthreads;
	size_t chunk;
	atomic_size_t next;
};

static void *ring_worker(void *arg)
{
	struct ring_job *j = arg;
	CK(cuCtxSetCurrent(ctx));
	char *slot[2];
	for (int i = 0; i < 2; i++) {
		CK(cuMemHostAlloc((void **)&slot[i], j->chunk, CU_MEMHOSTALLOC_PORTABLE));
	}
	CUstream s;
	CUevent ev[2];
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuEventCreate(&ev[0], CU_EVENT_DISABLE_TIMING));
	CK(cuEventCreate(&ev[1], CU_EVENT_DISABLE_TIMING));
	size_t nchunks = total / j->chunk;
	size_t pend[2] = { (size_t)-1, (size_t)-1 };
	int busy[2] = { 0, 0 };
	for (int k = 0;; k ^= 1) {
		size_t c = atomic_fetch_add(&j->next, 1);
		if (j->out) {
			if (c < nchunks) {
				CK(cuMemcpyDtoHAsync(slot[k], dev + c * j->chunk, j->chunk, s));
				CK(cuEventRecord(ev[k], s));
				pend[k] = c;
				busy[k] = 1;
			}
			int o = k ^ 1;
			if (busy[o]) {
				CK(cuEventSynchronize(ev[o]));
				memcpy(host + pend[o] * j->chunk, slot[o], j->chunk);
				busy[o] = 0;
			}
			if (c >= nchunks && !busy[k])
				break;
		} else {
			if (c >= nchunks)
				break;
			if (busy[k])
				CK(cuEventSynchronize(ev[k]));
			memcpy(slot[k], host + c * j->chunk, j->chunk);
			CK(cuMemcpyHtoDAsync(dev + c * j->chunk, slot[k], j->chunk, s));
			CK(cuEventRecord(ev[k], s));
			busy[k] = 1;
		}
	}
	CK(cuStreamSynchronize(s));
	cuEventDestroy(ev[0]);
	cuEventDestroy(ev[1]);
	cuStreamDestroy(s);
	cuMemFreeHost(slot[0]);
	cuMemFreeHost(slot[1]);
	return NULL;
}

static double ring_run(int out, int nthreads, size_t chunk)
{
	struct ring_job j = { .out = out, .nthreads = nthreads, .chunk = chunk };
	pthread_t th[64];
	double t0 = gcr_time_mono_ms();
	for (int i = 0; i < nthreads; i++)
		pthread_create(&th[i], NULL, ring_worker, &j);
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	return gcr_time_mono_ms() - t0;
}

/* The slot allocation is inside the timing above; time it separately. */
static double slot_alloc_ms(int nthreads, size_t chunk)
{
	double t0 = gcr_time_mono_ms();
	void *p[128];
	for (int i = 0; i < 2 * nthreads; i++)
		CK(cuMemHostAlloc(&p[i], chunk, CU_MEMHOSTALLOC_PORTABLE));
	double dt = gcr_time_mono_ms() - t0;
	for (int i = 0; i < 2 * nthreads; i++)
		cuMemFreeHost(p[i]);
	return dt;
}

/* ---- plain memcpy ---- */
struct mc_job {
	char *dst, *src;
	size_t n;
};
static void *mc_worker(void *arg)
{
	struct mc_job *j = arg;
	memcpy(j->dst, j->src, j->n);
	return NULL;
}

static double memcpy_run(char *dst, char *src, size_t n, int nthreads)
{
	pthread_t th[64];
	struct mc_job j[64];
	size_t per = n / nthreads;
	double t0 = gcr_time_mono_ms();
	for (int i = 0; i < nthreads; i++) {
		j[i] = (struct mc_job){ dst + i * per, src + i * per, per };
		pthread_create(&th[i], NULL, mc_worker, &j[i]);
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	return gcr_time_mono_ms() - t0;
}

/* ---- pageable cuMemcpy, T threads ---- */
struct pg_job {
	int out;
	size_t off, n;
};
static void *pg_worker(void *arg)
{
	struct pg_job *j = arg;
	CK(cuCtxSetCurrent(ctx));
	if (j->out)
		CK(cuMemcpyDtoH(host + j->off, dev + j->off, j->n));
	else
		CK(cuMemcpyHtoD(dev + j->off, host + j->off, j->n));
	return NULL;
}
static double pageable_run(int out, size_t n, int nthreads)
{
	pthread_t th[64];
	struct pg_job j[64];
	size_t per = n / nthreads;
	double t0 = gcr_time_mono_ms();
	for (int i = 0; i < nthreads; i++) {
		j[i] = (struct pg_job){ out, i * per, per };
		pthread_create(&th[i], NULL, pg_worker, &j[i]);
	}
	for (int i = 0; i < nthreads; i++)
		pthread_join(th[i], NULL);
	return gcr_time_mono_ms() - t0;
}

/* ---- driver checkpoint of a child holding reg bytes registered ----
 * The child is exec'd afresh: CUDA does not survive fork() after cuInit. */
static int child_main(size_t reg, size_t devbytes)
{
	CUdevice d;
	CUcontext c;
	CK(cuInit(0));
	CK(cuDeviceGet(&d, 0));
	CK(cuDevicePrimaryCtxRetain(&c, d));
	CK(cuCtxSetCurrent(c));
	CUdeviceptr x;
	CK(cuMemAlloc(&x, devbytes));
	CK(cuMemsetD8(x, 7, devbytes));
	if (reg) {
		char *h = map_faulted(reg);
		CK(cuMemHostRegister(h, reg, CU_MEMHOSTREGISTER_PORTABLE));
	}
	CK(cuCtxSynchronize());
	char b = 1;
	if (write(1, &b, 1) != 1 || read(0, &b, 1) != 1)
		return 2;
	return 0;
}

static void ckpt_probe(const char *self, size_t reg, size_t devbytes)
{
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p))
		exit(1);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p2c[0], 0);
		dup2(c2p[1], 1);
		close(p2c[1]);
		close(c2p[0]);
		char a[32], b[32];
		snprintf(a, sizeof a, "%zu", reg);
		snprintf(b, sizeof b, "%zu", devbytes);
		execl(self, self, "child", a, b, (char *)NULL);
		_exit(127);
	}
	close(p2c[0]);
	close(c2p[1]);
	char b;
	if (read(c2p[0], &b, 1) != 1) {
		fprintf(stderr, "ckpt child failed\n");
		exit(1);
	}
	double t0 = gcr_time_mono_ms();
	CK(cuCheckpointProcessLock(pid, NULL));
	double t1 = gcr_time_mono_ms();
	CK(cuCheckpointProcessCheckpoint(pid, NULL));
	double t2 = gcr_time_mono_ms();
	CK(cuCheckpointProcessRestore(pid, NULL));
	double t3 = gcr_time_mono_ms();
	CK(cuCheckpointProcessUnlock(pid, NULL));
	double t4 = gcr_time_mono_ms();
	printf("{\"probe\":\"ckpt\",\"registered_mib\":%zu,\"device_mib\":%zu,\"lock_ms\":%.1f,\"checkpoint_ms\":%.1f,\"restore_ms\":%.1f,\"unlock_ms\":%.1f}\n",
	       reg >> 20, devbytes >> 20, t1 - t0, t2 - t1, t3 - t2, t4 - t3);
	fflush(stdout);
	b = 1;
	if (write(p2c[1], &b, 1) != 1)
		exit(1);
	close(p2c[1]);
	close(c2p[0]);
	waitpid(pid, NULL, 0);
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "child") == 0)
		return child_main(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
	size_t gib = argc > 1 ? strtoull(argv[1], NULL, 10) : 16;
	total = gib << 30;
	CK(cuInit(0));
	/* Checkpoint probes first, before this process holds anything. */
	size_t regs[] = { 0, 64ull << 20, 512ull << 20, 2ull << 30 };
	for (int rep = 0; rep < 2; rep++)
		for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++)
			ckpt_probe(argv[0], regs[i], 256ull << 20);

	CUdevice d;
	CK(cuDeviceGet(&d, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, d));
	CK(cuCtxSetCurrent(ctx));
	CK(cuMemAlloc(&dev, total));
	CK(cuMemsetD32(dev, 0x5a5a5a5a, total / 4));
	double t0 = gcr_time_mono_ms();
	host = map_faulted(total);
	printf("{\"probe\":\"fault\",\"gib\":%zu,\"ms\":%.1f}\n", gib, gcr_time_mono_ms() - t0);

	/* register/unregister costs */
	size_t rs[] = { 64ull << 20, 512ull << 20, 4ull << 30 };
	for (size_t i = 0; i < 3; i++) {
		t0 = gcr_time_mono_ms();
		CK(cuMemHostRegister(host, rs[i], CU_MEMHOSTREGISTER_PORTABLE));
		double t1 = gcr_time_mono_ms();
		CK(cuMemHostUnregister(host));
		printf("{\"probe\":\"register\",\"mib\":%zu,\"register_ms\":%.1f,\"unregister_ms\":%.1f}\n", rs[i] >> 20,
		       t1 - t0, gcr_time_mono_ms() - t1);
	}
	/* pinned floor */
	CK(cuMemHostRegister(host, total, CU_MEMHOSTREGISTER_PORTABLE));
	CUstream s;
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	for (int rep = 0; rep < 2; rep++) {
		t0 = gcr_time_mono_ms();
		CK(cuMemcpyDtoHAsync(host, dev, total, s));
		CK(cuStreamSynchronize(s));
		double t1 = gcr_time_mono_ms();
		CK(cuMemcpyHtoDAsync(dev, host, total, s));
		CK(cuStreamSynchronize(s));
		double t2 = gcr_time_mono_ms();
		printf("{\"probe\":\"pinned\",\"gib\":%zu,\"d2h_ms\":%.1f,\"h2d_ms\":%.1f,\"d2h_gbs\":%.1f,\"h2d_gbs\":%.1f}\n",
		       gib, t1 - t0, t2 - t1, total / 1e6 / (t1 - t0), total / 1e6 / (t2 - t1));
		fflush(stdout);
	}
	CK(cuMemHostUnregister(host));

	/* plain memcpy, 4 GiB */
	size_t mn = 4ull << 30;
	char *tmp = map_faulted(mn);
	int ts[] = { 1, 2, 4, 8, 12, 16 };
	for (size_t i = 0; i < 6; i++) {
		double ms = memcpy_run(tmp, host, mn, ts[i]);
		printf("{\"probe\":\"memcpy\",\"threads\":%d,\"gbs\":%.1f}\n", ts[i], mn / 1e6 / ms);
		fflush(stdout);
	}
	munmap(tmp, mn);

	/* pageable cuMemcpy, 4 GiB */
	int pts[] = { 1, 4, 8 };
	for (size_t i = 0; i < 3; i++) {
		double o = pageable_run(1, mn, pts[i]), in = pageable_run(0, mn, pts[i]);
		printf("{\"probe\":\"pageable\",\"threads\":%d,\"d2h_gbs\":%.1f,\"h2d_gbs\":%.1f}\n", pts[i],
		       mn / 1e6 / o, mn / 1e6 / in);
		fflush(stdout);
	}

	/* ring */
	size_t chunks[] = { 2ull << 20, 8ull << 20, 32ull << 20 };
	int rts[] = { 4, 8, 12 };
	for (size_t ci = 0; ci < 3; ci++)
		for (size_t ti = 0; ti < 3; ti++) {
			double al = slot_alloc_ms(rts[ti], chunks[ci]);
			double o = ring_run(1, rts[ti], chunks[ci]) - al;
			/* verify a sample */
			int ok = ((unsigned char)host[total - 1] == 0x5a) && ((unsigned char)host[12345] == 0x5a);
			double in = ring_run(0, rts[ti], chunks[ci]) - al;
			printf("{\"probe\":\"ring\",\"chunk_mib\":%zu,\"threads\":%d,\"ring_mib\":%zu,\"d2h_ms\":%.1f,\"h2d_ms\":%.1f,\"d2h_gbs\":%.1f,\"h2d_gbs\":%.1f,\"slot_alloc_ms\":%.1f,\"ok\":%d}\n",
			       chunks[ci] >> 20, rts[ti], (2 * rts[ti] * chunks[ci]) >> 20, o, in, total / 1e6 / o,
			       total / 1e6 / in, al, ok);
			fflush(stdout);
		}
	return 0;
}
