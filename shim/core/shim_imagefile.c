/* shim_imagefile: staged GPU data to image files, and image files as the source of the next
 * resume (see shim_imagefile.h). One file per allocation, its non-zero chunks back to back in
 * chunk order, so a file's size says how much data it must hold and a reader needs no index
 * beyond the table. Writing: several threads, one chunk each at a time (pwrite at known
 * offsets), each chunk's CRC-32C taken from the bytes written. Reading is the resume's: its
 * copy workers pread each chunk into a pinned slot, check it and send it to the GPU, so a
 * restored process never needs its data in host memory twice (staging, then page cache). */
#include "shim_imagefile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr_image.h"
#include "gcr_log.h"
#include "gcr_crc32c.h"
#include "gcr_time.h"
#include "shim_alloc.h"
#include "shim_cr.h"
#include "shim_digest.h"
#include "shim_chunks.h"
#include "shim_staging.h"

#define MAX_THREADS 8

/* The staged allocations, in slot order (allocation calls are gated while suspended, so the
 * records stay), with the address of a whole mapping at offset 0 where there is one. */
struct one {
	struct shim_phys *p;
	uint64_t va;
	int fd;
	int dfd; /* the same file with O_DIRECT (-1: the filesystem has none): page-aligned chunks */
	struct gcr_image_alloc *a;
};

struct list {
	struct one *v;
	size_t n, cap;
};

static int list_add(struct shim_phys *p, uint64_t va, void *arg)
{
	(void)va;
	struct list *l = arg;
	if (!p->staged || p->chunks == NULL)
		return 0;
	if (l->n == l->cap)
		return -ENOMEM;
	l->v[l->n++] = (struct one){ .p = p, .fd = -1, .dfd = -1 };
	return 0;
}

static int list_addr(const struct shim_map *m, void *arg)
{
	struct list *l = arg;
	for (size_t i = 0; i < l->n; i++)
		if (l->v[i].p == m->phys && m->offset == 0 && m->size >= m->phys->size && l->v[i].va == 0)
			l->v[i].va = m->va;
	return 0;
}

static int staged_list(struct list *l, struct gcr_err *err)
{
	l->cap = shim_alloc_nphys();
	l->n = 0;
	l->v = calloc(l->cap + 1, sizeof(*l->v));
	if (l->v == NULL)
		return gcr_err_set(err, -ENOMEM, "out of host memory for the list of allocations");
	if (shim_alloc_each(0, list_add, l) < 0) {
		free(l->v);
		return gcr_err_set(err, -ENOMEM, "allocation table changed while suspended");
	}
	(void)shim_alloc_each_map(list_addr, l);
	return 0;
}

static uint32_t chunk_len(const struct shim_phys *p, size_t c)
{
	uint64_t lo = (uint64_t)c * GCR_DIGEST_CHUNK;
	return (uint32_t)(p->size - lo < GCR_DIGEST_CHUNK ? p->size - lo : GCR_DIGEST_CHUNK);
}

/* ---- the copy threads: one job per non-zero chunk ---- */

struct job {
	struct one *o;
	size_t c;
};

struct run {
	struct job *jobs;
	size_t n;
	atomic_size_t next;
	atomic_int failed;
	pthread_mutex_t lock;
	struct gcr_err err; /* the first failure, under lock */
};

static void run_fail(struct run *r, int code, const char *what, const struct one *o, size_t c)
{
	pthread_mutex_lock(&r->lock);
	if (!atomic_load(&r->failed))
		gcr_err_set(&r->err, code, "%s chunk %zu of %s: %s", what, c, o->a->file,
			    strerror(-code));
	atomic_store(&r->failed, 1);
	pthread_mutex_unlock(&r->lock);
}

static void *run_thread(void *arg)
{
	struct run *r = arg;
	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		if (i >= r->n || atomic_load(&r->failed))
			break;
		struct one *o = r->jobs[i].o;
		size_t c = r->jobs[i].c;
		struct gcr_image_chunk *ch = &o->a->chunks[c];
		char *host = shim_staging_host(o->p->chunks->off[c]);
		if (host == NULL) {
			run_fail(r, -EFAULT, "writing", o, c);
			break;
		}
		/* Direct I/O where the staging address, the file offset and the length allow it: the
		 * disk's own speed, where the page cache's write-back reached about half of it (1.4 of
		 * 2.2 GB/s on the H200 machine). */
		int wrc = gcr_image_pwrite(o->fd, (uintptr_t)host % GCR_IMAGE_DIRECT_ALIGN == 0 ? o->dfd : -1, host,
					   ch->len, ch->off);
		if (wrc < 0) {
			run_fail(r, wrc, "writing", o, c);
			return NULL;
		}
		ch->crc = gcr_crc32c_update(0, host, ch->len);
	}
	return NULL;
}

static int run_all(struct job *jobs, size_t n, struct gcr_err *err)
{
	struct run r = { .jobs = jobs, .n = n };
	pthread_mutex_init(&r.lock, NULL);
	pthread_t th[MAX_THREADS];
	size_t nt = n < MAX_THREADS ? n : MAX_THREADS, started = 0;
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	if (cores > 0 && nt > (size_t)cores)
		nt = (size_t)cores;
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old); /* the application's signals are not ours */
	for (; started < nt; started++)
		if (pthread_create(&th[started], NULL, run_thread, &r) != 0)
			break;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (started == 0 && n > 0)
		run_thread(&r); /* no thread to be had: do it here */
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&r.lock);
	if (atomic_load(&r.failed)) {
		*err = r.err;
		return err->code;
	}
	return 0;
}

static int write_table(const char *dir, struct list *l, struct gcr_err *err)
{
	struct gcr_image_table t = { .n = l->n, .a = calloc(l->n + 1, sizeof(*t.a)) };
	if (t.a == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for the table");
	for (size_t i = 0; i < l->n; i++)
		t.a[i] = *l->v[i].a;
	json_t *allocs = gcr_image_table_to_json(&t);
	free(t.a); /* the chunks belong to l */
	json_t *root = allocs ? json_pack("{s:o}", "allocs", allocs) : NULL;
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, GCR_IMAGE_TABLE);
	int rc = 0;
	if (root == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory for the table");
	else if (json_dump_file(root, path, JSON_COMPACT) < 0)
		rc = gcr_err_set(err, -EIO, "cannot write %s", path);
	json_decref(root);
	int fd = rc == 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	struct stat st;
	if (rc == 0 && (fd < 0 || fsync(fd) < 0))
		rc = gcr_err_set(err, -EIO, "cannot sync %s: %s", path, strerror(errno));
	/* What every reader refuses: said here, where the image is being written. */
	if (rc == 0 && fstat(fd, &st) == 0 && (unsigned long long)st.st_size > GCR_IMAGE_MAX_TABLE)
		rc = gcr_err_set(err, -EFBIG, "the table of %zu allocations has %lld bytes, more than an image may "
				 "(%llu: about 110,000 chunks of GPU data)", l->n, (long long)st.st_size, GCR_IMAGE_MAX_TABLE);
	if (fd >= 0)
		close(fd);
	return rc;
}

static void list_free(struct list *l)
{
	for (size_t i = 0; i < l->n; i++) {
		if (l->v[i].fd >= 0)
			close(l->v[i].fd);
		if (l->v[i].dfd >= 0)
			close(l->v[i].dfd);
		if (l->v[i].a != NULL)
			free(l->v[i].a->chunks);
		free(l->v[i].a);
	}
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* The table entry of o (allocated here, freed by list_free): its allocation's identity, no chunks
 * filled yet. */
static int one_table(struct one *o, struct gcr_err *err)
{
	const struct shim_chunks *ck = o->p->chunks;
	o->a = calloc(1, sizeof(*o->a));
	if (o->a == NULL || (o->a->chunks = calloc(ck->nchunks + 1, sizeof(*o->a->chunks))) == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for the table");
	*o->a = (struct gcr_image_alloc){ .address = o->va, .size = o->p->size, .slot = o->p->slot, .gen = o->p->gen,
					  .nchunks = ck->nchunks, .chunks = o->a->chunks };
	return 0;
}

static int check_suspended(const char *op, struct gcr_err *err)
{
	if (shim_cr_state() != SHIM_CR_SUSPENDED)
		return gcr_err_set(err, -EINVAL, "%s: not suspended (state %s): suspend first", op,
				   shim_cr_state_name(shim_cr_state()));
	return 0;
}

int shim_imagefile_write(const char *dir, json_t **result, struct gcr_err *err)
{
	*result = NULL;
	double t0 = gcr_time_mono_ms();
	int rc = check_suspended("image-write", err);
	if (rc == 0 && shim_cr_data() != SHIM_CR_DATA_HOST)
		rc = gcr_err_set(err, -EINVAL, "image-write: the data is in image files, not in host memory; resume "
				 "first (after image-read)");
	if (rc == 0 && (dir == NULL || dir[0] != '/'))
		rc = gcr_err_set(err, -EINVAL, "image-write: \"dir\" must be an absolute path");
	char gdir[PATH_MAX];
	if (rc == 0 && (size_t)snprintf(gdir, sizeof(gdir), "%s/%s", dir, GCR_IMAGE_GPU_DIR) >= sizeof(gdir) - 64)
		rc = gcr_err_set(err, -ENAMETOOLONG, "image-write: path too long");
	if (rc == 0 && mkdir(gdir, 0700) < 0)
		rc = gcr_err_set(err, -errno, "image-write: cannot create %s: %s", gdir, strerror(errno));
	struct list l = { 0 };
	if (rc == 0)
		rc = staged_list(&l, err);
	size_t njobs = 0, nj = 0;
	uint64_t bytes = 0, written = 0, zero = 0;
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		struct one *o = &l.v[i];
		const struct shim_chunks *ck = o->p->chunks;
		if ((rc = one_table(o, err)) < 0)
			break;
		snprintf(o->a->file, sizeof(o->a->file), "%s/alloc-%u-%u.bin", GCR_IMAGE_GPU_DIR, o->p->slot, o->p->gen);
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", dir, o->a->file);
		o->fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (o->fd < 0) {
			rc = gcr_err_set(err, -errno, "image-write: cannot create %s: %s", path, strerror(errno));
			break;
		}
		o->dfd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1 on tmpfs and the like: fine */
		uint64_t off = 0;
		for (size_t c = 0; c < ck->nchunks; c++) {
			struct gcr_image_chunk *ch = &o->a->chunks[c];
			ch->len = chunk_len(o->p, c);
			bytes += ch->len;
			if (ck->zero[c]) {
				ch->zero = 1;
				zero += ch->len;
				continue;
			}
			if (ck->off[c] == SHIM_CHUNKS_NONE) {
				rc = gcr_err_set(err, -EIO, "image-write: a chunk of %s is not in staging", o->a->file);
				break;
			}
			ch->off = off;
			off += ch->len;
			written += ch->len;
			njobs++;
		}
	}
	struct job *jobs = rc == 0 ? calloc(njobs + 1, sizeof(*jobs)) : NULL;
	if (rc == 0 && jobs == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory for %zu chunk jobs", njobs);
	for (size_t i = 0; rc == 0 && i < l.n; i++)
		for (size_t c = 0; c < l.v[i].a->nchunks; c++)
			if (!l.v[i].a->chunks[c].zero)
				jobs[nj++] = (struct job){ .o = &l.v[i], .c = c };
	if (rc == 0)
		gcr_image_test_hold("GCR_TEST_IMAGE_HOLD"); /* tests/flow/test_image.py */
	double t1 = gcr_time_mono_ms();
	if (rc == 0)
		rc = run_all(jobs, nj, err);
	for (size_t i = 0; rc == 0 && i < l.n; i++)
		if (fsync(l.v[i].fd) < 0)
			rc = gcr_err_set(err, -EIO, "image-write: fsync %s: %s", l.v[i].a->file, strerror(errno));
	double t2 = gcr_time_mono_ms();
	if (rc == 0)
		rc = write_table(dir, &l, err);
	if (rc == 0) {
		*result = json_pack("{s:I, s:I, s:I, s:I, s:s, s:{s:f, s:f}}", "bytes", (json_int_t)bytes, "written",
				    (json_int_t)written, "zero", (json_int_t)zero, "allocs", (json_int_t)l.n, "table",
				    GCR_IMAGE_TABLE, "ms", "data", t2 - t1, "total", gcr_time_mono_ms() - t0);
		if (*result == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of memory for the reply");
	}
	free(jobs);
	list_free(&l);
	if (rc < 0)
		gcr_err_wrap(err, "process still suspended, its data in host memory");
	return rc;
}

/* ---- suspend straight to files: the copies' sink (shim_cr_suspend_to) ---- */

struct sink_file {
	struct shim_phys *p;
	int fd, dfd;
	char name[GCR_IMAGE_NAME_MAX]; /* relative to the image, "gpu/..." */
};

struct sink_ctx {
	const char *dir;
	struct sink_file *v;
	size_t n, cap;
};

/* The file of allocation p, created on first use (the copy workers only pwrite at known
 * offsets, so one descriptor serves them all). */
static int sink_open(struct shim_phys *p, int *fd, int *dfd, const char **name, void *arg, struct gcr_err *err)
{
	struct sink_ctx *c = arg;
	size_t i = 0;
	while (i < c->n && c->v[i].p != p)
		i++;
	if (i == c->n) {
		if (c->n == c->cap)
			return gcr_err_set(err, -ENOMEM, "image: more allocations than when the suspend began");
		struct sink_file *f = &c->v[c->n];
		*f = (struct sink_file){ .p = p, .fd = -1, .dfd = -1 };
		snprintf(f->name, sizeof(f->name), "%s/alloc-%u-%u.bin", GCR_IMAGE_GPU_DIR, p->slot, p->gen);
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", c->dir, f->name);
		f->fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (f->fd < 0)
			return gcr_err_set(err, -errno, "image: cannot create %s: %s", path, strerror(errno));
		f->dfd = open(path, O_WRONLY | O_DIRECT | O_CLOEXEC); /* -1 on tmpfs and the like: fine */
		c->n++;
	}
	*fd = c->v[i].fd;
	*dfd = c->v[i].dfd;
	*name = c->v[i].name;
	return 0;
}

static void sink_close(struct sink_ctx *c)
{
	for (size_t i = 0; i < c->n; i++) {
		if (c->v[i].fd >= 0)
			close(c->v[i].fd);
		if (c->v[i].dfd >= 0)
			close(c->v[i].dfd);
	}
	free(c->v);
	c->v = NULL;
	c->n = 0;
}

/* After the suspend: the table from what the copies recorded in each chunk table. */
static int sink_table(const char *dir, struct sink_ctx *c, uint64_t *bytes, uint64_t *written, uint64_t *zero,
		      size_t *nallocs, struct gcr_err *err)
{
	struct list l = { 0 };
	int rc = staged_list(&l, err);
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		struct one *o = &l.v[i];
		const struct shim_chunks *ck = o->p->chunks;
		if ((rc = one_table(o, err)) < 0)
			break;
		if (ck->src_name == NULL || ck->src_off == NULL) {
			rc = gcr_err_set(err, -EIO, "image: allocation %u/%u was not written", o->p->slot, o->p->gen);
			break;
		}
		snprintf(o->a->file, sizeof(o->a->file), "%s", ck->src_name);
		for (size_t c2 = 0; c2 < ck->nchunks; c2++) {
			struct gcr_image_chunk *ch = &o->a->chunks[c2];
			ch->len = chunk_len(o->p, c2);
			ch->zero = ck->zero[c2];
			ch->off = ck->src_off[c2];
			ch->crc = ck->src_crc[c2];
			*bytes += ch->len;
			*(ch->zero ? zero : written) += ch->len;
		}
	}
	/* Data files, then the table, all synced before anyone calls the image whole. */
	for (size_t i = 0; rc == 0 && i < c->n; i++)
		if (fsync(c->v[i].fd) < 0)
			rc = gcr_err_set(err, -EIO, "image: fsync %s: %s", c->v[i].name, strerror(errno));
	if (rc == 0)
		rc = write_table(dir, &l, err);
	*nallocs = l.n;
	list_free(&l);
	return rc;
}

/* Every chunk table reads its file on the next resume (the undo of a suspend to files). */
static void sink_attach(void *arg)
{
	struct sink_ctx *c = arg;
	for (size_t i = 0; i < c->n; i++) {
		struct shim_chunks *ck = c->v[i].p->chunks;
		if (ck != NULL && ck->src_off != NULL && ck->src_fd < 0)
			ck->src_fd = dup(c->v[i].fd);
	}
}

int shim_imagefile_suspend(const char *dir, int timeout_ms, struct shim_cr_report *rep, json_t **result,
			   struct gcr_err *err)
{
	*result = NULL;
	double t0 = gcr_time_mono_ms();
	int rc = 0;
	/* Before the directory is made: a process already suspended is left as it is. */
	if (shim_cr_state() != SHIM_CR_RUNNING)
		rc = gcr_err_set(err, -EALREADY, "suspend to an image: already suspended (state %s, data %s)",
				 shim_cr_state_name(shim_cr_state()), shim_cr_data_name(shim_cr_data()));
	char gdir[PATH_MAX];
	if (rc == 0 && (dir == NULL || dir[0] != '/'))
		rc = gcr_err_set(err, -EINVAL, "suspend to an image: \"image\" must be an absolute path");
	if (rc == 0 && (size_t)snprintf(gdir, sizeof(gdir), "%s/%s", dir, GCR_IMAGE_GPU_DIR) >= sizeof(gdir) - 64)
		rc = gcr_err_set(err, -ENAMETOOLONG, "suspend to an image: path too long");
	if (rc == 0 && mkdir(gdir, 0700) < 0)
		rc = gcr_err_set(err, -errno, "suspend to an image: cannot create %s: %s", gdir, strerror(errno));
	struct sink_ctx c = { .dir = dir, .cap = shim_alloc_nphys() + 1 };
	if (rc == 0 && (c.v = calloc(c.cap, sizeof(*c.v))) == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory for the image files");
	struct shim_cr_sink sink = { .open = sink_open, .attach = sink_attach, .ctx = &c };
	if (rc == 0)
		gcr_image_test_hold("GCR_TEST_IMAGE_HOLD"); /* tests/flow/test_image.py */
	if (rc == 0)
		rc = shim_cr_suspend_to(&sink, timeout_ms, rep, err); /* on failure: running, nothing written counts */
	uint64_t bytes = 0, written = 0, zero = 0;
	size_t nallocs = 0;
	if (rc == 0 && (rc = sink_table(dir, &c, &bytes, &written, &zero, &nallocs, err)) < 0) {
		/* Suspended, every chunk in its file, but no table: back to running from the files. */
		struct gcr_err e2;
		struct shim_cr_report r2;
		sink_attach(&c);
		if (shim_cr_data_move(SHIM_CR_DATA_FILES, &e2) < 0 || shim_cr_resume(&r2, &e2) < 0) {
			gcr_err_wrap(err, "the process stays suspended, its data in %s (resume reads it): resume failed: %s",
				     gdir, e2.msg);
		} else {
			gcr_err_wrap(err, "process resumed from the files");
		}
	}
	sink_close(&c);
	if (rc == 0) {
		/* The data is in the files only (shim_cr says "written"): the pool (faulted in ahead
		 * for suspends) goes back, so CRIU's dump does not carry it. */
		shim_staging_drop();
		*result = json_pack("{s:I, s:I, s:I, s:I, s:s, s:{s:f}}", "bytes", (json_int_t)bytes, "written",
				    (json_int_t)written, "zero", (json_int_t)zero, "allocs", (json_int_t)nallocs, "table",
				    GCR_IMAGE_TABLE, "ms", "total", gcr_time_mono_ms() - t0);
		if (*result == NULL)
			GCR_LOG(GCR_LOG_WARN, "shim", "out of memory for the image summary");
	}
	return rc;
}

int shim_imagefile_drop(struct gcr_err *err)
{
	/* The machine first: once the staging is gone, nothing may resume from it. */
	int rc = shim_cr_data_move(SHIM_CR_DATA_WRITTEN, err);
	if (rc < 0)
		return gcr_err_wrap(err, "host staging kept");
	shim_staging_drop();
	GCR_LOG(GCR_LOG_INFO, "shim", "host staging given back: the GPU data is in image files only");
	return 0;
}

/* The descriptor src passed for name, or -1. */
static int src_fd(const struct shim_imagefile_src *src, const char *name)
{
	for (int i = 0; i < src->n; i++)
		if (strcmp(src->names[i], name) == 0)
			return src->fds[i];
	return -1;
}

/* One of the image's files, read-only: from src when the agent passed it, else under dir. */
static int open_image_file(const char *dir, const struct shim_imagefile_src *src, const char *name, char *path,
			   size_t plen, struct gcr_err *err)
{
	if (src != NULL) {
		snprintf(path, plen, "%s (passed)", name);
		int fd = src_fd(src, name);
		if (fd < 0)
			return gcr_err_set(err, -ENOENT, "image-read: %s was not passed with the request", name);
		int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
		return d >= 0 ? d : gcr_err_set(err, -errno, "image-read: %s: %s", path, strerror(errno));
	}
	if ((size_t)snprintf(path, plen, "%s/%s", dir, name) >= plen)
		return gcr_err_set(err, -ENAMETOOLONG, "image-read: path too long");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	return fd >= 0 ? fd : gcr_err_set(err, -errno, "image-read: cannot open %s: %s", path, strerror(errno));
}

int shim_imagefile_read(const char *dir, const struct shim_imagefile_src *src, json_t **result, struct gcr_err *err)
{
	*result = NULL;
	double t0 = gcr_time_mono_ms();
	int rc = check_suspended("image-read", err);
	if (rc == 0 && shim_cr_data() == SHIM_CR_DATA_HOST)
		rc = gcr_err_set(err, -EINVAL, "image-read: the data is still in host memory: resume instead");
	if (rc == 0 && src == NULL && (dir == NULL || dir[0] != '/'))
		rc = gcr_err_set(err, -EINVAL, "image-read: \"dir\" must be an absolute path");
	int in_files = rc == 0; /* from here a failure leaves the data in the files only */
	char path[PATH_MAX];
	char *buf = NULL;
	size_t len = 0;
	if (rc == 0) {
		int tfd = open_image_file(dir, src, GCR_IMAGE_TABLE, path, sizeof(path), err);
		rc = tfd < 0 ? tfd : gcr_image_read_fd(tfd, path, GCR_IMAGE_MAX_TABLE, &buf, &len, err);
		if (tfd >= 0)
			close(tfd);
	}
	struct gcr_image_table t = { 0 };
	if (rc == 0 && (rc = gcr_image_table_parse(buf, len, &t, err)) < 0)
		gcr_err_wrap(err, "%s", path);
	free(buf);
	struct list l = { 0 };
	if (rc == 0)
		rc = staged_list(&l, err);
	if (rc == 0 && l.n != t.n)
		rc = gcr_err_set(err, -EBADMSG, "image-read: the image has %zu allocations, this process %zu", t.n, l.n);
	uint64_t bytes = 0, loaded = 0;
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		struct one *o = &l.v[i];
		for (size_t k = 0; k < t.n && o->a == NULL; k++)
			if (t.a[k].slot == o->p->slot && t.a[k].gen == o->p->gen && t.a[k].size == o->p->size &&
			    t.a[k].nchunks == o->p->chunks->nchunks)
				o->a = &t.a[k];
		if (o->a == NULL)
			rc = gcr_err_set(err, -EBADMSG, "image-read: no allocation in the image matches record %u/%u (%zu bytes)",
					 o->p->slot, o->p->gen, o->p->size);
	}
	/* Copy workers for the resume; no pool: the data goes from the files to the GPU. */
	if (rc == 0 && l.n > 0)
		rc = shim_staging_prepare(l.v[0].p->gpu, 0, err);
	for (size_t i = 0; rc == 0 && i < l.n; i++) {
		struct one *o = &l.v[i];
		struct shim_chunks *ck = o->p->chunks;
		if ((rc = shim_chunks_record(ck, o->a->file)) < 0) {
			gcr_err_set(err, rc, "out of memory for the chunk table");
			break;
		}
		uint64_t need = 0;
		for (size_t c = 0; c < ck->nchunks; c++) {
			const struct gcr_image_chunk *ch = &o->a->chunks[c];
			ck->zero[c] = (uint8_t)ch->zero;
			ck->src_off[c] = ch->off;
			ck->src_crc[c] = ch->crc;
			bytes += ch->len;
			if (!ch->zero) {
				loaded += ch->len;
				need = ch->off + ch->len;
			}
		}
		if (need == 0)
			continue; /* all zero: no file, the resume zeroes it on the GPU */
		struct stat st;
		ck->src_fd = open_image_file(dir, src, o->a->file, path, sizeof(path), err);
		if (ck->src_fd < 0) {
			rc = ck->src_fd;
			ck->src_fd = -1;
		} else if (fstat(ck->src_fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != need) {
			rc = gcr_err_set(err, -EIO, "image-read: %s does not hold %llu bytes (truncated or changed)", path,
					 (unsigned long long)need);
		} else {
			(void)posix_fadvise(ck->src_fd, 0, 0, POSIX_FADV_SEQUENTIAL);
		}
	}
	if (rc == 0)
		rc = shim_cr_data_move(SHIM_CR_DATA_FILES, err);
	if (rc == 0) {
		*result = json_pack("{s:I, s:I, s:I, s:{s:f}}", "bytes", (json_int_t)bytes, "read", (json_int_t)loaded,
				    "allocs", (json_int_t)l.n, "ms", "total", gcr_time_mono_ms() - t0);
	} else {
		/* Nothing half-attached: every chunk table forgets its file, and resume waits for an
		 * image-read that succeeds. */
		for (size_t i = 0; i < l.n; i++)
			shim_chunks_clear(l.v[i].p->chunks);
		struct gcr_err e2;
		if (in_files && shim_cr_data_move(SHIM_CR_DATA_WRITTEN, &e2) < 0)
			GCR_LOG(GCR_LOG_ERROR, "shim", "image-read: %s", e2.msg);
	}
	for (size_t i = 0; i < l.n; i++)
		l.v[i].a = NULL; /* t's */
	free(l.v);
	gcr_image_table_clear(&t);
	if (rc < 0)
		gcr_err_wrap(err, "process still suspended, its data in image files only (resume refused until an "
			     "image-read succeeds)");
	return rc;
}
