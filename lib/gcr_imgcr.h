/* gcr_imgcr: a process to an image on disk and back (docs/images.md), in order, undoing on
 * failure: suspend (gcr_cr), the shim's image-write, CRIU's dump, the manifest, the commit;
 * and verify, CRIU's restore, the shim's image-read, resume. gcrctl runs it (the agent will). */
#ifndef GCR_IMGCR_H
#define GCR_IMGCR_H

#include <jansson.h>
#include <sys/types.h>

#include "gcr_cr.h"
#include "gcr_error.h"
#include "gcr_image.h"

/* The steps of gcr_imgcr_checkpoint, in order: the suspend to the partial image's files, CRIU's
 * dump, the manifest and the commit, and (leave_running) the resume from the committed files. */
enum gcr_imgcr_step {
	GCR_IMGCR_STEP_SUSPEND,
	GCR_IMGCR_STEP_DUMP,
	GCR_IMGCR_STEP_SEAL,
	GCR_IMGCR_STEP_BACK,
};

struct gcr_imgcr_opts {
	const struct gcr_cr_opts *cr; /* socket dir, timeouts */
	int leave_running;            /* checkpoint: the process goes on (else CRIU ends it) */
	/* checkpoint: the baseline, the driver's checkpoint plus CRIU alone (no shim needed: the
	 * GPU data goes into CRIU's page dump); the image's mode says so and restore follows it */
	int driver_only;
	/* restore: check every GPU data chunk before CRIU runs, rather than while it restores the
	 * CPU side (then a corrupt chunk removes the restored process, which was held at the gate
	 * and never resumed). Slower by the time of that check. */
	int verify_first;
	/* restore: become a child subreaper, so the restored process is ours once CRIU exits and a
	 * failed restore reaps it at once (gcrctl: it exits next, and the process goes to init). A
	 * daemon that sets it must reap the processes it restores when they end. */
	int subreaper;
	/* checkpoint: the process is in a container, so CRIU dumps the container's whole tree
	 * from its PID namespace's init, bind mounts and sandbox netns external (gcr_ctrdump;
	 * docs/images.md, "Pods"). Restoring such an image is the container runtime's part. */
	int whole_container;
	/* checkpoint: the Kubernetes node whose agent writes the image, and the container the
	 * process runs in, recorded in its manifest (NULL or "": none) */
	const char *node, *container;
	/* checkpoint: told before each step, with the partial image's path, so that a caller that
	 * may die meanwhile (the node agent) records how far it got before the step runs; NULL:
	 * none. */
	void (*step)(void *data, enum gcr_imgcr_step step, const char *partial);
	void *step_data;
	/* checkpoint: sign the manifest with this key, every file's SHA-256 in it (images on
	 * shared storage, gcr_imagemac; NULL: unsigned) */
	const struct gcr_imagemac_key *sign;
};

struct gcr_imgcr_result {
	pid_t pid;                      /* checkpointed, or restored */
	double ms_suspend, ms_write, ms_dump, ms_manifest, ms_resume, ms_total;
	double ms_verify, ms_restore, ms_read; /* read: attaching gpu/ files; resume moves the data */
	double ms_check; /* the GPU data's checksums: beside ms_restore, or before it (verify_first) */
	long long bytes, written, zero; /* GPU bytes: all staged, written to gpu/, recorded as zero */
	long long rss;                  /* the process's resident bytes when CRIU dumped it */
	long long image;                /* bytes of the image's files */
};

/* Checkpoints pid to the image dir (which must not exist). On failure before the commit the
 * partial directory is removed and the process is left as it was (resumed if this suspended it
 * and the dump did not end it); err says which step failed and the process's state. */
int gcr_imgcr_checkpoint(pid_t pid, const char *dir, const struct gcr_imgcr_opts *o, struct gcr_imgcr_result *r,
			 struct gcr_err *err);
/* What gcr_imgcr_seal writes into a manifest besides the files and the machine. */
struct gcr_imgcr_seal {
	const char *mode;         /* GCR_IMAGE_MODE_*; NULL: gcr */
	pid_t pid;                /* the process imaged */
	const char *socket;       /* its shim's control socket (NULL: none) */
	const char *shim_version; /* its shim's version; NULL: this build's */
	const char *vendor;       /* "amd" for a HIP process; NULL: this machine's (nvidia) */
	const char *node, *container; /* NULL: none */
	int no_table;             /* the driver mode: no gpu/, no table */
	const struct gcr_imagemac_key *sign; /* sign the manifest (gcr_imagemac); NULL: unsigned */
	/* The table of partial's gpu/ as the caller parsed it already (moved into the manifest, *table
	 * left empty); NULL: read from partial. */
	struct gcr_image_table *table;
};

/* The end of every image, whatever wrote its files: partial (DIR.partial.<pid>, holding criu/
 * and gpu/ with the shim's table) gets its manifest (the table, every file's size and CRC-32C,
 * s's fields, this machine's GPU and driver), all fsynced, and is committed as dir. On failure
 * partial is left as it was, for the caller to remove. *gpu_bytes (may be NULL) gets the sum of
 * the table's allocations. */
int gcr_imgcr_seal(const char *partial, const char *dir, const struct gcr_imgcr_seal *s, long long *gpu_bytes,
		   struct gcr_err *err) __attribute__((warn_unused_result));
/* The bytes of an image's files (its manifest, criu/ and gpu/), by their sizes. */
long long gcr_imgcr_bytes(const char *dir);

/* Restores the image dir: refused before anything is touched unless gcr_image_verify passes
 * against this machine; a failure after CRIU's restore kills the restored process. */
int gcr_imgcr_restore(const char *dir, const struct gcr_imgcr_opts *o, struct gcr_imgcr_result *r,
		      struct gcr_err *err);
/* The GPU part of a restore a container runtime did (docs/images.md, "Restore into a new
 * pod"), and the end of a suspend to an image a runtime's checkpoint followed: pid, held at
 * its shim's gate with its GPU data in dir/gpu (dir as pid's mount namespace sees it), reads
 * that data back (image-read; its shim found through cro->socket_dir, or its own view of it
 * for a process in a container) and resumes. On failure pid is left suspended; the caller
 * decides whether it ends (err says which step failed). Every wait on the process is bounded
 * by cro->call_ms (0: an hour, the disk's bound). */
int gcr_imgcr_resume_restored(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, struct gcr_imgcr_result *r,
			      struct gcr_err *err);
/* The same with the image's GPU files handed over as open descriptors (read-only) instead of a
 * directory the process can see: names[i] (as the image's table names it, "gpu/...") is fds[i];
 * n at most GCR_SOCK_MAX_FDS. Nothing is copied, and the process can reach no other file of the
 * image. The caller keeps and closes its descriptors. */
struct gcr_imgcr_files {
	const char *const *names;
	const int *fds;
	int n;
};
int gcr_imgcr_resume_restored_fds(pid_t pid, const struct gcr_imgcr_files *f, const struct gcr_cr_opts *cro,
				  struct gcr_imgcr_result *r, struct gcr_err *err);
/* image-read alone: pid's data, in dir/gpu's files only, becomes what its next resume reads
 * (it stays suspended). */
int gcr_imgcr_attach(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, struct gcr_err *err);
/* image-write alone: pid, suspended with its data in host memory, writes it to dir/gpu's files
 * and gives that memory back (its data then in those files only: gcr_imgcr_attach before a
 * resume); its registry connection closed and control socket re-bound for a CRIU dump. *bytes
 * gets the GPU bytes imaged. */
int gcr_imgcr_write(pid_t pid, const char *dir, const struct gcr_cr_opts *cro, long long *bytes, struct gcr_err *err);

/* What this machine offers an image (GPU 0's model, the driver, this gcr's shim version). */
void gcr_imgcr_expect_here(struct gcr_image_expect *e);

#endif
