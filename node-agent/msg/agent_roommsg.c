/* agent_roommsg: the overcommit policy's parsers of outside input: the shim's "room" request
 * and the process's environment. Every field checked; nothing else in the line is believed. */
#include "agent_roommsg.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "gcr/protocol.h"
#include "gcr_proto.h"

int agent_roommsg_parse(const char *line, size_t len, struct agent_roommsg_room *room, struct gcr_err *err)
{
	memset(room, 0, sizeof(*room));
	if (len >= GCR_PROTO_MAX_LINE)
		return gcr_err_set(err, -EMSGSIZE, "line of %zu bytes exceeds %d", len, GCR_PROTO_MAX_LINE);
	if (memchr(line, '\0', len) != NULL)
		return gcr_err_set(err, -EBADMSG, "a NUL byte in the line");
	char *copy = malloc(len + 1);
	if (copy == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	memcpy(copy, line, len);
	copy[len] = '\0';
	struct gcr_req req;
	int rc = gcr_proto_parse_request(copy, &req, err);
	free(copy);
	if (rc < 0)
		return rc;
	room->id = req.id;
	room->device = -1;
	if (req.op == GCR_OP_WAKE_ID) {
		json_t *w = json_object_get(req.args, "waited_ms");
		if (!json_is_integer(w) || json_integer_value(w) < 0 || json_integer_value(w) > GCR_WAKE_MAX_WAITED_MS)
			rc = gcr_err_set(err, -EBADMSG, "\"waited_ms\" must be an integer in 0..%lld",
					 (long long)GCR_WAKE_MAX_WAITED_MS);
		else {
			room->waited_ms = (long long)json_integer_value(w);
			rc = AGENT_ROOMMSG_WAKE;
		}
		gcr_req_clear(&req);
		return rc;
	}
	if (req.op != GCR_OP_ROOM_ID) {
		gcr_req_clear(&req);
		return AGENT_ROOMMSG_OTHER;
	}
	json_t *b = json_object_get(req.args, "bytes"), *d = json_object_get(req.args, "device");
	if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > GCR_ROOM_MAX_BYTES)
		rc = gcr_err_set(err, -EBADMSG, "\"bytes\" must be an integer in 1..%lld", (long long)GCR_ROOM_MAX_BYTES);
	else if (d != NULL && (!json_is_integer(d) || json_integer_value(d) < -1 ||
			       json_integer_value(d) > GCR_ROOM_MAX_DEVICE))
		rc = gcr_err_set(err, -EBADMSG, "\"device\" must be an integer in -1..%d", GCR_ROOM_MAX_DEVICE);
	else {
		room->bytes = (unsigned long long)json_integer_value(b);
		room->device = d != NULL ? (int)json_integer_value(d) : -1;
		rc = AGENT_ROOMMSG_ROOM;
	}
	gcr_req_clear(&req);
	return rc;
}

/* A decimal int with an optional sign and nothing else; -EINVAL otherwise. */
static int parse_int(const char *v, size_t n, int *out)
{
	char buf[16];
	if (n == 0 || n >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, v, n);
	buf[n] = '\0';
	char *end;
	errno = 0;
	long x = strtol(buf, &end, 10);
	if (errno != 0 || *end != '\0' || x < INT_MIN || x > INT_MAX || buf[0] == ' ' || buf[0] == '\t' ||
	    buf[0] == '\n' || buf[0] == '+')
		return -EINVAL;
	*out = (int)x;
	return 0;
}

static int value_is(const char *v, size_t n, const char *word)
{
	return strlen(word) == n && memcmp(v, word, n) == 0;
}

void agent_roommsg_environ(const char *buf, size_t len, struct agent_roommsg_env *out)
{
	*out = (struct agent_roommsg_env){ .overcommit = 0, .priority = 0, .preemptible = 1, .bad = 0 };
	size_t i = 0;
	while (i < len) {
		const char *e = buf + i;
		const char *nul = memchr(e, '\0', len - i);
		size_t n = nul != NULL ? (size_t)(nul - e) : len - i;
		i += n + 1;
		const char *eq = memchr(e, '=', n);
		if (eq == NULL)
			continue;
		size_t kn = (size_t)(eq - e), vn = n - kn - 1;
		const char *v = eq + 1;
		if (kn == strlen(GCR_OVERCOMMIT_ENV) && memcmp(e, GCR_OVERCOMMIT_ENV, kn) == 0) {
			if (value_is(v, vn, "1"))
				out->overcommit = 1;
			else if (value_is(v, vn, "0") || vn == 0)
				out->overcommit = 0;
			else
				out->bad = 1;
		} else if (kn == strlen(GCR_PRIORITY_ENV) && memcmp(e, GCR_PRIORITY_ENV, kn) == 0) {
			int p;
			if (parse_int(v, vn, &p) == 0)
				out->priority = p;
			else
				out->bad = 1;
		} else if (kn == strlen(GCR_PREEMPTIBLE_ENV) && memcmp(e, GCR_PREEMPTIBLE_ENV, kn) == 0) {
			if (value_is(v, vn, "0") || value_is(v, vn, "false"))
				out->preemptible = 0;
			else if (value_is(v, vn, "1") || value_is(v, vn, "true"))
				out->preemptible = 1;
			else
				out->bad = 1;
		}
	}
}
