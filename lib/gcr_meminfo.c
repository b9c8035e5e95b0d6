/* gcr_meminfo: one field of a meminfo file; a memory cgroup's limit and use. */
#include "gcr_meminfo.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The first len - 1 bytes of path, NUL-terminated; -ENOENT when unreadable. Plain read(2), no
 * stdio: the shim reads these from its own threads inside any program, and a FILE there races
 * with the program's exit (valgrind's __libc_freeres frees stdio's buffers under an fclose of
 * the staging thread, in the valgrind tier). The files read here are a few KiB at most. */
static int read_small(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -ENOENT;
	size_t got = 0;
	while (got < len - 1) {
		ssize_t n = read(fd, buf + got, len - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	buf[got] = '\0';
	return got > 0 ? 0 : -ENOENT;
}

uint64_t gcr_meminfo_bytes(const char *path, const char *name)
{
	char buf[8192];
	if (read_small(path != NULL ? path : "/proc/meminfo", buf, sizeof(buf)) < 0)
		return 0;
	unsigned long long kb = 0;
	size_t n = strlen(name);
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save))
		if (strncmp(line, name, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%llu", &kb) == 1)
			break;
	return kb <= (UINT64_MAX >> 10) ? (uint64_t)kb << 10 : 0;
}

/* The number a cgroup file starts with: 0 and *v; -ENOENT unreadable, -ERANGE "max". */
static int cg_number(const char *root, const char *name, uint64_t *v)
{
	char path[512];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, name) >= sizeof(path))
		return -ENOENT;
	char buf[32];
	if (read_small(path, buf, sizeof(buf)) < 0)
		return -ENOENT;
	if (strncmp(buf, "max", 3) == 0)
		return -ERANGE;
	unsigned long long n;
	if (sscanf(buf, "%llu", &n) != 1)
		return -ENOENT;
	*v = n;
	return 0;
}

/* The sum of the "<key> N" lines of a memory.stat file for the keys given (missing keys: 0). */
static uint64_t cg_stat_sum(const char *root, const char *name, const char *const *keys)
{
	char path[512], buf[8192];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, name) >= sizeof(path))
		return 0;
	if (read_small(path, buf, sizeof(buf)) < 0)
		return 0;
	uint64_t sum = 0;
	char *save = NULL;
	for (char *line = strtok_r(buf, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
		char key[64];
		unsigned long long v;
		if (sscanf(line, "%63s %llu", key, &v) != 2)
			continue;
		for (const char *const *k = keys; *k != NULL; k++)
			if (strcmp(key, *k) == 0)
				sum += v;
	}
	return sum;
}

int gcr_meminfo_cgroup(const char *root, struct gcr_memcg *m)
{
	static const char *const v2_file[] = { "active_file", "inactive_file", NULL };
	static const char *const v1_file[] = { "total_active_file", "total_inactive_file", NULL };
	char v1[512];
	if (root == NULL)
		root = "/sys/fs/cgroup";
	memset(m, 0, sizeof(*m));
	uint64_t cache;
	int rc = cg_number(root, "memory.max", &m->limit);
	if (rc != -ENOENT) {
		m->version = 2;
		if (rc < 0 || cg_number(root, "memory.current", &m->current) < 0)
			return -ENOENT;
		cache = cg_stat_sum(root, "memory.stat", v2_file);
	} else {
		if ((size_t)snprintf(v1, sizeof(v1), "%s/memory", root) >= sizeof(v1))
			return -ENOENT;
		m->version = 1;
		if (cg_number(v1, "memory.limit_in_bytes", &m->limit) < 0 || m->limit >= (1ull << 60) ||
		    cg_number(v1, "memory.usage_in_bytes", &m->current) < 0)
			return -ENOENT;
		cache = cg_stat_sum(v1, "memory.stat", v1_file);
	}
	m->used = m->current > cache ? m->current - cache : 0;
	return 0;
}
