/* test_agent_watch: watch streams split at every byte, several events per chunk,
 * bookmarks, 410 Gone, ERROR statuses, garbage, oversize and odd whitespace. */
#include "agent_watch.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>

#define MAX_EVENTS 64

struct rec {
	int n;
	int types[MAX_EVENTS];
	char rv[MAX_EVENTS][AGENT_WATCH_RV_MAX + 1];
	char name[MAX_EVENTS][64];
	int fail_at; /* stop with -ECANCELED at this event index, -1 never */
	json_t *kept;
};

static int record(const struct agent_watch_event *ev, void *data, struct gcr_err *err)
{
	struct rec *r = data;
	if (r->n == r->fail_at)
		return gcr_err_set(err, -ECANCELED, "test callback refused %s", ev->resource_version);
	if (r->n >= MAX_EVENTS)
		return -ENOSPC;
	json_t *md = json_object_get(ev->object, "metadata");
	const char *name = json_string_value(json_object_get(md, "name"));
	r->types[r->n] = (int)ev->type;
	snprintf(r->rv[r->n], sizeof(r->rv[0]), "%s", ev->resource_version);
	snprintf(r->name[r->n], sizeof(r->name[0]), "%s", name ? name : "");
	/* Keeping the object past the callback takes a reference. */
	if (r->kept == NULL) {
		r->kept = ev->object;
		json_incref(r->kept);
	}
	r->n++;
	return 0;
}

static void rec_init(struct rec *r)
{
	memset(r, 0, sizeof(*r));
	r->fail_at = -1;
}

static void rec_done(struct rec *r)
{
	json_decref(r->kept);
	r->kept = NULL;
}

#define OBJ(name, rv)                                                                         \
	"{\"apiVersion\":\"gcr.dev/v1alpha1\",\"kind\":\"Checkpoint\",\"metadata\":{\"name\":\"" \
	name "\",\"namespace\":\"ml\",\"resourceVersion\":\"" rv                                 \
	"\",\"uid\":\"1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8f\"},\"spec\":{\"podName\":\"train-0\"}}"

static const char stream[] =
	"{\"type\":\"ADDED\",\"object\":" OBJ("ck-1", "1001") "}\n"
	"{\"type\":\"MODIFIED\",\"object\":" OBJ("ck-1", "1002") "}\n"
	"{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Checkpoint\",\"apiVersion\":\"gcr.dev/v1alpha1\","
	"\"metadata\":{\"resourceVersion\":\"1050\",\"annotations\":{\"k8s.io/initial-events-end\":\"true\"}}}}\n"
	"{\"type\":\"ADDED\",\"object\":" OBJ("ck-2", "1061") "}\n"
	"{\"type\":\"DELETED\",\"object\":" OBJ("ck-1", "1062") "}\n";

static int check_stream(const struct rec *r, struct agent_watch *w)
{
	static const int types[] = { AGENT_WATCH_ADDED, AGENT_WATCH_MODIFIED, AGENT_WATCH_BOOKMARK,
				     AGENT_WATCH_ADDED, AGENT_WATCH_DELETED };
	static const char *const rvs[] = { "1001", "1002", "1050", "1061", "1062" };
	static const char *const names[] = { "ck-1", "ck-1", "", "ck-2", "ck-1" };
	int ok = r->n == 5 && strcmp(agent_watch_resource_version(w), "1062") == 0;
	for (int i = 0; ok && i < 5; i++)
		ok = r->types[i] == types[i] && strcmp(r->rv[i], rvs[i]) == 0 && strcmp(r->name[i], names[i]) == 0;
	return ok;
}

/* Feeds text in chunks of the given sizes (cycled); returns the first error. */
static int feed_chunks(struct agent_watch *w, const char *text, size_t len, const size_t *sizes, size_t nsizes,
		       struct gcr_err *err)
{
	size_t off = 0, k = 0;
	while (off < len) {
		size_t n = sizes[k++ % nsizes];
		if (n > len - off)
			n = len - off;
		int rc = agent_watch_feed(w, text + off, n, err);
		if (rc < 0)
			return rc;
		off += n;
	}
	return 0;
}

static void test_splits(void)
{
	size_t len = strlen(stream);
	struct gcr_err err = { 0, "" };
	struct rec r;
	int bad = 0;

	/* Two chunks, split at every byte position. */
	for (size_t cut = 0; cut <= len; cut++) {
		rec_init(&r);
		struct agent_watch *w = agent_watch_new(0, record, &r);
		int rc = agent_watch_feed(w, stream, cut, &err);
		if (rc == 0)
			rc = agent_watch_feed(w, stream + cut, len - cut, &err);
		if (rc == 0)
			rc = agent_watch_finish(w, &err);
		if (rc != 0 || !check_stream(&r, w) || agent_watch_lines(w) != 5)
			bad++;
		agent_watch_free(w);
		rec_done(&r);
	}
	CHECK(bad == 0);

	/* Three chunks, at every pair of positions 7 bytes apart. */
	bad = 0;
	for (size_t a = 0; a + 7 <= len; a++) {
		rec_init(&r);
		struct agent_watch *w = agent_watch_new(0, record, &r);
		size_t b = a + 7;
		int rc = agent_watch_feed(w, stream, a, &err);
		rc = rc ? rc : agent_watch_feed(w, stream + a, b - a, &err);
		rc = rc ? rc : agent_watch_feed(w, stream + b, len - b, &err);
		if (rc != 0 || !check_stream(&r, w))
			bad++;
		agent_watch_free(w);
		rec_done(&r);
	}
	CHECK(bad == 0);

	/* One byte at a time, and a few irregular chunkings. */
	static const size_t one[] = { 1 }, odd[] = { 3, 1, 250, 17, 2 }, big[] = { 4096 };
	const size_t *plans[] = { one, odd, big };
	size_t nplans[] = { 1, 5, 1 };
	for (int i = 0; i < 3; i++) {
		rec_init(&r);
		struct agent_watch *w = agent_watch_new(0, record, &r);
		CHECK(feed_chunks(w, stream, len, plans[i], nplans[i], &err) == 0);
		CHECK(check_stream(&r, w));
		agent_watch_free(w);
		rec_done(&r);
	}

	/* The kept object outlives the callback and the decoder. */
	rec_init(&r);
	struct agent_watch *w = agent_watch_new(0, record, &r);
	CHECK(agent_watch_feed(w, stream, len, &err) == 0);
	agent_watch_free(w);
	CHECK_STR(json_string_value(json_object_get(json_object_get(r.kept, "metadata"), "name")), "ck-1");
	rec_done(&r);
}

static void test_whitespace(void)
{
	struct gcr_err err = { 0, "" };
	struct rec r;
	rec_init(&r);
	struct agent_watch *w = agent_watch_new(0, record, &r);
	const char *t = "\n\n   \n\t\r\n"
			"{\"type\":\"ADDED\",\"object\":" OBJ("a", "5") "}\r\n"
			"  {\"type\" : \"MODIFIED\" , \"object\" : " OBJ("a", "6") " }  \n"
			"\r\n";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == 0);
	CHECK(r.n == 2);
	CHECK_STR(agent_watch_resource_version(w), "6");
	/* A last line without newline waits for finish. */
	t = "{\"type\":\"DELETED\",\"object\":" OBJ("a", "7") "}";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == 0);
	CHECK(r.n == 2);
	CHECK(agent_watch_finish(w, &err) == 0);
	CHECK(r.n == 3 && r.types[2] == AGENT_WATCH_DELETED);
	CHECK_STR(agent_watch_resource_version(w), "7");
	CHECK(agent_watch_finish(w, &err) == 0);
	CHECK(agent_watch_feed(w, "", 0, &err) == 0);
	agent_watch_free(w);
	rec_done(&r);
}

static void test_expired(void)
{
	struct gcr_err err = { 0, "" };
	struct rec r;
	rec_init(&r);
	struct agent_watch *w = agent_watch_new(0, record, &r);
	const char *t =
		"{\"type\":\"ADDED\",\"object\":" OBJ("a", "100") "}\n"
		"{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},"
		"\"status\":\"Failure\",\"message\":\"too old resource version: 100 (2500)\","
		"\"reason\":\"Expired\",\"code\":410}}\n"
		"{\"type\":\"ADDED\",\"object\":" OBJ("b", "101") "}\n";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == -ESTALE);
	CHECK(err.code == -ESTALE);
	CHECK(strstr(err.msg, "too old resource version: 100 (2500)") != NULL);
	CHECK(r.n == 1);
	CHECK_STR(agent_watch_resource_version(w), "100");
	/* Sticky until reset. */
	gcr_err_clear(&err);
	CHECK(agent_watch_feed(w, "\n", 1, &err) == -ESTALE);
	CHECK(strstr(err.msg, "expired") != NULL);
	CHECK(agent_watch_finish(w, NULL) == -ESTALE);
	/* The caller relists, then watches from the list's version. */
	agent_watch_reset(w);
	CHECK(agent_watch_set_resource_version(w, "2600") == 0);
	t = "{\"type\":\"MODIFIED\",\"object\":" OBJ("b", "2601") "}\n";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == 0);
	CHECK(r.n == 2);
	CHECK_STR(agent_watch_resource_version(w), "2601");

	/* 410 split across chunks, and the older "Gone" reason without code. */
	static const char *const gone[] = {
		"{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"code\":410,\"reason\":\"Gone\","
		"\"message\":\"The resourceVersion for the provided watch is too old.\"}}\n",
		"{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"reason\":\"Expired\"}}\n",
	};
	for (int i = 0; i < 2; i++) {
		agent_watch_reset(w);
		size_t half = strlen(gone[i]) / 2;
		CHECK(agent_watch_feed(w, gone[i], half, &err) == 0);
		CHECK(agent_watch_feed(w, gone[i] + half, strlen(gone[i]) - half, &err) == -ESTALE);
	}
	agent_watch_free(w);
	rec_done(&r);
}

static void test_error_status(void)
{
	struct gcr_err err = { 0, "" };
	struct agent_watch *w = agent_watch_new(0, NULL, NULL);
	const char *t = "{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"status\":"
			"\"Failure\",\"message\":\"etcdserver: request timed out\\nretry\",\"reason\":"
			"\"InternalError\",\"code\":500}}\n";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == -EIO);
	CHECK(strstr(err.msg, "500") != NULL && strstr(err.msg, "InternalError") != NULL);
	CHECK(strstr(err.msg, "etcdserver: request timed out") != NULL);
	CHECK(strchr(err.msg, '\n') == NULL);
	agent_watch_reset(w);
	t = "{\"type\":\"ERROR\",\"object\":{}}\n";
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == -EIO);
	CHECK(strstr(err.msg, "no message") != NULL);
	agent_watch_reset(w);
	t = "{\"type\":\"ERROR\",\"object\":{\"code\":\"410\"}}\n"; /* code must be a number */
	CHECK(agent_watch_feed(w, t, strlen(t), &err) == -EIO);
	agent_watch_free(w);
}

static void test_malformed(void)
{
	static const char *const bad[] = {
		"garbage\n",
		"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"1\"}}\n", /* truncated */
		"[]\n",
		"\"ADDED\"\n",
		"{}\n",
		"{\"type\":\"ADDED\"}\n",
		"{\"type\":\"ADDED\",\"object\":null}\n",
		"{\"type\":\"ADDED\",\"object\":[1]}\n",
		"{\"type\":7,\"object\":{}}\n",
		"{\"type\":\"added\",\"object\":" OBJ("a", "1") "}\n",
		"{\"type\":\"SYNC\",\"object\":" OBJ("a", "1") "}\n",
		"{\"type\":\"ADDED\",\"object\":{}}\n",
		"{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}\n",
		"{\"type\":\"ADDED\",\"object\":{\"metadata\":\"x\"}}\n",
		"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":1001}}}\n",
		"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"\"}}}\n",
		"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{}}}\n",
		"{\"type\":\"ADDED\",\"type\":\"DELETED\",\"object\":" OBJ("a", "1") "}\n",
		"{\"type\":\"ADDED\",\"object\":" OBJ("a\\u0000b", "1") "}\n",
		"{\"type\":\"ADDED\",\"object\":" OBJ("a", "1") "} {\"type\":\"ADDED\"}\n",
		/* Last: a raw NUL byte before the newline. */
		"{\"type\":\"ADDED\",\"object\":" OBJ("a", "1") "}\0\n",
	};
	size_t nbad = sizeof(bad) / sizeof(bad[0]);
	for (size_t i = 0; i < nbad; i++) {
		struct gcr_err err = { 0, "" };
		struct rec r;
		rec_init(&r);
		struct agent_watch *w = agent_watch_new(0, record, &r);
		size_t n = strlen(bad[i]);
		if (i == nbad - 1)
			n += 2; /* the NUL and the newline after it */
		int rc = agent_watch_feed(w, bad[i], n, &err);
		CHECK(rc == -EPROTO);
		if (rc != -EPROTO)
			fprintf(stderr, "malformed %zu: rc %d %s\n", i, rc, err.msg);
		CHECK(r.n == 0 && err.msg[0] != '\0' && strchr(err.msg, '\n') == NULL);
		CHECK_STR(agent_watch_resource_version(w), "");
		agent_watch_free(w);
		rec_done(&r);
	}

	/* A resourceVersion over the limit. */
	char t[512];
	char rv[AGENT_WATCH_RV_MAX + 2];
	memset(rv, '9', sizeof(rv) - 1);
	rv[sizeof(rv) - 1] = '\0';
	snprintf(t, sizeof(t), "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"%s\"}}}\n", rv);
	struct agent_watch *w = agent_watch_new(0, NULL, NULL);
	CHECK(agent_watch_feed(w, t, strlen(t), NULL) == -EPROTO);
	agent_watch_free(w);

	/* The message names the line. */
	struct gcr_err err = { 0, "" };
	w = agent_watch_new(0, NULL, NULL);
	const char *s = "{\"type\":\"ADDED\",\"object\":" OBJ("a", "1") "}\n\nnot json\n";
	CHECK(agent_watch_feed(w, s, strlen(s), &err) == -EPROTO);
	CHECK(strstr(err.msg, "line 3") != NULL && strstr(err.msg, "invalid JSON") != NULL);
	CHECK_STR(agent_watch_resource_version(w), "1");
	/* Trailing garbage found at finish. */
	agent_watch_reset(w);
	CHECK(agent_watch_feed(w, "{\"type\":", 8, &err) == 0);
	CHECK(agent_watch_finish(w, &err) == -EPROTO);
	agent_watch_free(w);
}

static void test_oversize(void)
{
	struct gcr_err err = { 0, "" };
	struct rec r;
	const char *ok = "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"12\"}}}";
	size_t n = strlen(ok);

	/* Exactly max_line is accepted, with or without chunking. */
	rec_init(&r);
	struct agent_watch *w = agent_watch_new(n, record, &r);
	CHECK(agent_watch_feed(w, ok, n, &err) == 0);
	CHECK(agent_watch_feed(w, "\n", 1, &err) == 0);
	CHECK(agent_watch_feed(w, ok, 10, &err) == 0);
	CHECK(agent_watch_feed(w, ok + 10, n - 10, &err) == 0);
	CHECK(agent_watch_feed(w, "\n", 1, &err) == 0);
	CHECK(r.n == 2);
	agent_watch_free(w);
	rec_done(&r);

	/* One byte more fails: in one chunk, in pieces, and without a newline. */
	char *big = malloc(n + 2);
	memcpy(big, ok, n);
	big[n] = ' ';
	big[n + 1] = '\n';
	for (int mode = 0; mode < 3; mode++) {
		rec_init(&r);
		w = agent_watch_new(n, record, &r);
		int rc;
		if (mode == 0) {
			rc = agent_watch_feed(w, big, n + 2, &err);
		} else if (mode == 1) {
			static const size_t sizes[] = { 5 };
			rc = feed_chunks(w, big, n + 2, sizes, 1, &err);
		} else {
			rc = agent_watch_feed(w, big, n + 1, &err);
		}
		CHECK(rc == -EMSGSIZE);
		CHECK(strstr(err.msg, "longer than") != NULL);
		CHECK(r.n == 0);
		CHECK(agent_watch_feed(w, "\n", 1, &err) == -EMSGSIZE);
		agent_watch_free(w);
		rec_done(&r);
	}
	free(big);

	/* A stream that never sends a newline stops at the bound (1 MiB here)
	 * instead of growing without end. */
	w = agent_watch_new(1024 * 1024, NULL, NULL);
	char chunk[16384];
	memset(chunk, 'x', sizeof(chunk));
	int rc = 0;
	size_t fed = 0;
	while (rc == 0 && fed < 4 * 1024 * 1024) {
		rc = agent_watch_feed(w, chunk, sizeof(chunk), &err);
		fed += sizeof(chunk);
	}
	CHECK(rc == -EMSGSIZE);
	CHECK(fed <= 1024 * 1024 + sizeof(chunk));
	agent_watch_free(w);

	/* A large (but allowed) event followed by small ones. */
	size_t bigsz = 512 * 1024;
	char *obj = malloc(bigsz + 256);
	int k = snprintf(obj, 256, "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"resourceVersion\":\"9\"},\"data\":\"");
	memset(obj + k, 'a', bigsz);
	strcpy(obj + k + bigsz, "\"}}\n");
	rec_init(&r);
	w = agent_watch_new(0, record, &r);
	static const size_t sizes[] = { 16384 };
	CHECK(feed_chunks(w, obj, strlen(obj), sizes, 1, &err) == 0);
	CHECK(agent_watch_feed(w, stream, strlen(stream), &err) == 0);
	CHECK(r.n == 6);
	CHECK_STR(agent_watch_resource_version(w), "1062");
	agent_watch_free(w);
	rec_done(&r);
	free(obj);
}

static void test_callback_stop(void)
{
	struct gcr_err err = { 0, "" };
	struct rec r;
	rec_init(&r);
	r.fail_at = 1;
	struct agent_watch *w = agent_watch_new(0, record, &r);
	CHECK(agent_watch_feed(w, stream, strlen(stream), &err) == -ECANCELED);
	CHECK(strstr(err.msg, "test callback refused 1002") != NULL);
	/* The refused event's version is not recorded: a new watch replays it. */
	CHECK_STR(agent_watch_resource_version(w), "1001");
	CHECK(r.n == 1);
	CHECK(agent_watch_feed(w, "\n", 1, &err) == -ECANCELED);
	agent_watch_free(w);
	rec_done(&r);
}

static void test_api(void)
{
	struct agent_watch *w = agent_watch_new(0, NULL, NULL);
	CHECK(w != NULL);
	CHECK_STR(agent_watch_resource_version(w), "");
	CHECK(agent_watch_set_resource_version(w, "12345") == 0);
	CHECK_STR(agent_watch_resource_version(w), "12345");
	char rv[AGENT_WATCH_RV_MAX + 2];
	memset(rv, '1', sizeof(rv) - 1);
	rv[sizeof(rv) - 1] = '\0';
	CHECK(agent_watch_set_resource_version(w, rv) == -EINVAL);
	CHECK_STR(agent_watch_resource_version(w), "12345");
	rv[AGENT_WATCH_RV_MAX] = '\0';
	CHECK(agent_watch_set_resource_version(w, rv) == 0);
	CHECK(agent_watch_set_resource_version(w, NULL) == 0);
	CHECK_STR(agent_watch_resource_version(w), "");
	/* Without a callback it still tracks versions. */
	CHECK(agent_watch_feed(w, stream, strlen(stream), NULL) == 0);
	CHECK_STR(agent_watch_resource_version(w), "1062");
	CHECK(agent_watch_lines(w) == 5);
	agent_watch_free(w);
	agent_watch_free(NULL);
	agent_watch_reset(NULL);
	CHECK(agent_watch_feed(NULL, "x", 1, NULL) == -EINVAL);
	CHECK(agent_watch_finish(NULL, NULL) == -EINVAL);
	CHECK(agent_watch_set_resource_version(NULL, "1") == -EINVAL);
	CHECK_STR(agent_watch_resource_version(NULL), "");
}

int main(void)
{
	test_splits();
	test_whitespace();
	test_expired();
	test_error_status();
	test_malformed();
	test_oversize();
	test_callback_stop();
	test_api();
	return test_summary("test_agent_watch");
}
