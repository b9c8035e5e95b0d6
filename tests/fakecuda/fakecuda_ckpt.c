/* fakecuda_ckpt: the checkpoint API across processes: each initialised process serves its state
 * machine on $FAKECUDA_DIR/fakecuda-<pid>.sock; callers reach it by their pid, even in a container. */
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "gcr_procns.h"

/* Protocol, one exchange per connection: the client sends one line, the service answers
 * "<CUresult> [value]\n" and closes. Requests: state, mem, tid, lock <timeoutMs>, checkpoint,
 * restore, unlock, fail <function> <nth> <CUresult>, disarm (value: armed faults not fired). */
#define FAKE_LINE_MAX 256

static atomic_int fake_state = CU_PROCESS_STATE_RUNNING;
/* One transition at a time; "state" and "mem" are answered without it. */
static pthread_mutex_t fake_transition_mu = PTHREAD_MUTEX_INITIALIZER;
static char fake_sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static pid_t fake_owner; /* a forked child must not remove its parent's socket */
static int fake_listen_fd = -1;
static atomic_int fake_service_tid;

static int fake_sock_name(int pid, char *buf, size_t len)
{
	const char *dir = getenv("FAKECUDA_DIR");
	int n = snprintf(buf, len, "%s/fakecuda-%d.sock", dir != NULL && *dir ? dir : "/tmp", pid);

	return n > 0 && (size_t)n < len ? 0 : -1;
}

/* ---- the target side ---- */

static CUresult fake_transition(const char *base, CUprocessState from, CUprocessState to,
				CUresult (*act)(unsigned int), unsigned int arg)
{
	CUresult rc;

	pthread_mutex_lock(&fake_transition_mu);
	rc = fake_fault_take(base);
	if (rc == CUDA_SUCCESS && atomic_load(&fake_state) != (int)from)
		rc = CUDA_ERROR_ILLEGAL_STATE;
	if (rc == CUDA_SUCCESS)
		rc = act(arg);
	if (rc == CUDA_SUCCESS)
		atomic_store(&fake_state, (int)to);
	pthread_mutex_unlock(&fake_transition_mu);
	return rc;
}

static CUresult fake_act_lock(unsigned int timeout_ms)
{
	/* The lock waits for the GPU's work: held streams finish first. */
	fake_exec_release_all();
	return fake_gate_close(timeout_ms);
}

static CUresult fake_act_checkpoint(unsigned int unused)
{
	return fake_mem_checkpoint();
}

/* The real driver's bug, modelled (seen on an H200, driver 580): a restore that runs out of
 * device memory leaves the process unrestorable; every later restore answers
 * CUDA_ERROR_OPERATING_SYSTEM, whatever room there is by then. An injected fault (fakesmi fail)
 * stays transient: it stands for failures the driver recovers from. */
static atomic_bool fake_restore_broken;

static CUresult fake_act_restore(unsigned int unused)
{
	CUresult rc;

	if (atomic_load(&fake_restore_broken))
		return CUDA_ERROR_OPERATING_SYSTEM;
	rc = fake_mem_restore();
	if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
		atomic_store(&fake_restore_broken, true);
		fprintf(stderr, "fakecuda: pid %d: restore ran out of device memory; this process can no "
			"longer be restored (the driver's bug, modelled)\n", (int)getpid());
	}
	return rc;
}

static CUresult fake_act_unlock(unsigned int unused)
{
	fake_gate_open();
	return CUDA_SUCCESS;
}

/* Answers one request line into reply. */
static CUresult fake_serve(char *req, unsigned long long *value)
{
	char name[64];
	unsigned int u;
	int code;

	*value = 0;
	if (strcmp(req, "state") == 0) {
		*value = (unsigned long long)atomic_load(&fake_state);
		return CUDA_SUCCESS;
	}
	if (strcmp(req, "mem") == 0) {
		*value = fake_mem_used();
		return CUDA_SUCCESS;
	}
	if (strcmp(req, "tid") == 0) {
		*value = (unsigned long long)atomic_load(&fake_service_tid);
		return CUDA_SUCCESS;
	}
	if (sscanf(req, "lock %u", &u) == 1)
		return fake_transition("cuCheckpointProcessLock", CU_PROCESS_STATE_RUNNING,
				       CU_PROCESS_STATE_LOCKED, fake_act_lock, u);
	if (strcmp(req, "checkpoint") == 0)
		return fake_transition("cuCheckpointProcessCheckpoint", CU_PROCESS_STATE_LOCKED,
				       CU_PROCESS_STATE_CHECKPOINTED, fake_act_checkpoint, 0);
	if (strcmp(req, "restore") == 0)
		return fake_transition("cuCheckpointProcessRestore", CU_PROCESS_STATE_CHECKPOINTED,
				       CU_PROCESS_STATE_LOCKED, fake_act_restore, 0);
	if (strcmp(req, "unlock") == 0)
		return fake_transition("cuCheckpointProcessUnlock", CU_PROCESS_STATE_LOCKED,
				       CU_PROCESS_STATE_RUNNING, fake_act_unlock, 0);
	if (sscanf(req, "fail %63s %u %d", name, &u, &code) == 3)
		return fake_fault_arm(name, u, code);
	if (strcmp(req, "disarm") == 0) {
		*value = fake_fault_disarm();
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

static int fake_read_line(int fd, char *buf, size_t len)
{
	size_t n = 0;
	ssize_t r;

	while (n + 1 < len) {
		r = read(fd, buf + n, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0 || buf[n] == '\n')
			break;
		n++;
	}
	buf[n] = '\0';
	return n > 0 ? 0 : -1;
}

static void fake_write_all(int fd, const char *buf, size_t len)
{
	ssize_t w;

	while (len > 0) {
		w = write(fd, buf, len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		buf += w;
		len -= (size_t)w;
	}
}

/* One connection per thread: a lock waiting for calls in flight must not stop "state". */
static void *fake_conn_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char req[FAKE_LINE_MAX], reply[64];
	unsigned long long value = 0;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	if (fake_read_line(fd, req, sizeof(req)) == 0)
		rc = fake_serve(req, &value);
	snprintf(reply, sizeof(reply), "%d %llu\n", (int)rc, value);
	fake_write_all(fd, reply, strlen(reply));
	close(fd);
	return NULL;
}

static void *fake_service_main(void *arg)
{
	pthread_attr_t attr;
	pthread_t t;
	int fd;

	atomic_store(&fake_service_tid, (int)gettid());
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	for (;;) {
		fd = accept4(fake_listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
				continue;
			break;
		}
		if (pthread_create(&t, &attr, fake_conn_main, (void *)(intptr_t)fd) != 0)
			fake_conn_main((void *)(intptr_t)fd);
	}
	pthread_attr_destroy(&attr);
	return NULL;
}

static void fake_service_cleanup(void)
{
	if (getpid() == fake_owner)
		unlink(fake_sock_path);
}

CUresult fake_service_start(void)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	sigset_t all, old;
	pthread_t t;
	int err;

	if (fake_sock_name(getpid(), fake_sock_path, sizeof(fake_sock_path)) != 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	memcpy(sa.sun_path, fake_sock_path, sizeof(sa.sun_path));
	fake_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fake_listen_fd < 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	unlink(fake_sock_path); /* left by an earlier process with this pid */
	if (bind(fake_listen_fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
	    listen(fake_listen_fd, 16) != 0) {
		fprintf(stderr, "fakecuda: cannot serve %s: %s\n", fake_sock_path, strerror(errno));
		close(fake_listen_fd);
		fake_listen_fd = -1;
		return CUDA_ERROR_OPERATING_SYSTEM;
	}
	fake_owner = getpid();
	atexit(fake_service_cleanup);
	/* The application's signals must never be delivered to the driver's threads. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	err = pthread_create(&t, NULL, fake_service_main, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (err != 0)
		return CUDA_ERROR_OPERATING_SYSTEM;
	pthread_detach(t);
	return CUDA_SUCCESS;
}

/* ---- the client side ---- */

/* Connects to the service of a process in another PID or mount namespace (a container), as
 * the real driver reaches it with the pid our namespace gives it: its socket is named by its
 * own pid (NSpid) in its own FAKECUDA_DIR (from its environment, "/tmp" when unset) inside
 * its own root (gcr_procns). Only a socket whose peer credentials carry pid counts: the
 * container owns those files. Returns the fd, or -1. */
static int fake_connect_own_view(int pid)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct ucred peer;
	socklen_t plen = sizeof(peer);
	char dir[sizeof(sa.sun_path)];
	pid_t nspid;
	int dfd, fd, rc;

	rc = gcr_procns_env(pid, "FAKECUDA_DIR", dir, sizeof(dir), NULL);
	if (rc == -ENOENT || (rc == 0 && dir[0] == '\0'))
		snprintf(dir, sizeof(dir), "/tmp");
	else if (rc < 0)
		return -1;
	if (gcr_procns_nspid(pid, &nspid, NULL) < 0 || (dfd = gcr_procns_open_dir(pid, dir, NULL)) < 0)
		return -1;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/fakecuda-%d.sock", dfd, (int)nspid);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
			getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0 || peer.pid != pid)) {
		close(fd);
		fd = -1;
	}
	close(dfd);
	return fd;
}

CUresult fake_service_request(int pid, const char *request, char *reply, size_t len)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char line[FAKE_LINE_MAX];
	int fd, rc, n = 0;

	if (pid <= 0 || fake_sock_name(pid, sa.sun_path, sizeof(sa.sun_path)) != 0)
		return CUDA_ERROR_INVALID_VALUE;
	/* The driver's answers, measured with driver 580: a process that exists but never called
	 * cuInit is NOT_INITIALIZED, a pid that does not exist is OPERATING_SYSTEM. */
	if (gcr_procns_same(pid, NULL) == 0) {
		fd = fake_connect_own_view(pid);
	} else { /* our namespaces (or unknown): our FAKECUDA_DIR, as before */
		fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return CUDA_ERROR_OPERATING_SYSTEM;
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
			close(fd);
			fd = -1;
		}
	}
	if (fd < 0)
		return kill(pid, 0) == 0 || errno == EPERM ? CUDA_ERROR_NOT_INITIALIZED
							    : CUDA_ERROR_OPERATING_SYSTEM;
	snprintf(line, sizeof(line), "%s\n", request);
	fake_write_all(fd, line, strlen(line));
	if (fake_read_line(fd, line, sizeof(line)) != 0 || sscanf(line, "%d %n", &rc, &n) != 1) {
		close(fd);
		return CUDA_ERROR_OPERATING_SYSTEM; /* it died meanwhile */
	}
	close(fd);
	if (reply != NULL && len > 0)
		snprintf(reply, len, "%s", line + n);
	return (CUresult)rc;
}

/* Neither gated nor needing cuInit in the caller (as in the driver: the answer is about the
 * target): the caller is no part of the target's calls in flight, and a process that targets
 * itself must not wait for its own lock. */
static CUresult fake_client_enter(const char *base)
{
	return fake_fault_take(base);
}

#define FAKE_CLIENT_ENTER(base)                                   \
	do {                                                      \
		CUresult fake_client_rc_ = fake_client_enter(base); \
		if (fake_client_rc_ != CUDA_SUCCESS)              \
			return fake_client_rc_;                   \
	} while (0)

static bool fake_zeroed(const void *p, size_t len)
{
	const unsigned char *b = p;
	size_t i;

	for (i = 0; i < len; i++)
		if (b[i] != 0)
			return false;
	return true;
}

FAKE_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
	char value[32];
	CUresult rc;

	FAKE_CLIENT_ENTER("cuCheckpointProcessGetState");
	if (state == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_service_request(pid, "state", value, sizeof(value));
	if (rc == CUDA_SUCCESS)
		*state = (CUprocessState)atoi(value);
	return rc;
}

FAKE_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
	char value[32];
	CUresult rc;

	FAKE_CLIENT_ENTER("cuCheckpointProcessGetRestoreThreadId");
	if (tid == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_service_request(pid, "tid", value, sizeof(value));
	if (rc == CUDA_SUCCESS)
		*tid = atoi(value);
	return rc;
}

FAKE_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
	char req[32];

	FAKE_CLIENT_ENTER("cuCheckpointProcessLock");
	if (args != NULL &&
	    (args->reserved0 != 0 || !fake_zeroed(args->reserved1, sizeof(args->reserved1))))
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(req, sizeof(req), "lock %u", args != NULL ? args->timeoutMs : 0);
	return fake_service_request(pid, req, NULL, 0);
}

/* Test hook: with FAKECUDA_HOLD_AFTER_CHECKPOINT=PATH, the caller (gcrctl, the agent) creates
 * PATH once a checkpoint succeeded and then waits to be killed, so a test can cut a suspend
 * short between the driver's checkpoint and what its caller does next. */
static void fake_hold_after_checkpoint(void)
{
	const char *path = getenv("FAKECUDA_HOLD_AFTER_CHECKPOINT");
	if (path == NULL || *path == '\0')
		return;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd >= 0)
		close(fd);
	for (;;)
		pause();
}

FAKE_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
	FAKE_CLIENT_ENTER("cuCheckpointProcessCheckpoint");
	if (args != NULL && !fake_zeroed(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	CUresult rc = fake_service_request(pid, "checkpoint", NULL, 0);
	if (rc == CUDA_SUCCESS)
		fake_hold_after_checkpoint();
	return rc;
}

/* Remapping onto another GPU is accepted only as the identity: every fake device is alike,
 * but moving allocations between devices is not modelled. */
static CUresult fake_check_pairs(const CUcheckpointRestoreArgs *args)
{
	CUuuid u;
	unsigned int i;
	int d, old_dev, new_dev;

	if (args->gpuPairsCount > 0 && args->gpuPairs == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < args->gpuPairsCount; i++) {
		old_dev = new_dev = -1;
		for (d = 0; d < fake_device_count(); d++) {
			fake_device_uuid(d, &u);
			if (memcmp(u.bytes, args->gpuPairs[i].oldUuid.bytes, sizeof(u.bytes)) == 0)
				old_dev = d;
			if (memcmp(u.bytes, args->gpuPairs[i].newUuid.bytes, sizeof(u.bytes)) == 0)
				new_dev = d;
		}
		if (old_dev < 0 || new_dev < 0)
			return CUDA_ERROR_INVALID_VALUE;
		if (old_dev != new_dev)
			return CUDA_ERROR_NOT_SUPPORTED;
	}
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
	CUresult rc;

	FAKE_CLIENT_ENTER("cuCheckpointProcessRestore");
	if (args != NULL) {
		if (!fake_zeroed(args->reserved, sizeof(args->reserved)) || args->reserved1 != 0)
			return CUDA_ERROR_INVALID_VALUE;
		rc = fake_check_pairs(args);
		if (rc != CUDA_SUCCESS)
			return rc;
	}
	return fake_service_request(pid, "restore", NULL, 0);
}

FAKE_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
	FAKE_CLIENT_ENTER("cuCheckpointProcessUnlock");
	if (args != NULL && !fake_zeroed(args->reserved, sizeof(args->reserved)))
		return CUDA_ERROR_INVALID_VALUE;
	return fake_service_request(pid, "unlock", NULL, 0);
}
