/* test_gcr_jsonbudget: jansson's allocations under a budget (a parse past it fails -EFBIG and
 * frees what it took; within it, the same tree as without), and what an allocation table at its
 * byte cap costs: each shape an honest or hostile process can write, parsed in a child whose
 * peak RSS is read back. The agent's chart limit is 256 MiB: a table's parse must leave room for
 * the agent's own (docs/install.md, "Input bounds", has the figures this prints). Under ASan or
 * valgrind the RSS is theirs, not ours: the parses are checked, the RSS not measured. */
#include "gcr_image.h"
#include "gcr_jsonbudget.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

/* Peak RSS (MiB) the parse of one table may add to the agent's: 256 MiB less the agent's own. */
#define PARSE_PEAK_MAX_MIB 200

static int instrumented(void)
{
#if defined(__SANITIZE_ADDRESS__)
	return 1;
#else
	const char *pre = getenv("LD_PRELOAD");
	return pre != NULL && strstr(pre, "vgpreload") != NULL;
#endif
}

/* A table of about bytes bytes of one shape: "zero" (one allocation of all-zero chunks: 7 bytes a
 * chunk), "data" (an honest table: 55 bytes a chunk of data), "allocs" (the most allocations, one
 * chunk each), "objects" ([{},{},...]: the costliest tree per byte; not a table). */
static char *table_of(const char *shape, size_t bytes, size_t *len)
{
	char *b = malloc(bytes + 4096);
	size_t n = 0;
	if (b == NULL)
		return NULL;
	if (strcmp(shape, "zero") == 0) {
		size_t k = (bytes - 200) / 7;
		n = (size_t)sprintf(b, "{\"allocs\":[{\"address\":1,\"size\":%zu,\"slot\":0,\"gen\":0,\"file\":\"gpu/a\","
				    "\"chunks\":[", k * (size_t)GCR_IMAGE_CHUNK);
		for (size_t i = 0; i < k; i++)
			n += (size_t)sprintf(b + n, "%s\"zero\"", i ? "," : "");
		n += (size_t)sprintf(b + n, "]}]}");
	} else if (strcmp(shape, "data") == 0) {
		size_t k = (bytes - 200) / 56;
		n = (size_t)sprintf(b, "{\"allocs\":[{\"address\":1,\"size\":%zu,\"slot\":0,\"gen\":0,\"file\":\"gpu/a\","
				    "\"chunks\":[", k * (size_t)GCR_IMAGE_CHUNK);
		for (size_t i = 0; i < k && n + 80 < bytes; i++)
			n += (size_t)sprintf(b + n, "%s{\"off\":%zu,\"len\":2097152,\"crc32c\":\"deadbeef\"}", i ? "," : "",
					     i * (size_t)GCR_IMAGE_CHUNK);
		n += (size_t)sprintf(b + n, "]}]}");
	} else if (strcmp(shape, "allocs") == 0) {
		n = (size_t)sprintf(b, "{\"allocs\":[");
		for (size_t i = 0; i < GCR_IMAGE_MAX_FILES && n + 200 < bytes; i++)
			n += (size_t)sprintf(b + n, "%s{\"address\":%zu,\"size\":4096,\"slot\":%zu,\"gen\":0,\"file\":"
					     "\"gpu/a-%zu.bin\",\"chunks\":[\"zero\"]}", i ? "," : "", i, i, i);
		n += (size_t)sprintf(b + n, "]}");
	} else {
		n = (size_t)sprintf(b, "{\"allocs\":[");
		while (n + 10 < bytes)
			n += (size_t)sprintf(b + n, "{},");
		n += (size_t)sprintf(b + n, "{}]}");
	}
	*len = n;
	return b;
}

/* Parses a table of shape at the cap in a child: its result (0 or -errno) in *rc, and the peak
 * RSS the parse added in MiB (-1 when the child failed). */
static long parse_in_child(const char *shape, int *rc)
{
	int fds[2];
	if (pipe(fds) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		close(fds[0]);
		size_t len = 0;
		char *b = table_of(shape, GCR_IMAGE_MAX_TABLE, &len);
		struct rusage ru;
		getrusage(RUSAGE_SELF, &ru);
		long before = ru.ru_maxrss;
		struct gcr_image_table t;
		struct gcr_err err = { 0, "" };
		long out[2] = { b != NULL ? gcr_image_table_parse(b, len, &t, &err) : -ENOMEM, 0 };
		getrusage(RUSAGE_SELF, &ru);
		out[1] = (ru.ru_maxrss - before) / 1024;
		printf("  %-8s %5.2f MiB table: %s, the parse's peak %ld MiB%s%s\n", shape, (double)len / (1 << 20),
		       out[0] == 0 ? "parsed" : "refused", out[1], out[0] ? ": " : "", out[0] ? err.msg : "");
		if (out[0] == 0)
			gcr_image_table_clear(&t);
		free(b);
		fflush(stdout);
		_exit(write(fds[1], out, sizeof(out)) == sizeof(out) ? 0 : 1);
	}
	close(fds[1]);
	long out[2] = { -1, -1 };
	ssize_t n = read(fds[0], out, sizeof(out));
	close(fds[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	if (n != sizeof(out) || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -1;
	*rc = (int)out[0];
	return out[1];
}

int main(void)
{
	struct gcr_err err = { 0, "" };
	setvbuf(stdout, NULL, _IOLBF, 0); /* the children's lines in order */
	CHECK(!gcr_jsonbudget_installed());
	gcr_jsonbudget_install();
	CHECK(gcr_jsonbudget_installed());

	/* Within the budget: the same tree as without. */
	const char *small = "{\"a\":[1,2,3],\"b\":{\"c\":\"d\"}}";
	json_t *j = gcr_jsonbudget_loadb(small, strlen(small), JSON_REJECT_DUPLICATES, 1 << 20, &err);
	CHECK(j != NULL && json_array_size(json_object_get(j, "a")) == 3);
	json_decref(j);
	/* Past it: -EFBIG, whatever the shape (and nothing leaks: valgrind's tier). */
	char big[65536];
	size_t n = 0;
	n += (size_t)sprintf(big, "[");
	while (n < sizeof(big) - 8)
		n += (size_t)sprintf(big + n, "{},");
	n += (size_t)sprintf(big + n, "{}]");
	CHECK(gcr_jsonbudget_loadb(big, n, 0, 64 << 10, &err) == NULL && err.code == -EFBIG &&
	      strstr(err.msg, "more than") != NULL);
	j = gcr_jsonbudget_loadb(big, n, 0, 64 << 20, &err); /* the same within a larger one */
	CHECK(j != NULL && json_array_size(j) > 10000);
	json_decref(j);
	/* Not JSON: -EBADMSG saying where. */
	CHECK(gcr_jsonbudget_loadb("{\"a\":", 5, 0, 1 << 20, &err) == NULL && err.code == -EBADMSG &&
	      strstr(err.msg, "not JSON") != NULL);
	/* Allocations outside a parse are not counted (other threads, later calls). */
	j = json_array();
	for (int i = 0; i < 100000; i++)
		json_array_append_new(j, json_integer(i));
	CHECK(json_array_size(j) == 100000);
	json_decref(j);

	/* A table past its cap is refused unread. */
	static char over[64];
	CHECK(gcr_image_table_parse(over, GCR_IMAGE_MAX_TABLE + 1, &(struct gcr_image_table){ 0 }, &err) == -EFBIG);

	/* Each shape at the cap: the honest ones parse, the hostile ones either parse or are refused,
	 * and none takes more than PARSE_PEAK_MAX_MIB. */
	static const struct {
		const char *shape;
		int want; /* 0: parses; 1: refused; -1: either */
	} shapes[] = { { "data", 0 }, { "zero", -1 }, { "allocs", 0 }, { "objects", 1 } };
	int meas = !instrumented();
	printf("tables at the cap (%llu MiB), parse budget %llu MiB:\n", GCR_IMAGE_MAX_TABLE >> 20,
	       GCR_IMAGE_PARSE_BUDGET >> 20);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		int rc = 1;
		long peak = parse_in_child(shapes[i].shape, &rc);
		CHECK(peak >= 0);
		if (shapes[i].want == 0)
			CHECK(rc == 0);
		else if (shapes[i].want == 1)
			CHECK(rc == -EFBIG || rc == -EBADMSG);
		else
			CHECK(rc == 0 || rc == -EFBIG);
		if (meas)
			CHECK(peak < PARSE_PEAK_MAX_MIB);
	}
	if (!meas)
		printf("  (ASan or valgrind: their memory, not the parse's; the peaks above are not checked)\n");
	return test_summary("test_gcr_jsonbudget");
}
