/* agent_room_hold: the overcommit policy's holds: each one's record on disk (read back by the next
 * agent), the table the worker keeps, resumes (the monitor: highest priority first, once the
 * process a hold was made for is gone, idle, or its room free again), the wake of a suspended
 * process that called, and the idle requester suspended so that those held for it run. */
#include "agent_room.h"
#include "agent_room_int.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr_client.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_meminfo.h"
#include "gcr_scale.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"

/* Longest record file read back (bytes). */
#define RECORD_MAX 8192

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

void agent_room_records_load(struct agent_room *r)
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

/* ---- the holds: the worker's own, changed under hlock (agent_room_held, agent_room_holds) ---- */

int agent_room_hold_of(struct agent_room *r, pid_t pid)
{
	for (int i = 0; i < r->nheld; i++)
		if (r->held[i].pid == pid)
			return i;
	return -1;
}

int agent_room_is_held(struct agent_room *r, pid_t pid)
{
	return agent_room_hold_of(r, pid) >= 0;
}

void agent_room_set_hold(struct agent_room *r, const struct hold *h)
{
	pthread_mutex_lock(&r->hlock);
	if (r->nheld < MAX_HELD)
		r->held[r->nheld++] = *h;
	pthread_mutex_unlock(&r->hlock);
	record_write(r, h);
}

void agent_room_drop_hold(struct agent_room *r, int i)
{
	pid_t pid = r->held[i].pid;
	pthread_mutex_lock(&r->hlock);
	r->held[i] = r->held[--r->nheld];
	pthread_mutex_unlock(&r->hlock);
	record_remove(r, pid);
}

/* Resumes held process i (the caller drops the hold on 0). */
int agent_room_resume_one(struct agent_room *r, int i, const char *why, struct gcr_err *err)
{
	struct hold *h = &r->held[i];
	struct gcr_cr_opts o = { .socket_dir = r->socket_dir, .mode = h->data_only ? GCR_CR_DATA_ONLY : GCR_CR_FULL,
				 .timeout_ms = r->cfg.timeout_ms };
	struct gcr_cr_result res = { 0 };
	double t0 = gcr_time_mono_ms();
	int rc = gcr_cr_resume(h->pid, &o, &res, err);
	if (rc == 0) {
		double held = gcr_time_wall_s() - h->since;
		char label[320], note[512];
		agent_room_pod_label(r, h->pod, h->pid, label, sizeof(label));
		agent_metrics_overcommit(r->m, label, 1, held, res.bytes_moved); /* counted before it is said */
		GCR_LOG(GCR_LOG_INFO, "overcommit", "resumed pid %d (pod %s, priority %d) after %.1f s held, %s: "
			"%.1f ms, %lld bytes moved", (int)h->pid, label, h->priority, held, why,
			gcr_time_mono_ms() - t0, res.bytes_moved);
		snprintf(note, sizeof(note), "resumed after %.1f s suspended %s (%s); %lld MiB moved back to the GPU "
			 "in %.0f ms", held, h->idle ? "for idling" : "for another pod", why, res.bytes_moved >> 20,
			 res.ms_total);
		agent_room_event(r, h->pod, "Normal", "OvercommitResumed", note);
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

/* ---- the wake: a suspended process called ---- */

/* Whether pid runs on the GPU: alive and not held by this agent. */
static int resident(struct agent_room *r, pid_t pid, unsigned long long start)
{
	return agent_room_alive(r, pid, start) && !agent_room_is_held(r, pid);
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
	unsigned long long need = h->bytes + r->cfg.margin, fr = agent_room_free_on(uuid, NULL), freed = 0;
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
		agent_room_settings_of(r, &p, &wo, &wp, &we, wns);
		int nc = agent_room_gather(r, pid, wns, uuid, cand, v, seen, sizeof(seen), NULL);
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
		agent_room_suspend_victims(r, &p, prio, cand, v, pick, k, uuid, &freed); /* a failed one: the resume says */
		i = agent_room_hold_of(r, pid); /* suspend_victims added holds */
	}
	snprintf(why, sizeof(why), "it called the GPU%s", k > 0 ? "; lower-priority pods suspended for it" : "");
	rc = agent_room_resume_one(r, i, why, &err);
	if (rc == 0) {
		agent_room_drop_hold(r, i);
		goto out;
	}
	snprintf(why, sizeof(why), "%s", err.msg);
	if (k > 0) {
		/* Those just suspended gain it nothing: back they go (their resume checks the room). */
		for (int j = r->nheld - 1; j >= 0; j--) {
			if (r->held[j].for_pid != pid || r->held[j].idle)
				continue;
			struct gcr_err e2;
			if (agent_room_resume_one(r, j, "the room made for a woken process was not enough", &e2) == 0)
				agent_room_drop_hold(r, j);
		}
	}
out:
	free(cand);
	free(v);
	free(pick);
	i = agent_room_hold_of(r, pid);
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
void agent_room_wake(struct agent_room *r, const struct wake *w)
{
	int i = agent_room_hold_of(r, w->p.pid);
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
	if (agent_registry_get(r->reg, wt->pid, &p) < 0 || agent_room_gpu_of(p.pid, uuid, &err) < 0)
		return;
	int opted, prio, preemptible, nfor = 0;
	agent_room_settings_of(r, &p, &opted, &prio, &preemptible, NULL);
	for (int i = 0; i < r->nheld; i++)
		nfor += r->held[i].for_pid == p.pid && !r->held[i].idle;
	agent_room_pod_label(r, p.pod_uid, p.pid, label, sizeof(label));
	/* Data only, whatever the victims' mode: its next call must reach the shim's gate to wake
	 * it. After the driver's checkpoint (full) a call the shim does not gate (cuCtxSetCurrent,
	 * the runtime's own calls into the driver) blocks inside the driver's lock, unseen, and the
	 * process would wait for ever. Its context (a few hundred MiB) stays on the GPU. */
	unsigned long long bytes = agent_room_data_bytes(r, p.pid, agent_room_bytes_on(p.pid, uuid));
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
		agent_room_event(r, p.pod_uid, "Warning", "OvercommitSuspendFailed", note);
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
		agent_room_event(r, p.pod_uid, "Warning", "OvercommitSuspendFailed", note);
		gcr_cr_result_clear(&res);
		return;
	}
	struct hold h = { .pid = p.pid, .start = p.start, .priority = prio, .bytes = bytes, .since = gcr_time_wall_s(),
			  .data_only = 1, .idle = 1 };
	snprintf(h.pod, sizeof(h.pod), "%s", p.pod_uid);
	snprintf(h.uuid, sizeof(h.uuid), "%s", uuid);
	agent_room_set_hold(r, &h);
	agent_metrics_overcommit_wake(r->m, label, 1, 0);
	GCR_LOG(GCR_LOG_INFO, "overcommit", "suspended idle pid %d (pod %s, priority %d, %llu bytes on %s) after "
		"%.1f s without a GPU call, for the %d processes held for it: %.1f ms, %lld bytes moved; resumed on "
		"its next call", (int)p.pid, label, prio, bytes, uuid, idle_ms / 1000, nfor, gcr_time_mono_ms() - t0,
		res.bytes_moved);
	snprintf(note, sizeof(note), "suspended on GPU %s after %.1f s without a GPU call, so that the %d pods "
		 "suspended for it can run; resumed on its next call", uuid, idle_ms / 1000, nfor);
	agent_room_event(r, p.pod_uid, "Warning", "OvercommitIdleSuspended", note);
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
		wake_try(r, agent_room_hold_of(r, h->pid));
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
	*s = (struct req_seen){ .pid = pid, .start = start, .alive = agent_room_alive(r, pid, start) };
	s->resident = s->alive && !agent_room_is_held(r, pid);
	return s;
}

void agent_room_monitor(struct agent_room *r)
{
	int nseen = 0;
	for (int i = r->nheld - 1; i >= 0; i--)
		if (!agent_room_alive(r, r->held[i].pid, r->held[i].start)) {
			GCR_LOG(GCR_LOG_INFO, "overcommit", "held pid %d is gone", (int)r->held[i].pid);
			agent_room_drop_hold(r, i);
		}
	agent_room_grants_check(r, -1);
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
		agent_room_key_of(h->for_pod, h->for_pid, fkey);
		const struct req_seen *q = requester(r, &nseen, h->for_pid, h->for_start);
		if (q->resident && agent_room_penalty_left(r, fkey) > 0) {
			snprintf(why, sizeof(why), "pid %d it was held for did not use the room it was given", (int)h->for_pid);
		} else if (q->resident) {
			if (!room_returned(r, h, why, sizeof(why))) {
				i++;
				continue;
			}
			agent_room_grants_check(r, h->for_pid); /* the room it was given free again: was it ever used? */
			h = &r->held[i];
			if (agent_room_penalty_left(r, fkey) > 0)
				snprintf(why, sizeof(why), "pid %d it was held for did not use the room it was given",
					 (int)h->for_pid);
		} else if (q->alive) {
			snprintf(why, sizeof(why), "pid %d it was held for is suspended for idling", (int)h->for_pid);
		} else {
			snprintf(why, sizeof(why), "pid %d it was held for is gone", (int)h->for_pid);
		}
		struct gcr_err err = { 0 };
		int rc = agent_room_resume_one(r, i, why, &err);
		if (rc == 0) {
			agent_room_drop_hold(r, i);
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
			agent_room_drop_hold(r, i);
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
