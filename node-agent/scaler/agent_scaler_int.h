/* agent_scaler_int: what the GPUResidency controller's files share, internal to
 * node-agent/scaler/ (nothing outside it includes this): the scaler's state, one pass over a
 * GPUResidency with its pods and operations, and the functions that agent_scaler.c and
 * agent_scaler_status.c call across files. Include agent_scaler.h first: included here, the two
 * would include each other (an include cycle, which tests/unit/test_architecture.sh refuses). */
#ifndef AGENT_SCALER_INT_H
#define AGENT_SCALER_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include <jansson.h>

#include "agent_kube.h"
#include "agent_leader.h"
#include "agent_informer.h"
#include "agent_phase.h"
#include "agent_scalemsg.h"
#include "agent_workq.h"
#include "gcr_scale.h"

#define API "/apis/gpucr.dev/v1alpha1"
/* A pod whose last operation failed is left alone this long (s) before a retry. */
#define COOLDOWN_S 10

struct agent_scaler {
	struct agent_kube *kube;
	struct agent_leader *leader;
	char *lease_ns;
	char *agent_selq; /* the node agents' pods' label selector, query-escaped; NULL: none */
	int resync_ms;
	atomic_int stop;
	struct agent_informers *inf;  /* the process's mirrors (borrowed) */
	struct agent_informer_sub *sub; /* GPUResidency objects, "ns/name" -> object (shared) */
	struct agent_workq *q;        /* "s:ns/name" per object; LEASES_KEY */
	pthread_t worker;
	int worker_started;
};

enum okind { O_CK, O_RS };

struct opr {
	json_t *obj; /* borrowed from the pass's lists */
	enum okind kind;
	long seq;
	int on_delete; /* a Restore made by the finalizer */
	const char *name, *pod_uid, *pod_name, *reason, *message;
	enum agent_phase phase;
	double completed; /* completionTime, 0 if none */
};

struct podr {
	const char *name, *uid, *node; /* borrowed */
	json_t *labels;                /* the pod's labels (borrowed), for other GPUResidencies' selectors */
	int selected;                  /* picked by the selector (else: leaving, or gone) */
	int contested;                 /* also picked by an older GPUResidency, which acts on it: left alone */
	const char *winner;            /* that one's name (borrowed from the pass's cache copy) */
	int external;                  /* its node says suspended (or in flight) by something not ours */
	int gone;                      /* deleted: its operations are removed */
	int given_up;                  /* deleting: left suspended, its operations kept */
	enum agent_phase phase;        /* the pod's phase, once read (same names as an operation's) */
	enum gcr_scale_state state;
	int pinned;
	double last_active;
	long long calls;
	struct opr *latest;
	long max_seq;
	char op[160];        /* Kind/name of the operation deciding its state */
	char msg[300];
};

struct pass {
	struct agent_scaler *s;
	json_t *res; /* the GPUResidency (owned copy) */
	const char *ns, *name, *uid;
	json_t *pods_list, *ck_list, *rs_list, *nodes; /* owned */
	json_t *keep;                                  /* pods read one by one (owned): r->node */
	int deleting;                                  /* deletionTimestamp set: the finalizer's pass */
	struct opr *ops;
	size_t nops;
	struct podr *pods;
	size_t npods;
	int created, deleted, errors;
	char selector[AGENT_SCALEMSG_SELECTOR_MAX];
	/* SelectorConflict: checked (else the old condition is kept), pods lost to older
	 * objects, and the condition's message (empty: no conflict). */
	int conflict_checked, lost;
	char conflict[1800];
};

/* agent_scaler.c: helpers and the pass's Events. */
const char *agent_scaler_str_at(json_t *o, const char *a, const char *b);
double agent_scaler_parse_time(const char *s);
void agent_scaler_event(struct pass *p, const char *type, const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* agent_scaler_status.c: the status, its conditions, and the Events of a selector conflict. */
void agent_scaler_conflict_events(struct pass *p);
void agent_scaler_write_status(struct pass *p, int replicas, const struct gcr_scale_plan *plan, int busy);
void agent_scaler_write_ready(struct pass *p, const char *status, const char *reason, const char *msg);

#endif
