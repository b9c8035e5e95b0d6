/* test_shim_agent: the shim's side of overcommit against a scripted agent on a Unix socket:
 * threads out of memory at once, a refusal, an agent that never answers (the bound), a late
 * answer to an abandoned request, an agent restarted between requests, the wake line, and
 * opt-out. */
#include "shim_agent.h"
#include "shim_config.h"
#include "util.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gcr_proto.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* How the scripted agent answers room requests. */
enum mode { GRANT, REFUSE, SILENT, LATE, HANG_UP };

static char sock_path[256];
static int lfd = -1;
static atomic_int mode;
static atomic_int registers, rooms, wakes; /* lines seen */
static atomic_llong last_waited;           /* the last wake's "waited_ms" */
static atomic_int hangups;                 /* connections the agent closed */
static atomic_int delay_ms;         /* before each answer */
static atomic_int stop;

static void answer(int fd, long long id, int granted)
{
	char *line = gcr_proto_reply_ok_line(id, json_pack("{s:b, s:i, s:i, s:s}", "granted", granted, "suspended",
							    granted, "freed", 0, "reason", "scripted"));
	struct gcr_err err;
	(void)gcr_sock_write_all(fd, line, strlen(line), 1000, &err);
	free(line);
}

/* One connection at a time, as the registry sees a shim: lines in, answers out. */
static void *agent_main(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		if (poll(&p, 1, 50) <= 0)
			continue;
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		struct gcr_linebuf lb;
		gcr_linebuf_init(&lb, 65536);
		long long pending = -1; /* LATE: the request answered at the next one */
		for (;;) {
			char *line;
			struct gcr_err err;
			int rc = gcr_linebuf_read(&lb, fd, 200, &line, &err);
			if (rc == -ETIMEDOUT) {
				if (atomic_load(&stop))
					break;
				continue;
			}
			if (rc < 0)
				break;
			struct gcr_req req;
			if (gcr_proto_parse_request(line, &req, &err) < 0)
				break;
			if (req.op == GCR_OP_REGISTER_ID) {
				atomic_fetch_add(&registers, 1);
			} else if (req.op == GCR_OP_WAKE_ID) {
				atomic_store(&last_waited, (long long)json_integer_value(json_object_get(req.args, "waited_ms")));
				atomic_fetch_add(&wakes, 1); /* no answer: the shim reads none */
				if (atomic_load(&mode) == HANG_UP) {
					atomic_store(&mode, GRANT);
					gcr_req_clear(&req);
					goto closed;
				}
			} else if (req.op == GCR_OP_ROOM_ID) {
				atomic_fetch_add(&rooms, 1);
				int d = atomic_load(&delay_ms);
				if (d > 0)
					usleep((useconds_t)d * 1000);
				switch (atomic_load(&mode)) {
				case GRANT:
					answer(fd, req.id, 1);
					break;
				case REFUSE:
					answer(fd, req.id, 0);
					break;
				case SILENT:
					break;
				case LATE:
					if (pending >= 0) {
						answer(fd, pending, 0); /* for the abandoned one: must be ignored */
						answer(fd, req.id, 1);
						pending = -1;
					} else {
						pending = req.id;
					}
					break;
				case HANG_UP:
					atomic_store(&mode, GRANT); /* the next agent grants */
					gcr_req_clear(&req);
					goto closed;
				}
			}
			gcr_req_clear(&req);
		}
	closed:
		gcr_linebuf_free(&lb);
		close(fd);
		atomic_fetch_add(&hangups, 1);
	}
	return NULL;
}

static void *oom_thread(void *arg)
{
	int *rc = arg;
	*rc = shim_agent_room((size_t)64 << 20, 0);
	return NULL;
}

static void test_threads(void)
{
	atomic_store(&mode, GRANT);
	atomic_store(&delay_ms, 100); /* the others pile up behind the first */
	int before = atomic_load(&rooms);
	pthread_t th[8];
	int rc[8];
	for (int i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, oom_thread, &rc[i]);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	int all = 1;
	for (int i = 0; i < 8; i++)
		all &= rc[i] == 0;
	CHECK(all);
	/* One at a time on the connection: 8 threads, and those that waited while another's was
	 * granted retry without asking: fewer than 8 requests, at least one. */
	int asked = atomic_load(&rooms) - before;
	CHECK(asked >= 1 && asked < 8);
	atomic_store(&delay_ms, 0);
}

static void test_refused(void)
{
	atomic_store(&mode, REFUSE);
	CHECK(shim_agent_room(4096, 0) == -ENOSPC);
}

static void test_bound(void)
{
	atomic_store(&mode, SILENT);
	shim_cfg.room_timeout_ms = 300;
	double t0 = gcr_time_mono_ms();
	int rc = shim_agent_room(4096, 0);
	double took = gcr_time_mono_ms() - t0;
	CHECK(rc == -ETIMEDOUT);
	CHECK(took >= 290 && took < test_ms(2000));
	shim_cfg.room_timeout_ms = (int)test_ms(5000);
}

static void test_late(void)
{
	/* The first request goes unanswered past its bound; its answer (a refusal) arrives with
	 * the second's grant: the second must get its own. */
	atomic_store(&mode, LATE);
	shim_cfg.room_timeout_ms = 200;
	CHECK(shim_agent_room(4096, 0) == -ETIMEDOUT);
	shim_cfg.room_timeout_ms = (int)test_ms(5000);
	CHECK(shim_agent_room(4096, 0) == 0);
}

static void test_restart(void)
{
	/* The agent hangs up (restarted): the shim registers with the next one and asks again. */
	atomic_store(&mode, HANG_UP);
	int regs = atomic_load(&registers);
	CHECK(shim_agent_room(4096, 0) == 0);
	CHECK(atomic_load(&registers) == regs + 1);
}

/* Polls (bounded) until the scripted agent has seen n wakes. */
static int wakes_seen(int n)
{
	for (int i = 0; i < 2000 && atomic_load(&wakes) < n; i++)
		usleep(1000);
	return atomic_load(&wakes) >= n;
}

static void test_wake(void)
{
	/* One line, no answer awaited, the wait carried; a room request after it still gets its own
	 * answer (the wake left nothing behind on the connection). */
	atomic_store(&mode, GRANT);
	int before = atomic_load(&wakes);
	CHECK(shim_agent_wake(42) == 0);
	CHECK(wakes_seen(before + 1) && atomic_load(&last_waited) == 42);
	CHECK(shim_agent_room(4096, 0) == 0);
	/* Out of range: clamped to what the agent accepts. */
	CHECK(shim_agent_wake(-5) == 0 && wakes_seen(before + 2) && atomic_load(&last_waited) == 0);
	/* The agent hangs up after this wake (restarted): the next wake finds the connection broken,
	 * registers again and is sent on the new one. */
	int hung = atomic_load(&hangups);
	atomic_store(&mode, HANG_UP);
	CHECK(shim_agent_wake(1) == 0 && wakes_seen(before + 3));
	for (int i = 0; i < 2000 && atomic_load(&hangups) == hung; i++)
		usleep(1000);
	CHECK(atomic_load(&hangups) == hung + 1);
	int regs = atomic_load(&registers);
	CHECK(shim_agent_wake(7) == 0);
	CHECK(wakes_seen(before + 4) && atomic_load(&last_waited) == 7 && atomic_load(&registers) == regs + 1);
}

static void test_opt_out(void)
{
	shim_cfg.overcommit = 0;
	int before = atomic_load(&rooms);
	int tries = 0;
	CHECK(shim_agent_room(4096, 0) == -ENOTSUP);
	CHECK(!shim_agent_room_retry(4096, 0, &tries));
	CHECK(atomic_load(&rooms) == before);
	shim_cfg.overcommit = 1;
	/* The per-call bound: SHIM_AGENT_ROOM_TRIES grants, then no more. */
	atomic_store(&mode, GRANT);
	tries = 0;
	int n = 0;
	while (shim_agent_room_retry(4096, 0, &tries) && n < 10)
		n++;
	CHECK(n == SHIM_AGENT_ROOM_TRIES);
}

int main(void)
{
	char dir[] = "/tmp/gcr-test-shim-agent.XXXXXX";
	if (mkdtemp(dir) == NULL)
		return 1;
	snprintf(sock_path, sizeof(sock_path), "%s/agent.sock", dir);
	struct gcr_err err;
	lfd = gcr_sock_listen(sock_path, &err);
	CHECK(lfd >= 0);
	setenv(GCR_AGENT_SOCKET_ENV, sock_path, 1);
	shim_config_load();
	shim_cfg.overcommit = 1;
	shim_cfg.room_timeout_ms = (int)test_ms(5000);
	pthread_t th;
	pthread_create(&th, NULL, agent_main, NULL);
	shim_agent_register("/tmp/ctl.sock");
	test_threads();
	test_refused();
	test_bound();
	test_late();
	test_restart();
	test_wake();
	test_opt_out();
	shim_agent_drop();
	atomic_store(&stop, 1);
	pthread_join(th, NULL);
	close(lfd);
	unlink(sock_path);
	rmdir(dir);
	CHECK(atomic_load(&registers) >= 2);
	return test_summary("test_shim_agent");
}
