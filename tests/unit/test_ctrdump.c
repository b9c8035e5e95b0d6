/* test_ctrdump: a container's CRIU dump (gcr_ctrdump): the status parser on good and
 * malformed text, the walk to the PID namespace's init on a fake /proc tree (found; a process
 * of our own namespace refused; a walk that leaves the namespace, loops or meets a missing
 * ancestor refused), and the command: the init's dump plus the external mounts and netns. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr_ctrdump.h"
#include "gcr_image.h"
#include "util.h"

static char root[64];

static int parse(const char *text, struct gcr_ctrdump_status *st)
{
	struct gcr_err err = { 0, "" };
	return gcr_ctrdump_parse_status(text, strlen(text), st, &err);
}

static void test_parse(void)
{
	struct gcr_ctrdump_status st;
	CHECK(parse("Name:\tgcr-testprog\nPid:\t18996\nPPid:\t18942\nNSpid:\t18996\t9\n", &st) == 0);
	CHECK(st.ppid == 18942 && st.nspid_outer == 18996 && st.nspid_inner == 9 && st.nspid_levels == 2);
	CHECK(parse("PPid:\t0\nNSpid:\t1\n", &st) == 0 && st.ppid == 0 && st.nspid_levels == 1);
	CHECK(parse("PPid:\t5\n", &st) == 0 && st.nspid_levels == 0); /* an old kernel: no NSpid */
	CHECK(parse("PPid:\t5\nNSpid:\t7\t1\t3", &st) == 0 && st.nspid_levels == 3 && st.nspid_inner == 3);
	CHECK(parse("Pid:\t5\n", &st) == -EINVAL);
	CHECK(parse("PPid:\tx\n", &st) == -EINVAL);
	CHECK(parse("PPid:\t-1\n", &st) == -EINVAL);
	CHECK(parse("PPid:\t99999999999\n", &st) == -EINVAL);
	CHECK(parse("PPid:\t5\nNSpid:\t7\t0\n", &st) == -EINVAL);
	CHECK(parse("PPid:\t5\nNSpid:\t \t\n", &st) == -EINVAL);
	CHECK(parse("PPid:\t5\nNSpid:\t7 8x\n", &st) == -EINVAL);
	char many[512] = "PPid:\t1\nNSpid:";
	for (int i = 0; i < 40; i++)
		strcat(many, "\t2");
	CHECK(parse(many, &st) == -EINVAL);
}

/* root/<pid>/status with PPid and NSpid, and root/<pid>/ns/net (a file: its inode is read). */
static void proc(pid_t pid, pid_t ppid, const char *nspid)
{
	char p[PATH_MAX];
	snprintf(p, sizeof(p), "%s/%d", root, (int)pid);
	CHECK(mkdir(p, 0700) == 0);
	snprintf(p, sizeof(p), "%s/%d/ns", root, (int)pid);
	CHECK(mkdir(p, 0700) == 0);
	snprintf(p, sizeof(p), "%s/%d/ns/net", root, (int)pid);
	FILE *f = fopen(p, "w");
	CHECK(f != NULL);
	if (f != NULL)
		fclose(f);
	snprintf(p, sizeof(p), "%s/%d/status", root, (int)pid);
	f = fopen(p, "w");
	CHECK(f != NULL);
	if (f != NULL) {
		fprintf(f, "Name:\tx\nPPid:\t%d\nNSpid:\t%s\n", (int)ppid, nspid);
		fclose(f);
	}
}

static void test_find_init(void)
{
	struct gcr_err err = { 0, "" };
	pid_t init = 0;
	unsigned long net = 0;
	/* A container: shim 100 (ns pid 1) -> sh 101 (1 inside) -> prog 103 (9 inside). */
	proc(100, 1, "100");
	proc(101, 100, "101\t1");
	proc(102, 101, "102\t8");
	proc(103, 101, "103\t9");
	CHECK(gcr_ctrdump_find_init(root, 103, &init, &net, &err) == 0);
	CHECK(init == 101 && net > 0);
	CHECK(gcr_ctrdump_find_init(root, 101, &init, &net, &err) == 0 && init == 101);
	CHECK(gcr_ctrdump_find_init(root, 100, &init, &net, &err) == -ESRCH);
	CHECK(strstr(err.msg, "not in a container") != NULL);
	/* The parent is in another namespace depth before an init is met. */
	proc(200, 100, "200\t5");
	proc(201, 200, "201\t6\t2");
	CHECK(gcr_ctrdump_find_init(root, 201, &init, &net, &err) == -ESRCH);
	/* A missing ancestor, and a loop. */
	proc(300, 299, "300\t4");
	CHECK(gcr_ctrdump_find_init(root, 300, &init, &net, &err) == -ENOENT);
	proc(400, 401, "400\t4");
	proc(401, 400, "401\t5");
	CHECK(gcr_ctrdump_find_init(root, 400, &init, &net, &err) == -ELOOP);
	/* Parent 0 before an init: not visible from here. */
	proc(500, 0, "500\t4");
	CHECK(gcr_ctrdump_find_init(root, 500, &init, &net, &err) == -ESRCH);
	CHECK(gcr_ctrdump_find_init(root, 999, &init, &net, &err) == -ENOENT);
}

static void test_externals(void)
{
	/* A pod container's mountinfo, abridged: overlay root, proc, a tmpfs, bind mounts of
	 * directories and files, a bind of a whole file system, an nsfs mount. */
	const char *mi =
		"320 300 0:71 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
		"321 320 0:75 / /proc rw,nosuid - proc proc rw\n"
		"322 320 0:76 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k\n"
		"336 320 254:0 /run/gcr/alloc/a6c3 /run/gcr rw,relatime - ext4 /dev/vda rw\n"
		"337 320 254:0 /var/lib/kubelet/pods/3d17/etc-hosts /etc/hosts rw shared:1 - ext4 /dev/vda rw\n"
		"342 320 254:0 / /data ro,relatime - ext4 /dev/vdb rw\n"
		"350 322 0:4 net:[4026532179] /dev/netns rw - nsfs nsfs rw\n"
		"351 321 0:76 /null /proc/kcore rw,nosuid - tmpfs tmpfs rw\n";
	char out[4096];
	int n = -1;
	struct gcr_err err = { 0, "" };
	CHECK(gcr_ctrdump_externals(mi, strlen(mi), out, sizeof(out), &n, &err) == 0);
	CHECK(n == 4);
	CHECK_STR(out, "external mnt[/run/gcr]:/run/gcr\nexternal mnt[/etc/hosts]:/etc/hosts\n"
		       "external mnt[/data]:/data\nexternal mnt[/proc/kcore]:/proc/kcore\n");
	CHECK(gcr_ctrdump_externals(mi, strlen(mi), out, 40, &n, &err) == -ENOSPC);
	const char *bad[] = {
		"1 2 3:4 /x\n",                                      /* too few fields */
		"1 2 3:4 /x /y rw shared:1 ext4 /dev/vda rw\n",      /* no "-" */
		"1 2 3:4 /x /y rw -\n",                              /* no type */
		"1 2 3:4 /x /a\\040b rw - ext4 /dev/vda rw\n",       /* an escaped space */
		"1 2 3:4 /x /a]b rw - ext4 /dev/vda rw\n",           /* a bracket */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		CHECK(gcr_ctrdump_externals(bad[i], strlen(bad[i]), out, sizeof(out), &n, &err) == -EINVAL);
	CHECK(gcr_ctrdump_externals("", 0, out, sizeof(out), &n, &err) == 0 && n == 0 && out[0] == '\0');
}

static void test_argv(void)
{
	struct gcr_criu_info info = { 0 };
	snprintf(info.path, sizeof(info.path), "/usr/sbin/criu");
	struct gcr_criu_argv a;
	struct gcr_err err = { 0, "" };
	/* This process is in its own (the test's) PID namespace: no container, refused. */
	CHECK(gcr_ctrdump_argv(&info, getpid(), "/tmp/img", GCR_CRIU_LEAVE_RUNNING, &a, &err) == -ESRCH);
}

int main(void)
{
	snprintf(root, sizeof(root), "/tmp/test-ctrdump-XXXXXX");
	if (mkdtemp(root) == NULL)
		return 1;
	test_parse();
	test_find_init();
	test_externals();
	test_argv();
	gcr_image_remove(root);
	return test_summary("test_ctrdump");
}
