/* fakehipsmi: rocm-smi for the stand-in HIP runtime: device memory a process holds, pinned
 * host memory, and fault injection, through the process's fakehip service socket. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fakehip.h"

static const char usage[] = "usage: fakehipsmi mem|registered PID\n"
			    "       fakehipsmi fail PID FUNC NTH CODE   the NTH next call of FUNC answers CODE\n";

static int request(long pid, const char *req, char *reply, size_t len)
{
	const char *dir = getenv("FAKEHIP_DIR");
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (dir == NULL || snprintf(a.sun_path, sizeof(a.sun_path), FAKEHIP_SOCK_FMT, dir, (int)pid) >=
				   (int)sizeof(a.sun_path)) {
		fprintf(stderr, "fakehipsmi: set FAKEHIP_DIR (the directory the process was started with)\n");
		return -1;
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		fprintf(stderr, "fakehipsmi: %s: %s (not a fakehip process?)\n", a.sun_path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	size_t n = 0;
	ssize_t r;
	if (write(fd, req, strlen(req)) < 0 || write(fd, "\n", 1) < 0) {
		close(fd);
		return -1;
	}
	while (n + 1 < len && (r = read(fd, reply + n, len - n - 1)) > 0)
		n += (size_t)r;
	reply[n] = '\0';
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	char req[160], reply[64];
	char *end;
	long pid = argc >= 3 ? strtol(argv[2], &end, 10) : 0;
	if (argc < 3 || *end != '\0' || pid <= 0) {
		fputs(usage, stderr);
		return 2;
	}
	if ((strcmp(argv[1], "mem") == 0 || strcmp(argv[1], "registered") == 0) && argc == 3)
		snprintf(req, sizeof(req), "%s", argv[1]);
	else if (strcmp(argv[1], "fail") == 0 && argc == 6 && strlen(argv[3]) < 64)
		snprintf(req, sizeof(req), "fail %s %s %s", argv[3], argv[4], argv[5]);
	else {
		fputs(usage, stderr);
		return 2;
	}
	int rc;
	unsigned long long value;
	if (request(pid, req, reply, sizeof(reply)) < 0 || sscanf(reply, "%d %llu", &rc, &value) != 2)
		return 1;
	if (rc != 0) {
		fprintf(stderr, "fakehipsmi: %s %ld: hipError_t %d\n", argv[1], pid, rc);
		return 1;
	}
	if (strcmp(argv[1], "fail") != 0)
		printf("%llu\n", value);
	return 0;
}
