/* test_agent_evictmsg: eviction imaging's parsers and decisions (gcr-hold's line, the pod
 * object, the estimate, the Checkpoint), and gcr-hold itself against a stand-in agent socket. */
#include "agent_evictmsg.h"
#include "gcr_time.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static int hold(const char *line)
{
	struct gcr_err err = { 0 };
	return agent_evictmsg_parse_hold(line, strlen(line), &err);
}

static void test_hold_line(void)
{
	CHECK(hold("{\"op\":\"evict-hold\",\"v\":1}") == 0);
	CHECK(hold("{\"v\":1,\"op\":\"evict-hold\"}") == 0);
	CHECK(hold("{\"op\":\"evict-hold\",\"v\":2}") == -EPROTO);
	CHECK(hold("{\"op\":\"room\",\"v\":1}") == -EPROTO);
	CHECK(hold("{\"op\":\"evict-hold\"}") == -EBADMSG);
	CHECK(hold("{\"v\":1}") == -EBADMSG);
	CHECK(hold("{\"op\":\"evict-hold\",\"v\":\"1\"}") == -EBADMSG);
	CHECK(hold("{\"op\":1,\"v\":1}") == -EBADMSG);
	CHECK(hold("{\"op\":\"evict-hold\",\"v\":1,\"pod\":\"other\"}") == -EBADMSG); /* nothing else believed */
	CHECK(hold("{\"op\":\"evict-hold\",\"op\":\"evict-hold\",\"v\":1}") == -EBADMSG);
	CHECK(hold("[1]") == -EBADMSG);
	CHECK(hold("") == -EBADMSG);
	CHECK(hold("not json") == -EBADMSG);
	struct gcr_err err;
	CHECK(agent_evictmsg_parse_hold("{\"v\":1}\0x", 9, &err) == -EBADMSG);
	char big[AGENT_EVICTMSG_MAX_LINE + 2];
	memset(big, ' ', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	CHECK(hold(big) == -EMSGSIZE);
	char *r = agent_evictmsg_reply(AGENT_EVICTMSG_NO_TIME, "needs \"20\" s");
	CHECK_STR(r, "{\"outcome\":\"no-time\",\"message\":\"needs \\\"20\\\" s\"}\n");
	free(r);
}

static json_t *pod(const char *extra_md, const char *conds, const char *containers)
{
	char buf[4096];
	snprintf(buf, sizeof(buf),
		 "{\"metadata\":{\"namespace\":\"ns\",\"name\":\"web-7d9-x\",\"uid\":\"0123abcd-1111-2222-3333-444455556666\"%s},"
		 "\"spec\":{\"containers\":%s},\"status\":{\"conditions\":%s,\"containerStatuses\":["
		 "{\"name\":\"side\",\"containerID\":\"containerd://aaa\"},{\"name\":\"main\",\"containerID\":\"containerd://bbb\"}]}}",
		 extra_md, containers, conds);
	json_error_t je;
	json_t *j = json_loads(buf, 0, &je);
	if (j == NULL)
		fprintf(stderr, "bad test JSON: %s\n", je.text);
	return j;
}

#define GPU_CONTAINERS "[{\"name\":\"side\"},{\"name\":\"main\",\"resources\":{\"limits\":{\"gpucr.dev/shim\":\"1\"}}}]"
#define DRAIN "[{\"type\":\"DisruptionTarget\",\"status\":\"True\",\"reason\":\"EvictionByEvictionAPI\"}]"
#define OPTED ",\"labels\":{\"gpucr.dev/evict\":\"image\"},\"deletionTimestamp\":\"2026-11-24T06:30:00Z\"," \
	      "\"ownerReferences\":[{\"uid\":\"not-me\"},{\"uid\":\"rs-uid\",\"controller\":true}]"

static void test_pod(void)
{
	struct agent_evictmsg_pod p;
	struct gcr_err err;
	char why[400];
	json_t *j = pod(OPTED, DRAIN, GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "aaa", &p, &err) == 0);
	CHECK(p.opted && p.deletion == 1795501800LL && p.cause == AGENT_EVICTMSG_CAUSE_EVICTION);
	CHECK_STR(p.owner_uid, "rs-uid");
	CHECK_STR(p.container, "main"); /* the hold ran in side, which has no GCR resource */
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 1);
	json_t *ck = agent_evictmsg_checkpoint(&p, "node-1", "gpucr.dev/v1alpha1");
	char *s = json_dumps(ck, JSON_SORT_KEYS | JSON_COMPACT);
	CHECK_STR(s, "{\"apiVersion\":\"gpucr.dev/v1alpha1\",\"kind\":\"Checkpoint\",\"metadata\":{\"annotations\":"
		     "{\"gpucr.dev/evict-cause\":\"EvictionByEvictionAPI\"},\"labels\":{\"gpucr.dev/evicted-pod\":"
		     "\"web-7d9-x\",\"gpucr.dev/eviction\":\"true\",\"gpucr.dev/node\":\"node-1\",\"gpucr.dev/owner-uid\":"
		     "\"rs-uid\"},\"name\":\"evict-web-7d9-x-0123abcd\",\"namespace\":\"ns\"},\"spec\":{\"action\":"
		     "\"Image\",\"containerName\":\"main\",\"cpuCheckpoint\":\"Kubelet\",\"podName\":\"web-7d9-x\"}}");
	free(s);
	json_decref(ck);
	json_decref(j);
	/* Preemption; two containers with the resource: the hold's own. */
	j = pod(OPTED, "[{\"type\":\"Ready\",\"status\":\"True\"},{\"type\":\"DisruptionTarget\",\"status\":\"True\","
		"\"reason\":\"PreemptionByScheduler\"}]",
		"[{\"name\":\"side\",\"resources\":{\"requests\":{\"gpucr.dev/shim\":\"1\"}}},"
		"{\"name\":\"main\",\"resources\":{\"limits\":{\"gpucr.dev/shim\":\"1\"}}}]");
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "bbb", &p, &err) == 0);
	CHECK(p.cause == AGENT_EVICTMSG_CAUSE_PREEMPTION && strcmp(p.container, "main") == 0);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && strcmp(p.container, "side") == 0);
	json_decref(j);
	/* A plain delete: nothing to do; with the annotation: any deletion. */
	j = pod(OPTED, "[]", GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && p.cause == AGENT_EVICTMSG_CAUSE_NONE);
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 0 && strstr(why, "not for preemption or drain"));
	json_decref(j);
	j = pod(OPTED ",\"annotations\":{\"gpucr.dev/evict-on\":\"any-deletion\"}", "[]", GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && p.cause == AGENT_EVICTMSG_CAUSE_ANY);
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 1);
	json_decref(j);
	/* Other DisruptionTarget reasons and a False status are not ours. */
	j = pod(OPTED, "[{\"type\":\"DisruptionTarget\",\"status\":\"True\",\"reason\":\"DeletionByTaintManager\"},"
		"{\"type\":\"DisruptionTarget\",\"status\":\"False\",\"reason\":\"PreemptionByScheduler\"}]", GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && p.cause == AGENT_EVICTMSG_CAUSE_NONE);
	json_decref(j);
	/* Not opted in; not deleting; no container with the resource. */
	j = pod(",\"labels\":{\"gpucr.dev/evict\":\"yes\"}", DRAIN, GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && !p.opted && p.deletion == 0);
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 0 && strstr(why, "not labelled"));
	json_decref(j);
	j = pod(",\"labels\":{\"gpucr.dev/evict\":\"image\"}", DRAIN, GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0);
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 0 && strstr(why, "not being deleted"));
	json_decref(j);
	j = pod(OPTED, DRAIN, "[{\"name\":\"main\"}]");
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == 0 && p.container[0] == '\0');
	CHECK(agent_evictmsg_decide(&p, why, sizeof(why)) == 0 && strstr(why, "GCR resource"));
	json_decref(j);
	/* Malformed objects. */
	j = pod(",\"deletionTimestamp\":\"yesterday\"", DRAIN, GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == -EBADMSG);
	json_decref(j);
	j = pod(",\"deletionTimestamp\":7", DRAIN, GPU_CONTAINERS);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == -EBADMSG);
	json_decref(j);
	j = json_loads("{\"metadata\":{\"name\":\"x\",\"uid\":\"u\"}}", 0, NULL);
	CHECK(agent_evictmsg_pod(j, "gpucr.dev/shim", "", &p, &err) == -EBADMSG);
	json_decref(j);
	CHECK(agent_evictmsg_pod(NULL, "gpucr.dev/shim", "", &p, &err) == -EBADMSG);
}

static void test_name_and_estimate(void)
{
	char n[64];
	agent_evictmsg_ck_name("web", "0123abcd-1111", n, sizeof(n));
	CHECK_STR(n, "evict-web-0123abcd");
	/* Cut to 63, never ending the cut in '-' or '.'. */
	agent_evictmsg_ck_name("a-very-long-deployment-name-of-a-gpu-workload-7d9f8c6b5-xk2p9q", "ffffffff-0000", n,
			       sizeof(n));
	CHECK(strlen(n) <= 63 && strncmp(n, "evict-a-very-long", 17) == 0 && strstr(n, "--") == NULL &&
	      strcmp(n + strlen(n) - 9, "-ffffffff") == 0);
	agent_evictmsg_ck_name("abcdefghijabcdefghijabcdefghijabcdefghijabcdefg.-xyz", "12345678", n, sizeof(n));
	CHECK_STR(n, "evict-abcdefghijabcdefghijabcdefghijabcdefghijabcdefg-12345678");
	CHECK(agent_evictmsg_needed_s(0, 200, 15) == 15);
	CHECK(agent_evictmsg_needed_s(2000ULL << 20, 200, 15) == 25);
	CHECK(agent_evictmsg_needed_s(1ULL << 20, 0, 0) == 1); /* no rate: 1 MiB/s */
}

/* The stand-in agent's side of one hold: accepts on l, reads gcr-hold's line and checks it;
 * the connection (or -1). */
static int take_hold(int l)
{
	int c = accept(l, NULL, NULL);
	char line[300] = "";
	ssize_t n = 0, r;
	while (c >= 0 && n < (ssize_t)sizeof(line) - 1 && (r = read(c, line + n, sizeof(line) - 1 - (size_t)n)) > 0) {
		n += r;
		if (memchr(line, '\n', (size_t)n))
			break;
	}
	line[n > 0 ? n - 1 : 0] = '\0';
	struct gcr_err err;
	CHECK(agent_evictmsg_parse_hold(line, strlen(line), &err) == 0);
	return c;
}

static pid_t spawn_hold(const char *bin, const char *sock, const char *out, const char *reconnect_s)
{
	pid_t pid = fork();
	if (pid == 0) {
		freopen(out, "w", stdout);
		freopen("/dev/null", "w", stderr);
		execl(bin, "gcr-hold", "--socket", sock, "--reconnect-s", reconnect_s, (char *)NULL);
		_exit(127);
	}
	return pid;
}

/* What gcr-hold printed is exactly line. */
static void check_printed(const char *out, const char *line)
{
	FILE *f = fopen(out, "r");
	char got[512] = "";
	CHECK(f != NULL && fgets(got, sizeof(got), f) != NULL);
	CHECK(line != NULL && strcmp(got, line) == 0);
	if (f)
		fclose(f);
}

static int listen_at(const char *sock)
{
	int l = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
	CHECK(bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(l, 4) == 0);
	return l;
}

/* gcr-hold against a stand-in agent: it sends the hold line, waits for the answer, prints it,
 * exits 0. An agent that drops the hold unanswered and comes back (a new socket at the same
 * path, as a restarted agent's): the hold is asked again and the new answer printed, exit 0.
 * An agent that stays away longer than --reconnect-s: exit 1. Nobody listening at first: exit 1
 * at once. */
static void test_gcr_hold(void)
{
	const char *top = getenv("top_builddir");
	char bin[1024], dir[] = "/tmp/gcr-hold-test.XXXXXX", sock[64], out[64];
	snprintf(bin, sizeof(bin), "%s/node-agent/gcr-hold", top ? top : ".");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(sock, sizeof(sock), "%s/evict.sock", dir);
	snprintf(out, sizeof(out), "%s/out", dir);
	int l = listen_at(sock);
	pid_t pid = spawn_hold(bin, sock, out, "120");
	int c = take_hold(l);
	/* It holds until the answer comes. */
	int st = 0;
	CHECK(waitpid(pid, &st, WNOHANG) == 0);
	char *rep = agent_evictmsg_reply(AGENT_EVICTMSG_WRITTEN, "image written");
	CHECK(rep != NULL && write(c, rep, strlen(rep)) == (ssize_t)strlen(rep));
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	check_printed(out, rep);
	close(c);
	/* The agent stops with the hold unanswered, and a new one listens at the same path: asked
	 * again, answered there. */
	pid = spawn_hold(bin, sock, out, "120");
	c = take_hold(l);
	close(l);
	unlink(sock);
	close(c);
	CHECK(waitpid(pid, &st, WNOHANG) == 0); /* still holding: nobody answered */
	l = listen_at(sock);
	c = take_hold(l);
	CHECK(waitpid(pid, &st, WNOHANG) == 0);
	free(rep);
	rep = agent_evictmsg_reply(AGENT_EVICTMSG_WRITTEN, "waited for the Checkpoint made before");
	CHECK(rep != NULL && write(c, rep, strlen(rep)) == (ssize_t)strlen(rep));
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
	check_printed(out, rep);
	free(rep);
	close(c);
	/* Dropped, and the agent stays away past --reconnect-s 1: exit 1 after about a second. */
	pid = spawn_hold(bin, sock, out, "1");
	c = take_hold(l);
	close(l);
	unlink(sock);
	double t0 = gcr_time_mono_ms();
	close(c);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 1);
	double took = gcr_time_mono_ms() - t0;
	CHECK(took >= 900 && took < test_ms(10000));
	/* Nobody listening: exit 1 at once. */
	t0 = gcr_time_mono_ms();
	pid = spawn_hold(bin, sock, out, "120");
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 1);
	CHECK(gcr_time_mono_ms() - t0 < test_ms(5000));
	unlink(out);
	rmdir(dir);
}

int main(void)
{
	test_hold_line();
	test_pod();
	test_name_and_estimate();
	test_gcr_hold();
	return test_summary("test_agent_evictmsg");
}
