/* shim_nccl_poll: poll() from NCCL's own code ends when a teardown starts, and waits at most
 * SHIM_NCCL_POLL_HURRY_MS while it runs (shim_nccl_poll.c says why). */
#ifndef SHIM_NCCL_POLL_H
#define SHIM_NCCL_POLL_H

#define SHIM_NCCL_POLL_HURRY_MS 5

/* Once NCCL is found: fn is one of its functions (its library's range is taken from it). Before
 * the library makes its threads, so their polls are seen from the first. Idempotent. */
void shim_nccl_poll_setup(const void *fn);

/* on: NCCL's polls in progress end now (returning 0) and later ones are short (nestable);
 * 0: one such window ends. */
void shim_nccl_poll_hurry(int on);

/* Whether a return address lies in the NCCL library. */
int shim_nccl_poll_is_nccl(const void *caller);

#endif
