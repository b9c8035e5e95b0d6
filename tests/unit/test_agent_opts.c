/* test_agent_opts: typed option rows: defaults, each type parsed and checked at set time (bounds,
 * -1 where it means never, true/false in YAML's three spellings only, an enum's names), flag names
 * and file keys alike, a bad value leaving the slot as it was, unknown options, a table whose
 * default is no value; a section's rows (errors as "section.key", unknown keys -ENOENT, strings
 * that may not be empty or whose empty means none). */
#include "agent_opts.h"
#include "util.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct t {
	char *path, *none;
	bool on;
	long n, ms;
	int mode;
};

static const char *const modes[] = { "full", "data", "half", NULL };
#define O(f) offsetof(struct t, f)
static const struct agent_opt rows[] = {
	{ "path", "path", AGENT_OPT_STR, O(path), "/run/x", .help = "a path" },
	{ "none", "noneKey", AGENT_OPT_STR, O(none), NULL, .help = "no default" },
	{ "on", "onKey", AGENT_OPT_BOOL, O(on), "true", .help = "a switch" },
	{ "n", "nKey", AGENT_OPT_INT, O(n), "4", .lo = 1, .hi = 64, .help = "a count" },
	{ "ms", "msKey", AGENT_OPT_INT, O(ms), "2000", .lo = 1, .hi = 600000, .never = 1, .help = "a period" },
	{ "mode", "modeKey", AGENT_OPT_ENUM, O(mode), "full", .names = modes, .help = "a mode" },
};
#define N (sizeof(rows) / sizeof(rows[0]))

int main(void)
{
	struct t t = { 0 };
	struct gcr_err err;
	CHECK(agent_opts_defaults(rows, N, &t, &err) == 0);
	CHECK_STR(t.path, "/run/x");
	CHECK(t.none == NULL && t.on && t.n == 4 && t.ms == 2000 && t.mode == 0);

	/* The flag's name and the file's key set the same slot. */
	CHECK(agent_opts_set(rows, N, &t, "on", "false", &err) == 0 && !t.on);
	CHECK(agent_opts_set(rows, N, &t, "onKey", "true", &err) == 0 && t.on);
	CHECK(agent_opts_set(rows, N, &t, "nKey", "64", &err) == 0 && t.n == 64);
	CHECK(agent_opts_set(rows, N, &t, "n", "1", &err) == 0 && t.n == 1);
	CHECK(agent_opts_set(rows, N, &t, "ms", "-1", &err) == 0 && t.ms == -1);
	CHECK(agent_opts_set(rows, N, &t, "modeKey", "half", &err) == 0 && t.mode == 2);
	CHECK(agent_opts_set(rows, N, &t, "noneKey", "given", &err) == 0);
	CHECK_STR(t.none, "given");
	CHECK(agent_opts_set(rows, N, &t, "path", "", &err) == 0);
	CHECK_STR(t.path, "");

	CHECK(agent_opts_set(rows, N, &t, "on", "FALSE", &err) == 0 && !t.on);
	CHECK(agent_opts_set(rows, N, &t, "on", "True", &err) == 0 && t.on);

	/* Refused, naming the option and what it takes; the slot keeps its value. */
	const char *bad_bool[] = { "tRUE", "1", "yes", "", "false " };
	for (size_t i = 0; i < sizeof(bad_bool) / sizeof(bad_bool[0]); i++) {
		CHECK(agent_opts_set(rows, N, &t, "on", bad_bool[i], &err) == -EINVAL);
		CHECK(strstr(err.msg, "--on: '") != NULL && strstr(err.msg, "is not true or false") != NULL);
		CHECK(t.on);
	}
	const char *bad_n[] = { "0", "65", "-1", "", "4x", "x4", " 4", "+4", "4.0", "99999999999999999999" };
	for (size_t i = 0; i < sizeof(bad_n) / sizeof(bad_n[0]); i++) {
		CHECK(agent_opts_set(rows, N, &t, "n", bad_n[i], &err) == -EINVAL);
		CHECK(strstr(err.msg, "is not an integer in 1..64") != NULL);
		CHECK(t.n == 1);
	}
	CHECK(agent_opts_set(rows, N, &t, "ms", "0", &err) == -EINVAL);
	CHECK(strstr(err.msg, "--ms: '0' is not -1 or an integer in 1..600000") != NULL);
	CHECK(agent_opts_set(rows, N, &t, "ms", "-2", &err) == -EINVAL && t.ms == -1);
	CHECK(agent_opts_set(rows, N, &t, "mode", "Full", &err) == -EINVAL);
	CHECK(strstr(err.msg, "--mode: 'Full' is not full, data or half") != NULL && t.mode == 2);
	CHECK(agent_opts_set(rows, N, &t, "bogus", "1", &err) == -EINVAL);
	CHECK(strstr(err.msg, "unknown option 'bogus'") != NULL);

	agent_opts_free(rows, N, &t);
	CHECK(t.path == NULL && t.none == NULL);

	/* A default that is no value of its type is the table's mistake, said at start. */
	const struct agent_opt broken[] = {
		{ "n", "n", AGENT_OPT_INT, O(n), "100", .lo = 1, .hi = 64, .help = "" },
	};
	CHECK(agent_opts_defaults(broken, 1, &t, &err) == -EINVAL);
	CHECK(strstr(err.msg, "the default of --n") != NULL);
	const struct agent_opt nodef[] = {
		{ "on", "on", AGENT_OPT_BOOL, O(on), NULL, .help = "" },
	};
	CHECK(agent_opts_defaults(nodef, 1, &t, &err) == -EINVAL);

	/* A section of the file (the devicePlugin one): its keys, its names in errors. */
	const struct agent_opt sect[] = {
		{ "path", "path", AGENT_OPT_STR, O(path), NULL, .nonempty = 1, .help = "" },
		{ "none", "noneKey", AGENT_OPT_STR, O(none), NULL, .empty_none = 1, .help = "" },
		{ "n", "slots", AGENT_OPT_INT, O(n), "16", .lo = 1, .hi = 1024, .help = "" },
	};
	struct t u = { 0 };
	CHECK(agent_opts_defaults(sect, 3, &u, &err) == 0 && u.n == 16 && u.path == NULL);
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "slots", "2000", &err) == -EINVAL);
	CHECK(strstr(err.msg, "devicePlugin.slots: '2000' is not an integer in 1..1024") != NULL && u.n == 16);
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "slots", "32", &err) == 0 && u.n == 32);
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "path", "", &err) == -EINVAL);
	CHECK(strstr(err.msg, "devicePlugin.path is empty") != NULL && u.path == NULL);
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "path", "/p", &err) == 0);
	CHECK_STR(u.path, "/p");
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "noneKey", "x", &err) == 0);
	CHECK_STR(u.none, "x");
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "noneKey", "", &err) == 0 && u.none == NULL);
	CHECK(agent_opts_set_in(sect, 3, &u, "devicePlugin", "future", "1", &err) == -ENOENT);
	CHECK(strstr(err.msg, "devicePlugin.future") != NULL);
	CHECK(agent_opts_find(sect, 3, "slots") == &sect[2] && agent_opts_find(sect, 3, "n") == &sect[2]);
	CHECK(agent_opts_find(sect, 3, "future") == NULL);
	agent_opts_free(sect, 3, &u);
	CHECK(u.path == NULL && u.none == NULL);
	return test_summary("test_agent_opts");
}
