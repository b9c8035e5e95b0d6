/* gcr_scale: scale-to-zero policy shared by gcrctl and the agent's scaler: which
 * processes (or pods) to suspend or resume to reach a resident count, and running them. */
#include "gcr_scale.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcr_client.h"
#include "gcr_group.h"
#include "gcr_groupmsg.h"
#include "gcr_shimreply.h"
#include "gcr_time.h"

const char *gcr_scale_state_name(enum gcr_scale_state s)
{
	static const char *const names[] = { "Resident", "Suspended", "Suspending", "Resuming", "Unmanaged" };
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "Unknown";
}

enum gcr_scale_state gcr_scale_state_of(enum gcr_cr_st s)
{
	switch (s) {
	case GCR_CR_ST_RUNNING: return GCR_SCALE_RESIDENT;
	case GCR_CR_ST_SUSPENDED:
	case GCR_CR_ST_PARTIAL: return GCR_SCALE_SUSPENDED;
	default: return GCR_SCALE_UNMANAGED;
	}
}

const char *gcr_scale_action_name(enum gcr_scale_action a)
{
	return a == GCR_SCALE_SUSPEND ? "suspend" : a == GCR_SCALE_RESUME ? "resume" : "none";
}

/* Most recently active first: later last_active, then more recent calls, then id. */
static int more_active_first(const void *a, const void *b)
{
	const struct gcr_scale_member *x = *(const struct gcr_scale_member *const *)a;
	const struct gcr_scale_member *y = *(const struct gcr_scale_member *const *)b;
	if (x->last_active != y->last_active)
		return x->last_active > y->last_active ? -1 : 1;
	if (x->recent_calls != y->recent_calls)
		return x->recent_calls > y->recent_calls ? -1 : 1;
	return strcmp(x->id ? x->id : "", y->id ? y->id : "");
}

static int less_active_first(const void *a, const void *b)
{
	const struct gcr_scale_member *x = *(const struct gcr_scale_member *const *)a;
	const struct gcr_scale_member *y = *(const struct gcr_scale_member *const *)b;
	if (x->last_active != y->last_active)
		return x->last_active < y->last_active ? -1 : 1;
	if (x->recent_calls != y->recent_calls)
		return x->recent_calls < y->recent_calls ? -1 : 1;
	return strcmp(x->id ? x->id : "", y->id ? y->id : ""); /* same order both ways: deterministic */
}

/* Marks up to want members in state `from` with action, in cmp's order; returns how many. */
static int pick(struct gcr_scale_member *m, size_t n, enum gcr_scale_state from, int want,
		int (*cmp)(const void *, const void *), enum gcr_scale_action action, int *oom)
{
	if (want <= 0)
		return 0;
	struct gcr_scale_member **v = calloc(n ? n : 1, sizeof(*v));
	if (v == NULL) {
		*oom = 1;
		return 0;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (m[i].state == from && !m[i].pinned)
			v[k++] = &m[i];
	qsort(v, k, sizeof(*v), cmp);
	int got = 0;
	for (size_t i = 0; i < k && got < want; i++, got++)
		v[i]->action = action;
	free(v);
	return got;
}

int gcr_scale_plan(struct gcr_scale_member *m, size_t n, int replicas, struct gcr_scale_plan *out,
		   struct gcr_err *err)
{
	memset(out, 0, sizeof(*out));
	if (replicas < 0)
		return gcr_err_set(err, -EINVAL, "replicas %d is negative", replicas);
	for (size_t i = 0; i < n; i++) {
		m[i].action = GCR_SCALE_NONE;
		switch (m[i].state) {
		case GCR_SCALE_RESIDENT: out->resident++; break;
		case GCR_SCALE_SUSPENDED: out->suspended++; break;
		case GCR_SCALE_SUSPENDING: out->suspending++; break;
		case GCR_SCALE_RESUMING: out->resuming++; break;
		default: out->unmanaged++; break;
		}
	}
	/* In-flight operations count as done: they cannot be cancelled half-way, and
	 * counting them otherwise would start a second operation on the same member. */
	int will_be_resident = out->resident + out->resuming;
	int oom = 0;
	if (will_be_resident > replicas) {
		int want = will_be_resident - replicas;
		out->to_suspend = pick(m, n, GCR_SCALE_RESIDENT, want, less_active_first, GCR_SCALE_SUSPEND, &oom);
		out->waiting = want - out->to_suspend; /* resumes in flight or pinned members: later rounds */
	} else if (will_be_resident < replicas) {
		int want = replicas - will_be_resident;
		out->to_resume = pick(m, n, GCR_SCALE_SUSPENDED, want, more_active_first, GCR_SCALE_RESUME, &oom);
		int left = want - out->to_resume;
		out->waiting = left < out->suspending ? left : out->suspending;
	}
	if (oom) {
		for (size_t i = 0; i < n; i++)
			m[i].action = GCR_SCALE_NONE;
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	return 0;
}

/* One unit of a run: a process alone, or the processes of one NCCL group (first .. in members,
 * listed by next[]), which suspend and resume only together (lib/gcr_group). */
struct run_arg {
	struct gcr_scale_proc *p; /* the whole array */
	const int *next;          /* the next member of the same group, -1 at the end */
	size_t first;
	int group;
	const struct gcr_cr_opts *o;
	double t0;
};

static void run_group(struct run_arg *a)
{
	struct gcr_scale_proc *p = a->p;
	pid_t pids[GCR_GROUP_MAX_MEMBERS];
	size_t idx[GCR_GROUP_MAX_MEMBERS], n = 0;
	for (int i = (int)a->first; i >= 0 && n < GCR_GROUP_MAX_MEMBERS; i = a->next[i]) {
		pids[n] = p[i].pid;
		idx[n++] = (size_t)i;
	}
	struct gcr_group_opts go = { .socket_dir = a->o->socket_dir, .mode = a->o->mode,
				     .timeout_ms = a->o->timeout_ms, .unchecked = a->o->unchecked };
	struct gcr_group_result *r = calloc(1, sizeof(*r));
	struct gcr_err err;
	int rc;
	if (r == NULL)
		rc = gcr_err_set(&err, -ENOMEM, "out of memory");
	else if (a->o->target_gpu != NULL || a->o->ngpu_pairs > 0 || a->o->image_dir != NULL || a->o->wake)
		rc = gcr_err_set(&err, -ENOTSUP, "processes %d.. form an NCCL group, which suspends and resumes on "
				 "its own GPUs only (no other GPU, image or wake); nothing was done", (int)pids[0]);
	else if (p[a->first].action == GCR_SCALE_SUSPEND)
		rc = gcr_group_suspend(pids, n, &go, r, &err);
	else
		rc = gcr_group_resume(pids, n, &go, r, &err);
	double done = gcr_time_mono_ms() - a->t0;
	for (size_t k = 0; k < n; k++) {
		struct gcr_scale_proc *q = &p[idx[k]];
		q->ms_done = done;
		q->rc = rc;
		if (rc < 0)
			q->err = err; /* the group's error names the member that failed */
		if (r != NULL && rc == 0)
			for (size_t m = 0; m < r->n; m++)
				if (r->m[m].pid == q->pid) { /* its own data and driver parts, for reports */
					q->r = r->m[m].cr;
					memset(&r->m[m].cr, 0, sizeof(r->m[m].cr)); /* taken over */
				}
	}
	if (r != NULL)
		gcr_group_result_clear(r);
	free(r);
}

static void *run_one(void *data)
{
	struct run_arg *a = data;
	struct gcr_scale_proc *p = &a->p[a->first];
	if (a->group >= 0)
		run_group(a);
	else if (p->action == GCR_SCALE_SUSPEND)
		p->rc = gcr_cr_suspend(p->pid, a->o, &p->r, &p->err);
	else
		p->rc = gcr_cr_resume(p->pid, a->o, &p->r, &p->err);
	if (a->group < 0)
		p->ms_done = gcr_time_mono_ms() - a->t0;
	return NULL;
}

static int find_root(int *parent, int i)
{
	while (parent[i] != i)
		i = parent[i] = parent[parent[i]];
	return i;
}

/* The NCCL groups among the processes acted on: those whose shims hold a communicator in common
 * (by key) are one group (union-find). group[i]: the group's first process, or -1 alone; next[]
 * links each group's processes. Shims that do not answer, or hold no communicator, are alone:
 * their own suspend then says why (a lone member of a live group is refused by its shim). */
static void find_groups(const struct gcr_scale_proc *p, size_t n, const char *socket_dir, int *group, int *next)
{
	for (size_t i = 0; i < n; i++)
		group[i] = next[i] = -1;
	pid_t *pids = calloc(n ? n : 1, sizeof(*pids));
	json_t **res = calloc(n ? n : 1, sizeof(*res));
	int *rcs = calloc(n ? n : 1, sizeof(*rcs)), *parent = calloc(n ? n : 1, sizeof(*parent));
	struct gcr_group_comms *c = calloc(n ? n : 1, sizeof(*c));
	struct gcr_err e;
	size_t k = 0;
	for (size_t i = 0; pids != NULL && i < n; i++)
		if (p[i].action != GCR_SCALE_NONE)
			pids[k++] = p[i].pid;
	if (pids == NULL || res == NULL || rcs == NULL || parent == NULL || c == NULL || k < 2 ||
	    gcr_client_call_all(socket_dir, pids, k, GCR_OP_STATUS_ID, NULL, 5000, res, rcs, &e) < 0)
		goto out;
	/* c[j] / parent[j] are indexed like pids (the processes acted on) */
	for (size_t j = 0; j < k; j++) {
		parent[j] = (int)j;
		if (rcs[j] < 0 || gcr_shimreply_comms(res[j], &c[j], &e) < 0)
			c[j].n = 0;
	}
	for (size_t a = 0; a < k; a++)
		for (size_t b = a + 1; b < k; b++)
			for (size_t x = 0; x < c[a].n; x++)
				for (size_t y = 0; y < c[b].n; y++)
					if (c[a].c[x].key == c[b].c[y].key) {
						int ra = find_root(parent, (int)a), rb = find_root(parent, (int)b);
						if (ra != rb)
							parent[rb] = ra;
					}
	/* map back to p's indices; a group is linked in p's order from its first process */
	int *last = calloc(k, sizeof(*last)), *first = calloc(k, sizeof(*first));
	if (last == NULL || first == NULL) {
		free(last);
		free(first);
		goto out;
	}
	for (size_t j = 0; j < k; j++)
		first[j] = last[j] = -1;
	for (size_t i = 0, j = 0; i < n; i++) {
		if (p[i].action == GCR_SCALE_NONE)
			continue;
		int root = find_root(parent, (int)j);
		if (c[j].n > 0) {
			if (first[root] < 0)
				first[root] = (int)i;
			else
				next[last[root]] = (int)i;
			last[root] = (int)i;
			group[i] = first[root];
		}
		j++;
	}
	free(last);
	free(first);
out:
	for (size_t j = 0; res != NULL && j < k; j++)
		json_decref(res[j]);
	free(pids);
	free(res);
	free(rcs);
	free(parent);
	free(c);
}

int gcr_scale_run(struct gcr_scale_proc *p, size_t n, const struct gcr_cr_opts *o, double *ms_wall)
{
	struct run_arg *args = calloc(n ? n : 1, sizeof(*args));
	pthread_t *th = calloc(n ? n : 1, sizeof(*th));
	char *started = calloc(n ? n : 1, 1);
	int *group = calloc(n ? n : 1, sizeof(*group)), *next = calloc(n ? n : 1, sizeof(*next));
	double t0 = gcr_time_mono_ms();
	int rc = 0;
	for (size_t i = 0; i < n; i++) {
		p[i].rc = 0;
		p[i].ms_done = 0;
		memset(&p[i].r, 0, sizeof(p[i].r));
		gcr_err_clear(&p[i].err);
	}
	if (group != NULL && next != NULL)
		find_groups(p, n, o->socket_dir, group, next);
	for (size_t i = 0; i < n; i++) {
		if (p[i].action == GCR_SCALE_NONE)
			continue;
		int g = group != NULL && next != NULL ? group[i] : -1;
		if (g >= 0 && (size_t)g != i)
			continue; /* run by its group's first process */
		/* A group whose members were asked different things (a plan over pods that share one
		 * group) is refused whole: half a group cannot move. */
		int mixed = 0;
		for (int j = g >= 0 ? next[g] : -1; j >= 0; j = next[j])
			mixed |= p[j].action != p[i].action;
		if (mixed) {
			for (int j = g; j >= 0; j = next[j]) {
				p[j].rc = gcr_err_set(&p[j].err, -EINVAL, "processes of one NCCL group (%d, ...) were asked "
						      "to suspend and to resume at once; nothing was done", (int)p[g].pid);
			}
			continue;
		}
		struct run_arg a = { .p = p, .next = next, .first = i, .group = g, .o = o, .t0 = t0 };
		/* Without memory or threads each still runs, one after the other. */
		if (args != NULL)
			args[i] = a;
		if (args == NULL || th == NULL || started == NULL ||
		    pthread_create(&th[i], NULL, run_one, &args[i]) != 0)
			run_one(&a);
		else
			started[i] = 1;
	}
	for (size_t i = 0; i < n; i++)
		if (started != NULL && started[i])
			pthread_join(th[i], NULL);
	for (size_t i = 0; i < n; i++)
		if (p[i].action != GCR_SCALE_NONE && p[i].rc < 0 && rc == 0)
			rc = p[i].rc;
	if (ms_wall != NULL)
		*ms_wall = gcr_time_mono_ms() - t0;
	free(args);
	free(th);
	free(started);
	free(group);
	free(next);
	return rc;
}

void gcr_scale_procs_clear(struct gcr_scale_proc *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		gcr_cr_result_clear(&p[i].r);
}

int gcr_scale_calls(pid_t pid, const char *socket_dir, long long *calls, struct gcr_err *err)
{
	struct gcr_client c = { .fd = -1 };
	json_t *res = NULL;
	*calls = 0;
	int rc = gcr_client_open(&c, socket_dir, pid, err);
	if (rc == 0)
		rc = gcr_client_call(&c, GCR_OP_STATS_ID, NULL, 10000, &res, err);
	gcr_client_close(&c);
	if (rc == 0)
		rc = gcr_shimreply_calls(res, calls, err);
	json_decref(res);
	return rc;
}

int gcr_scale_calls_all(const pid_t *pids, size_t n, const char *socket_dir, int timeout_ms, long long *calls,
			int *rcs, enum gcr_shimreply_st *states, struct gcr_err *err)
{
	json_t **res = calloc(n ? n : 1, sizeof(*res));
	if (res == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory asking %zu shims", n);
	int rc = gcr_client_call_all(socket_dir, pids, n, GCR_OP_STATS_ID, NULL, timeout_ms, res, rcs, err);
	for (size_t i = 0; i < n; i++) {
		struct gcr_err e;
		calls[i] = 0;
		/* Counters we cannot read count as no answer: the caller keeps the last ones it had. */
		if (rc >= 0 && rcs[i] == 0)
			rcs[i] = gcr_shimreply_calls(res[i], &calls[i], &e);
		if (states != NULL) {
			/* The stats reply carries the status, so the state costs no second request. */
			const char *name = NULL;
			states[i] = GCR_SHIMREPLY_ST_UNKNOWN;
			if (rc >= 0 && rcs[i] == 0 &&
			    gcr_shimreply_state(json_object_get(res[i], "status"), &name, &e) == 0)
				states[i] = gcr_shimreply_st_of(name);
		}
		json_decref(res[i]);
	}
	free(res);
	return rc;
}
