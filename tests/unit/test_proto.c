/* test_proto: the control protocol's parser refuses every malformed field and
 * round-trips what the encoder writes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "gcr_proto.h"
#include "util.h"

static int parse_req(const char *line, struct gcr_req *req)
{
	struct gcr_err err = { 0 };
	return gcr_proto_parse_request(line, req, &err);
}

static void test_requests(void)
{
	struct gcr_req req;
	CHECK(parse_req("{\"v\":1,\"id\":7,\"op\":\"suspend\",\"args\":{\"timeout_ms\":5}}", &req) == 0);
	CHECK(req.op == GCR_OP_SUSPEND_ID && req.id == 7);
	CHECK(json_integer_value(json_object_get(req.args, "timeout_ms")) == 5);
	gcr_req_clear(&req);
	CHECK(parse_req("{\"v\":1,\"op\":\"status\"}", &req) == 0 && req.op == GCR_OP_STATUS_ID);
	CHECK(json_is_object(req.args));
	gcr_req_clear(&req);

	const char *bad[] = {
		"", "null", "[]", "{", "{\"op\":\"status\"}",                 /* no version */
		"{\"v\":2,\"op\":\"status\"}", "{\"v\":\"1\",\"op\":\"status\"}", /* wrong version */
		"{\"v\":1}", "{\"v\":1,\"op\":3}", "{\"v\":1,\"op\":\"format-disk\"}",
		"{\"v\":1,\"op\":\"status\",\"id\":-1}", "{\"v\":1,\"op\":\"status\",\"id\":\"x\"}",
		"{\"v\":1,\"op\":\"status\",\"args\":[]}", "{\"v\":1,\"v\":1,\"op\":\"status\"}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse_req(bad[i], &req);
		CHECK(rc < 0);
		if (rc == 0)
			fprintf(stderr, "accepted: %s\n", bad[i]);
		gcr_req_clear(&req);
	}
	/* A line at the size limit is refused before parsing. */
	char *big = malloc(GCR_PROTO_MAX_LINE + 16);
	memset(big, ' ', GCR_PROTO_MAX_LINE + 8);
	big[GCR_PROTO_MAX_LINE + 8] = '\0';
	CHECK(parse_req(big, &req) == -EMSGSIZE);
	free(big);
}

static void test_round_trip(void)
{
	char *line = gcr_proto_request_line(42, GCR_OP_RESUME_ID, NULL);
	CHECK(line != NULL && line[strlen(line) - 1] == '\n');
	line[strlen(line) - 1] = '\0';
	struct gcr_req req;
	CHECK(parse_req(line, &req) == 0 && req.id == 42 && req.op == GCR_OP_RESUME_ID);
	gcr_req_clear(&req);
	free(line);

	struct gcr_reply rep;
	struct gcr_err err;
	line = gcr_proto_reply_err_line(3, -ENOMEM, "not enough GPU memory");
	CHECK(gcr_proto_parse_reply(line, &rep, &err) == 0);
	CHECK(!rep.ok && rep.code == -ENOMEM && rep.id == 3);
	CHECK_STR(rep.message, "not enough GPU memory");
	gcr_reply_clear(&rep);
	free(line);

	line = gcr_proto_reply_ok_line(4, json_pack("{s:s}", "state", "running"));
	CHECK(gcr_proto_parse_reply(line, &rep, &err) == 0 && rep.ok);
	CHECK_STR(json_string_value(json_object_get(rep.result, "state")), "running");
	gcr_reply_clear(&rep);
	free(line);

	/* Replies with a positive or missing error code are refused. */
	CHECK(gcr_proto_parse_reply("{\"v\":1,\"ok\":false,\"error\":{\"code\":5,\"message\":\"x\"}}", &rep, &err) < 0);
	gcr_reply_clear(&rep);
	CHECK(gcr_proto_parse_reply("{\"v\":1,\"ok\":false}", &rep, &err) < 0);
	gcr_reply_clear(&rep);
	CHECK(gcr_proto_parse_reply("{\"v\":1,\"ok\":1}", &rep, &err) < 0);
	gcr_reply_clear(&rep);
}

/* 1 if s is valid UTF-8 (the check jansson makes, written independently). */
static int valid_utf8(const char *s)
{
	json_t *j = json_string(s);
	json_decref(j);
	return j != NULL;
}

/* The error reply for msg encodes, parses back, and its message is valid UTF-8. */
static int reply_encodes(const char *msg, char *back, size_t cap)
{
	char *line = gcr_proto_reply_err_line(7, -EIO, msg);
	if (line == NULL)
		return 0;
	struct gcr_reply rep;
	struct gcr_err err = { 0 };
	int ok = gcr_proto_parse_reply(line, &rep, &err) == 0 && !rep.ok && rep.id == 7 && valid_utf8(rep.message);
	snprintf(back, cap, "%s", rep.message);
	gcr_reply_clear(&rep);
	free(line);
	return ok;
}

/* An error message cut inside a UTF-8 character, or holding bytes that are not UTF-8 (a
 * driver's string), still makes a reply: the cut drops the partial character, bad bytes
 * become '?'. Before the fix the first gave a NULL reply line and the client no answer. */
static void test_utf8(void)
{
	char pad[GCR_ERR_MSG_MAX];
	char back[GCR_ERR_MSG_MAX];
	/* "€" is 3 bytes; with k bytes of padding before it the 255-byte cut lands inside it. */
	for (size_t k = GCR_ERR_MSG_MAX - 4; k <= GCR_ERR_MSG_MAX - 1; k++) {
		memset(pad, 'a', k);
		pad[k] = '\0';
		struct gcr_err err = { 0 };
		gcr_err_set(&err, -EIO, "%s\xe2\x82\xac and more", pad);
		CHECK(valid_utf8(err.msg));
		CHECK(strlen(err.msg) >= k && strlen(err.msg) <= GCR_ERR_MSG_MAX - 1);
		CHECK(reply_encodes(err.msg, back, sizeof(back)));
		/* The same cut made by the wrapper's prefixing. */
		gcr_err_set(&err, -EIO, "%s", "\xf0\x9f\x98\x80 the GPU said no");
		gcr_err_wrap(&err, "%.*s\xe2\x82\xac", (int)(k - 2), pad);
		CHECK(valid_utf8(err.msg));
		CHECK(reply_encodes(err.msg, back, sizeof(back)));
	}
	/* The encoder itself cleans what it is given: a raw cut sequence and stray bytes. */
	CHECK(reply_encodes("driver says \xff\xfe ok \xc3", back, sizeof(back)));
	CHECK_STR(back, "driver says ?? ok ");
	CHECK(reply_encodes("caf\xc3\xa9 \xed\xa0\x80 \xf0\x9f\x98\x80", back, sizeof(back)));
	CHECK_STR(back, "caf\xc3\xa9 ??? \xf0\x9f\x98\x80"); /* a surrogate is not UTF-8 */
	char s[] = "ok \xe2\x82";
	CHECK(gcr_err_utf8_clean(s) == 3 && strcmp(s, "ok ") == 0);
	char t[] = "\xc0\xaf overlong";
	gcr_err_utf8_clean(t);
	CHECK_STR(t, "?? overlong");
}

/* The restore_need op: its name on the wire, its args as the shim checks them (the bounds
 * themselves: test_shimreply, which reads the status through the same parser). */
static void test_restore_need(void)
{
	struct gcr_req req;
	struct gcr_need need;
	struct gcr_err err = { 0 };
	CHECK(parse_req("{\"v\":1,\"id\":4,\"op\":\"restore_need\",\"args\":{\"devices\":[{\"uuid\":\"GPU-a\","
			"\"bytes\":7}]}}", &req) == 0 && req.op == GCR_OP_RESTORE_NEED_ID);
	CHECK(gcr_proto_need_parse(req.args, &need, &err) == 0 && need.n == 1 && need.dev[0].bytes == 7);
	CHECK_STR(need.dev[0].uuid, "GPU-a");
	CHECK_STR(gcr_op_name(GCR_OP_RESTORE_NEED_ID), "restore_need");
	gcr_req_clear(&req);
	/* The args are the need itself: the old trim's nesting is not one. */
	CHECK(parse_req("{\"v\":1,\"op\":\"restore_need\",\"args\":{\"restore_need\":{\"devices\":[]}}}", &req) == 0);
	CHECK(gcr_proto_need_parse(req.args, &need, &err) == -EBADMSG && need.n == 0 && strstr(err.msg, "devices") != NULL);
	gcr_req_clear(&req);
	CHECK(gcr_proto_need_parse(NULL, &need, &err) == -EBADMSG && need.n == 0);
}

int main(void)
{
	test_requests();
	test_round_trip();
	test_utf8();
	test_restore_need();
	return test_summary("test_proto");
}
