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
	char buf[2 * GCR_ERR_MSG_MAX + 2];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, GCR_ERR_MSG_MAX, fmt, ap);
	va_end(ap);
	if (n < 0)
		return err->code;
	size_t len = strlen(buf);
	memcpy(buf + len, ": ", 2);
	memcpy(buf + len + 2, err->msg, strnlen(err->msg, GCR_ERR_MSG_MAX - 1) + 1);
	memcpy(err->msg, buf, GCR_ERR_MSG_MAX - 1);
	err->msg[GCR_ERR_MSG_MAX - 1] = '\0';
	return err->code;
}

void gcr_err_clear(struct gcr_err *err)
{
	if (err == NULL)
		return;
	err->code = 0;
	err->msg[0] = '\0';
}
