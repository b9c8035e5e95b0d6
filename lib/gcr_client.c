/* gcr_client: the caller's side of the control protocol. The shim is trusted only
 * after its socket's peer credentials match the process we were asked about. */
#include "gcr_client.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_procns.h"
#include "gcr_sock.h"
#include "gcr_time.h"

#define CONNECT_MS 2000
/* While it waits for a reply, a call looks at the process this often (ms), and gives up once it
 * has seen it stopped this long (ms): a stopped process (SIGSTOP, a debugger) answers nothing
 * until someone continues it, and its peers must not wait out their whole bound for it. */
#define STOP_CHECK_MS 250
#define STOPPED_GIVE_UP_MS 1000

static int process_owner(pid_t pid, uid_t *uid)
{
	char p[64];
	struct stat st;
	snprintf(p, sizeof(p), "/proc/%d", (int)pid);
	if (stat(p, &st) < 0)
		return -errno;
	*uid = st.st_uid;
	return 0;
}

/* Connects to path (waiting up to connect_ms when its backlog is full); returns the fd if
 * the server's credentials show pid. A socket served by another process is -ESRCH with the
 * server's pid in err; shown is the path as messages name it. */
static int try_socket(const char *path, const char *shown, pid_t pid, uid_t owner, int connect_ms,
		      struct gcr_err *err)
{
	int fd = gcr_sock_connect(path, connect_ms, err);
	if (fd < 0)
		return fd;
	struct gcr_peer peer;
	int rc = gcr_sock_peer(fd, &peer, err);
	if (rc == 0 && peer.pid != pid)
		rc = gcr_err_set(err, -ESRCH, "the socket %s is served by pid %d, not by it", shown,
				 (int)peer.pid);
	if (rc == 0 && peer.uid != owner && peer.uid != 0)
		rc = gcr_err_set(err, -EPERM, "socket %s is served by uid %d, not the owner of pid %d",
				 shown, (int)peer.uid, (int)pid);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	return fd;
}

/* The socket as the process itself names it: "<its GCR_SOCKET_DIR>/gcr-<its own pid>-<its
 * start time>.sock" inside its own root (a shim that found that name taken chose a random
 * one, which only a scan finds). This is how the agent reaches a shim its device plugin injected: the
 * container has its own PID and mount namespaces, so neither the name nor the directory is
 * the host's. Read from /proc rather than taken from what the shim says when it registers:
 * gcrctl on a host has no registry to ask, a registry line is the process's word (nothing in
 * it is believed), and the path it would give is still in the container's mount namespace.
 * Symlinks in the last component resolve in OUR root, and a container controls its own
 * files, so a socket found here is trusted only through try_socket's peer credentials. */
static int try_own_view(char *shown, size_t shown_len, pid_t pid, uid_t owner, int connect_ms,
			struct gcr_err *err)
{
	char dir[256], path[96];
	pid_t nspid;
	int rc = gcr_procns_env(pid, GCR_SOCKET_DIR_ENV, dir, sizeof(dir), err);
	/* The shim's own rule (shim_config.c): an unset or non-absolute value means the default. */
	if (rc == -ENOENT || (rc == 0 && dir[0] != '/'))
		snprintf(dir, sizeof(dir), "%s", GCR_DEFAULT_SOCKET_DIR);
	else if (rc < 0)
		return rc;
	rc = gcr_procns_nspid(pid, &nspid, err);
	char stem[64];
	if (rc == 0)
		rc = gcr_sock_shim_stem(pid, nspid, stem, sizeof(stem), err);
	if (rc < 0)
		return rc;
	int dfd = gcr_procns_open_dir(pid, dir, err);
	if (dfd < 0)
		return dfd;
	/* Through the descriptor: "/proc/<pid>/root<dir>/..." may pass the 108 bytes of sun_path. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d/%s.sock", dfd, stem);
	snprintf(shown, shown_len, "/proc/%d/root%.180s/%.50s.sock", (int)pid, dir, stem);
	int fd = try_socket(path, shown, pid, owner, connect_ms, err);
	/* Every other socket there: a process a container runtime restored keeps the name its shim
	 * had when dumped (another start time) until image-read publishes it anew; the peer
	 * credentials still tell whose it is. */
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", dfd);
	int lfd = fd < 0 && fd != -EPERM ? open(self, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
	DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
	struct dirent *de;
	struct gcr_err e2;
	while (d != NULL && fd < 0 && fd != -EPERM && (de = readdir(d)) != NULL) {
		if (strncmp(de->d_name, "gcr-", 4) != 0 || strstr(de->d_name, ".sock") == NULL ||
		    (size_t)snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dfd, de->d_name) >= sizeof(path))
			continue;
		snprintf(shown, shown_len, "/proc/%d/root%.180s/%.50s", (int)pid, dir, de->d_name);
		int f2 = try_socket(path, shown, pid, owner, connect_ms, &e2);
		if (f2 >= 0 || f2 == -EPERM) {
			fd = f2;
			*err = e2;
		}
	}
	if (d != NULL)
		closedir(d);
	else if (lfd >= 0)
		close(lfd);
	close(dfd);
	return fd;
}

int gcr_client_open(struct gcr_client *c, const char *dir, pid_t pid, struct gcr_err *err)
{
	memset(c, 0, sizeof(*c));
	c->fd = -1;
	c->pid = pid;
	c->next_id = 1;
	uid_t owner = 0;
	if (pid <= 0 || process_owner(pid, &owner) < 0)
		return gcr_err_set(err, -ESRCH, "no such process: %d", (int)pid);
	/* why: the last socket that answered for another process, named in the final error. */
	struct gcr_err e2, why = { 0 };
	char stem[64];
	int fd = gcr_sock_shim_stem(pid, pid, stem, sizeof(stem), &e2);
	if (fd == 0 && snprintf(c->path, sizeof(c->path), "%.180s/%.50s.sock", dir, stem) >= (int)sizeof(c->path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket directory path too long: %s", dir);
	/* 1: the host's view (a process on the host, or a container sharing our namespaces). */
	if (fd == 0)
		fd = try_socket(c->path, c->path, pid, owner, CONNECT_MS, &e2);
	if (fd == -ESRCH)
		why = e2;
	/* 2: the process's own view (a container: its socket dir, its pid). */
	if (fd < 0 && fd != -EPERM) {
		fd = try_own_view(c->path, sizeof(c->path), pid, owner, CONNECT_MS, &e2);
		if (fd == -ESRCH)
			why = e2;
	}
	if (fd == -EPERM)
		return gcr_err_set(err, -EPERM, "%s", e2.msg);
	/* 3: every socket in dir (a shim whose sockets the host sees under another pid). */
	if (fd < 0) {
		DIR *d = opendir(dir);
		struct dirent *de;
		while (d != NULL && fd < 0 && (de = readdir(d)) != NULL) {
			if (strncmp(de->d_name, "gcr-", 4) != 0 || strstr(de->d_name, ".sock") == NULL)
				continue;
			if (snprintf(c->path, sizeof(c->path), "%s/%.100s", dir, de->d_name) >= (int)sizeof(c->path))
				continue;
			fd = try_socket(c->path, c->path, pid, owner, CONNECT_MS, &e2);
		}
		if (d != NULL)
			closedir(d);
	}
	if (fd < 0 && why.msg[0] != '\0')
		return gcr_err_set(err, -ENOENT, "process %d is not a GCR process: %s", (int)pid, why.msg);
	if (fd < 0)
		return gcr_err_set(err, -ENOENT,
				   "process %d is not a GCR process: no shim control socket answers for it in %s "
				   "or in its own socket dir (was it started with LD_PRELOAD=libgcr.so and has it "
				   "initialised CUDA?)",
				   (int)pid, dir);
	c->fd = fd;
	return 0;
}

void gcr_client_close(struct gcr_client *c)
{
	if (c != NULL && c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
}

/* The result of the reply line to request id of pid's shim, or its error. */
static int take_reply(const char *line, long long id, pid_t pid, json_t **result, struct gcr_err *err)
{
	struct gcr_reply rep;
	*result = NULL;
	if (gcr_proto_parse_reply(line, &rep, err) < 0)
		return gcr_err_wrap(err, "talking to the shim of pid %d", (int)pid);
	if (rep.id != id && rep.id != 0) {
		gcr_reply_clear(&rep);
		return gcr_err_set(err, -EPROTO, "reply for request %lld, expected %lld", rep.id, id);
	}
	if (!rep.ok) {
		int rc = gcr_err_set(err, rep.code, "%s", rep.message);
		gcr_reply_clear(&rep);
		return rc;
	}
	*result = rep.result;
	rep.result = NULL;
	gcr_reply_clear(&rep);
	return 0;
}

int gcr_client_call(struct gcr_client *c, enum gcr_op op, json_t *args, int timeout_ms,
		    json_t **result, struct gcr_err *err)
{
	return gcr_client_call_fds(c, op, args, NULL, 0, timeout_ms, result, err);
}

int gcr_client_call_fds(struct gcr_client *c, enum gcr_op op, json_t *args, const int *fds, int nfds,
			int timeout_ms, json_t **result, struct gcr_err *err)
{
	*result = NULL;
	long long id = c->next_id++;
	char *line = gcr_proto_request_line(id, op, args);
	if (line == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = gcr_sock_write_fds(c->fd, line, strlen(line), fds, nfds, timeout_ms, err);
	free(line);
	if (rc < 0)
		return rc;
	struct gcr_linebuf lb;
	gcr_linebuf_init(&lb, GCR_PROTO_MAX_LINE);
	char *reply = NULL;
	double now = gcr_time_mono_ms(), deadline = now + (timeout_ms < 0 ? 0 : timeout_ms), stopped_since = 0;
	char st = 0;
	/* In slices, looking at the process between them (the line buffer keeps what came). */
	for (;;) {
		double left = timeout_ms < 0 ? STOP_CHECK_MS : deadline - now;
		rc = gcr_linebuf_read(&lb, c->fd, left < STOP_CHECK_MS ? (int)(left > 0 ? left : 0) : STOP_CHECK_MS, &reply,
				      err);
		if (rc != -ETIMEDOUT)
			break;
		now = gcr_time_mono_ms();
		st = gcr_client_proc_state(c->pid);
		int stopped = st == 'T' || st == 't';
		stopped_since = !stopped ? 0 : stopped_since > 0 ? stopped_since : now;
		if (stopped && now - stopped_since >= STOPPED_GIVE_UP_MS) {
			rc = gcr_err_set(err, -ETIMEDOUT, "process %d is stopped (state %c: %s): its shim cannot answer",
					 (int)c->pid, st, st == 'T' ? "SIGSTOP or job control" : "held by a debugger or tracer");
			break;
		}
		if (timeout_ms >= 0 && now >= deadline) {
			rc = gcr_err_set(err, -ETIMEDOUT, "no reply in %d ms%s", timeout_ms,
					 stopped ? " (the process is stopped)" : "");
			break;
		}
	}
	if (rc < 0)
		rc = gcr_err_wrap(err, "talking to the shim of pid %d", (int)c->pid);
	else
		rc = take_reply(reply, id, c->pid, result, err);
	gcr_linebuf_free(&lb);
	return rc;
}

char gcr_client_proc_state(pid_t pid)
{
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* "pid (comm) S ...": the command may hold spaces and parentheses; the state follows the last ')'. */
	const char *p = strrchr(buf, ')');
	return p != NULL && p[1] == ' ' && p[2] != '\0' ? p[2] : 0;
}

/* Finds the shims of the pids still without a socket (fds[i] < 0, rcs[i] not final) in
 * one pass over dir: a container's shim names its socket with its own namespace's pid. */
static void scan_dir(const char *dir, const pid_t *pids, const uid_t *owner, size_t n, int *fds, int *rcs)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	while (d != NULL && (de = readdir(d)) != NULL) {
		char path[512];
		if (strncmp(de->d_name, "gcr-", 4) != 0 || strstr(de->d_name, ".sock") == NULL ||
		    snprintf(path, sizeof(path), "%.200s/%.200s", dir, de->d_name) >= (int)sizeof(path))
			continue;
		struct gcr_err e2;
		int fd = gcr_sock_connect(path, 0, &e2);
		struct gcr_peer peer;
		if (fd < 0)
			continue;
		size_t j = n;
		if (gcr_sock_peer(fd, &peer, &e2) == 0)
			for (j = 0; j < n; j++)
				if (pids[j] == peer.pid && fds[j] < 0 && rcs[j] != -ESRCH && rcs[j] != -EPERM)
					break;
		if (j == n || (peer.uid != owner[j] && peer.uid != 0)) {
			close(fd);
			continue;
		}
		fds[j] = fd;
	}
	if (d != NULL)
		closedir(d);
}

int gcr_client_call_all(const char *dir, const pid_t *pids, size_t n, enum gcr_op op, json_t *args,
			int timeout_ms, json_t **results, int *rcs, struct gcr_err *err)
{
	long long deadline = (long long)gcr_time_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
	size_t cnt = n ? n : 1;
	int *fds = malloc(cnt * sizeof(*fds));
	uid_t *owner = calloc(cnt, sizeof(*owner));
	struct gcr_linebuf *lbs = calloc(cnt, sizeof(*lbs));
	struct pollfd *pfd = calloc(cnt, sizeof(*pfd));
	size_t *who = calloc(cnt, sizeof(*who)); /* pfd[k] is the connection of pids[who[k]] */
	int rc = 0, unmatched = 0;
	for (size_t i = 0; i < n; i++) {
		results[i] = NULL;
		rcs[i] = -ENOENT;
		if (fds != NULL)
			fds[i] = -1;
	}
	if (fds == NULL || owner == NULL || lbs == NULL || pfd == NULL || who == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory asking %zu shims", n);
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		char path[256];
		struct gcr_err e2;
		gcr_linebuf_init(&lbs[i], GCR_PROTO_MAX_LINE);
		if (pids[i] <= 0 || process_owner(pids[i], &owner[i]) < 0) {
			rcs[i] = -ESRCH;
			continue;
		}
		char stem[64];
		if (gcr_sock_shim_stem(pids[i], pids[i], stem, sizeof(stem), &e2) < 0) {
			rcs[i] = -ESRCH; /* gone since process_owner */
			continue;
		}
		if (snprintf(path, sizeof(path), "%.180s/%.50s.sock", dir, stem) >= (int)sizeof(path))
			continue;
		int fd = try_socket(path, path, pids[i], owner[i], 0, &e2);
		/* A shim in a container: its own socket dir and pid (see try_own_view). */
		if (fd < 0 && fd != -EPERM && fd != -ETIMEDOUT)
			fd = try_own_view(path, sizeof(path), pids[i], owner[i], 0, &e2);
		if (fd >= 0) {
			fds[i] = fd;
		} else {
			/* Its own name is not accepting (-ETIMEDOUT) or not its shim: kept unless the
			 * scan finds the shim under another name. */
			rcs[i] = fd == -EPERM || fd == -ETIMEDOUT ? fd : -ENOENT;
			unmatched += fd != -EPERM;
		}
	}
	if (unmatched > 0)
		scan_dir(dir, pids, owner, n, fds, rcs);
	size_t np = 0;
	for (size_t i = 0; i < n; i++) {
		if (fds[i] < 0)
			continue;
		struct gcr_err e2;
		char *line = gcr_proto_request_line((long long)i + 1, op, json_incref(args));
		if (line == NULL) {
			rc = gcr_err_set(err, -ENOMEM, "out of memory");
			goto out;
		}
		/* No wait: a request line fits in a fresh connection's socket buffer. */
		rcs[i] = gcr_sock_write_all(fds[i], line, strlen(line), 0, &e2);
		free(line);
		if (rcs[i] < 0) {
			close(fds[i]);
			fds[i] = -1;
			continue;
		}
		rcs[i] = -ETIMEDOUT; /* until its reply comes */
		pfd[np] = (struct pollfd){ .fd = fds[i], .events = POLLIN };
		who[np++] = i;
	}
	while (np > 0) {
		long long left = deadline - (long long)gcr_time_mono_ms();
		if (left <= 0)
			break;
		int pr = poll(pfd, np, (int)left);
		if (pr < 0 && errno == EINTR)
			continue;
		if (pr <= 0)
			break;
		for (size_t k = 0; k < np;) {
			if (pfd[k].revents == 0) {
				k++;
				continue;
			}
			size_t i = who[k];
			char *line;
			struct gcr_err e2;
			int r = gcr_linebuf_read(&lbs[i], fds[i], 0, &line, &e2);
			if (r == -ETIMEDOUT) { /* part of the line so far */
				k++;
				continue;
			}
			if (r == 0)
				r = take_reply(line, (long long)i + 1, pids[i], &results[i], &e2);
			rcs[i] = r;
			rc += r == 0;
			close(fds[i]);
			fds[i] = -1;
			pfd[k] = pfd[--np]; /* k now holds another connection: look at it next */
			who[k] = who[np];
		}
	}
out:
	for (size_t i = 0; fds != NULL && i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]); /* still -ETIMEDOUT: the shim reads EOF when it wakes */
	for (size_t i = 0; lbs != NULL && i < n; i++)
		gcr_linebuf_free(&lbs[i]);
	free(fds);
	free(owner);
	free(lbs);
	free(pfd);
	free(who);
	return rc;
}

int gcr_client_list(const char *dir, void (*fn)(pid_t pid, const char *path, void *data),
		    void *data, struct gcr_err *err)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return gcr_err_set(err, -errno, "cannot open %s: %s", dir, strerror(errno));
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (strncmp(de->d_name, "gcr-", 4) != 0 || strstr(de->d_name, ".sock") == NULL)
			continue;
		char path[512];
		if (snprintf(path, sizeof(path), "%.200s/%.200s", dir, de->d_name) >= (int)sizeof(path))
			continue;
		struct gcr_err e2;
		int fd = gcr_sock_connect(path, CONNECT_MS, &e2);
		if (fd < 0)
			continue; /* stale socket of a process that is gone */
		struct gcr_peer peer;
		if (gcr_sock_peer(fd, &peer, &e2) == 0 && peer.pid > 0)
			fn(peer.pid, path, data);
		close(fd);
	}
	closedir(d);
	return 0;
}
