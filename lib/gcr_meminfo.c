/* gcr_meminfo: one field of a meminfo file; a memory cgroup's limit and use. */
#include "gcr_meminfo.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

uint64_t gcr_meminfo_bytes(const char *path, const char *name)
{
	FILE *f = fopen(path != NULL ? path : "/proc/meminfo", "re");
	if (f == NULL)
		return 0;
	char line[128];
	unsigned long long kb = 0;
	size_t n = strlen(name);
	while (fgets(line, sizeof(line), f) != NULL)
		if (strncmp(line, name, n) == 0 && line[n] == ':' && sscanf(line + n + 1, "%llu", &kb) == 1)
			break;
	fclose(f);
	return kb <= (UINT64_MAX >> 10) ? (uint64_t)kb << 10 : 0;
}

/* The number a cgroup file starts with: 0 and *v; -ENOENT unreadable, -ERANGE "max". */
static int cg_number(const char *root, const char *name, uint64_t *v)
{
	char path[512];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, name) >= sizeof(path))
		return -ENOENT;
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return -ENOENT;
	char buf[32];
	int rc = fgets(buf, sizeof(buf), f) != NULL ? 0 : -ENOENT;
	fclose(f);
	unsigned long long n;
	if (rc == 0 && strncmp(buf, "max", 3) == 0)
		return -ERANGE;
	if (rc == 0 && sscanf(buf, "%llu", &n) != 1)
		return -ENOENT;
	if (rc == 0)
		*v = n;
	return rc;
}

/* The sum of the "<key> N" lines of a memory.stat file for the keys given (missing keys: 0). */
static uint64_t cg_stat_sum(const char *root, const char *name, const char *const *keys)
{
	char path[512], line[128];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", root, name) >= sizeof(path))
		return 0;
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return 0;
	uint64_t sum = 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		char key[64];
		unsigned long long v;
		if (sscanf(line, "%63s %llu", key, &v) != 2)
			continue;
		for (const char *const *k = keys; *k != NULL; k++)
			if (strcmp(key, *k) == 0)
				sum += v;
	}
	fclose(f);
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
