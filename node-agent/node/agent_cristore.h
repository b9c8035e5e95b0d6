/* agent_cristore: the node's container image store, through the runtime's CRI socket (the one
 * the kubelet uses): the container images whose names start with a prefix, and the removal of
 * one. What agent_ocireg's sweep needs so that no checkpoint image stays where a pod could start
 * from it without a pull (docs/install.md, "The image registry"). */
#ifndef AGENT_CRISTORE_H
#define AGENT_CRISTORE_H

#include <stddef.h>

#include "gcr_error.h"

#define AGENT_CRISTORE_TIMEOUT_MS 5000 /* one CRI call at most */
#define AGENT_CRISTORE_MAX_NAMES 16    /* names kept per image */

struct agent_cristore_image {
	char id[128];                                 /* "sha256:<hex>" */
	char *names[AGENT_CRISTORE_MAX_NAMES];          /* repo tags and digests under the prefix (owned) */
	size_t nnames;
};

struct agent_cristore_list {
	struct agent_cristore_image *img; /* owned */
	size_t n;
};

/* One process-wide initialisation of gRPC for these calls (reference counted by gRPC). */
void agent_cristore_init(void);
void agent_cristore_shutdown(void);

/* endpoint: the CRI socket's path. The images having a tag or digest name starting with
 * prefix, with those names. 0 or -errno. */
int agent_cristore_images(const char *endpoint, const char *prefix, struct agent_cristore_list *out,
			  struct gcr_err *err)
	__attribute__((warn_unused_result));
void agent_cristore_list_clear(struct agent_cristore_list *l);

/* Removes image id (every name of it) from the store; gone already is success. */
int agent_cristore_remove(const char *endpoint, const char *id, struct gcr_err *err)
	__attribute__((warn_unused_result));

#endif
