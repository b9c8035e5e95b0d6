/* shim_ctl: the control socket: one thread serves many peers through poll(), checks
 * their credentials, and maps each request to shim_cr or a status snapshot. */
#include "config.h"
#include "shim_ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <stddef.h>
#include <unistd.h>

#include "gcr_groupmsg.h"
#include "gcr_image.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "gcr_time.h"
#include "shim_agent.h"
#include "shim_alloc.h"
#include "shim_pool.h"
#include "shim_config.h"
#include "shim_cr.h"
#include "shim_gate.h"
#include "shim_imagefile.h"
#include "shim_real.h"
#include "shim_staging.h"

/* The concurrency model: one thread, poll() over the listening socket and up to MAX_CONNS
 * connections, one request executed at a time. Requests are serialised anyway (suspend and
 * resume are one state machine), a status answers in microseconds, and a single thread adds
 * no locks and no threads to the host application; a thread per connection would, and a
 * short queue answering "busy" would still turn honest clients away while idle ones hold
 * the slots. Here an idle or slow peer holds a slot, never anyone's turn. At MAX_CONNS the
 * connection idle longest makes room for the new one. */
#define MAX_CONNS 64
/* A connection without a complete request line this long after it opened or after its last
 * reply is closed (ms): honest clients send their line at once; trickled bytes do not count. */
#define IDLE_MS 5000
/* After accept fails for want of fds or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
 * listening socket is left alone this long (ms) while open connections are served: it stays
 * readable, so retrying at once would spin. Other failures wait longer. */
#define ACCEPT_BACKOFF_MS 100
#define ACCEPT_ODD_BACKOFF_MS 1000
/* How long a reply may take to leave (ms): a reply fits the peer's socket buffer unless the
 * peer piles up requests without reading its replies. */
#define REPLY_MS 1000

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static char sock_path[256];
static pid_t owner_pid;
static int listen_fd = -1; /* the control thread's listening socket (republish_socket replaces it) */

const char *shim_ctl_path(void)
{
	return sock_path;
}

/* Which GPU runtimes the process uses: gcrctl and the agent choose the backend from it. */
static json_t *backends_json(void)
{
	return json_pack("{s:b, s:b}", "cuda", shim_real_handle(SHIM_CUDA) != NULL, "hip",
			 shim_real_handle(SHIM_HIP) != NULL);
}

/* The stream-ordered arena (shim_pool): what the application's pools hold on the fast path. */
static json_t *pool_json(void)
{
	struct shim_pool_stats ps;
	shim_pool_stats(&ps);
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:{s:I, s:I, s:I}}", "pools", (json_int_t)ps.pools,
			 "reserved", (json_int_t)ps.reserved_bytes, "used", (json_int_t)ps.used_bytes, "blocks",
			 (json_int_t)ps.blocks, "segments", (json_int_t)ps.segments, "pending_frees",
			 (json_int_t)ps.pending_frees, "graph", (json_int_t)ps.graph_bytes, "grows",
			 (json_int_t)ps.grows, "reuses", "same_stream", (json_int_t)ps.reuses_same_stream, "done",
			 (json_int_t)ps.reuses_done, "waited", (json_int_t)ps.reuses_waited);
}

static json_t *wake_json(void);

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
		unsigned long long ns, nr;
		shim_cr_requests(&ns, &nr);
		json_object_set_new(j, "requests", json_pack("{s:I, s:I}", "suspend", (json_int_t)ns, "resume",
							    (json_int_t)nr));
		json_object_set_new(j, "backends", backends_json());
		json_object_set_new(j, "pool", pool_json());
		json_object_set_new(json_object_get(j, "bytes"), "pool", json_integer((json_int_t)st.pool_seg_bytes));
		json_object_set_new(json_object_get(j, "buffers"), "pool", json_integer((json_int_t)st.pool_segs));
		/* The machine's state beyond "state" (shim_cr): where the data is, the restore's need
		 * (kept in the process so that whichever tool resumes it finds it), the wake. */
		json_object_set_new(j, "data", json_string(shim_cr_data_name(shim_cr_data())));
		struct gcr_need *need = malloc(sizeof(*need));
		if (need != NULL && shim_cr_need(need))
			json_object_set_new(j, "restore_need", gcr_proto_need_json(need));
		free(need);
		json_t *w = wake_json();
		if (w != NULL)
			json_object_set_new(j, "wake", w);
		/* A group member's communicators (include/gcr/protocol.h, "groups"). */
		struct gcr_group_comms *c = malloc(sizeof(*c));
		int held = 0;
		if (c != NULL) {
			shim_cr_comms(c, &held);
			if (c->n > 0)
				json_object_set_new(j, "comms", gcr_groupmsg_comms_json(c));
			if (c->n > 0 || held > 0)
				json_object_set_new(j, "nccl", json_pack("{s:i}", "held", held));
		}
		free(c);
	}
	return j;
}

static json_t *stats_json(void)
{
	json_t *calls = json_object();
	for (int vendor = 0; vendor < SHIM_VENDORS; vendor++) {
		unsigned count;
		const struct shim_hook *hooks = shim_real_hooks((enum shim_vendor)vendor, &count);
		for (unsigned i = 0; i < count; i++)
			for (int v = 0; v < 2; v++) {
				const char *name = hooks[i].name[v];
				uint64_t n = name ? shim_gate_total_calls(SHIM_HOOK_ROW(vendor, i), v) : 0;
				if (n > 0)
					json_object_set_new(calls, name, json_integer((json_int_t)n));
			}
	}
	struct shim_alloc_stats st;
	shim_alloc_stats(&st);
	return json_pack("{s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}, s:{s:I}, s:{s:I, s:I}, s:o}",
			 "calls", calls, "lookups", "dlsym_cu", (json_int_t)shim_lookups.dlsym[SHIM_CUDA],
			 "dlsym_wrapped", (json_int_t)shim_lookups.dlsym_wrapped[SHIM_CUDA],
			 "dlsym_hip", (json_int_t)shim_lookups.dlsym[SHIM_HIP],
			 "dlsym_hip_wrapped", (json_int_t)shim_lookups.dlsym_wrapped[SHIM_HIP],
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
	return json_pack("{s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:I, s:s}",
			 "ms", "comm", r->ms_comm, "gate", r->ms_gate, "sync", r->ms_sync, "digest", r->ms_digest, "plan",
			 r->ms_copy_prep, "copy", r->ms_copy, "release", r->ms_release, "map", r->ms_map,
			 "ctx", r->ms_ctx, "total", r->ms_total, "ctx_freed", (json_int_t)r->ctx_freed, "bytes",
			 (json_int_t)r->bytes, "copied", (json_int_t)r->copied,
			 "zero", (json_int_t)r->zero, "unchanged", (json_int_t)r->unchanged, "host",
			 (json_int_t)r->host, "handles", (json_int_t)r->handles, "mappings",
			 (json_int_t)r->mappings, "state", shim_cr_state_name(shim_cr_state()));
}

static void register_with_agent(void);
static void drop_agent(void);
static bool peer_gone(int fd);
static int republish_socket(struct gcr_err *err);
static int rebind_for_dump(struct gcr_err *err);

/* ---- images: image-write and image-read (shim_imagefile) ---- */
static int image_dir_arg(json_t *args, const char **dir, struct gcr_err *err)
{
	*dir = json_string_value(json_object_get(args, "dir"));
	if (*dir == NULL || (*dir)[0] != '/' || strlen(*dir) > 3000)
		return gcr_err_set(err, -EINVAL, "\"dir\" must be an absolute path");
	return 0;
}

/* Returns 1 when the client went away during the write: then nothing is dropped, the data
 * stays in staging and no reply is made (the caller's partial image is not to be trusted). */
static int op_image_write(int fd, json_t *args, json_t **result, struct gcr_err *err, int *rc)
{
	const char *dir;
	*rc = image_dir_arg(args, &dir, err);
	if (*rc == 0)
		*rc = shim_imagefile_write(dir, result, err);
	if (*rc == 0 && peer_gone(fd)) {
		GCR_LOG(GCR_LOG_WARN, "shim", "image-write to %s: the client went away; staging kept, process "
			"suspended (resume it)", dir);
		json_decref(*result);
		*result = NULL;
		return 1;
	}
	if (*rc == 0 && (*rc = shim_imagefile_drop(err)) < 0) {
		json_decref(*result);
		*result = NULL;
	}
	if (*rc == 0) {
		struct gcr_err e2;
		drop_agent();
		if (rebind_for_dump(&e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "shim", "control socket not re-bound for the dump (a restore will not "
				"find it): %s", e2.msg);
	}
	return 0;
}

/* The descriptors that came with the request being served (conn_serve sets it; closed after). */
static struct {
	int *fds;
	int n;
} req_fds;

/* {"files": [names]} with as many descriptors: the image handed over without a path. */
static int image_files_arg(json_t *args, struct shim_imagefile_src *src, struct gcr_err *err)
{
	json_t *names = json_object_get(args, "files");
	size_t n = json_array_size(names);
	if (!json_is_array(names) || n == 0 || n > GCR_SOCK_MAX_FDS || json_object_get(args, "dir") != NULL)
		return gcr_err_set(err, -EINVAL, "\"files\" must be 1..%d names (and no \"dir\")", GCR_SOCK_MAX_FDS);
	if ((int)n != req_fds.n)
		return gcr_err_set(err, -EINVAL, "\"files\" names %zu files, %d descriptors came with it", n, req_fds.n);
	for (size_t i = 0; i < n; i++) {
		const char *nm = json_string_value(json_array_get(names, i));
		if (nm == NULL || nm[0] == '\0' || strlen(nm) >= GCR_IMAGE_NAME_MAX)
			return gcr_err_set(err, -EINVAL, "\"files\"[%zu] must be a file name of the image", i);
		src->names[i] = nm;
	}
	src->fds = req_fds.fds;
	src->n = (int)n;
	return 0;
}

static int op_image_read(json_t *args, json_t **result, struct gcr_err *err)
{
	const char *dir = NULL;
	const char *names[GCR_SOCK_MAX_FDS];
	struct shim_imagefile_src src = { .names = names };
	int files = json_object_get(args, "files") != NULL;
	int rc = files ? image_files_arg(args, &src, err) : image_dir_arg(args, &dir, err);
	if (rc == 0)
		rc = shim_imagefile_read(dir, files ? &src : NULL, result, err);
	if (rc == 0) {
		struct gcr_err e2;
		if (republish_socket(&e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "shim", "control socket keeps its old name %s: %s", sock_path, e2.msg);
		json_object_set_new(*result, "socket", json_string(sock_path));
		register_with_agent();
	}
	return rc;
}

/* True once the peer has closed its end (or died): POLLHUP on a Unix stream socket means
 * both directions are shut, so a client that only shut its writing side (half-close) still
 * counts as present and gets its reply. */
static bool peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = 0 };
	return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* ---- the overcommit wake: a suspend the agent made with "wake" arms it (shim_cr keeps it);
 * the first thread that then reaches the closed gate tells the agent (shim_agent_wake), once
 * per suspend. The status says it until the resume ("wake": "called"), so an agent that
 * restarted and never got the line finds it (docs/preemption.md, "Wake on call"). ---- */
static void wake_send(void)
{
	if (shim_cr_wake(NULL) != SHIM_CR_WAKE_ARMED)
		return; /* the common case, without the gate's count */
	double since, now = gcr_time_mono_ms();
	int n = shim_gate_waiting(&since);
	if (n <= 0)
		since = now;
	if (shim_cr_wake_fire(since))
		(void)shim_agent_wake((long long)(now - since));
}

/* The status's "wake" (NULL: no wake suspend in effect). */
static json_t *wake_json(void)
{
	double since;
	enum shim_cr_wake w = shim_cr_wake(&since);
	if (w == SHIM_CR_WAKE_OFF)
		return NULL;
	return json_pack("{s:s, s:I}", "state", w == SHIM_CR_WAKE_CALLED ? "called" : "armed", "waited_ms",
			 (json_int_t)(w == SHIM_CR_WAKE_CALLED ? gcr_time_mono_ms() - since : 0));
}

/* The gate's wait hook: a thread about to wait. */
static void wake_on_wait(void)
{
	wake_send();
}

/* A thread that reached the gate while the suspend (or a failed resume) ran has not seen the
 * arm: sent for it. Either this check sees it waiting or its hook sees the arm; the machine's
 * exchange sends once. */
static void wake_catch_up(void)
{
	if (shim_gate_waiting(NULL) > 0)
		wake_send();
}

/* After a suspend that asked for it. */
static void wake_arm(void)
{
	struct gcr_err e2;
	shim_gate_set_wait_hook(wake_on_wait);
	if (shim_cr_wake_arm(&e2) < 0)
		GCR_LOG(GCR_LOG_ERROR, "shim", "no wake for this suspend: %s", e2.msg);
	wake_catch_up();
}

/* A suspend nobody will hear of would leave the process suspended with nobody to resume
 * it: undone at once. */
static void undo_suspend(const char *why)
{
	struct shim_cr_report rep;
	struct gcr_err err;
	shim_cr_wake_disarm();
	if (shim_cr_resume(&rep, &err) < 0)
		GCR_LOG(GCR_LOG_ERROR, "shim", "suspend undone because %s: resume failed: %s; process left "
			"suspended, resume it with gcrctl resume", why, err.msg);
	else
		GCR_LOG(GCR_LOG_WARN, "shim", "suspend undone because %s; process running", why);
}

/* ---- group members (include/gcr/protocol.h, "groups") ---- */

/* The connection that froze this member (its coordinator's): when it closes while the member
 * is held, the member thaws (shim_cr_abandon); it is never closed for idling meanwhile. */
static int group_owner = -1;

static bool held(void)
{
	enum shim_cr_state st = shim_cr_state();
	return st == SHIM_CR_FROZEN || st == SHIM_CR_DRAINED || st == SHIM_CR_REBUILT || st == SHIM_CR_REBUILDING;
}

static json_t *group_result(const struct gcr_group_comms *c, double ms)
{
	json_t *r = json_pack("{s:s, s:{s:f}}", "state", shim_cr_state_name(shim_cr_state()), "ms", "total", ms);
	if (r != NULL && c != NULL)
		json_object_set_new(r, "comms", gcr_groupmsg_comms_json(c));
	return r;
}

/* One group op: its arguments checked (gcr_groupmsg), then shim_cr. */
static int op_group(int fd, const struct gcr_req *req, json_t **result, struct gcr_err *err)
{
	double t0 = gcr_time_mono_ms();
	long long hold = 0, wait = 0, timeout = 0;
	json_t *args = req->args;
	struct {
		struct gcr_group_comms comms;
		struct gcr_group_targets targets, wants;
		struct gcr_group_keys keys;
		struct gcr_group_ids ids;
	} *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = 0;
	switch (req->op) {
	case GCR_OP_FREEZE_ID:
		rc = gcr_groupmsg_int(args, "hold_ms", 1, GCR_GROUP_MAX_MS, 30000, &hold, err);
		if (rc == 0)
			rc = gcr_groupmsg_int(args, "wait_ms", 1, GCR_GROUP_MAX_MS, GCR_GROUP_WAIT_MS, &wait, err);
		if (rc == 0 && (rc = shim_cr_freeze((int)hold, (int)wait, &m->comms, err)) == 0)
			group_owner = fd;
		break;
	case GCR_OP_DRAIN_ID:
		rc = gcr_groupmsg_targets(json_object_get(args, "targets"), &m->targets, err);
		if (rc == 0)
			rc = gcr_groupmsg_int(args, "timeout_ms", 1, GCR_GROUP_MAX_MS, 30000, &timeout, err);
		if (rc == 0 && (rc = shim_cr_drain(&m->targets, (int)timeout, &m->comms, &m->wants, err)) >= 0) {
			group_owner = fd;
			*result = group_result(&m->comms, gcr_time_mono_ms() - t0);
			if (rc == 1 && *result != NULL)
				json_object_set_new(*result, "wants", gcr_groupmsg_targets_json(&m->wants));
			rc = 0;
		}
		break;
	case GCR_OP_THAW_ID:
		rc = shim_cr_thaw(err);
		break;
	case GCR_OP_DETACH_ID:
		rc = shim_cr_detach(err);
		break;
	case GCR_OP_IDS_ID:
		rc = gcr_groupmsg_keys(json_object_get(args, "keys"), &m->keys, err);
		if (rc == 0)
			rc = shim_cr_ids(&m->keys, &m->ids, err);
		if (rc == 0)
			*result = json_pack("{s:o}", "ids", gcr_groupmsg_ids_json(&m->ids));
		break;
	case GCR_OP_REBUILD_ID: {
		json_t *failed = json_object_get(args, "failed");
		rc = gcr_groupmsg_ids(json_object_get(args, "ids"), &m->ids, err);
		if (rc == 0 && failed != NULL)
			rc = gcr_groupmsg_keys(failed, &m->keys, err);
		if (rc == 0)
			rc = gcr_groupmsg_int(args, "timeout_ms", 1, GCR_GROUP_MAX_MS, 60000, &timeout, err);
		if (rc == 0 && (rc = shim_cr_rebuild(&m->ids, &m->keys, (int)timeout, &m->comms, err)) == 0)
			group_owner = fd;
		break;
	}
	default:
		rc = gcr_err_set(err, -EOPNOTSUPP, "unsupported op");
	}
	if (rc == 0 && *result == NULL)
		*result = group_result(req->op == GCR_OP_THAW_ID || req->op == GCR_OP_DETACH_ID ? NULL : &m->comms,
				       gcr_time_mono_ms() - t0);
	if (rc == 0 && *result == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
	free(m);
	return rc;
}

/* Returns the reply line for one request line of the peer on fd (malloc'd), or NULL when
 * there is nobody to reply to or no memory (the caller closes the connection). The rule
 * for abandoned requests: a request whose client has gone is not executed (checked right
 * before executing it), and a suspend whose client goes while it runs is undone; *suspended
 * says a suspend succeeded, so that the caller undoes it when its reply cannot be sent. */
static char *handle_line(int fd, const char *line, bool *suspended)
{
	struct gcr_req req;
	struct gcr_err err = { 0 };
	*suspended = false;
	if (gcr_proto_parse_request(line, &req, &err) < 0)
		return gcr_proto_reply_err_line(0, err.code, err.msg);
	if (peer_gone(fd)) {
		GCR_LOG(GCR_LOG_WARN, "shim", "control request %s from a client that has gone: not run",
			gcr_op_name(req.op));
		gcr_req_clear(&req);
		return NULL;
	}
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
		/* "image": suspend straight to that image directory (gcr_imgcr), no staging. */
		json_t *img = json_object_get(req.args, "image");
		const char *dir = json_string_value(img);
		if (img != NULL && (dir == NULL || dir[0] != '/' || strlen(dir) > 3000)) {
			rc = gcr_err_set(&err, -EINVAL, "\"image\" must be an absolute path");
			break;
		}
		/* "wake": the agent's overcommit suspend; its process's next call tells the agent. */
		json_t *wake = json_object_get(req.args, "wake");
		if (wake != NULL && (!json_is_boolean(wake) || (json_is_true(wake) && dir != NULL))) {
			rc = gcr_err_set(&err, -EINVAL, "\"wake\" must be a boolean, and not with \"image\"");
			break;
		}
		/* "group": a drained member of a group of NCCL processes. */
		json_t *group = json_object_get(req.args, "group");
		if (group != NULL && (!json_is_boolean(group) || (json_is_true(group) && (dir != NULL || json_is_true(wake))))) {
			rc = gcr_err_set(&err, -EINVAL, "\"group\" must be a boolean, and not with \"image\" or \"wake\"");
			break;
		}
		json_t *imgres = NULL;
		rc = dir != NULL	    ? shim_imagefile_suspend(dir, timeout, &rep, &imgres, &err)
		     : json_is_true(group) ? shim_cr_suspend_group(timeout, &rep, &err)
					   : shim_cr_suspend(timeout, &rep, &err);
		if (rc == 0 && peer_gone(fd)) {
			/* Nobody will dump or resume it: back from the files just written. */
			json_t *r2 = NULL;
			struct gcr_err e2;
			if (dir != NULL && shim_imagefile_read(dir, NULL, &r2, &e2) < 0)
				GCR_LOG(GCR_LOG_ERROR, "shim", "suspend to %s undone because its client went away: %s; "
					"process left suspended (gcrctl restore cannot help: image-read it)", dir, e2.msg);
			else
				undo_suspend("the client that asked for it went away while it ran");
			json_decref(r2);
			json_decref(imgres);
			gcr_req_clear(&req);
			return NULL;
		}
		if (rc == 0) {
			*suspended = true;
			if (json_is_true(wake))
				wake_arm();
			result = report_json(&rep);
			if (imgres != NULL)
				json_object_set_new(result, "image", imgres);
		}
		if (rc == 0 && dir != NULL) {
			/* As after image-write: CRIU must find neither a connection to the agent nor the
			 * socket under its published name. */
			struct gcr_err e2;
			drop_agent();
			if (rebind_for_dump(&e2) < 0)
				GCR_LOG(GCR_LOG_WARN, "shim", "control socket not re-bound for the dump (a restore will not "
					"find it): %s", e2.msg);
		}
		break;
	}
	case GCR_OP_TRIM_ID:
		/* What older clients sent here: said plainly rather than trimmed without the need kept. */
		if (json_object_get(req.args, "trim") != NULL || json_object_get(req.args, "restore_need") != NULL) {
			rc = gcr_err_set(&err, -EINVAL, "trim takes no \"trim\" or \"restore_need\": keep a restore "
					 "need with the restore_need op (nothing trimmed)");
			break;
		}
		shim_cr_trim();
		result = json_object();
		break;
	case GCR_OP_RESTORE_NEED_ID: {
		struct gcr_need *need = malloc(sizeof(*need));
		if (need == NULL)
			rc = gcr_err_set(&err, -ENOMEM, "out of memory");
		else if ((rc = gcr_proto_need_parse(req.args, need, &err)) < 0)
			gcr_err_wrap(&err, "restore_need (nothing kept)");
		else if ((rc = shim_cr_need_set(need, &err)) == 0)
			result = json_object();
		free(need);
		break;
	}
	case GCR_OP_IMAGE_WRITE_ID:
		if (op_image_write(fd, req.args, &result, &err, &rc)) {
			gcr_req_clear(&req);
			return NULL;
		}
		break;
	case GCR_OP_IMAGE_READ_ID:
		rc = op_image_read(req.args, &result, &err);
		break;
	case GCR_OP_FREEZE_ID:
	case GCR_OP_DRAIN_ID:
	case GCR_OP_THAW_ID:
	case GCR_OP_DETACH_ID:
	case GCR_OP_IDS_ID:
	case GCR_OP_REBUILD_ID:
		rc = op_group(fd, &req, &result, &err);
		break;
	case GCR_OP_RESUME_ID:
		rc = shim_cr_resume(&rep, &err);
		if (rc == 0)
			result = report_json(&rep);
		else
			wake_catch_up(); /* still suspended: still the agent's */
		break;
	default:
		rc = gcr_err_set(&err, -EOPNOTSUPP, "unsupported op");
	}
	if (rc < 0)
		out = gcr_proto_reply_err_line(req.id, rc, err.msg);
	else
		out = gcr_proto_reply_ok_line(req.id, result);
	if (out == NULL && *suspended) {
		undo_suspend("its reply could not be made (out of memory)");
		*suspended = false;
	}
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

/* Best effort: an error line the peer may or may not read before we close. */
static void reply_error(int fd, int code, const char *msg)
{
	struct gcr_err err;
	char *line = gcr_proto_reply_err_line(0, code, msg);
	if (line != NULL)
		gcr_sock_write_all(fd, line, strlen(line), 0, &err);
	free(line);
}

struct conn {
	int fd; /* -1: free slot */
	struct gcr_linebuf lb;
	long long deadline; /* whole ms of gcr_time_mono_ms(): closed unless a full line came by then */
	int fds[GCR_SOCK_MAX_FDS]; /* passed with the lines buffered, for the next one served */
	int nfds;
};

static void conn_close_fds(struct conn *c)
{
	for (int i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = 0;
}

static void conn_close(struct conn *c)
{
	conn_close_fds(c);
	if (c->fd == group_owner) {
		group_owner = -1;
		shim_cr_abandon(); /* a held member whose coordinator went: thawed */
	}
	close(c->fd);
	gcr_linebuf_free(&c->lb);
	c->fd = -1;
}

/* Reads what the peer sent and executes its complete lines in order; false when the
 * connection is to be closed. */
static bool conn_serve(struct conn *c)
{
	struct gcr_err err;
	long n = gcr_linebuf_fill_fds(&c->lb, c->fd, c->fds, &c->nfds, GCR_SOCK_MAX_FDS, &err);
	if (n == -EAGAIN || n == -EWOULDBLOCK)
		return true;
	for (;;) {
		char *line;
		int rc = gcr_linebuf_next(&c->lb, &line, &err);
		if (rc == 0)
			break;
		if (rc < 0) {
			reply_error(c->fd, rc, err.msg);
			return false;
		}
		bool suspended;
		/* Descriptors are for the line they came with: an op that takes none leaves them closed. */
		req_fds.fds = c->fds;
		req_fds.n = c->nfds;
		char *reply = handle_line(c->fd, line, &suspended);
		req_fds.n = 0;
		conn_close_fds(c);
		if (reply == NULL)
			return false;
		rc = gcr_sock_write_all(c->fd, reply, strlen(reply), REPLY_MS, &err);
		free(reply);
		if (rc < 0) {
			if (suspended)
				undo_suspend("its reply could not be sent (the client has gone)");
			return false;
		}
		c->deadline = (long long)gcr_time_mono_ms() + IDLE_MS;
	}
	if (n == -EMSGSIZE || n == -EBADMSG)
		reply_error(c->fd, (int)n, err.msg);
	return n >= 0; /* EOF or a read error after the lines it completed: done */
}

/* Takes the queued connections; false when accept failed for want of resources and the
 * listening socket should rest for a while (*rest_ms). */
static bool accept_all(int lfd, struct conn *conns, int *failing, int *rest_ms)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			int e = errno;
			if (e == EAGAIN || e == EWOULDBLOCK)
				return true;
			if (e == EINTR || e == ECONNABORTED || e == EPROTO || e == EPERM)
				continue; /* that peer gave up or was refused; the next may be fine */
			bool scarce = e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
			*rest_ms = scarce ? ACCEPT_BACKOFF_MS : ACCEPT_ODD_BACKOFF_MS;
			if (*failing != e)
				GCR_LOG(GCR_LOG_WARN, "shim", "control socket accept: %s; serving open connections, "
					"retrying every %d ms", strerror(e), *rest_ms);
			*failing = e;
			return false;
		}
		if (*failing != 0) {
			GCR_LOG(GCR_LOG_INFO, "shim", "control socket accepts again");
			*failing = 0;
		}
		if (!peer_allowed(fd)) {
			reply_error(fd, -EACCES, "permission denied: peer is neither root nor the process owner");
			close(fd);
			continue;
		}
		/* A free slot, else the connection idle longest (the earliest deadline). */
		struct conn *slot = &conns[0];
		for (int i = 0; i < MAX_CONNS && slot->fd >= 0; i++)
			if (conns[i].fd < 0 || conns[i].deadline < slot->deadline)
				slot = &conns[i];
		if (slot->fd >= 0)
			conn_close(slot);
		slot->fd = fd;
		gcr_linebuf_init(&slot->lb, GCR_PROTO_MAX_LINE);
		slot->deadline = (long long)gcr_time_mono_ms() + IDLE_MS;
	}
}

/* Never returns: whatever fails, the next honest client must still be served. */
static void *ctl_thread(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	static struct conn conns[MAX_CONNS];
	struct pollfd pfd[MAX_CONNS + 1];
	int who[MAX_CONNS + 1]; /* pfd[k] is conns[who[k]] (k > 0) */
	long long rest_until = 0;
	int failing = 0; /* errno of the accept failures in a row, 0 when accepting */
	shim_real_relax_capture();
	for (int i = 0; i < MAX_CONNS; i++)
		conns[i].fd = -1;
	for (;;) {
		/* A group member held past its bound thaws here (shim_cr_tick). */
		double hold = shim_cr_tick();
		long long now = (long long)gcr_time_mono_ms(), wake = now + IDLE_MS;
		if (hold > 0 && (long long)hold + 1 < wake)
			wake = (long long)hold + 1;
		int np = 1;
		pfd[0] = (struct pollfd){ .fd = now < rest_until ? -1 : lfd, .events = POLLIN };
		if (now < rest_until)
			wake = rest_until;
		for (int i = 0; i < MAX_CONNS; i++) {
			if (conns[i].fd < 0)
				continue;
			pfd[np] = (struct pollfd){ .fd = conns[i].fd, .events = POLLIN };
			who[np++] = i;
			if (conns[i].deadline < wake)
				wake = conns[i].deadline;
		}
		int pr = poll(pfd, (nfds_t)np, wake > now ? (int)(wake - now) : 0);
		if (pr < 0 && errno != EINTR) {
			GCR_LOG(GCR_LOG_ERROR, "shim", "control socket poll: %s; retrying", strerror(errno));
			rest_until = (long long)gcr_time_mono_ms() + ACCEPT_ODD_BACKOFF_MS;
			continue;
		}
		for (int k = 1; pr > 0 && k < np; k++)
			if (pfd[k].revents != 0 && !conn_serve(&conns[who[k]]))
				conn_close(&conns[who[k]]);
		int rest_ms = 0;
		if (pr > 0 && pfd[0].revents != 0 && !accept_all(lfd, conns, &failing, &rest_ms))
			rest_until = (long long)gcr_time_mono_ms() + rest_ms;
		/* After the reads: a line that came while a long request ran is served, not dropped. */
		now = (long long)gcr_time_mono_ms();
		for (int i = 0; i < MAX_CONNS; i++) {
			if (conns[i].fd >= 0 && conns[i].fd == group_owner && held())
				conns[i].deadline = now + IDLE_MS; /* the coordinator of a held member */
			if (conns[i].fd >= 0 && conns[i].deadline <= now &&
			    (!conn_serve(&conns[i]) || conns[i].deadline <= now))
				conn_close(&conns[i]);
		}
	}
	return NULL;
}

static void remove_socket(void)
{
	/* A forked child inherits this handler; only the owner removes its socket. */
	if (sock_path[0] != '\0' && getpid() == owner_pid)
		unlink(sock_path);
}

/* Tells the node agent this process exists (GCR_AGENT_SOCKET, set by the device
 * plugin): shim_agent. Best effort and bounded: the application must never wait on the agent. */
static void register_with_agent(void)
{
	shim_agent_register(sock_path);
}

/* Before a CRIU dump: the registry connection is an external socket CRIU would refuse. The
 * agent sees EOF, as for an exit; image-read registers again. */
static void drop_agent(void)
{
	shim_agent_drop();
}

/* Before a CRIU dump: CRIU re-binds a listening socket at the name it was bound to, and
 * gcr_sock_listen_unique binds to a temporary name and renames it; so the socket is made
 * again, bound at its final name, for the restore to find it there. */
static int rebind_for_dump(struct gcr_err *err)
{
	if (sock_path[0] == '\0' || listen_fd < 0)
		return gcr_err_set(err, -ENOENT, "no control socket");
	unlink(sock_path);
	int fd = gcr_sock_listen(sock_path, err);
	if (fd < 0)
		return fd;
	int fl = fcntl(fd, F_GETFL), rc = 0;
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || dup3(fd, listen_fd, O_CLOEXEC) < 0)
		rc = gcr_err_set(err, -errno, "cannot take the new socket %s: %s", sock_path, strerror(errno));
	close(fd);
	return rc;
}

/* After a CRIU restore the process has a new start time, so clients look for a new name
 * (gcr-PID-START.sock), and the restored listening socket's credentials are not this
 * process's (CRIU made it), so clients would refuse it. A new socket is made under the new
 * name and put in place of the old one's descriptor (the control thread, which runs this,
 * polls that number). */
static int republish_socket(struct gcr_err *err)
{
	char stem[64], path[sizeof(sock_path)];
	int rc = gcr_sock_shim_stem(0, getpid(), stem, sizeof(stem), err);
	if (rc < 0)
		return rc;
	if ((size_t)snprintf(path, sizeof(path), "%s/%s.sock", shim_cfg.socket_dir, stem) >= sizeof(path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket path too long");
	if (sock_path[0] == '\0' || listen_fd < 0 || strcmp(path, sock_path) == 0)
		return 0;
	char bound[sizeof(((struct sockaddr_un *)0)->sun_path) + 1] = "";
	struct sockaddr_un sa;
	socklen_t salen = sizeof(sa);
	if (getsockname(listen_fd, (struct sockaddr *)&sa, &salen) == 0 && sa.sun_family == AF_UNIX &&
	    salen > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] == '/')
		snprintf(bound, sizeof(bound), "%.*s", (int)(salen - offsetof(struct sockaddr_un, sun_path)), sa.sun_path);
	int fd = gcr_sock_listen_unique(shim_cfg.socket_dir, stem, path, sizeof(path), err);
	if (fd < 0)
		return fd;
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || dup3(fd, listen_fd, O_CLOEXEC) < 0) {
		rc = gcr_err_set(err, -errno, "cannot take the new socket %s: %s", path, strerror(errno));
		close(fd);
		unlink(path);
		return rc;
	}
	close(fd);
	unlink(sock_path);
	if (bound[0] != '\0')
		unlink(bound); /* where CRIU bound the restored socket (a temporary name) */
	GCR_LOG(GCR_LOG_INFO, "shim", "control socket %s (was %s, before a restore)", path, sock_path);
	memcpy(sock_path, path, sizeof(path));
	owner_pid = getpid();
	return 0;
}

static void start(void)
{
	owner_pid = getpid();
	struct gcr_err err;
	char stem[64];
	int lfd = gcr_sock_shim_stem(0, owner_pid, stem, sizeof(stem), &err);
	if (lfd == 0)
		lfd = gcr_sock_listen_unique(shim_cfg.socket_dir, stem, sock_path, sizeof(sock_path), &err);
	if (lfd < 0) {
		gcr_log_problem("shim", "pid %d has no control socket (%s); it cannot be suspended", (int)owner_pid,
				err.msg);
		sock_path[0] = '\0';
		return;
	}
	/* accept() in a loop until EAGAIN: the poll loop must never block in it. */
	int fl = fcntl(lfd, F_GETFL);
	if (fl < 0 || fcntl(lfd, F_SETFL, fl | O_NONBLOCK) < 0) {
		GCR_LOG(GCR_LOG_WARN, "shim", "no control socket (O_NONBLOCK: %s); this process cannot be "
			"suspended", strerror(errno));
		close(lfd);
		unlink(sock_path);
		sock_path[0] = '\0';
		return;
	}
	/* The control thread must not take the application's signals. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_t th;
	listen_fd = lfd;
	int prc = pthread_create(&th, NULL, ctl_thread, (void *)(intptr_t)lfd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (prc != 0) {
		gcr_log_problem("shim", "pid %d cannot start its control thread (%s); it cannot be suspended",
				(int)owner_pid, strerror(prc));
		close(lfd);
		unlink(sock_path);
		sock_path[0] = '\0';
		return;
	}
	pthread_detach(th);
	atexit(remove_socket);
	GCR_LOG(GCR_LOG_INFO, "shim", "control socket %s", sock_path);
	/* Sockets of killed processes (SIGKILL runs no atexit) go when the next shim starts. */
	int reaped = gcr_sock_reap(shim_cfg.socket_dir, &err);
	if (reaped > 0)
		GCR_LOG(GCR_LOG_INFO, "shim", "removed %d dead control sockets from %s", reaped, shim_cfg.socket_dir);
	register_with_agent();
}

static void reset_after_fork(void)
{
	/* The child has no control thread; it gets its own socket if it initialises CUDA. */
	start_once = (pthread_once_t)PTHREAD_ONCE_INIT;
	sock_path[0] = '\0';
	shim_cr_wake_disarm(); /* the parent's suspend, not the child's */
	shim_agent_after_fork();
}

void shim_ctl_start(void)
{
	pthread_once(&start_once, start);
}

__attribute__((constructor)) static void shim_ctl_atfork(void)
{
	pthread_atfork(NULL, NULL, reset_after_fork);
}
