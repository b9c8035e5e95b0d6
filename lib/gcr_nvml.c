/* gcr_nvml: typed calls into the dlopen'd NVML. Opened once and never shut down: the agent
 * asks on every resume, and nvmlInit costs far more than the queries (docs/design.md). */
#include "gcr_nvml.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
	void *h;
	gcr_nvml_init_fn *init;
	gcr_nvml_error_string_fn *error_string;
	gcr_nvml_count_fn *count;
	gcr_nvml_by_index_fn *by_index;
	gcr_nvml_uuid_fn *uuid;
	gcr_nvml_memory_fn *memory;
	gcr_nvml_procs_fn *procs;
} nv;

static pthread_mutex_t nv_lock = PTHREAD_MUTEX_INITIALIZER;

/* One symbol into a typed slot without casting between object and function pointers. */
#define NV_LOAD(slot, name)                               \
	do {                                              \
		union {                                   \
			void *ptr;                        \
			__typeof__(nv.slot) fn;           \
		} u_ = { .ptr = dlsym(nv.h, name) };      \
		nv.slot = u_.fn;                          \
	} while (0)

static const char *nv_str(gcr_nvml_return r)
{
	const char *s = nv.error_string != NULL ? nv.error_string(r) : NULL;
	return s != NULL ? s : "unknown NVML error";
}

/* dlopen of the first candidate that loads; the last dlerror() in why. */
static void *nv_dlopen(char *why, size_t len)
{
	const char *env = getenv("GCR_LIBNVML"), *cuda = getenv("GCR_LIBCUDA");
	char beside[PATH_MAX] = "";
	if (cuda != NULL && strrchr(cuda, '/') != NULL)
		snprintf(beside, sizeof(beside), "%.*s/libnvidia-ml.so.1", (int)(strrchr(cuda, '/') - cuda), cuda);
	const char *cands[] = { env, beside[0] ? beside : NULL, env == NULL ? "libnvidia-ml.so.1" : NULL };
	for (size_t i = 0; i < sizeof(cands) / sizeof(cands[0]); i++) {
		if (cands[i] == NULL)
			continue;
		void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
		if (h != NULL)
			return h;
		snprintf(why, len, "%s", dlerror());
	}
	return NULL;
}

int gcr_nvml_open(struct gcr_err *err)
{
	int rc = 0;
	char why[200] = "not found";
	pthread_mutex_lock(&nv_lock);
	if (nv.h != NULL)
		goto out;
	nv.h = nv_dlopen(why, sizeof(why));
	if (nv.h == NULL) {
		rc = gcr_err_set(err, -ENOENT, "no NVML (libnvidia-ml.so.1): %s", why);
		goto out;
	}
	NV_LOAD(init, "nvmlInit_v2");
	NV_LOAD(error_string, "nvmlErrorString");
	NV_LOAD(count, "nvmlDeviceGetCount_v2");
	NV_LOAD(by_index, "nvmlDeviceGetHandleByIndex_v2");
	NV_LOAD(uuid, "nvmlDeviceGetUUID");
	NV_LOAD(memory, "nvmlDeviceGetMemoryInfo");
	NV_LOAD(procs, "nvmlDeviceGetComputeRunningProcesses_v3");
	if (nv.procs == NULL) /* drivers before 510: the same record under _v2 */
		NV_LOAD(procs, "nvmlDeviceGetComputeRunningProcesses_v2");
	gcr_nvml_return r = -1;
	if (nv.init == NULL || nv.count == NULL || nv.by_index == NULL || nv.uuid == NULL || nv.memory == NULL ||
	    nv.procs == NULL)
		rc = gcr_err_set(err, -ENOENT, "NVML lacks the calls the restore check needs (driver 510 or newer)");
	else if ((r = nv.init()) != GCR_NVML_SUCCESS)
		rc = gcr_err_set(err, -ENOENT, "nvmlInit_v2 failed: %s (%d)", nv_str(r), r);
	if (rc < 0) {
		dlclose(nv.h);
		memset(&nv, 0, sizeof(nv));
	}
out:
	pthread_mutex_unlock(&nv_lock);
	return rc;
}

static int nv_device(unsigned int i, gcr_nvml_device *dev, char *uuid, struct gcr_err *err)
{
	gcr_nvml_return r = nv.by_index(i, dev);
	if (r == GCR_NVML_SUCCESS)
		r = nv.uuid(*dev, uuid, GCR_NVML_UUID_LEN);
	return r == GCR_NVML_SUCCESS ? 0 : gcr_err_set(err, -EIO, "NVML device %u: %s (%d)", i, nv_str(r), r);
}

static int nv_count(unsigned int *count, struct gcr_err *err)
{
	int rc = gcr_nvml_open(err);
	if (rc < 0)
		return rc;
	gcr_nvml_return r = nv.count(count);
	return r == GCR_NVML_SUCCESS ? 0 : gcr_err_set(err, -EIO, "nvmlDeviceGetCount_v2: %s (%d)", nv_str(r), r);
}

int gcr_nvml_proc_use(pid_t pid, struct gcr_nvml_use *out, int max, int *n, struct gcr_err *err)
{
	/* A GPU shared by more processes than this is not one GCR is built for. */
	struct gcr_nvml_process_info infos[256];
	unsigned int count = 0;
	*n = 0;
	int rc = nv_count(&count, err);
	for (unsigned int i = 0; rc == 0 && i < count; i++) {
		gcr_nvml_device dev;
		char uuid[GCR_NVML_UUID_LEN];
		if ((rc = nv_device(i, &dev, uuid, err)) < 0)
			break;
		unsigned int np = sizeof(infos) / sizeof(infos[0]);
		gcr_nvml_return r = nv.procs(dev, &np, infos);
		if (r != GCR_NVML_SUCCESS) {
			rc = gcr_err_set(err, -EIO, "nvmlDeviceGetComputeRunningProcesses on %s: %s (%d)", uuid,
					 nv_str(r), r);
			break;
		}
		for (unsigned int k = 0; k < np; k++) {
			if (infos[k].pid != (unsigned int)pid)
				continue;
			if (infos[k].used_gpu_memory == GCR_NVML_VALUE_NOT_AVAILABLE) {
				rc = gcr_err_set(err, -EIO, "NVML cannot tell pid %d's memory on %s", (int)pid, uuid);
				break;
			}
			if (*n < max) {
				snprintf(out[*n].uuid, sizeof(out[*n].uuid), "%s", uuid);
				out[*n].bytes = infos[k].used_gpu_memory;
				(*n)++;
			}
		}
	}
	return rc;
}

int gcr_nvml_mem(const char *uuid, unsigned long long *free_bytes, unsigned long long *total, struct gcr_err *err)
{
	unsigned int count = 0;
	int rc = nv_count(&count, err);
	for (unsigned int i = 0; rc == 0 && i < count; i++) {
		gcr_nvml_device dev;
		char u[GCR_NVML_UUID_LEN];
		if ((rc = nv_device(i, &dev, u, err)) < 0)
			break;
		if (strcmp(u, uuid) != 0)
			continue;
		struct gcr_nvml_memory m;
		gcr_nvml_return r = nv.memory(dev, &m);
		if (r != GCR_NVML_SUCCESS)
			return gcr_err_set(err, -EIO, "nvmlDeviceGetMemoryInfo on %s: %s (%d)", uuid, nv_str(r), r);
		*free_bytes = m.free;
		*total = m.total;
		return 0;
	}
	return rc < 0 ? rc : gcr_err_set(err, -ENODEV, "no GPU %s on this node", uuid);
}

int gcr_nvml_gpus(char (*uuids)[GCR_NVML_UUID_LEN], int max, int *n, struct gcr_err *err)
{
	unsigned int count = 0;
	*n = 0;
	int rc = nv_count(&count, err);
	for (unsigned int i = 0; rc == 0 && i < count && *n < max; i++) {
		gcr_nvml_device dev;
		if ((rc = nv_device(i, &dev, uuids[*n], err)) == 0)
			(*n)++;
	}
	return rc;
}

/* ---- images (gcr_imgcr): what a restore must match ---- */
typedef gcr_nvml_return gcr_nvml_name_fn(gcr_nvml_device dev, char *name, unsigned int len);
typedef gcr_nvml_return gcr_nvml_driver_fn(char *version, unsigned int len);

int gcr_nvml_gpu_ident(unsigned int index, char *model, size_t mlen, char *driver, size_t dlen, struct gcr_err *err)
{
	snprintf(model, mlen, "unknown");
	snprintf(driver, dlen, "unknown");
	int rc = gcr_nvml_open(err);
	if (rc < 0)
		return rc;
	union {
		void *ptr;
		gcr_nvml_name_fn *fn;
	} name = { .ptr = dlsym(nv.h, "nvmlDeviceGetName") };
	union {
		void *ptr;
		gcr_nvml_driver_fn *fn;
	} drv = { .ptr = dlsym(nv.h, "nvmlSystemGetDriverVersion") };
	gcr_nvml_device dev;
	char buf[128];
	if (name.fn != NULL && nv.by_index != NULL && nv.by_index(index, &dev) == GCR_NVML_SUCCESS &&
	    name.fn(dev, buf, sizeof(buf)) == GCR_NVML_SUCCESS)
		snprintf(model, mlen, "%s", buf);
	if (drv.fn != NULL && drv.fn(buf, sizeof(buf)) == GCR_NVML_SUCCESS)
		snprintf(driver, dlen, "%s", buf);
	return 0;
}

int gcr_nvml_model(const char *uuid, char *model, size_t mlen, struct gcr_err *err)
{
	char uuids[GCR_NVML_MAX_DEVICES][GCR_NVML_UUID_LEN], driver[8];
	int n = 0;
	snprintf(model, mlen, "unknown");
	int rc = gcr_nvml_gpus(uuids, GCR_NVML_MAX_DEVICES, &n, err);
	for (int i = 0; rc == 0 && i < n; i++)
		if (strcmp(uuids[i], uuid) == 0)
			return gcr_nvml_gpu_ident((unsigned)i, model, mlen, driver, sizeof(driver), err);
	return rc < 0 ? rc : gcr_err_set(err, -ENODEV, "no GPU %s on this node", uuid);
}
