/* gcr_ctrdump: a container's CRIU dump (gcr_ctrdump.h). The init is found by walking PPid
 * up from the process while its innermost pid is not 1, inside the same namespace depth; the
 * status files are read, as anything from /proc of another user's process, as untrusted text. */
#include "gcr_ctrdump.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STATUS_MAX 16384 /* bytes of /proc/<pid>/status read (about 1.5 KiB in practice) */
#define WALK_MAX 4096    /* ancestors walked at most */
#define LINE_MAX_LEN 512
#define PID_MAX_VALUE 4194304 /* the kernel's PID_MAX_LIMIT */

/* One number in [1, PID_MAX_VALUE] (0 too when zero_ok) at *p, skipping blanks; *p moves past it. */
static int number(const char **p, const char *end, int zero_ok, pid_t *out)
{
	const char *s = *p;
	while (s < end && (*s == ' ' || *s == '\t'))
		s++;
	long v = 0;
	const char *d = s;
	while (s < end && *s >= '0' && *s <= '9' && s - d < 8)
		v = v * 10 + (*s++ - '0');
	if (s == d || (s < end && *s >= '0' && *s <= '9') || v > PID_MAX_VALUE || (v == 0 && !zero_ok))
		return -EINVAL;
	*out = (pid_t)v;
	*p = s;
	return 0;
}

int gcr_ctrdump_parse_status(const char *text, size_t len, struct gcr_ctrdump_status *st, struct gcr_err *err)
{
	memset(st, 0, sizeof(*st));
	int have_ppid = 0;
	const char *p = text, *end = text + len;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;
		if ((size_t)(le - p) > 6 && memcmp(p, "PPid:", 5) == 0) {
			const char *q = p + 5;
			if (number(&q, le, 1, &st->ppid) < 0)
				return gcr_err_set(err, -EINVAL, "status: malformed PPid line");
			have_ppid = 1;
		} else if ((size_t)(le - p) > 7 && memcmp(p, "NSpid:", 6) == 0) {
			const char *q = p + 6;
			st->nspid_levels = 0;
			for (;;) {
				while (q < le && (*q == ' ' || *q == '\t'))
					q++;
				if (q == le)
					break;
				pid_t v;
				if (number(&q, le, 0, &v) < 0 || st->nspid_levels == 32)
					return gcr_err_set(err, -EINVAL, "status: malformed NSpid line");
				if (st->nspid_levels++ == 0)
					st->nspid_outer = v;
				st->nspid_inner = v;
			}
			if (st->nspid_levels == 0)
				return gcr_err_set(err, -EINVAL, "status: empty NSpid line");
		}
		p = nl ? nl + 1 : end;
	}
	if (!have_ppid)
		return gcr_err_set(err, -EINVAL, "status: no PPid line");
	return 0;
}

static int read_status(const char *proc_root, pid_t pid, struct gcr_ctrdump_status *st, struct gcr_err *err)
{
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/%d/status", proc_root, (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot read %s: %s", path, strerror(errno));
	char *buf = malloc(STATUS_MAX);
	size_t n = 0;
	ssize_t r = 0;
	while (buf != NULL && n < STATUS_MAX && (r = read(fd, buf + n, STATUS_MAX - n)) > 0)
		n += (size_t)r;
	int saved = errno;
	close(fd);
	if (buf == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = r < 0 ? gcr_err_set(err, -saved, "cannot read %s: %s", path, strerror(saved))
		       : gcr_ctrdump_parse_status(buf, n, st, err);
	free(buf);
	if (rc == -EINVAL)
		gcr_err_wrap(err, "%s", path);
	return rc;
}

int gcr_ctrdump_find_init(const char *proc_root, pid_t pid, pid_t *init, unsigned long *netns, struct gcr_err *err)
{
	struct gcr_ctrdump_status st;
	int rc = read_status(proc_root, pid, &st, err);
	if (rc < 0)
		return rc;
	if (st.nspid_levels <= 1)
		return gcr_err_set(err, -ESRCH, "pid %d is in this PID namespace: not in a container", (int)pid);
	int levels = st.nspid_levels;
	pid_t cur = pid;
	for (int i = 0; st.nspid_inner != 1; i++) {
		if (i == WALK_MAX)
			return gcr_err_set(err, -ELOOP, "pid %d: no init of its PID namespace within %d ancestors", (int)pid,
					   WALK_MAX);
		cur = st.ppid;
		if (cur <= 0)
			return gcr_err_set(err, -ESRCH, "pid %d: its PID namespace's init is not visible here", (int)pid);
		rc = read_status(proc_root, cur, &st, err);
		if (rc < 0)
			return rc;
		if (st.nspid_levels != levels)
			return gcr_err_set(err, -ESRCH, "pid %d: left its PID namespace at pid %d without meeting its init",
					   (int)pid, (int)cur);
	}
	char path[PATH_MAX];
	struct stat sb;
	snprintf(path, sizeof(path), "%s/%d/ns/net", proc_root, (int)cur);
	if (stat(path, &sb) < 0)
		return gcr_err_set(err, -errno, "cannot read %s: %s", path, strerror(errno));
	*init = cur;
	*netns = (unsigned long)sb.st_ino;
	return 0;
}

static int append(struct gcr_criu_argv *a, const char *s)
{
	size_t len = strlen(s) + 1;
	if (a->n >= GCR_CRIU_MAX_ARGS || a->used + len > sizeof(a->buf))
		return -ENAMETOOLONG;
	a->v[a->n++] = memcpy(a->buf + a->used, s, len);
	a->v[a->n] = NULL;
	a->used += len;
	return 0;
}

int gcr_ctrdump_argv(const struct gcr_criu_info *info, pid_t pid, const char *images_dir, enum gcr_criu_after after,
		     struct gcr_criu_argv *a, struct gcr_err *err)
{
	pid_t init;
	unsigned long netns;
	int rc = gcr_ctrdump_find_init("/proc", pid, &init, &netns, err);
	if (rc < 0)
		return rc;
	rc = gcr_criu_dump_argv(info, init, images_dir, after, a, err);
	if (rc < 0)
		return rc;
	struct stat own;
	char net[64];
	snprintf(net, sizeof(net), "net[%lu]:" GCR_CTRDUMP_NET_KEY, netns);
	rc = append(a, "--external");
	if (rc == 0)
		rc = append(a, "mnt[]");
	if (rc == 0 && (stat("/proc/self/ns/net", &own) < 0 || (unsigned long)own.st_ino != netns)) {
		rc = append(a, "--external");
		if (rc == 0)
			rc = append(a, net);
	}
	return rc < 0 ? gcr_err_set(err, rc, "criu dump command too long") : 0;
}
