/* gcr_criu: CRIU for the control state of AMD (HIP) processes: finding it, checking its version
 * (4.0 or newer) and amdgpu plugin before anything is touched, and the dump/restore commands. */
#ifndef GCR_CRIU_H
#define GCR_CRIU_H

#include <limits.h>
#include <sys/types.h>

#include "gcr_error.h"

#define GCR_CRIU_MIN_MAJOR 4
#define GCR_CRIU_DEFAULT_PLUGIN_DIR "/usr/lib/criu" /* CRIU's own default */
#define GCR_CRIU_AMDGPU_PLUGIN "amdgpu_plugin.so"

/* Where to look; NULL members take $GCR_CRIU (else "criu" on $PATH) and $CRIU_LIBS_DIR (else
 * the default plugin directory). */
struct gcr_criu_cfg {
	const char *criu;
	const char *plugin_dir;
	int timeout_ms; /* for every criu run; 0: 60000 */
	/* Images of CUDA processes (gcr_imgcr): no amdgpu plugin needed, and no --libdir: GCR
	 * does the GPU part itself (the driver's checkpoint and the shim's files). */
	int no_plugin;
};

struct gcr_criu_info {
	char path[PATH_MAX];       /* the criu binary */
	int major, minor, patch;   /* its version */
	char plugin_dir[PATH_MAX]; /* passed as --libdir and $CRIU_LIBS_DIR */
	char plugin[PATH_MAX];     /* the amdgpu plugin found there */
	int timeout_ms;
	/* Where restore writes its log; empty: restore.log in the images directory. An image
	 * directory is verified by its manifest, so its restores log elsewhere. */
	char restore_log[PATH_MAX];
};

/* Reads "Version: X.Y[.Z]" from `criu --version` output. 0 or -EINVAL. */
int gcr_criu_parse_version(const char *out, int *major, int *minor, int *patch, struct gcr_err *err);

/* Finds criu, runs `criu --version`, requires 4.0 or newer and (unless cfg->no_plugin) the
 * amdgpu plugin. 0, or
 * -ENOENT (no criu, no plugin), -ENOTSUP (too old), -EIO (unreadable version), each with a
 * message that says what to install. Runs nothing else. */
int gcr_criu_check(const struct gcr_criu_cfg *cfg, struct gcr_criu_info *info, struct gcr_err *err);

/* What a dump leaves behind: CRIU's default kills the process (its GPU queues are freed);
 * LEAVE_RUNNING is a snapshot; LEAVE_STOPPED keeps it stopped for a later kill or resume. */
enum gcr_criu_after { GCR_CRIU_KILL = 0, GCR_CRIU_LEAVE_RUNNING, GCR_CRIU_LEAVE_STOPPED };

#define GCR_CRIU_MAX_ARGS 32
/* An argument vector; the strings live in buf, so it is one object with no other owner. */
struct gcr_criu_argv {
	int n;
	char *v[GCR_CRIU_MAX_ARGS + 1]; /* NULL-terminated */
	char buf[4 * PATH_MAX];
	size_t used;
};

/* The commands (docs/amd.md explains each option); images_dir must exist. 0 or -ENAMETOOLONG. */
int gcr_criu_dump_argv(const struct gcr_criu_info *info, pid_t pid, const char *images_dir,
		       enum gcr_criu_after after, struct gcr_criu_argv *a, struct gcr_err *err);
int gcr_criu_restore_argv(const struct gcr_criu_info *info, const char *images_dir, const char *pidfile,
			  struct gcr_criu_argv *a, struct gcr_err *err);

/* Runs a command with $CRIU_LIBS_DIR set, bounded by info->timeout_ms. 0, or -EIO with the
 * exit status and the last line it printed, or -ETIMEDOUT (the run is killed). */
int gcr_criu_run(const struct gcr_criu_info *info, const struct gcr_criu_argv *a, struct gcr_err *err);

#endif
