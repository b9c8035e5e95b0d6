/* test_agent_roommsg: the overcommit policy's parsers: the shim's "room" request (every field
 * checked) and the opt-in, priority and never-suspend settings in a process's environ. */
#include "agent_roommsg.h"
#include "util.h"

#include <errno.h>

static int parse(const char *line, struct agent_roommsg_room *r)
{
	struct gcr_err err = { 0 };
	return agent_roommsg_parse(line, strlen(line), r, &err);
}

static void test_room(void)
{
	struct agent_roommsg_room r;
	CHECK(parse("{\"v\":1,\"id\":7,\"op\":\"room\",\"args\":{\"bytes\":1048576,\"device\":0}}", &r) ==
	      AGENT_ROOMMSG_ROOM);
	CHECK(r.id == 7 && r.bytes == 1048576 && r.device == 0);
	/* device absent: unknown. */
	CHECK(parse("{\"v\":1,\"id\":8,\"op\":\"room\",\"args\":{\"bytes\":5}}", &r) == AGENT_ROOMMSG_ROOM);
	CHECK(r.device == -1 && r.bytes == 5);
	CHECK(parse("{\"v\":1,\"id\":1,\"op\":\"room\",\"args\":{\"bytes\":1125899906842624,\"device\":63}}", &r) ==
	      AGENT_ROOMMSG_ROOM);
	/* The register line: nothing to do. */
	CHECK(parse("{\"v\":1,\"id\":0,\"op\":\"register\",\"args\":{\"socket\":\"/x\",\"version\":\"1\"}}", &r) ==
	      AGENT_ROOMMSG_OTHER);
	/* Bad fields, each refused with the request's id kept for the error reply. */
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":0}}", &r) == -EBADMSG && r.id == 9);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":-5}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":1125899906842625}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":1.5}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":\"9\"}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":1,\"device\":64}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":1,\"device\":-2}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":9,\"op\":\"room\",\"args\":{\"bytes\":1,\"device\":\"0\"}}", &r) == -EBADMSG);
	/* The envelope. */
	CHECK(parse("{\"v\":2,\"id\":1,\"op\":\"room\",\"args\":{\"bytes\":1}}", &r) == -EPROTO);
	CHECK(parse("{\"v\":1,\"id\":1,\"op\":\"roomy\"}", &r) == -EOPNOTSUPP);
	CHECK(parse("not json", &r) == -EBADMSG);
	CHECK(parse("", &r) == -EBADMSG);
	struct gcr_err err;
	CHECK(agent_roommsg_parse("{\"v\":1}\0x", 9, &r, &err) == -EBADMSG); /* a NUL inside */
}

static void test_wake(void)
{
	struct agent_roommsg_room r;
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\",\"args\":{\"waited_ms\":12}}", &r) == AGENT_ROOMMSG_WAKE);
	CHECK(r.id == 3 && r.waited_ms == 12 && r.bytes == 0 && r.device == -1);
	CHECK(parse("{\"v\":1,\"id\":0,\"op\":\"wake\",\"args\":{\"waited_ms\":86400000}}", &r) ==
	      AGENT_ROOMMSG_WAKE);
	/* Each field checked: missing, negative, too large, not an integer. */
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\"}", &r) == -EBADMSG && r.id == 3);
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\",\"args\":{\"waited_ms\":-1}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\",\"args\":{\"waited_ms\":86400001}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\",\"args\":{\"waited_ms\":0.5}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":3,\"op\":\"wake\",\"args\":{\"waited_ms\":\"1\"}}", &r) == -EBADMSG);
	CHECK(parse("{\"v\":1,\"id\":-3,\"op\":\"wake\",\"args\":{\"waited_ms\":1}}", &r) == -EBADMSG);
}

static void env(const char *buf, size_t len, struct agent_roommsg_env *e)
{
	agent_roommsg_environ(buf, len, e);
}

#define ENV(lit, e) env(lit, sizeof(lit) - 1, e)

static void test_environ(void)
{
	struct agent_roommsg_env e;
	ENV("PATH=/bin\0GCR_OVERCOMMIT=1\0GCR_PRIORITY=-7\0GCR_PREEMPTIBLE=0\0", &e);
	CHECK(e.overcommit == 1 && e.priority == -7 && e.preemptible == 0 && !e.bad);
	/* Defaults. */
	ENV("PATH=/bin\0HOME=/\0", &e);
	CHECK(e.overcommit == 0 && e.priority == 0 && e.preemptible == 1 && !e.bad);
	env("", 0, &e);
	CHECK(e.overcommit == 0 && e.preemptible == 1);
	/* No final NUL; names must match whole (no prefix tricks). */
	ENV("GCR_OVERCOMMITX=1\0XGCR_PRIORITY=5\0GCR_PRIORITY=12", &e);
	CHECK(e.overcommit == 0 && e.priority == 12);
	/* Invalid values: the default, and said. */
	ENV("GCR_PRIORITY=12abc\0", &e);
	CHECK(e.priority == 0 && e.bad);
	ENV("GCR_PRIORITY=99999999999\0", &e);
	CHECK(e.priority == 0 && e.bad);
	ENV("GCR_PRIORITY=\0", &e);
	CHECK(e.priority == 0 && e.bad);
	ENV("GCR_PRIORITY= 5\0", &e);
	CHECK(e.priority == 0 && e.bad);
	ENV("GCR_OVERCOMMIT=yes\0", &e);
	CHECK(e.overcommit == 0 && e.bad);
	ENV("GCR_PREEMPTIBLE=false\0", &e);
	CHECK(e.preemptible == 0 && !e.bad);
	ENV("GCR_PREEMPTIBLE=maybe\0", &e);
	CHECK(e.preemptible == 1 && e.bad);
	/* The last one wins, as getenv's first would not: environ has one of each in practice. */
	ENV("GCR_PRIORITY=1\0GCR_PRIORITY=2\0", &e);
	CHECK(e.priority == 2);
	ENV("GCR_PRIORITY=-2147483648\0", &e);
	CHECK(e.priority == -2147483648 && !e.bad);
}

int main(void)
{
	test_room();
	test_wake();
	test_environ();
	return test_summary("test_agent_roommsg");
}
