/* fuzz_imagemac: arbitrary bytes as the manifest of an image on shared storage, through
 * gcr_image_manifest_parse_keyed with a fixed key: as given (a writer of the share without the
 * key: never accepted unless its MAC is right), and, when the first byte is odd, signed with the
 * key first (an agent's manifest: then the signed parse's own checks run). Aborts when an
 * accepted manifest is not marked signed or lacks a file's SHA-256, or when a refusal has no
 * one-line message. */
#include "gcr_image.h"
#include "gcr_imagemac.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *buf, size_t len, const struct gcr_imagemac_keys *keys)
{
	struct gcr_image_manifest m;
	struct gcr_err err = { 0, "" };
	int rc = gcr_image_manifest_parse_keyed(buf, len, keys, &m, &err);
	if (rc < 0) {
		if (err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL)
			abort();
		return;
	}
	if (!m.signed_ok)
		abort();
	for (size_t i = 0; i < m.nfiles; i++)
		if (!m.files[i].has_sha)
			abort();
	gcr_image_manifest_clear(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct gcr_imagemac_keys keys;
	if (keys.n == 0) {
		keys.n = 1;
		memcpy(keys.key[0].k, "fuzz-key-0123456789abcdef0123456789", 35);
		keys.key[0].len = 35;
		memcpy(keys.key[0].id, "0123456789abcdef", 17);
	}
	if (size == 0)
		return 0;
	check((const char *)data + 1, size - 1, &keys);
	if (data[0] & 1) {
		json_t *root = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
		struct gcr_err err = { 0, "" };
		if (json_is_object(root) && gcr_imagemac_sign(root, &keys.key[0], &err) == 0) {
			char *text = json_dumps(root, JSON_COMPACT);
			if (text != NULL) {
				check(text, strlen(text), &keys);
				if (gcr_imagemac_check(root, &keys, &err) != 0)
					abort(); /* what was just signed verifies */
				free(text);
			}
		}
		json_decref(root);
	}
	return 0;
}
