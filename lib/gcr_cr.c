/* gcr_cr: the suspend/resume flow. Suspend: shim data out -> driver lock ->
 * driver checkpoint (CUDA), or CRIU check -> shim data out -> CRIU dump (HIP).
 * Resume walks whatever state it finds back to running, so an interrupted
 * operation is finished by the next resume. */
#include "gcr_cr.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_client.h"
#include "gcr_criu.h"
#include "gcr_driver.h"
#include "gcr_groupmsg.h"
#include "gcr_log.h"
#include "gcr_nvml.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"

/* A suspend of 64 GiB copies for about 1.5 s; leave ample room. */
#define SHIM_CALL_MS 600000
#define IMAGE_CALL_MS 3600000 /* a suspend to an image: bounded by the disk */
#define STATUS_CALL_MS 10000

/* The driver's state of pid, its opening (dlopen, cuInit: a gcrctl pays it at every call, a
 * daemon once) timed apart from the query itself into r. 0 or -errno, as gcr_driver_state. */
static int driver_state_timed(pid_t pid, enum gcr_driver_state *ds, struct gcr_cr_result *r, struct gcr_err *err)
{
	double t = gcr_time_mono_ms();
	int rc = gcr_driver_open(err);
	r->ms_init = gcr_time_mono_ms() - t;
	if (rc < 0)
		return rc;
	t = gcr_time_mono_ms();
	rc = gcr_driver_state(pid, ds, err);
	r->ms_state = gcr_time_mono_ms() - t;
	return rc;
}

/* A stopped process (SIGSTOP, a debugger) answers nothing until continued, and the driver's
 * steps on it may wait for it too: said at once, before any of them. -ETIMEDOUT or 0. */
static int stopped(pid_t pid, const char *what, struct gcr_err *err)
{
	char st = gcr_client_proc_state(pid);
	if (st != 'T' && st != 't')
		return 0;
	return gcr_err_set(err, -ETIMEDOUT, "process %d is stopped (state %c: %s): %s not done; it can be once the "
			   "process is continued", (int)pid, st, st == 'T' ? "SIGSTOP or job control" : "held by a debugger "
			   "or tracer", what);
}

/* A wait for the shim's answer: natural ms, at most the caller's o->call_ms. */
static int call_ms(const struct gcr_cr_opts *o, int natural)
{
	return o->call_ms > 0 && o->call_ms < natural ? o->call_ms : natural;
}

const char *gcr_cr_mode_name(enum gcr_cr_mode m)
{
	return m == GCR_CR_DRIVER_ONLY ? "driver-only" : m == GCR_CR_DATA_ONLY ? "data-only" : "gcr";
}

void gcr_cr_result_clear(struct gcr_cr_result *r)
{
	if (r == NULL)
		return;
	json_decref(r->shim);
	memset(r, 0, sizeof(*r));
}

/* The shim's state name; "" when its status has none we can read. */
static const char *shim_state(json_t *status)
{
	const char *s;
	struct gcr_err e;
	return gcr_shimreply_state(status, &s, &e) == 0 ? s : "";
}

/* The shim's state; UNKNOWN when its status has none we can read, which no check below
 * accepts, so such a process is neither suspended nor resumed. */
static enum gcr_shimreply_st shim_st(json_t *status)
{
	return gcr_shimreply_st_of(shim_state(status));
}

/* Whether the shim says the process uses HIP and not CUDA (its control step is CRIU's). A
 * process using both is refused by the shim itself; an unreadable answer is taken as CUDA,
 * what a shim without the field means too. */
static int is_hip(pid_t pid, json_t *status)
{
	int hip;
	struct gcr_err e;
	if (gcr_shimreply_is_hip(status, &hip, &e) < 0)
		GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: %s; taken as a CUDA process", (int)pid, e.msg);
	return hip;
}

/* The pid's CRIU images directory, and a file in it. */
static int images_path(const struct gcr_cr_opts *o, pid_t pid, const char *file, char *out, size_t len,
		       struct gcr_err *err)
{
	const char *root = o->images_dir ? o->images_dir : getenv("GCR_IMAGES_DIR");
	if (root == NULL || root[0] == '\0')
		root = GCR_CR_IMAGES_DIR;
	int n = file ? snprintf(out, len, "%s/%d/%s", root, (int)pid, file)
		     : snprintf(out, len, "%s/%d", root, (int)pid);
	return n < 0 || (size_t)n >= len ? gcr_err_set(err, -ENAMETOOLONG, "images directory name too long") : 0;
}

static int mkdir_p(const char *path)
{
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof(tmp), "%s", path);
	for (char *p = tmp + 1; *p != '\0'; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	return mkdir(tmp, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

/* Whether a CRIU dump of pid waits to be restored (whatever the mode asked). */
static int dump_marked(const struct gcr_cr_opts *o, pid_t pid)
{
	char mark[PATH_MAX];
	struct gcr_err e;
	return images_path(o, pid, GCR_CR_DUMP_MARK, mark, sizeof(mark), &e) == 0 && access(mark, F_OK) == 0;
}

/* Whether resume restores pid with CRIU: only full mode runs CRIU. */
static int dumped(const struct gcr_cr_opts *o, pid_t pid)
{
	return o->mode == GCR_CR_FULL && dump_marked(o, pid);
}

/* criu dump of pid into its images directory; CRIU ends the process (its GPU state goes with
 * it). The mark is written only after a dump that succeeded. */
static int criu_dump(pid_t pid, const struct gcr_cr_opts *o, const struct gcr_criu_info *ci, struct gcr_err *err)
{
	char dir[PATH_MAX], mark[PATH_MAX];
	struct gcr_criu_argv a;
	int rc = images_path(o, pid, NULL, dir, sizeof(dir), err);
	if (rc == 0)
		rc = images_path(o, pid, GCR_CR_DUMP_MARK, mark, sizeof(mark), err);
	if (rc == 0 && (rc = mkdir_p(dir)) < 0)
		gcr_err_set(err, rc, "cannot create the images directory %s: %s", dir, strerror(-rc));
	if (rc == 0)
		rc = gcr_criu_dump_argv(ci, pid, dir, GCR_CRIU_KILL, &a, err);
	if (rc == 0)
		rc = gcr_criu_run(ci, &a, err);
	if (rc < 0)
		return rc;
	FILE *f = fopen(mark, "w");
	if (f == NULL || fprintf(f, "%d\n", (int)pid) < 0 || fclose(f) != 0) {
		/* The process is gone into the image; say where it is rather than pretend. */
		rc = gcr_err_set(err, -EIO, "criu dump succeeded but %s could not be written; restore with criu "
				 "restore --images-dir %s", mark, dir);
		if (f != NULL)
			fclose(f);
	}
	return rc;
}

/* criu restore of pid's images; the restored process must have its pid back. */
static int criu_restore(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err)
{
	char dir[PATH_MAX], mark[PATH_MAX], pidfile[PATH_MAX];
	struct gcr_criu_info ci;
	struct gcr_criu_argv a;
	int rc = images_path(o, pid, NULL, dir, sizeof(dir), err);
	if (rc == 0)
		rc = images_path(o, pid, GCR_CR_DUMP_MARK, mark, sizeof(mark), err);
	if (rc == 0)
		rc = images_path(o, pid, "restore.pid", pidfile, sizeof(pidfile), err);
	if (rc == 0)
		rc = gcr_criu_check(NULL, &ci, err);
	if (rc == 0)
		rc = gcr_criu_restore_argv(&ci, dir, pidfile, &a, err);
	double t = gcr_time_mono_ms();
	if (rc == 0) {
		unlink(pidfile);
		rc = gcr_criu_run(&ci, &a, err);
	}
	r->ms_restore = gcr_time_mono_ms() - t;
	if (rc < 0)
		return gcr_err_wrap(err, "process %d still in its CRIU images (%s); retry resume", (int)pid, dir);
	unlink(mark);
	FILE *f = fopen(pidfile, "r");
	int got = 0;
	if (f == NULL || fscanf(f, "%d", &got) != 1)
		got = 0;
	if (f != NULL)
		fclose(f);
	if (got != (int)pid)
		return gcr_err_set(err, -EIO, "criu restore gave pid %d, not %d (%s)", got, (int)pid, pidfile);
	return 0;
}

/* ---- restore room: the driver's cuCheckpointProcessRestore that runs out of GPU memory
 * leaves the process unrestorable for good (CUDA_ERROR_OPERATING_SYSTEM on every later try,
 * seen on an H200, driver 580), so a resume must know there is room before it calls it. ---- */

static unsigned long long room_margin(void)
{
	const char *e = getenv("GCR_RESTORE_MARGIN_MIB");
	char *end;
	unsigned long long mib = e != NULL ? strtoull(e, &end, 10) : GCR_CR_RESTORE_MARGIN_MIB;
	if (e != NULL && (end == e || *end != '\0' || mib > (1ULL << 20)))
		mib = GCR_CR_RESTORE_MARGIN_MIB;
	return mib << 20;
}

/* What the driver's restore will need: pid's device memory per GPU as NVML sees it, taken
 * with the application held at the shim's gate after the data step (nothing allocates), so
 * it is exactly what the driver's checkpoint is about to take off the GPU. */
static int room_need(pid_t pid, json_t **need, struct gcr_err *err)
{
	struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
	int n = 0;
	*need = NULL;
	int rc = gcr_nvml_proc_use(pid, use, GCR_NVML_MAX_DEVICES, &n, err);
	if (rc < 0)
		return rc;
	if (n == 0)
		return gcr_err_set(err, -ENODEV, "NVML lists pid %d on no GPU (another PID namespace?)", (int)pid);
	struct gcr_need nd = { .n = 0 };
	for (int i = 0; i < n && nd.n < GCR_NEED_MAX_DEVICES; i++, nd.n++) {
		char *u = nd.dev[nd.n].uuid;
		snprintf(u, GCR_NEED_UUID_MAX, "%.*s", GCR_NEED_UUID_MAX - 1, use[i].uuid);
		nd.dev[nd.n].bytes = (long long)use[i].bytes;
	}
	*need = gcr_proto_need_json(&nd);
	return *need != NULL ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
}

/* The shim status's record of what the restore needs, as an error a caller can show. */
static int need_of(pid_t pid, json_t *status, struct gcr_need *need, struct gcr_err *err)
{
	struct gcr_err e;
	int rc = gcr_shimreply_restore_need(status, need, &e);
	if (rc == -ENOENT)
		return gcr_err_set(err, -ENOTSUP, "the shim kept no record of the GPU memory pid %d's restore needs "
				   "(suspended by an older gcr?); process still suspended (driver checkpointed); "
				   "resume --unchecked to restore anyway", (int)pid);
	if (rc < 0)
		return gcr_err_set(err, -ENOTSUP, "the shim's record of the restore's GPU memory is malformed (%s); "
				   "process still suspended (driver checkpointed); resume --unchecked to restore anyway",
				   e.msg);
	return 0;
}

/* The GPU that need's device i is restored onto: its pair's, else its own. */
static const char *dest_of(const struct gcr_gpu_pair *pairs, size_t np, const char *uuid)
{
	for (size_t k = 0; k < np; k++)
		if (strcmp(pairs[k].from, uuid) == 0)
			return pairs[k].to;
	return uuid;
}

/* The driver's gpuPairs for this process, from o's pairs or target and the GPUs its restore
 * needs: every such GPU named (the driver wants all of them once one is remapped; identity for
 * those o leaves alone), pairs of GPUs it did not use left out, no two onto one GPU, every
 * target on this node and of the checkpointed GPU's model. *np 0: restore where it was. */
static int plan_pairs(pid_t pid, const struct gcr_need *need, const struct gcr_cr_opts *o,
		      struct gcr_gpu_pair *out, size_t *np, struct gcr_err *err)
{
	*np = 0;
	if (o->target_gpu == NULL && o->ngpu_pairs == 0)
		return 0;
	if (o->target_gpu != NULL && need->n != 1)
		return gcr_err_set(err, -EINVAL, "pid %d used %zu GPUs: a target GPU needs GPU pairs for each; process "
				   "still suspended (driver checkpointed)", (int)pid, need->n);
	if (need->n > GCR_DRIVER_MAX_PAIRS)
		return gcr_err_set(err, -EINVAL, "pid %d used %zu GPUs, more than the %d pairs the driver takes",
				   (int)pid, need->n, GCR_DRIVER_MAX_PAIRS);
	int moved = 0;
	for (size_t i = 0; i < need->n; i++) {
		const char *from = need->dev[i].uuid;
		const char *to = o->target_gpu != NULL ? o->target_gpu : dest_of(o->gpu_pairs, o->ngpu_pairs, from);
		for (size_t j = 0; j < i; j++)
			if (strcmp(out[j].to, to) == 0)
				return gcr_err_set(err, -EINVAL, "pid %d: GPUs %s and %s would both be restored onto %s; "
						   "process still suspended (driver checkpointed)", (int)pid, out[j].from,
						   from, to);
		snprintf(out[i].from, sizeof(out[i].from), "%s", from);
		snprintf(out[i].to, sizeof(out[i].to), "%s", to);
		if (strcmp(from, to) == 0)
			continue;
		moved = 1;
		char m_from[128], m_to[128];
		struct gcr_err e;
		int rc = gcr_nvml_model(to, m_to, sizeof(m_to), &e);
		if (rc == -ENODEV)
			return gcr_err_set(err, -ENODEV, "pid %d: no GPU %s on this node to restore onto; process still "
					   "suspended (driver checkpointed) on %s", (int)pid, to, from);
		if (rc == 0 && gcr_nvml_model(from, m_from, sizeof(m_from), &e) == 0 &&
		    strcmp(m_from, "unknown") != 0 && strcmp(m_to, "unknown") != 0 && strcmp(m_from, m_to) != 0)
			return gcr_err_set(err, -EINVAL, "pid %d: GPU %s is an %s, the process was checkpointed on an %s "
					   "(%s): the driver restores onto the same model only; process still suspended "
					   "(driver checkpointed)", (int)pid, to, m_to, m_from, from);
	}
	if (!moved)
		return 0;
	/* The driver takes the pairs as a permutation of the process's GPUs (measured on two H100s:
	 * 0->1 alone is CUDA_ERROR_INVALID_VALUE, 0->1 with 1->0 restores onto GPU 1): a GPU a pair
	 * moves onto, which the process still sees under its own ordinal, goes where a moved GPU was.
	 * Such a GPU holds none of the process's memory, so it needs no room. */
	size_t n = need->n;
	for (size_t i = 0; i < need->n; i++) {
		int is_from = 0;
		for (size_t j = 0; j < need->n; j++)
			is_from |= strcmp(out[j].from, out[i].to) == 0;
		if (is_from)
			continue;
		for (size_t j = 0; j < need->n; j++) { /* a GPU moved away, not yet anyone's target */
			int taken = 0;
			for (size_t k = 0; k < n; k++)
				taken |= strcmp(out[k].to, out[j].from) == 0;
			if (taken)
				continue;
			if (n == GCR_DRIVER_MAX_PAIRS)
				return gcr_err_set(err, -EINVAL, "pid %d: more GPU pairs than the driver takes",
						   (int)pid);
			memcpy(out[n].from, out[i].to, sizeof(out[n].from)); /* same size, NUL-terminated */
			memcpy(out[n].to, out[j].from, sizeof(out[n].to));
			n++;
			break;
		}
	}
	*np = n;
	return 0;
}

/* Whether every GPU the restore needs (on the GPU pairs' targets) has its bytes plus the margin
 * free now; -ENOSPC if one has not. */
static int room_check(pid_t pid, const struct gcr_need *need, const struct gcr_gpu_pair *pairs,
		      size_t np, struct gcr_err *err)
{
	unsigned long long margin = room_margin();
	for (size_t i = 0; i < need->n; i++) {
		const char *uuid = dest_of(pairs, np, need->dev[i].uuid); /* moved: the new GPU's room counts */
		unsigned long long bytes = (unsigned long long)need->dev[i].bytes;
		unsigned long long fr = 0, total = 0;
		int rc = gcr_nvml_mem(uuid, &fr, &total, err);
		if (rc < 0) {
			gcr_err_wrap(err, "cannot check the GPU has room for the restore; process still suspended "
				     "(driver checkpointed); resume --unchecked to restore anyway");
			return err->code = -ENOTSUP;
		}
		GCR_LOG(GCR_LOG_DEBUG, "gcr_cr", "pid %d: restore room on %s: need %llu + margin %llu bytes, free %llu",
			(int)pid, uuid, bytes, margin, fr);
		if (fr < bytes + margin)
			return gcr_err_set(err, -ENOSPC, "GPU %s: %llu bytes free, pid %d's restore needs %llu (%llu held "
					   "+ %llu margin); process still suspended (driver checkpointed); retry when "
					   "the GPU has room", uuid, fr, (int)pid, bytes + margin, bytes, margin);
	}
	return 0;
}

/* Asks the shim to undo its data step after a later step failed (after a suspend to an image,
 * the data comes back from its files: image-read first). */
static void undo_data(struct gcr_client *c, const struct gcr_cr_opts *o, const char *image_dir, struct gcr_err *err)
{
	json_t *res = NULL;
	struct gcr_err e2;
	int rc = 0;
	if (image_dir != NULL) {
		rc = gcr_client_call(c, GCR_OP_IMAGE_READ_ID, json_pack("{s:s}", "dir", image_dir),
				     call_ms(o, SHIM_CALL_MS), &res, &e2);
		json_decref(res);
		res = NULL;
	}
	if (rc == 0)
		rc = gcr_client_call(c, GCR_OP_RESUME_ID, NULL, call_ms(o, SHIM_CALL_MS), &res, &e2);
	if (rc < 0)
		gcr_err_wrap(err, "and undoing the data step failed too (%s); run resume again", e2.msg);
	else
		gcr_err_wrap(err, "GPU data restored, process running");
	json_decref(res);
}

/* The shim's byte counts: what crossed PCIe, and the size of the buffers. They only go into
 * reports and metrics, so counts we cannot read are reported as 0 and the operation stands. */
static void shim_bytes(pid_t pid, struct gcr_cr_result *r)
{
	struct gcr_err e;
	if (gcr_shimreply_bytes(r->shim, &r->bytes_total, &r->bytes_moved, &e) < 0)
		GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: %s; byte counts reported as 0", (int)pid, e.msg);
}

/* A HIP process: CRIU is checked before anything is touched (full mode), then the shim's data
 * step, then criu dump; a failed dump gives the data back, so the process keeps running.
 * Takes c and status over. */
static int hip_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_client *c, struct gcr_cr_result *r,
		       struct gcr_err *err, json_t *status)
{
	struct gcr_criu_info ci;
	int rc = 0;
	double t0 = gcr_time_mono_ms(), t;
	r->control = o->mode == GCR_CR_FULL ? GCR_CR_CONTROL_CRIU : GCR_CR_CONTROL_NONE;
	if (o->mode == GCR_CR_FULL && (rc = gcr_criu_check(NULL, &ci, err)) < 0) {
		gcr_err_wrap(err, "HIP process %d untouched (its control step needs CRIU; --no-driver moves the "
			     "data only)", (int)pid);
		goto out;
	}
	json_t *args = json_pack("{s:i}", "timeout_ms", o->timeout_ms);
	if (o->wake && o->mode != GCR_CR_FULL) /* full: CRIU dumps the process, nothing calls */
		json_object_set_new(args, "wake", json_true());
	rc = gcr_client_call(c, GCR_OP_SUSPEND_ID, args, call_ms(o, SHIM_CALL_MS), &r->shim, err);
	if (rc < 0)
		goto out; /* the shim unwound itself: still running */
	shim_bytes(pid, r);
	r->ms_data = gcr_time_mono_ms() - t0;
	if (o->mode == GCR_CR_FULL) {
		/* Our connection to the shim is not part of what CRIU saves. */
		gcr_client_close(c);
		t = gcr_time_mono_ms();
		rc = criu_dump(pid, o, &ci, err);
		r->ms_checkpoint = gcr_time_mono_ms() - t;
		if (rc < 0) {
			struct gcr_err e2;
			if (gcr_client_open(c, o->socket_dir, pid, &e2) < 0)
				gcr_err_wrap(err, "and the shim no longer answers (%s)", e2.msg);
			else
				undo_data(c, o, NULL, err);
			goto out;
		}
	}
	r->ms_total = gcr_time_mono_ms() - t0;
out:
	json_decref(status);
	gcr_client_close(c);
	return rc;
}

int gcr_cr_keep_need(struct gcr_client *c, json_t *need, int ms, struct gcr_err *err)
{
	json_t *res = NULL;
	int rc = gcr_client_call(c, GCR_OP_RESTORE_NEED_ID, json_incref(need), ms, &res, err);
	json_decref(res);
	if (rc != -EOPNOTSUPP)
		return rc;
	res = NULL;
	rc = gcr_client_call(c, GCR_OP_TRIM_ID, json_pack("{s:O, s:b}", "restore_need", need, "trim", 0), ms, &res,
			     err);
	json_decref(res);
	return rc;
}

int gcr_cr_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL, *need = NULL;
	double t0 = gcr_time_mono_ms(), t;
	int rc = 0, hip = 0, need_kept = 0;
	r->control = o->mode == GCR_CR_DATA_ONLY ? GCR_CR_CONTROL_NONE : GCR_CR_CONTROL_DRIVER;
	if ((rc = stopped(pid, "suspend", err)) < 0)
		goto out;
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_open(&c, o->socket_dir, pid, err);
		if (rc < 0)
			goto out;
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), &status, err);
		if (rc < 0)
			goto out;
		enum gcr_shimreply_st st = shim_st(status);
		int ready = o->group ? st == GCR_SHIMREPLY_ST_DRAINED || st == GCR_SHIMREPLY_ST_DETACHED
				     : st == GCR_SHIMREPLY_ST_RUNNING;
		if (!ready) {
			rc = gcr_err_set(err, -EALREADY, "process %d is %s (shim state %s)", (int)pid,
					 o->group ? "not a drained group member" : "already suspended", shim_state(status));
			goto out;
		}
		hip = is_hip(pid, status);
		if (hip && o->group) {
			rc = gcr_err_set(err, -ENOTSUP, "process %d: groups of HIP processes are not supported", (int)pid);
			goto out;
		}
	}
	if (hip)
		return hip_suspend(pid, o, &c, r, err, status);
	if (o->mode != GCR_CR_DATA_ONLY) {
		enum gcr_driver_state ds;
		rc = driver_state_timed(pid, &ds, r, err);
		if (rc < 0)
			goto out;
		if (ds != GCR_DRIVER_RUNNING) {
			rc = gcr_err_set(err, -EALREADY, "process %d is already suspended (driver state %s)",
					 (int)pid, gcr_driver_state_name(ds));
			goto out;
		}
	}
	t0 = gcr_time_mono_ms();
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		json_t *args = json_pack("{s:i}", "timeout_ms", o->timeout_ms);
		if (o->image_dir != NULL)
			json_object_set_new(args, "image", json_string(o->image_dir));
		else if (o->wake)
			json_object_set_new(args, "wake", json_true());
		else if (o->group)
			json_object_set_new(args, "group", json_true());
		/* To an image the copies go at the disk's speed: minutes for the largest GPUs. */
		rc = gcr_client_call(&c, GCR_OP_SUSPEND_ID, args,
				     call_ms(o, o->image_dir != NULL ? IMAGE_CALL_MS : SHIM_CALL_MS), &r->shim, err);
		if (rc < 0)
			goto out; /* the shim unwound itself: still running */
		shim_bytes(pid, r);
		r->ms_data = gcr_time_mono_ms() - t0;
	}
	if (o->mode == GCR_CR_FULL && !o->unchecked) {
		t = gcr_time_mono_ms();
		rc = room_need(pid, &need, err);
		r->ms_room = gcr_time_mono_ms() - t;
		if (rc < 0) {
			gcr_err_wrap(err, "cannot record the GPU memory a restore will need (--unchecked skips)");
			undo_data(&c, o, o->image_dir, err);
			goto out;
		}
		/* Kept by the shim before the driver's checkpoint: if this suspend is cut short after
		 * it (gcrctl or the agent killed), the resume still finds what it must check. */
		struct gcr_err e2;
		if (gcr_cr_keep_need(&c, need, call_ms(o, STATUS_CALL_MS), &e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: restore need not kept before the driver's checkpoint "
				"(tried again after it): %s", (int)pid, e2.msg);
		else
			need_kept = 1;
	}
	if (o->mode != GCR_CR_DATA_ONLY) {
		t = gcr_time_mono_ms();
		rc = gcr_driver_lock(pid, (unsigned)o->timeout_ms, err);
		r->ms_lock = gcr_time_mono_ms() - t;
		if (rc < 0) {
			if (o->mode == GCR_CR_FULL)
				undo_data(&c, o, o->image_dir, err);
			goto out;
		}
		t = gcr_time_mono_ms();
		rc = gcr_driver_checkpoint(pid, err);
		r->ms_checkpoint = gcr_time_mono_ms() - t;
		if (rc < 0) {
			struct gcr_err e2;
			if (gcr_driver_unlock(pid, &e2) < 0)
				gcr_err_wrap(err, "unlock failed too (%s)", e2.msg);
			else if (o->mode == GCR_CR_FULL)
				undo_data(&c, o, o->image_dir, err);
			goto out;
		}
	}
	r->ms_total = gcr_time_mono_ms() - t0;
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		/* Off the clock: unused staging goes back only now, because giving memory
		 * back while the driver checkpoints slows the checkpoint. The shim keeps the
		 * restore's need for whichever resume comes (gcrctl or the agent). */
		json_t *res = NULL;
		struct gcr_err e2;
		if (need != NULL && !need_kept && gcr_cr_keep_need(&c, need, call_ms(o, STATUS_CALL_MS), &e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: restore need not kept (resume will need --unchecked): "
				"%s", (int)pid, e2.msg);
		if (gcr_client_call(&c, GCR_OP_TRIM_ID, NULL, call_ms(o, STATUS_CALL_MS), &res, &e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: staging not trimmed (host memory held until the "
				"resume): %s", (int)pid, e2.msg);
		json_decref(res);
	}
out:
	json_decref(need);
	json_decref(status);
	gcr_client_close(&c);
	return rc;
}

/* A resume of one member of a group whose communicators were torn down would leave it waiting
 * for peers that nobody brings back: refused before the driver's restore, the group resumes as
 * one. A status without communicators (older shims, no NCCL) is not a member. */
static int refuse_member(struct gcr_client *c, struct gcr_err *err)
{
	json_t *status = NULL;
	struct gcr_err e;
	if (gcr_client_call(c, GCR_OP_STATUS_ID, NULL, 10000, &status, &e) < 0)
		return 0; /* the resume below reads it again and says why */
	struct gcr_group_comms *comms = malloc(sizeof(*comms));
	int rc = 0;
	if (comms != NULL && gcr_shimreply_comms(status, comms, &e) == 0)
		for (size_t i = 0; i < comms->n && rc == 0; i++)
			if (comms->c[i].state == GCR_GROUP_COMM_DOWN)
				rc = gcr_err_set(err, -EXDEV, "process %d is a member of an NCCL group whose communicators "
						 "are torn down; resume the group: gcrctl resume --group PID,... "
						 "(nothing touched, process still suspended)", (int)c->pid);
	free(comms);
	json_decref(status);
	return rc;
}

int gcr_cr_resume(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL;
	int rc = 0, did = 0;
	enum gcr_driver_state ds = GCR_DRIVER_RUNNING;
	struct gcr_gpu_pair pairs[GCR_DRIVER_MAX_PAIRS];
	size_t npairs = 0;
	double t0 = gcr_time_mono_ms(), t;
	r->control = o->mode == GCR_CR_DATA_ONLY ? GCR_CR_CONTROL_NONE : GCR_CR_CONTROL_DRIVER;
	if (o->target_gpu != NULL && o->ngpu_pairs > 0)
		return gcr_err_set(err, -EINVAL, "a target GPU or GPU pairs, not both; process %d untouched", (int)pid);
	if ((rc = stopped(pid, "resume", err)) < 0)
		goto out;
	/* A HIP process CRIU dumped: it comes back from its images first (same pid, its staged
	 * data in its memory), then the shim's data step below. */
	if (dumped(o, pid)) {
		r->control = GCR_CR_CONTROL_CRIU;
		rc = criu_restore(pid, o, r, err);
		if (rc < 0)
			goto out;
		did = 1;
	}
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_open(&c, o->socket_dir, pid, err);
		if (rc < 0)
			goto out;
		if (!o->group && (rc = refuse_member(&c, err)) < 0)
			goto out;
	}
	if (o->mode != GCR_CR_DATA_ONLY) {
		rc = driver_state_timed(pid, &ds, r, err);
		if (rc < 0 && o->mode == GCR_CR_FULL) {
			/* No CUDA driver here: a HIP process's control state was CRIU's (above). */
			struct gcr_err e2;
			if (gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), &status, &e2) == 0 && is_hip(pid, status)) {
				rc = 0;
				ds = GCR_DRIVER_RUNNING;
				if (!did)
					r->control = GCR_CR_CONTROL_NONE;
			}
			json_decref(status);
			status = NULL;
		}
		if (rc < 0)
			goto out;
	}
	t0 = did ? t0 : gcr_time_mono_ms();
	if (ds == GCR_DRIVER_FAILED) {
		rc = gcr_err_set(err, -EIO, "the driver reports process %d in the failed state", (int)pid);
		goto out;
	}
	if (ds == GCR_DRIVER_CHECKPOINTED && !o->unchecked && o->mode == GCR_CR_DRIVER_ONLY) {
		GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: restore room not checked (driver-only: no shim keeps the "
			"need); an out-of-memory restore would lose the process", (int)pid);
	} else if (ds == GCR_DRIVER_CHECKPOINTED && !o->unchecked) {
		struct gcr_need need;
		t = gcr_time_mono_ms();
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), &status, err);
		if (rc == 0)
			rc = need_of(pid, status, &need, err);
		if (rc == 0)
			rc = plan_pairs(pid, &need, o, pairs, &npairs, err);
		if (rc == 0)
			rc = room_check(pid, &need, pairs, npairs, err);
		json_decref(status);
		status = NULL;
		r->ms_room = gcr_time_mono_ms() - t;
		if (rc < 0)
			goto out;
	} else if (o->target_gpu != NULL && ds == GCR_DRIVER_CHECKPOINTED) {
		rc = gcr_err_set(err, -EINVAL, "a target GPU needs the shim's record of the GPUs pid %d used (not with "
				 "--unchecked or driver-only); name them with GPU pairs", (int)pid);
		goto out;
	} else if (ds == GCR_DRIVER_CHECKPOINTED) { /* unchecked: o's pairs as they are */
		npairs = o->ngpu_pairs < GCR_DRIVER_MAX_PAIRS ? o->ngpu_pairs : GCR_DRIVER_MAX_PAIRS;
		if (npairs > 0) /* gpu_pairs may be NULL when there are none */
			memcpy(pairs, o->gpu_pairs, npairs * sizeof(*pairs));
	}
	if (ds == GCR_DRIVER_CHECKPOINTED) {
		t = gcr_time_mono_ms();
		rc = gcr_driver_restore(pid, pairs, npairs, err);
		r->ms_restore = gcr_time_mono_ms() - t;
		if (rc == -ENOMEM) /* past the room check: someone allocated meanwhile */
			gcr_err_wrap(err, "the driver's restore ran out of GPU memory after the room check passed; "
				     "drivers up to 580 cannot restore this process again (docs/design.md)");
		else if (rc < 0) /* not memory (that is -ENOMEM above): a bad GPU pair, a lost GPU... */
			gcr_err_wrap(err, "process still suspended (driver checkpointed); resume again to retry");
		if (rc < 0)
			goto out;
		ds = GCR_DRIVER_LOCKED;
		did = 1;
	}
	if (ds == GCR_DRIVER_LOCKED) {
		t = gcr_time_mono_ms();
		rc = gcr_driver_unlock(pid, err);
		r->ms_unlock = gcr_time_mono_ms() - t;
		if (rc < 0)
			goto out;
		did = 1;
	}
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), &status, err);
		if (rc < 0)
			goto out;
		if (shim_st(status) == GCR_SHIMREPLY_ST_SUSPENDED) {
			t = gcr_time_mono_ms();
			rc = gcr_client_call(&c, GCR_OP_RESUME_ID, NULL, call_ms(o, SHIM_CALL_MS), &r->shim, err);
			r->ms_data = gcr_time_mono_ms() - t;
			if (rc < 0) {
				gcr_err_wrap(err, "GPU data kept (in host memory, or in the image files after image-read), "
					     "process held at the gate; retry resume");
				goto out;
			}
			shim_bytes(pid, r);
			did = 1;
		}
	}
	if (!did) {
		rc = gcr_err_set(err, -EINVAL, "process %d is not suspended", (int)pid);
		goto out;
	}
	r->ms_total = gcr_time_mono_ms() - t0;
out:
	json_decref(status);
	gcr_client_close(&c);
	return rc;
}

int gcr_cr_control(pid_t pid, const struct gcr_cr_opts *o, int out, struct gcr_err *err)
{
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL, *need = NULL, *res = NULL;
	enum gcr_driver_state ds;
	int rc = stopped(pid, "the driver's step", err);
	if (rc == 0)
		rc = gcr_client_open(&c, o->socket_dir, pid, err);
	if (rc == 0)
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), &status, err);
	if (rc == 0 && shim_st(status) != GCR_SHIMREPLY_ST_SUSPENDED)
		rc = gcr_err_set(err, -EINVAL, "process %d: its shim is %s, not suspended", (int)pid, shim_state(status));
	if (rc == 0 && is_hip(pid, status))
		rc = gcr_err_set(err, -ENOTSUP, "process %d is a HIP process: its control step is CRIU's", (int)pid);
	if (rc == 0)
		rc = gcr_driver_state(pid, &ds, err);
	if (rc < 0)
		goto out;
	if (out) {
		if (ds != GCR_DRIVER_RUNNING) {
			rc = gcr_err_set(err, -EALREADY, "process %d: the driver holds it already (%s)", (int)pid,
					 gcr_driver_state_name(ds));
			goto out;
		}
		if (!o->unchecked && (rc = room_need(pid, &need, err)) < 0) {
			gcr_err_wrap(err, "cannot record the GPU memory its restore will need; untouched");
			goto out;
		}
		if (need != NULL)
			rc = gcr_cr_keep_need(&c, need, call_ms(o, STATUS_CALL_MS), err);
		if (rc == 0)
			rc = gcr_driver_lock(pid, (unsigned)o->timeout_ms, err);
		if (rc == 0 && (rc = gcr_driver_checkpoint(pid, err)) < 0) {
			struct gcr_err e2;
			if (gcr_driver_unlock(pid, &e2) < 0)
				gcr_err_wrap(err, "unlock failed too (%s)", e2.msg);
		}
		if (rc < 0)
			gcr_err_wrap(err, "its context stays on the GPU, its data suspended");
		goto out;
	}
	if (ds == GCR_DRIVER_CHECKPOINTED && !o->unchecked) { /* back where it was: no pairs */
		struct gcr_need rn;
		rc = need_of(pid, status, &rn, err);
		if (rc == 0)
			rc = room_check(pid, &rn, NULL, 0, err);
	}
	if (rc == 0 && ds == GCR_DRIVER_CHECKPOINTED && (rc = gcr_driver_restore(pid, NULL, 0, err)) == 0)
		ds = GCR_DRIVER_LOCKED;
	if (rc == 0 && ds == GCR_DRIVER_LOCKED)
		rc = gcr_driver_unlock(pid, err);
	if (rc < 0)
		gcr_err_wrap(err, "its context still checkpointed by the driver, its data suspended");
out:
	json_decref(res);
	json_decref(need);
	json_decref(status);
	gcr_client_close(&c);
	return rc;
}

/* ---- the process's state ---- */

static const char *const st_names[GCR_CR_ST_N] = { "running", "suspended", "partial", "unmanaged", "gone" };

const char *gcr_cr_st_name(enum gcr_cr_st s)
{
	return (unsigned)s < GCR_CR_ST_N ? st_names[s] : "unknown";
}

enum gcr_cr_st gcr_cr_state_combine(const struct gcr_cr_proc_state *in, enum gcr_cr_mode mode)
{
	if (!in->shim)
		return in->dumped ? GCR_CR_ST_SUSPENDED : in->exists ? GCR_CR_ST_UNMANAGED : GCR_CR_ST_GONE;
	/* The driver's side: a HIP process has none, and an unreadable one is running (the rule
	 * in gcr_cr.h). */
	enum gcr_driver_state d = in->hip || !in->driver ? GCR_DRIVER_RUNNING : in->driver_st;
	int shim_running = in->shim_st == GCR_SHIMREPLY_ST_RUNNING;
	int shim_suspended = in->shim_st == GCR_SHIMREPLY_ST_SUSPENDED;
	if (shim_running && d == GCR_DRIVER_RUNNING)
		return GCR_CR_ST_RUNNING;
	int suspended = 0;
	switch (mode) {
	case GCR_CR_FULL: suspended = shim_suspended && (in->hip || d == GCR_DRIVER_CHECKPOINTED); break;
	case GCR_CR_DATA_ONLY: suspended = shim_suspended && d == GCR_DRIVER_RUNNING; break;
	case GCR_CR_DRIVER_ONLY: suspended = shim_running && !in->hip && d == GCR_DRIVER_CHECKPOINTED; break;
	}
	return suspended ? GCR_CR_ST_SUSPENDED : GCR_CR_ST_PARTIAL;
}

/* Reads pid's shim status (*status: owned, NULL without one), the driver's state and the
 * dump mark into ps (all but the verdict); shim_err and drv_err say why one is missing
 * (shim_err: -ESRCH when the process does not exist). */
static void read_state(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_proc_state *ps, json_t **status,
		      struct gcr_err *shim_err, struct gcr_err *drv_err)
{
	memset(ps, 0, sizeof(*ps));
	*status = NULL;
	shim_err->code = drv_err->code = 0;
	shim_err->msg[0] = drv_err->msg[0] = '\0';
	ps->exists = 1;
	ps->shim_st = GCR_SHIMREPLY_ST_UNKNOWN;
	struct gcr_client c = { .fd = -1 };
	int rc = gcr_client_open(&c, o->socket_dir, pid, shim_err);
	if (rc < 0 && dump_marked(o, pid)) {
		ps->exists = 0; /* in its images, until CRIU restores it (same pid) */
		ps->dumped = 1;
		ps->hip = 1; /* only HIP processes are dumped */
		return;
	}
	if (rc == -ESRCH) {
		ps->exists = 0;
		return;
	}
	if (rc == 0)
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, call_ms(o, STATUS_CALL_MS), status, shim_err);
	gcr_client_close(&c);
	const char *name;
	if (*status != NULL) {
		struct gcr_err e;
		if (gcr_shimreply_state(*status, &name, &e) == 0) {
			ps->shim = 1;
			ps->shim_st = gcr_shimreply_st_of(name);
		} else {
			*shim_err = e; /* then as no shim */
		}
		ps->hip = is_hip(pid, *status);
		struct gcr_err de;
		if (gcr_shimreply_data(*status, &ps->data, &de) < 0)
			ps->data = GCR_SHIMREPLY_DATA_HOST; /* absent: an older shim, running */
	}
	if (!ps->hip && stopped(pid, "reading the driver's state", drv_err) == 0)
		ps->driver = gcr_driver_state(pid, &ps->driver_st, drv_err) == 0;
}

int gcr_cr_state(pid_t pid, const struct gcr_cr_opts *opts, struct gcr_cr_proc_state *out, struct gcr_err *err)
{
	json_t *status = NULL;
	struct gcr_err shim_err, drv_err;
	(void)err; /* every reading is a state */
	read_state(pid, opts, out, &status, &shim_err, &drv_err);
	json_decref(status);
	if (shim_err.code == -EPROTO)
		GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: %s", (int)pid, shim_err.msg);
	out->state = gcr_cr_state_combine(out, opts->mode);
	return 0;
}

int gcr_cr_status(pid_t pid, const struct gcr_cr_opts *o, json_t **out, struct gcr_err *err)
{
	*out = NULL;
	struct gcr_cr_proc_state ps;
	json_t *status = NULL;
	struct gcr_err drv_err;
	read_state(pid, o, &ps, &status, err, &drv_err);
	ps.state = gcr_cr_state_combine(&ps, o->mode);
	if (ps.dumped) {
		*out = json_pack("{s:i, s:s, s:s, s:s}", "pid", (int)pid, "state", gcr_cr_st_name(ps.state), "driver",
				 GCR_CR_DRIVER_NONE, "criu", "dumped");
		return 0;
	}
	if (!ps.exists)
		return err->code; /* -ESRCH, err says why */
	json_t *o_json = json_pack("{s:i, s:s, s:o*}", "pid", (int)pid, "state", gcr_cr_st_name(ps.state), "shim",
				   status);
	if (ps.hip)
		json_object_set_new(o_json, "driver", json_string(GCR_CR_DRIVER_NONE)); /* AMD: CRIU, not a driver API */
	else if (ps.driver)
		json_object_set_new(o_json, "driver", json_string(gcr_driver_state_name(ps.driver_st)));
	else
		json_object_set_new(o_json, "driver_error", json_string(drv_err.msg));
	if (status == NULL)
		json_object_set_new(o_json, "shim_error", json_string(err->msg));
	*out = o_json;
	return 0;
}
