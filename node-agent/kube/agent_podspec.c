/* agent_podspec: what a pod's own spec and metadata ask of GCR (agent_podspec.h). */
#include "agent_podspec.h"

#include <string.h>

int agent_podspec_gate_declared(json_t *pod)
{
	size_t i;
	json_t *g;
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "readinessGates"), i, g)
	{
		const char *t = json_string_value(json_object_get(g, "conditionType"));
		if (t != NULL && strcmp(t, AGENT_PODSPEC_GATE_TYPE) == 0)
			return 1;
	}
	return 0;
}

json_t *agent_podspec_gate_condition(json_t *pod)
{
	size_t i;
	json_t *cnd;
	json_array_foreach(json_object_get(json_object_get(pod, "status"), "conditions"), i, cnd)
	{
		const char *t = json_string_value(json_object_get(cnd, "type"));
		if (t != NULL && strcmp(t, AGENT_PODSPEC_GATE_TYPE) == 0)
			return cnd;
	}
	return NULL;
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
