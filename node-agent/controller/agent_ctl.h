/* agent_ctl: what the controller's files share, internal to node-agent/controller/ (nothing
 * outside it includes this): the controller's state, an operation, and the functions that the
 * dispatch (agent_controller.c) and the actions (agent_ctl_*.c) call across files. Include
 * agent_controller.h first: included here, the two would include each other (an include cycle,
 * which tests/unit/test_architecture.sh refuses). */
#ifndef AGENT_CTL_H
#define AGENT_CTL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

#include "agent_crobj.h"
#include "agent_informer.h"
#include "agent_phase.h"
#include "agent_record.h"
#include "agent_workq.h"
#include "gcr_cr.h"
#include "gcr_error.h"
#include "gcr_imagemac.h"

#define API "/apis/gpucr.dev/v1alpha1"
#define MAX_PROCS AGENT_RECORD_MAX_PROCS
/* Default bound of one gate/driver-lock step in ms when the spec has no timeoutSeconds. */
#define DEFAULT_TIMEOUT_MS 60000
/* A suspend or resume's wait for the shim's answer: the operation's timeout (the gate's and the
 * driver lock's bound) plus this (ms), for the copies after the gate closed. */
#define GATE_SLACK_MS 60000
/* Operations run at once by default, and at most (different pods only). */
#define DEFAULT_PARALLEL 4
#define MAX_PARALLEL 64
/* Records whose Checkpoint is gone, and images whose Checkpoint is gone, are looked for this
 * often (ms). */
#define SWEEP_MS 2000
/* The condition that says whether a Checkpoint's status is the agent's (False, reason Forged:
 * a final phase someone else wrote, which the CRD keeps final). */
#define FORGED_TYPE "SetByAgent"
#define FORGED_REASON "Forged"

enum kind { K_POD, K_CK, K_RS, NK };

struct agent_controller;

struct agent_controller {
	struct agent_kube *kube;
	struct agent_registry *reg;
	struct agent_metrics *metrics;
	struct agent_record_store *rec;
	struct agent_ckimage *img; /* the Image action (agent_ckimage) */
	char *node, *lease_ns, *socket_dir, *pause, *pod_query, *instance, *images_dir, *kubelet_url, *key_dir,
		*alloc_root;
	int pause_s, grace_ms, images_keep, images_shared, registry_port;
	struct agent_controller_adopt adopt;
	double last_leftovers; /* the last sweep of leftovers (monotonic ms) */
	atomic_int stop;
	/* The controller's lock is the process's mirrors' (agent_informers_lock(inf)), as for the
	 * scaler's roles (agent_gate, agent_replace): it guards the controller's views and
	 * everything below, and its hooks (om_changed) are called under it, so a view and the state
	 * derived from it change together (one lock, as when the controller's own mirror took
	 * its lock). Lock order: this lock first, then the controller's work queue's (agent_workq),
	 * the workers' share's (agent_share) and the record store's (agent_record), never the
	 * other way; the roles sharing it in role all (gate, replace, the GPUResidency scaler) take
	 * only their own work queues' locks under it, and the roles calling the controller
	 * (overcommit, eviction, the shares' teller: pod_by_uid, pod_event, checkpoint_wait) hold
	 * none of those when they do. No API request is made under it; a wait on the conditions
	 * below releases it (agent_informers_wait_locked). */
	struct agent_informers *inf;
	pthread_cond_t cond;
	pthread_cond_t pod_changed; /* a pod event arrived (wait_gate) */
	pthread_cond_t ck_changed;  /* a Checkpoint event arrived (agent_controller_checkpoint_wait) */
	/* The controller's views, "ns/name" -> object: this node's pods (field selector: a mirror
	 * of its own); the Checkpoints and Restores not yet taken by a node, or taken by this one,
	 * whole; those another node took only as far as needed to recognise them (slim). Each a
	 * copy of its own (the Checkpoints' and Restores' watches shared with the process's other
	 * roles): agent_ctl_cached_locked, agent_informer_next_locked. */
	struct agent_informer_sub *sub[NK];
	/* Keys "c:ns/name", "r:ns/name", "o:<record uid>", SWEEP_KEY (agent_workq: its own lock,
	 * taken inside this one). Each pod ("ns/pod") is claimed by one key at a time, so that
	 * operations on one pod never overlap (its processes' state machine is one); a key that
	 * found its namespace's share of the workers used is parked on "ns:<namespace>". */
	struct agent_workq *q;
	json_t *done;       /* metadata.uid of objects finished by this process (no record) */
	json_t *first_seen; /* Restore uid -> when it was first seen without its Checkpoint (ms) */
	/* Each namespace's share of the workers (cfg.workers). */
	struct agent_share *workers_share;
	int nworkers;
	pthread_t workers[MAX_PARALLEL];
	int workers_started;
};

struct op {
	enum kind kind;
	json_t *obj; /* owned copy */
	struct agent_crobj d; /* obj decoded */
	const char *key;
	char path[700];
};

struct proc {
	pid_t pid;
	char container[AGENT_CROBJ_NS_LEN];
};

enum pod_where { POD_HERE, POD_MISSING, POD_OTHER_NODE, POD_UNSCHEDULED, POD_UNKNOWN };

/* agent_controller.c: the caches, retries, status and Events, processes and pods that every action uses. */
const char *agent_ctl_md_str(json_t *obj, const char *field);
const char *agent_ctl_status_str(json_t *obj, const char *field);
/* The cached object of kind k with key "ns/name" (borrowed, under the lock; NULL: none), and
 * whether all three caches were listed (an empty cache before its list would say "no such
 * object"). A cache is walked with agent_informer_next_locked(c->sub[k], ...). */
json_t *agent_ctl_cached_locked(struct agent_controller *c, enum kind k, const char *key);
int agent_ctl_synced_locked(struct agent_controller *c);
json_t *agent_ctl_cache_get(struct agent_controller *c, enum kind k, const char *ns, const char *name);
int agent_ctl_cache_has_uid(struct agent_controller *c, enum kind k, const char *ns, const char *name, const char *uid);
void agent_ctl_mark_done(struct agent_controller *c, const char *uid);
int agent_ctl_is_done(struct agent_controller *c, const char *uid);
void agent_ctl_retry_later(struct agent_controller *c, const char *key, int ms);
void agent_ctl_retry_reset(struct agent_controller *c, const char *key);
/* 1 while key is being retried with backoff (retry_later with 0, not reset since). */
int agent_ctl_retrying(struct agent_controller *c, const char *key);
int agent_ctl_nap(struct agent_controller *c, int ms);
json_t *agent_ctl_build_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
			       const char *message, json_t *extra);
int agent_ctl_write_status(struct agent_controller *c, struct op *o, json_t *st);
int agent_ctl_set_status(struct agent_controller *c, struct op *o, enum agent_phase phase, const char *reason,
			 const char *message, json_t *extra);
void agent_ctl_event(struct agent_controller *c, json_t *obj, const char *action, const char *type, const char *reason,
		     const char *note);
void agent_ctl_fail(struct agent_controller *c, struct op *o, const char *reason, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void agent_ctl_test_pause(struct agent_controller *c, const char *where);
void agent_ctl_save(struct agent_controller *c, const struct agent_record *r);
int agent_ctl_ck_finalizer(struct agent_controller *c, const char *ns, const char *name, const char *uid, int add,
			   struct gcr_err *err);
const char *agent_ctl_status_container_id(json_t *st);
json_t *agent_ctl_container_status(json_t *pod, const char *cname, const char *cid);
void agent_ctl_container_name_of(json_t *pod, const char *cid, char *out, size_t len);
json_t *agent_ctl_procs_json(const struct proc *p, int n, const char *state);
int agent_ctl_verified_procs(struct agent_controller *c, const struct agent_record *r, struct proc *out, int *gone);
enum gcr_cr_mode agent_ctl_mode_of(int keep_context);
const char *agent_ctl_mode_api_name(enum gcr_cr_mode m);
enum gcr_cr_st agent_ctl_real_state(struct agent_controller *c, pid_t pid, enum gcr_cr_mode mode);
int agent_ctl_timeout_ms_of(const struct agent_crobj *d);
int agent_ctl_resume_all(struct agent_controller *c, const struct proc *p, int n, enum gcr_cr_mode mode,
			 int timeout_ms, const struct agent_crobj *rs, struct gcr_cr_result *sum, struct gcr_err *err);
json_t *agent_ctl_find_pod(struct agent_controller *c, const char *ns, const char *name, enum pod_where *where,
			   char *node, size_t nlen);
void agent_ctl_other_node(struct agent_controller *c, struct op *o, const char *node, const char *what);

/* agent_ctl_suspend.c: a Checkpoint (suspend), and records whose Checkpoint is gone. */
void agent_ctl_reconcile_checkpoint(struct agent_controller *c, struct op *o);
void agent_ctl_reconcile_orphan(struct agent_controller *c, const char *key, const char *uid);

/* agent_ctl_image.c: a Checkpoint with action Image, and the images sweep. */
int agent_ctl_load_keys(struct agent_controller *c, struct gcr_imagemac_keys *keys, struct gcr_err *err);
unsigned long long agent_ctl_copy_bound(void *data, const struct agent_record *r, int suspended, char *why, size_t len,
					struct gcr_err *err);
int agent_ctl_image_op_ms(const struct agent_crobj *d);
void agent_ctl_run_image(struct agent_controller *c, struct op *o, struct agent_record *r);
void agent_ctl_new_image(struct agent_controller *c, struct op *o, json_t *pod, const struct agent_registry_proc *rp,
			 int n);
void agent_ctl_orphan_image(struct agent_controller *c, const char *key, struct agent_record *r);
void agent_ctl_sweep_images(struct agent_controller *c);

/* agent_ctl_restore.c: a Restore on the suspended processes. */
json_t *agent_ctl_find_checkpoint(struct agent_controller *c, const char *ns, const char *name, int *transient);
void agent_ctl_reconcile_restore(struct agent_controller *c, struct op *o);

/* agent_ctl_podrestore.c: a Restore of an Image into a new pod. */
void agent_ctl_restore_image(struct agent_controller *c, struct op *o, const struct agent_crobj *ckd);

#endif
