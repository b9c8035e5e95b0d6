/* test_agent_images: the images directory of Checkpoints with action Image (agent_images):
 * paths from names, the per-pod limit (oldest by the manifest's time removed first), the sweep
 * of images whose Checkpoint is gone, and what neither ever removes (partial images, a
 * directory without a manifest, an unknown answer); the descriptor-based copies of an image
 * whose CPU side is the kubelet's (regular files only, never through a symbolic link; a pod's gpu/
 * files only as its table names them, within its bound, without holes); also
 * agent_crobj's spec.action, spec.cpuCheckpoint and a Restore's spec.podName. */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "agent_crobj.h"
#include "agent_images.h"
#include "gcr_image.h"
#include "util.h"

static char root[64];

static int exists_path(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* A committed image at dir (empty criu/ and gpu/, a manifest created at t by node, "": none). */
static void make_node_image(const char *dir, long long t, const char *node)
{
	char partial[PATH_MAX], sub[PATH_MAX + 8];
	struct gcr_err err = { 0, "" };
	CHECK(agent_images_mkparents(dir, &err) == 0);
	CHECK(gcr_image_partial_name(dir, 99, partial, sizeof(partial), &err) == 0);
	CHECK(mkdir(partial, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/criu", partial);
	CHECK(mkdir(sub, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/gpu", partial);
	CHECK(mkdir(sub, 0700) == 0);
	struct gcr_image_manifest m = { 0 };
	m.format = GCR_IMAGE_FORMAT;
	m.created = t;
	m.pid = 7;
	snprintf(m.gcr_version, sizeof(m.gcr_version), "%s", PACKAGE_VERSION);
	snprintf(m.env.gpu_vendor, sizeof(m.env.gpu_vendor), "nvidia");
	snprintf(m.env.gpu_model, sizeof(m.env.gpu_model), "unknown");
	snprintf(m.env.driver, sizeof(m.env.driver), "unknown");
	snprintf(m.env.shim_version, sizeof(m.env.shim_version), "%s", PACKAGE_VERSION);
	snprintf(m.node, sizeof(m.node), "%s", node);
	CHECK(gcr_image_manifest_write(partial, &m, &err) == 0);
	CHECK(gcr_image_commit(partial, dir, &err) == 0);
}

static void make_image(const char *dir, long long t)
{
	make_node_image(dir, t, "");
}

static void path_of(const char *ns, const char *pod, const char *name, char *out)
{
	struct gcr_err err = { 0, "" };
	CHECK(agent_images_path(root, ns, pod, name, out, PATH_MAX, &err) == 0);
}

static void test_path(void)
{
	char p[PATH_MAX];
	struct gcr_err err = { 0, "" };
	CHECK(agent_images_path("/var/lib/gcr/images/", "team-a", "pod-1", "ck.1", p, sizeof(p), &err) == 0);
	CHECK_STR(p, "/var/lib/gcr/images/team-a/pod-1/ck.1");
	CHECK(agent_images_path("rel", "a", "b", "c", p, sizeof(p), &err) == -EINVAL);
	CHECK(agent_images_path("/r", "..", "b", "c", p, sizeof(p), &err) == -EINVAL);
	CHECK(agent_images_path("/r", "a", "b/../..", "c", p, sizeof(p), &err) == -EINVAL);
	CHECK(agent_images_path("/r", "a", "b", "", p, sizeof(p), &err) == -EINVAL);
	CHECK(agent_images_path("/r", "a", "b", "c", p, 8, &err) == -ENAMETOOLONG);
}

static void test_prune(void)
{
	char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX], partial[PATH_MAX], bare[PATH_MAX], pod_dir[PATH_MAX];
	struct gcr_err err = { 0, "" };
	path_of("ns", "p1", "newest", a);
	path_of("ns", "p1", "oldest", b);
	path_of("ns", "p1", "middle", c);
	make_image(a, 300);
	make_image(b, 100);
	make_image(c, 200);
	/* A checkpoint being written, and a directory without a manifest: never removed. */
	snprintf(partial, sizeof(partial), "%s/ns/p1/writing.partial.77", root);
	CHECK(mkdir(partial, 0700) == 0);
	snprintf(bare, sizeof(bare), "%s/ns/p1/bare", root);
	CHECK(mkdir(bare, 0700) == 0);
	snprintf(pod_dir, sizeof(pod_dir), "%s/ns/p1", root);
	CHECK(agent_images_prune(pod_dir, 0, NULL, &err) == -EINVAL);
	CHECK(agent_images_prune(pod_dir, 2, NULL, &err) == 1);
	CHECK(!exists_path(b) && exists_path(a) && exists_path(c));
	CHECK(exists_path(partial) && exists_path(bare));
	CHECK(agent_images_prune(pod_dir, 2, NULL, &err) == 0);
	CHECK(agent_images_prune(pod_dir, 1, NULL, &err) == 1);
	CHECK(!exists_path(c) && exists_path(a));
	/* Nothing named .gc-* is left behind. */
	char gc[PATH_MAX];
	snprintf(gc, sizeof(gc), "%s/ns/p1/.gc-oldest", root);
	CHECK(!exists_path(gc));
	CHECK(agent_images_prune("/nonexistent/gcr-images", 2, NULL, &err) == -ENOENT);
}

/* Checkpoints that exist: "ns/keep"; "ns/unknown" answers unknown. */
static int exists_fn(void *data, const char *ns, const char *name)
{
	int *calls = data;
	(*calls)++;
	if (strcmp(ns, "ns") == 0 && strcmp(name, "keep") == 0)
		return 1;
	if (strcmp(name, "unknown") == 0)
		return -1;
	return 0;
}

static void test_sweep(void)
{
	char keep[PATH_MAX], gone[PATH_MAX], unknown[PATH_MAX], partial[PATH_MAX], bare[PATH_MAX], left[PATH_MAX];
	struct gcr_err err = { 0, "" };
	path_of("ns", "p2", "keep", keep);
	path_of("ns", "p2", "gone", gone);
	path_of("other", "p3", "unknown", unknown);
	make_image(keep, 1);
	make_image(gone, 2);
	make_image(unknown, 3);
	snprintf(partial, sizeof(partial), "%s/ns/p2/gone2.partial.12", root);
	CHECK(mkdir(partial, 0700) == 0);
	snprintf(bare, sizeof(bare), "%s/ns/p2/nomanifest", root);
	CHECK(mkdir(bare, 0700) == 0);
	/* A removal cut short by a crash: the next sweep finishes it. */
	snprintf(left, sizeof(left), "%s/ns/p2/.gc-crashed", root);
	CHECK(mkdir(left, 0700) == 0);
	int calls = 0;
	/* ns/p2/gone, and test_prune's ns/p1/newest (no Checkpoint "newest" either). */
	CHECK(agent_images_sweep(root, NULL, exists_fn, &calls, &err) == 2);
	CHECK(exists_path(keep) && !exists_path(gone) && exists_path(unknown));
	CHECK(exists_path(partial) && exists_path(bare) && !exists_path(left));
	CHECK(calls >= 3);
	CHECK(agent_images_sweep("/nonexistent/gcr-images", NULL, exists_fn, &calls, &err) == 0);
}

/* Images on shared storage (images.shared): each node's retention touches only the images its
 * manifest says it wrote, so two agents never remove, nor count, each other's. */
static void test_owner(void)
{
	char a1[PATH_MAX], a2[PATH_MAX], a3[PATH_MAX], b1[PATH_MAX], b2[PATH_MAX], none[PATH_MAX], pod_dir[PATH_MAX];
	char gc_a[PATH_MAX], gc_b[PATH_MAX], gc_empty[PATH_MAX], sub[PATH_MAX + 16];
	struct gcr_err err = { 0, "" };
	/* One pod name imaged on both nodes (a pod recreated on the other), and an image from
	 * before manifests named the node. */
	path_of("sh", "p", "a-old", a1);
	path_of("sh", "p", "a-mid", a2);
	path_of("sh", "p", "a-new", a3);
	path_of("sh", "p", "b-old", b1);
	path_of("sh", "p", "b-new", b2);
	path_of("sh", "p", "unowned", none);
	make_node_image(a1, 10, "node-a");
	make_node_image(a2, 20, "node-a");
	make_node_image(a3, 30, "node-a");
	make_node_image(b1, 1, "node-b"); /* the oldest of all: node-a must not count it */
	make_node_image(b2, 40, "node-b");
	make_image(none, 0);
	snprintf(pod_dir, sizeof(pod_dir), "%s/sh/p", root);
	/* node-a keeps 2 of its own: only its oldest goes, never node-b's older ones. */
	CHECK(agent_images_prune(pod_dir, 2, "node-a", &err) == 1);
	CHECK(!exists_path(a1) && exists_path(a2) && exists_path(a3));
	CHECK(exists_path(b1) && exists_path(b2) && exists_path(none));
	CHECK(agent_images_prune(pod_dir, 1, "node-b", &err) == 1);
	CHECK(!exists_path(b1) && exists_path(b2) && exists_path(a2) && exists_path(a3));
	/* A node name that is a prefix of another's is not its owner. */
	CHECK(agent_images_prune(pod_dir, 1, "node", &err) == 0);
	CHECK(exists_path(a2) && exists_path(a3) && exists_path(b2));
	/* Removals cut short by a crash: node-a's with its manifest, node-b's, and an empty one. */
	snprintf(gc_a, sizeof(gc_a), "%s/sh/p/.gc-a-x", root);
	snprintf(gc_b, sizeof(gc_b), "%s/sh/p/.gc-b-x", root);
	snprintf(gc_empty, sizeof(gc_empty), "%s/sh/p/.gc-e-x", root);
	make_node_image(gc_a, 5, "node-a");
	make_node_image(gc_b, 5, "node-b");
	CHECK(mkdir(gc_empty, 0700) == 0);
	snprintf(sub, sizeof(sub), "%s/criu", gc_b);
	CHECK(exists_path(sub));
	/* node-b's sweep: no Checkpoint exists for any of them ("sh" is not "ns"). */
	int calls = 0;
	CHECK(agent_images_sweep(root, "node-b", exists_fn, &calls, &err) >= 1);
	CHECK(!exists_path(b2) && exists_path(a2) && exists_path(a3) && exists_path(none));
	CHECK(!exists_path(gc_b) && exists_path(gc_a) && !exists_path(gc_empty));
	CHECK(agent_images_sweep(root, "node-a", exists_fn, &calls, &err) >= 2);
	CHECK(!exists_path(a2) && !exists_path(a3) && !exists_path(gc_a));
	/* Nobody's image stays on shared storage; the node-local sweep (no owner) takes it. */
	CHECK(exists_path(none));
	CHECK(agent_images_sweep(root, NULL, exists_fn, &calls, &err) >= 1);
	CHECK(!exists_path(none));
}

/* The manifest's node: written when set, read back, absent when unset, refused when empty or
 * not a string. */
static void test_manifest_node(void)
{
	char dir[PATH_MAX], mpath[PATH_MAX + 32];
	struct gcr_err err = { 0, "" };
	path_of("mf", "p", "n1", dir);
	make_node_image(dir, 1, "gcr-node-2");
	snprintf(mpath, sizeof(mpath), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	char *buf = NULL;
	size_t len = 0;
	struct gcr_image_manifest m;
	CHECK(gcr_image_read_file(mpath, GCR_IMAGE_MAX_JSON, &buf, &len, &err) == 0);
	CHECK(gcr_image_manifest_parse(buf, len, &m, &err) == 0);
	CHECK_STR(m.node, "gcr-node-2");
	gcr_image_manifest_clear(&m);
	/* The same manifest with "node" replaced: "" and a number are refused. */
	char *at = strstr(buf, "\"gcr-node-2\"");
	CHECK(at != NULL);
	if (at != NULL) {
		memcpy(at, "\"\"          ", 12);
		CHECK(gcr_image_manifest_parse(buf, len, &m, &err) == -EBADMSG);
		memcpy(at, "12          ", 12);
		CHECK(gcr_image_manifest_parse(buf, len, &m, &err) == -EBADMSG);
	}
	free(buf);
	path_of("mf", "p", "n2", dir);
	make_image(dir, 1);
	snprintf(mpath, sizeof(mpath), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	CHECK(gcr_image_read_file(mpath, GCR_IMAGE_MAX_JSON, &buf, &len, &err) == 0);
	CHECK(strstr(buf, "\"node\"") == NULL);
	CHECK(gcr_image_manifest_parse(buf, len, &m, &err) == 0 && m.node[0] == '\0');
	gcr_image_manifest_clear(&m);
	free(buf);
}

static void test_action(void)
{
	struct agent_crobj o;
	struct gcr_err err = { 0, "" };
	const char *head = "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"uid\":\"u-1\"},\"spec\":{\"podName\":\"p\"";
	const struct {
		const char *spec;
		int rc;
		enum agent_crobj_action action;
	} cases[] = {
		{ "", 0, AGENT_ACTION_SUSPEND },
		{ ",\"action\":\"Suspend\"", 0, AGENT_ACTION_SUSPEND },
		{ ",\"action\":\"Image\"", 0, AGENT_ACTION_IMAGE },
		{ ",\"action\":\"image\"", -EINVAL, AGENT_ACTION_SUSPEND },
		{ ",\"action\":7", -EINVAL, AGENT_ACTION_SUSPEND },
		{ ",\"action\":\"Image\",\"keepContext\":true", -EINVAL, AGENT_ACTION_IMAGE },
		{ ",\"action\":\"Image\",\"keepContext\":false", 0, AGENT_ACTION_IMAGE },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[512];
		snprintf(text, sizeof(text), "%s%s}}", head, cases[i].spec);
		json_t *obj = json_loads(text, 0, NULL);
		int rc = agent_crobj_decode(obj, AGENT_CROBJ_CHECKPOINT, &o, &err);
		CHECK(rc == cases[i].rc);
		if (rc == 0)
			CHECK(o.action == cases[i].action);
		json_decref(obj);
	}
}

static void test_cpu_checkpoint(void)
{
	struct agent_crobj o;
	struct gcr_err err = { 0, "" };
	const char *md = "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"c\",\"uid\":\"u-1\"},\"spec\":{";
	const struct {
		enum agent_crobj_kind kind;
		const char *spec;
		int rc, kubelet;
		const char *pod;
	} cases[] = {
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"action\":\"Image\"", 0, 0, "" },
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"action\":\"Image\",\"cpuCheckpoint\":\"Agent\"", 0, 0, "" },
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"action\":\"Image\",\"cpuCheckpoint\":\"Kubelet\"", 0, 1, "" },
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"cpuCheckpoint\":\"Kubelet\"", -EINVAL, 0, "" },
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"action\":\"Image\",\"cpuCheckpoint\":\"kubelet\"", -EINVAL, 0, "" },
		{ AGENT_CROBJ_CHECKPOINT, "\"podName\":\"p\",\"action\":\"Image\",\"cpuCheckpoint\":1", -EINVAL, 0, "" },
		{ AGENT_CROBJ_RESTORE, "\"checkpointName\":\"c\"", 0, 0, "" },
		{ AGENT_CROBJ_RESTORE, "\"checkpointName\":\"c\",\"podName\":\"new-pod\"", 0, 0, "new-pod" },
		{ AGENT_CROBJ_RESTORE, "\"checkpointName\":\"c\",\"podName\":\"../x\"", -EINVAL, 0, "" },
		{ AGENT_CROBJ_RESTORE, "\"checkpointName\":\"c\",\"podName\":\"\"", -EINVAL, 0, "" },
		{ AGENT_CROBJ_RESTORE, "\"checkpointName\":\"c\",\"podName\":3", -EINVAL, 0, "" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[512];
		snprintf(text, sizeof(text), "%s%s}}", md, cases[i].spec);
		json_t *obj = json_loads(text, 0, NULL);
		CHECK(obj != NULL);
		int rc = agent_crobj_decode(obj, cases[i].kind, &o, &err);
		CHECK(rc == cases[i].rc);
		if (rc == 0) {
			CHECK(o.cpu_kubelet == cases[i].kubelet);
			CHECK_STR(o.pod, cases[i].pod);
		}
		json_decref(obj);
	}
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	CHECK(f != NULL);
	if (f != NULL) {
		fputs(text, f);
		fclose(f);
	}
}

static void test_copy(void)
{
	char src[PATH_MAX], dst[PATH_MAX], p[PATH_MAX + 64];
	struct gcr_err err = { 0, "" };
	snprintf(src, sizeof(src), "%s/copy-src", root);
	snprintf(dst, sizeof(dst), "%s/copy-dst", root);
	CHECK(mkdir(src, 0700) == 0 && mkdir(dst, 0700) == 0);
	snprintf(p, sizeof(p), "%s/gpu", src);
	CHECK(mkdir(p, 0700) == 0);
	snprintf(p, sizeof(p), "%s/gpu/a.bin", src);
	write_file(p, "0123456789");
	snprintf(p, sizeof(p), "%s/gpu/allocs.json", src);
	write_file(p, "{}");
	int sfd = open(src, O_RDONLY | O_DIRECTORY), dfd = open(dst, O_RDONLY | O_DIRECTORY);
	CHECK(sfd >= 0 && dfd >= 0);
	CHECK(agent_images_copy_dir(sfd, dfd, "gpu", &err) == 12);
	snprintf(p, sizeof(p), "%s/gpu/a.bin", dst);
	struct stat st;
	CHECK(stat(p, &st) == 0 && st.st_size == 10 && (st.st_mode & 0777) == 0600);
	/* Again: the destination exists, never written over. */
	CHECK(agent_images_copy_dir(sfd, dfd, "gpu", &err) == -EEXIST);
	/* A symbolic link among the files, or as the directory: refused. */
	snprintf(p, sizeof(p), "%s/gpu/link", src);
	CHECK(symlink("/etc/passwd", p) == 0);
	agent_images_remove_at(dfd, "gpu");
	snprintf(p, sizeof(p), "%s/gpu", dst);
	CHECK(!exists_path(p));
	CHECK(agent_images_copy_dir(sfd, dfd, "gpu", &err) < 0);
	CHECK(strstr(err.msg, "link") != NULL);
	snprintf(p, sizeof(p), "%s/lgpu", src);
	CHECK(symlink("gpu", p) == 0);
	CHECK(agent_images_copy_dir(sfd, dfd, "lgpu", &err) == -ELOOP || err.code == -ENOTDIR);
	/* One file: a link refused, a regular file copied, never over an existing one. */
	char a[PATH_MAX + 64], b[PATH_MAX + 64];
	snprintf(a, sizeof(a), "%s/gpu/a.bin", src);
	snprintf(b, sizeof(b), "%s/one.tar", dst);
	CHECK(agent_images_copy_file(a, b, &err) == 10);
	CHECK(agent_images_copy_file(a, b, &err) == -EEXIST);
	snprintf(a, sizeof(a), "%s/gpu/link", src);
	snprintf(b, sizeof(b), "%s/two.tar", dst);
	CHECK(agent_images_copy_file(a, b, &err) == -ELOOP);
	agent_images_remove_at(sfd, "gpu");
	snprintf(p, sizeof(p), "%s/gpu", src);
	CHECK(!exists_path(p));
	close(sfd);
	close(dfd);
}

/* The checked copy of a signed image's gpu/: each file's SHA-256 against the manifest's entry. */
static void test_copy_checked(void)
{
	char src[PATH_MAX], dst[PATH_MAX], p[PATH_MAX + 64];
	struct gcr_err err = { 0, "" };
	snprintf(src, sizeof(src), "%s/chk-src", root);
	snprintf(dst, sizeof(dst), "%s/chk-dst", root);
	CHECK(mkdir(src, 0700) == 0 && mkdir(dst, 0700) == 0);
	snprintf(p, sizeof(p), "%s/gpu", src);
	CHECK(mkdir(p, 0700) == 0);
	snprintf(p, sizeof(p), "%s/gpu/a.bin", src);
	write_file(p, "0123456789");
	struct gcr_image_file files[1] = { { .path = "gpu/a.bin", .size = 10, .has_sha = 1 } };
	struct gcr_sha256 s;
	gcr_sha256_init(&s);
	gcr_sha256_update(&s, "0123456789", 10);
	gcr_sha256_final(&s, files[0].sha);
	struct gcr_image_manifest m = { .nfiles = 1, .files = files, .signed_ok = 1 };
	int sfd = open(src, O_RDONLY | O_DIRECTORY), dfd = open(dst, O_RDONLY | O_DIRECTORY);
	CHECK(sfd >= 0 && dfd >= 0);
	CHECK(agent_images_copy_dir_checked(sfd, dfd, "gpu", &m, &err) == 10);
	agent_images_remove_at(dfd, "gpu");
	/* The same length, one byte changed: refused, naming the file. */
	snprintf(p, sizeof(p), "%s/gpu/a.bin", src);
	write_file(p, "0123456780");
	CHECK(agent_images_copy_dir_checked(sfd, dfd, "gpu", &m, &err) == -EIO &&
	      strstr(err.msg, "gpu/a.bin: SHA-256 does not match") != NULL);
	agent_images_remove_at(dfd, "gpu");
	/* A file the manifest does not list: refused. */
	write_file(p, "0123456789");
	snprintf(p, sizeof(p), "%s/gpu/extra.bin", src);
	write_file(p, "x");
	CHECK(agent_images_copy_dir_checked(sfd, dfd, "gpu", &m, &err) == -EIO &&
	      strstr(err.msg, "not in the signed manifest") != NULL);
	agent_images_remove_at(dfd, "gpu");
	agent_images_remove_at(sfd, "gpu");
	close(sfd);
	close(dfd);
}

/* A pod's gpu/ as the shim writes it: allocation 1 (4 MiB: one 2 MiB chunk of data, one zero),
 * allocation 2 (1 MiB, all zero: no file), the table. */
#define DATA_LEN (2u << 20)
static const char *table_json =
	"{\"allocs\":[{\"address\":4096,\"size\":4194304,\"slot\":1,\"gen\":0,\"file\":\"gpu/alloc-1-0.bin\","
	"\"chunks\":[{\"off\":0,\"len\":2097152,\"crc32c\":\"00000000\"},\"zero\"]},"
	"{\"address\":8192,\"size\":1048576,\"slot\":2,\"gen\":0,\"file\":\"gpu/alloc-2-0.bin\",\"chunks\":[\"zero\"]}]}";

static void pod_gpu_dir(const char *src, int sparse_data)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "rm -rf %s && mkdir -p %s/gpu", src, src);
	CHECK(system(p) == 0);
	snprintf(p, sizeof(p), "%s/gpu/allocs.json", src);
	write_file(p, table_json);
	snprintf(p, sizeof(p), "%s/gpu/alloc-1-0.bin", src);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
	CHECK(fd >= 0);
	if (sparse_data) {
		CHECK(ftruncate(fd, DATA_LEN) == 0); /* all hole: 0 bytes of the pod's disk */
	} else {
		static char buf[DATA_LEN];
		memset(buf, 7, sizeof(buf));
		CHECK(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf));
	}
	close(fd);
}

/* copy_gpu from src into a fresh dst; its result, err's message in msg. */
static long long copy_gpu(const char *src, const char *dst, unsigned long long bound, struct gcr_image_table *t,
			  char *msg)
{
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "rm -rf %s && mkdir -p %s", dst, dst);
	CHECK(system(p) == 0);
	struct gcr_err err = { 0, "" };
	int sfd = open(src, O_RDONLY | O_DIRECTORY), dfd = open(dst, O_RDONLY | O_DIRECTORY);
	long long n = agent_images_copy_gpu(sfd, dfd, bound, t, &err);
	snprintf(msg, GCR_ERR_MSG_MAX, "%s", err.msg);
	close(sfd);
	close(dfd);
	return n;
}

static double cached(const char *path);

static void test_copy_gpu(void)
{
	char src[PATH_MAX], dst[PATH_MAX], p[2 * PATH_MAX + 64], msg[GCR_ERR_MSG_MAX];
	struct gcr_image_table t;
	struct stat st;
	snprintf(src, sizeof(src), "%s/pod", root);
	snprintf(dst, sizeof(dst), "%s/img", root);
	/* Whole: the table's files, each its chunks' size, the table as read. */
	pod_gpu_dir(src, 0);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == (long long)(DATA_LEN + strlen(table_json)));
	CHECK(t.n == 2 && t.a[0].nchunks == 2 && gcr_image_alloc_need(&t.a[0]) == DATA_LEN);
	gcr_image_table_clear(&t);
	snprintf(p, sizeof(p), "%s/gpu/alloc-1-0.bin", dst);
	CHECK(stat(p, &st) == 0 && st.st_size == DATA_LEN && (st.st_mode & 0777) == 0600);
	double cd = cached(p); /* written back and dropped, as copy_file's (test_copy_drops_cache) */
	CHECK(cd >= 0 && cd < 0.05);
	snprintf(p, sizeof(p), "%s/gpu/alloc-2-0.bin", dst);
	CHECK(!exists_path(p));
	/* Past the pod's bound (what it held on the GPU, its ephemeral-storage limit): nothing written. */
	CHECK(copy_gpu(src, dst, DATA_LEN - 1, &t, msg) == -EFBIG && strstr(msg, "more than") != NULL);
	snprintf(p, sizeof(p), "%s/gpu", dst);
	CHECK(!exists_path(p) && t.n == 0 && t.a == NULL);
	/* A file the table does not name (the 12 KB sparse file of the audit). */
	snprintf(p, sizeof(p), "truncate -s 1G %s/gpu/filler.bin", src);
	CHECK(system(p) == 0);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == -EINVAL && strstr(msg, "filler.bin is not in") != NULL);
	/* The table's file with holes, or of another size, or missing, or a link. */
	pod_gpu_dir(src, 1);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == -EINVAL && strstr(msg, "sparse") != NULL);
	pod_gpu_dir(src, 0);
	snprintf(p, sizeof(p), "truncate -s 1M %s/gpu/alloc-1-0.bin", src);
	CHECK(system(p) == 0);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == -EINVAL && strstr(msg, "chunks need") != NULL);
	snprintf(p, sizeof(p), "rm %s/gpu/alloc-1-0.bin", src);
	CHECK(system(p) == 0);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == -EINVAL && strstr(msg, "missing") != NULL);
	snprintf(p, sizeof(p), "ln -s /etc/passwd %s/gpu/alloc-1-0.bin", src);
	CHECK(system(p) == 0);
	CHECK(copy_gpu(src, dst, 8u << 20, &t, msg) == -EINVAL && strstr(msg, "regular") != NULL);
	/* A table past its bound is not even read; one that names a file outside gpu/ is refused. */
	pod_gpu_dir(src, 0);
	snprintf(p, sizeof(p), "truncate -s %llu %s/gpu/allocs.json", GCR_IMAGE_MAX_TABLE + 1, src);
	CHECK(system(p) == 0);
	CHECK(copy_gpu(src, dst, 1ull << 40, &t, msg) == -EFBIG);
	snprintf(p, sizeof(p), "%s/gpu/allocs.json", src);
	unlink(p);
	write_file(p, "{\"allocs\":[{\"address\":1,\"size\":1,\"slot\":1,\"gen\":0,\"file\":\"gpu/x/y.bin\","
		      "\"chunks\":[\"zero\"]}]}");
	CHECK(copy_gpu(src, dst, 1ull << 40, &t, msg) == -EINVAL && strstr(msg, "not a data file") != NULL);
	snprintf(p, sizeof(p), "rm -rf %s %s", src, dst);
	CHECK(system(p) == 0);
}

static int owned_by_list(void *data, const char *path)
{
	for (const char *const *p = data; *p != NULL; p++)
		if (strcmp(*p, path) == 0)
			return 1;
	return 0;
}

/* What a pod writes in its image directory goes (once a minute old) unless an Image in flight
 * owns it, links never followed; a socket directory's image-* only once older than any
 * operation; a partial image only once older than any image's run and unowned. */
static void test_leftovers(void)
{
	char alloc[PATH_MAX], sock[PATH_MAX], p[PATH_MAX + 64], q[PATH_MAX + 128], keep[PATH_MAX + 64], victim[PATH_MAX];
	snprintf(alloc, sizeof(alloc), "%s/.alloc/00ab", root);
	snprintf(sock, sizeof(sock), "%s/sockroot/00ab", root);
	snprintf(p, sizeof(p), "%s/.alloc", root);
	CHECK(mkdir(p, 0711) == 0 && mkdir(alloc, 01733) == 0);
	snprintf(p, sizeof(p), "%s/sockroot", root);
	CHECK(mkdir(p, 0700) == 0 && mkdir(sock, 01733) == 0);
	/* Outside, what a link must never lead the sweep to. */
	snprintf(victim, sizeof(victim), "%.200s/victim", root);
	CHECK(mkdir(victim, 0700) == 0);
	snprintf(p, sizeof(p), "%s/precious", victim);
	write_file(p, "x");
	/* The pod's junk: a deep tree, a big file, a link to the victim; an Image's work directory. */
	snprintf(p, sizeof(p), "%s/junk", alloc);
	CHECK(mkdir(p, 0700) == 0);
	for (int d = 0; d < 5; d++) {
		strncat(p, "/d", sizeof(p) - strlen(p) - 1);
		CHECK(mkdir(p, 0700) == 0);
	}
	strncat(p, "/f", sizeof(p) - strlen(p) - 1);
	write_file(p, "junk");
	snprintf(p, sizeof(p), "%s/big.bin", alloc);
	write_file(p, "0123456789");
	snprintf(p, sizeof(p), "%s/link", alloc);
	CHECK(symlink(victim, p) == 0);
	snprintf(keep, sizeof(keep), "%s/0b6c5a1e-uid", alloc);
	CHECK(mkdir(keep, 0700) == 0);
	const char *owned[] = { keep, NULL };
	/* A socket directory: a shim's socket stays; image-* only once older than any operation. */
	snprintf(p, sizeof(p), "%s/gcr-1-2.sock", sock);
	write_file(p, "");
	snprintf(p, sizeof(p), "%s/image-old", sock);
	CHECK(mkdir(p, 0700) == 0);
	snprintf(q, sizeof(q), "%s/gpu.bin", p);
	write_file(q, "g");
	snprintf(p, sizeof(p), "%s/sockroot", root);
	long long now = (long long)time(NULL);
	/* Just made (the sweep may have read its list before an Image recorded them): kept. */
	CHECK(agent_images_sweep_allocs(root, p, owned_by_list, owned, now) == 0);
	/* Later: the pod's junk goes, the owned work and the socket dir's entries stay. */
	CHECK(agent_images_sweep_allocs(root, p, owned_by_list, owned, now + AGENT_IMAGES_ALLOC_MIN_AGE_S + 1) == 3);
	snprintf(q, sizeof(q), "%s/junk", alloc);
	CHECK(!exists_path(q));
	snprintf(q, sizeof(q), "%s/big.bin", alloc);
	CHECK(!exists_path(q));
	snprintf(q, sizeof(q), "%s/link", alloc);
	struct stat st;
	CHECK(lstat(q, &st) < 0);
	snprintf(q, sizeof(q), "%s/precious", victim);
	CHECK(exists_path(q));
	CHECK(exists_path(keep));
	snprintf(q, sizeof(q), "%s/image-old", sock);
	CHECK(exists_path(q));
	/* Past any operation's bound: the socket dir's image-* goes, its socket stays. */
	CHECK(agent_images_sweep_allocs(root, p, owned_by_list, owned, now + AGENT_IMAGES_PARTIAL_MAX_AGE_S + 1) == 1);
	CHECK(!exists_path(q));
	snprintf(q, sizeof(q), "%s/gcr-1-2.sock", sock);
	CHECK(exists_path(q));
	CHECK(exists_path(keep));

	/* Partial images: an old one nobody owns goes; an owned one, a young one and an image stay. */
	char img[PATH_MAX], part[PATH_MAX], part2[PATH_MAX];
	path_of("team-p", "pod", "ck", img);
	make_image(img, 5);
	struct gcr_err err = { 0, "" };
	CHECK(gcr_image_partial_name(img, 11, part, sizeof(part), &err) == 0);
	CHECK(gcr_image_partial_name(img, 12, part2, sizeof(part2), &err) == 0);
	CHECK(mkdir(part, 0700) == 0 && mkdir(part2, 0700) == 0);
	const char *owned2[] = { part2, NULL };
	CHECK(agent_images_sweep_partials(root, owned_by_list, owned2, (long long)time(NULL)) == 0);
	/* (test_sweep's partials are among them) */
	CHECK(agent_images_sweep_partials(root, owned_by_list, owned2,
					  (long long)time(NULL) + AGENT_IMAGES_PARTIAL_MAX_AGE_S + 1) >= 1);
	CHECK(!exists_path(part) && exists_path(part2) && exists_path(img));
	gcr_image_remove(part2);
}

/* Share of the file at path in the page cache (0 to 1), or -1. */
static double cached(const char *path)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return -1;
	long pg = sysconf(_SC_PAGESIZE);
	size_t pages = ((size_t)st.st_size + (size_t)pg - 1) / (size_t)pg, in = 0;
	unsigned char *v = malloc(pages);
	if (v == NULL || mincore(m, (size_t)st.st_size, v) < 0) {
		free(v);
		munmap(m, (size_t)st.st_size);
		return -1;
	}
	for (size_t i = 0; i < pages; i++)
		in += v[i] & 1;
	free(v);
	munmap(m, (size_t)st.st_size);
	return (double)in / (double)pages;
}

/* A large copy (an image's GPU data, 16 GB on a GPU node) leaves neither file in the page cache,
 * whose pages the agent's memory cgroup is charged for: with the plain copy, 100% of both stayed
 * (and on the GPU node the dirty ones got the agent OOM-killed). Needs a disk, not tmpfs. */
static void test_copy_drops_cache(void)
{
	char dir[PATH_MAX], src[PATH_MAX + 16], dst[PATH_MAX + 16];
	struct statfs sf;
	snprintf(dir, sizeof(dir), "%s", root);
	if (statfs(root, &sf) == 0 && sf.f_type == 0x01021994 /* TMPFS_MAGIC */)
		snprintf(dir, sizeof(dir), "test-agent-images-big"); /* the build tree */
	CHECK(strcmp(dir, root) == 0 || mkdir(dir, 0700) == 0 || errno == EEXIST);
	snprintf(src, sizeof(src), "%s/big-src", dir);
	snprintf(dst, sizeof(dst), "%s/big-dst", dir);
	const size_t mib = 1u << 20, n = 80;
	char *b = malloc(mib);
	int fd = open(src, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CHECK(b != NULL && fd >= 0);
	for (size_t i = 0; b != NULL && fd >= 0 && i < n; i++) {
		memset(b, (int)(i & 0xff), mib);
		CHECK(write(fd, b, mib) == (ssize_t)mib);
	}
	CHECK(fd >= 0 && fsync(fd) == 0);
	if (fd >= 0)
		close(fd);
	struct gcr_err err = { 0, "" };
	CHECK(agent_images_copy_file(src, dst, &err) == (long long)(n * mib));
	double cs = cached(src), cd = cached(dst);
	CHECK(cs >= 0 && cs < 0.05);
	CHECK(cd >= 0 && cd < 0.05);
	if (cs < 0 || cs >= 0.05 || cd < 0 || cd >= 0.05)
		fprintf(stderr, "cached after the copy: source %.2f, copy %.2f\n", cs, cd);
	/* And the copy is whole. */
	fd = open(dst, O_RDONLY);
	int same = fd >= 0 && b != NULL;
	for (size_t i = 0; same && i < n; i++) {
		same = read(fd, b, mib) == (ssize_t)mib;
		for (size_t k = 0; same && k < mib; k += 4096)
			same = (unsigned char)b[k] == (i & 0xff);
	}
	CHECK(same);
	if (fd >= 0)
		close(fd);
	free(b);
	unlink(src);
	unlink(dst);
	if (strcmp(dir, root) != 0)
		rmdir(dir);
}

int main(void)
{
	snprintf(root, sizeof(root), "/tmp/test-agent-images-XXXXXX");
	if (mkdtemp(root) == NULL)
		return 1;
	test_path();
	test_prune();
	test_sweep();
	test_owner();
	test_manifest_node();
	test_action();
	test_cpu_checkpoint();
	test_copy_checked();
	test_copy();
	test_copy_gpu();
	test_copy_drops_cache();
	test_leftovers();
	gcr_image_remove(root);
	return test_summary("test_agent_images");
}
