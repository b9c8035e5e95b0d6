/* agent_images: the node's directory of images written for Checkpoints with action Image,
 * <root>/<namespace>/<pod>/<checkpoint name>, and what removes them (docs/images.md, "Pods"):
 * the oldest of a pod past the limit once a new one commits, and those whose Checkpoint is gone.
 * A partial image (a name holding ".partial.") or a directory without a manifest is never
 * removed here: it may be a checkpoint being written. */
#ifndef AGENT_IMAGES_H
#define AGENT_IMAGES_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_error.h"
#include "gcr_image.h"

/* The image directory of Checkpoint ns/name of pod (each a valid Kubernetes name) under root
 * (absolute), into out (len bytes). 0, -EINVAL (a name that is not one, a relative root) or
 * -ENAMETOOLONG. */
int agent_images_path(const char *root, const char *ns, const char *pod, const char *name, char *out, size_t len,
		      struct gcr_err *err) __attribute__((warn_unused_result));

/* Creates the parent directories of path (mode 0700; existing ones are left as they are).
 * 0 or -errno. */
int agent_images_mkparents(const char *path, struct gcr_err *err) __attribute__((warn_unused_result));

/* Whether dir is an allocation's image directory under root: exactly <root>/.alloc/<id>, id 1..64
 * lowercase hex digits (what the device plugin makes; nothing else is ever written to). */
int agent_images_is_alloc_dir(const char *root, const char *dir);

/* Moves the whole image from to (its parents made first), never over anything (RENAME_NOREPLACE:
 * -EEXIST). 0 or -errno. */
int agent_images_move(const char *from, const char *to, struct gcr_err *err) __attribute__((warn_unused_result));

/* Ownership: with owner NULL (images node-local) every committed image counts; with owner (a
 * node name: images on storage every node shares) only those whose manifest's "node" is owner,
 * so two nodes' agents never remove, nor count, each other's images (an image without "node"
 * is nobody's and stays). */

/* Removes the oldest committed images in pod_dir (<root>/<ns>/<pod>) of owner past keep (>= 1),
 * oldest by the manifest's "created", then by name. Returns how many were removed (>= 0), or
 * -errno when pod_dir cannot be read. */
int agent_images_prune(const char *pod_dir, int keep, const char *owner, struct gcr_err *err);

/* Whether path (a full path: <dir>/<name>) is what an Image in flight owns (its work directory
 * or partial image), so the sweep keeps it. */
typedef int (*agent_images_owned_fn)(void *data, const char *path);

/* Whether Checkpoint ns/name exists: 1 yes, 0 no, < 0 unknown (nothing is removed). */
typedef int (*agent_images_exists_fn)(void *data, const char *ns, const char *name);

/* Removes every committed image of owner under root whose Checkpoint does not exist (empty pod
 * directories stay: one may be about to get an image). Returns how many images were removed
 * (>= 0); a root that does not exist is 0. */
int agent_images_sweep(const char *root, const char *owner, agent_images_exists_fn exists, void *data,
		       struct gcr_err *err);
/* The same sweep also removes, in every pod directory, partial images (names holding
 * ".partial.") that owned (may be NULL) does not keep and that are older than
 * AGENT_IMAGES_PARTIAL_MAX_AGE_S (now - their last change): what an agent killed mid-image left.
 * Returns images and partials removed. */
int agent_images_sweep_partials(const char *root, agent_images_owned_fn owned, void *data, long long now);

/* ---- a pod's side of an image whose CPU side is the kubelet's (docs/images.md) ----
 * The shim writes and reads GPU data in its own mount namespace, so the agent works in a
 * directory of the pod's socket directory (always mounted, at the same path in every pod),
 * reached through descriptors opened inside the pod's root (gcr_procns_open_dir), never by
 * following a name the pod could have swapped for a symbolic link. */

/* Creates <sockdir>/image-<uid> (mode 0700) for pid, sockdir being pid's GCR_SOCKET_DIR (or
 * /run/gcr): *dfd gets a descriptor of it (the caller closes it), inside (len bytes) its path
 * as pid sees it. -EEXIST when it exists. */
int agent_images_pod_dir(pid_t pid, const char *uid, int *dfd, char *inside, size_t len, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* The same path, made by nothing (what agent_images_pod_dir would create). */
int agent_images_pod_path(pid_t pid, const char *uid, char *inside, size_t len, struct gcr_err *err)
	__attribute__((warn_unused_result));
/* A descriptor of the existing directory dir (as pid sees it, opened inside its root, no
 * symbolic link followed at its last step), or -errno. */
int agent_images_pod_open(pid_t pid, const char *dir, struct gcr_err *err);
/* Removes dir (as pid sees it) and everything under it, inside pid's root. Best effort. */
void agent_images_pod_remove(pid_t pid, const char *dir);

/* Copies the regular files of directory sub of src_dfd into a new directory sub of dst_dfd
 * (mode 0700, files 0600, fsynced), refusing any entry that is not a regular file. Returns
 * the bytes copied, or -errno. */
long long agent_images_copy_dir(int src_dfd, int dst_dfd, const char *sub, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The same, each file's SHA-256 taken as it is copied and compared with m's entry for
 * "sub/<name>" (a signed manifest, gcr_imagemac: every file has one): a file m does not list,
 * or whose bytes differ, fails the copy (-EIO, "changed"). What is copied is what was checked,
 * whatever the source does meanwhile. m NULL: as agent_images_copy_dir. */
struct gcr_image_manifest;
long long agent_images_copy_dir_checked(int src_dfd, int dst_dfd, const char *sub, const struct gcr_image_manifest *m,
					struct gcr_err *err) __attribute__((warn_unused_result));

/* Copies the GPU data files a pod's process wrote, src_dfd's gpu/, into a new directory gpu/ of
 * dst_dfd, bounded by what the pod may make the agent write (docs/install.md, "Input bounds"):
 * its table (gpu/allocs.json: GCR_IMAGE_MAX_TABLE bytes at most, parsed within the budget of
 * gcr_jsonbudget) names every other file; each is a regular file of exactly the bytes its chunks
 * need, without holes (its blocks cover its size: a sparse file would cost the node's disk what it
 * never cost the pod's); together they hold at most max_bytes (the caller's bound: what the
 * process held on the GPU, and the container's ephemeral-storage limit). Anything else is
 * refused before a byte is written (-EFBIG past a bound, -EINVAL a file that is not one of the
 * table's, -EIO one that changed while copied). *t gets the table (the manifest's; the caller
 * clears it). Returns the bytes copied, or -errno. */
long long agent_images_copy_gpu(int src_dfd, int dst_dfd, unsigned long long max_bytes, struct gcr_image_table *t,
				struct gcr_err *err) __attribute__((warn_unused_result));

/* Copies the regular file src (opened without following a final symbolic link) to the new file
 * dst (0600, fsynced). Returns the bytes copied, or -errno. */
long long agent_images_copy_file(const char *src, const char *dst, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* Removes directory name in dfd and everything under it, never following a symbolic link (a
 * link is removed as a link), at most AGENT_IMAGES_MAX_DEPTH levels down (deeper entries, and
 * their parents, stay). Best effort. */
#define AGENT_IMAGES_MAX_DEPTH 16
void agent_images_remove_at(int dfd, const char *name);

/* ---- leftovers in directories a pod can write (docs/images.md, "Leftovers") ---- */

/* Empties every allocation's image directory (<root>/.alloc/<id>: the pod writes there, the
 * agent reads) of what no Image in flight owns, once AGENT_IMAGES_ALLOC_MIN_AGE_S old: nothing
 * the pod puts there lives long, outside every limit of the pod's. And every allocation's socket directory
 * (<alloc_root>/<id>, NULL: none) of its "image-*" directories no Image owns and older than
 * AGENT_IMAGES_PARTIAL_MAX_AGE_S (now - their ctime, which the pod cannot set back or ahead: a
 * Restore's copy in flight has no record). Returns the entries removed. */
int agent_images_sweep_allocs(const char *root, const char *alloc_root, agent_images_owned_fn owned, void *data,
			      long long now);

/* A partial image (a name holding ".partial.") no Image in flight of this node owns and older
 * than this (s): every image's run is bounded by its timeout (<= 1 h), so it is a leftover. */
#define AGENT_IMAGES_PARTIAL_MAX_AGE_S 7200
/* What a pod put in its image directory is removed once this old (s, since its last change). */
#define AGENT_IMAGES_ALLOC_MIN_AGE_S 15

#endif
