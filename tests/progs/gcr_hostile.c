/* gcr-hostile: what a hostile tenant's pod does to the node agent, for the hostile-tenant tier
 * (tests/k8s/hostile/): each command exhausts one per-node table or pool the agent shares among
 * pods, or plants input the agent reads, and prints what it got, one line per fact, for the test
 * to read (the agent's answers are the evidence; this program asserts nothing).
 *
 *   gcr-hostile holds N SECONDS        N connections to gcr-hold's socket, never sending a line,
 *                                      each reopened as soon as the agent closes it
 *   gcr-hostile register N SECONDS [exit]
 *                                      N children register on the agent's registry socket; the
 *                                      parent keeps their connections; "exit": the children end
 *                                      at once (the audit's short-lived children)
 *   gcr-hostile room BYTES COUNT INTERVAL_MS
 *                                      COUNT room requests for BYTES, one per INTERVAL_MS, each
 *                                      answered before the next (0: all at once, then the answers)
 *   gcr-hostile table SHAPE BYTES PATH a gpu/allocs.json of about BYTES bytes: "zero" (all-zero
 *                                      chunks), "objects" (a tree that is no table)
 *   gcr-hostile plant DIR SECONDS (table FILE | sparse BYTES)
 *                                      waits for DIR/image-* /gpu/allocs.json (the shim's image
 *                                      files of a Kubelet-route image) and, once the process's
 *                                      own resume has read it back, puts FILE in its place; or
 *                                      puts a sparse gpu/filler.bin of BYTES beside it at once
 *
 * The sockets: $GCR_AGENT_SOCKET (the device plugin sets it) and evict.sock beside it. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 4096

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void nap_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

static int sock_path(const char *name, char *out, size_t len)
{
	const char *reg = getenv("GCR_AGENT_SOCKET");
	if (reg == NULL || reg[0] != '/') {
		fprintf(stderr, "gcr-hostile: GCR_AGENT_SOCKET is not set (not an opted-in pod?)\n");
		return -1;
	}
	if (name == NULL) {
		snprintf(out, len, "%s", reg);
		return 0;
	}
	const char *slash = strrchr(reg, '/');
	snprintf(out, len, "%.*s/%s", (int)(slash - reg), reg, name);
	return 0;
}

static int connect_to(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	snprintf(a.sun_path, sizeof(a.sun_path), "%.107s", path);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Reads what is there (non-blocking) into buf; 0 EOF, -1 nothing yet, else bytes. */
static ssize_t read_some(int fd, char *buf, size_t len)
{
	ssize_t n = recv(fd, buf, len - 1, MSG_DONTWAIT);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	return n;
}

static int cmd_holds(int n, double seconds)
{
	char path[512];
	if (n < 1 || n > MAX_CONNS || sock_path("evict.sock", path, sizeof(path)) < 0)
		return 2;
	static int fds[MAX_CONNS];
	long opened = 0, answered = 0, refused = 0, failed = 0;
	char first[512] = "";
	for (int i = 0; i < n; i++)
		fds[i] = -1;
	double end = now_s() + seconds;
	while (now_s() < end) {
		for (int i = 0; i < n; i++) {
			if (fds[i] < 0) {
				fds[i] = connect_to(path);
				if (fds[i] < 0)
					failed++;
				else
					opened++;
				continue;
			}
			char buf[1024];
			ssize_t r = read_some(fds[i], buf, sizeof(buf));
			if (r == -1)
				continue;
			if (r > 0) {
				answered++;
				if (strstr(buf, "share") != NULL) {
					refused++;
					if (first[0] == '\0')
						snprintf(first, sizeof(first), "%.*s", (int)strcspn(buf, "\n"), buf);
				}
			}
			close(fds[i]);
			fds[i] = -1;
		}
		nap_ms(20);
	}
	printf("HOLDS opened=%ld answered=%ld refused_share=%ld failed=%ld\n", opened, answered, refused, failed);
	if (first[0])
		printf("HOLDS first_refusal %s\n", first);
	return 0;
}

static int cmd_register(int n, double seconds, int children_exit)
{
	char path[512];
	if (n < 1 || n > MAX_CONNS || sock_path(NULL, path, sizeof(path)) < 0)
		return 2;
	static int fds[MAX_CONNS];
	static pid_t kids[MAX_CONNS];
	const char *line = "{\"v\":1,\"id\":0,\"op\":\"register\",\"args\":{\"socket\":\"/none\",\"version\":\"hostile\"}}\n";
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int go[2];
		if (fds[i] < 0 || pipe(go) < 0)
			return 2;
		kids[i] = fork();
		if (kids[i] == 0) { /* the child connects: the credentials are its own */
			struct sockaddr_un a = { .sun_family = AF_UNIX };
			snprintf(a.sun_path, sizeof(a.sun_path), "%.107s", path);
			if (connect(fds[i], (struct sockaddr *)&a, sizeof(a)) == 0)
				(void)!write(fds[i], line, strlen(line));
			close(go[0]);
			(void)!write(go[1], "x", 1);
			if (children_exit) {
				nap_ms(300); /* alive while the agent reads its cgroup */
				_exit(0);
			}
			pause();
			_exit(0);
		}
		close(go[1]);
		char c;
		(void)!read(go[0], &c, 1);
		close(go[0]);
	}
	/* The parent holds every connection; one the agent closed reads EOF. */
	nap_ms(3000);
	int open_n = 0;
	double end = now_s() + seconds;
	do {
		open_n = 0;
		for (int i = 0; i < n; i++) {
			struct pollfd p = { .fd = fds[i], .events = POLLIN };
			char buf[256];
			if (fds[i] >= 0 && poll(&p, 1, 0) == 1 && read_some(fds[i], buf, sizeof(buf)) == 0) {
				close(fds[i]);
				fds[i] = -1;
			}
			open_n += fds[i] >= 0;
		}
		printf("REGISTER children=%d held=%d closed=%d\n", n, open_n, n - open_n);
		fflush(stdout);
		nap_ms(1000);
	} while (now_s() < end);
	for (int i = 0; i < n; i++)
		if (!children_exit && kids[i] > 0)
			kill(kids[i], SIGKILL);
	while (waitpid(-1, NULL, 0) > 0)
		;
	return 0;
}

static int cmd_room(unsigned long long bytes, int count, long interval_ms)
{
	char path[512];
	if (count < 1 || sock_path(NULL, path, sizeof(path)) < 0)
		return 2;
	int fd = connect_to(path);
	if (fd < 0) {
		perror("gcr-hostile: registry");
		return 1;
	}
	const char *reg = "{\"v\":1,\"id\":0,\"op\":\"register\",\"args\":{\"socket\":\"/none\",\"version\":\"hostile\"}}\n";
	(void)!write(fd, reg, strlen(reg));
	long granted = 0, denied = 0, busy = 0;
	char acc[65536];
	size_t have = 0;
	int sent = 0, got = 0;
	while (got < count) {
		if (sent < count && (interval_ms == 0 || sent == got)) {
			char line[256];
			int l = snprintf(line, sizeof(line), "{\"v\":1,\"id\":%d,\"op\":\"room\",\"args\":{\"bytes\":%llu,"
				      "\"device\":0}}\n", sent + 1, bytes);
			if (write(fd, line, (size_t)l) != l)
				break;
			sent++;
			continue;
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 30000) != 1)
			break;
		ssize_t r = read(fd, acc + have, sizeof(acc) - 1 - have);
		if (r <= 0)
			break;
		have += (size_t)r;
		acc[have] = '\0';
		char *nl;
		while ((nl = strchr(acc, '\n')) != NULL) {
			*nl = '\0';
			got++;
			if (strstr(acc, "\"granted\":true") != NULL)
				granted++;
			else if (strstr(acc, "\"granted\":false") != NULL)
				denied++;
			else
				busy++;
			printf("ROOM %d %.400s\n", got, acc);
			fflush(stdout);
			have -= (size_t)(nl + 1 - acc);
			memmove(acc, nl + 1, have + 1);
			if (interval_ms > 0 && got < count)
				nap_ms(interval_ms);
		}
	}
	printf("ROOM sent=%d answered=%d granted=%ld denied=%ld busy=%ld\n", sent, got, granted, denied, busy);
	close(fd);
	return 0;
}

static int cmd_table(const char *shape, long long bytes, const char *path)
{
	FILE *f = fopen(path, "w");
	if (f == NULL || bytes < 300)
		return 2;
	long long n = 0;
	if (strcmp(shape, "zero") == 0) {
		long long k = (bytes - 200) / 7;
		n += fprintf(f, "{\"allocs\":[{\"address\":1,\"size\":%lld,\"slot\":0,\"gen\":0,\"file\":\"gpu/a\","
			     "\"chunks\":[", k * 2097152LL);
		for (long long i = 0; i < k; i++)
			n += fprintf(f, "%s\"zero\"", i ? "," : "");
		n += fprintf(f, "]}]}");
	} else {
		n += fprintf(f, "{\"allocs\":[");
		while (n + 10 < bytes)
			n += fprintf(f, "{},");
		n += fprintf(f, "{}]}");
	}
	fclose(f);
	printf("TABLE %s %lld bytes\n", shape, n);
	return 0;
}

/* The first DIR/image-<uid>/gpu holding allocs.json, into out. */
static int find_gpu_dir(const char *dir, char *out, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int found = 0;
	while (d != NULL && !found && (de = readdir(d)) != NULL) {
		struct stat st;
		if (strncmp(de->d_name, "image-", 6) != 0)
			continue;
		snprintf(out, len, "%s/%s/gpu/allocs.json", dir, de->d_name);
		found = stat(out, &st) == 0;
		if (found)
			out[strlen(out) - strlen("/allocs.json")] = '\0';
	}
	if (d != NULL)
		closedir(d);
	return found;
}

static int cmd_plant(const char *dir, double seconds, const char *what, const char *arg)
{
	char gpu[1024], tmp[1200], dst[1200];
	double end = now_s() + seconds;
	while (!find_gpu_dir(dir, gpu, sizeof(gpu))) {
		if (now_s() > end) {
			printf("PLANT nothing to plant in %s after %.0f s\n", dir, seconds);
			return 1;
		}
		nap_ms(5);
	}
	if (strcmp(what, "table") == 0) {
		snprintf(tmp, sizeof(tmp), "%s/.hostile", gpu);
		snprintf(dst, sizeof(dst), "%s/allocs.json", gpu);
		/* Ready beside it first, so the swap is one rename. */
		int in = open(arg, O_RDONLY), out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		char buf[1 << 16];
		ssize_t r;
		while (in >= 0 && out >= 0 && (r = read(in, buf, sizeof(buf))) > 0)
			(void)!write(out, buf, (size_t)r);
		if (in >= 0)
			close(in);
		if (out >= 0)
			close(out);
		/* Swapped once the process's own resume has read it (its atime passes its mtime: relatime
		 * updates a file read since it was written), so the resume goes through and the agent's
		 * copy right after it is what meets the planted table: watched without a pause. */
		struct stat st;
		while (stat(dst, &st) == 0 && (st.st_atim.tv_sec < st.st_mtim.tv_sec ||
					       (st.st_atim.tv_sec == st.st_mtim.tv_sec &&
						st.st_atim.tv_nsec <= st.st_mtim.tv_nsec))) {
			if (now_s() > end) {
				printf("PLANT %s was never read back in %.0f s\n", dst, seconds);
				return 1;
			}
		}
		if (rename(tmp, dst) < 0) {
			perror("gcr-hostile: rename");
			return 1;
		}
	} else {
		snprintf(dst, sizeof(dst), "%s/filler.bin", gpu);
		int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (out < 0 || ftruncate(out, strtoll(arg, NULL, 10)) < 0) {
			perror("gcr-hostile: sparse file");
			return 1;
		}
		close(out);
	}
	printf("PLANT %s %s\n", what, dst);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (argc >= 4 && strcmp(argv[1], "holds") == 0)
		return cmd_holds(atoi(argv[2]), atof(argv[3]));
	if (argc >= 4 && strcmp(argv[1], "register") == 0)
		return cmd_register(atoi(argv[2]), atof(argv[3]), argc >= 5 && strcmp(argv[4], "exit") == 0);
	if (argc >= 5 && strcmp(argv[1], "room") == 0)
		return cmd_room(strtoull(argv[2], NULL, 10), atoi(argv[3]), atol(argv[4]));
	if (argc >= 5 && strcmp(argv[1], "table") == 0)
		return cmd_table(argv[2], atoll(argv[3]), argv[4]);
	if (argc >= 6 && strcmp(argv[1], "plant") == 0)
		return cmd_plant(argv[2], atof(argv[3]), argv[4], argv[5]);
	fprintf(stderr, "usage: gcr-hostile holds N SECONDS | register N SECONDS [exit] | room BYTES COUNT "
			"INTERVAL_MS | table zero|objects BYTES PATH | plant DIR SECONDS table FILE|sparse BYTES\n");
	return 2;
}
