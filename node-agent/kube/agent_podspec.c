/* agent_podspec: what a pod's own spec and metadata ask of GCR (agent_podspec.h). */
#include "agent_podspec.h"

#include <string.h>

/* The element of pod.<section>.<list> whose string field is value (borrowed), NULL when none:
 * every question below is one such lookup. */
static json_t *find(json_t *pod, const char *section, const char *list, const char *field, const char *value)
{
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(json_object_get(pod, section), list), i, e)
	{
		const char *s = json_string_value(json_object_get(e, field));
		if (s != NULL && strcmp(s, value) == 0)
			return e;
	}
	return NULL;
}

int agent_podspec_gate_declared(json_t *pod)
{
	return find(pod, "spec", "readinessGates", "conditionType", AGENT_PODSPEC_GATE_TYPE) != NULL;
}

json_t *agent_podspec_gate_condition(json_t *pod)
{
	return find(pod, "status", "conditions", "type", AGENT_PODSPEC_GATE_TYPE);
}

json_t *agent_podspec_container(json_t *pod, const char *name)
{
	return find(pod, "spec", "containers", "name", name);
}

const char *agent_podspec_gate_status(json_t *pod)
{
	return json_string_value(json_object_get(agent_podspec_gate_condition(pod), "status"));
}

int agent_podspec_overcommit(json_t *pod)
{
	json_t *md = json_object_get(pod, "metadata");
	const char *lab =
		json_string_value(json_object_get(json_object_get(md, "labels"), AGENT_PODSPEC_OVERCOMMIT_KEY));
	const char *ann =
		json_string_value(json_object_get(json_object_get(md, "annotations"), AGENT_PODSPEC_OVERCOMMIT_KEY));
	return (lab != NULL && strcmp(lab, AGENT_PODSPEC_OVERCOMMIT_VALUE) == 0) ||
	       (ann != NULL && strcmp(ann, AGENT_PODSPEC_OVERCOMMIT_VALUE) == 0);
}
