/* agent_ocireg: the node's read-only OCI registry of checkpoint images on 127.0.0.1, from which
 * the node's containerd pulls a replacement pod's checkpoint image (docs/preemption.md,
 * "The replacement pod") or a user's (docs/images.md, "Restore into a new pod"). It serves only
 * a Checkpoint issued for a pending restore or one whose status publishes a reference. */
#ifndef AGENT_OCIREG_H
#define AGENT_OCIREG_H

#include "agent_evictmsg.h"
#include "agent_kube.h"
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

struct agent_ocireg;

/* Serves on 127.0.0.1:port (loopback only, whatever the network namespace) the Checkpoints of
 * node whose image lies under images_dir; of every node when shared (images_dir is one
 * filesystem on all of them, --images-shared). Borrows kube. */
int agent_ocireg_new(struct agent_kube *kube, const char *node, const char *images_dir, int shared, int port,
		     struct agent_ocireg **out, struct gcr_err *err) __attribute__((warn_unused_result));

/* NULL-safe; stops the server. */
void agent_ocireg_free(struct agent_ocireg *r);

#endif
