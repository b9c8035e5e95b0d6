/* agent_ocireg: the node's read-only OCI registry of checkpoint images on 127.0.0.1, from which
 * the node's containerd pulls a replacement pod's checkpoint image (docs/preemption.md,
 * "The replacement pod") or a user's (docs/images.md, "Restore into a new pod"). It serves only
 * a Checkpoint issued for a pending restore or one whose status publishes a reference, only to
 * containerd (TLS with a client certificate: agent_ocisrv, agent_regtls), and keeps the node's
 * image store from holding such an image longer than its token is good (agent_cristore). */
#ifndef AGENT_OCIREG_H
#define AGENT_OCIREG_H

#include "agent_evictmsg.h"
#include "agent_kube.h"
#include "agent_metrics.h"
#include "gcr_error.h"

/* Labels and annotations of an eviction Checkpoint (docs/preemption.md, "Eviction without
 * loss": agent_evict writes the first, the scaler's agent_replace the others). */
#define AGENT_OCIREG_LABEL_EVICTION AGENT_EVICTMSG_L_EVICTION /* agent_evict sets it */
#define AGENT_OCIREG_LABEL_RESTORED_INTO "gpucr.dev/restored-into"
/* The token issued for the restore: the image's tag; removed once the Restore is final. */
#define AGENT_OCIREG_ANN_TOKEN "gpucr.dev/restore-token"
/* The container the image restores, when the Checkpoint names none. */
#define AGENT_OCIREG_ANN_CONTAINER "gpucr.dev/restore-container"

/* Images whose digests are kept at once (an image's archive is digested once). */
#define AGENT_OCIREG_CACHE 16
/* The node's image store is checked for checkpoint images this often (ms). */
#define AGENT_OCIREG_SWEEP_MS 2000

struct agent_ocireg;

struct agent_ocireg_cfg {
	const char *node;       /* this node */
	const char *images_dir; /* the images' root */
	int shared;             /* images_dir is one filesystem on every node: serve other nodes' images too */
	int port;               /* 127.0.0.1:port */
	/* containerd's registry host directory for 127.0.0.1:port, as this process sees it
	 * ("<config_path>/127.0.0.1_<port>_"): hosts.toml, the CA and the client pair go there. */
	const char *hosts_dir;
	const char *proc_root;     /* "/proc": who took the port */
	const char *cri_endpoint;  /* the runtime's CRI socket path (NULL: images are left in its store) */
	const char *images_key_dir; /* shared images' keys (gcr_imagemac; NULL: none) */
	const char *pod_ns, *pod_name; /* the agent's own pod: Events about the port (NULL: none) */
};

/* Serves on 127.0.0.1:cfg->port (loopback only, whatever the network namespace) the Checkpoints
 * of cfg->node whose image lies under images_dir; of every node when shared. A taken port is
 * retried in the background, never an error. Borrows kube, metrics (may be NULL) and cfg's
 * strings. */
int agent_ocireg_new(struct agent_kube *kube, struct agent_metrics *metrics, const struct agent_ocireg_cfg *cfg,
		     struct agent_ocireg **out, struct gcr_err *err) __attribute__((warn_unused_result));

/* 1 while listening (the port is ours): a /readyz condition. */
int agent_ocireg_listening(void *r);

/* NULL-safe; stops the server. */
void agent_ocireg_free(struct agent_ocireg *r);

#endif
