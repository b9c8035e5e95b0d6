/* Unit test of lib/gcr_cr without a GPU: the combined process state (gcr_cr_state_combine,
 * every shim state x driver state x mode), and gcr_cr_state, gcr_cr_status, suspend and
 * resume against a stand-in shim this process serves for its own pid, with no CUDA driver
 * (GCR_LIBCUDA names none), which is the missing-driver rule's case. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_client.h"
#include "gcr_cr.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "util.h"

/* ---- the combining function, table-driven ---- */

/* Driver columns: not read, then each driver state, then a HIP process (no driver). */
enum { D_UNREAD, D_RUNNING, D_LOCKED, D_CKPT, D_FAILED, D_UNKNOWN, D_HIP, D_N };
static const enum gcr_driver_state drv_of[D_N] = { GCR_DRIVER_RUNNING, GCR_DRIVER_RUNNING, GCR_DRIVER_LOCKED,
						   GCR_DRIVER_CHECKPOINTED, GCR_DRIVER_FAILED, GCR_DRIVER_UNKNOWN,
						   GCR_DRIVER_RUNNING };

/* One row per shim state, one letter per driver column: R running, S suspended, P partial. */
struct row {
	enum gcr_cr_mode mode;
	enum gcr_shimreply_st shim;
	const char *want;
};

static const struct row rows[] = {
	/*                                                 unread run lock ckpt fail unk hip */
	{ GCR_CR_FULL, GCR_SHIMREPLY_ST_RUNNING, "RRPPPPR" },
	{ GCR_CR_FULL, GCR_SHIMREPLY_ST_SUSPENDED, "PPPSPPS" },
	{ GCR_CR_FULL, GCR_SHIMREPLY_ST_SUSPENDING, "PPPPPPP" },
	{ GCR_CR_FULL, GCR_SHIMREPLY_ST_RESUMING, "PPPPPPP" },
	{ GCR_CR_FULL, GCR_SHIMREPLY_ST_UNKNOWN, "PPPPPPP" },
	{ GCR_CR_DATA_ONLY, GCR_SHIMREPLY_ST_RUNNING, "RRPPPPR" },
	{ GCR_CR_DATA_ONLY, GCR_SHIMREPLY_ST_SUSPENDED, "SSPPPPS" },
	{ GCR_CR_DATA_ONLY, GCR_SHIMREPLY_ST_SUSPENDING, "PPPPPPP" },
	{ GCR_CR_DATA_ONLY, GCR_SHIMREPLY_ST_RESUMING, "PPPPPPP" },
	{ GCR_CR_DATA_ONLY, GCR_SHIMREPLY_ST_UNKNOWN, "PPPPPPP" },
	{ GCR_CR_DRIVER_ONLY, GCR_SHIMREPLY_ST_RUNNING, "RRPSPPR" },
	{ GCR_CR_DRIVER_ONLY, GCR_SHIMREPLY_ST_SUSPENDED, "PPPPPPP" },
	{ GCR_CR_DRIVER_ONLY, GCR_SHIMREPLY_ST_SUSPENDING, "PPPPPPP" },
	{ GCR_CR_DRIVER_ONLY, GCR_SHIMREPLY_ST_RESUMING, "PPPPPPP" },
	{ GCR_CR_DRIVER_ONLY, GCR_SHIMREPLY_ST_UNKNOWN, "PPPPPPP" },
	/* A member of an NCCL group between the steps of its group's operation: never taken as
	 * running or suspended (gcrctl resume --group finishes it). */
#define GROUP_ROWS(st) { GCR_CR_FULL, st, "PPPPPPP" }, { GCR_CR_DATA_ONLY, st, "PPPPPPP" }, \
		       { GCR_CR_DRIVER_ONLY, st, "PPPPPPP" },
	GROUP_ROWS(GCR_SHIMREPLY_ST_FROZEN) GROUP_ROWS(GCR_SHIMREPLY_ST_DRAINED) GROUP_ROWS(GCR_SHIMREPLY_ST_DETACHED)
	GROUP_ROWS(GCR_SHIMREPLY_ST_REBUILDING) GROUP_ROWS(GCR_SHIMREPLY_ST_REBUILT)
#undef GROUP_ROWS
};

static enum gcr_cr_st st_of_letter(char c)
{
	return c == 'R' ? GCR_CR_ST_RUNNING : c == 'S' ? GCR_CR_ST_SUSPENDED : GCR_CR_ST_PARTIAL;
}

static void test_combine(void)
{
	int covered[3][GCR_SHIMREPLY_ST_N] = { { 0 } };
	for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++) {
		covered[rows[r].mode][rows[r].shim] = 1;
		for (int d = 0; d < D_N; d++) {
			struct gcr_cr_proc_state in = { .exists = 1, .shim = 1, .shim_st = rows[r].shim,
							.hip = d == D_HIP, .driver = d != D_UNREAD && d != D_HIP,
							.driver_st = drv_of[d], .state = GCR_CR_ST_GONE };
			enum gcr_cr_st got = gcr_cr_state_combine(&in, rows[r].mode);
			if (got != st_of_letter(rows[r].want[d]))
				fprintf(stderr, "mode %s, shim %s, driver column %d: %s, want %c\n",
					gcr_cr_mode_name(rows[r].mode), gcr_shimreply_st_name(rows[r].shim), d,
					gcr_cr_st_name(got), rows[r].want[d]);
			CHECK(got == st_of_letter(rows[r].want[d]));
		}
	}
	for (int m = 0; m < 3; m++)
		for (int s = 0; s < GCR_SHIMREPLY_ST_N; s++)
			CHECK(covered[m][s]); /* every shim state in every mode has its row */
	/* Without a shim the driver does not matter: CRIU's images, a process, or none. */
	for (int m = 0; m < 3; m++)
		for (int d = 0; d < D_N; d++) {
			struct gcr_cr_proc_state in = { .exists = 1, .hip = d == D_HIP,
							.driver = d != D_UNREAD && d != D_HIP, .driver_st = drv_of[d] };
			CHECK(gcr_cr_state_combine(&in, (enum gcr_cr_mode)m) == GCR_CR_ST_UNMANAGED);
			in.exists = 0;
			CHECK(gcr_cr_state_combine(&in, (enum gcr_cr_mode)m) == GCR_CR_ST_GONE);
			in.dumped = 1;
			CHECK(gcr_cr_state_combine(&in, (enum gcr_cr_mode)m) == GCR_CR_ST_SUSPENDED);
		}
}

static void test_names(void)
{
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_RUNNING), "running");
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_SUSPENDED), "suspended");
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_PARTIAL), "partial");
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_UNMANAGED), "unmanaged");
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_GONE), "gone");
	CHECK_STR(gcr_cr_st_name(GCR_CR_ST_N), "unknown");
	CHECK_STR(gcr_cr_mode_name(GCR_CR_FULL), "gcr");
	CHECK_STR(gcr_cr_mode_name(GCR_CR_DATA_ONLY), "data-only");
	CHECK_STR(gcr_cr_mode_name(GCR_CR_DRIVER_ONLY), "driver-only");
	struct gcr_cr_result r = { .shim = json_object() };
	gcr_cr_result_clear(&r); /* frees the report */
	CHECK(r.shim == NULL && r.ms_total == 0);
	gcr_cr_result_clear(NULL);
}

/* ---- a stand-in shim, served by this process for its own pid ---- */

static struct {
	int lfd;
	atomic_int stop;
	const char *state;        /* what status and reports say */
	int hip;                  /* backends: HIP only */
	int fail_suspend;         /* answer suspend with this -errno */
	int old_proto;            /* a shim before the restore_need op: the need rides a trim */
	atomic_int n_old_need;    /* needs taken that way */
	atomic_int n_status, n_suspend, n_resume, n_trim, n_need;
} fake;

static json_t *fake_status(void)
{
	return json_pack("{s:i, s:s, s:s, s:{s:b, s:b}}", "pid", (int)getpid(), "state", fake.state, "version",
			 "test", "backends", "cuda", !fake.hip, "hip", fake.hip);
}

static char *fake_answer(const char *line)
{
	struct gcr_req req;
	struct gcr_err err;
	if (gcr_proto_parse_request(line, &req, &err) < 0)
		return gcr_proto_reply_err_line(0, err.code, err.msg);
	json_t *res = NULL;
	int code = 0;
	switch (req.op) {
	case GCR_OP_STATUS_ID:
		fake.n_status++;
		res = fake_status();
		break;
	case GCR_OP_SUSPEND_ID:
		fake.n_suspend++;
		if (fake.fail_suspend != 0) {
			code = fake.fail_suspend;
		} else if (strcmp(fake.state, GCR_STATE_RUNNING) != 0) {
			code = -EALREADY;
		} else {
			fake.state = GCR_STATE_SUSPENDED;
			res = json_pack("{s:I, s:I, s:s}", "bytes", (json_int_t)4096, "copied", (json_int_t)1024,
					"state", fake.state);
		}
		break;
	case GCR_OP_RESUME_ID:
		fake.n_resume++;
		if (strcmp(fake.state, GCR_STATE_SUSPENDED) != 0) {
			code = -EINVAL;
		} else {
			fake.state = GCR_STATE_RUNNING;
			res = json_pack("{s:I, s:s}", "bytes", (json_int_t)4096, "state", fake.state);
		}
		break;
	case GCR_OP_TRIM_ID:
		/* As the shim: the need goes with its own op now. */
		fake.n_trim++;
		if (fake.old_proto && json_is_false(json_object_get(req.args, "trim")) &&
		    json_is_object(json_object_get(req.args, "restore_need"))) {
			fake.n_old_need++;
			res = json_object();
		} else if (json_object_size(req.args) != 0) {
			code = -EINVAL;
		} else {
			res = json_object();
		}
		break;
	case GCR_OP_RESTORE_NEED_ID: {
		struct gcr_need need;
		fake.n_need++;
		if (fake.old_proto)
			code = -EOPNOTSUPP;
		else if (strcmp(fake.state, GCR_STATE_SUSPENDED) != 0)
			code = -EINVAL;
		else if ((code = gcr_proto_need_parse(req.args, &need, &err)) == 0)
			res = json_object();
		break;
	}
	default: code = -EOPNOTSUPP; break;
	}
	long long id = req.id;
	gcr_req_clear(&req);
	return code < 0 ? gcr_proto_reply_err_line(id, code, "refused by the stand-in")
			: gcr_proto_reply_ok_line(id, res);
}

static void *fake_main(void *arg)
{
	(void)arg;
	while (!fake.stop) {
		struct pollfd p = { .fd = fake.lfd, .events = POLLIN };
		if (poll(&p, 1, 50) <= 0)
			continue;
		int fd = accept(fake.lfd, NULL, NULL);
		if (fd < 0)
			continue;
		struct gcr_linebuf lb;
		struct gcr_err err;
		char *line;
		if (gcr_linebuf_init(&lb, GCR_PROTO_MAX_LINE) == 0) {
			while (gcr_linebuf_read(&lb, fd, 5000, &line, &err) == 0) {
				char *out = fake_answer(line);
				if (out == NULL || gcr_sock_write_all(fd, out, strlen(out), 5000, &err) < 0) {
					free(out);
					break;
				}
				free(out);
			}
			gcr_linebuf_free(&lb);
		}
		close(fd);
	}
	return NULL;
}

static void reset_fake(const char *state, int hip)
{
	fake.state = state;
	fake.hip = hip;
	fake.fail_suspend = 0;
	fake.old_proto = 0;
	fake.n_status = fake.n_suspend = fake.n_resume = fake.n_trim = fake.n_need = fake.n_old_need = 0;
}

/* A HIP process in full mode with a stand-in CRIU (tests/unit/fake-criu.sh, which dumps
 * nothing and ends nothing): the data step, then criu dump and its mark; the state reads
 * suspended; resume restores from the images (the pid file names this pid), then the data. */
static void hip_full(const char *dir)
{
	const char *src = getenv("top_srcdir");
	char fake_criu[PATH_MAX], plugin[PATH_MAX], log[PATH_MAX], mark[PATH_MAX], pid[32];
	snprintf(fake_criu, sizeof(fake_criu), "%s/tests/unit/fake-criu.sh", src ? src : ".");
	snprintf(plugin, sizeof(plugin), "%s/amdgpu_plugin.so", dir);
	snprintf(log, sizeof(log), "%s/criu.log", dir);
	snprintf(mark, sizeof(mark), "%s/%d/%s", dir, (int)getpid(), GCR_CR_DUMP_MARK);
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	FILE *f = fopen(plugin, "w");
	CHECK(f != NULL && fclose(f) == 0);
	setenv("GCR_CRIU", fake_criu, 1);
	setenv("CRIU_LIBS_DIR", dir, 1);
	setenv("FAKE_CRIU_VERSION_OUT", "Version: 4.1", 1);
	setenv("FAKE_CRIU_LOG", log, 1);
	setenv("FAKE_CRIU_PID", pid, 1);
	struct gcr_cr_opts full = { .socket_dir = dir, .mode = GCR_CR_FULL, .timeout_ms = (int)test_ms(1000),
				    .images_dir = dir };
	struct gcr_cr_result r;
	struct gcr_cr_proc_state ps;
	struct gcr_err err;
	reset_fake(GCR_STATE_RUNNING, 1);
	CHECK(gcr_cr_suspend(getpid(), &full, &r, &err) == 0 && fake.n_suspend == 1);
	CHECK_STR(r.control, GCR_CR_CONTROL_CRIU);
	gcr_cr_result_clear(&r);
	CHECK(access(mark, F_OK) == 0);
	CHECK(gcr_cr_state(getpid(), &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED && ps.hip);
	CHECK(gcr_cr_resume(getpid(), &full, &r, &err) == 0 && fake.n_resume == 1);
	CHECK_STR(r.control, GCR_CR_CONTROL_CRIU);
	gcr_cr_result_clear(&r);
	CHECK(access(mark, F_OK) != 0); /* restored: the mark goes */
	/* A failed dump gives the data back: the process runs. */
	setenv("FAKE_CRIU_RC", "1", 1);
	reset_fake(GCR_STATE_RUNNING, 1);
	CHECK(gcr_cr_suspend(getpid(), &full, &r, &err) < 0 && fake.n_suspend == 1 && fake.n_resume == 1);
	CHECK(strcmp(fake.state, GCR_STATE_RUNNING) == 0 && access(mark, F_OK) != 0);
	gcr_cr_result_clear(&r);
	unsetenv("FAKE_CRIU_RC");
	unlink(plugin);
	unlink(log);
	char images[PATH_MAX];
	snprintf(images, sizeof(images), "%s/%d/restore.pid", dir, (int)getpid());
	unlink(images);
	snprintf(images, sizeof(images), "%s/%d", dir, (int)getpid());
	rmdir(images);
}

static void test_with_shim(const char *dir)
{
	pid_t me = getpid();
	struct gcr_err err;
	struct gcr_cr_opts full = { .socket_dir = dir, .mode = GCR_CR_FULL, .timeout_ms = (int)test_ms(1000),
				    .images_dir = dir };
	struct gcr_cr_opts data = full, drvonly = full;
	data.mode = GCR_CR_DATA_ONLY;
	drvonly.mode = GCR_CR_DRIVER_ONLY;
	struct gcr_cr_proc_state ps;

	/* A running shim with no driver: running in every mode (the missing-driver rule). */
	reset_fake(GCR_STATE_RUNNING, 0);
	CHECK(gcr_cr_state(me, &full, &ps, &err) == 0);
	CHECK(ps.state == GCR_CR_ST_RUNNING && ps.shim && ps.shim_st == GCR_SHIMREPLY_ST_RUNNING && !ps.driver &&
	      !ps.hip && ps.exists && !ps.dumped);
	CHECK(gcr_cr_state(me, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_RUNNING);
	CHECK(gcr_cr_state(me, &drvonly, &ps, &err) == 0 && ps.state == GCR_CR_ST_RUNNING);

	/* Suspended by the shim, driver unread: suspended in data-only mode, partial in full. */
	reset_fake(GCR_STATE_SUSPENDED, 0);
	CHECK(gcr_cr_state(me, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED);
	CHECK(gcr_cr_state(me, &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_PARTIAL);
	/* A HIP process: no driver state; suspended in full mode too. */
	reset_fake(GCR_STATE_SUSPENDED, 1);
	CHECK(gcr_cr_state(me, &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED && ps.hip);
	reset_fake(GCR_STATE_SUSPENDING, 0);
	CHECK(gcr_cr_state(me, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_PARTIAL);

	/* gcr_cr_status: the same reading as JSON. */
	reset_fake(GCR_STATE_RUNNING, 0);
	json_t *st = NULL;
	CHECK(gcr_cr_status(me, &full, &st, &err) == 0 && st != NULL);
	CHECK_STR(json_string_value(json_object_get(st, "state")), "running");
	CHECK_STR(json_string_value(json_object_get(json_object_get(st, "shim"), "state")), GCR_STATE_RUNNING);
	CHECK(json_object_get(st, "driver") == NULL && json_is_string(json_object_get(st, "driver_error")));
	CHECK(json_object_get(st, "shim_error") == NULL);
	json_decref(st);
	reset_fake(GCR_STATE_RUNNING, 1);
	CHECK(gcr_cr_status(me, &full, &st, &err) == 0);
	CHECK_STR(json_string_value(json_object_get(st, "driver")), GCR_CR_DRIVER_NONE);
	json_decref(st);

	/* The restore's need: its own op; to a shim that predates the op, the trim form it knows. */
	{
		struct gcr_client c;
		struct gcr_need n = { .n = 1 };
		snprintf(n.dev[0].uuid, sizeof(n.dev[0].uuid), "GPU-test");
		n.dev[0].bytes = 1 << 20;
		json_t *nj = gcr_proto_need_json(&n);
		reset_fake(GCR_STATE_SUSPENDED, 0);
		CHECK(nj != NULL && gcr_client_open(&c, dir, me, &err) == 0);
		CHECK(gcr_cr_keep_need(&c, nj, 5000, &err) == 0 && fake.n_need == 1 && fake.n_old_need == 0);
		fake.old_proto = 1;
		CHECK(gcr_cr_keep_need(&c, nj, 5000, &err) == 0 && fake.n_need == 2 && fake.n_old_need == 1);
		reset_fake(GCR_STATE_RUNNING, 0); /* the new shim refuses a need while running: said */
		CHECK(gcr_cr_keep_need(&c, nj, 5000, &err) == -EINVAL && fake.n_old_need == 0);
		gcr_client_close(&c);
		json_decref(nj);
	}

	/* Suspend and resume, data only: the shim's steps alone, no driver needed. */
	reset_fake(GCR_STATE_RUNNING, 0);
	struct gcr_cr_result r;
	CHECK(gcr_cr_suspend(me, &data, &r, &err) == 0);
	CHECK(fake.n_suspend == 1 && fake.n_trim == 1 && r.bytes_total == 4096 && r.bytes_moved == 1024);
	CHECK(fake.n_need == 0); /* data only: no driver's restore to measure for */
	CHECK_STR(r.control, GCR_CR_CONTROL_NONE);
	gcr_cr_result_clear(&r);
	CHECK(gcr_cr_state(me, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED);
	/* A second suspend is refused from the status, before the shim is asked. */
	CHECK(gcr_cr_suspend(me, &data, &r, &err) == -EALREADY && fake.n_suspend == 1);
	gcr_cr_result_clear(&r);
	CHECK(gcr_cr_resume(me, &data, &r, &err) == 0 && fake.n_resume == 1 && r.bytes_total == 4096);
	gcr_cr_result_clear(&r);
	CHECK(gcr_cr_state(me, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_RUNNING);
	/* Resuming a running process: not suspended, the shim is not asked to resume. */
	CHECK(gcr_cr_resume(me, &data, &r, &err) == -EINVAL && fake.n_resume == 1);
	gcr_cr_result_clear(&r);
	/* The shim's own refusal comes back as its code; the process stays running. */
	fake.fail_suspend = -ETIMEDOUT;
	CHECK(gcr_cr_suspend(me, &data, &r, &err) == -ETIMEDOUT && strcmp(fake.state, GCR_STATE_RUNNING) == 0);
	gcr_cr_result_clear(&r);

	/* A HIP process, data only: the shim's steps, no CRIU. */
	reset_fake(GCR_STATE_RUNNING, 1);
	CHECK(gcr_cr_suspend(me, &data, &r, &err) == 0 && fake.n_suspend == 1);
	CHECK_STR(r.control, GCR_CR_CONTROL_NONE);
	gcr_cr_result_clear(&r);
	CHECK(gcr_cr_resume(me, &data, &r, &err) == 0 && fake.n_resume == 1);
	gcr_cr_result_clear(&r);
	/* A HIP process in full mode without CRIU: untouched. */
	setenv("GCR_CRIU", "/nonexistent/criu", 1);
	reset_fake(GCR_STATE_RUNNING, 1);
	CHECK(gcr_cr_suspend(me, &full, &r, &err) < 0 && fake.n_suspend == 0 && strstr(err.msg, "untouched") != NULL);
	gcr_cr_result_clear(&r);
	hip_full(dir);

	/* Full mode with no driver: refused after the status, before the shim moves anything. */
	reset_fake(GCR_STATE_RUNNING, 0);
	CHECK(gcr_cr_suspend(me, &full, &r, &err) < 0 && fake.n_suspend == 0 && fake.n_status == 1);
	gcr_cr_result_clear(&r);
	CHECK(gcr_cr_resume(me, &full, &r, &err) < 0 && fake.n_resume == 0);
	gcr_cr_result_clear(&r);
}

static void test_without_shim(const char *dir)
{
	struct gcr_err err;
	struct gcr_cr_opts full = { .socket_dir = dir, .mode = GCR_CR_FULL, .timeout_ms = (int)test_ms(1000),
				    .images_dir = dir };
	struct gcr_cr_proc_state ps;
	/* A process without a shim: unmanaged; status says why. */
	pid_t child = fork();
	if (child == 0) {
		pause();
		_exit(0);
	}
	CHECK(child > 0);
	CHECK(gcr_cr_state(child, &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_UNMANAGED && !ps.shim);
	json_t *st = NULL;
	CHECK(gcr_cr_status(child, &full, &st, &err) == 0);
	CHECK_STR(json_string_value(json_object_get(st, "state")), "unmanaged");
	CHECK(json_is_string(json_object_get(st, "shim_error")) && json_object_get(st, "shim") == NULL);
	json_decref(st);
	kill(child, SIGKILL);
	waitpid(child, NULL, 0);
	/* Gone: status is -ESRCH, the state says gone. */
	CHECK(gcr_cr_state(child, &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_GONE && !ps.exists);
	CHECK(gcr_cr_status(child, &full, &st, &err) == -ESRCH && st == NULL);
	/* Gone into CRIU's images (the dump mark): suspended, in every mode. */
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%d", dir, (int)child);
	CHECK(mkdir(path, 0700) == 0);
	snprintf(path, sizeof(path), "%s/%d/%s", dir, (int)child, GCR_CR_DUMP_MARK);
	FILE *f = fopen(path, "w");
	CHECK(f != NULL && fclose(f) == 0);
	CHECK(gcr_cr_state(child, &full, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED && ps.dumped);
	struct gcr_cr_opts data = full;
	data.mode = GCR_CR_DATA_ONLY;
	CHECK(gcr_cr_state(child, &data, &ps, &err) == 0 && ps.state == GCR_CR_ST_SUSPENDED);
	CHECK(gcr_cr_status(child, &full, &st, &err) == 0);
	CHECK_STR(json_string_value(json_object_get(st, "criu")), "dumped");
	CHECK_STR(json_string_value(json_object_get(st, "state")), "suspended");
	json_decref(st);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%d", dir, (int)child);
	rmdir(path);
}

int main(void)
{
	gcr_log_init(GCR_LOG_ERROR);
	setenv("GCR_LIBCUDA", "/nonexistent/libcuda.so.1", 1); /* no driver: the rule's case */
	test_combine();
	test_names();

	char dir[] = "/tmp/gcr-test-cr-XXXXXX", stem[64], path[PATH_MAX];
	struct gcr_err err;
	CHECK(mkdtemp(dir) != NULL);
	CHECK(gcr_sock_shim_stem(getpid(), getpid(), stem, sizeof(stem), &err) == 0);
	fake.lfd = gcr_sock_listen_unique(dir, stem, path, sizeof(path), &err);
	CHECK(fake.lfd >= 0);
	pthread_t t;
	if (fake.lfd >= 0 && pthread_create(&t, NULL, fake_main, NULL) == 0) {
		test_with_shim(dir);
		fake.stop = 1;
		pthread_join(t, NULL);
	}
	close(fake.lfd);
	unlink(path);
	test_without_shim(dir);
	rmdir(dir);
	return test_summary("test_gcr_cr");
}
