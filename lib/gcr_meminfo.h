/* gcr_meminfo: the host memory the shim's staging and the agent's idle suspend are sized
 * against: one field of a meminfo file (/proc/meminfo), and the memory cgroup a process sees as
 * its own (cgroup v2 or v1: a container's limit and what it uses). */
#ifndef GCR_MEMINFO_H
#define GCR_MEMINFO_H

#include <stdint.h>

/* The "<name>: N kB" field of path (NULL: /proc/meminfo) in bytes; 0 when the file or the
 * field cannot be read. */
uint64_t gcr_meminfo_bytes(const char *path, const char *name);

/* A memory cgroup's limit and use, in bytes. used leaves out the page cache of files (the
 * active and inactive file lists), which the kernel reclaims before it kills anything for the
 * limit; shared memory and tmpfs stay counted. */
struct gcr_memcg {
	int version; /* 2 or 1 */
	uint64_t limit;
	uint64_t current; /* as the cgroup counts it, page cache included */
	uint64_t used;    /* current less the reclaimable page cache */
};

/* The memory cgroup at root (NULL: /sys/fs/cgroup, a process's own in a container with a cgroup
 * namespace or runc's v1 mounts): 0 and *m filled when it has a limit; -ENOENT when it has
 * none ("max", or a v1 limit of 2^60 bytes or more) or its files cannot be read. */
int gcr_meminfo_cgroup(const char *root, struct gcr_memcg *m);

#endif
