/* shim_ctl: the per-process control socket. A thread serves the JSON-lines
 * protocol (include/gcr/protocol.h) to peers running as root or as our own user. */
#ifndef SHIM_CTL_H
#define SHIM_CTL_H

/* Starts the control thread once CUDA is initialised; idempotent. */
void shim_ctl_start(void);
/* The socket path in use ("" before start). */
const char *shim_ctl_path(void);

#endif
