/* agent_images: the images directory of Checkpoints with action Image, and its retention
 * (agent_images.h). An image is removed by renaming it to ".gc-<name>" in its pod directory
 * first (one rename: it stops being an image at once), then deleting the tree, its manifest
 * last; a ".gc-" left by a crash is deleted by the next sweep. On storage every node shares,
 * each node's retention touches only the images whose manifest names it (agent_images.h). */
#include "agent_images.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_crobj.h"
#include "gcr_image.h"
#include "gcr_procns.h"
#include "gcr/protocol.h"

#define GC_PREFIX ".gc-"
/* Most images looked at in one pod directory (more are left for the next prune). */
#define MAX_SCAN 4096

int agent_images_path(const char *root, const char *ns, const char *pod, const char *name, char *out, size_t len,
		      struct gcr_err *err)
{
	if (root == NULL || root[0] != '/')
		return gcr_err_set(err, -EINVAL, "images root '%s' is not an absolute path", root ? root : "");
	if (!agent_crobj_is_label(ns) || !agent_crobj_is_subdomain(pod) || !agent_crobj_is_subdomain(name))
		return gcr_err_set(err, -EINVAL, "'%s/%s/%s' is not a namespace, pod and Checkpoint name", ns ? ns : "",
				   pod ? pod : "", name ? name : "");
	size_t rl = strlen(root);
	while (rl > 1 && root[rl - 1] == '/')
		rl--;
	int n = snprintf(out, len, "%.*s/%s/%s/%s", (int)rl, root, ns, pod, name);
	if (n < 0 || (size_t)n >= len)
		return gcr_err_set(err, -ENAMETOOLONG, "image path under %s is too long", root);
	return 0;
}

int agent_images_mkparents(const char *path, struct gcr_err *err)
{
	char p[PATH_MAX];
	if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p))
		return gcr_err_set(err, -ENAMETOOLONG, "path too long: %s", path);
	char *last = strrchr(p, '/');
	if (last == NULL || last == p)
		return 0;
	*last = '\0';
	for (char *s = p + 1;; s++) {
		int end = *s == '\0';
		if (*s == '/' || end) {
			char c = *s;
			*s = '\0';
			if (mkdir(p, 0700) < 0 && errno != EEXIST)
				return gcr_err_set(err, -errno, "cannot create %s: %s", p, strerror(errno));
			*s = c;
		}
		if (end)
			break;
	}
	return 0;
}

int agent_images_is_alloc_dir(const char *root, const char *dir)
{
	if (root == NULL || dir == NULL)
		return 0;
	size_t rl = strlen(root);
	while (rl > 1 && root[rl - 1] == '/')
		rl--;
	if (strncmp(dir, root, rl) != 0 || strncmp(dir + rl, "/.alloc/", 8) != 0)
		return 0;
	const char *id = dir + rl + 8;
	size_t n = strlen(id);
	if (n == 0 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)id[i]) || isupper((unsigned char)id[i]))
			return 0;
	return 1;
}

int agent_images_move(const char *from, const char *to, struct gcr_err *err)
{
	int rc = agent_images_mkparents(to, err);
	if (rc < 0)
		return rc;
	if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) < 0)
		return gcr_err_set(err, -errno, "cannot move %s to %s: %s", from, to, strerror(errno));
	return 0;
}

/* Whether dir holds a manifest that parses and, with owner, names owner as its node (images on
 * shared storage: each node removes only its own). *created gets its time. */
static int owns(const char *dir, const char *owner, long long *created)
{
	char path[PATH_MAX];
	if (snprintf(path, sizeof(path), "%s/%s", dir, GCR_IMAGE_MANIFEST) >= (int)sizeof(path))
		return 0;
	char *buf = NULL;
	size_t len = 0;
	struct gcr_err err;
	struct gcr_image_manifest m;
	if (gcr_image_read_file(path, GCR_IMAGE_MAX_JSON, &buf, &len, &err) < 0)
		return 0;
	int ok = gcr_image_manifest_parse(buf, len, &m, &err) == 0;
	free(buf);
	if (ok) {
		ok = owner == NULL || strcmp(m.node, owner) == 0;
		*created = m.created;
		gcr_image_manifest_clear(&m);
	}
	return ok;
}

/* Whether pod_dir/name is a committed image owner's retention may remove: a valid Checkpoint
 * name (so never partial nor ".gc-") whose directory owns() accepts. */
static int committed(const char *pod_dir, const char *name, const char *owner, long long *created)
{
	char dir[PATH_MAX];
	if (!agent_crobj_is_subdomain(name) || gcr_image_is_partial(name) ||
	    snprintf(dir, sizeof(dir), "%s/%s", pod_dir, name) >= (int)sizeof(dir))
		return 0;
	return owns(dir, owner, created);
}

/* Takes pod_dir/name out of the images (rename to .gc-name), then deletes it, its manifest last:
 * a ".gc-" left by a crash still says whose it was (remove_leftovers). */
static int remove_image(const char *pod_dir, const char *name)
{
	char from[PATH_MAX], to[PATH_MAX], sub[PATH_MAX + 8];
	if (snprintf(from, sizeof(from), "%s/%s", pod_dir, name) >= (int)sizeof(from) ||
	    snprintf(to, sizeof(to), "%s/" GC_PREFIX "%s", pod_dir, name) >= (int)sizeof(to))
		return -ENAMETOOLONG;
	gcr_image_remove(to); /* an old one left by a crash */
	if (rename(from, to) < 0)
		return -errno;
	snprintf(sub, sizeof(sub), "%s/" GCR_IMAGE_CRIU_DIR, to);
	gcr_image_remove(sub);
	snprintf(sub, sizeof(sub), "%s/" GCR_IMAGE_GPU_DIR, to);
	gcr_image_remove(sub);
	gcr_image_remove(to);
	return 0;
}

/* Deletes ".gc-" leftovers of pod_dir: with owner, only those whose manifest names owner (and
 * empty ones, by rmdir, which two agents may both try harmlessly). */
static void remove_leftovers(const char *pod_dir, const char *owner)
{
	DIR *d = opendir(pod_dir);
	struct dirent *de;
	char p[PATH_MAX];
	long long created;
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (strncmp(de->d_name, GC_PREFIX, strlen(GC_PREFIX)) != 0 ||
		    snprintf(p, sizeof(p), "%s/%s", pod_dir, de->d_name) >= (int)sizeof(p))
			continue;
		if (owner == NULL || owns(p, owner, &created))
			gcr_image_remove(p);
		else
			(void)rmdir(p);
	}
	if (d != NULL)
		closedir(d);
}

struct entry {
	long long created;
	char name[AGENT_CROBJ_NAME_LEN];
};

static int older_first(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	if (x->created != y->created)
		return x->created < y->created ? -1 : 1;
	return strcmp(x->name, y->name);
}

int agent_images_prune(const char *pod_dir, int keep, const char *owner, struct gcr_err *err)
{
	if (keep < 1)
		return gcr_err_set(err, -EINVAL, "images to keep must be at least 1 (got %d)", keep);
	DIR *d = opendir(pod_dir);
	if (d == NULL)
		return gcr_err_set(err, -errno, "cannot read %s: %s", pod_dir, strerror(errno));
	struct entry *e = calloc(MAX_SCAN, sizeof(*e));
	if (e == NULL) {
		closedir(d);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	int n = 0, removed = 0;
	struct dirent *de;
	while (n < MAX_SCAN && (de = readdir(d)) != NULL) {
		long long created;
		if (committed(pod_dir, de->d_name, owner, &created)) {
			e[n].created = created;
			snprintf(e[n].name, sizeof(e[n].name), "%.253s", de->d_name); /* a subdomain: <= 253 */
			n++;
		}
	}
	closedir(d);
	qsort(e, (size_t)n, sizeof(*e), older_first);
	for (int i = 0; i < n - keep; i++)
		if (remove_image(pod_dir, e[i].name) == 0)
			removed++;
	free(e);
	return removed;
}

/* Calls fn(data, path, name) for each entry of dir that is a directory and a valid name by
 * valid(); stops at the first negative return. */
static int each_dir(const char *dir, int (*valid)(const char *), int (*fn)(void *, const char *, const char *),
		    void *data)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *de;
	char p[PATH_MAX];
	struct stat st;
	int rc = 0;
	while (rc >= 0 && (de = readdir(d)) != NULL) {
		if (!valid(de->d_name) || snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) >= (int)sizeof(p) ||
		    lstat(p, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		rc = fn(data, p, de->d_name);
	}
	closedir(d);
	return rc;
}

struct sweep {
	const char *owner;
	agent_images_exists_fn exists;
	void *data;
	const char *ns;
	int removed;
};

static int sweep_image(void *data, const char *path, const char *name)
{
	struct sweep *s = data;
	long long created;
	char pod_dir[PATH_MAX];
	snprintf(pod_dir, sizeof(pod_dir), "%s", path);
	char *slash = strrchr(pod_dir, '/');
	if (slash == NULL)
		return 0;
	*slash = '\0';
	/* Existence first: reading every manifest every sweep would cost more than the sweep. */
	if (s->exists(s->data, s->ns, name) != 0 || !committed(pod_dir, name, s->owner, &created))
		return 0;
	if (remove_image(pod_dir, name) == 0)
		s->removed++;
	return 0;
}

static int sweep_pod(void *data, const char *path, const char *name)
{
	struct sweep *s = data;
	(void)name;
	remove_leftovers(path, s->owner);
	each_dir(path, agent_crobj_is_subdomain, sweep_image, data);

	return 0;
}

static int sweep_ns(void *data, const char *path, const char *name)
{
	struct sweep *s = data;
	s->ns = name;
	each_dir(path, agent_crobj_is_subdomain, sweep_pod, data);

	return 0;
}

static int is_ns(const char *s)
{
	return agent_crobj_is_label(s);
}

int agent_images_sweep(const char *root, const char *owner, agent_images_exists_fn exists, void *data,
		       struct gcr_err *err)
{
	struct sweep s = { .owner = owner, .exists = exists, .data = data };
	int rc = each_dir(root, is_ns, sweep_ns, &s);
	if (rc < 0)
		return gcr_err_set(err, rc, "cannot read %s: %s", root, strerror(-rc));
	return s.removed;
}

/* ---- a pod's side of an image whose CPU side is the kubelet's ---- */

int agent_images_pod_path(pid_t pid, const char *uid, char *inside, size_t len, struct gcr_err *err)
{
	char sock[PATH_MAX];
	if (!agent_crobj_is_token(uid))
		return gcr_err_set(err, -EINVAL, "not a uid: %.80s", uid);
	if (gcr_procns_env(pid, GCR_SOCKET_DIR_ENV, sock, sizeof(sock), err) < 0)
		snprintf(sock, sizeof(sock), "%s", GCR_DEFAULT_SOCKET_DIR);
	if (sock[0] != '/')
		return gcr_err_set(err, -EINVAL, "pid %d's %s is not absolute: %.200s", (int)pid, GCR_SOCKET_DIR_ENV, sock);
	if ((size_t)snprintf(inside, len, "%s/image-%s", sock, uid) >= len)
		return gcr_err_set(err, -ENAMETOOLONG, "path too long");
	return 0;
}

int agent_images_pod_dir(pid_t pid, const char *uid, int *dfd, char *inside, size_t len, struct gcr_err *err)
{
	char sock[PATH_MAX], name[96];
	*dfd = -1;
	if (!agent_crobj_is_token(uid))
		return gcr_err_set(err, -EINVAL, "not a uid: %.80s", uid);
	if (gcr_procns_env(pid, GCR_SOCKET_DIR_ENV, sock, sizeof(sock), err) < 0)
		snprintf(sock, sizeof(sock), "%s", GCR_DEFAULT_SOCKET_DIR);
	if (sock[0] != '/')
		return gcr_err_set(err, -EINVAL, "pid %d's %s is not absolute: %.200s", (int)pid, GCR_SOCKET_DIR_ENV, sock);
	snprintf(name, sizeof(name), "image-%s", uid);
	if ((size_t)snprintf(inside, len, "%s/%s", sock, name) >= len)
		return gcr_err_set(err, -ENAMETOOLONG, "path too long");
	int pfd = gcr_procns_open_dir(pid, sock, err);
	if (pfd < 0)
		return pfd;
	int rc = 0;
	if (mkdirat(pfd, name, 0700) < 0)
		rc = gcr_err_set(err, -errno, "cannot create %s in pid %d's root: %s", inside, (int)pid, strerror(errno));
	else if ((*dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = gcr_err_set(err, -errno, "cannot open %s in pid %d's root: %s", inside, (int)pid, strerror(errno));
	close(pfd);
	return rc;
}

/* Copies the open file in (read from its start) to the open file out; the bytes, or -errno.
 * With sha, its SHA-256 of what was written. Neither file is left in the page cache
 * (gcr_image_behind: the agent's memory cgroup is charged for it). */
static long long copy_fd(int in, int out, const char *what, struct gcr_sha256 *sha, struct gcr_err *err)
{
	static const size_t buf_len = 1u << 20;
	char *buf = malloc(buf_len);
	long long total = 0;
	struct gcr_image_behind wb = { .in = in, .out = out };
	if (buf == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	for (;;) {
		ssize_t n = read(in, buf, buf_len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			total = gcr_err_set(err, -errno, "reading %s: %s", what, strerror(errno));
			break;
		}
		if (n == 0)
			break;
		if (sha != NULL)
			gcr_sha256_update(sha, buf, (size_t)n);
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(out, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				free(buf);
				return gcr_err_set(err, -errno, "writing %s: %s", what, strerror(errno));
			}
			off += w;
		}
		total += n;
		gcr_image_behind_step(&wb, (uint64_t)total);
	}
	free(buf);
	if (total >= 0 && fsync(out) < 0)
		total = gcr_err_set(err, -errno, "fsync of %s: %s", what, strerror(errno));
	if (total > 0)
		gcr_image_behind_end(&wb);
	return total;
}

long long agent_images_copy_dir(int src_dfd, int dst_dfd, const char *sub, struct gcr_err *err)
{
	return agent_images_copy_dir_checked(src_dfd, dst_dfd, sub, NULL, err);
}

long long agent_images_copy_dir_checked(int src_dfd, int dst_dfd, const char *sub, const struct gcr_image_manifest *m,
					struct gcr_err *err)
{
	int sfd = openat(src_dfd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0)
		return gcr_err_set(err, -errno, "cannot open %s/: %s", sub, strerror(errno));
	if (mkdirat(dst_dfd, sub, 0700) < 0) {
		int e = errno;
		close(sfd);
		return gcr_err_set(err, -e, "cannot create %s/: %s", sub, strerror(e));
	}
	int dfd = openat(dst_dfd, sub, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = dfd < 0 ? NULL : fdopendir(sfd);
	if (d == NULL) {
		int e = errno;
		close(sfd);
		if (dfd >= 0)
			close(dfd);
		return gcr_err_set(err, -e, "cannot open %s/: %s", sub, strerror(e));
	}
	long long total = 0;
	struct dirent *de;
	int files = 0;
	while (total >= 0 && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		char what[GCR_IMAGE_NAME_MAX + 64];
		snprintf(what, sizeof(what), "%s/%.200s", sub, de->d_name);
		if (++files > GCR_IMAGE_MAX_FILES) {
			total = gcr_err_set(err, -E2BIG, "more than %d files in %s/", GCR_IMAGE_MAX_FILES, sub);
			break;
		}
		int in = openat(sfd, de->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		struct stat st;
		if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode)) {
			total = gcr_err_set(err, in < 0 ? -errno : -EINVAL, "%s: %s", what,
					    in < 0 ? strerror(errno) : "not a regular file (refused)");
			if (in >= 0)
				close(in);
			break;
		}
		int out = openat(dfd, de->d_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (out < 0) {
			total = gcr_err_set(err, -errno, "cannot create %s: %s", what, strerror(errno));
			close(in);
			break;
		}
		const struct gcr_image_file *want = NULL;
		for (size_t k = 0; m != NULL && k < m->nfiles && want == NULL; k++)
			if (strcmp(m->files[k].path, what) == 0)
				want = &m->files[k];
		struct gcr_sha256 sha;
		gcr_sha256_init(&sha);
		long long n = m != NULL && (want == NULL || !want->has_sha)
				      ? gcr_err_set(err, -EIO, "%s is not in the signed manifest: refused", what)
				      : copy_fd(in, out, what, m != NULL ? &sha : NULL, err);
		close(in);
		close(out);
		if (n >= 0 && want != NULL) {
			uint8_t got[GCR_SHA256_LEN];
			gcr_sha256_final(&sha, got);
			if ((uint64_t)n != want->size || memcmp(got, want->sha, sizeof(got)) != 0)
				n = gcr_err_set(err, -EIO, "%s: SHA-256 does not match the signed manifest (changed): "
						"refused", what);
		}
		total = n < 0 ? n : total + n;
	}
	closedir(d); /* closes sfd */
	if (total >= 0 && fsync(dfd) < 0)
		total = gcr_err_set(err, -errno, "fsync of %s/: %s", sub, strerror(errno));
	close(dfd);
	return total;
}

/* Whether st is a file with holes: fewer bytes allocated than its size, by more than a little
 * (filesystems that keep a tiny file inline allocate none; a dense file never misses 64 KiB). */
static int sparse(const struct stat *st)
{
	return st->st_size > 65536 && (unsigned long long)st->st_blocks * 512 + 65536 < (unsigned long long)st->st_size;
}

/* Copies exactly len bytes of in to out; -EIO when in ends first or holds more. */
static long long copy_exact(int in, int out, unsigned long long len, const char *what, struct gcr_err *err)
{
	static const size_t buf_len = 1u << 20;
	char *buf = malloc(buf_len);
	if (buf == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	unsigned long long done = 0;
	long long rc = 0;
	struct gcr_image_behind wb = { .in = in, .out = out };
	while (rc == 0 && done <= len) {
		size_t want = len - done < buf_len ? (size_t)(len - done) : buf_len;
		ssize_t n = read(in, buf, want > 0 ? want : 1); /* at the end: one byte more must not come */
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			rc = gcr_err_set(err, -errno, "reading %s: %s", what, strerror(errno));
		else if (n == 0 && done < len)
			rc = gcr_err_set(err, -EIO, "%s ended at %llu of its %llu bytes (changed while copied): refused", what,
					 done, len);
		else if (n == 0)
			break;
		else if (done == len)
			rc = gcr_err_set(err, -EIO, "%s grew past its %llu bytes while copied: refused", what, len);
		for (ssize_t off = 0; rc == 0 && off < n;) {
			ssize_t w = write(out, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				rc = gcr_err_set(err, -errno, "writing %s: %s", what, strerror(errno));
			else
				off += w;
		}
		if (rc == 0) {
			done += (unsigned long long)n;
			gcr_image_behind_step(&wb, done);
		}
	}
	free(buf);
	if (rc == 0 && fsync(out) < 0)
		rc = gcr_err_set(err, -errno, "fsync of %s: %s", what, strerror(errno));
	if (rc == 0)
		gcr_image_behind_end(&wb);
	return rc < 0 ? rc : (long long)done;
}

/* The table's allocation whose data file is gpu/<name>; NULL: none. */
static const struct gcr_image_alloc *table_file(const struct gcr_image_table *t, const char *name)
{
	for (size_t i = 0; i < t->n; i++)
		if (strcmp(t->a[i].file + strlen(GCR_IMAGE_GPU_DIR "/"), name) == 0)
			return &t->a[i];
	return NULL;
}

long long agent_images_copy_gpu(int src_dfd, int dst_dfd, unsigned long long max_bytes, struct gcr_image_table *t,
				struct gcr_err *err)
{
	const char *table_name = GCR_IMAGE_TABLE + strlen(GCR_IMAGE_GPU_DIR "/");
	memset(t, 0, sizeof(*t));
	int sfd = openat(src_dfd, GCR_IMAGE_GPU_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (sfd < 0)
		return gcr_err_set(err, -errno, "cannot open %s/: %s", GCR_IMAGE_GPU_DIR, strerror(errno));
	char *tbuf = NULL;
	size_t tlen = 0;
	long long total = 0;
	int tfd = openat(sfd, table_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (tfd < 0)
		total = gcr_err_set(err, -errno, "cannot open %s: %s", GCR_IMAGE_TABLE, strerror(errno));
	else if ((total = gcr_image_read_fd(tfd, GCR_IMAGE_TABLE, GCR_IMAGE_MAX_TABLE, &tbuf, &tlen, err)) == 0 &&
		 (total = gcr_image_table_parse(tbuf, tlen, t, err)) < 0)
		gcr_err_wrap(err, "%s", GCR_IMAGE_TABLE);
	if (tfd >= 0)
		close(tfd);
	/* What the table makes the agent write, before anything is: its files under gpu/ itself, their
	 * data within the bound. */
	unsigned long long need = tlen;
	for (size_t i = 0; total == 0 && i < t->n; i++) {
		if (strchr(t->a[i].file + strlen(GCR_IMAGE_GPU_DIR "/"), '/') != NULL ||
		    strcmp(t->a[i].file + strlen(GCR_IMAGE_GPU_DIR "/"), table_name) == 0)
			total = gcr_err_set(err, -EINVAL, "%s names %s: not a data file of gpu/ (refused)", GCR_IMAGE_TABLE,
					    t->a[i].file);
		need += gcr_image_alloc_need(&t->a[i]);
	}
	if (total == 0 && need > max_bytes)
		total = gcr_err_set(err, -EFBIG, "the GPU data files come to %llu MiB, more than the %llu MiB the pod may "
				    "have written (what its process held on the GPU, and its ephemeral-storage limit): "
				    "refused", need >> 20, max_bytes >> 20);
	/* Every entry checked before the copy starts. */
	DIR *d = total == 0 ? fdopendir(dup(sfd)) : NULL;
	if (total == 0 && d == NULL)
		total = gcr_err_set(err, -errno, "cannot read %s/: %s", GCR_IMAGE_GPU_DIR, strerror(errno));
	struct dirent *de;
	while (total == 0 && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 || strcmp(de->d_name, table_name) == 0)
			continue;
		const struct gcr_image_alloc *a = table_file(t, de->d_name);
		struct stat st;
		if (a == NULL) {
			total = gcr_err_set(err, -EINVAL, "%s/%.200s is not in %s: refused", GCR_IMAGE_GPU_DIR, de->d_name,
					    GCR_IMAGE_TABLE);
		} else if (fstatat(sfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode)) {
			total = gcr_err_set(err, -EINVAL, "%s: not a regular file (refused)", a->file);
		} else if ((unsigned long long)st.st_size != gcr_image_alloc_need(a)) {
			total = gcr_err_set(err, -EINVAL, "%s has %lld bytes, its chunks need %llu: refused", a->file,
					    (long long)st.st_size, (unsigned long long)gcr_image_alloc_need(a));
		} else if (sparse(&st)) {
			total = gcr_err_set(err, -EINVAL, "%s has holes (%lld bytes in %llu allocated): a sparse file is "
					    "refused", a->file, (long long)st.st_size,
					    (unsigned long long)st.st_blocks * 512);
		}
	}
	if (d != NULL)
		closedir(d);
	for (size_t i = 0; total == 0 && i < t->n; i++) {
		struct stat st;
		if (gcr_image_alloc_need(&t->a[i]) > 0 &&
		    fstatat(sfd, t->a[i].file + strlen(GCR_IMAGE_GPU_DIR "/"), &st, AT_SYMLINK_NOFOLLOW) < 0)
			total = gcr_err_set(err, -EINVAL, "%s is missing: refused", t->a[i].file);
	}
	int dfd = -1;
	if (total == 0 && mkdirat(dst_dfd, GCR_IMAGE_GPU_DIR, 0700) < 0)
		total = gcr_err_set(err, -errno, "cannot create %s/: %s", GCR_IMAGE_GPU_DIR, strerror(errno));
	if (total == 0 && (dfd = openat(dst_dfd, GCR_IMAGE_GPU_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		total = gcr_err_set(err, -errno, "cannot open %s/: %s", GCR_IMAGE_GPU_DIR, strerror(errno));
	/* The copy: each file by its table's name, exactly its size; the table from the bytes parsed. */
	for (size_t i = 0; total >= 0 && i < t->n; i++) {
		const struct gcr_image_alloc *a = &t->a[i];
		const char *name = a->file + strlen(GCR_IMAGE_GPU_DIR "/");
		int in = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		if (in < 0 && errno == ENOENT && gcr_image_alloc_need(a) == 0)
			continue; /* all zero: no file needed */
		int out = in < 0 ? -1 : openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		struct stat st;
		long long n;
		if (in < 0 || out < 0)
			n = gcr_err_set(err, -errno, "%s: %s", a->file, strerror(errno));
		else if (fstat(in, &st) < 0 || !S_ISREG(st.st_mode) || sparse(&st))
			n = gcr_err_set(err, -EINVAL, "%s changed while copied: refused", a->file);
		else
			n = copy_exact(in, out, gcr_image_alloc_need(a), a->file, err);
		if (in >= 0)
			close(in);
		if (out >= 0)
			close(out);
		total = n < 0 ? n : total + n;
	}
	if (total >= 0) {
		int out = openat(dfd, table_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		long long n = out < 0 ? gcr_err_set(err, -errno, "cannot create %s: %s", GCR_IMAGE_TABLE, strerror(errno)) : 0;
		for (size_t off = 0; n == 0 && off < tlen;) {
			ssize_t w = write(out, tbuf + off, tlen - off);
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				n = gcr_err_set(err, -errno, "writing %s: %s", GCR_IMAGE_TABLE, strerror(errno));
			else
				off += (size_t)w;
		}
		if (n == 0 && fsync(out) < 0)
			n = gcr_err_set(err, -errno, "fsync of %s: %s", GCR_IMAGE_TABLE, strerror(errno));
		if (out >= 0)
			close(out);
		total = n < 0 ? n : total + (long long)tlen;
	}
	if (total >= 0 && fsync(dfd) < 0)
		total = gcr_err_set(err, -errno, "fsync of %s/: %s", GCR_IMAGE_GPU_DIR, strerror(errno));
	if (dfd >= 0)
		close(dfd);
	close(sfd);
	free(tbuf);
	if (total < 0)
		gcr_image_table_clear(t);
	return total;
}

long long agent_images_copy_file(const char *src, const char *dst, struct gcr_err *err)
{
	int in = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (in < 0 || fstat(in, &st) < 0 || !S_ISREG(st.st_mode)) {
		int e = in < 0 ? errno : EINVAL;
		if (in >= 0)
			close(in);
		return gcr_err_set(err, -e, "%s: %s", src, in < 0 ? strerror(e) : "not a regular file");
	}
	int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0) {
		int e = errno;
		close(in);
		return gcr_err_set(err, -e, "cannot create %s: %s", dst, strerror(e));
	}
	long long n = copy_fd(in, out, src, NULL, err);
	close(in);
	close(out);
	return n;
}

/* Removes every entry of the open directory fd (depth levels left), never following a link. */
static void clear_fd(int fd, int depth)
{
	int dup_fd = dup(fd);
	DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
	struct dirent *de;
	if (d == NULL) {
		if (dup_fd >= 0)
			close(dup_fd);
		return;
	}
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (unlinkat(fd, de->d_name, 0) == 0 || errno != EISDIR)
			continue;
		if (depth > 0) {
			int sfd = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sfd >= 0) {
				clear_fd(sfd, depth - 1);
				close(sfd);
			}
		}
		(void)unlinkat(fd, de->d_name, AT_REMOVEDIR);
	}
	closedir(d);
}

void agent_images_remove_at(int dfd, const char *name)
{
	if (unlinkat(dfd, name, 0) == 0 || errno != EISDIR)
		return; /* a file, a link, or nothing */
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0) {
		clear_fd(fd, AGENT_IMAGES_MAX_DEPTH);
		close(fd);
	}
	(void)unlinkat(dfd, name, AT_REMOVEDIR);
}

int agent_images_pod_open(pid_t pid, const char *dir, struct gcr_err *err)
{
	char parent[PATH_MAX];
	if (dir == NULL || dir[0] != '/' || snprintf(parent, sizeof(parent), "%s", dir) >= (int)sizeof(parent))
		return gcr_err_set(err, -EINVAL, "not an absolute path: %.200s", dir ? dir : "");
	char *slash = strrchr(parent, '/');
	*slash = '\0';
	int pfd = gcr_procns_open_dir(pid, parent[0] ? parent : "/", err);
	if (pfd < 0)
		return pfd;
	int fd = openat(pfd, slash + 1, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int e = errno;
	close(pfd);
	return fd >= 0 ? fd : gcr_err_set(err, -e, "cannot open %s in pid %d's root: %s", dir, (int)pid, strerror(e));
}

void agent_images_pod_remove(pid_t pid, const char *dir)
{
	char parent[PATH_MAX];
	struct gcr_err err;
	if (dir == NULL || dir[0] != '/' || snprintf(parent, sizeof(parent), "%s", dir) >= (int)sizeof(parent))
		return;
	char *slash = strrchr(parent, '/');
	*slash = '\0';
	int pfd = gcr_procns_open_dir(pid, parent[0] ? parent : "/", &err);
	if (pfd >= 0) {
		agent_images_remove_at(pfd, slash + 1);
		close(pfd);
	}
}

/* ---- leftovers in directories a pod can write ---- */

struct allocs {
	agent_images_owned_fn owned;
	void *data;
	long long now;
	int removed;
	int socket_dirs; /* the allocations' socket directories: only image-* entries are looked at */
};

/* Empties one allocation's directory path of what the sweep may remove. */
static int clear_alloc(void *arg, const char *path, const char *name)
{
	struct allocs *a = arg;
	(void)name;
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int dfd = fd < 0 ? -1 : dup(fd);
	DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
	struct dirent *de;
	char full[PATH_MAX];
	int seen = 0;
	while (d != NULL && (de = readdir(d)) != NULL && seen++ < MAX_SCAN) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (a->socket_dirs && strncmp(de->d_name, "image-", 6) != 0)
			continue; /* the shims' sockets, and whatever else the pod keeps there */
		if (snprintf(full, sizeof(full), "%s/%s", path, de->d_name) >= (int)sizeof(full) ||
		    (a->owned != NULL && a->owned(a->data, full)))
			continue;
		/* A socket directory's image-<uid>: also a Restore's copy in flight (no record names it),
		 * so only one older than any operation's bound is a leftover. In an image directory, only
		 * what is older than the sweep itself: an Image recorded after its list was read is not
		 * in it. */
		struct stat st;
		long long min_age = a->socket_dirs ? AGENT_IMAGES_PARTIAL_MAX_AGE_S : AGENT_IMAGES_ALLOC_MIN_AGE_S;
		/* ctime: a pod can set a file's mtime to the future, not its ctime. */
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || a->now - (long long)st.st_ctime < min_age)
			continue;
		agent_images_remove_at(fd, de->d_name);
		a->removed++;
	}
	if (d != NULL)
		closedir(d);
	else if (dfd >= 0)
		close(dfd);
	if (fd >= 0)
		close(fd);
	return 0;
}

static int is_alloc_id(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return 0;
	return 1;
}

int agent_images_sweep_allocs(const char *root, const char *alloc_root, agent_images_owned_fn owned, void *data,
			      long long now)
{
	struct allocs a = { .owned = owned, .data = data, .now = now };
	char dir[PATH_MAX];
	if (root != NULL && snprintf(dir, sizeof(dir), "%s/.alloc", root) < (int)sizeof(dir))
		(void)each_dir(dir, is_alloc_id, clear_alloc, &a);
	a.socket_dirs = 1;
	if (alloc_root != NULL)
		(void)each_dir(alloc_root, is_alloc_id, clear_alloc, &a);
	return a.removed;
}

struct partials {
	agent_images_owned_fn owned;
	void *data;
	long long now;
	int removed;
};

static int sweep_pod_partials(void *arg, const char *path, const char *name)
{
	struct partials *p = arg;
	(void)name;
	DIR *d = opendir(path);
	struct dirent *de;
	char full[PATH_MAX];
	struct stat st;
	int seen = 0;
	while (d != NULL && (de = readdir(d)) != NULL && seen++ < MAX_SCAN) {
		if (strstr(de->d_name, GCR_IMAGE_PARTIAL) == NULL ||
		    snprintf(full, sizeof(full), "%s/%s", path, de->d_name) >= (int)sizeof(full) ||
		    lstat(full, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		if (p->now - (long long)st.st_ctime < AGENT_IMAGES_PARTIAL_MAX_AGE_S ||
		    (p->owned != NULL && p->owned(p->data, full)))
			continue;
		gcr_image_remove(full);
		p->removed++;
	}
	if (d != NULL)
		closedir(d);
	return 0;
}

static int sweep_ns_partials(void *arg, const char *path, const char *name)
{
	(void)name;
	each_dir(path, agent_crobj_is_subdomain, sweep_pod_partials, arg);
	return 0;
}

int agent_images_sweep_partials(const char *root, agent_images_owned_fn owned, void *data, long long now)
{
	struct partials p = { .owned = owned, .data = data, .now = now };
	(void)each_dir(root, is_ns, sweep_ns_partials, &p);
	return p.removed;
}
