/* fuzz_watch: feeds arbitrary bytes to agent_watch in chunks whose sizes come
 * from the input's first bytes, then checks the decoder's invariants. */
#include "agent_watch.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Small, so that the oversize path is reached often. */
#define FUZZ_MAX_LINE 4096

static int on_event(const struct agent_watch_event *ev, void *data, struct gcr_err *err)
{
	unsigned *count = data;
	if (ev->object == NULL || !json_is_object(ev->object) || ev->resource_version == NULL ||
	    ev->resource_version[0] == '\0' || strlen(ev->resource_version) > AGENT_WATCH_RV_MAX ||
	    ev->type < AGENT_WATCH_ADDED || ev->type > AGENT_WATCH_BOOKMARK)
		abort();
	/* Stop now and then, to exercise the callback-error path. */
	if (++*count % 97 == 0)
		return gcr_err_set(err, -ECANCELED, "fuzz stop");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_err err = { 0, "" };
	unsigned count = 0;
	if (size < 2)
		return 0;
	/* Byte 0: largest chunk (1..256); byte 1: seed of the chunk sizes. */
	size_t max_chunk = (size_t)data[0] + 1;
	uint32_t seed = data[1] * 2654435761u + 1;
	data += 2;
	size -= 2;

	struct agent_watch *w = agent_watch_new(FUZZ_MAX_LINE, on_event, &count);
	if (w == NULL)
		return 0;
	size_t off = 0;
	while (off < size) {
		seed = seed * 1103515245u + 12345u;
		size_t n = (seed >> 16) % max_chunk + 1;
		if (n > size - off)
			n = size - off;
		int rc = agent_watch_feed(w, data + off, n, &err);
		if (rc != 0) {
			if (rc > 0 || err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL)
				abort();
			/* Errors are sticky until reset; then the stream goes on. */
			if (agent_watch_feed(w, "\n", 1, NULL) != rc)
				abort();
			agent_watch_reset(w);
		}
		if (strlen(agent_watch_resource_version(w)) > AGENT_WATCH_RV_MAX)
			abort();
		off += n;
	}
	int rc = agent_watch_finish(w, &err);
	if (rc > 0)
		abort();
	agent_watch_free(w);
	return 0;
}
