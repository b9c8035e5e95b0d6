/* agent_room_request: a room request, taken by the worker (agent_room.c): the requester's GPU and
 * what it and the candidates hold there (NVML, and the shims' own count in data-only mode), the
 * victims chosen (agent_victims) and suspended through gcr_cr, each recorded as a hold
 * (agent_room_hold.c), the reply, and the room given watched until used: a pod that does not use
 * it loses its priority for a while (the back-off). */
#include "agent_room.h"
#include "agent_room_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_podspec.h"
#include "gcr_client.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_shimreply.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* How long a reply may take to leave (ms): the shim is waiting for it. */
#define REPLY_MS 1000

/* ---- room not used: the back-off ---- */

void agent_room_key_of(const char *uid, pid_t pid, char *out)
{
	if (uid[0] != '\0')
		snprintf(out, KEY_LEN, "%s", uid);
	else
		snprintf(out, KEY_LEN, "pid/%d", (int)pid);
}

/* Seconds key has still without priority (0: none). */
double agent_room_penalty_left(struct agent_room *r, const char *key)
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

/* ---- requests ---- */

void agent_room_reply(int fd, long long id, int granted, int suspended, unsigned long long freed, const char *reason)
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

/* The GPU pid allocates on: the one NVML shows it on (the first, when several), else the
 * node's only GPU. */
int agent_room_gpu_of(pid_t pid, char *uuid, struct gcr_err *err)
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
unsigned long long agent_room_bytes_on(pid_t pid, const char *uuid)
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
unsigned long long agent_room_data_bytes(struct agent_room *r, pid_t pid, unsigned long long on_gpu)
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

unsigned long long agent_room_free_on(const char *uuid, unsigned long long *total)
{
	unsigned long long fr = 0, t = 0;
	struct gcr_err err;
	if (gcr_nvml_mem(uuid, &fr, &t, &err) < 0)
		fr = t = 0;
	if (total != NULL)
		*total = t;
	return fr;
}

/* Suspends the chosen victims; returns how many, their bytes in *freed. */
int agent_room_suspend_victims(struct agent_room *r, const struct agent_registry_proc *req, int req_prio,
			       const struct agent_registry_proc *cand, const struct agent_victim *v, const int *pick,
			       int k, const char *uuid, unsigned long long *freed)
{
	int done = 0;
	char req_label[320];
	agent_room_pod_label(r, req->pod_uid, req->pid, req_label, sizeof(req_label));
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
		agent_room_pod_label(r, p->pod_uid, p->pid, label, sizeof(label));
		double t0 = gcr_time_mono_ms();
		int rc = gcr_cr_suspend(p->pid, &o, &res, &err);
		if (rc < 0) {
			GCR_LOG(GCR_LOG_WARN, "overcommit", "suspend of pid %d (pod %s) for pid %d failed: %s", (int)p->pid,
				label, (int)req->pid, err.msg);
			snprintf(note, sizeof(note), "not suspended for pod %s: %s", req_label, err.msg);
			agent_room_event(r, p->pod_uid, "Warning", "OvercommitSuspendFailed", note);
			gcr_cr_result_clear(&res);
			continue;
		}
		struct hold h = { .pid = p->pid, .start = p->start, .priority = v[pick[j]].priority,
				  .bytes = v[pick[j]].bytes, .since = gcr_time_wall_s(), .for_pid = req->pid,
				  .for_start = req->start, .data_only = r->cfg.data_only };
		snprintf(h.pod, sizeof(h.pod), "%s", p->pod_uid);
		snprintf(h.for_pod, sizeof(h.for_pod), "%s", req->pod_uid);
		snprintf(h.uuid, sizeof(h.uuid), "%s", uuid);
		agent_room_set_hold(r, &h);
		done++;
		*freed += h.bytes;
		GCR_LOG(GCR_LOG_INFO, "overcommit", "suspended pid %d (pod %s, priority %d, %llu bytes on %s) for pid %d "
			"(pod %s, priority %d): %.1f ms, %lld bytes moved", (int)p->pid, label, h.priority, h.bytes,
			uuid, (int)req->pid, req_label, req_prio, gcr_time_mono_ms() - t0, res.bytes_moved);
		snprintf(note, sizeof(note), "suspended to make room on GPU %s for pod %s (priority %d > %d): %llu MiB "
			 "freed; resumed when that pod ends", uuid, req_label, req_prio, h.priority, h.bytes >> 20);
		agent_room_event(r, p->pod_uid, "Warning", "OvercommitSuspended", note);
		snprintf(note, sizeof(note), "pod %s (priority %d) suspended to make room for an allocation on GPU %s",
			 label, h.priority, uuid);
		agent_room_event(r, req->pod_uid, "Normal", "OvercommitRoomMade", note);
		agent_metrics_overcommit(r->m, label, 0, 0, res.bytes_moved);
		gcr_cr_result_clear(&res);
	}
	return done;
}

/* The registered processes (cand, room for AGENT_REGISTRY_MAX) as candidates v for a request
 * of self (of namespace req_ns) on GPU uuid, and the field in seen ("pid:priority/bytes[,why
 * not]" each); those the room policy keeps from req_ns are not eligible, counted in *by_policy
 * (may be NULL). */
int agent_room_gather(struct agent_room *r, pid_t self, const char *req_ns, const char *uuid,
		      struct agent_registry_proc *cand, struct agent_victim *v, char *seen, size_t len, int *by_policy)
{
	int nc = agent_registry_find(r->reg, NULL, NULL, cand, AGENT_REGISTRY_MAX);
	size_t used = 0;
	seen[0] = '\0';
	for (int i = 0; i < nc; i++) {
		int co, cp, ce;
		char cns[64];
		agent_room_settings_of(r, &cand[i], &co, &cp, &ce, cns);
		int allowed = agent_roompolicy_allows(&r->policy, req_ns, cns);
		int other = cand[i].pid != self && co && !agent_room_is_held(r, cand[i].pid) && allowed;
		if (cand[i].pid != self && co && !allowed && by_policy != NULL)
			(*by_policy)++;
		v[i] = (struct agent_victim){ .pid = cand[i].pid, .priority = cp, .preemptible = ce, .eligible = other,
					      .last_active = agent_activity_last(r->act, cand[i].pid),
					      .bytes = other ? agent_room_bytes_on(cand[i].pid, uuid) : 0 };
		if (v[i].bytes > 0 && r->cfg.data_only)
			v[i].bytes = agent_room_data_bytes(r, cand[i].pid, v[i].bytes);
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

/* Room made for p by suspends: watched until seen used (agent_room_grants_check). */
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
	agent_room_pod_label(r, g->pod, g->pid, label, sizeof(label));
	GCR_LOG(GCR_LOG_WARN, "overcommit", "pid %d (pod %s) was given room for %llu MiB on %s by suspends and did not "
		"use it (it holds %llu MiB, %llu MiB when it asked; the room free again, or %d ms passed): it loses its "
		"priority for %d ms; the processes held for it resume", (int)g->pid, label, g->asked >> 20, g->uuid,
		holds_now >> 20, g->before >> 20, AGENT_ROOM_USE_MS, r->cfg.unused_backoff_ms);
	snprintf(note, sizeof(note), "asked for %llu MiB of room on GPU %s, which other pods were suspended for, and did "
		 "not use it: its requests for room are refused for %.0f s (overcommit.unusedBackoffMs) and those pods "
		 "resume", g->asked >> 20, g->uuid, r->cfg.unused_backoff_ms / 1000.0);
	agent_room_event(r, g->pod, "Warning", "OvercommitRoomUnused", note);
	r->grants[i] = r->grants[--r->ngrants];
}

/* Each room given: used once the requester's bytes on that GPU have grown by what it asked
 * (less a granule: the driver's rounding); not used within AGENT_ROOM_USE_MS, or its victims'
 * room seen free again before (room_returned: it never took it), its pod loses its priority for
 * unused_backoff_ms, and the processes held for it resume (agent_room_monitor). pid -1: every
 * grant by the clock; else only pid's, which just gave its room back. */
void agent_room_grants_check(struct agent_room *r, pid_t returned)
{
	double now = gcr_time_mono_ms();
	for (int i = r->ngrants - 1; i >= 0; i--) {
		struct grant *g = &r->grants[i];
		if (returned > 0 && g->pid != returned)
			continue;
		int gone = !agent_room_alive(r, g->pid, g->start);
		unsigned long long b = gone ? 0 : agent_room_bytes_on(g->pid, g->uuid);
		int used = !gone && b + AGENT_ROOM_GRANULE >= g->before + g->asked;
		if (!gone && !used && (returned > 0 || now - g->at >= AGENT_ROOM_USE_MS))
			grant_unused(r, i, b, now);
		else if (gone || used || now - g->at >= AGENT_ROOM_USE_MS)
			r->grants[i] = r->grants[--r->ngrants];
	}
}

void agent_room_handle(struct agent_room *r, struct request *q)
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
	agent_room_settings_of(r, p, &opted, &prio, &preemptible, req_ns);
	agent_room_key_of(p->pod_uid, p->pid, key);
	int self = agent_room_hold_of(r, p->pid);
	if (self >= 0) {
		/* It asks, so it runs: someone else resumed it (gcrctl resume). */
		GCR_LOG(GCR_LOG_INFO, "overcommit", "held pid %d was resumed by someone else", (int)p->pid);
		agent_room_drop_hold(r, self);
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
	double left = agent_room_penalty_left(r, key);
	if (left > 0) {
		snprintf(reason, sizeof(reason), "%s was given room by suspends and did not use it: its requests are refused "
			 "for another %.0f s (overcommit.unusedBackoffMs)", p->pod_uid[0] ? "the pod" : "the process", left);
		tell = 1;
		goto deny;
	}
	if (agent_room_gpu_of(p->pid, uuid, &err) < 0) {
		snprintf(reason, sizeof(reason), "cannot tell the GPU of pid %d: %s", (int)p->pid, err.msg);
		goto deny;
	}
	unsigned long long want = (q->req.bytes + AGENT_ROOM_GRANULE - 1) / AGENT_ROOM_GRANULE * AGENT_ROOM_GRANULE +
				  r->cfg.margin;
	unsigned long long total = 0, fr = agent_room_free_on(uuid, &total);
	/* Its need: what it holds there already plus what it asks must fit in the GPU; anything else
	 * no suspend can serve. NVML's count, not the shim's word. */
	unsigned long long holds = agent_room_bytes_on(p->pid, uuid);
	if (want > total || holds + want > total) {
		snprintf(reason, sizeof(reason), "%llu MiB wanted (pid %d holds %llu MiB there already): more than GPU %s "
			 "has (%llu MiB)", want >> 20, (int)p->pid, holds >> 20, uuid, total >> 20);
		goto deny;
	}
	if (fr >= want) {
		agent_room_reply(q->fd, q->req.id, 1, 0, 0, NULL); /* room came back meanwhile */
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
	nc = agent_room_gather(r, p->pid, req_ns, uuid, cand, v, seen, sizeof(seen), &by_policy);
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
	double t_suspend = gcr_time_wall_s();
	int done = agent_room_suspend_victims(r, p, prio, cand, v, pick, k, uuid, &freed);
	fr = agent_room_free_on(uuid, NULL);
	if (fr >= q->req.bytes) {
		agent_room_reply(q->fd, q->req.id, 1, done, freed, NULL);
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
		if (agent_room_resume_one(r, i, "the room made was not enough", &e2) == 0)
			agent_room_drop_hold(r, i);
		else
			GCR_LOG(GCR_LOG_WARN, "overcommit", "pid %d stays held: %s", (int)r->held[i].pid, e2.msg);
	}
deny:
	GCR_LOG(GCR_LOG_INFO, "overcommit", "pid %d: no room for %llu bytes: %s", (int)p->pid, q->req.bytes, reason);
	agent_room_reply(q->fd, q->req.id, 0, 0, 0, reason);
	if (tell && !told_recently(r, key)) /* once a minute at most: requests come at every out-of-memory */
		agent_room_event(r, p->pod_uid, "Warning", "OvercommitRoomRefused", reason);
out:
	free(cand);
	free(v);
	free(pick);
}
