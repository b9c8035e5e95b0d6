/* agent_ocidist: request heads and paths of the node's checkpoint-image registry, and the OCI
 * container image it serves. Heads and paths are outside input (anything on the node's loopback may
 * connect), so they are parsed to a closed shape: fixed words, DNS names, a token or a digest,
 * nothing else. */
#include "agent_ocidist.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>

static int lower_hex(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

static int alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

/* A DNS label (dots 0) or subdomain (dots 1) of at most max characters. */
static int dns_name(const char *s, size_t n, size_t max, int dots)
{
	if (n == 0 || n > max || !alnum(s[0]) || !alnum(s[n - 1]))
		return 0;
	for (size_t i = 0; i < n; i++) {
		if (alnum(s[i]) || s[i] == '-')
			continue;
		if (dots && s[i] == '.' && alnum(s[i - 1]) && alnum(s[i + 1]))
			continue;
		return 0;
	}
	return 1;
}

int agent_ocidist_token_valid(const char *s)
{
	return s != NULL && strlen(s) == AGENT_OCIDIST_TOKEN_LEN && lower_hex(s, AGENT_OCIDIST_TOKEN_LEN);
}

static int is_digest(const char *s, size_t n)
{
	return n == 71 && memcmp(s, "sha256:", 7) == 0 && lower_hex(s + 7, 64);
}

int agent_ocidist_parse(const char *path, size_t len, struct agent_ocireq *out, struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	if (memchr(path, '\0', len) != NULL)
		return gcr_err_set(err, -EINVAL, "NUL in the path");
	if (len == 4 && memcmp(path, "/v2/", 4) == 0) {
		out->kind = AGENT_OCIREQ_BASE;
		return 0;
	}
	static const char pre[] = "/v2/" AGENT_OCIDIST_REPO "/";
	const size_t np = sizeof(pre) - 1;
	if (len <= np || memcmp(path, pre, np) != 0)
		return gcr_err_set(err, -EINVAL, "not under /v2/%s/", AGENT_OCIDIST_REPO);
	/* Four segments after the prefix: ns, name, manifests|blobs, ref. */
	const char *seg[4];
	size_t sl[4], k = 0;
	const char *p = path + np, *end = path + len;
	while (k < 4) {
		const char *slash = memchr(p, '/', (size_t)(end - p));
		seg[k] = p;
		sl[k] = (size_t)((slash ? slash : end) - p);
		k++;
		if (slash == NULL)
			break;
		p = slash + 1;
	}
	if (k != 4 || seg[3] + sl[3] != end)
		return gcr_err_set(err, -EINVAL, "want /v2/%s/<namespace>/<name>/manifests|blobs/<reference>",
				   AGENT_OCIDIST_REPO);
	if (!dns_name(seg[0], sl[0], 63, 0))
		return gcr_err_set(err, -EINVAL, "namespace is not a DNS label");
	if (!dns_name(seg[1], sl[1], 253, 1))
		return gcr_err_set(err, -EINVAL, "name is not a DNS subdomain");
	memcpy(out->ns, seg[0], sl[0]);
	memcpy(out->name, seg[1], sl[1]);
	int manifests = sl[2] == 9 && memcmp(seg[2], "manifests", 9) == 0;
	if (!manifests && !(sl[2] == 5 && memcmp(seg[2], "blobs", 5) == 0))
		return gcr_err_set(err, -EINVAL, "neither manifests nor blobs");
	out->kind = manifests ? AGENT_OCIREQ_MANIFEST : AGENT_OCIREQ_BLOB;
	out->is_digest = is_digest(seg[3], sl[3]);
	if (!out->is_digest && !(manifests && sl[3] == AGENT_OCIDIST_TOKEN_LEN && lower_hex(seg[3], sl[3])))
		return gcr_err_set(err, -EINVAL, "reference is neither a sha256 digest nor a token%s",
				   manifests ? "" : " (blobs want a digest)");
	memcpy(out->ref, seg[3], sl[3]);
	return 0;
}

static int tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Whether the comma list v (n bytes) holds the token want, in any case. */
static int has_token(const char *v, size_t n, const char *want)
{
	size_t w = strlen(want);
	for (size_t i = 0; i < n;) {
		while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ','))
			i++;
		size_t j = i;
		while (j < n && v[j] != ',' && v[j] != ' ' && v[j] != '\t')
			j++;
		if (j - i == w && strncasecmp(v + i, want, w) == 0)
			return 1;
		while (j < n && v[j] != ',')
			j++;
		i = j;
	}
	return 0;
}

int agent_ocidist_head(const char *buf, size_t len, struct agent_ocihead *out, struct gcr_err *err)
{
	memset(out, 0, sizeof(out[0]));
	/* The end of the head first: nothing is taken from an incomplete one. */
	size_t end = 0;
	for (size_t i = 0; i + 3 < len && i + 4 <= AGENT_OCIDIST_HEAD_MAX; i++)
		if (memcmp(buf + i, "\r\n\r\n", 4) == 0) {
			end = i + 4;
			break;
		}
	if (end == 0)
		return len >= AGENT_OCIDIST_HEAD_MAX ? gcr_err_set(err, -E2BIG, "request head over %d bytes",
								  AGENT_OCIDIST_HEAD_MAX)
						     : -EAGAIN;
	/* Request line: METHOD SP target SP HTTP/1.x CRLF. */
	size_t i = 0;
	while (i < end && tchar((unsigned char)buf[i]))
		i++;
	if (i == 0 || i > 16 || buf[i] != ' ')
		return gcr_err_set(err, -EINVAL, "malformed request method");
	out->method = i == 3 && memcmp(buf, "GET", 3) == 0	? AGENT_OCIMETHOD_GET
		      : i == 4 && memcmp(buf, "HEAD", 4) == 0 ? AGENT_OCIMETHOD_HEAD
							    : AGENT_OCIMETHOD_OTHER;
	size_t t = ++i;
	while (i < end && (unsigned char)buf[i] > 0x20 && (unsigned char)buf[i] < 0x7f)
		i++;
	if (i == t || buf[i] != ' ')
		return gcr_err_set(err, -EINVAL, "malformed request target");
	out->target_off = t;
	out->target_len = i - t;
	i++;
	if (end - i < 10 || memcmp(buf + i, "HTTP/1.", 7) != 0 || (buf[i + 7] != '0' && buf[i + 7] != '1') ||
	    memcmp(buf + i + 8, "\r\n", 2) != 0)
		return gcr_err_set(err, -EINVAL, "not HTTP/1.0 or HTTP/1.1");
	int v11 = buf[i + 7] == '1';
	out->keep_alive = v11;
	i += 10;
	/* Headers, up to the empty line at end - 2. */
	int nh = 0;
	while (i < end - 2) {
		if (++nh > AGENT_OCIDIST_HEADERS_MAX)
			return gcr_err_set(err, -EINVAL, "more than %d headers", AGENT_OCIDIST_HEADERS_MAX);
		size_t n = i;
		while (n < end && tchar((unsigned char)buf[n]))
			n++;
		if (n == i || buf[n] != ':')
			return gcr_err_set(err, -EINVAL, "malformed header name (or a folded line)");
		size_t v = n + 1, e = v;
		while (e < end && buf[e] != '\r') {
			unsigned char c = (unsigned char)buf[e];
			if ((c < 0x20 && c != '\t') || c == 0x7f)
				return gcr_err_set(err, -EINVAL, "control byte in a header value");
			e++;
		}
		if (e + 1 >= end || buf[e + 1] != '\n')
			return gcr_err_set(err, -EINVAL, "a header line without CRLF");
		while (v < e && (buf[v] == ' ' || buf[v] == '\t'))
			v++;
		size_t ve = e;
		while (ve > v && (buf[ve - 1] == ' ' || buf[ve - 1] == '\t'))
			ve--;
		size_t nl = n - i;
		if (nl == 10 && strncasecmp(buf + i, "connection", 10) == 0) {
			if (has_token(buf + v, ve - v, "close"))
				out->keep_alive = 0;
			else if (!v11 && has_token(buf + v, ve - v, "keep-alive"))
				out->keep_alive = 1;
		} else if (nl == 14 && strncasecmp(buf + i, "content-length", 14) == 0) {
			if (ve - v != 1 || buf[v] != '0')
				return gcr_err_set(err, -EINVAL, "a request with a body (Content-Length)");
		} else if (nl == 17 && strncasecmp(buf + i, "transfer-encoding", 17) == 0) {
			return gcr_err_set(err, -EINVAL, "a request with a body (Transfer-Encoding)");
		}
		i = e + 2;
	}
	out->len = end;
	return 0;
}

int agent_ocidist_token(char out[AGENT_OCIDIST_TOKEN_LEN + 1], struct gcr_err *err)
{
	unsigned char r[AGENT_OCIDIST_TOKEN_LEN / 2];
	static const char hx[] = "0123456789abcdef";
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		return gcr_err_set(err, -EAGAIN, "getrandom: %s", strerror(errno));
	for (size_t i = 0; i < sizeof(r); i++) {
		out[2 * i] = hx[r[i] >> 4];
		out[2 * i + 1] = hx[r[i] & 15];
	}
	out[AGENT_OCIDIST_TOKEN_LEN] = '\0';
	return 0;
}

static int doc(json_t *j, char **text, char digest[72])
{
	char hex[GCR_SHA256_HEX];
	*text = j != NULL ? json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
	json_decref(j);
	if (*text == NULL)
		return -ENOMEM;
	gcr_sha256_hex(*text, strlen(*text), hex);
	snprintf(digest, 72, "sha256:%s", hex);
	return 0;
}

int agent_ocidist_build(const char *container, const char *layer_hex, long long layer_size,
			struct agent_ocidist_image *out, struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	if (strlen(layer_hex) != 64 || !lower_hex(layer_hex, 64) || layer_size < 0 || container[0] == '\0')
		return gcr_err_set(err, -EINVAL, "bad layer digest, size or container name");
	snprintf(out->layer_digest, sizeof(out->layer_digest), "sha256:%s", layer_hex);
	out->layer_size = layer_size;
	int rc = doc(json_pack("{s:s, s:s, s:{}, s:{s:s, s:[s]}}", "architecture", "amd64", "os", "linux", "config",
			       "rootfs", "type", "layers", "diff_ids", out->layer_digest),
		     &out->config, out->config_digest);
	if (rc == 0)
		rc = doc(json_pack("{s:i, s:s, s:{s:s, s:s, s:I}, s:[{s:s, s:s, s:I}], s:{s:s}}", "schemaVersion", 2,
				   "mediaType", AGENT_OCIDIST_MT_MANIFEST, "config", "mediaType", AGENT_OCIDIST_MT_CONFIG,
				   "digest", out->config_digest, "size", (json_int_t)strlen(out->config), "layers",
				   "mediaType", AGENT_OCIDIST_MT_LAYER, "digest", out->layer_digest, "size",
				   (json_int_t)layer_size, "annotations", AGENT_OCIDIST_CKPT_ANNOTATION, container),
			 &out->manifest, out->manifest_digest);
	if (rc == 0)
		rc = doc(json_pack("{s:i, s:s, s:{s:s}, s:[{s:s, s:s, s:I, s:{s:s, s:s}}]}", "schemaVersion", 2,
				   "mediaType", AGENT_OCIDIST_MT_INDEX, "annotations", AGENT_OCIDIST_CKPT_ANNOTATION,
				   container, "manifests", "mediaType", AGENT_OCIDIST_MT_MANIFEST, "digest",
				   out->manifest_digest, "size", (json_int_t)strlen(out->manifest), "platform",
				   "architecture", "amd64", "os", "linux"),
			 &out->index, out->index_digest);
	if (rc < 0) {
		agent_ocidist_clear(out);
		return gcr_err_set(err, rc, "out of memory");
	}
	return 0;
}

void agent_ocidist_clear(struct agent_ocidist_image *img)
{
	free(img->config);
	free(img->manifest);
	free(img->index);
	img->config = img->manifest = img->index = NULL;
}

int agent_ocidist_ref(int port, const char *ns, const char *name, const char *token, char *out, size_t len)
{
	int n = snprintf(out, len, "127.0.0.1:%d/%s/%s/%s:%s", port, AGENT_OCIDIST_REPO, ns, name, token);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}
