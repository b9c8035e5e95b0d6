/* agent_dpmsg: the device plugin's messages (kubelet API v1beta1, protobuf-c): decoding
 * with validation of every field of every request, and encoding of every answer. No I/O. */
#ifndef AGENT_DPMSG_H
#define AGENT_DPMSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.pb-c.h"
#include "gcr_error.h"

#define AGENT_DPMSG_MAX_BYTES (1u << 20)   /* largest request we unpack: 1 MiB */
#define AGENT_DPMSG_MAX_SLOTS 1024u         /* devices a plugin may advertise */
#define AGENT_DPMSG_MAX_CONTAINERS 64u      /* containers in one Allocate / preferred request */
#define AGENT_DPMSG_MAX_ID 63u              /* bytes in a device id */
#define AGENT_DPMSG_ALLOC_ID_LEN 32u        /* hex characters in an allocation id */

/* Slot i is advertised as "gcr-slot-<i>", i < slots. Returns i, or -EINVAL for
 * anything else (leading zeros, out of range, too long, not ASCII digits). */
int agent_dpmsg_slot_index(const char *id, unsigned slots);

/* Decoders: NULL with err set when buf does not unpack or a field is out of bounds.
 * Free the result with the matching *_free (NULL-safe). slots bounds the device ids. */
V1beta1__Empty *agent_dpmsg_empty_decode(const uint8_t *buf, size_t len, struct gcr_err *err);
V1beta1__AllocateRequest *agent_dpmsg_allocate_decode(const uint8_t *buf, size_t len,
						      unsigned slots, struct gcr_err *err);
V1beta1__PreferredAllocationRequest *agent_dpmsg_preferred_decode(const uint8_t *buf, size_t len,
								  unsigned slots,
								  struct gcr_err *err);
V1beta1__PreStartContainerRequest *agent_dpmsg_prestart_decode(const uint8_t *buf, size_t len,
							       unsigned slots, struct gcr_err *err);
void agent_dpmsg_empty_free(V1beta1__Empty *m);
void agent_dpmsg_allocate_free(V1beta1__AllocateRequest *m);
void agent_dpmsg_preferred_free(V1beta1__PreferredAllocationRequest *m);
void agent_dpmsg_prestart_free(V1beta1__PreStartContainerRequest *m);

/* What one container gets from Allocate; every string is the caller's. */
struct agent_dpmsg_alloc {
	const char *shim_host_dir, *shim_container_dir;        /* mounted read-only */
	const char *sock_host_dir, *sock_container_dir;        /* this allocation's own, read-write */
	const char *agent_host_dir, *agent_container_dir;      /* the agent's socket dir, read-only */
	const char *agent_container_socket;                    /* GCR_AGENT_SOCKET */
	const char *cdi_device;                                /* NULL: none */
	const char *const *extra_env; /* name, value, name, value...: after the three above */
	size_t n_extra_env;           /* pairs, at most AGENT_DPMSG_MAX_EXTRA_ENV */
	/* This allocation's image directory (Checkpoints with action Image), mounted read-write
	 * at the same path, so that a path the agent names means the same directory to the shim,
	 * and named in GCR_IMAGE_DIR after the others; NULL: none. */
	const char *image_dir;
};

#define AGENT_DPMSG_MAX_EXTRA_ENV 32
/* The image directory's path, in the container's environment (the agent reads it back from
 * /proc/<pid>/environ and checks it is that directory before it writes there). */
#define AGENT_DPMSG_IMAGE_DIR_ENV "GCR_IMAGE_DIR"

/* Encoders: a malloc'd buffer (*len bytes) the caller frees, or NULL on ENOMEM. */
uint8_t *agent_dpmsg_options_encode(size_t *len);
uint8_t *agent_dpmsg_empty_encode(size_t *len);
uint8_t *agent_dpmsg_devices_encode(unsigned slots, bool healthy, size_t *len);
/* Preferred answer for a validated request: must-include ids first, then the
 * available ones in order, allocation_size in all. */
uint8_t *agent_dpmsg_preferred_encode(const V1beta1__PreferredAllocationRequest *req, size_t *len);
/* One container response per allocs[i], i < n. */
uint8_t *agent_dpmsg_allocate_encode(const struct agent_dpmsg_alloc *allocs, size_t n,
				     size_t *len);
uint8_t *agent_dpmsg_register_encode(const char *endpoint, const char *resource_name,
				     size_t *len);

#endif
