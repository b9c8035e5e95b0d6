/* gcr_proto: the control protocol's only parser and encoder; a line that fails
 * any check is refused whole with a message naming the field. */
#include "gcr_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const op_names[] = {
	[GCR_OP_NONE] = "",
	[GCR_OP_STATUS_ID] = GCR_OP_STATUS,
	[GCR_OP_SUSPEND_ID] = GCR_OP_SUSPEND,
	[GCR_OP_RESUME_ID] = GCR_OP_RESUME,
	[GCR_OP_STATS_ID] = GCR_OP_STATS,
	[GCR_OP_REGISTER_ID] = GCR_OP_REGISTER,
	[GCR_OP_TRIM_ID] = GCR_OP_TRIM,
	[GCR_OP_RESTORE_NEED_ID] = GCR_OP_RESTORE_NEED,
	[GCR_OP_IMAGE_WRITE_ID] = GCR_OP_IMAGE_WRITE,
	[GCR_OP_IMAGE_READ_ID] = GCR_OP_IMAGE_READ,
	[GCR_OP_ROOM_ID] = GCR_OP_ROOM,
	[GCR_OP_WAKE_ID] = GCR_OP_WAKE,
	[GCR_OP_FREEZE_ID] = GCR_OP_FREEZE,
	[GCR_OP_DRAIN_ID] = GCR_OP_DRAIN,
	[GCR_OP_THAW_ID] = GCR_OP_THAW,
	[GCR_OP_DETACH_ID] = GCR_OP_DETACH,
	[GCR_OP_IDS_ID] = GCR_OP_IDS,
	[GCR_OP_REBUILD_ID] = GCR_OP_REBUILD,
};

const char *gcr_op_name(enum gcr_op op)
{
	if ((unsigned)op >= sizeof(op_names) / sizeof(op_names[0]))
		return "";
	return op_names[op];
}

static int parse_line(const char *line, json_t **out, struct gcr_err *err)
{
	json_error_t je;
	size_t len = strlen(line);
	if (len >= GCR_PROTO_MAX_LINE)
		return gcr_err_set(err, -EMSGSIZE, "line of %zu bytes exceeds %d", len, GCR_PROTO_MAX_LINE);
	json_t *j = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
	if (j == NULL)
		return gcr_err_set(err, -EBADMSG, "invalid JSON at column %d: %s", je.column, je.text);
	if (!json_is_object(j)) {
		json_decref(j);
		return gcr_err_set(err, -EBADMSG, "message is not a JSON object");
	}
	json_t *v = json_object_get(j, "v");
	if (!json_is_integer(v) || json_integer_value(v) != GCR_PROTO_VERSION) {
		json_decref(j);
		return gcr_err_set(err, -EPROTO, "unsupported protocol version (want \"v\":%d)",
				   GCR_PROTO_VERSION);
	}
	*out = j;
	return 0;
}

static int parse_id(json_t *j, long long *id, struct gcr_err *err)
{
	json_t *v = json_object_get(j, "id");
	if (v == NULL) {
		*id = 0;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return gcr_err_set(err, -EBADMSG, "\"id\" must be a non-negative integer");
	*id = json_integer_value(v);
	return 0;
}

int gcr_proto_parse_request(const char *line, struct gcr_req *req, struct gcr_err *err)
{
	memset(req, 0, sizeof(*req));
	json_t *j = NULL;
	int rc = parse_line(line, &j, err);
	if (rc < 0)
		return rc;
	rc = parse_id(j, &req->id, err);
	if (rc < 0)
		goto out;
	json_t *op = json_object_get(j, "op");
	if (!json_is_string(op)) {
		rc = gcr_err_set(err, -EBADMSG, "\"op\" must be a string");
		goto out;
	}
	for (size_t i = 1; i < sizeof(op_names) / sizeof(op_names[0]); i++)
		if (strcmp(json_string_value(op), op_names[i]) == 0)
			req->op = (enum gcr_op)i;
	if (req->op == GCR_OP_NONE) {
		rc = gcr_err_set(err, -EOPNOTSUPP, "unknown op \"%.64s\"", json_string_value(op));
		goto out;
	}
	json_t *args = json_object_get(j, "args");
	if (args != NULL && !json_is_object(args)) {
		rc = gcr_err_set(err, -EBADMSG, "\"args\" must be an object");
		goto out;
	}
	req->args = args ? json_incref(args) : json_object();
	rc = req->args ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
out:
	json_decref(j);
	return rc;
}

void gcr_req_clear(struct gcr_req *req)
{
	if (req == NULL)
		return;
	json_decref(req->args);
	memset(req, 0, sizeof(*req));
}

int gcr_proto_parse_reply(const char *line, struct gcr_reply *rep, struct gcr_err *err)
{
	memset(rep, 0, sizeof(*rep));
	json_t *j = NULL;
	int rc = parse_line(line, &j, err);
	if (rc < 0)
		return rc;
	rc = parse_id(j, &rep->id, err);
	if (rc < 0)
		goto out;
	json_t *ok = json_object_get(j, "ok");
	if (!json_is_boolean(ok)) {
		rc = gcr_err_set(err, -EBADMSG, "\"ok\" must be a boolean");
		goto out;
	}
	rep->ok = json_is_true(ok);
	if (rep->ok) {
		json_t *res = json_object_get(j, "result");
		if (res != NULL && !json_is_object(res)) {
			rc = gcr_err_set(err, -EBADMSG, "\"result\" must be an object");
			goto out;
		}
		rep->result = res ? json_incref(res) : json_object();
		goto out;
	}
	json_t *e = json_object_get(j, "error");
	json_t *code = json_object_get(e, "code");
	json_t *msg = json_object_get(e, "message");
	if (!json_is_object(e) || !json_is_integer(code) || !json_is_string(msg) ||
	    json_integer_value(code) >= 0 || json_integer_value(code) < -4095) {
		rc = gcr_err_set(err, -EBADMSG, "\"error\" must hold a negative errno \"code\" and a \"message\"");
		goto out;
	}
	rep->code = (int)json_integer_value(code);
	snprintf(rep->message, sizeof(rep->message), "%s", json_string_value(msg));
	gcr_err_utf8_clean(rep->message); /* the cut may have split a character */
out:
	json_decref(j);
	return rc;
}

void gcr_reply_clear(struct gcr_reply *rep)
{
	if (rep == NULL)
		return;
	json_decref(rep->result);
	memset(rep, 0, sizeof(*rep));
}

/* A UUID as NVML gives it: printable ASCII without spaces, 1 .. GCR_NEED_UUID_MAX - 1 bytes and
 * no NUL inside, so it may go into log lines and NVML calls as it is. */
static int uuid_ok(json_t *u)
{
	const char *s = json_string_value(u);
	size_t len = json_string_length(u);
	if (s == NULL || len == 0 || len >= GCR_NEED_UUID_MAX || strlen(s) != len)
		return 0;
	for (size_t i = 0; i < len; i++)
		if (s[i] <= ' ' || s[i] > '~')
			return 0;
	return 1;
}

int gcr_proto_need_parse(json_t *obj, struct gcr_need *need, struct gcr_err *err)
{
	need->n = 0;
	json_t *devs = json_object_get(obj, "devices"), *d;
	size_t i, n = json_array_size(devs);
	if (!json_is_object(obj) || !json_is_array(devs) || n == 0 || n > GCR_NEED_MAX_DEVICES)
		return gcr_err_set(err, -EBADMSG, "\"devices\" must be an array of 1 .. %d GPUs", GCR_NEED_MAX_DEVICES);
	json_array_foreach(devs, i, d) {
		json_t *u = json_object_get(d, "uuid"), *b = json_object_get(d, "bytes");
		if (!uuid_ok(u))
			return gcr_err_set(err, -EBADMSG, "device %zu: \"uuid\" must be 1 .. %d printable characters "
					   "without spaces", i, GCR_NEED_UUID_MAX - 1);
		if (!json_is_integer(b) || json_integer_value(b) < 0 || json_integer_value(b) >= GCR_NEED_MAX_BYTES)
			return gcr_err_set(err, -EBADMSG, "device %zu: \"bytes\" must be an integer in 0 .. 2^50 - 1",
					   i);
		for (size_t k = 0; k < i; k++)
			if (strcmp(need->dev[k].uuid, json_string_value(u)) == 0)
				return gcr_err_set(err, -EBADMSG, "device %zu: GPU %s is listed twice", i,
						   need->dev[k].uuid);
		memcpy(need->dev[i].uuid, json_string_value(u), json_string_length(u) + 1);
		need->dev[i].bytes = (long long)json_integer_value(b);
	}
	need->n = n;
	return 0;
}

json_t *gcr_proto_need_json(const struct gcr_need *need)
{
	json_t *devs = json_array();
	for (size_t i = 0; devs != NULL && i < need->n; i++)
		if (json_array_append_new(devs, json_pack("{s:s, s:I}", "uuid", need->dev[i].uuid, "bytes",
							  (json_int_t)need->dev[i].bytes)) < 0) {
			json_decref(devs);
			devs = NULL;
		}
	return devs != NULL ? json_pack("{s:o}", "devices", devs) : NULL;
}

static char *dump_line(json_t *j)
{
	if (j == NULL)
		return NULL;
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (s == NULL)
		return NULL;
	size_t n = strlen(s);
	char *line = realloc(s, n + 2);
	if (line == NULL) {
		free(s);
		return NULL;
	}
	line[n] = '\n';
	line[n + 1] = '\0';
	return line;
}

char *gcr_proto_request_line(long long id, enum gcr_op op, json_t *args)
{
	json_t *j = json_pack("{s:i, s:I, s:s, s:o}", "v", GCR_PROTO_VERSION, "id", (json_int_t)id,
			      "op", gcr_op_name(op), "args", args ? args : json_object());
	return dump_line(j);
}

char *gcr_proto_reply_ok_line(long long id, json_t *result)
{
	json_t *j = json_pack("{s:i, s:I, s:b, s:o}", "v", GCR_PROTO_VERSION, "id", (json_int_t)id,
			      "ok", 1, "result", result ? result : json_object());
	return dump_line(j);
}

char *gcr_proto_reply_err_line(long long id, int code, const char *message)
{
	/* jansson refuses invalid UTF-8, and a refused reply would leave the client with no
	 * answer at all: the message is cleaned (and bounded) first. */
	char clean[GCR_ERR_MSG_MAX];
	snprintf(clean, sizeof(clean), "%s", message ? message : "");
	gcr_err_utf8_clean(clean);
	json_t *j = json_pack("{s:i, s:I, s:b, s:{s:i, s:s}}", "v", GCR_PROTO_VERSION, "id",
			      (json_int_t)id, "ok", 0, "error", "code", code < 0 ? code : -EIO, "message", clean);
	return dump_line(j);
}
