/* test_agent_ociimg: the node registry's pure half: SHA-256 against known digests, the request
 * paths accepted and refused (every segment), the token, and the image built around a layer
 * (its documents' digests are their own sha256; the annotation containerd restores from). */
#include "agent_ociimg.h"
#include "util.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>

static void test_sha256(void)
{
	char hex[GCR_SHA256_HEX];
	gcr_sha256_hex("", 0, hex);
	CHECK_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	gcr_sha256_hex("abc", 3, hex);
	CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	gcr_sha256_hex(two, strlen(two), hex);
	CHECK_STR(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	/* A million 'a' fed in uneven pieces: the buffering across blocks. */
	static char a[1000000];
	memset(a, 'a', sizeof(a));
	struct gcr_sha256 s;
	uint8_t d[GCR_SHA256_LEN];
	gcr_sha256_init(&s);
	size_t off = 0, step = 1;
	while (off < sizeof(a)) {
		size_t n = step < sizeof(a) - off ? step : sizeof(a) - off;
		gcr_sha256_update(&s, a + off, n);
		off += n;
		step = step * 7 % 997 + 1;
	}
	gcr_sha256_final(&s, d);
	gcr_sha256_to_hex(d, hex);
	CHECK_STR(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static int parse(const char *p, struct agent_ocireq *q)
{
	struct gcr_err err = { 0 };
	int rc = agent_ociimg_parse(p, strlen(p), q, &err);
	CHECK(rc == 0 || (err.code == rc && err.msg[0] != '\0'));
	return rc;
}

#define D64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define TOK "00112233445566778899aabbccddeeff"

static void test_parse(void)
{
	struct agent_ocireq q;
	CHECK(parse("/v2/", &q) == 0 && q.kind == AGENT_OCIREQ_BASE);
	CHECK(parse("/v2/gcr-evict/team-a/evict-web-0-1a2b3c4d/manifests/" TOK, &q) == 0);
	CHECK(q.kind == AGENT_OCIREQ_MANIFEST && !q.is_digest);
	CHECK_STR(q.ns, "team-a");
	CHECK_STR(q.name, "evict-web-0-1a2b3c4d");
	CHECK_STR(q.ref, TOK);
	CHECK(parse("/v2/gcr-evict/a/b.c/manifests/sha256:" D64, &q) == 0 && q.is_digest);
	CHECK_STR(q.ref, "sha256:" D64);
	CHECK(parse("/v2/gcr-evict/a/b/blobs/sha256:" D64, &q) == 0 && q.kind == AGENT_OCIREQ_BLOB && q.is_digest);
	/* Refused: other repositories, shapes, names, references. */
	const char *bad[] = {
		"", "/", "/v2", "/v2//", "/v2/x", "/v1/", "/v2/gcr-evict/", "/v2/gcr-evict/a/b/manifests/",
		"/v2/other/a/b/manifests/" TOK, "/v2/gcr-evict/a/b/manifests/" TOK "/",
		"/v2/gcr-evict/a/b/c/manifests/" TOK, "/v2/gcr-evict/A/b/manifests/" TOK,
		"/v2/gcr-evict/a/../manifests/" TOK, "/v2/gcr-evict/../b/manifests/" TOK,
		"/v2/gcr-evict/a/b./manifests/" TOK, "/v2/gcr-evict/a/.b/manifests/" TOK,
		"/v2/gcr-evict/a/b..c/manifests/" TOK, "/v2/gcr-evict/-a/b/manifests/" TOK,
		"/v2/gcr-evict/a.b/c/manifests/" TOK, "/v2/gcr-evict/a/b/tags/list",
		"/v2/gcr-evict/a/b/manifests/latest", "/v2/gcr-evict/a/b/manifests/" TOK "0",
		"/v2/gcr-evict/a/b/manifests/00112233445566778899AABBCCDDEEFF",
		"/v2/gcr-evict/a/b/blobs/" TOK, "/v2/gcr-evict/a/b/blobs/sha512:" D64,
		"/v2/gcr-evict/a/b/blobs/sha256:" D64 "0", "/v2/gcr-evict/a/b/blobs/sha256:" D64 "/x",
		"/v2/gcr-evict/a/b/manifests/sha256:0123", "/v2/gcr-evict/a%2Fb/c/manifests/" TOK,
		"/v2/gcr-evict/a/b/blobs/uploads/",
		"/v2/gcr-evict/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/b/manifests/" TOK,
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse(bad[i], &q);
		CHECK(rc == -EINVAL);
		if (rc != -EINVAL)
			fprintf(stderr, "accepted: %s\n", bad[i]);
	}
	/* A NUL inside the given length. */
	struct gcr_err err = { 0 };
	CHECK(agent_ociimg_parse("/v2/\0", 5, &q, &err) == -EINVAL);
	/* Length, not NUL, bounds the path. */
	CHECK(agent_ociimg_parse("/v2/xyz", 4, &q, &err) == 0 && q.kind == AGENT_OCIREQ_BASE);
}

static void test_token(void)
{
	char a[AGENT_OCIIMG_TOKEN_LEN + 1], b[AGENT_OCIIMG_TOKEN_LEN + 1];
	struct gcr_err err = { 0 };
	CHECK(agent_ociimg_token(a, &err) == 0 && agent_ociimg_token(b, &err) == 0);
	CHECK(agent_ociimg_token_valid(a) && agent_ociimg_token_valid(b) && strcmp(a, b) != 0);
	CHECK(!agent_ociimg_token_valid(NULL) && !agent_ociimg_token_valid("") && !agent_ociimg_token_valid(TOK "0"));
	CHECK(!agent_ociimg_token_valid("0011223344556677889900aabbccddeG"));
	char ref[200];
	CHECK(agent_ociimg_ref(5055, "ns", "ck", a, ref, sizeof(ref)) == 0);
	CHECK(strncmp(ref, "127.0.0.1:5055/gcr-evict/ns/ck:", 31) == 0 && strcmp(ref + 31, a) == 0);
	struct agent_ocireq q;
	char path[300];
	/* The reference the scaler writes becomes a path the registry accepts. */
	snprintf(path, sizeof(path), "/v2/gcr-evict/ns/ck/manifests/%s", strrchr(ref, ':') + 1);
	CHECK(parse(path, &q) == 0 && strcmp(q.ref, a) == 0);
	CHECK(agent_ociimg_ref(5055, "ns", "ck", a, ref, 20) == -ENAMETOOLONG);
}

static int digest_of(const char *doc, const char *digest)
{
	char hex[GCR_SHA256_HEX], want[80];
	gcr_sha256_hex(doc, strlen(doc), hex);
	snprintf(want, sizeof(want), "sha256:%s", hex);
	return strcmp(want, digest) == 0;
}

static void test_build(void)
{
	struct agent_ociimg img;
	struct gcr_err err = { 0 };
	CHECK(agent_ociimg_build("main", D64, 12345, &img, &err) == 0);
	CHECK(digest_of(img.config, img.config_digest) && digest_of(img.manifest, img.manifest_digest) &&
	      digest_of(img.index, img.index_digest));
	CHECK_STR(img.layer_digest, "sha256:" D64);
	json_t *ix = json_loads(img.index, 0, NULL), *mf = json_loads(img.manifest, 0, NULL);
	CHECK(ix != NULL && mf != NULL);
	CHECK_STR(json_string_value(json_object_get(json_object_get(ix, "annotations"), AGENT_OCIIMG_CKPT_ANNOTATION)),
		  "main");
	json_t *m0 = json_array_get(json_object_get(ix, "manifests"), 0);
	CHECK_STR(json_string_value(json_object_get(m0, "digest")), img.manifest_digest);
	CHECK(json_integer_value(json_object_get(m0, "size")) == (json_int_t)strlen(img.manifest));
	json_t *l0 = json_array_get(json_object_get(mf, "layers"), 0);
	CHECK(json_integer_value(json_object_get(l0, "size")) == 12345);
	CHECK_STR(json_string_value(json_object_get(json_object_get(mf, "config"), "digest")), img.config_digest);
	json_decref(ix);
	json_decref(mf);
	agent_ociimg_clear(&img);
	agent_ociimg_clear(&img); /* twice: safe */
	CHECK(agent_ociimg_build("main", "xyz", 1, &img, &err) == -EINVAL);
	CHECK(agent_ociimg_build("", D64, 1, &img, &err) == -EINVAL);
}

int main(void)
{
	test_sha256();
	test_parse();
	test_token();
	test_build();
	return test_summary("test_agent_ociimg");
}
