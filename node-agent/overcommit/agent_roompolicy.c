/* agent_roompolicy: the rules of who may take GPU room from whom (agent_roompolicy.h), parsed
 * strictly: a name that is not a namespace, a rule without '=', too many rules or names are
 * refused whole, so a typo never widens the policy. */
#include "agent_roompolicy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* A DNS label (RFC 1123, as Kubernetes namespaces are) or "*". */
static int is_name(const char *s, size_t n)
{
	if (n == 1 && s[0] == '*')
		return 1;
	if (n == 0 || n > AGENT_ROOMPOLICY_NAME_MAX || s[0] == '-' || s[n - 1] == '-')
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
			return 0;
	return 1;
}

/* [s, e) without the spaces around it. */
static void trim(const char **s, const char **e)
{
	while (*s < *e && (**s == ' ' || **s == '\t'))
		(*s)++;
	while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
		(*e)--;
}

static int parse_rule(const char *s, const char *e, struct agent_roompolicy *p, int idx, struct gcr_err *err)
{
	const char *eq = memchr(s, '=', (size_t)(e - s));
	if (eq == NULL)
		return gcr_err_set(err, -EINVAL, "rule %d: not REQUESTER=VICTIM,...", idx + 1);
	const char *rs = s, *re = eq;
	trim(&rs, &re);
	if (!is_name(rs, (size_t)(re - rs)))
		return gcr_err_set(err, -EINVAL, "rule %d: '%.*s' is not a namespace or *", idx + 1,
				   (int)(re - rs > 80 ? 80 : re - rs), rs);
	for (int i = 0; i < p->nrules; i++)
		if (strlen(p->rules[i].requester) == (size_t)(re - rs) &&
		    memcmp(p->rules[i].requester, rs, (size_t)(re - rs)) == 0)
			return gcr_err_set(err, -EINVAL, "rule %d: %.*s has a rule already", idx + 1, (int)(re - rs), rs);
	if (p->nrules == AGENT_ROOMPOLICY_MAX_RULES)
		return gcr_err_set(err, -EINVAL, "more than %d rules", AGENT_ROOMPOLICY_MAX_RULES);
	struct agent_roompolicy_rule *r = &p->rules[p->nrules];
	memset(r, 0, sizeof(*r));
	memcpy(r->requester, rs, (size_t)(re - rs));
	for (const char *v = eq + 1; v <= e;) {
		const char *ve = memchr(v, ',', (size_t)(e - v));
		if (ve == NULL)
			ve = e;
		const char *ns = v, *ne = ve;
		trim(&ns, &ne);
		if (!is_name(ns, (size_t)(ne - ns)))
			return gcr_err_set(err, -EINVAL, "rule %d (%s): '%.*s' is not a namespace or *", idx + 1,
					   r->requester, (int)(ne - ns > 80 ? 80 : ne - ns), ns);
		if (r->nvictims == AGENT_ROOMPOLICY_MAX_VICTIMS)
			return gcr_err_set(err, -EINVAL, "rule %d (%s): more than %d namespaces", idx + 1, r->requester,
					   AGENT_ROOMPOLICY_MAX_VICTIMS);
		memcpy(r->victims[r->nvictims++], ns, (size_t)(ne - ns));
		v = ve + 1;
	}
	p->nrules++;
	return 0;
}

int agent_roompolicy_parse(const char *text, size_t len, struct agent_roompolicy *p, struct gcr_err *err)
{
	p->nrules = 0;
	if (len > AGENT_ROOMPOLICY_MAX_TEXT)
		return gcr_err_set(err, -EINVAL, "%zu bytes: more than %d", len, AGENT_ROOMPOLICY_MAX_TEXT);
	if (memchr(text, '\0', len) != NULL)
		return gcr_err_set(err, -EINVAL, "a NUL byte in the rules");
	const char *end = text + len;
	int idx = 0, rc = 0;
	for (const char *s = text; s < end && rc == 0; idx++) {
		const char *e = memchr(s, ';', (size_t)(end - s));
		if (e == NULL)
			e = end;
		const char *ts = s, *te = e;
		trim(&ts, &te);
		if (ts < te) /* an empty rule (a trailing ';') is nothing */
			rc = parse_rule(ts, te, p, idx, err);
		s = e + 1;
	}
	if (rc < 0)
		p->nrules = 0;
	return rc;
}

static int matches(const char *pattern, const char *ns)
{
	return strcmp(pattern, "*") == 0 ? ns[0] != '\0' : strcmp(pattern, ns) == 0;
}

int agent_roompolicy_allows(const struct agent_roompolicy *p, const char *requester, const char *victim)
{
	if (strcmp(requester, victim) == 0)
		return 1;
	for (int i = 0; i < p->nrules; i++) {
		const struct agent_roompolicy_rule *r = &p->rules[i];
		if (!matches(r->requester, requester))
			continue;
		for (int k = 0; k < r->nvictims; k++)
			if (matches(r->victims[k], victim))
				return 1;
	}
	return 0;
}

void agent_roompolicy_describe(const struct agent_roompolicy *p, char *out, size_t len)
{
	size_t used = 0;
	out[0] = '\0';
	if (p->nrules == 0) {
		snprintf(out, len, "each namespace from itself only");
		return;
	}
	for (int i = 0; i < p->nrules && used < len; i++) {
		const struct agent_roompolicy_rule *r = &p->rules[i];
		int w = snprintf(out + used, len - used, "%s%s from", i ? "; " : "", r->requester);
		used = w > 0 && (size_t)w < len - used ? used + (size_t)w : len;
		for (int k = 0; k < r->nvictims && used < len; k++) {
			w = snprintf(out + used, len - used, "%s %s", k ? "," : "", r->victims[k]);
			used = w > 0 && (size_t)w < len - used ? used + (size_t)w : len;
		}
	}
}
