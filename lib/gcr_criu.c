/* gcr_criu: CRIU driven through its command line. Checks come first and run only
 * `criu --version`, so a missing or old CRIU is reported before any process is touched. */
#include "gcr_criu.h"
#include "gcr_time.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUT_MAX 4096 /* bytes of a run's output kept for messages */

/* One decimal component, 0..99999, at *p; advances *p. -1 when there is none. */
static int version_part(const char **p)
{
	if (**p < '0' || **p > '9')
		return -1;
	long v = 0;
	while (**p >= '0' && **p <= '9') {
		v = v * 10 + (**p - '0');
		if (v > 99999)
			return -1; /* no real version is this long: refuse rather than overflow */
		(*p)++;
	}
	return (int)v;
}

int gcr_criu_parse_version(const char *out, int *major, int *minor, int *patch, struct gcr_err *err)
{
	const char *v = out ? strstr(out, "Version:") : NULL;
	int ma = -1, mi = -1, pa = 0;
	if (v != NULL) {
		v += strlen("Version:");
		while (*v == ' ' || *v == '\t')
			v++;
		ma = version_part(&v);
		if (ma >= 0 && *v == '.') {
			v++;
			mi = version_part(&v);
			if (mi >= 0 && *v == '.') {
				v++;
				pa = version_part(&v);
			}
		}
	}
	if (ma < 0 || mi < 0 || pa < 0)
		return gcr_err_set(err, -EINVAL, "no \"Version: X.Y\" line in criu --version output");
	*major = ma;
	*minor = mi;
	*patch = pa;
	return 0;
}

/* Runs argv with $CRIU_LIBS_DIR set (when plugin_dir is given), output (stdout and stderr) into
 * out. Returns the exit status (0..255), -ETIMEDOUT, or -errno when it cannot start. */
static int run(char *const argv[], const char *plugin_dir, int timeout_ms, char *out, size_t outlen)
{
	int p[2];
	size_t n = 0;
	out[0] = '\0';
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return -e;
	}
	if (pid == 0) {
		dup2(p[1], STDOUT_FILENO);
		dup2(p[1], STDERR_FILENO);
		if (plugin_dir != NULL)
			setenv("CRIU_LIBS_DIR", plugin_dir, 1);
		execv(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	long long deadline = (long long)gcr_time_mono_ms() + timeout_ms;
	int timed_out = 0;
	for (;;) {
		long long left = deadline - (long long)gcr_time_mono_ms();
		struct pollfd pfd = { .fd = p[0], .events = POLLIN };
		if (left <= 0 || poll(&pfd, 1, (int)left) == 0) {
			timed_out = 1;
			break;
		}
		char tmp[512];
		ssize_t r = read(p[0], tmp, sizeof(tmp));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		/* Keep the last outlen - 1 bytes: the end says why it failed. */
		for (ssize_t i = 0; i < r; i++) {
			if (n + 1 == outlen) {
				memmove(out, out + 1, n - 1);
				n--;
			}
			out[n++] = tmp[i];
		}
	}
	out[n] = '\0';
	close(p[0]);
	if (timed_out)
		kill(pid, SIGKILL);
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (timed_out)
		return -ETIMEDOUT;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The last non-empty line of s (trailing newlines dropped), in place. */
static const char *last_line(char *s)
{
	size_t n = strlen(s);
	while (n > 0 && s[n - 1] == '\n')
		s[--n] = '\0';
	char *nl = strrchr(s, '\n');
	return nl ? nl + 1 : s;
}

/* An executable path for name: as given when it has a slash, else the first on $PATH. */
static int find_binary(const char *name, char *path, size_t len)
{
	if (strchr(name, '/') != NULL) {
		if ((size_t)snprintf(path, len, "%s", name) >= len)
			return -ENAMETOOLONG;
		return access(path, X_OK) == 0 ? 0 : -ENOENT;
	}
	const char *env = getenv("PATH");
	char dirs[4096];
	snprintf(dirs, sizeof(dirs), "%s", env ? env : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
	char *save = NULL;
	for (char *d = strtok_r(dirs, ":", &save); d != NULL; d = strtok_r(NULL, ":", &save))
		if ((size_t)snprintf(path, len, "%s/%s", d, name) < len && access(path, X_OK) == 0)
			return 0;
	return -ENOENT;
}

int gcr_criu_check(const struct gcr_criu_cfg *cfg, struct gcr_criu_info *info, struct gcr_err *err)
{
	memset(info, 0, sizeof(*info));
	const char *name = cfg && cfg->criu ? cfg->criu : getenv("GCR_CRIU");
	if (name == NULL || name[0] == '\0')
		name = "criu";
	const char *dir = cfg && cfg->plugin_dir ? cfg->plugin_dir : getenv("CRIU_LIBS_DIR");
	if (dir == NULL || dir[0] == '\0')
		dir = GCR_CRIU_DEFAULT_PLUGIN_DIR;
	info->timeout_ms = cfg && cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
	if (find_binary(name, info->path, sizeof(info->path)) < 0)
		return gcr_err_set(err, -ENOENT,
				   "CRIU not found (%s): AMD processes need CRIU %d.0 or newer with its amdgpu "
				   "plugin (set GCR_CRIU to its path)",
				   name, GCR_CRIU_MIN_MAJOR);
	char out[OUT_MAX];
	char *argv[] = { info->path, "--version", NULL };
	int rc = run(argv, NULL, info->timeout_ms, out, sizeof(out));
	if (rc != 0)
		return gcr_err_set(err, -EIO, "%s --version failed (%s %d): %.120s", info->path,
				   rc < 0 ? "error" : "exit", rc, last_line(out));
	if (gcr_criu_parse_version(out, &info->major, &info->minor, &info->patch, err) < 0)
		return gcr_err_set(err, -EIO, "%s --version: cannot read the version from \"%.80s\"", info->path,
				   last_line(out));
	if (info->major < GCR_CRIU_MIN_MAJOR)
		return gcr_err_set(err, -ENOTSUP,
				   "CRIU %d.%d.%d at %s is too old: the amdgpu plugin needs CRIU %d.0 or newer",
				   info->major, info->minor, info->patch, info->path, GCR_CRIU_MIN_MAJOR);
	if (cfg != NULL && cfg->no_plugin)
		return 0; /* plugin_dir stays empty: no --libdir */
	struct stat st;
	if ((size_t)snprintf(info->plugin_dir, sizeof(info->plugin_dir), "%s", dir) >= sizeof(info->plugin_dir) ||
	    (size_t)snprintf(info->plugin, sizeof(info->plugin), "%s/%s", dir, GCR_CRIU_AMDGPU_PLUGIN) >=
		    sizeof(info->plugin))
		return gcr_err_set(err, -ENAMETOOLONG, "CRIU plugin directory name too long");
	if (stat(info->plugin, &st) < 0 || !S_ISREG(st.st_mode))
		return gcr_err_set(err, -ENOENT,
				   "CRIU %d.%d has no amdgpu plugin: %s missing (set CRIU_LIBS_DIR to the "
				   "directory holding %s)",
				   info->major, info->minor, info->plugin, GCR_CRIU_AMDGPU_PLUGIN);
	return 0;
}

static int add(struct gcr_criu_argv *a, const char *s)
{
	size_t len = strlen(s) + 1;
	if (a->n == GCR_CRIU_MAX_ARGS || a->used + len > sizeof(a->buf))
		return -ENAMETOOLONG;
	a->v[a->n++] = memcpy(a->buf + a->used, s, len);
	a->v[a->n] = NULL;
	a->used += len;
	return 0;
}

/* Options both directions share: plugins, and what a process in a pod holds that CRIU must
 * be told about (docs/amd.md, "CRIU options"). */
static int common(const struct gcr_criu_info *info, const char *images_dir, const char *log,
		  struct gcr_criu_argv *a)
{
	int rc = 0;
	/* CRIU's own default level (2: errors and warnings). Debug logging (4) wrote a line per memory
	 * area and page range and slowed a PyTorch process's dump and restore; GCR_CRIU_LOG_LEVEL=4
	 * brings it back to debug a failure. An optional argument: "-v 4" would make "4" a stray
	 * parameter. */
	const char *lvl = getenv("GCR_CRIU_LOG_LEVEL");
	const char *v = lvl != NULL && lvl[0] >= '0' && lvl[0] <= '4' && lvl[1] == '\0'
				? (const char *[]){ "-v0", "-v1", "-v2", "-v3", "-v4" }[lvl[0] - '0']
				: "-v2";
	const char *opts[] = { "--images-dir", images_dir, "--libdir", info->plugin_dir, "--shell-job",
			       "--tcp-established", "--ext-unix-sk", "--file-locks", "--log-file", log, v };
	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]) && rc == 0; i++) {
		if (i < 4 && i >= 2 && info->plugin_dir[0] == '\0')
			continue; /* no plugins (gcr_criu_cfg.no_plugin) */
		rc = add(a, opts[i]);
	}
	return rc;
}

int gcr_criu_dump_argv(const struct gcr_criu_info *info, pid_t pid, const char *images_dir,
		       enum gcr_criu_after after, struct gcr_criu_argv *a, struct gcr_err *err)
{
	memset(a, 0, sizeof(*a));
	char p[24];
	snprintf(p, sizeof(p), "%d", (int)pid);
	int rc = add(a, info->path);
	if (rc == 0)
		rc = add(a, "dump");
	if (rc == 0)
		rc = add(a, "--tree");
	if (rc == 0)
		rc = add(a, p);
	if (rc == 0)
		rc = common(info, images_dir, "dump.log", a);
	if (rc == 0 && after == GCR_CRIU_LEAVE_RUNNING)
		rc = add(a, "--leave-running");
	if (rc == 0 && after == GCR_CRIU_LEAVE_STOPPED)
		rc = add(a, "--leave-stopped");
	return rc < 0 ? gcr_err_set(err, rc, "criu dump command too long") : 0;
}

int gcr_criu_restore_argv(const struct gcr_criu_info *info, const char *images_dir, const char *pidfile,
			  struct gcr_criu_argv *a, struct gcr_err *err)
{
	memset(a, 0, sizeof(*a));
	int rc = add(a, info->path);
	if (rc == 0)
		rc = add(a, "restore");
	if (rc == 0)
		rc = common(info, images_dir, info->restore_log[0] ? info->restore_log : "restore.log", a);
	/* Detached: the restored tree is not our child, so the agent may exit or restart. */
	if (rc == 0)
		rc = add(a, "--restore-detached");
	if (rc == 0)
		rc = add(a, "--pidfile");
	if (rc == 0)
		rc = add(a, pidfile);
	return rc < 0 ? gcr_err_set(err, rc, "criu restore command too long") : 0;
}

int gcr_criu_run(const struct gcr_criu_info *info, const struct gcr_criu_argv *a, struct gcr_err *err)
{
	char out[OUT_MAX];
	if (a->n < 2)
		return gcr_err_set(err, -EINVAL, "empty criu command");
	/* Without plugins (CUDA: the shim and the driver did the GPU part), CRIU would still load
	 * every plugin in $CRIU_LIBS_DIR or /usr/lib/criu (its own cuda_plugin.so among them, which
	 * would act on a process already suspended): give it an empty directory of our own. */
	struct gcr_criu_argv b;
	char none[] = "/tmp/gcr-criu-noplugins.XXXXXX";
	const struct gcr_criu_argv *use = a;
	if (info->plugin_dir[0] == '\0') {
		if (mkdtemp(none) == NULL)
			return gcr_err_set(err, -errno, "criu %s: cannot make an empty plugin directory: %s", a->v[1],
					   strerror(errno));
		memset(&b, 0, sizeof(b));
		int r = 0;
		for (int i = 0; i < a->n && r == 0; i++) {
			r = add(&b, a->v[i]);
			if (r == 0 && i == 1) /* after the command */
				r = add(&b, "--libdir") == 0 ? add(&b, none) : -ENAMETOOLONG;
		}
		if (r < 0) {
			rmdir(none);
			return gcr_err_set(err, r, "criu %s command too long", a->v[1]);
		}
		use = &b;
	}
	int rc = run(use->v, info->plugin_dir[0] ? info->plugin_dir : NULL,
		     info->timeout_ms > 0 ? info->timeout_ms : 60000, out, sizeof(out));
	if (use == &b)
		rmdir(none);
	if (rc == -ETIMEDOUT)
		return gcr_err_set(err, -ETIMEDOUT, "criu %s did not finish in %d ms (killed)", a->v[1], info->timeout_ms);
	if (rc != 0)
		return gcr_err_set(err, -EIO, "criu %s failed (%s %d): %.160s (see its --log-file in the images directory)",
				   a->v[1], rc < 0 ? "error" : "exit", rc, last_line(out));
	return 0;
}
