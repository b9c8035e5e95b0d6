/* agent_opts: typed option rows, as redis's config table has them: each row names an option (its
 * flag, and its key in the YAML file), its type (string, bool, integer with bounds, enum of
 * names), its default and its help, and where its value goes in the caller's struct. A value is
 * parsed and checked when it is set, so the agent holds booleans and numbers, never strings to
 * compare, and a bad one is refused naming the option and what it takes. */
#ifndef AGENT_OPTS_H
#define AGENT_OPTS_H

#include <stddef.h>
#include <stdio.h>

#include "gcr_error.h"

enum agent_opt_type {
	AGENT_OPT_STR,  /* char * (owned by the struct; NULL: not given, no default) */
	AGENT_OPT_BOOL, /* bool: "true" or "false" */
	AGENT_OPT_INT,  /* long in lo..hi (and -1 with never) */
	AGENT_OPT_ENUM, /* int: the index of one of names */
};

struct agent_opt {
	const char *name;  /* the flag, "overcommit-mode" */
	const char *camel; /* the file's key, "overcommitMode" */
	enum agent_opt_type type;
	size_t off;               /* the slot's offset in the caller's struct */
	const char *def;          /* the default as text (NULL: a string with none; others must have one) */
	long lo, hi;              /* AGENT_OPT_INT's bounds */
	int never;                /* AGENT_OPT_INT: -1 is taken too (it means "never") */
	const char *const *names; /* AGENT_OPT_ENUM: NULL-terminated */
	const char *help;
	int nonempty;   /* AGENT_OPT_STR: "" is refused */
	int empty_none; /* AGENT_OPT_STR: "" means not given (NULL) */
};

/* Sets every row of rows (n) in base to its default: 0, or -EINVAL naming a row whose default
 * is not a value of its type (a mistake in the table), -ENOMEM. */
int agent_opts_defaults(const struct agent_opt *rows, size_t n, void *base, struct gcr_err *err);

/* Sets the option key (a flag's name or a file key) to value, parsed and checked: 0; -EINVAL
 * ("unknown option 'key'", or "--name: 'value' is not ..."); -ENOMEM. */
int agent_opts_set(const struct agent_opt *rows, size_t n, void *base, const char *key, const char *value,
		   struct gcr_err *err);

/* The same for a section of the file (the chart's devicePlugin: the rows' camel keys): errors
 * name the key as "section.key", and a key no row has is -ENOENT (err says so; the caller may
 * ignore it: a newer chart still starts an older agent). */
int agent_opts_set_in(const struct agent_opt *rows, size_t n, void *base, const char *section, const char *key,
		      const char *value, struct gcr_err *err);

/* The row named key (flag or file key), or NULL. */
const struct agent_opt *agent_opts_find(const struct agent_opt *rows, size_t n, const char *key);

/* Frees the strings of base (every AGENT_OPT_STR slot, then NULL). */
void agent_opts_free(const struct agent_opt *rows, size_t n, void *base);

/* One line per row: "  --name  help [default]". */
void agent_opts_usage(FILE *f, const struct agent_opt *rows, size_t n);

#endif
