/* agent_ocireg: the node's checkpoint-image registry. The kubelet runs only images it can pull,
 * so the agent serves the distribution API's read side on 127.0.0.1 of the network namespace
 * it runs in (the host's: the chart gives the agent hostNetwork when eviction.restore is on),
 * over TLS to containerd alone (agent_ocisrv, agent_regtls: containerd's host configuration for
 * the port is written at start). What it serves is built on the fly around the image's
 * criu/kubelet-checkpoint.tar (agent_ocidist), and only for a Checkpoint of this node (of any
 * node when the images directory is shared) that the scaler issued a token for (an eviction's,
 * for its replacement pod), or whose status.image.reference its node agent published (any other
 * Kubelet image, for a user's own new pod): the manifest by that tag, blobs by the digests of an
 * image whose tag was asked; everything else is 404. A sweep keeps the node's image store from
 * holding a checkpoint image once a container was started from it or its token is withdrawn
 * (agent_cristore). Tokens are never logged. */
#include "agent_ocireg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent_cristore.h"
#include "agent_ocidist.h"
#include "agent_ocisrv.h"
#include "agent_phase.h"
#include "agent_regtls.h"
#include "gcr_image.h"
#include "gcr_imagemac.h"
#include "gcr_log.h"
#include "gcr_sha256.h"
#include "gcr_time.h"

#define API "/apis/gpucr.dev/v1alpha1"
#define ARCHIVE GCR_IMAGE_RUNTIME_ARCHIVE
#define HASH_BUF (1u << 20)

enum estate { E_EMPTY = 0, E_DIGESTING, E_READY };

struct entry {
	char key[320];      /* "ns/name" */
	char uid[64];       /* the Checkpoint's: a re-created one is another image */
	char archive[PATH_MAX];
	long long size;     /* of the archive, with mtime: a changed file is digested again */
	long long mtime_ns;
	enum estate state;  /* digesting: one request reads the archive, without the lock */
	struct agent_ocidist_image img;
	unsigned long long used; /* last use, for replacement */
};

struct agent_ocireg {
	struct agent_kube *kube;
	struct agent_metrics *metrics;
	struct agent_ocireg_cfg cfg;
	char images_dir[PATH_MAX];
	struct agent_regtls *tls;
	struct agent_ocisrv *srv;
	pthread_mutex_t lock; /* guards the cache; never held while an archive is read */
	pthread_cond_t ready; /* an entry left E_DIGESTING */
	struct entry cache[AGENT_OCIREG_CACHE];
	unsigned long long tick;
	atomic_int listening, taken_reported, stop;
	pthread_t sweeper;
	int sweeper_started, grpc;
	pthread_mutex_t slock; /* the sweep's sleep */
	pthread_cond_t scond;
	atomic_ullong removed; /* images taken out of the node's store */
};

static const char *str_at(json_t *o, const char *a, const char *b)
{
	return json_string_value(json_object_get(json_object_get(o, a), b));
}

/* Constant time, so a token cannot be guessed byte by byte from response times. */
static int same_token(const char *a, const char *b)
{
	unsigned char d = 0;
	for (int i = 0; i < AGENT_OCIDIST_TOKEN_LEN; i++)
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
	    !agent_ocidist_token_valid(colon + 1) ||
	    agent_ocidist_ref(r->cfg.port, ns, name, colon + 1, want, sizeof(want)) < 0 || strcmp(want, ref) != 0)
		return -ENOENT;
	*tok = colon + 1;
	*cname = cn;
	return 0;
}

struct issue {
	char token[AGENT_OCIDIST_TOKEN_LEN + 1];
	char archive[PATH_MAX], dir[PATH_MAX], container[256], uid[64];
};

/* The Checkpoint ns/name when it is issued for a restore on this node: its token, its archive
 * (under images_dir, resolved) and the container name. -ENOENT otherwise (with why). */
static int issued(struct agent_ocireg *r, const char *ns, const char *name, struct issue *out, struct gcr_err *err)
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
	enum agent_phase phase = agent_phase_of(str_at(ck, "status", "phase"));
	const char *node = str_at(ck, "status", "nodeName");
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
	} else if (into == NULL || !agent_ocidist_token_valid(tok) || cname == NULL) {
		rc = gcr_err_set(err, -ENOENT, "not an eviction Checkpoint issued for a restore");
		goto out;
	}
	if (u == NULL || strlen(u) >= sizeof(out->uid) || strlen(cname) >= sizeof(out->container)) {
		rc = gcr_err_set(err, -ENOENT, "a Checkpoint without a uid, or with a container name too long");
		goto out;
	}
	if (phase != AGENT_PHASE_SUCCEEDED || node == NULL ||
	    (!r->cfg.shared && strcmp(node, r->cfg.node) != 0) || img == NULL) {
		rc = gcr_err_set(err, -ENOENT, "not a Succeeded image%s%s", r->cfg.shared ? "" : " of node ",
				 r->cfg.shared ? "" : r->cfg.node);
		goto out;
	}
	char full[PATH_MAX + 64], real[PATH_MAX];
	size_t dl = strlen(r->images_dir);
	snprintf(full, sizeof(full), "%s/" ARCHIVE, img);
	if (realpath(full, real) == NULL || strncmp(real, r->images_dir, dl) != 0 || real[dl] != '/') {
		rc = gcr_err_set(err, -ENOENT, "%s: no archive under %s", img, r->images_dir);
		goto out;
	}
	snprintf(out->token, sizeof(out->token), "%s", tok);
	snprintf(out->archive, sizeof(out->archive), "%s", real);
	/* The image directory: the archive's grandparent (<image>/criu/kubelet-checkpoint.tar). */
	snprintf(out->dir, sizeof(out->dir), "%s", real);
	for (int i = 0; i < 2; i++) {
		char *sl = strrchr(out->dir, '/');
		if (sl != NULL)
			*sl = '\0';
	}
	snprintf(out->container, sizeof(out->container), "%s", cname);
	snprintf(out->uid, sizeof(out->uid), "%s", u);
out:
	json_decref(ck);
	return rc;
}

/* The archive's sha256 as its image's signed manifest gives it (shared storage: containerd
 * then checks every byte it pulls against a digest no writer of the share could forge). 0 with
 * hex, -ENOENT with no key configured, else -errno: refused. */
static int signed_digest(struct agent_ocireg *r, const char *dir, long long size, char hex[GCR_SHA256_HEX],
			 struct gcr_err *err)
{
	if (r->cfg.images_key_dir == NULL)
		return -ENOENT;
	struct gcr_imagemac_keys keys;
	int rc = gcr_imagemac_load(r->cfg.images_key_dir, &keys, err);
	if (rc < 0)
		return rc;
	char path[PATH_MAX + 32], *buf = NULL;
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/%s", dir, GCR_IMAGE_MANIFEST);
	struct gcr_image_manifest m = { 0 };
	rc = gcr_image_read_file(path, GCR_IMAGE_MAX_JSON, &buf, &len, err);
	if (rc == 0)
		rc = gcr_image_manifest_parse_keyed(buf, len, &keys, &m, err);
	free(buf);
	gcr_imagemac_clear(&keys);
	const struct gcr_image_file *f = NULL;
	for (size_t i = 0; rc == 0 && i < m.nfiles && f == NULL; i++)
		if (strcmp(m.files[i].path, ARCHIVE) == 0)
			f = &m.files[i];
	if (rc == 0 && (f == NULL || (long long)f->size != size))
		rc = gcr_err_set(err, -EIO, "the signed manifest %s the archive (%lld bytes on disk)",
				 f == NULL ? "does not list" : "gives another size for", size);
	if (rc == 0)
		gcr_sha256_to_hex(f->sha, hex);
	gcr_image_manifest_clear(&m);
	return rc;
}

/* sha256 of the open file, its size bytes; 0 or -EIO. */
static int digest_fd(int fd, long long size, char hex[GCR_SHA256_HEX], struct gcr_err *err)
{
	unsigned char *buf = malloc(HASH_BUF);
	if (buf == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	struct gcr_sha256 s;
	gcr_sha256_init(&s);
	long long total = 0;
	ssize_t n;
	while ((n = read(fd, buf, HASH_BUF)) > 0 || (n < 0 && errno == EINTR)) {
		if (n < 0)
			continue;
		gcr_sha256_update(&s, buf, (size_t)n);
		total += n;
	}
	int rerr = n < 0 ? errno : 0;
	free(buf);
	if (rerr != 0 || total != size)
		return gcr_err_set(err, -EIO, "read %lld of %lld bytes%s%s", total, size, rerr ? ": " : "",
				   rerr ? strerror(rerr) : "");
	uint8_t d[GCR_SHA256_LEN];
	gcr_sha256_final(&s, d);
	gcr_sha256_to_hex(d, hex);
	return 0;
}

/* The image of the issued Checkpoint key, built once per archive: a copy of its entry into *out
 * (documents duplicated), or -errno. Only the entry being built is held while its archive is
 * read: requests for other images go on (one 3 GB archive held every pull for 18 s when the
 * whole cache was locked), and requests for this one wait for it. */
static int image_of(struct agent_ocireg *r, const char *key, const struct issue *is, struct agent_ocidist_image *out,
		    struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	int fd = open(is->archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat sb;
	if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		int e = fd < 0 ? errno : EINVAL;
		if (fd >= 0)
			close(fd);
		return gcr_err_set(err, -e, "%s: %s", is->archive, fd < 0 ? strerror(e) : "not a file");
	}
	long long mt = (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec, size = (long long)sb.st_size;
	pthread_mutex_lock(&r->lock);
	struct entry *e = NULL;
	for (;;) {
		struct entry *lru = NULL;
		e = NULL;
		for (int i = 0; i < AGENT_OCIREG_CACHE && e == NULL; i++) {
			struct entry *c = &r->cache[i];
			if (c->state != E_EMPTY && strcmp(c->key, key) == 0 && strcmp(c->uid, is->uid) == 0 &&
			    strcmp(c->archive, is->archive) == 0 && c->size == size && c->mtime_ns == mt)
				e = c;
			else if (c->state != E_DIGESTING && (lru == NULL || c->used < lru->used))
				lru = c;
		}
		if (e != NULL && e->state == E_DIGESTING) { /* another request builds it: wait for it */
			pthread_cond_wait(&r->ready, &r->lock);
			continue;
		}
		if (e != NULL)
			break;
		if (lru == NULL) { /* every entry being built: a bound on the archives read at once */
			pthread_mutex_unlock(&r->lock);
			close(fd);
			return gcr_err_set(err, -EBUSY, "%d images are being digested at once", AGENT_OCIREG_CACHE);
		}
		e = lru;
		agent_ocidist_clear(&e->img);
		memset(e, 0, sizeof(*e));
		snprintf(e->key, sizeof(e->key), "%s", key);
		snprintf(e->uid, sizeof(e->uid), "%s", is->uid);
		snprintf(e->archive, sizeof(e->archive), "%s", is->archive);
		e->size = size;
		e->mtime_ns = mt;
		e->state = E_DIGESTING;
		pthread_mutex_unlock(&r->lock);
		char hex[GCR_SHA256_HEX];
		double t0 = gcr_time_mono_ms();
		int rc = signed_digest(r, is->dir, size, hex, err), hashed = 0;
		if (rc == -ENOENT && (rc = digest_fd(fd, size, hex, err)) == 0)
			hashed = 1;
		struct agent_ocidist_image img = { 0 };
		if (rc == 0)
			rc = agent_ocidist_build(is->container, hex, size, &img, err);
		pthread_mutex_lock(&r->lock);
		if (rc < 0) {
			e->state = E_EMPTY;
			e->key[0] = '\0';
			pthread_cond_broadcast(&r->ready);
			pthread_mutex_unlock(&r->lock);
			close(fd);
			return rc;
		}
		e->img = img;
		e->state = E_READY;
		pthread_cond_broadcast(&r->ready);
		GCR_LOG(GCR_LOG_INFO, "ocireg", "image of Checkpoint %s: layer %s (%lld bytes, %s in %.0f ms), index %s", key,
			e->img.layer_digest, size, hashed ? "digested" : "digest from the signed manifest",
			gcr_time_mono_ms() - t0, e->img.index_digest);
		break;
	}
	close(fd);
	e->used = ++r->tick;
	*out = e->img;
	out->config = strdup(e->img.config);
	out->manifest = strdup(e->img.manifest);
	out->index = strdup(e->img.index);
	pthread_mutex_unlock(&r->lock);
	if (out->config == NULL || out->manifest == NULL || out->index == NULL) {
		agent_ocidist_clear(out);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	return 0;
}

/* A cached image (its tag asked before) of the Checkpoint key with uid: a copy, or -ENOENT. */
static int cached(struct agent_ocireg *r, const char *key, const char *uid, struct agent_ocidist_image *out)
{
	memset(out, 0, sizeof(*out));
	int rc = -ENOENT;
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < AGENT_OCIREG_CACHE && rc < 0; i++) {
		struct entry *c = &r->cache[i];
		if (c->state == E_READY && strcmp(c->key, key) == 0 && strcmp(c->uid, uid) == 0) {
			*out = c->img;
			out->config = strdup(c->img.config);
			out->manifest = strdup(c->img.manifest);
			out->index = strdup(c->img.index);
			rc = out->config && out->manifest && out->index ? 0 : -ENOMEM;
			c->used = ++r->tick;
		}
	}
	pthread_mutex_unlock(&r->lock);
	if (rc == -ENOMEM)
		agent_ocidist_clear(out);
	return rc;
}

static void not_found(struct agent_ocisrv_conn *c, const struct agent_ocireq *q, const char *why)
{
	/* The path is never logged: a manifest's path carries the token. */
	GCR_LOG(GCR_LOG_DEBUG, "ocireg", "404 %s of %s/%s (uid %ld): %s",
		q == NULL ? "request" : q->kind == AGENT_OCIREQ_BLOB ? "blob" : "manifest", q ? q->ns : "-",
		q ? q->name : "-", agent_ocisrv_peer_uid(c), why);
	static const char body[] = "{\"errors\":[{\"code\":\"NAME_UNKNOWN\",\"message\":\"not found\"}]}\n";
	agent_ocisrv_reply(c, 404, "application/json", NULL, body, sizeof(body) - 1);
}

static void answer(void *data, struct agent_ocisrv_conn *c, const struct agent_ocisrv_req *req)
{
	struct agent_ocireg *r = data;
	struct agent_ocireq q;
	struct gcr_err err = { 0 };
	if (agent_ocidist_parse(req->target, req->target_len, &q, &err) < 0) {
		not_found(c, NULL, err.msg);
		return;
	}
	if (q.kind == AGENT_OCIREQ_BASE) {
		agent_ocisrv_reply(c, 200, "application/json", NULL, "{}\n", 3);
		return;
	}
	struct issue is;
	if (issued(r, q.ns, q.name, &is, &err) < 0) {
		not_found(c, &q, err.msg);
		return;
	}
	char key[320];
	snprintf(key, sizeof(key), "%s/%s", q.ns, q.name);
	struct agent_ocidist_image img;
	if (q.is_digest) { /* only digests of an image already asked for by its token */
		if (cached(r, key, is.uid, &img) < 0) {
			not_found(c, &q, "digest of an image not asked for by its tag");
			return;
		}
	} else {
		if (!same_token(q.ref, is.token)) {
			not_found(c, &q, "wrong token");
			return;
		}
		if (image_of(r, key, &is, &img, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "ocireg", "image of Checkpoint %s not served: %s", key, err.msg);
			if (err.code == -EBUSY)
				agent_ocisrv_reply(c, 503, "text/plain", NULL, "busy\n", 5);
			else
				not_found(c, &q, "image unreadable or refused");
			return;
		}
		GCR_LOG(GCR_LOG_INFO, "ocireg", "%s manifest of Checkpoint %s (issued tag)",
			req->method == AGENT_OCIMETHOD_HEAD ? "HEAD" : "GET", key);
	}
	const char *doc = NULL, *ctype = NULL, *dg = NULL;
	int layer = 0;
	if (!q.is_digest || strcmp(q.ref, img.index_digest) == 0)
		doc = img.index, ctype = AGENT_OCIDIST_MT_INDEX, dg = img.index_digest;
	else if (strcmp(q.ref, img.manifest_digest) == 0)
		doc = img.manifest, ctype = AGENT_OCIDIST_MT_MANIFEST, dg = img.manifest_digest;
	else if (q.kind == AGENT_OCIREQ_BLOB && strcmp(q.ref, img.config_digest) == 0)
		doc = img.config, ctype = AGENT_OCIDIST_MT_CONFIG, dg = img.config_digest;
	else if (q.kind == AGENT_OCIREQ_BLOB && strcmp(q.ref, img.layer_digest) == 0)
		layer = 1, dg = img.layer_digest;
	if (dg == NULL) {
		agent_ocidist_clear(&img);
		not_found(c, &q, "unknown digest");
		return;
	}
	if (!layer) {
		agent_ocisrv_reply(c, 200, ctype, dg, doc, strlen(doc));
		agent_ocidist_clear(&img);
		return;
	}
	/* The layer as its digest says: a changed archive (size) is not served; a change of bytes
	 * at the same size is caught by containerd against the digest. */
	int fd = open(is.archive, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	struct stat sb;
	long long lsize = img.layer_size;
	if (fd < 0 || fstat(fd, &sb) < 0 || (long long)sb.st_size != lsize) {
		if (fd >= 0)
			close(fd);
		agent_ocidist_clear(&img);
		not_found(c, &q, "archive changed or gone");
		return;
	}
	char dcopy[72];
	snprintf(dcopy, sizeof(dcopy), "%s", dg);
	agent_ocidist_clear(&img);
	int rc = agent_ocisrv_reply_fd(c, 200, "application/octet-stream", dcopy, fd, lsize);
	GCR_LOG(GCR_LOG_INFO, "ocireg", "%s layer of Checkpoint %s (%lld bytes)%s",
		req->method == AGENT_OCIMETHOD_HEAD ? "HEAD" : "GET", key, lsize, rc < 0 ? ": the send failed" : "");
}

/* ---- the port, reported ---- */

static void pod_event(struct agent_ocireg *r, const char *type, const char *reason, const char *note)
{
	if (r->cfg.pod_ns == NULL || r->cfg.pod_name == NULL)
		return;
	json_t *obj = json_pack("{s:s, s:s, s:{s:s, s:s}}", "apiVersion", "v1", "kind", "Pod", "metadata", "namespace",
				r->cfg.pod_ns, "name", r->cfg.pod_name);
	struct gcr_err err;
	if (obj == NULL || agent_kube_event(r->kube, obj, type, reason, "Serve", note, r->cfg.node, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "ocireg", "Event %s on pod %s/%s not written: %s", reason, r->cfg.pod_ns,
			r->cfg.pod_name, obj ? err.msg : "out of memory");
	json_decref(obj);
}

static void state(void *data, int listening, const char *why)
{
	struct agent_ocireg *r = data;
	atomic_store(&r->listening, listening);
	char note[600];
	if (!listening) {
		snprintf(note, sizeof(note), "%s: the node's checkpoint images are not served until it is free (the agent "
			 "retries with back-off); containerd pulls only from this agent (TLS), so whatever holds the port "
			 "receives no pull", why);
		pod_event(r, "Warning", "RegistryPortTaken", note);
		atomic_store(&r->taken_reported, 1);
	} else if (atomic_exchange(&r->taken_reported, 0)) {
		snprintf(note, sizeof(note), "serving checkpoint images on 127.0.0.1:%d again", r->cfg.port);
		pod_event(r, "Normal", "RegistryListening", note);
	}
}

int agent_ocireg_listening(void *data)
{
	return atomic_load(&((struct agent_ocireg *)data)->listening);
}

static void metrics(FILE *f, void *data)
{
	struct agent_ocireg *r = data;
	struct agent_ocisrv_stats st;
	agent_ocisrv_stats(r->srv, &st);
	fprintf(f,
		"# HELP gcr_agent_image_registry_listening 1 while the checkpoint-image registry holds its port.\n"
		"# TYPE gcr_agent_image_registry_listening gauge\n"
		"gcr_agent_image_registry_listening %d\n"
		"# HELP gcr_agent_image_registry_bind_failures_total Tries that found the registry's port taken.\n"
		"# TYPE gcr_agent_image_registry_bind_failures_total counter\n"
		"gcr_agent_image_registry_bind_failures_total %llu\n"
		"# HELP gcr_agent_image_registry_connections Registry connections now, by state.\n"
		"# TYPE gcr_agent_image_registry_connections gauge\n"
		"gcr_agent_image_registry_connections{state=\"handshake\"} %u\n"
		"gcr_agent_image_registry_connections{state=\"serving\"} %u\n"
		"# HELP gcr_agent_image_registry_connections_total Registry connections by outcome.\n"
		"# TYPE gcr_agent_image_registry_connections_total counter\n"
		"gcr_agent_image_registry_connections_total{outcome=\"accepted\"} %llu\n"
		"gcr_agent_image_registry_connections_total{outcome=\"authenticated\"} %llu\n"
		"gcr_agent_image_registry_connections_total{outcome=\"handshake_failed\"} %llu\n"
		"gcr_agent_image_registry_connections_total{outcome=\"evicted\"} %llu\n"
		"gcr_agent_image_registry_connections_total{outcome=\"refused\"} %llu\n"
		"# HELP gcr_agent_image_registry_requests_total Requests on authenticated connections.\n"
		"# TYPE gcr_agent_image_registry_requests_total counter\n"
		"gcr_agent_image_registry_requests_total %llu\n"
		"# HELP gcr_agent_image_registry_store_removals_total Checkpoint images taken out of the node's image "
		"store.\n# TYPE gcr_agent_image_registry_store_removals_total counter\n"
		"gcr_agent_image_registry_store_removals_total %llu\n",
		st.listening, st.bind_failures, st.pending, st.serving, st.accepted, st.authenticated, st.handshake_failed,
		st.evicted, st.refused, st.requests, atomic_load(&r->removed));
}

/* ---- the node's image store ---- */

/* The images named by containers of this node's pods that have started (running, or ended): a
 * container the runtime restored from a checkpoint image reports its base image to the CRI, so
 * the pods say which checkpoint image it was made from. A JSON object used as a set, or NULL. */
static json_t *started_images(struct agent_ocireg *r)
{
	char path[400];
	snprintf(path, sizeof(path), "/api/v1/pods?fieldSelector=spec.nodeName%%3D%s", r->cfg.node);
	long st = 0;
	json_t *list = NULL, *out = NULL;
	struct gcr_err err;
	if (agent_kube_request(r->kube, "GET", path, NULL, NULL, &st, &list, &err) < 0 || st != 200) {
		GCR_LOG(GCR_LOG_DEBUG, "ocireg", "image store: pods of node %s not listed (HTTP %ld)", r->cfg.node, st);
		json_decref(list);
		return NULL;
	}
	out = json_object();
	size_t i, k;
	json_t *pod, *cs;
	json_array_foreach(json_object_get(list, "items"), i, pod)
	{
		json_t *spec = json_object_get(pod, "spec"), *status = json_object_get(pod, "status");
		const char *lists[][2] = { { "containers", "containerStatuses" }, { "initContainers", "initContainerStatuses" } };
		for (size_t l = 0; l < 2; l++) {
			json_array_foreach(json_object_get(status, lists[l][1]), k, cs)
			{
				json_t *state = json_object_get(cs, "state"), *last = json_object_get(cs, "lastState");
				const char *cname = json_string_value(json_object_get(cs, "name"));
				if (cname == NULL || (json_object_get(state, "running") == NULL &&
						      json_object_get(state, "terminated") == NULL &&
						      json_object_get(last, "terminated") == NULL))
					continue;
				size_t j;
				json_t *c;
				json_array_foreach(json_object_get(spec, lists[l][0]), j, c)
				{
					const char *n = json_string_value(json_object_get(c, "name"));
					const char *img = json_string_value(json_object_get(c, "image"));
					if (n != NULL && img != NULL && strcmp(n, cname) == 0)
						json_object_set_new(out, img, json_true());
				}
			}
		}
	}
	json_decref(list);
	return out;
}

/* One pass: every image named under 127.0.0.1:<port>/gcr-evict/ goes unless its token is still
 * the one issued and no container of this node was started from it yet. While both hold, the
 * registry would serve it to the token anyway, so the store grants nothing more; after, a pod
 * naming it with imagePullPolicy IfNotPresent would start from it without any pull. */
static void sweep(struct agent_ocireg *r)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "127.0.0.1:%d/%s/", r->cfg.port, AGENT_OCIDIST_REPO);
	struct agent_cristore_list l;
	struct gcr_err err;
	if (agent_cristore_images(r->cfg.cri_endpoint, prefix, &l, &err) < 0) {
		GCR_LOG(GCR_LOG_DEBUG, "ocireg", "image store: %s", err.msg);
		return;
	}
	json_t *started = l.n > 0 ? started_images(r) : NULL;
	for (size_t i = 0; i < l.n && !atomic_load(&r->stop); i++) {
		const struct agent_cristore_image *im = &l.img[i];
		char ck[320] = "", why[200] = "";
		int keep = 1, used = 0;
		for (size_t k = 0; k < im->nnames && started != NULL; k++)
			used |= json_object_get(started, im->names[k]) != NULL;
		/* Its tag's Checkpoint and token; a digest name alone (no token) is never kept. */
		for (size_t k = 0; k < im->nnames; k++) {
			const char *rest = im->names[k] + strlen(prefix), *colon = strrchr(rest, ':');
			const char *slash = strchr(rest, '/');
			if (strchr(rest, '@') != NULL || colon == NULL || slash == NULL || slash > colon)
				continue;
			char ns[64] = "", name[254] = "";
			snprintf(ns, sizeof(ns), "%.*s", (int)(slash - rest), rest);
			snprintf(name, sizeof(name), "%.*s", (int)(colon - slash - 1), slash + 1);
			snprintf(ck, sizeof(ck), "%s/%s", ns, name);
			struct issue is;
			struct gcr_err e2;
			if (!agent_ocidist_token_valid(colon + 1) || issued(r, ns, name, &is, &e2) < 0 ||
			    !same_token(colon + 1, is.token)) {
				keep = 0;
				snprintf(why, sizeof(why), "its token is no longer issued");
			}
			break;
		}
		if (ck[0] == '\0') {
			keep = 0;
			snprintf(why, sizeof(why), "named by digest only");
		}
		if (keep && used) {
			keep = 0;
			snprintf(why, sizeof(why), "a container was started from it");
		}
		if (keep)
			continue;
		if (agent_cristore_remove(r->cfg.cri_endpoint, im->id, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "ocireg", "checkpoint image of Checkpoint %s (%s) not removed from the node's "
				"image store: %s", ck[0] ? ck : "?", im->id, err.msg);
			continue;
		}
		atomic_fetch_add(&r->removed, 1);
		GCR_LOG(GCR_LOG_INFO, "ocireg", "checkpoint image of Checkpoint %s (%s) removed from the node's image store: "
			"%s", ck[0] ? ck : "?", im->id, why);
	}
	json_decref(started);
	agent_cristore_list_clear(&l);
}

static void *sweeper(void *arg)
{
	struct agent_ocireg *r = arg;
	pthread_mutex_lock(&r->slock);
	while (!atomic_load(&r->stop)) {
		pthread_mutex_unlock(&r->slock);
		sweep(r);
		pthread_mutex_lock(&r->slock);
		struct timespec dl;
		gcr_time_deadline(&dl, AGENT_OCIREG_SWEEP_MS);
		while (!atomic_load(&r->stop) && pthread_cond_timedwait(&r->scond, &r->slock, &dl) == 0)
			;
	}
	pthread_mutex_unlock(&r->slock);
	return NULL;
}

int agent_ocireg_new(struct agent_kube *kube, struct agent_metrics *m, const struct agent_ocireg_cfg *cfg,
		     struct agent_ocireg **out, struct gcr_err *err)
{
	*out = NULL;
	if (cfg->port <= 0 || cfg->port > 65535)
		return gcr_err_set(err, -EINVAL, "registry port %d out of 1..65535", cfg->port);
	if (cfg->hosts_dir == NULL || cfg->hosts_dir[0] != '/')
		return gcr_err_set(err, -EINVAL, "the image registry needs containerd's registry host directory for "
				   "127.0.0.1:%d (--restore-registry-hosts-dir, an absolute path)", cfg->port);
	struct agent_ocireg *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	r->kube = kube;
	r->metrics = m;
	r->cfg = *cfg;
	if (realpath(cfg->images_dir, r->images_dir) == NULL) /* absent now: compared as given */
		snprintf(r->images_dir, sizeof(r->images_dir), "%s", cfg->images_dir);
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->ready, NULL);
	pthread_mutex_init(&r->slock, NULL);
	pthread_cond_init(&r->scond, NULL);
	int rc = agent_regtls_new(cfg->node, &r->tls, err);
	if (rc == 0 && (rc = agent_regtls_write_hosts(r->tls, cfg->hosts_dir, cfg->port, err)) < 0)
		gcr_err_wrap(err, "containerd's registry host configuration");
	struct agent_ocisrv_cfg scfg = { .port = cfg->port, .tls = r->tls, .proc_root = cfg->proc_root, .fn = answer,
					 .state = state, .data = r };
	if (rc == 0)
		rc = agent_ocisrv_start(&scfg, &r->srv, err);
	if (rc == 0 && cfg->cri_endpoint != NULL && cfg->cri_endpoint[0] != '\0') {
		agent_cristore_init();
		r->grpc = 1;
		if ((rc = pthread_create(&r->sweeper, NULL, sweeper, r)) != 0)
			rc = gcr_err_set(err, -rc, "cannot start the image store sweep: %s", strerror(rc));
		else
			r->sweeper_started = 1;
	}
	if (rc < 0) {
		agent_ocireg_free(r);
		return rc;
	}
	if (m != NULL)
		agent_metrics_add_source(m, metrics, r);
	GCR_LOG(GCR_LOG_INFO, "ocireg", "serving checkpoint images of %s%s from %s on https://127.0.0.1:%d/v2/%s/ "
		"(containerd's host configuration in %s; checkpoint images %s)", cfg->shared ? "every node" : "node ",
		cfg->shared ? "" : cfg->node, r->images_dir, cfg->port, AGENT_OCIDIST_REPO, cfg->hosts_dir,
		r->sweeper_started ? "leave the node's image store once used or withdrawn"
				   : "stay in the node's image store (no CRI endpoint)");
	*out = r;
	return 0;
}

void agent_ocireg_free(struct agent_ocireg *r)
{
	if (r == NULL)
		return;
	if (r->metrics != NULL)
		agent_metrics_add_source(r->metrics, NULL, r); /* removes it */
	atomic_store(&r->stop, 1);
	pthread_mutex_lock(&r->slock);
	pthread_cond_broadcast(&r->scond);
	pthread_mutex_unlock(&r->slock);
	if (r->sweeper_started)
		pthread_join(r->sweeper, NULL);
	if (r->grpc)
		agent_cristore_shutdown();
	agent_ocisrv_free(r->srv);
	agent_regtls_free(r->tls);
	for (int i = 0; i < AGENT_OCIREG_CACHE; i++)
		agent_ocidist_clear(&r->cache[i].img);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->ready);
	pthread_mutex_destroy(&r->slock);
	pthread_cond_destroy(&r->scond);
	free(r);
}
