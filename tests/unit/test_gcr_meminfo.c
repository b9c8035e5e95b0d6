/* test_gcr_meminfo: meminfo fields, and a memory cgroup's limit and use (lib/gcr_meminfo) read
 * from v2 and v1 file layouts written here: page cache left out of the use, no limit ("max", a
 * v1 limit of 2^60 bytes or more, missing files) reported as none. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr_meminfo.h"
#include "util.h"

static void put(const char *dir, const char *name, const char *text)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	if (f == NULL) {
		perror(path);
		exit(1);
	}
	fputs(text, f);
	fclose(f);
}

int main(void)
{
	char root[] = "/tmp/gcr-test-meminfo.XXXXXX", v1[600], path[600];
	if (mkdtemp(root) == NULL)
		return 1;
	struct gcr_memcg m;

	put(root, "meminfo", "MemTotal:       16384 kB\nMemFree: 100 kB\nMemAvailable:    8192 kB\n");
	snprintf(path, sizeof(path), "%s/meminfo", root);
	CHECK(gcr_meminfo_bytes(path, "MemTotal") == 16384ull << 10);
	CHECK(gcr_meminfo_bytes(path, "MemAvailable") == 8192ull << 10);
	CHECK(gcr_meminfo_bytes(path, "Mem") == 0);

	/* Nothing there: no limit. */
	CHECK(gcr_meminfo_cgroup(root, &m) == -ENOENT);

	/* v2: 1 GiB limit, 600 MiB charged of which 200 MiB page cache (active + inactive file). */
	put(root, "memory.max", "1073741824\n");
	put(root, "memory.current", "629145600\n");
	put(root, "memory.stat", "anon 314572800\nfile 314572800\nactive_file 104857600\ninactive_file 104857600\n"
				 "shmem 104857600\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == 0);
	CHECK(m.version == 2 && m.limit == 1073741824ull && m.current == 629145600ull);
	CHECK(m.used == 629145600ull - 209715200ull);
	put(root, "memory.max", "max\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == -ENOENT);
	put(root, "memory.max", "garbage\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == -ENOENT);
	snprintf(path, sizeof(path), "%s/memory.max", root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/memory.current", root);
	unlink(path);
	snprintf(path, sizeof(path), "%s/memory.stat", root);
	unlink(path);

	/* v1: memory/ under the root; hierarchical (total_) page cache left out. */
	snprintf(v1, sizeof(v1), "%s/memory", root);
	mkdir(v1, 0755);
	put(v1, "memory.limit_in_bytes", "536870912\n");
	put(v1, "memory.usage_in_bytes", "419430400\n");
	put(v1, "memory.stat", "cache 1\nrss 2\nactive_file 999\ntotal_active_file 52428800\n"
			       "total_inactive_file 52428800\ntotal_rss 314572800\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == 0);
	CHECK(m.version == 1 && m.limit == 536870912ull && m.used == 419430400ull - 104857600ull);
	/* The page cache larger than the count (racing reads): no underflow. */
	put(v1, "memory.usage_in_bytes", "1000\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == 0 && m.used == 0);
	/* The v1 "no limit" value. */
	put(v1, "memory.limit_in_bytes", "9223372036854771712\n");
	CHECK(gcr_meminfo_cgroup(root, &m) == -ENOENT);

	char cmd[700];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", root);
	return test_summary("test_gcr_meminfo");
}
