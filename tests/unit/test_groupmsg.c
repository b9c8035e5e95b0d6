/* test_groupmsg: the group operations' lists (lib/gcr_groupmsg): every encoder's output decodes to
 * what was encoded; every decoder refuses, naming the field, a wrong type, a range broken, a key
 * or id malformed, a key given twice, a list too long, and leaves nothing decoded. */
#include <errno.h>
#include <jansson.h>
#include <string.h>

#include "gcr_groupmsg.h"
#include "util.h"

static json_t *parse(const char *s)
{
	json_error_t e;
	return json_loads(s, 0, &e);
}

static void test_keys_text(void)
{
	char buf[GCR_GROUP_KEY_LEN];
	uint64_t k = 0;
	gcr_groupmsg_key_fmt(0x0123456789abcdefull, buf);
	CHECK_STR(buf, "0123456789abcdef");
	CHECK(gcr_groupmsg_key_parse(buf, strlen(buf), &k) == 0 && k == 0x0123456789abcdefull);
	CHECK(gcr_groupmsg_key_parse("0000000000000000", 16, &k) == -EINVAL && k == 0); /* 0 names nothing */
	CHECK(gcr_groupmsg_key_parse("0123456789ABCDEF", 16, &k) == -EINVAL);          /* lowercase only */
	CHECK(gcr_groupmsg_key_parse("0123456789abcde", 15, &k) == -EINVAL);
	CHECK(gcr_groupmsg_key_parse("0123456789abcdef0", 17, &k) == -EINVAL);
	CHECK(gcr_groupmsg_key_parse("0123456789abcdeg", 16, &k) == -EINVAL);
	CHECK(gcr_groupmsg_key_parse(NULL, 16, &k) == -EINVAL);
	CHECK_STR(gcr_groupmsg_state_name(GCR_GROUP_COMM_FAILED), "failed");
	CHECK_STR(gcr_groupmsg_how_name(GCR_GROUP_HOW_LOCAL), "local");
	CHECK_STR(gcr_groupmsg_state_name((enum gcr_group_comm_state)9), "unknown");
}

static void test_comms(void)
{
	static struct gcr_group_comms in, out;
	struct gcr_err err;
	in.n = 3;
	in.c[0] = (struct gcr_group_comm){ .key = 11, .count = 5, .rank = 1, .nranks = 2, .device = 1,
					   .state = GCR_GROUP_COMM_LIVE, .how = GCR_GROUP_HOW_INIT };
	in.c[1] = (struct gcr_group_comm){ .key = 12, .parent = 11, .count = GCR_GROUP_COUNT_MAX - 1, .rank = 0,
					   .nranks = 1, .device = -1, .state = GCR_GROUP_COMM_DOWN,
					   .how = GCR_GROUP_HOW_SPLIT };
	/* One process holding two ranks of one communicator (ncclCommInitAll). */
	in.c[2] = (struct gcr_group_comm){ .key = 11, .count = 5, .rank = 0, .nranks = 2, .device = 0,
					   .state = GCR_GROUP_COMM_FAILED, .how = GCR_GROUP_HOW_INIT };
	json_t *j = gcr_groupmsg_comms_json(&in);
	CHECK(j != NULL && gcr_groupmsg_comms(j, &out, &err) == 0 && out.n == 3 &&
	      memcmp(&in.c, &out.c, 3 * sizeof(in.c[0])) == 0);
	json_decref(j);

	static const char *const bad[] = {
		"{}",                                                                       /* not an array */
		"[1]",                                                                      /* not an object */
		"[{\"key\":\"000000000000000b\",\"rank\":2,\"nranks\":2,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":0,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":65537,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":-1,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":1125899906842624,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":64,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"lively\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"grow\"}]",
		"[{\"key\":\"000000000000000B\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":\"0\",\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		/* a split without its parent; a parent on an init */
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"split\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":1,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\",\"parent\":\"000000000000000c\"}]",
		/* the same key and rank twice; one key with two sizes */
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":2,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"},"
		"{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":2,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
		"[{\"key\":\"000000000000000b\",\"rank\":0,\"nranks\":2,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"},"
		"{\"key\":\"000000000000000b\",\"rank\":1,\"nranks\":3,\"count\":0,\"device\":0,\"state\":\"live\",\"how\":\"init\"}]",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		json_t *b = parse(bad[i]);
		out.n = 7;
		err.msg[0] = '\0';
		int rc = gcr_groupmsg_comms(b, &out, &err);
		CHECK(b != NULL && rc == -EBADMSG && out.n == 0 && err.msg[0] != '\0');
		if (rc != -EBADMSG)
			fprintf(stderr, "accepted: %s\n", bad[i]);
		json_decref(b);
	}
	/* Too many entries. */
	json_t *big = json_array();
	for (int i = 0; i <= GCR_GROUP_MAX_COMMS; i++)
		json_array_append_new(big, json_pack("{s:s, s:i, s:i, s:i, s:i, s:s, s:s}", "key", "00000000000000aa",
						     "rank", i, "nranks", 1000, "count", 0, "device", 0, "state", "live",
						     "how", "init"));
	CHECK(gcr_groupmsg_comms(big, &out, &err) == -EBADMSG && out.n == 0 && strstr(err.msg, "at most") != NULL);
	json_decref(big);
}

static void test_targets_keys_ids(void)
{
	static struct gcr_group_targets t, t2;
	static struct gcr_group_keys k, k2;
	static struct gcr_group_ids ids, ids2;
	struct gcr_err err;
	t.n = 2;
	t.t[0] = (struct gcr_group_target){ 5, 0 };
	t.t[1] = (struct gcr_group_target){ 6, 99 };
	json_t *j = gcr_groupmsg_targets_json(&t);
	CHECK(gcr_groupmsg_targets(j, &t2, &err) == 0 && t2.n == 2 && t2.t[1].key == 6 && t2.t[1].count == 99);
	json_decref(j);
	k.n = 2;
	k.key[0] = 1;
	k.key[1] = UINT64_MAX;
	j = gcr_groupmsg_keys_json(&k);
	CHECK(gcr_groupmsg_keys(j, &k2, &err) == 0 && k2.n == 2 && k2.key[1] == UINT64_MAX);
	json_decref(j);
	ids.n = 1;
	ids.v[0].key = 77;
	for (int b = 0; b < GCR_GROUP_ID_BYTES; b++)
		ids.v[0].id[b] = (unsigned char)(b * 37 + 1);
	j = gcr_groupmsg_ids_json(&ids);
	CHECK(gcr_groupmsg_ids(j, &ids2, &err) == 0 && ids2.n == 1 && ids2.v[0].key == 77 &&
	      memcmp(ids.v[0].id, ids2.v[0].id, GCR_GROUP_ID_BYTES) == 0);
	json_decref(j);

	static const char *const bad_targets[] = {
		"[{\"key\":\"0000000000000001\"}]",
		"[{\"key\":\"0000000000000001\",\"count\":-1}]",
		"[{\"key\":\"0000000000000001\",\"count\":1},{\"key\":\"0000000000000001\",\"count\":2}]",
		"[{\"count\":1}]",
		"{\"key\":\"0000000000000001\",\"count\":1}",
	};
	for (size_t i = 0; i < sizeof(bad_targets) / sizeof(bad_targets[0]); i++) {
		json_t *b = parse(bad_targets[i]);
		CHECK(gcr_groupmsg_targets(b, &t2, &err) == -EBADMSG && t2.n == 0);
		json_decref(b);
	}
	static const char *const bad_keys[] = { "[1]", "[\"01\"]", "[\"0000000000000001\",\"0000000000000001\"]", "\"k\"" };
	for (size_t i = 0; i < sizeof(bad_keys) / sizeof(bad_keys[0]); i++) {
		json_t *b = parse(bad_keys[i]);
		CHECK(gcr_groupmsg_keys(b, &k2, &err) == -EBADMSG && k2.n == 0);
		json_decref(b);
	}
	char hex[2 * GCR_GROUP_ID_BYTES + 2];
	memset(hex, 'a', sizeof(hex));
	hex[2 * GCR_GROUP_ID_BYTES] = '\0';
	json_t *ok = json_pack("[{s:s, s:s}]", "key", "0000000000000001", "id", hex);
	CHECK(gcr_groupmsg_ids(ok, &ids2, &err) == 0 && ids2.n == 1 && ids2.v[0].id[5] == 0xaa);
	json_decref(ok);
	hex[7] = 'G';
	json_t *b = json_pack("[{s:s, s:s}]", "key", "0000000000000001", "id", hex);
	CHECK(gcr_groupmsg_ids(b, &ids2, &err) == -EBADMSG && ids2.n == 0);
	json_decref(b);
	hex[7] = 'a';
	hex[2 * GCR_GROUP_ID_BYTES - 1] = '\0'; /* one digit short */
	b = json_pack("[{s:s, s:s}]", "key", "0000000000000001", "id", hex);
	CHECK(gcr_groupmsg_ids(b, &ids2, &err) == -EBADMSG);
	json_decref(b);
	b = parse("[{\"key\":\"0000000000000001\",\"id\":5}]");
	CHECK(gcr_groupmsg_ids(b, &ids2, &err) == -EBADMSG);
	json_decref(b);
}

static void test_int(void)
{
	struct gcr_err err;
	long long v = 0;
	json_t *a = parse("{\"hold_ms\":250,\"bad\":\"x\",\"neg\":-5}");
	CHECK(gcr_groupmsg_int(a, "hold_ms", 1, 1000, 7, &v, &err) == 0 && v == 250);
	CHECK(gcr_groupmsg_int(a, "absent", 1, 1000, 7, &v, &err) == 0 && v == 7);
	CHECK(gcr_groupmsg_int(a, "bad", 1, 1000, 7, &v, &err) == -EBADMSG && strstr(err.msg, "\"bad\"") != NULL);
	CHECK(gcr_groupmsg_int(a, "neg", 1, 1000, 7, &v, &err) == -EBADMSG);
	CHECK(gcr_groupmsg_int(a, "hold_ms", 1, 100, 7, &v, &err) == -EBADMSG);
	json_decref(a);
}

int main(void)
{
	test_keys_text();
	test_comms();
	test_targets_keys_ids();
	test_int();
	return test_summary("test_groupmsg");
}
