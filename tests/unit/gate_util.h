/* gate_util: for unit tests of the shim's gate: waiting, bounded, until a caller started on
 * another thread is seen waiting at the closed gate (its wait counter moves). */
#ifndef GCR_TEST_GATE_UTIL_H
#define GCR_TEST_GATE_UTIL_H

#include <sched.h>
#include <stdint.h>

#include "shim_gate.h"

/* 1 once shim_gate_waits() exceeds before, 0 if it never does within the bound. */
static inline int test_gate_wait_seen(uint64_t before)
{
	for (long i = 0; i < 200000000L; i++) {
		if (shim_gate_waits() > before)
			return 1;
		sched_yield();
	}
	return 0;
}

#endif
