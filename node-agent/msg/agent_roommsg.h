/* agent_roommsg: what the overcommit policy reads from outside: a shim's "room" request on the
 * registry connection, and the opt-in, priority and never-suspend mark in a process's environ. */
#ifndef AGENT_ROOMMSG_H
#define AGENT_ROOMMSG_H

#include <stddef.h>

#include "gcr_error.h"

/* A "room" request's or a "wake" line's arguments (include/gcr/protocol.h). */
struct agent_roommsg_room {
	long long id;            /* the request's id, echoed in the reply (room) */
	unsigned long long bytes; /* room: 1 .. GCR_ROOM_MAX_BYTES; wake: 0 */
	int device;              /* room: -1 .. GCR_ROOM_MAX_DEVICE; wake: -1 */
	long long waited_ms;     /* wake: 0 .. GCR_WAKE_MAX_WAITED_MS; room: 0 */
};

enum agent_roommsg_kind {
	AGENT_ROOMMSG_OTHER = 0, /* "register" or any other op: nothing to do */
	AGENT_ROOMMSG_ROOM,      /* a room request, in *room */
	AGENT_ROOMMSG_WAKE,      /* a suspended process's thread reached the gate, in *room */
};

/* One line (len bytes, no newline needed) a shim sent on the registry connection. Returns the
 * kind, or -EBADMSG / -EPROTO / -EMSGSIZE / -EOPNOTSUPP with err saying which field is wrong
 * (room->id is then the request's id when it could be read, else 0). A bad wake gets no reply
 * (the shim does not read one): the caller logs it. */
int agent_roommsg_parse(const char *line, size_t len, struct agent_roommsg_room *room, struct gcr_err *err);

/* The settings of one process, from its environment. */
struct agent_roommsg_env {
	int overcommit;  /* GCR_OVERCOMMIT=1 */
	int priority;    /* GCR_PRIORITY, 0 when absent or invalid */
	int preemptible; /* 0 when GCR_PREEMPTIBLE=0 (or false), else 1 */
	int bad;         /* a value was present but invalid (logged by the caller) */
};

/* Reads /proc/<pid>/environ's content (len bytes of NUL-separated NAME=VALUE; a missing
 * final NUL is fine). Never fails: what it cannot read is the default. */
void agent_roommsg_environ(const char *buf, size_t len, struct agent_roommsg_env *out);

#endif
