/* gcr_log: level parsing and the single write(2) per line that keeps lines whole. */
#include "gcr_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int gcr_log_level = GCR_LOG_WARN;

static const char *const level_names[] = { "error", "warn", "info", "debug" };

void gcr_log_init(enum gcr_log_level default_level)
{
	const char *v = getenv("GCR_LOG_LEVEL");
	gcr_log_level = default_level;
	if (v == NULL)
		return;
	for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0])); i++)
		if (strcmp(v, level_names[i]) == 0)
			gcr_log_level = i;
}

void gcr_log_write(enum gcr_log_level level, const char *component, const char *fmt, ...)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "%s %s: ", level_names[level], component);
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	size_t len = (size_t)n + (size_t)m;
	if (len > sizeof(line) - 2)
		len = sizeof(line) - 2;
	line[len++] = '\n';
	/* One write per line so lines from several threads never interleave. */
	ssize_t w = write(STDERR_FILENO, line, len);
	(void)w;
}
