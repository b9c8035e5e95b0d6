/* Tiny shared helpers for the C unit tests: CHECK records a failure and goes on,
 * each test binary ends with one "N passed, N failed" line and a matching exit code. */
#ifndef GCR_TEST_UTIL_H
#define GCR_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_passed, test_failed;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (cond) {                                                           \
			test_passed++;                                                \
		} else {                                                              \
			test_failed++;                                                \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
		}                                                                     \
	} while (0)

#define CHECK_STR(a, b) CHECK((a) != NULL && strcmp((a), (b)) == 0)

/* A test's time bound ms, stretched by GCR_TEST_TIME_SCALE (1 to 50; the valgrind and
 * sanitizer tiers set it): deadlines a live peer must meet (answers, handshakes) are not what a
 * test checks, and under valgrind on a loaded machine a peer takes many times longer. The
 * bounds a test checks against stretch with them, so what it asserts stays the same. */
static inline long test_ms(long ms)
{
	const char *e = getenv("GCR_TEST_TIME_SCALE");
	long k = e != NULL ? strtol(e, NULL, 10) : 1;
	return ms * (k < 1 ? 1 : k > 50 ? 50 : k);
}

static inline int test_summary(const char *name)
{
	printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
	return test_failed == 0 && test_passed > 0 ? 0 : 1;
}

#endif
