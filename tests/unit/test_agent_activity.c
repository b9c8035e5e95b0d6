/* test_agent_activity: the heartbeat's activity sample against real processes playing
 * shims, some of them stopped (SIGSTOP): one deadline for all, last counters kept. */
#include "agent_activity.h"
#include "agent_scalemsg.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gcr_proto.h"
#include "gcr_scale.h"
#include "gcr_sock.h"

/* Shims: A always answers (its socket named as a container's shim names it, so it is found
 * by the directory scan), B answers, is stopped, then continued; the rest stay stopped. */
enum { A = 0, B = 1, NSHIMS = 10 };
/* The sample's bound in this test, ms: one after the other, the stopped shims alone would
 * take (NSHIMS - 2) times it. */
#define STATS_MS ((int)test_ms(300)) /* a live shim's time to answer; valgrind stretches it */

/* Pod uid of shim i, and its cgroup spelling (underscores). */
static void pod_uid(int i, char *out, size_t len, int underscores)
{
	snprintf(out, len, underscores ? "1f0c5b0e_9d7a_4c2b_8e6f_3a4b5c6d7e%02d" : "1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e%02d",
		 i);
}

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A child playing the shim of pod i: answers every stats request with calls[i] calls, and
 * its state in the reply's status: A says suspended, the others running. */
static void shim_main(int i, const char *dir, volatile long long *calls, int ready_fd)
{
	char path[512], uid[64];
	struct gcr_err err;
	int pid = (int)getpid();
	snprintf(path, sizeof(path), "%s/proc/%d", dir, pid);
	if (mkdir(path, 0700) < 0)
		_exit(2);
	snprintf(path, sizeof(path), "%s/proc/%d/cgroup", dir, pid);
	FILE *f = fopen(path, "w");
	pod_uid(i, uid, sizeof(uid), 1);
	if (f == NULL || fprintf(f, "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/"
				    "cri-containerd-%064d.scope\n", uid, i) < 0 || fclose(f) != 0)
		_exit(2);
	if (i == A)
		snprintf(path, sizeof(path), "%s/run/gcr-ns-1.sock", dir);
	else
		snprintf(path, sizeof(path), "%s/run/gcr-%d.sock", dir, pid);
	int lfd = gcr_sock_listen(path, &err);
	if (lfd < 0 || write(ready_fd, "r", 1) != 1)
		_exit(2);
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			_exit(2);
		struct gcr_linebuf lb;
		gcr_linebuf_init(&lb, GCR_PROTO_MAX_LINE);
		char *line;
		struct gcr_req req;
		if (gcr_linebuf_read(&lb, fd, 5000, &line, &err) == 0 && gcr_proto_parse_request(line, &req, &err) == 0) {
			char *rep = gcr_proto_reply_ok_line(req.id, json_pack("{s:{s:I}, s:{s:s}}", "calls", "cuLaunchKernel",
									      (json_int_t)calls[i], "status", "state",
									      i == A ? "suspended" : "running"));
			/* A request the agent gave up on gets EPIPE here: MSG_NOSIGNAL keeps us alive. */
			if (rep != NULL)
				(void)gcr_sock_write_all(fd, rep, strlen(rep), 1000, &err);
			free(rep);
			gcr_req_clear(&req);
		}
		gcr_linebuf_free(&lb);
		close(fd);
	}
}

/* Pod i's entry in note; calls -1 when it is missing. */
static struct agent_scalemsg_activity pod_act(const char *note, int i)
{
	struct agent_scalemsg_activity act = { .calls = -1 };
	char uid[64];
	struct gcr_err err;
	pod_uid(i, uid, sizeof(uid), 0);
	if (note == NULL || agent_scalemsg_activity_find(note, strlen(note), uid, &act, &err) < 0)
		act.calls = -1;
	return act;
}

/* One sample, timed: must wait for the stopped shims once (about STATS_MS), never once each. */
static char *sample(struct agent_activity *a, const char *what)
{
	double t0 = mono_s();
	char *note = agent_activity_note(a);
	double took = mono_s() - t0;
	int stopped = NSHIMS - 2 + (strstr(what, "B stopped") != NULL);
	printf("%s: %.3f s with %d stopped shims (bound %d ms)\n", what, took, stopped, STATS_MS);
	CHECK(note != NULL);
	CHECK(took >= 0.9 * STATS_MS / 1000.0); /* it did ask the stopped ones */
	CHECK(took < 2.0 * STATS_MS / 1000.0 + 0.3); /* and waited for them together */
	return note;
}

/* The note's parser on hand-made notes: the states are optional (older agents), strict when there. */
static void note_parser(void)
{
	static const struct {
		const char *note;
		int rc, have, suspended;
	} cases[] = {
		{ "{\"v\":1,\"pods\":{\"u\":{\"t\":1.5,\"c\":2}}}", 0, 0, 0 }, /* an older agent: unknown */
		{ "{\"v\":1,\"at\":9.5,\"pods\":{\"u\":{\"t\":1.5,\"c\":2,\"s\":{\"suspended\":2}}}}", 0, 1, 2 },
		{ "{\"v\":1,\"pods\":{\"u\":{\"t\":1.5,\"c\":2,\"s\":{\"suspended\":2}}}}", -EINVAL, 0, 0 },
		{ "{\"v\":1,\"at\":9.5,\"pods\":{\"u\":{\"t\":1,\"c\":2,\"s\":{\"asleep\":1}}}}", -EINVAL, 0, 0 },
		{ "{\"v\":1,\"at\":9.5,\"pods\":{\"u\":{\"t\":1,\"c\":2,\"s\":{\"running\":0}}}}", -EINVAL, 0, 0 },
		{ "{\"v\":1,\"at\":9.5,\"pods\":{\"u\":{\"t\":1,\"c\":2,\"s\":{\"running\":70000}}}}", -EINVAL, 0, 0 },
		{ "{\"v\":1,\"at\":-1,\"pods\":{\"u\":{\"t\":1,\"c\":2,\"s\":{\"running\":1}}}}", -EINVAL, 0, 0 },
		{ "{\"v\":1,\"at\":9.5,\"pods\":{\"u\":{\"t\":1,\"c\":2,\"s\":[1]}}}", -EINVAL, 0, 0 },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct agent_scalemsg_activity act;
		struct gcr_err err;
		int rc = agent_scalemsg_activity_find(cases[i].note, strlen(cases[i].note), "u", &act, &err);
		if (rc != cases[i].rc || (rc == 0 && (act.have_states != cases[i].have ||
						      act.procs[GCR_SHIMREPLY_ST_SUSPENDED] != cases[i].suspended)))
			printf("note case %zu: rc %d (want %d)\n", i, rc, cases[i].rc);
		CHECK(rc == cases[i].rc);
		CHECK(rc != 0 || (act.have_states == cases[i].have && act.procs[GCR_SHIMREPLY_ST_SUSPENDED] ==
								      cases[i].suspended));
	}
	/* Selectors matched here as the API server would. */
	json_t *sel = json_loads("{\"matchLabels\":{\"app\":\"llm\"},\"matchExpressions\":[{\"key\":\"tier\","
				 "\"operator\":\"NotIn\",\"values\":[\"b\"]},{\"key\":\"x\",\"operator\":\"DoesNotExist\"}]}",
				 0, NULL);
	json_t *l1 = json_pack("{s:s}", "app", "llm"), *l2 = json_pack("{s:s, s:s}", "app", "llm", "tier", "b"),
	       *l3 = json_pack("{s:s, s:s}", "app", "llm", "x", ""), *bad = json_pack("{s:{}}", "matchLabels");
	struct gcr_err err;
	CHECK(agent_scalemsg_selector_match(sel, l1, &err) == 1);
	CHECK(agent_scalemsg_selector_match(sel, l2, &err) == 0);
	CHECK(agent_scalemsg_selector_match(sel, l3, &err) == 0);
	CHECK(agent_scalemsg_selector_match(sel, NULL, &err) == 0);
	CHECK(agent_scalemsg_selector_match(bad, l1, &err) == -EINVAL); /* empty: would pick every pod */
	json_decref(sel);
	json_decref(l1);
	json_decref(l2);
	json_decref(l3);
	json_decref(bad);
}

static int stop_and_wait(pid_t pid)
{
	int st;
	return kill(pid, SIGSTOP) == 0 && waitpid(pid, &st, WUNTRACED) == pid && WIFSTOPPED(st);
}

int main(void)
{
	char dir[] = "/tmp/gcr-test-activity.XXXXXX";
	char path[600], run[600];
	pid_t pids[NSHIMS] = { 0 };
	struct gcr_err err;
	struct agent_registry *reg = NULL;
	struct agent_activity *a = NULL;
	char *n1 = NULL, *n2 = NULL, *n3 = NULL;
	signal(SIGPIPE, SIG_IGN);
	note_parser();
	volatile long long *calls = mmap(NULL, NSHIMS * sizeof(long long), PROT_READ | PROT_WRITE,
					 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(calls != MAP_FAILED);
	CHECK(mkdtemp(dir) != NULL);
	snprintf(run, sizeof(run), "%s/run", dir);
	snprintf(path, sizeof(path), "%s/proc", dir);
	CHECK(mkdir(run, 0700) == 0 && mkdir(path, 0700) == 0);
	if (calls == MAP_FAILED)
		return test_summary("test_agent_activity");
	for (int i = 0; i < NSHIMS; i++)
		calls[i] = 100;

	/* Each child says when it listens; the registry's start-up scan then finds them all. */
	for (int i = 0; i < NSHIMS; i++) {
		int p[2];
		CHECK(pipe(p) == 0);
		pids[i] = fork();
		if (pids[i] == 0) {
			close(p[0]);
			shim_main(i, dir, calls, p[1]);
		}
		close(p[1]);
		char c = 0;
		CHECK(pids[i] > 0 && read(p[0], &c, 1) == 1 && c == 'r');
		close(p[0]);
	}
	snprintf(path, sizeof(path), "%s/agent.sock", dir);
	char proc[600];
	snprintf(proc, sizeof(proc), "%s/proc", dir);
	CHECK(agent_registry_new(path, run, NULL, proc, 0, &reg, &err) == 0);
	if (reg == NULL)
		goto out;
	CHECK(agent_registry_count(reg) == NSHIMS);
	a = agent_activity_new(reg, run);
	CHECK(a != NULL);
	if (a == NULL)
		goto out;
	agent_activity_set_stats_ms(a, STATS_MS);
	for (int i = B + 1; i < NSHIMS; i++)
		CHECK(stop_and_wait(pids[i]));

	/* 1: A and B answer 100 calls; each pod is listed, the stopped ones too. */
	n1 = sample(a, "sample 1");
	for (int i = 0; i < NSHIMS; i++)
		CHECK(pod_act(n1, i).calls == 0); /* first sight: no interval yet */
	/* The node's truth per pod: A's one process suspended, B's running, the stopped ones
	 * unknown (no answer), each as of the sample's start. */
	struct agent_scalemsg_activity sa = pod_act(n1, A), sb = pod_act(n1, B), sc = pod_act(n1, B + 1);
	CHECK(sa.have_states && sa.procs[GCR_SHIMREPLY_ST_SUSPENDED] == 1 && sa.procs[GCR_SHIMREPLY_ST_RUNNING] == 0);
	CHECK(sb.have_states && sb.procs[GCR_SHIMREPLY_ST_RUNNING] == 1 && sb.procs[GCR_SHIMREPLY_ST_SUSPENDED] == 0);
	CHECK(sc.have_states && sc.procs[GCR_SHIMREPLY_ST_UNKNOWN] == 1 && sc.procs[GCR_SHIMREPLY_ST_RUNNING] == 0);
	CHECK(sa.sampled > 1.7e9 && sa.sampled <= (double)time(NULL) + 1);

	/* 2: A made 50 calls; B is stopped: it keeps its last counter (100), so nothing recent
	 * and its last activity unchanged. */
	calls[A] = 150;
	CHECK(stop_and_wait(pids[B]));
	n2 = sample(a, "sample 2, B stopped");
	CHECK(pod_act(n2, A).calls == 50);
	CHECK(pod_act(n2, B).calls == 0);
	CHECK(fabs(pod_act(n2, B).last_active - pod_act(n1, B).last_active) < 1e-6);
	for (int i = B + 1; i < NSHIMS; i++)
		CHECK(pod_act(n2, i).calls == 0);

	/* 3: B continued at 250: 150 recent calls, counted from the kept 100, not from 0. */
	calls[B] = 250;
	int st;
	CHECK(kill(pids[B], SIGCONT) == 0 && waitpid(pids[B], &st, WCONTINUED) == pids[B] && WIFCONTINUED(st));
	n3 = sample(a, "sample 3");
	CHECK(pod_act(n3, A).calls == 0);
	CHECK(pod_act(n3, B).calls == 150);
	CHECK(pod_act(n3, B).last_active > pod_act(n2, B).last_active);

	/* The call underneath: answers and time-outs per pid, one deadline. */
	long long got[NSHIMS];
	int rcs[NSHIMS];
	double t0 = mono_s();
	enum gcr_shimreply_st sts[NSHIMS];
	CHECK(gcr_scale_calls_all(pids, NSHIMS, run, STATS_MS, got, rcs, sts, &err) == 2);
	CHECK(sts[A] == GCR_SHIMREPLY_ST_SUSPENDED && sts[B] == GCR_SHIMREPLY_ST_RUNNING &&
	      sts[B + 1] == GCR_SHIMREPLY_ST_UNKNOWN);
	CHECK(mono_s() - t0 < 2.0 * STATS_MS / 1000.0 + 0.3);
	CHECK(rcs[A] == 0 && got[A] == 150 && rcs[B] == 0 && got[B] == 250);
	for (int i = B + 1; i < NSHIMS; i++)
		CHECK(rcs[i] == -ETIMEDOUT && got[i] == 0);
	pid_t none[2] = { 0, pids[A] };
	CHECK(gcr_scale_calls_all(none, 2, "/nonexistent", STATS_MS, got, rcs, NULL, &err) == 0);
	CHECK(rcs[0] == -ESRCH && rcs[1] == -ENOENT);
out:
	free(n1);
	free(n2);
	free(n3);
	agent_activity_free(a);
	agent_registry_free(reg);
	for (int i = 0; i < NSHIMS; i++)
		if (pids[i] > 0) {
			kill(pids[i], SIGKILL);
			waitpid(pids[i], NULL, 0);
		}
	snprintf(path, sizeof(path), "rm -rf %s", dir);
	CHECK(system(path) == 0);
	return test_summary("test_agent_activity");
}
