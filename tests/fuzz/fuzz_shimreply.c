/* fuzz_shimreply: arbitrary bytes as a shim's reply object, through every gcr_shimreply
 * reader; aborts when one returns a value outside its documented bounds. */
#include "gcr_shimreply.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What gcr_shimreply promises of a string it hands out. */
static void check_word(const char *s, size_t cap)
{
	size_t n = strnlen(s, cap);
	if (n == 0 || n >= cap)
		abort();
	for (size_t i = 0; i < n; i++)
		if (s[i] <= ' ' || s[i] > '~')
			abort();
}

/* Every reader answers 0, -ENOENT or -EPROTO, and err carries the same code on failure. */
static void check_rc(int rc, const struct gcr_err *err)
{
	if (rc != 0 && rc != -ENOENT && rc != -EPROTO)
		abort();
	if (rc != 0 && (err->code != rc || err->msg[0] == '\0'))
		abort();
}

static void check_all(json_t *j)
{
	struct gcr_err err = { 0, "" };
	const char *state = (const char *)1;
	int rc = gcr_shimreply_state(j, &state, &err);
	check_rc(rc, &err);
	if (rc == 0)
		check_word(state, GCR_SHIMREPLY_STATE_LEN);
	else if (state != NULL)
		abort();

	int hip = -1;
	rc = gcr_shimreply_is_hip(j, &hip, &err);
	check_rc(rc, &err);
	if (rc == -ENOENT || (hip != 0 && hip != 1) || (rc < 0 && hip != 0))
		abort();

	long long total = -1, moved = -1;
	rc = gcr_shimreply_bytes(j, &total, &moved, &err);
	check_rc(rc, &err);
	if (total < 0 || total >= GCR_SHIMREPLY_BYTES_MAX || moved < 0 || moved >= GCR_SHIMREPLY_BYTES_MAX ||
	    (rc < 0 && (total != 0 || moved != 0)))
		abort();

	long long fast = -1, drv = -1;
	rc = gcr_shimreply_sizes(j, &fast, &drv, &err);
	check_rc(rc, &err);
	if (fast < 0 || fast >= 2 * GCR_SHIMREPLY_BYTES_MAX || drv < 0 || drv >= 2 * GCR_SHIMREPLY_BYTES_MAX ||
	    (rc < 0 && (fast != 0 || drv != 0)))
		abort();

	struct gcr_need need;
	memset(&need, 0xa5, sizeof(need));
	rc = gcr_shimreply_restore_need(j, &need, &err);
	check_rc(rc, &err);
	if (rc < 0 && need.n != 0)
		abort();
	if (rc == 0 && (need.n == 0 || need.n > GCR_NEED_MAX_DEVICES))
		abort();
	for (size_t i = 0; rc == 0 && i < need.n; i++) {
		check_word(need.dev[i].uuid, GCR_NEED_UUID_MAX);
		if (need.dev[i].bytes < 0 || need.dev[i].bytes >= GCR_SHIMREPLY_BYTES_MAX)
			abort();
	}

	enum gcr_shimreply_data data = GCR_SHIMREPLY_DATA_FILES;
	rc = gcr_shimreply_data(j, &data, &err);
	check_rc(rc, &err);
	if ((rc < 0 && data != GCR_SHIMREPLY_DATA_HOST) || (unsigned)data > GCR_SHIMREPLY_DATA_GPU)
		abort();

	int called = -1;
	long long waited = -1;
	rc = gcr_shimreply_wake(j, &called, &waited, &err);
	check_rc(rc, &err);
	if ((rc < 0 && (called != 0 || waited != 0)) || (called != 0 && called != 1) || waited < 0 ||
	    waited >= GCR_SHIMREPLY_BYTES_MAX || (!called && waited != 0))
		abort();

	long long sum = -1;
	rc = gcr_shimreply_calls(j, &sum, &err);
	check_rc(rc, &err);
	if (rc == -ENOENT || sum < 0 || (rc < 0 && sum != 0))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_t *j = json_loadb((const char *)data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	if (j == NULL)
		return 0;
	check_all(j);
	/* gcr_cr_status nests the shim's status under "shim", and gcrctl and the agent read it
	 * there; a stats reply nests one under "status". */
	check_all(json_object_get(j, "shim"));
	check_all(json_object_get(j, "status"));
	json_decref(j);
	return 0;
}
