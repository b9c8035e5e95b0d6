/* test_agent_registry: a shim's registration over the real socket (this process
 * plays the shim), identified by peer credentials and a fake <procRoot>/<pid>/cgroup. */
#include "agent_registry.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gcr_sock.h"

#define U "1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8f"
#define U_ "1f0c5b0e_9d7a_4c2b_8e6f_3a4b5c6d7e8f"
#define C "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"

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

	agent_registry_free(r);
	struct stat sb;
	CHECK(stat(sock, &sb) < 0); /* socket removed */
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	CHECK(system(cmd) == 0);
	return test_summary("test_agent_registry");
}
