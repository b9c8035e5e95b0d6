/* gcr_imagemac: the integrity of images on storage other machines write to (images.shared,
 * images.claim; docs/images.md, "Shared storage"): the manifest lists every file's SHA-256 and
 * carries an HMAC-SHA256 of itself under a key only the node agents hold, so a writer of the
 * share who lacks the key cannot make a restore take changed data (CRC-32C, the format's own
 * check, is no defence against a writer who recomputes it). */
#ifndef GCR_IMAGEMAC_H
#define GCR_IMAGEMAC_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "gcr_sha256.h"

#define GCR_IMAGEMAC_KEY_MIN 32   /* bytes of a key at least */
#define GCR_IMAGEMAC_KEY_MAX 1024 /* and at most */
/* A key directory (a Secret mounted into the agent) holds "key", the one that signs, and
 * optionally "previous", still accepted: one rotation at a time (docs/install.md). */
#define GCR_IMAGEMAC_KEY_FILE "key"
#define GCR_IMAGEMAC_PREV_FILE "previous"
#define GCR_IMAGEMAC_ALG "HMAC-SHA256"
#define GCR_IMAGEMAC_ID_HEX 17 /* a key's name: 8 bytes of SHA-256("gcr key id" || key), hex */

struct gcr_imagemac_key {
	unsigned char k[GCR_IMAGEMAC_KEY_MAX];
	size_t len;
	char id[GCR_IMAGEMAC_ID_HEX];
};

struct gcr_imagemac_keys {
	struct gcr_imagemac_key key[2]; /* [0] signs; both verify */
	int n;
};

void gcr_hmac_sha256(const void *key, size_t klen, const void *data, size_t len, uint8_t out[GCR_SHA256_LEN]);

/* Reads dir/key (required) and dir/previous (optional): each GCR_IMAGEMAC_KEY_MIN..MAX bytes,
 * a trailing newline dropped. 0 or -errno with a message. */
int gcr_imagemac_load(const char *dir, struct gcr_imagemac_keys *out, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* Wipes the keys. */
void gcr_imagemac_clear(struct gcr_imagemac_keys *keys);

/* Adds "mac": {"alg", "key": the key's id, "value": hex} to the manifest object root: the HMAC of
 * root's canonical text (compact, keys sorted) without "mac". 0 or -ENOMEM. */
int gcr_imagemac_sign(json_t *root, const struct gcr_imagemac_key *k, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Checks the manifest object root (as parsed from disk) against keys: -EBADMSG when it carries
 * no MAC or a malformed one, -EKEYREJECTED when signed with a key this node does not hold (both
 * named), -EPERM when the MAC differs (changed since it was signed). Constant-time compare. */
int gcr_imagemac_check(json_t *root, const struct gcr_imagemac_keys *keys, struct gcr_err *err)
	__attribute__((warn_unused_result));

#endif
