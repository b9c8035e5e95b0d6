/* fuzz_roompolicy: arbitrary bytes as the agent's --overcommit-room-from rules, through
 * agent_roompolicy; checks that a refusal always says why and leaves no rule, that every
 * accepted name is a namespace or "*", and that a namespace always may take room from itself. */
#include "agent_roompolicy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int name_ok(const char *s)
{
	size_t n = strlen(s);
	if (strcmp(s, "*") == 0)
		return 1;
	if (n == 0 || n > AGENT_ROOMPOLICY_NAME_MAX || s[0] == '-' || s[n - 1] == '-')
		return 0;
	return strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct agent_roompolicy p;
	struct gcr_err err = { 0, "" };
	int rc = agent_roompolicy_parse((const char *)data, size, &p, &err);
	if (rc < 0 && (p.nrules != 0 || err.msg[0] == '\0'))
		abort();
	for (int i = 0; rc == 0 && i < p.nrules; i++) {
		if (!name_ok(p.rules[i].requester) || p.rules[i].nvictims < 1 ||
		    p.rules[i].nvictims > AGENT_ROOMPOLICY_MAX_VICTIMS)
			abort();
		for (int k = 0; k < p.rules[i].nvictims; k++)
			if (!name_ok(p.rules[i].victims[k]))
				abort();
		if (!agent_roompolicy_allows(&p, p.rules[i].requester, p.rules[i].requester))
			abort();
	}
	char d[256];
	agent_roompolicy_describe(&p, d, sizeof(d));
	if (memchr(d, '\0', sizeof(d)) == NULL)
		abort();
	return 0;
}
