/* gcr/protocol.h: the control protocol a shim speaks on its Unix socket, for other
 * tools that want to speak it. JSON lines; every request and reply carries "v". */
#ifndef GCR_PROTOCOL_H
#define GCR_PROTOCOL_H

#define GCR_PROTO_VERSION 1
/* Longest line either side may send, newline included (bytes). */
#define GCR_PROTO_MAX_LINE 65536

/* Requests: {"v":1,"id":N,"op":OP,"args":{...}}
 * Replies:  {"v":1,"id":N,"ok":true,"result":{...}}
 *           {"v":1,"id":N,"ok":false,"error":{"code":-errno,"message":"..."}} */
#define GCR_OP_STATUS "status"   /* state, byte counts; never calls the driver */
#define GCR_OP_SUSPEND "suspend" /* data out: gate closed, buffers staged, memory released */
#define GCR_OP_RESUME "resume"   /* data in: memory re-created at the same addresses, gate opened */
#define GCR_OP_STATS "stats"     /* counters: hooks seen, bytes per path, gate waits */
/* After the whole suspend (the driver's checkpoint included): give the staging memory
 * the saved data does not use back to the system, in the background. Args: "restore_need"
 * (an object the shim keeps for whichever tool resumes: the GPU memory the restore needs),
 * "trim": false to only keep that record (sent before the driver's checkpoint, so a suspend
 * cut short there still leaves it). */
#define GCR_OP_TRIM "trim"
/* Shim -> node agent, once, on the agent's registry socket: {"socket": control socket
 * path as the shim sees it, "version": ...}. The agent believes none of it beyond a
 * hint: it takes the pid from the connection's credentials and the pod and container
 * from /proc/<pid>/cgroup. The connection stays open; EOF means the process is gone. */
#define GCR_OP_REGISTER "register"
#define GCR_AGENT_SOCKET_ENV "GCR_AGENT_SOCKET"

/* Default directory for the per-process sockets ("<dir>/gcr-<pid>-<start time>.sock",
 * docs/design.md). */
#define GCR_DEFAULT_SOCKET_DIR "/run/gcr"
#define GCR_SOCKET_DIR_ENV "GCR_SOCKET_DIR"

#endif
