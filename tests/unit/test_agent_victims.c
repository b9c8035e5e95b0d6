/* test_agent_victims: the overcommit policy's choice of victims (agent_victims_pick): priority,
 * least recently active, never-suspend, eligibility, and "just enough". */
#include "agent_victims.h"
#include "util.h"

#include <errno.h>

#define MIB (1ULL << 20)

/* A candidate: eligible and preemptible unless said otherwise. */
#define V(pid, prio, last, mib) { (pid), (prio), 1, 1, (last), (unsigned long long)(mib) * MIB }

static int picked(const int *out, int k, int idx)
{
	for (int i = 0; i < k; i++)
		if (out[i] == idx)
			return 1;
	return 0;
}

static void test_priority_first(void)
{
	struct agent_victim c[] = { V(10, 5, 1.0, 100), V(11, 1, 9.0, 100), V(12, 3, 1.0, 100) };
	int out[3];
	unsigned long long freed;
	/* 100 MiB: the lowest priority alone, even though it was active most recently. */
	int k = agent_victims_pick(c, 3, 10, 100 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 1 && freed == 100 * MIB);
	/* 150 MiB: the two lowest, lowest first. */
	k = agent_victims_pick(c, 3, 10, 150 * MIB, out, &freed);
	CHECK(k == 2 && out[0] == 1 && out[1] == 2 && freed == 200 * MIB);
	/* Strictly lower: a requester of priority 3 may take only priority 1. */
	k = agent_victims_pick(c, 3, 3, 100 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 1);
	k = agent_victims_pick(c, 3, 3, 150 * MIB, out, &freed);
	CHECK(k == -ENOSPC && freed == 100 * MIB);
	/* Equal priority never: a requester of priority 1 takes nobody. */
	k = agent_victims_pick(c, 3, 1, 1, out, &freed);
	CHECK(k == -ENOSPC && freed == 0);
}

static void test_lru(void)
{
	/* Same priority: the least recently active first; unknown activity (0) counts as oldest. */
	struct agent_victim c[] = { V(20, 1, 50.0, 100), V(21, 1, 10.0, 100), V(22, 1, 0.0, 100) };
	int out[3];
	unsigned long long freed;
	int k = agent_victims_pick(c, 3, 2, 100 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 2);
	k = agent_victims_pick(c, 3, 2, 200 * MIB, out, &freed);
	CHECK(k == 2 && out[0] == 2 && out[1] == 1);
	/* Same priority and activity: the bigger first (fewer suspends), then the lower pid. */
	struct agent_victim d[] = { V(31, 1, 5.0, 10), V(30, 1, 5.0, 10), V(32, 1, 5.0, 80) };
	k = agent_victims_pick(d, 3, 2, 50 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 2);
	k = agent_victims_pick(d, 3, 2, 85 * MIB, out, &freed);
	CHECK(k == 2 && out[0] == 2 && out[1] == 1);
}

static void test_never_and_ineligible(void)
{
	struct agent_victim c[] = { V(40, 0, 1.0, 500), V(41, 1, 1.0, 100), V(42, 1, 1.0, 300) };
	c[0].preemptible = 0; /* never suspend: the biggest and lowest, yet never chosen */
	c[2].eligible = 0;    /* another GPU, not opted in, or held already */
	int out[3];
	unsigned long long freed;
	int k = agent_victims_pick(c, 3, 10, 100 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 1);
	k = agent_victims_pick(c, 3, 10, 101 * MIB, out, &freed);
	CHECK(k == -ENOSPC && freed == 100 * MIB);
	CHECK(!picked(out, 0, 0));
	/* No bytes on the GPU: not a candidate (suspending it frees nothing there). */
	struct agent_victim z[] = { V(50, 0, 1.0, 0) };
	k = agent_victims_pick(z, 1, 10, 1, out, &freed);
	CHECK(k == -ENOSPC);
}

static void test_just_enough(void)
{
	/* In order a (10 MiB), b (500 MiB): taking both reaches 400, but b alone does: a is put back. */
	struct agent_victim c[] = { V(60, 1, 1.0, 10), V(61, 2, 1.0, 500) };
	int out[2];
	unsigned long long freed;
	int k = agent_victims_pick(c, 2, 10, 400 * MIB, out, &freed);
	CHECK(k == 1 && out[0] == 1 && freed == 500 * MIB);
	/* Nothing needed: nobody. */
	k = agent_victims_pick(c, 2, 10, 0, out, &freed);
	CHECK(k == 0 && freed == 0);
	/* Exactly enough: both, the sum equal to the need. */
	k = agent_victims_pick(c, 2, 10, 510 * MIB, out, &freed);
	CHECK(k == 2 && freed == 510 * MIB);
	/* No candidates at all. */
	k = agent_victims_pick(c, 0, 10, 1, out, &freed);
	CHECK(k == -ENOSPC);
}

int main(void)
{
	test_priority_first();
	test_lru();
	test_never_and_ineligible();
	test_just_enough();
	return test_summary("test_agent_victims");
}
