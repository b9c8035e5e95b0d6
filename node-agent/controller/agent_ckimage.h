/* agent_ckimage: the Image action of a Checkpoint (docs/images.md, "Pods", "Restore into a new
 * pod"): an image of a pod's GPU process on its node, by the agent's own CRIU or, restorable into
 * a new pod, by the kubelet's checkpoint; of a running process (it runs on) or, by the kubelet's
 * route, of one suspended already (it stays so: a drained pod's). Every step is recorded before
 * it runs (agent_record); an Image that an agent restart cut short is resumed or finished from
 * its record, the process brought back, never left held; what such a run left (the pod's copy of
 * the GPU data, a partial image, the kubelet's archive) is removed by the sweep. The controller
 * owns the objects: it records the Image first, and writes its statuses and Events from the
 * outcome told here. */
#ifndef AGENT_CKIMAGE_H
#define AGENT_CKIMAGE_H

#include <jansson.h>

#include "agent_kube.h"
#include "agent_record.h"
#include "agent_registry.h"
#include "gcr_error.h"

/* The kubelet's checkpoint of a container, at most this long (s): its CRIU dump of the CPU side. */
#define AGENT_CKIMAGE_KUBELET_S 300
/* Where the kubelet writes its archives unless told otherwise (its root dir + /checkpoints). */
#define AGENT_CKIMAGE_CHECKPOINTS_DIR "/var/lib/kubelet/checkpoints"

struct agent_ckimage_cfg {
	struct agent_kube *kube;        /* the kubelet's checkpoint API */
	struct agent_registry *reg;     /* start times of processes */
	struct agent_record_store *rec; /* each step, recorded before it runs */
	const char *socket_dir;         /* the shims' control sockets (gcr_cr) */
	const char *images_dir;         /* <images>/.alloc/<id>: where the agent's CRIU writes a pod's image */
	const char *proc_root;          /* "/proc" or a test tree: <pid>/cgroup names a process's pod */
	const char *node;               /* written in each manifest */
	const char *kubelet_url;        /* https://HOST:PORT; NULL: no kubelet route */
	const char *checkpoints_dir;    /* the kubelet's archives; NULL: AGENT_CKIMAGE_CHECKPOINTS_DIR */
	const char *key_dir;            /* the images' signing keys (gcr_imagemac); NULL: unsigned */
	/* The most bytes of GPU data r's pod may make the agent copy from its image directory (the
	 * kubelet route; docs/install.md, "Input bounds"), why in why; 0 with err: no bound can be set
	 * and nothing is copied. suspended: the process holds nothing on the GPU now. */
	unsigned long long (*copy_bound)(void *data, const struct agent_record *r, int suspended, char *why,
					 size_t len, struct gcr_err *err);
	void *copy_bound_data;
	/* Test hook (GCR_AGENT_TEST_PAUSE): called with "image-<step>" after a step is recorded,
	 * before it runs, so a test kills the agent exactly there. NULL: none. */
	void (*pause)(void *data, const char *where);
	void *pause_data;
};

struct agent_ckimage;

int agent_ckimage_new(const struct agent_ckimage_cfg *cfg, struct agent_ckimage **out, struct gcr_err *err)
	__attribute__((warn_unused_result));
void agent_ckimage_free(struct agent_ckimage *m);

/* What an Image's run tells the controller for its status. */
struct agent_ckimage_out {
	int final;            /* 0: not over (the process not brought back yet): run again later */
	int ok;               /* final: the image is whole at the record's img.path */
	char reason[48];      /* the Complete condition's reason: ImageWritten, ImageFailed, Interrupted */
	char msg[1536];       /* what happened and the state the process is left in */
	const char *state;    /* the process now, for status.processes: "Running" or "Checkpointed" */
	json_t *extra;        /* ok: the status's "image" and "durations" (owned; cleared by _out_clear) */
	double ms_total;
	long long bytes;      /* the image's bytes */
};
void agent_ckimage_out_clear(struct agent_ckimage_out *out);

/* Runs the Image of record r (state IMAGING), saving r at each step: a new one (step START), or
 * one a restart cut short, from the step its record names (the process is brought back first;
 * an Image cut short before its dump is run again once, one cut short later ends Failed
 * Interrupted, one past its dump is finished). gate_ms bounds the gate and the driver's lock,
 * op_ms every wait on the process. out says how it ended; r's state is the controller's to set
 * with the final status. */
void agent_ckimage_run(struct agent_ckimage *m, struct agent_record *r, int gate_ms, int op_ms,
		       struct agent_ckimage_out *out);

/* The leftovers of Images: for each record, the pod's copy of the GPU data of a process imaged
 * suspended once it runs again or is gone, and the kubelet's archives of a dump a restart cut
 * short while that dump could still write one; in the pods' image directories and socket
 * directories (alloc_root, NULL: none) what no Image in flight owns; partial images no Image in
 * flight owns and older than AGENT_IMAGES_PARTIAL_MAX_AGE_S. Returns how many were removed. */
int agent_ckimage_sweep(struct agent_ckimage *m, const char *alloc_root);

/* Whether record r still has leftovers for the sweep to look after (a kept copy of the data, an
 * archive that may still come): the record stays, its Checkpoint gone or not, until then. */
int agent_ckimage_pending(const struct agent_record *r, long long now_s);

#endif
