/* agent_config: gcr-agent's YAML configuration file, read with libyaml's document API (as
 * agent_kubeconfig reads a kubeconfig) and handed setting by setting to the agent, which
 * owns the option table and checks each value. The shape: a mapping of option names to
 * scalars, and the devicePlugin section, a mapping of its keys to scalars, with shimEnv a
 * mapping of names to scalar values (nested values of other keys go to dp_nested, which
 * refuses or skips them). Several documents in one file are read in turn. */
#ifndef AGENT_CONFIG_H
#define AGENT_CONFIG_H

#include <stddef.h>

#include "gcr_error.h"

#define AGENT_CONFIG_SECTION "devicePlugin"
#define AGENT_CONFIG_SHIM_ENV "shimEnv"

/* Each callback returns 0 or -errno with err set; the reader prefixes the file's path. */
struct agent_config_sink {
	void *data;
	/* A top-level key with a scalar value (the section given as a scalar too: the callback
	 * says it must be a mapping). */
	int (*opt)(void *data, const char *key, const char *value, struct gcr_err *err);
	/* A key of the section with a scalar value (shimEnv as a scalar: only null means none). */
	int (*dp_opt)(void *data, const char *key, const char *value, struct gcr_err *err);
	/* A key of the section, not shimEnv, whose value is a mapping or a sequence. */
	int (*dp_nested)(void *data, const char *key, struct gcr_err *err);
	/* One shimEnv entry. */
	int (*dp_env)(void *data, const char *name, const char *value, struct gcr_err *err);
};

/* Reads the configuration in text (len bytes); path names it in messages. 0, or -EINVAL
 * (not YAML, or not the shape above; an alias anywhere), or a callback's error, with err
 * saying where. Settings before the error have been handed over. */
int agent_config_parse(const char *text, size_t len, const char *path, const struct agent_config_sink *sink,
		       struct gcr_err *err);

/* The same for the file at path: -errno when it cannot be opened. */
int agent_config_load(const char *path, const struct agent_config_sink *sink, struct gcr_err *err);

#endif
