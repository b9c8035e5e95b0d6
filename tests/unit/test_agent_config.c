/* Unit test of node-agent/daemon/agent_config: the agent's YAML file through libyaml's
 * document API; what reaches each callback, in order, and every shape refused. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "agent_config.h"
#include "util.h"

static char got[4096]; /* one "kind key=value;" per callback, in order */
static const char *fail_key; /* a callback refuses this key with -EINVAL */

static int rec(const char *kind, const char *key, const char *value, struct gcr_err *err)
{
	size_t n = strlen(got);
	snprintf(got + n, sizeof(got) - n, "%s %s=%s;", kind, key, value ? value : "");
	if (fail_key != NULL && strcmp(key, fail_key) == 0)
		return gcr_err_set(err, -EINVAL, "%s refused", key);
	return 0;
}

static int on_opt(void *d, const char *k, const char *v, struct gcr_err *e)
{
	(void)d;
	return rec("opt", k, v, e);
}
static int on_dp(void *d, const char *k, const char *v, struct gcr_err *e)
{
	(void)d;
	return rec("dp", k, v, e);
}
static int on_nested(void *d, const char *k, struct gcr_err *e)
{
	(void)d;
	return rec("nested", k, NULL, e);
}
static int on_env(void *d, const char *k, const char *v, struct gcr_err *e)
{
	(void)d;
	return rec("env", k, v, e);
}

static const struct agent_config_sink sink = { .opt = on_opt, .dp_opt = on_dp, .dp_nested = on_nested,
					       .dp_env = on_env };
static struct gcr_err err;

static int parse(const char *text)
{
	got[0] = '\0';
	memset(&err, 0, sizeof(err));
	return agent_config_parse(text, strlen(text), "cfg.yaml", &sink, &err);
}

/* Refused with -EINVAL and a message containing want. */
static int refused(const char *text, const char *want)
{
	int rc = parse(text);
	int ok = rc == -EINVAL && strstr(err.msg, want) != NULL && strncmp(err.msg, "cfg.yaml", 8) == 0;
	if (!ok)
		fprintf(stderr, "%s -> %d %s (want %s)\n", text, rc, err.msg, want);
	return ok;
}

int main(void)
{
	CHECK(parse("") == 0 && got[0] == '\0');
	CHECK(parse("# only a comment\n") == 0 && got[0] == '\0');
	CHECK(parse("nodeName: n1\nlog-level: info\nempty:\n") == 0);
	CHECK_STR(got, "opt nodeName=n1;opt log-level=info;opt empty=;");
	CHECK(parse("a: 1\ndevicePlugin:\n  enabled: true\n  extra: {x: [1]}\n  shimEnv:\n    GCR_A: \"1\"\n"
		    "    GCR_B: two\n  slots: 4\nb: ~\n") == 0);
	CHECK_STR(got, "opt a=1;dp enabled=true;nested extra=;env GCR_A=1;env GCR_B=two;dp slots=4;opt b=~;");
	/* shimEnv given as a scalar goes to dp_opt (only null means none; the agent checks). */
	CHECK(parse("devicePlugin:\n  shimEnv:\n") == 0);
	CHECK_STR(got, "dp shimEnv=;");
	/* The section given as a scalar is the agent's to refuse. */
	CHECK(parse("devicePlugin: x\n") == 0);
	CHECK_STR(got, "opt devicePlugin=x;");
	/* Several documents: read in turn. */
	CHECK(parse("a: 1\n---\nb: 2\n") == 0);
	CHECK_STR(got, "opt a=1;opt b=2;");
	/* An anchor without an alias is fine. */
	CHECK(parse("a: &x 1\n") == 0);
	CHECK_STR(got, "opt a=1;");

	CHECK(refused("a: [\n", "cfg.yaml:"));
	CHECK(refused("a: *nothing\n", "cfg.yaml:"));
	CHECK(refused("just a scalar\n", "expected a mapping of options"));
	CHECK(refused("- a\n- b\n", "expected a mapping of options"));
	CHECK(refused("a: {b: c}\n", "option 'a' must be a scalar"));
	CHECK(refused("a: [1]\n", "option 'a' must be a scalar"));
	CHECK(refused("devicePlugin: [1]\n", "option 'devicePlugin' must be a scalar"));
	CHECK(refused("? [k]\n: v\n", "option '?' must be a scalar"));
	CHECK(refused("devicePlugin:\n  ? [k]\n  : v\n", "devicePlugin: keys must be scalars"));
	CHECK(refused("devicePlugin:\n  shimEnv: [A]\n", "devicePlugin.shimEnv must be a mapping"));
	CHECK(refused("devicePlugin:\n  shimEnv:\n    A: [1]\n", "names and values must be scalars"));
	CHECK(refused("devicePlugin:\n  shimEnv:\n    ? [A]\n    : 1\n", "names and values must be scalars"));
	CHECK(refused("x: &v 1\ndevicePlugin:\n  shimEnv:\n    A: *v\n", "devicePlugin.shimEnv: no aliases"));
	CHECK(refused("devicePlugin:\n  extra: &m {A: 1}\n  shimEnv: *m\n", "devicePlugin.shimEnv: no aliases"));
	CHECK(refused("a: &v 1\nb: *v\n", "no aliases"));
	/* A callback's refusal, prefixed with the path; settings before it were handed over. */
	fail_key = "slots";
	CHECK(refused("a: 1\ndevicePlugin:\n  slots: 0\n", "cfg.yaml: slots refused"));
	CHECK_STR(got, "opt a=1;dp slots=0;");
	fail_key = "GCR_A";
	CHECK(refused("devicePlugin:\n  shimEnv:\n    GCR_A: 1\n", "cfg.yaml: GCR_A refused"));
	fail_key = "extra";
	CHECK(refused("devicePlugin:\n  extra: [1]\n", "cfg.yaml: extra refused"));
	fail_key = "a";
	CHECK(refused("a: 1\n", "cfg.yaml: a refused"));
	fail_key = NULL;
	/* The file reader: a missing file. */
	CHECK(agent_config_load("/nonexistent/gcr-agent.yaml", &sink, &err) == -ENOENT);
	return test_summary("test_agent_config");
}
