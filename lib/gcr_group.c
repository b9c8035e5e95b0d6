/* gcr_group: the coordinator of a group suspend and resume. Each step runs in one thread per
 * member, every member at once, and ends when every member answered or its bound passed; the
 * next step starts only then. The coordinator keeps one connection to each member for the whole
 * operation: a member whose coordinator dies thaws by itself (shim_cr_abandon). Suspend:
 * status -> freeze -> (every communicator's ranks all in the group) -> drain to the largest
 * counts -> suspend (teardown, data, driver). Resume: resume (driver, data) -> ids -> rebuild ->
 * thaw. Undo: before the teardown, thaw; after it, resume whatever was suspended and rebuild. */
#include "gcr_group.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_client.h"
#include "gcr_groupmsg.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_shimreply.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* A reply comes within the shim's own bound plus this (ms): the reply itself, the poll loop. */
#define REPLY_SLACK_MS 2000
/* A status answers in microseconds; at most this, and never more than the operation's bound. */
#define STATUS_MS 10000

struct member {
	struct gcr_client c; /* the coordinator's connection: the member's hold ends with it */
	int open;
	int hung; /* a request to it timed out: not asked again in this operation */
	int active; /* takes part in the step being run */
	enum gcr_shimreply_st st;
	struct gcr_group_comms comms;
	struct gcr_group_keys keys; /* ids: the communicators whose rank 0 it holds */
};

struct grp {
	const struct gcr_group_opts *o;
	struct gcr_group_result *r;
	struct member *mm;
	size_t n;
	struct gcr_group_targets targets;
	struct gcr_group_ids ids;
	struct gcr_group_keys failed;
};

typedef int (*step_fn)(struct grp *g, size_t i, struct gcr_err *err);

/* Whether pid has ended (gone, or a zombie nobody reaped yet). */
static int proc_gone(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return 1;
	size_t got = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[got] = '\0';
	const char *p = strrchr(buf, ')');
	return p == NULL || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X';
}

/* A test hook (tests/flow/test_nccl.py): with GCR_GROUP_TEST_PAUSE=STEP the coordinator stops
 * after that step, says so on stderr and goes on at the next line on stdin (at most 120 s), so
 * a test can kill or stop a member at a known point of the operation. */
static void pause_after(const char *step)
{
	const char *want = getenv("GCR_GROUP_TEST_PAUSE");
	if (want == NULL || strcmp(want, step) != 0)
		return;
	fprintf(stderr, "gcr_group: paused after %s\n", step);
	fflush(stderr);
	struct pollfd p = { .fd = 0, .events = POLLIN };
	char line[64];
	if (poll(&p, 1, 120000) == 1 && fgets(line, sizeof(line), stdin) == NULL)
		GCR_LOG(GCR_LOG_WARN, "gcr_group", "test pause: stdin closed");
}

/* ---- steps: one thread per active member ---- */

struct step_arg {
	struct grp *g;
	size_t i;
	step_fn fn;
	const char *name;
	double *ms;
};

static void *step_thread(void *p)
{
	struct step_arg *a = p;
	struct gcr_group_member *m = &a->g->r->m[a->i];
	struct gcr_err e = { 0 };
	double t = gcr_time_mono_ms();
	int rc = a->fn(a->g, a->i, &e);
	if (a->ms != NULL)
		*a->ms = gcr_time_mono_ms() - t;
	if (rc < 0 && m->rc == 0) {
		m->rc = rc;
		m->err = e;
		m->step = a->name;
	}
	if (rc < 0 && proc_gone(m->pid))
		m->gone = 1;
	return NULL;
}

/* Runs fn for every active member at once; returns how many failed. ms: the step's wall time;
 * member_ms: the offset of each member's own time in struct gcr_group_member, or -1. */
static int run_step(struct grp *g, const char *name, step_fn fn, double *ms, long member_ms)
{
	pthread_t th[GCR_GROUP_MAX_MEMBERS];
	struct step_arg args[GCR_GROUP_MAX_MEMBERS];
	int started[GCR_GROUP_MAX_MEMBERS] = { 0 };
	int before[GCR_GROUP_MAX_MEMBERS];
	double t = gcr_time_mono_ms();
	for (size_t i = 0; i < g->n; i++) {
		before[i] = g->r->m[i].rc;
		if (!g->mm[i].active)
			continue;
		double *own = member_ms >= 0 ? (double *)(void *)((char *)&g->r->m[i] + member_ms) : NULL;
		args[i] = (struct step_arg){ .g = g, .i = i, .fn = fn, .name = name, .ms = own };
		started[i] = pthread_create(&th[i], NULL, step_thread, &args[i]) == 0;
		if (!started[i])
			step_thread(&args[i]); /* no thread to be had: this one, in turn */
	}
	for (size_t i = 0; i < g->n; i++)
		if (started[i])
			pthread_join(th[i], NULL);
	if (ms != NULL)
		*ms = gcr_time_mono_ms() - t;
	int failed = 0;
	for (size_t i = 0; i < g->n; i++)
		failed += g->mm[i].active && g->r->m[i].rc < 0 && before[i] == 0;
	return failed;
}

static void activate(struct grp *g, int (*pick)(struct grp *g, size_t i))
{
	for (size_t i = 0; i < g->n; i++)
		g->mm[i].active = pick(g, i);
}

static int pick_live(struct grp *g, size_t i)
{
	return !g->r->m[i].gone && g->mm[i].open;
}

/* The first member that failed, for the message; NULL if none. */
static struct gcr_group_member *first_failed(struct grp *g)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->r->m[i].rc < 0)
			return &g->r->m[i];
	return NULL;
}

/* One request to member i on the coordinator's connection, bounded. */
static int call(struct grp *g, size_t i, enum gcr_op op, json_t *args, int timeout_ms, json_t **reply,
		struct gcr_err *err)
{
	struct member *mm = &g->mm[i];
	*reply = NULL;
	if (!mm->open) {
		json_decref(args);
		return gcr_err_set(err, -ENOTCONN, "no connection to pid %d's shim", (int)g->r->m[i].pid);
	}
	int rc = gcr_client_call(&mm->c, op, args, timeout_ms, reply, err);
	/* A connection that failed (not an error reply): closed, the member's hold with it. */
	if (rc == -ETIMEDOUT || rc == -EPIPE || rc == -ECONNRESET || rc == -EIO || rc == -ENOTCONN || rc == -EPROTO) {
		gcr_client_close(&mm->c);
		mm->open = 0;
		mm->hung |= rc == -ETIMEDOUT;
	}
	return rc;
}

static void note_state(struct grp *g, size_t i, json_t *reply)
{
	const char *s;
	struct gcr_err e;
	if (gcr_shimreply_state(reply, &s, &e) == 0) {
		g->mm[i].st = gcr_shimreply_st_of(s);
		g->r->m[i].state = gcr_shimreply_st_name(g->mm[i].st);
	}
}

static void note_comms(struct grp *g, size_t i, json_t *reply)
{
	struct gcr_err e;
	int rc = gcr_shimreply_comms(reply, &g->mm[i].comms, &e);
	if (rc == -EPROTO)
		GCR_LOG(GCR_LOG_WARN, "gcr_group", "pid %d: %s", (int)g->r->m[i].pid, e.msg);
	g->r->m[i].comms = (int)g->mm[i].comms.n;
}

static int status_ms(const struct grp *g)
{
	return g->o->timeout_ms < STATUS_MS ? g->o->timeout_ms : STATUS_MS;
}

static int st_status(struct grp *g, size_t i, struct gcr_err *err)
{
	json_t *reply = NULL;
	int rc = call(g, i, GCR_OP_STATUS_ID, NULL, status_ms(g), &reply, err);
	if (rc == 0) {
		note_state(g, i, reply);
		note_comms(g, i, reply);
		int hip = 0;
		struct gcr_err e;
		if (gcr_shimreply_is_hip(reply, &hip, &e) == 0 && hip)
			rc = gcr_err_set(err, -ENOTSUP, "a HIP process: groups are NCCL's (CUDA) only");
	}
	json_decref(reply);
	return rc;
}

static int st_freeze(struct grp *g, size_t i, struct gcr_err *err)
{
	long long hold = 2LL * g->o->timeout_ms + 10000;
	if (hold > GCR_GROUP_MAX_MS)
		hold = GCR_GROUP_MAX_MS;
	int wait = g->o->timeout_ms < GCR_GROUP_WAIT_MS ? g->o->timeout_ms : GCR_GROUP_WAIT_MS;
	json_t *reply = NULL, *args = json_pack("{s:I, s:i}", "hold_ms", (json_int_t)hold, "wait_ms", wait);
	int rc = call(g, i, GCR_OP_FREEZE_ID, args, wait + REPLY_SLACK_MS, &reply, err);
	if (rc == 0) {
		note_state(g, i, reply);
		struct gcr_err e;
		if (gcr_shimreply_comms(reply, &g->mm[i].comms, &e) == -EPROTO)
			rc = gcr_err_set(err, -EPROTO, "its freeze reply: %s", e.msg);
		g->r->m[i].comms = (int)g->mm[i].comms.n;
	}
	json_decref(reply);
	return rc;
}

/* Whether member i holds communicator key. */
static int holds(const struct grp *g, size_t i, uint64_t key)
{
	for (size_t q = 0; q < g->mm[i].comms.n; q++)
		if (g->mm[i].comms.c[q].key == key)
			return 1;
	return 0;
}

/* A live member other than i whose drain request is still unanswered, or g->n. */
static size_t silent(struct grp *g, const long long *pending, size_t i)
{
	for (size_t j = 0; j < g->n; j++)
		if (j != i && pending[j] != 0 && pick_live(g, j))
			return j;
	return g->n;
}

/* The drain, every member at once and asynchronously: a member that answers "frozen" with wants
 * (a thread waits at a communicator at its target while another is below its own) gets those
 * targets raised in every member that holds them, each of which drains again; done when every
 * member answered "drained" to the targets as they end, or the bound passed. Requests go out
 * while others are in flight, so no member waits for another's round. */
static int drain_loop(struct grp *g, struct gcr_err *err)
{
	double t0 = gcr_time_mono_ms(), deadline = t0 + g->o->timeout_ms;
	long long pending[GCR_GROUP_MAX_MEMBERS] = { 0 };
	int resend[GCR_GROUP_MAX_MEMBERS], done[GCR_GROUP_MAX_MEMBERS] = { 0 };
	struct gcr_linebuf lb[GCR_GROUP_MAX_MEMBERS];
	int rc = 0, rounds = 0;
	for (size_t i = 0; i < g->n; i++) {
		resend[i] = pick_live(g, i);
		gcr_linebuf_init(&lb[i], GCR_PROTO_MAX_LINE);
	}
	for (;;) {
		int left = (int)(deadline - gcr_time_mono_ms()), all = 1;
		for (size_t i = 0; i < g->n && rc == 0; i++) {
			if (!resend[i] || pending[i] != 0)
				continue;
			json_t *args = json_pack("{s:o, s:i}", "targets", gcr_groupmsg_targets_json(&g->targets), "timeout_ms",
						 left > 1 ? left : 1);
			long long id = g->mm[i].c.next_id++;
			char *line = gcr_proto_request_line(id, GCR_OP_DRAIN_ID, args);
			struct gcr_err e;
			if (line == NULL || gcr_sock_write_all(g->mm[i].c.fd, line, strlen(line), 1000, &e) < 0) {
				rc = gcr_err_set(err, -EIO, "pid %d: drain: cannot send the request", (int)g->r->m[i].pid);
				g->r->m[i].rc = rc;
				g->r->m[i].err = *err;
				g->r->m[i].step = "drain";
			}
			free(line);
			pending[i] = id;
			resend[i] = done[i] = 0;
			rounds++;
		}
		for (size_t i = 0; i < g->n; i++)
			if (pick_live(g, i) && (!done[i] || pending[i] != 0))
				all = 0;
		if (rc < 0 || all)
			break;
		struct pollfd pfd[GCR_GROUP_MAX_MEMBERS];
		size_t who[GCR_GROUP_MAX_MEMBERS], np = 0;
		for (size_t i = 0; i < g->n; i++)
			if (pending[i] != 0) {
				pfd[np] = (struct pollfd){ .fd = g->mm[i].c.fd, .events = POLLIN };
				who[np++] = i;
			}
		left = (int)(deadline + REPLY_SLACK_MS - gcr_time_mono_ms());
		if (np == 0 || left <= 0 || poll(pfd, np, left) <= 0) {
			for (size_t i = 0; i < g->n; i++)
				if (pick_live(g, i) && !done[i]) {
					rc = gcr_err_set(err, -ETIMEDOUT, "pid %d: drain: the group's targets not reached in %d ms",
							 (int)g->r->m[i].pid, g->o->timeout_ms);
					g->r->m[i].rc = rc;
					g->r->m[i].err = *err;
					g->r->m[i].step = "drain";
					break;
				}
			break;
		}
		for (size_t k = 0; k < np && rc == 0; k++) {
			size_t i = who[k];
			char *line;
			struct gcr_err e;
			struct gcr_reply rep = { 0 };
			if (pfd[k].revents == 0)
				continue;
			int r = gcr_linebuf_read(&lb[i], g->mm[i].c.fd, 0, &line, &e);
			if (r == -ETIMEDOUT)
				continue; /* part of the line so far */
			if (r == 0)
				r = gcr_proto_parse_reply(line, &rep, &e);
			if (r == 0 && rep.id != pending[i])
				r = gcr_err_set(&e, -EPROTO, "a reply to request %lld, not %lld", rep.id, pending[i]);
			if (r == 0 && !rep.ok)
				r = gcr_err_set(&e, rep.code, "%s", rep.message);
			pending[i] = 0;
			if (r < 0) {
				g->r->m[i].rc = r;
				g->r->m[i].err = e;
				g->r->m[i].step = "drain";
				g->r->m[i].gone = proc_gone(g->r->m[i].pid);
				g->mm[i].st = GCR_SHIMREPLY_ST_RUNNING; /* a failed drain thaws the member */
				size_t s = silent(g, pending, i);
				if (r == -ETIMEDOUT && s < g->n) { /* its collective waited for one that never answered */
					rc = gcr_err_set(err, r, "pid %d: drain: no answer when pid %d's drain gave up (stopped "
							 "or hung?); pid %d: %s", (int)g->r->m[s].pid, (int)g->r->m[i].pid,
							 (int)g->r->m[i].pid, e.msg);
					g->r->m[s].rc = rc;
					g->r->m[s].err = *err;
					g->r->m[s].step = "drain";
				} else {
					rc = gcr_err_set(err, r, "pid %d: drain: %s", (int)g->r->m[i].pid, e.msg);
				}
				gcr_reply_clear(&rep);
				break;
			}
			note_state(g, i, rep.result);
			json_t *w = json_object_get(rep.result, "wants");
			if (w == NULL) {
				done[i] = 1;
				g->r->m[i].ms_drain = gcr_time_mono_ms() - t0;
				gcr_reply_clear(&rep);
				continue;
			}
			struct gcr_group_targets *wants = malloc(sizeof(*wants));
			if (wants == NULL || gcr_groupmsg_targets(w, wants, &e) < 0) {
				rc = gcr_err_set(err, -EPROTO, "pid %d: drain: its wants: %s", (int)g->r->m[i].pid,
						 wants == NULL ? "out of memory" : e.msg);
				free(wants);
				gcr_reply_clear(&rep);
				break;
			}
			/* One further on each, for every member that holds it; a want already met (an
			 * answer to older targets) just drains again. */
			resend[i] = 1;
			for (size_t q = 0; q < wants->n; q++)
				for (size_t t = 0; t < g->targets.n; t++) {
					if (g->targets.t[t].key != wants->t[q].key || g->targets.t[t].count > wants->t[q].count)
						continue;
					g->targets.t[t].count = wants->t[q].count + 1;
					for (size_t j = 0; j < g->n; j++)
						if (pick_live(g, j) && holds(g, j, wants->t[q].key))
							resend[j] = 1, done[j] = 0;
				}
			free(wants);
			gcr_reply_clear(&rep);
		}
		if (rc < 0)
			break;
	}
	for (size_t i = 0; i < g->n; i++) {
		gcr_linebuf_free(&lb[i]);
		if (pending[i] != 0) {
			/* Its answer is not waited for: the connection goes, and the member thaws by
			 * itself when its drain ends. */
			gcr_client_close(&g->mm[i].c);
			g->mm[i].open = 0;
			g->mm[i].st = GCR_SHIMREPLY_ST_RUNNING;
		}
	}
	g->r->ms_drain = gcr_time_mono_ms() - t0;
	GCR_LOG(GCR_LOG_DEBUG, "gcr_group", "drain: %d requests in %.1f ms", rounds, g->r->ms_drain);
	return rc;
}

static int st_thaw(struct grp *g, size_t i, struct gcr_err *err)
{
	json_t *reply = NULL;
	int rc = call(g, i, GCR_OP_THAW_ID, NULL, status_ms(g), &reply, err);
	if (rc == 0)
		note_state(g, i, reply);
	json_decref(reply);
	return rc;
}

static int st_detach(struct grp *g, size_t i, struct gcr_err *err)
{
	json_t *reply = NULL;
	int rc = call(g, i, GCR_OP_DETACH_ID, NULL, g->o->timeout_ms + REPLY_SLACK_MS, &reply, err);
	if (rc == 0)
		note_state(g, i, reply);
	json_decref(reply);
	return rc;
}

static int st_ids(struct grp *g, size_t i, struct gcr_err *err)
{
	json_t *reply = NULL, *args = json_pack("{s:o}", "keys", gcr_groupmsg_keys_json(&g->mm[i].keys));
	int rc = call(g, i, GCR_OP_IDS_ID, args, status_ms(g) + REPLY_SLACK_MS, &reply, err);
	struct gcr_group_ids *got = rc == 0 ? malloc(sizeof(*got)) : NULL;
	struct gcr_err e;
	if (rc == 0 && got == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
	if (rc == 0 && gcr_groupmsg_ids(json_object_get(reply, "ids"), got, &e) < 0)
		rc = gcr_err_set(err, -EPROTO, "its ids reply: %s", e.msg);
	/* Exactly the keys asked for, each once. */
	for (size_t k = 0; rc == 0 && k < g->mm[i].keys.n; k++) {
		size_t q = 0;
		while (q < got->n && got->v[q].key != g->mm[i].keys.key[k])
			q++;
		if (q == got->n || got->n != g->mm[i].keys.n)
			rc = gcr_err_set(err, -EPROTO, "its ids reply does not answer the keys asked");
	}
	if (rc == 0) {
		/* Each member writes its own keys' slots: the keys of two members never overlap. */
		for (size_t q = 0; q < got->n; q++)
			for (size_t k = 0; k < g->ids.n; k++)
				if (g->ids.v[k].key == got->v[q].key)
					memcpy(g->ids.v[k].id, got->v[q].id, GCR_GROUP_ID_BYTES);
	}
	free(got);
	json_decref(reply);
	return rc;
}

static int st_rebuild(struct grp *g, size_t i, struct gcr_err *err)
{
	json_t *reply = NULL, *args = json_pack("{s:o, s:o, s:i}", "ids", gcr_groupmsg_ids_json(&g->ids), "failed",
					       gcr_groupmsg_keys_json(&g->failed), "timeout_ms", g->o->timeout_ms);
	int rc = call(g, i, GCR_OP_REBUILD_ID, args, g->o->timeout_ms + REPLY_SLACK_MS, &reply, err);
	if (rc == 0)
		note_state(g, i, reply);
	json_decref(reply);
	return rc;
}

static struct gcr_cr_opts cr_opts(const struct grp *g, enum gcr_cr_mode mode)
{
	return (struct gcr_cr_opts){ .socket_dir = g->o->socket_dir, .mode = mode, .timeout_ms = g->o->timeout_ms,
				     .unchecked = g->o->unchecked, .group = mode != GCR_CR_DRIVER_ONLY };
}

static int st_suspend(struct grp *g, size_t i, struct gcr_err *err)
{
	struct gcr_cr_opts o = cr_opts(g, g->o->mode);
	gcr_cr_result_clear(&g->r->m[i].cr);
	return gcr_cr_suspend(g->r->m[i].pid, &o, &g->r->m[i].cr, err);
}

static int st_resume(struct grp *g, size_t i, struct gcr_err *err)
{
	struct gcr_cr_opts o = cr_opts(g, g->o->mode);
	gcr_cr_result_clear(&g->r->m[i].cr);
	return gcr_cr_resume(g->r->m[i].pid, &o, &g->r->m[i].cr, err);
}

/* ---- the group's view of its communicators ---- */

struct keyinfo {
	uint64_t key;
	int nranks, seen;
	enum gcr_group_how how;
	int root; /* the member holding rank 0, or -1 */
	unsigned char *has; /* nranks flags */
	int twice;
};

/* Gathers every member's communicators; NULL + err on a rank given twice or sizes that differ. */
static struct keyinfo *gather(struct grp *g, size_t *nk, struct gcr_err *err)
{
	size_t cap = 0;
	for (size_t i = 0; i < g->n; i++)
		cap += g->r->m[i].gone ? 0 : g->mm[i].comms.n;
	struct keyinfo *ks = calloc(cap + 1, sizeof(*ks));
	size_t n = 0;
	if (ks == NULL) {
		gcr_err_set(err, -ENOMEM, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < g->n; i++) {
		if (g->r->m[i].gone)
			continue;
		for (size_t q = 0; q < g->mm[i].comms.n; q++) {
			const struct gcr_group_comm *c = &g->mm[i].comms.c[q];
			size_t k = 0;
			while (k < n && ks[k].key != c->key)
				k++;
			if (k == n) {
				ks[n] = (struct keyinfo){ .key = c->key, .nranks = c->nranks, .how = c->how, .root = -1,
							  .has = calloc((size_t)c->nranks, 1) };
				if (ks[n].has == NULL) {
					gcr_err_set(err, -ENOMEM, "out of memory");
					goto fail;
				}
				n++;
			}
			char kx[GCR_GROUP_KEY_LEN];
			gcr_groupmsg_key_fmt(c->key, kx);
			if (ks[k].nranks != c->nranks) {
				gcr_err_set(err, -EPROTO, "communicator %s: pid %d says %d ranks, another member %d", kx,
					    (int)g->r->m[i].pid, c->nranks, ks[k].nranks);
				goto fail;
			}
			if (ks[k].has[c->rank]) {
				gcr_err_set(err, -EPROTO, "communicator %s: rank %d is claimed by two members (pid %d and "
					    "another)", kx, c->rank, (int)g->r->m[i].pid);
				goto fail;
			}
			ks[k].has[c->rank] = 1;
			ks[k].seen++;
			if (c->rank == 0)
				ks[k].root = (int)i;
		}
	}
	*nk = n;
	return ks;
fail:
	for (size_t k = 0; k < n; k++)
		free(ks[k].has);
	free(ks);
	return NULL;
}

static void gather_free(struct keyinfo *ks, size_t n)
{
	for (size_t k = 0; ks != NULL && k < n; k++)
		free(ks[k].has);
	free(ks);
}

/* Every communicator's every rank must be a member: a rank elsewhere would be left waiting. */
static int complete(struct grp *g, struct gcr_err *err)
{
	size_t nk = 0;
	struct keyinfo *ks = gather(g, &nk, err);
	if (ks == NULL)
		return err->code;
	int rc = 0;
	g->r->comms = (int)nk;
	for (size_t k = 0; k < nk && rc == 0; k++) {
		if (ks[k].seen == ks[k].nranks)
			continue;
		char kx[GCR_GROUP_KEY_LEN];
		gcr_groupmsg_key_fmt(ks[k].key, kx);
		int miss = 0;
		while (miss < ks[k].nranks && ks[k].has[miss])
			miss++;
		rc = gcr_err_set(err, -EINVAL, "communicator %s has %d ranks, %d of them in this group (rank %d is in "
				 "another process): name every process of the NCCL group", kx, ks[k].nranks, ks[k].seen,
				 miss);
	}
	gather_free(ks, nk);
	return rc;
}

/* The drain's targets: each communicator's largest count in any member. */
static int targets(struct grp *g, struct gcr_err *err)
{
	g->targets.n = 0;
	for (size_t i = 0; i < g->n; i++)
		for (size_t q = 0; q < g->mm[i].comms.n; q++) {
			const struct gcr_group_comm *c = &g->mm[i].comms.c[q];
			size_t k = 0;
			while (k < g->targets.n && g->targets.t[k].key != c->key)
				k++;
			if (k == g->targets.n) {
				if (g->targets.n == GCR_GROUP_MAX_COMMS)
					return gcr_err_set(err, -E2BIG, "more than %d communicators in the group",
							   GCR_GROUP_MAX_COMMS);
				g->targets.t[g->targets.n++] = (struct gcr_group_target){ c->key, c->count };
			} else if (c->count > g->targets.t[k].count) {
				g->targets.t[k].count = c->count;
			}
		}
	return 0;
}

static int pick_held(struct grp *g, size_t i)
{
	enum gcr_shimreply_st s = g->mm[i].st;
	return pick_live(g, i) && (s == GCR_SHIMREPLY_ST_FROZEN || s == GCR_SHIMREPLY_ST_DRAINED || s == GCR_SHIMREPLY_ST_REBUILT);
}

static void thaw_all(struct grp *g)
{
	activate(g, pick_held);
	(void)run_step(g, "thaw", st_thaw, &g->r->ms_thaw, offsetof(struct gcr_group_member, ms_thaw));
}

static int pick_all_live(struct grp *g, size_t i)
{
	return pick_live(g, i);
}

static int pick_suspended(struct grp *g, size_t i)
{
	return !g->r->m[i].gone && g->mm[i].st == GCR_SHIMREPLY_ST_SUSPENDED;
}

static int pick_to_detach(struct grp *g, size_t i)
{
	enum gcr_shimreply_st s = g->mm[i].st;
	return pick_live(g, i) && (s == GCR_SHIMREPLY_ST_DRAINED || s == GCR_SHIMREPLY_ST_REBUILT);
}

static int pick_detached(struct grp *g, size_t i)
{
	return pick_live(g, i) && g->mm[i].st == GCR_SHIMREPLY_ST_DETACHED;
}

static int pick_rebuilt(struct grp *g, size_t i)
{
	return pick_live(g, i) && g->mm[i].st == GCR_SHIMREPLY_ST_REBUILT;
}

static int pick_ids(struct grp *g, size_t i)
{
	return pick_detached(g, i) && g->mm[i].keys.n > 0;
}

/* Reads every live member's state and communicators again (a step's error may leave any). */
static void refresh(struct grp *g)
{
	for (size_t i = 0; i < g->n; i++) {
		if (!g->mm[i].open && !g->mm[i].hung && !g->r->m[i].gone && !proc_gone(g->r->m[i].pid)) {
			struct gcr_err e;
			g->mm[i].open = gcr_client_open(&g->mm[i].c, g->o->socket_dir, g->r->m[i].pid, &e) == 0;
		}
		if (proc_gone(g->r->m[i].pid))
			g->r->m[i].gone = 1;
	}
	activate(g, pick_all_live);
	struct gcr_group_member saved[GCR_GROUP_MAX_MEMBERS];
	memcpy(saved, g->r->m, g->n * sizeof(saved[0]));
	(void)run_step(g, "status", st_status, NULL, -1);
	for (size_t i = 0; i < g->n; i++) { /* a status failing here does not overwrite the first error */
		g->r->m[i].rc = saved[i].rc;
		g->r->m[i].err = saved[i].err;
		g->r->m[i].step = saved[i].step;
	}
}

/* Makes every detached member's communicators again (those with a rank in a member that is gone
 * are marked failed), then lets their calls go. 0, or -errno with err set (members detached). */
static int rebuild_all(struct grp *g, struct gcr_err *err)
{
	activate(g, pick_to_detach);
	if (run_step(g, "detach", st_detach, NULL, -1) > 0)
		return gcr_err_set(err, -EIO, "tearing down the communicators of a member failed");
	size_t nk = 0;
	struct keyinfo *ks = gather(g, &nk, err);
	if (ks == NULL)
		return err->code;
	int any_gone = 0, rc = 0;
	for (size_t i = 0; i < g->n; i++)
		any_gone |= g->r->m[i].gone;
	g->failed.n = 0;
	g->ids.n = 0;
	for (size_t i = 0; i < g->n; i++)
		g->mm[i].keys.n = 0;
	for (size_t k = 0; k < nk && rc == 0; k++) {
		char kx[GCR_GROUP_KEY_LEN];
		gcr_groupmsg_key_fmt(ks[k].key, kx);
		if (ks[k].seen < ks[k].nranks) {
			if (!any_gone) {
				rc = gcr_err_set(err, -EINVAL, "communicator %s: %d of its %d ranks in this group: name every "
						 "process of the NCCL group", kx, ks[k].seen, ks[k].nranks);
				break;
			}
			if (g->failed.n < GCR_GROUP_MAX_COMMS)
				g->failed.key[g->failed.n++] = ks[k].key;
			continue;
		}
		if (ks[k].how != GCR_GROUP_HOW_INIT)
			continue;
		struct member *root = &g->mm[ks[k].root];
		if (root->keys.n < GCR_GROUP_MAX_COMMS && g->ids.n < GCR_GROUP_MAX_COMMS) {
			root->keys.key[root->keys.n++] = ks[k].key;
			g->ids.v[g->ids.n].key = ks[k].key;
			memset(g->ids.v[g->ids.n].id, 0, GCR_GROUP_ID_BYTES);
			g->ids.n++;
		}
	}
	g->r->failed_comms = (int)g->failed.n;
	if (g->r->comms == 0)
		g->r->comms = (int)nk;
	gather_free(ks, nk);
	if (rc < 0)
		return rc;
	activate(g, pick_ids);
	if (run_step(g, "ids", st_ids, &g->r->ms_ids, offsetof(struct gcr_group_member, ms_ids)) > 0) {
		struct gcr_group_member *m = first_failed(g);
		return gcr_err_set(err, m->rc, "pid %d: ids: %s; group detached (communicators down, NCCL calls held): "
				   "retry gcrctl resume --group", (int)m->pid, m->err.msg);
	}
	pause_after("ids");
	activate(g, pick_detached);
	if (run_step(g, "rebuild", st_rebuild, &g->r->ms_rebuild, offsetof(struct gcr_group_member, ms_rebuild)) > 0) {
		struct gcr_group_member *m = first_failed(g);
		char first[GCR_ERR_MSG_MAX];
		snprintf(first, sizeof(first), "pid %d: rebuild: %.200s", (int)m->pid, m->err.msg);
		/* One made them, another did not: all down again, so a retry starts level. */
		refresh(g);
		activate(g, pick_rebuilt);
		(void)run_step(g, "detach", st_detach, NULL, -1);
		return gcr_err_set(err, m->rc, "%s; group detached (communicators down, NCCL calls held): retry "
				   "gcrctl resume --group", first);
	}
	pause_after("rebuild");
	activate(g, pick_rebuilt);
	(void)run_step(g, "thaw", st_thaw, &g->r->ms_thaw, offsetof(struct gcr_group_member, ms_thaw));
	return 0;
}

/* ---- the whole operation ---- */

static int setup(struct grp *g, const pid_t *pids, size_t n, const struct gcr_group_opts *o,
		 struct gcr_group_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	memset(g, 0, sizeof(*g));
	g->o = o;
	g->r = r;
	if (n == 0 || n > GCR_GROUP_MAX_MEMBERS)
		return gcr_err_set(err, -EINVAL, "a group has 1 .. %d members, not %zu", GCR_GROUP_MAX_MEMBERS, n);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < i; k++)
			if (pids[k] == pids[i])
				return gcr_err_set(err, -EINVAL, "pid %d is given twice", (int)pids[i]);
	g->mm = calloc(n, sizeof(*g->mm));
	if (g->mm == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory for a group of %zu", n);
	g->n = r->n = n;
	for (size_t i = 0; i < n; i++) {
		r->m[i].pid = pids[i];
		r->m[i].state = "unknown";
		g->mm[i].c.fd = -1;
		g->mm[i].st = GCR_SHIMREPLY_ST_UNKNOWN;
	}
	return 0;
}

static void teardown_grp(struct grp *g)
{
	for (size_t i = 0; g->mm != NULL && i < g->n; i++)
		if (g->mm[i].open)
			gcr_client_close(&g->mm[i].c);
	free(g->mm);
	g->mm = NULL;
}

static void totals(struct grp *g, double t0)
{
	g->r->ms_total = gcr_time_mono_ms() - t0;
	for (size_t i = 0; i < g->n; i++) {
		g->r->bytes_moved += g->r->m[i].cr.bytes_moved;
		g->r->bytes_total += g->r->m[i].cr.bytes_total;
	}
}

/* Connects to every member (the process must exist and have a shim); gone ones are marked. */
static int open_all(struct grp *g, int gone_ok, struct gcr_err *err)
{
	for (size_t i = 0; i < g->n; i++) {
		struct gcr_group_member *m = &g->r->m[i];
		int rc = gcr_client_open(&g->mm[i].c, g->o->socket_dir, m->pid, &m->err);
		if (rc == 0) {
			g->mm[i].open = 1;
			continue;
		}
		m->rc = rc;
		m->step = "connect";
		m->gone = proc_gone(m->pid);
		if (!(gone_ok && m->gone))
			return gcr_err_set(err, rc, "pid %d: %s; nothing touched", (int)m->pid, m->err.msg);
	}
	return 0;
}

static int pick_all_true(struct grp *g, size_t i)
{
	(void)g;
	(void)i;
	return 1;
}

/* The driver's checkpoint alone on every member at once (the benchmarks' baseline): bounded by
 * the lock's timeout; a member whose lock or checkpoint fails gets the others undone. */
static int driver_only(struct grp *g, int resume, double t0, struct gcr_err *err)
{
	activate(g, pick_all_true);
	int failed = run_step(g, resume ? "resume" : "suspend", resume ? st_resume : st_suspend, &g->r->ms_cr,
			      offsetof(struct gcr_group_member, ms_cr));
	int rc = 0;
	if (failed > 0) {
		struct gcr_group_member *m = first_failed(g);
		char first[GCR_ERR_MSG_MAX];
		snprintf(first, sizeof(first), "pid %d: %s (driver only): %.200s", (int)m->pid, resume ? "resume" : "suspend",
			 m->err.msg);
		rc = m->rc;
		if (!resume) {
			/* The members it did checkpoint come back. */
			for (size_t i = 0; i < g->n; i++)
				g->mm[i].active = g->r->m[i].rc == 0;
			struct gcr_group_member keep[GCR_GROUP_MAX_MEMBERS];
			memcpy(keep, g->r->m, g->n * sizeof(keep[0]));
			int undo_failed = run_step(g, "undo", st_resume, NULL, -1);
			for (size_t i = 0; i < g->n; i++)
				if (keep[i].rc < 0) {
					g->r->m[i].rc = keep[i].rc;
					g->r->m[i].err = keep[i].err;
					g->r->m[i].step = keep[i].step;
				}
			g->r->rolled_back = 1;
			gcr_err_set(err, rc, "%s; %s", first, undo_failed ? "restoring the others failed too: gcrctl resume "
					"--group --driver-only retries" : "the others restored, group running");
		} else {
			gcr_err_set(err, rc, "%s", first);
		}
	}
	totals(g, t0);
	return rc;
}

int gcr_group_suspend(const pid_t *pids, size_t n, const struct gcr_group_opts *o, struct gcr_group_result *r,
		      struct gcr_err *err)
{
	struct grp g;
	double t0 = gcr_time_mono_ms();
	int rc = setup(&g, pids, n, o, r, err);
	if (rc < 0)
		return rc;
	if (o->mode == GCR_CR_DRIVER_ONLY) {
		rc = driver_only(&g, 0, t0, err);
		teardown_grp(&g);
		return rc;
	}
	rc = open_all(&g, 0, err);
	if (rc < 0)
		goto out;
	activate(&g, pick_all_live);
	if (run_step(&g, "status", st_status, NULL, -1) > 0) {
		struct gcr_group_member *m = first_failed(&g);
		rc = gcr_err_set(err, m->rc, "pid %d: %s; nothing touched", (int)m->pid, m->err.msg);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (g.mm[i].st != GCR_SHIMREPLY_ST_RUNNING) {
			rc = gcr_err_set(err, -EALREADY, "pid %d is not running (shim state %s); nothing touched", (int)pids[i],
					 gcr_shimreply_st_name(g.mm[i].st));
			goto out;
		}
	/* 1. Freeze: no member submits anything new; each reports how far each communicator went. */
	if (run_step(&g, "freeze", st_freeze, &r->ms_freeze, offsetof(struct gcr_group_member, ms_freeze)) > 0) {
		struct gcr_group_member *m = first_failed(&g);
		thaw_all(&g);
		rc = gcr_err_set(err, m->rc, "pid %d: freeze: %s; group thawed (running)", (int)m->pid, m->err.msg);
		goto out;
	}
	pause_after("freeze");
	if ((rc = complete(&g, err)) < 0 || (rc = targets(&g, err)) < 0) {
		thaw_all(&g);
		gcr_err_wrap(err, "group thawed (running)");
		goto out;
	}
	/* 2. Drain: each member goes up to the largest count, then waits for NCCL's work. */
	if ((rc = drain_loop(&g, err)) < 0) {
		thaw_all(&g);
		gcr_err_wrap(err, "group thawed (running)");
		goto out;
	}
	pause_after("drain");
	/* 3. Suspend: communicators torn down, then each member's data step and driver checkpoint. */
	if (run_step(&g, "suspend", st_suspend, &r->ms_cr, offsetof(struct gcr_group_member, ms_cr)) == 0) {
		pause_after("suspend");
		goto out;
	}
	struct gcr_group_member *m = first_failed(&g);
	char first[GCR_ERR_MSG_MAX];
	snprintf(first, sizeof(first), "pid %d%s: suspend: %.200s", (int)m->pid, m->gone ? " (gone)" : "", m->err.msg);
	rc = m->rc;
	/* Undo: what was suspended comes back, then every communicator is made again. */
	r->rolled_back = 1;
	refresh(&g);
	activate(&g, pick_suspended);
	struct gcr_err e2 = { 0 };
	int undo = run_step(&g, "undo", st_resume, NULL, -1) > 0 ? -EIO : 0;
	if (undo == 0) {
		refresh(&g);
		undo = rebuild_all(&g, &e2);
	} else {
		struct gcr_group_member *u = first_failed(&g);
		gcr_err_set(&e2, -EIO, "pid %d: %s", (int)u->pid, u->err.msg);
	}
	if (undo < 0)
		gcr_err_set(err, rc, "%s; bringing the group back failed too (%s): gcrctl resume --group retries", first,
			    e2.msg);
	else
		gcr_err_set(err, rc, "%s; group running again%s", first,
			    r->failed_comms > 0 ? " (a member is gone: its communicators failed in the others)" : "");
out:
	refresh(&g);
	totals(&g, t0);
	teardown_grp(&g);
	return rc;
}

int gcr_group_resume(const pid_t *pids, size_t n, const struct gcr_group_opts *o, struct gcr_group_result *r,
		     struct gcr_err *err)
{
	struct grp g;
	double t0 = gcr_time_mono_ms();
	int rc = setup(&g, pids, n, o, r, err);
	if (rc < 0)
		return rc;
	if (o->mode == GCR_CR_DRIVER_ONLY) {
		rc = driver_only(&g, 1, t0, err);
		teardown_grp(&g);
		return rc;
	}
	rc = open_all(&g, 1, err);
	if (rc < 0)
		goto out;
	activate(&g, pick_all_live);
	if (run_step(&g, "status", st_status, NULL, -1) > 0) {
		struct gcr_group_member *m = first_failed(&g);
		if (!m->gone) {
			rc = gcr_err_set(err, m->rc, "pid %d: %s; nothing touched", (int)m->pid, m->err.msg);
			goto out;
		}
	}
	int todo = 0;
	for (size_t i = 0; i < n; i++) {
		enum gcr_shimreply_st s = g.mm[i].st;
		if (r->m[i].gone)
			continue;
		if (s == GCR_SHIMREPLY_ST_FROZEN || s == GCR_SHIMREPLY_ST_REBUILDING || s == GCR_SHIMREPLY_ST_SUSPENDING ||
		    s == GCR_SHIMREPLY_ST_RESUMING) {
			rc = gcr_err_set(err, -EBUSY, "pid %d is %s: another operation on the group is running (or NCCL "
					 "still initialises); retry", (int)pids[i], gcr_shimreply_st_name(s));
			goto out;
		}
		todo += s != GCR_SHIMREPLY_ST_RUNNING;
	}
	if (todo == 0) {
		rc = gcr_err_set(err, -EINVAL, "the group is not suspended (every member running)");
		goto out;
	}
	/* 1. The driver's restore and the data of every suspended member. */
	activate(&g, pick_suspended);
	if (run_step(&g, "resume", st_resume, &r->ms_cr, offsetof(struct gcr_group_member, ms_cr)) > 0) {
		struct gcr_group_member *m = first_failed(&g);
		if (!m->gone) {
			rc = gcr_err_set(err, m->rc, "pid %d: resume: %s; the others wait (resumed but detached: NCCL calls "
					 "held): retry gcrctl resume --group", (int)m->pid, m->err.msg);
			goto out;
		}
	}
	pause_after("resume");
	/* 2. The communicators, made again together. */
	refresh(&g);
	struct gcr_err e2 = { 0 };
	rc = rebuild_all(&g, &e2);
	if (rc < 0) {
		*err = e2;
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		if (r->m[i].gone) {
			rc = gcr_err_set(err, -ESRCH, "pid %d is gone; its %d communicator(s) failed in the other members, "
					 "which run (their calls on them answer ncclRemoteError)", (int)pids[i], r->failed_comms);
			if (r->m[i].rc == 0) {
				r->m[i].rc = -ESRCH;
				r->m[i].step = "resume";
				gcr_err_set(&r->m[i].err, -ESRCH, "the process is gone");
			}
			break;
		}
out:
	refresh(&g);
	totals(&g, t0);
	teardown_grp(&g);
	return rc;
}

void gcr_group_result_clear(struct gcr_group_result *r)
{
	for (size_t i = 0; r != NULL && i < r->n && i < GCR_GROUP_MAX_MEMBERS; i++)
		gcr_cr_result_clear(&r->m[i].cr);
}

/* ---- finding a process's group ---- */

struct find_ctx {
	const char *dir;
	pid_t self;
	struct gcr_group_comms *mine, *theirs;
	pid_t *out;
	size_t cap, n;
};

static void find_one(pid_t pid, const char *path, void *data)
{
	(void)path;
	struct find_ctx *f = data;
	struct gcr_client c;
	json_t *st = NULL;
	struct gcr_err e;
	if (pid == f->self || f->n >= f->cap)
		return;
	if (gcr_client_open(&c, f->dir, pid, &e) == 0 && gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 2000, &st, &e) == 0 &&
	    gcr_shimreply_comms(st, f->theirs, &e) == 0) {
		int shared = 0;
		for (size_t a = 0; a < f->mine->n && !shared; a++)
			for (size_t b = 0; b < f->theirs->n && !shared; b++)
				shared = f->mine->c[a].key == f->theirs->c[b].key;
		if (shared)
			f->out[f->n++] = pid;
	}
	json_decref(st);
	gcr_client_close(&c);
}

int gcr_group_find(const char *socket_dir, pid_t pid, pid_t *out, size_t cap, size_t *n, struct gcr_err *err)
{
	struct gcr_client c;
	json_t *st = NULL;
	*n = 0;
	if (cap == 0)
		return gcr_err_set(err, -EINVAL, "no room for the group");
	struct find_ctx f = { .dir = socket_dir, .self = pid, .out = out, .cap = cap, .n = 1,
			      .mine = malloc(sizeof(*f.mine)), .theirs = malloc(sizeof(*f.theirs)) };
	int rc = f.mine != NULL && f.theirs != NULL ? 0 : gcr_err_set(err, -ENOMEM, "out of memory");
	out[0] = pid;
	if (rc == 0)
		rc = gcr_client_open(&c, socket_dir, pid, err);
	if (rc == 0) {
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 2000, &st, err);
		gcr_client_close(&c);
	}
	if (rc == 0)
		rc = gcr_shimreply_comms(st, f.mine, err);
	if (rc == 0)
		rc = gcr_client_list(socket_dir, find_one, &f, err);
	if (rc == 0)
		*n = f.n;
	json_decref(st);
	free(f.mine);
	free(f.theirs);
	return rc;
}
