/* agent_record: the node agent's own record of each Checkpoint it acts on, on the node where
 * users cannot write (<socket-dir>/agent/records, root only), written before any process is
 * touched and after each step. It is what recovery after a restart, a Restore and a deletion
 * work from: which processes (pid and start time), of which pod (uid), in which mode, how far
 * it got, and the final statuses written, so a status lost to an API fault is written again. */
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

enum agent_record_state {
	AGENT_REC_SUSPENDING, /* recorded, then being suspended (or not started yet) */
	AGENT_REC_SUSPENDED,  /* every process suspended by this Checkpoint */
	AGENT_REC_FAILED,     /* the suspend failed; the processes were left or put back running */
	AGENT_REC_RESUMING,   /* a Restore (rs_uid) or the deletion is resuming them */
	AGENT_REC_RESUMED,    /* resumed by Restore rs_uid ("" when by the deletion) */
	AGENT_REC_NSTATES
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
	int n;
	struct agent_record_proc p[AGENT_RECORD_MAX_PROCS];
	char rs_uid[AGENT_CROBJ_UID_LEN], rs_name[AGENT_CROBJ_NAME_LEN]; /* the Restore resuming them */
	json_t *ck_status; /* the Checkpoint's final status as written (owned), or NULL */
	json_t *rs_status; /* the Restore rs_uid's final status (owned), or NULL */
};

const char *agent_record_state_name(enum agent_record_state s);

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

#endif
