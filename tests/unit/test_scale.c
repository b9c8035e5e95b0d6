/* test_scale: lib/gcr_scale's policy: counts, who is suspended or resumed first,
 * operations in flight, unmanaged members, a target changed mid-scale. */
#include <errno.h>
#include <string.h>

#include "gcr_scale.h"
#include "util.h"

#define M(id_, st_, t_, c_) { .id = (id_), .state = (st_), .last_active = (t_), .recent_calls = (c_) }

static const char *acted(const struct gcr_scale_member *m, size_t n, enum gcr_scale_action a, char *buf, size_t len)
{
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++)
		if (m[i].action == a) {
			strncat(buf, m[i].id, len - strlen(buf) - 1);
			strncat(buf, " ", len - strlen(buf) - 1);
		}
	return buf;
}

static void test_down_and_up(void)
{
	struct gcr_scale_member m[] = {
		M("a", GCR_SCALE_RESIDENT, 300, 5), M("b", GCR_SCALE_RESIDENT, 100, 9),
		M("c", GCR_SCALE_RESIDENT, 200, 1),
	};
	struct gcr_scale_plan p;
	struct gcr_err err;
	char buf[64];
	CHECK(gcr_scale_plan(m, 3, 1, &p, &err) == 0);
	CHECK(p.resident == 3 && p.to_suspend == 2 && p.to_resume == 0 && p.waiting == 0);
	CHECK_STR(acted(m, 3, GCR_SCALE_SUSPEND, buf, sizeof(buf)), "b c "); /* least recently active */
	CHECK(gcr_scale_plan(m, 3, 3, &p, &err) == 0);
	CHECK(p.to_suspend == 0 && p.to_resume == 0);
	CHECK(gcr_scale_plan(m, 3, 0, &p, &err) == 0 && p.to_suspend == 3);
	CHECK(gcr_scale_plan(m, 3, 7, &p, &err) == 0 && p.to_resume == 0 && p.waiting == 0);

	m[0].state = m[1].state = m[2].state = GCR_SCALE_SUSPENDED;
	CHECK(gcr_scale_plan(m, 3, 2, &p, &err) == 0);
	CHECK(p.suspended == 3 && p.to_resume == 2);
	CHECK_STR(acted(m, 3, GCR_SCALE_RESUME, buf, sizeof(buf)), "a c "); /* most recently active */
	CHECK(gcr_scale_plan(m, 3, -1, &p, &err) == -EINVAL && err.code == -EINVAL);
}

static void test_ties(void)
{
	/* Same last activity: fewer recent calls goes first, then the id. */
	struct gcr_scale_member m[] = {
		M("z", GCR_SCALE_RESIDENT, 0, 10), M("y", GCR_SCALE_RESIDENT, 0, 3), M("x", GCR_SCALE_RESIDENT, 0, 3),
	};
	struct gcr_scale_plan p;
	struct gcr_err err;
	char buf[64];
	CHECK(gcr_scale_plan(m, 3, 1, &p, &err) == 0);
	CHECK_STR(acted(m, 3, GCR_SCALE_SUSPEND, buf, sizeof(buf)), "y x ");
	CHECK(gcr_scale_plan(m, 3, 2, &p, &err) == 0);
	CHECK_STR(acted(m, 3, GCR_SCALE_SUSPEND, buf, sizeof(buf)), "x ");
}

static void test_in_flight(void)
{
	/* Scaling to 0 is under way (two suspending); the target goes back to 3: the
	 * settled one is resumed now, the two wait until their suspend ends. */
	struct gcr_scale_member m[] = {
		M("a", GCR_SCALE_SUSPENDING, 1, 0), M("b", GCR_SCALE_SUSPENDING, 2, 0),
		M("c", GCR_SCALE_SUSPENDED, 3, 0), M("d", GCR_SCALE_UNMANAGED, 9, 9),
	};
	struct gcr_scale_plan p;
	struct gcr_err err;
	char buf[64];
	CHECK(gcr_scale_plan(m, 4, 3, &p, &err) == 0);
	CHECK(p.to_resume == 1 && p.waiting == 2 && p.unmanaged == 1 && p.suspending == 2);
	CHECK_STR(acted(m, 4, GCR_SCALE_RESUME, buf, sizeof(buf)), "c ");
	CHECK(m[3].action == GCR_SCALE_NONE); /* never touched */
	/* Resumes in flight count as resident: scaling to 1 suspends nobody else, waits. */
	struct gcr_scale_member r[] = {
		M("a", GCR_SCALE_RESUMING, 1, 0), M("b", GCR_SCALE_RESUMING, 2, 0), M("c", GCR_SCALE_SUSPENDED, 3, 0),
	};
	CHECK(gcr_scale_plan(r, 3, 1, &p, &err) == 0);
	CHECK(p.to_suspend == 0 && p.to_resume == 0 && p.waiting == 1);
	CHECK(gcr_scale_plan(r, 3, 2, &p, &err) == 0 && p.to_suspend == 0 && p.to_resume == 0 && p.waiting == 0);
	/* A pinned member (a recent failure) is counted but never chosen. */
	struct gcr_scale_member q[] = { M("a", GCR_SCALE_RESIDENT, 1, 0), M("b", GCR_SCALE_RESIDENT, 2, 0) };
	q[0].pinned = 1;
	CHECK(gcr_scale_plan(q, 2, 0, &p, &err) == 0 && p.resident == 2 && p.to_suspend == 1 && p.waiting == 1);
	CHECK(q[0].action == GCR_SCALE_NONE && q[1].action == GCR_SCALE_SUSPEND);
	/* Empty set: nothing to do, any target. */
	CHECK(gcr_scale_plan(NULL, 0, 5, &p, &err) == 0 && p.to_resume == 0 && p.waiting == 0);
}

static void test_names(void)
{
	CHECK_STR(gcr_scale_state_name(GCR_SCALE_SUSPENDING), "Suspending");
	CHECK_STR(gcr_scale_state_name((enum gcr_scale_state)42), "Unknown");
	CHECK_STR(gcr_scale_action_name(GCR_SCALE_RESUME), "resume");
}

static void test_run_nothing(void)
{
	/* No action: no thread, no call, all fine; a pid without a shim fails alone. */
	struct gcr_scale_proc p[2] = { { .pid = 1, .action = GCR_SCALE_NONE },
				       { .pid = 4000000, .action = GCR_SCALE_SUSPEND } };
	struct gcr_cr_opts o = { .socket_dir = "/nonexistent", .mode = GCR_CR_DATA_ONLY, .timeout_ms = 1000 };
	double ms = -1;
	CHECK(gcr_scale_run(p, 1, &o, &ms) == 0 && ms >= 0);
	CHECK(gcr_scale_run(p, 2, &o, &ms) < 0);
	CHECK(p[0].rc == 0 && p[1].rc < 0 && p[1].err.msg[0] != '\0' && p[1].ms_done >= 0);
	gcr_scale_procs_clear(p, 2);
	long long calls = 7;
	struct gcr_err err;
	CHECK(gcr_scale_calls(4000000, "/nonexistent", &calls, &err) < 0 && calls == 0);
}

int main(void)
{
	test_down_and_up();
	test_ties();
	test_in_flight();
	test_names();
	test_run_nothing();
	return test_summary("test_scale");
}
