/* shim_gate: per-thread in-flight flags instead of one shared counter, so an open
 * gate costs no cache-line traffic between launching threads. A thread's record is
 * freed when the thread exits (its counts folded into the retired totals): a process
 * that starts 100k short-lived threads must not keep 100k records (~2.4 KB each). */
#include "shim_gate.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "gcr_time.h"

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cond = PTHREAD_COND_INITIALIZER;
static atomic_int gate_closed;
static atomic_int gate_quiet; /* shim_gate_set_quiet */
static _Atomic uint64_t gate_waits;
static void (*_Atomic wait_hook)(void);
/* Threads waiting now; the first one's arrival (monotonic ms), both under gate_lock. */
static int waiting;
static double waiting_since;

/* threads_lock guards the list, the retired totals and nthreads; a record is only
 * read under it (or by its own thread), so freeing one under it is safe. */
static pthread_mutex_t threads_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_thread *threads; /* live threads' records, doubly linked */
static uint64_t retired[SHIM_GATE_ROWS][2]; /* counts of threads that have exited */
static size_t nthreads;
static __thread struct shim_thread *self __attribute__((tls_model("initial-exec")));

/* Used when even a small allocation fails (or no key could be made): counts are then
 * shared, the gate still works, and it is never freed. */
static struct shim_thread fallback_thread;
static pthread_once_t fallback_once = PTHREAD_ONCE_INIT;

static pthread_key_t exit_key;
static int exit_key_ok;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

static void push_thread(struct shim_thread *t)
{
	pthread_mutex_lock(&threads_lock);
	t->prev = NULL;
	t->next = threads;
	if (threads != NULL)
		threads->prev = t;
	threads = t;
	nthreads++;
	pthread_mutex_unlock(&threads_lock);
}

static void push_fallback(void)
{
	push_thread(&fallback_thread);
}

/* The key's destructor, at thread exit: the record leaves the list, its counts stay. */
static void thread_exit(void *arg)
{
	struct shim_thread *t = arg;
	if (t == NULL || t == &fallback_thread)
		return;
	pthread_mutex_lock(&threads_lock);
	for (unsigned r = 0; r < SHIM_GATE_ROWS; r++)
		for (int v = 0; v < 2; v++)
			retired[r][v] += atomic_load_explicit(&t->calls[r][v], memory_order_relaxed);
	if (t->prev != NULL)
		t->prev->next = t->next;
	else
		threads = t->next;
	if (t->next != NULL)
		t->next->prev = t->prev;
	nthreads--;
	pthread_mutex_unlock(&threads_lock);
	/* A later destructor (another library's) calling CUDA gets a fresh record, which
	 * pthread then hands to this destructor again. */
	if (self == t)
		self = NULL;
	free(t);
}

static void make_exit_key(void)
{
	exit_key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

struct shim_thread *shim_thread_self(void)
{
	struct shim_thread *t = self;
	if (t != NULL)
		return t;
	pthread_once(&exit_key_once, make_exit_key);
	t = exit_key_ok ? calloc(1, sizeof(*t)) : NULL;
	if (t != NULL && pthread_setspecific(exit_key, t) != 0) {
		free(t);
		t = NULL;
	}
	if (t == NULL) {
		pthread_once(&fallback_once, push_fallback);
		t = &fallback_thread;
	} else {
		push_thread(t);
	}
	self = t;
	return t;
}

size_t shim_gate_nthreads(void)
{
	pthread_mutex_lock(&threads_lock);
	size_t n = nthreads;
	pthread_mutex_unlock(&threads_lock);
	return n;
}

/* 1 if some thread is inside a gated call. Under threads_lock, so no record is freed
 * while it is read; never held while waiting, so threads can still start and exit. */
static int any_active(void)
{
	int busy = 0;
	pthread_mutex_lock(&threads_lock);
	for (struct shim_thread *t = threads; t != NULL && !busy; t = t->next)
		busy = atomic_load(&t->active) > 0;
	pthread_mutex_unlock(&threads_lock);
	return busy;
}

struct shim_thread *shim_gate_enter(unsigned row, int variant)
{
	struct shim_thread *t = shim_thread_self();
	shim_count(t, row, variant);
	for (;;) {
		/* seq_cst add, then seq_cst load: pairs with close()'s store-then-scan. */
		if (atomic_fetch_add(&t->active, 1) > 0)
			return t; /* nested inside a gated call of this thread: never self-block */
		if (!atomic_load(&gate_closed))
			return t;
		atomic_fetch_sub(&t->active, 1);
		atomic_fetch_add_explicit(&gate_waits, 1, memory_order_relaxed);
		pthread_mutex_lock(&gate_lock);
		if (waiting++ == 0)
			waiting_since = gcr_time_mono_ms();
		pthread_mutex_unlock(&gate_lock);
		/* Counted as waiting first: a hook armed after this sees the count (shim_gate_waiting). */
		void (*hook)(void) = atomic_load(&wait_hook);
		if (hook != NULL && atomic_load(&gate_closed))
			hook();
		pthread_mutex_lock(&gate_lock);
		while (atomic_load(&gate_closed))
			pthread_cond_wait(&gate_cond, &gate_lock);
		waiting--;
		pthread_mutex_unlock(&gate_lock);
	}
}

void shim_gate_exit(struct shim_thread *t)
{
	atomic_fetch_sub_explicit(&t->active, 1, memory_order_release);
}

int shim_gate_close(int timeout_ms, struct gcr_err *err)
{
	atomic_store(&gate_closed, 1);
	double deadline = gcr_time_mono_ms() + timeout_ms;
	/* Threads registered after gate_closed was set see it before they can run a
	 * gated call, so once a scan finds every thread outside, none can get in. */
	while (any_active()) {
		if (gcr_time_mono_ms() > deadline) {
			shim_gate_open();
			return gcr_err_set(err, -EBUSY, "a thread stayed inside a CUDA call for %d ms; gate reopened",
					   timeout_ms);
		}
		/* In-flight calls are submissions (microseconds) or synchronous
		 * copies; a 50 us poll keeps the close cheap without spinning. */
		struct timespec ts = { 0, 50000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

void shim_gate_open(void)
{
	pthread_mutex_lock(&gate_lock);
	atomic_store(&gate_quiet, 0);
	atomic_store(&gate_closed, 0);
	pthread_cond_broadcast(&gate_cond);
	pthread_mutex_unlock(&gate_lock);
}

int shim_gate_is_closed(void)
{
	return atomic_load(&gate_closed);
}

void shim_gate_set_quiet(void)
{
	if (atomic_load(&gate_closed))
		atomic_store(&gate_quiet, 1);
}

int shim_gate_quiet(void)
{
	return atomic_load_explicit(&gate_quiet, memory_order_acquire);
}

void shim_gate_set_wait_hook(void (*fn)(void))
{
	atomic_store(&wait_hook, fn);
}

int shim_gate_waiting(double *since_ms)
{
	pthread_mutex_lock(&gate_lock);
	int n = waiting;
	if (since_ms != NULL)
		*since_ms = n > 0 ? waiting_since : 0;
	pthread_mutex_unlock(&gate_lock);
	return n;
}

uint64_t shim_gate_total_calls(unsigned row, int variant)
{
	pthread_mutex_lock(&threads_lock);
	uint64_t sum = retired[row][variant];
	for (struct shim_thread *t = threads; t != NULL; t = t->next)
		sum += atomic_load_explicit(&t->calls[row][variant], memory_order_relaxed);
	pthread_mutex_unlock(&threads_lock);
	return sum;
}

uint64_t shim_gate_waits(void)
{
	return atomic_load_explicit(&gate_waits, memory_order_relaxed);
}
