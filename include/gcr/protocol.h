/* gcr/protocol.h: the control protocol a shim speaks on its Unix socket, for other
 * tools that want to speak it: every request, reply and report field the shim sends and
 * gcrctl and the node agent read. JSON lines; every request and reply carries "v".
 * Readers must check every value (the socket belongs to the workload): lib/gcr_proto.c
 * checks the envelope, lib/gcr_shimreply.c the fields below. */
#ifndef GCR_PROTOCOL_H
#define GCR_PROTOCOL_H

#define GCR_PROTO_VERSION 1
/* Longest line either side may send, newline included (bytes). */
#define GCR_PROTO_MAX_LINE 65536

/* ---- envelope ----
 * Requests: {"v":1,"id":N,"op":OP,"args":{...}}
 *           "id": integer >= 0, echoed in the reply; "args": an object, may be absent.
 * Replies:  {"v":1,"id":N,"ok":true,"result":{...}}
 *           {"v":1,"id":N,"ok":false,"error":{"code":-errno,"message":"..."}}
 * Error codes of the envelope (id 0 when the request could not be read):
 *   -EMSGSIZE   a line longer than GCR_PROTO_MAX_LINE
 *   -EBADMSG    not JSON, not an object, or a field of the wrong type
 *   -EPROTO     "v" missing or not GCR_PROTO_VERSION
 *   -EOPNOTSUPP an op this shim does not know
 *   -EACCES     the peer is neither root nor the process's own user (then the shim closes)
 * Error codes of the ops:
 *   suspend: -EALREADY not running (already suspended or in flight); -ENOTSUP memory the
 *            shim cannot stage, or both CUDA and HIP in one process; -ENODEV no GPU runtime
 *            initialised yet; -ETIMEDOUT the gate did not close in "timeout_ms"; -ENOMEM;
 *            -EINVAL a bad "timeout_ms"; others from the runtime, as -errno. A failed
 *            suspend was undone: the process runs.
 *   suspend: -EXDEV the process holds live NCCL communicators (a member of a group of
 *            processes: the whole group is suspended with the group ops below), nothing touched.
 *   resume:  -EINVAL not suspended; others from the runtime (the process stays suspended,
 *            held at the gate: resume again).
 *   trim:    -EINVAL a "trim" or "restore_need" argument (both went to restore_need, below).
 *   restore_need: -EINVAL not suspended (the state named); -EBADMSG malformed "devices".
 *   group ops (below): -EINVAL not in the state the op needs (the error names it); -EBADMSG
 *            malformed args; -EBUSY a communicator is being created, a group stayed open, or a
 *            rebuild still runs; -ENOTSUP a communicator uses what cannot be rebuilt (the error
 *            says what); -ETIMEDOUT the op's bound passed (the error says the state left). */

/* ---- ops ---- */
/* status: no args. Never calls the driver. Result:
 *   "pid"      the process's pid in its own PID namespace
 *   "state"    GCR_STATE_* below
 *   "version"  the shim's package version
 *   "bytes"    {"vmm","app_vmm","pool","driver","async","managed"}: bytes tracked per kind;
 *              "vmm", "app_vmm" and "pool" (the shim's stream-ordered arena's segments) take the
 *              fast path, "driver" and "async" (pools the shim does not serve) are left to the
 *              driver's checkpoint, "managed" is refused at suspend
 *   "buffers"  {"vmm","app_vmm","pool","driver","async","managed","shared"}: counts of the same
 *              ("pool": segments)
 *   "pool"     {"pools","reserved","used","blocks","segments","pending_frees","graph","grows",
 *              "reuses":{"same_stream","done","waited"}}: the stream-ordered arena serving
 *              cuMemAllocAsync and pools (reserved: segment bytes; used: blocks handed out;
 *              graph: bytes owned by graphs; reuses: how freed blocks were given again)
 *   "staging"  {"capacity","used","ring","workers","target","ready","grown_inline","fault_ms"}:
 *              the pinned host staging pool ("ready": true once "target" bytes are pinned)
 *   "requests" {"suspend","resume"}: requests that reached the shim's C/R code
 *   "backends" {"cuda": bool, "hip": bool}: runtimes loaded; HIP only means the control
 *              step is CRIU's (absent in older shims: CUDA)
 *   "restore_need" (from a restore_need op, below, until the next suspend or the resume that
 *              succeeds) {"devices": [{"uuid", "bytes"}, ...]}: what that op kept, re-encoded
 *   "data"     where the process's GPU data is, GCR_DATA_* below: "gpu" while running (and while
 *              a suspend is in flight, and in the group states); while suspended "host", "written"
 *              or "files"; while a resume is in flight, where it is read from (absent in older
 *              shims while not suspended)
 *   "wake"     (while suspended by a suspend with "wake", below; absent otherwise: no wake in
 *              effect) {"state": "armed" (no thread has
 *              called since) or "called" (one has: its wake was sent to the agent, or tried),
 *              "waited_ms": how long the first caller has waited (0 while armed)}: an agent that
 *              restarted finds here a wake it never received (docs/preemption.md, "Wake on call") */
#define GCR_OP_STATUS "status"
/* suspend: data out: gate closed, buffers staged, memory released. Args: "group" (bool: a
 * group member, drained or detached: its communicators are torn down first, and the process
 * ends suspended with them down), "timeout_ms"
 * (1 .. 3600000: how long the gate waits for calls in flight; default the shim's
 * GCR_GATE_TIMEOUT_MS); "wake" (bool, default false: the node agent's overcommit suspends: the
 * first thread to reach the closed gate afterwards sends "wake" to the agent, below; not with
 * "image"); "image" (optional, absolute: an existing directory, the image being
 * written): the copies go from the pinned slots straight to image/gpu/ files, no staging, and
 * nothing is released before every chunk is written; then the table image/gpu/allocs.json, all
 * fsynced, the staging pool given back, the agent's registry connection closed and the control
 * socket re-bound for CRIU, as after image-write; resume is refused until image-read. Result: a
 * report (below), with "image": {"bytes","written","zero","allocs","table","ms":{"total"}}. */
#define GCR_OP_SUSPEND "suspend"
/* resume: data in: memory re-created at the same addresses, data copied back, gate opened.
 * No args. Result: a report (below). */
#define GCR_OP_RESUME "resume"
/* stats: no args. Result:
 *   "calls"     {hook name: count}, every hook the process called (also per-thread ones)
 *   "lookups"   {"dlsym_cu","dlsym_wrapped","dlsym_hip","dlsym_hip_wrapped","procaddr",
 *                "procaddr_wrapped","procaddr_by_name","procaddr_passthrough"}: how the
 *               application found the hooked entry points
 *   "gate"      {"waits"}: calls that waited at the closed gate
 *   "decisions" {"converted","fallback"}: allocations moved to the fast path, or not
 *   "status"    the status result above */
#define GCR_OP_STATS "stats"
/* After the whole suspend (the driver's checkpoint included): give the staging memory
 * the saved data does not use back to the system, in the background. No args (older clients
 * sent "restore_need" and "trim": false here: refused, -EINVAL, pointing at restore_need).
 * A no-op unless suspended. Result: {}. */
#define GCR_OP_TRIM "trim"
/* restore_need: only while suspended (any "data"): keeps the GPU memory the driver's restore of
 * this process needs, for whichever tool resumes it (gcrctl, the agent after a restart).
 * gcr_cr measures it with NVML after the data step and sends it before the driver's
 * checkpoint, so a suspend cut short there still leaves it. Args: "devices": [{"uuid": the
 * GPU's UUID (1 .. GCR_NEED_UUID_MAX - 1 printable ASCII characters, no spaces), "bytes": 0 ..
 * 2^50 - 1}, ...], 1 .. GCR_NEED_MAX_DEVICES entries, no UUID twice. Replaces what an earlier
 * one kept; the status says it ("restore_need") until the next suspend or the resume that
 * succeeds (a failed resume keeps it). Result: {}. */
#define GCR_OP_RESTORE_NEED "restore_need"
#define GCR_NEED_MAX_DEVICES 64 /* gcr_nvml lists at most as many GPUs */
#define GCR_NEED_UUID_MAX 96    /* with its NUL: NVML's UUID buffer (NVML_DEVICE_UUID_V2_BUFFER_SIZE) */
#define GCR_NEED_MAX_BYTES (1LL << 50)
/* ---- images (docs/images.md) ---- */
/* image-write: only while suspended with the data in staging (HIP; CUDA suspends with
 * "image" instead). Args: "dir" (absolute; an existing directory, the image being written).
 * Writes every staged allocation's non-zero 2 MiB chunks to
 * dir/gpu/ (several threads), the per-chunk table (zero or offset + CRC-32C) to
 * dir/gpu/allocs.json, all fsynced; then gives the host staging back (so CRIU's dump does
 * not hold the data twice) and closes the node agent's registry connection (an external
 * socket would fail the dump). From then on resume is refused (-EINVAL) until image-read.
 * Result: {"bytes","written","zero","allocs","table","ms":{"data","total"}}. A client that
 * is gone by the end gets no reply and the staging is kept. Errors: -EINVAL not
 * suspended, or already written; -EIO and others from the files (staging kept). */
#define GCR_OP_IMAGE_WRITE "image-write"
/* image-read: only while suspended with the data in image files (after a CRIU restore, or to
 * undo a suspend to an image or an image-write). Args: "dir", or "files": the names (as the
 * image's table has them, GCR_IMAGE_TABLE among them) of the descriptors passed with the request
 * (SCM_RIGHTS, as many as names, read-only: the node agent's restore into a new pod hands the
 * image over without a copy). Checks that the table matches the
 * process's allocations and each data file's size, and attaches the files: the next resume
 * reads each chunk from them into a pinned slot, checks its CRC-32C and sends it to the GPU at
 * its address. Re-publishes the control socket under the name of the restored process's new
 * start time, registers with the node agent again. Result: {"bytes","read" (bytes the resume
 * will read),"allocs","ms":{"total"}}. Errors: -EINVAL not suspended or the data still in
 * staging; -EIO a data file of the wrong size, -EBADMSG a table that does not match (the
 * process stays suspended, resume refused). */
#define GCR_OP_IMAGE_READ "image-read"

/* ---- groups: processes that communicate through NCCL, suspended and resumed as one
 * (docs/design.md, "Groups of processes"). A coordinator (lib/gcr_group.c: gcrctl --group)
 * drives every member through the same phase before any member starts the next:
 *   suspend: freeze -> drain -> suspend {"group": true} (communicators torn down, then the data
 *            step) -> the driver's checkpoint; a failure thaws (before the teardown) or rebuilds
 *            (after it) every member;
 *   resume:  the driver's restore -> resume (data in; the member ends "detached") -> ids (from
 *            the member holding rank 0 of each communicator) -> rebuild -> thaw.
 * Communicators are the shim's: the application holds the shim's handles, so torn down and
 * rebuilt ones stay valid. A communicator is named across processes by its "key", 16 lowercase
 * hex digits: a hash of the ncclUniqueId it was made from, or of its parent's key, the parent's
 * split number and the colour. Lists hold at most GCR_GROUP_MAX_COMMS entries (lib/gcr_groupmsg.h).
 *
 * A communicator, as status and the group ops report it ("comms": [...]):
 *   {"key": KEY, "rank": r, "nranks": n (1 .. 65536; rank 0 .. n-1), "count": submissions so far
 *    (0 .. 2^50: collectives outside a group, and each ncclGroupEnd once per communicator it
 *    touched, splits on the parent), "device": the CUDA device (-1 .. 63), "state": "live" |
 *    "down" (torn down, rebuilt at resume) | "failed" (a member holding one of its ranks did not
 *    come back: every call on it answers ncclRemoteError), "how": "init" | "split" | "local"
 *    (ncclCommInitAll: every rank in this process), "parent": KEY (split only)}
 * status adds "comms" when the process has any, and "nccl": {"held": threads waiting at the
 * shim's NCCL wrappers}. */
/* freeze: running -> frozen. New NCCL submissions wait at the shim's wrappers (a group already
 * begun is let through to its ncclGroupEnd); the reply lists the counts. Args: "hold_ms" (1 ..
 * 3600000): the member thaws by itself when no drain comes within it, or when the connection
 * that froze it closes; "wait_ms" (1 .. 3600000, default 5000): how long open groups may take.
 * Result: {"state", "comms", "ms": {"total"}}. */
#define GCR_OP_FREEZE "freeze"
/* drain: frozen -> drained. Args: "targets": [{"key": KEY, "count": n}, ...] (the largest count
 * each communicator has in any member), "timeout_ms" (1 .. 3600000). Submissions are let through
 * until every communicator of the member reaches its target, then NCCL's work is waited for on
 * the GPU. A count past its target (members that disagree) or the bound passing thaws the member
 * (-EPROTO, -ETIMEDOUT). Result: {"state": "drained", "comms", "ms": {"total"}}; or, when a
 * thread waits at a communicator at its target while another is below its own, {"state":
 * "frozen", "wants": [{"key", "count"}, ...], ...}: the group must go one further on those (the
 * coordinator raises their targets in every member that holds them and drains again; targets
 * only rise, and a drained member is drained again when one of its targets rose). A communicator
 * whose every rank is in the member goes further by itself. */
#define GCR_OP_DRAIN "drain"
/* thaw: frozen, drained or rebuilt -> running: held submissions go on. No args. Result:
 * {"state"}. */
#define GCR_OP_THAW "thaw"
/* detach: drained or rebuilt -> detached: every communicator torn down (ncclCommAbort, local),
 * NCCL calls stay held; what a failed group operation does before it rebuilds. No args. Result:
 * {"state", "ms": {"total"}}. The group's suspend ({"group": true}, from drained) detaches first
 * itself. */
#define GCR_OP_DETACH "detach"
/* ids: detached only. Args: "keys": [KEY, ...]: communicators made by ncclCommInitRank* whose
 * rank 0 this member holds. Result: {"ids": [{"key": KEY, "id": 256 lowercase hex digits (a
 * fresh ncclUniqueId, made here)}, ...]}. */
#define GCR_OP_IDS "ids"
/* rebuild: detached -> rebuilding -> rebuilt (NCCL calls still held; thaw lets them go). Args:
 * "ids" (as ids answered, one per communicator made by init), "failed": [KEY, ...] (their
 * members did not come back: marked failed, not rebuilt), "timeout_ms" (1 .. 3600000). Every
 * communicator is made again in the order the application made it (inits together, then splits
 * on the new parents), with its recorded configuration. Past the bound the reply is -ETIMEDOUT
 * and the member stays "rebuilding" until NCCL's initialisation ends (then rebuilt, or detached
 * on failure). Result: {"state", "comms", "ms": {"init", "split", "total"}}. */
#define GCR_OP_REBUILD "rebuild"

/* Shim -> node agent, once, on the agent's registry socket: {"socket": control socket
 * path as the shim sees it, "version": ...}. The agent believes none of it beyond a
 * hint: it takes the pid from the connection's credentials and the pod and container
 * from /proc/<pid>/cgroup. The connection stays open; EOF means the process is gone. */
#define GCR_OP_REGISTER "register"
#define GCR_AGENT_SOCKET_ENV "GCR_AGENT_SOCKET"

/* ---- overcommit by suspend (docs/preemption.md) ----
 * room: shim -> node agent, on the registry connection, from a process whose GPU allocation
 * just failed with out-of-memory. Args: "bytes" (1 .. 2^50: the allocation's size), "device"
 * (-1 .. 63: the process's own ordinal of the GPU, -1 unknown; a hint: the agent finds the GPU
 * from NVML). The agent answers on the same connection, within the shim's bound or not at all
 * (the shim then gives the application its out-of-memory error; a late reply is dropped by
 * its id). Result: {"granted": bool, "suspended": processes suspended for this request,
 * "freed": their bytes on the GPU, "reason": why not (when not granted)}. The agent grants
 * only to a process that opted in (GCR_OVERCOMMIT_ENV below), by suspending opted-in processes
 * of strictly lower priority on the same GPU; it resumes them when the requester is gone, frees
 * memory, or idles (docs/preemption.md).
 * Errors: -EBADMSG a bad "bytes" or "device"; -EBUSY too many requests waiting. */
#define GCR_OP_ROOM "room"
/* wake: shim -> node agent, on the registry connection, no reply: a thread of a process the
 * agent suspended (its suspend carried "wake": true, below) reached the closed gate. Sent once
 * per such suspension. Args: "waited_ms" (0 .. GCR_WAKE_MAX_WAITED_MS: how long the first
 * waiting thread had waited when the line left; a thread may arrive while the suspend is
 * still in flight). The agent treats it as a room request at the process's priority for the
 * bytes it held (docs/preemption.md, "Wake on call"); a line from a process it did not suspend
 * is logged and ignored. A process suspended without "wake" (gcrctl, a Checkpoint) sends none.
 * A wake the agent lost (it restarted meanwhile) stays in the status ("wake": "called") until
 * the resume. */
#define GCR_OP_WAKE "wake"
#define GCR_WAKE_MAX_WAITED_MS 86400000LL
/* The process's environment as the agent reads it (<procRoot>/<pid>/environ; the device
 * plugin sets the first for pods that opted in):
 *   GCR_OVERCOMMIT=1     ask the agent for room on out-of-memory, and may be suspended for
 *                        a process of higher priority;
 *   GCR_PRIORITY=N       the priority outside Kubernetes (-2^31 .. 2^31-1; default 0); in a
 *                        pod, the pod's spec.priority wins;
 *   GCR_PREEMPTIBLE=0    never suspended for another (in a pod also the annotation
 *                        gpucr.dev/preemptible: "false");
 *   GCR_ROOM_TIMEOUT_MS  how long the shim waits for the answer (1 .. 600000; default 5000). */
#define GCR_OVERCOMMIT_ENV "GCR_OVERCOMMIT"
#define GCR_PRIORITY_ENV "GCR_PRIORITY"
#define GCR_PREEMPTIBLE_ENV "GCR_PREEMPTIBLE"
#define GCR_ROOM_TIMEOUT_ENV "GCR_ROOM_TIMEOUT_MS"
#define GCR_ROOM_MAX_BYTES (1LL << 50)
#define GCR_ROOM_MAX_DEVICE 63

/* ---- reports: the result of suspend and resume ----
 *   "state"  GCR_STATE_* after the operation
 *   "bytes"  the staged buffers' size; "copied" what crossed PCIe (absent in older shims:
 *            all of "bytes"); "zero", "unchanged": bytes skipped as all zero or unchanged
 *            since the last suspend (GCR_INCREMENTAL); "host" bytes held in host memory
 *   "handles", "mappings": VMM handles released / re-created and their mappings
 *   "ctx_freed" bytes of context-local memory given back
 *   "ms"     {"gate","sync","digest","plan","copy","release","map","ctx","total"}: times */

/* ---- the shim's states (status "state", report "state") ---- */
#define GCR_STATE_RUNNING "running"
#define GCR_STATE_SUSPENDING "suspending" /* a suspend in flight */
#define GCR_STATE_SUSPENDED "suspended"   /* data off the GPU ("data" says where), application held at the gate */
#define GCR_STATE_RESUMING "resuming"     /* a resume in flight */
/* Group members (above): */
#define GCR_STATE_FROZEN "frozen"         /* NCCL submissions held, counts reported */
#define GCR_STATE_DRAINED "drained"       /* counts at their targets, NCCL's work done */
#define GCR_STATE_DETACHED "detached"     /* communicators torn down, NCCL calls held */
#define GCR_STATE_REBUILDING "rebuilding" /* communicators being made again */
#define GCR_STATE_REBUILT "rebuilt"       /* made again, NCCL calls still held until thaw */

/* ---- where the GPU data is (status "data"); shim_cr's state machine moves it ---- */
#define GCR_DATA_GPU "gpu"         /* on the GPU: running, group states, a suspend in flight */
#define GCR_DATA_HOST "host"       /* host memory (staging): a resume brings it back */
#define GCR_DATA_WRITTEN "written" /* image files only (suspend to an image, image-write): image-read, then resume */
#define GCR_DATA_FILES "files"     /* image files attached by image-read: the next resume reads them */

/* Default directory for the per-process sockets ("<dir>/gcr-<pid>-<start time>.sock",
 * docs/design.md). */
#define GCR_DEFAULT_SOCKET_DIR "/run/gcr"
#define GCR_SOCKET_DIR_ENV "GCR_SOCKET_DIR"

#endif
