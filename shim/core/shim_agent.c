/* shim_agent: the registry connection to the node agent: "register" once, then, for a process
 * that opted in to overcommit, "room" requests when an allocation fails for want of GPU memory,
 * and "wake" when a thread reaches the gate of a suspend the agent made. */
#include "config.h"
#include "shim_agent.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "gcr_time.h"
#include "shim_config.h"

/* How long registering may take (ms): the application must never wait on the agent. */
#define REGISTER_MS 1000
/* Longest reply line the agent sends on this connection (bytes). */
#define REPLY_MAX 4096

/* The lock guards fd, the line buffer and the request ids; a room request holds it while it
 * waits for its answer, so requests from several threads go one at a time. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fd = -1;
static struct gcr_linebuf lb;
static long long next_id = 1;
static char sock_copy[256]; /* the control socket, to register again after the agent restarted */
/* Requests granted so far: a thread that waited for the lock while another's was granted
 * retries its allocation first instead of asking again. */
static atomic_ulong grants;

int shim_agent_overcommit(void)
{
	return shim_cfg.overcommit;
}

/* Connects and sends "register"; the caller holds the lock. */
static int connect_locked(struct gcr_err *err)
{
	const char *path = getenv(GCR_AGENT_SOCKET_ENV);
	if (path == NULL || path[0] == '\0')
		return gcr_err_set(err, -ENOENT, "no %s", GCR_AGENT_SOCKET_ENV);
	int s = gcr_sock_connect(path, REGISTER_MS, err);
	if (s < 0)
		return s;
	char *line = gcr_proto_request_line(0, GCR_OP_REGISTER_ID,
					    json_pack("{s:s, s:s}", "socket", sock_copy, "version", PACKAGE_VERSION));
	int rc = line == NULL ? gcr_err_set(err, -ENOMEM, "out of memory for the request")
			      : gcr_sock_write_all(s, line, strlen(line), REGISTER_MS, err);
	free(line);
	if (rc < 0) {
		close(s);
		return rc;
	}
	fd = s; /* kept open: the agent sees EOF when the process exits */
	gcr_linebuf_free(&lb);
	gcr_linebuf_init(&lb, REPLY_MAX);
	return 0;
}

static void close_locked(void)
{
	if (fd >= 0)
		close(fd);
	fd = -1;
	gcr_linebuf_free(&lb);
}

void shim_agent_register(const char *sock_path)
{
	const char *path = getenv(GCR_AGENT_SOCKET_ENV);
	if (path == NULL || path[0] == '\0')
		return;
	struct gcr_err err;
	pthread_mutex_lock(&lock);
	snprintf(sock_copy, sizeof(sock_copy), "%s", sock_path);
	close_locked();
	int rc = connect_locked(&err);
	pthread_mutex_unlock(&lock);
	if (rc < 0)
		gcr_log_problem("shim", "pid %d not registered with the node agent at %s: %s; it will not find "
				"this process for Checkpoints", (int)getpid(), path, err.msg);
}

void shim_agent_drop(void)
{
	pthread_mutex_lock(&lock);
	close_locked();
	pthread_mutex_unlock(&lock);
}

void shim_agent_after_fork(void)
{
	/* Another thread may have held the lock at the fork: only this thread lives on. */
	pthread_mutex_init(&lock, NULL);
	if (fd >= 0)
		close(fd); /* the parent's registration, not ours */
	fd = -1;
	memset(&lb, 0, sizeof(lb)); /* its buffer is the parent's copy: dropped, not freed twice */
	atomic_store(&grants, 0);
}

static long left_ms(double deadline)
{
	double left = deadline - gcr_time_mono_ms();
	return left > 0 ? (long)left + 1 : 0;
}

/* Sends one room request and waits for the reply with its id until deadline (ms on the
 * monotonic clock). 0 granted, -ENOSPC refused, -ETIMEDOUT, -EPIPE the connection broke
 * (the agent restarted: the caller registers again). The caller holds the lock. */
static int exchange_locked(size_t bytes, int device, double deadline, struct gcr_err *err)
{
	long long id = next_id++;
	char *line = gcr_proto_request_line(id, GCR_OP_ROOM_ID,
					    json_pack("{s:I, s:i}", "bytes", (json_int_t)bytes, "device", device));
	if (line == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for the request");
	int rc = gcr_sock_write_all(fd, line, strlen(line), (int)left_ms(deadline), err);
	free(line);
	if (rc < 0) /* a line cut short would garble the next one: the connection is done either way */
		return gcr_err_set(err, -EPIPE, "the request could not be sent: %s", err->msg);
	for (;;) {
		char *l;
		int n = gcr_linebuf_next(&lb, &l, err);
		if (n < 0)
			return gcr_err_set(err, -EPIPE, "the agent sent a line too long");
		if (n == 0) {
			long ms = left_ms(deadline);
			if (ms <= 0)
				return gcr_err_set(err, -ETIMEDOUT, "no answer from the agent in %d ms",
						   shim_cfg.room_timeout_ms);
			struct pollfd p = { .fd = fd, .events = POLLIN };
			int pr = poll(&p, 1, (int)(ms > 1000000 ? 1000000 : ms));
			if (pr < 0 && errno != EINTR)
				return gcr_err_set(err, -EPIPE, "poll: %s", strerror(errno));
			if (pr <= 0)
				continue;
			long got = gcr_linebuf_fill(&lb, fd, err);
			if (got < 0 && got != -EAGAIN && got != -EWOULDBLOCK)
				return gcr_err_set(err, -EPIPE, "the agent's connection closed");
			continue;
		}
		struct gcr_reply rep;
		if (gcr_proto_parse_reply(l, &rep, err) < 0)
			return gcr_err_set(err, -EPIPE, "a bad reply from the agent: %s", err->msg);
		if (rep.id != id) { /* the late answer to a request that timed out: not ours */
			gcr_reply_clear(&rep);
			continue;
		}
		if (!rep.ok)
			rc = gcr_err_set(err, rep.code < 0 ? rep.code : -EPROTO, "the agent: %s", rep.message);
		else if (json_is_true(json_object_get(rep.result, "granted")))
			rc = 0;
		else
			rc = gcr_err_set(err, -ENOSPC, "the agent made no room: %s",
					 json_string_value(json_object_get(rep.result, "reason"))
						 ? json_string_value(json_object_get(rep.result, "reason"))
						 : "no reason given");
		gcr_reply_clear(&rep);
		return rc;
	}
}

int shim_agent_room(size_t bytes, int device)
{
	if (!shim_cfg.overcommit)
		return -ENOTSUP;
	double t0 = gcr_time_mono_ms(), deadline = t0 + shim_cfg.room_timeout_ms;
	unsigned long seen = atomic_load(&grants);
	struct timespec dl;
	gcr_time_deadline(&dl, shim_cfg.room_timeout_ms);
	if (pthread_mutex_timedlock(&lock, &dl) != 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "room for %zu bytes: another request held the agent's connection "
			"past %d ms; out of memory", bytes, shim_cfg.room_timeout_ms);
		return -ETIMEDOUT;
	}
	if (atomic_load(&grants) != seen) { /* room was made while we waited: try that first */
		pthread_mutex_unlock(&lock);
		return 0;
	}
	struct gcr_err err = { 0 };
	int rc = fd >= 0 ? 0 : connect_locked(&err);
	if (rc == 0)
		rc = exchange_locked(bytes, device, deadline, &err);
	if (rc == -EPIPE && left_ms(deadline) > 0) {
		/* The agent restarted since we registered: register with the new one, ask again. */
		close_locked();
		rc = connect_locked(&err);
		if (rc == 0)
			rc = exchange_locked(bytes, device, deadline, &err);
	}
	if (rc == -EPIPE)
		close_locked();
	if (rc == 0)
		atomic_fetch_add(&grants, 1);
	pthread_mutex_unlock(&lock);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "shim", "room for %zu bytes on device %d made by the agent in %.1f ms; "
			"allocating again", bytes, device, gcr_time_mono_ms() - t0);
	else
		GCR_LOG(GCR_LOG_WARN, "shim", "no room for %zu bytes on device %d (%s); the application gets "
			"out-of-memory", bytes, device, err.msg);
	return rc;
}

/* One wake line on the connection; the caller holds the lock. */
static int wake_locked(long long waited_ms, struct gcr_err *err)
{
	if (waited_ms > GCR_WAKE_MAX_WAITED_MS)
		waited_ms = GCR_WAKE_MAX_WAITED_MS;
	char *line = gcr_proto_request_line(next_id++, GCR_OP_WAKE_ID, json_pack("{s:I}", "waited_ms",
										  (json_int_t)(waited_ms < 0 ? 0 : waited_ms)));
	if (line == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for the line");
	int rc = gcr_sock_write_all(fd, line, strlen(line), REGISTER_MS, err);
	free(line);
	return rc;
}

int shim_agent_wake(long long waited_ms)
{
	struct gcr_err err = { 0 };
	struct timespec dl;
	gcr_time_deadline(&dl, REGISTER_MS);
	/* Nobody holds the lock long while this process is suspended: a room request is a gated
	 * call, over before the gate closed. */
	if (pthread_mutex_timedlock(&lock, &dl) != 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "wake not sent: the agent's connection stayed busy %d ms; the process "
			"stays suspended until the agent resumes it", REGISTER_MS);
		return -ETIMEDOUT;
	}
	int rc = fd >= 0 ? wake_locked(waited_ms, &err) : -EPIPE;
	if (rc < 0) {
		/* The agent restarted since we registered: register with the new one, tell it. */
		close_locked();
		rc = connect_locked(&err);
		if (rc == 0)
			rc = wake_locked(waited_ms, &err);
		if (rc < 0)
			close_locked();
	}
	pthread_mutex_unlock(&lock);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "shim", "suspended by the agent and called: wake sent (first caller waited "
			"%lld ms)", waited_ms);
	else
		GCR_LOG(GCR_LOG_WARN, "shim", "suspended by the agent and called, but the agent could not be told (%s); "
			"the process stays suspended until the agent resumes it", err.msg);
	return rc;
}
