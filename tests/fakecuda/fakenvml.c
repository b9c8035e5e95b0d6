/* fakenvml: the stand-in libnvidia-ml.so.1 for the stand-in driver: devices, their memory and
 * the processes on them, read from the pool file the fake driver keeps ($FAKECUDA_DIR); and the
 * devices' identity NVIDIA's nvidia-ctk reads to write a CDI spec (tests/gpu/node). */
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

/* ---- what NVIDIA's nvidia-ctk asks when it writes a CDI spec (tests/gpu/node's rehearsal) ----
 * Each device as a Hopper GPU of driver 580.159.04 (the GPU machine's), no MIG, minor number its
 * index, its PCI bus 00:0<index+6>.0. Layouts from NVML's documented C ABI (nvml.h). */
#define FAKE_NVML_ERROR_NOT_SUPPORTED 3
#define FAKE_NVML_DRIVER "580.159.04"

struct fake_nvml_pci_info { /* nvmlPciInfo_t */
	char bus_id_legacy[16];
	unsigned int domain, bus, device, pci_device_id, pci_subsystem_id;
	char bus_id[32];
};

FAKE_NVML_EXPORT gcr_nvml_return nvmlInitWithFlags(unsigned int flags);
FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetDriverVersion(char *version, unsigned int len);
FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetCudaDriverVersion(int *version);
FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetCudaDriverVersion_v2(int *version);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetHandleByUUID(const char *uuid, gcr_nvml_device *dev);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetName(gcr_nvml_device dev, char *name, unsigned int len);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetIndex(gcr_nvml_device dev, unsigned int *index);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMinorNumber(gcr_nvml_device dev, unsigned int *minor);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetPciInfo_v3(gcr_nvml_device dev, struct fake_nvml_pci_info *pci);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMigMode(gcr_nvml_device dev, unsigned int *current, unsigned int *pending);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceIsMigDeviceHandle(gcr_nvml_device dev, unsigned int *is_mig);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMaxMigDeviceCount(gcr_nvml_device dev, unsigned int *count);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetCudaComputeCapability(gcr_nvml_device dev, int *major, int *minor);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetArchitecture(gcr_nvml_device dev, unsigned int *arch);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetBrand(gcr_nvml_device dev, int *brand);
FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetAddressingMode(gcr_nvml_device dev, void *mode);

FAKE_NVML_EXPORT gcr_nvml_return nvmlInitWithFlags(unsigned int flags)
{
	(void)flags;
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetDriverVersion(char *version, unsigned int len)
{
	if (version == NULL)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	return snprintf(version, len, "%s", FAKE_NVML_DRIVER) >= (int)len ? GCR_NVML_ERROR_INSUFFICIENT_SIZE
									    : GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetCudaDriverVersion(int *version)
{
	if (version == NULL)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*version = 13000;
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlSystemGetCudaDriverVersion_v2(int *version)
{
	return nvmlSystemGetCudaDriverVersion(version);
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetHandleByUUID(const char *uuid, gcr_nvml_device *dev)
{
	char want[GCR_NVML_UUID_LEN];
	unsigned int i, n = fake_nvml_count();

	if (uuid == NULL || dev == NULL)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	for (i = 0; i < n; i++) {
		*dev = fake_nvml_handle(i);
		if (nvmlDeviceGetUUID(*dev, want, sizeof(want)) == GCR_NVML_SUCCESS && strcmp(want, uuid) == 0)
			return GCR_NVML_SUCCESS;
	}
	return GCR_NVML_ERROR_NOT_FOUND;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetName(gcr_nvml_device dev, char *name, unsigned int len)
{
	unsigned int i;

	if (name == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	return snprintf(name, len, "Stand-in GPU") >= (int)len ? GCR_NVML_ERROR_INSUFFICIENT_SIZE : GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetIndex(gcr_nvml_device dev, unsigned int *index)
{
	return index == NULL || fake_nvml_index(dev, index) != 0 ? FAKE_NVML_ERROR_INVALID_ARGUMENT : GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMinorNumber(gcr_nvml_device dev, unsigned int *minor)
{
	return nvmlDeviceGetIndex(dev, minor);
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetPciInfo_v3(gcr_nvml_device dev, struct fake_nvml_pci_info *pci)
{
	unsigned int i;

	if (pci == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	memset(pci, 0, sizeof(*pci));
	pci->device = i + 6;
	pci->pci_device_id = 0x233510de; /* H200's device id, NVIDIA's vendor id */
	snprintf(pci->bus_id, sizeof(pci->bus_id), "00000000:00:%02x.0", pci->device);
	snprintf(pci->bus_id_legacy, sizeof(pci->bus_id_legacy), "0000:00:%02x.0", pci->device);
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMigMode(gcr_nvml_device dev, unsigned int *current, unsigned int *pending)
{
	unsigned int i;

	if (current == NULL || pending == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*current = *pending = 0;
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceIsMigDeviceHandle(gcr_nvml_device dev, unsigned int *is_mig)
{
	unsigned int i;

	if (is_mig == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*is_mig = 0;
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetMaxMigDeviceCount(gcr_nvml_device dev, unsigned int *count)
{
	return nvmlDeviceIsMigDeviceHandle(dev, count);
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetCudaComputeCapability(gcr_nvml_device dev, int *major, int *minor)
{
	unsigned int i;

	if (major == NULL || minor == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*major = 9;
	*minor = 0;
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetArchitecture(gcr_nvml_device dev, unsigned int *arch)
{
	unsigned int i;

	if (arch == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*arch = 9; /* NVML_DEVICE_ARCH_HOPPER */
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetBrand(gcr_nvml_device dev, int *brand)
{
	unsigned int i;

	if (brand == NULL || fake_nvml_index(dev, &i) != 0)
		return FAKE_NVML_ERROR_INVALID_ARGUMENT;
	*brand = 14; /* NVML_BRAND_NVIDIA */
	return GCR_NVML_SUCCESS;
}

FAKE_NVML_EXPORT gcr_nvml_return nvmlDeviceGetAddressingMode(gcr_nvml_device dev, void *mode)
{
	(void)dev;
	(void)mode;
	return FAKE_NVML_ERROR_NOT_SUPPORTED;
}
