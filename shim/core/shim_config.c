/* shim_config: table-driven parsing of the GCR_* environment; a bad value keeps
 * the default and logs one warning, it never stops the application. */
#include "shim_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_log.h"

struct shim_config shim_cfg;

static int parse_size(const char *v, void *dst)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0')
		return -EINVAL;
	*(size_t *)dst = (size_t)n;
	return 0;
}

static int parse_int(const char *v, void *dst)
{
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || n < 0 || n > 1000000000)
		return -EINVAL;
	*(int *)dst = (int)n;
	return 0;
}

static int parse_dir(const char *v, void *dst)
{
	if (v[0] != '/' || strlen(v) >= sizeof(shim_cfg.socket_dir))
		return -EINVAL;
	strcpy(dst, v);
	return 0;
}

static const struct {
	const char *env;
	int (*parse)(const char *v, void *dst);
	void *dst;
} options[] = {
	{ GCR_SOCKET_DIR_ENV, parse_dir, shim_cfg.socket_dir },
	{ "GCR_VMM_MIN_BYTES", parse_size, &shim_cfg.vmm_min_bytes },
	{ "GCR_VMM", parse_int, &shim_cfg.vmm },
	{ "GCR_STAGING_PREPARE", parse_int, &shim_cfg.staging_prepare },
	{ "GCR_STAGING_THREADS", parse_int, &shim_cfg.staging_threads },
	{ "GCR_ZERO_SKIP", parse_int, &shim_cfg.zero_skip },
	{ "GCR_INCREMENTAL", parse_int, &shim_cfg.incremental },
	{ "GCR_CTX_SHRINK", parse_int, &shim_cfg.ctx_shrink },
	{ "GCR_GATE_TIMEOUT_MS", parse_int, &shim_cfg.gate_timeout_ms },
};

void shim_config_load(void)
{
	snprintf(shim_cfg.socket_dir, sizeof(shim_cfg.socket_dir), "%s", GCR_DEFAULT_SOCKET_DIR);
	shim_cfg.vmm_min_bytes = 2u << 20; /* the VMM granularity: smaller would waste memory */
	shim_cfg.vmm = 1;
	shim_cfg.staging_prepare = 1;
	shim_cfg.staging_threads = 12; /* ~49 GB/s each way on the H100: docs/design.md */
	shim_cfg.zero_skip = 1;
	/* ~175 ms off a 16 GiB suspend on the H100 (medians of 11: 735 -> 559 ms; docs/benchmarks.md,
	 * runs 19-23); GCR_CTX_SHRINK=0 leaves the context's local memory in the checkpoint. */
	shim_cfg.ctx_shrink = 1;
	shim_cfg.gate_timeout_ms = 30000;
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		const char *v = getenv(options[i].env);
		if (v != NULL && options[i].parse(v, options[i].dst) < 0)
			GCR_LOG(GCR_LOG_WARN, "shim", "ignoring %s=%s (invalid value)", options[i].env, v);
	}
}
