/* gcr_log: one-line logs, "LEVEL component: message", to stderr.
 * The level is read once from GCR_LOG_LEVEL; a disabled level costs one compare. */
#ifndef GCR_LOG_H
#define GCR_LOG_H

enum gcr_log_level { GCR_LOG_ERROR = 0, GCR_LOG_WARN, GCR_LOG_INFO, GCR_LOG_DEBUG };

/* Level in force; set from GCR_LOG_LEVEL (error|warn|info|debug) by gcr_log_init. */
extern int gcr_log_level;

/* default_level applies when GCR_LOG_LEVEL is unset (the shim passes ERROR). */
void gcr_log_init(enum gcr_log_level default_level);

void gcr_log_write(enum gcr_log_level level, const char *component, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* For a library preloaded into someone else's process (the shim) that cannot do its job:
 * the first problem of the process prints "gcr: <message>" on stderr whatever the level,
 * so it is never silent; later ones are ordinary warnings. */
void gcr_log_problem(const char *component, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The level is checked before the arguments are evaluated. */
#define GCR_LOG(level, component, ...)                                      \
	do {                                                                \
		if ((int)(level) <= gcr_log_level)                          \
			gcr_log_write((level), (component), __VA_ARGS__);   \
	} while (0)

#endif
