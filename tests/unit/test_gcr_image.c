/* test_gcr_image: the image directory (lib/gcr_image) on crafted directories: the partial
 * name rule, commit's rename, and each refusal of gcr_image_verify with its code and message. */
#include "config.h"
#include "gcr_image.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define DATA_LEN 4096 /* bytes of the one non-zero chunk */

static char root[] = "/tmp/gcr-test-image-XXXXXX";

static void put(const char *dir, const char *rel, const void *data, size_t n)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	FILE *f = fopen(p, "w");
	CHECK(f != NULL && fwrite(data, 1, n, f) == n);
	if (f != NULL)
		fclose(f);
}

/* One allocation of 2 MiB + DATA_LEN bytes: a zero chunk, then DATA_LEN bytes at offset 0
 * of gpu/alloc-0-1.bin. nchunks_data > 1 makes the table ask for more than the file holds. */
static void fill_table(struct gcr_image_table *t, const uint8_t *data, int bigger)
{
	t->n = 1;
	t->a = calloc(2, sizeof(*t->a));
	struct gcr_image_alloc *a = &t->a[0];
	a->address = 0x7f0000000000ull;
	a->size = GCR_IMAGE_CHUNK + (bigger ? GCR_IMAGE_CHUNK : DATA_LEN);
	a->slot = 0;
	a->gen = 1;
	snprintf(a->file, sizeof(a->file), "gpu/alloc-0-1.bin");
	a->nchunks = 2;
	a->chunks = calloc(2, sizeof(*a->chunks));
	a->chunks[0].zero = 1;
	a->chunks[0].len = (uint32_t)GCR_IMAGE_CHUNK;
	a->chunks[1].len = bigger ? (uint32_t)GCR_IMAGE_CHUNK : DATA_LEN;
	a->chunks[1].crc = gcr_crc32c_update(0, data, DATA_LEN);
}

/* A whole image at root/name: criu/ and gpu/ files, a manifest, committed from its partial
 * name; out gets its path. */
static int make_image_signed(const char *name, int bigger, const struct gcr_imagemac_key *key, char *out, size_t len);

static int make_image(const char *name, int bigger, char *out, size_t len)
{
	return make_image_signed(name, bigger, NULL, out, len);
}

static int make_image_signed(const char *name, int bigger, const struct gcr_imagemac_key *key, char *out, size_t len)
{
	static uint8_t data[DATA_LEN];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)(i * 7 + 1);
	char *dir = out, partial[PATH_MAX], sub[PATH_MAX + 8];
	struct gcr_err err = { 0, "" };
	snprintf(dir, len, "%s/%s", root, name);
	CHECK(gcr_image_partial_name(dir, 1234, partial, sizeof(partial), &err) == 0);
	CHECK(mkdir(partial, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/criu", partial);
	CHECK(mkdir(sub, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/gpu", partial);
	CHECK(mkdir(sub, 0700) == 0);
	put(partial, "criu/pages-1.img", "criu pages", 10);
	put(partial, "criu/core-1.img", "criu core", 9);
	put(partial, "gpu/alloc-0-1.bin", data, sizeof(data));
	put(partial, "gpu/allocs.json", "{}", 2);
	struct gcr_image_manifest m = { 0 };
	m.format = GCR_IMAGE_FORMAT;
	snprintf(m.gcr_version, sizeof(m.gcr_version), "%s", PACKAGE_VERSION);
	m.created = 1763935000;
	m.pid = 4242;
	snprintf(m.socket, sizeof(m.socket), "/run/gcr/gcr-4242-1.sock");
	snprintf(m.env.gpu_vendor, sizeof(m.env.gpu_vendor), "nvidia");
	snprintf(m.env.gpu_model, sizeof(m.env.gpu_model), "Model A");
	snprintf(m.env.driver, sizeof(m.env.driver), "570.1");
	snprintf(m.env.shim_version, sizeof(m.env.shim_version), "0.1.0");
	fill_table(&m.table, data, bigger);
	int rc = gcr_image_manifest_write_signed(partial, &m, key, &err);
	CHECK(rc == 0);
	gcr_image_manifest_clear(&m);
	if (rc == 0)
		rc = gcr_image_commit(partial, dir, &err);
	CHECK(rc == 0);
	return rc;
}

static const struct gcr_image_expect here = { "nvidia", "Model A", "570.1", "0.1.0", NULL };

/* verify refuses dir with code and a message containing word; m is left empty. */
static void refused(const char *dir, const struct gcr_image_expect *e, int code, const char *word)
{
	struct gcr_image_manifest m;
	struct gcr_err err = { 0, "" };
	int rc = gcr_image_verify(dir, e, &m, &err);
	CHECK(rc == code);
	CHECK(strstr(err.msg, word) != NULL);
	CHECK(m.files == NULL && m.table.a == NULL && m.nfiles == 0);
	if (rc != code || strstr(err.msg, word) == NULL)
		fprintf(stderr, "  expected %d \"%s\", got %d: %s\n", code, word, rc, err.msg);
}

static void accepted(const char *dir, const struct gcr_image_expect *e)
{
	struct gcr_image_manifest m;
	struct gcr_err err = { 0, "" };
	int rc = gcr_image_verify(dir, e, &m, &err);
	CHECK(rc == 0);
	if (rc != 0)
		fprintf(stderr, "  refused: %s\n", err.msg);
	CHECK(m.pid == 4242 && m.nfiles == 4 && m.table.n == 1 && m.table.a[0].chunks[0].zero == 1);
	CHECK_STR(m.env.gpu_model, "Model A");
	gcr_image_manifest_clear(&m);
}

/* Replaces the first from after anchor (NULL: from the start) in dir's manifest with to. */
static void edit_after(const char *dir, const char *anchor, const char *from, const char *to)
{
	char p[PATH_MAX], *buf = NULL;
	size_t len;
	struct gcr_err err;
	snprintf(p, sizeof(p), "%s/manifest.json", dir);
	CHECK(gcr_image_read_file(p, 1 << 20, &buf, &len, &err) == 0);
	char *start = buf && anchor ? strstr(buf, anchor) : buf;
	char *at = start ? strstr(start, from) : NULL;
	CHECK(at != NULL);
	if (at != NULL) {
		FILE *f = fopen(p, "w");
		fprintf(f, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
		fclose(f);
	}
	free(buf);
}

static void edit(const char *dir, const char *from, const char *to)
{
	edit_after(dir, NULL, from, to);
}

static void test_names(void)
{
	char out[64];
	struct gcr_err err = { 0, "" };
	CHECK(gcr_image_partial_name("/a/img//", 77, out, sizeof(out), &err) == 0);
	CHECK_STR(out, "/a/img.partial.77");
	CHECK(gcr_image_is_partial(out));
	CHECK(!gcr_image_is_partial("/a/img"));
	CHECK(!gcr_image_is_partial("/a/b.partial.3/img")); /* only the last component counts */
	char longname[128];
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	CHECK(gcr_image_partial_name(longname, 1, out, sizeof(out), &err) == -ENAMETOOLONG);
}

static void test_commit(void)
{
	char a[PATH_MAX], b[PATH_MAX];
	struct gcr_err err = { 0, "" };
	snprintf(a, sizeof(a), "%s/c.partial.1", root);
	snprintf(b, sizeof(b), "%s/c", root);
	CHECK(mkdir(a, 0700) == 0 && mkdir(b, 0700) == 0);
	/* An empty directory at the name is not replaced. */
	CHECK(gcr_image_commit(a, b, &err) == -EEXIST);
	CHECK(access(a, F_OK) == 0);
	CHECK(rmdir(b) == 0);
	CHECK(gcr_image_commit(a, b, &err) == 0);
	CHECK(access(a, F_OK) != 0 && access(b, F_OK) == 0);
	gcr_image_remove(b);
	CHECK(access(b, F_OK) != 0);
	CHECK(gcr_image_commit(a, b, &err) == -ENOENT); /* nothing to commit */
}

/* The manifest's optional "container" (a Restore into a new pod restores that container). */
static void test_container(void)
{
#define BASE                                                                                                     \
	"{\"format\":2,\"gcr_version\":\"x\",\"shim_version\":\"x\",\"created\":1,\"pid\":2,\"socket\":\"\","           \
	"\"gpu\":{\"vendor\":\"nvidia\",\"model\":\"m\",\"driver\":\"d\"},\"files\":[],\"allocs\":[]%s}"
	char buf[1024];
	struct gcr_image_manifest m;
	struct gcr_err err;
	snprintf(buf, sizeof(buf), BASE, ",\"container\":\"model-server\"");
	CHECK(gcr_image_manifest_parse(buf, strlen(buf), &m, &err) == 0);
	CHECK(strcmp(m.container, "model-server") == 0);
	gcr_image_manifest_clear(&m);
	snprintf(buf, sizeof(buf), BASE, "");
	CHECK(gcr_image_manifest_parse(buf, strlen(buf), &m, &err) == 0 && m.container[0] == '\0');
	gcr_image_manifest_clear(&m);
	snprintf(buf, sizeof(buf), BASE, ",\"container\":\"\"");
	CHECK(gcr_image_manifest_parse(buf, strlen(buf), &m, &err) == -EBADMSG);
	snprintf(buf, sizeof(buf), BASE, ",\"container\":7");
	CHECK(gcr_image_manifest_parse(buf, strlen(buf), &m, &err) == -EBADMSG);
	char long_name[200];
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	char field[300];
	snprintf(field, sizeof(field), ",\"container\":\"%s\"", long_name);
	snprintf(buf, sizeof(buf), BASE, field);
	CHECK(gcr_image_manifest_parse(buf, strlen(buf), &m, &err) == -EBADMSG);
	/* Written and read back. */
	char dir[PATH_MAX], sub[PATH_MAX + 16];
	snprintf(dir, sizeof(dir), "%s/ctr", root);
	CHECK(mkdir(dir, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/criu", dir);
	CHECK(mkdir(sub, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/gpu", dir);
	CHECK(mkdir(sub, 0700) == 0);
	struct gcr_image_manifest w = { .format = GCR_IMAGE_FORMAT, .created = 1, .pid = 3 };
	snprintf(w.container, sizeof(w.container), "main");
	CHECK(gcr_image_manifest_write(dir, &w, &err) == 0);
	char *text = NULL;
	size_t len = 0;
	snprintf(sub, sizeof(sub), "%s/manifest.json", dir);
	CHECK(gcr_image_read_file(sub, 1 << 20, &text, &len, &err) == 0);
	CHECK(gcr_image_manifest_parse(text, len, &m, &err) == 0 && strcmp(m.container, "main") == 0);
	gcr_image_manifest_clear(&m);
	free(text);
#undef BASE
}

static void test_verify(void)
{
	char img[512], p[PATH_MAX], q[PATH_MAX];
	if (make_image("img", 0, img, sizeof(img)) < 0)
		return;
	accepted(img, &here);
	accepted(img, NULL);
	struct gcr_image_expect blank = { "", "", "", "", NULL }; /* empty fields are not compared */
	accepted(img, &blank);

	/* The machine differs. */
	struct gcr_image_expect e = here;
	snprintf(e.gpu_model, sizeof(e.gpu_model), "Model B");
	refused(img, &e, -ENOTSUP, "GPU model");
	e = here;
	snprintf(e.driver, sizeof(e.driver), "580.2");
	refused(img, &e, -ENOTSUP, "driver version");
	e = here;
	snprintf(e.shim_version, sizeof(e.shim_version), "0.2.0");
	refused(img, &e, -ENOTSUP, "shim version");
	e = here;
	snprintf(e.gpu_vendor, sizeof(e.gpu_vendor), "amd");
	refused(img, &e, -ENOTSUP, "GPU vendor");

	/* A flipped byte in a data file: same size, wrong checksum. */
	snprintf(p, sizeof(p), "%s/gpu/alloc-0-1.bin", img);
	int fd = open(p, O_RDWR);
	CHECK(fd >= 0);
	uint8_t b;
	CHECK(pread(fd, &b, 1, 100) == 1);
	b ^= 0xff;
	CHECK(pwrite(fd, &b, 1, 100) == 1);
	refused(img, &here, -EIO, "CRC-32C");
	b ^= 0xff;
	CHECK(pwrite(fd, &b, 1, 100) == 1);
	/* Truncated. */
	CHECK(ftruncate(fd, DATA_LEN - 1) == 0);
	refused(img, &here, -EIO, "truncated");
	b = (uint8_t)((DATA_LEN - 1) * 7 + 1);
	CHECK(pwrite(fd, &b, 1, DATA_LEN - 1) == 1);
	close(fd);
	accepted(img, &here);

	/* Missing, extra, and not a regular file. */
	snprintf(p, sizeof(p), "%s/criu/core-1.img", img);
	snprintf(q, sizeof(q), "%s/core-1.img", root);
	CHECK(rename(p, q) == 0);
	refused(img, &here, -EIO, "missing");
	CHECK(rename(q, p) == 0);
	snprintf(p, sizeof(p), "%s/gpu/extra.bin", img);
	put(img, "gpu/extra.bin", "x", 1);
	refused(img, &here, -EIO, "not in the manifest");
	unlink(p);
	CHECK(symlink("/etc/passwd", p) == 0);
	refused(img, &here, -EBADMSG, "not a regular file");
	unlink(p);
	/* CRIU writes its restore statistics there on every restore: tolerated. */
	put(img, "criu/stats-restore", "s", 1);
	accepted(img, &here);

	/* The manifest: deleted, unparsable, another format, a path outside the image. */
	snprintf(p, sizeof(p), "%s/manifest.json", img);
	snprintf(q, sizeof(q), "%s/manifest.saved", root);
	CHECK(rename(p, q) == 0);
	refused(img, &here, -ENOENT, "no manifest.json");
	put(img, "manifest.json", "{\"format\": 1,", 13);
	refused(img, &here, -EBADMSG, "not JSON");
	CHECK(rename(q, p) == 0);
	accepted(img, &here);
	edit(img, "\"format\": 2", "\"format\": 1");
	refused(img, &here, -ENOTSUP, "format 1"); /* phase 1's SHA-256 images are not read */
	edit(img, "\"format\": 1", "\"format\": 2");
	/* Only an allocation's data file may go without a whole-file checksum. */
	edit_after(img, "\"criu/core-1.img\"", "\"crc32c\"", "\"xcrc32c\"");
	refused(img, &here, -EBADMSG, "no crc32c");
	edit(img, "\"xcrc32c\"", "\"crc32c\"");
	/* The mode: unknown refused; the driver's baseline has no shim version to match. */
	edit(img, "\"mode\": \"gcr\"", "\"mode\": \"other\"");
	refused(img, &here, -EBADMSG, "mode");
	edit(img, "\"mode\": \"other\"", "\"mode\": \"driver\"");
	e = here;
	snprintf(e.shim_version, sizeof(e.shim_version), "0.2.0");
	accepted(img, &e);
	edit(img, "\"mode\": \"driver\"", "\"mode\": \"gcr\"");
	refused(img, &e, -ENOTSUP, "shim version");
	accepted(img, &here);
	/* A flipped byte in a CRIU file: its whole-file CRC-32C. */
	snprintf(p, sizeof(p), "%s/criu/pages-1.img", img);
	put(img, "criu/pages-1.img", "criu pagex", 10);
	refused(img, &here, -EIO, "CRC-32C does not match");
	put(img, "criu/pages-1.img", "criu pages", 10);
	edit(img, "\"criu/core-1.img\"", "\"criu/../../core-1.img\"");
	refused(img, &here, -EBADMSG, "relative path");
	edit(img, "\"criu/../../core-1.img\"", "\"criu/core-1.img\"");
	edit(img, "\"file\": \"gpu/alloc-0-1.bin\"", "\"file\": \"criu/core-1.img\"");
	refused(img, &here, -EBADMSG, "not under gpu/");
	edit(img, "\"file\": \"criu/core-1.img\"", "\"file\": \"gpu/alloc-0-1.bin\"");
	accepted(img, &here);

	/* The partial name, and no directory at all. */
	snprintf(p, sizeof(p), "%s.partial.9", img);
	CHECK(rename(img, p) == 0);
	refused(p, &here, -ENOENT, "partial");
	refused(img, &here, -ENOENT, "no image");
	CHECK(rename(p, img) == 0);
	accepted(img, &here);
}

/* A table whose chunks need more bytes than its (listed, checksummed) file holds. */
static void test_short_table(void)
{
	char img[512];
	if (make_image("short", 1, img, sizeof(img)) == 0)
		refused(img, &here, -EIO, "its chunks need");
}

static void hmac_hex(const void *k, size_t kl, const char *data, char hex[GCR_SHA256_HEX])
{
	uint8_t d[GCR_SHA256_LEN];
	gcr_hmac_sha256(k, kl, data, strlen(data), d);
	gcr_sha256_to_hex(d, hex);
}

/* RFC 4231's test cases 1, 2 and 6 (a key longer than the block). */
static void test_hmac(void)
{
	char hex[GCR_SHA256_HEX];
	uint8_t k1[20], k6[131];
	memset(k1, 0x0b, sizeof(k1));
	memset(k6, 0xaa, sizeof(k6));
	hmac_hex(k1, sizeof(k1), "Hi There", hex);
	CHECK_STR(hex, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
	hmac_hex("Jefe", 4, "what do ya want for nothing?", hex);
	CHECK_STR(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
	hmac_hex(k6, sizeof(k6), "Test Using Larger Than Block-Size Key - Hash Key First", hex);
	CHECK_STR(hex, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

static void key_file(const char *dir, const char *name, const char *text, size_t n)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	CHECK(f != NULL && fwrite(text, 1, n, f) == n);
	if (f != NULL)
		fclose(f);
}

static void test_keys(void)
{
	char dir[PATH_MAX], big[GCR_IMAGEMAC_KEY_MAX + 2];
	struct gcr_imagemac_keys k;
	struct gcr_err err = { 0, "" };
	snprintf(dir, sizeof(dir), "%s/keys", root);
	CHECK(mkdir(dir, 0700) == 0);
	CHECK(gcr_imagemac_load(dir, &k, &err) == -ENOENT && strstr(err.msg, "key") != NULL);
	key_file(dir, "key", "short\n", 6);
	CHECK(gcr_imagemac_load(dir, &k, &err) == -EINVAL && strstr(err.msg, "fewer than 32") != NULL);
	memset(big, 'k', sizeof(big));
	key_file(dir, "key", big, sizeof(big));
	CHECK(gcr_imagemac_load(dir, &k, &err) == -EINVAL && strstr(err.msg, "more than") != NULL);
	key_file(dir, "key", "0123456789abcdef0123456789abcdef\n", 33);
	CHECK(gcr_imagemac_load(dir, &k, &err) == 0 && k.n == 1 && k.key[0].len == 32 && strlen(k.key[0].id) == 16);
	char id0[GCR_IMAGEMAC_ID_HEX];
	snprintf(id0, sizeof(id0), "%s", k.key[0].id);
	key_file(dir, "previous", "fedcba9876543210fedcba9876543210", 32);
	CHECK(gcr_imagemac_load(dir, &k, &err) == 0 && k.n == 2 && strcmp(k.key[0].id, id0) == 0 &&
	      strcmp(k.key[1].id, id0) != 0);
	gcr_imagemac_clear(&k);
	CHECK(k.n == 0 && k.key[0].len == 0);
}

/* Re-signs dir's manifest with key after replacing from with to in it (an agent's signature on a
 * manifest that lies about the data). */
static void resign(const char *dir, const char *from, const char *to, const struct gcr_imagemac_key *key)
{
	edit(dir, from, to);
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/manifest.json", dir);
	json_t *doc = json_load_file(p, 0, NULL);
	struct gcr_err err = { 0, "" };
	CHECK(doc != NULL && gcr_imagemac_sign(doc, key, &err) == 0 && json_dump_file(doc, p, JSON_INDENT(1)) == 0);
	json_decref(doc);
}

static void test_signed(void)
{
	char img[512], kdir[PATH_MAX - 16];
	struct gcr_imagemac_keys keys, other;
	struct gcr_err err = { 0, "" };
	snprintf(kdir, sizeof(kdir), "%s/keys", root);
	key_file(kdir, "previous", "", 0);
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/previous", kdir);
	unlink(p);
	CHECK(gcr_imagemac_load(kdir, &keys, &err) == 0 && keys.n == 1);
	other = keys;
	other.key[0].k[0] ^= 1;
	snprintf(other.key[0].id, sizeof(other.key[0].id), "00000000000000ff");
	struct gcr_image_expect ek = here;
	ek.keys = &keys;
	struct gcr_image_expect eo = here;
	eo.keys = &other;
	/* Signed and whole: accepted with the key, and without one (the MAC is not asked for). */
	if (make_image_signed("signed", 0, &keys.key[0], img, sizeof(img)) == 0) {
		accepted(img, &ek);
		accepted(img, &here);
		struct gcr_image_manifest m;
		CHECK(gcr_image_verify(img, &ek, &m, &err) == 0 && m.signed_ok && m.nfiles == 4);
		for (size_t i = 0; i < m.nfiles; i++)
			CHECK(m.files[i].has_sha);
		gcr_image_manifest_clear(&m);
		refused(img, &eo, -EKEYREJECTED, "signed with key");
		/* The old key kept as "previous": still accepted after a rotation. */
		struct gcr_imagemac_keys rot = { .n = 2 };
		rot.key[0] = other.key[0];
		rot.key[1] = keys.key[0];
		struct gcr_image_expect er = here;
		er.keys = &rot;
		accepted(img, &er);
		/* Any change to the manifest without the key: refused before anything is read. */
		edit(img, "\"pid\": 4242", "\"pid\": 4243");
		refused(img, &ek, -EPERM, "MAC does not match");
		edit(img, "\"pid\": 4243", "\"pid\": 4242");
		accepted(img, &ek);
	}
	if (make_image_signed("signed2", 0, &keys.key[0], img, sizeof(img)) == 0) {
		/* The data file's SHA-256 replaced in a correctly signed manifest: its bytes are refused. */
		char *buf = NULL;
		size_t len;
		snprintf(p, sizeof(p), "%s/manifest.json", img);
		CHECK(gcr_image_read_file(p, 1 << 20, &buf, &len, &err) == 0);
		char *at = buf ? strstr(buf, "gpu/alloc-0-1.bin") : NULL;
		char *sha = at ? strstr(at, "\"sha256\": \"") : NULL;
		char old[80];
		if (sha != NULL) {
			snprintf(old, sizeof(old), "%.77s", sha);
			char new[80];
			snprintf(new, sizeof(new), "%s", old);
			new[12] = new[12] == 'a' ? 'b' : 'a';
			resign(img, old, new, &keys.key[0]);
			refused(img, &ek, -EIO, "SHA-256 does not match the signed manifest");
		}
		CHECK(sha != NULL);
		free(buf);
	}
	/* Unsigned: refused where a key is asked for. */
	if (make_image("unsigned", 0, img, sizeof(img)) == 0) {
		accepted(img, &here);
		refused(img, &ek, -EBADMSG, "not signed");
	}
	gcr_imagemac_clear(&keys);
	gcr_imagemac_clear(&other);
}

int main(void)
{
	if (mkdtemp(root) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	test_names();
	test_commit();
	test_container();
	test_verify();
	test_short_table();
	test_hmac();
	test_keys();
	test_signed();
	gcr_image_remove(root);
	return test_summary("test_gcr_image");
}
