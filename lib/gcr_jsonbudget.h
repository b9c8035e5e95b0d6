/* gcr_jsonbudget: a bound on the memory jansson takes while parsing outside input that may be
 * large (a process's allocation table, a manifest a pod or a share's client wrote): measured,
 * jansson's tree of an 8 MiB table took 90-130 MiB, of 40 MB 800 MiB. Each such parse runs
 * with a budget: every allocation jansson makes in that thread meanwhile counts (with malloc's
 * own bytes), and past the budget it fails, so the parse fails cleanly instead of the process
 * growing; and one such parse runs at a time, so the process holds one budget at most.
 * The budget works once gcr_jsonbudget_install has run: gcr-agent and gcrctl call it first
 * thing; the shim, inside someone else's process, never does (only the byte caps apply). */
#ifndef GCR_JSONBUDGET_H
#define GCR_JSONBUDGET_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"

/* Routes jansson's allocations through the budget's counter (process-wide, before any other
 * jansson call; the same malloc and free underneath, so objects made before are freed right). */
void gcr_jsonbudget_install(void);

/* Whether gcr_jsonbudget_install has run in this process. */
int gcr_jsonbudget_installed(void);

/* json_loadb(buf, len, flags) within budget bytes of jansson's allocations, one at a time in
 * the process. NULL with err: -EFBIG past the budget, -EBADMSG not JSON (where, and why). */
json_t *gcr_jsonbudget_loadb(const char *buf, size_t len, size_t flags, size_t budget, struct gcr_err *err);

#endif
