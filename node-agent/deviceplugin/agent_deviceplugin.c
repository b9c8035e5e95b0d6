/* agent_deviceplugin: the kubelet device plugin over gRPC core: one thread, one completion
 * queue, every handler answered without blocking; kubelet restarts found by polling its socket. */
#include "agent_deviceplugin.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "agent_dpmsg.h"
#include "gcr_log.h"
#include "gcr_time.h"

#define LOG_COMP "deviceplugin"
#define REGISTER_TIMEOUT_MS 5000 /* one Register call to the kubelet */
#define REGISTER_RETRY_MS 1000   /* after a failed one, while kubelet.sock stays */
#define DIR_MAX 160              /* an allocation dir: socket root (< 100 bytes) + / + 32 hex */

enum dp_method {
	M_UNKNOWN,
	M_OPTIONS,
	M_LIST_AND_WATCH,
	M_PREFERRED,
	M_ALLOCATE,
	M_PRESTART,
};

static const struct {
	const char *path;
	enum dp_method method;
} methods[] = {
	{ "/v1beta1.DevicePlugin/GetDevicePluginOptions", M_OPTIONS },
	{ "/v1beta1.DevicePlugin/ListAndWatch", M_LIST_AND_WATCH },
	{ "/v1beta1.DevicePlugin/GetPreferredAllocation", M_PREFERRED },
	{ "/v1beta1.DevicePlugin/Allocate", M_ALLOCATE },
	{ "/v1beta1.DevicePlugin/PreStartContainer", M_PRESTART },
};

/* What a completion-queue tag points at; the first member of every tagged object. */
enum tag_kind {
	T_NEW_CALL,     /* grpc_server_request_call finished */
	T_RECV,         /* the request message arrived */
	T_UNARY_DONE,   /* answer sent, call closed */
	T_STREAM_SEND,  /* one ListAndWatch message sent */
	T_STREAM_CLOSE, /* the ListAndWatch call ended (cancelled or closed) */
	T_SHUTDOWN,     /* a server finished shutting down */
	T_REGISTER,     /* our Register call to the kubelet finished */
};

struct dp_tag {
	enum tag_kind kind;
	void *obj;
};

/* One server call, unary or the ListAndWatch stream. */
struct dp_call {
	struct agent_dp *dp;
	grpc_call *call;
	grpc_call_details details;
	grpc_metadata_array md;
	grpc_byte_buffer *recv;
	grpc_byte_buffer *send;
	grpc_slice status_details;
	int cancelled;
	enum dp_method method;
	struct dp_tag tag_main, tag_close;
	/* stream only */
	int batches;            /* batches in flight; freed when 0 after closing */
	bool closed, send_pending;
	unsigned sent_gen;
	struct dp_call *next;   /* in dp->streams */
};

struct dp_register {
	struct dp_tag tag;
	grpc_channel *channel;
	grpc_call *call;
	grpc_byte_buffer *send, *recv;
	grpc_metadata_array md_init, md_trail;
	grpc_status_code status;
	grpc_slice details;
};

struct agent_dp {
	/* configuration, owned copies */
	char *resource_name, *kubelet_dir, *endpoint, *shim_host_dir, *shim_container_dir;
	char *socket_root, *socket_container_dir, *agent_socket, *agent_host_dir;
	char *agent_container_dir, *agent_container_socket, *cdi_device, *image_root;
	char **shim_env; /* name, value, ... (2 * n_shim_env strings) */
	size_t n_shim_env;
	char sock_path[PATH_MAX], kubelet_sock[PATH_MAX];
	unsigned slots, poll_ms;

	atomic_bool healthy;
	atomic_uint health_gen;
	atomic_uint registrations;
	atomic_bool stop;
	bool started, grpc_up;
	pthread_t thread;

	/* thread-owned */
	grpc_completion_queue *cq;
	grpc_server *server;        /* the one serving, or NULL */
	grpc_server *old_server;    /* shutting down */
	struct dp_tag shutdown_tag;
	struct dp_call *streams;
	struct dp_register *reg;    /* in flight, or NULL */
	bool kubelet_seen;          /* kubelet.sock existed at the last poll */
	ino_t kubelet_ino;
	struct timespec kubelet_ctime;
	bool want_register;
	int64_t retry_at_ms;        /* monotonic; 0: none */
	unsigned live_calls;        /* dp_call objects alive, for the final drain */
};

static gpr_timespec deadline_in(unsigned ms)
{
	return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
			    gpr_time_from_millis((int64_t)ms, GPR_TIMESPAN));
}

/* ---- configuration ---- */

static char *dup_or(const char *s, const char *def)
{
	return strdup(s != NULL && s[0] != '\0' ? s : def);
}

/* Absolute, no "..", shorter than a Unix socket path can be. */
static int check_path(const char *what, const char *p, struct gcr_err *err)
{
	if (p[0] != '/' || strstr(p, "/..") != NULL || strlen(p) > 100)
		return gcr_err_set(err, -EINVAL, "%s %s: want an absolute path under 100 bytes, no ..",
				   what, p);
	return 0;
}

bool agent_dp_path_under(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	while (n > 1 && dir[n - 1] == '/')
		n--;
	return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/' || n == 1);
}

static char *dirname_dup(const char *path)
{
	char *d = strdup(path), *slash;

	if (d == NULL)
		return NULL;
	slash = strrchr(d, '/');
	if (slash == d)
		slash[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	return d;
}

int agent_dp_env_check(const char *name, const char *value, struct gcr_err *err)
{
	static const char *const own[] = { "LD_PRELOAD", "GCR_SOCKET_DIR", "GCR_AGENT_SOCKET" };
	size_t n = name != NULL ? strnlen(name, AGENT_DP_SHIM_ENV_LEN + 1) : 0;

	if (n == 0 || n > AGENT_DP_SHIM_ENV_LEN)
		return gcr_err_set(err, -EINVAL, "shim env name: want 1..%d bytes", AGENT_DP_SHIM_ENV_LEN);
	for (size_t i = 0; i < n; i++) {
		char ch = name[i];
		bool ok = ch == '_' || (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
			  (i > 0 && ch >= '0' && ch <= '9');
		if (!ok)
			return gcr_err_set(err, -EINVAL, "shim env name '%.64s': want [A-Za-z_][A-Za-z0-9_]*",
					   name);
	}
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
		if (strcmp(name, own[i]) == 0)
			return gcr_err_set(err, -EINVAL, "shim env %s: set by the device plugin itself", name);
	if (value == NULL || strnlen(value, AGENT_DP_SHIM_ENV_LEN + 1) > AGENT_DP_SHIM_ENV_LEN)
		return gcr_err_set(err, -EINVAL, "shim env %s: value missing or over %d bytes", name,
				   AGENT_DP_SHIM_ENV_LEN);
	return 0;
}

/* Checks and copies cfg's shim env into dp (name, value pairs). */
static int shim_env_copy(struct agent_dp *dp, const struct agent_dp_config *cfg, struct gcr_err *err)
{
	if (cfg->n_shim_env > AGENT_DP_SHIM_ENV_MAX)
		return gcr_err_set(err, -EINVAL, "device plugin: %zu shim env entries, at most %d",
				   cfg->n_shim_env, AGENT_DP_SHIM_ENV_MAX);
	if (cfg->n_shim_env == 0)
		return 0;
	dp->shim_env = calloc(2 * cfg->n_shim_env, sizeof(*dp->shim_env));
	if (dp->shim_env == NULL)
		return gcr_err_set(err, -ENOMEM, "device plugin: out of memory");
	for (size_t i = 0; i < cfg->n_shim_env; i++) {
		const struct agent_dp_env *e = &cfg->shim_env[i];
		if (agent_dp_env_check(e->name, e->value, err) < 0) {
			gcr_err_wrap(err, "device plugin");
			return -EINVAL;
		}
		for (size_t j = 0; j < i; j++)
			if (strcmp(cfg->shim_env[j].name, e->name) == 0)
				return gcr_err_set(err, -EINVAL, "device plugin: shim env %s given twice", e->name);
		dp->n_shim_env = i + 1; /* freed from here on */
		dp->shim_env[2 * i] = strdup(e->name);
		dp->shim_env[2 * i + 1] = strdup(e->value);
		if (dp->shim_env[2 * i] == NULL || dp->shim_env[2 * i + 1] == NULL)
			return gcr_err_set(err, -ENOMEM, "device plugin: out of memory");
	}
	return 0;
}

struct agent_dp *agent_dp_new(const struct agent_dp_config *cfg, struct gcr_err *err)
{
	struct agent_dp *dp = calloc(1, sizeof(*dp));
	const char *base;

	if (dp == NULL) {
		gcr_err_set(err, -ENOMEM, "device plugin: out of memory");
		return NULL;
	}
	dp->resource_name = dup_or(cfg->resource_name, "gpucr.dev/shim");
	dp->kubelet_dir = dup_or(cfg->kubelet_dir, "/var/lib/kubelet/device-plugins");
	dp->endpoint = dup_or(cfg->endpoint, "gcr-shim.sock");
	dp->shim_host_dir = dup_or(cfg->shim_host_dir, "/opt/gcr/lib");
	dp->shim_container_dir = dup_or(cfg->shim_container_dir, "/opt/gcr/lib");
	dp->socket_root = dup_or(cfg->socket_root, "/run/gcr/alloc");
	dp->socket_container_dir = dup_or(cfg->socket_container_dir, "/run/gcr/sock");
	dp->agent_socket = dup_or(cfg->agent_socket, "/run/gcr/agent/agent.sock");
	dp->agent_container_dir = dup_or(cfg->agent_container_dir, "/run/gcr/agent");
	dp->cdi_device = cfg->cdi_device != NULL && cfg->cdi_device[0] ? strdup(cfg->cdi_device) : NULL;
	dp->image_root = cfg->image_root != NULL && cfg->image_root[0] ? strdup(cfg->image_root) : NULL;
	dp->slots = cfg->slots ? cfg->slots : 16;
	dp->poll_ms = cfg->poll_ms ? cfg->poll_ms : 100;
	atomic_init(&dp->healthy, true);
	atomic_init(&dp->health_gen, 1);
	atomic_init(&dp->registrations, 0);
	atomic_init(&dp->stop, false);
	if (!dp->resource_name || !dp->kubelet_dir || !dp->endpoint || !dp->shim_host_dir ||
	    !dp->shim_container_dir || !dp->socket_root || !dp->socket_container_dir ||
	    !dp->agent_socket || !dp->agent_container_dir ||
	    (cfg->cdi_device && cfg->cdi_device[0] && !dp->cdi_device) ||
	    (cfg->image_root && cfg->image_root[0] && !dp->image_root)) {
		gcr_err_set(err, -ENOMEM, "device plugin: out of memory");
		goto fail;
	}
	dp->agent_host_dir = dirname_dup(dp->agent_socket);
	base = strrchr(dp->agent_socket, '/');
	if (dp->agent_host_dir == NULL || base == NULL ||
	    asprintf(&dp->agent_container_socket, "%s%s", dp->agent_container_dir, base) < 0) {
		dp->agent_container_socket = NULL;
		gcr_err_set(err, -ENOMEM, "device plugin: out of memory");
		goto fail;
	}
	if (dp->slots > AGENT_DPMSG_MAX_SLOTS) {
		gcr_err_set(err, -EINVAL, "device plugin: slots %u, at most %u", dp->slots,
			    AGENT_DPMSG_MAX_SLOTS);
		goto fail;
	}
	/* resource names are <domain>/<name>: one slash, both sides non-empty */
	base = strchr(dp->resource_name, '/');
	if (base == NULL || base == dp->resource_name || base[1] == '\0' || strchr(base + 1, '/') ||
	    strlen(dp->resource_name) > 253) {
		gcr_err_set(err, -EINVAL, "device plugin: resource name %s: want domain/name",
			    dp->resource_name);
		goto fail;
	}
	if (strchr(dp->endpoint, '/') != NULL || strcmp(dp->endpoint, "kubelet.sock") == 0 ||
	    dp->endpoint[0] == '.') {
		gcr_err_set(err, -EINVAL, "device plugin: endpoint %s: want a file name", dp->endpoint);
		goto fail;
	}
	if (check_path("kubelet dir", dp->kubelet_dir, err) < 0 ||
	    check_path("shim host dir", dp->shim_host_dir, err) < 0 ||
	    check_path("shim container dir", dp->shim_container_dir, err) < 0 ||
	    check_path("socket root", dp->socket_root, err) < 0 ||
	    check_path("socket container dir", dp->socket_container_dir, err) < 0 ||
	    check_path("agent socket", dp->agent_socket, err) < 0 ||
	    check_path("agent container dir", dp->agent_container_dir, err) < 0 ||
	    (dp->image_root != NULL && check_path("image root", dp->image_root, err) < 0))
		goto fail;
	/* Every container sees the agent socket's directory: other pods' dirs must not be in it. */
	if (agent_dp_path_under(dp->socket_root, dp->agent_host_dir)) {
		gcr_err_set(err, -EINVAL,
			    "device plugin: socket root %s lies in the agent socket's dir %s, which every pod sees",
			    dp->socket_root, dp->agent_host_dir);
		goto fail;
	}
	if (shim_env_copy(dp, cfg, err) < 0)
		goto fail;
	snprintf(dp->sock_path, sizeof(dp->sock_path), "%s/%s", dp->kubelet_dir, dp->endpoint);
	snprintf(dp->kubelet_sock, sizeof(dp->kubelet_sock), "%s/kubelet.sock", dp->kubelet_dir);
	return dp;
fail:
	agent_dp_free(dp);
	return NULL;
}

void agent_dp_set_healthy(struct agent_dp *dp, bool healthy)
{
	if (atomic_exchange(&dp->healthy, healthy) != healthy)
		atomic_fetch_add(&dp->health_gen, 1);
}

unsigned agent_dp_registrations(struct agent_dp *dp)
{
	return atomic_load(&dp->registrations);
}

/* ---- byte buffers ---- */

static grpc_byte_buffer *buffer_take(uint8_t *buf, size_t len)
{
	grpc_slice s;
	grpc_byte_buffer *bb;

	if (buf == NULL)
		return NULL;
	s = grpc_slice_from_copied_buffer((const char *)buf, len);
	bb = grpc_raw_byte_buffer_create(&s, 1);
	grpc_slice_unref(s);
	free(buf);
	return bb;
}

/* The whole message as one slice (unref it); len 0 when bb is NULL. */
static grpc_slice buffer_read(grpc_byte_buffer *bb)
{
	grpc_byte_buffer_reader r;
	grpc_slice s;

	if (bb == NULL || !grpc_byte_buffer_reader_init(&r, bb))
		return grpc_empty_slice();
	s = grpc_byte_buffer_reader_readall(&r);
	grpc_byte_buffer_reader_destroy(&r);
	return s;
}

/* ---- server calls ---- */

static void request_call(struct agent_dp *dp);

static void call_free(struct dp_call *c)
{
	if (c->call)
		grpc_call_unref(c->call);
	grpc_call_details_destroy(&c->details);
	grpc_metadata_array_destroy(&c->md);
	if (c->recv)
		grpc_byte_buffer_destroy(c->recv);
	if (c->send)
		grpc_byte_buffer_destroy(c->send);
	grpc_slice_unref(c->status_details);
	c->dp->live_calls--;
	free(c);
}

/* Answers a unary call: the message (NULL: none) and a status, then frees on T_UNARY_DONE. */
static void unary_finish(struct dp_call *c, grpc_byte_buffer *msg, grpc_status_code code,
			 const char *detail)
{
	grpc_op ops[4];
	size_t n = 0;

	memset(ops, 0, sizeof(ops));
	if (code == GRPC_STATUS_OK && msg == NULL) {
		code = GRPC_STATUS_RESOURCE_EXHAUSTED;
		detail = "out of memory";
	}
	c->send = msg;
	grpc_slice_unref(c->status_details);
	c->status_details = grpc_slice_from_copied_string(detail ? detail : "");
	ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (code == GRPC_STATUS_OK) {
		ops[n].op = GRPC_OP_SEND_MESSAGE;
		ops[n++].data.send_message.send_message = msg;
	}
	ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
	ops[n].data.send_status_from_server.status = code;
	ops[n++].data.send_status_from_server.status_details = &c->status_details;
	ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
	c->tag_main.kind = T_UNARY_DONE;
	if (grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL) != GRPC_CALL_OK) {
		GCR_LOG(GCR_LOG_ERROR, LOG_COMP, "cannot answer a call");
		call_free(c);
	}
}

static void stream_send(struct dp_call *c, bool first)
{
	struct agent_dp *dp = c->dp;
	grpc_op ops[2];
	size_t n = 0, len = 0;
	unsigned gen = atomic_load(&dp->health_gen);
	uint8_t *buf = agent_dpmsg_devices_encode(dp->slots, atomic_load(&dp->healthy), &len);

	memset(ops, 0, sizeof(ops));
	if (c->send)
		grpc_byte_buffer_destroy(c->send);
	c->send = buffer_take(buf, len);
	if (c->send == NULL)
		return; /* out of memory: the next poll tries again */
	if (first)
		ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[n].op = GRPC_OP_SEND_MESSAGE;
	ops[n++].data.send_message.send_message = c->send;
	c->tag_main.kind = T_STREAM_SEND;
	if (grpc_call_start_batch(c->call, ops, n, &c->tag_main, NULL) == GRPC_CALL_OK) {
		c->batches++;
		c->send_pending = true;
		c->sent_gen = gen;
	}
}

static void stream_maybe_free(struct dp_call *c)
{
	struct dp_call **pp;

	if (!c->closed || c->batches > 0)
		return;
	for (pp = &c->dp->streams; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	call_free(c);
}

static void stream_start(struct dp_call *c)
{
	grpc_op op;

	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
	op.data.recv_close_on_server.cancelled = &c->cancelled;
	c->tag_close.kind = T_STREAM_CLOSE;
	if (grpc_call_start_batch(c->call, &op, 1, &c->tag_close, NULL) != GRPC_CALL_OK) {
		call_free(c);
		return;
	}
	c->batches = 1;
	c->next = c->dp->streams;
	c->dp->streams = c;
	GCR_LOG(GCR_LOG_INFO, LOG_COMP, "ListAndWatch: stream opened, %u slots", c->dp->slots);
	stream_send(c, true);
}

/* A new directory any user may write into but not list, and only remove their own entries from
 * (mode 01733, set after mkdir so the umask cannot narrow it): the workload's shim creates its
 * socket or its image files there. Removed again if the mode cannot be set. */
static int mkdir_drop_box(const char *path)
{
	if (mkdir(path, 0700) < 0)
		return -errno;
	if (chmod(path, 01733) < 0) {
		int e = -errno;
		rmdir(path);
		return e;
	}
	return 0;
}

/* A fresh directory for one container's shim sockets: <socket_root>/<32 hex>, mode 01733
 * (any uid may create its socket; nobody may list or remove the others'). */
static int alloc_dir_make(struct agent_dp *dp, char *path, size_t size)
{
	unsigned char rnd[AGENT_DPMSG_ALLOC_ID_LEN / 2];
	char id[AGENT_DPMSG_ALLOC_ID_LEN + 1];

	if (getrandom(rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
		return -EAGAIN;
	for (size_t i = 0; i < sizeof(rnd); i++)
		snprintf(id + 2 * i, 3, "%02x", rnd[i]);
	snprintf(path, size, "%s/%s", dp->socket_root, id);
	return mkdir_drop_box(path);
}

/* <image_root>/.alloc/<the socket dir's id> (and its parents), mode 01733 as the socket dir:
 * the workload's user writes its image's GPU files there, the agent renames the whole image out. */
static int image_dir_make(struct agent_dp *dp, const char *sock_dir, char *path, size_t size)
{
	const char *id = strrchr(sock_dir, '/');
	char parent[DIR_MAX];
	snprintf(parent, sizeof(parent), "%s/.alloc", dp->image_root);
	if ((mkdir(dp->image_root, 0700) < 0 && errno != EEXIST) || (mkdir(parent, 0711) < 0 && errno != EEXIST))
		return -errno;
	if (id == NULL || snprintf(path, size, "%s%s", parent, id) >= (int)size)
		return -ENAMETOOLONG;
	return mkdir_drop_box(path);
}

static void handle_allocate(struct dp_call *c, const uint8_t *buf, size_t len)
{
	struct agent_dp *dp = c->dp;
	struct gcr_err err = { 0 };
	V1beta1__AllocateRequest *req = agent_dpmsg_allocate_decode(buf, len, dp->slots, &err);
	struct agent_dpmsg_alloc allocs[AGENT_DPMSG_MAX_CONTAINERS];
	char dirs[AGENT_DPMSG_MAX_CONTAINERS][DIR_MAX], idirs[AGENT_DPMSG_MAX_CONTAINERS][DIR_MAX];
	size_t n = 0, out = 0;
	uint8_t *msg = NULL;
	int rc = 0;

	if (req == NULL) {
		GCR_LOG(GCR_LOG_WARN, LOG_COMP, "Allocate refused: %s", err.msg);
		unary_finish(c, NULL, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
		return;
	}
	n = req->n_container_requests;
	for (size_t i = 0; i < n; i++) {
		rc = alloc_dir_make(dp, dirs[i], sizeof(dirs[i]));
		if (rc == 0 && dp->image_root != NULL) {
			rc = image_dir_make(dp, dirs[i], idirs[i], sizeof(idirs[i]));
			if (rc < 0)
				rmdir(dirs[i]);
		}
		if (rc < 0) {
			n = i;
			break;
		}
		allocs[i] = (struct agent_dpmsg_alloc){
			.shim_host_dir = dp->shim_host_dir,
			.shim_container_dir = dp->shim_container_dir,
			.sock_host_dir = dirs[i],
			.sock_container_dir = dp->socket_container_dir,
			.agent_host_dir = dp->agent_host_dir,
			.agent_container_dir = dp->agent_container_dir,
			.agent_container_socket = dp->agent_container_socket,
			.cdi_device = dp->cdi_device,
			.image_dir = dp->image_root != NULL ? idirs[i] : NULL,
			.extra_env = (const char *const *)dp->shim_env,
			.n_extra_env = dp->n_shim_env,
		};
	}
	if (rc == 0)
		msg = agent_dpmsg_allocate_encode(allocs, n, &out);
	if (rc < 0 || msg == NULL) {
		for (size_t i = 0; i < n; i++)
			rmdir(dirs[i]);
		snprintf(err.msg, sizeof(err.msg), "cannot make a socket directory under %s: %s",
			 dp->socket_root, strerror(rc < 0 ? -rc : ENOMEM));
		GCR_LOG(GCR_LOG_ERROR, LOG_COMP, "Allocate failed: %s", err.msg);
		unary_finish(c, NULL, GRPC_STATUS_INTERNAL, err.msg);
	} else {
		for (size_t i = 0; i < n; i++)
			GCR_LOG(GCR_LOG_INFO, LOG_COMP, "Allocate: container %zu, %zu slot(s), socket dir %s",
				i, req->container_requests[i]->n_devices_ids, dirs[i]);
		unary_finish(c, buffer_take(msg, out), GRPC_STATUS_OK, NULL);
	}
	agent_dpmsg_allocate_free(req);
}

/* The request arrived: decode, validate, answer. Everything here is quick and local. */
static void handle_request(struct dp_call *c)
{
	struct agent_dp *dp = c->dp;
	struct gcr_err err = { 0 };
	grpc_slice s = buffer_read(c->recv);
	const uint8_t *buf = GRPC_SLICE_START_PTR(s);
	size_t len = GRPC_SLICE_LENGTH(s), out = 0;

	switch (c->method) {
	case M_OPTIONS:
	case M_LIST_AND_WATCH: {
		V1beta1__Empty *e = agent_dpmsg_empty_decode(buf, len, &err);
		if (e == NULL) {
			unary_finish(c, NULL, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
		} else if (c->method == M_OPTIONS) {
			uint8_t *m = agent_dpmsg_options_encode(&out);
			unary_finish(c, buffer_take(m, out), GRPC_STATUS_OK, NULL);
		} else {
			stream_start(c);
		}
		agent_dpmsg_empty_free(e);
		break;
	}
	case M_PREFERRED: {
		V1beta1__PreferredAllocationRequest *r =
			agent_dpmsg_preferred_decode(buf, len, dp->slots, &err);
		if (r == NULL) {
			GCR_LOG(GCR_LOG_WARN, LOG_COMP, "GetPreferredAllocation refused: %s", err.msg);
			unary_finish(c, NULL, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
		} else {
			uint8_t *m = agent_dpmsg_preferred_encode(r, &out);
			unary_finish(c, buffer_take(m, out), GRPC_STATUS_OK, NULL);
		}
		agent_dpmsg_preferred_free(r);
		break;
	}
	case M_ALLOCATE:
		handle_allocate(c, buf, len);
		break;
	case M_PRESTART: {
		V1beta1__PreStartContainerRequest *r =
			agent_dpmsg_prestart_decode(buf, len, dp->slots, &err);
		if (r == NULL) {
			unary_finish(c, NULL, GRPC_STATUS_INVALID_ARGUMENT, err.msg);
		} else {
			uint8_t *m = agent_dpmsg_empty_encode(&out);
			unary_finish(c, buffer_take(m, out), GRPC_STATUS_OK, NULL);
		}
		agent_dpmsg_prestart_free(r);
		break;
	}
	default:
		unary_finish(c, NULL, GRPC_STATUS_UNIMPLEMENTED, "no such method");
		break;
	}
	grpc_slice_unref(s);
}

/* A call arrived: ask for the next one, then read this one's request. */
static void handle_new_call(struct dp_call *c, bool ok)
{
	struct agent_dp *dp = c->dp;
	grpc_op op;

	if (!ok) { /* server shutting down */
		call_free(c);
		return;
	}
	request_call(dp);
	c->method = M_UNKNOWN;
	for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
		if (grpc_slice_str_cmp(c->details.method, methods[i].path) == 0)
			c->method = methods[i].method;
	memset(&op, 0, sizeof(op));
	op.op = GRPC_OP_RECV_MESSAGE;
	op.data.recv_message.recv_message = &c->recv;
	c->tag_main.kind = T_RECV;
	if (grpc_call_start_batch(c->call, &op, 1, &c->tag_main, NULL) != GRPC_CALL_OK)
		call_free(c);
}

static void request_call(struct agent_dp *dp)
{
	struct dp_call *c;

	if (dp->server == NULL || atomic_load(&dp->stop))
		return;
	c = calloc(1, sizeof(*c));
	if (c == NULL) {
		GCR_LOG(GCR_LOG_ERROR, LOG_COMP, "out of memory: not accepting calls");
		return;
	}
	c->dp = dp;
	c->status_details = grpc_empty_slice();
	grpc_call_details_init(&c->details);
	grpc_metadata_array_init(&c->md);
	c->tag_main = (struct dp_tag){ T_NEW_CALL, c };
	c->tag_close = (struct dp_tag){ T_STREAM_CLOSE, c };
	dp->live_calls++;
	if (grpc_server_request_call(dp->server, &c->call, &c->details, &c->md, dp->cq, dp->cq,
				     &c->tag_main) != GRPC_CALL_OK)
		call_free(c);
}

/* ---- our server ---- */

static int server_start(struct agent_dp *dp)
{
	grpc_arg args[2];
	grpc_channel_args cargs = { 2, args };
	grpc_server_credentials *creds;
	char addr[PATH_MAX + 8];
	int port;

	args[0].type = GRPC_ARG_INTEGER;
	args[0].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
	args[0].value.integer = (int)AGENT_DPMSG_MAX_BYTES;
	args[1].type = GRPC_ARG_INTEGER;
	args[1].key = (char *)GRPC_ARG_MAX_CONCURRENT_STREAMS;
	args[1].value.integer = 64;
	unlink(dp->sock_path);
	dp->server = grpc_server_create(&cargs, NULL);
	if (dp->server == NULL)
		return -ENOMEM;
	grpc_server_register_completion_queue(dp->server, dp->cq, NULL);
	snprintf(addr, sizeof(addr), "unix:%s", dp->sock_path);
	creds = grpc_insecure_server_credentials_create();
	port = grpc_server_add_http2_port(dp->server, addr, creds);
	grpc_server_credentials_release(creds);
	if (port == 0) {
		grpc_server_destroy(dp->server);
		dp->server = NULL;
		return -EADDRNOTAVAIL;
	}
	grpc_server_start(dp->server);
	chmod(dp->sock_path, 0600); /* only root (the kubelet) talks to us */
	request_call(dp);
	GCR_LOG(GCR_LOG_INFO, LOG_COMP, "serving %s on %s", dp->resource_name, dp->sock_path);
	return 0;
}

/* Starts shutting the server down; T_SHUTDOWN destroys it (and restarts unless stopping). */
static void server_shutdown(struct agent_dp *dp)
{
	if (dp->server == NULL || dp->old_server != NULL)
		return;
	dp->old_server = dp->server;
	dp->server = NULL;
	dp->shutdown_tag = (struct dp_tag){ T_SHUTDOWN, dp };
	grpc_server_shutdown_and_notify(dp->old_server, dp->cq, &dp->shutdown_tag);
	grpc_server_cancel_all_calls(dp->old_server);
}

/* ---- registration with the kubelet ---- */

static void register_free(struct dp_register *r)
{
	if (r->call)
		grpc_call_unref(r->call);
	if (r->channel)
		grpc_channel_destroy(r->channel);
	if (r->send)
		grpc_byte_buffer_destroy(r->send);
	if (r->recv)
		grpc_byte_buffer_destroy(r->recv);
	grpc_metadata_array_destroy(&r->md_init);
	grpc_metadata_array_destroy(&r->md_trail);
	grpc_slice_unref(r->details);
	free(r);
}

/* Calls Registration.Register asynchronously: the kubelet dials back before answering. */
static void register_start(struct agent_dp *dp)
{
	struct dp_register *r = calloc(1, sizeof(*r));
	grpc_channel_credentials *creds;
	char target[PATH_MAX + 8];
	grpc_op ops[6];
	uint8_t *msg;
	size_t len = 0;

	if (r == NULL)
		goto retry;
	r->tag = (struct dp_tag){ T_REGISTER, r };
	r->details = grpc_empty_slice();
	grpc_metadata_array_init(&r->md_init);
	grpc_metadata_array_init(&r->md_trail);
	msg = agent_dpmsg_register_encode(dp->endpoint, dp->resource_name, &len);
	r->send = buffer_take(msg, len);
	snprintf(target, sizeof(target), "unix:%s", dp->kubelet_sock);
	creds = grpc_insecure_credentials_create();
	r->channel = grpc_channel_create(target, creds, NULL);
	grpc_channel_credentials_release(creds);
	if (r->send == NULL || r->channel == NULL)
		goto fail;
	r->call = grpc_channel_create_call(r->channel, NULL, GRPC_PROPAGATE_DEFAULTS, dp->cq,
					   grpc_slice_from_static_string("/v1beta1.Registration/Register"),
					   NULL, deadline_in(REGISTER_TIMEOUT_MS), NULL);
	if (r->call == NULL)
		goto fail;
	memset(ops, 0, sizeof(ops));
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = r->send;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &r->md_init;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = &r->recv;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &r->md_trail;
	ops[5].data.recv_status_on_client.status = &r->status;
	ops[5].data.recv_status_on_client.status_details = &r->details;
	if (grpc_call_start_batch(r->call, ops, 6, &r->tag, NULL) != GRPC_CALL_OK)
		goto fail;
	dp->reg = r;
	dp->want_register = false;
	return;
fail:
	register_free(r);
retry:
	dp->retry_at_ms = (int64_t)gcr_time_mono_ms() + REGISTER_RETRY_MS;
}

static void register_done(struct agent_dp *dp, struct dp_register *r, bool ok)
{
	dp->reg = NULL;
	if (ok && r->status == GRPC_STATUS_OK) {
		atomic_fetch_add(&dp->registrations, 1);
		dp->retry_at_ms = 0;
		GCR_LOG(GCR_LOG_INFO, LOG_COMP, "registered %s with the kubelet (%s)", dp->resource_name,
			dp->kubelet_sock);
	} else {
		char *d = grpc_slice_to_c_string(r->details);
		GCR_LOG(GCR_LOG_WARN, LOG_COMP, "Register failed (status %d: %s); retrying in %d ms",
			(int)r->status, d ? d : "", REGISTER_RETRY_MS);
		gpr_free(d);
		dp->retry_at_ms = (int64_t)gcr_time_mono_ms() + REGISTER_RETRY_MS;
	}
	register_free(r);
}

/* ---- the loop ---- */

/* Polls kubelet.sock and our socket; a new kubelet.sock means a kubelet (re)start. */
static void poll_kubelet(struct agent_dp *dp)
{
	struct stat st;
	bool exists = stat(dp->kubelet_sock, &st) == 0 && S_ISSOCK(st.st_mode);

	if (exists && (!dp->kubelet_seen || st.st_ino != dp->kubelet_ino ||
		       st.st_ctim.tv_sec != dp->kubelet_ctime.tv_sec ||
		       st.st_ctim.tv_nsec != dp->kubelet_ctime.tv_nsec)) {
		if (dp->kubelet_seen)
			GCR_LOG(GCR_LOG_INFO, LOG_COMP, "kubelet restarted: registering again");
		dp->kubelet_ino = st.st_ino;
		dp->kubelet_ctime = st.st_ctim;
		dp->want_register = true;
		dp->retry_at_ms = 0;
	}
	dp->kubelet_seen = exists;
	/* The kubelet empties its plugin directory when it starts: serve a fresh socket. */
	if (dp->server != NULL && lstat(dp->sock_path, &st) < 0) {
		GCR_LOG(GCR_LOG_INFO, LOG_COMP, "%s removed: restarting the server", dp->sock_path);
		server_shutdown(dp);
		dp->want_register = exists;
	}
	if (!exists)
		return;
	if (dp->server != NULL && dp->reg == NULL &&
	    (dp->want_register || (dp->retry_at_ms != 0 && (int64_t)gcr_time_mono_ms() >= dp->retry_at_ms)))
		register_start(dp);
}

static void push_health(struct agent_dp *dp)
{
	unsigned gen = atomic_load(&dp->health_gen);

	for (struct dp_call *c = dp->streams; c; c = c->next)
		if (!c->closed && !c->send_pending && c->sent_gen != gen)
			stream_send(c, false);
}

static void dispatch(struct agent_dp *dp, struct dp_tag *t, bool ok)
{
	struct dp_call *c = t->obj;

	switch (t->kind) {
	case T_NEW_CALL:
		handle_new_call(c, ok);
		break;
	case T_RECV:
		if (!ok || c->recv == NULL) /* cancelled, or the client sent no message */
			unary_finish(c, NULL, GRPC_STATUS_INVALID_ARGUMENT, "no request message");
		else
			handle_request(c);
		break;
	case T_UNARY_DONE:
		call_free(c);
		break;
	case T_STREAM_SEND:
		c->batches--;
		c->send_pending = false;
		if (!ok)
			c->closed = true;
		stream_maybe_free(c);
		break;
	case T_STREAM_CLOSE:
		c->batches--;
		c->closed = true;
		GCR_LOG(GCR_LOG_INFO, LOG_COMP, "ListAndWatch: stream closed");
		stream_maybe_free(c);
		break;
	case T_SHUTDOWN:
		grpc_server_destroy(dp->old_server);
		dp->old_server = NULL;
		if (!atomic_load(&dp->stop) && server_start(dp) < 0) {
			GCR_LOG(GCR_LOG_ERROR, LOG_COMP, "cannot serve on %s; retrying", dp->sock_path);
		}
		break;
	case T_REGISTER:
		register_done(dp, t->obj, ok);
		break;
	}
}

static void *dp_thread(void *arg)
{
	struct agent_dp *dp = arg;
	int64_t next_poll = 0, serve_retry_at = 0;

	while (!atomic_load(&dp->stop)) {
		grpc_event ev = grpc_completion_queue_next(dp->cq, deadline_in(dp->poll_ms), NULL);

		if (ev.type == GRPC_OP_COMPLETE)
			dispatch(dp, ev.tag, ev.success != 0);
		if ((int64_t)gcr_time_mono_ms() >= next_poll) {
			/* Not serving (the directory was missing, say): try again each second. */
			if (dp->server == NULL && dp->old_server == NULL && (int64_t)gcr_time_mono_ms() >= serve_retry_at &&
			    server_start(dp) < 0) {
				GCR_LOG(GCR_LOG_ERROR, LOG_COMP, "cannot serve on %s; retrying", dp->sock_path);
				serve_retry_at = (int64_t)gcr_time_mono_ms() + REGISTER_RETRY_MS;
			}
			poll_kubelet(dp);
			push_health(dp);
			next_poll = (int64_t)gcr_time_mono_ms() + dp->poll_ms;
		}
	}
	/* Stop: cancel everything, then drain until every call and the server are gone. */
	if (dp->reg)
		grpc_call_cancel(dp->reg->call, NULL);
	server_shutdown(dp);
	for (int64_t end = (int64_t)gcr_time_mono_ms() + 10000; /* bounded: 10 s */
	     (dp->old_server != NULL || dp->reg != NULL || dp->live_calls > 0) && (int64_t)gcr_time_mono_ms() < end;) {
		grpc_event ev = grpc_completion_queue_next(dp->cq, deadline_in(100), NULL);
		if (ev.type == GRPC_OP_COMPLETE)
			dispatch(dp, ev.tag, ev.success != 0);
		else if (ev.type == GRPC_QUEUE_SHUTDOWN)
			break;
	}
	if (dp->old_server != NULL || dp->live_calls > 0)
		GCR_LOG(GCR_LOG_WARN, LOG_COMP, "stopping with %u call(s) still open", dp->live_calls);
	grpc_completion_queue_shutdown(dp->cq);
	while (grpc_completion_queue_next(dp->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
	       GRPC_QUEUE_SHUTDOWN)
		;
	grpc_completion_queue_destroy(dp->cq);
	dp->cq = NULL;
	unlink(dp->sock_path);
	return NULL;
}

/* mkdir -p for the socket root; a directory we create is 0711 (enter, not list). */
static int mkdir_p(const char *path, struct gcr_err *err)
{
	char buf[PATH_MAX];

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1;; p++) {
		if (*p == '/' || *p == '\0') {
			char saved = *p;
			*p = '\0';
			if (mkdir(buf, 0711) < 0 && errno != EEXIST)
				return gcr_err_set(err, -errno, "mkdir %s: %s", buf, strerror(errno));
			*p = saved;
			if (saved == '\0')
				break;
		}
	}
	return 0;
}

int agent_dp_start(struct agent_dp *dp, struct gcr_err *err)
{
	int rc;

	if (dp->started)
		return gcr_err_set(err, -EALREADY, "device plugin: already started");
	if (mkdir_p(dp->socket_root, err) < 0)
		return gcr_err_wrap(err, "device plugin socket root");
	grpc_init();
	dp->grpc_up = true;
	dp->cq = grpc_completion_queue_create_for_next(NULL);
	if (dp->cq == NULL)
		return gcr_err_set(err, -ENOMEM, "device plugin: no completion queue");
	if (server_start(dp) < 0)
		GCR_LOG(GCR_LOG_WARN, LOG_COMP, "cannot serve on %s yet; retrying", dp->sock_path);
	rc = pthread_create(&dp->thread, NULL, dp_thread, dp);
	if (rc != 0) {
		atomic_store(&dp->stop, true);
		if (dp->server) {
			server_shutdown(dp);
			while (dp->old_server) {
				grpc_event ev = grpc_completion_queue_next(
					dp->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
				dispatch(dp, ev.tag, ev.success != 0);
			}
		}
		return gcr_err_set(err, -rc, "device plugin: pthread_create: %s", strerror(rc));
	}
	dp->started = true;
	return 0;
}

void agent_dp_free(struct agent_dp *dp)
{
	if (dp == NULL)
		return;
	if (dp->started) {
		atomic_store(&dp->stop, true);
		pthread_join(dp->thread, NULL);
	}
	if (dp->grpc_up)
		grpc_shutdown();
	free(dp->resource_name);
	free(dp->kubelet_dir);
	free(dp->endpoint);
	free(dp->shim_host_dir);
	free(dp->shim_container_dir);
	free(dp->socket_root);
	free(dp->socket_container_dir);
	free(dp->image_root);
	free(dp->agent_socket);
	free(dp->agent_host_dir);
	free(dp->agent_container_dir);
	free(dp->agent_container_socket);
	free(dp->cdi_device);
	for (size_t i = 0; dp->shim_env != NULL && i < 2 * dp->n_shim_env; i++)
		free(dp->shim_env[i]);
	free(dp->shim_env);
	free(dp);
}
