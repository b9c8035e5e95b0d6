/* gcr_meminfo: one field of a meminfo file (/proc/meminfo), the host memory the shim's staging
 * and the agent's idle suspend are sized against. */
#ifndef GCR_MEMINFO_H
#define GCR_MEMINFO_H

#include <stdint.h>

/* The "<name>: N kB" field of path (NULL: /proc/meminfo) in bytes; 0 when the file or the
 * field cannot be read. */
uint64_t gcr_meminfo_bytes(const char *path, const char *name);

#endif
