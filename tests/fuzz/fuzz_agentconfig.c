/* fuzz_agentconfig: agent_config_parse (gcr-agent's YAML file, node-agent/daemon/agent_config.c)
 * on arbitrary bytes. Every callback must receive NUL-terminated strings; a failure must
 * carry its code and a one-line message. */
#include "agent_config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t touch(const char *s)
{
	if (s == NULL)
		abort();
	return strlen(s);
}

static int opt(void *d, const char *key, const char *value, struct gcr_err *err)
{
	(void)err;
	*(size_t *)d += touch(key) + (value ? strlen(value) : 0);
	return 0;
}

static int dp_nested(void *d, const char *key, struct gcr_err *err)
{
	(void)err;
	*(size_t *)d += touch(key);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t seen = 0;
	const struct agent_config_sink sink = { &seen, opt, opt, dp_nested, opt };
	struct gcr_err err = { 0, "" };
	int rc = agent_config_parse((const char *)data, size, "/fuzz/config.yaml", &sink, &err);
	if (rc > 0 || (rc < 0 && (err.code != rc || err.msg[0] == '\0' || strchr(err.msg, '\n') != NULL)))
		abort();
	return 0;
}
