/* gcr_jsonbudget: jansson's allocations counted against a per-parse budget in the parsing
 * thread (gcr_jsonbudget.h). Only allocations are counted, never frees: the count bounds
 * everything the parse took, so it is at least the parse's peak (a growing array's old
 * copies count too: an overestimate of at most the array's own bytes). */
#include "gcr_jsonbudget.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* malloc's own bytes per block (glibc: an 8-byte header, 16-byte granules). */
#define BLOCK_BYTES(n) (((n) + 8 + 15) & ~(size_t)15)

static atomic_int installed;
static pthread_mutex_t one_at_a_time = PTHREAD_MUTEX_INITIALIZER;
static __thread int counting;
static __thread int over;
static __thread size_t left;

static void *budget_malloc(size_t n)
{
	if (counting) {
		if (BLOCK_BYTES(n) > left) {
			over = 1;
			return NULL;
		}
		left -= BLOCK_BYTES(n);
	}
	return malloc(n);
}

static void budget_free(void *p)
{
	free(p);
}

void gcr_jsonbudget_install(void)
{
	json_set_alloc_funcs(budget_malloc, budget_free);
	atomic_store(&installed, 1);
}

int gcr_jsonbudget_installed(void)
{
	return atomic_load(&installed);
}

json_t *gcr_jsonbudget_loadb(const char *buf, size_t len, size_t flags, size_t budget, struct gcr_err *err)
{
	json_error_t je;
	pthread_mutex_lock(&one_at_a_time);
	left = budget;
	over = 0;
	counting = atomic_load(&installed);
	json_t *j = json_loadb(buf, len, flags, &je);
	counting = 0;
	int was_over = over;
	pthread_mutex_unlock(&one_at_a_time);
	if (j != NULL)
		return j;
	if (was_over)
		gcr_err_set(err, -EFBIG, "parsing its %zu bytes takes more than %zu MiB of memory (the bound)", len,
			    budget >> 20);
	else
		gcr_err_set(err, -EBADMSG, "not JSON: %s (line %d column %d)", je.text, je.line, je.column);
	return NULL;
}
