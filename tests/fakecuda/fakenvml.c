/* fakenvml: the stand-in libnvidia-ml.so.1 for the stand-in driver: devices, their memory and
 * the processes on them, read from the pool file the fake driver keeps ($FAKECUDA_DIR). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_pool.h"
#include "gcr_nvml_abi.h"

#define FAKE_NVML_EXPORT __attribute__((visibility("default")))
#define FAKE_NVML_ERROR_INVALID_ARGUMENT 2
#define FAKE_NVML_ERROR_UNKNOWN 999

/* Declared from the prototypes gcr_nvml calls through, so a mismatch fails the build. */
FAKE_NVML_EXPORT gcr_nvml_init_fn nvmlInit_v2, nvmlShutdown;
FAKE_NVML_EXPORT gcr_nvml_error_string_fn nvmlErrorString;
FAKE_NVML_EXPORT gcr_nvml_count_fn nvmlDeviceGetCount_v2;
FAKE_NVML_EXPORT gcr_nvml_by_index_fn nvmlDeviceGetHandleByIndex_v2;
FAKE_NVML_EXPORT gcr_nvml_uuid_fn nvmlDeviceGetUUID;
FAKE_NVML_EXPORT gcr_nvml_memory_fn nvmlDeviceGetMemoryInfo;
FAKE_NVML_EXPORT gcr_nvml_procs_fn nvmlDeviceGetComputeRunningProcesses_v3;

/* A device handle is its index + 1, so a NULL handle is never valid. */
static gcr_nvml_device fake_nvml_handle(unsigned int i)
{
	return (gcr_nvml_device)(uintptr_t)(i + 1);
}

static long fake_nvml_env(const char *name, long dflt, long min, long max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (s == NULL || *s == '\0')
		return dflt;
	v = strtol(s, &end, 10);
	return *end == '\0' && v >= min && v <= max ? v : dflt;
}

/* As the fake driver reads them: FAKECUDA_DEVICES (1) devices of FAKECUDA_MEM_MIB (4096). */
static unsigned int fake_nvml_count(void)
{
	return (unsigned int)fake_nvml_env("FAKECUDA_DEVICES", 1, 0, FAKE_POOL_DEVICES);
}

static int fake_nvml_index(gcr_nvml_device dev, unsigned int *i)
{
	uintptr_t v = (uintptr_t)dev;

	if (v == 0 || v > fake_nvml_count())
		return -1;
	*i = (unsigned int)(v - 1);
	return 0;
}

static int fake_nvml_alive(pid_t pid)
{
	return kill(pid, 0) == 0 || errno == EPERM;
}

/* The pid, as we see it, of the process that is pid in the PID namespace with inode pidns;
 * 0 if there is none (it exited). */
static pid_t fake_nvml_our_pid(pid_t pid, uint32_t pidns)
{
	char path[64], line[256];
	struct stat st;
	struct dirent *e;
	pid_t found = 0;
	DIR *d;

	if (stat("/proc/self/ns/pid", &st) == 0 && (uint32_t)st.st_ino == pidns)
		return fake_nvml_alive(pid) ? pid : 0;
	d = opendir("/proc");
	while (d != NULL && found == 0 && (e = readdir(d)) != NULL) {
		long n = strtol(e->d_name, NULL, 10);
		FILE *f;

		snprintf(path, sizeof(path), "/proc/%ld/ns/pid", n);
		if (n <= 0 || stat(path, &st) != 0 || (uint32_t)st.st_ino != pidns)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/status", n);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		while (fgets(line, sizeof(line), f) != NULL) {
			char *last = strrchr(line, '\t');

			if (strncmp(line, "NSpid:", 6) == 0 && last != NULL && atoi(last + 1) == pid)
				found = (pid_t)n;
		}
		fclose(f);
	}
	if (d != NULL)
		closedir(d);
	return found;
}

/* Copies the live slots of the pool into out (FAKE_POOL_SLOTS of them); 0 if there is no pool
 * yet (no fake process has charged memory: none is using any). */
static int fake_nvml_pool(struct fake_pool_slot *out)
{
	size_t len = FAKE_POOL_SLOTS * sizeof(struct fake_pool_slot);
	char path[4096];
	struct stat st;
	void *p;
	int fd, i;

	memset(out, 0, len);
	fake_pool_path(path, sizeof(path));
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	if (fstat(fd, &st) != 0 || (size_t)st.st_size < len) {
		close(fd);
		return 0;
	}
	p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		close(fd);
		return -1;
	}
	flock(fd, LOCK_SH);
	memcpy(out, p, len);
	flock(fd, LOCK_UN);
	munmap(p, len);
	for (i = 0; i < FAKE_POOL_SLOTS; i++) {
		/* A live process holds a write lock on its slot (fakecuda_mem.c); a dead one's slot may
		 * name a live process, its PID namespace's inode number having been reused. */
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
				    .l_start = (off_t)i * (off_t)sizeof(struct fake_pool_slot),
				    .l_len = (off_t)sizeof(struct fake_pool_slot) };
		int held = fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
		pid_t ours = out[i].pid != 0 && held ? fake_nvml_our_pid(out[i].pid, out[i].pidns) : 0;

		if (ours == 0)
			memset(&out[i], 0, sizeof(out[i]));
		else
			out[i].pid = ours;
	}
	close(fd);
	return 0;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlInit_v2(void)
{
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlShutdown(void)
{
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT const char *nvmlErrorString(gcr_nvml_return r)
{
	return r == GCR_NVML_SUCCESS ? "Success" : r == FAKE_NVML_ERROR_INVALID_ARGUMENT ? "Invalid Argument"
		: r == GCR_NVML_ERROR_INSUFFICIENT_SIZE ? "Insufficient Size" : "Unknown Error";
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetCount_v2(unsigned int *count)
{
	if (count == NULL)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*count = fake_nvml_count();
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetHandleByIndex_v2(unsigned int i, gcr_nvml_device *dev)
{
	if (dev == NULL || i >= fake_nvml_count())
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*dev = fake_nvml_handle(i);
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetUUID(gcr_nvml_device dev, char *uuid, unsigned int len)
{
	unsigned int i;

	if (uuid == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	if (snprintf(uuid, len, "GPU-fakecuda-dev-%u", i) >= (int)len)
		return GCR_NVML_ERROR_INSUFFICIENT_SIZE;
	return GCR_NVML_SUCCESS;
}

/* used: what every live fake process holds on the device; free: the rest. */
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMemoryInfo(gcr_nvml_device dev, struct gcr_nvml_memory *mem)
{
	static struct fake_pool_slot pool[FAKE_POOL_SLOTS];
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	unsigned long long used = 0;
	unsigned int i;
	int s, rc;

	if (mem == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	rc = fake_nvml_pool(pool);
	for (s = 0; rc == 0 && s < FAKE_POOL_SLOTS; s++)
		used += pool[s].used[i];
	pthread_mutex_unlock(&mu);
	if (rc != 0)
		return FAKE_NVML_ERROR_UNKNOWN;
	mem->total = (unsigned long long)fake_nvml_env("FAKECUDA_MEM_MIB", 4096, 1, 1L << 30) << 20;
	mem->used = used < mem->total ? used : mem->total;
	mem->free = mem->total - mem->used;
	return GCR_NVML_SUCCESS;
}

/* Every live fake process holding memory on the device, as the driver lists those with a
 * context there. */
static gcr_nvml_return fake_nvml_procs(gcr_nvml_device dev, unsigned int *count,
				       struct gcr_nvml_process_info *infos)
{
	static struct fake_pool_slot pool[FAKE_POOL_SLOTS];
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	gcr_nvml_return r = GCR_NVML_SUCCESS;
	unsigned int i, n = 0;
	int s;

	if (count == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (fake_nvml_pool(pool) != 0)
		r = FAKE_NVML_ERROR_UNKNOWN;
	for (s = 0; r == GCR_NVML_SUCCESS && s < FAKE_POOL_SLOTS; s++) {
		if (pool[s].pid == 0 || pool[s].used[i] == 0)
			continue;
		if (infos != NULL && n < *count)
			infos[n] = (struct gcr_nvml_process_info){ .pid = (unsigned int)pool[s].pid,
								   .used_gpu_memory = pool[s].used[i] };
		n++;
	}
	pthread_mutex_unlock(&mu);
	if (r == GCR_NVML_SUCCESS && (infos == NULL || n > *count))
		r = GCR_NVML_ERROR_INSUFFICIENT_SIZE;
	*count = n;
	return r;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetComputeRunningProcesses_v3(gcr_nvml_device dev, unsigned int *count,
									 struct gcr_nvml_process_info *infos)
{
	return fake_nvml_procs(dev, count, infos);
}
