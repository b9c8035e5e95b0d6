/* fuzz_proto: the control protocol's request and reply parsers on arbitrary
 * lines, and the restore_need op's args parser on every request's args; a parse either fails
 * with a message or yields fields within bounds. */
#include "gcr_proto.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the shim keeps and reports of a restore_need request: 1 .. GCR_NEED_MAX_DEVICES GPUs,
 * printable UUIDs without spaces, bytes in range, no UUID twice; and what it writes back
 * parses the same. */
static void check_need(json_t *args)
{
	static struct gcr_need need, again;
	struct gcr_err err = { 0, "" };
	memset(&need, 0xa5, sizeof(need));
	int rc = gcr_proto_need_parse(args, &need, &err);
	if (rc < 0) {
		if (rc != -EBADMSG || err.code != rc || err.msg[0] == '\0' || need.n != 0)
			abort();
		return;
	}
	if (need.n == 0 || need.n > GCR_NEED_MAX_DEVICES)
		abort();
	for (size_t i = 0; i < need.n; i++) {
		size_t len = strnlen(need.dev[i].uuid, GCR_NEED_UUID_MAX);
		if (len == 0 || len >= GCR_NEED_UUID_MAX || need.dev[i].bytes < 0 || need.dev[i].bytes >= GCR_NEED_MAX_BYTES)
			abort();
		for (size_t k = 0; k < len; k++)
			if (need.dev[i].uuid[k] <= ' ' || need.dev[i].uuid[k] > '~')
				abort();
		for (size_t k = 0; k < i; k++)
			if (strcmp(need.dev[k].uuid, need.dev[i].uuid) == 0)
				abort();
	}
	json_t *back = gcr_proto_need_json(&need);
	if (back != NULL && (gcr_proto_need_parse(back, &again, &err) != 0 || again.n != need.n))
		abort();
	for (size_t i = 0; back != NULL && i < need.n; i++)
		if (strcmp(again.dev[i].uuid, need.dev[i].uuid) != 0 || again.dev[i].bytes != need.dev[i].bytes)
			abort();
	json_decref(back);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *line = malloc(size + 1);
	if (line == NULL)
		return 0;
	memcpy(line, data, size);
	line[size] = '\0';
	struct gcr_err err = { 0, "" };
	struct gcr_req req;
	int rc = gcr_proto_parse_request(line, &req, &err);
	if (rc == 0) {
		if (req.op == GCR_OP_NONE || req.id < 0 || !json_is_object(req.args))
			abort();
		check_need(req.args);
	} else if (err.code != rc || err.msg[0] == '\0') {
		abort();
	}
	gcr_req_clear(&req);
	struct gcr_reply rep;
	rc = gcr_proto_parse_reply(line, &rep, &err);
	if (rc == 0 && ((rep.ok && !json_is_object(rep.result)) || (!rep.ok && rep.code >= 0)))
		abort();
	gcr_reply_clear(&rep);
	free(line);
	return 0;
}
