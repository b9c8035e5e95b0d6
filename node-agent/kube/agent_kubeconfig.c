/* agent_kubeconfig: kubeconfig YAML (libyaml document API) and in-cluster
 * service account settings, reduced to one server and one set of credentials. */
#include "agent_kubeconfig.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* YAML merge keys ("<<: *base") may chain; anchors can even form cycles, so
 * lookups through them stop at this depth. */
#define MERGE_DEPTH_MAX 8
/* Mappings one lookup may visit through merge keys. */
#define MERGE_VISITS_MAX 64
/* Server URLs and file paths: far beyond anything real. */
#define URL_MAX 4096
#define PATH_MAX_LEN 4096
/* Longest user-supplied name quoted in an error message. */
#define QUOTE_MAX 64

/* ---- small helpers ---- */

static char *xstrndup(const char *s, size_t n)
{
	char *d = malloc(n + 1);
	if (d != NULL) {
		memcpy(d, s, n);
		d[n] = '\0';
	}
	return d;
}

/* Frees a buffer that held a secret; explicit_bzero is not optimised away. */
static void free_secret(char *s, size_t n)
{
	if (s == NULL)
		return;
	explicit_bzero(s, n);
	free(s);
}

static void free_secret_str(char *s)
{
	if (s != NULL)
		free_secret(s, strlen(s));
}

/* Names quoted from the file may hold control characters; messages stay one line. */
static void one_line(struct gcr_err *err)
{
	if (err == NULL)
		return;
	for (char *c = err->msg; *c != '\0'; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
}

static int64_t ts_ns(struct timespec t)
{
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Reads a regular file of at most max bytes into a NUL-terminated buffer. */
static int read_bounded(const char *path, size_t max, char **out, size_t *out_len, struct stat *st,
			struct gcr_err *err)
{
	char *buf = NULL;
	size_t used = 0;
	int rc = 0;

	*out = NULL;
	*out_len = 0;
	/* O_NONBLOCK: a FIFO at a configured path must not hang the agent. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		rc = -errno;
		return gcr_err_set(err, rc, "cannot open %s: %s", path, strerror(-rc));
	}
	if (fstat(fd, st) != 0) {
		rc = -errno;
		rc = gcr_err_set(err, rc, "cannot stat %s: %s", path, strerror(-rc));
		goto out;
	}
	if (!S_ISREG(st->st_mode)) {
		rc = gcr_err_set(err, -EINVAL, "%s is not a regular file", path);
		goto out;
	}
	if ((uint64_t)st->st_size > max) {
		rc = gcr_err_set(err, -EFBIG, "%s is larger than %zu bytes", path, max);
		goto out;
	}
	buf = malloc(max + 2);
	if (buf == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory reading %s", path);
		goto out;
	}
	/* Read one byte past max: the file may have grown since fstat. */
	while (used <= max) {
		ssize_t n = read(fd, buf + used, max + 1 - used);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			rc = gcr_err_set(err, rc, "cannot read %s: %s", path, strerror(-rc));
			goto out;
		}
		if (n == 0)
			break;
		used += (size_t)n;
	}
	if (used > max) {
		rc = gcr_err_set(err, -EFBIG, "%s is larger than %zu bytes", path, max);
		goto out;
	}
	buf[used] = '\0';
	*out = buf;
	*out_len = used;
	buf = NULL;
out:
	free_secret(buf, max + 2);
	close(fd);
	return rc;
}

/* A bearer token goes into an HTTP header: trim surrounding whitespace and
 * refuse anything but visible ASCII, so a bad file cannot inject headers. */
static int clean_token(const char *s, size_t n, char **out, const char *what, struct gcr_err *err)
{
	while (n > 0 && isspace((unsigned char)s[n - 1]))
		n--;
	while (n > 0 && isspace((unsigned char)s[0]))
		s++, n--;
	if (n == 0)
		return gcr_err_set(err, -EINVAL, "%s is empty", what);
	if (n > AGENT_KUBECONFIG_MAX_TOKEN)
		return gcr_err_set(err, -EINVAL, "%s is longer than %u bytes", what,
				   AGENT_KUBECONFIG_MAX_TOKEN);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x21 || c > 0x7e)
			return gcr_err_set(err, -EINVAL, "%s contains a byte 0x%02x at offset %zu", what, c, i);
	}
	*out = xstrndup(s, n);
	return *out ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
}

/* Standard base64 with padding, as Go's encoding/base64 StdEncoding; line
 * breaks and blanks (YAML block scalars) are skipped. */
static int base64_decode(const char *in, size_t n, char **out, size_t *out_len, const char *what,
			 struct gcr_err *err)
{
	char *buf = malloc(n / 4 * 3 + 4);
	uint32_t acc = 0;
	size_t len = 0, digits = 0, pad = 0;
	int rc = 0;

	if (buf == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)in[i];
		int v;
		if (c == '\n' || c == '\r' || c == ' ' || c == '\t')
			continue;
		if (c == '=') {
			pad++;
			continue;
		}
		if (pad > 0) {
			rc = gcr_err_set(err, -EINVAL, "%s: invalid base64: data after padding at offset %zu",
					 what, i);
			goto out;
		}
		if (c >= 'A' && c <= 'Z')
			v = c - 'A';
		else if (c >= 'a' && c <= 'z')
			v = c - 'a' + 26;
		else if (c >= '0' && c <= '9')
			v = c - '0' + 52;
		else if (c == '+')
			v = 62;
		else if (c == '/')
			v = 63;
		else {
			rc = gcr_err_set(err, -EINVAL, "%s: invalid base64 character 0x%02x at offset %zu",
					 what, c, i);
			goto out;
		}
		acc = acc << 6 | (uint32_t)v;
		if (++digits % 4 == 0) {
			buf[len++] = (char)(acc >> 16);
			buf[len++] = (char)(acc >> 8);
			buf[len++] = (char)acc;
			acc = 0;
		}
	}
	if (pad > 2 || (digits + pad) % 4 != 0 || (pad > 0 && digits % 4 + pad != 4) || digits == 0) {
		rc = gcr_err_set(err, -EINVAL, "%s: invalid base64: bad length or padding", what);
		goto out;
	}
	if (digits % 4 == 2) {
		buf[len++] = (char)(acc >> 4);
	} else if (digits % 4 == 3) {
		buf[len++] = (char)(acc >> 10);
		buf[len++] = (char)(acc >> 2);
	}
	buf[len] = '\0';
	*out = buf;
	*out_len = len;
	buf = NULL;
out:
	free_secret(buf, n / 4 * 3 + 4);
	return rc;
}

/* ---- YAML document access ---- */

struct doc {
	yaml_document_t *d;
	struct gcr_err *err;
};

static yaml_node_t *node_at(struct doc *doc, int id)
{
	return yaml_document_get_node(doc->d, id);
}

static int scalar_is(yaml_node_t *n, const char *s)
{
	size_t len = strlen(s);
	return n != NULL && n->type == YAML_SCALAR_NODE && n->data.scalar.length == len &&
	       memcmp(n->data.scalar.value, s, len) == 0;
}

/* Value node of key in a mapping, following "<<" merge keys; NULL if absent.
 * *budget bounds the mappings visited: aliases let a few bytes of YAML fan
 * merges out exponentially. */
static yaml_node_t *map_get_rec(struct doc *doc, yaml_node_t *map, const char *key, int depth, int *budget)
{
	if (map == NULL || map->type != YAML_MAPPING_NODE || depth > MERGE_DEPTH_MAX || --*budget < 0)
		return NULL;
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
		if (scalar_is(node_at(doc, p->key), key))
			return node_at(doc, p->value);
	/* Explicit keys win over merged ones, as in YAML 1.1 and Go's yaml. */
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
		if (!scalar_is(node_at(doc, p->key), "<<"))
			continue;
		yaml_node_t *m = node_at(doc, p->value), *v = NULL;
		if (m != NULL && m->type == YAML_MAPPING_NODE)
			v = map_get_rec(doc, m, key, depth + 1, budget);
		else if (m != NULL && m->type == YAML_SEQUENCE_NODE)
			for (yaml_node_item_t *i = m->data.sequence.items.start;
			     v == NULL && *budget > 0 && i < m->data.sequence.items.top; i++)
				v = map_get_rec(doc, node_at(doc, *i), key, depth + 1, budget);
		if (v != NULL)
			return v;
	}
	return NULL;
}

static yaml_node_t *map_get(struct doc *doc, yaml_node_t *map, const char *key)
{
	int budget = MERGE_VISITS_MAX;
	return map_get_rec(doc, map, key, 0, &budget);
}

/* A plain ~, null or empty scalar means "not set", as in client-go. */
static int scalar_is_null(yaml_node_t *n)
{
	if (n->data.scalar.length == 0)
		return 1;
	if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	return scalar_is(n, "~") || scalar_is(n, "null") || scalar_is(n, "Null") || scalar_is(n, "NULL");
}

/* String value of key: 0 with v and n set, 1 when absent, negative on error. */
static int get_scalar(struct doc *doc, yaml_node_t *map, const char *key, const char *where,
		      const char **v, size_t *n)
{
	yaml_node_t *node = map_get(doc, map, key);
	if (node == NULL)
		return 1;
	if (node->type != YAML_SCALAR_NODE)
		return gcr_err_set(doc->err, -EINVAL, "%s: %s is not a string", where, key);
	if (scalar_is_null(node))
		return 1;
	if (node->data.scalar.length > AGENT_KUBECONFIG_MAX_VALUE)
		return gcr_err_set(doc->err, -EFBIG, "%s: %s is longer than %u bytes", where, key,
				   AGENT_KUBECONFIG_MAX_VALUE);
	*v = (const char *)node->data.scalar.value;
	*n = node->data.scalar.length;
	/* Values become C strings: an embedded NUL would silently cut them. */
	if (memchr(*v, '\0', *n) != NULL)
		return gcr_err_set(doc->err, -EINVAL, "%s: %s contains a NUL byte", where, key);
	return 0;
}

/* Like get_scalar, into a new C string; 1 (and *out NULL) when absent. */
static int get_string(struct doc *doc, yaml_node_t *map, const char *key, const char *where, char **out)
{
	const char *v;
	size_t n;
	*out = NULL;
	int rc = get_scalar(doc, map, key, where, &v, &n);
	if (rc != 0)
		return rc;
	*out = xstrndup(v, n);
	return *out ? 0 : gcr_err_set(doc->err, -ENOMEM, "out of memory");
}

/* YAML 1.1 booleans, which Go's yaml.v2 (and so kubectl) accepts. */
static int get_bool(struct doc *doc, yaml_node_t *map, const char *key, const char *where, int *out)
{
	static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON" };
	static const char *const no[] = { "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF" };
	yaml_node_t *node = map_get(doc, map, key);
	*out = 0;
	if (node == NULL || (node->type == YAML_SCALAR_NODE && scalar_is_null(node)))
		return 0;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (scalar_is(node, yes[i])) {
			*out = 1;
			return 0;
		}
		if (scalar_is(node, no[i]))
			return 0;
	}
	return gcr_err_set(doc->err, -EINVAL, "%s: %s is not a boolean", where, key);
}

/* The "<inner>" mapping of the entry called name in the list root[list]:
 *   clusters: [{name: x, cluster: {...}}]. */
static int find_named(struct doc *doc, yaml_node_t *root, const char *list, const char *inner,
		      const char *name, yaml_node_t **out)
{
	yaml_node_t *seq = map_get(doc, root, list);
	*out = NULL;
	if (seq != NULL && seq->type != YAML_SEQUENCE_NODE &&
	    !(seq->type == YAML_SCALAR_NODE && scalar_is_null(seq)))
		return gcr_err_set(doc->err, -EINVAL, "%s is not a list", list);
	if (seq != NULL && seq->type == YAML_SEQUENCE_NODE) {
		/* The first entry of a name wins, as in client-go's loader. */
		for (yaml_node_item_t *i = seq->data.sequence.items.start; i < seq->data.sequence.items.top;
		     i++) {
			yaml_node_t *entry = node_at(doc, *i);
			if (entry == NULL || entry->type != YAML_MAPPING_NODE ||
			    !scalar_is(map_get(doc, entry, "name"), name))
				continue;
			yaml_node_t *m = map_get(doc, entry, inner);
			if (m == NULL || m->type != YAML_MAPPING_NODE)
				return gcr_err_set(doc->err, -EINVAL, "%s '%.*s' has no '%s' mapping", inner,
						   QUOTE_MAX, name, inner);
			*out = m;
			return 0;
		}
	}
	return gcr_err_set(doc->err, -ENOENT, "%s '%.*s' not found in %s", inner, QUOTE_MAX, name, list);
}

/* Relative paths in a kubeconfig are relative to the file, as kubectl does. */
static int resolve_path(const char *base_dir, const char *path, char **out, const char *what,
			struct gcr_err *err)
{
	size_t n = strlen(path);
	*out = NULL;
	if (n > PATH_MAX_LEN)
		return gcr_err_set(err, -ENAMETOOLONG, "%s: path longer than %d bytes", what, PATH_MAX_LEN);
	if (path[0] == '/' || base_dir == NULL || base_dir[0] == '\0') {
		*out = xstrndup(path, n);
	} else {
		size_t b = strlen(base_dir);
		*out = malloc(b + n + 2);
		if (*out != NULL)
			snprintf(*out, b + n + 2, "%s/%s", base_dir, path);
	}
	return *out ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
}

/* "<field>-data" (base64 PEM) wins over "<field>" (a path), as in client-go. */
static int get_pem_or_path(struct doc *doc, yaml_node_t *map, const char *field, const char *where,
			   const char *base_dir, char **pem, size_t *pem_len, char **path)
{
	char key[64], what[192];
	const char *v;
	size_t n;

	*pem = *path = NULL;
	*pem_len = 0;
	snprintf(key, sizeof(key), "%s-data", field);
	snprintf(what, sizeof(what), "%s: %s", where, key);
	int rc = get_scalar(doc, map, key, where, &v, &n);
	if (rc < 0)
		return rc;
	if (rc == 0) {
		rc = base64_decode(v, n, pem, pem_len, what, doc->err);
		if (rc < 0)
			return rc;
		if (memmem(*pem, *pem_len, "-----BEGIN ", 11) == NULL) {
			free_secret(*pem, *pem_len);
			*pem = NULL;
			*pem_len = 0;
			return gcr_err_set(doc->err, -EINVAL, "%s does not decode to PEM", what);
		}
		return 0;
	}
	char *raw = NULL;
	rc = get_string(doc, map, field, where, &raw);
	if (rc != 0)
		return rc;
	snprintf(what, sizeof(what), "%s: %s", where, field);
	rc = resolve_path(base_dir, raw, path, what, doc->err);
	free(raw);
	return rc;
}

/* https only: the agent always verifies the server, and never sends a
 * token in clear. Trailing slashes go so callers can append "/api/...". */
static int clean_server(const char *s, char **out, const char *where, struct gcr_err *err)
{
	size_t n = strlen(s);
	*out = NULL;
	if (strncasecmp(s, "https://", 8) != 0)
		return gcr_err_set(err, -EINVAL, "%s: server '%.*s' is not an https:// URL", where, QUOTE_MAX, s);
	if (n > URL_MAX)
		return gcr_err_set(err, -EINVAL, "%s: server URL longer than %d bytes", where, URL_MAX);
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] > 0x7e)
			return gcr_err_set(err, -EINVAL, "%s: server URL contains byte 0x%02x", where,
					   (unsigned char)s[i]);
	while (n > 8 && s[n - 1] == '/')
		n--;
	if (n == 8 || s[8] == '/')
		return gcr_err_set(err, -EINVAL, "%s: server URL has no host", where);
	*out = xstrndup(s, n);
	if (*out == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	/* The scheme is case-insensitive; callers may compare it as "https://". */
	memcpy(*out, "https://", 8);
	return 0;
}

static struct agent_kubeconfig *kc_new(void)
{
	struct agent_kubeconfig *kc = calloc(1, sizeof(*kc));
	if (kc != NULL)
		kc->token_reread_s = AGENT_KUBECONFIG_TOKEN_REREAD_S;
	return kc;
}

void agent_kubeconfig_free(struct agent_kubeconfig *kc)
{
	if (kc == NULL)
		return;
	free(kc->server);
	free(kc->tls_server_name);
	free(kc->ca_pem);
	free(kc->ca_file);
	free(kc->client_cert_pem);
	free(kc->client_cert_file);
	free_secret(kc->client_key_pem, kc->client_key_pem_len);
	free(kc->client_key_file);
	free_secret_str(kc->token);
	free(kc->token_file);
	free(kc->namespace);
	free(kc);
}

static int parse_cluster(struct doc *doc, yaml_node_t *cl, const char *where, const char *base_dir,
			 struct agent_kubeconfig *kc)
{
	char *server = NULL;
	int insecure = 0;

	int rc = get_bool(doc, cl, "insecure-skip-tls-verify", where, &insecure);
	if (rc < 0)
		return rc;
	if (insecure)
		return gcr_err_set(doc->err, -EPERM,
				   "%s: insecure-skip-tls-verify is set; gcr-agent always verifies TLS", where);
	rc = get_string(doc, cl, "server", where, &server);
	if (rc < 0)
		return rc;
	if (rc == 1)
		return gcr_err_set(doc->err, -EINVAL, "%s has no server", where);
	rc = clean_server(server, &kc->server, where, doc->err);
	free(server);
	if (rc < 0)
		return rc;
	rc = get_pem_or_path(doc, cl, "certificate-authority", where, base_dir, &kc->ca_pem, &kc->ca_pem_len,
			     &kc->ca_file);
	if (rc < 0)
		return rc;
	rc = get_string(doc, cl, "tls-server-name", where, &kc->tls_server_name);
	return rc < 0 ? rc : 0;
}

static int parse_user(struct doc *doc, yaml_node_t *user, const char *where, const char *base_dir,
		      struct agent_kubeconfig *kc)
{
	const char *v;
	size_t n;
	char what[192];
	char *raw = NULL;

	int rc = get_pem_or_path(doc, user, "client-certificate", where, base_dir, &kc->client_cert_pem,
				 &kc->client_cert_pem_len, &kc->client_cert_file);
	if (rc < 0)
		return rc;
	rc = get_pem_or_path(doc, user, "client-key", where, base_dir, &kc->client_key_pem,
			     &kc->client_key_pem_len, &kc->client_key_file);
	if (rc < 0)
		return rc;
	int have_cert = kc->client_cert_pem || kc->client_cert_file;
	int have_key = kc->client_key_pem || kc->client_key_file;
	if (have_cert != have_key)
		return gcr_err_set(doc->err, -EINVAL, "%s has a client %s without a %s", where,
				   have_cert ? "certificate" : "key", have_cert ? "key" : "certificate");

	rc = get_scalar(doc, user, "token", where, &v, &n);
	if (rc < 0)
		return rc;
	if (rc == 0) {
		snprintf(what, sizeof(what), "%s: token", where);
		rc = clean_token(v, n, &kc->token, what, doc->err);
		if (rc < 0)
			return rc;
	}
	rc = get_string(doc, user, "tokenFile", where, &raw);
	if (rc < 0)
		return rc;
	if (rc == 0) {
		snprintf(what, sizeof(what), "%s: tokenFile", where);
		rc = resolve_path(base_dir, raw, &kc->token_file, what, doc->err);
		free(raw);
		if (rc < 0)
			return rc;
	}
	if (have_cert || kc->token || kc->token_file)
		return 0;
	static const char *const unsupported[] = { "exec", "auth-provider", "username" };
	for (size_t i = 0; i < sizeof(unsupported) / sizeof(unsupported[0]); i++)
		if (map_get(doc, user, unsupported[i]) != NULL)
			return gcr_err_set(doc->err, -ENOTSUP,
					   "%s uses '%s', which gcr-agent does not support (use a token or a client certificate)",
					   where, unsupported[i]);
	return gcr_err_set(doc->err, -EINVAL, "%s has no credentials (token, tokenFile or client certificate)",
			   where);
}

/* Walks current-context -> context -> cluster and user into kc. */
static int parse_root(struct doc *doc, yaml_node_t *root, const char *base_dir, const char *context,
		      struct agent_kubeconfig *kc)
{
	char *current = NULL, *cluster_name = NULL, *user_name = NULL;
	char where[96];
	yaml_node_t *ctx, *cl, *user;
	int rc;

	if (root == NULL || root->type != YAML_MAPPING_NODE)
		return gcr_err_set(doc->err, -EINVAL, "not a kubeconfig: the document is not a mapping");
	if (context == NULL) {
		rc = get_string(doc, root, "current-context", "kubeconfig", &current);
		if (rc < 0)
			goto out;
		if (rc == 1) {
			rc = gcr_err_set(doc->err, -ENOENT, "kubeconfig has no current-context");
			goto out;
		}
		context = current;
	}
	rc = find_named(doc, root, "contexts", "context", context, &ctx);
	if (rc < 0)
		goto out;
	snprintf(where, sizeof(where), "context '%.*s'", QUOTE_MAX, context);
	rc = get_string(doc, ctx, "cluster", where, &cluster_name);
	if (rc == 1)
		rc = gcr_err_set(doc->err, -EINVAL, "%s names no cluster", where);
	if (rc < 0)
		goto out;
	rc = get_string(doc, ctx, "user", where, &user_name);
	if (rc == 1)
		rc = gcr_err_set(doc->err, -EINVAL, "%s names no user", where);
	if (rc < 0)
		goto out;
	rc = get_string(doc, ctx, "namespace", where, &kc->namespace);
	if (rc < 0)
		goto out;

	rc = find_named(doc, root, "clusters", "cluster", cluster_name, &cl);
	if (rc < 0)
		goto out;
	snprintf(where, sizeof(where), "cluster '%.*s'", QUOTE_MAX, cluster_name);
	rc = parse_cluster(doc, cl, where, base_dir, kc);
	if (rc < 0)
		goto out;

	rc = find_named(doc, root, "users", "user", user_name, &user);
	if (rc < 0)
		goto out;
	snprintf(where, sizeof(where), "user '%.*s'", QUOTE_MAX, user_name);
	rc = parse_user(doc, user, where, base_dir, kc);
out:
	free(current);
	free(cluster_name);
	free(user_name);
	return rc < 0 ? rc : 0;
}

/* The document holds copies of keys and tokens: wipe them before freeing. */
static void wipe_document(yaml_document_t *d)
{
	for (yaml_node_t *n = d->nodes.start; n < d->nodes.top; n++)
		if (n->type == YAML_SCALAR_NODE && n->data.scalar.value != NULL)
			explicit_bzero(n->data.scalar.value, n->data.scalar.length);
}

int agent_kubeconfig_parse(const char *text, size_t len, const char *base_dir, const char *context,
			   struct agent_kubeconfig **out, struct gcr_err *err)
{
	yaml_parser_t parser;
	yaml_document_t document;
	struct doc doc = { &document, err };
	struct agent_kubeconfig *kc = NULL;
	int have_parser = 0, have_doc = 0, rc = 0;

	*out = NULL;
	if (text == NULL || len == 0)
		return gcr_err_set(err, -EINVAL, "kubeconfig is empty");
	if (len > AGENT_KUBECONFIG_MAX_FILE)
		return gcr_err_set(err, -EFBIG, "kubeconfig larger than %u bytes", AGENT_KUBECONFIG_MAX_FILE);
	kc = kc_new();
	if (kc == NULL || !yaml_parser_initialize(&parser)) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	have_parser = 1;
	yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
	if (!yaml_parser_load(&parser, &document)) {
		rc = gcr_err_set(err, -EINVAL, "kubeconfig: YAML error at line %zu column %zu: %s",
				 parser.problem_mark.line + 1, parser.problem_mark.column + 1,
				 parser.problem ? parser.problem : "unknown");
		goto out;
	}
	have_doc = 1;
	yaml_node_t *root = yaml_document_get_root_node(&document);
	if (root == NULL) {
		rc = gcr_err_set(err, -EINVAL, "kubeconfig is empty");
		goto out;
	}
	rc = parse_root(&doc, root, base_dir, context, kc);
	if (rc < 0)
		goto out;
	*out = kc;
	kc = NULL;
out:
	if (rc < 0)
		one_line(err);
	if (have_doc) {
		wipe_document(&document);
		yaml_document_delete(&document);
	}
	if (have_parser)
		yaml_parser_delete(&parser);
	agent_kubeconfig_free(kc);
	return rc;
}

int agent_kubeconfig_load_file(const char *path, const char *context, struct agent_kubeconfig **out,
			       struct gcr_err *err)
{
	char *text = NULL, *dir = NULL;
	size_t len = 0;
	struct stat st;
	int rc;

	*out = NULL;
	rc = read_bounded(path, AGENT_KUBECONFIG_MAX_FILE, &text, &len, &st, err);
	if (rc < 0) {
		gcr_err_wrap(err, "kubeconfig");
		return rc;
	}
	const char *slash = strrchr(path, '/');
	dir = slash == NULL ? xstrndup(".", 1) : xstrndup(path, slash == path ? 1 : (size_t)(slash - path));
	if (dir == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	rc = agent_kubeconfig_parse(text, len, dir, context, out, err);
	if (rc < 0) {
		gcr_err_wrap(err, "%s", path);
		goto out;
	}
	rc = agent_kubeconfig_refresh_token(*out, err);
	if (rc < 0) {
		gcr_err_wrap(err, "%s", path);
		agent_kubeconfig_free(*out);
		*out = NULL;
		goto out;
	}
	rc = 0;
out:
	if (rc < 0)
		one_line(err);
	free_secret(text, len);
	free(dir);
	return rc;
}

/* KUBERNETES_SERVICE_HOST is an IP (v4 or v6) or a name; nothing that would
 * change the URL's meaning gets through. */
static int in_cluster_server(char **out, struct gcr_err *err)
{
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");
	*out = NULL;
	if (host == NULL || host[0] == '\0' || port == NULL || port[0] == '\0')
		return gcr_err_set(err, -ENOENT,
				   "not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set");
	size_t hn = strlen(host);
	if (hn > 253)
		return gcr_err_set(err, -EINVAL, "KUBERNETES_SERVICE_HOST is too long");
	int v6 = 0;
	for (size_t i = 0; i < hn; i++) {
		char c = host[i];
		if (c == ':')
			v6 = 1;
		else if (!isalnum((unsigned char)c) && c != '.' && c != '-')
			return gcr_err_set(err, -EINVAL, "KUBERNETES_SERVICE_HOST '%.*s' is not a host", QUOTE_MAX,
					   host);
	}
	char *end;
	errno = 0;
	unsigned long p = strtoul(port, &end, 10);
	if (errno != 0 || *end != '\0' || p == 0 || p > 65535 || !isdigit((unsigned char)port[0]))
		return gcr_err_set(err, -EINVAL, "KUBERNETES_SERVICE_PORT '%.*s' is not a port", QUOTE_MAX, port);
	size_t n = hn + 32;
	*out = malloc(n);
	if (*out == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	snprintf(*out, n, v6 ? "https://[%s]:%lu" : "https://%s:%lu", host, p);
	return 0;
}

static char *join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	if (p != NULL)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

/* The pod's namespace: a DNS-1123 label, at most 63 bytes. Optional. */
static int read_namespace(const char *path, char **out, struct gcr_err *err)
{
	char *text = NULL;
	size_t len = 0;
	struct stat st;
	int rc = read_bounded(path, 256, &text, &len, &st, err);
	*out = NULL;
	if (rc == -ENOENT) {
		gcr_err_clear(err);
		return 0;
	}
	if (rc < 0)
		return rc;
	while (len > 0 && isspace((unsigned char)text[len - 1]))
		text[--len] = '\0';
	for (size_t i = 0; i < len; i++)
		if (!islower((unsigned char)text[i]) && !isdigit((unsigned char)text[i]) && text[i] != '-')
			rc = -EINVAL;
	if (len == 0 || len > 63 || rc < 0) {
		rc = gcr_err_set(err, -EINVAL, "%s does not hold a namespace name", path);
		free(text);
		return rc;
	}
	*out = text;
	return 0;
}

int agent_kubeconfig_in_cluster(const char *sa_dir, struct agent_kubeconfig **out, struct gcr_err *err)
{
	struct agent_kubeconfig *kc = NULL;
	struct stat st;
	int rc;

	*out = NULL;
	if (sa_dir == NULL)
		sa_dir = AGENT_KUBECONFIG_SA_DIR;
	kc = kc_new();
	if (kc == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	rc = in_cluster_server(&kc->server, err);
	if (rc < 0)
		goto out;
	kc->ca_file = join(sa_dir, "ca.crt");
	kc->token_file = join(sa_dir, "token");
	if (kc->ca_file == NULL || kc->token_file == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
		goto out;
	}
	/* We always verify TLS, so the cluster CA is required, not optional. */
	if (stat(kc->ca_file, &st) != 0) {
		rc = -errno;
		rc = gcr_err_set(err, rc, "CA %s: %s", kc->ca_file, strerror(-rc));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = gcr_err_set(err, -EINVAL, "CA %s is not a regular file", kc->ca_file);
		goto out;
	}
	rc = agent_kubeconfig_refresh_token(kc, err);
	if (rc < 0)
		goto out;
	char *ns_path = join(sa_dir, "namespace");
	rc = ns_path ? read_namespace(ns_path, &kc->namespace, err) : gcr_err_set(err, -ENOMEM, "out of memory");
	free(ns_path);
	if (rc < 0)
		goto out;
	*out = kc;
	kc = NULL;
	rc = 0;
out:
	agent_kubeconfig_free(kc);
	if (rc < 0) {
		gcr_err_wrap(err, "in-cluster config");
		one_line(err);
	}
	return rc;
}

int agent_kubeconfig_refresh_token(struct agent_kubeconfig *kc, struct gcr_err *err)
{
	struct stat st;
	struct timespec now;
	char *text = NULL, *token = NULL;
	size_t len = 0;
	int rc;

	if (kc == NULL || kc->token_file == NULL)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &now);
	int read_before = kc->token_read_at.tv_sec != 0 || kc->token_read_at.tv_nsec != 0;
	/* stat follows kubelet's ..data symlink, so a swap shows as a new inode. */
	if (read_before && stat(kc->token_file, &st) == 0 &&
	    ts_ns(st.st_mtim) == ts_ns(kc->token_mtime) && st.st_size == kc->token_size &&
	    st.st_dev == kc->token_dev && st.st_ino == kc->token_ino &&
	    ts_ns(now) - ts_ns(kc->token_read_at) < (int64_t)kc->token_reread_s * 1000000000)
		return 0;

	rc = read_bounded(kc->token_file, AGENT_KUBECONFIG_MAX_TOKEN, &text, &len, &st, err);
	if (rc < 0)
		goto out;
	rc = clean_token(text, len, &token, "token file", err);
	if (rc < 0) {
		gcr_err_wrap(err, "%s", kc->token_file);
		goto out;
	}
	rc = kc->token == NULL || strcmp(kc->token, token) != 0;
	free_secret_str(kc->token);
	kc->token = token;
	token = NULL;
	kc->token_mtime = st.st_mtim;
	kc->token_size = st.st_size;
	kc->token_dev = st.st_dev;
	kc->token_ino = st.st_ino;
	kc->token_read_at = now;
out:
	free_secret(text, len);
	free_secret_str(token);
	return rc;
}
