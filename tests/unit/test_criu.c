/* test_criu: CRIU detection and commands against a fake criu (tests/unit/fake-criu.sh): version
 * parsing, a missing binary, a CRIU too old, a missing amdgpu plugin, the exact argument vectors
 * of dump and restore, and how a failed run is reported. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gcr_criu.h"
#include "util.h"

/* The fake's record of one run: CRIU_LIBS_DIR= then the arguments, joined by spaces. */
static void read_log(const char *path, char *out, size_t len)
{
	FILE *f = fopen(path, "r");
	size_t n = 0;
	out[0] = '\0';
	if (f == NULL)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f) != NULL) {
		line[strcspn(line, "\n")] = '\0';
		n += (size_t)snprintf(out + n, len - n, "%s%s", n ? " " : "", line);
		if (n >= len)
			break;
	}
	fclose(f);
}

int main(void)
{
	const char *src = getenv("top_srcdir");
	char fake[4096], dir[] = "/tmp/gcr-criu-XXXXXX", plugin[4200], log[4200], got[4096], want[8192];
	snprintf(fake, sizeof(fake), "%s/tests/unit/fake-criu.sh", src ? src : ".");
	CHECK(mkdtemp(dir) != NULL);
	snprintf(log, sizeof(log), "%s/run.log", dir);
	setenv("FAKE_CRIU_LOG", log, 1);
	struct gcr_err err = { 0 };
	struct gcr_criu_info info;
	struct gcr_criu_cfg cfg = { .criu = fake, .plugin_dir = dir, .timeout_ms = 10000 };
	int ma, mi, pa;

	/* Version lines as criu prints them. */
	CHECK(gcr_criu_parse_version("Version: 4.1\nGitID: v4.1\n", &ma, &mi, &pa, &err) == 0 && ma == 4 && mi == 1 && pa == 0);
	CHECK(gcr_criu_parse_version("Version: 3.17.1\n", &ma, &mi, &pa, &err) == 0 && ma == 3 && mi == 17 && pa == 1);
	CHECK(gcr_criu_parse_version("criu 4.0", &ma, &mi, &pa, &err) == -EINVAL);
	CHECK(gcr_criu_parse_version("Version: x", &ma, &mi, &pa, &err) == -EINVAL);

	/* No binary: says what is missing and what to install. */
	struct gcr_criu_cfg none = { .criu = "/nonexistent/criu", .plugin_dir = dir };
	CHECK(gcr_criu_check(&none, &info, &err) == -ENOENT && strstr(err.msg, "CRIU not found") != NULL &&
	      strstr(err.msg, "4.0") != NULL);
	struct gcr_criu_cfg onpath = { .criu = "gcr-no-such-criu-binary", .plugin_dir = dir };
	CHECK(gcr_criu_check(&onpath, &info, &err) == -ENOENT);

	/* Too old (Debian bookworm's 3.17): refused before anything runs. */
	setenv("FAKE_CRIU_VERSION_OUT", "Version: 3.17.1", 1);
	CHECK(gcr_criu_check(&cfg, &info, &err) == -ENOTSUP && strstr(err.msg, "3.17.1") != NULL &&
	      strstr(err.msg, "too old") != NULL);
	CHECK(access(log, F_OK) != 0);

	/* Unreadable or failing --version. */
	setenv("FAKE_CRIU_VERSION_OUT", "something else", 1);
	CHECK(gcr_criu_check(&cfg, &info, &err) == -EIO && strstr(err.msg, "something else") != NULL);
	setenv("FAKE_CRIU_VERSION_OUT", "Version: 4.1", 1);
	setenv("FAKE_CRIU_VERSION_RC", "3", 1);
	CHECK(gcr_criu_check(&cfg, &info, &err) == -EIO && strstr(err.msg, "exit 3") != NULL);
	unsetenv("FAKE_CRIU_VERSION_RC");

	/* New enough, but no amdgpu plugin in the directory. */
	CHECK(gcr_criu_check(&cfg, &info, &err) == -ENOENT && strstr(err.msg, "amdgpu_plugin.so") != NULL &&
	      strstr(err.msg, "CRIU_LIBS_DIR") != NULL);
	snprintf(plugin, sizeof(plugin), "%s/amdgpu_plugin.so", dir);
	int fd = open(plugin, O_CREAT | O_WRONLY, 0644);
	CHECK(fd >= 0);
	close(fd);
	CHECK(gcr_criu_check(&cfg, &info, &err) == 0 && info.major == 4 && info.minor == 1);
	CHECK_STR(info.path, fake);
	CHECK_STR(info.plugin, plugin);
	/* The environment chooses when the configuration does not. */
	setenv("GCR_CRIU", fake, 1);
	setenv("CRIU_LIBS_DIR", dir, 1);
	struct gcr_criu_info env_info;
	CHECK(gcr_criu_check(NULL, &env_info, &err) == 0 && strcmp(env_info.plugin_dir, dir) == 0);

	/* Argument vectors, exactly. */
	struct gcr_criu_argv a;
	CHECK(gcr_criu_dump_argv(&info, 4242, "/img", GCR_CRIU_LEAVE_STOPPED, &a, &err) == 0);
	CHECK(a.v[a.n] == NULL);
	snprintf(want, sizeof(want),
		 "CRIU_LIBS_DIR=%s dump --tree 4242 --images-dir /img --libdir %s --shell-job --tcp-established "
		 "--ext-unix-sk --file-locks --log-file dump.log -v2 --leave-stopped",
		 dir, dir);
	CHECK(gcr_criu_run(&info, &a, &err) == 0);
	read_log(log, got, sizeof(got));
	CHECK_STR(got, want);
	CHECK(gcr_criu_dump_argv(&info, 7, "/img", GCR_CRIU_KILL, &a, &err) == 0 &&
	      strcmp(a.v[a.n - 1], "-v2") == 0); /* no leave-* option: CRIU kills the tree */
	CHECK(gcr_criu_dump_argv(&info, 7, "/img", GCR_CRIU_LEAVE_RUNNING, &a, &err) == 0 &&
	      strcmp(a.v[a.n - 1], "--leave-running") == 0);
	CHECK(gcr_criu_restore_argv(&info, "/img", "/img/pid", &a, &err) == 0);
	CHECK(gcr_criu_run(&info, &a, &err) == 0);
	read_log(log, got, sizeof(got));
	snprintf(want, sizeof(want),
		 "CRIU_LIBS_DIR=%s restore --images-dir /img --libdir %s --shell-job --tcp-established "
		 "--ext-unix-sk --file-locks --log-file restore.log -v2 --restore-detached --pidfile /img/pid",
		 dir, dir);
	CHECK_STR(got, want);

	/* Without plugins (a CUDA process's image: the shim has moved its data): no --libdir, and
	 * no amdgpu plugin needed. */
	unlink(plugin);
	struct gcr_criu_cfg bare = { .criu = fake, .plugin_dir = dir, .timeout_ms = 10000, .no_plugin = 1 };
	struct gcr_criu_info binfo;
	CHECK(gcr_criu_check(&bare, &binfo, &err) == 0 && binfo.plugin_dir[0] == '\0');
	CHECK(gcr_criu_dump_argv(&binfo, 7, "/img", GCR_CRIU_KILL, &a, &err) == 0);
	int libdir = 0;
	for (int i = 0; i < a.n; i++)
		libdir |= strcmp(a.v[i], "--libdir") == 0;
	CHECK(!libdir && strcmp(a.v[a.n - 1], "-v2") == 0);
	/* Run, it gets an empty directory of its own as --libdir, so CRIU loads no plugin from
	 * $CRIU_LIBS_DIR or /usr/lib/criu; the directory is gone afterwards. */
	setenv("FAKE_CRIU_HOOK",
	       "prev=; for a; do if [ \"$prev\" = --libdir ] && [ -d \"$a\" ] && [ -z \"$(ls -A \"$a\")\" ]; "
	       "then echo LIBDIR-EMPTY \"$a\"; fi; prev=$a; done",
	       1);
	CHECK(gcr_criu_run(&binfo, &a, &err) == 0);
	unsetenv("FAKE_CRIU_HOOK");
	read_log(log, got, sizeof(got));
	const char *empty = strstr(got, "LIBDIR-EMPTY /tmp/gcr-criu-noplugins.");
	CHECK(strstr(got, " dump --libdir /tmp/gcr-criu-noplugins.") != NULL && empty != NULL);
	if (empty != NULL) {
		char gone[64];
		snprintf(gone, sizeof(gone), "%.*s", (int)strcspn(empty + 13, " "), empty + 13);
		CHECK(access(gone, F_OK) != 0);
	}
	fd = open(plugin, O_CREAT | O_WRONLY, 0644);
	CHECK(fd >= 0);
	close(fd);

	/* A failed run: exit status and CRIU's last words. */
	setenv("FAKE_CRIU_RC", "1", 1);
	setenv("FAKE_CRIU_SAY", "Error (criu/cr-dump.c:1): amdgpu_plugin: no KFD", 1);
	CHECK(gcr_criu_run(&info, &a, &err) == -EIO && strstr(err.msg, "exit 1") != NULL &&
	      strstr(err.msg, "no KFD") != NULL);

	/* Names that do not fit are refused, not truncated. */
	char longdir[5 * 4096];
	memset(longdir, 'x', sizeof(longdir) - 1);
	longdir[0] = '/';
	longdir[sizeof(longdir) - 1] = '\0';
	CHECK(gcr_criu_dump_argv(&info, 1, longdir, GCR_CRIU_KILL, &a, &err) == -ENAMETOOLONG);

	unlink(log);
	unlink(plugin);
	rmdir(dir);
	return test_summary("test_criu");
}
