/* agent_deviceplugin: the kubelet device plugin (API v1beta1) of the node agent: serves
 * DevicePlugin on a Unix socket, registers with the kubelet and re-registers when it restarts. */
#ifndef AGENT_DEVICEPLUGIN_H
#define AGENT_DEVICEPLUGIN_H

#include <stdbool.h>

#include "gcr_error.h"

/* Extra environment for the shim (the chart's devicePlugin.shimEnv): at most
 * AGENT_DP_SHIM_ENV_MAX entries, name and value at most AGENT_DP_SHIM_ENV_LEN bytes each. */
#define AGENT_DP_SHIM_ENV_MAX 32
#define AGENT_DP_SHIM_ENV_LEN 1024

struct agent_dp_env {
	const char *name, *value;
};

/* NULL or 0 fields take the defaults in brackets. Strings are copied by agent_dp_new. */
struct agent_dp_config {
	const char *resource_name;       /* [gpucr.dev/shim] */
	unsigned slots;                  /* shareable slots advertised [16], 1..1024 */
	const char *kubelet_dir;         /* [/var/lib/kubelet/device-plugins] */
	const char *endpoint;            /* our socket's name in kubelet_dir [gcr-shim.sock] */
	const char *shim_host_dir;       /* holds libgcr.so [/opt/gcr/lib] */
	const char *shim_container_dir;  /* where containers see it [/opt/gcr/lib] */
	const char *socket_root;         /* per-allocation socket dirs go under it [/run/gcr/alloc] */
	const char *socket_container_dir;/* GCR_SOCKET_DIR in the container [/run/gcr/sock] */
	const char *agent_socket;        /* the agent's registry socket [/run/gcr/agent/agent.sock] */
	const char *agent_container_dir; /* where containers see its directory [/run/gcr/agent] */
	const char *cdi_device;          /* CDI device name for Allocate; NULL: none */
	/* Images of pods: each allocation gets <image_root>/.alloc/<its id> (mode 01733, as its
	 * socket dir), mounted at the same path; NULL or "": none. */
	const char *image_root;
	unsigned poll_ms;                /* kubelet restart / health check period [100 ms] */
	const struct agent_dp_env *shim_env; /* added to Allocate's envs; checked by agent_dp_env_check */
	size_t n_shim_env;
};

/* One shimEnv entry: a name [A-Za-z_][A-Za-z0-9_]* that is none of the variables Allocate
 * sets itself (LD_PRELOAD, GCR_SOCKET_DIR, GCR_AGENT_SOCKET), lengths within bounds.
 * 0 or -EINVAL with err set. */
int agent_dp_env_check(const char *name, const char *value, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Is path inside dir, or dir itself (textually: both absolute, no "..")? */
bool agent_dp_path_under(const char *path, const char *dir);

struct agent_dp;

/* Validates and copies cfg (socket_root must not lie in the agent socket's directory,
 * which every container sees). Starts nothing. NULL with err set on failure. */
struct agent_dp *agent_dp_new(const struct agent_dp_config *cfg, struct gcr_err *err);

/* Serves and registers from its own thread; returns at once. 0 or -errno. */
int agent_dp_start(struct agent_dp *dp, struct gcr_err *err) __attribute__((warn_unused_result));

/* Health of every slot; a change reaches ListAndWatch streams within poll_ms. Thread-safe. */
void agent_dp_set_healthy(struct agent_dp *dp, bool healthy);

/* Times Register succeeded with the kubelet (for tests and /readyz). Thread-safe. */
unsigned agent_dp_registrations(struct agent_dp *dp);

/* Stops the thread, cancels streams, removes the socket, frees. NULL-safe. */
void agent_dp_free(struct agent_dp *dp);

#endif
