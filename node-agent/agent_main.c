/* agent_main: gcr-agent's entry point: configuration (YAML file, then flags),
 * start-up of the registry, metrics and controller, and the SIGTERM shutdown. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "agent_controller.h"
#include "agent_kube.h"
#include "agent_kubeconfig.h"
#include "agent_lease.h"
#include "agent_metrics.h"
#include "agent_registry.h"
#include "gcr/protocol.h"
#include "gcr_log.h"

/* Largest configuration file we read, in bytes. */
#define CONFIG_MAX (64 * 1024)
/* Seconds the test hook pauses unless GCR_AGENT_TEST_PAUSE_S says otherwise. */
#define TEST_PAUSE_S_DEFAULT 60

/* The lease namespace when neither leaseNamespace nor POD_NAMESPACE says otherwise. */
#define LEASE_NS_DEFAULT "gcr-system"

struct cfg {
	char *kubeconfig, *node_name, *socket_dir, *registry_socket, *metrics_address, *proc_root,
		*context, *lease_namespace;
};

/* One row per option: the YAML key (the flag's name) and its slot. */
struct opt_row {
	const char *name;  /* flag, and key in the file */
	const char *camel; /* the same key as the Helm chart's config.yaml spells it */
	size_t off;
	const char *def;
	const char *help;
};

#define SLOT(f) offsetof(struct cfg, f)
static const struct opt_row opts_table[] = {
	{ "kubeconfig", "kubeconfig", SLOT(kubeconfig), NULL, "kubeconfig file (default: in-cluster service account)" },
	{ "context", "context", SLOT(context), NULL, "kubeconfig context (default: current-context)" },
	{ "node-name", "nodeName", SLOT(node_name), NULL, "this node's name (default: $NODE_NAME)" },
	{ "socket-dir", "socketDir", SLOT(socket_dir), GCR_DEFAULT_SOCKET_DIR, "directory of the shims' control sockets" },
	{ "registry-socket", "registrySocket", SLOT(registry_socket), GCR_DEFAULT_SOCKET_DIR "/agent.sock",
	  "Unix socket the shims register on" },
	{ "metrics-address", "metricsAddress", SLOT(metrics_address), "127.0.0.1:9464",
	  "HOST:PORT of /metrics, /healthz, /readyz" },
	{ "proc-root", "procRoot", SLOT(proc_root), "/proc", "where <pid>/cgroup files are read" },
	{ "lease-namespace", "leaseNamespace", SLOT(lease_namespace), NULL,
	  "namespace of the node heartbeat Leases (default: $POD_NAMESPACE, else " LEASE_NS_DEFAULT ")" },
};

/* Keys of the chart's config.yaml that other parts of the agent (device plugin)
 * own; this build reads none of them, but they are not mistakes. */
static const char *const foreign_keys[] = { "devicePlugin" };
#define NOPTS (sizeof(opts_table) / sizeof(opts_table[0]))

static char **slot(struct cfg *c, const struct opt_row *r)
{
	return (char **)(void *)((char *)c + r->off);
}

static int set_opt(struct cfg *c, const char *name, const char *value, struct gcr_err *err)
{
	for (size_t i = 0; i < NOPTS; i++) {
		if (strcmp(opts_table[i].name, name) == 0 || strcmp(opts_table[i].camel, name) == 0) {
			char *v = strdup(value);
			if (v == NULL)
				return gcr_err_set(err, -ENOMEM, "out of memory");
			free(*slot(c, &opts_table[i]));
			*slot(c, &opts_table[i]) = v;
			return 0;
		}
	}
	return gcr_err_set(err, -EINVAL, "unknown option '%s'", name);
}

static int is_foreign(const char *key)
{
	for (size_t i = 0; i < sizeof(foreign_keys) / sizeof(foreign_keys[0]); i++)
		if (strcmp(foreign_keys[i], key) == 0)
			return 1;
	return 0;
}

/* One key/value of the file: an option, logLevel, or a key owned elsewhere. */
static int file_opt(struct cfg *c, const char *key, const char *value, struct gcr_err *err)
{
	if (strcmp(key, "logLevel") == 0) {
		static const char *const names[] = { "error", "warn", "info", "debug" };
		for (int i = 0; i < 4; i++)
			if (strcmp(value, names[i]) == 0 && getenv("GCR_LOG_LEVEL") == NULL)
				gcr_log_level = i;
		return 0;
	}
	if (is_foreign(key))
		return 0;
	return set_opt(c, key, value, err);
}

/* The configuration file: a YAML mapping of option names (flag or camelCase
 * spelling) to scalars; the sections other modules own are skipped. */
static int load_config(struct cfg *c, const char *path, struct gcr_err *err)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return gcr_err_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
	yaml_parser_t p;
	yaml_event_t ev;
	int rc = 0, depth = 0, done = 0;
	char *key = NULL;
	yaml_parser_initialize(&p);
	yaml_parser_set_input_file(&p, f);
	while (!done && rc == 0) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = gcr_err_set(err, -EINVAL, "%s:%zu: %s", path, p.problem_mark.line + 1,
					 p.problem ? p.problem : "YAML error");
			break;
		}
		switch (ev.type) {
		case YAML_MAPPING_START_EVENT:
		case YAML_SEQUENCE_START_EVENT:
			if (++depth == 2 && (key == NULL || !is_foreign(key)))
				rc = gcr_err_set(err, -EINVAL, "%s: option '%s' must be a scalar", path,
						 key ? key : "?");
			break;
		case YAML_MAPPING_END_EVENT:
		case YAML_SEQUENCE_END_EVENT:
			if (--depth == 1) { /* end of a skipped section */
				free(key);
				key = NULL;
			}
			break;
		case YAML_SCALAR_EVENT:
			if (depth > 1) {
				break; /* inside a section owned elsewhere */
			} else if (depth != 1) {
				rc = gcr_err_set(err, -EINVAL, "%s: expected a mapping of options", path);
			} else if (key == NULL) {
				key = strndup((char *)ev.data.scalar.value, ev.data.scalar.length);
				if (key == NULL)
					rc = gcr_err_set(err, -ENOMEM, "out of memory");
			} else {
				rc = file_opt(c, key, (char *)ev.data.scalar.value, err);
				if (rc < 0)
					gcr_err_wrap(err, "%s", path);
				free(key);
				key = NULL;
			}
			break;
		case YAML_STREAM_END_EVENT:
			done = 1;
			break;
		default:
			break;
		}
		yaml_event_delete(&ev);
	}
	free(key);
	yaml_parser_delete(&p);
	fclose(f);
	return rc;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: gcr-agent [--config FILE] [--OPTION VALUE]...\n"
		   "The GCR node agent: runs Checkpoint and Restore objects for this node's pods.\n");
	for (size_t i = 0; i < NOPTS; i++)
		fprintf(f, "  --%-18s %s%s%s%s\n", opts_table[i].name, opts_table[i].help,
			opts_table[i].def ? " [" : "", opts_table[i].def ? opts_table[i].def : "",
			opts_table[i].def ? "]" : "");
	fprintf(f, "  --%-18s YAML file with the options above as keys (flags win)\n", "config");
	fprintf(f, "Environment: NODE_NAME; POD_NAMESPACE; GCR_LOG_LEVEL; test hook GCR_AGENT_TEST_PAUSE=before-cr|after-cr\n"
		   "(pause GCR_AGENT_TEST_PAUSE_S seconds, default 60, at that point of each Checkpoint).\n");
}

static void cfg_free(struct cfg *c)
{
	for (size_t i = 0; i < NOPTS; i++) {
		free(*slot(c, &opts_table[i]));
		*slot(c, &opts_table[i]) = NULL;
	}
}

/* Flags parsed twice: first only --config (loaded first), then the rest, so flags win. */
static int parse_args(struct cfg *c, int argc, char **argv, struct gcr_err *err)
{
	const char *config = NULL;
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
	if (config != NULL) {
		int rc = load_config(c, config, err);
		if (rc < 0)
			return rc;
	}
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
		int rc = set_opt(c, name, v, err);
		if (rc < 0)
			return rc;
	}
	if (c->node_name == NULL && getenv("NODE_NAME") != NULL && set_opt(c, "node-name", getenv("NODE_NAME"), err) < 0)
		return -ENOMEM;
	const char *pod_ns = getenv("POD_NAMESPACE");
	if (c->lease_namespace == NULL &&
	    set_opt(c, "lease-namespace", pod_ns && pod_ns[0] ? pod_ns : LEASE_NS_DEFAULT, err) < 0)
		return -ENOMEM;
	for (size_t i = 0; i < NOPTS; i++)
		if (*slot(c, &opts_table[i]) == NULL && opts_table[i].def != NULL &&
		    set_opt(c, opts_table[i].name, opts_table[i].def, err) < 0)
			return -ENOMEM;
	if (c->node_name == NULL || c->node_name[0] == '\0')
		return gcr_err_set(err, -EINVAL, "no node name: pass --node-name or set NODE_NAME");
	return 0;
}

static int registered_gauge(void *data)
{
	return agent_registry_count(data);
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
	int rc, status = 1;

	gcr_log_init(GCR_LOG_INFO);
	if (parse_args(&cfg, argc, argv, &err) < 0) {
		fprintf(stderr, "gcr-agent: %s\n", err.msg);
		usage(stderr);
		cfg_free(&cfg);
		return 2;
	}
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
	if (agent_registry_new(cfg.registry_socket, cfg.socket_dir, cfg.proc_root, &reg, &err) < 0 ||
	    agent_registry_start(reg, &err) < 0)
		goto out;
	if (agent_metrics_new(cfg.metrics_address, registered_gauge, reg, &metrics, &err) < 0)
		goto out;
	const char *ps = getenv("GCR_AGENT_TEST_PAUSE_S");
	struct agent_controller_cfg ccfg = {
		.node_name = cfg.node_name,
		.lease_namespace = cfg.lease_namespace,
		.socket_dir = cfg.socket_dir,
		.test_pause = getenv("GCR_AGENT_TEST_PAUSE"),
		.pause_s = ps ? atoi(ps) : TEST_PAUSE_S_DEFAULT,
	};
	if (agent_lease_new(kube, cfg.lease_namespace, cfg.node_name, &lease, &err) < 0 ||
	    agent_lease_start(lease, &err) < 0)
		goto out;
	if (agent_controller_new(kube, reg, metrics, &ccfg, &ctl, &err) < 0 ||
	    agent_controller_start(ctl, &err) < 0)
		goto out;
	GCR_LOG(GCR_LOG_INFO, "agent",
		"node %s: registry %s, shim sockets %s, metrics http://%s, proc %s, lease %s/gcr-agent-%s",
		cfg.node_name, cfg.registry_socket, cfg.socket_dir, cfg.metrics_address, cfg.proc_root,
		cfg.lease_namespace, cfg.node_name);

	int sig = 0;
	sigwait(&sigs, &sig);
	GCR_LOG(GCR_LOG_INFO, "agent", "signal %d: finishing the operation in flight, then exiting", sig);
	status = 0;
out:
	if (status != 0)
		fprintf(stderr, "gcr-agent: %s\n", err.msg);
	agent_controller_free(ctl); /* stops taking work, lets the operation in flight finish */
	agent_lease_free(lease);     /* the Lease then expires: other agents take over failing requests */
	agent_metrics_free(metrics);
	agent_registry_free(reg);
	agent_kube_free(kube);
	cfg_free(&cfg);
	return status;
}
