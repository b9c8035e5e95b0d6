/* agent_ocidist: the pure half of the node's checkpoint-image registry (agent_ocireg): the
 * request heads and paths it accepts (OCI distribution API, read-only, one repository per eviction
 * Checkpoint) and the OCI container image it builds around a kubelet checkpoint archive. */
#ifndef AGENT_OCIDIST_H
#define AGENT_OCIDIST_H

#include <stddef.h>

#include "gcr_error.h"
#include "gcr_sha256.h"

/* Repository of a Checkpoint's image: AGENT_OCIDIST_REPO/<namespace>/<checkpoint name>; its
 * one tag is the token issued for the restore (AGENT_OCIDIST_TOKEN_LEN lower-case hex). */
#define AGENT_OCIDIST_REPO "gcr-evict"
#define AGENT_OCIDIST_TOKEN_LEN 32 /* 128 random bits */
/* The annotation containerd's CRI restores a container from (on the image index). */
#define AGENT_OCIDIST_CKPT_ANNOTATION "org.criu.checkpoint.container.name"
#define AGENT_OCIDIST_MT_INDEX "application/vnd.oci.image.index.v1+json"
#define AGENT_OCIDIST_MT_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define AGENT_OCIDIST_MT_CONFIG "application/vnd.oci.image.config.v1+json"
#define AGENT_OCIDIST_MT_LAYER "application/vnd.oci.image.layer.v1.tar"

enum agent_ocireq_kind {
	AGENT_OCIREQ_BASE = 1, /* GET /v2/: the API version check */
	AGENT_OCIREQ_MANIFEST, /* /v2/<repo>/manifests/<tag or digest> */
	AGENT_OCIREQ_BLOB,     /* /v2/<repo>/blobs/<digest> */
};

struct agent_ocireq {
	enum agent_ocireq_kind kind;
	char ns[64];   /* DNS label */
	char name[254]; /* DNS subdomain: the Checkpoint's name */
	/* A tag (AGENT_OCIDIST_TOKEN_LEN hex) or "sha256:<64 hex>": is_digest says which. */
	char ref[72];
	int is_digest;
};

/* Parses a request path (no query) strictly: /v2/, or /v2/gcr-evict/<ns>/<name>/manifests/<ref>
 * (ref a token-shaped tag or a sha256 digest) or .../blobs/<sha256 digest>. len: bytes of path
 * (it need not be NUL-terminated; a NUL inside is refused). 0 or -EINVAL with a message. */
int agent_ocidist_parse(const char *path, size_t len, struct agent_ocireq *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* One HTTP/1.x request head, as containerd sends them (GET or HEAD, no body): what the
 * registry needs of it. Offsets are into the buffer parsed. */
#define AGENT_OCIDIST_HEAD_MAX 8192 /* bytes of a request head at most; more is refused */
#define AGENT_OCIDIST_HEADERS_MAX 64
enum agent_ocimethod {
	AGENT_OCIMETHOD_GET = 1,
	AGENT_OCIMETHOD_HEAD,
	AGENT_OCIMETHOD_OTHER, /* a well-formed method the registry does not serve (405) */
};

struct agent_ocihead {
	enum agent_ocimethod method;
	size_t target_off, target_len; /* the request target, as sent (no %-decoding) */
	int keep_alive;                /* HTTP/1.1 unless "Connection: close"; 1.0 with "keep-alive" */
	size_t len;                    /* bytes of the head, its empty line included */
};

/* Parses the request head at the start of buf (len bytes: outside input, NULs included):
 * the request line (token method, a target of visible ASCII, HTTP/1.0 or 1.1), then headers
 * (token names, no line folding, no control bytes), CRLF line ends. A head announcing a body
 * (Content-Length other than 0, Transfer-Encoding) is refused. 0; -EAGAIN when the head's end
 * is not in buf yet (and buf is shorter than AGENT_OCIDIST_HEAD_MAX); -E2BIG past that size;
 * -EINVAL malformed, with a message. */
int agent_ocidist_head(const char *buf, size_t len, struct agent_ocihead *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* A new token: AGENT_OCIDIST_TOKEN_LEN lower-case hex digits of getrandom() and the NUL.
 * 0 or -errno (no randomness: no token). */
int agent_ocidist_token(char out[AGENT_OCIDIST_TOKEN_LEN + 1], struct gcr_err *err) __attribute__((warn_unused_result));

/* 1 when s is a well-formed token (only the shape). */
int agent_ocidist_token_valid(const char *s);

/* The container image around one layer (the archive): config, manifest and index documents
 * with their digests ("sha256:<hex>"). Owns the three strings. */
struct agent_ocidist_image {
	char *config, *manifest, *index;
	char config_digest[72], manifest_digest[72], index_digest[72], layer_digest[72];
	long long layer_size;
};

/* container: the name containerd restores (the checkpointed container's); layer_hex: the
 * archive's sha256 (64 hex), size its bytes. 0 or -errno. */
int agent_ocidist_build(const char *container, const char *layer_hex, long long layer_size,
			struct agent_ocidist_image *out, struct gcr_err *err) __attribute__((warn_unused_result));
void agent_ocidist_clear(struct agent_ocidist_image *img);

/* "127.0.0.1:<port>/gcr-evict/<ns>/<name>:<token>" into out: the image on the registry of the
 * node that pulls it (every node's agent_ocireg listens on its own loopback, same port).
 * 0 or -ENAMETOOLONG. */
int agent_ocidist_ref(int port, const char *ns, const char *name, const char *token, char *out, size_t len);

#endif
