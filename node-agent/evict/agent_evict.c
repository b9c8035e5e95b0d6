/* agent_evict: eviction imaging's engine: a socket gcr-hold connects to from a pod's preStop
 * hook, one thread per hold (bounded) that decides from the pod fetched fresh, creates the
 * eviction Checkpoint, waits for the controller to finish it, and answers the hold. */
#include "agent_evict.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "agent_cgroup.h"
#include "agent_evictmsg.h"
#include "gcr_log.h"
#include "gcr_nvml.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* The accept loop's poll period (ms): the bound on noticing stop. */
#define POLL_MS 200
/* How long gcr-hold may take to send its line (ms): it sends at once. */
#define LINE_MS 2000
/* How long a reply may take to leave (ms). */
#define REPLY_MS 1000
/* Processes of one pod looked at for their GPU bytes. */
#define MAX_PROCS 16

/* One pod's hold: the first connection does the work, others of the same pod wait for it. */
struct job {
	int used, done, refs;
	char uid[AGENT_CGROUP_UID_LEN + 1];
	int outcome; /* enum agent_evictmsg_outcome, or -ECANCELED: the agent stopped first */
	char msg[768];
};

struct agent_evict {
	struct agent_kube *kube;
	struct agent_evict_hooks hooks;
	struct agent_registry *reg;
	struct agent_metrics *m;
	struct agent_evict_cfg cfg;
	char *socket_path, *proc_root, *node, *resource, *api_version; /* cfg's strings, owned */
	int lfd;
	pthread_t th;
	int started;
	atomic_int stop;
	pthread_mutex_t lock; /* guards active and jobs */
	pthread_cond_t cv;
	int active; /* connection threads alive */
	struct agent_share *share; /* each pod's share of the holds (NULL: AGENT_EVICT_MAX_HOLDS only) */
	struct job jobs[AGENT_EVICT_MAX_HOLDS];
};

/* One hold's connection, its caller identified before its thread starts. */
struct conn {
	struct agent_evict *e;
	int fd;
	pid_t pid;
	struct agent_cgroup_pod pod;
};

static void reply(int fd, enum agent_evictmsg_outcome o, const char *msg)
{
	char *line = agent_evictmsg_reply(o, msg);
	struct gcr_err err;
	if (line == NULL || gcr_sock_write_all(fd, line, strlen(line), REPLY_MS, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "evict", "reply \"%s\" not sent: %s", agent_evictmsg_outcome_name(o),
			line == NULL ? "out of memory" : err.msg);
	free(line);
}

static void metric(struct agent_evict *e, enum agent_evictmsg_outcome o, double s)
{
	static const int map[] = { [AGENT_EVICTMSG_NOTHING] = AGENT_METRICS_EVICT_SKIPPED,
				   [AGENT_EVICTMSG_WRITTEN] = AGENT_METRICS_EVICT_WRITTEN,
				   [AGENT_EVICTMSG_FAILED] = AGENT_METRICS_EVICT_FAILED,
				   [AGENT_EVICTMSG_NO_TIME] = AGENT_METRICS_EVICT_NO_TIME };
	agent_metrics_eviction(e->m, map[o], s);
}

/* The pod of uid on this node: the controller's pod watch, else a list of this node's pods
 * (the watch may lag); then fetched fresh by name, since the DisruptionTarget condition may
 * land just before the deletion. NULL with err set when not found. */
static json_t *fresh_pod(struct agent_evict *e, const char *uid, struct gcr_err *err)
{
	char ns[64] = "", name[254] = "", path[800];
	json_t *pod = e->hooks.by_uid(e->hooks.data, uid), *list = NULL;
	long st = 0;
	if (pod == NULL) {
		snprintf(path, sizeof(path), "/api/v1/pods?fieldSelector=spec.nodeName%%3D%s", e->node);
		if (agent_kube_request(e->kube, "GET", path, NULL, NULL, &st, &list, err) == 0 && st == 200) {
			json_t *it;
			size_t i;
			json_array_foreach(json_object_get(list, "items"), i, it) {
				const char *u = json_string_value(json_object_get(json_object_get(it, "metadata"), "uid"));
				if (u != NULL && strcmp(u, uid) == 0) {
					pod = json_incref(it);
					break;
				}
			}
		}
		json_decref(list);
	}
	json_t *md = json_object_get(pod, "metadata");
	const char *n = json_string_value(json_object_get(md, "namespace")), *nm = json_string_value(json_object_get(md, "name"));
	if (n != NULL && nm != NULL && strlen(n) < sizeof(ns) && strlen(nm) < sizeof(name)) {
		snprintf(ns, sizeof(ns), "%s", n);
		snprintf(name, sizeof(name), "%s", nm);
	}
	json_decref(pod);
	if (ns[0] == '\0') {
		gcr_err_set(err, -ENOENT, "pod %s is not among node %s's pods", uid, e->node);
		return NULL;
	}
	pod = NULL;
	snprintf(path, sizeof(path), "/api/v1/namespaces/%s/pods/%s", ns, name);
	if (agent_kube_request(e->kube, "GET", path, NULL, NULL, &st, &pod, err) < 0) {
		json_decref(pod);
		return NULL;
	}
	const char *u = json_string_value(json_object_get(json_object_get(pod, "metadata"), "uid"));
	if (st != 200 || u == NULL || strcmp(u, uid) != 0) {
		gcr_err_set(err, -ENOENT, "pod %s/%s (uid %s): HTTP %ld, %s", ns, name, uid, st,
			    st == 200 ? "another pod of that name now" : "not readable");
		json_decref(pod);
		return NULL;
	}
	return pod;
}

/* The GPU bytes of the pod's processes under the shim (NVML's usedGpuMemory, summed). */
static unsigned long long pod_bytes(struct agent_evict *e, const char *uid)
{
	struct agent_registry_proc p[MAX_PROCS];
	int n = agent_registry_find(e->reg, uid, NULL, p, MAX_PROCS);
	unsigned long long sum = 0;
	for (int i = 0; i < n; i++) {
		struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
		int k = 0;
		struct gcr_err err;
		if (gcr_nvml_proc_use(p[i].pid, use, GCR_NVML_MAX_DEVICES, &k, &err) < 0) {
			GCR_LOG(GCR_LOG_WARN, "evict", "pod %s pid %d: its GPU bytes unknown (%s); the estimate counts none",
				uid, (int)p[i].pid, err.msg);
			continue;
		}
		for (int j = 0; j < k; j++)
			sum += use[j].bytes;
	}
	return sum;
}

/* Whether Checkpoint ns/name exists: 1 yes, 0 no (404), -errno unknown (err set). */
static int checkpoint_exists(struct agent_evict *e, const char *ns, const char *name, struct gcr_err *err)
{
	char path[400];
	snprintf(path, sizeof(path), "/apis/%s/namespaces/%s/checkpoints/%s", e->api_version, ns, name);
	long st = 0;
	json_t *ck = NULL;
	int rc = agent_kube_request(e->kube, "GET", path, NULL, NULL, &st, &ck, err);
	json_decref(ck);
	if (rc < 0)
		return rc;
	if (st == 200 || st == 404)
		return st == 200;
	return gcr_err_set(err, -EIO, "reading Checkpoint %s/%s: HTTP %ld", ns, name, st);
}

/* POSTs the eviction Checkpoint; 0 also when it exists (made between the look and the POST:
 * that one is waited for). */
static int create_checkpoint(struct agent_evict *e, const struct agent_evictmsg_pod *p, const char *name,
			     struct gcr_err *err)
{
	json_t *ck = agent_evictmsg_checkpoint(p, e->node, e->api_version);
	char *body = ck != NULL ? json_dumps(ck, JSON_COMPACT) : NULL;
	json_decref(ck);
	if (body == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	char path[400];
	snprintf(path, sizeof(path), "/apis/%s/namespaces/%s/checkpoints", e->api_version, p->ns);
	long st = 0;
	json_t *out = NULL;
	int rc = agent_kube_request(e->kube, "POST", path, "application/json", body, &st, &out, err);
	free(body);
	if (rc == 0 && st == 409)
		GCR_LOG(GCR_LOG_INFO, "evict", "Checkpoint %s/%s exists already: waiting for it", p->ns, name);
	else if (rc == 0 && st != 201 && st != 200)
		rc = gcr_err_set(err, -EIO, "creating Checkpoint %s/%s: HTTP %ld: %.160s", p->ns, name, st,
				 json_string_value(json_object_get(out, "message")) ? json_string_value(json_object_get(out, "message")) : "");
	json_decref(out);
	return rc;
}

/* Waits for the pod's eviction Checkpoint name to be final (until its deletion deadline), posts
 * the Event and says the outcome; -ECANCELED (no Event) when the agent stops first. */
static int await_image(struct agent_evict *e, const struct agent_evictmsg_pod *p, const char *uid, const char *name,
		       double t0, char *msg, size_t len)
{
	char res[640];
	int rc = e->hooks.ck_wait(e->hooks.data, p->ns, name, (double)p->deletion, &e->stop, res, sizeof(res));
	double took = gcr_time_wall_s() - t0;
	if (rc == -ECANCELED)
		return rc;
	if (rc == 1) {
		snprintf(msg, len, "Checkpoint %s wrote the image of %.63s/%.100s (container %s) in %.1f s: %.400s", name,
			 p->ns, p->name, p->container, took, res);
		e->hooks.event(e->hooks.data, uid, "Normal", "EvictionImageWritten", "Evict", msg);
		return AGENT_EVICTMSG_WRITTEN;
	}
	snprintf(msg, len, "Checkpoint %s: no image of %.63s/%.100s after %.1f s: %.400s", name, p->ns, p->name, took,
		 res);
	e->hooks.event(e->hooks.data, uid, "Warning", "EvictionImageFailed", "Evict", msg);
	return AGENT_EVICTMSG_FAILED;
}

/* The hold of pod uid, from start to answer: outcome and its message (len bytes), or -ECANCELED
 * when the agent stops first (the hold is then left unanswered: gcr-hold asks the next agent). */
static int hold(struct agent_evict *e, const char *uid, const char *cid, char *msg, size_t len)
{
	struct gcr_err err;
	double t0 = gcr_time_wall_s();
	if (!e->cfg.enabled) {
		snprintf(msg, len, "eviction imaging is off on node %s (the chart's eviction.enabled)", e->node);
		return AGENT_EVICTMSG_NOTHING;
	}
	json_t *pod = fresh_pod(e, uid, &err);
	if (pod == NULL) {
		snprintf(msg, len, "nothing done: %s", err.msg);
		return AGENT_EVICTMSG_NOTHING;
	}
	struct agent_evictmsg_pod p;
	int rc = agent_evictmsg_pod(pod, e->resource, cid, &p, &err);
	json_decref(pod);
	char why[400];
	if (rc < 0) {
		snprintf(msg, len, "nothing done: the pod object: %s", err.msg);
		return AGENT_EVICTMSG_NOTHING;
	}
	if (!agent_evictmsg_decide(&p, why, sizeof(why))) {
		snprintf(msg, len, "nothing to do for %s/%s: %s", p.ns, p.name, why);
		return AGENT_EVICTMSG_NOTHING;
	}
	char name[64];
	agent_evictmsg_ck_name(p.name, p.uid, name, sizeof(name));
	/* An earlier agent took this hold and made the Checkpoint, then stopped (gcr-hold asked
	 * again): wait for that one, whatever the estimate says now; never make a second. */
	rc = checkpoint_exists(e, p.ns, name, &err);
	if (rc < 0) {
		snprintf(msg, len, "no image: %s; the pod ends as without GCR", err.msg);
		e->hooks.event(e->hooks.data, uid, "Warning", "EvictionImageFailed", "Evict", msg);
		return AGENT_EVICTMSG_FAILED;
	}
	if (rc == 1) {
		GCR_LOG(GCR_LOG_INFO, "evict", "pod %s/%s deleted for %s: Checkpoint %s exists already (made by an earlier "
			"agent's hold): waiting for it (%.0f s left)", p.ns, p.name, agent_evictmsg_cause_name(p.cause), name,
			(double)p.deletion - t0);
		return await_image(e, &p, uid, name, t0, msg, len);
	}
	unsigned long long bytes = pod_bytes(e, uid);
	double needed = agent_evictmsg_needed_s(bytes, e->cfg.rate_mib_s, e->cfg.fixed_s);
	double left = (double)p.deletion - t0;
	if (needed > left) {
		snprintf(msg, len, "no image: deleted for %s, an image of %llu MiB of GPU data needs about %.0f s, the grace "
			 "period leaves %.0f s (raise terminationGracePeriodSeconds); the pod ends as without GCR",
			 agent_evictmsg_cause_name(p.cause), bytes >> 20, needed, left > 0 ? left : 0);
		e->hooks.event(e->hooks.data, uid, "Warning", "EvictionNotImaged", "Evict", msg);
		return AGENT_EVICTMSG_NO_TIME;
	}
	GCR_LOG(GCR_LOG_INFO, "evict", "pod %s/%s deleted for %s: imaging container %s as Checkpoint %s (%llu MiB of GPU "
		"data, about %.0f s needed, %.0f s left)", p.ns, p.name, agent_evictmsg_cause_name(p.cause), p.container,
		name, bytes >> 20, needed, left);
	if (create_checkpoint(e, &p, name, &err) < 0) {
		snprintf(msg, len, "no image: %s; the pod ends as without GCR", err.msg);
		e->hooks.event(e->hooks.data, uid, "Warning", "EvictionImageFailed", "Evict", msg);
		return AGENT_EVICTMSG_FAILED;
	}
	return await_image(e, &p, uid, name, t0, msg, len);
}

/* The job of uid (joined when one exists, else started); NULL when the table is full. */
static struct job *job_get(struct agent_evict *e, const char *uid, int *first)
{
	struct job *free_j = NULL;
	*first = 0;
	for (int i = 0; i < AGENT_EVICT_MAX_HOLDS; i++) {
		struct job *j = &e->jobs[i];
		if (j->used && strcmp(j->uid, uid) == 0) {
			j->refs++;
			return j;
		}
		if (!j->used && free_j == NULL)
			free_j = j;
	}
	if (free_j != NULL) {
		*free_j = (struct job){ .used = 1, .refs = 1 };
		snprintf(free_j->uid, sizeof(free_j->uid), "%s", uid);
		*first = 1;
	}
	return free_j;
}

static void serve_conn(struct agent_evict *e, int fd, pid_t pid, const struct agent_cgroup_pod *caller)
{
	struct gcr_err err;
	struct agent_cgroup_pod pod = *caller;
	char *line = NULL;
	struct gcr_linebuf lb;
	if (gcr_linebuf_init(&lb, AGENT_EVICTMSG_MAX_LINE + 1) < 0)
		return;
	int rc = gcr_linebuf_read(&lb, fd, LINE_MS, &line, &err);
	if (rc == 0)
		rc = agent_evictmsg_parse_hold(line, strlen(line), &err);
	gcr_linebuf_free(&lb);
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "evict", "pid %d (pod %s): a bad hold: %s", (int)pid, pod.pod_uid, err.msg);
		char m[GCR_ERR_MSG_MAX + 32];
		snprintf(m, sizeof(m), "bad request: %s", err.msg);
		reply(fd, AGENT_EVICTMSG_NOTHING, m);
		return;
	}
	int first;
	pthread_mutex_lock(&e->lock);
	struct job *j = job_get(e, pod.pod_uid, &first);
	pthread_mutex_unlock(&e->lock);
	if (j == NULL) {
		reply(fd, AGENT_EVICTMSG_NOTHING, "too many holds at once on this node; nothing done");
		metric(e, AGENT_EVICTMSG_NOTHING, 0);
		return;
	}
	int o; /* an outcome, or -ECANCELED: left unanswered */
	char msg[sizeof(j->msg)];
	if (first) {
		double t0 = gcr_time_wall_s();
		o = hold(e, pod.pod_uid, pod.container_id, msg, sizeof(msg));
		if (o == -ECANCELED) {
			GCR_LOG(GCR_LOG_INFO, "evict", "hold of pod %s left unanswered: the agent is stopping (gcr-hold asks "
				"the next agent, which waits for the same Checkpoint)", pod.pod_uid);
		} else {
			metric(e, o, gcr_time_wall_s() - t0);
			GCR_LOG(o == AGENT_EVICTMSG_FAILED || o == AGENT_EVICTMSG_NO_TIME ? GCR_LOG_WARN : GCR_LOG_INFO,
				"evict", "hold of pod %s answered %s: %s", pod.pod_uid, agent_evictmsg_outcome_name(o), msg);
		}
		pthread_mutex_lock(&e->lock);
		j->outcome = o;
		snprintf(j->msg, sizeof(j->msg), "%s", msg);
		j->done = 1;
		pthread_cond_broadcast(&e->cv);
	} else {
		pthread_mutex_lock(&e->lock);
		while (!j->done)
			pthread_cond_wait(&e->cv, &e->lock);
		o = j->outcome;
		snprintf(msg, sizeof(msg), "%s", j->msg);
	}
	if (--j->refs == 0)
		j->used = 0;
	pthread_mutex_unlock(&e->lock);
	if (o != -ECANCELED)
		reply(fd, o, msg);
}

static void *conn_main(void *data)
{
	struct conn *c = data;
	struct agent_evict *e = c->e;
	serve_conn(e, c->fd, c->pid, &c->pod);
	close(c->fd);
	if (e->share != NULL)
		agent_share_give(e->share, c->pod.pod_uid);
	free(c);
	pthread_mutex_lock(&e->lock);
	e->active--;
	pthread_cond_broadcast(&e->cv);
	pthread_mutex_unlock(&e->lock);
	return NULL;
}

/* The caller of fd: its pid (peer credentials) and pod (its cgroup). 0, or -errno with the
 * hold answered "nothing" and fd closed. */
static int caller_of(struct agent_evict *e, int fd, pid_t *pid, struct agent_cgroup_pod *pod)
{
	struct gcr_peer peer;
	struct gcr_err err;
	char path[512];
	if (gcr_sock_peer(fd, &peer, &err) < 0 || peer.pid <= 0) {
		reply(fd, AGENT_EVICTMSG_NOTHING, "the caller's pid is not visible to the agent");
		close(fd);
		return -ESRCH;
	}
	snprintf(path, sizeof(path), "%s/%d/cgroup", e->proc_root, (int)peer.pid);
	if (agent_cgroup_read_file(path, pod, &err) < 0) {
		GCR_LOG(GCR_LOG_WARN, "evict", "hold from pid %d refused, it is not in a pod: %s", (int)peer.pid, err.msg);
		reply(fd, AGENT_EVICTMSG_NOTHING, "the caller is not in a pod");
		close(fd);
		return -ENOENT;
	}
	*pid = peer.pid;
	return 0;
}

/* A hold's connection: its caller identified, its pod's share of the holds taken (past it,
 * that pod alone is answered "nothing": agent_share logs, counts and tells), then its thread. */
static void accept_one(struct agent_evict *e)
{
	int fd = accept4(e->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	pid_t pid;
	struct agent_cgroup_pod pod;
	if (caller_of(e, fd, &pid, &pod) < 0)
		return;
	struct gcr_err err;
	char who[48];
	snprintf(who, sizeof(who), "gcr-hold pid %d", (int)pid);
	if (e->share != NULL && agent_share_take(e->share, pod.pod_uid, who, NULL, &err) < 0) {
		char m[GCR_ERR_MSG_MAX + 32];
		snprintf(m, sizeof(m), "nothing done: %s", err.msg);
		reply(fd, AGENT_EVICTMSG_NOTHING, m); /* counted by the share, not as a hold */
		close(fd);
		return;
	}
	pthread_mutex_lock(&e->lock);
	int full = e->active >= AGENT_EVICT_MAX_HOLDS;
	if (!full)
		e->active++;
	pthread_mutex_unlock(&e->lock);
	struct conn *c = full ? NULL : malloc(sizeof(*c));
	pthread_t th;
	pthread_attr_t at;
	int ok = 0;
	if (c != NULL) {
		*c = (struct conn){ .e = e, .fd = fd, .pid = pid, .pod = pod };
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		ok = pthread_create(&th, &at, conn_main, c) == 0;
		pthread_attr_destroy(&at);
	}
	if (ok)
		return;
	reply(fd, AGENT_EVICTMSG_NOTHING, "the agent cannot take another hold now; nothing done");
	close(fd);
	free(c);
	if (e->share != NULL)
		agent_share_give(e->share, pod.pod_uid);
	if (!full) {
		pthread_mutex_lock(&e->lock);
		e->active--;
		pthread_mutex_unlock(&e->lock);
	}
}

static void *accept_main(void *data)
{
	struct agent_evict *e = data;
	while (!atomic_load(&e->stop)) {
		struct pollfd p = { .fd = e->lfd, .events = POLLIN };
		if (poll(&p, 1, POLL_MS) > 0 && (p.revents & POLLIN))
			accept_one(e);
	}
	return NULL;
}

int agent_evict_new(struct agent_kube *kube, const struct agent_evict_hooks *hooks, struct agent_registry *reg,
		    struct agent_metrics *m, const struct agent_evict_cfg *cfg, struct agent_evict **out,
		    struct gcr_err *err)
{
	*out = NULL;
	struct agent_evict *e = calloc(1, sizeof(*e));
	if (e == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	e->kube = kube;
	e->hooks = *hooks;
	e->reg = reg;
	e->m = m;
	e->cfg = *cfg;
	e->share = cfg->share;
	e->lfd = -1;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cv, NULL);
	e->socket_path = strdup(cfg->socket_path);
	e->proc_root = strdup(cfg->proc_root ? cfg->proc_root : "/proc");
	e->node = strdup(cfg->node_name);
	e->resource = strdup(cfg->resource_name ? cfg->resource_name : "gpucr.dev/shim");
	e->api_version = strdup(cfg->api_version ? cfg->api_version : "gpucr.dev/v1alpha1");
	if (!e->socket_path || !e->proc_root || !e->node || !e->resource || !e->api_version) {
		agent_evict_free(e);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	if (e->cfg.rate_mib_s <= 0)
		e->cfg.rate_mib_s = AGENT_EVICT_RATE_MIB_S;
	if (e->cfg.fixed_s <= 0)
		e->cfg.fixed_s = AGENT_EVICT_FIXED_S;
	int fd = gcr_sock_listen_shared(e->socket_path, err);
	if (fd < 0) {
		agent_evict_free(e);
		return fd;
	}
	e->lfd = fd;
	*out = e;
	return 0;
}

int agent_evict_start(struct agent_evict *e, struct gcr_err *err)
{
	int rc = pthread_create(&e->th, NULL, accept_main, e);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the eviction thread: %s", strerror(rc));
	e->started = 1;
	return 0;
}

void agent_evict_free(struct agent_evict *e)
{
	if (e == NULL)
		return;
	atomic_store(&e->stop, 1);
	if (e->started)
		pthread_join(e->th, NULL);
	/* Holds in flight see stop within a second (the Checkpoint wait wakes that often), or their
	 * request's own bound. */
	pthread_mutex_lock(&e->lock);
	while (e->active > 0)
		pthread_cond_wait(&e->cv, &e->lock);
	pthread_mutex_unlock(&e->lock);
	if (e->lfd >= 0) {
		close(e->lfd);
		unlink(e->socket_path);
	}
	pthread_cond_destroy(&e->cv);
	pthread_mutex_destroy(&e->lock);
	free(e->socket_path);
	free(e->proc_root);
	free(e->node);
	free(e->resource);
	free(e->api_version);
	free(e);
}
