/* agent_room: the overcommit policy's engine: one worker thread takes the shims' room
 * requests and wakes in order, suspends victims (agent_victims) through gcr_cr, records each
 * hold, resumes held processes once the process they were suspended for is gone or idle, and
 * suspends an idle requester until its next call wakes it. */
#include "agent_room.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_podspec.h"
#include "agent_victims.h"
#include "gcr_client.h"
#include "gcr_cr.h"
#include "gcr_shimreply.h"
#include "gcr_log.h"
#include "gcr_meminfo.h"
#include "gcr_nvml.h"
#include "gcr_proto.h"
#include "gcr_scale.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* Processes held at once at most (a node's GPU processes: the registry's bound). */
#define MAX_HELD AGENT_REGISTRY_MAX
/* How long a reply may take to leave (ms): the shim is waiting for it. */
#define REPLY_MS 1000
/* Longest record file read back (bytes). */
#define RECORD_MAX 8192
/* How long a candidate's shim may take to say what it holds (ms), in data-only mode. */
#define STATUS_MS 1000
/* The records' folder under record_dir. */
#define RECORD_SUBDIR "overcommit"
/* Pods a refusal by policy or back-off is told to (an Event) at most once per TELL_MS each. */
#define TOLD_MAX 64
#define TELL_MS 60000
/* A pod's key: its uid, or "pid/<pid>" outside pods. */
#define KEY_LEN (AGENT_CGROUP_UID_LEN + 16)

/* One process suspended for another. */
struct hold {
	pid_t pid;
	unsigned long long start; /* 0: not known */
	char pod[AGENT_CGROUP_UID_LEN + 1];
	int priority;
	unsigned long long bytes; /* on the GPU, when suspended */
	double since;             /* CLOCK_REALTIME seconds */
	pid_t for_pid;
	unsigned long long for_start;
	char for_pod[AGENT_CGROUP_UID_LEN + 1];
	char uuid[GCR_NVML_UUID_LEN];
	int said; /* the last resume failure logged (its -errno), so each is said once */
	int data_only; /* suspended in data-only mode: resumed in the same */
	double room_since; /* monotonic ms since its GPU has had room for it, requester alive; 0: not */
	int idle;          /* suspended for idling, for its victims (for_pid 0); resumed only when woken */
	double woken;      /* monotonic ms its first caller reached the gate (a wake); 0: not woken */
	int woken_said;    /* "stays suspended" of the wake logged */
	int recovered;     /* read back from an earlier agent's record: a wake it was sent may be lost, so
			    * its shim's status is asked until it says (monitor) */
};

struct request {
	struct agent_registry_proc p;
	int fd;
	struct agent_roommsg_room req;
	double queued; /* monotonic ms */
};

/* A wake waiting for the worker (one per process at most). */
struct wake {
	struct agent_registry_proc p;
	double at; /* monotonic ms its first caller reached the gate */
};

/* Room given to a requester by suspends, waiting to be seen used (AGENT_ROOM_USE_MS). */
struct grant {
	pid_t pid;
	unsigned long long start;
	char key[KEY_LEN], pod[AGENT_CGROUP_UID_LEN + 1], uuid[GCR_NVML_UUID_LEN];
	unsigned long long before, asked; /* its bytes on the GPU when it asked; what it asked */
	double at;                        /* monotonic ms of the grant */
};

/* A pod that did not use the room it was given: no priority until then. */
struct penalty {
	char key[KEY_LEN];
	double until; /* monotonic ms */
};

/* A requester's driver calls, sampled every check_ms while others are held for it. */
struct watch {
	pid_t pid;
	long long calls;
	double since; /* monotonic ms the count last changed (or watching began) */
};

/* A requester's state, read once per pass of monitor: every hold made for it sees the same, so
 * a requester that ends between two of its holds cannot let a lower one resume before a higher. */
struct req_seen {
	pid_t pid;
	unsigned long long start;
	int resident, alive;
};

struct agent_room {
	struct agent_registry *reg;
	struct agent_activity *act;
	struct agent_metrics *m;
	struct agent_room_cfg cfg;
	char *socket_dir, *dir; /* dir: <record_dir>/overcommit */
	char *proc_root;        /* cfg.proc_root's copy (NULL: none) */
	struct agent_room_hooks hooks;
	pthread_t th;
	int started;
	pthread_mutex_t lock; /* guards q, nq, nudge, stop */
	pthread_cond_t cv;
	struct request q[AGENT_ROOM_QUEUE];
	int nq, nudge, stop;
	struct wake *wq; /* MAX_HELD: a process's second wake replaces its first */
	int nw;
	struct watch *watch; /* the worker's own: MAX_HELD */
	int nwatch;
	/* Events decided by the worker, posted after its reply (the worker's own). */
	struct {
		char uid[AGENT_CGROUP_UID_LEN + 1], type[8], reason[40], note[640];
	} ev[2 * AGENT_ROOM_EVENTS];
	int nev;
	/* The worker's own, read by agent_room_held under hlock. */
	pthread_mutex_t hlock;
	struct hold *held;
	int nheld;
	/* The worker's own: room given and not yet seen used; pods without priority for a while;
	 * when a pod was last told a refusal by policy or back-off. */
	struct agent_roompolicy policy;
	struct grant *grants; /* MAX_HELD */
	int ngrants;
	struct penalty *pen; /* MAX_HELD */
	int npen;
	struct {
		char key[KEY_LEN];
		double at;
	} told[TOLD_MAX];
	struct req_seen seen[MAX_HELD]; /* monitor's memo of requesters, one pass long */
	/* A hold given up to a Checkpoint (agent_room_release), done by the worker under lock. */
	pthread_mutex_t rel_lock; /* one release at a time */
	pthread_cond_t rel_cv;
	struct {
		int pending, done, found, data_only;
		pid_t pid;
		unsigned long long start;
	} rel;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int alive(struct agent_room *r, pid_t pid, unsigned long long start)
{
	if (pid <= 0 || (kill(pid, 0) < 0 && errno != EPERM))
		return 0;
	return start == 0 || agent_registry_start_time(r->reg, pid) == start;
}

/* "namespace/name" from Kubernetes when known, else the uid; "pid/<pid>" outside pods. */
static void pod_label(struct agent_room *r, const char *uid, pid_t pid, char *out, size_t len)
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
static void event(struct agent_room *r, const char *uid, const char *type, const char *reason, const char *note)
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
static void settings_of(struct agent_room *r, const struct agent_registry_proc *p, int *opted, int *prio,
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

/* ---- room not used: the back-off ---- */

static void key_of(const char *uid, pid_t pid, char *out)
{
	if (uid[0] != '\0')
		snprintf(out, KEY_LEN, "%s", uid);
	else
		snprintf(out, KEY_LEN, "pid/%d", (int)pid);
}

/* Seconds key has still without priority (0: none). */
static double penalty_left(struct agent_room *r, const char *key)
{
	double now = gcr_time_mono_ms();
	for (int i = 0; i < r->npen; i++)
		if (strcmp(r->pen[i].key, key) == 0)
			return r->pen[i].until > now ? (r->pen[i].until - now) / 1000 : 0;
	return 0;
}

static void penalize(struct agent_room *r, const char *key, double until)
{
	double now = gcr_time_mono_ms();
	int i = 0;
	while (i < r->npen && strcmp(r->pen[i].key, key) != 0 && r->pen[i].until > now)
		i++;
	if (i == MAX_HELD)
		return; /* as many penalties as processes: the oldest stay */
	snprintf(r->pen[i].key, sizeof(r->pen[i].key), "%s", key);
	r->pen[i].until = until;
	if (i == r->npen)
		r->npen++;
}

/* Whether key was told a refusal by policy or back-off within TELL_MS; marks it told now. */
static int told_recently(struct agent_room *r, const char *key)
{
	double now = gcr_time_mono_ms();
	int oldest = 0;
	for (int i = 0; i < TOLD_MAX; i++) {
		if (strcmp(r->told[i].key, key) == 0) {
			if (now - r->told[i].at < TELL_MS)
				return 1;
			oldest = i;
			break;
		}
		if (r->told[i].at < r->told[oldest].at)
			oldest = i;
	}
	snprintf(r->told[oldest].key, sizeof(r->told[oldest].key), "%s", key);
	r->told[oldest].at = now;
	return 0;
}

/* ---- records: <dir>/<pid>.json, written whole then renamed ---- */

static void record_path(struct agent_room *r, pid_t pid, char *out, size_t len)
{
	snprintf(out, len, "%s/%d.json", r->dir, (int)pid);
}

static void record_write(struct agent_room *r, const struct hold *h)
{
	char path[600], tmp[640];
	record_path(r, h->pid, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	json_t *j = json_pack("{s:i, s:I, s:s, s:i, s:I, s:f, s:i, s:I, s:s, s:s, s:s, s:b}", "pid", (int)h->pid,
			      "start", (json_int_t)h->start, "pod", h->pod, "priority", h->priority, "bytes",
			      (json_int_t)h->bytes, "since", h->since, "for_pid", (int)h->for_pid, "for_start",
			      (json_int_t)h->for_start, "for_pod", h->for_pod, "gpu", h->uuid, "mode",
			      h->data_only ? "data" : "full", "idle", h->idle);
	int rc = j != NULL ? json_dump_file(j, tmp, JSON_COMPACT) : -1;
	json_decref(j);
	if (rc == 0 && rename(tmp, path) == 0)
		return;
	GCR_LOG(GCR_LOG_WARN, "overcommit", "record of held pid %d not written to %s: %s; an agent restarted "
		"before its resume will not resume it (gcrctl resume %d does)", (int)h->pid, path, strerror(errno),
		(int)h->pid);
	unlink(tmp);
}

static void record_remove(struct agent_room *r, pid_t pid)
{
	char path[600];
	record_path(r, pid, path, sizeof(path));
	if (unlink(path) < 0 && errno != ENOENT)
		GCR_LOG(GCR_LOG_WARN, "overcommit", "record %s not removed: %s", path, strerror(errno));
}

/* One record read back; -EBADMSG when a field is missing or of the wrong type. */
static int record_parse(const char *text, size_t len, struct hold *h)
{
	json_error_t je;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	json_int_t pid, start, bytes, for_pid, for_start;
	int prio;
	double since;
	const char *pod, *for_pod, *gpu, *mode;
	int idle = 0; /* absent in an older agent's records */
	int rc = j != NULL && json_unpack(j, "{s:I, s:I, s:s, s:i, s:I, s:F, s:I, s:I, s:s, s:s, s:s, s?b}", "pid", &pid,
					  "start", &start, "pod", &pod, "priority", &prio, "bytes", &bytes, "since",
					  &since, "for_pid", &for_pid, "for_start", &for_start, "for_pod", &for_pod,
					  "gpu", &gpu, "mode", &mode, "idle", &idle) == 0 &&
			 (strcmp(mode, "data") == 0 || strcmp(mode, "full") == 0) &&
			 pid > 0 && pid < (1 << 22) && (idle ? for_pid == 0 : for_pid > 0) && for_pid < (1 << 22) &&
			 start >= 0 &&
			 for_start >= 0 && bytes >= 0 && strlen(pod) <= AGENT_CGROUP_UID_LEN &&
			 strlen(for_pod) <= AGENT_CGROUP_UID_LEN && strlen(gpu) < GCR_NVML_UUID_LEN
		 ? 0
		 : -EBADMSG;
	if (rc == 0) {
		*h = (struct hold){ .pid = (pid_t)pid, .start = (unsigned long long)start, .priority = prio,
				    .bytes = (unsigned long long)bytes, .since = since, .for_pid = (pid_t)for_pid,
				    .for_start = (unsigned long long)for_start,
				    .data_only = strcmp(mode, "data") == 0, .idle = idle };
		snprintf(h->pod, sizeof(h->pod), "%s", pod);
		snprintf(h->for_pod, sizeof(h->for_pod), "%s", for_pod);
		snprintf(h->uuid, sizeof(h->uuid), "%s", gpu);
	}
	json_decref(j);
	return rc;
}

static void records_load(struct agent_room *r)
{
	DIR *d = opendir(r->dir);
	if (d == NULL)
		return;
	struct dirent *de;
	while ((de = readdir(d)) != NULL && r->nheld < MAX_HELD) {
		size_t n = strlen(de->d_name);
		if (n < 6 || strcmp(de->d_name + n - 5, ".json") != 0)
			continue;
		char path[600], buf[RECORD_MAX];
		snprintf(path, sizeof(path), "%s/%s", r->dir, de->d_name);
		FILE *f = fopen(path, "re");
		size_t len = f != NULL ? fread(buf, 1, sizeof(buf), f) : 0;
		if (f != NULL)
			fclose(f);
		struct hold h;
		if (len == 0 || len == sizeof(buf) || record_parse(buf, len, &h) < 0) {
			GCR_LOG(GCR_LOG_WARN, "overcommit", "record %s unreadable: removed (resume that process with "
				"gcrctl resume if it is suspended)", path);
			unlink(path);
			continue;
		}
		h.recovered = 1;
		r->held[r->nheld++] = h;
		if (h.idle)
			GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d) suspended for idling since an earlier "
				"agent: resumed on its next call (its shim is asked whether one came while no agent "
				"listened)", (int)h.pid, h.priority);
		else
			GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d) held since an earlier agent for pid %d: "
				"resumed once that one is gone", (int)h.pid, h.priority, (int)h.for_pid);
	}
	closedir(d);
}

/* ---- requests ---- */

static void reply(int fd, long long id, int granted, int suspended, unsigned long long freed, const char *reason)
{
	json_t *res = json_pack("{s:b, s:i, s:I}", "granted", granted, "suspended", suspended, "freed",
				(json_int_t)freed);
	if (res != NULL && reason != NULL)
		json_object_set_new(res, "reason", json_string(reason));
	char *line = gcr_proto_reply_ok_line(id, res);
	struct gcr_err err;
	if (line == NULL || gcr_sock_write_all(fd, line, strlen(line), REPLY_MS, &err) < 0)
		GCR_LOG(GCR_LOG_WARN, "overcommit", "room reply not sent: %s",
			line == NULL ? "out of memory" : err.msg);
	free(line);
	close(fd);
}

static int hold_of(struct agent_room *r, pid_t pid);

static int is_held(struct agent_room *r, pid_t pid)
{
	return hold_of(r, pid) >= 0;
}

/* The GPU pid allocates on: the one NVML shows it on (the first, when several), else the
 * node's only GPU. */
static int gpu_of(pid_t pid, char *uuid, struct gcr_err *err)
{
	struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
	int n = 0;
	int rc = gcr_nvml_proc_use(pid, use, GCR_NVML_MAX_DEVICES, &n, err);
	if (rc < 0)
		return rc;
	if (n > 0) {
		snprintf(uuid, GCR_NVML_UUID_LEN, "%s", use[0].uuid);
		return 0;
	}
	char gpus[GCR_NVML_MAX_DEVICES][GCR_NVML_UUID_LEN];
	if ((rc = gcr_nvml_gpus(gpus, GCR_NVML_MAX_DEVICES, &n, err)) < 0)
		return rc;
	if (n != 1)
		return gcr_err_set(err, -ENODEV, "NVML shows pid %d on no GPU and the node has %d", (int)pid, n);
	snprintf(uuid, GCR_NVML_UUID_LEN, "%s", gpus[0]);
	return 0;
}

/* pid's bytes on the GPU uuid (0: none, or NVML cannot say). */
static unsigned long long bytes_on(pid_t pid, const char *uuid)
{
	struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
	int n = 0;
	struct gcr_err err;
	if (gcr_nvml_proc_use(pid, use, GCR_NVML_MAX_DEVICES, &n, &err) < 0)
		return 0;
	for (int i = 0; i < n; i++)
		if (strcmp(use[i].uuid, uuid) == 0)
			return use[i].bytes;
	return 0;
}

/* What a data-only suspend of pid frees: the buffers on the shim's fast path (its status's
 * "bytes": vmm, app_vmm and pool; 0 when the shim does not answer in time or says nonsense), at
 * most what NVML shows it holding on the GPU. */
static unsigned long long data_bytes(struct agent_room *r, pid_t pid, unsigned long long on_gpu)
{
	static const char *const kinds[] = { "vmm", "app_vmm", "pool" };
	struct gcr_client c;
	struct gcr_err err;
	json_t *st = NULL;
	unsigned long long sum = 0;
	if (gcr_client_open(&c, r->socket_dir, pid, &err) < 0)
		return 0;
	int rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, STATUS_MS, &st, &err);
	gcr_client_close(&c);
	json_t *bytes = rc == 0 ? json_object_get(st, "bytes") : NULL;
	for (size_t i = 0; bytes != NULL && i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		json_t *v = json_object_get(bytes, kinds[i]);
		if (v == NULL)
			continue; /* an older shim: no pool */
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= GCR_SHIMREPLY_BYTES_MAX) {
			sum = 0;
			break;
		}
		sum += (unsigned long long)json_integer_value(v);
	}
	json_decref(st);
	return sum < on_gpu ? sum : on_gpu;
}

static unsigned long long free_on(const char *uuid, unsigned long long *total)
{
	unsigned long long fr = 0, t = 0;
	struct gcr_err err;
	if (gcr_nvml_mem(uuid, &fr, &t, &err) < 0)
		fr = t = 0;
	if (total != NULL)
		*total = t;
	return fr;
}

static void set_hold(struct agent_room *r, const struct hold *h)
{
	pthread_mutex_lock(&r->hlock);
	if (r->nheld < MAX_HELD)
		r->held[r->nheld++] = *h;
	pthread_mutex_unlock(&r->hlock);
	record_write(r, h);
}

static void drop_hold(struct agent_room *r, int i)
{
	pid_t pid = r->held[i].pid;
	pthread_mutex_lock(&r->hlock);
	r->held[i] = r->held[--r->nheld];
	pthread_mutex_unlock(&r->hlock);
	record_remove(r, pid);
}

/* Resumes held process i (the caller drops the hold on 0). */
static int resume_one(struct agent_room *r, int i, const char *why, struct gcr_err *err)
{
	struct hold *h = &r->held[i];
	struct gcr_cr_opts o = { .socket_dir = r->socket_dir, .mode = h->data_only ? GCR_CR_DATA_ONLY : GCR_CR_FULL,
				 .timeout_ms = r->cfg.timeout_ms };
	struct gcr_cr_result res = { 0 };
	double t0 = gcr_time_mono_ms();
	int rc = gcr_cr_resume(h->pid, &o, &res, err);
	if (rc == 0) {
		double held = now_s() - h->since;
		char label[320], note[512];
		pod_label(r, h->pod, h->pid, label, sizeof(label));
		agent_metrics_overcommit(r->m, label, 1, held, res.bytes_moved); /* counted before it is said */
		GCR_LOG(GCR_LOG_INFO, "overcommit", "resumed pid %d (pod %s, priority %d) after %.1f s held, %s: "
			"%.1f ms, %lld bytes moved", (int)h->pid, label, h->priority, held, why,
			gcr_time_mono_ms() - t0, res.bytes_moved);
		snprintf(note, sizeof(note), "resumed after %.1f s suspended %s (%s); %lld MiB moved back to the GPU "
			 "in %.0f ms", held, h->idle ? "for idling" : "for another pod", why, res.bytes_moved >> 20,
			 res.ms_total);
		event(r, h->pod, "Normal", "OvercommitResumed", note);
		if (h->woken > 0) {
			double waited = gcr_time_mono_ms() - h->woken;
			agent_metrics_overcommit_wake(r->m, label, 0, waited / 1000);
			GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d woken: its first call waited %.1f ms", (int)h->pid,
				waited);
		}
	}
	gcr_cr_result_clear(&res);
	return rc;
}

/* Suspends the chosen victims; returns how many, their bytes in *freed. */
static int suspend_victims(struct agent_room *r, const struct agent_registry_proc *req, int req_prio,
			   const struct agent_registry_proc *cand, const struct agent_victim *v, const int *pick,
			   int k, const char *uuid, unsigned long long *freed)
{
	int done = 0;
	char req_label[320];
	pod_label(r, req->pod_uid, req->pid, req_label, sizeof(req_label));
	*freed = 0;
	for (int j = 0; j < k; j++) {
		const struct agent_registry_proc *p = &cand[pick[j]];
		/* wake: its next call tells us (it then waits for room at its own priority). */
		struct gcr_cr_opts o = { .socket_dir = r->socket_dir,
					 .mode = r->cfg.data_only ? GCR_CR_DATA_ONLY : GCR_CR_FULL,
					 .timeout_ms = r->cfg.timeout_ms, .wake = 1 };
		struct gcr_cr_result res = { 0 };
		struct gcr_err err = { 0 };
		char label[320], note[640];
		pod_label(r, p->pod_uid, p->pid, label, sizeof(label));
		double t0 = gcr_time_mono_ms();
		int rc = gcr_cr_suspend(p->pid, &o, &res, &err);
		if (rc < 0) {
			GCR_LOG(GCR_LOG_WARN, "overcommit", "suspend of pid %d (pod %s) for pid %d failed: %s", (int)p->pid,
				label, (int)req->pid, err.msg);
			snprintf(note, sizeof(note), "not suspended for pod %s: %s", req_label, err.msg);
			event(r, p->pod_uid, "Warning", "OvercommitSuspendFailed", note);
			gcr_cr_result_clear(&res);
			continue;
		}
		struct hold h = { .pid = p->pid, .start = p->start, .priority = v[pick[j]].priority,
				  .bytes = v[pick[j]].bytes, .since = now_s(), .for_pid = req->pid,
				  .for_start = req->start, .data_only = r->cfg.data_only };
		snprintf(h.pod, sizeof(h.pod), "%s", p->pod_uid);
		snprintf(h.for_pod, sizeof(h.for_pod), "%s", req->pod_uid);
		snprintf(h.uuid, sizeof(h.uuid), "%s", uuid);
		set_hold(r, &h);
		done++;
		*freed += h.bytes;
		GCR_LOG(GCR_LOG_INFO, "overcommit", "suspended pid %d (pod %s, priority %d, %llu bytes on %s) for pid %d "
			"(pod %s, priority %d): %.1f ms, %lld bytes moved", (int)p->pid, label, h.priority, h.bytes,
			uuid, (int)req->pid, req_label, req_prio, gcr_time_mono_ms() - t0, res.bytes_moved);
		snprintf(note, sizeof(note), "suspended to make room on GPU %s for pod %s (priority %d > %d): %llu MiB "
			 "freed; resumed when that pod ends", uuid, req_label, req_prio, h.priority, h.bytes >> 20);
		event(r, p->pod_uid, "Warning", "OvercommitSuspended", note);
		snprintf(note, sizeof(note), "pod %s (priority %d) suspended to make room for an allocation on GPU %s",
			 label, h.priority, uuid);
		event(r, req->pod_uid, "Normal", "OvercommitRoomMade", note);
		agent_metrics_overcommit(r->m, label, 0, 0, res.bytes_moved);
		gcr_cr_result_clear(&res);
	}
	return done;
}

/* The registered processes (cand, room for AGENT_REGISTRY_MAX) as candidates v for a request
 * of self (of namespace req_ns) on GPU uuid, and the field in seen ("pid:priority/bytes[,why
 * not]" each); those the room policy keeps from req_ns are not eligible, counted in *by_policy
 * (may be NULL). */
static int gather(struct agent_room *r, pid_t self, const char *req_ns, const char *uuid,
		  struct agent_registry_proc *cand, struct agent_victim *v, char *seen, size_t len, int *by_policy)
{
	int nc = agent_registry_find(r->reg, NULL, NULL, cand, AGENT_REGISTRY_MAX);
	size_t used = 0;
	seen[0] = '\0';
	for (int i = 0; i < nc; i++) {
		int co, cp, ce;
		char cns[64];
		settings_of(r, &cand[i], &co, &cp, &ce, cns);
		int allowed = agent_roompolicy_allows(&r->policy, req_ns, cns);
		int other = cand[i].pid != self && co && !is_held(r, cand[i].pid) && allowed;
		if (cand[i].pid != self && co && !allowed && by_policy != NULL)
			(*by_policy)++;
		v[i] = (struct agent_victim){ .pid = cand[i].pid, .priority = cp, .preemptible = ce, .eligible = other,
					      .last_active = agent_activity_last(r->act, cand[i].pid),
					      .bytes = other ? bytes_on(cand[i].pid, uuid) : 0 };
		if (v[i].bytes > 0 && r->cfg.data_only)
			v[i].bytes = data_bytes(r, cand[i].pid, v[i].bytes);
		const char *why = cand[i].pid == self ? ",self"
				  : !co			      ? ",not-opted-in"
				  : !allowed		      ? ",other-namespace"
				  : !other		      ? ",held"
				  : !ce			      ? ",never"
							      : "";
		int w = snprintf(seen + used, len - used, " %d:%d/%lluMiB%s", (int)cand[i].pid, cp, v[i].bytes >> 20,
				 why);
		used = w > 0 && (size_t)w < len - used ? used + (size_t)w : used;
	}
	return nc;
}

static int hold_of(struct agent_room *r, pid_t pid)
{
	for (int i = 0; i < r->nheld; i++)
		if (r->held[i].pid == pid)
			return i;
	return -1;
}

/* Room made for p by suspends: watched until seen used (grants_check). */
static void grant_add(struct agent_room *r, const struct agent_registry_proc *p, const char *key, const char *uuid,
		      unsigned long long before, unsigned long long asked)
{
	if (r->cfg.unused_backoff_ms < 0 || r->ngrants == MAX_HELD)
		return;
	struct grant *g = &r->grants[r->ngrants++];
	*g = (struct grant){ .pid = p->pid, .start = p->start, .before = before, .asked = asked,
			     .at = gcr_time_mono_ms() };
	snprintf(g->key, sizeof(g->key), "%s", key);
	snprintf(g->pod, sizeof(g->pod), "%s", p->pod_uid);
	snprintf(g->uuid, sizeof(g->uuid), "%s", uuid);
}

/* Grant i was not used: its pod loses its priority for unused_backoff_ms (told once). */
static void grant_unused(struct agent_room *r, int i, unsigned long long holds_now, double now)
{
	struct grant *g = &r->grants[i];
	char label[320], note[640];
	penalize(r, g->key, now + r->cfg.unused_backoff_ms);
	pod_label(r, g->pod, g->pid, label, sizeof(label));
	GCR_LOG(GCR_LOG_WARN, "overcommit", "pid %d (pod %s) was given room for %llu MiB on %s by suspends and did not "
		"use it (it holds %llu MiB, %llu MiB when it asked; the room free again, or %d ms passed): it loses its "
		"priority for %d ms; the processes held for it resume", (int)g->pid, label, g->asked >> 20, g->uuid,
		holds_now >> 20, g->before >> 20, AGENT_ROOM_USE_MS, r->cfg.unused_backoff_ms);
	snprintf(note, sizeof(note), "asked for %llu MiB of room on GPU %s, which other pods were suspended for, and did "
		 "not use it: its requests for room are refused for %.0f s (overcommit.unusedBackoffMs) and those pods "
		 "resume", g->asked >> 20, g->uuid, r->cfg.unused_backoff_ms / 1000.0);
	event(r, g->pod, "Warning", "OvercommitRoomUnused", note);
	r->grants[i] = r->grants[--r->ngrants];
}

/* Each room given: used once the requester's bytes on that GPU have grown by what it asked
 * (less a granule: the driver's rounding); not used within AGENT_ROOM_USE_MS, or its victims'
 * room seen free again before (room_returned: it never took it), its pod loses its priority for
 * unused_backoff_ms, and the processes held for it resume (monitor). pid -1: every grant by
 * the clock; else only pid's, which just gave its room back. */
static void grants_check(struct agent_room *r, pid_t returned)
{
	double now = gcr_time_mono_ms();
	for (int i = r->ngrants - 1; i >= 0; i--) {
		struct grant *g = &r->grants[i];
		if (returned > 0 && g->pid != returned)
			continue;
		int gone = !alive(r, g->pid, g->start);
		unsigned long long b = gone ? 0 : bytes_on(g->pid, g->uuid);
		int used = !gone && b + AGENT_ROOM_GRANULE >= g->before + g->asked;
		if (!gone && !used && (returned > 0 || now - g->at >= AGENT_ROOM_USE_MS))
			grant_unused(r, i, b, now);
		else if (gone || used || now - g->at >= AGENT_ROOM_USE_MS)
			r->grants[i] = r->grants[--r->ngrants];
	}
}

static void handle(struct agent_room *r, struct request *q)
{
	const struct agent_registry_proc *p = &q->p;
	char reason[512], uuid[GCR_NVML_UUID_LEN];
	struct gcr_err err = { 0 };
	unsigned long long freed = 0;
	int opted, prio, preemptible, k = 0, nc = 0;
	struct agent_registry_proc *cand = NULL;
	struct agent_victim *v = NULL;
	int *pick = NULL, by_policy = 0, tell = 0;
	char req_ns[64], key[KEY_LEN];
	settings_of(r, p, &opted, &prio, &preemptible, req_ns);
	key_of(p->pod_uid, p->pid, key);
	int self = hold_of(r, p->pid);
	if (self >= 0) {
		/* It asks, so it runs: someone else resumed it (gcrctl resume). */
		GCR_LOG(GCR_LOG_INFO, "overcommit", "held pid %d was resumed by someone else", (int)p->pid);
		drop_hold(r, self);
	}
	if (!r->cfg.enabled) {
		snprintf(reason, sizeof(reason), "overcommit is off on this node");
		goto deny;
	}
	if (!opted) {
		snprintf(reason, sizeof(reason), "pid %d has not opted in (pod %s: %s, or %s=1 outside Kubernetes)",
			 (int)p->pid, AGENT_PODSPEC_OVERCOMMIT_KEY, AGENT_PODSPEC_OVERCOMMIT_VALUE, GCR_OVERCOMMIT_ENV);
		goto deny;
	}
	double left = penalty_left(r, key);
	if (left > 0) {
		snprintf(reason, sizeof(reason), "%s was given room by suspends and did not use it: its requests are refused "
			 "for another %.0f s (overcommit.unusedBackoffMs)", p->pod_uid[0] ? "the pod" : "the process", left);
		tell = 1;
		goto deny;
	}
	if (gpu_of(p->pid, uuid, &err) < 0) {
		snprintf(reason, sizeof(reason), "cannot tell the GPU of pid %d: %s", (int)p->pid, err.msg);
		goto deny;
	}
	unsigned long long want = (q->req.bytes + AGENT_ROOM_GRANULE - 1) / AGENT_ROOM_GRANULE * AGENT_ROOM_GRANULE +
				  r->cfg.margin;
	unsigned long long total = 0, fr = free_on(uuid, &total);
	/* Its need: what it holds there already plus what it asks must fit in the GPU; anything else
	 * no suspend can serve. NVML's count, not the shim's word. */
	unsigned long long holds = bytes_on(p->pid, uuid);
	if (want > total || holds + want > total) {
		snprintf(reason, sizeof(reason), "%llu MiB wanted (pid %d holds %llu MiB there already): more than GPU %s "
			 "has (%llu MiB)", want >> 20, (int)p->pid, holds >> 20, uuid, total >> 20);
		goto deny;
	}
	if (fr >= want) {
		reply(q->fd, q->req.id, 1, 0, 0, NULL); /* room came back meanwhile */
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d: %llu bytes already free on %s; granted", (int)p->pid, fr,
			uuid);
		return;
	}
	cand = calloc(AGENT_REGISTRY_MAX, sizeof(*cand));
	v = calloc(AGENT_REGISTRY_MAX, sizeof(*v));
	pick = calloc(AGENT_REGISTRY_MAX, sizeof(*pick));
	if (cand == NULL || v == NULL || pick == NULL) {
		snprintf(reason, sizeof(reason), "the agent is out of memory");
		goto deny;
	}
	char seen[1024];
	nc = gather(r, p->pid, req_ns, uuid, cand, v, seen, sizeof(seen), &by_policy);
	/* Why these victims: the whole field, once per request (requests come only on out-of-memory). */
	GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d) needs %llu MiB more on %s; pid:priority/bytes:%s",
		(int)p->pid, prio, (want - fr) >> 20, uuid, seen);
	k = agent_victims_pick(v, nc, prio, want - fr, pick, &freed);
	if (k < 0) {
		snprintf(reason, sizeof(reason), "%llu MiB free on GPU %s, %llu MiB wanted; processes of priority below "
			 "%d that may be suspended hold %llu MiB", fr >> 20, uuid, want >> 20, prio, freed >> 20);
		if (by_policy > 0) {
			snprintf(reason + strlen(reason), sizeof(reason) - strlen(reason), "; %d process(es) of other "
				 "namespaces may not be suspended for namespace %s (overcommit.roomFrom)", by_policy,
				 req_ns[0] ? req_ns : "\"\"");
			tell = 1;
		}
		goto deny;
	}
	double t_suspend = now_s();
	int done = suspend_victims(r, p, prio, cand, v, pick, k, uuid, &freed);
	fr = free_on(uuid, NULL);
	if (fr >= q->req.bytes) {
		reply(q->fd, q->req.id, 1, done, freed, NULL);
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d: room for %llu bytes made on %s (%d suspended, %llu bytes) "
			"in %.1f ms", (int)p->pid, q->req.bytes, uuid, done, freed, gcr_time_mono_ms() - q->queued);
		if (done > 0)
			grant_add(r, p, key, uuid, holds, q->req.bytes);
		goto out;
	}
	/* Not enough after all (a suspend failed, or the memory went to someone else): the
	 * processes just suspended gain nobody anything; back they go. */
	snprintf(reason, sizeof(reason), "suspending %d of %d chosen processes left %llu MiB free on GPU %s, "
		 "%llu MiB wanted", done, k, fr >> 20, uuid, want >> 20);
	for (int i = r->nheld - 1; i >= 0; i--) {
		if (r->held[i].for_pid != p->pid || r->held[i].since < t_suspend)
			continue;
		struct gcr_err e2;
		if (resume_one(r, i, "the room made was not enough", &e2) == 0)
			drop_hold(r, i);
		else
			GCR_LOG(GCR_LOG_WARN, "overcommit", "pid %d stays held: %s", (int)r->held[i].pid, e2.msg);
	}
deny:
	GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d: no room for %llu bytes: %s", (int)p->pid, q->req.bytes, reason);
	reply(q->fd, q->req.id, 0, 0, 0, reason);
	if (tell && !told_recently(r, key)) /* once a minute at most: requests come at every out-of-memory */
		event(r, p->pod_uid, "Warning", "OvercommitRoomRefused", reason);
out:
	free(cand);
	free(v);
	free(pick);
}

/* ---- the wake: a suspended process called ---- */

/* Whether pid runs on the GPU: alive and not held by this agent. */
static int resident(struct agent_room *r, pid_t pid, unsigned long long start)
{
	return alive(r, pid, start) && !is_held(r, pid);
}

/* Room for woken held process i at its own priority: resumed if its bytes fit, else after
 * suspending resident processes of lower priority (agent_victims_pick: just enough); -ENOSPC
 * when they cannot cover it (it stays held, and is tried again each check). 0: resumed (the
 * hold dropped). */
static int wake_try(struct agent_room *r, int i)
{
	struct hold *h = &r->held[i];
	pid_t pid = h->pid;
	struct agent_registry_proc p;
	struct gcr_err err = { 0 };
	char why[320], uuid[GCR_NVML_UUID_LEN];
	int rc = 0;
	if (agent_registry_get(r->reg, pid, &p) < 0) {
		p = (struct agent_registry_proc){ .pid = pid, .start = h->start };
		snprintf(p.pod_uid, sizeof(p.pod_uid), "%s", h->pod);
	}
	snprintf(uuid, sizeof(uuid), "%s", h->uuid);
	unsigned long long need = h->bytes + r->cfg.margin, fr = free_on(uuid, NULL), freed = 0;
	int prio = h->priority, k = 0;
	struct agent_registry_proc *cand = NULL;
	struct agent_victim *v = NULL;
	int *pick = NULL;
	if (fr < need) {
		cand = calloc(AGENT_REGISTRY_MAX, sizeof(*cand));
		v = calloc(AGENT_REGISTRY_MAX, sizeof(*v));
		pick = calloc(AGENT_REGISTRY_MAX, sizeof(*pick));
		if (cand == NULL || v == NULL || pick == NULL) {
			rc = -ENOMEM;
			snprintf(why, sizeof(why), "the agent is out of memory");
			goto out;
		}
		char seen[1024], wns[64];
		int wo, wp, we;
		settings_of(r, &p, &wo, &wp, &we, wns);
		int nc = gather(r, pid, wns, uuid, cand, v, seen, sizeof(seen), NULL);
		k = agent_victims_pick(v, nc, prio, need - fr, pick, &freed);
		if (k < 0) {
			rc = -ENOSPC;
			snprintf(why, sizeof(why), "%llu MiB free on %s, %llu MiB needed; processes of priority below %d "
				 "that may be suspended hold %llu MiB", fr >> 20, uuid, need >> 20, prio, freed >> 20);
			if (!r->held[i].woken_said)
				GCR_LOG(GCR_LOG_INFO, "overcommit", "woken pid %d: pid:priority/bytes:%s", (int)pid, seen);
			goto out;
		}
		GCR_LOG(GCR_LOG_INFO, "overcommit", "woken pid %d (priority %d) needs %llu MiB more on %s; "
			"pid:priority/bytes:%s", (int)pid, prio, (need - fr) >> 20, uuid, seen);
		suspend_victims(r, &p, prio, cand, v, pick, k, uuid, &freed); /* a failed one: the resume says */
		i = hold_of(r, pid); /* suspend_victims added holds */
	}
	snprintf(why, sizeof(why), "it called the GPU%s", k > 0 ? "; lower-priority pods suspended for it" : "");
	rc = resume_one(r, i, why, &err);
	if (rc == 0) {
		drop_hold(r, i);
		goto out;
	}
	snprintf(why, sizeof(why), "%s", err.msg);
	if (k > 0) {
		/* Those just suspended gain it nothing: back they go (their resume checks the room). */
		for (int j = r->nheld - 1; j >= 0; j--) {
			if (r->held[j].for_pid != pid || r->held[j].idle)
				continue;
			struct gcr_err e2;
			if (resume_one(r, j, "the room made for a woken process was not enough", &e2) == 0)
				drop_hold(r, j);
		}
	}
out:
	free(cand);
	free(v);
	free(pick);
	i = hold_of(r, pid);
	if (rc < 0 && i >= 0 && !r->held[i].woken_said) {
		GCR_LOG(GCR_LOG_INFO, "overcommit", "woken pid %d (priority %d) stays suspended: %s; resumed when room "
			"returns", (int)pid, prio, why);
		r->held[i].woken_said = 1;
	}
	return rc;
}

/* A wake from p: only a process this agent holds is woken (one suspended by gcrctl or a
 * Checkpoint is its owner's); a victim whose requester still runs stays held (its requester's
 * priority is above its own), and is given back by the rules of the monitor. */
static void wake(struct agent_room *r, const struct wake *w)
{
	int i = hold_of(r, w->p.pid);
	if (i < 0 || (r->held[i].start != 0 && w->p.start != 0 && r->held[i].start != w->p.start)) {
		GCR_LOG(GCR_LOG_INFO, "overcommit", "wake from pid %d ignored: not suspended by overcommit", (int)w->p.pid);
		return;
	}
	struct hold *h = &r->held[i];
	if (h->woken > 0)
		return;
	h->woken = w->at;
	GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d, %s) called while suspended (its first call has "
		"waited %.1f ms)", (int)h->pid, h->priority, h->idle ? "idle" : "held for another",
		gcr_time_mono_ms() - w->at);
	if (!h->idle && resident(r, h->for_pid, h->for_start)) {
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d stays suspended: pid %d it was held for (priority above "
			"its own) runs; resumed when room returns", (int)h->pid, (int)h->for_pid);
		h->woken_said = 1;
		return;
	}
	if (h->idle)
		(void)wake_try(r, i);
	/* A victim whose requester is gone or idle: the monitor's next pass resumes it. */
}

/* ---- an idle requester ---- */

/* MemAvailable of <proc_root>/meminfo in bytes; 0 when it cannot be read (not checked). */
static unsigned long long host_available(struct agent_room *r)
{
	char path[600];
	if (r->proc_root == NULL)
		return 0;
	snprintf(path, sizeof(path), "%s/meminfo", r->proc_root);
	return gcr_meminfo_bytes(path, "MemAvailable");
}

/* Suspends requester pid (others held for it), idle idle_ms, so that they resume. */
static void idle_suspend(struct agent_room *r, struct watch *wt, double idle_ms)
{
	struct agent_registry_proc p;
	struct gcr_err err = { 0 };
	char label[320], note[640], uuid[GCR_NVML_UUID_LEN];
	if (agent_registry_get(r->reg, wt->pid, &p) < 0 || gpu_of(p.pid, uuid, &err) < 0)
		return;
	int opted, prio, preemptible, nfor = 0;
	settings_of(r, &p, &opted, &prio, &preemptible, NULL);
	for (int i = 0; i < r->nheld; i++)
		nfor += r->held[i].for_pid == p.pid && !r->held[i].idle;
	pod_label(r, p.pod_uid, p.pid, label, sizeof(label));
	/* Data only, whatever the victims' mode: its next call must reach the shim's gate to wake
	 * it. After the driver's checkpoint (full) a call the shim does not gate (cuCtxSetCurrent,
	 * the runtime's own calls into the driver) blocks inside the driver's lock, unseen, and the
	 * process would wait for ever. Its context (a few hundred MiB) stays on the GPU. */
	unsigned long long bytes = data_bytes(r, p.pid, bytes_on(p.pid, uuid));
	/* Its buffers go to host memory, faulted in as written: past what the host has, the kernel
	 * (swap, its OOM killer) would answer. An eighth more for the staging's own. */
	unsigned long long avail = host_available(r);
	if (avail > 0 && bytes + bytes / 8 > avail) {
		wt->since = gcr_time_mono_ms();
		GCR_LOG(GCR_LOG_WARN, "overcommit", "idle pid %d (pod %s) not suspended: its %llu MiB of buffers do not "
			"fit in the host's %llu MiB available; tried again after another %d ms without a call",
			(int)p.pid, label, bytes >> 20, avail >> 20, r->cfg.idle_ms);
		snprintf(note, sizeof(note), "not suspended after %.1f s without a GPU call: its %llu MiB of GPU "
			 "buffers do not fit in the node's %llu MiB of available memory", idle_ms / 1000, bytes >> 20,
			 avail >> 20);
		event(r, p.pod_uid, "Warning", "OvercommitSuspendFailed", note);
		return;
	}
	struct gcr_cr_opts o = { .socket_dir = r->socket_dir, .mode = GCR_CR_DATA_ONLY,
				 .timeout_ms = AGENT_ROOM_IDLE_GATE_MS, .wake = 1 };
	struct gcr_cr_result res = { 0 };
	double t0 = gcr_time_mono_ms();
	int rc = gcr_cr_suspend(p.pid, &o, &res, &err);
	wt->since = gcr_time_mono_ms(); /* failed: tried again after another idle period */
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "overcommit", "idle pid %d (pod %s) not suspended: %s; tried again after another "
			"%d ms without a call", (int)p.pid, label, err.msg, r->cfg.idle_ms);
		snprintf(note, sizeof(note), "not suspended after %.1f s without a GPU call: %s", idle_ms / 1000, err.msg);
		event(r, p.pod_uid, "Warning", "OvercommitSuspendFailed", note);
		gcr_cr_result_clear(&res);
		return;
	}
	struct hold h = { .pid = p.pid, .start = p.start, .priority = prio, .bytes = bytes, .since = now_s(),
			  .data_only = 1, .idle = 1 };
	snprintf(h.pod, sizeof(h.pod), "%s", p.pod_uid);
	snprintf(h.uuid, sizeof(h.uuid), "%s", uuid);
	set_hold(r, &h);
	agent_metrics_overcommit_wake(r->m, label, 1, 0);
	GCR_LOG(GCR_LOG_INFO, "overcommit", "suspended idle pid %d (pod %s, priority %d, %llu bytes on %s) after "
		"%.1f s without a GPU call, for the %d processes held for it: %.1f ms, %lld bytes moved; resumed on "
		"its next call", (int)p.pid, label, prio, bytes, uuid, idle_ms / 1000, nfor, gcr_time_mono_ms() - t0,
		res.bytes_moved);
	snprintf(note, sizeof(note), "suspended on GPU %s after %.1f s without a GPU call, so that the %d pods "
		 "suspended for it can run; resumed on its next call", uuid, idle_ms / 1000, nfor);
	event(r, p.pod_uid, "Warning", "OvercommitIdleSuspended", note);
	gcr_cr_result_clear(&res);
}

/* Samples the driver calls of each resident requester (others held for it) and suspends one
 * that made none for idle_ms. The shims' counters, read through their control sockets. */
static void idle_check(struct agent_room *r)
{
	if (r->cfg.idle_ms <= 0)
		return;
	pid_t pids[MAX_HELD];
	int n = 0;
	for (int i = 0; i < r->nheld; i++) {
		const struct hold *h = &r->held[i];
		int dup = 0;
		for (int j = 0; j < n && !dup; j++)
			dup = pids[j] == h->for_pid;
		if (!h->idle && !dup && resident(r, h->for_pid, h->for_start))
			pids[n++] = h->for_pid;
	}
	long long calls[MAX_HELD];
	int rcs[MAX_HELD];
	struct gcr_err err;
	if (n > 0 && gcr_scale_calls_all(pids, (size_t)n, r->socket_dir, STATUS_MS, calls, rcs, NULL, &err) < 0)
		return;
	double now = gcr_time_mono_ms();
	struct watch next[MAX_HELD];
	for (int k = 0; k < n; k++) {
		struct watch w = { .pid = pids[k], .calls = calls[k], .since = now };
		for (int j = 0; j < r->nwatch; j++)
			if (r->watch[j].pid == pids[k]) {
				w = r->watch[j];
				/* No answer (a stopped process): no calls seen, so idle time runs on. */
				if (rcs[k] == 0 && calls[k] != w.calls) {
					w.calls = calls[k];
					w.since = now;
				}
			}
		next[k] = w;
	}
	memcpy(r->watch, next, (size_t)n * sizeof(next[0]));
	r->nwatch = n;
	for (int k = 0; k < r->nwatch; k++)
		if (now - r->watch[k].since >= r->cfg.idle_ms)
			idle_suspend(r, &r->watch[k], now - r->watch[k].since);
}

/* ---- resumes ---- */

/* Highest priority first, then the longest held. */
static int resume_order(const void *a, const void *b)
{
	const struct hold *x = a, *y = b;
	if (x->priority != y->priority)
		return x->priority > y->priority ? -1 : 1;
	return x->since < y->since ? -1 : x->since > y->since;
}

/* Whether held process h, whose requester still runs, gets its room back now: its GPU has had
 * h's bytes plus the margin free for return_ms. NVML unreadable counts as no room. */
static int room_returned(struct agent_room *r, struct hold *h, char *why, size_t len)
{
	if (r->cfg.return_ms < 0)
		return 0;
	unsigned long long fr = 0, total = 0, need = h->bytes + r->cfg.margin;
	struct gcr_err err;
	double now = gcr_time_mono_ms();
	if (gcr_nvml_mem(h->uuid, &fr, &total, &err) < 0 || fr < need) {
		h->room_since = 0;
		return 0;
	}
	if (h->room_since == 0)
		h->room_since = now;
	if (now - h->room_since < r->cfg.return_ms)
		return 0;
	snprintf(why, len, "room returned: %llu MiB free on %s for %.1f s while pid %d runs", fr >> 20, h->uuid,
		 (now - h->room_since) / 1000, (int)h->for_pid);
	return 1;
}

/* An idle hold read back from an earlier agent's record: its process may have called while no
 * agent listened (its wake went to the agent that died, or nowhere), and it sends a wake once per
 * suspend. Its shim's status says so ("wake": "called"): then it is woken as if the line had come.
 * Asked until it answers; "armed" means its wake is still to come, to this agent. */
static void lost_wakes(struct agent_room *r)
{
	for (int i = 0; i < r->nheld; i++) {
		struct hold *h = &r->held[i];
		if (!h->recovered || !h->idle || h->woken > 0)
			continue;
		struct gcr_client c;
		struct gcr_err err;
		json_t *st = NULL;
		int called = 0;
		long long waited = 0;
		if (gcr_client_open(&c, r->socket_dir, h->pid, &err) < 0)
			continue;
		int rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, STATUS_MS, &st, &err);
		gcr_client_close(&c);
		if (rc == 0)
			rc = gcr_shimreply_wake(st, &called, &waited, &err);
		json_decref(st);
		if (rc < 0 && rc != -ENOENT)
			continue; /* asked again next pass */
		h->recovered = 0;
		if (!called)
			continue;
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d) called while no agent listened (its first call "
			"has waited %lld ms; the wake it sent was lost): woken now", (int)h->pid, h->priority, waited);
		h->woken = gcr_time_mono_ms() - (double)waited;
		wake_try(r, hold_of(r, h->pid));
		i = -1; /* wake_try may have changed the holds */
	}
}

static const struct req_seen *requester(struct agent_room *r, int *n, pid_t pid, unsigned long long start)
{
	struct req_seen *seen = r->seen;
	for (int k = 0; k < *n; k++)
		if (seen[k].pid == pid && seen[k].start == start)
			return &seen[k];
	struct req_seen *s = &seen[*n < MAX_HELD ? (*n)++ : MAX_HELD - 1];
	*s = (struct req_seen){ .pid = pid, .start = start, .alive = alive(r, pid, start) };
	s->resident = s->alive && !is_held(r, pid);
	return s;
}

static void monitor(struct agent_room *r)
{
	int nseen = 0;
	for (int i = r->nheld - 1; i >= 0; i--)
		if (!alive(r, r->held[i].pid, r->held[i].start)) {
			GCR_LOG(GCR_LOG_INFO, "overcommit", "held pid %d is gone", (int)r->held[i].pid);
			drop_hold(r, i);
		}
	grants_check(r, -1);
	lost_wakes(r);
	idle_check(r);
	pthread_mutex_lock(&r->hlock);
	qsort(r->held, (size_t)r->nheld, sizeof(*r->held), resume_order);
	pthread_mutex_unlock(&r->hlock);
	for (int i = 0; i < r->nheld;) {
		struct hold *h = &r->held[i];
		char why[320];
		if (h->idle) {
			/* Resumed only when it called; while it waits for room, lower ones wait too. */
			if (h->woken <= 0) {
				i++;
				continue;
			}
			int rc = wake_try(r, i);
			if (rc == -ENOSPC)
				break;
			if (rc == 0) {
				pthread_mutex_lock(&r->hlock);
				qsort(r->held, (size_t)r->nheld, sizeof(*r->held), resume_order);
				pthread_mutex_unlock(&r->hlock);
				i = 0;
				continue;
			}
			i++;
			continue;
		}
		char fkey[KEY_LEN];
		key_of(h->for_pod, h->for_pid, fkey);
		const struct req_seen *q = requester(r, &nseen, h->for_pid, h->for_start);
		if (q->resident && penalty_left(r, fkey) > 0) {
			snprintf(why, sizeof(why), "pid %d it was held for did not use the room it was given", (int)h->for_pid);
		} else if (q->resident) {
			if (!room_returned(r, h, why, sizeof(why))) {
				i++;
				continue;
			}
			grants_check(r, h->for_pid); /* the room it was given free again: was it ever used? */
			h = &r->held[i];
			if (penalty_left(r, fkey) > 0)
				snprintf(why, sizeof(why), "pid %d it was held for did not use the room it was given",
					 (int)h->for_pid);
		} else if (q->alive) {
			snprintf(why, sizeof(why), "pid %d it was held for is suspended for idling", (int)h->for_pid);
		} else {
			snprintf(why, sizeof(why), "pid %d it was held for is gone", (int)h->for_pid);
		}
		struct gcr_err err = { 0 };
		int rc = resume_one(r, i, why, &err);
		if (rc == 0) {
			drop_hold(r, i);
			pthread_mutex_lock(&r->hlock);
			qsort(r->held, (size_t)r->nheld, sizeof(*r->held), resume_order);
			pthread_mutex_unlock(&r->hlock);
			continue;
		}
		struct gcr_cr_proc_state st;
		struct gcr_cr_opts o = { .socket_dir = r->socket_dir, .mode = h->data_only ? GCR_CR_DATA_ONLY : GCR_CR_FULL };
		struct gcr_err e2;
		if (gcr_cr_state(h->pid, &o, &st, &e2) == 0 && st.state == GCR_CR_ST_RUNNING) {
			GCR_LOG(GCR_LOG_INFO, "overcommit", "held pid %d was resumed by someone else", (int)h->pid);
			drop_hold(r, i);
			continue;
		}
		if (h->said != rc) {
			GCR_LOG(rc == -ENOSPC ? GCR_LOG_INFO : GCR_LOG_WARN, "overcommit", "pid %d (priority %d) not resumed "
				"yet: %s; retrying every %d ms", (int)h->pid, h->priority, err.msg, r->cfg.check_ms);
			h->said = rc;
		}
		/* Strict priority: while the highest waits for room, lower ones do not take it. */
		if (rc == -ENOSPC)
			break;
		i++;
	}
}

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
	int i = hold_of(r, r->rel.pid);
	r->rel.found = i >= 0 && (r->held[i].start == 0 || r->rel.start == 0 || r->held[i].start == r->rel.start);
	if (r->rel.found) {
		r->rel.data_only = r->held[i].data_only;
		GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d (priority %d, suspended %s) taken over by a Checkpoint: no "
			"longer resumed by the policy", (int)r->held[i].pid, r->held[i].priority,
			r->held[i].idle ? "for idling" : "for another pod");
		drop_hold(r, i);
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
			handle(r, &q);
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
			wake(r, &w);
			events_flush(r);
			pthread_mutex_lock(&r->lock);
			r->nudge = 1; /* a woken victim whose requester is gone or idle: the monitor resumes it now */
			continue;
		}
		r->nudge = 0;
		pthread_mutex_unlock(&r->lock);
		monitor(r);
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
	records_load(r);
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
		reply(r->q[i].fd, r->q[i].req.id, 0, 0, 0, "the agent is stopping");
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
