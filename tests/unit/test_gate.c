/* test_gate: the submission gate lets calls through while open, waits for calls in
 * flight when closing, holds new callers until it opens (telling the wait hook), and gives up
 * cleanly. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "shim_gate.h"
#include "gate_util.h"
#include "util.h"

static atomic_int inside, passed;
static atomic_int release_inside;

/* Enters, signals it is inside, and stays until told to leave. */
static void *hold_inside(void *arg)
{
	(void)arg;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0);
	atomic_store(&inside, 1);
	while (!atomic_load(&release_inside))
		sched_yield();
	shim_gate_exit(t);
	return NULL;
}

static atomic_int hook_calls;

/* The wait hook: called by the waiting thread, before it waits, while the gate is closed. */
static void count_hook(void)
{
	atomic_fetch_add(&hook_calls, 1);
}

static void *enter_once(void *arg)
{
	(void)arg;
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemcpyHtoD_v2), 1);
	atomic_store(&passed, 1);
	shim_gate_exit(t);
	return NULL;
}

/* Bounded wait on a condition another thread makes true (no fixed sleeps). */
static int wait_for(atomic_int *flag, int want)
{
	for (long i = 0; i < 200000000L; i++) {
		if (atomic_load(flag) == want)
			return 1;
		sched_yield();
	}
	return 0;
}

int main(void)
{
	struct gcr_err err;

	/* Open: calls pass and are counted per hook and variant. */
	for (int i = 0; i < 5; i++)
		shim_gate_exit(shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0));
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0) == 5);
	/* One gate for both vendors, each hook on its own row: a HIP launch is not a CUDA one. */
	shim_gate_exit(shim_gate_enter(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipLaunchKernel), 1));
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipLaunchKernel), 1) == 1);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_HIP, SHIM_HIP_HOOK_hipLaunchKernel), 0) == 0);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0) == 5);
	CHECK(SHIM_HOOK_ROW(SHIM_HIP, 0) == SHIM_HOOK_COUNT && SHIM_HOOK_ROW(SHIM_CUDA, 0) == 0);
	CHECK(shim_gate_close(1000, &err) == 0 && shim_gate_is_closed());
	shim_gate_open();
	CHECK(!shim_gate_is_closed());

	/* Quiet: only a closed gate's (set after the synchronisation), cleared when it opens. */
	shim_gate_set_quiet();
	CHECK(!shim_gate_quiet());
	CHECK(shim_gate_close(1000, &err) == 0 && !shim_gate_quiet());
	shim_gate_set_quiet();
	CHECK(shim_gate_quiet());
	shim_gate_open();
	CHECK(!shim_gate_quiet());

	/* A call in flight that never returns: close gives up with -EBUSY and reopens. */
	pthread_t holder;
	pthread_create(&holder, NULL, hold_inside, NULL);
	CHECK(wait_for(&inside, 1));
	CHECK(shim_gate_close(50, &err) == -EBUSY);
	CHECK(!shim_gate_is_closed());

	/* Once it returns, close succeeds. */
	atomic_store(&release_inside, 1);
	pthread_join(holder, NULL);
	CHECK(shim_gate_close(1000, &err) == 0);

	/* A caller arriving while closed waits at the gate until it opens. */
	uint64_t waits = shim_gate_waits();
	pthread_t caller;
	pthread_create(&caller, NULL, enter_once, NULL);
	CHECK(test_gate_wait_seen(waits));
	CHECK(atomic_load(&passed) == 0);
	shim_gate_open();
	pthread_join(caller, NULL);
	CHECK(atomic_load(&passed) == 1);
	CHECK(shim_gate_total_calls(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuMemcpyHtoD_v2), 1) == 1);

	/* The wait hook: each caller about to wait runs it once; the waiting count and the first
	 * arrival follow; the open gate never calls it. */
	shim_gate_set_wait_hook(count_hook);
	shim_gate_exit(shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0));
	CHECK(atomic_load(&hook_calls) == 0);
	double since = -1;
	CHECK(shim_gate_waiting(&since) == 0 && since == 0);
	CHECK(shim_gate_close(1000, &err) == 0);
	atomic_store(&passed, 0);
	waits = shim_gate_waits();
	pthread_t c1, c2;
	pthread_create(&c1, NULL, enter_once, NULL);
	CHECK(test_gate_wait_seen(waits));
	pthread_create(&c2, NULL, enter_once, NULL);
	CHECK(test_gate_wait_seen(waits + 1));
	CHECK(wait_for(&hook_calls, 2));
	for (long i = 0; i < 200000000L && shim_gate_waiting(NULL) < 2; i++)
		sched_yield();
	CHECK(shim_gate_waiting(&since) == 2 && since > 0);
	shim_gate_open();
	pthread_join(c1, NULL);
	pthread_join(c2, NULL);
	CHECK(shim_gate_waiting(NULL) == 0 && atomic_load(&hook_calls) == 2);
	shim_gate_set_wait_hook(NULL);

	/* A thread already inside a gated call may nest without blocking itself. */
	struct shim_thread *t = shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0);
	atomic_store(&inside, 0);
	atomic_store(&release_inside, 0);
	shim_gate_exit(shim_gate_enter(SHIM_HOOK_ROW(SHIM_CUDA, SHIM_HOOK_cuLaunchKernel), 0));
	shim_gate_exit(t);
	CHECK(shim_gate_close(1000, &err) == 0);
	shim_gate_open();
	return test_summary("test_gate");
}
