/* agent_workq: a work queue with client-go's semantics in plain C, for a controller's workers.
 * A key (a string naming the work, "c:ns/name") is queued at most once; a key being processed
 * is never handed to a second worker, and one added meanwhile is queued again when its worker
 * is done; delayed adds wait on a timer (no polling), with a per-key exponential backoff; and
 * owners (a pod: one operation per pod) are claimed by one key at a time, the keys that found
 * an owner taken parked on it until it is released. No I/O, no JSON: unit-tested alone. */
#ifndef AGENT_WORKQ_H
#define AGENT_WORKQ_H

#include <stddef.h>

/* Longest key, owner and parking-place name, with the NUL. */
#define AGENT_WORKQ_KEY_MAX 768

struct agent_workq;

/* A queue whose backoff starts at first_ms and doubles up to max_ms (both > 0). NULL: out of
 * memory. */
struct agent_workq *agent_workq_new(int first_ms, int max_ms);

/* Frees q; the caller has shut it down and joined the threads that call get. NULL-safe. */
void agent_workq_free(struct agent_workq *q);

/* Queues key unless it is queued already; a key being processed is queued again at its done.
 * A key longer than AGENT_WORKQ_KEY_MAX - 1 is refused: -ENAMETOOLONG (-ENOMEM: out of memory). */
int agent_workq_add(struct agent_workq *q, const char *key);

/* Queues key in ms (ms <= 0: now). A key already waiting keeps the earlier of its two times. */
int agent_workq_add_after(struct agent_workq *q, const char *key, int ms);

/* add_after with key's next delay: first_ms, then twice the last, up to max_ms. Returns the
 * delay (ms), or -errno as add. */
int agent_workq_backoff(struct agent_workq *q, const char *key);

/* Forgets key's backoff: its next backoff waits first_ms again. */
void agent_workq_forget(struct agent_workq *q, const char *key);

/* key's last backoff delay (ms), 0 when it has none (never backed off, or forgotten). */
int agent_workq_backoff_ms(struct agent_workq *q, const char *key);

/* 1 when key waits on a timer (add_after or backoff not yet due), else 0. */
int agent_workq_waiting(struct agent_workq *q, const char *key);

/* Blocks until a key is due and not being processed, and copies it to key (len >= its
 * length + 1, else it is cut): 1, the key now being processed (call done). 0 once the queue is
 * shut down. */
int agent_workq_get(struct agent_workq *q, char *key, size_t len);

/* key's worker finished with it: queued again if it was added meanwhile. */
void agent_workq_done(struct agent_workq *q, const char *key);

/* Takes owner for key: 1 when it was free (it is key's until agent_workq_release), 0 when
 * another key holds it: key is then parked on it, and queued again at the release. -errno as
 * add. */
int agent_workq_claim(struct agent_workq *q, const char *owner, const char *key);

/* Frees owner; the keys parked on it are queued again. */
void agent_workq_release(struct agent_workq *q, const char *owner);

/* Parks key on place (any name: what it waits for, such as its namespace's share of the
 * workers), to be queued again by agent_workq_unpark(place). -errno as add. */
int agent_workq_park(struct agent_workq *q, const char *place, const char *key);

/* Queues again every key parked on place. */
void agent_workq_unpark(struct agent_workq *q, const char *place);

/* Keys queued now (due, not yet taken; timers that came due are queued first), for tests and
 * metrics. */
int agent_workq_len(struct agent_workq *q);

/* Ends every get (now and after) with 0; adds are ignored from then on. */
void agent_workq_shutdown(struct agent_workq *q);

#endif
