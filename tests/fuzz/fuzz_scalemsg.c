/* fuzz_scalemsg: arbitrary bytes as a LabelSelector (JSON) and as a node's activity
 * note (with its per-state process counts), through agent_scalemsg; checks what the
 * selector string may contain, and that matching agrees with it on what a selector is. */
#include "agent_scalemsg.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gcr_err err = { 0, "" };
	/* The same bytes as an activity note, looked up under a fixed and an absent uid. */
	struct agent_scalemsg_activity a;
	int rc = agent_scalemsg_activity_find((const char *)data, size, "0f2d3c1a-7a2b-4c3d-9e8f-0123456789ab", &a, &err);
	if (rc == 0 && (a.last_active < 0 || a.calls < 0))
		abort();
	/* States: only when the note has them, each count bounded, with a sample time. */
	for (int i = 0; i < GCR_SHIMREPLY_ST_N; i++)
		if ((rc != 0 || !a.have_states) ? a.procs[i] != 0 : a.procs[i] < 0 || a.procs[i] > AGENT_SCALEMSG_PROCS_MAX)
			abort();
	if (rc == 0 && a.have_states && !(a.sampled > 0))
		abort();
	rc = agent_scalemsg_activity_find((const char *)data, size, NULL, &a, &err);
	if (rc == 0)
		abort(); /* nothing is found for no uid */
	/* ... and as a selector: the string may hold only label characters and the
	 * selector syntax, never a byte that could break out of the query. */
	json_t *sel = json_loadb((const char *)data, size, 0, NULL);
	char out[AGENT_SCALEMSG_SELECTOR_MAX], q[3 * AGENT_SCALEMSG_SELECTOR_MAX];
	/* A small buffer now and then, for the too-long path. */
	size_t len = size > 0 && data[0] == '{' && size % 7 == 0 ? 16 : sizeof(out);
	/* Matching accepts exactly the selectors the string form does (with room enough). */
	json_t *labels = json_pack("{s:s, s:s, s:s}", "app", "llm", "tier", "", "a.b/c-d", "x_y");
	int sok = agent_scalemsg_selector(sel, out, sizeof(out), &err) == 0;
	int m = agent_scalemsg_selector_match(sel, labels, &err);
	if (sok ? (m != 0 && m != 1) : m != -EINVAL)
		abort();
	json_decref(labels);
	if (agent_scalemsg_selector(sel, out, len, &err) == 0) {
		if (out[0] == '\0' || strlen(out) >= len)
			abort();
		for (const char *p = out; *p; p++)
			if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,!() ", *p))
				abort();
		if (agent_scalemsg_query_escape(out, q, sizeof(q)) != 0 || strpbrk(q, "&=# ,()!/") != NULL)
			abort();
	}
	json_decref(sel);
	return 0;
}
