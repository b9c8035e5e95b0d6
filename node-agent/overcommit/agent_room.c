/* agent_room: the overcommit policy's engine (docs/preemption.md), its frame: the state's life
 * (new, start, free), the registry's callbacks that queue room requests and wakes, the one worker
 * thread that takes them in turn (a request: agent_room_request.c; a wake, and between them the
 * monitor of the holds: agent_room_hold.c), a hold given up to a Checkpoint, and the helpers both
 * sides use: a process's settings and label, whether it is alive, the Events a decision queues.
 * What the files share is agent_room_int.h. */
#include "agent_room.h"
#include "agent_room_int.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* The records' folder under record_dir. */
#define RECORD_SUBDIR "overcommit"

/* ---- what both sides use ---- */

int agent_room_alive(struct agent_room *r, pid_t pid, unsigned long long start)
{
	if (pid <= 0 || (kill(pid, 0) < 0 && errno != EPERM))
		return 0;
	return start == 0 || agent_registry_start_time(r->reg, pid) == start;
}

/* "namespace/name" from Kubernetes when known, else the uid; "pid/<pid>" outside pods. */
void agent_room_pod_label(struct agent_room *r, const char *uid, pid_t pid, char *out, size_t len)
{
	struct agent_room_pod pod = { 0 };
	if (uid[0] != '\0' && r->hooks.pod != NULL && r->hooks.pod(r->hooks.data, uid, &pod) == 0 &&
	    pod.name[0] != '\0')
		snprintf(out, len, "%s", pod.name);
	else if (uid[0] != '\0')
		snprintf(out, len, "%s", uid);
	else
		snprintf(out, len, "pid/%d", (int)pid);
}

/* Queued; events_flush posts them once the reply is gone. Past the bound, dropped (logged). */
void agent_room_event(struct agent_room *r, const char *uid, const char *type, const char *reason, const char *note)
{
	if (r->hooks.event == NULL || uid[0] == '\0')
		return;
	if (r->nev == (int)(sizeof(r->ev) / sizeof(r->ev[0]))) {
		GCR_LOG(GCR_LOG_WARN, "overcommit", "event %s on pod %s dropped: too many at once", reason, uid);
		return;
	}
	snprintf(r->ev[r->nev].uid, sizeof(r->ev[r->nev].uid), "%s", uid);
	snprintf(r->ev[r->nev].type, sizeof(r->ev[r->nev].type), "%s", type);
	snprintf(r->ev[r->nev].reason, sizeof(r->ev[r->nev].reason), "%s", reason);
	snprintf(r->ev[r->nev].note, sizeof(r->ev[r->nev].note), "%s", note);
	r->nev++;
}

static void events_flush(struct agent_room *r)
{
	for (int i = 0; i < r->nev; i++)
		r->hooks.event(r->hooks.data, r->ev[i].uid, r->ev[i].type, r->ev[i].reason, r->ev[i].note);
	r->nev = 0;
}

/* Opt-in, priority and never-suspend of p: its pod's (Kubernetes) when the pod is known, else
 * the process's environment if trusted (cfg.trust_env), else not opted in; ns (may be NULL,
 * 64 bytes) its pod's namespace, "" when not known (outside pods: the room policy's ""). */
void agent_room_settings_of(struct agent_room *r, const struct agent_registry_proc *p, int *opted, int *prio,
			    int *preemptible, char *ns)
{
	struct agent_room_pod pod = { 0 };
	*opted = r->cfg.trust_env && p->env.overcommit;
	*prio = p->env.priority;
	*preemptible = p->env.preemptible;
	if (ns != NULL)
		ns[0] = '\0';
	if (r->hooks.pod != NULL && p->pod_uid[0] != '\0' && r->hooks.pod(r->hooks.data, p->pod_uid, &pod) == 0) {
		*opted = pod.overcommit;
		if (pod.has_priority)
			*prio = pod.priority;
		if (pod.never)
			*preemptible = 0;
		if (ns != NULL)
			snprintf(ns, sizeof(pod.ns), "%s", pod.ns);
	}
}

/* ---- the worker ---- */

/* The first of *n elements of size sz in a into out; the rest move up. */
static void pop_front(void *a, int *n, size_t sz, void *out)
{
	memcpy(out, a, sz);
	memmove(a, (char *)a + sz, (size_t)(*n - 1) * sz);
	(*n)--;
}

/* A Checkpoint takes hold rel.pid over: the policy forgets it (its record too) and never
 * resumes it; the Checkpoint's record holds it from then on. Caller (the worker) holds lock. */
static void release_locked(struct agent_room *r)
{
	int i = agent_room_hold_of(r, r->rel.pid);
	r->rel.found = i >= 0 && (r->held[i].start == 0 || r->rel.start == 0 || r->held[i].start == r->rel.start);
	if (r->rel.found) {
		r->rel.data_only = r->held[i].data_only;
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d, suspended %s) taken over by a Checkpoint: no "
			"longer resumed by the policy", (int)r->held[i].pid, r->held[i].priority,
			r->held[i].idle ? "for idling" : "for another pod");
		agent_room_drop_hold(r, i);
	}
	r->rel.done = 1;
	pthread_cond_broadcast(&r->rel_cv);
}

int agent_room_holds(struct agent_room *r, pid_t pid, unsigned long long start, int *data_only)
{
	int found = 0;
	pthread_mutex_lock(&r->hlock);
	for (int i = 0; i < r->nheld && !found; i++)
		if (r->held[i].pid == pid && (r->held[i].start == 0 || start == 0 || r->held[i].start == start)) {
			found = 1;
			*data_only = r->held[i].data_only;
		}
	pthread_mutex_unlock(&r->hlock);
	return found;
}

int agent_room_release(struct agent_room *r, pid_t pid, unsigned long long start, int *data_only, int timeout_ms)
{
	struct timespec dl;
	int rc = 0;
	pthread_mutex_lock(&r->rel_lock);
	pthread_mutex_lock(&r->lock);
	r->rel.pending = 1;
	r->rel.done = r->rel.found = r->rel.data_only = 0;
	r->rel.pid = pid;
	r->rel.start = start;
	pthread_cond_signal(&r->cv);
	gcr_time_deadline(&dl, timeout_ms > 0 ? timeout_ms : AGENT_ROOM_TIMEOUT_MS);
	while (!r->rel.done && !r->stop && rc == 0)
		rc = pthread_cond_timedwait(&r->rel_cv, &r->lock, &dl);
	rc = r->rel.done ? (r->rel.found ? 0 : -ENOENT) : -ETIMEDOUT;
	*data_only = r->rel.data_only;
	r->rel.pending = 0; /* not taken by the worker in time: never done later */
	pthread_mutex_unlock(&r->lock);
	pthread_mutex_unlock(&r->rel_lock);
	return rc;
}

static void *worker(void *data)
{
	struct agent_room *r = data;
	pthread_mutex_lock(&r->lock);
	while (!r->stop) {
		if (r->nq == 0 && r->nw == 0 && !r->nudge && !(r->rel.pending && !r->rel.done)) {
			struct timespec dl;
			gcr_time_deadline(&dl, r->cfg.check_ms);
			pthread_cond_timedwait(&r->cv, &r->lock, &dl);
		}
		if (r->stop)
			break;
		if (r->rel.pending && !r->rel.done) {
			release_locked(r);
			continue;
		}
		if (r->nq > 0) {
			struct request q;
			pop_front(r->q, &r->nq, sizeof(q), &q);
			pthread_mutex_unlock(&r->lock);
			agent_room_handle(r, &q);
			if (r->cfg.share != NULL)
				agent_share_give(r->cfg.share, q.p.pod_uid);
			events_flush(r);
			pthread_mutex_lock(&r->lock);
			continue; /* requests first: an allocation is waiting */
		}
		if (r->nw > 0) {
			struct wake w;
			pop_front(r->wq, &r->nw, sizeof(w), &w);
			pthread_mutex_unlock(&r->lock);
			agent_room_wake(r, &w);
			events_flush(r);
			pthread_mutex_lock(&r->lock);
			r->nudge = 1; /* a woken victim whose requester is gone or idle: the monitor resumes it now */
			continue;
		}
		r->nudge = 0;
		pthread_mutex_unlock(&r->lock);
		agent_room_monitor(r);
		events_flush(r);
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

/* ---- the registry's callbacks (its thread: queue and return) ---- */

/* Refuses a room request at once (-EBUSY): nothing queued. */
static void refuse_busy(int fd, long long id, const char *why)
{
	char *line = gcr_proto_reply_err_line(id, -EBUSY, why);
	struct gcr_err err;
	if (line != NULL)
		(void)gcr_sock_write_all(fd, line, strlen(line), 0, &err);
	free(line);
	close(fd);
}

static void on_room(void *data, const struct agent_registry_proc *p, int fd, const struct agent_roommsg_room *req)
{
	struct agent_room *r = data;
	struct gcr_err err;
	char who[48];
	snprintf(who, sizeof(who), "a room request of pid %d", (int)p->pid);
	/* The pod's share of the queue first: a pod past it is refused alone. */
	if (r->cfg.share != NULL && agent_share_take(r->cfg.share, p->pod_uid, who, NULL, &err) < 0) {
		refuse_busy(fd, req->id, err.msg);
		return;
	}
	pthread_mutex_lock(&r->lock);
	if (r->nq == AGENT_ROOM_QUEUE) {
		pthread_mutex_unlock(&r->lock);
		if (r->cfg.share != NULL)
			agent_share_give(r->cfg.share, p->pod_uid);
		refuse_busy(fd, req->id, "too many room requests waiting");
		return;
	}
	r->q[r->nq++] = (struct request){ .p = *p, .fd = fd, .req = *req, .queued = gcr_time_mono_ms() };
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->lock);
}

static void on_wake(void *data, const struct agent_registry_proc *p, const struct agent_roommsg_room *w)
{
	struct agent_room *r = data;
	double at = gcr_time_mono_ms() - (double)w->waited_ms;
	pthread_mutex_lock(&r->lock);
	int i = 0;
	while (i < r->nw && r->wq[i].p.pid != p->pid)
		i++;
	/* One per registered process at most, so the list (MAX_HELD) never overflows. */
	if (i < MAX_HELD) {
		r->wq[i] = (struct wake){ .p = *p, .at = at };
		if (i == r->nw)
			r->nw++;
		pthread_cond_signal(&r->cv);
	}
	pthread_mutex_unlock(&r->lock);
}

static void on_gone(void *data, const struct agent_registry_proc *p)
{
	struct agent_room *r = data;
	(void)p;
	pthread_mutex_lock(&r->lock);
	r->nudge = 1; /* a requester may have gone: look at the holds now */
	pthread_cond_signal(&r->cv);
	pthread_mutex_unlock(&r->lock);
}

int agent_room_new(struct agent_registry *reg, struct agent_activity *act, struct agent_metrics *m,
		   const struct agent_room_cfg *cfg, const struct agent_room_hooks *hooks, struct agent_room **out,
		   struct gcr_err *err)
{
	*out = NULL;
	struct agent_room *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	r->reg = reg;
	r->act = act;
	r->m = m;
	r->cfg = *cfg;
	if (r->cfg.timeout_ms <= 0)
		r->cfg.timeout_ms = AGENT_ROOM_TIMEOUT_MS;
	if (r->cfg.check_ms <= 0)
		r->cfg.check_ms = AGENT_ROOM_CHECK_MS;
	if (r->cfg.return_ms == 0)
		r->cfg.return_ms = AGENT_ROOM_RETURN_MS;
	if (r->cfg.unused_backoff_ms == 0)
		r->cfg.unused_backoff_ms = AGENT_ROOM_UNUSED_BACKOFF_MS;
	if (cfg->policy != NULL)
		r->policy = *cfg->policy;
	r->cfg.policy = NULL; /* r->policy is the copy */
	if (hooks != NULL)
		r->hooks = *hooks;
	pthread_mutex_init(&r->lock, NULL);
	pthread_mutex_init(&r->hlock, NULL);
	pthread_mutex_init(&r->rel_lock, NULL);
	pthread_cond_init(&r->cv, NULL);
	pthread_cond_init(&r->rel_cv, NULL);
	r->socket_dir = strdup(cfg->socket_dir);
	r->proc_root = cfg->proc_root != NULL ? strdup(cfg->proc_root) : NULL;
	r->held = calloc(MAX_HELD, sizeof(*r->held));
	r->wq = calloc(MAX_HELD, sizeof(*r->wq));
	r->watch = calloc(MAX_HELD, sizeof(*r->watch));
	r->grants = calloc(MAX_HELD, sizeof(*r->grants));
	r->pen = calloc(MAX_HELD, sizeof(*r->pen));
	if (r->socket_dir == NULL || r->held == NULL || r->wq == NULL || r->watch == NULL || r->grants == NULL ||
	    r->pen == NULL ||
	    (cfg->proc_root != NULL && r->proc_root == NULL) ||
	    asprintf(&r->dir, "%s/%s", cfg->record_dir, RECORD_SUBDIR) < 0) {
		r->dir = NULL;
		agent_room_free(r);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	if (mkdir(cfg->record_dir, 0700) < 0 && errno != EEXIST) {
		int e = errno;
		agent_room_free(r);
		return gcr_err_set(err, -e, "record dir %s: %s", cfg->record_dir, strerror(e));
	}
	if (mkdir(r->dir, 0700) < 0 && errno != EEXIST) {
		int e = errno;
		gcr_err_set(err, -e, "record dir %s: %s", r->dir, strerror(e));
		agent_room_free(r);
		return -e;
	}
	agent_room_records_load(r);
	struct agent_registry_handler h = { .room = on_room, .wake = on_wake, .gone = on_gone, .data = r };
	agent_registry_set_handler(reg, &h);
	*out = r;
	return 0;
}

int agent_room_start(struct agent_room *r, struct gcr_err *err)
{
	int rc = pthread_create(&r->th, NULL, worker, r);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the overcommit thread: %s", strerror(rc));
	r->started = 1;
	char rules[512];
	agent_roompolicy_describe(&r->policy, rules, sizeof(rules));
	GCR_LOG(GCR_LOG_INFO, "overcommit", "policy %s (%s suspends; idle requesters %s%d ms; room from: %s; room not "
		"used: no priority for %d ms); %d processes held; records in %s", r->cfg.enabled ? "on" : "off",
		r->cfg.data_only ? "data-only" : "full", r->cfg.idle_ms > 0 ? "suspended after " : "never suspended, ",
		r->cfg.idle_ms, rules, r->cfg.unused_backoff_ms, r->nheld, r->dir);
	return 0;
}

void agent_room_free(struct agent_room *r)
{
	if (r == NULL)
		return;
	struct agent_registry_handler none = { 0 };
	agent_registry_set_handler(r->reg, &none); /* no more requests queued here */
	if (r->started) {
		pthread_mutex_lock(&r->lock);
		r->stop = 1;
		pthread_cond_signal(&r->cv);
		pthread_mutex_unlock(&r->lock);
		pthread_join(r->th, NULL);
	}
	for (int i = 0; i < r->nq; i++) {
		agent_room_reply(r->q[i].fd, r->q[i].req.id, 0, 0, 0, "the agent is stopping");
		if (r->cfg.share != NULL)
			agent_share_give(r->cfg.share, r->q[i].p.pod_uid);
	}
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->hlock);
	pthread_mutex_destroy(&r->rel_lock);
	pthread_cond_destroy(&r->rel_cv);
	free(r->held);
	free(r->wq);
	free(r->watch);
	free(r->grants);
	free(r->pen);
	free(r->socket_dir);
	free(r->proc_root);
	free(r->dir);
	free(r);
}

int agent_room_held(struct agent_room *r)
{
	pthread_mutex_lock(&r->hlock);
	int n = r->nheld;
	pthread_mutex_unlock(&r->hlock);
	return n;
}
