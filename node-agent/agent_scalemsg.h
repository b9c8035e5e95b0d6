/* agent_scalemsg: the scaler's parsers and encoders of outside input: a LabelSelector
 * to its string and query forms, and the activity note node agents put on their Lease. */
#ifndef AGENT_SCALEMSG_H
#define AGENT_SCALEMSG_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"

/* Annotation of a node's heartbeat Lease: per pod UID, when its processes last
 * called the driver and how many calls since the sample before. */
#define AGENT_SCALEMSG_ACTIVITY_KEY "gpucr.dev/activity"
/* Largest activity note read, in bytes (annotations total at most 256 KiB). */
#define AGENT_SCALEMSG_ACTIVITY_MAX (200u * 1024)
/* Longest selector string produced, in bytes. */
#define AGENT_SCALEMSG_SELECTOR_MAX 8192

/* metav1.LabelSelector (matchLabels, matchExpressions with In, NotIn, Exists,
 * DoesNotExist) to the string form of labels.Parse ("a=b,c in (d,e),!f"), into out
 * (len bytes). Keys and values are checked against label syntax, so the string is
 * safe to put in a query once escaped. An empty selector is refused (-EINVAL): it
 * would pick every pod of the namespace. */
int agent_scalemsg_selector(json_t *selector, char *out, size_t len, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Percent-encodes s for a URL query value into out (len bytes); -ENAMETOOLONG if it does not fit. */
int agent_scalemsg_query_escape(const char *s, char *out, size_t len) __attribute__((warn_unused_result));

struct agent_scalemsg_activity {
	double last_active; /* seconds since the epoch; 0: never seen active */
	long long calls;    /* calls in the last sampling interval */
};

/* Looks pod_uid up in an activity note (the annotation's text). 0 found, -ENOENT
 * not listed, -EINVAL malformed or too long (message in err). */
int agent_scalemsg_activity_find(const char *text, size_t len, const char *pod_uid,
				 struct agent_scalemsg_activity *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Adds pod_uid's entry to a note being built (an object; see agent_scalemsg_activity_text). */
int agent_scalemsg_activity_add(json_t *note, const char *pod_uid, const struct agent_scalemsg_activity *a);

/* The note's text (malloc'd), or NULL when out of memory. */
char *agent_scalemsg_activity_text(json_t *note);

#endif
