/* agent_watch: incremental decoder for a Kubernetes watch stream (?watch=1):
 * newline-delimited JSON events, fed in whatever chunks libcurl delivers. */
#ifndef AGENT_WATCH_H
#define AGENT_WATCH_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"

/* Default bound on one event line, in bytes: the API server caps an object
 * at ~1.5 MiB in etcd, so 16 MiB is generous yet stops unbounded growth. */
#define AGENT_WATCH_MAX_LINE_DEFAULT (16u * 1024 * 1024)
/* resourceVersion is opaque, but etcd's are decimal int64s; 128 bytes is ample. */
#define AGENT_WATCH_RV_MAX 128

enum agent_watch_type {
	AGENT_WATCH_ADDED = 1,
	AGENT_WATCH_MODIFIED,
	AGENT_WATCH_DELETED,
	/* Not an object change: the server only says "you are up to date to
	 * resource_version". The version is already recorded when the callback runs. */
	AGENT_WATCH_BOOKMARK,
};

struct agent_watch_event {
	enum agent_watch_type type;
	/* The event's "object" (a JSON object). Borrowed: valid only during the
	 * callback; json_incref it to keep it. */
	json_t *object;
	/* object.metadata.resourceVersion; borrowed like object, never NULL. */
	const char *resource_version;
};

/* Called once per ADDED, MODIFIED, DELETED or BOOKMARK event, in stream order.
 * Returns 0 to go on, or a negative errno (with err filled) to stop:
 * agent_watch_feed then returns it, and the event's resourceVersion is not
 * recorded, so a new watch from agent_watch_resource_version replays it. */
typedef int (*agent_watch_cb)(const struct agent_watch_event *ev, void *data, struct gcr_err *err);

struct agent_watch;

/* max_line: longest accepted event line in bytes, 0 for the default. */
struct agent_watch *agent_watch_new(size_t max_line, agent_watch_cb cb, void *data);

/* NULL-safe. */
void agent_watch_free(struct agent_watch *w);

/* Feeds len bytes from the stream; complete lines are decoded and delivered
 * before it returns, a partial line is kept for the next call. Returns 0, or:
 *   -ESTALE   an ERROR event with Status 410 Gone / reason Expired: the
 *             resourceVersion is too old; list again and watch from the list's
 *   -EIO      any other ERROR event; err has the Status code and message
 *   -EPROTO   a line that is not a well-formed watch event
 *   -EMSGSIZE a line longer than max_line
 *   the callback's negative value.
 * Any of these ends the stream: later feeds return the same code until
 * agent_watch_reset. */
int agent_watch_feed(struct agent_watch *w, const void *buf, size_t len, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* End of stream: decodes a last line that had no newline. Returns as feed. */
int agent_watch_finish(struct agent_watch *w, struct gcr_err *err) __attribute__((warn_unused_result));

/* Clears the partial line and the error state for a new watch connection;
 * the recorded resourceVersion is kept (resume from it). */
void agent_watch_reset(struct agent_watch *w);

/* Last resourceVersion delivered (events and bookmarks), "" if none yet. */
const char *agent_watch_resource_version(const struct agent_watch *w);

/* Sets the version to resume from, e.g. a list's metadata.resourceVersion
 * after a relist; NULL or "" clears it. Returns -EINVAL when too long. */
int agent_watch_set_resource_version(struct agent_watch *w, const char *rv);

/* Lines decoded so far (including empty ones), for diagnostics. */
unsigned long agent_watch_lines(const struct agent_watch *w);

#endif
