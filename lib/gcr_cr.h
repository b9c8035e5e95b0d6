/* gcr_cr: one suspend or resume of a process, in the right order: the shim's data
 * step, then the control step (and the reverse), undoing on failure. The control step
 * is the CUDA driver's checkpoint API for CUDA processes and CRIU for HIP (AMD) ones,
 * chosen from the shim's status ("backends"). gcrctl and the node agent both run C/R
 * through here. */
#ifndef GCR_CR_H
#define GCR_CR_H

#include <jansson.h>
#include <sys/types.h>

#include "gcr_driver.h"
#include "gcr_error.h"
#include "gcr_shimreply.h"

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
	/* Suspend straight to this image directory's gpu/ (gcr_imgcr; CUDA, full mode): the shim
	 * writes every chunk to a file instead of host memory. NULL: to host memory. */
	const char *image_dir;
	/* Resume onto other GPUs (the driver's gpuPairs; CUDA, full and driver-only modes): the
	 * room check looks at each pair's new GPU. */
	const struct gcr_gpu_pair *gpu_pairs;
	size_t ngpu_pairs;
	/* Resume onto this GPU (UUID): the one GPU the process used, whichever it was (a process of
	 * several GPUs needs gpu_pairs). Not with gpu_pairs. Pairs of GPUs the process did not use
	 * are left out; GPUs it used that no pair names stay where they were. Before the driver is
	 * called, every target must exist, be the same model and have room (-ENODEV / -EINVAL /
	 * -ENOSPC, the process still suspended where it was). */
	const char *target_gpu;
	/* Suspend: the node agent's overcommit suspend ("wake" to the shim: the process's next call
	 * tells the agent). Not with image_dir. */
	int wake;
	/* A member of a group of NCCL processes driven by lib/gcr_group.c: suspend takes it drained
	 * (its communicators are torn down first, "group" to the shim); resume leaves it detached for
	 * its group's rebuild. Without it, a member is refused (-EXDEV) before anything is touched. */
	int group;
	/* Each wait for the shim's answer at most this long (ms): the operation's own bound. 0: the
	 * flow's defaults (10 s for a status, 10 min for a suspend or resume, 1 h for a suspend to an
	 * image). A stopped process is given up on at once either way (gcr_client_call). */
	int call_ms;
};

/* Bytes the driver's restore gets beyond what NVML showed the process holding before its
 * checkpoint: $GCR_RESTORE_MARGIN_MIB, else this (docs/design.md, "Restore room"). */
#define GCR_CR_RESTORE_MARGIN_MIB 128

/* gcr_cr_result.control, and what gcr_cr_status says for a driver of a HIP process. */
#define GCR_CR_CONTROL_DRIVER "driver"
#define GCR_CR_CONTROL_CRIU "criu"
#define GCR_CR_CONTROL_NONE "none"
#define GCR_CR_DRIVER_NONE "none"

struct gcr_cr_result {
	/* ms_checkpoint / ms_restore: the driver's, or CRIU's dump / restore for HIP. */
	double ms_data, ms_lock, ms_checkpoint, ms_restore, ms_unlock, ms_total;
	double ms_room; /* resume: the restore room check (NVML); suspend: recording the need */
	double ms_init;  /* the driver opened (dlopen, cuInit): only a process's first driver use */
	double ms_state; /* the driver's state of the process asked (cuCheckpointProcessGetState) */
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
 * (retry later), and -ENOTSUP when that cannot be checked (no NVML, no need recorded).
 * -EXDEV: the process is a member of a group of NCCL processes (its shim holds communicators):
 * nothing touched; lib/gcr_group.c suspends and resumes the whole group. */
int gcr_cr_suspend(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);
int gcr_cr_resume(pid_t pid, const struct gcr_cr_opts *o, struct gcr_cr_result *r, struct gcr_err *err);

/* The driver's step alone, on a process whose shim is suspended (its data out): out (1) takes
 * its context off the GPU (the restore's need kept by the shim, the driver's lock and
 * checkpoint), in (0) brings it back (the room checked, the driver's restore and unlock). What a
 * data-only suspend lacks for a CRIU dump of the process, and gives back after it. On failure the
 * driver's side is as it was (err says so). CUDA only: -ENOTSUP for a HIP process. */
int gcr_cr_control(pid_t pid, const struct gcr_cr_opts *o, int out, struct gcr_err *err);

/* Gives the shim on c the GPU memory its process's restore will need (need: a gcr_proto_need_json
 * object, borrowed): the restore_need op. A shim older than that op (a pod still running the
 * previous chart's shim after an agent upgrade) answers -EOPNOTSUPP; it is sent the form it
 * knows, a trim that trims nothing carrying the need. 0 or -errno. */
struct gcr_client;
int gcr_cr_keep_need(struct gcr_client *c, json_t *need, int ms, struct gcr_err *err);

/* ---- a process's state, one value for every reader (gcrctl, the controller, scaling) ----
 *
 * Combined from three sources: the shim's state (its status reply), the CUDA driver's
 * checkpoint state, and CRIU's dump mark (a HIP process CRIU dumped, gone until restored).
 * A HIP process has no driver state: its control state is CRIU's. "Suspended" depends on
 * the mode asked: full (shim suspended, driver checkpointed), data only (shim suspended,
 * driver running), driver only (shim running, driver checkpointed).
 *
 * The rule for a driver state that cannot be read (no libcuda, a driver without the
 * checkpoint API, a process the driver does not know): it is taken as running, the driver
 * holding nothing. Why: gcr_cr's suspend always moves the data before the driver's
 * checkpoint, so a shim that says running has not been checkpointed by gcr; data-only mode
 * never calls the driver, and it is the mode of nodes where no driver state exists (HIP,
 * drivers before 550, GPU-less stand-in runs), where "unknown, so not resident" would make
 * every process look half-suspended (the controller then resumed running processes, which
 * fails: "not suspended"). Nothing is claimed suspended on the guess: a suspended shim with
 * an unreadable driver in full mode is PARTIAL, and suspend and resume in a mode that uses
 * the driver read it themselves and fail with its error. */
enum gcr_cr_st {
	GCR_CR_ST_RUNNING = 0, /* resident: nothing to resume */
	GCR_CR_ST_SUSPENDED,   /* suspended in the mode asked: a resume in that mode brings it back */
	GCR_CR_ST_PARTIAL,     /* between the two: an operation in flight or cut short, another mode's
				* suspend, or the driver's failed state; a resume finishes it or says why */
	GCR_CR_ST_UNMANAGED,   /* the process is there but no shim answers with a state: not gcr's */
	GCR_CR_ST_GONE,        /* no such process (and no CRIU images of it) */
	GCR_CR_ST_N
};

/* "running", "suspended", "partial", "unmanaged", "gone" (what gcrctl status prints as
 * "state"). */
const char *gcr_cr_st_name(enum gcr_cr_st s);

/* What gcr_cr_state read, and its verdict. */
struct gcr_cr_proc_state {
	enum gcr_cr_st state;       /* the verdict */
	int exists;                 /* 0: no such process */
	int shim;                   /* 1: the shim answered with a state name */
	enum gcr_shimreply_st shim_st; /* when shim: its state (UNKNOWN: a name this reader does not know) */
	int hip;                    /* the shim says HIP: no driver state, CRIU's instead */
	int driver;                 /* 1: the driver's state was read (0: see the rule above) */
	enum gcr_driver_state driver_st; /* when driver */
	int dumped;                 /* CRIU's dump mark is there and no shim answers */
	/* when shim: where its GPU data is (GPU when not suspended; HOST when unsaid, as older
	 * shims leave it while running) */
	enum gcr_shimreply_data data;
};

/* The verdict from the readings in *in (state ignored), in mode. The one place process
 * states are compared; pure, so it is tested over every combination. */
enum gcr_cr_st gcr_cr_state_combine(const struct gcr_cr_proc_state *in, enum gcr_cr_mode mode);

/* Reads pid's shim, driver and dump mark and combines them in opts->mode. Returns 0: every
 * outcome, gone included, is a state (err is kept for errors a later reading may have). An
 * unreadable shim status is logged and taken as no shim. */
int gcr_cr_state(pid_t pid, const struct gcr_cr_opts *opts, struct gcr_cr_proc_state *out, struct gcr_err *err);

/* The same reading as a JSON object: "pid", "state" (gcr_cr_st_name, combined in o->mode),
 * "shim" (its status, absent without a shim; "shim_error" says why), "driver" (the driver's
 * state name; "none" for a HIP process; absent when unreadable, "driver_error" says why),
 * "criu": "dumped" for a process CRIU dumped and ended. -ESRCH when the process does not
 * exist. */
int gcr_cr_status(pid_t pid, const struct gcr_cr_opts *o, json_t **out, struct gcr_err *err);

#endif
