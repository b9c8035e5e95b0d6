/* gcr_image: the image directory (see gcr_image.h): parse, write, commit, verify. Every
 * field read from disk is checked here; the shim and gcrctl never read a manifest any other
 * way. */
#include "gcr_image.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gcr_jsonbudget.h"

#define IO_BUF (1u << 20) /* bytes per read while hashing */
#define VERIFY_THREADS 16

/* ---- small helpers ---- */

static int sha_from_hex(const char *s, uint8_t out[GCR_SHA256_LEN])
{
	if (s == NULL || strlen(s) != 2 * GCR_SHA256_LEN)
		return -1;
	for (size_t i = 0; i < GCR_SHA256_LEN; i++) {
		int v = 0;
		for (int k = 0; k < 2; k++) {
			char c = s[2 * i + (size_t)k];
			int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
			if (d < 0)
				return -1;
			v = v * 16 + d;
		}
		out[i] = (uint8_t)v;
	}
	return 0;
}

/* A relative path inside the image: no leading '/', no "..", no empty or "." parts. */
static int safe_rel(const char *s)
{
	if (s == NULL || s[0] == '\0' || s[0] == '/' || strlen(s) >= GCR_IMAGE_NAME_MAX)
		return 0;
	const char *p = s;
	while (*p) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		p += n;
		if (*p == '/')
			p++;
	}
	return 1;
}

static int get_u64(json_t *o, const char *k, uint64_t *v)
{
	json_t *j = json_object_get(o, k);
	if (!json_is_integer(j) || json_integer_value(j) < 0)
		return -1;
	*v = (uint64_t)json_integer_value(j);
	return 0;
}

static int get_str(json_t *o, const char *k, char *out, size_t len)
{
	const char *s = json_string_value(json_object_get(o, k));
	if (s == NULL || strlen(s) >= len)
		return -1;
	memcpy(out, s, strlen(s) + 1);
	return 0;
}

int gcr_image_read_fd(int fd, const char *what, size_t max, char **buf, size_t *len, struct gcr_err *err)
{
	*buf = NULL;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		return gcr_err_set(err, -EBADMSG, "%s is not a regular file", what);
	if ((uint64_t)st.st_size > max)
		return gcr_err_set(err, -EFBIG, "%s has %lld bytes, more than the %zu read at most", what,
				   (long long)st.st_size, max);
	char *b = malloc((size_t)st.st_size + 1);
	size_t n = 0;
	int rc = b ? 0 : gcr_err_set(err, -ENOMEM, "out of memory reading %s", what);
	while (rc == 0 && n < (size_t)st.st_size) {
		ssize_t r = read(fd, b + n, (size_t)st.st_size - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			rc = gcr_err_set(err, -EIO, "reading %s: %s", what, r < 0 ? strerror(errno) : "short file");
		else
			n += (size_t)r;
	}
	if (rc < 0) {
		free(b);
		return rc;
	}
	b[n] = '\0';
	*buf = b;
	*len = n;
	return 0;
}

int gcr_image_read_file(const char *path, size_t max, char **buf, size_t *len, struct gcr_err *err)
{
	*buf = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
	int rc = gcr_image_read_fd(fd, path, max, buf, len, err);
	close(fd);
	return rc;
}

int gcr_image_pwrite(int fd, int dfd, const void *buf, size_t len, uint64_t off)
{
	int use = dfd >= 0 && (off | len) % GCR_IMAGE_DIRECT_ALIGN == 0 ? dfd : fd;
	size_t done = 0;
	while (done < len) {
		ssize_t k = pwrite(use, (const char *)buf + done, len - done, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EINVAL && use == dfd) {
			use = fd; /* took O_DIRECT at open, not for this write */
			continue;
		}
		if (k <= 0)
			return k < 0 ? -errno : -ENOSPC;
		done += (size_t)k;
	}
	return 0;
}

int gcr_image_pread(int fd, void *buf, size_t len, uint64_t off)
{
	size_t done = 0;
	while (done < len) {
		ssize_t k = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		done += (size_t)k;
	}
	return 0;
}

void gcr_image_test_hold(const char *env)
{
	const char *fifo = getenv(env);
	if (fifo == NULL || fifo[0] == '\0')
		return;
	int fd = open(fifo, O_RDONLY | O_CLOEXEC);
	char b[16];
	ssize_t n;
	/* Until EOF: a stale errno of EINTR must not turn EOF into a spin. */
	while (fd >= 0 && ((n = read(fd, b, sizeof(b))) > 0 || (n < 0 && errno == EINTR)))
		;
	if (fd >= 0)
		close(fd);
}

/* ---- the table ---- */

void gcr_image_table_clear(struct gcr_image_table *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->n; i++)
		free(t->a[i].chunks);
	free(t->a);
	t->a = NULL;
	t->n = 0;
}

static int alloc_from_json(json_t *o, size_t idx, struct gcr_image_alloc *a, struct gcr_err *err)
{
	uint64_t slot, gen;
	json_t *chunks = json_object_get(o, "chunks");
	if (!json_is_object(o) || get_u64(o, "address", &a->address) < 0 || get_u64(o, "size", &a->size) < 0 ||
	    get_u64(o, "slot", &slot) < 0 || get_u64(o, "gen", &gen) < 0 || slot > UINT32_MAX || gen > UINT32_MAX ||
	    get_str(o, "file", a->file, sizeof(a->file)) < 0 || !json_is_array(chunks))
		return gcr_err_set(err, -EBADMSG, "allocation %zu: missing or malformed address, size, slot, gen, file "
				   "or chunks", idx);
	a->slot = (uint32_t)slot;
	a->gen = (uint32_t)gen;
	if (!safe_rel(a->file) || strncmp(a->file, GCR_IMAGE_GPU_DIR "/", 4) != 0)
		return gcr_err_set(err, -EBADMSG, "allocation %zu: file \"%s\" is not under gpu/", idx, a->file);
	size_t n = json_array_size(chunks);
	if (a->size == 0 || a->size > (1ull << 50) || n != (a->size + GCR_IMAGE_CHUNK - 1) / GCR_IMAGE_CHUNK)
		return gcr_err_set(err, -EBADMSG, "allocation %zu: %zu chunks do not cover %" PRIu64 " bytes", idx, n,
				   a->size);
	a->chunks = calloc(n + 1, sizeof(*a->chunks));
	if (a->chunks == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for %zu chunks", n);
	a->nchunks = n;
	uint64_t next_off = 0;
	for (size_t c = 0; c < n; c++) {
		json_t *j = json_array_get(chunks, c);
		struct gcr_image_chunk *ch = &a->chunks[c];
		uint64_t want = a->size - c * GCR_IMAGE_CHUNK < GCR_IMAGE_CHUNK ? a->size - c * GCR_IMAGE_CHUNK
										  : GCR_IMAGE_CHUNK;
		ch->len = (uint32_t)want;
		if (json_is_string(j) && strcmp(json_string_value(j), "zero") == 0) {
			ch->zero = 1;
			continue;
		}
		uint64_t off, len;
		char hex[GCR_CRC32C_HEX];
		if (!json_is_object(j) || get_u64(j, "off", &off) < 0 || get_u64(j, "len", &len) < 0 ||
		    get_str(j, "crc32c", hex, sizeof(hex)) < 0 || gcr_crc32c_from_hex(hex, &ch->crc) < 0)
			return gcr_err_set(err, -EBADMSG, "allocation %zu chunk %zu: neither \"zero\" nor "
					   "{off, len, crc32c}", idx, c);
		/* Written in order, back to back: anything else is not an image we wrote. */
		if (len != want || off != next_off)
			return gcr_err_set(err, -EBADMSG, "allocation %zu chunk %zu: offset %" PRIu64 " length %" PRIu64
					   " (expected %" PRIu64 ", %" PRIu64 ")", idx, c, off, len, next_off, want);
		ch->off = off;
		next_off += len;
	}
	return 0;
}

/* Orders allocations by file name, or by record (qsort over pointers). */
static int by_file(const void *x, const void *y)
{
	return strcmp((*(const struct gcr_image_alloc *const *)x)->file, (*(const struct gcr_image_alloc *const *)y)->file);
}

static int by_record(const void *x, const void *y)
{
	const struct gcr_image_alloc *a = *(const struct gcr_image_alloc *const *)x;
	const struct gcr_image_alloc *b = *(const struct gcr_image_alloc *const *)y;
	if (a->slot != b->slot)
		return a->slot < b->slot ? -1 : 1;
	return a->gen < b->gen ? -1 : a->gen > b->gen;
}

/* Whether two allocations share a file or a record: sorted, so n log n (a table of 65,536
 * allocations pairwise took seconds of the agent's time). */
static int shared_file_or_record(const struct gcr_image_table *t, struct gcr_err *err)
{
	if (t->n < 2)
		return 0;
	const struct gcr_image_alloc **v = malloc(t->n * sizeof(*v));
	if (v == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for %zu allocations", t->n);
	int rc = 0;
	for (int pass = 0; pass < 2 && rc == 0; pass++) {
		for (size_t i = 0; i < t->n; i++)
			v[i] = &t->a[i];
		qsort(v, t->n, sizeof(*v), pass == 0 ? by_file : by_record);
		for (size_t i = 1; i < t->n && rc == 0; i++)
			if ((pass == 0 ? by_file : by_record)(&v[i - 1], &v[i]) == 0)
				rc = gcr_err_set(err, -EBADMSG, "allocations %zu and %zu share a %s", (size_t)(v[i - 1] - t->a),
						 (size_t)(v[i] - t->a), pass == 0 ? "file" : "record");
	}
	free(v);
	return rc;
}

int gcr_image_table_from_json(json_t *allocs, struct gcr_image_table *t, struct gcr_err *err)
{
	memset(t, 0, sizeof(*t));
	if (!json_is_array(allocs))
		return gcr_err_set(err, -EBADMSG, "\"allocs\" is not an array");
	size_t n = json_array_size(allocs);
	if (n > GCR_IMAGE_MAX_FILES)
		return gcr_err_set(err, -EBADMSG, "%zu allocations: too many", n);
	t->a = calloc(n + 1, sizeof(*t->a));
	if (t->a == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for %zu allocations", n);
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		rc = alloc_from_json(json_array_get(allocs, i), i, &t->a[i], err);
		t->n = i + 1;
	}
	if (rc == 0)
		rc = shared_file_or_record(t, err);
	if (rc < 0)
		gcr_image_table_clear(t);
	return rc;
}

int gcr_image_table_parse(const char *buf, size_t len, struct gcr_image_table *t, struct gcr_err *err)
{
	memset(t, 0, sizeof(*t));
	if (len > GCR_IMAGE_MAX_TABLE)
		return gcr_err_set(err, -EFBIG, "the table has %zu bytes, more than %llu (at most about 110,000 chunks of "
				   "GPU data per process)", len, GCR_IMAGE_MAX_TABLE);
	json_t *root = gcr_jsonbudget_loadb(buf, len, JSON_REJECT_DUPLICATES, GCR_IMAGE_PARSE_BUDGET, err);
	if (root == NULL)
		return gcr_err_wrap(err, "the table");
	int rc = gcr_image_table_from_json(json_object_get(root, "allocs"), t, err);
	json_decref(root);
	return rc;
}

uint64_t gcr_image_alloc_need(const struct gcr_image_alloc *a)
{
	uint64_t need = 0;
	for (size_t c = 0; c < a->nchunks; c++)
		if (!a->chunks[c].zero)
			need = a->chunks[c].off + a->chunks[c].len;
	return need;
}

json_t *gcr_image_table_to_json(const struct gcr_image_table *t)
{
	json_t *arr = json_array();
	for (size_t i = 0; arr != NULL && i < t->n; i++) {
		const struct gcr_image_alloc *a = &t->a[i];
		json_t *ch = json_array();
		for (size_t c = 0; ch != NULL && c < a->nchunks; c++) {
			const struct gcr_image_chunk *k = &a->chunks[c];
			char hex[GCR_CRC32C_HEX];
			gcr_crc32c_to_hex(k->crc, hex);
			json_array_append_new(ch, k->zero ? json_string("zero")
							  : json_pack("{s:I, s:I, s:s}", "off", (json_int_t)k->off, "len",
								      (json_int_t)k->len, "crc32c", hex));
		}
		json_t *o = json_pack("{s:I, s:I, s:I, s:I, s:s, s:o}", "address", (json_int_t)a->address, "size",
				      (json_int_t)a->size, "slot", (json_int_t)a->slot, "gen", (json_int_t)a->gen,
				      "file", a->file, "chunks", ch);
		if (o == NULL || json_array_append_new(arr, o) < 0) {
			json_decref(arr);
			return NULL;
		}
	}
	return arr;
}

static const struct gcr_image_alloc *table_find(const struct gcr_image_table *t, const char *file)
{
	for (size_t i = 0; t != NULL && i < t->n; i++)
		if (strcmp(t->a[i].file, file) == 0)
			return &t->a[i];
	return NULL;
}

/* ---- the manifest ---- */

void gcr_image_manifest_clear(struct gcr_image_manifest *m)
{
	if (m == NULL)
		return;
	free(m->files);
	gcr_image_table_clear(&m->table);
	memset(m, 0, sizeof(*m));
}

int gcr_image_manifest_parse(const char *buf, size_t len, struct gcr_image_manifest *m, struct gcr_err *err)
{
	return gcr_image_manifest_parse_keyed(buf, len, NULL, m, err);
}

int gcr_image_manifest_parse_keyed(const char *buf, size_t len, const struct gcr_imagemac_keys *keys,
				   struct gcr_image_manifest *m, struct gcr_err *err)
{
	memset(m, 0, sizeof(*m));
	if (len > GCR_IMAGE_MAX_JSON)
		return gcr_err_set(err, -EFBIG, "manifest has %zu bytes, more than %llu", len, GCR_IMAGE_MAX_JSON);
	json_t *root = gcr_jsonbudget_loadb(buf, len, JSON_REJECT_DUPLICATES, GCR_IMAGE_PARSE_BUDGET, err);
	if (root == NULL)
		return gcr_err_wrap(err, "manifest");
	/* The MAC first: nothing of a manifest someone else wrote is taken before it. */
	int rc = keys != NULL && json_is_object(root) ? gcr_imagemac_check(root, keys, err) : 0;
	if (rc < 0) {
		json_decref(root);
		return rc;
	}
	uint64_t format = 0, created = 0, pid = 0;
	json_t *gpu = json_object_get(root, "gpu"), *files = json_object_get(root, "files");
	if (!json_is_object(root) || get_u64(root, "format", &format) < 0)
		rc = gcr_err_set(err, -EBADMSG, "manifest has no \"format\"");
	else if ((m->format = format > 1000000 ? -1 : (int)format) != GCR_IMAGE_FORMAT)
		rc = gcr_err_set(err, -ENOTSUP, "image format %" PRIu64 ", this gcr reads format %d", format,
				 GCR_IMAGE_FORMAT);
	else if (get_str(root, "gcr_version", m->gcr_version, sizeof(m->gcr_version)) < 0 ||
		 get_str(root, "shim_version", m->env.shim_version, sizeof(m->env.shim_version)) < 0 ||
		 get_u64(root, "created", &created) < 0 || get_u64(root, "pid", &pid) < 0 || pid == 0 ||
		 pid > 4194304 || get_str(root, "socket", m->socket, sizeof(m->socket)) < 0 || !json_is_object(gpu) ||
		 get_str(gpu, "vendor", m->env.gpu_vendor, sizeof(m->env.gpu_vendor)) < 0 ||
		 get_str(gpu, "model", m->env.gpu_model, sizeof(m->env.gpu_model)) < 0 ||
		 get_str(gpu, "driver", m->env.driver, sizeof(m->env.driver)) < 0 || !json_is_array(files))
		rc = gcr_err_set(err, -EBADMSG, "manifest lacks or mistypes gcr_version, shim_version, created, pid, "
				 "socket, gpu {vendor, model, driver} or files");
	if (rc == 0) {
		/* Absent: an image of GCR's (the field came with the driver's baseline). */
		if (json_object_get(root, "mode") == NULL)
			snprintf(m->mode, sizeof(m->mode), "%s", GCR_IMAGE_MODE_GCR);
		else if (get_str(root, "mode", m->mode, sizeof(m->mode)) < 0)
			m->mode[0] = '\0';
		if (strcmp(m->mode, GCR_IMAGE_MODE_GCR) != 0 && strcmp(m->mode, GCR_IMAGE_MODE_DRIVER) != 0 &&
		    strcmp(m->mode, GCR_IMAGE_MODE_RUNTIME) != 0)
			rc = gcr_err_set(err, -EBADMSG, "manifest \"mode\" is neither \"gcr\", \"driver\" nor \"runtime\"");
		/* Optional: absent in images written outside Kubernetes and before the field. */
		if (rc == 0 && json_object_get(root, "node") != NULL &&
		    (get_str(root, "node", m->node, sizeof(m->node)) < 0 || m->node[0] == '\0'))
			rc = gcr_err_set(err, -EBADMSG, "manifest \"node\" is not a name of at most %d characters",
					 GCR_IMAGE_NODE_MAX - 1);
		if (rc == 0 && json_object_get(root, "container") != NULL &&
		    (get_str(root, "container", m->container, sizeof(m->container)) < 0 || m->container[0] == '\0'))
			rc = gcr_err_set(err, -EBADMSG, "manifest \"container\" is not a name of at most %d characters",
					 GCR_IMAGE_CONTAINER_MAX - 1);
	}
	if (rc == 0) {
		m->created = (long long)created;
		m->pid = (pid_t)pid;
		m->nfiles = json_array_size(files);
		if (m->nfiles > GCR_IMAGE_MAX_FILES)
			rc = gcr_err_set(err, -EBADMSG, "manifest lists %zu files: too many", m->nfiles);
		else if ((m->files = calloc(m->nfiles + 1, sizeof(*m->files))) == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of memory for %zu files", m->nfiles);
	}
	for (size_t i = 0; rc == 0 && i < m->nfiles; i++) {
		json_t *f = json_array_get(files, i);
		struct gcr_image_file *fi = &m->files[i];
		char hex[GCR_CRC32C_HEX];
		json_t *crc = json_is_object(f) ? json_object_get(f, "crc32c") : NULL;
		json_t *sha = json_is_object(f) ? json_object_get(f, "sha256") : NULL;
		fi->has_crc = crc != NULL;
		fi->has_sha = sha != NULL;
		if (!json_is_object(f) || get_str(f, "path", fi->path, sizeof(fi->path)) < 0 || !safe_rel(fi->path) ||
		    get_u64(f, "size", &fi->size) < 0 ||
		    (crc != NULL && (get_str(f, "crc32c", hex, sizeof(hex)) < 0 || gcr_crc32c_from_hex(hex, &fi->crc) < 0)))
			rc = gcr_err_set(err, -EBADMSG, "manifest file entry %zu: needs a relative path, size and crc32c", i);
		else if (sha != NULL && sha_from_hex(json_string_value(sha), fi->sha) < 0)
			rc = gcr_err_set(err, -EBADMSG, "manifest file entry %zu: sha256 is not 64 hex digits", i);
		else if (keys != NULL && sha == NULL)
			rc = gcr_err_set(err, -EBADMSG, "signed manifest: file %s has no sha256", fi->path);
		for (size_t k = 0; rc == 0 && k < i; k++)
			if (strcmp(m->files[k].path, fi->path) == 0)
				rc = gcr_err_set(err, -EBADMSG, "manifest lists %s twice", fi->path);
	}
	if (rc == 0)
		rc = gcr_image_table_from_json(json_object_get(root, "allocs"), &m->table, err);
	/* Only an allocation's data file goes without a whole-file checksum. */
	for (size_t i = 0; rc == 0 && i < m->nfiles; i++)
		if (!m->files[i].has_crc && table_find(&m->table, m->files[i].path) == NULL)
			rc = gcr_err_set(err, -EBADMSG, "manifest file %s has no crc32c and is no allocation's data file",
					 m->files[i].path);
	json_decref(root);
	if (rc < 0)
		gcr_image_manifest_clear(m);
	else
		m->signed_ok = keys != NULL;
	return rc;
}

#define BEHIND_WINDOW (32ull << 20)

/* [off, off + len) of both files on disk and out of the page cache (len 0: to the end). */
static void behind_drop(const struct gcr_image_behind *b, uint64_t off, uint64_t len)
{
	if (b->out >= 0) {
		(void)sync_file_range(b->out, (off_t)off, (off_t)len,
				      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
		(void)posix_fadvise(b->out, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
	}
	(void)posix_fadvise(b->in, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
}

void gcr_image_behind_step(struct gcr_image_behind *b, uint64_t total)
{
	if (total - b->started < BEHIND_WINDOW)
		return;
	if (b->out >= 0)
		(void)sync_file_range(b->out, (off_t)b->started, (off_t)(total - b->started), SYNC_FILE_RANGE_WRITE);
	if (b->started >= BEHIND_WINDOW)
		behind_drop(b, b->started - BEHIND_WINDOW, BEHIND_WINDOW);
	b->started = total;
}

void gcr_image_behind_end(const struct gcr_image_behind *b)
{
	behind_drop(b, 0, 0);
}

/* CRC-32C and size of a file, and its SHA-256 into sha unless NULL. What it reads is charged to
 * the reader's memory cgroup (the agent's, for a seal): it goes from the cache as read. */
static int crc_file(const char *path, uint64_t *size, uint32_t *crc, uint8_t *sha, struct gcr_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
	/* The fsync that follows waits for the disk: start the write-back now, so it runs while
	 * the checksum reads the page cache (CRIU's pages, 1.7 GB for PyTorch: 0.85 s serial). A
	 * filesystem without it just syncs later. */
	(void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	char *b = malloc(IO_BUF);
	if (b == NULL) {
		close(fd);
		return gcr_err_set(err, -ENOMEM, "out of memory reading %s", path);
	}
	uint32_t c = 0;
	uint64_t n = 0;
	int rc = 0;
	struct gcr_image_behind wb = { .in = fd, .out = -1 };
	struct gcr_sha256 hs;
	gcr_sha256_init(&hs);
	for (;;) {
		ssize_t r = read(fd, b, IO_BUF);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = gcr_err_set(err, -EIO, "reading %s: %s", path, strerror(errno));
			break;
		}
		if (r == 0)
			break;
		c = gcr_crc32c_update(c, b, (size_t)r);
		if (sha != NULL)
			gcr_sha256_update(&hs, b, (size_t)r);
		n += (uint64_t)r;
		gcr_image_behind_step(&wb, n);
	}
	free(b);
	gcr_image_behind_end(&wb);
	close(fd);
	*crc = c;
	*size = n;
	if (sha != NULL)
		gcr_sha256_final(&hs, sha);
	return rc;
}

static int fsync_path(const char *path, int dir, struct gcr_err *err)
{
	int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot open %s to sync it: %s", path, strerror(errno));
	int rc = fsync(fd) < 0 ? gcr_err_set(err, -errno, "fsync %s: %s", path, strerror(errno)) : 0;
	close(fd);
	return rc;
}

/* Lists every regular file under dir/sub, one level (CRIU and the shim write flat directories);
 * anything else there is refused. With hash: also fsyncs each and records its CRC-32C, except
 * for the data files of table (the shim wrote and synced them, with a CRC per chunk). */
struct walk {
	struct gcr_image_file *files;
	size_t n, cap;
};

static int walk_sub(const char *dir, const char *sub, struct walk *w, int hash, const struct gcr_image_table *table,
		    struct gcr_err *err)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, sub);
	DIR *d = opendir(p);
	if (d == NULL)
		return errno == ENOENT ? 0 : gcr_err_set(err, -errno, "cannot read %s: %s", p, strerror(errno));
	int rc = 0;
	struct dirent *de;
	while (rc == 0 && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		char rel[GCR_IMAGE_NAME_MAX], full[PATH_MAX];
		if ((size_t)snprintf(rel, sizeof(rel), "%s/%s", sub, de->d_name) >= sizeof(rel) ||
		    (size_t)snprintf(full, sizeof(full), "%s/%s", dir, rel) >= sizeof(full)) {
			rc = gcr_err_set(err, -ENAMETOOLONG, "file name too long in %s", p);
			break;
		}
		struct stat st;
		if (lstat(full, &st) < 0 || !S_ISREG(st.st_mode)) {
			rc = gcr_err_set(err, -EBADMSG, "%s is not a regular file", full);
			break;
		}
		if (w->n == w->cap) {
			size_t cap = w->cap ? 2 * w->cap : 64;
			struct gcr_image_file *f = cap > GCR_IMAGE_MAX_FILES ? NULL : realloc(w->files, cap * sizeof(*f));
			if (f == NULL) {
				rc = gcr_err_set(err, -ENOMEM, "too many files in %s", dir);
				break;
			}
			w->files = f;
			w->cap = cap;
		}
		struct gcr_image_file *f = &w->files[w->n++];
		memset(f, 0, sizeof(*f));
		memcpy(f->path, rel, strlen(rel) + 1);
		f->size = (uint64_t)st.st_size;
		int data = table_find(table, rel) != NULL;
		if (hash && (!data || hash > 1)) {
			/* A data file's chunks carry its CRCs; signed, it gets a SHA-256 too. */
			uint32_t crc = 0;
			f->has_crc = !data;
			f->has_sha = hash > 1;
			rc = crc_file(full, &f->size, &crc, f->has_sha ? f->sha : NULL, err);
			if (!data)
				f->crc = crc;
			if (rc == 0 && !data)
				rc = fsync_path(full, 0, err);
		}
	}
	closedir(d);
	if (rc == 0 && hash)
		rc = fsync_path(p, 1, err);
	return rc;
}

int gcr_image_manifest_write(const char *dir, const struct gcr_image_manifest *m, struct gcr_err *err)
{
	return gcr_image_manifest_write_signed(dir, m, NULL, err);
}

int gcr_image_manifest_write_signed(const char *dir, const struct gcr_image_manifest *m,
				    const struct gcr_imagemac_key *key, struct gcr_err *err)
{
	struct walk w = { 0 };
	int hash = key != NULL ? 2 : 1;
	int rc = walk_sub(dir, GCR_IMAGE_CRIU_DIR, &w, hash, &m->table, err);
	if (rc == 0)
		rc = walk_sub(dir, GCR_IMAGE_GPU_DIR, &w, hash, &m->table, err);
	json_t *files = json_array(), *root = NULL;
	for (size_t i = 0; rc == 0 && i < w.n; i++) {
		json_t *f = json_pack("{s:s, s:I}", "path", w.files[i].path, "size", (json_int_t)w.files[i].size);
		if (f != NULL && w.files[i].has_crc) {
			char hex[GCR_CRC32C_HEX];
			gcr_crc32c_to_hex(w.files[i].crc, hex);
			json_object_set_new(f, "crc32c", json_string(hex));
		}
		if (f != NULL && w.files[i].has_sha) {
			char hex[GCR_SHA256_HEX];
			gcr_sha256_to_hex(w.files[i].sha, hex);
			json_object_set_new(f, "sha256", json_string(hex));
		}
		json_array_append_new(files, f);
	}
	if (rc == 0) {
		json_t *allocs = gcr_image_table_to_json(&m->table);
		root = json_pack("{s:i, s:s, s:s, s:s, s:I, s:i, s:s, s:{s:s, s:s, s:s}, s:o, s:o}", "format",
				 GCR_IMAGE_FORMAT, "mode", m->mode[0] ? m->mode : GCR_IMAGE_MODE_GCR, "gcr_version",
				 m->gcr_version, "shim_version", m->env.shim_version,
				 "created", (json_int_t)m->created, "pid", (int)m->pid, "socket", m->socket, "gpu",
				 "vendor", m->env.gpu_vendor, "model", m->env.gpu_model, "driver", m->env.driver,
				 "files", files, "allocs", allocs);
		files = NULL;
		if (root == NULL)
			rc = gcr_err_set(err, -ENOMEM, "out of memory for the manifest");
		else if (m->node[0] != '\0' && json_object_set_new(root, "node", json_string(m->node)) < 0)
			rc = gcr_err_set(err, -ENOMEM, "out of memory for the manifest");
		else if (m->container[0] != '\0' && json_object_set_new(root, "container", json_string(m->container)) < 0)
			rc = gcr_err_set(err, -ENOMEM, "out of memory for the manifest");
		else if (key != NULL)
			rc = gcr_imagemac_sign(root, key, err);
	}
	json_decref(files);
	free(w.files);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	if (rc == 0 && json_dump_file(root, path, JSON_INDENT(1)) < 0)
		rc = gcr_err_set(err, -EIO, "cannot write %s", path);
	json_decref(root);
	if (rc == 0)
		rc = fsync_path(path, 0, err);
	if (rc == 0)
		rc = fsync_path(dir, 1, err);
	return rc;
}

/* ---- write-back while CRIU writes ---- */

#define FLUSH_MS 25

struct gcr_image_flusher {
	char dir[PATH_MAX];
	pthread_t th;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stop; /* under lock */
};

static void flush_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (de->d_type != DT_REG)
			continue;
		int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0)
			continue;
		(void)sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
		close(fd);
	}
	closedir(d);
}

static void *flusher_main(void *arg)
{
	struct gcr_image_flusher *f = arg;
	pthread_mutex_lock(&f->lock);
	while (!f->stop) {
		pthread_mutex_unlock(&f->lock);
		flush_dir(f->dir);
		struct timespec until;
		clock_gettime(CLOCK_MONOTONIC, &until);
		until.tv_nsec += FLUSH_MS * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&f->lock);
		while (!f->stop && pthread_cond_timedwait(&f->cond, &f->lock, &until) == 0)
			;
	}
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

struct gcr_image_flusher *gcr_image_flusher_start(const char *dir)
{
	struct gcr_image_flusher *f = calloc(1, sizeof(*f));
	if (f == NULL || (size_t)snprintf(f->dir, sizeof(f->dir), "%s", dir) >= sizeof(f->dir)) {
		free(f);
		return NULL;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&f->cond, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&f->lock, NULL);
	if (pthread_create(&f->th, NULL, flusher_main, f) != 0) {
		pthread_cond_destroy(&f->cond);
		pthread_mutex_destroy(&f->lock);
		free(f);
		return NULL;
	}
	return f;
}

void gcr_image_flusher_stop(struct gcr_image_flusher *f)
{
	if (f == NULL)
		return;
	pthread_mutex_lock(&f->lock);
	f->stop = 1;
	pthread_cond_signal(&f->cond);
	pthread_mutex_unlock(&f->lock);
	pthread_join(f->th, NULL);
	pthread_cond_destroy(&f->cond);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/* ---- the directory ---- */

int gcr_image_partial_name(const char *dir, pid_t pid, char *out, size_t len, struct gcr_err *err)
{
	size_t n = strlen(dir);
	while (n > 1 && dir[n - 1] == '/')
		n--;
	if ((size_t)snprintf(out, len, "%.*s%s%d", (int)n, dir, GCR_IMAGE_PARTIAL, (int)pid) >= len)
		return gcr_err_set(err, -ENAMETOOLONG, "image path too long: %s", dir);
	return 0;
}

int gcr_image_is_partial(const char *dir)
{
	const char *base = strrchr(dir, '/');
	base = base ? base + 1 : dir;
	return strstr(base, GCR_IMAGE_PARTIAL) != NULL;
}

int gcr_image_commit(const char *partial, const char *dir, struct gcr_err *err)
{
	/* RENAME_NOREPLACE: a plain rename would silently replace an empty directory at dir. */
	int r = renameat2(AT_FDCWD, partial, AT_FDCWD, dir, RENAME_NOREPLACE);
	if (r < 0 && (errno == EINVAL || errno == ENOSYS)) { /* a filesystem without it */
		struct stat st;
		if (lstat(dir, &st) == 0)
			errno = EEXIST;
		else
			r = rename(partial, dir);
	}
	if (r < 0)
		return gcr_err_set(err, -errno, "cannot rename %s to %s: %s", partial, dir, strerror(errno));
	char parent[PATH_MAX];
	snprintf(parent, sizeof(parent), "%s", dir);
	char *slash = strrchr(parent, '/');
	if (slash == parent)
		slash[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	else
		snprintf(parent, sizeof(parent), ".");
	return fsync_path(parent, 1, err);
}

static void remove_tree(const char *path, int depth)
{
	DIR *d = depth < 8 ? opendir(path) : NULL;
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		char p[PATH_MAX];
		if ((size_t)snprintf(p, sizeof(p), "%s/%s", path, de->d_name) >= sizeof(p))
			continue;
		struct stat st;
		if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
			remove_tree(p, depth + 1);
		else
			unlink(p);
	}
	if (d != NULL)
		closedir(d);
	rmdir(path);
}

void gcr_image_remove(const char *dir)
{
	if (dir != NULL && dir[0] != '\0')
		remove_tree(dir, 0);
}

static int env_check(const char *what, const char *have, const char *want, struct gcr_err *err)
{
	if (want[0] == '\0' || strcmp(have, want) == 0)
		return 0;
	return gcr_err_set(err, -ENOTSUP, "image is for %s \"%s\", this machine has \"%s\": refused", what, have, want);
}

/* ---- every data chunk's CRC-32C, by several threads (a 16 GiB image is read at the page
 * cache's or the disk's speed, not one core's) ---- */

struct vjob {
	size_t a, c;
};

struct vrun {
	const char *dir;
	const struct gcr_image_table *t;
	const int *fds; /* per allocation */
	const struct vjob *jobs;
	size_t n;
	atomic_size_t next;
	atomic_int failed;
	pthread_mutex_t lock;
	struct gcr_err err; /* the first failure, under lock */
};

static void vrun_fail(struct vrun *r, int code, const char *what, const char *file, size_t c)
{
	pthread_mutex_lock(&r->lock);
	if (!atomic_load(&r->failed))
		gcr_err_set(&r->err, code, "%s/%s chunk %zu: %s: refused", r->dir, file, c, what);
	atomic_store(&r->failed, 1);
	pthread_mutex_unlock(&r->lock);
}

static void *vrun_thread(void *arg)
{
	struct vrun *r = arg;
	char *buf = malloc(GCR_IMAGE_CHUNK);
	if (buf == NULL) {
		vrun_fail(r, -ENOMEM, "out of memory to check it", r->t->a[r->jobs[0].a].file, (size_t)0);
		return NULL;
	}
	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		if (i >= r->n || atomic_load(&r->failed))
			break;
		const struct gcr_image_alloc *a = &r->t->a[r->jobs[i].a];
		const struct gcr_image_chunk *ch = &a->chunks[r->jobs[i].c];
		if (gcr_image_pread(r->fds[r->jobs[i].a], buf, ch->len, ch->off) < 0)
			vrun_fail(r, -EIO, "cannot be read whole (truncated)", a->file, r->jobs[i].c);
		else if (gcr_crc32c_update(0, buf, ch->len) != ch->crc)
			vrun_fail(r, -EIO, "CRC-32C differs from the manifest (" GCR_IMAGE_CORRUPT ")", a->file, r->jobs[i].c);
	}
	free(buf);
	return NULL;
}

static int verify_chunks(const char *dir, const struct gcr_image_table *t, int threads, struct gcr_err *err)
{
	size_t n = 0;
	for (size_t i = 0; i < t->n; i++)
		for (size_t c = 0; c < t->a[i].nchunks; c++)
			n += !t->a[i].chunks[c].zero;
	if (n == 0)
		return 0;
	int *fds = malloc((t->n + 1) * sizeof(*fds));
	struct vjob *jobs = calloc(n, sizeof(*jobs));
	int rc = fds && jobs ? 0 : gcr_err_set(err, -ENOMEM, "out of memory to check %zu chunks", n);
	size_t nfd = 0, nj = 0;
	for (; rc == 0 && nfd < t->n; nfd++) {
		char path[PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", dir, t->a[nfd].file);
		fds[nfd] = -1;
		int any = 0;
		for (size_t c = 0; c < t->a[nfd].nchunks; c++)
			if (!t->a[nfd].chunks[c].zero) {
				jobs[nj++] = (struct vjob){ .a = nfd, .c = c };
				any = 1;
			}
		if (any && (fds[nfd] = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			rc = gcr_err_set(err, -EIO, "cannot open %s: %s: refused", path, strerror(errno));
	}
	struct vrun r = { .dir = dir, .t = t, .fds = fds, .jobs = jobs, .n = nj };
	pthread_mutex_init(&r.lock, NULL);
	if (rc == 0) {
		pthread_t th[VERIFY_THREADS];
		long cores = sysconf(_SC_NPROCESSORS_ONLN);
		size_t want = threads > 0 && threads < VERIFY_THREADS ? (size_t)threads : VERIFY_THREADS;
		size_t nt = nj < want ? nj : want, started = 0;
		if (cores > 0 && nt > (size_t)cores)
			nt = (size_t)cores;
		for (; started < nt; started++)
			if (pthread_create(&th[started], NULL, vrun_thread, &r) != 0)
				break;
		if (started == 0)
			vrun_thread(&r); /* no thread to be had: here */
		for (size_t i = 0; i < started; i++)
			pthread_join(th[i], NULL);
		if (atomic_load(&r.failed)) {
			*err = r.err;
			rc = err->code;
		}
	}
	pthread_mutex_destroy(&r.lock);
	for (size_t i = 0; fds != NULL && i < nfd; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
	free(jobs);
	return rc;
}

/* ---- a signed image's data files: each file's SHA-256, one reader per file ---- */

struct srun {
	const char *dir;
	const struct gcr_image_manifest *m;
	atomic_size_t next;
	atomic_int failed;
	pthread_mutex_t lock;
	struct gcr_err err; /* the first failure, under lock */
};

static void *srun_thread(void *arg)
{
	struct srun *r = arg;
	for (;;) {
		size_t k = atomic_fetch_add(&r->next, 1);
		if (k >= r->m->nfiles || atomic_load(&r->failed))
			break;
		const struct gcr_image_file *f = &r->m->files[k];
		if (f->has_crc) /* whole-file checks done by verify_meta */
			continue;
		char path[PATH_MAX];
		uint64_t size = 0;
		uint32_t crc;
		uint8_t sha[GCR_SHA256_LEN];
		struct gcr_err e = { 0 };
		snprintf(path, sizeof(path), "%s/%s", r->dir, f->path);
		int rc = crc_file(path, &size, &crc, sha, &e);
		if (rc == 0 && (size != f->size || memcmp(sha, f->sha, sizeof(sha)) != 0))
			rc = gcr_err_set(&e, -EIO, "%s: SHA-256 does not match the signed manifest (changed): refused", path);
		if (rc < 0) {
			pthread_mutex_lock(&r->lock);
			if (!atomic_load(&r->failed))
				r->err = e;
			atomic_store(&r->failed, 1);
			pthread_mutex_unlock(&r->lock);
		}
	}
	return NULL;
}

static int verify_sha(const char *dir, const struct gcr_image_manifest *m, int threads, struct gcr_err *err)
{
	struct srun r = { .dir = dir, .m = m };
	pthread_mutex_init(&r.lock, NULL);
	pthread_t th[VERIFY_THREADS];
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	size_t nt = threads > 0 && threads < VERIFY_THREADS ? (size_t)threads : VERIFY_THREADS, started = 0;
	if (nt > m->nfiles)
		nt = m->nfiles;
	if (cores > 0 && nt > (size_t)cores)
		nt = (size_t)cores;
	for (; started < nt; started++)
		if (pthread_create(&th[started], NULL, srun_thread, &r) != 0)
			break;
	if (started == 0)
		srun_thread(&r);
	for (size_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	int rc = 0;
	if (atomic_load(&r.failed)) {
		*err = r.err;
		rc = err->code;
	}
	pthread_mutex_destroy(&r.lock);
	return rc;
}

int gcr_image_env_check(const struct gcr_image_manifest *m, const struct gcr_image_expect *expect,
			struct gcr_err *err)
{
	int rc = env_check("GPU vendor", m->env.gpu_vendor, expect->gpu_vendor, err);
	if (rc == 0)
		rc = env_check("GPU model", m->env.gpu_model, expect->gpu_model, err);
	if (rc == 0)
		rc = env_check("driver version", m->env.driver, expect->driver, err);
	/* The baseline's process has no shim to match. */
	if (rc == 0 && strcmp(m->mode, GCR_IMAGE_MODE_DRIVER) != 0)
		rc = env_check("shim version", m->env.shim_version, expect->shim_version, err);
	return rc;
}

int gcr_image_verify_data(const char *dir, const struct gcr_image_manifest *m, int threads, struct gcr_err *err)
{
	int rc = verify_chunks(dir, &m->table, threads, err);
	if (rc == 0 && m->signed_ok)
		rc = verify_sha(dir, m, threads, err);
	return rc;
}

int gcr_image_verify(const char *dir, const struct gcr_image_expect *expect, struct gcr_image_manifest *m,
		     struct gcr_err *err)
{
	int rc = gcr_image_verify_meta(dir, expect, m, err);
	if (rc == 0 && (rc = gcr_image_verify_data(dir, m, 0, err)) < 0)
		gcr_image_manifest_clear(m);
	return rc;
}

int gcr_image_verify_meta(const char *dir, const struct gcr_image_expect *expect, struct gcr_image_manifest *m,
			  struct gcr_err *err)
{
	memset(m, 0, sizeof(*m));
	struct stat st;
	if (gcr_image_is_partial(dir))
		return gcr_err_set(err, -ENOENT, "%s is a partial image (a checkpoint that did not finish): refused", dir);
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return gcr_err_set(err, -ENOENT, "no image at %s", dir);
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	char *buf;
	size_t len;
	int rc = gcr_image_read_file(path, GCR_IMAGE_MAX_JSON, &buf, &len, err);
	if (rc == -ENOENT)
		return gcr_err_set(err, -ENOENT, "%s has no %s: not a whole image, refused", dir, GCR_IMAGE_MANIFEST);
	if (rc < 0)
		return rc;
	rc = gcr_image_manifest_parse_keyed(buf, len, expect != NULL ? expect->keys : NULL, m, err);
	free(buf);
	if (rc < 0)
		return gcr_err_wrap(err, "%s", path);
	if (expect != NULL)
		rc = gcr_image_env_check(m, expect, err);
	/* Sizes and extra files first (cheap), then every checksum. */
	struct walk w = { 0 };
	if (rc == 0)
		rc = walk_sub(dir, GCR_IMAGE_CRIU_DIR, &w, 0, NULL, err);
	if (rc == 0)
		rc = walk_sub(dir, GCR_IMAGE_GPU_DIR, &w, 0, NULL, err);
	for (size_t i = 0; rc == 0 && i < w.n; i++) {
		size_t k = 0;
		while (k < m->nfiles && strcmp(m->files[k].path, w.files[i].path) != 0)
			k++;
		/* CRIU writes its restore statistics into the images directory on every restore. */
		if (k == m->nfiles && strcmp(w.files[i].path, GCR_IMAGE_CRIU_DIR "/stats-restore") == 0)
			continue;
		if (k == m->nfiles)
			rc = gcr_err_set(err, -EIO, "%s/%s is not in the manifest: refused", dir, w.files[i].path);
		else if (m->files[k].size != w.files[i].size)
			rc = gcr_err_set(err, -EIO, "%s/%s has %" PRIu64 " bytes, the manifest says %" PRIu64
					 " (truncated or changed): refused", dir, w.files[i].path, w.files[i].size,
					 m->files[k].size);
	}
	for (size_t k = 0; rc == 0 && k < m->nfiles; k++) {
		size_t i = 0;
		while (i < w.n && strcmp(m->files[k].path, w.files[i].path) != 0)
			i++;
		if (i == w.n)
			rc = gcr_err_set(err, -EIO, "%s/%s is missing: refused", dir, m->files[k].path);
	}
	free(w.files);
	/* Each allocation's file is listed and holds every non-zero chunk. */
	for (size_t i = 0; rc == 0 && i < m->table.n; i++) {
		const struct gcr_image_alloc *a = &m->table.a[i];
		uint64_t need = 0;
		for (size_t c = 0; c < a->nchunks; c++)
			if (!a->chunks[c].zero)
				need = a->chunks[c].off + a->chunks[c].len;
		size_t k = 0;
		while (k < m->nfiles && strcmp(m->files[k].path, a->file) != 0)
			k++;
		if (k == m->nfiles && need > 0)
			rc = gcr_err_set(err, -EIO, "%s: GPU data file %s is not listed: refused", dir, a->file);
		else if (k < m->nfiles && m->files[k].size != need)
			rc = gcr_err_set(err, -EIO, "%s/%s: %" PRIu64 " bytes, its chunks need %" PRIu64 ": refused", dir,
					 a->file, m->files[k].size, need);
	}
	for (size_t k = 0; rc == 0 && k < m->nfiles; k++) {
		if (!m->files[k].has_crc)
			continue;
		uint64_t size;
		uint32_t crc;
		uint8_t sha[GCR_SHA256_LEN];
		snprintf(path, sizeof(path), "%s/%s", dir, m->files[k].path);
		rc = crc_file(path, &size, &crc, m->signed_ok ? sha : NULL, err);
		if (rc == 0 && (size != m->files[k].size || crc != m->files[k].crc))
			rc = gcr_err_set(err, -EIO, "%s: CRC-32C does not match the manifest (corrupt): refused", path);
		else if (rc == 0 && m->signed_ok && memcmp(sha, m->files[k].sha, sizeof(sha)) != 0)
			rc = gcr_err_set(err, -EIO, "%s: SHA-256 does not match the signed manifest (changed): refused",
					 path);
	}
	if (rc < 0)
		gcr_image_manifest_clear(m);
	return rc;
}
