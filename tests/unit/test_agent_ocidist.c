/* test_agent_ocidist: the node registry's pure half: SHA-256 against known digests, the request
 * paths accepted and refused (every segment), the token, and the container image built around a
 * layer (its documents' digests are their own sha256; the annotation containerd restores from). */
#include "agent_ocidist.h"
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
	int rc = agent_ocidist_parse(p, strlen(p), q, &err);
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
	CHECK(agent_ocidist_parse("/v2/\0", 5, &q, &err) == -EINVAL);
	/* Length, not NUL, bounds the path. */
	CHECK(agent_ocidist_parse("/v2/xyz", 4, &q, &err) == 0 && q.kind == AGENT_OCIREQ_BASE);
}

static void test_token(void)
{
	char a[AGENT_OCIDIST_TOKEN_LEN + 1], b[AGENT_OCIDIST_TOKEN_LEN + 1];
	struct gcr_err err = { 0 };
	CHECK(agent_ocidist_token(a, &err) == 0 && agent_ocidist_token(b, &err) == 0);
	CHECK(agent_ocidist_token_valid(a) && agent_ocidist_token_valid(b) && strcmp(a, b) != 0);
	CHECK(!agent_ocidist_token_valid(NULL) && !agent_ocidist_token_valid("") && !agent_ocidist_token_valid(TOK "0"));
	CHECK(!agent_ocidist_token_valid("0011223344556677889900aabbccddeG"));
	char ref[200];
	CHECK(agent_ocidist_ref(5055, "ns", "ck", a, ref, sizeof(ref)) == 0);
	CHECK(strncmp(ref, "127.0.0.1:5055/gcr-evict/ns/ck:", 31) == 0 && strcmp(ref + 31, a) == 0);
	struct agent_ocireq q;
	char path[300];
	/* The reference the scaler writes becomes a path the registry accepts. */
	snprintf(path, sizeof(path), "/v2/gcr-evict/ns/ck/manifests/%s", strrchr(ref, ':') + 1);
	CHECK(parse(path, &q) == 0 && strcmp(q.ref, a) == 0);
	CHECK(agent_ocidist_ref(5055, "ns", "ck", a, ref, 20) == -ENAMETOOLONG);
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
	struct agent_ocidist_image img;
	struct gcr_err err = { 0 };
	CHECK(agent_ocidist_build("main", D64, 12345, &img, &err) == 0);
	CHECK(digest_of(img.config, img.config_digest) && digest_of(img.manifest, img.manifest_digest) &&
	      digest_of(img.index, img.index_digest));
	CHECK_STR(img.layer_digest, "sha256:" D64);
	json_t *ix = json_loads(img.index, 0, NULL), *mf = json_loads(img.manifest, 0, NULL);
	CHECK(ix != NULL && mf != NULL);
	CHECK_STR(json_string_value(json_object_get(json_object_get(ix, "annotations"), AGENT_OCIDIST_CKPT_ANNOTATION)),
		  "main");
	json_t *m0 = json_array_get(json_object_get(ix, "manifests"), 0);
	CHECK_STR(json_string_value(json_object_get(m0, "digest")), img.manifest_digest);
	CHECK(json_integer_value(json_object_get(m0, "size")) == (json_int_t)strlen(img.manifest));
	json_t *l0 = json_array_get(json_object_get(mf, "layers"), 0);
	CHECK(json_integer_value(json_object_get(l0, "size")) == 12345);
	CHECK_STR(json_string_value(json_object_get(json_object_get(mf, "config"), "digest")), img.config_digest);
	json_decref(ix);
	json_decref(mf);
	agent_ocidist_clear(&img);
	agent_ocidist_clear(&img); /* twice: safe */
	CHECK(agent_ocidist_build("main", "xyz", 1, &img, &err) == -EINVAL);
	CHECK(agent_ocidist_build("", D64, 1, &img, &err) == -EINVAL);
}

static int head(const char *h, struct agent_ocihead *out)
{
	struct gcr_err err = { 0 };
	int rc = agent_ocidist_head(h, strlen(h), out, &err);
	CHECK(rc == 0 || rc == -EAGAIN || (err.code == rc && err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL));
	return rc;
}

static void test_head(void)
{
	struct agent_ocihead h;
	const char *g = "GET /v2/gcr-evict/a/b/manifests/" TOK " HTTP/1.1\r\nHost: 127.0.0.1:5055\r\n"
			"User-Agent: containerd/v2.3.7\r\nAccept: application/vnd.oci.image.index.v1+json\r\n\r\n";
	CHECK(head(g, &h) == 0 && h.method == AGENT_OCIMETHOD_GET && h.keep_alive && h.len == strlen(g));
	CHECK(h.target_len == strlen("/v2/gcr-evict/a/b/manifests/" TOK) && strncmp(g + h.target_off, "/v2/", 4) == 0);
	CHECK(head("HEAD /v2/ HTTP/1.1\r\nConnection: close\r\n\r\n", &h) == 0 && h.method == AGENT_OCIMETHOD_HEAD &&
	      !h.keep_alive);
	CHECK(head("GET /v2/ HTTP/1.1\r\nconnection: Keep-Alive, CLOSE\r\n\r\n", &h) == 0 && !h.keep_alive);
	CHECK(head("GET /v2/ HTTP/1.0\r\n\r\n", &h) == 0 && !h.keep_alive);
	CHECK(head("GET /v2/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &h) == 0 && h.keep_alive);
	CHECK(head("POST /v2/x/blobs/uploads/ HTTP/1.1\r\nContent-Length: 0\r\n\r\n", &h) == 0 &&
	      h.method == AGENT_OCIMETHOD_OTHER);
	/* Two heads back to back: the first's length ends it (pipelining). */
	const char *two = "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n";
	CHECK(head(two, &h) == 0 && h.len == strlen("GET /a HTTP/1.1\r\n\r\n"));
	/* Not whole yet. */
	CHECK(head("", &h) == -EAGAIN && head("GET /v2/ HTTP/1.1\r\nHost: x\r\n", &h) == -EAGAIN);
	/* Refused. */
	const char *bad[] = {
		"GET /v2/ HTTP/2.0\r\n\r\n", "GET  /v2/ HTTP/1.1\r\n\r\n", "GET /v2/\r\n\r\n",
		" GET /v2/ HTTP/1.1\r\n\r\n", "G(T /v2/ HTTP/1.1\r\n\r\n", "GET /v\x7f" "2/ HTTP/1.1\r\n\r\n",
		"GET /v2/ HTTP/1.1\n\r\n\r\n", "GET /v2/ HTTP/1.1\r\nHost : x\r\n\r\n",
		"GET /v2/ HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", "GET /v2/ HTTP/1.1\r\nX: a\x01" "b\r\n\r\n",
		"GET /v2/ HTTP/1.1\r\nX: a\rb\r\n\r\n", "GET /v2/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
		"GET /v2/ HTTP/1.1\r\nContent-Length: 00\r\n\r\n",
		"GET /v2/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "GETTTTTTTTTTTTTTT /v2/ HTTP/1.1\r\n\r\n",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = head(bad[i], &h);
		CHECK(rc == -EINVAL);
		if (rc != -EINVAL)
			fprintf(stderr, "head accepted (%d): %s\n", rc, bad[i]);
	}
	/* A NUL in the target or a header. */
	struct gcr_err err = { 0 };
	CHECK(agent_ocidist_head("GET /v\0/ HTTP/1.1\r\n\r\n", 23, &h, &err) == -EINVAL);
	CHECK(agent_ocidist_head("GET / HTTP/1.1\r\nX: \0\r\n\r\n", 26, &h, &err) == -EINVAL);
	/* Too many headers; a head past the size with no end. */
	char *big = malloc(AGENT_OCIDIST_HEAD_MAX + 64);
	CHECK(big != NULL);
	if (big != NULL) {
		size_t n = (size_t)snprintf(big, 64, "GET / HTTP/1.1\r\n");
		for (int i = 0; i <= AGENT_OCIDIST_HEADERS_MAX; i++)
			n += (size_t)snprintf(big + n, 16, "X: %d\r\n", i % 10);
		memcpy(big + n, "\r\n", 3);
		CHECK(agent_ocidist_head(big, n + 2, &h, &err) == -EINVAL);
		memset(big, 'a', AGENT_OCIDIST_HEAD_MAX + 10);
		memcpy(big, "GET /", 5);
		CHECK(agent_ocidist_head(big, AGENT_OCIDIST_HEAD_MAX + 10, &h, &err) == -E2BIG);
		CHECK(agent_ocidist_head(big, AGENT_OCIDIST_HEAD_MAX - 1, &h, &err) == -EAGAIN);
		/* An end just past the size is not looked for. */
		memcpy(big + AGENT_OCIDIST_HEAD_MAX - 2, "\r\n\r\n", 4);
		CHECK(agent_ocidist_head(big, AGENT_OCIDIST_HEAD_MAX + 2, &h, &err) == -E2BIG);
		free(big);
	}
}

int main(void)
{
	test_sha256();
	test_parse();
	test_token();
	test_build();
	test_head();
	return test_summary("test_agent_ocidist");
}
