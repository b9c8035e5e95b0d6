/* fakecuda_pool: the file $FAKECUDA_DIR/fakecuda-pool that every fake process using one
 * FAKECUDA_DIR (or FAKECUDA_POOL) shares, as processes share a GPU: one slot per process, its bytes per device.
 * The stand-in driver writes it (fakecuda_mem.c); the stand-in NVML only reads it (fakenvml.c). */
#ifndef FAKECUDA_POOL_H
#define FAKECUDA_POOL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FAKE_POOL_SLOTS 256
#define FAKE_POOL_DEVICES 8 /* FAKE_MAX_DEVICES */

struct fake_pool_slot {
	int32_t pid;   /* in the process's own PID namespace; 0: free; a dead pid's slot is reused */
	uint32_t pidns; /* that namespace's inode (NVML reports pids as its caller sees them) */
	uint64_t used[FAKE_POOL_DEVICES]; /* bytes */
};

/* $FAKECUDA_POOL, else $FAKECUDA_DIR/fakecuda-pool (else /tmp): a fake "container" with a
 * FAKECUDA_DIR of its own still shares the node's GPU through FAKECUDA_POOL. */
static inline void fake_pool_path(char *buf, size_t len)
{
	const char *pool = getenv("FAKECUDA_POOL"), *dir = getenv("FAKECUDA_DIR");

	if (pool != NULL && *pool)
		snprintf(buf, len, "%s", pool);
	else
		snprintf(buf, len, "%s/fakecuda-pool", dir != NULL && *dir ? dir : "/tmp");
}

#endif
