/* fuzz_ocipath: agent_ocidist_parse (the node registry's request paths: anything on the node's
 * loopback may send them) on arbitrary bytes; checks that a success is one of the three shapes
 * with NUL-terminated, well-formed fields, and a failure has a one-line message. */
#include "agent_ocidist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int ok_chars(const char *s, const char *allowed)
{
	return s[0] != '\0' && strspn(s, allowed) == strlen(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_ocireq q;
	struct gcr_err err = { 0, "" };
	int rc = agent_ocidist_parse((const char *)data, size, &q, &err);
	if (rc < 0) {
		if (err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL)
			abort();
		return 0;
	}
	if (q.kind == AGENT_OCIREQ_BASE)
		return size == 4 && memcmp(data, "/v2/", 4) == 0 ? 0 : (abort(), 0);
	if (q.kind != AGENT_OCIREQ_MANIFEST && q.kind != AGENT_OCIREQ_BLOB)
		abort();
	if (memchr(q.ns, '\0', sizeof(q.ns)) == NULL || memchr(q.name, '\0', sizeof(q.name)) == NULL ||
	    memchr(q.ref, '\0', sizeof(q.ref)) == NULL)
		abort();
	if (!ok_chars(q.ns, "abcdefghijklmnopqrstuvwxyz0123456789-") ||
	    !ok_chars(q.name, "abcdefghijklmnopqrstuvwxyz0123456789-.") || strstr(q.name, "..") != NULL)
		abort();
	if (q.is_digest ? (strlen(q.ref) != 71 || strncmp(q.ref, "sha256:", 7) != 0)
			: (q.kind == AGENT_OCIREQ_BLOB || !agent_ocidist_token_valid(q.ref)))
		abort();
	return 0;
}
