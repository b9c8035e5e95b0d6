/* shim_gate: the gate on work submission that holds the application's threads for
 * the whole checkpoint window, and the per-thread call counters behind statistics. */
#ifndef SHIM_GATE_H
#define SHIM_GATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_hooktab.h"

/* Counter rows: every vendor's hooks (SHIM_HOOK_ROW in shim_hooktab.h). */
#define SHIM_GATE_ROWS SHIM_HOOK_ROWS

/* One per live application thread that called a hook; freed at thread exit, its
 * counts added to the totals. Counters written by the owner only (relaxed stores). */
struct shim_thread {
	atomic_int active; /* gated calls in progress in this thread (nesting depth) */
	_Atomic uint64_t calls[SHIM_GATE_ROWS][2];
	struct shim_thread *next, *prev; /* the live list, under the gate's lock */
};

struct shim_thread *shim_thread_self(void);
/* Records held now (live threads that called a hook, and the shared fallback). */
size_t shim_gate_nthreads(void);

/* Counts a call that does not pass the gate (resolvers, init) on row SHIM_HOOK_ROW(v, id). */
static inline void shim_count(struct shim_thread *t, unsigned row, int variant)
{
	uint64_t c = atomic_load_explicit(&t->calls[row][variant], memory_order_relaxed);
	atomic_store_explicit(&t->calls[row][variant], c + 1, memory_order_relaxed);
}

/* Entering counts the call on its row and blocks while the gate is closed. The fast path is
 * one atomic add on the thread's own cache line and one load of a read-mostly flag. */
struct shim_thread *shim_gate_enter(unsigned row, int variant);
void shim_gate_exit(struct shim_thread *t);

/* Closes the gate and waits until no thread is inside a gated call.
 * -EBUSY (gate reopened) if that takes longer than timeout_ms. */
int shim_gate_close(int timeout_ms, struct gcr_err *err);
void shim_gate_open(void);
int shim_gate_is_closed(void);
/* The closed gate's GPU is quiet: every piece of work submitted before it closed has finished
 * (shim_cr sets it after its synchronisation; opening the gate clears it). While it is, the
 * backends answer queries on that work (is this event, this stream done?) themselves: yes,
 * without entering a driver whose checkpoint lock would hold the caller (PyTorch's watchdog
 * thread, whose stopped heartbeat ends the process after 8 minutes). */
void shim_gate_set_quiet(void);
int shim_gate_quiet(void);

/* Called (outside the gate's locks) by each thread about to wait at the closed gate, before
 * it waits; NULL: none. The overcommit wake (shim_agent) hangs here; the open gate never
 * reaches it. */
void shim_gate_set_wait_hook(void (*fn)(void));
/* Threads waiting at the closed gate now, and when the first of them began (monotonic ms; 0
 * when none waits). */
int shim_gate_waiting(double *since_ms);

/* Sums of every thread's counters on a row, and how many calls waited at the gate. */
uint64_t shim_gate_total_calls(unsigned row, int variant);
uint64_t shim_gate_waits(void);

#endif
