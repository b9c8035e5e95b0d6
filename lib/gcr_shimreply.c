/* gcr_shimreply: checked reads of the shim's reply fields. A reply comes from inside the
 * workload, so a wrong type, a negative or huge count, or control bytes in a string are
 * refused here rather than reaching an NVML call, a log line or an overflowing sum. */
#include "gcr_shimreply.h"

#include <errno.h>
#include <string.h>

#include "gcr/protocol.h"
#include "gcr_groupmsg.h"

/* A string made only of printable ASCII without spaces, 1 .. cap - 1 bytes: what the shim
 * sends for states and NVML for UUIDs. Such a string may go into log lines and messages. */
static int word_ok(const char *s, size_t len, size_t cap)
{
	if (s == NULL || len == 0 || len >= cap || strlen(s) != len) /* strlen: no embedded NUL */
		return 0;
	for (size_t i = 0; i < len; i++)
		if (s[i] <= ' ' || s[i] > '~')
			return 0;
	return 1;
}

/* An integer member in 0 .. max - 1; -ENOENT when absent. */
static int count_of(json_t *obj, const char *key, long long max, long long *out, struct gcr_err *err)
{
	json_t *v = json_object_get(obj, key);
	*out = 0;
	if (v == NULL)
		return -ENOENT;
	if (!json_is_integer(v))
		return gcr_err_set(err, -EPROTO, "shim reply: \"%s\" is not an integer", key);
	json_int_t n = json_integer_value(v);
	if (n < 0 || n >= max)
		return gcr_err_set(err, -EPROTO, "shim reply: \"%s\" %lld out of range (0 .. %lld)", key,
				   (long long)n, max - 1);
	*out = (long long)n;
	return 0;
}

static const char *const st_names[GCR_SHIMREPLY_ST_N] = {
	GCR_STATE_RUNNING, GCR_STATE_SUSPENDING, GCR_STATE_SUSPENDED, GCR_STATE_RESUMING,  GCR_STATE_FROZEN,
	GCR_STATE_DRAINED, GCR_STATE_DETACHED,   GCR_STATE_REBUILDING, GCR_STATE_REBUILT, "unknown"
};

const char *gcr_shimreply_st_name(enum gcr_shimreply_st s)
{
	return (unsigned)s < GCR_SHIMREPLY_ST_N ? st_names[s] : st_names[GCR_SHIMREPLY_ST_UNKNOWN];
}

enum gcr_shimreply_st gcr_shimreply_st_of(const char *name)
{
	for (int i = 0; name != NULL && i < GCR_SHIMREPLY_ST_UNKNOWN; i++)
		if (strcmp(name, st_names[i]) == 0)
			return (enum gcr_shimreply_st)i;
	return GCR_SHIMREPLY_ST_UNKNOWN;
}

int gcr_shimreply_state(json_t *reply, const char **state, struct gcr_err *err)
{
	*state = NULL;
	json_t *v = json_object_get(reply, "state");
	if (v == NULL)
		return gcr_err_set(err, -ENOENT, "shim reply has no \"state\"");
	if (!json_is_string(v) || !word_ok(json_string_value(v), json_string_length(v), GCR_SHIMREPLY_STATE_LEN))
		return gcr_err_set(err, -EPROTO, "shim reply: \"state\" is not a state name");
	*state = json_string_value(v);
	return 0;
}

int gcr_shimreply_is_hip(json_t *status, int *hip, struct gcr_err *err)
{
	*hip = 0;
	json_t *b = json_object_get(status, "backends");
	if (b == NULL)
		return 0;
	if (!json_is_object(b))
		return gcr_err_set(err, -EPROTO, "shim status: \"backends\" is not an object");
	json_t *h = json_object_get(b, "hip"), *c = json_object_get(b, "cuda");
	if ((h != NULL && !json_is_boolean(h)) || (c != NULL && !json_is_boolean(c)))
		return gcr_err_set(err, -EPROTO, "shim status: \"backends\" members must be true or false");
	*hip = json_is_true(h) && !json_is_true(c);
	return 0;
}

int gcr_shimreply_data(json_t *status, enum gcr_shimreply_data *data, struct gcr_err *err)
{
	/* In enum order. */
	static const char *const names[] = { GCR_DATA_HOST, GCR_DATA_WRITTEN, GCR_DATA_FILES, GCR_DATA_GPU };
	*data = GCR_SHIMREPLY_DATA_HOST;
	json_t *v = json_object_get(status, "data");
	if (v == NULL)
		return gcr_err_set(err, -ENOENT, "shim status has no \"data\"");
	for (size_t i = 0; json_is_string(v) && i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(json_string_value(v), names[i]) == 0) {
			*data = (enum gcr_shimreply_data)i;
			return 0;
		}
	return gcr_err_set(err, -EPROTO, "shim status: \"data\" is not \"host\", \"written\", \"files\" or \"gpu\"");
}

int gcr_shimreply_wake(json_t *status, int *called, long long *waited_ms, struct gcr_err *err)
{
	*called = 0;
	*waited_ms = 0;
	json_t *w = json_object_get(status, "wake");
	if (w == NULL)
		return gcr_err_set(err, -ENOENT, "shim status has no \"wake\"");
	const char *st = json_string_value(json_object_get(w, "state"));
	long long ms;
	if (!json_is_object(w) || st == NULL || (strcmp(st, "armed") != 0 && strcmp(st, "called") != 0))
		return gcr_err_set(err, -EPROTO, "shim status: \"wake\" needs a state \"armed\" or \"called\"");
	int rc = count_of(w, "waited_ms", GCR_SHIMREPLY_BYTES_MAX, &ms, err);
	if (rc < 0)
		return rc == -ENOENT ? gcr_err_set(err, -EPROTO, "shim status: \"wake\" without \"waited_ms\"") : rc;
	*called = strcmp(st, "called") == 0;
	*waited_ms = *called ? ms : 0;
	return 0;
}

int gcr_shimreply_bytes(json_t *report, long long *total, long long *moved, struct gcr_err *err)
{
	*total = *moved = 0;
	long long t, m;
	int rc = count_of(report, "bytes", GCR_SHIMREPLY_BYTES_MAX, &t, err);
	if (rc == -ENOENT)
		return gcr_err_set(err, -ENOENT, "shim report has no \"bytes\"");
	if (rc < 0)
		return rc;
	rc = count_of(report, "copied", GCR_SHIMREPLY_BYTES_MAX, &m, err);
	if (rc == -ENOENT)
		m = t;
	else if (rc < 0)
		return rc;
	*total = t;
	*moved = m;
	return 0;
}

int gcr_shimreply_sizes(json_t *status, long long *fast, long long *driver, struct gcr_err *err)
{
	/* "pool": the shim's stream-ordered arena (issue 19), moved like "vmm"; absent in older shims. */
	static const char *const keys[5] = { "vmm", "app_vmm", "pool", "driver", "async" };
	long long v[5] = { 0 };
	*fast = *driver = 0;
	json_t *b = json_object_get(status, "bytes");
	if (b == NULL)
		return gcr_err_set(err, -ENOENT, "shim status has no \"bytes\"");
	if (!json_is_object(b))
		return gcr_err_set(err, -EPROTO, "shim status: \"bytes\" is not an object");
	for (int i = 0; i < 5; i++) {
		int rc = count_of(b, keys[i], GCR_SHIMREPLY_BYTES_MAX, &v[i], err);
		if (rc == -ENOENT)
			v[i] = 0;
		else if (rc < 0)
			return rc;
	}
	*fast = v[0] + v[1] + v[2];
	*driver = v[3] + v[4];
	return 0;
}

int gcr_shimreply_restore_need(json_t *status, struct gcr_need *need, struct gcr_err *err)
{
	need->n = 0;
	json_t *rn = json_object_get(status, "restore_need");
	if (rn == NULL)
		return gcr_err_set(err, -ENOENT, "shim status has no \"restore_need\"");
	struct gcr_err e;
	if (gcr_proto_need_parse(rn, need, &e) < 0)
		return gcr_err_set(err, -EPROTO, "shim status: \"restore_need\": %s", e.msg);
	return 0;
}

int gcr_shimreply_calls(json_t *stats, long long *sum, struct gcr_err *err)
{
	*sum = 0;
	json_t *calls = json_object_get(stats, "calls"), *v;
	const char *k;
	long long s = 0;
	if (!json_is_object(calls) || json_object_size(calls) > GCR_SHIMREPLY_MAX_CALLS)
		return gcr_err_set(err, -EPROTO, "shim stats: \"calls\" is not a map of at most %d counters",
				   GCR_SHIMREPLY_MAX_CALLS);
	json_object_foreach(calls, k, v) {
		json_int_t n = json_is_integer(v) ? json_integer_value(v) : -1;
		if (n < 0 || n >= GCR_SHIMREPLY_CALLS_MAX)
			return gcr_err_set(err, -EPROTO, "shim stats: a \"calls\" counter is not an integer in 0 .. 2^50");
		s += n; /* at most 4096 terms below 2^50: below 2^62 */
	}
	*sum = s;
	return 0;
}

int gcr_shimreply_comms(json_t *reply, struct gcr_group_comms *out, struct gcr_err *err)
{
	out->n = 0;
	json_t *c = json_object_get(reply, "comms");
	if (c == NULL)
		return gcr_err_set(err, -ENOENT, "shim reply has no \"comms\"");
	struct gcr_err e;
	if (gcr_groupmsg_comms(c, out, &e) < 0)
		return gcr_err_set(err, -EPROTO, "shim reply: %s", e.msg);
	return 0;
}
