/* gcr_cr: the suspend/resume flow. Suspend: shim data out -> driver lock ->
 * driver checkpoint. Resume walks whatever state it finds back to running, so an
 * interrupted operation is finished by the next resume. */
#include "gcr_cr.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "gcr_client.h"
#include "gcr_driver.h"
#include "gcr_log.h"

/* A suspend of 64 GiB copies for about 1.5 s; leave ample room. */
#define SHIM_CALL_MS 600000

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *gcr_cr_mode_name(enum gcr_cr_mode m)
{
	return m == GCR_CR_DRIVER_ONLY ? "driver-only" : m == GCR_CR_DATA_ONLY ? "data-only" : "gcr";
}

void gcr_cr_result_clear(struct gcr_cr_result *r)
{
	if (r == NULL)
		return;
	json_decref(r->shim);
	memset(r, 0, sizeof(*r));
}

static const char *shim_state(json_t *status)
{
	const char *s = json_string_value(json_object_get(status, "state"));
	return s ? s : "";
}

/* Asks the shim to undo its data step after a later step failed. */
static void undo_data(struct gcr_client *c, struct gcr_err *err)
{
	json_t *res = NULL;
	struct gcr_err e2;
	if (gcr_client_call(c, GCR_OP_RESUME_ID, NULL, SHIM_CALL_MS, &res, &e2) < 0)
		gcr_err_wrap(err, "and undoing the data step failed too (%s); run resume again", e2.msg);
	else
		gcr_err_wrap(err, "GPU data restored, process running");
	json_decref(res);
}

/* The shim's byte counts: what crossed PCIe, and the size of the buffers. */
static void shim_bytes(struct gcr_cr_result *r)
{
	json_t *copied = json_object_get(r->shim, "copied");
	r->bytes_total = json_integer_value(json_object_get(r->shim, "bytes"));
	r->bytes_moved = copied != NULL ? json_integer_value(copied) : r->bytes_total;
}

int gcr_cr_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL;
	double t0 = now_ms(), t;
	int rc = 0;
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_open(&c, o->socket_dir, pid, err);
		if (rc < 0)
			goto out;
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 10000, &status, err);
		if (rc < 0)
			goto out;
		if (strcmp(shim_state(status), "running") != 0) {
			rc = gcr_err_set(err, -EALREADY, "process %d is already suspended (shim state %s)",
					 (int)pid, shim_state(status));
			goto out;
		}
	}
	if (o->mode != GCR_CR_DATA_ONLY) {
		enum gcr_driver_state ds;
		rc = gcr_driver_state(pid, &ds, err);
		if (rc < 0)
			goto out;
		if (ds != GCR_DRIVER_RUNNING) {
			rc = gcr_err_set(err, -EALREADY, "process %d is already suspended (driver state %s)",
					 (int)pid, gcr_driver_state_name(ds));
			goto out;
		}
	}
	t0 = now_ms();
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		json_t *args = json_pack("{s:i}", "timeout_ms", o->timeout_ms);
		rc = gcr_client_call(&c, GCR_OP_SUSPEND_ID, args, SHIM_CALL_MS, &r->shim, err);
		if (rc < 0)
			goto out; /* the shim unwound itself: still running */
		shim_bytes(r);
		r->ms_data = now_ms() - t0;
	}
	if (o->mode != GCR_CR_DATA_ONLY) {
		t = now_ms();
		rc = gcr_driver_lock(pid, (unsigned)o->timeout_ms, err);
		r->ms_lock = now_ms() - t;
		if (rc < 0) {
			if (o->mode == GCR_CR_FULL)
				undo_data(&c, err);
			goto out;
		}
		t = now_ms();
		rc = gcr_driver_checkpoint(pid, err);
		r->ms_checkpoint = now_ms() - t;
		if (rc < 0) {
			struct gcr_err e2;
			if (gcr_driver_unlock(pid, &e2) < 0)
				gcr_err_wrap(err, "unlock failed too (%s)", e2.msg);
			else if (o->mode == GCR_CR_FULL)
				undo_data(&c, err);
			goto out;
		}
	}
	r->ms_total = now_ms() - t0;
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		/* Off the clock: unused staging goes back only now, because giving memory
		 * back while the driver checkpoints slows the checkpoint. */
		json_t *res = NULL;
		struct gcr_err e2;
		if (gcr_client_call(&c, GCR_OP_TRIM_ID, NULL, 10000, &res, &e2) < 0)
			GCR_LOG(GCR_LOG_WARN, "gcr_cr", "pid %d: staging not trimmed: %s", (int)pid, e2.msg);
		json_decref(res);
	}
out:
	json_decref(status);
	gcr_client_close(&c);
	return rc;
}

int gcr_cr_resume(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL;
	int rc = 0, did = 0;
	enum gcr_driver_state ds = GCR_DRIVER_RUNNING;
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_open(&c, o->socket_dir, pid, err);
		if (rc < 0)
			goto out;
	}
	if (o->mode != GCR_CR_DATA_ONLY) {
		rc = gcr_driver_state(pid, &ds, err);
		if (rc < 0)
			goto out;
	}
	double t0 = now_ms(), t;
	if (ds == GCR_DRIVER_FAILED) {
		rc = gcr_err_set(err, -EIO, "the driver reports process %d in the failed state", (int)pid);
		goto out;
	}
	if (ds == GCR_DRIVER_CHECKPOINTED) {
		t = now_ms();
		rc = gcr_driver_restore(pid, err);
		r->ms_restore = now_ms() - t;
		if (rc < 0) {
			gcr_err_wrap(err, "process still suspended; retry when the GPU has room");
			goto out;
		}
		ds = GCR_DRIVER_LOCKED;
		did = 1;
	}
	if (ds == GCR_DRIVER_LOCKED) {
		t = now_ms();
		rc = gcr_driver_unlock(pid, err);
		r->ms_unlock = now_ms() - t;
		if (rc < 0)
			goto out;
		did = 1;
	}
	if (o->mode != GCR_CR_DRIVER_ONLY) {
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 10000, &status, err);
		if (rc < 0)
			goto out;
		if (strcmp(shim_state(status), "suspended") == 0) {
			t = now_ms();
			rc = gcr_client_call(&c, GCR_OP_RESUME_ID, NULL, SHIM_CALL_MS, &r->shim, err);
			r->ms_data = now_ms() - t;
			if (rc < 0) {
				gcr_err_wrap(err, "GPU data still in host memory, process held at the gate; retry resume");
				goto out;
			}
			shim_bytes(r);
			did = 1;
		}
	}
	if (!did) {
		rc = gcr_err_set(err, -EINVAL, "process %d is not suspended", (int)pid);
		goto out;
	}
	r->ms_total = now_ms() - t0;
out:
	json_decref(status);
	gcr_client_close(&c);
	return rc;
}

int gcr_cr_status(pid_t pid, const struct gcr_cr_opts *o, json_t **out, struct gcr_err *err)
{
	*out = NULL;
	struct gcr_client c = { .fd = -1 };
	json_t *status = NULL;
	int rc = gcr_client_open(&c, o->socket_dir, pid, err);
	if (rc == -ESRCH)
		return rc;
	if (rc == 0)
		rc = gcr_client_call(&c, GCR_OP_STATUS_ID, NULL, 10000, &status, err);
	gcr_client_close(&c);
	json_t *o_json = json_pack("{s:i, s:o*}", "pid", (int)pid, "shim", status);
	enum gcr_driver_state ds;
	struct gcr_err e2;
	if (gcr_driver_state(pid, &ds, &e2) == 0)
		json_object_set_new(o_json, "driver", json_string(gcr_driver_state_name(ds)));
	else
		json_object_set_new(o_json, "driver_error", json_string(e2.msg));
	if (rc < 0)
		json_object_set_new(o_json, "shim_error", json_string(err->msg));
	*out = o_json;
	return 0;
}
