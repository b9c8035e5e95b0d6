/* agent_main: gcr-agent's entry point: configuration (YAML file, then flags),
 * start-up of the registry, metrics, device plugin and controller, and the SIGTERM shutdown. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_config.h"
#include "agent_controller.h"
#include "agent_deviceplugin.h"
#include "agent_gate.h"
#include "agent_informer.h"
#include "agent_kube.h"
#include "agent_kubeconfig.h"
#include "agent_lease.h"
#include "agent_leader.h"
#include "agent_opts.h"
#include "agent_scaler.h"
#include "agent_activity.h"
#include "agent_metrics.h"
#include "agent_ocireg.h"
#include "agent_registry.h"
#include "agent_replace.h"
#include "agent_room.h"
#include "agent_podspec.h"
#include "agent_roompolicy.h"
#include "agent_share.h"
#include "agent_evict.h"
#include "agent_evictmsg.h"
#include "gcr/protocol.h"
#include "gcr_driver.h"
#include "gcr_jsonbudget.h"
#include "gcr_log.h"
#include "gcr_time.h"

/* Largest configuration file we read, in bytes. */
#define CONFIG_MAX (64 * 1024)
/* Seconds the test hook pauses unless GCR_AGENT_TEST_PAUSE_S says otherwise. */
#define TEST_PAUSE_S_DEFAULT 60
/* Most operations one agent runs at once (agent_controller's bound). */
#define MAX_PARALLEL_MAX 64
/* Most images kept per pod (images-keep). */
#define IMAGES_KEEP_MAX 100

/* Where the registry socket and the device plugin's per-container socket dirs go when not
 * given, under socketDir: changing only --socket-dir moves them all. The registry gets a
 * directory of its own because the device plugin mounts that directory into every opted-in pod. */
#define REGISTRY_IN_SOCKET_DIR "/agent/agent.sock"
#define SOCKET_ROOT_IN_SOCKET_DIR "/alloc"
/* Records decide which processes are resumed: a directory of socketDir that the device
 * plugin mounts into no pod (it mounts the registry socket's directory and one directory of
 * the socket root per container). */
#define RECORDS_IN_SOCKET_DIR "/records"

/* The lease namespace when neither leaseNamespace nor POD_NAMESPACE says otherwise. */
#define LEASE_NS_DEFAULT "gcr-system"

/* The devicePlugin section of the file (the chart's values.yaml devicePlugin). NULL / 0:
 * the device plugin's defaults (agent_deviceplugin.h). */
struct dp_cfg {
	bool enabled; /* off unless the file says true: the chart turns it on */
	char *resource_name, *kubelet_dir, *endpoint, *shim_host_dir, *shim_container_dir, *socket_root,
		*socket_container_dir, *agent_container_dir, *cdi_device, *image_root;
	long slots, poll_ms;
	char *env[2 * AGENT_DP_SHIM_ENV_MAX]; /* shimEnv: name, value, ... */
	size_t n_env;                         /* pairs */
};

/* The options, typed (agent_opts: each row below parses and checks its slot). */
enum role { ROLE_NODE, ROLE_SCALER, ROLE_ALL };
enum oc_mode { OC_MODE_FULL, OC_MODE_DATA };
struct cfg {
	char *kubeconfig, *node_name, *socket_dir, *registry_socket, *metrics_address, *proc_root, *context,
		*lease_namespace, *agent_selector, *record_dir, *images_dir, *room_from, *kubelet_url,
		*kubelet_checkpoints, *restore_certs_dir, *restore_cri_endpoint, *images_key_dir;
	bool images_shared, overcommit, overcommit_env, outside_pods, eviction, hold_driver;
	long heartbeat_s, leader_lease_s, max_parallel, restore_grace_s, images_keep, overcommit_margin_mib,
		overcommit_return_ms, overcommit_idle_ms, unused_backoff_ms, share_pods, share_registry, share_holds,
		share_room, share_workers, eviction_rate, eviction_fixed_s, restore_port, restore_wait_s;
	int role;           /* enum role */
	int overcommit_mode; /* enum oc_mode */
	struct dp_cfg dp;
};

static const char *const role_names[] = { "node", "scaler", "all", NULL };
static const char *const oc_mode_names[] = { "full", "data", NULL };
#define SLOT(f) offsetof(struct cfg, f)
static const struct agent_opt opts_table[] = {
	{ "kubeconfig", "kubeconfig", AGENT_OPT_STR, SLOT(kubeconfig), NULL,
	  .help = "kubeconfig file (default: in-cluster service account)" },
	{ "context", "context", AGENT_OPT_STR, SLOT(context), NULL,
	  .help = "kubeconfig context (default: current-context)" },
	{ "node-name", "nodeName", AGENT_OPT_STR, SLOT(node_name), NULL,
	  .help = "this node's name (default: $NODE_NAME)" },
	{ "socket-dir", "socketDir", AGENT_OPT_STR, SLOT(socket_dir), GCR_DEFAULT_SOCKET_DIR,
	  .help = "directory of the shims' control sockets" },
	{ "registry-socket", "registrySocket", AGENT_OPT_STR, SLOT(registry_socket), NULL,
	  .help = "Unix socket the shims register on, in a directory of its own (default: <socket-dir>" REGISTRY_IN_SOCKET_DIR ")" },
	{ "metrics-address", "metricsAddress", AGENT_OPT_STR, SLOT(metrics_address), "127.0.0.1:9464",
	  .help = "HOST:PORT of /metrics, /healthz, /readyz" },
	{ "proc-root", "procRoot", AGENT_OPT_STR, SLOT(proc_root), "/proc",
	  .help = "where <pid>/cgroup and <pid>/stat files are read" },
	{ "record-dir", "recordDir", AGENT_OPT_STR, SLOT(record_dir), NULL,
	  .help = "the agent's own record of each Checkpoint, root only (default: <socket-dir>" RECORDS_IN_SOCKET_DIR ")" },
	{ "restore-grace-seconds", "restoreGraceSeconds", AGENT_OPT_INT, SLOT(restore_grace_s), "30", .lo = 1, .hi = 3600,
	  .help = "a Restore whose Checkpoint does not exist waits this long (Pending) before it fails (1..3600)" },
	{ "images-dir", "imagesDir", AGENT_OPT_STR, SLOT(images_dir), "/var/lib/gcr/images",
	  .help = "root of the images Checkpoints with action Image write, as <root>/<namespace>/<pod>/<name>" },
	{ "images-keep", "imagesKeep", AGENT_OPT_INT, SLOT(images_keep), "2", .lo = 1, .hi = IMAGES_KEEP_MAX,
	  .help = "images kept per pod: the oldest past this many are removed when a new one commits (1..100)" },
	{ "images-shared", "imagesShared", AGENT_OPT_BOOL, SLOT(images_shared), "false",
	  .help = "true: images-dir is one filesystem every node shares (the operator's promise): a Restore takes an image "
	  "another node wrote, and retention removes only the images this node wrote; false: images are node-local "
	  "(another node's image is refused, ImageElsewhere)" },
	{ "overcommit", "overcommit", AGENT_OPT_BOOL, SLOT(overcommit), "true",
	  .help = "true: a pod that opted in (gpucr.dev/overcommit: suspend; GCR_OVERCOMMIT=1 outside Kubernetes) and runs out "
	  "of GPU memory gets room by the suspend of lower-priority ones (docs/preemption.md); false: never" },
	{ "overcommit-margin-mib", "overcommitMarginMiB", AGENT_OPT_INT, SLOT(overcommit_margin_mib), "0", .lo = 0, .hi = 65536,
	  .help = "MiB made free beyond an allocation that asks for room (0..65536)" },
	{ "overcommit-return-ms", "overcommitReturnMs", AGENT_OPT_INT, SLOT(overcommit_return_ms), "2000", .lo = 1, .hi = 600000, .never = 1,
	  .help = "a suspended pod is resumed once its GPU has had room for it this long (ms, 1..600000) while the pod it "
	  "made room for still runs (that pod freed memory); -1: only when that pod ends" },
	{ "overcommit-idle-ms", "overcommitIdleMs", AGENT_OPT_INT, SLOT(overcommit_idle_ms), "30000", .lo = 0, .hi = 86400000,
	  .help = "a pod that others were suspended for and that has made no GPU call this long (ms, 0..86400000; 0: never) "
	  "is suspended itself so that they resume; its next call wakes it (suspending them again)" },
	{ "overcommit-mode", "overcommitMode", AGENT_OPT_ENUM, SLOT(overcommit_mode), "full", .names = oc_mode_names,
	  .help = "full: a victim leaves the GPU whole (data, then the driver's checkpoint); data: only its buffers "
	  "leave, its context stays (faster suspend and resume, a few hundred MiB left per victim)" },
	{ "overcommit-env", "overcommitEnv", AGENT_OPT_BOOL, SLOT(overcommit_env), "true",
	  .help = "true: a process whose pod Kubernetes does not show is opted in and ranked by its environment "
	  "(GCR_OVERCOMMIT, GCR_PRIORITY, GCR_PREEMPTIBLE); false: only pods labelled gpucr.dev/overcommit take part "
	  "(the chart: its device plugin sets GCR_OVERCOMMIT for every container)" },
	{ "overcommit-room-from", "overcommitRoomFrom", AGENT_OPT_STR, SLOT(room_from), "",
	  .help = "which namespaces may suspend pods of which for room: 'REQUESTER=VICTIM,...;...', names or * (the chart's "
	  "overcommit.roomFrom); a namespace always may from itself; empty: from itself only (docs/preemption.md)" },
	{ "overcommit-unused-backoff-ms", "overcommitUnusedBackoffMs", AGENT_OPT_INT, SLOT(unused_backoff_ms), "60000", .lo = 1, .hi = 86400000, .never = 1,
	  .help = "a pod given room by suspends that does not use it within 3 s loses its priority this long (ms, "
	  "1..86400000; -1: never): its requests are refused and the pods held for it resume" },
	{ "share-pods", "sharePods", AGENT_OPT_INT, SLOT(share_pods), "0", .lo = 0, .hi = 1024,
	  .help = "pods a node's tables are shared among: each pod gets max(1, capacity / this) of each (0: devicePlugin.slots "
	  "with the device plugin on, else 32; docs/install.md, \"Shares per pod\")" },
	{ "share-registry-per-pod", "shareRegistryPerPod", AGENT_OPT_INT, SLOT(share_registry), "0", .lo = 0, .hi = AGENT_REGISTRY_MAX,
	  .help = "registered processes one pod may have at once (of 1024; 0: the fair share)" },
	{ "share-holds-per-pod", "shareHoldsPerPod", AGENT_OPT_INT, SLOT(share_holds), "0", .lo = 0, .hi = AGENT_EVICT_MAX_HOLDS,
	  .help = "gcr-hold connections one pod may have at once (of 64; 0: the fair share)" },
	{ "share-room-per-pod", "shareRoomPerPod", AGENT_OPT_INT, SLOT(share_room), "0", .lo = 0, .hi = AGENT_ROOM_QUEUE,
	  .help = "room requests one pod may have waiting at once (of 64; 0: the fair share)" },
	{ "workers-per-namespace", "workersPerNamespace", AGENT_OPT_INT, SLOT(share_workers), "0", .lo = 0, .hi = MAX_PARALLEL_MAX,
	  .help = "Checkpoints and Restores of one namespace run at once on this node (of --max-parallel; 0: half of it, at "
	  "least 1)" },
	{ "processes-outside-pods", "processesOutsidePods", AGENT_OPT_BOOL, SLOT(outside_pods), "false",
	  .help = "true: shims of processes outside pods register too (a machine without Kubernetes: gcrctl and "
	  "overcommit work on them; Checkpoint objects cannot name them)" },
	{ "hold-driver", "holdDriver", AGENT_OPT_BOOL, SLOT(hold_driver), "false",
	  .help = "true: the CUDA driver opened at start and held (resumes on the node open it in tens of ms, not "
	  "0.2-0.4 s; about 4 MiB of every GPU shows used while the agent runs)" },
	{ "kubelet-url", "kubeletURL", AGENT_OPT_STR, SLOT(kubelet_url), NULL,
	  .help = "https://HOST:PORT of this node's kubelet, whose checkpoint API writes the CPU side of an Image with "
	  "spec.cpuCheckpoint Kubelet (default: none, such Images fail)" },
	{ "kubelet-checkpoints-dir", "kubeletCheckpointsDir", AGENT_OPT_STR, SLOT(kubelet_checkpoints), "/var/lib/kubelet/checkpoints",
	  .help = "where the kubelet writes its checkpoint archives (its root dir + /checkpoints, mounted at the same path): "
	  "an Image cut short by an agent restart during the kubelet's checkpoint has its archive removed there" },
	{ "eviction", "eviction", AGENT_OPT_BOOL, SLOT(eviction), "false",
	  .help = "true: a pod labelled gpucr.dev/evict: image whose preStop hook runs gcr-hold is imaged (a Checkpoint "
	  "evict-<pod>-<uid>, needs --kubelet-url) when it is deleted for preemption or drain; false: gcr-hold is "
	  "answered at once" },
	{ "eviction-rate-mib-s", "evictionRateMiBs", AGENT_OPT_INT, SLOT(eviction_rate), "200", .lo = 1, .hi = 100000,
	  .help = "GPU data an eviction image writes per second, conservatively (MiB/s, 1..100000): with "
	  "--eviction-fixed-seconds, the estimate weighed against the grace period left" },
	{ "eviction-fixed-seconds", "evictionFixedSeconds", AGENT_OPT_INT, SLOT(eviction_fixed_s), "15", .lo = 1, .hi = 3600,
	  .help = "seconds an eviction image needs besides its GPU data (the container's CRIU dump, the archive; 1..3600)" },
	{ "restore-registry-port", "restoreRegistryPort", AGENT_OPT_INT, SLOT(restore_port), "0", .lo = 0, .hi = 65535,
	  .help = "eviction images restored into replacement pods (docs/preemption.md, \"The replacement pod\"): role node "
	  "serves them on 127.0.0.1:PORT of its network namespace (the host's), role scaler points gated pods there; "
	  "0: off (0..65535)" },
	{ "restore-registry-certs-dir", "restoreRegistryCertsDir", AGENT_OPT_STR, SLOT(restore_certs_dir), "/etc/containerd/certs.d",
	  .help = "containerd's registry configuration root (its CRI config_path): the agent writes hosts.toml, a CA and a "
	  "client certificate for https://127.0.0.1:PORT into <dir>/127.0.0.1_PORT_ at every start, so that containerd "
	  "pulls checkpoint images from this agent only (docs/install.md, \"The image registry\")" },
	{ "restore-cri-endpoint", "restoreCriEndpoint", AGENT_OPT_STR, SLOT(restore_cri_endpoint), NULL,
	  .help = "the container runtime's CRI socket (the kubelet's): checkpoint images are removed from the node's image "
	  "store once a container was started from them or their token is withdrawn (default: none, they stay)" },
	{ "images-key-dir", "imagesKeyDir", AGENT_OPT_STR, SLOT(images_key_dir), NULL,
	  .help = "directory of the shared images' key (\"key\", and \"previous\" while rotating): every image is signed, "
	  "every restore refuses one not signed with it; required with --images-shared (docs/images.md)" },
	{ "restore-wait-seconds", "restoreWaitSeconds", AGENT_OPT_INT, SLOT(restore_wait_s), "90", .lo = 1, .hi = 3600,
	  .help = "a pod gated gpucr.dev/restore waits this long for its owner's eviction Checkpoint in progress, and a "
	  "restored pod for its container, before it starts cold (1..3600)" },
	{ "lease-namespace", "leaseNamespace", AGENT_OPT_STR, SLOT(lease_namespace), NULL,
	  .help = "namespace of the node heartbeat Leases and the scaler's leader Lease (default: $POD_NAMESPACE, else "
	  LEASE_NS_DEFAULT ")" },
	{ "heartbeat-seconds", "heartbeatSeconds", AGENT_OPT_INT, SLOT(heartbeat_s), "10", .lo = 1, .hi = AGENT_LEASE_DURATION_S - 1,
	  .help = "node heartbeat period; pods' activity is sampled at the same pace (1..39)" },
	{ "leader-lease-seconds", "leaderLeaseSeconds", AGENT_OPT_INT, SLOT(leader_lease_s), "15", .lo = 1, .hi = 300,
	  .help = "term of the scaler's leader Lease: another agent takes over this long after the leader stops (1..300)" },
	{ "max-parallel", "maxParallel", AGENT_OPT_INT, SLOT(max_parallel), "4", .lo = 1, .hi = MAX_PARALLEL_MAX,
	  .help = "Checkpoints and Restores run at once on this node, each on a different pod (1..64)" },
	{ "agent-selector", "agentSelector", AGENT_OPT_STR, SLOT(agent_selector), NULL,
	  .help = "label selector of the node agents' pods in the lease namespace: the scaler creates the heartbeat "
	  "Lease of each node they run on (role node cannot create Leases)" },
	{ "role", "role", AGENT_OPT_ENUM, SLOT(role), "all", .names = role_names,
	  .help = "node (controller, device plugin, registry, heartbeat), scaler (leader election, GPUResidency scaler, "
	  "readiness gates) or all (both: one machine)" },
};


/* The devicePlugin section, typed as the options are (agent_opts); the defaults are the device
 * plugin's own (agent_deviceplugin.h). Paths and names may not be empty; an empty cdiDevice (the
 * chart's default) means none. shimEnv, a mapping, is walked by agent_config (dp_env_add). */
#define DP_SLOT(f) offsetof(struct dp_cfg, f)
#define DP_STR(key, f) { key, key, AGENT_OPT_STR, DP_SLOT(f), NULL, .nonempty = 1, .help = "" }
static const struct agent_opt dp_rows[] = {
	{ "enabled", "enabled", AGENT_OPT_BOOL, DP_SLOT(enabled), "false", .help = "" },
	{ "slots", "slots", AGENT_OPT_INT, DP_SLOT(slots), "16", 1, 1024, .help = "" },
	{ "pollMs", "pollMs", AGENT_OPT_INT, DP_SLOT(poll_ms), "100", 1, 60000, .help = "" },
	DP_STR("resourceName", resource_name),
	DP_STR("kubeletDir", kubelet_dir),
	DP_STR("endpoint", endpoint),
	DP_STR("shimHostDir", shim_host_dir),
	DP_STR("shimContainerDir", shim_container_dir),
	DP_STR("socketRoot", socket_root),
	DP_STR("socketContainerDir", socket_container_dir),
	DP_STR("agentContainerDir", agent_container_dir),
	{ "cdiDevice", "cdiDevice", AGENT_OPT_STR, DP_SLOT(cdi_device), NULL, .empty_none = 1, .help = "" },
	DP_STR("imageRoot", image_root),
};
#define NDP_ROWS (sizeof(dp_rows) / sizeof(dp_rows[0]))
#define DP_SECTION AGENT_CONFIG_SECTION
#define NOPTS (sizeof(opts_table) / sizeof(opts_table[0]))

static int set_opt(struct cfg *c, const char *name, const char *value, struct gcr_err *err)
{
	return agent_opts_set(opts_table, NOPTS, c, name, value, err);
}

/* One shimEnv entry, checked as the device plugin will (so a bad one fails at start even
 * with the plugin off). */
static int dp_env_add(struct dp_cfg *d, const char *name, const char *value, struct gcr_err *err)
{
	if (d->n_env >= AGENT_DP_SHIM_ENV_MAX)
		return gcr_err_set(err, -EINVAL, "%s.shimEnv: more than %d entries", DP_SECTION,
				   AGENT_DP_SHIM_ENV_MAX);
	if (agent_dp_env_check(name, value, err) < 0)
		return gcr_err_wrap(err, "%s.shimEnv", DP_SECTION);
	for (size_t i = 0; i < d->n_env; i++)
		if (strcmp(d->env[2 * i], name) == 0)
			return gcr_err_set(err, -EINVAL, "%s.shimEnv: %s given twice", DP_SECTION, name);
	char *n = strdup(name), *v = strdup(value);
	if (n == NULL || v == NULL) {
		free(n);
		free(v);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	d->env[2 * d->n_env] = n;
	d->env[2 * d->n_env + 1] = v;
	d->n_env++;
	return 0;
}

/* One key/value of the devicePlugin section. Keys this agent does not know are logged
 * and ignored, so a newer chart still starts an older agent. */
static int dp_opt(struct dp_cfg *d, const char *key, const char *value, struct gcr_err *err)
{
	if (strcmp(key, AGENT_CONFIG_SHIM_ENV) == 0) { /* a scalar: only an empty (null) one, meaning none */
		if (value[0] != '\0' && strcmp(value, "~") != 0 && strcmp(value, "null") != 0)
			return gcr_err_set(err, -EINVAL, "%s.shimEnv must be a mapping", DP_SECTION);
		return 0;
	}
	int rc = agent_opts_set_in(dp_rows, NDP_ROWS, d, DP_SECTION, key, value, err);
	if (rc != -ENOENT)
		return rc;
	GCR_LOG(GCR_LOG_DEBUG, "agent", "config: %s.%s ignored (not used by this agent)", DP_SECTION, key);
	return 0;
}

/* A key of the devicePlugin section whose value is a mapping or a sequence: an error for
 * the scalar keys this agent reads, ignored for keys it does not know (shimEnv is
 * walked by agent_config). */
static int dp_nested(const char *key, struct gcr_err *err)
{
	if (agent_opts_find(dp_rows, NDP_ROWS, key) != NULL)
		return gcr_err_set(err, -EINVAL, "%s.%s must be a scalar", DP_SECTION, key);
	GCR_LOG(GCR_LOG_DEBUG, "agent", "config: %s.%s ignored (not used by this agent)", DP_SECTION, key);
	return 0;
}

/* One key/value of the file: an option or logLevel. */
static int file_opt(struct cfg *c, const char *key, const char *value, struct gcr_err *err)
{
	if (strcmp(key, "logLevel") == 0) {
		static const char *const names[] = { "error", "warn", "info", "debug" };
		for (int i = 0; i < 4; i++)
			if (strcmp(value, names[i]) == 0 && getenv("GCR_LOG_LEVEL") == NULL)
				gcr_log_level = i;
		return 0;
	}
	if (strcmp(key, DP_SECTION) == 0)
		return gcr_err_set(err, -EINVAL, "%s must be a mapping", DP_SECTION);
	return set_opt(c, key, value, err);
}

static int cfg_opt(void *data, const char *key, const char *value, struct gcr_err *err)
{
	return file_opt(data, key, value, err);
}

static int cfg_dp_opt(void *data, const char *key, const char *value, struct gcr_err *err)
{
	return dp_opt(&((struct cfg *)data)->dp, key, value, err);
}

static int cfg_dp_nested(void *data, const char *key, struct gcr_err *err)
{
	(void)data;
	return dp_nested(key, err);
}

static int cfg_dp_env(void *data, const char *name, const char *value, struct gcr_err *err)
{
	return dp_env_add(&((struct cfg *)data)->dp, name, value, err);
}

/* The configuration file (agent_config: its shape), each setting checked here. */
static int load_config(struct cfg *c, const char *path, struct gcr_err *err)
{
	const struct agent_config_sink sink = { .data = c, .opt = cfg_opt, .dp_opt = cfg_dp_opt,
						.dp_nested = cfg_dp_nested, .dp_env = cfg_dp_env };
	return agent_config_load(path, &sink, err);
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gcr-agent [--config FILE] [--OPTION VALUE]...\n"
		   "The GCR node agent: runs Checkpoint and Restore objects for this node's pods.\n");
	agent_opts_usage(f, opts_table, NOPTS);
	fprintf(f, "  --%-18s YAML file with the options above as keys (flags win), and a devicePlugin\n"
		   "  %-20s section: enabled [false], resourceName, slots, kubeletDir, endpoint, shimHostDir,\n"
		   "  %-20s shimContainerDir, socketRoot [<socket-dir>" SOCKET_ROOT_IN_SOCKET_DIR "], socketContainerDir,\n"
		   "  %-20s agentContainerDir, cdiDevice, pollMs, shimEnv (a map: extra environment for the shim)\n",
		"config", "", "", "");
	fprintf(f, "Environment: NODE_NAME; POD_NAMESPACE; GCR_LOG_LEVEL; test hook\n"
		   "GCR_AGENT_TEST_PAUSE=before-cr|after-cr|before-rs (pause GCR_AGENT_TEST_PAUSE_S seconds, default 60,\n"
		   "at that point of each Checkpoint, or before each Restore's resume).\n");
}

static void cfg_free(struct cfg *c)
{
	agent_opts_free(opts_table, NOPTS, c);
	agent_opts_free(dp_rows, NDP_ROWS, &c->dp);
	for (size_t i = 0; i < 2 * c->dp.n_env; i++) {
		free(c->dp.env[i]);
		c->dp.env[i] = NULL;
	}
	c->dp.n_env = 0;
}


/* registrySocket and devicePlugin.socketRoot from socketDir when not given; then refuses a
 * socketRoot inside the registry socket's directory (every opted-in pod would see the other
 * pods' socket dirs), naming the keys to change. */
static int derive_paths(struct cfg *c, struct gcr_err *err)
{
	size_t n = strlen(c->socket_dir);
	while (n > 0 && c->socket_dir[n - 1] == '/')
		n--; /* "/run/gcr/" and "/" join without a double slash */
	char buf[512];
	if (c->registry_socket == NULL) {
		snprintf(buf, sizeof(buf), "%.*s%s", (int)n, c->socket_dir, REGISTRY_IN_SOCKET_DIR);
		if (set_opt(c, "registry-socket", buf, err) < 0)
			return -ENOMEM;
	}
	if (c->record_dir == NULL) {
		snprintf(buf, sizeof(buf), "%.*s%s", (int)n, c->socket_dir, RECORDS_IN_SOCKET_DIR);
		if (set_opt(c, "record-dir", buf, err) < 0)
			return -ENOMEM;
	}
	if (c->dp.socket_root == NULL) {
		snprintf(buf, sizeof(buf), "%.*s%s", (int)n, c->socket_dir, SOCKET_ROOT_IN_SOCKET_DIR);
		if ((c->dp.socket_root = strdup(buf)) == NULL)
			return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	if (!c->dp.enabled)
		return 0; /* nothing is mounted into pods */
	snprintf(buf, sizeof(buf), "%s", c->registry_socket);
	char *slash = strrchr(buf, '/');
	if (slash == NULL)
		return gcr_err_set(err, -EINVAL, "registrySocket %s: want an absolute path", c->registry_socket);
	slash[slash == buf] = '\0'; /* its directory; "/" stays "/" */
	if (agent_dp_path_under(c->dp.socket_root, buf))
		return gcr_err_set(err, -EINVAL,
				   "%s.socketRoot %.80s lies in %.80s, registrySocket's dir, which every opted-in pod "
				   "sees: give registrySocket (--registry-socket) a dir of its own (default "
				   "<socket-dir>%s) or move %s.socketRoot",
				   DP_SECTION, c->dp.socket_root, buf, REGISTRY_IN_SOCKET_DIR, DP_SECTION);
	if (agent_dp_path_under(c->record_dir, buf) || agent_dp_path_under(c->record_dir, c->dp.socket_root))
		return gcr_err_set(err, -EINVAL,
				   "recordDir %.80s lies in a directory the device plugin mounts into pods (%.80s or "
				   "%.80s): keep it out of both (default <socket-dir>%s)",
				   c->record_dir, buf, c->dp.socket_root, RECORDS_IN_SOCKET_DIR);
	if (agent_dp_path_under(c->socket_dir, buf))
		GCR_LOG(GCR_LOG_WARN, "agent",
			"socketDir %s lies in registrySocket's directory %s, which the device plugin mounts into "
			"every opted-in pod: give registrySocket a directory of its own", c->socket_dir, buf);
	return 0;
}

/* Flags parsed twice: first only --config (loaded first), then the rest, so flags win. */
static int parse_args(struct cfg *c, int argc, char **argv, struct gcr_err *err)
{
	const char *config = NULL;
	int rc = agent_opts_defaults(opts_table, NOPTS, c, err);
	if (rc == 0)
		rc = agent_opts_defaults(dp_rows, NDP_ROWS, &c->dp, err);
	if (rc < 0)
		return rc;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			exit(0);
		}
		if (strcmp(argv[i], "--config") == 0 && i + 1 < argc)
			config = argv[i + 1];
		else if (strncmp(argv[i], "--config=", 9) == 0)
			config = argv[i] + 9;
	}
	if (config != NULL && (rc = load_config(c, config, err)) < 0)
		return rc;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = NULL;
		char name[64];
		if (strncmp(a, "--", 2) != 0)
			return gcr_err_set(err, -EINVAL, "unexpected argument '%s'", a);
		const char *eq = strchr(a, '=');
		if (eq != NULL) {
			snprintf(name, sizeof(name), "%.*s", (int)(eq - a - 2), a + 2);
			v = eq + 1;
		} else {
			snprintf(name, sizeof(name), "%s", a + 2);
			if (i + 1 >= argc)
				return gcr_err_set(err, -EINVAL, "--%s needs a value", name);
			v = argv[++i];
		}
		if (strcmp(name, "config") == 0)
			continue;
		if ((rc = set_opt(c, name, v, err)) < 0)
			return rc;
	}
	if (c->node_name == NULL && getenv("NODE_NAME") != NULL && set_opt(c, "node-name", getenv("NODE_NAME"), err) < 0)
		return -ENOMEM;
	const char *pod_ns = getenv("POD_NAMESPACE");
	if (c->lease_namespace == NULL &&
	    set_opt(c, "lease-namespace", pod_ns && pod_ns[0] ? pod_ns : LEASE_NS_DEFAULT, err) < 0)
		return -ENOMEM;
	if (derive_paths(c, err) < 0)
		return err->code;
	/* Each value was checked as it was set (agent_opts); what is left are the rules between them. */
	if (c->role != ROLE_SCALER && (c->node_name == NULL || c->node_name[0] == '\0'))
		return gcr_err_set(err, -EINVAL, "no node name: pass --node-name or set NODE_NAME");
	/* The scaler reads the same file and images nothing. */
	if (c->eviction && c->role != ROLE_SCALER && (c->kubelet_url == NULL || c->kubelet_url[0] == '\0'))
		return gcr_err_set(err, -EINVAL, "--eviction true needs --kubelet-url: an eviction image's CPU side is the "
				   "kubelet's checkpoint (the chart's images.kubelet.enabled)");
	struct agent_roompolicy *pol = malloc(sizeof(*pol));
	int prc = pol != NULL ? agent_roompolicy_parse(c->room_from, strlen(c->room_from), pol, err)
			      : gcr_err_set(err, -ENOMEM, "out of memory");
	free(pol);
	if (prc < 0)
		return gcr_err_wrap(err, "--overcommit-room-from");
	if (c->images_dir[0] != '/')
		return gcr_err_set(err, -EINVAL, "--images-dir: '%s' is not an absolute path", c->images_dir);
	/* On storage other machines write to, CRC-32C is no defence: images are signed there. */
	if (c->images_shared && (c->images_key_dir == NULL || c->images_key_dir[0] != '/'))
		return gcr_err_set(err, -EINVAL, "--images-shared needs --images-key-dir (an absolute path): images "
				   "on shared storage are signed with a key the agents hold (docs/images.md, \"Shared storage\")");
	if (c->restore_certs_dir[0] != '/')
		return gcr_err_set(err, -EINVAL, "--restore-registry-certs-dir: '%s' is not an absolute path",
				   c->restore_certs_dir);
	if (c->kubelet_url != NULL && c->kubelet_url[0] != '\0' &&
	    (strncmp(c->kubelet_url, "https://", 8) != 0 || c->kubelet_url[strlen(c->kubelet_url) - 1] == '/'))
		return gcr_err_set(err, -EINVAL, "--kubelet-url: '%s' is not https://HOST:PORT", c->kubelet_url);
	return 0;
}

static int registered_gauge(void *data)
{
	return data ? agent_registry_count(data) : 0; /* role scaler: no registry */
}

/* /readyz with the device plugin on: it registered with the kubelet at least once. */
static int dp_registered(void *data)
{
	return agent_dp_registrations(data) > 0;
}

/* /readyz of role node: the device plugin registered (when on), the image registry holding its
 * port (when on: a squatted port is retried, and says so here). */
struct node_ready {
	struct agent_dp *dp;
	struct agent_ocireg *ocireg;
	char what[200];
};

static int node_ready(void *data)
{
	struct node_ready *n = data;
	return (n->dp == NULL || dp_registered(n->dp)) && (n->ocireg == NULL || agent_ocireg_listening(n->ocireg));
}

/* The device plugin, serving and registering from its own thread; the shims it injects
 * register on our registry socket. */
static int dp_start(const struct cfg *c, struct agent_dp **out, struct gcr_err *err)
{
	const struct dp_cfg *d = &c->dp;
	struct agent_dp_config dc = {
		.resource_name = d->resource_name,
		.slots = (unsigned)d->slots,
		.kubelet_dir = d->kubelet_dir,
		.endpoint = d->endpoint,
		.shim_host_dir = d->shim_host_dir,
		.shim_container_dir = d->shim_container_dir,
		.socket_root = d->socket_root,
		.socket_container_dir = d->socket_container_dir,
		.agent_socket = c->registry_socket,
		.agent_container_dir = d->agent_container_dir,
		.cdi_device = d->cdi_device,
		.image_root = d->image_root,
		.poll_ms = (unsigned)d->poll_ms,
	};
	struct agent_dp_env env[AGENT_DP_SHIM_ENV_MAX];
	for (size_t i = 0; i < d->n_env; i++)
		env[i] = (struct agent_dp_env){ .name = d->env[2 * i], .value = d->env[2 * i + 1] };
	dc.shim_env = env;
	dc.n_shim_env = d->n_env;
	struct agent_dp *dp = agent_dp_new(&dc, err);
	if (dp == NULL) {
		gcr_err_wrap(err, "device plugin");
		return err->code < 0 ? err->code : -EINVAL;
	}
	int rc = agent_dp_start(dp, err);
	if (rc < 0) {
		gcr_err_wrap(err, "device plugin");
		agent_dp_free(dp);
		return rc;
	}
	*out = dp;
	return 0;
}

/* A unique leader-election identity: a restarted agent is a new candidate, not the old holder. */
static void leader_identity(const struct cfg *c, char *out, size_t len)
{
	char host[256] = "";
	const char *who = c->node_name && c->node_name[0] ? c->node_name : getenv("POD_NAME");
	if ((who == NULL || who[0] == '\0') && gethostname(host, sizeof(host) - 1) == 0)
		who = host;
	unsigned rnd = 0;
	FILE *ur = fopen("/dev/urandom", "rb");
	if (ur == NULL || fread(&rnd, sizeof(rnd), 1, ur) != 1)
		rnd = (unsigned)getpid() ^ (unsigned)time(NULL);
	if (ur != NULL)
		fclose(ur);
	snprintf(out, len, "%.240s-%08x", who && who[0] ? who : "gcr-scaler", rnd);
}

/* ---- eviction (agent_evict): pods, their Events and Checkpoints from the controller's watches ---- */
static json_t *evict_pod(void *data, const char *uid)
{
	return agent_controller_pod_by_uid(data, uid);
}

static void evict_event(void *data, const char *uid, const char *type, const char *reason, const char *action,
			const char *note)
{
	agent_controller_pod_event(data, uid, type, reason, action, note);
}

static int evict_ck_wait(void *data, const char *ns, const char *name, double until_s, atomic_int *stop, char *msg,
			 size_t len)
{
	return agent_controller_checkpoint_wait(data, ns, name, until_s, stop, msg, len);
}

/* ---- overcommit (agent_room) in Kubernetes: pods from the controller's watch ---- */
static int oc_pod(void *data, const char *uid, struct agent_room_pod *out)
{
	struct agent_controller *ctl = data;
	json_t *pod = agent_controller_pod_by_uid(ctl, uid);
	if (pod == NULL)
		return -ENOENT;
	json_t *md = json_object_get(pod, "metadata");
	const char *never = json_string_value(json_object_get(json_object_get(md, "annotations"), AGENT_ROOM_NEVER_KEY));
	json_t *prio = json_object_get(json_object_get(pod, "spec"), "priority");
	*out = (struct agent_room_pod){ 0 };
	out->overcommit = agent_podspec_overcommit(pod);
	out->never = never != NULL && strcmp(never, "false") == 0;
	if (json_is_integer(prio) && json_integer_value(prio) >= INT_MIN && json_integer_value(prio) <= INT_MAX) {
		out->has_priority = 1;
		out->priority = (int)json_integer_value(prio);
	}
	snprintf(out->ns, sizeof(out->ns), "%s", json_string_value(json_object_get(md, "namespace")) &&
		 strlen(json_string_value(json_object_get(md, "namespace"))) < sizeof(out->ns)
		 ? json_string_value(json_object_get(md, "namespace")) : "");
	snprintf(out->name, sizeof(out->name), "%.150s/%.150s", json_string_value(json_object_get(md, "namespace"))
		 ? json_string_value(json_object_get(md, "namespace")) : "", json_string_value(json_object_get(md, "name"))
		 ? json_string_value(json_object_get(md, "name")) : uid);
	json_decref(pod);
	return 0;
}

static void oc_event(void *data, const char *uid, const char *type, const char *reason, const char *note)
{
	agent_controller_pod_event(data, uid, type, reason, "Overcommit", note);
}

/* A pod past its share of a table (agent_share's thread): a Warning Event on it. */
static void share_event(void *data, const char *uid, const char *table, const char *note)
{
	(void)table;
	agent_controller_pod_event(data, uid, "Warning", "ShareExhausted", "Share", note);
}

/* The node's shared tables (agent_share), one share per pod each, the workers' per namespace. */
struct shares {
	struct agent_shares *ss;
	struct agent_share *registry, *holds, *room, *workers;
};

static int shares_new(const struct cfg *c, int max_parallel, struct shares *out, struct gcr_err *err)
{
	int pods = (int)c->share_pods;
	if (pods == 0)
		pods = c->dp.enabled ? (int)c->dp.slots : AGENT_SHARE_OWNERS_DEFAULT;
	int per_ns = c->share_workers > 0 ? (int)c->share_workers : (max_parallel / 2 > 1 ? max_parallel / 2 : 1);
	*out = (struct shares){ .ss = agent_shares_new() };
	if (out->ss == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	const struct agent_share_cfg t[] = {
		{ .name = "registry", .what = "registered processes", .owner = "pod", .capacity = AGENT_REGISTRY_MAX,
		  .per_owner = (int)c->share_registry, .owners = pods, .tell = 1 },
		{ .name = "holds", .what = "eviction holds (gcr-hold)", .owner = "pod", .capacity = AGENT_EVICT_MAX_HOLDS,
		  .per_owner = (int)c->share_holds, .owners = pods, .tell = 1 },
		{ .name = "room", .what = "waiting room requests", .owner = "pod", .capacity = AGENT_ROOM_QUEUE,
		  .per_owner = (int)c->share_room, .owners = pods, .tell = 1 },
		{ .name = "workers", .what = "Checkpoint and Restore workers", .owner = "namespace",
		  .capacity = max_parallel, .per_owner = per_ns },
	};
	struct agent_share **slot[] = { &out->registry, &out->holds, &out->room, &out->workers };
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if ((*slot[i] = agent_shares_add(out->ss, &t[i], err)) == NULL)
			return err->code;
	GCR_LOG(GCR_LOG_INFO, "agent", "shares among %d pods: registry %d of %d per pod, eviction holds %d of %d, room "
		"requests %d of %d, workers %d of %d per namespace", pods, agent_share_limit(out->registry),
		AGENT_REGISTRY_MAX, agent_share_limit(out->holds), AGENT_EVICT_MAX_HOLDS, agent_share_limit(out->room),
		AGENT_ROOM_QUEUE, agent_share_limit(out->workers), max_parallel);
	return 0;
}

/* The controller's view of the overcommit policy's holds (a Checkpoint takes one over). data:
 * the room's pointer, set before the controller starts and cleared after it stops. */
static int oc_held(void *data, pid_t pid, unsigned long long start, int *data_only)
{
	struct agent_room *room = *(struct agent_room **)data;
	return room != NULL ? agent_room_holds(room, pid, start, data_only) : 0;
}

static int oc_release(void *data, pid_t pid, unsigned long long start, int *data_only, int timeout_ms)
{
	struct agent_room *room = *(struct agent_room **)data;
	return room != NULL ? agent_room_release(room, pid, start, data_only, timeout_ms) : -ENOENT;
}

static int gate_synced(void *data)
{
	return agent_gate_synced(data);
}

/* --hold-driver: the CUDA driver opened at start and held for the agent's life. The driver drops
 * its state when no process has it open; while the GPUs' processes are checkpointed the next
 * opening then costs 0.2-0.4 s, 46 ms while one process holds it (two H200s,
 * tests/gpu/init_probe.py, run 71), and every resume here and every gcrctl on the node opens it.
 * Off by default: the open driver shows about 4 MiB used on every GPU. A thread: start-up does
 * not wait. */
static void *driver_hold(void *arg)
{
	(void)arg;
	struct gcr_err err = { 0 };
	double t0 = gcr_time_mono_ms();
	if (gcr_driver_open(&err) == 0)
		GCR_LOG(GCR_LOG_INFO, "agent", "CUDA driver open in %.0f ms, held while the agent runs (resumes on this "
			"node open it in tens of ms)", gcr_time_mono_ms() - t0);
	else
		GCR_LOG(GCR_LOG_INFO, "agent", "CUDA driver not held open: %s", err.msg);
	return NULL;
}

int main(int argc, char **argv)
{
	struct cfg cfg = { 0 };
	struct gcr_err err = { 0 };
	struct agent_kubeconfig *kc = NULL;
	struct agent_kube *kube = NULL;
	struct agent_registry *reg = NULL;
	struct agent_metrics *metrics = NULL;
	struct agent_controller *ctl = NULL;
	struct agent_lease *lease = NULL;
	struct agent_leader *leader = NULL;
	struct agent_scaler *scaler = NULL;
	struct agent_gate *gate = NULL;
	struct agent_informers *informers = NULL;
	struct agent_replace *replace = NULL;
	struct agent_ocireg *ocireg = NULL;
	struct agent_activity *activity = NULL;
	struct agent_dp *dp = NULL;
	struct agent_room *room = NULL;
	struct agent_evict *evict = NULL;
	struct shares shares = { 0 };
	struct agent_roompolicy *room_policy = NULL;
	int rc, status = 1;
	struct node_ready nready = { 0 };

	gcr_log_init(GCR_LOG_INFO);
	gcr_jsonbudget_install(); /* before any jansson call: tables and manifests parse within a budget */
	if (parse_args(&cfg, argc, argv, &err) < 0) {
		fprintf(stderr, "gcr-agent: %s\n", err.msg);
		usage(stderr);
		cfg_free(&cfg);
		return 2;
	}
	/* Role node: what needs the node (host pids, sockets, kubelet) and only its RBAC; role
	 * scaler: the cluster-level writers (Checkpoints, Restores, readiness gates); all: both. */
	const bool node = cfg.role != ROLE_SCALER, scale = cfg.role != ROLE_NODE;
	/* SIGTERM/SIGINT are taken by sigwait below, in this thread only. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	rc = cfg.kubeconfig ? agent_kubeconfig_load_file(cfg.kubeconfig, cfg.context, &kc, &err)
			    : agent_kubeconfig_in_cluster(NULL, &kc, &err);
	if (rc < 0)
		goto out;
	kube = agent_kube_new(kc);
	if (kube == NULL) {
		agent_kubeconfig_free(kc);
		gcr_err_set(&err, -ENOMEM, "out of memory");
		goto out;
	}
	pthread_t drv_th;
	if (node && cfg.hold_driver && pthread_create(&drv_th, NULL, driver_hold, NULL) == 0)
		pthread_detach(drv_th);
	if (node && (agent_registry_new(cfg.registry_socket, cfg.socket_dir, cfg.dp.enabled ? cfg.dp.socket_root : NULL,
				       cfg.proc_root, cfg.outside_pods ? AGENT_REGISTRY_OUTSIDE_PODS : 0,
				       &reg, &err) < 0 ||
		     agent_registry_start(reg, &err) < 0))
		goto out;
	if (agent_metrics_new(cfg.metrics_address, registered_gauge, reg, &metrics, &err) < 0)
		goto out;
	if (node && cfg.dp.enabled) {
		if (dp_start(&cfg, &dp, &err) < 0)
			goto out;
		nready.dp = dp;
		snprintf(nready.what, sizeof(nready.what), "device plugin registered with the kubelet");
		agent_metrics_set_ready_check(metrics, nready.what, node_ready, &nready);
	}
	const char *ps = getenv("GCR_AGENT_TEST_PAUSE_S");
	struct agent_controller_cfg ccfg = {
		.node_name = cfg.node_name,
		.lease_namespace = cfg.lease_namespace,
		.socket_dir = cfg.socket_dir,
		.record_dir = cfg.record_dir,
		.images_dir = cfg.images_dir,
		.images_shared = cfg.images_shared,
		.kubelet_url = cfg.kubelet_url,
		.kubelet_checkpoints = cfg.kubelet_checkpoints,
		.alloc_root = cfg.dp.enabled ? cfg.dp.socket_root : NULL,
		.proc_root = cfg.proc_root,
		.adopt = { .held = oc_held, .release = oc_release, .data = &room },
		.registry_port = (int)cfg.restore_port,
		.max_parallel = (int)cfg.max_parallel,
		.restore_grace_s = (int)cfg.restore_grace_s,
		.images_keep = (int)cfg.images_keep,
		.images_key_dir = cfg.images_key_dir,
		.test_pause = getenv("GCR_AGENT_TEST_PAUSE"),
		.pause_s = ps ? atoi(ps) : TEST_PAUSE_S_DEFAULT,
	};
	const int heartbeat_s = (int)cfg.heartbeat_s, leader_lease_s = (int)cfg.leader_lease_s;
	/* Every role of the process shares one mirror per resource and query (the Checkpoints and
	 * Restores are watched once in role all, for the controller and the scaler's roles alike),
	 * started once every role has subscribed. */
	if ((informers = agent_informers_new(kube)) == NULL) {
		gcr_err_set(&err, -ENOMEM, "out of memory");
		goto out;
	}
	if (node) {
		if (shares_new(&cfg, ccfg.max_parallel, &shares, &err) < 0)
			goto out;
		agent_registry_set_share(reg, shares.registry);
		agent_metrics_set_shares(metrics, shares.ss);
		ccfg.workers = shares.workers;
	}
	struct agent_replace_cfg rcfg = { .registry_port = (int)cfg.restore_port, .images_shared = cfg.images_shared,
					  .wait_s = (int)cfg.restore_wait_s };
	if (node) {
		/* The heartbeat carries this node's pods' activity, read from the shims' counters. */
		activity = agent_activity_new(reg, cfg.socket_dir);
		if (activity == NULL) {
			gcr_err_set(&err, -ENOMEM, "out of memory");
			goto out;
		}
		if (agent_lease_new(kube, cfg.lease_namespace, cfg.node_name, &lease, &err) < 0)
			goto out;
		agent_lease_set_period(lease, heartbeat_s);
		/* Role all has no scaler Deployment to create it; role node's identity cannot. */
		agent_lease_set_create(lease, scale);
		agent_lease_set_note(lease, agent_activity_note, activity);
		if (agent_lease_start(lease, &err) < 0)
			goto out;
	}
	if (scale) {
		char identity[300];
		leader_identity(&cfg, identity, sizeof(identity));
		struct agent_scaler_cfg scfg = { .lease_namespace = cfg.lease_namespace,
						 .agent_selector = cfg.agent_selector };
		if (agent_leader_new(kube, cfg.lease_namespace, "gcr-scaler-leader", identity, leader_lease_s,
				     &leader, &err) < 0 ||
		    agent_leader_start(leader, &err) < 0 || agent_scaler_new(kube, informers, leader, &scfg, &scaler, &err) < 0 ||
		    agent_scaler_start(scaler, &err) < 0 || agent_gate_new(kube, informers, leader, &gate, &err) < 0 ||
		    agent_gate_read_notes(gate, cfg.lease_namespace, &err) < 0 || agent_gate_start(gate, &err) < 0)
			goto out;
		if (rcfg.registry_port > 0 &&
		    (agent_replace_new(kube, informers, leader, &rcfg, &replace, &err) < 0 || agent_replace_start(replace, &err) < 0))
			goto out;
		/* Role all: started below, once the controller has subscribed too. */
		if (!node && agent_informers_start(informers, &err) < 0)
			goto out;
		GCR_LOG(GCR_LOG_INFO, "agent", "scaler: candidate %s for lease %s/gcr-scaler-leader; %s%s", identity,
			cfg.lease_namespace, cfg.agent_selector ? "creates the heartbeat Leases of nodes with pods " : "",
			cfg.agent_selector ? cfg.agent_selector : "no --agent-selector: creates no node heartbeat Lease");
	}
	if (node) {
		/* The controller's workers ask the overcommit policy (agent_room) about its holds, and the
		 * policy asks the controller's pod watch about pods: both made before either starts. */
		if (agent_controller_new(kube, informers, reg, metrics, &ccfg, &ctl, &err) < 0)
			goto out;
		agent_shares_set_teller(shares.ss, share_event, ctl);
		if (agent_shares_start(shares.ss, &err) < 0)
			goto out;
		if (rcfg.registry_port > 0) {
			char hosts[PATH_MAX];
			snprintf(hosts, sizeof(hosts), "%s/127.0.0.1_%d_", cfg.restore_certs_dir, rcfg.registry_port);
			if (mkdir(hosts, 0755) < 0 && errno != EEXIST) {
				gcr_err_set(&err, -errno, "cannot create %s: %s", hosts, strerror(errno));
				goto out;
			}
			struct agent_ocireg_cfg ocfg = {
				.node = cfg.node_name, .images_dir = cfg.images_dir,
				.shared = cfg.images_shared, .port = rcfg.registry_port,
				.hosts_dir = hosts, .proc_root = cfg.proc_root, .cri_endpoint = cfg.restore_cri_endpoint,
				.images_key_dir = cfg.images_key_dir, .pod_ns = getenv("POD_NAMESPACE"),
				.pod_name = getenv("POD_NAME") };
			if (agent_ocireg_new(kube, metrics, &ocfg, &ocireg, &err) < 0)
				goto out;
			/* A taken port is retried, never fatal; /readyz says so meanwhile. */
			nready.ocireg = ocireg;
			snprintf(nready.what, sizeof(nready.what), "%s%sthe image registry on 127.0.0.1:%d (its port is "
				 "taken: see the log)", dp != NULL ? "device plugin registered with the kubelet" : "",
				 dp != NULL ? ", and " : "", rcfg.registry_port);
			agent_metrics_set_ready_check(metrics, nready.what, node_ready, &nready);
		}
		/* Overcommit: the room requests on the registry; pods' settings and Events through the
		 * controller's pod watch. */
		struct agent_room_cfg ocfg = { .socket_dir = cfg.socket_dir, .record_dir = cfg.record_dir,
					       .proc_root = cfg.proc_root,
					       .enabled = cfg.overcommit,
					       .margin = (unsigned long long)cfg.overcommit_margin_mib << 20,
					       .return_ms = (int)cfg.overcommit_return_ms,
					       .idle_ms = (int)cfg.overcommit_idle_ms,
					       .data_only = cfg.overcommit_mode == OC_MODE_DATA,
					       .trust_env = cfg.overcommit_env,
					       .unused_backoff_ms = (int)cfg.unused_backoff_ms,
					       .share = shares.room };
		room_policy = calloc(1, sizeof(*room_policy));
		if (room_policy == NULL ||
		    agent_roompolicy_parse(cfg.room_from, strlen(cfg.room_from), room_policy, &err) < 0) {
			if (room_policy == NULL)
				gcr_err_set(&err, -ENOMEM, "out of memory");
			goto out;
		}
		ocfg.policy = room_policy;
		struct agent_room_hooks hooks = { .pod = oc_pod, .event = oc_event, .data = ctl };
		if (agent_room_new(reg, activity, metrics, &ocfg, &hooks, &room, &err) < 0 ||
		    agent_room_start(room, &err) < 0 || agent_informers_start(informers, &err) < 0 ||
		    agent_controller_start(ctl, &err) < 0)
			goto out;
		/* Eviction imaging: gcr-hold's socket beside the registry's, which every shim container sees. */
		char hold_sock[600];
		snprintf(hold_sock, sizeof(hold_sock), "%s", cfg.registry_socket);
		char *hs = strrchr(hold_sock, '/');
		snprintf(hs != NULL ? hs + 1 : hold_sock, sizeof(hold_sock) - (size_t)(hs != NULL ? hs + 1 - hold_sock : 0),
			 "%s", AGENT_EVICTMSG_SOCKET_NAME);
		struct agent_evict_cfg ecfg = { .socket_path = hold_sock, .proc_root = cfg.proc_root,
						.node_name = cfg.node_name, .resource_name = cfg.dp.resource_name,
						.enabled = cfg.eviction, .rate_mib_s = (double)cfg.eviction_rate,
						.fixed_s = (double)cfg.eviction_fixed_s, .share = shares.holds };
		const struct agent_evict_hooks ehooks = { .by_uid = evict_pod, .event = evict_event,
							  .ck_wait = evict_ck_wait, .data = ctl };
		if (agent_evict_new(kube, &ehooks, reg, metrics, &ecfg, &evict, &err) < 0 ||
		    agent_evict_start(evict, &err) < 0)
			goto out;
		GCR_LOG(GCR_LOG_INFO, "agent", "eviction imaging: %s (gcr-hold's socket %s)",
			ecfg.enabled ? "on" : "off: every hold is answered at once", hold_sock);
		GCR_LOG(GCR_LOG_INFO, "agent",
			"node %s: registry %s, shim sockets %s, metrics http://%s, proc %s, lease %s/gcr-agent-%s",
			cfg.node_name, cfg.registry_socket, cfg.socket_dir, cfg.metrics_address, cfg.proc_root,
			cfg.lease_namespace, cfg.node_name);
		GCR_LOG(GCR_LOG_INFO, "agent", "device plugin: %s (shims reach the registry as GCR_AGENT_SOCKET)",
			dp != NULL ? "on" : "off: devicePlugin.enabled is not true");
	} else {
		/* Ready once the gate's watches have listed (nothing node-side to wait for). */
		agent_metrics_set_ready(metrics);
		agent_metrics_set_ready_check(metrics, "the readiness-gate watches' first lists", gate_synced, gate);
		GCR_LOG(GCR_LOG_INFO, "agent", "role scaler: metrics http://%s; no node controller, registry or device plugin",
			cfg.metrics_address);
	}

	int sig = 0;
	sigwait(&sigs, &sig);
	GCR_LOG(GCR_LOG_INFO, "agent", "signal %d: finishing the operations in flight, then exiting", sig);
	status = 0;
out:
	if (status != 0)
		fprintf(stderr, "gcr-agent: %s\n", err.msg);
	if (metrics != NULL)
		agent_metrics_set_ready_check(metrics, NULL, NULL, NULL); /* dp, gate go: /readyz stops asking */
	/* No hook into the scaler's roles once they are freed below. In role all this stops the
	 * controller's caches too: its operations in flight finish on them as they are (its stop
	 * wakes every wait on them). In role node they follow the cluster until those operations
	 * end (the second stop, after the controller's). */
	if (scale)
		agent_informers_stop(informers);
	agent_scaler_free(scaler);  /* stops creating work for the nodes */
	agent_replace_free(replace);
	agent_gate_free(gate);
	agent_leader_free(leader);  /* releases the leader Lease: another agent takes over at once */
	agent_shares_stop(shares.ss); /* no more Events through the controller */
	agent_evict_free(evict);    /* holds in flight are answered; before the controller they use */
	if (ctl != NULL)
		agent_controller_stop(ctl); /* its workers ask the overcommit policy about its holds */
	agent_informers_stop(informers); /* no hook into the controller from here on */
	agent_room_free(room);      /* held processes stay held, with their records, for the next agent */
	room = NULL;
	agent_controller_free(ctl); /* stops taking work, lets the operations in flight finish */
	agent_informers_free(informers); /* after the roles that read it (the room through the controller) */
	agent_dp_free(dp);            /* stops serving, removes its socket from the kubelet's dir */
	agent_lease_free(lease);     /* the Lease then expires: other agents take over failing requests */
	agent_activity_free(activity);
	agent_ocireg_free(ocireg);
	agent_metrics_free(metrics);
	agent_registry_free(reg);
	agent_shares_free(shares.ss); /* after every table that borrows a share */
	free(room_policy);
	agent_kube_free(kube);
	cfg_free(&cfg);
	return status;
}
