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

/* Pseudo file systems CRIU recreates itself (their mount root "/"). */
static const char *const pseudo_fs[] = { "proc",  "sysfs",    "tmpfs",	"devpts", "mqueue",  "cgroup",
					 "cgroup2", "overlay", "devtmpfs", "securityfs", "debugfs", "tracefs",
					 "bpf",	  "hugetlbfs", "pstore", "configfs",	"fusectl" };

/* The n-th space-separated field of [s, e) into out (at most cap bytes with the NUL); 0 or -1. */
static int field(const char *s, const char *e, int n, char *out, size_t cap)
{
	for (int i = 0;; i++) {
		while (s < e && *s == ' ')
			s++;
		const char *f = s;
		while (s < e && *s != ' ')
			s++;
		if (f == s)
			return -1;
		if (i == n) {
			if ((size_t)(s - f) >= cap)
				return -1;
			memcpy(out, f, (size_t)(s - f));
			out[s - f] = '\0';
			return 0;
		}
	}
}

int gcr_ctrdump_externals(const char *text, size_t len, char *out, size_t outlen, int *n, struct gcr_err *err)
{
	size_t used = 0;
	*n = 0;
	if (outlen == 0)
		return gcr_err_set(err, -ENOSPC, "mountinfo: no room");
	out[0] = '\0';
	const char *p = text, *end = text + len;
	int line = 0;
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl ? nl : end;
		line++;
		if (le == p) {
			p = nl ? nl + 1 : end;
			continue;
		}
		char root[PATH_MAX], mp[PATH_MAX], fstype[64], f[64];
		/* fields: id parent maj:min root mountpoint options [optional...] - fstype source super */
		if (field(p, le, 3, root, sizeof(root)) < 0 || field(p, le, 4, mp, sizeof(mp)) < 0)
			return gcr_err_set(err, -EINVAL, "mountinfo line %d: too few fields", line);
		int sep = -1;
		for (int i = 6; i < 64 && field(p, le, i, f, sizeof(f)) == 0; i++)
			if (strcmp(f, "-") == 0) {
				sep = i;
				break;
			}
		if (sep < 0 || field(p, le, sep + 1, fstype, sizeof(fstype)) < 0)
			return gcr_err_set(err, -EINVAL, "mountinfo line %d: no file system type", line);
		if (root[0] != '/') { /* nsfs ("net:[...]"): a namespace file, CRIU's own business */
			p = nl ? nl + 1 : end;
			continue;
		}
		if (mp[0] != '/' || strpbrk(mp, "\\[]:") != NULL)
			return gcr_err_set(err, -EINVAL, "mountinfo line %d: a mount point CRIU cannot be told about", line);
		int pseudo = 0;
		for (size_t i = 0; i < sizeof(pseudo_fs) / sizeof(pseudo_fs[0]); i++)
			pseudo |= strcmp(fstype, pseudo_fs[i]) == 0;
		if (strcmp(mp, "/") != 0 && (strcmp(root, "/") != 0 || !pseudo)) {
			int w = snprintf(out + used, outlen - used, "external mnt[%s]:%s\n", mp, mp);
			if (w < 0 || (size_t)w >= outlen - used)
				return gcr_err_set(err, -ENOSPC, "mountinfo: too many external mounts");
			used += (size_t)w;
			(*n)++;
		}
		p = nl ? nl + 1 : end;
	}
	return 0;
}

/* Writes the configuration file of the container's external mounts; path gets its name. */
static int write_config(pid_t init, const char *images_dir, char *path, size_t plen, struct gcr_err *err)
{
	char mi[64];
	snprintf(mi, sizeof(mi), "/proc/%d/mountinfo", (int)init);
	int fd = open(mi, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot read %s: %s", mi, strerror(errno));
	size_t cap = 1 << 20, n = 0;
	char *buf = malloc(cap), *conf = malloc(cap);
	ssize_t r = 0;
	while (buf != NULL && n < cap && (r = read(fd, buf + n, cap - n)) > 0)
		n += (size_t)r;
	close(fd);
	int rc = 0, count = 0;
	if (buf == NULL || conf == NULL)
		rc = gcr_err_set(err, -ENOMEM, "out of memory");
	else if (r < 0)
		rc = gcr_err_set(err, -EIO, "cannot read %s", mi);
	else
		rc = gcr_ctrdump_externals(buf, n, conf, cap, &count, err);
	if (rc == 0 && snprintf(path, plen, "%s/ctrdump.conf", images_dir) >= (int)plen)
		rc = gcr_err_set(err, -ENAMETOOLONG, "images directory path too long");
	if (rc == 0) {
		FILE *f = fopen(path, "w");
		int bad = f == NULL || fputs(conf, f) < 0;
		if (f != NULL && fclose(f) != 0)
			bad = 1;
		if (bad)
			rc = gcr_err_set(err, -EIO, "cannot write %s", path);
	}
	free(buf);
	free(conf);
	return rc;
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
	/* In our own mount namespace (no mount namespace of its own) CRIU dumps no mounts. */
	char conf[PATH_MAX] = "", ns_theirs[64];
	struct stat m1, m2;
	snprintf(ns_theirs, sizeof(ns_theirs), "/proc/%d/ns/mnt", (int)init);
	if (stat(ns_theirs, &m1) < 0 || stat("/proc/self/ns/mnt", &m2) < 0 || m1.st_ino != m2.st_ino)
		rc = write_config(init, images_dir, conf, sizeof(conf), err);
	if (rc < 0)
		return rc;
	rc = gcr_criu_dump_argv(info, init, images_dir, after, a, err);
	if (rc < 0)
		return rc;
	struct stat own;
	char net[64];
	snprintf(net, sizeof(net), "net[%lu]:" GCR_CTRDUMP_NET_KEY, netns);
	if (conf[0] != '\0') {
		rc = append(a, "--config");
		if (rc == 0)
			rc = append(a, conf);
	}
	/* The shim's library replaced under a running pod (the DaemonSet rolled: install-shim renames
	 * a new file over it) is a deleted mapped file, which CRIU copies up to this size (bytes). */
	if (rc == 0)
		rc = append(a, "--ghost-limit");
	if (rc == 0)
		rc = append(a, "16M");
	if (rc == 0)
		rc = append(a, "--network-lock");
	if (rc == 0)
		rc = append(a, "nftables");
	if (rc == 0 && (stat("/proc/self/ns/net", &own) < 0 || (unsigned long)own.st_ino != netns)) {
		rc = append(a, "--external");
		if (rc == 0)
			rc = append(a, net);
	}
	return rc < 0 ? gcr_err_set(err, rc, "criu dump command too long") : 0;
}
