/* fuzz_proto: the control protocol's request and reply parsers on arbitrary
 * lines; a parse either fails with a message or yields fields within bounds. */
#include "gcr_proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
