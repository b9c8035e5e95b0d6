/* gcr_cr: one suspend or resume of a process, in the right order: the shim's data
 * step, then the driver's control step (and the reverse), undoing on failure.
 * gcrctl and the node agent both run C/R through here. */
#ifndef GCR_CR_H
#define GCR_CR_H

#include <jansson.h>
#include <sys/types.h>

#include "gcr_error.h"

enum gcr_cr_mode {
	GCR_CR_FULL = 0,    /* shim data path + driver checkpoint: 0 bytes left on the GPU */
	GCR_CR_DRIVER_ONLY, /* the driver's checkpoint API alone (the baseline) */
	GCR_CR_DATA_ONLY,   /* the shim's data path alone; the context stays resident */
};

struct gcr_cr_opts {
	const char *socket_dir;
	enum gcr_cr_mode mode;
	int timeout_ms; /* for the gate and the driver lock */
};

struct gcr_cr_result {
	double ms_data, ms_lock, ms_checkpoint, ms_restore, ms_unlock, ms_total;
	long long bytes_moved;  /* by the shim's data path, over PCIe */
	long long bytes_total;  /* the buffers the shim staged (moved + zero + unchanged) */
	json_t *shim;           /* the shim's own report (owned), or NULL */
};

const char *gcr_cr_mode_name(enum gcr_cr_mode m);
void gcr_cr_result_clear(struct gcr_cr_result *r);

/* 0 or -errno. After a failure the process is running (suspend) or still
 * suspended and resumable (resume); err says which step failed and why. */
int gcr_cr_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);
int gcr_cr_resume(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);

/* The shim's status (or NULL if the process has no shim) and the driver's state. */
int gcr_cr_status(pid_t pid, const struct gcr_cr_opts *o, json_t **out, struct gcr_err *err);

#endif
