/* shim_agent: this process's connection to the node agent's registry (GCR_AGENT_SOCKET):
 * registration, and, for processes that opted in to overcommit, asking for GPU room. */
#ifndef SHIM_AGENT_H
#define SHIM_AGENT_H

#include <stddef.h>

/* Registers with the agent (best effort, bounded): sends "register" with the control socket
 * path sock_path and keeps the connection open (EOF tells the agent the process is gone). A
 * no-op without GCR_AGENT_SOCKET. */
void shim_agent_register(const char *sock_path);

/* Closes the connection (before a CRIU dump: an external socket would fail it). Waits for a
 * room request in flight to end (bounded by its timeout). */
void shim_agent_drop(void);

/* In a forked child: the parent's connection and lock are not ours. */
void shim_agent_after_fork(void);

/* True when this process opted in to overcommit (GCR_OVERCOMMIT=1 and GCR_AGENT_SOCKET set):
 * an allocation that fails for want of memory may then ask for room. One load of a flag. */
int shim_agent_overcommit(void);

/* After an allocation of bytes on device (the process's ordinal, -1 unknown) failed for want
 * of GPU memory: asks the agent to make room and waits for its answer, at most
 * GCR_ROOM_TIMEOUT_MS in all. 0: room was made (retry the allocation once); -ENOTSUP: not
 * opted in; -ENOSPC: the agent said no; -ETIMEDOUT: no answer in time; other -errno: the
 * agent could not be asked. Thread-safe: one request at a time; a thread that waited while
 * another's request was granted gets 0 without asking again. */
int shim_agent_room(size_t bytes, int device);

/* Tells the agent, with no reply awaited, that a thread of this process reached the closed
 * gate of a suspend the agent made ("wake", include/gcr/protocol.h); waited_ms: how long the
 * first waiting thread has waited. Registers again first when the agent restarted. 0, or
 * -errno when the agent could not be told (logged). Bounded: about 2 s at most. */
int shim_agent_wake(long long waited_ms);

/* The retry loop of an allocation wrapper, after an attempt failed for want of memory: true
 * when this process opted in, fewer than SHIM_AGENT_ROOM_TRIES rooms were
 * asked for this call (*tries counts them) and the agent made room: then try again. Callers
 * test the out-of-memory first (`r == OOM && shim_agent_room_retry(...)`), so that the
 * arguments (the current device) are only computed after one: a successful allocation pays
 * one comparison. */
#define SHIM_AGENT_ROOM_TRIES 2
static inline int shim_agent_room_retry(size_t bytes, int device, int *tries)
{
	return shim_agent_overcommit() && (*tries)++ < SHIM_AGENT_ROOM_TRIES &&
	       shim_agent_room(bytes, device) == 0;
}

#endif
