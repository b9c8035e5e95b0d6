/* fakesmi: nvidia-smi for the stand-in driver: shows a fake CUDA process's device memory and
 * checkpoint state, arms fault injection, and drives the cuCheckpointProcess* calls on it. */
#include "fakecuda.h"
#include "gcr_nvml_abi.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char fake_usage[] =
	"usage: fakesmi mem PID            device memory bytes PID holds\n"
	"       fakesmi state PID          running | locked | checkpointed | failed\n"
	"       fakesmi fail PID FUNC NTH CODE\n"
	"                                  the NTH next call of FUNC in PID returns CODE\n"
	"       fakesmi disarm PID         removes PID's armed faults; prints how many had not fired\n"
	"       fakesmi lock PID [TIMEOUT_MS]\n"
	"       fakesmi checkpoint|restore|unlock PID\n"
	"       fakesmi tid PID            the restore thread id\n"
	"       fakesmi hold FREE_MIB      another process on device 0: takes all but FREE_MIB of it (as\n"
	"                                  NVML counts), prints HOLDING free=BYTES, holds until stdin ends\n";

static const char *fake_err_name(CUresult rc)
{
	const char *name = NULL;

	if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == NULL)
		return "unknown CUresult";
	return name;
}

static int fake_fail(const char *what, int pid, CUresult rc)
{
	fprintf(stderr, "fakesmi: %s %d: %s (%d)%s\n", what, pid, fake_err_name(rc), (int)rc,
		rc == CUDA_ERROR_NOT_INITIALIZED    ? ": not a (fake) CUDA process, or another FAKECUDA_DIR"
		: rc == CUDA_ERROR_OPERATING_SYSTEM ? ": no such process"
						    : "");
	return 1;
}

extern gcr_nvml_memory_fn nvmlDeviceGetMemoryInfo;
extern gcr_nvml_by_index_fn nvmlDeviceGetHandleByIndex_v2;

static unsigned long long fake_nvml_free(void)
{
	struct gcr_nvml_memory m = {0};
	gcr_nvml_device d;

	if (nvmlDeviceGetHandleByIndex_v2(0, &d) != GCR_NVML_SUCCESS || nvmlDeviceGetMemoryInfo(d, &m) != 0)
		return 0;
	return m.free;
}

/* Holds device memory so that FREE_MIB stay free, until stdin ends (the test's pipe closes). */
static int fake_hold(long free_mib)
{
	unsigned long long want = (unsigned long long)free_mib << 20, fr;
	CUdeviceptr p = 0;
	CUcontext ctx;
	CUdevice dev;
	char line[64];
	CUresult rc;

	rc = cuInit(0);
	if (rc == CUDA_SUCCESS)
		rc = cuDeviceGet(&dev, 0);
	if (rc == CUDA_SUCCESS)
		rc = cuDevicePrimaryCtxRetain(&ctx, dev);
	if (rc == CUDA_SUCCESS)
		rc = cuCtxSetCurrent(ctx);
	if (rc != CUDA_SUCCESS)
		return fake_fail("hold", (int)getpid(), rc);
	fr = fake_nvml_free();
	/* Whole pages: the fake charges allocations page-rounded. */
	if (fr > want && (rc = cuMemAlloc(&p, (size_t)((fr - want) & ~4095ULL))) != CUDA_SUCCESS)
		return fake_fail("hold", (int)getpid(), rc);
	printf("HOLDING free=%llu\n", fake_nvml_free());
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin) != NULL)
		;
	return 0;
}

static int fake_parse_int(const char *s, long min, long max, long *out)
{
	char *end;

	errno = 0;
	*out = strtol(s, &end, 0);
	return errno == 0 && end != s && *end == '\0' && *out >= min && *out <= max ? 0 : -1;
}

int main(int argc, char **argv)
{
	static const char *const states[] = {"running", "locked", "checkpointed", "failed"};
	char req[160], reply[64];
	const char *cmd;
	CUprocessState st;
	CUresult rc;
	long pid, nth, code, timeout = 0;
	int tid;

	if (argc == 3 && strcmp(argv[1], "hold") == 0) {
		if (fake_parse_int(argv[2], 0, 1L << 30, &pid) != 0) {
			fputs(fake_usage, stderr);
			return 2;
		}
		return fake_hold(pid);
	}
	if (argc < 3 || fake_parse_int(argv[2], 1, 0x7fffffff, &pid) != 0) {
		fputs(fake_usage, stderr);
		return 2;
	}
	cmd = argv[1];
	if ((strcmp(cmd, "mem") == 0 || strcmp(cmd, "disarm") == 0) && argc == 3) {
		rc = fake_service_request((int)pid, cmd, reply, sizeof(reply));
		if (rc != CUDA_SUCCESS)
			return fake_fail(cmd, (int)pid, rc);
		printf("%s\n", reply);
		return 0;
	}
	if (strcmp(cmd, "fail") == 0 && argc == 6) {
		if (strlen(argv[3]) > 63 || fake_parse_int(argv[4], 1, 0x7fffffff, &nth) != 0 ||
		    fake_parse_int(argv[5], 1, 0x7fffffff, &code) != 0) {
			fputs(fake_usage, stderr);
			return 2;
		}
		snprintf(req, sizeof(req), "fail %s %ld %ld", argv[3], nth, code);
		rc = fake_service_request((int)pid, req, NULL, 0);
		return rc == CUDA_SUCCESS ? 0 : fake_fail(cmd, (int)pid, rc);
	}
	/* The rest goes through the driver API, as cuda-checkpoint does (no cuInit needed). */
	if (strcmp(cmd, "state") == 0 && argc == 3) {
		rc = cuCheckpointProcessGetState((int)pid, &st);
		if (rc != CUDA_SUCCESS)
			return fake_fail(cmd, (int)pid, rc);
		printf("%s\n", (unsigned int)st < 4 ? states[st] : "unknown");
		return 0;
	}
	if (strcmp(cmd, "tid") == 0 && argc == 3) {
		rc = cuCheckpointProcessGetRestoreThreadId((int)pid, &tid);
		if (rc != CUDA_SUCCESS)
			return fake_fail(cmd, (int)pid, rc);
		printf("%d\n", tid);
		return 0;
	}
	if (strcmp(cmd, "lock") == 0 && (argc == 3 || argc == 4)) {
		CUcheckpointLockArgs args = {0};

		if (argc == 4 && fake_parse_int(argv[3], 0, 0x7fffffff, &timeout) != 0) {
			fputs(fake_usage, stderr);
			return 2;
		}
		args.timeoutMs = (unsigned int)timeout;
		rc = cuCheckpointProcessLock((int)pid, &args);
	} else if (strcmp(cmd, "checkpoint") == 0 && argc == 3) {
		rc = cuCheckpointProcessCheckpoint((int)pid, NULL);
	} else if (strcmp(cmd, "restore") == 0 && argc == 3) {
		rc = cuCheckpointProcessRestore((int)pid, NULL);
	} else if (strcmp(cmd, "unlock") == 0 && argc == 3) {
		rc = cuCheckpointProcessUnlock((int)pid, NULL);
	} else {
		fputs(fake_usage, stderr);
		return 2;
	}
	return rc == CUDA_SUCCESS ? 0 : fake_fail(cmd, (int)pid, rc);
}
