/* gcr_procns: reads another process's view (pid namespace, environment, root) from
 * /proc, so a caller on the host can name what a process inside a container names. */
#include "gcr_procns.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Largest /proc/<pid>/environ we read, in bytes: a shim's or driver's variable sits among
 * the container's own, which stay far below this; a larger one is refused, not cut. */
#define ENVIRON_MAX (256 * 1024)

static int same_ns(pid_t pid, const char *ns, struct gcr_err *err)
{
	char mine[64], theirs[64];
	struct stat a, b;
	snprintf(mine, sizeof(mine), "/proc/self/ns/%s", ns);
	snprintf(theirs, sizeof(theirs), "/proc/%d/ns/%s", (int)pid, ns);
	if (stat(mine, &a) < 0 || stat(theirs, &b) < 0)
		return gcr_err_set(err, -errno, "cannot compare the %s namespace of pid %d with ours: %s", ns,
				   (int)pid, strerror(errno));
	return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int gcr_procns_same(pid_t pid, struct gcr_err *err)
{
	int rc = same_ns(pid, "pid", err);
	if (rc == 1)
		rc = same_ns(pid, "mnt", err);
	return rc;
}

int gcr_procns_nspid(pid_t pid, pid_t *nspid, struct gcr_err *err)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return gcr_err_set(err, -errno, "cannot read %s: %s", path, strerror(errno));
	*nspid = pid; /* kernels before 4.1 have no NSpid line: no nesting to see */
	while (fgets(line, sizeof(line), f) != NULL) {
		if (strncmp(line, "NSpid:", 6) != 0)
			continue;
		/* "NSpid:\t<ours>\t...\t<its own>": the last field is the innermost namespace's. */
		char *last = NULL, *save = NULL;
		for (char *t = strtok_r(line + 6, " \t\n", &save); t != NULL; t = strtok_r(NULL, " \t\n", &save))
			last = t;
		char *end = NULL;
		long v = last ? strtol(last, &end, 10) : 0;
		if (last == NULL || *end != '\0' || v <= 0) {
			fclose(f);
			return gcr_err_set(err, -EPROTO, "%s: unreadable NSpid line", path);
		}
		*nspid = (pid_t)v;
		break;
	}
	fclose(f);
	return 0;
}

int gcr_procns_env(pid_t pid, const char *name, char *out, size_t len, struct gcr_err *err)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/environ", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return gcr_err_set(err, -errno, "cannot read %s: %s", path, strerror(errno));
	char *buf = malloc(ENVIRON_MAX + 1);
	size_t n = 0;
	int rc = 0;
	if (buf == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory reading %s", path);
		goto out;
	}
	for (;;) {
		ssize_t r = read(fd, buf + n, ENVIRON_MAX - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = gcr_err_set(err, -errno, "cannot read %s: %s", path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
		if (n == ENVIRON_MAX) {
			rc = gcr_err_set(err, -EFBIG, "%s: larger than %d bytes", path, ENVIRON_MAX);
			goto out;
		}
	}
	buf[n] = '\0';
	size_t nl = strlen(name);
	rc = -ENOENT;
	for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
		const char *e = buf + i;
		if (strncmp(e, name, nl) != 0 || e[nl] != '=')
			continue;
		if (strlen(e + nl + 1) >= len) {
			rc = gcr_err_set(err, -ENAMETOOLONG, "%s of pid %d: value longer than %zu bytes", name,
					 (int)pid, len - 1);
		} else {
			strcpy(out, e + nl + 1);
			rc = 0;
		}
		break; /* the first one wins, as with getenv */
	}
	if (rc == -ENOENT)
		gcr_err_set(err, -ENOENT, "%s is not set in the environment of pid %d", name, (int)pid);
out:
	free(buf);
	close(fd);
	return rc;
}

int gcr_procns_open_dir(pid_t pid, const char *dir, struct gcr_err *err)
{
	char root[64];
	snprintf(root, sizeof(root), "/proc/%d/root", (int)pid);
	int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rfd < 0)
		return gcr_err_set(err, -errno, "cannot open %s: %s", root, strerror(errno));
	while (*dir == '/')
		dir++;
	if (*dir == '\0')
		dir = ".";
	/* RESOLVE_IN_ROOT: an absolute symlink inside the container (/run -> /var/run) must
	 * resolve in the container's root; a plain openat would resolve it in ours. */
	struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
				.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
	int fd = (int)syscall(SYS_openat2, rfd, dir, &how, sizeof(how));
	if (fd < 0 && errno == ENOSYS) /* before Linux 5.6: the peer-credential check still gates */
		fd = openat(rfd, dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int e = errno;
	close(rfd);
	if (fd < 0)
		return gcr_err_set(err, -e, "cannot open %s/%s: %s", root, dir, strerror(e));
	return fd;
}
