/* fakecuda_util: for unit tests built from the shim's sources on the stand-in driver
 * (tests/fakecuda): loads it into this process, makes device 0's primary context current, and
 * talks to its control service (faults, statistics). */
#ifndef GCR_TEST_FAKECUDA_UTIL_H
#define GCR_TEST_FAKECUDA_UTIL_H

#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim_config.h"
#include "shim_cuda_real.h"
#include "shim_gpu.h"
#include "shim_real.h"

static char fake_dir[] = "/tmp/gcr-unit-fake-XXXXXX";

/* One request to the stand-in's service in this process; its value, or -1. */
static inline long long fake(const char *req)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/fakecuda-%d.sock", fake_dir, (int)getpid());
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	char buf[64] = "";
	long long value = -1;
	int rc = -1;
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && write(fd, req, strlen(req)) >= 0 &&
	    write(fd, "\n", 1) == 1 && read(fd, buf, sizeof(buf) - 1) > 0 && sscanf(buf, "%d %lld", &rc, &value) == 2 &&
	    rc != 0)
		value = -1;
	if (fd >= 0)
		close(fd);
	return value;
}

static pid_t fake_dir_owner;

/* At exit, after the stand-in's own exit handler has removed its socket (registered before
 * cuInit, so it runs later): the pool file (fakecuda_pool.h's name in FAKECUDA_DIR), then the
 * directory (each test left it in /tmp); not in a forked child that exits while its parent
 * still uses them. */
static inline void fake_dir_remove(void)
{
	if (getpid() != fake_dir_owner)
		return;
	char path[sizeof(fake_dir) + 32];
	snprintf(path, sizeof(path), "%s/fakecuda-pool", fake_dir);
	unlink(path);
	rmdir(fake_dir);
}

/* The stand-in driver loaded and initialised, device 0's primary context current; NULL on
 * failure (the test then stops). */
static inline CUcontext fake_setup(void)
{
	struct gcr_err err = { 0 };
	if (mkdtemp(fake_dir) == NULL)
		return NULL;
	fake_dir_owner = getpid();
	atexit(fake_dir_remove);
	setenv("FAKECUDA_DIR", fake_dir, 1);
	snprintf(shim_cfg.socket_dir, sizeof(shim_cfg.socket_dir), "%s", fake_dir);
	const char *b = getenv("top_builddir");
	char path[4096];
	snprintf(path, sizeof(path), "%s/tests/fakecuda/libcuda.so.1", b ? b : ".");
	if (dlopen(path, RTLD_NOW | RTLD_GLOBAL) == NULL || shim_cuda_ops.load(&err) < 0)
		return NULL;
	__typeof__(&cuInit) init = (__typeof__(&cuInit))shim_real_dlsym(shim_real_handle(SHIM_CUDA), "cuInit");
	CUcontext ctx = NULL;
	CUdevice dev = 0;
	if (init == NULL || init(0) != CUDA_SUCCESS || shim_cu.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    shim_cu.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || shim_cuda_ops.ctx_set(ctx, &err) < 0)
		return NULL;
	return ctx;
}

/* Free device memory on the current context's device. */
static inline size_t fake_free_bytes(void)
{
	size_t free_b = 0, total = 0;
	struct gcr_err err;
	(void)shim_cuda_ops.mem_info(0, &free_b, &total, &err);
	return free_b;
}

static inline void fake_teardown(void)
{
	char sock[4200];
	snprintf(sock, sizeof(sock), "%s/fakecuda-%d.sock", fake_dir, (int)getpid());
	unlink(sock);
	rmdir(fake_dir);
}

#endif
