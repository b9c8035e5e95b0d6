/* Unit tests for gcr_shimreply: real shim replies read as before, and each kind of
 * malformed field refused with -EPROTO (absent ones with -ENOENT) and nothing read. */
#include "gcr_shimreply.h"

#include <errno.h>

#include "util.h"

static json_t *parse(const char *s)
{
	json_t *j = json_loads(s, 0, NULL);
	CHECK(j != NULL);
	return j;
}

static void test_state(void)
{
	struct gcr_err err;
	const char *st;
	json_t *j = parse("{\"state\": \"suspended\"}");
	CHECK(gcr_shimreply_state(j, &st, &err) == 0);
	CHECK_STR(st, "suspended");
	json_decref(j);
	CHECK(gcr_shimreply_state(NULL, &st, &err) == -ENOENT && st == NULL);
	static const char *const bad[] = { "{\"state\": 1}", "{\"state\": \"\"}", "{\"state\": \"run\\nning\"}",
					   "{\"state\": \"a b\"}", "{\"state\": \"run\\u0000x\"}",
					   "{\"state\": \"0123456789012345678901234567890123\"}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = json_loads(bad[i], JSON_ALLOW_NUL, NULL);
		CHECK(gcr_shimreply_state(j, &st, &err) == -EPROTO && st == NULL && err.code == -EPROTO);
		json_decref(j);
	}
}

static void test_is_hip(void)
{
	struct gcr_err err;
	int hip = -1;
	json_t *j = parse("{\"backends\": {\"cuda\": false, \"hip\": true}}");
	CHECK(gcr_shimreply_is_hip(j, &hip, &err) == 0 && hip == 1);
	json_decref(j);
	j = parse("{\"backends\": {\"cuda\": true, \"hip\": true}}");
	CHECK(gcr_shimreply_is_hip(j, &hip, &err) == 0 && hip == 0);
	json_decref(j);
	j = parse("{\"state\": \"running\"}"); /* an older shim: CUDA */
	CHECK(gcr_shimreply_is_hip(j, &hip, &err) == 0 && hip == 0);
	json_decref(j);
	j = parse("{\"backends\": {\"hip\": 1}}");
	CHECK(gcr_shimreply_is_hip(j, &hip, &err) == -EPROTO && hip == 0);
	json_decref(j);
	j = parse("{\"backends\": [true]}");
	CHECK(gcr_shimreply_is_hip(j, &hip, &err) == -EPROTO && hip == 0);
	json_decref(j);
}

static void test_bytes(void)
{
	struct gcr_err err;
	long long t, m;
	json_t *j = parse("{\"bytes\": 1073741824, \"copied\": 805306368}");
	CHECK(gcr_shimreply_bytes(j, &t, &m, &err) == 0 && t == 1073741824 && m == 805306368);
	json_decref(j);
	j = parse("{\"bytes\": 4096}"); /* no "copied": all of it moved */
	CHECK(gcr_shimreply_bytes(j, &t, &m, &err) == 0 && t == 4096 && m == 4096);
	json_decref(j);
	j = parse("{}");
	CHECK(gcr_shimreply_bytes(j, &t, &m, &err) == -ENOENT && t == 0 && m == 0);
	json_decref(j);
	static const char *const bad[] = { "{\"bytes\": -1}", "{\"bytes\": 1125899906842624}",
					   "{\"bytes\": \"5\"}", "{\"bytes\": 5, \"copied\": -2}",
					   "{\"bytes\": 5, \"copied\": 1.0}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = parse(bad[i]);
		CHECK(gcr_shimreply_bytes(j, &t, &m, &err) == -EPROTO && t == 0 && m == 0);
		json_decref(j);
	}
}

static void test_sizes(void)
{
	struct gcr_err err;
	long long f, d;
	json_t *j = parse("{\"bytes\": {\"vmm\": 3, \"app_vmm\": 4, \"driver\": 5, \"async\": 6, \"managed\": 7}}");
	CHECK(gcr_shimreply_sizes(j, &f, &d, &err) == 0 && f == 7 && d == 11);
	json_decref(j);
	j = parse("{\"bytes\": {\"vmm\": 3, \"driver\": 5}}");
	CHECK(gcr_shimreply_sizes(j, &f, &d, &err) == 0 && f == 3 && d == 5);
	json_decref(j);
	j = parse("{\"bytes\": {\"vmm\": 3, \"async\": -5}}");
	CHECK(gcr_shimreply_sizes(j, &f, &d, &err) == -EPROTO && f == 0 && d == 0);
	json_decref(j);
	j = parse("{\"bytes\": 12}");
	CHECK(gcr_shimreply_sizes(j, &f, &d, &err) == -EPROTO);
	json_decref(j);
}

static void test_restore_need(void)
{
	struct gcr_err err;
	struct gcr_need need;
	json_t *j = parse("{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-5b1c0e2a\", \"bytes\": 1612709888},"
			  " {\"uuid\": \"GPU-0a9e7c55\", \"bytes\": 0}]}}");
	CHECK(gcr_shimreply_restore_need(j, &need, &err) == 0 && need.n == 2);
	CHECK_STR(need.dev[0].uuid, "GPU-5b1c0e2a");
	CHECK(need.dev[0].bytes == 1612709888 && need.dev[1].bytes == 0);
	json_decref(j);
	j = parse("{\"state\": \"suspended\"}");
	CHECK(gcr_shimreply_restore_need(j, &need, &err) == -ENOENT && need.n == 0);
	json_decref(j);
	static const char *const bad[] = {
		"{\"restore_need\": {\"devices\": []}}",
		"{\"restore_need\": {\"devices\": {}}}",
		"{\"restore_need\": []}",
		"{\"restore_need\": {\"devices\": [{\"bytes\": 1}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-1\"}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-1\", \"bytes\": -1}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU 1\", \"bytes\": 1}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": 7, \"bytes\": 1}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-1\", \"bytes\": 1125899906842624}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-1\", \"bytes\": 1.5}]}}",
		"{\"restore_need\": {\"devices\": [{\"uuid\": \"GPU-1\", \"bytes\": 1}, {\"uuid\": \"GPU-1\", \"bytes\": 2}]}}",
		"{\"restore_need\": {\"devices\": [\"GPU-1\"]}}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = parse(bad[i]);
		CHECK(gcr_shimreply_restore_need(j, &need, &err) == -EPROTO && need.n == 0);
		json_decref(j);
	}
	/* A NUL inside a UUID (jansson keeps it when told to). */
	j = json_pack("{s:{s:[{s:o, s:i}]}}", "restore_need", "devices", "uuid", json_stringn("GPU\0-1", 6), "bytes", 1);
	CHECK(j != NULL && gcr_shimreply_restore_need(j, &need, &err) == -EPROTO && need.n == 0);
	json_decref(j);
	/* One more device than the record may hold. */
	json_t *devs = json_array();
	for (int i = 0; i <= GCR_NEED_MAX_DEVICES; i++) {
		char u[16];
		snprintf(u, sizeof(u), "GPU-%d", i);
		json_array_append_new(devs, json_pack("{s:s, s:i}", "uuid", u, "bytes", 1));
	}
	j = json_pack("{s:{s:O}}", "restore_need", "devices", devs);
	CHECK(gcr_shimreply_restore_need(j, &need, &err) == -EPROTO && need.n == 0);
	json_decref(j);
	/* As many as it may hold, the longest UUID: read, and written back the same. */
	json_array_remove(devs, GCR_NEED_MAX_DEVICES);
	char longest[GCR_NEED_UUID_MAX];
	memset(longest, 'u', sizeof(longest) - 1);
	longest[sizeof(longest) - 1] = '\0';
	json_array_set_new(devs, 0, json_pack("{s:s, s:I}", "uuid", longest, "bytes", (json_int_t)GCR_NEED_MAX_BYTES - 1));
	j = json_pack("{s:{s:O}}", "restore_need", "devices", devs);
	CHECK(gcr_shimreply_restore_need(j, &need, &err) == 0 && need.n == GCR_NEED_MAX_DEVICES);
	CHECK_STR(need.dev[0].uuid, longest);
	json_t *back = gcr_proto_need_json(&need);
	CHECK(back != NULL && json_equal(back, json_object_get(j, "restore_need")));
	json_decref(back);
	json_decref(j);
	/* One GPU twice: which of its numbers would the check believe? */
	json_array_set_new(devs, 1, json_pack("{s:s, s:i}", "uuid", longest, "bytes", 1));
	j = json_pack("{s:{s:O}}", "restore_need", "devices", devs);
	CHECK(gcr_shimreply_restore_need(j, &need, &err) == -EPROTO && strstr(err.msg, "twice") != NULL);
	json_decref(j);
	json_decref(devs);
}

static void test_calls(void)
{
	struct gcr_err err;
	long long sum = -1;
	json_t *j = parse("{\"calls\": {\"cuLaunchKernel\": 120034, \"cuMemAlloc_v2\": 12, \"x\": 0}}");
	CHECK(gcr_shimreply_calls(j, &sum, &err) == 0 && sum == 120046);
	json_decref(j);
	j = parse("{\"calls\": {}}");
	CHECK(gcr_shimreply_calls(j, &sum, &err) == 0 && sum == 0);
	json_decref(j);
	static const char *const bad[] = { "{}", "{\"calls\": []}", "{\"calls\": {\"a\": -1}}",
					   "{\"calls\": {\"a\": \"1\"}}", "{\"calls\": {\"a\": 1125899906842624}}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = parse(bad[i]);
		CHECK(gcr_shimreply_calls(j, &sum, &err) == -EPROTO && sum == 0);
		json_decref(j);
	}
	/* The largest map allowed, every counter at its bound: the sum does not overflow. */
	json_t *calls = json_object();
	for (int i = 0; i < GCR_SHIMREPLY_MAX_CALLS; i++) {
		char k[16];
		snprintf(k, sizeof(k), "h%d", i);
		json_object_set_new(calls, k, json_integer(GCR_SHIMREPLY_CALLS_MAX - 1));
	}
	j = json_pack("{s:O}", "calls", calls);
	CHECK(gcr_shimreply_calls(j, &sum, &err) == 0 && sum == GCR_SHIMREPLY_MAX_CALLS * (GCR_SHIMREPLY_CALLS_MAX - 1));
	json_decref(j);
	json_object_set_new(calls, "one_more", json_integer(1));
	j = json_pack("{s:O}", "calls", calls);
	CHECK(gcr_shimreply_calls(j, &sum, &err) == -EPROTO && sum == 0);
	json_decref(j);
	json_decref(calls);
}

/* A status's "data" and "wake" (protocol.h): what an agent's recovery acts on. */
static void test_data_wake(void)
{
	struct gcr_err err;
	enum gcr_shimreply_data d = GCR_SHIMREPLY_DATA_FILES;
	int called = -1;
	long long ms = -1;
	json_t *j = parse("{\"data\": \"written\", \"wake\": {\"state\": \"called\", \"waited_ms\": 1500}}");
	CHECK(gcr_shimreply_data(j, &d, &err) == 0 && d == GCR_SHIMREPLY_DATA_WRITTEN);
	CHECK(gcr_shimreply_wake(j, &called, &ms, &err) == 0 && called == 1 && ms == 1500);
	json_decref(j);
	j = parse("{\"data\": \"files\", \"wake\": {\"state\": \"armed\", \"waited_ms\": 0}}");
	CHECK(gcr_shimreply_data(j, &d, &err) == 0 && d == GCR_SHIMREPLY_DATA_FILES);
	CHECK(gcr_shimreply_wake(j, &called, &ms, &err) == 0 && called == 0 && ms == 0);
	json_decref(j);
	j = parse("{\"data\": \"gpu\"}");
	CHECK(gcr_shimreply_data(j, &d, &err) == 0 && d == GCR_SHIMREPLY_DATA_GPU);
	json_decref(j);
	j = parse("{}");
	CHECK(gcr_shimreply_data(j, &d, &err) == -ENOENT && d == GCR_SHIMREPLY_DATA_HOST);
	CHECK(gcr_shimreply_wake(j, &called, &ms, &err) == -ENOENT && called == 0 && ms == 0);
	json_decref(j);
	static const char *const bad[] = { "{\"data\": 1, \"wake\": []}", "{\"data\": \"disk\", \"wake\": {}}",
					   "{\"data\": \"\", \"wake\": {\"state\": \"called\"}}",
					   "{\"data\": null, \"wake\": {\"state\": \"soon\", \"waited_ms\": 1}}",
					   "{\"data\": [], \"wake\": {\"state\": \"called\", \"waited_ms\": -3}}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = parse(bad[i]);
		CHECK(gcr_shimreply_data(j, &d, &err) == -EPROTO && d == GCR_SHIMREPLY_DATA_HOST);
		CHECK(gcr_shimreply_wake(j, &called, &ms, &err) == -EPROTO && called == 0 && ms == 0);
		json_decref(j);
	}
}

int main(void)
{
	test_data_wake();
	test_state();
	test_is_hip();
	test_bytes();
	test_sizes();
	test_restore_need();
	test_calls();
	return test_summary("test_shimreply");
}
