/* agent_share: each pod's fair share of the agent's per-node tables and pools (registry
 * entries, eviction holds, room requests, controller workers): what each owner holds, the
 * refusals past its share (counted, logged and told as an Event at most once a minute per
 * owner and table), and what /metrics shows of them (docs/install.md, "Shares per pod").
 *
 * The rule: a table of capacity C shared among at most P owners (the device plugin's slots:
 * every opted-in pod holds one) gives each owner max(1, C / P) entries, or the configured
 * number. With P owners at most, the shares fit in the table, so a pod that uses all of its
 * own never takes another pod's. */
#ifndef AGENT_SHARE_H
#define AGENT_SHARE_H

#include "gcr_error.h"

/* An owner key: a pod's uid (36 bytes) or a namespace (63). */
#define AGENT_SHARE_OWNER_MAX 64
/* A refusal is logged and told (an Event) at most this often per owner and table (ms); the
 * next line says how many refusals came in between. */
#define AGENT_SHARE_TELL_MS 60000
/* Owners told at once, waiting for the teller's thread; past it the Event is dropped (the
 * log line and the metric still count it). */
#define AGENT_SHARE_NOTICES 256
/* The owners a table expects when nothing says: the chart's default devicePlugin.slots. */
#define AGENT_SHARE_OWNERS_DEFAULT 32

struct agent_share_cfg {
	const char *name;  /* the table, in the metric's label and the log: "registry" */
	const char *what;  /* what one entry is, plural: "registered processes" */
	const char *owner; /* what owns entries: "pod" (the Events go to it) or "namespace" */
	int capacity;      /* entries the table has (> 0) */
	int per_owner;     /* at most this many for one owner; 0: agent_share_fair(capacity, owners) */
	int owners;        /* owners expected at most (> 0; 0: AGENT_SHARE_OWNERS_DEFAULT) */
	int tell;          /* 1: a refusal queues an Event on the owner (a pod uid) for the teller */
};

/* max(1, capacity / owners): each of owners owners gets this many, and they all fit. */
int agent_share_fair(int capacity, int owners);

struct agent_shares; /* every table of one agent; the teller's thread */
struct agent_share;  /* one table */

/* Posts an Event about a refusal on the owner's pod (uid); called from the teller's thread. */
typedef void (*agent_share_tell_fn)(void *data, const char *owner, const char *table, const char *note);

struct agent_shares *agent_shares_new(void); /* NULL: out of memory */

/* A table; owned by ss (freed with it). NULL: out of memory or a bad cfg (err says). */
struct agent_share *agent_shares_add(struct agent_shares *ss, const struct agent_share_cfg *cfg,
				     struct gcr_err *err);

/* Sets the teller (before agent_shares_start); without one, no Event is posted. */
void agent_shares_set_teller(struct agent_shares *ss, agent_share_tell_fn fn, void *data);

/* Starts the teller's thread. */
int agent_shares_start(struct agent_shares *ss, struct gcr_err *err) __attribute__((warn_unused_result));

/* Stops the teller's thread (notices not yet told are dropped): after it, the teller's data
 * may go. NULL-safe, idempotent. */
void agent_shares_stop(struct agent_shares *ss);

/* Stops the thread; frees every table. NULL-safe. */
void agent_shares_free(struct agent_shares *ss);

/* One entry of the table for owner; who says for whom in the log ("pid 4242"). 0: taken;
 * -EDQUOT: owner holds its whole share (refused to it alone: counted, logged and told at most
 * once per AGENT_SHARE_TELL_MS, err says so); -ENOSPC: the table is full (more owners than
 * expected). An owner "" (a process outside pods) is bound by the capacity only. *tell (may
 * be NULL) is set to 1 when this refusal is the one to tell, for a caller that tells itself. */
int agent_share_take(struct agent_share *s, const char *owner, const char *who, int *tell, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Gives back one entry of owner (one it took). */
void agent_share_give(struct agent_share *s, const char *owner);

/* Entries owner holds now. */
int agent_share_used(struct agent_share *s, const char *owner);

/* One owner's share, and the table's capacity. */
int agent_share_limit(const struct agent_share *s);
int agent_share_capacity(const struct agent_share *s);

/* What /metrics shows of one table. */
struct agent_share_stat {
	const char *name;
	int capacity, per_owner, in_use, owners; /* owners holding at least one entry */
	unsigned long long refused;
};

/* Calls fn for each table, in the order added, under the shares' lock (fn must not call back). */
void agent_shares_each(struct agent_shares *ss, void (*fn)(void *data, const struct agent_share_stat *st),
		       void *data);

#endif
