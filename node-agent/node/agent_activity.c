/* agent_activity: per pod, when its shimmed processes last called the driver and what state
 * each is in, from the shims' existing stats replies read at heartbeat time (nothing added to the hot path). */
#include "agent_activity.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agent_scalemsg.h"
#include "gcr_log.h"
#include "gcr_scale.h"

/* Per pod below: [recent calls, last active, [processes per state]], one slot per state. */

struct agent_activity {
	struct agent_registry *reg;
	char *socket_dir;
	int stats_ms; /* how long one sample waits for the shims' replies, all together */
	pthread_mutex_t lock;
	/* seen_lock guards replacing seen (the sampler, under lock) against agent_activity_last's
	 * reads, which must not wait for a whole sample. seen is never changed in place. */
	pthread_mutex_t seen_lock;
	json_t *seen; /* "pid" -> [calls, last_active]: the previous sample */
};

struct agent_activity *agent_activity_new(struct agent_registry *reg, const char *socket_dir)
{
	struct agent_activity *a = calloc(1, sizeof(*a));
	if (a == NULL)
		return NULL;
	a->reg = reg;
	a->stats_ms = AGENT_ACTIVITY_STATS_MS;
	a->socket_dir = strdup(socket_dir);
	a->seen = json_object();
	pthread_mutex_init(&a->lock, NULL);
	pthread_mutex_init(&a->seen_lock, NULL);
	if (a->socket_dir == NULL || a->seen == NULL) {
		agent_activity_free(a);
		return NULL;
	}
	return a;
}

void agent_activity_free(struct agent_activity *a)
{
	if (a == NULL)
		return;
	json_decref(a->seen);
	pthread_mutex_destroy(&a->lock);
	pthread_mutex_destroy(&a->seen_lock);
	free(a->socket_dir);
	free(a);
}

void agent_activity_set_stats_ms(struct agent_activity *a, int ms)
{
	if (ms > 0)
		a->stats_ms = ms;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)(ts.tv_nsec / 1000000) / 1e3;
}

char *agent_activity_note(void *data)
{
	struct agent_activity *a = data;
	/* Only the heartbeat thread samples, under a->lock. */
	static struct agent_registry_proc procs[AGENT_REGISTRY_MAX];
	static pid_t pids[AGENT_REGISTRY_MAX];
	static long long calls_of[AGENT_REGISTRY_MAX];
	static int rcs[AGENT_REGISTRY_MAX];
	static enum gcr_shimreply_st states[AGENT_REGISTRY_MAX];
	pthread_mutex_lock(&a->lock);
	int n = agent_registry_find(a->reg, NULL, NULL, procs, AGENT_REGISTRY_MAX);
	json_t *seen = json_object(), *per_pod = json_object(), *note = json_object();
	char *text = NULL;
	if (seen == NULL || per_pod == NULL || note == NULL)
		goto out;
	for (int i = 0; i < n; i++)
		pids[i] = procs[i].pid;
	/* Every shim at once with one deadline: the Lease renewal waits for this, and a
	 * stopped process answers nothing, so one after the other with gcr_scale_calls' 10 s
	 * each, a few of them let the Lease expire (40 s). */
	struct gcr_err err;
	/* Taken before asking: every state in this note was read after it, which is what the
	 * scaler compares with an operation's completion time. */
	double asked = now_s();
	if (n > 0 && gcr_scale_calls_all(pids, (size_t)n, a->socket_dir, a->stats_ms, calls_of, rcs, states, &err) < 0)
		for (int i = 0; i < n; i++) {
			rcs[i] = -ENOMEM; /* nobody asked: all keep their last counters */
			states[i] = GCR_SHIMREPLY_ST_UNKNOWN;
		}
	double now = now_s();
	for (int i = 0; i < n; i++) {
		char key[16];
		snprintf(key, sizeof(key), "%d", (int)procs[i].pid);
		long long calls = calls_of[i];
		/* A process that did not answer in time (a stopped or suspended one) keeps its last
		 * known counter, so it counts as idle this round: no recent calls, last activity unchanged. */
		int ok = rcs[i] == 0;
		json_t *prev = json_object_get(a->seen, key);
		long long prev_calls = prev ? (long long)json_integer_value(json_array_get(prev, 0)) : -1;
		double last = prev ? json_real_value(json_array_get(prev, 1)) : now; /* first seen: active now */
		if (!ok)
			calls = prev_calls < 0 ? 0 : prev_calls;
		long long recent = prev_calls >= 0 && calls > prev_calls ? calls - prev_calls : 0;
		if (recent > 0)
			last = now;
		json_object_set_new(seen, key, json_pack("[I, f]", (json_int_t)calls, last));
		if (procs[i].pod_uid[0] == '\0')
			continue; /* a process outside pods (--processes-outside-pods): in no pod's note */
		/* A pod's activity: its most recently active process, the sum of recent calls. */
		/* A pod's states: how many of its processes are in each (the node's truth). */
		json_t *pp = json_object_get(per_pod, procs[i].pod_uid);
		if (pp == NULL) {
			json_t *zeros = json_array();
			for (int k = 0; zeros != NULL && k < GCR_SHIMREPLY_ST_N; k++)
				json_array_append_new(zeros, json_integer(0));
			pp = json_pack("[I, f, o]", (json_int_t)recent, last, zeros);
			json_object_set_new(per_pod, procs[i].pod_uid, pp);
		} else {
			double pl = json_real_value(json_array_get(pp, 1));
			json_array_set_new(pp, 0, json_integer(json_integer_value(json_array_get(pp, 0)) + recent));
			json_array_set_new(pp, 1, json_real(last > pl ? last : pl));
		}
		json_t *sv = json_array_get(pp, 2);
		json_array_set_new(sv, states[i], json_integer(json_integer_value(json_array_get(sv, states[i])) + 1));
	}
	const char *uid;
	json_t *pp;
	json_object_foreach(per_pod, uid, pp)
	{
		struct agent_scalemsg_activity act = { .calls = json_integer_value(json_array_get(pp, 0)),
						      .last_active = json_real_value(json_array_get(pp, 1)),
						      .have_states = 1, .sampled = asked };
		for (int k = 0; k < GCR_SHIMREPLY_ST_N; k++)
			act.procs[k] = (int)json_integer_value(json_array_get(json_array_get(pp, 2), k));
		if (agent_scalemsg_activity_add(note, uid, &act) < 0)
			goto out;
	}
	text = agent_scalemsg_activity_text(note);
	pthread_mutex_lock(&a->seen_lock);
	json_decref(a->seen);
	a->seen = seen; /* processes gone since the last sample drop out */
	pthread_mutex_unlock(&a->seen_lock);
	seen = NULL;
out:
	pthread_mutex_unlock(&a->lock);
	json_decref(seen);
	json_decref(per_pod);
	json_decref(note);
	if (text == NULL)
		GCR_LOG(GCR_LOG_WARN, "activity", "out of memory building the activity note");
	return text;
}

double agent_activity_last(struct agent_activity *a, pid_t pid)
{
	if (a == NULL)
		return 0;
	char key[16];
	snprintf(key, sizeof(key), "%d", (int)pid);
	pthread_mutex_lock(&a->seen_lock);
	double last = json_real_value(json_array_get(json_object_get(a->seen, key), 1));
	pthread_mutex_unlock(&a->seen_lock);
	return last;
}
