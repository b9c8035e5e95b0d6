/* test_agent_registry: a shim's registration over the real socket (this process
 * plays the shim), identified by peer credentials and a fake <procRoot>/<pid>/cgroup. */
#include "agent_registry.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include "gcr_log.h"
#include "gcr_sock.h"

#define U "1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8f"
#define U_ "1f0c5b0e_9d7a_4c2b_8e6f_3a4b5c6d7e8f"
#define C "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"

#define U2 "2a1d6c1f-0e8b-4d3c-9f70-4b5c6d7e8f90"
#define U2_ "2a1d6c1f_0e8b_4d3c_9f70_4b5c6d7e8f90"

/* A child whose fake <proc>/<pid>/cgroup names pod uid_ (underscores): once a byte comes on *go,
 * it connects the socket fd its parent made (so the parent holds the same connection), says on
 * ready whether the agent closed it ('C') or not ('O', once asked on end), then waits for its end.
 * The caller starts the children only once all are forked: this process is the registry too, and
 * a child forked after a connection was accepted would hold the registry's end of it open. */
static pid_t child_of(const char *proc, const char *uid_, const char *sock, int fd, int *go_w, int *ready, int *end)
{
	int go[2], rd[2], en[2];
	if (pipe(go) < 0 || pipe(rd) < 0 || pipe(en) < 0)
		return -1;
	pid_t pid = fork();
	if (pid == 0) {
		char c;
		close(go[1]);
		close(rd[0]);
		close(en[1]);
		(void)!read(go[0], &c, 1);
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		snprintf(a.sun_path, sizeof(a.sun_path), "%.107s", sock);
		char state = 'X';
		if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
			/* Closed by the registry ('C'), or still open when the parent asks ('O', its byte);
			 * what the registry says on a kept connection is read and passed over. */
			struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = en[0], .events = POLLIN } };
			char buf[512];
			int pr = 0;
			while (state == 'X' && (pr = poll(p, 2, 30000)) > 0) {
				int on_fd = (p[0].revents & (POLLIN | POLLHUP)) != 0;
				ssize_t got = on_fd ? recv(fd, buf, sizeof(buf), MSG_DONTWAIT) : -1;
				if (got == 0 || (p[0].revents & POLLERR) || (on_fd && got < 0 && errno != EAGAIN))
					state = 'C'; /* closed: at its end, or reset */
				else if (p[1].revents & POLLIN)
					state = read(en[0], &c, 1) == 1 ? 'O' : 'X';
				else if (!on_fd)
					break; /* neither: nothing more to learn */
			}
			if (state == 'X')
				fprintf(stderr, "child %d: neither closed nor kept: poll %d, revents %#x %#x, errno %d\n",
					(int)getpid(), pr, p[0].revents, p[1].revents, errno);
		} else {
			fprintf(stderr, "child %d: connect: %s\n", (int)getpid(), strerror(errno));
		}
		(void)!write(rd[1], &state, 1);
		(void)!read(en[0], &c, 1);
		_exit(0);
	}
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "mkdir -p %s/%d && printf '%%s\\n' "
		 "'0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s"
		 ".slice/cri-containerd-" C ".scope' > %s/%d/cgroup", proc, (int)pid, uid_, proc, (int)pid);
	if (system(cmd) != 0)
		return -1;
	close(go[0]);
	close(rd[1]);
	close(en[0]);
	*go_w = go[1];
	*ready = rd[0];
	*end = en[1];
	return pid;
}

/* Polls (bounded, 5 s) until the registry holds want processes. */
static int wait_count(struct agent_registry *r, int want)
{
	for (int i = 0; i < 500; i++) {
		if (agent_registry_count(r) == want)
			return 1;
		struct timespec ts = { 0, 10 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	return 0;
}

int main(void)
{
	char dir[] = "/tmp/gcr-test-registry.XXXXXX";
	char path[256], sock[256], run[128];
	struct gcr_err err;
	struct agent_registry *r = NULL;
	CHECK(mkdtemp(dir) != NULL);
	snprintf(run, sizeof(run), "%s/run", dir);
	snprintf(sock, sizeof(sock), "%s/agent.sock", run);
	snprintf(path, sizeof(path), "%s/proc/%d", dir, (int)getpid());
	char cmd[2048];
	snprintf(cmd, sizeof(cmd), "mkdir -p %s && printf '%%s\\n' "
		 "'0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" U_
		 ".slice/cri-containerd-" C ".scope' > %s/cgroup", path, path);
	CHECK(system(cmd) == 0);
	snprintf(path, sizeof(path), "%s/proc", dir);

	CHECK(agent_registry_new(sock, run, NULL, path, 0, &r, &err) == 0);
	CHECK(agent_registry_start(r, &err) == 0);
	CHECK(agent_registry_count(r) == 0);
	/* Any local user may connect (a shim in a non-root container); only credentials count. */
	struct stat ss;
	CHECK(stat(sock, &ss) == 0 && S_ISSOCK(ss.st_mode) && (ss.st_mode & 07777) == 0666);
	CHECK(stat(run, &ss) == 0 && (ss.st_mode & 07777) == 0711);

	/* Register: the pid comes from the credentials, not from what is sent. */
	int fd = gcr_sock_connect(sock, 1000, &err);
	CHECK(fd >= 0);
	const char *line = "{\"v\":1,\"id\":0,\"op\":\"register\",\"args\":{\"socket\":\"/x\",\"pid\":1}}\n";
	CHECK(gcr_sock_write_all(fd, line, strlen(line), 1000, &err) == 0);
	CHECK(wait_count(r, 1));
	struct agent_registry_proc p[4];
	CHECK(agent_registry_find(r, U, NULL, p, 4) == 1);
	CHECK(p[0].pid == getpid());
	CHECK_STR(p[0].container_id, C);
	CHECK(agent_registry_find(r, U, C, p, 4) == 1);
	CHECK(agent_registry_find(r, U, "00", p, 4) == 0);
	CHECK(agent_registry_find(r, "5e8d2c4a-1b3f-4a6e-9c7d-0f2e4a6c8b1d", NULL, p, 4) == 0);
	CHECK(agent_registry_get(r, getpid(), &p[1]) == 0);
	CHECK(agent_registry_get(r, 1, &p[1]) == -ENOENT);

	/* EOF: the process is gone. */
	close(fd);
	CHECK(wait_count(r, 0));
	CHECK(agent_registry_find(r, U, NULL, p, 4) == 0);

	/* A process outside any pod is not tracked. */
	snprintf(cmd, sizeof(cmd), "printf '0::/user.slice\\n' > %s/%d/cgroup", path, (int)getpid());
	CHECK(system(cmd) == 0);
	fd = gcr_sock_connect(sock, 1000, &err);
	CHECK(fd >= 0);
	CHECK(wait_count(r, 0));
	close(fd);

	/* Each pod's share (agent_share, 3 here): five children of one pod register, the last two
	 * are refused (their connection closed at once) while another pod's child still registers;
	 * once the children exit, their entries go although their parent holds the connections. */
	gcr_log_level = GCR_LOG_ERROR;
	struct agent_shares *shares = agent_shares_new();
	struct agent_share *sh = agent_shares_add(shares, &(struct agent_share_cfg){ .name = "registry", .what = "processes",
										 .capacity = AGENT_REGISTRY_MAX, .per_owner = 3 },
						  &err);
	CHECK(sh != NULL);
	agent_registry_set_share(r, sh);
	int kfd[6], go[6], ready[6], end[6];
	pid_t kid[6];
	char closed = 0, open_n = 0;
	for (int i = 0; i < 6; i++) {
		kfd[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		kid[i] = child_of(path, i < 5 ? U_ : U2_, sock, kfd[i], &go[i], &ready[i], &end[i]);
		CHECK(kid[i] > 0);
	}
	for (int i = 0; i < 6; i++) { /* at once */
		(void)!write(go[i], "g", 1);
		close(go[i]);
	}
	/* The two refused are closed (the registry's answer, however long it takes: 30 s bound); then
	 * the others are asked whether theirs is still open. */
	char st[6] = { 0 };
	for (int n = 0; n < 2;) {
		struct pollfd pf[6];
		for (int i = 0; i < 6; i++)
			pf[i] = (struct pollfd){ .fd = st[i] ? -1 : ready[i], .events = POLLIN };
		if (poll(pf, 6, 30000) <= 0)
			break;
		for (int i = 0; i < 6; i++)
			if (pf[i].revents & POLLIN) {
				CHECK(read(ready[i], &st[i], 1) == 1);
				n++;
			}
	}
	for (int i = 0; i < 6; i++) {
		if (st[i] == 0) {
			(void)!write(end[i], "p", 1);
			CHECK(read(ready[i], &st[i], 1) == 1);
		}
		if (i < 5) {
			closed += st[i] == 'C';
			open_n += st[i] == 'O';
		} else {
			CHECK(st[i] == 'O'); /* the other pod is not affected */
		}
	}
	if (!(open_n == 3 && closed == 2))
		for (int i = 0; i < 6; i++)
			fprintf(stderr, "child %d (pid %d): %c\n", i, (int)kid[i], st[i]);
	CHECK(open_n == 3 && closed == 2);
	CHECK(wait_count(r, 4));
	CHECK(agent_share_used(sh, U) == 3 && agent_share_used(sh, U2) == 1);
	CHECK(agent_registry_find(r, U2, NULL, p, 4) == 1 && p[0].pid == kid[5]);
	/* The children exit, unreaped (zombies keep their pids: the stat file says Z). */
	for (int i = 0; i < 6; i++) {
		(void)!write(end[i], "e", 1);
		CHECK(waitid(P_PID, (id_t)kid[i], &(siginfo_t){ 0 }, WEXITED | WNOWAIT) == 0);
		snprintf(cmd, sizeof(cmd), "printf '%d (x) Z 1 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 0\\n' > %s/%d/stat",
			 (int)kid[i], path, (int)kid[i]);
		CHECK(system(cmd) == 0);
	}
	CHECK(wait_count(r, 0)); /* the sweep: zombies, connections still open here */
	for (int i = 0; i < 6; i++)
		CHECK(waitpid(kid[i], NULL, 0) == kid[i]);
	CHECK(agent_share_used(sh, U) == 0 && agent_share_used(sh, U2) == 0);
	for (int i = 0; i < 6; i++) {
		close(kfd[i]);
		close(ready[i]);
		close(end[i]);
	}

	agent_registry_free(r);
	agent_shares_free(shares);
	struct stat sb;
	CHECK(stat(sock, &sb) < 0); /* socket removed */
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return test_summary("test_agent_registry");
}
