/* test_agent_share: the fair-share accounting: one owner stops at its share while the others
 * go on, gives reopen it, the rule max(1, C / P), the table's own bound, refusals counted and
 * told once per window (through the teller's thread), the stats /metrics reads. */
#include "agent_share.h"
#include "util.h"

#include "gcr_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t told_lock = PTHREAD_MUTEX_INITIALIZER;
static int told;
static char told_owner[80], told_table[40], told_note[400];

static void tell(void *data, const char *owner, const char *table, const char *note)
{
	(void)data;
	pthread_mutex_lock(&told_lock);
	told++;
	snprintf(told_owner, sizeof(told_owner), "%s", owner);
	snprintf(told_table, sizeof(told_table), "%s", table);
	snprintf(told_note, sizeof(told_note), "%s", note);
	pthread_mutex_unlock(&told_lock);
}

static int told_count(void)
{
	pthread_mutex_lock(&told_lock);
	int n = told;
	pthread_mutex_unlock(&told_lock);
	return n;
}

/* Polls (bounded, 5 s) until the teller has told want notices. */
static int wait_told(int want)
{
	for (int i = 0; i < 500; i++) {
		if (told_count() >= want)
			return 1;
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

static void stat_cb(void *data, const struct agent_share_stat *st)
{
	struct agent_share_stat *out = data;
	if (strcmp(st->name, "holds") == 0)
		*out = *st;
}

int main(void)
{
	struct gcr_err err;
	gcr_log_level = GCR_LOG_ERROR; /* a line per refusal is the product's, not the test's */
	/* The rule. */
	CHECK(agent_share_fair(1024, 32) == 32);
	CHECK(agent_share_fair(64, 32) == 2);
	CHECK(agent_share_fair(4, 32) == 1);
	CHECK(agent_share_fair(64, 0) == 64 / AGENT_SHARE_OWNERS_DEFAULT);

	struct agent_shares *ss = agent_shares_new();
	CHECK(ss != NULL);
	agent_shares_set_teller(ss, tell, NULL);
	CHECK(agent_shares_start(ss, &err) == 0);
	CHECK(agent_shares_add(ss, &(struct agent_share_cfg){ .name = "bad", .what = "x" }, &err) == NULL &&
	      err.code == -EINVAL);
	struct agent_share *h = agent_shares_add(ss, &(struct agent_share_cfg){ .name = "holds", .what = "eviction holds",
										 .owner = "pod", .capacity = 8,
										 .owners = 4, .tell = 1 },
						 &err);
	CHECK(h != NULL && agent_share_limit(h) == 2 && agent_share_capacity(h) == 8);

	/* One owner takes its share and is refused past it; the others are not. */
	CHECK(agent_share_take(h, "pod-a", "pid 1", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-a", "pid 1", NULL, &err) == 0);
	int t = -1;
	CHECK(agent_share_take(h, "pod-a", "pid 1", &t, &err) == -EDQUOT && t == 1);
	CHECK(strstr(err.msg, "pod-a") != NULL && strstr(err.msg, "share") != NULL);
	CHECK(wait_told(1));
	CHECK_STR(told_owner, "pod-a");
	CHECK_STR(told_table, "holds");
	CHECK(strstr(told_note, "eviction holds refused for pid 1") != NULL && strstr(told_note, "2 of 8") != NULL);
	/* Told once per window: the next refusals are counted, not told. */
	CHECK(agent_share_take(h, "pod-a", "pid 1", &t, &err) == -EDQUOT && t == 0);
	CHECK(agent_share_take(h, "pod-a", "pid 1", &t, &err) == -EDQUOT && t == 0);
	CHECK(told_count() == 1);
	CHECK(agent_share_take(h, "pod-b", "pid 2", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-b", "pid 2", NULL, &err) == 0);
	CHECK(agent_share_used(h, "pod-a") == 2 && agent_share_used(h, "pod-b") == 2 && agent_share_used(h, "c") == 0);
	/* A give reopens the owner's share. */
	agent_share_give(h, "pod-a");
	CHECK(agent_share_used(h, "pod-a") == 1);
	CHECK(agent_share_take(h, "pod-a", "pid 1", NULL, &err) == 0);

	struct agent_share_stat st = { 0 };
	agent_shares_each(ss, stat_cb, &st);
	CHECK(st.capacity == 8 && st.per_owner == 2 && st.in_use == 4 && st.owners == 2 && st.refused == 3);

	/* More owners than expected: the table's own bound, -ENOSPC, whoever asks. */
	CHECK(agent_share_take(h, "pod-c", "", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-c", "", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-d", "", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-d", "", NULL, &err) == 0);
	CHECK(agent_share_take(h, "pod-e", "pid 5", &t, &err) == -ENOSPC && t == 1);
	CHECK(wait_told(2));
	CHECK_STR(told_owner, "pod-e");
	CHECK(strstr(told_note, "full") != NULL);
	/* An owner "" (outside pods): only the capacity. */
	agent_share_give(h, "pod-d");
	CHECK(agent_share_take(h, "", "pid 9", NULL, &err) == 0);
	CHECK(agent_share_take(h, "", "pid 9", NULL, &err) == -ENOSPC);
	agent_share_give(h, "");
	CHECK(agent_share_take(h, "", "pid 9", NULL, &err) == 0);

	/* A configured share wins over the rule; never more than the capacity. */
	struct agent_share *w = agent_shares_add(ss, &(struct agent_share_cfg){ .name = "workers", .what = "workers",
										 .owner = "namespace", .capacity = 4,
										 .per_owner = 9 },
						 &err);
	CHECK(w != NULL && agent_share_limit(w) == 4);
	/* Owners come and go: a table keeps counting correctly after many owners passed through. */
	struct agent_share *r = agent_shares_add(ss, &(struct agent_share_cfg){ .name = "registry", .what = "entries",
										 .capacity = 4, .per_owner = 1 },
						 &err);
	CHECK(r != NULL);
	int ok = 1;
	for (int i = 0; i < 1000 && ok; i++) {
		char key[32];
		snprintf(key, sizeof(key), "pod-%d", i);
		ok = agent_share_take(r, key, "", NULL, &err) == 0 && agent_share_take(r, key, "", NULL, &err) == -EDQUOT;
		agent_share_give(r, key);
	}
	CHECK(ok);
	CHECK(agent_share_take(r, "x1", "", NULL, &err) == 0 && agent_share_take(r, "x2", "", NULL, &err) == 0 &&
	      agent_share_take(r, "x3", "", NULL, &err) == 0 && agent_share_take(r, "x4", "", NULL, &err) == 0);
	CHECK(agent_share_take(r, "x5", "", NULL, &err) == -ENOSPC);
	agent_shares_free(ss);
	agent_shares_free(NULL);
	return test_summary("test_agent_share");
}
