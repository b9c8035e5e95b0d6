/* gcr_proto: encoding and strict validation of the control protocol's JSON lines
 * (include/gcr/protocol.h). Every field from the wire is checked here. */
#ifndef GCR_PROTO_H
#define GCR_PROTO_H

#include <jansson.h>
#include <stddef.h>

#include "gcr/protocol.h"
#include "gcr_error.h"

enum gcr_op {
	GCR_OP_NONE = 0,
	GCR_OP_STATUS_ID,
	GCR_OP_SUSPEND_ID,
	GCR_OP_RESUME_ID,
	GCR_OP_STATS_ID,
	GCR_OP_REGISTER_ID,
	GCR_OP_TRIM_ID,
	GCR_OP_RESTORE_NEED_ID,
	/* images (docs/images.md) */
	GCR_OP_IMAGE_WRITE_ID,
	GCR_OP_IMAGE_READ_ID,
	/* overcommit: shim -> agent (docs/preemption.md) */
	GCR_OP_ROOM_ID,
	GCR_OP_WAKE_ID,
	/* groups of processes (NCCL): lib/gcr_group.c drives them */
	GCR_OP_FREEZE_ID,
	GCR_OP_DRAIN_ID,
	GCR_OP_THAW_ID,
	GCR_OP_DETACH_ID,
	GCR_OP_IDS_ID,
	GCR_OP_REBUILD_ID,
};

struct gcr_req {
	long long id;
	enum gcr_op op;
	json_t *args; /* owned; always an object after a successful parse */
};

struct gcr_reply {
	long long id;
	int ok;
	json_t *result; /* owned; an object when ok */
	int code;       /* negative errno when !ok */
	char message[GCR_ERR_MSG_MAX];
};

const char *gcr_op_name(enum gcr_op op);

int gcr_proto_parse_request(const char *line, struct gcr_req *req, struct gcr_err *err);
void gcr_req_clear(struct gcr_req *req);
int gcr_proto_parse_reply(const char *line, struct gcr_reply *rep, struct gcr_err *err);
void gcr_reply_clear(struct gcr_reply *rep);

/* The GPU memory a process's restore needs (include/gcr/protocol.h, restore_need): what that
 * op takes, what the shim keeps, and what its status reports. */
struct gcr_need {
	size_t n; /* 1 .. GCR_NEED_MAX_DEVICES once parsed */
	struct {
		char uuid[GCR_NEED_UUID_MAX]; /* printable ASCII without spaces, not empty */
		long long bytes;              /* 0 .. GCR_NEED_MAX_BYTES - 1 */
	} dev[GCR_NEED_MAX_DEVICES];
};
/* obj: {"devices": [{"uuid", "bytes"}, ...]} (other members ignored). 0, or -EBADMSG with err
 * naming what was wrong and need->n 0. */
int gcr_proto_need_parse(json_t *obj, struct gcr_need *need, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* {"devices": [...]}, or NULL when out of memory. */
json_t *gcr_proto_need_json(const struct gcr_need *need);

/* Each returns a malloc'd line ending in '\n' (caller frees) or NULL when out of
 * memory. The json_t arguments are stolen (may be NULL). */
char *gcr_proto_request_line(long long id, enum gcr_op op, json_t *args);
char *gcr_proto_reply_ok_line(long long id, json_t *result);
char *gcr_proto_reply_err_line(long long id, int code, const char *message);

#endif
