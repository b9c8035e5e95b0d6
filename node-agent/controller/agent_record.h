/* agent_record: the node agent's own record of each Checkpoint it acts on, on the node where
 * users cannot write (<socket-dir>/agent/records, root only), written before any process is
 * touched and after each step. It is what recovery after a restart, a Restore and a deletion
 * work from: which processes (pid and start time), of which pod (uid), in which mode, how far
 * it got, and the final statuses written, so a status lost to an API fault is written again.
 * Every Checkpoint the agent ends Succeeded has one, until the Checkpoint goes: a Succeeded
 * without a record was not written by the agent (a forged one, marked so). */
#ifndef AGENT_RECORD_H
#define AGENT_RECORD_H

#include <jansson.h>
#include <sys/types.h>

#include "agent_crobj.h"
#include "gcr_error.h"

/* Processes of one pod acted on at most (the CRD's processes maxItems). */
#define AGENT_RECORD_MAX_PROCS 64
/* A record file is at most this big: 64 processes and two statuses fit many times over. */
#define AGENT_RECORD_FILE_MAX (256 * 1024)
/* Longest path an Image's record keeps (with the NUL). */
#define AGENT_RECORD_PATH_MAX 1024

enum agent_record_state {
	AGENT_REC_SUSPENDING, /* recorded, then being suspended (or not started yet) */
	AGENT_REC_SUSPENDED,  /* every process suspended by this Checkpoint */
	AGENT_REC_FAILED,     /* the suspend or image failed (or nothing was done); processes running or
			       * put back as they were */
	AGENT_REC_RESUMING,   /* a Restore (rs_uid) or the deletion is resuming them */
	AGENT_REC_RESUMED,    /* resumed by Restore rs_uid ("" when by the deletion) */
	AGENT_REC_IMAGING,    /* an Image in flight: img.step says how far it got */
	AGENT_REC_IMAGED,     /* an Image written whole at img.path */
	AGENT_REC_NSTATES
};

/* What a Checkpoint does (its spec.action). */
enum agent_record_action { AGENT_REC_ACT_SUSPEND, AGENT_REC_ACT_IMAGE };

/* The steps of an Image (agent_ckimage), each recorded before it runs. The kubelet's route runs
 * SUSPEND, DUMP, BACK, SEAL; the agent's own CRIU runs SUSPEND, DUMP, SEAL, BACK, MOVE. */
enum agent_record_step {
	AGENT_REC_STEP_START,   /* recorded: nothing touched yet */
	AGENT_REC_STEP_SUSPEND, /* the GPU data to work's files (a suspend, or image-write when suspended) */
	AGENT_REC_STEP_DUMP,    /* the CPU side: the kubelet's checkpoint, or CRIU's dump */
	AGENT_REC_STEP_SEAL,    /* the manifest of partial, committed as the image */
	AGENT_REC_STEP_BACK,    /* the process back from the files: resumed, or (suspended before) attached */
	AGENT_REC_STEP_MOVE,    /* the image moved from the pod's directory to img.path */
	AGENT_REC_NSTEPS
};

/* An Image's own part of the record: where each of its pieces lies, so that recovery and the
 * sweep find and remove what a killed agent left (a partial image, the kubelet's archive, the
 * pod's copy of the GPU data). */
struct agent_record_image {
	int kubelet;        /* the CPU side by the kubelet's checkpoint (else the agent's CRIU) */
	int from_suspended; /* the process was suspended already: imaged from there, it stays so */
	int converted;      /* a data-only suspend this Image took through the driver's checkpoint */
	enum agent_record_step step;
	int attempt;        /* 1, or 2 for the run again after an agent restart before the dump */
	long long dump_at;  /* when the kubelet's checkpoint was asked for (s since the epoch; names
			     * its archive), 0 before */
	int kept;           /* the process stays suspended with its data in work's files: the sweep
			     * removes work once the process runs again or is gone */
	char path[AGENT_RECORD_PATH_MAX];    /* the image */
	char work[AGENT_RECORD_PATH_MAX];    /* the pod's side: kubelet, <socket dir>/image-<uid> as the pod
					      * sees it; CRIU, <images>/.alloc/<id>/<uid>; "" none */
	char partial[AGENT_RECORD_PATH_MAX]; /* the partial image being written, "" none yet */
	char archive[AGENT_RECORD_PATH_MAX]; /* the kubelet's archive, once it said where */
	char container[AGENT_CROBJ_NS_LEN];  /* the container imaged */
};

struct agent_record_proc {
	pid_t pid;
	unsigned long long start; /* /proc/<pid>/stat starttime: a reused pid is another process */
	char container[AGENT_CROBJ_NS_LEN];
};

struct agent_record {
	char uid[AGENT_CROBJ_UID_LEN]; /* the Checkpoint's metadata.uid: the key */
	char ns[AGENT_CROBJ_NS_LEN], name[AGENT_CROBJ_NAME_LEN];
	char pod[AGENT_CROBJ_NAME_LEN], pod_uid[AGENT_CROBJ_UID_LEN];
	int keep_context; /* the mode suspended in */
	enum agent_record_state state;
	enum agent_record_action action;
	struct agent_record_image img; /* action Image only */
	int n;
	struct agent_record_proc p[AGENT_RECORD_MAX_PROCS];
	char rs_uid[AGENT_CROBJ_UID_LEN], rs_name[AGENT_CROBJ_NAME_LEN]; /* the Restore resuming them */
	json_t *ck_status; /* the Checkpoint's final status as written (owned), or NULL */
	json_t *rs_status; /* the Restore rs_uid's final status (owned), or NULL */
};

const char *agent_record_state_name(enum agent_record_state s);
const char *agent_record_step_name(enum agent_record_step s);

/* The record as JSON (a new reference), and back: decode checks every field and bound (a file
 * on disk may be truncated or damaged); r then owns new references to the statuses. */
json_t *agent_record_encode(const struct agent_record *r);
int agent_record_decode(json_t *j, struct agent_record *r, struct gcr_err *err) __attribute__((warn_unused_result));
/* Drops r's statuses. NULL-safe. */
void agent_record_clear(struct agent_record *r);
/* Replaces *slot by a copy of status (NULL: none). */
void agent_record_set_status(json_t **slot, json_t *status);

struct agent_record_store;

/* Opens dir (created 0700; refused unless it is a directory owned by this user and not
 * writable by others) and loads every record; a damaged one is renamed *.bad and logged. */
int agent_record_store_new(const char *dir, struct agent_record_store **out, struct gcr_err *err)
	__attribute__((warn_unused_result));
void agent_record_store_free(struct agent_record_store *s);

/* A copy of the record of uid into out (clear it after): 0 or -ENOENT. */
int agent_record_get(struct agent_record_store *s, const char *uid, struct agent_record *out);
/* Writes r (a temporary file, fsync, rename, fsync of the directory), then keeps it. */
int agent_record_put(struct agent_record_store *s, const struct agent_record *r, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* Removes the record of uid (0 also when there was none). */
int agent_record_del(struct agent_record_store *s, const char *uid, struct gcr_err *err);
/* The records' keys: a new array of {"uid", "ns", "name", "pod"}. */
json_t *agent_record_list(struct agent_record_store *s);
/* When this store began (s since the epoch, kept in the directory): a Succeeded on a Checkpoint
 * created since then, and without a record, was not written by the agent (an older agent ended
 * some Images without one). */
long long agent_record_store_since(struct agent_record_store *s);

#endif
