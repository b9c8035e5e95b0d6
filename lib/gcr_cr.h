/* gcr_cr: one suspend or resume of a process, in the right order: the shim's data
 * step, then the control step (and the reverse), undoing on failure. The control step
 * is the CUDA driver's checkpoint API for CUDA processes and CRIU for HIP (AMD) ones,
 * chosen from the shim's status ("backends"). gcrctl and the node agent both run C/R
 * through here. */
#ifndef GCR_CR_H
#define GCR_CR_H

#include <jansson.h>
#include <sys/types.h>

#include "gcr_error.h"

enum gcr_cr_mode {
	GCR_CR_FULL = 0,    /* shim data path + control step (driver checkpoint / CRIU) */
	GCR_CR_DRIVER_ONLY, /* the driver's checkpoint API alone (the baseline; CUDA only) */
	GCR_CR_DATA_ONLY,   /* the shim's data path alone; the context stays resident */
};

/* Where CRIU images go without opts->images_dir: $GCR_IMAGES_DIR, else this; one directory
 * per pid beneath. */
#define GCR_CR_IMAGES_DIR "/var/lib/gcr/images"
/* Written in a pid's images directory after a CRIU dump, removed after its restore: resume
 * restores with CRIU exactly when it is there. */
#define GCR_CR_DUMP_MARK "gcr-dump"

struct gcr_cr_opts {
	const char *socket_dir;
	enum gcr_cr_mode mode;
	int timeout_ms;         /* for the gate and the driver lock */
	const char *images_dir; /* CRIU images (HIP, full mode); NULL: see GCR_CR_IMAGES_DIR */
	/* Skip the restore room check (suspend: record no need; resume: restore without knowing
	 * there is room). An out-of-memory driver restore loses the process: the user's call. */
	int unchecked;
};

/* Bytes the driver's restore gets beyond what NVML showed the process holding before its
 * checkpoint: $GCR_RESTORE_MARGIN_MIB, else this (docs/design.md, "Restore room"). */
#define GCR_CR_RESTORE_MARGIN_MIB 128

struct gcr_cr_result {
	/* ms_checkpoint / ms_restore: the driver's, or CRIU's dump / restore for HIP. */
	double ms_data, ms_lock, ms_checkpoint, ms_restore, ms_unlock, ms_total;
	double ms_room; /* resume: the restore room check (NVML); suspend: recording the need */
	const char *control;    /* "driver", "criu", or "none" (data only) */
	long long bytes_moved;  /* by the shim's data path, over PCIe */
	long long bytes_total;  /* the buffers the shim staged (moved + zero + unchanged) */
	json_t *shim;           /* the shim's own report (owned), or NULL */
};

const char *gcr_cr_mode_name(enum gcr_cr_mode m);
void gcr_cr_result_clear(struct gcr_cr_result *r);

/* 0 or -errno. After a failure the process is running (suspend) or still
 * suspended and resumable (resume); err says which step failed and why. Resume answers
 * -ENOSPC, before touching anything, when a GPU lacks the room the driver's restore needs
 * (retry later), and -ENOTSUP when that cannot be checked (no NVML, no need recorded). */
int gcr_cr_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);
int gcr_cr_resume(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);

/* The shim's status (or NULL if the process has no shim) and the driver's state ("none" for
 * a HIP process; "criu": "dumped" for a process CRIU dumped and ended). */
int gcr_cr_status(pid_t pid, const struct gcr_cr_opts *o, json_t **out, struct gcr_err *err);

#endif
