/* gcrctl: suspend, resume and inspect GCR processes on this machine without
 * Kubernetes; the same library code (lib/gcr_cr) the node agent runs. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "config.h"
#include "gcr/protocol.h"
#include "gcr_client.h"
#include "gcr_cr.h"
#include "gcr_criu.h"
#include "gcr_driver.h"
#include "gcr_group.h"
#include "gcr_imgcr.h"
#include "gcr_jsonbudget.h"
#include "gcr_log.h"
#include "gcr_scale.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"
#include "gcr_uuid.h"

static int json_out;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: gcrctl [--socket-dir DIR] [--json] [--timeout-ms N] [--images-dir DIR] COMMAND\n"
		"  suspend [--driver-only|--no-driver] PID   GPU state to host memory, 0 bytes left on the GPU\n"
		"  suspend --image DIR PID                   the same with the GPU data written to DIR/gpu (DIR\n"
		"                                             as the process sees it), ready for a container\n"
		"                                             runtime's checkpoint (docs/images.md)\n"
		"  suspend --group PID,PID,... [--driver-only|--no-driver]  a group of processes that\n"
		"                                             communicate through NCCL, as one operation:\n"
		"                                             held at matching counts, communicators torn\n"
		"                                             down, every member's data and driver state out\n"
		"                                             at once; a failure brings every member back\n"
		"  resume  [--driver-only|--no-driver] PID   back on the GPU at the same addresses\n"
		"  resume --group PID,PID,...                 the group back: every member's driver state and\n"
		"                                             data, then the communicators made again\n"
		"  resume --image DIR PID                    after a container runtime's restore (or a suspend\n"
		"                                             --image): the GPU data from DIR/gpu (DIR as the\n"
		"                                             process sees it), then resume\n"
		"  status PID                                 the process's state (running, suspended, partial,\n"
		"                                             unmanaged, gone; in the mode given), and its\n"
		"                                             shim's and driver's\n"
		"  stats PID                                  what the shim saw (calls, lookups, bytes)\n"
		"  list                                       processes with a GCR shim\n"
		"  scale --replicas N [--sample-ms MS] PID... keep N of these processes resident: suspends the\n"
		"                                             least active first, resumes the most active first,\n"
		"                                             all at once (one thread per process)\n"
		"  criu                                       CRIU for AMD processes: found, >= 4.0, amdgpu plugin\n"
		"  hold-driver                                opens the CUDA driver and keeps it open until\n"
		"                                             SIGTERM or SIGINT, as gcr-agent does: while the\n"
		"                                             GPUs' processes are checkpointed, a gcrctl that\n"
		"                                             opens the driver pays 0.2-0.4 s, 0.05 s while\n"
		"                                             another process holds it (a node without the agent)\n"
		"  checkpoint --image DIR [--leave-running] [--driver-only] [--container] PID  the process to an\n"
		"                                             image on disk (docs/images.md); CRIU ends it unless\n"
		"                                             --leave-running; --driver-only: the driver's checkpoint\n"
		"                                             plus CRIU alone, no shim (the baseline); --container:\n"
		"                                             PID is in a container, CRIU dumps the container's\n"
		"                                             whole tree (its PID namespace's init)\n"
		"  restore --image DIR [--verify-first] [--gpu-pair FROM=TO]...  the process back from an image:\n"
		"                                             manifest, sizes\n"
		"                                             and CRIU files checked first, the GPU data while\n"
		"                                             CRIU restores (or first, with --verify-first)\n"
		"--gpu-pair FROM=TO (resume, restore; repeatable): the driver restores the GPU with UUID FROM's\n"
		"state onto the GPU with UUID TO (same model; nvidia-smi -L lists UUIDs); --gpu UUID: the one\n"
		"GPU the process used, whichever it was, onto GPU UUID. Checked first: the target exists, is\n"
		"the same model and has room; otherwise the process stays suspended where it was.\n"
		"--driver-only: the driver's checkpoint API alone; --no-driver (or --keep-context): the\n"
		"shim's data step alone, the CUDA context stays resident. Socket dir: $%s or %s.\n"
		"HIP (AMD) processes: the control step is CRIU (criu dump, which ends the process, and\n"
		"criu restore), images in --images-dir/PID ($GCR_IMAGES_DIR or " GCR_CR_IMAGES_DIR ").\n"
		"--unchecked: suspend without recording the GPU memory the restore needs / resume without\n"
		"checking it is free (an out-of-memory driver restore loses the process; see docs/design.md).\n"
		"A resume refused for want of GPU memory exits with status 3: the process is still\n"
		"suspended; retry when the GPU has room.\n"
		"scale ranks by the shim's call counters: their growth over --sample-ms (default 0: their totals).\n"
		"scale --replicas 0|1 --group PID,... suspends or resumes the group as one replica.\n"
		"--timeout-ms bounds each step of a group operation (all members at once), default 30000.\n",
		GCR_SOCKET_DIR_ENV, GCR_DEFAULT_SOCKET_DIR);
}

/* hold-driver: the driver open (dlopen, cuInit: no context, no GPU memory) until a signal. The
 * driver tears its state down when no process has it open; the next opening then costs 0.2-0.4 s
 * (two H200s, tests/gpu/init_probe.py, run 71), which every gcrctl resume would pay. */
static int do_hold_driver(void)
{
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	struct gcr_err err = { 0 };
	double t0 = gcr_time_mono_ms();
	if (gcr_driver_open(&err) < 0) {
		fprintf(stderr, "gcrctl: hold-driver: %s\n", err.msg);
		return 1;
	}
	printf("driver open in %.1f ms; held until SIGTERM or SIGINT\n", gcr_time_mono_ms() - t0);
	fflush(stdout);
	int sig = 0;
	while (sigwait(&sigs, &sig) != 0)
		;
	printf("driver let go (signal %d)\n", sig);
	return 0;
}

static int parse_pid(const char *s, pid_t *pid)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v <= 0 || v > 4194304)
		return -EINVAL;
	*pid = (pid_t)v;
	return 0;
}

static void print_json(json_t *j)
{
	char *s = json_dumps(j, JSON_COMPACT);
	if (s != NULL)
		puts(s);
	free(s);
}

static int fail(const char *op, pid_t pid, const struct gcr_err *err)
{
	if (json_out) {
		json_t *j = json_pack("{s:i, s:s, s:b, s:s, s:i}", "pid", (int)pid, "op", op, "ok", 0, "error",
				      err->msg, "code", err->code);
		print_json(j);
		json_decref(j);
	}
	fprintf(stderr, "gcrctl: %s %d: %s\n", op, (int)pid, err->msg);
	return err->code == -ENOSPC ? 3 : 1; /* 3: no room on the GPU yet, still suspended: retry */
}

/* A member of an NCCL group alone was refused: a second line names the group's processes (those
 * whose shims share a communicator with it) and the command that suspends them together. */
static void group_hint(const char *op, pid_t pid, const struct gcr_cr_opts *o, struct gcr_err *err)
{
	pid_t peers[GCR_GROUP_MAX_MEMBERS];
	size_t n = 0;
	struct gcr_err e;
	(void)err;
	if (gcr_group_find(o->socket_dir, pid, peers, GCR_GROUP_MAX_MEMBERS, &n, &e) < 0 || n == 0)
		return;
	fprintf(stderr, "gcrctl: %s %d: its NCCL group here: gcrctl %s --group ", op, (int)pid, op);
	for (size_t i = 0; i < n; i++)
		fprintf(stderr, "%s%d", i ? "," : "", (int)peers[i]);
	fprintf(stderr, "\n");
}

static int do_cr(const char *op, pid_t pid, struct gcr_cr_opts *o)
{
	struct gcr_cr_result r;
	struct gcr_err err = { 0 };
	int resume = strcmp(op, "resume") == 0;
	int rc = resume ? gcr_cr_resume(pid, o, &r, &err) : gcr_cr_suspend(pid, o, &r, &err);
	if (rc == -EXDEV)
		group_hint(op, pid, o, &err);
	if (rc < 0) {
		gcr_cr_result_clear(&r);
		return fail(op, pid, &err);
	}
	json_t *ms = json_pack("{s:f, s:f, s:f, s:f, s:f}", "total", r.ms_total, "data", r.ms_data, "room", r.ms_room,
			       "init", r.ms_init, "state", r.ms_state);
	if (resume) {
		json_object_set_new(ms, "restore", json_real(r.ms_restore));
		json_object_set_new(ms, "unlock", json_real(r.ms_unlock));
	} else {
		json_object_set_new(ms, "lock", json_real(r.ms_lock));
		json_object_set_new(ms, "checkpoint", json_real(r.ms_checkpoint));
	}
	json_t *j = json_pack("{s:i, s:s, s:b, s:s, s:s, s:o, s:{s:I, s:I}, s:O*}", "pid", (int)pid, "op", op,
			      "ok", 1, "mode", gcr_cr_mode_name(o->mode), "control", r.control ? r.control : "none",
			      "ms", ms, "bytes", "moved",
			      (json_int_t)r.bytes_moved, "total", (json_int_t)r.bytes_total, "shim", r.shim);
	if (json_out)
		print_json(j);
	else
		printf("%s %d: ok in %.1f ms (data %.1f ms, driver %.1f ms), %.1f of %.1f MiB moved by the shim\n",
		       op, (int)pid, r.ms_total, r.ms_data,
		       resume ? r.ms_restore + r.ms_unlock : r.ms_lock + r.ms_checkpoint,
		       (double)r.bytes_moved / 1048576.0, (double)r.bytes_total / 1048576.0);
	json_decref(j);
	gcr_cr_result_clear(&r);
	return 0;
}

/* Parses "PID,PID,..." (outside input: a command line): 1 .. GCR_GROUP_MAX_MEMBERS pids. */
static int parse_group(const char *s, pid_t *pids, size_t *n)
{
	char buf[GCR_GROUP_MAX_MEMBERS * 12];
	*n = 0;
	if (strlen(s) >= sizeof(buf))
		return -EINVAL;
	snprintf(buf, sizeof(buf), "%s", s);
	for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
		if (*n == GCR_GROUP_MAX_MEMBERS || parse_pid(tok, &pids[*n]) < 0)
			return -EINVAL;
		(*n)++;
	}
	return *n > 0 ? 0 : -EINVAL;
}

/* suspend/resume --group: lib/gcr_group's operation over every member at once. */
static int do_group(const char *op, const pid_t *pids, size_t n, const struct gcr_cr_opts *o)
{
	struct gcr_group_opts go = { .socket_dir = o->socket_dir, .mode = o->mode, .timeout_ms = o->timeout_ms,
				     .unchecked = o->unchecked };
	struct gcr_group_result *r = calloc(1, sizeof(*r));
	struct gcr_err err = { 0 };
	if (r == NULL) {
		fprintf(stderr, "gcrctl: out of memory\n");
		return 1;
	}
	int resume = strcmp(op, "resume") == 0;
	int rc = resume ? gcr_group_resume(pids, n, &go, r, &err) : gcr_group_suspend(pids, n, &go, r, &err);
	json_t *members = json_array();
	for (size_t i = 0; i < r->n; i++) {
		const struct gcr_group_member *m = &r->m[i];
		json_t *j = json_pack("{s:i, s:b, s:s, s:i, s:b, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}, "
				      "s:{s:I, s:I}}",
				      "pid", (int)m->pid, "ok", m->rc == 0, "state", m->state, "comms", m->comms, "gone",
				      m->gone, "ms", "freeze", m->ms_freeze, "drain", m->ms_drain, "cr", m->ms_cr, "data",
				      m->cr.ms_data, "driver",
				      resume ? m->cr.ms_restore + m->cr.ms_unlock : m->cr.ms_lock + m->cr.ms_checkpoint,
				      "room", m->cr.ms_room, "init", m->cr.ms_init, "state", m->cr.ms_state, "ids", m->ms_ids,
				      "rebuild", m->ms_rebuild, "thaw", m->ms_thaw, "bytes", "moved", (json_int_t)m->cr.bytes_moved, "total",
				      (json_int_t)m->cr.bytes_total);
		if (m->rc < 0)
			json_object_set_new(j, "error", json_sprintf("%s: %s", m->step ? m->step : "?", m->err.msg));
		if (m->cr.shim != NULL) /* the shim's own breakdown (copy, digest, release...), as a single suspend gives */
			json_object_set(j, "shim", m->cr.shim);
		json_array_append_new(members, j);
	}
	json_t *pj = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(pj, json_integer(pids[i]));
	json_t *j = json_pack("{s:s, s:o, s:b, s:s, s:i, s:i, s:b, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f}, s:{s:I, s:I}, s:o}",
			      "op", op, "group", pj, "ok", rc == 0, "mode", gcr_cr_mode_name(o->mode), "comms", r->comms,
			      "failed_comms", r->failed_comms, "rolled_back", r->rolled_back, "ms", "total", r->ms_total,
			      "freeze", r->ms_freeze, "drain", r->ms_drain, "cr", r->ms_cr, "ids", r->ms_ids, "rebuild",
			      r->ms_rebuild, "thaw", r->ms_thaw, "bytes", "moved", (json_int_t)r->bytes_moved, "total",
			      (json_int_t)r->bytes_total, "members", members);
	if (rc < 0) {
		json_object_set_new(j, "error", json_string(err.msg));
		json_object_set_new(j, "code", json_integer(err.code));
	}
	if (json_out)
		print_json(j);
	else if (rc == 0)
		printf("%s group of %zu: ok in %.1f ms (%s%.1f ms), %d communicators, %.1f of %.1f MiB moved by the shims\n",
		       op, n, r->ms_total, resume ? "resume " : "freeze ", resume ? r->ms_cr : r->ms_freeze,
		       r->comms, (double)r->bytes_moved / 1048576.0, (double)r->bytes_total / 1048576.0);
	if (!json_out && rc == 0)
		printf("  steps: %s %.1f ms, %s %.1f ms, %s %.1f ms, %s %.1f ms\n", resume ? "resume" : "freeze",
		       resume ? r->ms_cr : r->ms_freeze, resume ? "ids" : "drain", resume ? r->ms_ids : r->ms_drain,
		       resume ? "rebuild" : "suspend", resume ? r->ms_rebuild : r->ms_cr, "thaw", r->ms_thaw);
	json_decref(j);
	if (rc < 0)
		fprintf(stderr, "gcrctl: %s --group: %s\n", op, err.msg);
	gcr_group_result_clear(r);
	free(r);
	return rc == -ENOSPC ? 3 : rc < 0 ? 1 : 0;
}

/* One line for a status object: "pid N: STATE (shim STATE, driver STATE)[, sizes]", the first
 * state gcr_cr_state's (in the mode asked: --no-driver, --driver-only). */
static void print_status_line(pid_t pid, json_t *st, int sizes)
{
	json_t *shim = json_object_get(st, "shim");
	const char *driver = json_string_value(json_object_get(st, "driver")), *state;
	const char *whole = json_string_value(json_object_get(st, "state"));
	long long fast, drv;
	struct gcr_err e;
	if (gcr_shimreply_state(shim, &state, &e) < 0)
		state = shim != NULL ? "unreadable" : "absent";
	printf("pid %d: %s (shim %s, driver %s)", (int)pid, whole ? whole : "unknown", state,
	       driver ? driver : "unavailable");
	/* Sizes the shim cannot give sensibly are left out rather than printed wrong. */
	if (sizes && shim != NULL && gcr_shimreply_sizes(shim, &fast, &drv, &e) == 0)
		printf(", %.1f MiB on the fast path, %.1f MiB left to the driver", (double)fast / 1048576.0,
		       (double)drv / 1048576.0);
	const char *sock = json_string_value(json_object_get(st, "socket"));
	printf("%s%s\n", sock ? ", socket " : "", sock ? sock : "");
}

static int do_status(pid_t pid, struct gcr_cr_opts *o)
{
	json_t *st = NULL;
	struct gcr_err err = { 0 };
	if (gcr_cr_status(pid, o, &st, &err) < 0)
		return fail("status", pid, &err);
	if (json_out)
		print_json(st);
	else
		print_status_line(pid, st, 1);
	int absent = json_object_get(st, "shim") == NULL;
	json_decref(st);
	return absent ? 1 : 0;
}

static int do_stats(pid_t pid, struct gcr_cr_opts *o)
{
	struct gcr_client c;
	struct gcr_err err = { 0 };
	json_t *res = NULL;
	if (gcr_client_open(&c, o->socket_dir, pid, &err) < 0 ||
	    gcr_client_call(&c, GCR_OP_STATS_ID, NULL, 10000, &res, &err) < 0) {
		gcr_client_close(&c);
		return fail("stats", pid, &err);
	}
	gcr_client_close(&c);
	char *s = json_dumps(res, json_out ? JSON_COMPACT : JSON_INDENT(2));
	if (s != NULL)
		puts(s);
	free(s);
	json_decref(res);
	return 0;
}

static void list_one(pid_t pid, const char *path, void *data)
{
	struct gcr_cr_opts *o = data;
	json_t *st = NULL;
	struct gcr_err err;
	if (gcr_cr_status(pid, o, &st, &err) < 0)
		return;
	json_object_set_new(st, "socket", json_string(path));
	if (json_out)
		print_json(st);
	else
		print_status_line(pid, st, 0);
	json_decref(st);
}

/* scale: the policy of the agent's scaler (gcr_scale) on local pids. Times: plan (states and
 * activity read), run (first operation started to last one ended), total (command to done). */
static int do_scale(int replicas, int sample_ms, pid_t *pids, int n, struct gcr_cr_opts *o)
{
	double t0 = gcr_time_mono_ms();
	struct gcr_scale_member *m = calloc((size_t)n, sizeof(*m));
	struct gcr_scale_proc *p = calloc((size_t)n, sizeof(*p));
	long long *calls = calloc((size_t)n, sizeof(*calls));
	char (*ids)[16] = calloc((size_t)n, sizeof(*ids));
	int status = 1;
	if (m == NULL || p == NULL || calls == NULL || ids == NULL) {
		fprintf(stderr, "gcrctl: scale: out of memory\n");
		goto out;
	}
	for (int i = 0; i < n; i++) {
		snprintf(ids[i], sizeof(ids[i]), "%d", (int)pids[i]);
		m[i].id = ids[i];
		struct gcr_cr_proc_state ps;
		struct gcr_err se;
		m[i].state = gcr_cr_state(pids[i], o, &ps, &se) == 0 ? gcr_scale_state_of(ps.state) : GCR_SCALE_UNMANAGED;
		struct gcr_err e;
		if (m[i].state != GCR_SCALE_UNMANAGED && gcr_scale_calls(pids[i], o->socket_dir, &calls[i], &e) < 0)
			calls[i] = 0;
		m[i].recent_calls = calls[i];
	}
	if (sample_ms > 0) {
		struct timespec ts = { .tv_sec = sample_ms / 1000, .tv_nsec = (long)(sample_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL); /* the sampling interval itself, not a synchronisation */
		for (int i = 0; i < n; i++) {
			long long now_calls = 0;
			struct gcr_err e;
			if (m[i].state != GCR_SCALE_UNMANAGED &&
			    gcr_scale_calls(pids[i], o->socket_dir, &now_calls, &e) == 0)
				m[i].recent_calls = now_calls - calls[i];
		}
	}
	struct gcr_scale_plan plan;
	struct gcr_err err;
	if (gcr_scale_plan(m, (size_t)n, replicas, &plan, &err) < 0) {
		fprintf(stderr, "gcrctl: scale: %s\n", err.msg);
		goto out;
	}
	for (int i = 0; i < n; i++)
		p[i] = (struct gcr_scale_proc){ .pid = pids[i], .action = m[i].action };
	double t_run = gcr_time_mono_ms();
	double ms_run = 0;
	int rc = gcr_scale_run(p, (size_t)n, o, &ms_run);
	double ms_total = gcr_time_mono_ms() - t0, ms_plan = t_run - t0;
	int resident = 0, suspended = 0, unmanaged = 0;
	json_t *procs = json_array();
	for (int i = 0; i < n; i++) {
		enum gcr_scale_state after = m[i].state;
		if (p[i].action != GCR_SCALE_NONE && p[i].rc == 0)
			after = p[i].action == GCR_SCALE_SUSPEND ? GCR_SCALE_SUSPENDED : GCR_SCALE_RESIDENT;
		resident += after == GCR_SCALE_RESIDENT;
		suspended += after == GCR_SCALE_SUSPENDED;
		unmanaged += after == GCR_SCALE_UNMANAGED;
		int resume = p[i].action == GCR_SCALE_RESUME;
		json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:I}", "pid", (int)pids[i], "before",
				      gcr_scale_state_name(m[i].state), "action", gcr_scale_action_name(p[i].action),
				      "after", gcr_scale_state_name(after), "activity", (json_int_t)m[i].recent_calls);
		if (p[i].action != GCR_SCALE_NONE) {
			json_object_set_new(j, "ok", json_boolean(p[i].rc == 0));
			json_object_set_new(j, "ms", json_pack("{s:f, s:f, s:f, s:f}", "done", p[i].ms_done, "total",
							       p[i].r.ms_total, "data", p[i].r.ms_data, "driver",
							       resume ? p[i].r.ms_restore + p[i].r.ms_unlock
								      : p[i].r.ms_lock + p[i].r.ms_checkpoint));
			json_object_set_new(j, "bytes", json_integer((json_int_t)p[i].r.bytes_moved));
			if (p[i].rc < 0)
				json_object_set_new(j, "error", json_string(p[i].err.msg));
		}
		json_array_append_new(procs, j);
		if (json_out || p[i].action == GCR_SCALE_NONE)
			continue;
		if (p[i].rc < 0)
			printf("pid %d: %s failed after %.1f ms: %s\n", (int)pids[i], gcr_scale_action_name(p[i].action),
			       p[i].ms_done, p[i].err.msg);
		else
			printf("pid %d: %s ok, done %.1f ms after the start (own %.1f ms: data %.1f ms, driver %.1f ms), "
			       "%.1f MiB\n",
			       (int)pids[i], gcr_scale_action_name(p[i].action), p[i].ms_done, p[i].r.ms_total,
			       p[i].r.ms_data,
			       resume ? p[i].r.ms_restore + p[i].r.ms_unlock : p[i].r.ms_lock + p[i].r.ms_checkpoint,
			       (double)p[i].r.bytes_moved / 1048576.0);
	}
	if (json_out) {
		json_t *j = json_pack("{s:s, s:i, s:b, s:s, s:{s:f, s:f, s:f}, s:{s:i, s:i, s:i}, s:{s:i, s:i}, s:o}",
				      "op", "scale", "replicas", replicas, "ok", rc == 0, "mode",
				      gcr_cr_mode_name(o->mode), "ms", "plan", ms_plan, "run", ms_run, "total", ms_total,
				      "after", "resident", resident, "suspended", suspended, "unmanaged", unmanaged,
				      "actions", "suspend", plan.to_suspend, "resume", plan.to_resume, "processes", procs);
		print_json(j);
		json_decref(j);
	} else {
		json_decref(procs);
		const char *what = plan.to_suspend > 0 ? "all suspended" : plan.to_resume > 0 ? "all resident" : "nothing to do";
		char extra[64] = "";
		if (unmanaged > 0)
			snprintf(extra, sizeof(extra), ", %d without a shim", unmanaged);
		printf("scale to %d: %d suspended, %d resumed%s; request to %s: %.1f ms (plan %.1f ms, run %.1f ms); "
		       "now %d resident, %d suspended%s\n",
		       replicas, plan.to_suspend, plan.to_resume, rc < 0 ? " (with failures)" : "", what, ms_total,
		       ms_plan, ms_run, resident, suspended, extra);
	}
	gcr_scale_procs_clear(p, (size_t)n);
	status = rc < 0 ? 1 : 0;
out:
	free(m);
	free(p);
	free(calls);
	free(ids);
	return status;
}

/* ---- images (docs/images.md) ---- */
static int do_image(const char *cmd, pid_t pid, const char *dir, int leave_running, int verify_first,
		    int container, struct gcr_cr_opts *o)
{
	/* --driver-only: the baseline (the driver's checkpoint plus CRIU alone); restore reads the
	 * mode from the image. */
	struct gcr_imgcr_opts io = { .cr = o, .leave_running = leave_running,
				     .driver_only = o->mode == GCR_CR_DRIVER_ONLY, .verify_first = verify_first,
				     .subreaper = 1, .whole_container = container };
	o->mode = GCR_CR_FULL;
	struct gcr_imgcr_result r;
	struct gcr_err err = { 0 };
	int ckpt = strcmp(cmd, "checkpoint") == 0;
	int rc = ckpt ? gcr_imgcr_checkpoint(pid, dir, &io, &r, &err) : gcr_imgcr_restore(dir, &io, &r, &err);
	if (rc < 0)
		return fail(cmd, ckpt ? pid : r.pid, &err);
	json_t *j = json_pack("{s:i, s:s, s:b, s:s, s:{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f},"
			      " s:{s:I, s:I, s:I, s:I, s:I}}",
			      "pid", (int)r.pid, "op", cmd, "ok", 1, "image", dir, "ms", "suspend", r.ms_suspend,
			      "write", r.ms_write, "dump", r.ms_dump, "manifest", r.ms_manifest, "verify", r.ms_verify,
			      "check", r.ms_check, "restore", r.ms_restore, "read", r.ms_read, "resume", r.ms_resume,
			      "total", r.ms_total,
			      "bytes", "gpu", (json_int_t)r.bytes, "written", (json_int_t)r.written, "zero",
			      (json_int_t)r.zero, "rss", (json_int_t)r.rss, "image", (json_int_t)r.image);
	if (json_out)
		print_json(j);
	else if (ckpt)
		printf("checkpoint %d: image %s in %.1f ms (suspend %.1f, write %.1f, dump %.1f, manifest %.1f ms), "
		       "%.1f MiB written, %.1f MiB zero, image %.1f MiB%s\n",
		       (int)r.pid, dir, r.ms_total, r.ms_suspend, r.ms_write, r.ms_dump, r.ms_manifest,
		       (double)r.written / 1048576.0, (double)r.zero / 1048576.0, (double)r.image / 1048576.0,
		       leave_running ? ", process running" : ", process ended");
	else
		printf("restore %d: from %s in %.1f ms (verify %.1f, GPU data check %.1f%s, criu %.1f, attach %.1f, "
		       "resume with the data %.1f ms)\n", (int)r.pid, dir, r.ms_total, r.ms_verify, r.ms_check,
		       verify_first ? "" : " beside criu", r.ms_restore, r.ms_read, r.ms_resume);
	json_decref(j);
	return 0;
}

/* resume --image: the GPU part of a restore the container runtime did (its CRIU restored the
 * container, the process waits at its shim's gate with its data in DIR/gpu). */
static int do_resume_restored(pid_t pid, const char *dir, struct gcr_cr_opts *o)
{
	struct gcr_imgcr_result r;
	struct gcr_err err = { 0 };
	if (gcr_imgcr_resume_restored(pid, dir, o, &r, &err) < 0)
		return fail("resume", pid, &err);
	json_t *j = json_pack("{s:i, s:s, s:b, s:s, s:{s:f, s:f, s:f}, s:{s:I}}", "pid", (int)pid, "op", "resume",
			      "ok", 1, "image", dir, "ms", "read", r.ms_read, "resume", r.ms_resume, "total",
			      r.ms_total, "bytes", "gpu", (json_int_t)r.bytes);
	if (json_out)
		print_json(j);
	else
		printf("resume %d: from %s in %.1f ms (attach %.1f, resume with the data %.1f ms), %.1f MiB\n",
		       (int)pid, dir, r.ms_total, r.ms_read, r.ms_resume, (double)r.bytes / 1048576.0);
	json_decref(j);
	return 0;
}

/* Whether this node can save AMD processes' control state: CRIU ($GCR_CRIU or on $PATH),
 * 4.0 or newer, with its amdgpu plugin ($CRIU_LIBS_DIR or /usr/lib/criu). */
static int do_criu(void)
{
	struct gcr_criu_info info;
	struct gcr_err err = { 0 };
	int rc = gcr_criu_check(NULL, &info, &err);
	if (json_out) {
		json_t *j = rc == 0 ? json_pack("{s:b, s:s, s:o, s:s}", "ok", 1, "criu", info.path, "version",
						json_sprintf("%d.%d.%d", info.major, info.minor, info.patch), "plugin",
						info.plugin)
				    : json_pack("{s:b, s:s, s:i}", "ok", 0, "error", err.msg, "code", rc);
		print_json(j);
		json_decref(j);
	} else if (rc == 0) {
		printf("criu %d.%d.%d at %s, amdgpu plugin %s\n", info.major, info.minor, info.patch, info.path,
		       info.plugin);
	}
	if (rc < 0)
		fprintf(stderr, "gcrctl: criu: %s\n", err.msg);
	return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	gcr_log_init(GCR_LOG_WARN);
	gcr_jsonbudget_install(); /* before any jansson call: tables and manifests parse within a budget */
	struct gcr_cr_opts o = { .socket_dir = getenv(GCR_SOCKET_DIR_ENV), .mode = GCR_CR_FULL,
				 .timeout_ms = 30000 };
	if (o.socket_dir == NULL)
		o.socket_dir = GCR_DEFAULT_SOCKET_DIR;
	static const struct option opts[] = {
		{ "socket-dir", required_argument, NULL, 's' }, { "json", no_argument, NULL, 'j' },
		{ "timeout-ms", required_argument, NULL, 't' }, { "driver-only", no_argument, NULL, 'D' },
		{ "no-driver", no_argument, NULL, 'N' },	 { "keep-context", no_argument, NULL, 'N' },
		{ "help", no_argument, NULL, 'h' },	 { "replicas", required_argument, NULL, 'r' },
		{ "sample-ms", required_argument, NULL, 'S' },	 { "images-dir", required_argument, NULL, 'I' },
		{ "version", no_argument, NULL, 'V' },	 { "unchecked", no_argument, NULL, 'U' },
		{ "image", required_argument, NULL, 'i' }, { "leave-running", no_argument, NULL, 'L' },
		{ "verify-first", no_argument, NULL, 'F' }, { "container", no_argument, NULL, 'C' },
		{ "gpu-pair", required_argument, NULL, 'P' },
		{ "group", required_argument, NULL, 'G' },
		{ "gpu", required_argument, NULL, 'g' },
		{ NULL, 0, NULL, 0 },
	};
	int ch, replicas = -1, sample_ms = 0, leave_running = 0, verify_first = 0, container = 0;
	const char *image = NULL, *group = NULL;
	/* GNU getopt permutes, so options may also follow the command. */
	static struct gcr_gpu_pair pairs[GCR_DRIVER_MAX_PAIRS];
	while ((ch = getopt_long(argc, argv, "s:jt:DNhVr:S:I:Ui:LFCP:G:g:", opts, NULL)) != -1) {
		switch (ch) {
		case 'G': group = optarg; break;
		case 's': o.socket_dir = optarg; break;
		case 'I': o.images_dir = optarg; break;
		case 'j': json_out = 1; break;
		case 't': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (*end != '\0' || v < 1 || v > 3600000) {
				fprintf(stderr, "gcrctl: --timeout-ms must be an integer in 1..3600000\n");
				return 2;
			}
			o.timeout_ms = (int)v;
			break;
		}
		case 'r':
		case 'S': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (*end != '\0' || end == optarg || v < 0 || v > (ch == 'r' ? 1000000 : 600000)) {
				fprintf(stderr, "gcrctl: --%s must be an integer in 0..%d\n",
					ch == 'r' ? "replicas" : "sample-ms", ch == 'r' ? 1000000 : 600000);
				return 2;
			}
			*(ch == 'r' ? &replicas : &sample_ms) = (int)v;
			break;
		}
		case 'D': o.mode = GCR_CR_DRIVER_ONLY; break;
		case 'U': o.unchecked = 1; break;
		case 'i': image = optarg; break;
		case 'L': leave_running = 1; break;
		case 'F': verify_first = 1; break;
		case 'C': container = 1; break;
		case 'P': {
			struct gcr_err perr = { 0 };
			if (o.ngpu_pairs == GCR_DRIVER_MAX_PAIRS) {
				fprintf(stderr, "gcrctl: at most %d --gpu-pair\n", GCR_DRIVER_MAX_PAIRS);
				return 2;
			}
			if (gcr_driver_parse_pair(optarg, &pairs[o.ngpu_pairs], &perr) < 0) {
				fprintf(stderr, "gcrctl: %s\n", perr.msg);
				return 2;
			}
			o.gpu_pairs = pairs;
			o.ngpu_pairs++;
			break;
		}
		case 'g':
			if (!gcr_uuid_valid(optarg)) {
				fprintf(stderr, "gcrctl: --gpu '%s': expected a GPU UUID (GPU-xxxxxxxx-...)\n", optarg);
				return 2;
			}
			o.target_gpu = optarg;
			break;
		case 'N': o.mode = GCR_CR_DATA_ONLY; break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("gcrctl %s\n", PACKAGE_VERSION); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind >= argc) {
		usage(stderr);
		return 2;
	}
	const char *cmd = argv[optind];
	pid_t pid = 0;
	if (group != NULL) {
		static pid_t gpids[GCR_GROUP_MAX_MEMBERS];
		size_t ng = 0;
		int is_scale = strcmp(cmd, "scale") == 0;
		if (strcmp(cmd, "suspend") != 0 && strcmp(cmd, "resume") != 0 && !is_scale) {
			fprintf(stderr, "gcrctl: --group goes with suspend, resume or scale\n");
			return 2;
		}
		if (parse_group(group, gpids, &ng) < 0 || optind + 1 != argc || image != NULL) {
			fprintf(stderr, "gcrctl: --group needs PID,PID,... (1 .. %d pids) and no PID after the command\n",
				GCR_GROUP_MAX_MEMBERS);
			return 2;
		}
		if (is_scale && replicas != 0 && replicas != 1) {
			fprintf(stderr, "gcrctl: scale --group takes --replicas 0 or 1 (the group is one replica)\n");
			return 2;
		}
		if (is_scale) {
			/* One replica: suspended unless it must be resident; nothing to do when it already is. */
			struct gcr_cr_proc_state ps;
			struct gcr_err se;
			int resident = gcr_cr_state(gpids[0], &o, &ps, &se) == 0 && ps.state == GCR_CR_ST_RUNNING;
			if (resident == (replicas == 1)) {
				printf("scale to %d: nothing to do\n", replicas);
				return 0;
			}
			return do_group(replicas == 0 ? "suspend" : "resume", gpids, ng, &o);
		}
		return do_group(cmd, gpids, ng, &o);
	}
	if (strcmp(cmd, "scale") == 0) {
		int n = argc - optind - 1;
		pid_t *pids = n > 0 ? calloc((size_t)n, sizeof(*pids)) : NULL;
		if (replicas < 0 || n <= 0 || pids == NULL) {
			fprintf(stderr, "gcrctl: scale needs --replicas N and at least one PID\n");
			free(pids);
			return 2;
		}
		for (int i = 0; i < n; i++) {
			if (parse_pid(argv[optind + 1 + i], &pids[i]) < 0) {
				fprintf(stderr, "gcrctl: scale: '%s' is not a PID\n", argv[optind + 1 + i]);
				free(pids);
				return 2;
			}
			for (int k = 0; k < i; k++)
				if (pids[k] == pids[i]) {
					fprintf(stderr, "gcrctl: scale: PID %d given twice\n", (int)pids[i]);
					free(pids);
					return 2;
				}
		}
		int rc = do_scale(replicas, sample_ms, pids, n, &o);
		free(pids);
		return rc;
	}
	if (strcmp(cmd, "checkpoint") == 0 || strcmp(cmd, "restore") == 0) {
		int ckpt = cmd[0] == 'c';
		if (image == NULL || optind + (ckpt ? 2 : 1) != argc ||
		    (ckpt && parse_pid(argv[optind + 1], &pid) < 0)) {
			fprintf(stderr, "gcrctl: %s needs --image DIR%s\n", cmd, ckpt ? " and one PID" : " and no PID");
			return 2;
		}
		return do_image(cmd, pid, image, leave_running, verify_first, container, &o);
	}
	if (strcmp(cmd, "hold-driver") == 0) {
		if (optind + 1 != argc) {
			fprintf(stderr, "gcrctl: hold-driver takes no argument\n");
			return 2;
		}
		return do_hold_driver();
	}
	int needs_pid = strcmp(cmd, "list") != 0 && strcmp(cmd, "criu") != 0;
	if (needs_pid && (optind + 2 != argc || parse_pid(argv[optind + 1], &pid) < 0)) {
		fprintf(stderr, "gcrctl: %s needs one PID (a positive integer)\n", cmd);
		return 2;
	}
	if (!needs_pid && optind + 1 != argc) {
		usage(stderr);
		return 2;
	}
	if (image != NULL && strcmp(cmd, "suspend") == 0) {
		if (o.mode != GCR_CR_FULL || image[0] != '/') {
			fprintf(stderr, "gcrctl: suspend --image needs an absolute DIR and the full mode\n");
			return 2;
		}
		o.image_dir = image;
	} else if (image != NULL && strcmp(cmd, "resume") == 0) {
		return do_resume_restored(pid, image, &o);
	} else if (image != NULL) {
		fprintf(stderr, "gcrctl: --image goes with checkpoint, restore, suspend or resume\n");
		return 2;
	}
	if (strcmp(cmd, "suspend") == 0 || strcmp(cmd, "resume") == 0)
		return do_cr(cmd, pid, &o);
	if (strcmp(cmd, "status") == 0)
		return do_status(pid, &o);
	if (strcmp(cmd, "stats") == 0)
		return do_stats(pid, &o);
	if (strcmp(cmd, "criu") == 0)
		return do_criu();
	if (strcmp(cmd, "list") == 0) {
		struct gcr_err err;
		if (gcr_client_list(o.socket_dir, list_one, &o, &err) < 0) {
			fprintf(stderr, "gcrctl: list: %s\n", err.msg);
			return 1;
		}
		return 0;
	}
	fprintf(stderr, "gcrctl: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
