/* gcr_procns: a process's own view of things, read through /proc: its pid in its own
 * PID namespace, a variable of its environment, and a directory of its root. */
#ifndef GCR_PROCNS_H
#define GCR_PROCNS_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_error.h"

/* 1 when pid shares this process's PID and mount namespaces, 0 when it does not, or a
 * negative errno when that cannot be read (no such process, no permission). */
int gcr_procns_same(pid_t pid, struct gcr_err *err);

/* *nspid: pid as its own (innermost) PID namespace numbers it: the last field of
 * /proc/<pid>/status's NSpid line (pid itself on a kernel without the line). */
int gcr_procns_nspid(pid_t pid, pid_t *nspid, struct gcr_err *err);

/* The value of name in pid's environment as it was at exec (/proc/<pid>/environ; a
 * process's later setenv is not seen). -ENOENT when unset, -ENAMETOOLONG when the value
 * does not fit in len bytes. */
int gcr_procns_env(pid_t pid, const char *name, char *out, size_t len, struct gcr_err *err);

/* An O_PATH descriptor of dir (absolute, as pid sees it) resolved inside pid's root
 * (/proc/<pid>/root): symlinks on the way resolve in that root, not in ours, and none
 * may leave it. The caller closes it. A name under it is reachable as
 * "/proc/self/fd/<fd>/<name>", a short path whatever the depth of dir. */
int gcr_procns_open_dir(pid_t pid, const char *dir, struct gcr_err *err);

#endif
