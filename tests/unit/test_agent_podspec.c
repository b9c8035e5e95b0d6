/* test_agent_podspec: what a pod asks of GCR: the readiness gate among its readinessGates, and
 * its overcommit opt-in by label or annotation, matched exactly. */
#include "agent_podspec.h"
#include "util.h"

static json_t *pod(const char *text)
{
	json_error_t e;
	json_t *p = json_loads(text, 0, &e);
	if (p == NULL)
		fprintf(stderr, "bad test JSON: %s\n", e.text);
	return p;
}

static int gate(const char *text)
{
	json_t *p = pod(text);
	int r = agent_podspec_gate_declared(p);
	json_decref(p);
	return r;
}

static int overcommit(const char *text)
{
	json_t *p = pod(text);
	int r = agent_podspec_overcommit(p);
	json_decref(p);
	return r;
}

int main(void)
{
	CHECK(gate("{\"spec\":{\"readinessGates\":[{\"conditionType\":\"a/b\"},{\"conditionType\":\"gpucr.dev/resident\"}]}}"));
	CHECK(!gate("{\"spec\":{\"readinessGates\":[{\"conditionType\":\"gpucr.dev/resident-x\"}]}}"));
	CHECK(!gate("{\"spec\":{\"readinessGates\":[{\"conditionType\":7},{}]}}"));
	CHECK(!gate("{\"spec\":{\"readinessGates\":{\"conditionType\":\"gpucr.dev/resident\"}}}")); /* not a list */
	CHECK(!gate("{\"spec\":{}}"));
	CHECK(!gate("{}"));
	CHECK(agent_podspec_gate_declared(NULL) == 0);
	/* The condition is read from status.conditions, by its type alone. */
	json_t *p = pod("{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"},"
			"{\"type\":\"gpucr.dev/resident\",\"status\":\"False\",\"reason\":\"Suspended\"}]}}");
	CHECK(agent_podspec_gate_condition(p) != NULL);
	CHECK_STR(agent_podspec_gate_status(p), "False");
	json_decref(p);
	p = pod("{\"status\":{\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\"}]}}");
	CHECK(agent_podspec_gate_condition(p) == NULL && agent_podspec_gate_status(p) == NULL);
	json_decref(p);
	CHECK(agent_podspec_gate_status(NULL) == NULL);

	/* A container by its name, exactly. */
	p = pod("{\"spec\":{\"containers\":[{\"name\":\"side\"},{\"name\":\"main\",\"image\":\"x\"}]}}");
	CHECK(agent_podspec_container(p, "main") == json_array_get(json_object_get(json_object_get(p, "spec"),
										 "containers"), 1));
	CHECK(agent_podspec_container(p, "mai") == NULL && agent_podspec_container(p, "") == NULL);
	json_decref(p);

	CHECK(overcommit("{\"metadata\":{\"labels\":{\"gpucr.dev/overcommit\":\"suspend\"}}}"));
	CHECK(overcommit("{\"metadata\":{\"annotations\":{\"gpucr.dev/overcommit\":\"suspend\"}}}"));
	CHECK(overcommit("{\"metadata\":{\"labels\":{\"gpucr.dev/overcommit\":\"no\"},"
			 "\"annotations\":{\"gpucr.dev/overcommit\":\"suspend\"}}}"));
	CHECK(!overcommit("{\"metadata\":{\"labels\":{\"gpucr.dev/overcommit\":\"Suspend\"}}}"));
	CHECK(!overcommit("{\"metadata\":{\"labels\":{\"gpucr.dev/overcommit\":true}}}"));
	CHECK(!overcommit("{\"metadata\":{\"labels\":{\"gpucr.dev/overcommitx\":\"suspend\"}}}"));
	CHECK(!overcommit("{\"metadata\":{}}"));
	CHECK(agent_podspec_overcommit(NULL) == 0);
	return test_summary("test_agent_podspec");
}
