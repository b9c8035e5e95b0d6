/* agent_ocireg: the node's checkpoint-image registry. The kubelet runs only images it can pull
 * and containerd pulls over plain HTTP from a registry on a loopback address with a port
 * (core/remotes/docker/config/hosts.go, docker.IsLocalhost), so the agent serves the
 * distribution API's read side on 127.0.0.1 of the network namespace it runs in (the host's:
 * the chart gives the agent hostNetwork when eviction.restore is on). What it serves is built
 * on the fly around the image's criu/kubelet-checkpoint.tar (agent_ociimg), and only for a
 * Checkpoint of this node (of any node when the images directory is shared) that the scaler
 * issued a token for (an eviction's, for its replacement pod), or whose status.image.reference
 * its node agent published (any other Kubelet image, for a user's own new pod): the manifest by
 * that tag, blobs by the digests of an image whose tag was asked; everything else is 404. */
#include "agent_ocireg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_ociimg.h"
#include "gcr_log.h"
#include "gcr_sha256.h"

#define API "/apis/gpucr.dev/v1alpha1"
#define ARCHIVE "criu/kubelet-checkpoint.tar"
/* containerd opens a few connections per pull; a handful of pulls at once is plenty. */
#define MAX_CONNECTIONS 32u
#define IDLE_TIMEOUT_S 60u

struct entry {
	char key[320];      /* "ns/name" */
	char uid[64];       /* the Checkpoint's: a re-created one is another image */
	char archive[PATH_MAX];
	long long size;     /* of the archive, with mtime: a changed file is digested again */
	long long mtime_ns;
	struct agent_ociimg img;
	unsigned long long used; /* last use, for replacement */
};

struct agent_ocireg {
	struct agent_kube *kube;
	char node[256];
	char images_dir[PATH_MAX];
	int port;
	int shared; /* images_dir is one filesystem on every node: serve other nodes' images too */
	struct MHD_Daemon *d;
	pthread_mutex_t lock; /* guards the cache (digesting happens under it: once per image) */
	struct entry cache[AGENT_OCIREG_CACHE];
	unsigned long long tick;
};

static const char *str_at(json_t *o, const char *a, const char *b)
{
	return json_string_value(json_object_get(json_object_get(o, a), b));
}

/* Constant time, so a token cannot be guessed byte by byte from response times. */
static int same_token(const char *a, const char *b)
{
	unsigned char d = 0;
	for (int i = 0; i < AGENT_OCIIMG_TOKEN_LEN; i++)
		d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

/* Whether ck's status.image.reference is the one its node agent publishes for ns/name on this
 * registry (agent_controller, a Kubelet image that no eviction made): 0 with *tok pointing at the
 * reference's token and *cname at status.image.container (both inside ck), else -ENOENT. */
static int published(struct agent_ocireg *r, const char *ns, const char *name, json_t *ck, const char **tok,
		     const char **cname)
{
	json_t *img = json_object_get(json_object_get(ck, "status"), "image");
	const char *ref = json_string_value(json_object_get(img, "reference"));
	const char *cpu = json_string_value(json_object_get(img, "cpuCheckpoint"));
	const char *cn = json_string_value(json_object_get(img, "container"));
	const char *colon = ref ? strrchr(ref, ':') : NULL;
	char want[700];
	if (colon == NULL || cpu == NULL || strcmp(cpu, "Kubelet") != 0 || cn == NULL || cn[0] == '\0' ||
	    !agent_ociimg_token_valid(colon + 1) ||
	    agent_ociimg_ref(r->port, ns, name, colon + 1, want, sizeof(want)) < 0 || strcmp(want, ref) != 0)
		return -ENOENT;
	*tok = colon + 1;
	*cname = cn;
	return 0;
}

/* The Checkpoint ns/name when it is issued for a restore on this node: its token, its archive
 * (under images_dir, resolved) and the container name. -ENOENT otherwise (with why). */
static int issued(struct agent_ocireg *r, const char *ns, const char *name, char token[AGENT_OCIIMG_TOKEN_LEN + 1],
		  char *archive, size_t alen, char *container, size_t clen, char *uid, size_t ulen, struct gcr_err *err)
{
	char path[700];
	snprintf(path, sizeof(path), API "/namespaces/%s/checkpoints/%s", ns, name);
	long st = 0;
	json_t *ck = NULL;
	int rc = agent_kube_request(r->kube, "GET", path, NULL, NULL, &st, &ck, err);
	if (rc == 0 && st != 200)
		rc = gcr_err_set(err, -ENOENT, "Checkpoint not readable (HTTP %ld)", st);
	if (rc < 0)
		goto out;
	json_t *md = json_object_get(ck, "metadata");
	const char *ev = json_string_value(json_object_get(json_object_get(md, "labels"), AGENT_OCIREG_LABEL_EVICTION));
	const char *into =
		json_string_value(json_object_get(json_object_get(md, "labels"), AGENT_OCIREG_LABEL_RESTORED_INTO));
	const char *tok = json_string_value(json_object_get(json_object_get(md, "annotations"), AGENT_OCIREG_ANN_TOKEN));
	const char *cname = str_at(ck, "spec", "containerName");
	if (cname == NULL || cname[0] == '\0')
		cname = json_string_value(json_object_get(json_object_get(md, "annotations"), AGENT_OCIREG_ANN_CONTAINER));
	const char *phase = str_at(ck, "status", "phase"), *node = str_at(ck, "status", "nodeName");
	const char *img = json_string_value(json_object_get(json_object_get(json_object_get(ck, "status"), "image"), "path"));
	const char *u = json_string_value(json_object_get(md, "uid"));
	int eviction = ev != NULL && strcmp(ev, "true") == 0;
	if (!eviction) {
		/* Any other Kubelet image: the reference its node agent wrote into its status. */
		if (published(r, ns, name, ck, &tok, &cname) < 0) {
			rc = gcr_err_set(err, -ENOENT, "neither an eviction Checkpoint issued for a restore nor a "
					 "published image");
			goto out;
		}
	} else if (into == NULL || !agent_ociimg_token_valid(tok) || cname == NULL) {
		rc = gcr_err_set(err, -ENOENT, "not an eviction Checkpoint issued for a restore");
		goto out;
	}
	if (u == NULL) {
		rc = gcr_err_set(err, -ENOENT, "a Checkpoint without a uid");
		goto out;
	}
	if (phase == NULL || strcmp(phase, "Succeeded") != 0 || node == NULL || (!r->shared && strcmp(node, r->node) != 0) ||
	    img == NULL) {
		rc = gcr_err_set(err, -ENOENT, "not a Succeeded image%s%s", r->shared ? "" : " of node ",
				 r->shared ? "" : r->node);
		goto out;
	}
	char full[PATH_MAX], real[PATH_MAX];
	size_t dl = strlen(r->images_dir);
	snprintf(full, sizeof(full), "%s/" ARCHIVE, img);
	if (realpath(full, real) == NULL || strncmp(real, r->images_dir, dl) != 0 || real[dl] != '/') {
		rc = gcr_err_set(err, -ENOENT, "%s: no archive under %s", img, r->images_dir);
		goto out;
	}
	snprintf(token, AGENT_OCIIMG_TOKEN_LEN + 1, "%s", tok);
	snprintf(archive, alen, "%s", real);
	snprintf(container, clen, "%s", cname);
	snprintf(uid, ulen, "%s", u);
out:
	json_decref(ck);
	return rc;
}

/* The cache entry of ns/name with its digests, computing them when new or changed; NULL with
 * err. Under r->lock. */
static struct entry *image_locked(struct agent_ocireg *r, const char *key, const char *uid, const char *archive,
				  const char *container, struct gcr_err *err)
{
	struct stat sb;
	int fd = open(archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		gcr_err_set(err, -errno ? -errno : -EINVAL, "%s: %s", archive, fd < 0 ? strerror(errno) : "not a file");
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	long long mt = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
	struct entry *e = NULL, *lru = &r->cache[0];
	for (int i = 0; i < AGENT_OCIREG_CACHE; i++) {
		struct entry *c = &r->cache[i];
		if (strcmp(c->key, key) == 0 && strcmp(c->uid, uid) == 0 && strcmp(c->archive, archive) == 0 &&
		    c->size == (long long)sb.st_size && c->mtime_ns == mt) {
			e = c;
			break;
		}
		if (c->used < lru->used)
			lru = c;
	}
	if (e != NULL) {
		close(fd);
		e->used = ++r->tick;
		return e;
	}
	struct gcr_sha256 s;
	gcr_sha256_init(&s);
	static __thread unsigned char buf[1 << 16];
	ssize_t n;
	long long total = 0;
	while ((n = read(fd, buf, sizeof(buf))) > 0) {
		gcr_sha256_update(&s, buf, (size_t)n);
		total += n;
	}
	int rerr = n < 0 ? errno : 0;
	close(fd);
	if (rerr != 0 || total != (long long)sb.st_size) {
		gcr_err_set(err, -EIO, "%s: read %lld of %lld bytes%s%s", archive, total, (long long)sb.st_size,
			    rerr ? ": " : "", rerr ? strerror(rerr) : "");
		return NULL;
	}
	uint8_t d[GCR_SHA256_LEN];
	char hex[GCR_SHA256_HEX];
	gcr_sha256_final(&s, d);
	gcr_sha256_to_hex(d, hex);
	e = lru;
	agent_ociimg_clear(&e->img);
	memset(e, 0, sizeof(*e));
	if (agent_ociimg_build(container, hex, total, &e->img, err) < 0)
		return NULL;
	snprintf(e->key, sizeof(e->key), "%s", key);
	snprintf(e->uid, sizeof(e->uid), "%s", uid);
	snprintf(e->archive, sizeof(e->archive), "%s", archive);
	e->size = total;
	e->mtime_ns = mt;
	e->used = ++r->tick;
	GCR_LOG(GCR_LOG_INFO, "ocireg", "image of Checkpoint %s: layer %s (%lld bytes), index %s", key, e->img.layer_digest,
		total, e->img.index_digest);
	return e;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, unsigned int code, const char *ctype, const char *digest,
				const char *body)
{
	struct MHD_Response *resp =
		MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	MHD_add_response_header(resp, "Content-Type", ctype);
	MHD_add_response_header(resp, "Docker-Distribution-API-Version", "registry/2.0");
	if (digest != NULL)
		MHD_add_response_header(resp, "Docker-Content-Digest", digest);
	enum MHD_Result ret = MHD_queue_response(c, code, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result not_found(struct MHD_Connection *c, const char *url, const char *why)
{
	GCR_LOG(GCR_LOG_DEBUG, "ocireg", "404 %.300s: %s", url, why);
	return send_buf(c, MHD_HTTP_NOT_FOUND, "application/json", NULL,
			"{\"errors\":[{\"code\":\"NAME_UNKNOWN\",\"message\":\"not found\"}]}\n");
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *c, const char *url, const char *method,
			      const char *version, const char *upload, size_t *upload_len, void **ctx)
{
	struct agent_ocireg *r = cls;
	(void)version, (void)upload, (void)upload_len, (void)ctx;
	if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
		return send_buf(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", NULL, "read-only registry\n");
	struct agent_ocireq q;
	struct gcr_err err = { 0 };
	if (agent_ociimg_parse(url, strlen(url), &q, &err) < 0)
		return not_found(c, url, err.msg);
	if (q.kind == AGENT_OCIREQ_BASE)
		return send_buf(c, MHD_HTTP_OK, "application/json", NULL, "{}\n");
	char token[AGENT_OCIIMG_TOKEN_LEN + 1], archive[PATH_MAX], container[256], uid[64], key[320];
	if (issued(r, q.ns, q.name, token, archive, sizeof(archive), container, sizeof(container), uid, sizeof(uid),
		   &err) < 0)
		return not_found(c, url, err.msg);
	snprintf(key, sizeof(key), "%s/%s", q.ns, q.name);
	pthread_mutex_lock(&r->lock);
	struct entry *e = NULL;
	if (q.is_digest) { /* only digests of an image already asked for by its token */
		for (int i = 0; i < AGENT_OCIREG_CACHE && e == NULL; i++)
			if (strcmp(r->cache[i].key, key) == 0 && strcmp(r->cache[i].uid, uid) == 0)
				e = &r->cache[i];
		if (e == NULL) {
			pthread_mutex_unlock(&r->lock);
			return not_found(c, url, "digest of an image not asked for by its tag");
		}
	} else {
		if (!same_token(q.ref, token)) {
			pthread_mutex_unlock(&r->lock);
			return not_found(c, url, "wrong token");
		}
		if ((e = image_locked(r, key, uid, archive, container, &err)) == NULL) {
			pthread_mutex_unlock(&r->lock);
			GCR_LOG(GCR_LOG_WARN, "ocireg", "image of Checkpoint %s not served: %s", key, err.msg);
			return not_found(c, url, "image unreadable");
		}
		GCR_LOG(GCR_LOG_INFO, "ocireg", "%s manifest of Checkpoint %s (issued tag)", method, key);
	}
	/* Copies under the lock: the entry may be replaced once it is released. */
	const char *doc = NULL, *ctype = NULL, *dg = NULL;
	char dbuf[72], *copy = NULL;
	int layer = 0;
	long long lsize = e->img.layer_size;
	if (!q.is_digest || strcmp(q.ref, e->img.index_digest) == 0)
		doc = e->img.index, ctype = AGENT_OCIIMG_MT_INDEX, dg = e->img.index_digest;
	else if (strcmp(q.ref, e->img.manifest_digest) == 0)
		doc = e->img.manifest, ctype = AGENT_OCIIMG_MT_MANIFEST, dg = e->img.manifest_digest;
	else if (q.kind == AGENT_OCIREQ_BLOB && strcmp(q.ref, e->img.config_digest) == 0)
		doc = e->img.config, ctype = AGENT_OCIIMG_MT_CONFIG, dg = e->img.config_digest;
	else if (q.kind == AGENT_OCIREQ_BLOB && strcmp(q.ref, e->img.layer_digest) == 0)
		layer = 1, dg = e->img.layer_digest;
	if (dg != NULL)
		snprintf(dbuf, sizeof(dbuf), "%s", dg);
	if (doc != NULL)
		copy = strdup(doc);
	pthread_mutex_unlock(&r->lock);
	if (dg == NULL)
		return not_found(c, url, "unknown digest");
	if (!layer) {
		if (copy == NULL)
			return MHD_NO;
		enum MHD_Result ret = send_buf(c, MHD_HTTP_OK, ctype, dbuf, copy);
		free(copy);
		return ret;
	}
	int fd = open(archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0 || (long long)sb.st_size != lsize) {
		if (fd >= 0)
			close(fd);
		return not_found(c, url, "archive changed or gone");
	}
	struct MHD_Response *resp = MHD_create_response_from_fd((uint64_t)lsize, fd); /* owns fd */
	if (resp == NULL) {
		close(fd);
		return MHD_NO;
	}
	MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
	MHD_add_response_header(resp, "Docker-Content-Digest", dbuf);
	enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	GCR_LOG(GCR_LOG_INFO, "ocireg", "%s layer of Checkpoint %s (%lld bytes)", method, key, lsize);
	return ret;
}

/* Paths are taken as sent: no %-decoding, so the parser sees every byte (a "%00" decoded would
 * end the string early; a '%' is simply refused by agent_ociimg_parse). */
static size_t no_unescape(void *cls, struct MHD_Connection *c, char *s)
{
	(void)cls, (void)c;
	return strlen(s);
}

int agent_ocireg_new(struct agent_kube *kube, const char *node, const char *images_dir, int shared, int port,
		     struct agent_ocireg **out, struct gcr_err *err)
{
	*out = NULL;
	if (port <= 0 || port > 65535)
		return gcr_err_set(err, -EINVAL, "registry port %d out of 1..65535", port);
	struct agent_ocireg *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	r->kube = kube;
	r->port = port;
	r->shared = shared;
	snprintf(r->node, sizeof(r->node), "%s", node);
	if (realpath(images_dir, r->images_dir) == NULL) /* absent now: compared as given */
		snprintf(r->images_dir, sizeof(r->images_dir), "%s", images_dir);
	pthread_mutex_init(&r->lock, NULL);
	/* Loopback only, always: nothing here is for another machine. */
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	/* A thread per connection: digesting a new image's archive (0.3 GB/s) must not hold
	 * the other connections. */
	r->d = MHD_start_daemon(MHD_USE_ERROR_LOG | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
					MHD_USE_POLL,
				(uint16_t)port, NULL, NULL, answer, r, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
				MHD_OPTION_UNESCAPE_CALLBACK, no_unescape, NULL,
				MHD_OPTION_CONNECTION_LIMIT, MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT,
				IDLE_TIMEOUT_S, MHD_OPTION_END);
	if (r->d == NULL) {
		agent_ocireg_free(r);
		return gcr_err_set(err, -EADDRINUSE, "cannot serve the image registry on 127.0.0.1:%d", port);
	}
	GCR_LOG(GCR_LOG_INFO, "ocireg", "serving eviction images of node %s from %s on http://127.0.0.1:%d/v2/%s/",
		r->node, r->images_dir, port, AGENT_OCIIMG_REPO);
	*out = r;
	return 0;
}

void agent_ocireg_free(struct agent_ocireg *r)
{
	if (r == NULL)
		return;
	if (r->d != NULL)
		MHD_stop_daemon(r->d);
	for (int i = 0; i < AGENT_OCIREG_CACHE; i++)
		agent_ociimg_clear(&r->cache[i].img);
	pthread_mutex_destroy(&r->lock);
	free(r);
}
