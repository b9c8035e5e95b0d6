/* gcr_error: the fixed-size, caller-owned error record every GCR function fills.
 * It never allocates, so it is safe inside preload hooks on out-of-memory paths. */
#ifndef GCR_ERROR_H
#define GCR_ERROR_H

#include <stddef.h>

#define GCR_ERR_MSG_MAX 256

struct gcr_err {
	int code;                   /* negative errno, 0 when clear */
	char msg[GCR_ERR_MSG_MAX];  /* one line, no trailing newline */
};

/* Records code (a negative errno) and a printf-style message; returns code so
 * callers can write `return gcr_err_set(err, -EINVAL, "...")`. err may be NULL. */
int gcr_err_set(struct gcr_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* Prefixes an existing message with more context ("while X: <old>"). */
int gcr_err_wrap(struct gcr_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

void gcr_err_clear(struct gcr_err *err);

/* Makes s valid UTF-8 in place, never longer: a sequence cut by the end of the string
 * (a truncation) is dropped, any other invalid byte becomes '?'. Returns the new length. */
size_t gcr_err_utf8_clean(char *s);

#endif
