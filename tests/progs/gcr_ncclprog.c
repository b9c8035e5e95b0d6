/* gcr-ncclprog: one rank of a group of processes that all-reduce every step through NCCL (the
 * stand-in tests/fakenccl in CI, the real libnccl.so.2 on a GPU host), for the group suspend's
 * tests. Each step: a kernel updates buffer A, A is all-reduced on the world communicator; with
 * --split, B is all-reduced on a communicator split from it (ranks in reverse order) and the
 * last rank takes part in a second split with NCCL_SPLIT_NOCOLOR; every 5th step B is broadcast
 * (ncclBcast, which NCCL forwards to ncclBroadcast itself); every 7th a ring of send/recv in a
 * group. Sums of uint32 are exact in any order, so the final DIGEST is the same for every
 * timing: a run suspended and resumed must print the digest of one that was not.
 * Protocol on stdout: "READY pid=P rank=R", (with --wait: waits for "go") "STEP k" after step k
 * is done on the GPU, "DIGEST hex", "DONE"; then (with --wait) waits for "exit". */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim_nccl_abi.h"

static struct {
	int rank, nranks, device, steps, split, nonblocking, dlopen_api, wait, pace_ms, devices, watchdog;
	size_t mib;
	const char *id_file, *module;
} opt = { .nranks = 1, .device = -1, .steps = 50, .mib = 8, .module = "gcr_kernels.h" };

static void wait_for(const char *want);

/* With --wait the program stays until told to exit, so a test can look at it after the error. */
static void die(const char *what, long code)
{
	printf("ERROR %s (%ld)\n", what, code);
	fprintf(stderr, "gcr-ncclprog rank %d: %s failed (%ld)\n", opt.rank, what, code);
	if (opt.wait)
		wait_for("exit");
	exit(3);
}

#define CU(call)                                        \
	do {                                            \
		CUresult r_ = (call);                   \
		if (r_ != CUDA_SUCCESS)                 \
			die(#call, (long)r_);           \
	} while (0)

/* NCCL's functions: linked, or (--api dlopen) looked up on a local handle the way Python's
 * ctypes does, which the shim answers through its dlsym. */
static struct {
	__typeof__(&ncclGetUniqueId) GetUniqueId;
	__typeof__(&ncclCommInitRankConfig) CommInitRankConfig;
	__typeof__(&ncclCommSplit) CommSplit;
	__typeof__(&ncclAllReduce) AllReduce;
	__typeof__(&ncclBcast) Bcast;
	__typeof__(&ncclSend) Send;
	__typeof__(&ncclRecv) Recv;
	__typeof__(&ncclGroupStart) GroupStart;
	__typeof__(&ncclGroupEnd) GroupEnd;
	__typeof__(&ncclCommGetAsyncError) CommGetAsyncError;
	__typeof__(&ncclCommCount) CommCount;
	__typeof__(&ncclCommUserRank) CommUserRank;
	__typeof__(&ncclCommDestroy) CommDestroy;
} nc;

static void load_nccl(void)
{
	if (!opt.dlopen_api) {
		nc.GetUniqueId = ncclGetUniqueId;
		nc.CommInitRankConfig = ncclCommInitRankConfig;
		nc.CommSplit = ncclCommSplit;
		nc.AllReduce = ncclAllReduce;
		nc.Bcast = ncclBcast;
		nc.Send = ncclSend;
		nc.Recv = ncclRecv;
		nc.GroupStart = ncclGroupStart;
		nc.GroupEnd = ncclGroupEnd;
		nc.CommGetAsyncError = ncclCommGetAsyncError;
		nc.CommCount = ncclCommCount;
		nc.CommUserRank = ncclCommUserRank;
		nc.CommDestroy = ncclCommDestroy;
		return;
	}
	void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL)
		die("dlopen libnccl.so.2", 0);
#define LOOK(f)                                                   \
	do {                                                      \
		*(void **)&nc.f = dlsym(h, "nccl" #f);            \
		if (nc.f == NULL)                                 \
			die("dlsym nccl" #f, 0);                  \
	} while (0)
	LOOK(GetUniqueId);
	LOOK(CommInitRankConfig);
	LOOK(CommSplit);
	LOOK(AllReduce);
	LOOK(Bcast);
	LOOK(Send);
	LOOK(Recv);
	LOOK(GroupStart);
	LOOK(GroupEnd);
	LOOK(CommGetAsyncError);
	LOOK(CommCount);
	LOOK(CommUserRank);
	LOOK(CommDestroy);
#undef LOOK
}

#define NC(call)                                          \
	do {                                              \
		ncclResult_t r_ = (call);                 \
		if (r_ != ncclSuccess)                    \
			die(#call, (long)r_);             \
	} while (0)

static void options(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "rank", required_argument, NULL, 'r' },     { "nranks", required_argument, NULL, 'n' },
		{ "id-file", required_argument, NULL, 'i' },  { "device", required_argument, NULL, 'd' },
		{ "devices", required_argument, NULL, 'D' },  { "mib", required_argument, NULL, 'm' },
		{ "steps", required_argument, NULL, 's' },    { "split", no_argument, NULL, 'S' },
		{ "nonblocking", no_argument, NULL, 'B' },   { "api", required_argument, NULL, 'a' },
		{ "module", required_argument, NULL, 'M' },   { "wait", no_argument, NULL, 'w' },
		{ "pace-ms", required_argument, NULL, 'p' },  { "watchdog", no_argument, NULL, 'W' },
		{ NULL, 0, NULL, 0 },
	};
	int ch;
	while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (ch) {
		case 'r': opt.rank = atoi(optarg); break;
		case 'n': opt.nranks = atoi(optarg); break;
		case 'i': opt.id_file = optarg; break;
		case 'd': opt.device = atoi(optarg); break;
		case 'D': opt.devices = atoi(optarg); break;
		case 'm': opt.mib = (size_t)atoi(optarg); break;
		case 's': opt.steps = atoi(optarg); break;
		case 'S': opt.split = 1; break;
		case 'B': opt.nonblocking = 1; break;
		case 'a': opt.dlopen_api = strcmp(optarg, "dlopen") == 0; break;
		case 'M': opt.module = optarg; break;
		case 'w': opt.wait = 1; break;
		case 'p': opt.pace_ms = atoi(optarg); break;
		case 'W': opt.watchdog = 1; break;
		default: exit(2);
		}
	}
	if (opt.nranks < 1 || opt.rank < 0 || opt.rank >= opt.nranks || opt.id_file == NULL || opt.mib < 1) {
		fprintf(stderr, "usage: gcr-ncclprog --rank R --nranks N --id-file PATH [--device D] [--devices K] "
			"[--mib M] [--steps S] [--split] [--nonblocking] [--api link|dlopen] [--module PATH] [--wait] "
			"[--pace-ms P] [--watchdog]\n");
		exit(2);
	}
}

static void wait_for(const char *want)
{
	char line[64];
	while (fgets(line, sizeof(line), stdin) != NULL) {
		line[strcspn(line, "\r\n")] = '\0';
		if (strcmp(line, want) == 0)
			return;
	}
	exit(1);
}

/* Rank 0 makes the id and publishes it (written whole, then renamed); the others wait for the
 * file, bounded by 120 s: the test starts every rank at once. */
static ncclUniqueId share_id(void)
{
	ncclUniqueId id;
	if (opt.rank == 0) {
		char tmp[4096];
		NC(nc.GetUniqueId(&id));
		snprintf(tmp, sizeof(tmp), "%s.tmp", opt.id_file);
		FILE *f = fopen(tmp, "wb");
		if (f == NULL || fwrite(&id, sizeof(id), 1, f) != 1 || fclose(f) != 0 || rename(tmp, opt.id_file) != 0)
			die("writing the id file", errno);
		return id;
	}
	for (int i = 0; i < 12000; i++) {
		FILE *f = fopen(opt.id_file, "rb");
		if (f != NULL) {
			size_t got = fread(&id, sizeof(id), 1, f);
			fclose(f);
			if (got == 1)
				return id;
		}
		struct timespec ts = { 0, 10 * 1000000L };
		nanosleep(&ts, NULL); /* polling a file another process writes, bounded */
	}
	die("waiting for the id file", 0);
	return id;
}

static ncclComm_t ready(ncclComm_t c, ncclResult_t r)
{
	if (r == ncclInProgress) {
		ncclResult_t st = ncclInProgress;
		for (int i = 0; i < 60000 && st == ncclInProgress; i++) {
			NC(nc.CommGetAsyncError(c, &st));
			if (st == ncclInProgress) {
				struct timespec ts = { 0, 1000000L };
				nanosleep(&ts, NULL);
			}
		}
		r = st;
	}
	if (r != ncclSuccess)
		die("communicator init", r);
	return c;
}

/* --watchdog: a thread polling as PyTorch's watchdog does, every 10 ms: is the last step's event
 * done, has the world communicator an asynchronous error; "BEAT n" every 10 polls. Its beat
 * must go on while the group is suspended (a stopped one ends a PyTorch process). */
static struct {
	pthread_t thread;
	atomic_int stop;
	CUcontext ctx;
	CUevent ev;
	ncclComm_t comm;
} wd;

static void *watchdog(void *arg)
{
	(void)arg;
	if (cuCtxSetCurrent(wd.ctx) != CUDA_SUCCESS) {
		printf("ERROR watchdog cuCtxSetCurrent\n");
		return NULL;
	}
	for (long n = 1; !atomic_load(&wd.stop); n++) {
		CUresult q = cuEventQuery(wd.ev);
		ncclResult_t st = ncclSuccess, r = nc.CommGetAsyncError(wd.comm, &st);
		if ((q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY) || r != ncclSuccess || st != ncclSuccess) {
			printf("ERROR watchdog cuEventQuery %d ncclCommGetAsyncError %d/%d\n", (int)q, (int)r, (int)st);
			return NULL;
		}
		if (n % 10 == 0)
			printf("BEAT %ld\n", n / 10);
		struct timespec ts = { 0, 10 * 1000000L };
		nanosleep(&ts, NULL); /* the watchdog's own period */
	}
	return NULL;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	options(argc, argv);
	load_nccl();
	CU(cuInit(0));
	int ndev = 0;
	CU(cuDeviceGetCount(&ndev));
	int devno = opt.device >= 0 ? opt.device : opt.rank % (opt.devices > 0 ? opt.devices : ndev);
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction k_fill, k_step;
	CUstream s;
	CU(cuDeviceGet(&dev, devno));
	CU(cuDevicePrimaryCtxRetain(&ctx, dev));
	CU(cuCtxSetCurrent(ctx));
	CU(cuModuleLoad(&mod, opt.module));
	CU(cuModuleGetFunction(&k_fill, mod, "gcr_fill"));
	CU(cuModuleGetFunction(&k_step, mod, "gcr_step"));
	CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

	uint64_t na = opt.mib << 18, nb = 1 << 16; /* words: mib MiB, 256 KiB */
	CUdeviceptr a, b, c;
	CU(cuMemAlloc(&a, na * 4));
	CU(cuMemAlloc(&b, nb * 4));
	CU(cuMemAlloc(&c, nb * 4));
	uint32_t seed_a = (uint32_t)opt.rank + 1, seed_b = 100 + (uint32_t)opt.rank;
	void *fa[] = { &a, &na, &seed_a }, *fb[] = { &b, &nb, &seed_b };
	CU(cuLaunchKernel(k_fill, 64, 1, 1, 256, 1, 1, 0, s, fa, NULL));
	CU(cuLaunchKernel(k_fill, 64, 1, 1, 256, 1, 1, 0, s, fb, NULL));
	CU(cuMemsetD8Async(c, 0, nb * 4, s));
	CU(cuStreamSynchronize(s));

	ncclConfig_t cfg = { .size = sizeof(ncclConfig_t), .magic = SHIM_NCCL_API_MAGIC, .version = 22809,
			     .blocking = opt.nonblocking ? 0 : 1, .cgaClusterSize = NCCL_CONFIG_UNDEF_INT,
			     .minCTAs = NCCL_CONFIG_UNDEF_INT, .maxCTAs = NCCL_CONFIG_UNDEF_INT,
			     .splitShare = NCCL_CONFIG_UNDEF_INT, .trafficClass = NCCL_CONFIG_UNDEF_INT,
			     .commName = "gcr-ncclprog", .collnetEnable = NCCL_CONFIG_UNDEF_INT,
			     .CTAPolicy = NCCL_CONFIG_UNDEF_INT, .shrinkShare = NCCL_CONFIG_UNDEF_INT,
			     .nvlsCTAs = NCCL_CONFIG_UNDEF_INT, .nChannelsPerNetPeer = NCCL_CONFIG_UNDEF_INT,
			     .nvlinkCentricSched = NCCL_CONFIG_UNDEF_INT, .graphUsageMode = NCCL_CONFIG_UNDEF_INT,
			     .numRmaCtx = NCCL_CONFIG_UNDEF_INT };
	ncclUniqueId id = share_id();
	ncclComm_t world = NULL, sub = NULL, none = NULL;
	ncclResult_t r = nc.CommInitRankConfig(&world, opt.nranks, id, opt.rank, &cfg);
	world = ready(world, r);
	if (opt.split) {
		/* Every rank, keys reversed: rank R is rank N-1-R there. */
		r = nc.CommSplit(world, 0, opt.nranks - 1 - opt.rank, &sub, NULL);
		sub = ready(sub, r);
		/* The last rank takes part without a colour: it gets no communicator. */
		int last = opt.rank == opt.nranks - 1 && opt.nranks > 1;
		r = nc.CommSplit(world, last ? NCCL_SPLIT_NOCOLOR : 1, opt.rank, &none, NULL);
		if (last && (r != ncclSuccess || none != NULL))
			die("NOCOLOR split", r);
		if (!last)
			none = ready(none, r);
	}
	int n = 0, me = -1;
	NC(nc.CommCount(world, &n));
	NC(nc.CommUserRank(world, &me));
	if (n != opt.nranks || me != opt.rank)
		die("world communicator rank/size", n * 1000 + me);
	if (sub != NULL) {
		NC(nc.CommUserRank(sub, &me));
		if (me != opt.nranks - 1 - opt.rank)
			die("split rank", me);
	}
	if (opt.watchdog) {
		wd.ctx = ctx;
		wd.comm = world;
		CU(cuEventCreate(&wd.ev, CU_EVENT_DISABLE_TIMING));
		CU(cuEventRecord(wd.ev, s));
		if (pthread_create(&wd.thread, NULL, watchdog, NULL) != 0)
			die("pthread_create", errno);
	}
	printf("READY pid=%d rank=%d\n", (int)getpid(), opt.rank);
	if (opt.wait)
		wait_for("go");

	for (int k = 0; k < opt.steps; k++) {
		uint32_t kk = (uint32_t)k;
		void *sa[] = { &a, &na, &kk };
		CU(cuLaunchKernel(k_step, 64, 1, 1, 256, 1, 1, 0, s, sa, NULL));
		NC(nc.AllReduce((const void *)a, (void *)a, na, ncclUint32, ncclSum, world, s));
		if (sub != NULL)
			NC(nc.AllReduce((const void *)b, (void *)b, nb, ncclUint32, ncclSum, sub, s));
		if (none != NULL && k % 3 == 0)
			NC(nc.AllReduce((const void *)c, (void *)c, nb, ncclUint32, ncclMax, none, s));
		if (k % 5 == 0)
			NC(nc.Bcast((void *)b, nb, ncclUint32, k % opt.nranks, world, s));
		if (k % 7 == 0 && opt.nranks > 1) {
			NC(nc.GroupStart());
			NC(nc.Send((const void *)b, nb, ncclUint32, (opt.rank + 1) % opt.nranks, world, s));
			NC(nc.Recv((void *)c, nb, ncclUint32, (opt.rank + opt.nranks - 1) % opt.nranks, world, s));
			NC(nc.GroupEnd());
		}
		if (opt.watchdog)
			CU(cuEventRecord(wd.ev, s));
		CU(cuStreamSynchronize(s));
		ncclResult_t st = ncclSuccess;
		NC(nc.CommGetAsyncError(world, &st));
		if (st != ncclSuccess)
			die("async error", st);
		printf("STEP %d\n", k);
		if (opt.pace_ms > 0) {
			struct timespec ts = { opt.pace_ms / 1000, (long)(opt.pace_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL); /* the program's own pace, not a synchronisation */
		}
	}
	if (opt.watchdog) {
		atomic_store(&wd.stop, 1);
		pthread_join(wd.thread, NULL);
		CU(cuEventDestroy(wd.ev));
	}
	uint64_t h = 0xcbf29ce484222325ull;
	uint32_t *host = malloc(na * 4);
	if (host == NULL)
		die("malloc", 0);
	CU(cuMemcpyDtoH(host, a, na * 4));
	h = fnv(h, host, na * 4);
	CU(cuMemcpyDtoH(host, b, nb * 4));
	h = fnv(h, host, nb * 4);
	CU(cuMemcpyDtoH(host, c, nb * 4));
	h = fnv(h, host, nb * 4);
	free(host);
	printf("DIGEST %016llx\n", (unsigned long long)h);
	printf("DONE\n");
	if (opt.wait)
		wait_for("exit");
	if (none != NULL)
		NC(nc.CommDestroy(none));
	if (sub != NULL)
		NC(nc.CommDestroy(sub));
	NC(nc.CommDestroy(world));
	return 0;
}
