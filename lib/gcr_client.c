/* gcr_client: the caller's side of the control protocol. The shim is trusted only
 * after its socket's peer credentials match the process we were asked about. */
#include "gcr_client.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcr/protocol.h"
#include "gcr_procns.h"
#include "gcr_sock.h"

#define CONNECT_MS 2000

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

/* Connects to path; returns the fd if the server's credentials show pid. A socket served
 * by another process is -ESRCH with the server's pid in err. */
static int try_socket(const char *path, const char *shown, pid_t pid, uid_t owner, struct gcr_err *err)
{
	int fd = gcr_sock_connect(path, CONNECT_MS, err);
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

/* The socket as the process itself names it: "<its GCR_SOCKET_DIR>/gcr-<its own pid>.sock"
 * inside its own root. This is how the agent reaches a shim its device plugin injected: the
 * container has its own PID and mount namespaces, so neither the name nor the directory is
 * the host's. Read from /proc rather than taken from what the shim says when it registers:
 * gcrctl on a host has no registry to ask, a registry line is the process's word (nothing in
 * it is believed), and the path it would give is still in the container's mount namespace.
 * Symlinks in the last component resolve in OUR root, and a container controls its own
 * files, so a socket found here is trusted only through try_socket's peer credentials. */
static int try_own_view(struct gcr_client *c, pid_t pid, uid_t owner, struct gcr_err *err)
{
	char dir[256], path[64];
	pid_t nspid;
	int rc = gcr_procns_env(pid, GCR_SOCKET_DIR_ENV, dir, sizeof(dir), err);
	/* The shim's own rule (shim_config.c): an unset or non-absolute value means the default. */
	if (rc == -ENOENT || (rc == 0 && dir[0] != '/'))
		snprintf(dir, sizeof(dir), "%s", GCR_DEFAULT_SOCKET_DIR);
	else if (rc < 0)
		return rc;
	rc = gcr_procns_nspid(pid, &nspid, err);
	if (rc < 0)
		return rc;
	int dfd = gcr_procns_open_dir(pid, dir, err);
	if (dfd < 0)
		return dfd;
	/* Through the descriptor: "/proc/<pid>/root<dir>/..." may pass the 108 bytes of sun_path. */
	snprintf(path, sizeof(path), "/proc/self/fd/%d/gcr-%d.sock", dfd, (int)nspid);
	snprintf(c->path, sizeof(c->path), "/proc/%d/root%.180s/gcr-%d.sock", (int)pid, dir, (int)nspid);
	int fd = try_socket(path, c->path, pid, owner, err);
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
	if (snprintf(c->path, sizeof(c->path), "%.200s/gcr-%d.sock", dir, (int)pid) >= (int)sizeof(c->path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket directory path too long: %s", dir);
	/* 1: the host's view (a process on the host, or a container sharing our namespaces). */
	int fd = try_socket(c->path, c->path, pid, owner, &e2);
	if (fd == -ESRCH)
		why = e2;
	/* 2: the process's own view (a container: its socket dir, its pid). */
	if (fd < 0 && fd != -EPERM) {
		fd = try_own_view(c, pid, owner, &e2);
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
			fd = try_socket(c->path, c->path, pid, owner, &e2);
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

int gcr_client_call(struct gcr_client *c, enum gcr_op op, json_t *args, int timeout_ms,
		    json_t **result, struct gcr_err *err)
{
	*result = NULL;
	long long id = c->next_id++;
	char *line = gcr_proto_request_line(id, op, args);
	if (line == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = gcr_sock_write_all(c->fd, line, strlen(line), timeout_ms, err);
	free(line);
	if (rc < 0)
		return rc;
	struct gcr_linebuf lb;
	gcr_linebuf_init(&lb, GCR_PROTO_MAX_LINE);
	char *reply;
	rc = gcr_linebuf_read(&lb, c->fd, timeout_ms, &reply, err);
	struct gcr_reply rep;
	if (rc == 0)
		rc = gcr_proto_parse_reply(reply, &rep, err);
	gcr_linebuf_free(&lb);
	if (rc < 0)
		return gcr_err_wrap(err, "talking to the shim of pid %d", (int)c->pid);
	if (rep.id != id && rep.id != 0) {
		gcr_reply_clear(&rep);
		return gcr_err_set(err, -EPROTO, "reply for request %lld, expected %lld", rep.id, id);
	}
	if (!rep.ok) {
		rc = gcr_err_set(err, rep.code, "%s", rep.message);
		gcr_reply_clear(&rep);
		return rc;
	}
	*result = rep.result;
	rep.result = NULL;
	gcr_reply_clear(&rep);
	return 0;
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
