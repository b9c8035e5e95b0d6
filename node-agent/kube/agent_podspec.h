/* agent_podspec: what a pod's spec, metadata and status say to GCR, read by every role that meets
 * a pod: the readiness gate it lists and that gate's condition, its containers by name, and its opt-in
 * to GPU memory overcommit by suspend. Kept here, below the roles, so that no role reads another's
 * header. */
#ifndef AGENT_PODSPEC_H
#define AGENT_PODSPEC_H

#include <jansson.h>

/* The condition type a pod lists in spec.readinessGates to have its readiness follow
 * its GPU state (docs/scale-to-zero.md, "Traffic follows state"). */
#define AGENT_PODSPEC_GATE_TYPE "gpucr.dev/resident"

/* The gate's condition in pod's status.conditions, NULL when it has none (borrowed). */
json_t *agent_podspec_gate_condition(json_t *pod);
/* That condition's status ("True", "False"), NULL when it has none (borrowed). */
const char *agent_podspec_gate_status(json_t *pod);

/* The container named name in pod's spec (borrowed), NULL when it declares none so named. */
json_t *agent_podspec_container(json_t *pod, const char *name);

/* A pod Kubernetes knows opts in to overcommit by its label or annotation
 * gpucr.dev/overcommit: suspend, whatever its processes' environment says (docs/preemption.md). */
#define AGENT_PODSPEC_OVERCOMMIT_KEY "gpucr.dev/overcommit"
#define AGENT_PODSPEC_OVERCOMMIT_VALUE "suspend"

/* 1 when pod lists AGENT_PODSPEC_GATE_TYPE in spec.readinessGates. */
int agent_podspec_gate_declared(json_t *pod);

/* 1 when pod (a Pod object) opted in to overcommit: label or annotation
 * AGENT_PODSPEC_OVERCOMMIT_KEY: AGENT_PODSPEC_OVERCOMMIT_VALUE. */
int agent_podspec_overcommit(json_t *pod);

#endif
