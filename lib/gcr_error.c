/* gcr_error: fills the caller-owned error record; formatting only, no allocation. */
#include "gcr_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Length of the valid UTF-8 sequence at s (RFC 3629: no overlongs, surrogates or values
 * past U+10FFFF), 0 if invalid or cut short by the terminator. */
static size_t utf8_seq(const unsigned char *s)
{
	unsigned char c = s[0];
	size_t n;
	unsigned char lo = 0x80, hi = 0xBF; /* the allowed range of the second byte */
	if (c < 0x80)
		return 1;
	if (c >= 0xC2 && c <= 0xDF)
		n = 2;
	else if (c >= 0xE0 && c <= 0xEF) {
		n = 3;
		lo = c == 0xE0 ? 0xA0 : 0x80;
		hi = c == 0xED ? 0x9F : 0xBF;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		lo = c == 0xF0 ? 0x90 : 0x80;
		hi = c == 0xF4 ? 0x8F : 0xBF;
	} else
		return 0;
	if (s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < n; i++)
		if (s[i] < 0x80 || s[i] > 0xBF)
			return 0;
	return n;
}

size_t gcr_err_utf8_clean(char *s)
{
	unsigned char *p = (unsigned char *)s;
	size_t i = 0;
	while (p[i] != '\0') {
		size_t n = utf8_seq(p + i);
		if (n > 0) {
			i += n;
			continue;
		}
		/* A lead byte whose sequence the terminator cuts: the tail of a truncation. */
		int cut = p[i] >= 0xC2 && p[i] <= 0xF4;
		for (size_t k = i + 1; cut && p[k] != '\0'; k++)
			if (p[k] < 0x80 || p[k] > 0xBF || k - i >= 3)
				cut = 0;
		if (cut) {
			p[i] = '\0';
			break;
		}
		p[i++] = '?';
	}
	return i;
}

int gcr_err_set(struct gcr_err *err, int code, const char *fmt, ...)
{
	if (err == NULL)
		return code;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	/* The message goes into JSON replies, which must be valid UTF-8: neither the cut
	 * at the buffer's end nor bytes from outside (a driver's string) may break it. */
	gcr_err_utf8_clean(err->msg);
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
	gcr_err_utf8_clean(err->msg);
	return err->code;
}

void gcr_err_clear(struct gcr_err *err)
{
	if (err == NULL)
		return;
	err->code = 0;
	err->msg[0] = '\0';
}
