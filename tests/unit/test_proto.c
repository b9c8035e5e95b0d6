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

int main(void)
{
	test_requests();
	test_round_trip();
	return test_summary("test_proto");
}
