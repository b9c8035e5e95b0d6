/* gcr_imgcr: the image flow (see gcr_imgcr.h). The rule for failures: before the commit the
 * partial directory goes and the process comes back as it was; after a restore's CRIU step the
 * restored process is killed, so nothing is left half-running. */
#include "config.h"
#include "gcr_imgcr.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_client.h"
#include "gcr_criu.h"
#include "gcr_ctrdump.h"
#include "gcr_image.h"
#include "gcr_log.h"
#include "gcr_nvml.h"
#include "gcr_sock.h"
#include "gcr_time.h"

#define IMAGE_OP_MS 3600000 /* image-write / image-read: bounded by the disk, not by us */

/* A wait on the process: IMAGE_OP_MS, or the caller's operation's bound. */
static int op_ms(const struct gcr_cr_opts *cro)
{
	return cro->call_ms > 0 && cro->call_ms < IMAGE_OP_MS ? cro->call_ms : IMAGE_OP_MS;
}

void gcr_imgcr_expect_here(struct gcr_image_expect *e)
{
	memset(e, 0, sizeof(*e));
	struct gcr_err err;
	snprintf(e->gpu_vendor, sizeof(e->gpu_vendor), "nvidia");
	(void)gcr_nvml_gpu_ident(0, e->gpu_model, sizeof(e->gpu_model), e->driver, sizeof(e->driver), &err);
	snprintf(e->shim_version, sizeof(e->shim_version), "%s", PACKAGE_VERSION);
}

/* One request to pid's shim (a fresh connection: the socket may have been renamed). args is
 * stolen: gcr_client_call takes it, and it is dropped here when no call is made. */
static int shim_call_fds(pid_t pid, const struct gcr_cr_opts *cro, enum gcr_op op, json_t *args, const int *fds,
			 int nfds, json_t **res, char *path, size_t plen, struct gcr_err *err)
{
	struct gcr_client c;
	*res = NULL;
	int rc = gcr_client_open(&c, cro->socket_dir, pid, err);
	if (rc == 0) {
		if (path != NULL)
			snprintf(path, plen, "%s", c.path);
		rc = gcr_client_call_fds(&c, op, args, fds, nfds, op_ms(cro), res, err);
	} else {
		json_decref(args);
	}
	gcr_client_close(&c);
	return rc;
}

static int shim_call(pid_t pid, const struct gcr_cr_opts *cro, enum gcr_op op, json_t *args, json_t **res,
		     char *path, size_t plen, struct gcr_err *err)
{
	return shim_call_fds(pid, cro, op, args, NULL, 0, res, path, plen, err);
}

/* The same at a socket path (a restored process: its listening socket, restored by CRIU, does
 * not carry its pid in its credentials, so gcr_client_open would not take it). The peer
 * must say it is pid. args is stolen. */
static int shim_call_at(const char *path, pid_t pid, const struct gcr_cr_opts *cro, enum gcr_op op, json_t *args,
			json_t **res, struct gcr_err *err)
{
	struct gcr_client c = { .fd = -1, .pid = pid, .next_id = 1 };
	json_t *st = NULL;
	*res = NULL;
	snprintf(c.path, sizeof(c.path), "%s", path);
	c.fd = gcr_sock_connect(path, 5000, err);
	int rc = c.fd < 0 ? c.fd : gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 10000, &st, err);
	if (rc == 0 && json_integer_value(json_object_get(st, "pid")) != pid)
		rc = gcr_err_set(err, -ESRCH, "the shim at %s is not pid %d's", path, (int)pid);
	json_decref(st);
	if (rc == 0)
		rc = gcr_client_call(&c, op, args, op_ms(cro), res, err); /* steals args */
	else
		json_decref(args);
	gcr_client_close(&c);
	return rc;
}

static long long vm_rss(pid_t pid)
{
	char p[64], line[256];
	snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
	FILE *f = fopen(p, "r");
	long long kb = -1;
	while (f != NULL && fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "VmRSS: %lld kB", &kb) == 1)
			break;
	if (f != NULL)
		fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

/* Bytes of the image's files (the manifest, criu/, gpu/: flat directories), by stat alone:
 * hashing them again to learn their size cost a third of a checkpoint. */
static long long dir_bytes(const char *dir)
{
	static const char *const subs[] = { "", "/" GCR_IMAGE_CRIU_DIR, "/" GCR_IMAGE_GPU_DIR };
	long long n = 0;
	for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
		char p[PATH_MAX], f[PATH_MAX];
		snprintf(p, sizeof(p), "%s%s", dir, subs[i]);
		DIR *d = opendir(p);
		struct dirent *de;
		struct stat st;
		while (d != NULL && (de = readdir(d)) != NULL)
			if ((size_t)snprintf(f, sizeof(f), "%s/%s", p, de->d_name) < sizeof(f) && lstat(f, &st) == 0 &&
			    S_ISREG(st.st_mode))
				n += st.st_size;
		if (d != NULL)
			closedir(d);
	}
	return n;
}

static int criu_ready(int hip, struct gcr_criu_info *info, struct gcr_err *err)
{
	struct gcr_criu_cfg cfg = { .no_plugin = !hip, .timeout_ms = 600000 };
	int rc = gcr_criu_check(&cfg, info, err);
	if (rc < 0)
		gcr_err_wrap(err, "images need CRIU >= %d (scripts/install-criu.sh builds one; set GCR_CRIU)",
			     GCR_CRIU_MIN_MAJOR);
	return rc;
}

/* The files as the data's source (the write gave staging back), then resume, which reads them
 * to the GPU: the undo of a checkpoint whose dump failed, and the end of one that leaves the
 * process running. */
static int bring_back(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, struct gcr_err *err)
{
	int rc = gcr_imgcr_attach(pid, dir, cro, err);
	struct gcr_cr_result cr;
	if (rc == 0) {
		rc = gcr_cr_resume(pid, cro, &cr, err);
		gcr_cr_result_clear(&cr);
	}
	return rc;
}

long long gcr_imgcr_bytes(const char *dir)
{
	return dir_bytes(dir);
}

int gcr_imgcr_seal(const char *partial, const char *dir, const struct gcr_imgcr_seal *s, long long *gpu_bytes,
		   struct gcr_err *err)
{
	struct gcr_image_manifest m = { .format = GCR_IMAGE_FORMAT, .created = (long long)time(NULL), .pid = s->pid };
	struct gcr_image_expect here;
	char table[PATH_MAX + 32], *buf = NULL;
	size_t len = 0;
	int rc = 0;
	snprintf(m.mode, sizeof(m.mode), "%s", s->mode ? s->mode : GCR_IMAGE_MODE_GCR);
	snprintf(m.gcr_version, sizeof(m.gcr_version), "%s", PACKAGE_VERSION);
	snprintf(m.socket, sizeof(m.socket), "%s", s->socket ? s->socket : "");
	snprintf(m.node, sizeof(m.node), "%s", s->node ? s->node : "");
	snprintf(m.container, sizeof(m.container), "%s", s->container ? s->container : "");
	gcr_imgcr_expect_here(&here);
	m.env = here;
	if (s->vendor != NULL)
		snprintf(m.env.gpu_vendor, sizeof(m.env.gpu_vendor), "%s", s->vendor);
	if (s->shim_version != NULL)
		snprintf(m.env.shim_version, sizeof(m.env.shim_version), "%s", s->shim_version);
	if (!s->no_table && s->table != NULL) {
		m.table = *s->table;
		memset(s->table, 0, sizeof(*s->table));
	} else if (!s->no_table) {
		snprintf(table, sizeof(table), "%s/%s", partial, GCR_IMAGE_TABLE);
		rc = gcr_image_read_file(table, GCR_IMAGE_MAX_TABLE, &buf, &len, err);
		if (rc == 0) /* written by the process: within its bounds (gcr_jsonbudget) */
			rc = gcr_image_table_parse(buf, len, &m.table, err);
		free(buf);
	}
	if (gpu_bytes != NULL) {
		*gpu_bytes = 0;
		for (size_t i = 0; i < m.table.n; i++)
			*gpu_bytes += (long long)m.table.a[i].size;
	}
	if (rc == 0)
		rc = gcr_image_manifest_write_signed(partial, &m, s->sign, err);
	if (rc == 0)
		rc = gcr_image_commit(partial, dir, err);
	gcr_image_manifest_clear(&m);
	return rc;
}

int gcr_imgcr_attach(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, struct gcr_err *err)
{
	json_t *res = NULL;
	int rc = shim_call(pid, cro, GCR_OP_IMAGE_READ_ID, json_pack("{s:s}", "dir", dir), &res, NULL, 0, err);
	json_decref(res);
	return rc;
}

int gcr_imgcr_write(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, long long *bytes, struct gcr_err *err)
{
	json_t *res = NULL;
	int rc = shim_call(pid, cro, GCR_OP_IMAGE_WRITE_ID, json_pack("{s:s}", "dir", dir), &res, NULL, 0, err);
	*bytes = rc == 0 ? json_integer_value(json_object_get(res, "bytes")) : 0;
	json_decref(res);
	return rc;
}

static void step(const struct gcr_imgcr_opts *o, enum gcr_imgcr_step st, const char *partial)
{
	if (o->step != NULL)
		o->step(o->step_data, st, partial);
}

int gcr_imgcr_checkpoint(pid_t pid, const char *dir, const struct gcr_imgcr_opts *o, struct gcr_imgcr_result *r,
			 struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	r->pid = pid;
	double t_start = gcr_time_mono_ms(), t0;
	char partial[PATH_MAX], abs_partial[PATH_MAX], criu_dir[PATH_MAX + 8], socket[GCR_IMAGE_NAME_MAX] = "";
	char shim_version[32] = "none";
	struct stat st;
	struct gcr_criu_info info;
	struct gcr_cr_opts cro = *o->cr;
	int suspended = 0, written = 0, gone = 0, made = 0;
	json_t *status = NULL, *res = NULL;
	int rc = 0;
	if (stat(dir, &st) == 0 || errno != ENOENT)
		return gcr_err_set(err, -EEXIST, "%s exists: an image is never overwritten (process untouched)", dir);
	if (gcr_image_is_partial(dir))
		return gcr_err_set(err, -EINVAL, "%s: the name of a partial image; choose another", dir);
	rc = gcr_image_partial_name(dir, getpid(), partial, sizeof(partial), err);
	if (rc < 0)
		return rc;
	/* What the process is (CUDA or HIP, its shim's version) before anything is touched. */
	int hip = 0, drv = o->driver_only;
	if (!drv) {
		rc = shim_call(pid, &cro, GCR_OP_STATUS_ID, NULL, &status, socket, sizeof(socket), err);
		if (rc < 0)
			return gcr_err_wrap(err, "process untouched");
		hip = json_is_true(json_object_get(json_object_get(status, "backends"), "hip"));
		const char *ver = json_string_value(json_object_get(status, "version"));
		snprintf(shim_version, sizeof(shim_version), "%s", ver ? ver : "unknown");
		json_decref(status);
	}
	rc = criu_ready(hip, &info, err);
	if (rc < 0)
		return gcr_err_wrap(err, "process untouched");
	/* HIP: CRIU with its amdgpu plugin is the control step, so the shim's data step alone. */
	cro.mode = drv ? GCR_CR_DRIVER_ONLY : hip ? GCR_CR_DATA_ONLY : GCR_CR_FULL;
	step(o, GCR_IMGCR_STEP_SUSPEND, partial);
	if (mkdir(partial, 0700) < 0)
		return gcr_err_set(err, -errno, "cannot create %s: %s (process untouched)", partial, strerror(errno));
	made = 1;
	snprintf(criu_dir, sizeof(criu_dir), "%s/%s", partial, GCR_IMAGE_CRIU_DIR);
	if (realpath(partial, abs_partial) == NULL || mkdir(criu_dir, 0700) < 0) {
		rc = gcr_err_set(err, -errno, "cannot prepare %s: %s (process untouched)", partial, strerror(errno));
		goto out;
	}
	/* CUDA: the suspend itself writes gpu/ (the copies go from the pinned slots to the files, no
	 * staging). HIP keeps the staged path: suspend, then image-write. */
	int stream = !drv && !hip;
	if (stream)
		cro.image_dir = abs_partial;
	t0 = gcr_time_mono_ms();
	struct gcr_cr_result cr;
	rc = gcr_cr_suspend(pid, &cro, &cr, err);
	if (rc == 0 && stream) {
		res = json_incref(json_object_get(cr.shim, "image"));
		r->ms_write = json_real_value(json_object_get(json_object_get(cr.shim, "ms"), "copy"));
	}
	gcr_cr_result_clear(&cr);
	r->ms_suspend = gcr_time_mono_ms() - t0;
	if (rc < 0) {
		gcr_err_wrap(err, "suspend");
		goto out;
	}
	suspended = 1;
	if (stream && res == NULL)
		rc = gcr_err_set(err, -EPROTO, "the shim's suspend reported no image: is its version too old?");
	t0 = gcr_time_mono_ms();
	if (rc == 0 && hip)
		rc = shim_call(pid, &cro, GCR_OP_IMAGE_WRITE_ID, json_pack("{s:s}", "dir", abs_partial), &res, NULL, 0,
			       err);
	if (hip)
		r->ms_write = gcr_time_mono_ms() - t0;
	/* From here the data is in the partial image only: the undo is image-read + resume. */
	written = stream || (rc == 0 && hip);
	if (rc < 0) {
		gcr_err_wrap(err, "image-write");
		goto out;
	}
	r->bytes = json_integer_value(json_object_get(res, "bytes"));
	r->written = json_integer_value(json_object_get(res, "written"));
	r->zero = json_integer_value(json_object_get(res, "zero"));
	json_decref(res);
	r->rss = vm_rss(pid);
	struct gcr_criu_argv av;
	step(o, GCR_IMGCR_STEP_DUMP, partial);
	t0 = gcr_time_mono_ms();
	enum gcr_criu_after after = o->leave_running ? GCR_CRIU_LEAVE_RUNNING : GCR_CRIU_KILL;
	rc = o->whole_container ? gcr_ctrdump_argv(&info, pid, criu_dir, after, &av, err)
				: gcr_criu_dump_argv(&info, pid, criu_dir, after, &av, err);
	if (rc == 0) {
		struct gcr_image_flusher *fl = gcr_image_flusher_start(criu_dir);
		rc = gcr_criu_run(&info, &av, err);
		gcr_image_flusher_stop(fl);
	}
	r->ms_dump = gcr_time_mono_ms() - t0;
	if (rc < 0)
		goto out;
	gone = !o->leave_running;
	step(o, GCR_IMGCR_STEP_SEAL, partial);
	t0 = gcr_time_mono_ms();
	struct gcr_imgcr_seal seal = { .mode = drv ? GCR_IMAGE_MODE_DRIVER : GCR_IMAGE_MODE_GCR, .pid = pid,
				       .socket = socket, .shim_version = shim_version, .vendor = hip ? "amd" : NULL,
				       .node = o->node, .container = o->container, .no_table = drv, .sign = o->sign };
	rc = gcr_imgcr_seal(partial, dir, &seal, NULL, err);
	r->ms_manifest = gcr_time_mono_ms() - t0;
	if (rc == 0) {
		made = 0;
		r->image = dir_bytes(dir);
	}
	if (rc == 0 && o->leave_running) {
		step(o, GCR_IMGCR_STEP_BACK, partial);
		t0 = gcr_time_mono_ms();
		char abs_dir[PATH_MAX];
		if (realpath(dir, abs_dir) == NULL) {
			rc = gcr_err_set(err, -errno, "image %s written, but %s", dir, strerror(errno));
		} else if (drv) {
			struct gcr_cr_result cr2;
			rc = gcr_cr_resume(pid, &cro, &cr2, err);
			gcr_cr_result_clear(&cr2);
		} else {
			rc = bring_back(pid, abs_dir, &cro, err);
		}
		r->ms_resume = gcr_time_mono_ms() - t0;
		if (rc < 0)
			gcr_err_wrap(err, "image %s written; the process stays suspended, bringing it back failed", dir);
		suspended = 0;
	}
out:
	if (rc < 0 && made) {
		if (suspended && !gone) {
			struct gcr_err e2;
			int b = 0;
			if (written) {
				b = bring_back(pid, abs_partial, &cro, &e2);
			} else {
				struct gcr_cr_result cr2;
				b = gcr_cr_resume(pid, &cro, &cr2, &e2);
				gcr_cr_result_clear(&cr2);
			}
			char first[GCR_ERR_MSG_MAX];
			snprintf(first, sizeof(first), "%s", err->msg);
			if (b < 0 && written) {
				/* Its GPU data is in the partial image's files only: they stay. */
				gcr_err_set(err, rc, "%s; the process stays suspended with its GPU data in %s (resume "
					    "failed: %s; image-read that directory, then resume)", first, abs_partial, e2.msg);
				made = 0;
			} else if (b < 0) {
				gcr_err_set(err, rc, "%s; the process stays suspended (resume failed: %s)", first, e2.msg);
			} else {
				gcr_err_set(err, rc, "%s; process resumed, no image written", first);
			}
		} else if (gone) {
			gcr_err_wrap(err, "the process was ended by CRIU's dump; its image is kept at %s", partial);
			made = 0; /* the only copy of the process: kept */
		}
		if (made)
			gcr_image_remove(partial);
	}
	r->ms_total = gcr_time_mono_ms() - t_start;
	return rc;
}

/* image-read with the files as descriptors: {"files": [names]}, the descriptors with the line. */
static int attach_fds(pid_t pid, const struct gcr_imgcr_files *f, const struct gcr_cr_opts *cro, struct gcr_err *err)
{
	if (f->n <= 0 || f->n > GCR_SOCK_MAX_FDS)
		return gcr_err_set(err, -EINVAL, "%d image files to hand over: 1..%d", f->n, GCR_SOCK_MAX_FDS);
	json_t *names = json_array();
	for (int i = 0; names != NULL && i < f->n; i++)
		json_array_append_new(names, json_string(f->names[i]));
	json_t *res = NULL;
	int rc = shim_call_fds(pid, cro, GCR_OP_IMAGE_READ_ID, json_pack("{s:o}", "files", names), f->fds, f->n, &res,
			       NULL, 0, err);
	json_decref(res);
	return rc;
}

static int resume_restored(pid_t pid, const char *dir, const struct gcr_imgcr_files *f, const struct gcr_cr_opts *cro,
			   struct gcr_imgcr_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	r->pid = pid;
	double t0 = gcr_time_mono_ms();
	int rc = f != NULL ? attach_fds(pid, f, cro, err) : gcr_imgcr_attach(pid, dir, cro, err);
	r->ms_read = gcr_time_mono_ms() - t0;
	if (rc < 0) {
		r->ms_total = r->ms_read;
		return f != NULL ? gcr_err_wrap(err, "image-read of %d files handed over (process %d still suspended)",
						f->n, (int)pid)
				 : gcr_err_wrap(err, "image-read from %s (process %d still suspended)", dir, (int)pid);
	}
	struct gcr_cr_result cr;
	double t1 = gcr_time_mono_ms();
	rc = gcr_cr_resume(pid, cro, &cr, err);
	r->ms_resume = gcr_time_mono_ms() - t1;
	r->bytes = cr.bytes_total;
	gcr_cr_result_clear(&cr);
	r->ms_total = gcr_time_mono_ms() - t0;
	return rc;
}

int gcr_imgcr_resume_restored(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, struct gcr_imgcr_result *r,
			      struct gcr_err *err)
{
	return resume_restored(pid, dir, NULL, cro, r, err);
}

int gcr_imgcr_resume_restored_fds(pid_t pid, const struct gcr_imgcr_files *f, const struct gcr_cr_opts *cro,
				  struct gcr_imgcr_result *r, struct gcr_err *err)
{
	return resume_restored(pid, NULL, f, cro, r, err);
}

/* Kills a restored process and returns once it has died (its pidfd polls readable at exit),
 * so "nothing left half-running" holds when the caller reports. CRIU's -d leaves it to the
 * nearest subreaper, else init: whoever reaps it frees its pid, which the image needs. */
static void kill_restored(pid_t pid)
{
	if (pid <= 0)
		return;
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	kill(pid, SIGKILL);
	if (pfd >= 0) {
		struct pollfd p = { .fd = pfd, .events = POLLIN };
		while (poll(&p, 1, 30000) < 0 && errno == EINTR)
			;
		close(pfd);
	}
	/* Ours when the caller is a subreaper (gcr_imgcr_opts.subreaper): reaped here, so its pid is
	 * free for the next restore at once. */
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

struct data_check {
	pthread_t th;
	char dir[PATH_MAX];
	const struct gcr_image_manifest *m;
	double t0, ms;
	int beside; /* runs while CRIU restores */
	int rc;
	struct gcr_err err;
};

static void *expect_here_run(void *arg)
{
	gcr_imgcr_expect_here(arg);
	return NULL;
}

static void *data_check_run(void *arg)
{
	struct data_check *d = arg;
	/* Beside CRIU's restore: leave it cores (it restores on one, with helpers). */
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	d->rc = gcr_image_verify_data(d->dir, d->m, d->beside && cores > 4 ? (int)cores - 2 : 0, &d->err);
	d->ms = gcr_time_mono_ms() - d->t0;
	return NULL;
}

int gcr_imgcr_restore(const char *dir, const struct gcr_imgcr_opts *o, struct gcr_imgcr_result *r,
		      struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	double t_start = gcr_time_mono_ms(), t0 = t_start;
	struct gcr_image_expect here;
	struct gcr_image_manifest m;
	/* This machine's GPU (NVML's start-up takes a while) beside the manifest and CRIU files'
	 * checks; compared before anything is touched. */
	pthread_t here_th;
	int here_started = pthread_create(&here_th, NULL, expect_here_run, &here) == 0;
	if (!here_started)
		gcr_imgcr_expect_here(&here);
	int rc = gcr_image_verify_meta(dir, NULL, &m, err);
	if (here_started)
		pthread_join(here_th, NULL);
	if (rc == 0 && (rc = gcr_image_env_check(&m, &here, err)) < 0)
		gcr_image_manifest_clear(&m);
	r->ms_verify = gcr_time_mono_ms() - t0;
	if (rc == 0 && strcmp(m.mode, GCR_IMAGE_MODE_RUNTIME) == 0) {
		rc = gcr_err_set(err, -ENOTSUP, "%s holds a container runtime's checkpoint: a new pod created from it is "
				 "restored by the runtime, then its GPU data (docs/images.md); nothing restored", dir);
		gcr_image_manifest_clear(&m);
	}
	if (rc < 0)
		return rc;
	/* The GPU data's checksums while CRIU restores the CPU side: the restored process stays
	 * held at the shim's gate (it was dumped suspended) and is killed, never resumed, if a
	 * chunk is corrupt. */
	struct data_check dc = { .m = &m };
	snprintf(dc.dir, sizeof(dc.dir), "%s", dir);
	dc.t0 = gcr_time_mono_ms();
	dc.beside = !o->verify_first;
	int dc_started = dc.beside && pthread_create(&dc.th, NULL, data_check_run, &dc) == 0;
	if (!dc_started)
		data_check_run(&dc); /* first, here (asked for, or no thread to be had) */
	if (!dc_started && dc.rc < 0) {
		rc = dc.rc;
		*err = dc.err;
		r->ms_check = dc.ms;
		gcr_image_manifest_clear(&m);
		r->ms_total = gcr_time_mono_ms() - t_start;
		return rc;
	}
	r->image = dir_bytes(dir);
	int hip = strcmp(m.env.gpu_vendor, "amd") == 0, drv = strcmp(m.mode, GCR_IMAGE_MODE_DRIVER) == 0;
	struct gcr_cr_opts cro = *o->cr;
	cro.mode = drv ? GCR_CR_DRIVER_ONLY : hip ? GCR_CR_DATA_ONLY : GCR_CR_FULL;
	char abs_dir[PATH_MAX], criu_dir[PATH_MAX + 8], tmp[] = "/tmp/gcr-restore-XXXXXX", pidfile[64];
	struct gcr_criu_info info;
	pid_t pid = 0;
	if (realpath(dir, abs_dir) == NULL)
		rc = gcr_err_set(err, -errno, "%s: %s", dir, strerror(errno));
	if (rc == 0)
		rc = criu_ready(hip, &info, err);
	if (rc == 0 && kill(m.pid, 0) == 0)
		rc = gcr_err_set(err, -EEXIST, "pid %d, which the image needs, is in use: nothing restored", (int)m.pid);
	if (rc == 0 && mkdtemp(tmp) == NULL)
		rc = gcr_err_set(err, -errno, "mkdtemp: %s", strerror(errno));
	if (rc < 0)
		goto out;
	snprintf(pidfile, sizeof(pidfile), "%s/pid", tmp);
	/* The restored process comes to us when CRIU exits, so a failed restore can reap it (an
	 * init that reaps late would keep its pid, and the next restore would be refused). */
	if (o->subreaper)
		(void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	/* The shim's socket file of the dumped process, if left (it was killed): CRIU binds the
	 * restored socket at that name. */
	struct gcr_err e2;
	if (m.socket[0] != '\0')
		(void)gcr_sock_remove_stale(m.socket, &e2);
	snprintf(info.restore_log, sizeof(info.restore_log), "%s/restore.log", tmp);
	snprintf(criu_dir, sizeof(criu_dir), "%s/%s", abs_dir, GCR_IMAGE_CRIU_DIR);
	struct gcr_criu_argv av;
	t0 = gcr_time_mono_ms();
	rc = gcr_criu_restore_argv(&info, criu_dir, pidfile, &av, err);
	if (rc == 0)
		rc = gcr_criu_run(&info, &av, err);
	r->ms_restore = gcr_time_mono_ms() - t0;
	char *buf = NULL;
	size_t len;
	if (gcr_image_read_file(pidfile, 64, &buf, &len, &(struct gcr_err){ 0 }) == 0)
		pid = (pid_t)atoi(buf);
	free(buf);
	r->pid = pid;
	if (rc == 0 && pid <= 0)
		rc = gcr_err_set(err, -EIO, "criu restore wrote no pid file");
	if (dc_started)
		pthread_join(dc.th, NULL);
	dc_started = 0;
	r->ms_check = dc.ms;
	if (dc.rc < 0) {
		kill_restored(pid);
		char first[GCR_ERR_MSG_MAX];
		snprintf(first, sizeof(first), "%s", dc.err.msg);
		rc = gcr_err_set(err, dc.rc, "%s%s", first,
				 pid > 0 ? " (the restored process, held before its data step, was removed)" : "");
		goto out;
	}
	if (rc < 0) {
		gcr_err_wrap(err, "criu restore (log %s)", info.restore_log);
		kill_restored(pid);
		goto out;
	}
	gcr_image_test_hold("GCR_TEST_RESTORE_HOLD"); /* tests/flow/test_image.py case_changed_after_verify */
	t0 = gcr_time_mono_ms();
	json_t *res = NULL;
	if (!drv) /* attaches the files: the resume reads them straight to the GPU */
		rc = shim_call_at(m.socket, pid, &cro, GCR_OP_IMAGE_READ_ID, json_pack("{s:s}", "dir", abs_dir), &res,
				  err);
	json_decref(res);
	r->ms_read = gcr_time_mono_ms() - t0;
	if (rc == 0) {
		struct gcr_cr_result cr;
		t0 = gcr_time_mono_ms();
		rc = gcr_cr_resume(pid, &cro, &cr, err);
		r->ms_resume = gcr_time_mono_ms() - t0;
		r->bytes = cr.bytes_total;
		gcr_cr_result_clear(&cr);
	}
	if (rc < 0) {
		kill_restored(pid);
		gcr_err_wrap(err, "restored process %d killed (nothing left half-running)", (int)pid);
	}
out:
	if (dc_started)
		pthread_join(dc.th, NULL);
	if (strcmp(tmp, "/tmp/gcr-restore-XXXXXX") != 0 && rc == 0) {
		unlink(info.restore_log);
		unlink(pidfile);
		rmdir(tmp);
	}
	gcr_image_manifest_clear(&m);
	r->ms_total = gcr_time_mono_ms() - t_start;
	return rc;
}
