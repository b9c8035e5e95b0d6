/* gcr_error: fills the caller-owned error record; formatting only, no allocation. */
#include "gcr_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int gcr_err_set(struct gcr_err *err, int code, const char *fmt, ...)
{
	if (err == NULL)
		return code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	err->code = code;
	return code;
}

int gcr_err_wrap(struct gcr_err *err, const char *fmt, ...)
{
	if (err == NULL)
		return -1;
	char prefix[GCR_ERR_MSG_MAX], old[GCR_ERR_MSG_MAX];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	snprintf(err->msg, sizeof(err->msg), "%s: %s", prefix, old);
	return err->code;
}

void gcr_err_clear(struct gcr_err *err)
{
	if (err == NULL)
		return;
	err->code = 0;
	err->msg[0] = '\0';
}
