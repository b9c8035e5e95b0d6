/* agent_opts: typed option rows (agent_opts.h). */
#include "agent_opts.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void *slot(void *base, const struct agent_opt *r)
{
	return (char *)base + r->off;
}

/* "a, b or c" of an enum's names into out. */
static void names_text(const char *const *names, char *out, size_t len)
{
	size_t k = 0, used = 0;
	while (names[k] != NULL)
		k++;
	out[0] = '\0';
	for (size_t i = 0; i < k && used < len; i++) {
		int w = snprintf(out + used, len - used, "%s%s", i == 0 ? "" : i + 1 == k ? " or " : ", ", names[i]);
		used += w > 0 ? (size_t)w : 0;
	}
}

/* Parses value for r into base's slot: 0 or -EINVAL/-ENOMEM with err set, naming the option as
 * label ("--name", or "section.key" for a row of a section). */
static int parse(const struct agent_opt *r, const char *label, void *base, const char *value, struct gcr_err *err)
{
	switch (r->type) {
	case AGENT_OPT_STR: {
		int none = value[0] == '\0' && r->empty_none;
		if (value[0] == '\0' && r->nonempty)
			return gcr_err_set(err, -EINVAL, "%s is empty", label);
		char *v = none ? NULL : strdup(value);
		if (v == NULL && !none)
			return gcr_err_set(err, -ENOMEM, "out of memory");
		char **s = slot(base, r);
		free(*s);
		*s = v;
		return 0;
	}
	case AGENT_OPT_BOOL: {
		/* YAML's core schema spells them three ways. */
		int t = strcmp(value, "true") == 0 || strcmp(value, "True") == 0 || strcmp(value, "TRUE") == 0;
		int f = strcmp(value, "false") == 0 || strcmp(value, "False") == 0 || strcmp(value, "FALSE") == 0;
		if (!t && !f)
			return gcr_err_set(err, -EINVAL, "%s: '%s' is not true or false", label, value);
		*(bool *)slot(base, r) = t;
		return 0;
	}
	case AGENT_OPT_INT: {
		char *end = NULL;
		errno = 0;
		long v = strtol(value, &end, 10);
		/* Digits only (strtol would take leading blanks and a '+'). */
		int ok = (value[0] == '-' || (value[0] >= '0' && value[0] <= '9')) && end != value && *end == '\0' &&
			 errno == 0 && ((v >= r->lo && v <= r->hi) || (r->never && v == -1));
		if (!ok)
			return gcr_err_set(err, -EINVAL, "%s: '%s' is not %san integer in %ld..%ld", label, value,
					   r->never ? "-1 or " : "", r->lo, r->hi);
		*(long *)slot(base, r) = v;
		return 0;
	}
	case AGENT_OPT_ENUM:
		for (int i = 0; r->names != NULL && r->names[i] != NULL; i++) {
			if (strcmp(value, r->names[i]) == 0) {
				*(int *)slot(base, r) = i;
				return 0;
			}
		}
		char all[200];
		names_text(r->names, all, sizeof(all));
		return gcr_err_set(err, -EINVAL, "%s: '%s' is not %s", label, value, all);
	}
	return gcr_err_set(err, -EINVAL, "%s: a row of no known type", label);
}

/* "--name": how an option is named in its errors. */
static void flag_label(const struct agent_opt *r, char *out, size_t len)
{
	snprintf(out, len, "--%s", r->name);
}

int agent_opts_defaults(const struct agent_opt *rows, size_t n, void *base, struct gcr_err *err)
{
	for (size_t i = 0; i < n; i++) {
		const struct agent_opt *r = &rows[i];
		if (r->def == NULL) {
			if (r->type != AGENT_OPT_STR)
				return gcr_err_set(err, -EINVAL, "--%s: a %s option needs a default", r->name,
						   r->type == AGENT_OPT_BOOL ? "bool" : "number or enum");
			continue; /* a string with no default stays NULL: not given */
		}
		char label[128];
		flag_label(r, label, sizeof(label));
		int rc = parse(r, label, base, r->def, err);
		if (rc < 0)
			return rc == -ENOMEM ? rc : gcr_err_wrap(err, "the default of --%s", r->name);
	}
	return 0;
}

int agent_opts_set(const struct agent_opt *rows, size_t n, void *base, const char *key, const char *value,
		   struct gcr_err *err)
{
	const struct agent_opt *r = agent_opts_find(rows, n, key);
	if (r == NULL)
		return gcr_err_set(err, -EINVAL, "unknown option '%s'", key);
	char label[128];
	flag_label(r, label, sizeof(label));
	return parse(r, label, base, value, err);
}

int agent_opts_set_in(const struct agent_opt *rows, size_t n, void *base, const char *section, const char *key,
		      const char *value, struct gcr_err *err)
{
	const struct agent_opt *r = agent_opts_find(rows, n, key);
	if (r == NULL)
		return gcr_err_set(err, -ENOENT, "%s.%s: not a key of %s", section, key, section);
	char label[256];
	snprintf(label, sizeof(label), "%s.%s", section, r->camel);
	return parse(r, label, base, value, err);
}

const struct agent_opt *agent_opts_find(const struct agent_opt *rows, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(rows[i].name, key) == 0 || strcmp(rows[i].camel, key) == 0)
			return &rows[i];
	return NULL;
}

void agent_opts_free(const struct agent_opt *rows, size_t n, void *base)
{
	for (size_t i = 0; i < n; i++) {
		if (rows[i].type == AGENT_OPT_STR) {
			char **s = slot(base, &rows[i]);
			free(*s);
			*s = NULL;
		}
	}
}

void agent_opts_usage(FILE *f, const struct agent_opt *rows, size_t n)
{
	for (size_t i = 0; i < n; i++)
		fprintf(f, "  --%-18s %s%s%s%s\n", rows[i].name, rows[i].help, rows[i].def ? " [" : "",
			rows[i].def ? rows[i].def : "", rows[i].def ? "]" : "");
}
