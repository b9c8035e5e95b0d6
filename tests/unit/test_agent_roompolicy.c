/* test_agent_roompolicy: the rules of who may take GPU room from whom: the same-namespace
 * default, named and wildcard rules, and every malformed text refused whole. */
#include "agent_roompolicy.h"
#include "util.h"

#include <errno.h>
#include <string.h>

static int parse(const char *text, struct agent_roompolicy *p, struct gcr_err *err)
{
	return agent_roompolicy_parse(text, strlen(text), p, err);
}

int main(void)
{
	static struct agent_roompolicy p;
	struct gcr_err err;
	char d[512];

	/* None: each namespace from itself only; outside pods ("") from each other. */
	CHECK(parse("", &p, &err) == 0 && p.nrules == 0);
	CHECK(agent_roompolicy_allows(&p, "a", "a"));
	CHECK(!agent_roompolicy_allows(&p, "a", "b"));
	CHECK(agent_roompolicy_allows(&p, "", ""));
	CHECK(!agent_roompolicy_allows(&p, "a", ""));
	agent_roompolicy_describe(&p, d, sizeof(d));
	CHECK(strstr(d, "itself only") != NULL);

	/* Named rules, spaces allowed, a trailing ';'. */
	CHECK(parse(" inference = batch, dev ;ops=*;", &p, &err) == 0 && p.nrules == 2);
	CHECK(agent_roompolicy_allows(&p, "inference", "batch"));
	CHECK(agent_roompolicy_allows(&p, "inference", "dev"));
	CHECK(!agent_roompolicy_allows(&p, "inference", "ops"));
	CHECK(!agent_roompolicy_allows(&p, "batch", "inference"));
	CHECK(agent_roompolicy_allows(&p, "ops", "inference"));
	CHECK(!agent_roompolicy_allows(&p, "ops", "")); /* "*" is a namespace, never outside pods */
	agent_roompolicy_describe(&p, d, sizeof(d));
	CHECK(strcmp(d, "inference from batch, dev; ops from *") == 0);

	/* Everyone from everyone: the behaviour before the policy. */
	CHECK(parse("*=*", &p, &err) == 0);
	CHECK(agent_roompolicy_allows(&p, "x", "y") && agent_roompolicy_allows(&p, "y", "x"));
	CHECK(parse("*=scavenger", &p, &err) == 0);
	CHECK(agent_roompolicy_allows(&p, "x", "scavenger") && !agent_roompolicy_allows(&p, "scavenger", "x"));

	/* Refused whole, saying which rule; the policy left at the default. */
	const char *bad[] = { "a", "a=", "=b", "A=b", "a=b;a=c", "a=b,,c", "a=-b", "a=b c", "a b=c", "a=b\xff",
			      "a=bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK(parse("x=y", &p, &err) == 0 && p.nrules == 1);
		CHECK(parse(bad[i], &p, &err) == -EINVAL && p.nrules == 0 && err.msg[0] != '\0');
	}
	CHECK(agent_roompolicy_parse("a=b\0c", 5, &p, &err) == -EINVAL);
	char many[8192] = "";
	for (int i = 0; i < AGENT_ROOMPOLICY_MAX_RULES + 1; i++)
		snprintf(many + strlen(many), sizeof(many) - strlen(many), "n%d=x;", i);
	CHECK(parse(many, &p, &err) == -EINVAL && strstr(err.msg, "rules") != NULL);
	return test_summary("test_agent_roompolicy");
}
