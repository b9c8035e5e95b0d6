/* shim_ctl: accepts one peer at a time (operations are serialised anyway), checks
 * its credentials, and maps each request to shim_cr or a status snapshot. */
#include "config.h"
#include "shim_ctl.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_cr.h"
#include "shim_gate.h"
#include "shim_hip_hook.h"
#include "shim_hook.h"
#include "shim_real.h"
#include "shim_staging.h"

/* How long a peer may take to send a request line (ms): a stuck peer must not
 * block the next one forever. */
#define PEER_IDLE_MS 60000

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static char sock_path[256];
static pid_t owner_pid;

const char *shim_ctl_path(void)
{
	return sock_path;
}

/* Which GPU runtimes the process uses: gcrctl and the agent choose the backend from it. */
static json_t *backends_json(void)
{
	return json_pack("{s:b, s:b}", "cuda", shim_real_cuda_handle() != NULL, "hip", shim_hip_handle() != NULL);
}

/* The GPU memory the driver's restore of this process needs, as gcr_cr recorded it at the
 * last suspend (sent with trim, once the driver's checkpoint succeeded): it lives here, in the
 * process, so whichever tool resumes (gcrctl, the agent) finds it. Cleared by each suspend, so
 * a stale record never outlives the checkpoint it was taken for. */
static pthread_mutex_t need_lock = PTHREAD_MUTEX_INITIALIZER;
static json_t *restore_need;

static void need_set(json_t *need)
{
	pthread_mutex_lock(&need_lock);
	json_decref(restore_need);
	restore_need = need != NULL ? json_deep_copy(need) : NULL;
	pthread_mutex_unlock(&need_lock);
}

static json_t *status_json(void)
{
	struct shim_alloc_stats st;
	struct shim_staging_stats ss;
	shim_alloc_stats(&st);
	shim_staging_stats(&ss);
	json_t *j = json_pack(
		"{s:i, s:s, s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:{s:I, s:I, s:I, s:I, s:I, s:I},"
		" s:{s:I, s:I, s:I, s:i, s:I, s:b, s:I, s:f}}",
		"pid", (int)getpid(), "state", shim_cr_state_name(shim_cr_state()), "version", PACKAGE_VERSION,
		"bytes", "vmm", (json_int_t)st.vmm_bytes, "app_vmm", (json_int_t)st.app_vmm_bytes,
		"driver", (json_int_t)st.driver_bytes, "async", (json_int_t)st.async_bytes,
		"managed", (json_int_t)st.managed_bytes,
		"buffers", "vmm", (json_int_t)st.vmm_buffers, "app_vmm", (json_int_t)st.app_vmm_handles,
		"driver", (json_int_t)st.driver_buffers, "async", (json_int_t)st.async_buffers,
		"managed", (json_int_t)st.managed_buffers, "shared", (json_int_t)st.shared_handles,
		"staging", "capacity", (json_int_t)ss.capacity, "used", (json_int_t)ss.used,
		"ring", (json_int_t)ss.ring, "workers", ss.workers,
		"target", (json_int_t)ss.target, "ready", ss.ready,
		"grown_inline", (json_int_t)ss.grown_inline, "fault_ms", ss.fault_ms);
	if (j != NULL) {
		json_object_set_new(j, "backends", backends_json());
		pthread_mutex_lock(&need_lock);
		if (restore_need != NULL)
			json_object_set_new(j, "restore_need", json_deep_copy(restore_need));
		pthread_mutex_unlock(&need_lock);
	}
	return j;
}

static json_t *stats_json(void)
{
	json_t *calls = json_object();
	for (int i = 0; i < SHIM_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++) {
			const char *name = shim_hook_name((enum shim_hook_id)i, v);
			uint64_t n = name ? shim_gate_total_calls((enum shim_hook_id)i, v) : 0;
			if (n > 0)
				json_object_set_new(calls, name, json_integer((json_int_t)n));
		}
	for (int i = 0; i < SHIM_HIP_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++) {
			const char *name = shim_hip_hook_name((enum shim_hip_hook_id)i, v);
			uint64_t n = name ? shim_gate_total_hip_calls((enum shim_hip_hook_id)i, v) : 0;
			if (n > 0)
				json_object_set_new(calls, name, json_integer((json_int_t)n));
		}
	struct shim_alloc_stats st;
	shim_alloc_stats(&st);
	return json_pack("{s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I}, s:{s:I, s:I}, s:o}",
			 "calls", calls, "lookups", "dlsym_cu", (json_int_t)shim_lookups.dlsym_cu,
			 "dlsym_wrapped", (json_int_t)shim_lookups.dlsym_wrapped,
			 "dlsym_hip", (json_int_t)shim_hip_lookups.dlsym_hip,
			 "dlsym_hip_wrapped", (json_int_t)shim_hip_lookups.dlsym_wrapped,
			 "procaddr", (json_int_t)shim_lookups.procaddr,
			 "procaddr_wrapped", (json_int_t)shim_lookups.procaddr_wrapped,
			 "procaddr_by_name", (json_int_t)shim_lookups.procaddr_by_name,
			 "procaddr_passthrough", (json_int_t)shim_lookups.procaddr_passthrough,
			 "gate", "waits", (json_int_t)shim_gate_waits(),
			 "decisions", "converted", (json_int_t)st.converted_total,
			 "fallback", (json_int_t)st.fallback_total, "status", status_json());
}

static json_t *report_json(const struct shim_cr_report *r)
{
	return json_pack("{s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:I, s:s}",
			 "ms", "gate", r->ms_gate, "sync", r->ms_sync, "digest", r->ms_digest, "plan",
			 r->ms_copy_prep, "copy", r->ms_copy, "release", r->ms_release, "map", r->ms_map,
			 "ctx", r->ms_ctx, "total", r->ms_total, "ctx_freed", (json_int_t)r->ctx_freed, "bytes",
			 (json_int_t)r->bytes, "copied", (json_int_t)r->copied,
			 "zero", (json_int_t)r->zero, "unchanged", (json_int_t)r->unchanged, "host",
			 (json_int_t)r->host, "handles", (json_int_t)r->handles, "mappings",
			 (json_int_t)r->mappings, "state", shim_cr_state_name(shim_cr_state()));
}

/* Returns the reply line for one request line (malloc'd), or NULL if out of memory. */
static char *handle_line(const char *line)
{
	struct gcr_req req;
	struct gcr_err err = { 0 };
	if (gcr_proto_parse_request(line, &req, &err) < 0)
		return gcr_proto_reply_err_line(0, err.code, err.msg);
	char *out = NULL;
	struct shim_cr_report rep;
	int rc = 0;
	json_t *result = NULL;
	switch (req.op) {
	case GCR_OP_STATUS_ID:
		result = status_json();
		break;
	case GCR_OP_STATS_ID:
		result = stats_json();
		break;
	case GCR_OP_SUSPEND_ID: {
		json_t *t = json_object_get(req.args, "timeout_ms");
		int timeout = shim_cfg.gate_timeout_ms;
		if (t != NULL) {
			if (!json_is_integer(t) || json_integer_value(t) < 1 || json_integer_value(t) > 3600000) {
				rc = gcr_err_set(&err, -EINVAL, "\"timeout_ms\" must be an integer in 1..3600000");
				break;
			}
			timeout = (int)json_integer_value(t);
		}
		need_set(NULL);
		rc = shim_cr_suspend(timeout, &rep, &err);
		if (rc == 0)
			result = report_json(&rep);
		break;
	}
	case GCR_OP_TRIM_ID: {
		json_t *need = json_object_get(req.args, "restore_need");
		if (need != NULL && !json_is_object(need)) {
			rc = gcr_err_set(&err, -EINVAL, "\"restore_need\" must be an object");
			break;
		}
		if (need != NULL)
			need_set(need);
		shim_cr_trim();
		result = json_object();
		break;
	}
	case GCR_OP_RESUME_ID:
		rc = shim_cr_resume(&rep, &err);
		if (rc == 0)
			result = report_json(&rep);
		break;
	default:
		rc = gcr_err_set(&err, -EOPNOTSUPP, "unsupported op");
	}
	if (rc < 0)
		out = gcr_proto_reply_err_line(req.id, rc, err.msg);
	else
		out = gcr_proto_reply_ok_line(req.id, result);
	gcr_req_clear(&req);
	return out;
}

/* Root (the agent, gcrctl under sudo) or the process's own user may connect. */
static int peer_allowed(int fd)
{
	struct gcr_peer peer;
	struct gcr_err err;
	if (gcr_sock_peer(fd, &peer, &err) < 0)
		return 0;
	return peer.uid == 0 || peer.uid == geteuid();
}

static void serve_peer(int fd)
{
	struct gcr_linebuf lb;
	gcr_linebuf_init(&lb, GCR_PROTO_MAX_LINE);
	struct gcr_err err;
	if (!peer_allowed(fd)) {
		char *line = gcr_proto_reply_err_line(0, -EACCES, "permission denied: peer is neither root nor the process owner");
		if (line != NULL)
			gcr_sock_write_all(fd, line, strlen(line), 1000, &err);
		free(line);
		goto out;
	}
	for (;;) {
		char *line;
		int rc = gcr_linebuf_read(&lb, fd, PEER_IDLE_MS, &line, &err);
		if (rc < 0) {
			if (rc == -EMSGSIZE || rc == -EBADMSG) {
				char *reply = gcr_proto_reply_err_line(0, rc, err.msg);
				if (reply != NULL)
					gcr_sock_write_all(fd, reply, strlen(reply), 1000, &err);
				free(reply);
			}
			break;
		}
		char *reply = handle_line(line);
		if (reply == NULL)
			break;
		rc = gcr_sock_write_all(fd, reply, strlen(reply), 10000, &err);
		free(reply);
		if (rc < 0)
			break;
	}
out:
	gcr_linebuf_free(&lb);
	close(fd);
}

static void *ctl_thread(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	shim_real_relax_capture();
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			GCR_LOG(GCR_LOG_ERROR, "shim", "control socket accept: %s", strerror(errno));
			break;
		}
		serve_peer(fd);
	}
	close(lfd);
	return NULL;
}

static void remove_socket(void)
{
	/* A forked child inherits this handler; only the owner removes its socket. */
	if (sock_path[0] != '\0' && getpid() == owner_pid)
		unlink(sock_path);
}

/* Tells the node agent this process exists (GCR_AGENT_SOCKET, set by the device
 * plugin). Best effort and bounded: the application must never wait on the agent. */
static int agent_fd = -1;

static void register_with_agent(void)
{
	const char *path = getenv(GCR_AGENT_SOCKET_ENV);
	if (path == NULL || path[0] == '\0')
		return;
	struct gcr_err err;
	int fd = gcr_sock_connect(path, 1000, &err);
	if (fd < 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "not registered with the node agent at %s: %s; it will not find "
			"this process for Checkpoints", path, err.msg);
		return;
	}
	char *line = gcr_proto_request_line(0, GCR_OP_REGISTER_ID,
					    json_pack("{s:s, s:s}", "socket", sock_path, "version", PACKAGE_VERSION));
	if (line == NULL || gcr_sock_write_all(fd, line, strlen(line), 1000, &err) < 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "not registered with the node agent at %s: %s; it will not find "
			"this process for Checkpoints", path, line == NULL ? "out of memory" : err.msg);
		close(fd);
	} else {
		agent_fd = fd; /* kept open: the agent sees EOF when the process exits */
	}
	free(line);
}

static void start(void)
{
	owner_pid = getpid();
	struct gcr_err err;
	snprintf(sock_path, sizeof(sock_path), "%s/gcr-%d.sock", shim_cfg.socket_dir, (int)owner_pid);
	int lfd = gcr_sock_listen(sock_path, &err);
	if (lfd < 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "no control socket (%s); this process cannot be suspended",
			err.msg);
		sock_path[0] = '\0';
		return;
	}
	/* The control thread must not take the application's signals. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_t th;
	int prc = pthread_create(&th, NULL, ctl_thread, (void *)(intptr_t)lfd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (prc != 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "cannot start the control thread: %s", strerror(prc));
		close(lfd);
		unlink(sock_path);
		sock_path[0] = '\0';
		return;
	}
	pthread_detach(th);
	atexit(remove_socket);
	GCR_LOG(GCR_LOG_INFO, "shim", "control socket %s", sock_path);
	register_with_agent();
}

static void reset_after_fork(void)
{
	/* The child has no control thread; it gets its own socket if it initialises CUDA. */
	start_once = (pthread_once_t)PTHREAD_ONCE_INIT;
	sock_path[0] = '\0';
	if (agent_fd >= 0) {
		close(agent_fd); /* the parent's registration, not ours */
		agent_fd = -1;
	}
}

void shim_ctl_start(void)
{
	pthread_once(&start_once, start);
}

__attribute__((constructor)) static void shim_ctl_atfork(void)
{
	pthread_atfork(NULL, NULL, reset_after_fork);
}
