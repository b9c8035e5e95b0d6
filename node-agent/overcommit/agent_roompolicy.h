/* agent_roompolicy: which namespaces may take GPU room from which (docs/preemption.md, "Who may
 * take room from whom"): the administrator's rules, parsed from the agent's option
 * --overcommit-room-from (the chart's overcommit.roomFrom), and the one question asked of them.
 *
 * The text: rules separated by ';', each "REQUESTER=VICTIM,VICTIM,...", a name being a
 * namespace (a DNS label) or "*" (any). Empty: no rule. A namespace always may take room from
 * itself; anything else needs a rule. "*=*" is every namespace from every other, as before the
 * option existed. Processes outside pods have the namespace "" (only from each other). */
#ifndef AGENT_ROOMPOLICY_H
#define AGENT_ROOMPOLICY_H

#include <stddef.h>

#include "gcr_error.h"

#define AGENT_ROOMPOLICY_MAX_RULES 64  /* requester entries */
#define AGENT_ROOMPOLICY_MAX_VICTIMS 64 /* names in one rule */
#define AGENT_ROOMPOLICY_MAX_TEXT 16384 /* bytes of the option */
#define AGENT_ROOMPOLICY_NAME_MAX 63

struct agent_roompolicy_rule {
	char requester[AGENT_ROOMPOLICY_NAME_MAX + 1];
	int nvictims;
	char victims[AGENT_ROOMPOLICY_MAX_VICTIMS][AGENT_ROOMPOLICY_NAME_MAX + 1];
};

struct agent_roompolicy {
	int nrules;
	struct agent_roompolicy_rule rules[AGENT_ROOMPOLICY_MAX_RULES];
};

/* Parses text (len bytes; outside input: the agent's configuration). 0, or -EINVAL with err
 * naming the rule that is wrong (p is then empty: the same-namespace default). */
int agent_roompolicy_parse(const char *text, size_t len, struct agent_roompolicy *p, struct gcr_err *err);

/* Whether a process of namespace requester may suspend one of namespace victim for room. */
int agent_roompolicy_allows(const struct agent_roompolicy *p, const char *requester, const char *victim);

/* The rules as text ("same namespace only" when none), for the agent's start-up line. */
void agent_roompolicy_describe(const struct agent_roompolicy *p, char *out, size_t len);

#endif
