/* shim_nccl: what the NCCL module's files share: the hook table (from shim_nccl_hooks.def) and
 * the real library behind it, the records that stand for the application's communicators, and
 * the hold on submissions that a group suspend closes (shim_nccl.c); the wrappers are
 * shim_nccl_hook.c, the operations the state machine calls shim_nccl_ops.c. */
#ifndef SHIM_NCCL_H
#define SHIM_NCCL_H

#include <stdatomic.h>
#include <stdint.h>

#include "gcr_groupmsg.h"
#include "shim_nccl_abi.h"
#include "shim_nccl_hooks.def"

enum shim_nccl_hook_id {
#define SHIM_NCCL_COLL(sym, var, since, params, args) SHIM_NCCL_HOOK_##sym,
#define SHIM_NCCL_USE(sym, var, since, params, args) SHIM_NCCL_HOOK_##sym,
#define SHIM_NCCL_CUSTOM(sym, var, since, ret, params) SHIM_NCCL_HOOK_##sym,
	SHIM_NCCL_COLL_LIST SHIM_NCCL_USE_LIST SHIM_NCCL_CUSTOM_LIST
#undef SHIM_NCCL_COLL
#undef SHIM_NCCL_USE
#undef SHIM_NCCL_CUSTOM
	SHIM_NCCL_HOOK_COUNT
};

/* One interposed entry point: name[1] the pnccl twin, NULL when there is none. */
struct shim_nccl_hook {
	const char *name[2];
	void *wrapper[2];
	void *real[2]; /* filled when the library is found; NULL if it lacks one */
};
extern struct shim_nccl_hook shim_nccl_hooks[SHIM_NCCL_HOOK_COUNT]; /* shim_nccl_hook.c */

/* NCCL functions the shim calls for its own work and does not interpose. */
struct shim_nccl_lib {
	__typeof__(&ncclGetUniqueId) GetUniqueId;
	__typeof__(&ncclGetErrorString) GetErrorString;
};
extern struct shim_nccl_lib shim_nccl_lib;

/* Finds the NCCL the application loaded (the object holding hint, else libnccl.so.2 already
 * loaded, else any loaded object named libnccl.so*: PyTorch loads it under an RTLD_LOCAL
 * dlopen, where dlsym(RTLD_NEXT) cannot see it; else the object that called the first wrapper,
 * for a library that carries NCCL inside it and calls its own exported names) and fills the
 * table; never loads one. 0 or -ENOENT. */
int shim_nccl_load(const void *hint);
/* Every exported wrapper notes its caller first, for that last case (one load once loaded). */
void shim_nccl_note_caller(const void *caller);
#define SHIM_NCCL_NOTE_CALLER() shim_nccl_note_caller(__builtin_return_address(0))
/* The real function behind a hook (loading on first use), NULL when there is none. */
void *shim_nccl_real(unsigned id, int variant);
#define SHIM_NCCL_REAL(sym, v) ((__typeof__(&sym))shim_nccl_real(SHIM_NCCL_HOOK_##sym, (v)))

/* ---- the records: one per communicator the application made; its handle is the record's
 * address, so a torn-down and rebuilt communicator keeps the handle ---- */
#define SHIM_NCCL_MAX_COMMS 1024
/* The configuration copied whole, up to this many bytes (ncclConfig_t of 2.29: 88). */
#define SHIM_NCCL_CONFIG_MAX 256
#define SHIM_NCCL_NAME_MAX 128

enum shim_nccl_rec_state {
	SHIM_NCCL_LIVE = 0, /* a real communicator behind it */
	SHIM_NCCL_DOWN,     /* torn down for a suspend: made again at resume */
	SHIM_NCCL_FAILED,   /* a peer did not come back: every call answers ncclRemoteError */
};

/* Why a communicator cannot be torn down and made again (a suspend refuses, naming it). */
#define SHIM_NCCL_U_WINDOW 0x01u  /* a memory window registered */
#define SHIM_NCCL_U_DEVCOMM 0x02u /* a device communicator (device API) */
#define SHIM_NCCL_U_REDOP 0x04u   /* a custom reduction op alive */
#define SHIM_NCCL_U_GRAPH 0x08u   /* a collective captured in a CUDA graph */
#define SHIM_NCCL_U_SHRINK 0x10u  /* made by ncclCommShrink or ncclCommGrow */
#define SHIM_NCCL_U_REVOKED 0x20u /* revoked (ncclCommRevoke) */

struct shim_nccl_rec {
	uint32_t magic;	  /* SHIM_NCCL_MAGIC while the slot is in use */
	ncclComm_t real;  /* NULL while down, failed or destroyed */
	enum shim_nccl_rec_state state;
	enum gcr_group_how how;
	unsigned unsup;   /* SHIM_NCCL_U_* */
	uint64_t key, seq; /* seq: creation order, the order a rebuild follows */
	int rank, nranks, device;
	CUcontext ctx;    /* current when the application made it: a rebuild makes it there */
	int blocking;
	ncclUniqueId id;  /* init: what it was made from (InitRankScalable: the first id) */
	int has_config;
	unsigned char config[SHIM_NCCL_CONFIG_MAX];
	char net_name[SHIM_NCCL_NAME_MAX], comm_name[SHIM_NCCL_NAME_MAX];
	/* split: the parent, the parent's split number, colour and key */
	struct shim_nccl_rec *parent;
	uint64_t split_seq, next_split;
	int color, split_key;
	int nocolor;   /* a split this process took part in with NCCL_SPLIT_NOCOLOR: no handle */
	int app_gone;  /* destroyed by the application; kept while children need it as a parent */
	int children;  /* records that name this one as parent */
	/* local (ncclCommInitAll): the call's number, this one's index, and every device of it */
	uint64_t local_group;
	int local_index, local_n;
	int local_devs[64];
	_Atomic long long count; /* submissions admitted */
	long long target;        /* the drain's */
	int waiters;             /* threads held at it (lock) */
	ncclResult_t sticky;     /* the last error seen, answered while held */
	char errmsg[160];
	int windows, devcomms, redops;
};

/* The application's handle's record, or NULL when h is not one of ours (a real communicator
 * NCCL passes to its own public functions, or garbage). */
struct shim_nccl_rec *shim_nccl_rec_of(const void *h);
/* A new record (zeroed but for magic and seq), or NULL when SHIM_NCCL_MAX_COMMS are in use.
 * Lock held. */
struct shim_nccl_rec *shim_nccl_rec_new(void);
/* Frees r, and its parent when that was destroyed and r was its last child. Lock held. */
void shim_nccl_rec_free(struct shim_nccl_rec *r);
/* Records in creation order: fills out (cap entries), returns how many. Lock held. */
size_t shim_nccl_recs(struct shim_nccl_rec **out, size_t cap);
uint64_t shim_nccl_key_init(const ncclUniqueId *ids, int nid);
uint64_t shim_nccl_key_split(uint64_t parent, uint64_t seq, int color);
/* Copies config (NULL: none) into r, strings included; sets r->blocking (parent's for NULL). */
void shim_nccl_rec_config(struct shim_nccl_rec *r, const ncclConfig_t *config, const struct shim_nccl_rec *parent);
/* The configuration to make r again with (its copy), or NULL. */
ncclConfig_t *shim_nccl_rec_cfg(struct shim_nccl_rec *r);

/* Registrations (ncclCommRegister) are the shim's handles too: made again after a rebuild. */
struct shim_nccl_reg {
	uint32_t magic;
	struct shim_nccl_rec *rec;
	void *buff;
	size_t size;
	void *real;
	struct shim_nccl_reg *next;
};
struct shim_nccl_reg *shim_nccl_reg_of(const void *h);

/* The module's lock: records, registrations, the hold. */
void shim_nccl_lock(void);
void shim_nccl_unlock(void);

/* ---- the hold on submissions (the group suspend's freeze and drain) ---- */
enum shim_nccl_mode {
	SHIM_NCCL_OPEN = 0, /* everything goes through */
	SHIM_NCCL_FROZEN,   /* nothing new: groups already begun finish */
	SHIM_NCCL_DRAINING, /* submissions up to each communicator's target */
	SHIM_NCCL_CLOSED,   /* nothing at all (drained, torn down, suspended, rebuilding) */
};

/* What a wrapper is doing, for the hold. */
enum shim_nccl_kind {
	SHIM_NCCL_K_COLL,   /* a submission: counted (in a group: at its ncclGroupEnd) */
	SHIM_NCCL_K_USE,    /* needs the live communicator, submits nothing */
	SHIM_NCCL_K_CREATE, /* makes a communicator (a split is also a submission on its parent) */
	SHIM_NCCL_K_QUERY,  /* answered from the record while held */
};

/* One call through a wrapper: enter maps the handle and waits for admission; exit ends it. */
struct shim_nccl_call {
	struct shim_nccl_rec *rec; /* NULL: not ours, passed through as it came */
	ncclComm_t real;
	void *fn;
	enum shim_nccl_kind kind;
	int admitted;
};
/* 0 (call c->fn with c->real), or the NCCL error to answer. comm: the handle given (NULL for
 * a creation from nothing: ncclCommInitRank*); stream: the submission's (checked for CUDA-graph
 * capture), NULL otherwise. c->rec is NULL when the call passes through unmapped. */
ncclResult_t shim_nccl_enter(struct shim_nccl_call *c, unsigned id, int variant, ncclComm_t comm, cudaStream_t stream,
			     enum shim_nccl_kind kind);
ncclResult_t shim_nccl_exit(struct shim_nccl_call *c, ncclResult_t r);
/* The group calls (shim_nccl_hook.c's wrappers): top-level start is admitted like a
 * submission; end counts each communicator the group touched. */
ncclResult_t shim_nccl_group_start(int variant);
ncclResult_t shim_nccl_group_end(int variant, int simulate, ncclSimInfo_t *info);
/* Whether the calling thread has a group open (a creation there is made at its end). */
int shim_nccl_in_group(void);
/* Whether the calling thread is inside a real NCCL call (NCCL calling its own public names). */
int shim_nccl_busy(void);
void shim_nccl_busy_add(int d);

/* The hold's state, for shim_nccl_ops.c (lock held where it says so). */
struct shim_nccl_hold {
	_Atomic int mode;
	_Atomic int admitting;   /* threads between reading the mode and being counted */
	_Atomic int inflight;    /* admitted calls inside NCCL now */
	_Atomic int open_groups; /* top-level groups begun and not yet ended */
	_Atomic int creating;    /* communicators being made (blocking inits, splits) */
	int waiting;             /* threads waiting for admission (lock) */
	int drain_group;         /* a group the drain let begin is open (lock) */
};
extern struct shim_nccl_hold shim_nccl_hold;
/* Wakes every thread waiting on the hold (lock held). */
void shim_nccl_wake(void);
/* Waits on the hold's condition until deadline (monotonic ms); lock held. 0, or -ETIMEDOUT. */
int shim_nccl_wait_until(double deadline_ms);

/* Whether the shim serves NCCL (GCR_NCCL, default 1: 0 passes every call through unmapped). */
int shim_nccl_enabled(void);

#endif
