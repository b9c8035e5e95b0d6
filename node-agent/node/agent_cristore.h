/* agent_criimg: the node's container image store, through the runtime's CRI socket (the one
 * the kubelet uses): the images whose names start with a prefix, and the removal of an image. What agent_ocireg's sweep needs so that no
 * checkpoint image stays where a pod could start from it without a pull (docs/install.md,
 * "The image registry"). */
#ifndef AGENT_CRIIMG_H
#define AGENT_CRIIMG_H

#include <stddef.h>

#include "gcr_error.h"

#define AGENT_CRIIMG_TIMEOUT_MS 5000 /* one CRI call at most */
#define AGENT_CRIIMG_MAX_NAMES 16    /* names kept per image */

struct agent_criimg_image {
	char id[128];                                 /* "sha256:<hex>" */
	char *names[AGENT_CRIIMG_MAX_NAMES];          /* repo tags and digests under the prefix (owned) */
	size_t nnames;
};

struct agent_criimg_list {
	struct agent_criimg_image *img; /* owned */
	size_t n;
};

/* One process-wide initialisation of gRPC for these calls (reference counted by gRPC). */
void agent_criimg_init(void);
void agent_criimg_shutdown(void);

/* endpoint: the CRI socket's path. The images having a tag or digest name starting with
 * prefix, with those names. 0 or -errno. */
int agent_criimg_images(const char *endpoint, const char *prefix, struct agent_criimg_list *out, struct gcr_err *err)
	__attribute__((warn_unused_result));
void agent_criimg_list_clear(struct agent_criimg_list *l);

/* Removes image id (every name of it) from the store; gone already is success. */
int agent_criimg_remove(const char *endpoint, const char *id, struct gcr_err *err)
	__attribute__((warn_unused_result));

#endif
