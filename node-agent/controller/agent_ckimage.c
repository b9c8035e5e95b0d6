/* agent_ckimage: a Checkpoint's Image, each step recorded before it runs (agent_ckimage.h).
 *
 * Recovery reads the step the record names and the process's real state (its shim, the driver,
 * where its GPU data is) and never guesses: a process found suspended by this Image is brought
 * back first, from the files its record names; an Image cut short before anything of the CPU side
 * was taken is run again (once); one cut short during the dump ends Failed Interrupted (the dump
 * may still be writing: the kubelet's archive is looked for and removed while it may come); one
 * whose dump is done is finished. */
#include "config.h"

#include "agent_ckimage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_cgroup.h"
#include "agent_images.h"
#include "gcr_cr.h"
#include "gcr_image.h"
#include "gcr_imagemac.h"
#include "gcr_imgcr.h"
#include "gcr_log.h"
#include "gcr_procns.h"
#include "gcr_time.h"

/* A dump a restart cut short may still write its archive this long after it was asked for (s). */
#define ARCHIVE_WATCH_S (AGENT_CKIMAGE_KUBELET_S + 60)
/* The kubelet names its archive with the time it took the request (RFC 3339, whole seconds): the
 * archive of the request sent at dump_at is named within this window around it (s). */
#define ARCHIVE_BEFORE_S 2
#define ARCHIVE_AFTER_S 5
/* An Image cut short before its dump is run again at most this many times in all. */
#define MAX_ATTEMPTS 2
/* Most entries looked at in the kubelet's checkpoint directory per record and sweep. */
#define MAX_ARCHIVES 4096

struct agent_ckimage {
	struct agent_ckimage_cfg cfg;
	char *socket_dir, *images_dir, *proc_root, *node, *kubelet_url, *checkpoints, *key_dir;
};

static char *dup_or_null(const char *s, int *bad)
{
	char *d = s != NULL ? strdup(s) : NULL;
	*bad |= s != NULL && d == NULL;
	return d;
}

/* The node's signing keys, if it has any (keys->n 0 without): 0, or -errno with why. */
static int load_keys(const struct agent_ckimage *m, struct gcr_imagemac_keys *keys, struct gcr_err *err)
{
	memset(keys, 0, sizeof(*keys));
	return m->key_dir == NULL ? 0 : gcr_imagemac_load(m->key_dir, keys, err);
}

int agent_ckimage_new(const struct agent_ckimage_cfg *cfg, struct agent_ckimage **out, struct gcr_err *err)
{
	*out = NULL;
	struct agent_ckimage *m = calloc(1, sizeof(*m));
	int bad = m == NULL;
	if (m != NULL) {
		m->cfg = *cfg;
		m->socket_dir = dup_or_null(cfg->socket_dir, &bad);
		m->images_dir = dup_or_null(cfg->images_dir, &bad);
		m->proc_root = dup_or_null(cfg->proc_root ? cfg->proc_root : "/proc", &bad);
		m->node = dup_or_null(cfg->node ? cfg->node : "", &bad);
		m->kubelet_url = dup_or_null(cfg->kubelet_url && cfg->kubelet_url[0] ? cfg->kubelet_url : NULL, &bad);
		m->checkpoints = dup_or_null(cfg->checkpoints_dir && cfg->checkpoints_dir[0] ? cfg->checkpoints_dir
											    : AGENT_CKIMAGE_CHECKPOINTS_DIR,
					     &bad);
		m->key_dir = dup_or_null(cfg->key_dir && cfg->key_dir[0] ? cfg->key_dir : NULL, &bad);
	}
	if (bad || m->socket_dir == NULL || m->images_dir == NULL) {
		agent_ckimage_free(m);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	*out = m;
	return 0;
}

void agent_ckimage_free(struct agent_ckimage *m)
{
	if (m == NULL)
		return;
	free(m->socket_dir);
	free(m->images_dir);
	free(m->proc_root);
	free(m->node);
	free(m->kubelet_url);
	free(m->checkpoints);
	free(m->key_dir);
	free(m);
}

void agent_ckimage_out_clear(struct agent_ckimage_out *out)
{
	json_decref(out->extra);
	out->extra = NULL;
}

/* ---- the record, the test hook, the outcome ---- */

/* Records that step is about to run, then the test hook's pause there. A record that cannot be
 * written is logged and the step runs (a restart then finds the record a step behind, which
 * recovery handles: every step's recovery also covers the one before). */
static void step(struct agent_ckimage *m, struct agent_record *r, enum agent_record_step st)
{
	struct gcr_err err;
	r->img.step = st;
	if (agent_record_put(m->cfg.rec, r, &err) < 0)
		GCR_LOG(GCR_LOG_ERROR, "image", "Checkpoint %s/%s: step %s not recorded: %s", r->ns, r->name,
			agent_record_step_name(st), err.msg);
	if (m->cfg.pause != NULL) {
		char where[32];
		snprintf(where, sizeof(where), "image-%s", agent_record_step_name(st));
		m->cfg.pause(m->cfg.pause_data, where);
	}
}

static void say(struct agent_ckimage_out *out, int final, int ok, const char *reason, const char *state,
		const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static void say(struct agent_ckimage_out *out, int final, int ok, const char *reason, const char *state,
		const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(out->msg, sizeof(out->msg), fmt, ap);
	va_end(ap);
	out->final = final;
	out->ok = ok;
	snprintf(out->reason, sizeof(out->reason), "%s", reason);
	out->state = state;
}

/* ---- the process ---- */

enum pstate { P_GONE, P_RUNNING, P_SUSPENDED, P_DATA_ONLY, P_OTHER };

/* Whether r's process is still the one recorded: its pid with the recorded start time, in the
 * recorded pod (its cgroup). */
static int proc_here(struct agent_ckimage *m, const struct agent_record *r)
{
	char path[600];
	struct agent_cgroup_pod cp;
	struct gcr_err err;
	if (r->n < 1 || r->p[0].start == 0 || agent_registry_start_time(m->cfg.reg, r->p[0].pid) != r->p[0].start)
		return 0;
	snprintf(path, sizeof(path), "%s/%d/cgroup", m->proc_root, (int)r->p[0].pid);
	return agent_cgroup_read_file(path, &cp, &err) == 0 && strcmp(cp.pod_uid, r->pod_uid) == 0;
}

/* The process's state (its shim and the driver, in full mode), and where its GPU data is. A
 * suspend in data-only mode (the driver still holding its context) is P_DATA_ONLY. */
static enum pstate look(struct agent_ckimage *m, const struct agent_record *r, int op_ms,
			enum gcr_shimreply_data *data)
{
	*data = GCR_SHIMREPLY_DATA_HOST;
	if (!proc_here(m, r))
		return P_GONE;
	struct gcr_cr_opts o = { .socket_dir = m->socket_dir, .mode = GCR_CR_FULL,
				 .call_ms = op_ms > 0 && op_ms < 10000 ? op_ms : 10000 };
	struct gcr_cr_proc_state ps;
	struct gcr_err err;
	(void)gcr_cr_state(r->p[0].pid, &o, &ps, &err);
	*data = ps.data;
	if (ps.state == GCR_CR_ST_RUNNING)
		return P_RUNNING;
	if (ps.state == GCR_CR_ST_SUSPENDED)
		return P_SUSPENDED;
	if (gcr_cr_state_combine(&ps, GCR_CR_DATA_ONLY) == GCR_CR_ST_SUSPENDED)
		return P_DATA_ONLY;
	return ps.state == GCR_CR_ST_GONE ? P_GONE : P_OTHER;
}

static const char *pstate_name(enum pstate s)
{
	static const char *const n[] = { "gone", "running", "suspended", "suspended (data only)", "neither" };
	return n[s];
}

/* The process back to where this Image found it: attached to its data in dir's files when they
 * hold it only (dir: as the process sees it), then resumed, or (suspended before the Image) left
 * suspended with its driver's side as it was. 0 when it is back (or gone: -ESRCH). */
static int bring_back(struct agent_ckimage *m, const struct agent_record *r, const char *dir, int gate_ms, int op_ms,
		      struct gcr_err *err)
{
	enum gcr_shimreply_data data;
	enum pstate s = look(m, r, op_ms, &data);
	pid_t pid = r->p[0].pid;
	struct gcr_cr_opts o = { .socket_dir = m->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = gate_ms,
				 .call_ms = op_ms };
	if (s == P_GONE)
		return gcr_err_set(err, -ESRCH, "process %d is gone", (int)pid);
	if (s == P_RUNNING)
		return 0;
	if (s == P_OTHER)
		return gcr_err_set(err, -EAGAIN, "process %d is neither running nor suspended (an operation in "
				   "flight, or held by a dump): tried again", (int)pid);
	int rc = 0;
	if (data == GCR_SHIMREPLY_DATA_WRITTEN) {
		if (dir == NULL || dir[0] == '\0')
			return gcr_err_set(err, -ENOENT, "process %d holds its GPU data in image files this Image "
					   "did not record", (int)pid);
		if ((rc = gcr_imgcr_attach(pid, dir, &o, err)) < 0)
			return gcr_err_wrap(err, "image-read of %s", dir);
	}
	if (r->img.from_suspended)
		return r->img.converted && s == P_SUSPENDED ? gcr_cr_control(pid, &o, 0, err) : 0;
	struct gcr_cr_result cr;
	rc = gcr_cr_resume(pid, &o, &cr, err);
	gcr_cr_result_clear(&cr);
	return rc;
}

/* ---- the pieces an Image leaves ---- */

/* Removes the directory at path (the agent's own directories; its last component may be in a
 * directory the pod writes, so it is removed through a descriptor of its parent, no link
 * followed). */
static void remove_path(const char *path)
{
	char parent[PATH_MAX];
	if (path[0] != '/' || snprintf(parent, sizeof(parent), "%s", path) >= (int)sizeof(parent))
		return;
	char *slash = strrchr(parent, '/');
	*slash = '\0';
	int fd = open(parent[0] ? parent : "/", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		agent_images_remove_at(fd, slash + 1);
		close(fd);
	}
}

/* Whether dir is a committed image: a directory at its final name with a manifest (the commit is
 * the rename of a whole one). */
static int whole(const char *dir)
{
	char mf[PATH_MAX + 32];
	struct stat st;
	snprintf(mf, sizeof(mf), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	return dir[0] == '/' && lstat(dir, &st) == 0 && S_ISDIR(st.st_mode) && lstat(mf, &st) == 0 &&
	       S_ISREG(st.st_mode);
}

/* The pod's side of a kubelet Image (its copy of the GPU data in the pod's socket directory),
 * unless the process keeps its data there (kept). */
static void drop_work(struct agent_ckimage *m, struct agent_record *r)
{
	(void)m;
	if (r->img.kubelet && r->img.work[0] != '\0' && !r->img.kept && r->n > 0)
		agent_images_pod_remove(r->p[0].pid, r->img.work);
}

/* "checkpoint-<pod>_<ns>-<container>-<time>.tar" of the kubelet: whether name is the archive of
 * r's container asked for at r->img.dump_at (its time within the window). */
static int archive_of(const struct agent_record *r, const char *name)
{
	char pfx[AGENT_CROBJ_NAME_LEN + 2 * AGENT_CROBJ_NS_LEN + 32];
	int n = snprintf(pfx, sizeof(pfx), "checkpoint-%s_%s-%s-", r->pod, r->ns, r->img.container);
	size_t len = strlen(name);
	if (n <= 0 || (size_t)n >= sizeof(pfx) || strncmp(name, pfx, (size_t)n) != 0 || len < (size_t)n + 4 ||
	    strcmp(name + len - 4, ".tar") != 0)
		return 0;
	struct tm tm = { 0 };
	const char *end = strptime(name + n, "%Y-%m-%dT%H:%M:%S", &tm);
	if (end == NULL)
		return 0;
	long long t = (long long)timegm(&tm); /* "Z"; an offset, as some kubelets write, is read below */
	int sign = end[0] == '+' ? -1 : end[0] == '-' ? 1 : 0, hh = 0, mm = 0;
	if (sign != 0 && sscanf(end + 1, "%2d:%2d", &hh, &mm) == 2)
		t += sign * (hh * 3600 + mm * 60);
	return t >= r->img.dump_at - ARCHIVE_BEFORE_S && t <= r->img.dump_at + ARCHIVE_AFTER_S;
}

/* Another Image's dump the sweep must not take an archive from: one in flight (its window), or
 * one whose record names its archive. */
struct other_dump {
	char uid[AGENT_CROBJ_UID_LEN], ns[AGENT_CROBJ_NS_LEN], pod[AGENT_CROBJ_NAME_LEN];
	char container[AGENT_CROBJ_NS_LEN], archive[AGENT_RECORD_PATH_MAX];
	long long dump_at;
	int inflight;
};

struct others {
	struct other_dump *v;
	size_t n;
};

/* Whether name (full: its path) is another Image's: named in its record, or in the window of its
 * dump while it is in flight. */
static int others_own(const struct others *o, const struct agent_record *r, const char *name, const char *full)
{
	for (size_t i = 0; o != NULL && i < o->n; i++) {
		const struct other_dump *d = &o->v[i];
		if (strcmp(d->uid, r->uid) == 0)
			continue;
		if (d->archive[0] != '\0' && strcmp(d->archive, full) == 0)
			return 1;
		struct agent_record x = { .n = 0 };
		snprintf(x.ns, sizeof(x.ns), "%s", d->ns);
		snprintf(x.pod, sizeof(x.pod), "%s", d->pod);
		snprintf(x.img.container, sizeof(x.img.container), "%s", d->container);
		x.img.dump_at = d->dump_at;
		if (d->inflight && d->dump_at > 0 && archive_of(&x, name))
			return 1;
	}
	return 0;
}

/* Removes the kubelet's archives of r's dump (a restart cut it short: its path never reached the
 * record) but the one named in keep and those of others (NULL: none known); how many. */
static int drop_archives(struct agent_ckimage *m, const struct agent_record *r, const char *keep,
			 const struct others *others)
{
	if (!r->img.kubelet || r->img.dump_at <= 0 || r->img.container[0] == '\0')
		return 0;
	int fd = open(m->checkpoints, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int dfd = fd < 0 ? -1 : dup(fd);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	struct dirent *de;
	int n = 0, seen = 0;
	while (d != NULL && (de = readdir(d)) != NULL && seen++ < MAX_ARCHIVES) {
		char full[PATH_MAX];
		snprintf(full, sizeof(full), "%s/%s", m->checkpoints, de->d_name);
		if (!archive_of(r, de->d_name) || (keep != NULL && strcmp(full, keep) == 0) ||
		    others_own(others, r, de->d_name, full))
			continue;
		if (unlinkat(fd, de->d_name, 0) == 0) {
			GCR_LOG(GCR_LOG_INFO, "image", "Checkpoint %s/%s: the kubelet's archive %s of a dump cut short "
				"removed", r->ns, r->name, full);
			n++;
		}
	}
	if (d != NULL)
		closedir(d);
	else if (dfd >= 0)
		close(dfd);
	if (fd >= 0)
		close(fd);
	return n;
}

/* Everything the Image made besides the committed image and a kept copy of the data: the partial
 * image, the pod's side (kubelet), the kubelet's archive. */
static void cleanup(struct agent_ckimage *m, struct agent_record *r)
{
	if (r->img.partial[0] != '\0')
		remove_path(r->img.partial);
	drop_work(m, r);
	if (r->img.archive[0] != '\0')
		(void)unlink(r->img.archive); /* the container's memory: never left in the kubelet's directory */
	drop_archives(m, r, NULL, NULL);
}

int agent_ckimage_pending(const struct agent_record *r, long long now_s)
{
	return r->action == AGENT_REC_ACT_IMAGE &&
	       (r->img.kept || (r->img.kubelet && r->img.dump_at > 0 && now_s < r->img.dump_at + ARCHIVE_WATCH_S));
}

/* ---- the kubelet's route ---- */

/* POST /checkpoint/<ns>/<pod>/<container> on this node's kubelet (its checkpoint API, the
 * container runtime's CRI CheckpointContainer, which leaves the container running): archive
 * (len bytes) gets the archive's path on the node. */
static int kubelet_checkpoint(struct agent_ckimage *m, const struct agent_record *r, char *archive, size_t len,
			      struct gcr_err *err)
{
	char path[900];
	snprintf(path, sizeof(path), "/checkpoint/%s/%s/%s?timeout=%d", r->ns, r->pod, r->img.container,
		 AGENT_CKIMAGE_KUBELET_S);
	long st = 0;
	json_t *out = NULL;
	int rc = agent_kube_request_at(m->cfg.kube, m->kubelet_url, "POST", path, AGENT_CKIMAGE_KUBELET_S + 30, &st,
				       &out, err);
	if (rc == 0 && st != 200) /* >= 400: the request said why */
		rc = st >= 400 ? -EIO : gcr_err_set(err, -EIO, "HTTP %ld", st);
	const char *a = json_string_value(json_array_get(json_object_get(out, "items"), 0));
	if (rc == 0 && (a == NULL || a[0] != '/' || strstr(a, "/../") != NULL || strlen(a) >= len))
		rc = gcr_err_set(err, -EPROTO, "the kubelet's answer names no checkpoint archive");
	if (rc == 0)
		snprintf(archive, len, "%s", a);
	json_decref(out);
	if (rc < 0)
		gcr_err_wrap(err, "the kubelet's checkpoint of %s/%s/%s", r->ns, r->pod, r->img.container);
	return rc;
}

/* The kubelet Image's end: the pod's copy of the GPU data and the kubelet's archive put together
 * in a partial image, sealed (gcr_imgcr_seal: manifest, commit) at img.path; then the archive and
 * (unless kept) the pod's copy go. The process is back already. */
static void seal_kubelet(struct agent_ckimage *m, struct agent_record *r, double t0, double t_dump, double t_back,
			 struct agent_ckimage_out *out)
{
	struct gcr_err err = { 0 };
	char partial[AGENT_RECORD_PATH_MAX], dst[AGENT_RECORD_PATH_MAX + 64];
	const char *state = r->img.from_suspended ? "Checkpointed" : "Running";
	const char *left = r->img.from_suspended ? "the process stays suspended" : "the process runs on";
	long long gpu_bytes = 0;
	int rc = gcr_image_partial_name(r->img.path, getpid(), partial, sizeof(partial), &err);
	if (r->img.partial[0] != '\0' && strcmp(r->img.partial, partial) != 0)
		remove_path(r->img.partial); /* an earlier agent's */
	if (rc == 0)
		snprintf(r->img.partial, sizeof(r->img.partial), "%s", partial);
	step(m, r, AGENT_REC_STEP_SEAL);
	double t1 = gcr_time_mono_ms();
	if (rc == 0) {
		remove_path(partial); /* this agent's own name, left by a run cut short */
		if (mkdir(partial, 0700) < 0)
			rc = gcr_err_set(&err, -errno, "cannot create %s: %s", partial, strerror(errno));
	}
	int idfd = rc == 0 ? open(partial, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
	int pfd = rc == 0 ? agent_images_pod_open(r->p[0].pid, r->img.work, &err) : -1;
	if (rc == 0 && idfd < 0)
		rc = gcr_err_set(&err, -errno, "cannot open %s: %s", partial, strerror(errno));
	if (rc == 0 && pfd < 0)
		rc = pfd;
	char why[160] = "";
	unsigned long long bound = 0;
	struct gcr_image_table t = { 0 }; /* the table as copied: the manifest's */
	if (rc == 0) {
		bound = m->cfg.copy_bound != NULL
				? m->cfg.copy_bound(m->cfg.copy_bound_data, r, r->img.from_suspended, why, sizeof(why), &err)
				: ~0ull;
		if (bound == 0)
			rc = err.code < 0 ? err.code : -EIO;
	}
	if (rc == 0) { /* only the files its table names, within what the pod may make us write */
		long long n = agent_images_copy_gpu(pfd, idfd, bound, &t, &err);
		rc = n < 0 ? (int)n : 0;
		if (n == -EFBIG)
			GCR_LOG(GCR_LOG_INFO, "ckimage", "Checkpoint %s/%s: pid %d's files bounded by %s", r->ns, r->name,
				(int)r->p[0].pid, why);
	}
	if (idfd >= 0)
		close(idfd);
	if (pfd >= 0)
		close(pfd);
	snprintf(dst, sizeof(dst), "%s/%s", partial, GCR_IMAGE_CRIU_DIR);
	if (rc == 0 && mkdir(dst, 0700) < 0)
		rc = gcr_err_set(&err, -errno, "cannot create %s: %s", dst, strerror(errno));
	snprintf(dst, sizeof(dst), "%s/%s", partial, GCR_IMAGE_RUNTIME_ARCHIVE);
	if (rc == 0) {
		long long an = agent_images_copy_file(r->img.archive, dst, &err);
		rc = an < 0 ? (int)an : 0;
	}
	struct gcr_imgcr_seal seal = { .mode = GCR_IMAGE_MODE_RUNTIME, .pid = r->p[0].pid, .node = m->node,
				       .container = r->img.container, .table = &t };
	struct gcr_imagemac_keys keys;
	if (rc == 0 && (rc = load_keys(m, &keys, &err)) == 0) {
		seal.sign = keys.n > 0 ? &keys.key[0] : NULL;
		rc = gcr_imgcr_seal(partial, r->img.path, &seal, &gpu_bytes, &err);
		gcr_imagemac_clear(&keys);
	}
	gcr_image_table_clear(&t); /* not moved into a manifest when a step failed */
	double t_seal = gcr_time_mono_ms() - t1;
	if (rc < 0) {
		cleanup(m, r);
		say(out, 1, 0, "ImageFailed", state, "image of pid %d to %s failed: %s; %s, no image written",
		    (int)r->p[0].pid, r->img.path, err.msg, left);
		return;
	}
	r->img.partial[0] = '\0';
	cleanup(m, r);
	long long image = gcr_imgcr_bytes(r->img.path);
	out->bytes = image;
	out->ms_total = gcr_time_mono_ms() - t0;
	say(out, 1, 1, "ImageWritten", state,
	    "image of pid %d written to %s: %lld bytes (%lld GPU bytes; CPU side by the kubelet, restorable into a new "
	    "pod); %s%s",
	    (int)r->p[0].pid, r->img.path, image, gpu_bytes, left,
	    r->img.kept ? " (it was suspended: its GPU data is now in its pod's image directory, which its next "
			  "resume reads)"
			: "");
	out->extra = json_pack("{s:s, s:{s:s, s:I, s:I, s:s, s:s}, s:{s:I, s:I, s:I, s:I}}", "mode", "Full", "image",
			       "path", r->img.path, "bytes", (json_int_t)image, "gpuBytes", (json_int_t)gpu_bytes,
			       "cpuCheckpoint", "Kubelet", "container", r->img.container, "durations", "dump",
			       (json_int_t)t_dump, "resume", (json_int_t)t_back, "manifest", (json_int_t)t_seal, "total",
			       (json_int_t)out->ms_total);
}

/* The GPU data of a suspended process to the pod's files: its driver's side taken off the GPU
 * first when it was suspended data-only (a CRIU dump cannot take a resident context), then
 * image-write (its host memory then freed, its data in those files only). */
static int write_suspended(struct agent_ckimage *m, struct agent_record *r, const struct gcr_cr_opts *cro,
			   struct gcr_err *err)
{
	long long bytes = 0;
	int rc = r->img.converted ? gcr_cr_control(r->p[0].pid, cro, 1, err) : 0;
	if (rc < 0)
		return gcr_err_wrap(err, "the driver's checkpoint of a process suspended data-only");
	rc = gcr_imgcr_write(r->p[0].pid, r->img.work, cro, &bytes, err);
	if (rc < 0) {
		struct gcr_err e2;
		if (r->img.converted && gcr_cr_control(r->p[0].pid, cro, 0, &e2) < 0)
			gcr_err_wrap(err, "and putting its context back failed too (%s)", e2.msg);
		return gcr_err_wrap(err, "image-write to %s", r->img.work);
	}
	return 0;
}

static void run_kubelet(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
			struct agent_ckimage_out *out)
{
	pid_t pid = r->p[0].pid;
	struct gcr_err err = { 0 };
	struct gcr_cr_opts cro = { .socket_dir = m->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = gate_ms,
				   .call_ms = op_ms };
	double t0 = gcr_time_mono_ms();
	struct stat st;
	enum gcr_shimreply_data data;
	enum pstate s = look(m, r, op_ms, &data);
	if (s == P_GONE || s == P_OTHER) {
		say(out, 1, 0, "ImageFailed", "Running", "process %d is %s; nothing was done", (int)pid,
		    s == P_GONE ? "gone" : "neither running nor suspended (an operation in flight?)");
		return;
	}
	r->img.from_suspended = s != P_RUNNING;
	r->img.converted = s == P_DATA_ONLY;
	const char *state = r->img.from_suspended ? "Checkpointed" : "Running";
	if (r->img.from_suspended && data != GCR_SHIMREPLY_DATA_HOST) {
		say(out, 1, 0, "ImageFailed", state, "process %d is suspended with its GPU data in image files already "
		    "(another image of it was cut short?); nothing was done", (int)pid);
		return;
	}
	if (lstat(r->img.path, &st) == 0) {
		say(out, 1, 0, "ImageFailed", state, "%s exists: an image is never overwritten (process untouched)",
		    r->img.path);
		return;
	}
	if (agent_images_mkparents(r->img.path, &err) < 0) {
		say(out, 1, 0, "ImageFailed", state, "%s; nothing was done", err.msg);
		return;
	}
	if (agent_images_pod_path(pid, r->uid, r->img.work, sizeof(r->img.work), &err) < 0) {
		say(out, 1, 0, "ImageFailed", state, "%s; nothing was done", err.msg);
		return;
	}
	step(m, r, AGENT_REC_STEP_SUSPEND);
	int pfd = -1;
	char inside[PATH_MAX];
	int rc = agent_images_pod_dir(pid, r->uid, &pfd, inside, sizeof(inside), &err);
	if (pfd >= 0)
		close(pfd);
	if (rc == 0 && r->img.from_suspended) {
		rc = write_suspended(m, r, &cro, &err);
	} else if (rc == 0) {
		struct gcr_cr_result cr;
		cro.image_dir = r->img.work;
		rc = gcr_cr_suspend(pid, &cro, &cr, &err);
		cro.image_dir = NULL;
		gcr_cr_result_clear(&cr);
		if (rc < 0)
			gcr_err_wrap(&err, "suspend to %s", r->img.work);
	}
	if (rc < 0) {
		drop_work(m, r);
		say(out, 1, 0, "ImageFailed", state, "image of pid %d to %s failed: %s; %s", (int)pid, r->img.path,
		    err.msg, r->img.from_suspended ? "the process stays suspended as it was" : "the process runs on");
		return;
	}
	r->img.dump_at = (long long)time(NULL);
	step(m, r, AGENT_REC_STEP_DUMP);
	double t1 = gcr_time_mono_ms();
	rc = kubelet_checkpoint(m, r, r->img.archive, sizeof(r->img.archive), &err);
	double t_dump = gcr_time_mono_ms() - t1;
	step(m, r, AGENT_REC_STEP_BACK);
	t1 = gcr_time_mono_ms();
	struct gcr_err berr;
	int back = bring_back(m, r, r->img.work, gate_ms, op_ms, &berr);
	double t_back = gcr_time_mono_ms() - t1;
	if (back < 0 && back != -ESRCH) {
		/* Its data in the pod's files only: they stay, and the next try brings it back. */
		say(out, 0, 0, "InProgress", "Checkpointed", "%s; bringing process %d back from %s failed (%s): tried "
		    "again", rc < 0 ? err.msg : "image taken", (int)pid, r->img.work, berr.msg);
		return;
	}
	if (r->img.from_suspended && back == 0)
		r->img.kept = 1; /* its data in the pod's files now: its next resume reads them */
	if (rc < 0 || back < 0) {
		cleanup(m, r);
		say(out, 1, 0, "ImageFailed", state, "image of pid %d to %s failed: %s; %s, no image written", (int)pid,
		    r->img.path, rc < 0 ? err.msg : berr.msg,
		    back < 0 ? "the process is gone"
		    : r->img.from_suspended ? "the process stays suspended as it was"
					    : "process resumed");
		return;
	}
	seal_kubelet(m, r, t0, t_dump, t_back, out);
}

/* ---- the agent's own CRIU ---- */

/* Where the image of pid, a process in a pod, is written first: its allocation's image directory
 * (the device plugin's GCR_IMAGE_DIR, mounted at the same path in the container, so the shim and
 * CRIU mean the same directory), checked to be <images_dir>/.alloc/<id> and, opened inside the
 * process's own root, the very directory the agent has there. out gets <that dir>/<uid>. */
static int pod_image_dir(struct agent_ckimage *m, pid_t pid, const char *uid, char *out, size_t len,
			 struct gcr_err *err)
{
	char v[PATH_MAX];
	int rc = gcr_procns_env(pid, "GCR_IMAGE_DIR", v, sizeof(v), err);
	if (rc < 0)
		return gcr_err_set(err, rc, "the pod has no image directory (GCR_IMAGE_DIR: the chart's images.pods is "
				   "off, or the pod started before it was on)");
	if (!agent_images_is_alloc_dir(m->images_dir, v))
		return gcr_err_set(err, -EPERM, "GCR_IMAGE_DIR %.200s is not an allocation's image directory under %s", v,
				   m->images_dir);
	struct stat ours, theirs;
	int fd = gcr_procns_open_dir(pid, v, err);
	if (fd < 0)
		return fd;
	rc = fstat(fd, &theirs) < 0 || lstat(v, &ours) < 0 ? -errno : 0;
	close(fd);
	if (rc < 0)
		return gcr_err_set(err, rc, "cannot read %s: %s", v, strerror(-rc));
	if (!S_ISDIR(ours.st_mode) || ours.st_dev != theirs.st_dev || ours.st_ino != theirs.st_ino)
		return gcr_err_set(err, -EPERM, "%s in the pod is not the agent's %s", v, v);
	if (snprintf(out, len, "%s/%s", v, uid) >= (int)len)
		return gcr_err_set(err, -ENAMETOOLONG, "image path too long");
	return 0;
}

struct stepper {
	struct agent_ckimage *m;
	struct agent_record *r;
};

/* gcr_imgcr's steps, recorded with the partial image they write. */
static void on_step(void *data, enum gcr_imgcr_step st, const char *partial)
{
	static const enum agent_record_step map[] = { [GCR_IMGCR_STEP_SUSPEND] = AGENT_REC_STEP_SUSPEND,
						      [GCR_IMGCR_STEP_DUMP] = AGENT_REC_STEP_DUMP,
						      [GCR_IMGCR_STEP_SEAL] = AGENT_REC_STEP_SEAL,
						      [GCR_IMGCR_STEP_BACK] = AGENT_REC_STEP_BACK };
	struct stepper *sp = data;
	snprintf(sp->r->img.partial, sizeof(sp->r->img.partial), "%s", partial);
	step(sp->m, sp->r, map[st]);
}

/* The image's status fields from its manifest and files (an Image finished from its record). */
static json_t *image_extra(const struct agent_record *r, long long *bytes)
{
	char mf[PATH_MAX + 32], *buf = NULL;
	size_t len = 0;
	struct gcr_image_manifest man;
	struct gcr_err err;
	long long gpu = 0;
	snprintf(mf, sizeof(mf), "%s/%s", r->img.path, GCR_IMAGE_MANIFEST);
	if (gcr_image_read_file(mf, GCR_IMAGE_MAX_JSON, &buf, &len, &err) == 0 &&
	    gcr_image_manifest_parse(buf, len, &man, &err) == 0) {
		for (size_t i = 0; i < man.table.n; i++)
			gpu += (long long)man.table.a[i].size;
		gcr_image_manifest_clear(&man);
	}
	free(buf);
	*bytes = gcr_imgcr_bytes(r->img.path);
	json_t *img = json_pack("{s:s, s:I, s:I}", "path", r->img.path, "bytes", (json_int_t)*bytes, "gpuBytes",
				(json_int_t)gpu);
	if (img != NULL && r->img.kubelet)
		json_object_set_new(img, "cpuCheckpoint", json_string("Kubelet"));
	if (img != NULL && r->img.container[0] != '\0')
		json_object_set_new(img, "container", json_string(r->img.container));
	return json_pack("{s:s, s:o}", "mode", "Full", "image", img);
}

static void run_agent(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
		      struct agent_ckimage_out *out)
{
	pid_t pid = r->p[0].pid;
	struct gcr_err err = { 0 }, nserr;
	struct stat st;
	enum gcr_shimreply_data data;
	enum pstate s = look(m, r, op_ms, &data);
	if (s != P_RUNNING) {
		say(out, 1, 0, s == P_SUSPENDED || s == P_DATA_ONLY ? "AlreadySuspended" : "ImageFailed",
		    s == P_SUSPENDED || s == P_DATA_ONLY ? "Checkpointed" : "Running",
		    "process %d is %s: the agent's CRIU images running processes only (spec.cpuCheckpoint Kubelet "
		    "images a suspended one); nothing was done", (int)pid, pstate_name(s));
		return;
	}
	if (lstat(r->img.path, &st) == 0) {
		say(out, 1, 0, "ImageFailed", "Running", "%s exists: an image is never overwritten (process untouched)",
		    r->img.path);
		return;
	}
	if (agent_images_mkparents(r->img.path, &err) < 0) {
		say(out, 1, 0, "ImageFailed", "Running", "%s; nothing was done", err.msg);
		return;
	}
	/* A process in a container (not in our PID and mount namespaces: a pod's) is dumped with its
	 * container's whole tree (gcr_ctrdump), written in its allocation's image directory first; one
	 * on the host alone, straight at the image's path. */
	int in_pod = gcr_procns_same(pid, &nserr) == 0;
	r->img.work[0] = '\0';
	if (in_pod && pod_image_dir(m, pid, r->uid, r->img.work, sizeof(r->img.work), &err) < 0) {
		say(out, 1, 0, "ImageFailed", "Running", "image of pid %d to %s failed: %s (process untouched)", (int)pid,
		    r->img.path, err.msg);
		return;
	}
	struct gcr_cr_opts cro = { .socket_dir = m->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = gate_ms,
				   .call_ms = op_ms };
	struct stepper sp = { .m = m, .r = r };
	struct gcr_imgcr_opts io = { .cr = &cro, .leave_running = 1, .whole_container = in_pod, .node = m->node,
				     .container = r->img.container, .step = on_step, .step_data = &sp };
	struct gcr_imgcr_result ir = { 0 };
	const char *dest = in_pod ? r->img.work : r->img.path;
	struct gcr_imagemac_keys keys;
	int rc = load_keys(m, &keys, &err);
	if (rc < 0) {
		say(out, 1, 0, "ImageFailed", "Running", "image of pid %d to %s failed: %s (process untouched)", (int)pid,
		    r->img.path, err.msg);
		return;
	}
	io.sign = keys.n > 0 ? &keys.key[0] : NULL;
	rc = gcr_imgcr_checkpoint(pid, dest, &io, &ir, &err);
	gcr_imagemac_clear(&keys);
	if (rc == 0 && in_pod) {
		step(m, r, AGENT_REC_STEP_MOVE);
		if ((rc = agent_images_move(r->img.work, r->img.path, &err)) < 0)
			gcr_err_wrap(&err, "the image is whole at %s; the process runs on", r->img.work);
	}
	if (rc < 0) {
		enum pstate now = look(m, r, op_ms, &data);
		if (now != P_RUNNING && now != P_GONE && data == GCR_SHIMREPLY_DATA_WRITTEN) {
			/* gcr_imgcr could not bring it back: its data is in the partial image's files, which
			 * stay; the next try reads them. */
			say(out, 0, 0, "InProgress", "Checkpointed", "image of pid %d failed: %s; bringing it back is "
			    "tried again", (int)pid, err.msg);
			return;
		}
		if (!whole(dest) && r->img.partial[0] != '\0')
			remove_path(r->img.partial);
		say(out, 1, 0, "ImageFailed", now == P_RUNNING ? "Running" : "Checkpointed",
		    "image of pid %d to %s failed: %s", (int)pid, r->img.path, err.msg);
		return;
	}
	r->img.partial[0] = '\0';
	out->bytes = ir.image;
	out->ms_total = ir.ms_total;
	say(out, 1, 1, "ImageWritten", "Running",
	    "image of pid %d written to %s: %lld bytes (%lld GPU bytes, %lld written); the process runs on", (int)pid,
	    r->img.path, ir.image, ir.bytes, ir.written);
	out->extra = json_pack(
		"{s:s, s:{s:s, s:I, s:I, s:I}, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I, s:I, s:I}}", "mode", "Full", "image",
		"path", r->img.path, "bytes", (json_int_t)ir.image, "gpuBytes", (json_int_t)ir.bytes, "writtenBytes",
		(json_int_t)ir.written, "bytes", "vmm", (json_int_t)ir.bytes, "total", (json_int_t)ir.bytes, "durations",
		"suspend", (json_int_t)ir.ms_suspend, "write", (json_int_t)ir.ms_write, "dump", (json_int_t)ir.ms_dump,
		"manifest", (json_int_t)ir.ms_manifest, "resume", (json_int_t)ir.ms_resume, "total",
		(json_int_t)ir.ms_total);
	if (r->img.container[0] != '\0')
		json_object_set_new(json_object_get(out->extra, "image"), "container", json_string(r->img.container));
}

/* ---- an Image a restart cut short ---- */

static void run_fresh(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
		      struct agent_ckimage_out *out)
{
	if (r->img.kubelet && m->kubelet_url == NULL) {
		say(out, 1, 0, "ImageFailed", "Running", "spec.cpuCheckpoint Kubelet: this agent has no kubelet URL "
		    "(the chart's images.kubelet.enabled is off); nothing was done");
		return;
	}
	if (r->img.kubelet)
		run_kubelet(m, r, gate_ms, op_ms, out);
	else
		run_agent(m, r, gate_ms, op_ms, out);
}

/* Brought back and clean, cut short before anything of the CPU side was taken: run again (once);
 * else Failed Interrupted. */
static void again(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms, const char *when,
		  struct agent_ckimage_out *out)
{
	if (r->img.attempt < MAX_ATTEMPTS) {
		GCR_LOG(GCR_LOG_INFO, "image", "Checkpoint %s/%s: cut short %s; process %d back as it was, leftovers "
			"removed; running it again", r->ns, r->name, when, (int)r->p[0].pid);
		r->img.attempt++;
		r->img.partial[0] = r->img.archive[0] = '\0';
		r->img.dump_at = 0;
		step(m, r, AGENT_REC_STEP_START);
		run_fresh(m, r, gate_ms, op_ms, out);
		return;
	}
	say(out, 1, 0, "Interrupted", r->img.from_suspended ? "Checkpointed" : "Running",
	    "the agent restarted %s (attempt %d); the process was brought back (%s), its leftovers removed; no image "
	    "written", when, r->img.attempt, r->img.from_suspended ? "suspended, as it was" : "running");
}

static void recover(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
		    struct agent_ckimage_out *out)
{
	enum agent_record_step at = r->img.step;
	struct gcr_err err = { 0 };
	char when[96];
	snprintf(when, sizeof(when), "during the Image's step %s", agent_record_step_name(at));
	GCR_LOG(GCR_LOG_WARN, "image", "Checkpoint %s/%s: its Image was cut short at step %s (attempt %d, %s "
		"route): finishing it from its record", r->ns, r->name, agent_record_step_name(at), r->img.attempt,
		r->img.kubelet ? "kubelet" : "CRIU");
	/* Whole already: the process back, the rest cleaned, done. */
	if (whole(r->img.path)) {
		int back = bring_back(m, r, r->img.kubelet ? r->img.work : r->img.path, gate_ms, op_ms, &err);
		if (back < 0 && back != -ESRCH) {
			say(out, 0, 0, "InProgress", "Checkpointed", "image whole at %s; bringing process %d back failed "
			    "(%s): tried again", r->img.path, (int)r->p[0].pid, err.msg);
			return;
		}
		if (r->img.from_suspended && back == 0)
			r->img.kept = 1;
		cleanup(m, r);
		out->extra = image_extra(r, &out->bytes);
		say(out, 1, 1, "ImageWritten", r->img.from_suspended ? "Checkpointed" : "Running",
		    "image of pid %d written to %s: %lld bytes (finished after an agent restart); %s", (int)r->p[0].pid,
		    r->img.path, out->bytes, back < 0 ? "the process is gone" : r->img.from_suspended ?
		    "the process stays suspended" : "the process runs on");
		return;
	}
	/* The CRIU route, committed in the pod's directory: back, then moved. */
	if (!r->img.kubelet && r->img.work[0] != '\0' && whole(r->img.work)) {
		int back = bring_back(m, r, r->img.work, gate_ms, op_ms, &err);
		if (back < 0 && back != -ESRCH) {
			say(out, 0, 0, "InProgress", "Checkpointed", "image whole at %s; bringing process %d back failed "
			    "(%s): tried again", r->img.work, (int)r->p[0].pid, err.msg);
			return;
		}
		step(m, r, AGENT_REC_STEP_MOVE);
		if (agent_images_move(r->img.work, r->img.path, &err) < 0) {
			remove_path(r->img.work);
			say(out, 1, 0, "ImageFailed", "Running", "%s; the process runs on", err.msg);
			return;
		}
		recover(m, r, gate_ms, op_ms, out); /* whole at its path now */
		return;
	}
	/* Not whole: the process back from wherever its data is (the record names it). */
	const char *from = r->img.kubelet ? r->img.work : r->img.partial;
	int back = at == AGENT_REC_STEP_START ? 0 : bring_back(m, r, from, gate_ms, op_ms, &err);
	if (back < 0 && back != -ESRCH) {
		say(out, 0, 0, "InProgress", "Checkpointed", "the agent restarted %s; bringing process %d back from %s "
		    "failed (%s): tried again", when, (int)r->p[0].pid, from[0] ? from : "?", err.msg);
		return;
	}
	if (r->img.from_suspended && back == 0 && at != AGENT_REC_STEP_START) {
		enum gcr_shimreply_data data;
		(void)look(m, r, op_ms, &data);
		r->img.kept = data == GCR_SHIMREPLY_DATA_FILES; /* its data in the pod's files now */
	}
	if (back == -ESRCH) {
		cleanup(m, r);
		say(out, 1, 0, "Interrupted", "Running", "the agent restarted %s and process %d is gone since; its "
		    "leftovers removed; no image written", when, (int)r->p[0].pid);
		return;
	}
	/* The kubelet's archive is there (its path recorded) and the pod's copy too: finished. */
	if (r->img.kubelet && (at == AGENT_REC_STEP_BACK || at == AGENT_REC_STEP_SEAL) && r->img.archive[0] != '\0') {
		seal_kubelet(m, r, gcr_time_mono_ms(), 0, 0, out);
		return;
	}
	if (r->img.partial[0] != '\0')
		remove_path(r->img.partial);
	r->img.partial[0] = '\0';
	if (r->img.kubelet && r->img.archive[0] != '\0')
		(void)unlink(r->img.archive);
	r->img.archive[0] = '\0';
	drop_work(m, r);
	if (at <= AGENT_REC_STEP_SUSPEND && !r->img.kept) {
		again(m, r, gate_ms, op_ms, when, out);
		return;
	}
	drop_archives(m, r, NULL, NULL); /* and again by the sweep while that dump may still write one */
	say(out, 1, 0, "Interrupted", r->img.from_suspended ? "Checkpointed" : "Running",
	    "the agent restarted %s; the process was brought back (%s), the Image's leftovers removed%s; no image "
	    "written", when, r->img.from_suspended ? "it stays suspended, as it was" : "running",
	    r->img.kubelet && at == AGENT_REC_STEP_DUMP ? " (the kubelet's archive of that dump too, when it comes)"
							 : "");
}

void agent_ckimage_run(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
		       struct agent_ckimage_out *out)
{
	memset(out, 0, sizeof(*out));
	out->state = "Running";
	double t0 = gcr_time_mono_ms();
	if (r->n != 1) {
		say(out, 1, 0, "ImageFailed", "Running", "an image holds one process, the record has %d; nothing was done",
		    r->n);
		return;
	}
	if (r->img.attempt < 1)
		r->img.attempt = 1;
	if (r->img.step == AGENT_REC_STEP_START)
		run_fresh(m, r, gate_ms, op_ms, out);
	else
		recover(m, r, gate_ms, op_ms, out);
	if (out->ms_total <= 0)
		out->ms_total = gcr_time_mono_ms() - t0;
}

/* ---- the sweep ---- */

struct owned {
	json_t *paths; /* set of the paths Images in flight own */
};

/* A path an Image in flight names, or (the pod's own view of its socket directory differs from
 * the host's) an entry whose name one names: image-<uid> in a socket directory. */
static int owned_path(void *data, const char *path)
{
	struct owned *o = data;
	const char *base = strrchr(path, '/');
	return json_object_get(o->paths, path) != NULL || (base != NULL && json_object_get(o->paths, base + 1) != NULL);
}

static void own(struct owned *o, const char *path)
{
	if (path[0] == '\0')
		return;
	json_object_set_new(o->paths, path, json_true());
	const char *base = strrchr(path, '/');
	if (base != NULL && strncmp(base + 1, "image-", 6) == 0)
		json_object_set_new(o->paths, base + 1, json_true());
}

int agent_ckimage_sweep(struct agent_ckimage *m, const char *alloc_root)
{
	json_t *list = agent_record_list(m->cfg.rec);
	struct owned owned = { .paths = json_object() };
	long long now = (long long)time(NULL);
	int removed = 0;
	size_t i;
	json_t *e;
	/* Every kubelet Image's dump first: one record's leftover archive is never another's. */
	struct others others = { .v = calloc(json_array_size(list) + 1, sizeof(*others.v)) };
	json_array_foreach(list, i, e)
	{
		struct agent_record r = { .n = 0 };
		const char *uid = json_string_value(json_object_get(e, "uid"));
		if (others.v != NULL && uid != NULL && agent_record_get(m->cfg.rec, uid, &r) == 0 &&
		    r.action == AGENT_REC_ACT_IMAGE && r.img.kubelet) {
			struct other_dump *d = &others.v[others.n++];
			snprintf(d->uid, sizeof(d->uid), "%s", r.uid);
			snprintf(d->ns, sizeof(d->ns), "%s", r.ns);
			snprintf(d->pod, sizeof(d->pod), "%s", r.pod);
			snprintf(d->container, sizeof(d->container), "%s", r.img.container);
			snprintf(d->archive, sizeof(d->archive), "%s", r.img.archive);
			d->dump_at = r.img.dump_at;
			d->inflight = r.state == AGENT_REC_IMAGING;
		}
		agent_record_clear(&r);
	}
	json_array_foreach(list, i, e)
	{
		struct agent_record r = { .n = 0 };
		const char *uid = json_string_value(json_object_get(e, "uid"));
		if (uid == NULL || agent_record_get(m->cfg.rec, uid, &r) < 0 || r.action != AGENT_REC_ACT_IMAGE) {
			agent_record_clear(&r);
			continue;
		}
		if (r.state == AGENT_REC_IMAGING) {
			/* In flight, or waiting for its recovery: everything it names is its own. */
			own(&owned, r.img.work);
			own(&owned, r.img.partial);
			agent_record_clear(&r);
			continue;
		}
		int dirty = 0;
		if (r.img.kept) {
			/* The process's data lives in the pod's copy until its next resume. */
			enum gcr_shimreply_data data;
			enum pstate s = look(m, &r, 2000, &data);
			if (s == P_GONE || s == P_RUNNING) {
				if (s == P_RUNNING)
					agent_images_pod_remove(r.p[0].pid, r.img.work);
				GCR_LOG(GCR_LOG_INFO, "image", "Checkpoint %s/%s: process %d %s: the pod's copy of its GPU data "
					"%s", r.ns, r.name, (int)r.p[0].pid, s == P_GONE ? "is gone" : "runs again",
					s == P_GONE ? "went with its pod" : "removed");
				r.img.kept = 0;
				dirty = 1;
				removed += s == P_RUNNING;
			} else {
				own(&owned, r.img.work);
			}
		}
		if (agent_ckimage_pending(&r, now))
			removed += drop_archives(m, &r, NULL, others.v != NULL ? &others : NULL);
		struct gcr_err err;
		if (dirty && agent_record_put(m->cfg.rec, &r, &err) < 0)
			GCR_LOG(GCR_LOG_WARN, "image", "record of Checkpoint %s/%s: %s", r.ns, r.name, err.msg);
		agent_record_clear(&r);
	}
	json_decref(list);
	removed += agent_images_sweep_allocs(m->images_dir, alloc_root, owned_path, &owned, now);
	removed += agent_images_sweep_partials(m->images_dir, owned_path, &owned, now);
	json_decref(owned.paths);
	free(others.v);
	return removed;
}
