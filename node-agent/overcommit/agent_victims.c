/* agent_victims: the overcommit policy's choice of victims (agent_victims_pick): priority,
 * then least recently active, and just enough of them. No I/O: tests call it directly. */
#include "agent_victims.h"

#include <errno.h>
#include <stdlib.h>

/* qsort's comparison needs the array: the candidates are passed by index through this. */
struct ranked {
	const struct agent_victim *v;
	int idx;
};

static int before(const void *a, const void *b)
{
	const struct agent_victim *x = ((const struct ranked *)a)->v, *y = ((const struct ranked *)b)->v;
	if (x->priority != y->priority)
		return x->priority < y->priority ? -1 : 1;
	if (x->last_active != y->last_active)
		return x->last_active < y->last_active ? -1 : 1;
	if (x->bytes != y->bytes)
		return x->bytes > y->bytes ? -1 : 1;
	return x->pid < y->pid ? -1 : x->pid > y->pid;
}

int agent_victims_pick(const struct agent_victim *c, int n, int prio, unsigned long long need, int *out,
		       unsigned long long *freed)
{
	*freed = 0;
	if (need == 0 || n <= 0)
		return need == 0 ? 0 : -ENOSPC;
	struct ranked *r = malloc((size_t)n * sizeof(*r));
	if (r == NULL)
		return -ENOMEM;
	int m = 0;
	unsigned long long all = 0;
	for (int i = 0; i < n; i++)
		if (c[i].eligible && c[i].preemptible && c[i].priority < prio && c[i].bytes > 0) {
			r[m++] = (struct ranked){ .v = &c[i], .idx = i };
			all += c[i].bytes;
		}
	if (all < need) {
		free(r);
		*freed = all;
		return -ENOSPC;
	}
	qsort(r, (size_t)m, sizeof(*r), before);
	int k = 0;
	unsigned long long sum = 0;
	while (sum < need)
		sum += r[k++].v->bytes;
	/* Put back the earliest chosen that turned out unneeded (a small one before a big one). */
	int kept = 0;
	for (int i = 0; i < k; i++) {
		if (i < k - 1 && sum - r[i].v->bytes >= need) {
			sum -= r[i].v->bytes;
			continue;
		}
		out[kept++] = r[i].idx;
	}
	free(r);
	*freed = sum;
	return kept;
}
