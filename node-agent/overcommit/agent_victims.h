/* agent_victims: which processes to suspend so that an allocation fits: a pure function of
 * the candidates (priority, last activity, never-suspend, bytes), tested on its own. */
#ifndef AGENT_VICTIMS_H
#define AGENT_VICTIMS_H

#include <sys/types.h>

struct agent_victim {
	pid_t pid;
	int priority;               /* higher wins */
	int preemptible;            /* 0: never chosen */
	int eligible;               /* 0: not a candidate at all (not opted in, other GPU, held already) */
	double last_active;         /* seconds (any epoch; larger is more recent), 0 unknown: oldest */
	unsigned long long bytes;   /* what a suspend gives back on the requester's GPU */
};

/* Picks, among the n candidates, those to suspend for a requester of priority prio that needs
 * need more bytes: only eligible, preemptible ones with priority strictly below prio and bytes
 * > 0, in the order lowest priority first, then least recently active, then most bytes, then
 * lowest pid; taken in that order until their bytes reach need, after which every chosen one
 * the rest can do without is put back (earliest in the order first), so no more are suspended
 * than needed. Writes their indices into out (room for n) in the order chosen, the bytes they
 * free into *freed. Returns how many (0 when need is 0), or -ENOSPC when all the candidates
 * together would not reach need: then none is chosen (*freed says what they would free). */
int agent_victims_pick(const struct agent_victim *c, int n, int prio, unsigned long long need, int *out,
		       unsigned long long *freed);

#endif
