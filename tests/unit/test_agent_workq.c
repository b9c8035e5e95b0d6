/* test_agent_workq: the work queue's semantics: de-duplicated adds, a key never with two workers
 * and queued again when added during its processing, delayed adds not before their time (the
 * earlier of two kept), the per-key backoff, claims and parking, shutdown, and under four
 * workers and a producer no key processed twice at once nor an add lost. */
#include "agent_workq.h"
#include "util.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr_time.h"

static int get_now(struct agent_workq *q, char *key, size_t len)
{
	/* Only called when something is queued: get would block otherwise. */
	return agent_workq_len(q) > 0 ? agent_workq_get(q, key, len) : -1;
}

struct getter {
	struct agent_workq *q;
	int rc;
	char key[AGENT_WORKQ_KEY_MAX];
	double at; /* monotonic ms when get returned */
};

static void *getter_main(void *data)
{
	struct getter *g = data;
	g->rc = agent_workq_get(g->q, g->key, sizeof(g->key));
	g->at = gcr_time_mono_ms();
	return NULL;
}

/* The stress: four workers; each key's "busy" flag must never be found set on entry. */
#define NKEYS 20
#define ROUNDS 3000
static atomic_int busy[NKEYS], overlap, processed[NKEYS];
/* adds[k] counts k's adds, raised before each; a worker that got k notes what it read then. An
 * add lost (k queued or processing, the add dropped) leaves seen[k] short of adds[k] forever. */
static atomic_int adds[NKEYS], seen[NKEYS];

static void *worker_main(void *data)
{
	struct agent_workq *q = data;
	char key[32];
	while (agent_workq_get(q, key, sizeof(key)) == 1) {
		int k = atoi(key + 1);
		if (atomic_exchange(&busy[k], 1) != 0)
			atomic_fetch_add(&overlap, 1);
		atomic_store(&seen[k], atomic_load(&adds[k]));
		atomic_fetch_add(&processed[k], 1);
		atomic_store(&busy[k], 0);
		agent_workq_done(q, key);
	}
	return NULL;
}

int main(void)
{
	char key[AGENT_WORKQ_KEY_MAX];
	CHECK(agent_workq_new(0, 10) == NULL);
	CHECK(agent_workq_new(10, 5) == NULL);
	struct agent_workq *q = agent_workq_new(20, 160);
	CHECK(q != NULL);

	/* De-duplicated, first in first out. */
	CHECK(agent_workq_add(q, "a") == 0 && agent_workq_add(q, "b") == 0 && agent_workq_add(q, "a") == 0);
	CHECK(agent_workq_len(q) == 2);
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "a") == 0);
	/* a is being processed: an add marks it, it is not handed out again before its done. */
	CHECK(agent_workq_add(q, "a") == 0);
	CHECK(agent_workq_len(q) == 1);
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "b") == 0);
	CHECK(agent_workq_len(q) == 0);
	agent_workq_done(q, "b");
	CHECK(agent_workq_len(q) == 0); /* b was not added again */
	agent_workq_done(q, "a");
	CHECK(agent_workq_len(q) == 1); /* a was */
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "a") == 0);
	agent_workq_done(q, "a");
	agent_workq_done(q, "nothing"); /* never queued: ignored */
	CHECK(agent_workq_len(q) == 0);

	/* A key that does not fit is refused, not cut. */
	char longkey[AGENT_WORKQ_KEY_MAX + 1];
	memset(longkey, 'x', sizeof(longkey) - 1);
	longkey[sizeof(longkey) - 1] = '\0';
	CHECK(agent_workq_add(q, longkey) == -ENAMETOOLONG);
	CHECK(agent_workq_claim(q, longkey, "k") == -ENAMETOOLONG);
	CHECK(agent_workq_len(q) == 0);
	/* A short buffer gets the key cut, NUL-terminated. */
	CHECK(agent_workq_add(q, "abcdef") == 0);
	char small[4];
	CHECK(get_now(q, small, sizeof(small)) == 1 && strcmp(small, "abc") == 0);
	agent_workq_done(q, "abcdef");

	/* Delayed: not queued before its time; of two delays the earlier counts. */
	CHECK(agent_workq_add_after(q, "later", 5000) == 0);
	CHECK(agent_workq_add_after(q, "later", 150) == 0);
	CHECK(agent_workq_waiting(q, "later") == 1 && agent_workq_len(q) == 0);
	struct getter g = { .q = q };
	pthread_t th;
	double t0 = gcr_time_mono_ms();
	CHECK(pthread_create(&th, NULL, getter_main, &g) == 0);
	pthread_join(th, NULL);
	CHECK(g.rc == 1 && strcmp(g.key, "later") == 0);
	CHECK(g.at - t0 >= 140); /* not before its time (the 5 s one was replaced, or this would block) */
	CHECK(agent_workq_waiting(q, "later") == 0);
	agent_workq_done(q, "later");
	CHECK(agent_workq_add_after(q, "now", 0) == 0 && agent_workq_len(q) == 1); /* 0 ms: at once */
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "now") == 0);
	/* A timer that comes due while its key is processed queues it at the done. */
	CHECK(agent_workq_add_after(q, "now", 30) == 0);
	usleep(60 * 1000);
	CHECK(agent_workq_len(q) == 0);
	agent_workq_done(q, "now");
	CHECK(agent_workq_len(q) == 1); /* len, like get, queues what came due */
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "now") == 0);
	agent_workq_done(q, "now");

	/* Backoff: 20, 40, 80, 160, 160; forgotten, 20 again. */
	int want[] = { 20, 40, 80, 160, 160 };
	for (int i = 0; i < 5; i++)
		CHECK(agent_workq_backoff(q, "r") == want[i]);
	CHECK(agent_workq_waiting(q, "r") == 1 && agent_workq_backoff_ms(q, "r") == 160);
	agent_workq_forget(q, "r");
	CHECK(agent_workq_backoff_ms(q, "r") == 0 && agent_workq_backoff_ms(q, "never") == 0);
	CHECK(agent_workq_backoff(q, "r") == 20);
	CHECK(agent_workq_get(q, key, sizeof(key)) == 1 && strcmp(key, "r") == 0);
	agent_workq_done(q, "r");
	agent_workq_forget(q, "r");

	/* Claims: one key per owner; the others parked on it until the release. */
	CHECK(agent_workq_claim(q, "ns/pod", "c:ns/one") == 1);
	CHECK(agent_workq_claim(q, "ns/pod", "c:ns/two") == 0);
	CHECK(agent_workq_claim(q, "ns/pod", "c:ns/two") == 0); /* parked once */
	CHECK(agent_workq_claim(q, "ns/other", "c:ns/three") == 1);
	CHECK(agent_workq_len(q) == 0);
	agent_workq_release(q, "ns/pod");
	CHECK(agent_workq_len(q) == 1);
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "c:ns/two") == 0);
	CHECK(agent_workq_claim(q, "ns/pod", "c:ns/two") == 1);
	agent_workq_release(q, "ns/pod");
	agent_workq_done(q, "c:ns/two");
	agent_workq_release(q, "ns/other");
	CHECK(agent_workq_len(q) == 0);
	/* Parking on any place. */
	CHECK(agent_workq_park(q, "share:ns", "c:ns/a") == 0 && agent_workq_park(q, "share:ns", "c:ns/b") == 0);
	CHECK(agent_workq_len(q) == 0);
	agent_workq_unpark(q, "share:nobody");
	CHECK(agent_workq_len(q) == 0);
	agent_workq_unpark(q, "share:ns");
	CHECK(agent_workq_len(q) == 2);
	agent_workq_unpark(q, "share:ns"); /* once */
	CHECK(agent_workq_len(q) == 2);
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "c:ns/a") == 0);
	agent_workq_done(q, key);
	CHECK(get_now(q, key, sizeof(key)) == 1 && strcmp(key, "c:ns/b") == 0);
	agent_workq_done(q, key);

	/* Shutdown ends a get waiting on an empty queue (whether it reached its wait before the
	 * shutdown or after: it returns 0, never blocks on), and every later one. */
	g = (struct getter){ .q = q, .rc = -1 };
	CHECK(pthread_create(&th, NULL, getter_main, &g) == 0);
	agent_workq_shutdown(q);
	pthread_join(th, NULL);
	CHECK(g.rc == 0);
	CHECK(agent_workq_add(q, "x") == 0 && agent_workq_len(q) == 0);
	CHECK(agent_workq_get(q, key, sizeof(key)) == 0);
	agent_workq_free(q);
	agent_workq_free(NULL);

	/* Four workers, one producer: no key with two workers at once, and every key processed
	 * after its last add. */
	q = agent_workq_new(1, 8);
	CHECK(q != NULL);
	pthread_t w[4];
	for (int i = 0; i < 4; i++)
		CHECK(pthread_create(&w[i], NULL, worker_main, q) == 0);
	for (int r = 0; r < ROUNDS; r++) {
		int k = r % NKEYS;
		char kk[32];
		snprintf(kk, sizeof(kk), "k%d", k);
		atomic_fetch_add(&adds[k], 1);
		if (r % 7 == 0)
			CHECK(agent_workq_add_after(q, kk, 1 + r % 3) == 0);
		else
			CHECK(agent_workq_add(q, kk) == 0);
	}
	/* Drained: every key seen after its last add (bounded wait, 10 s). */
	int all = 0;
	for (int t = 0; t < 1000 && !all; t++) {
		all = 1;
		for (int k = 0; k < NKEYS; k++)
			all &= atomic_load(&seen[k]) == atomic_load(&adds[k]);
		if (!all)
			usleep(10 * 1000);
	}
	CHECK(all);
	CHECK(atomic_load(&overlap) == 0);
	int total = 0;
	for (int k = 0; k < NKEYS; k++)
		total += atomic_load(&processed[k]);
	CHECK(total >= NKEYS && total <= ROUNDS + ROUNDS / 7); /* de-duplicated: never more than added */
	agent_workq_shutdown(q);
	for (int i = 0; i < 4; i++)
		pthread_join(w[i], NULL);
	agent_workq_free(q);
	return test_summary("test_agent_workq");
}
