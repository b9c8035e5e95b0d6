/* gcr_meminfo: one field of a meminfo file. */
#include "gcr_meminfo.h"

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
