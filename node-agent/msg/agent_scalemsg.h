/* agent_scalemsg: the scaler's parsers and encoders of outside input: a LabelSelector
 * to its string and query forms, and the activity note node agents put on their Lease. */
#ifndef AGENT_SCALEMSG_H
#define AGENT_SCALEMSG_H

#include <jansson.h>
#include <stddef.h>

#include "gcr_error.h"
#include "gcr_shimreply.h"

/* Annotation of a node's heartbeat Lease: per pod UID, when its processes last
 * called the driver, how many calls since the sample before and (since the "at" field) how
 * many of its processes the shims reported in each state, as of the sample time "at". */
#define AGENT_SCALEMSG_ACTIVITY_KEY "gpucr.dev/activity"
/* Largest activity note read, in bytes (annotations total at most 256 KiB). */
#define AGENT_SCALEMSG_ACTIVITY_MAX (200u * 1024)
/* Most processes of one pod in one state that a note may claim (a node has far fewer). */
#define AGENT_SCALEMSG_PROCS_MAX 65536
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
	/* The node's truth about the pod's processes: how many the shims reported in each state
	 * (UNKNOWN: no answer in time). have_states 0: the note has none (an agent older than
	 * the field): the states are unknown, not "none". */
	int have_states;
	int procs[GCR_SHIMREPLY_ST_N];
	double sampled; /* when the states were read (seconds since the epoch, the node's clock); 0: unknown */
};

/* Looks pod_uid up in an activity note (the annotation's text). 0 found, -ENOENT
 * not listed, -EINVAL malformed or too long (message in err). Strict: a state name other
 * than gcr_shimreply's, a count outside 0 .. AGENT_SCALEMSG_PROCS_MAX, or states without
 * the note's "at" make the note malformed. */
int agent_scalemsg_activity_find(const char *text, size_t len, const char *pod_uid,
				 struct agent_scalemsg_activity *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Adds pod_uid's entry to a note being built (an object; see agent_scalemsg_activity_text),
 * with its states when a->have_states (then a->sampled becomes the note's "at"). */
int agent_scalemsg_activity_add(json_t *note, const char *pod_uid, const struct agent_scalemsg_activity *a);

/* Whether a pod with these labels (an object of strings; NULL: none) is picked by selector
 * (a metav1.LabelSelector, as agent_scalemsg_selector takes it): 1 picked, 0 not, -EINVAL
 * when the selector is not one agent_scalemsg_selector accepts (message in err). */
int agent_scalemsg_selector_match(json_t *selector, json_t *labels, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The note's text (malloc'd), or NULL when out of memory. */
char *agent_scalemsg_activity_text(json_t *note);

#endif
