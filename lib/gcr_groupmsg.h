/* gcr_groupmsg: the messages of the group operations (include/gcr/protocol.h, "groups"): the
 * communicators a member reports, drain targets, fresh unique ids and lists of keys, encoded
 * and checked here for both sides (the shim reads the coordinator's arguments, the coordinator
 * reads the members' replies, and neither trusts the other's bytes). */
#ifndef GCR_GROUPMSG_H
#define GCR_GROUPMSG_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"

/* Communicators in one member's message: PyTorch makes one per process group and device, so a
 * handful; 128 keeps the largest message (ids: ~280 bytes each) under GCR_PROTO_MAX_LINE. */
#define GCR_GROUP_MAX_COMMS 128
#define GCR_GROUP_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define GCR_GROUP_MAX_RANKS 65536
#define GCR_GROUP_COUNT_MAX (1LL << 50)
#define GCR_GROUP_MAX_DEVICE 63
/* The bound every group op takes (ms), and what wait_ms defaults to. */
#define GCR_GROUP_MAX_MS 3600000
#define GCR_GROUP_WAIT_MS 5000
/* A key as text: 16 lowercase hex digits and the NUL. */
#define GCR_GROUP_KEY_LEN 17

enum gcr_group_comm_state {
	GCR_GROUP_COMM_LIVE = 0,
	GCR_GROUP_COMM_DOWN,   /* torn down: rebuilt at resume */
	GCR_GROUP_COMM_FAILED, /* a member holding a rank did not come back */
	GCR_GROUP_COMM_NSTATES
};

enum gcr_group_how {
	GCR_GROUP_HOW_INIT = 0, /* ncclCommInitRank*: rebuilt from a fresh unique id */
	GCR_GROUP_HOW_SPLIT,    /* ncclCommSplit: split again from the rebuilt parent */
	GCR_GROUP_HOW_LOCAL,    /* ncclCommInitAll: every rank in this process */
	GCR_GROUP_HOW_N
};

struct gcr_group_comm {
	uint64_t key;
	uint64_t parent; /* split: the parent's key; 0 otherwise */
	long long count; /* 0 .. GCR_GROUP_COUNT_MAX - 1 */
	int rank, nranks;
	int device; /* -1 .. GCR_GROUP_MAX_DEVICE */
	enum gcr_group_comm_state state;
	enum gcr_group_how how;
};

struct gcr_group_comms {
	size_t n;
	struct gcr_group_comm c[GCR_GROUP_MAX_COMMS];
};

struct gcr_group_target {
	uint64_t key;
	long long count;
};

struct gcr_group_targets {
	size_t n;
	struct gcr_group_target t[GCR_GROUP_MAX_COMMS];
};

struct gcr_group_id {
	uint64_t key;
	unsigned char id[GCR_GROUP_ID_BYTES];
};

struct gcr_group_ids {
	size_t n;
	struct gcr_group_id v[GCR_GROUP_MAX_COMMS];
};

struct gcr_group_keys {
	size_t n;
	uint64_t key[GCR_GROUP_MAX_COMMS];
};

const char *gcr_groupmsg_state_name(enum gcr_group_comm_state s); /* "live", "down", "failed" */
const char *gcr_groupmsg_how_name(enum gcr_group_how h);          /* "init", "split", "local" */

/* A key as 16 lowercase hex digits (out: GCR_GROUP_KEY_LEN bytes); and back: 0 or -EINVAL for
 * anything else (key 0 is never a communicator's). */
void gcr_groupmsg_key_fmt(uint64_t key, char *out);
int gcr_groupmsg_key_parse(const char *s, size_t len, uint64_t *key);

/* Encoders: a new JSON value, or NULL when out of memory. */
json_t *gcr_groupmsg_comms_json(const struct gcr_group_comms *c);
json_t *gcr_groupmsg_targets_json(const struct gcr_group_targets *t);
json_t *gcr_groupmsg_ids_json(const struct gcr_group_ids *ids);
json_t *gcr_groupmsg_keys_json(const struct gcr_group_keys *k);

/* Decoders of outside input: every field checked (types, ranges, rank < nranks, keys and ids
 * well formed, no key twice; in comms no key and rank twice, one size per key); 0, or -EBADMSG
 * with err naming the field. The output holds nothing on error (n == 0). */
int gcr_groupmsg_comms(json_t *arr, struct gcr_group_comms *out, struct gcr_err *err)
	__attribute__((warn_unused_result));
int gcr_groupmsg_targets(json_t *arr, struct gcr_group_targets *out, struct gcr_err *err)
	__attribute__((warn_unused_result));
int gcr_groupmsg_ids(json_t *arr, struct gcr_group_ids *out, struct gcr_err *err)
	__attribute__((warn_unused_result));
int gcr_groupmsg_keys(json_t *arr, struct gcr_group_keys *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* An optional integer member of args in lo .. hi (def when absent); -EBADMSG otherwise. */
int gcr_groupmsg_int(json_t *args, const char *key, long long lo, long long hi, long long def, long long *out,
		     struct gcr_err *err) __attribute__((warn_unused_result));

#endif
