/* fuzz_ocihead: agent_ocidist_head (the registry's request heads: what a client that showed the
 * node's certificate sends) on arbitrary bytes; checks that an accepted head lies inside the
 * input, ends with its empty line, and that its target is visible ASCII; a refusal has a
 * one-line message; -EAGAIN only while shorter than the size bound. */
#include "agent_ocidist.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_ocihead h;
	struct gcr_err err = { 0, "" };
	const char *b = (const char *)data;
	int rc = agent_ocidist_head(b, size, &h, &err);
	if (rc == -EAGAIN) {
		if (size >= AGENT_OCIDIST_HEAD_MAX)
			abort();
		return 0;
	}
	if (rc < 0) {
		if (err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL)
			abort();
		return 0;
	}
	if (h.len < 4 || h.len > size || h.len > AGENT_OCIDIST_HEAD_MAX || memcmp(b + h.len - 4, "\r\n\r\n", 4) != 0)
		abort();
	if (h.target_len == 0 || h.target_off + h.target_len > h.len)
		abort();
	for (size_t i = 0; i < h.target_len; i++)
		if ((unsigned char)b[h.target_off + i] <= 0x20 || (unsigned char)b[h.target_off + i] >= 0x7f)
			abort();
	if (h.method != AGENT_OCIMETHOD_GET && h.method != AGENT_OCIMETHOD_HEAD && h.method != AGENT_OCIMETHOD_OTHER)
		abort();
	/* The target goes on to the path parser, as in the registry. */
	struct agent_ocireq q;
	(void)agent_ocidist_parse(b + h.target_off, h.target_len, &q, &err);
	return 0;
}
