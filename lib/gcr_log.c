/* gcr_log: level parsing and the single write(2) per line that keeps lines whole. */
#include "gcr_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
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

/* Formats "<prefix><message>\n" and writes it in one write(2). */
__attribute__((format(printf, 2, 0))) static void write_line(const char *prefix, const char *fmt, va_list ap)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "%s", prefix);
	if (n < 0 || (size_t)n >= sizeof(line))
		return;
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
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

void gcr_log_write(enum gcr_log_level level, const char *component, const char *fmt, ...)
{
	char prefix[64];
	snprintf(prefix, sizeof(prefix), "%s %s: ", level_names[level], component);
	va_list ap;
	va_start(ap, fmt);
	write_line(prefix, fmt, ap);
	va_end(ap);
}

/* The pid that printed its line: a forked child is another process, with its own line. */
static pid_t problem_pid;

void gcr_log_problem(const char *component, const char *fmt, ...)
{
	pid_t me = getpid();
	va_list ap;
	va_start(ap, fmt);
	if (__atomic_exchange_n(&problem_pid, me, __ATOMIC_ACQ_REL) != me) {
		write_line("gcr: ", fmt, ap);
	} else if (GCR_LOG_WARN <= gcr_log_level) {
		char prefix[64];
		snprintf(prefix, sizeof(prefix), "%s %s: ", level_names[GCR_LOG_WARN], component);
		write_line(prefix, fmt, ap);
	}
	va_end(ap);
}
