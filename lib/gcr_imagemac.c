/* gcr_imagemac: HMAC-SHA256 (RFC 2104) over the manifest's canonical text. Why the manifest
 * only: it lists every file's size and SHA-256, so one MAC binds every byte, and a reader checks
 * the files against those hashes where it reads them (agent_images_copy_dir_checked, or
 * gcr_image_verify_data). Why a MAC and not a signature: the verifiers are the same agents as
 * the writers, all holding one Secret; nobody else needs to check. */
#include "gcr_imagemac.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void gcr_hmac_sha256(const void *key, size_t klen, const void *data, size_t len, uint8_t out[GCR_SHA256_LEN])
{
	uint8_t k[64] = { 0 }, pad[64], inner[GCR_SHA256_LEN];
	struct gcr_sha256 s;
	if (klen > sizeof(k)) {
		gcr_sha256_init(&s);
		gcr_sha256_update(&s, key, klen);
		gcr_sha256_final(&s, k);
	} else if (klen > 0) {
		memcpy(k, key, klen);
	}
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k[i] ^ 0x36;
	gcr_sha256_init(&s);
	gcr_sha256_update(&s, pad, sizeof(pad));
	gcr_sha256_update(&s, data, len);
	gcr_sha256_final(&s, inner);
	for (size_t i = 0; i < sizeof(pad); i++)
		pad[i] = k[i] ^ 0x5c;
	gcr_sha256_init(&s);
	gcr_sha256_update(&s, pad, sizeof(pad));
	gcr_sha256_update(&s, inner, sizeof(inner));
	gcr_sha256_final(&s, out);
	explicit_bzero(k, sizeof(k));
	explicit_bzero(pad, sizeof(pad));
	explicit_bzero(&s, sizeof(s));
}

static void key_id(struct gcr_imagemac_key *k)
{
	static const char tag[] = "gcr key id";
	struct gcr_sha256 s;
	uint8_t d[GCR_SHA256_LEN];
	gcr_sha256_init(&s);
	gcr_sha256_update(&s, tag, sizeof(tag) - 1);
	gcr_sha256_update(&s, k->k, k->len);
	gcr_sha256_final(&s, d);
	for (int i = 0; i < 8; i++)
		snprintf(k->id + 2 * i, 3, "%02x", d[i]);
}

static int load_one(const char *dir, const char *name, int required, struct gcr_imagemac_key *k, struct gcr_err *err)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	/* Follows links: a mounted Secret's files are links into its current data directory. */
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return !required && errno == ENOENT ? 1 : gcr_err_set(err, -errno, "images key %s: %s", path, strerror(errno));
	struct stat st;
	ssize_t n = fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ? -1 : read(fd, k->k, sizeof(k->k));
	char extra;
	int more = n >= 0 && (size_t)n == sizeof(k->k) && read(fd, &extra, 1) == 1;
	close(fd);
	if (n < 0)
		return gcr_err_set(err, -EINVAL, "images key %s: not a readable file", path);
	size_t len = (size_t)n;
	while (len > 0 && (k->k[len - 1] == '\n' || k->k[len - 1] == '\r'))
		len--;
	if (more || len < GCR_IMAGEMAC_KEY_MIN) {
		explicit_bzero(k->k, sizeof(k->k));
		return gcr_err_set(err, -EINVAL, "images key %s: %s than %d bytes", path, more ? "more" : "fewer",
				   more ? GCR_IMAGEMAC_KEY_MAX : GCR_IMAGEMAC_KEY_MIN);
	}
	k->len = len;
	key_id(k);
	return 0;
}

int gcr_imagemac_load(const char *dir, struct gcr_imagemac_keys *out, struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	int rc = load_one(dir, GCR_IMAGEMAC_KEY_FILE, 1, &out->key[0], err);
	if (rc < 0)
		return rc;
	out->n = 1;
	rc = load_one(dir, GCR_IMAGEMAC_PREV_FILE, 0, &out->key[1], err);
	if (rc < 0) {
		gcr_imagemac_clear(out);
		return rc;
	}
	if (rc == 0)
		out->n = 2;
	return 0;
}

void gcr_imagemac_clear(struct gcr_imagemac_keys *keys)
{
	if (keys != NULL)
		explicit_bzero(keys, sizeof(*keys));
}

/* The MAC of root without its "mac" member, as hex. */
static int mac_of(json_t *root, const struct gcr_imagemac_key *k, char hex[GCR_SHA256_HEX])
{
	json_t *body = json_copy(root); /* shallow: deleting "mac" leaves root as it was */
	if (body == NULL)
		return -ENOMEM;
	json_object_del(body, "mac");
	char *text = json_dumps(body, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(body);
	if (text == NULL)
		return -ENOMEM;
	uint8_t d[GCR_SHA256_LEN];
	gcr_hmac_sha256(k->k, k->len, text, strlen(text), d);
	free(text);
	gcr_sha256_to_hex(d, hex);
	return 0;
}

int gcr_imagemac_sign(json_t *root, const struct gcr_imagemac_key *k, struct gcr_err *err)
{
	char hex[GCR_SHA256_HEX];
	if (!json_is_object(root) || mac_of(root, k, hex) < 0 ||
	    json_object_set_new(root, "mac", json_pack("{s:s, s:s, s:s}", "alg", GCR_IMAGEMAC_ALG, "key", k->id,
							"value", hex)) < 0)
		return gcr_err_set(err, -ENOMEM, "out of memory signing the manifest");
	return 0;
}

int gcr_imagemac_check(json_t *root, const struct gcr_imagemac_keys *keys, struct gcr_err *err)
{
	json_t *mac = json_object_get(root, "mac");
	const char *alg = json_string_value(json_object_get(mac, "alg"));
	const char *id = json_string_value(json_object_get(mac, "key"));
	const char *val = json_string_value(json_object_get(mac, "value"));
	if (mac == NULL)
		return gcr_err_set(err, -EBADMSG, "the manifest is not signed (images on shared storage must be: "
				   "written by an agent without the images key?)");
	if (alg == NULL || strcmp(alg, GCR_IMAGEMAC_ALG) != 0 || id == NULL || val == NULL ||
	    strlen(val) != GCR_SHA256_HEX - 1)
		return gcr_err_set(err, -EBADMSG, "the manifest's \"mac\" is malformed");
	const struct gcr_imagemac_key *k = NULL;
	for (int i = 0; i < keys->n && k == NULL; i++)
		if (strcmp(keys->key[i].id, id) == 0)
			k = &keys->key[i];
	if (k == NULL)
		return gcr_err_set(err, -EKEYREJECTED, "the manifest is signed with key %.16s, this node holds %s%s%s (a "
				   "key rotated past \"previous\"?)", id, keys->key[0].id, keys->n > 1 ? " and " : "",
				   keys->n > 1 ? keys->key[1].id : "");
	char hex[GCR_SHA256_HEX];
	if (mac_of(root, k, hex) < 0)
		return gcr_err_set(err, -ENOMEM, "out of memory checking the manifest");
	unsigned char d = 0;
	for (size_t i = 0; i < GCR_SHA256_HEX - 1; i++)
		d |= (unsigned char)(hex[i] ^ val[i]);
	if (d != 0)
		return gcr_err_set(err, -EPERM, "the manifest's MAC does not match (changed since key %s signed it)", k->id);
	return 0;
}
