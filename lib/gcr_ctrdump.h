/* gcr_ctrdump: the CRIU dump of a process that lives in a container (docs/images.md, "Pods"):
 * CRIU cannot dump one process of a PID namespace ("Can't dump a pid namespace without the
 * process init"), so the unit is the container's tree from its namespace's init, with the bind
 * mounts the runtime made (their sources are not in CRIU's mount namespace) and the pod
 * sandbox's network namespace marked external, as runc's checkpoint does. */
#ifndef GCR_CTRDUMP_H
#define GCR_CTRDUMP_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_criu.h"
#include "gcr_error.h"

/* The key the sandbox's network namespace gets in the images (--external net[INODE]:KEY); a
 * restore passes the new sandbox's namespace under it (--inherit-fd fd[N]:KEY). */
#define GCR_CTRDUMP_NET_KEY "gcr-pod-net"

/* From /proc/<pid>/status: PPid, and the NSpid line's first (as /proc's mount sees it) and
 * last (innermost namespace) numbers; nspid_levels is how many the line had (0: no line). */
struct gcr_ctrdump_status {
	pid_t ppid;
	pid_t nspid_outer, nspid_inner;
	int nspid_levels;
};

/* Parses the text of a status file (len bytes, no NUL needed). 0, or -EINVAL when PPid is
 * missing or a number is malformed or out of range. */
int gcr_ctrdump_parse_status(const char *text, size_t len, struct gcr_ctrdump_status *st, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The init of pid's PID namespace, as proc_root numbers it (the ancestor whose innermost pid
 * is 1), and the inode of its network namespace. -ESRCH when pid is in proc_root's own PID
 * namespace (no container: dump pid itself), -ENOENT / -EACCES from /proc, -ELOOP past 4096
 * ancestors. */
int gcr_ctrdump_find_init(const char *proc_root, pid_t pid, pid_t *init, unsigned long *netns,
			  struct gcr_err *err) __attribute__((warn_unused_result));

/* From the text of the container's /proc/<init>/mountinfo (len bytes), CRIU configuration lines
 * "external mnt[MOUNTPOINT]:MOUNTPOINT", one per mount CRIU cannot dump from the agent's own
 * mount namespace: every mount but "/" (and nsfs) that is a bind of a subdirectory (root not "/") or of a
 * file system other than the pseudo ones CRIU recreates (proc, sysfs, tmpfs, devpts, mqueue,
 * cgroup, overlay...), as runc marks its bind mounts. Into out (outlen bytes, NUL-terminated);
 * *n gets the count. 0, -EINVAL (a malformed line, or a path with an escape or a bracket),
 * -ENOSPC (out too small). */
int gcr_ctrdump_externals(const char *text, size_t len, char *out, size_t outlen, int *n, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* The dump command of the container holding pid: gcr_criu_dump_argv of its init, plus
 * "--config images_dir/ctrdump.conf" (written here: its external mounts, above),
 * "--network-lock nftables" (an agent image has no iptables), "--ghost-limit 16M" (the shim's
 * library, replaced under a running pod when the DaemonSet rolls, is a deleted mapped file) and, when its network namespace is
 * not ours, "--external net[INODE]:GCR_CTRDUMP_NET_KEY". 0, or the errors above, -errno writing
 * the file, or -ENAMETOOLONG. */
int gcr_ctrdump_argv(const struct gcr_criu_info *info, pid_t pid, const char *images_dir,
		     enum gcr_criu_after after, struct gcr_criu_argv *a, struct gcr_err *err)
	__attribute__((warn_unused_result));

#endif
