/* shim_config: table-driven parsing of the GCR_* environment; a bad value keeps
 * the default and logs one warning, it never stops the application. */
#include "shim_config.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcr/protocol.h"
#include "gcr_log.h"

struct shim_config shim_cfg;

struct option;
/* Parses v into the row's destination if it passes the row's check; 0 or -EINVAL. */
typedef int (*parse_fn)(const char *v, const struct option *o);

struct option {
	const char *env;
	parse_fn parse;
	void *dst;
	/* As the environment would spell it: a default goes through the same parser and
	 * check as a user's value, so the two cannot disagree. */
	const char *def;
	unsigned long long min, max; /* the accepted range (numbers), or length (paths) */
};

static int parse_size(const char *v, const struct option *o)
{
	char *end;
	errno = 0;
	unsigned long long n = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || n < o->min || n > o->max)
		return -EINVAL;
	*(size_t *)o->dst = (size_t)n;
	return 0;
}

static int parse_int(const char *v, const struct option *o)
{
	char *end;
	errno = 0;
	long long n = strtoll(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || n < 0 || (unsigned long long)n < o->min ||
	    (unsigned long long)n > o->max)
		return -EINVAL;
	*(int *)o->dst = (int)n;
	return 0;
}

/* An absolute path shorter than max (the destination's size). */
static int parse_dir(const char *v, const struct option *o)
{
	size_t n = strlen(v);
	if (v[0] != '/' || n >= o->max)
		return -EINVAL;
	memcpy(o->dst, v, n + 1);
	return 0;
}

#define INT_MAX_SETTING 1000000000ULL

static const struct option options[] = {
	{ GCR_SOCKET_DIR_ENV, parse_dir, shim_cfg.socket_dir, GCR_DEFAULT_SOCKET_DIR, 1,
	  sizeof(shim_cfg.socket_dir) },
	/* 2 MiB, the VMM granularity: smaller would waste memory. */
	{ "GCR_VMM_MIN_BYTES", parse_size, &shim_cfg.vmm_min_bytes, "2097152", 0, SIZE_MAX },
	{ "GCR_VMM", parse_int, &shim_cfg.vmm, "1", 0, INT_MAX_SETTING },
	{ "GCR_STAGING_PREPARE", parse_int, &shim_cfg.staging_prepare, "1", 0, INT_MAX_SETTING },
	/* ~49 GB/s each way on the H100: docs/design.md. */
	{ "GCR_STAGING_THREADS", parse_int, &shim_cfg.staging_threads, "12", 0, INT_MAX_SETTING },
	{ "GCR_ZERO_SKIP", parse_int, &shim_cfg.zero_skip, "1", 0, INT_MAX_SETTING },
	{ "GCR_INCREMENTAL", parse_int, &shim_cfg.incremental, "0", 0, INT_MAX_SETTING },
	/* ~175 ms off a 16 GiB suspend on the H100 (medians of 11: 735 -> 559 ms; docs/benchmarks.md,
	 * runs 19-23); GCR_CTX_SHRINK=0 leaves the context's local memory in the checkpoint. */
	{ "GCR_CTX_SHRINK", parse_int, &shim_cfg.ctx_shrink, "1", 0, INT_MAX_SETTING },
	{ "GCR_GATE_TIMEOUT_MS", parse_int, &shim_cfg.gate_timeout_ms, "30000", 0, INT_MAX_SETTING },
	/* NCCL's communicators made the shim's (docs/design.md, "Groups"); 0: NCCL calls pass through
	 * unmapped, and a process holding communicators is refused like any sharing memory. */
	{ "GCR_NCCL", parse_int, &shim_cfg.nccl, "1", 0, 1 },
	/* A suspend to an image is bound by the disk, which takes few large sequential writes
	 * faster than many small ones: docs/images.md, "Numbers". */
	{ "GCR_IMAGE_WRITERS", parse_int, &shim_cfg.image_writers, "2", 1, 64 },
	{ "GCR_IMAGE_PIECE_MIB", parse_int, &shim_cfg.image_piece_mib, "64", 2, 256 },
	/* Overcommit by suspend (docs/preemption.md): the device plugin sets it for opted-in pods. */
	{ GCR_OVERCOMMIT_ENV, parse_int, &shim_cfg.overcommit, "0", 0, 1 },
	/* A suspend of a 16 GiB process takes about 0.9 s on the H100 (docs/design.md); 5 s leaves
	 * room for a few of them, and an application that gets no room still fails fast. */
	{ GCR_ROOM_TIMEOUT_ENV, parse_int, &shim_cfg.room_timeout_ms, "5000", 1, 600000 },
};

static void load(void)
{
	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		const struct option *o = &options[i];
		if (o->parse(o->def, o) < 0)
			GCR_LOG(GCR_LOG_ERROR, "shim", "built-in default %s=%s is invalid", o->env, o->def);
		const char *v = getenv(o->env);
		if (v != NULL && o->parse(v, o) < 0)
			GCR_LOG(GCR_LOG_WARN, "shim", "ignoring %s=%s (invalid value)", o->env, v);
	}
}

void shim_config_load(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, load);
}
