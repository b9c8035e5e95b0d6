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

/* Connects to path; returns the fd if the server's credentials show pid. */
static int try_socket(const char *path, pid_t pid, uid_t owner, struct gcr_err *err)
{
	int fd = gcr_sock_connect(path, CONNECT_MS, err);
	if (fd < 0)
		return fd;
	struct gcr_peer peer;
	int rc = gcr_sock_peer(fd, &peer, err);
	if (rc == 0 && peer.pid != pid)
		rc = -ESRCH;
	if (rc == 0 && peer.uid != owner && peer.uid != 0)
		rc = gcr_err_set(err, -EPERM, "socket %s is served by uid %d, not the owner of pid %d",
				 path, (int)peer.uid, (int)pid);
	if (rc < 0) {
		close(fd);
		return rc;
	}
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
	struct gcr_err e2;
	if (snprintf(c->path, sizeof(c->path), "%.200s/gcr-%d.sock", dir, (int)pid) >= (int)sizeof(c->path))
		return gcr_err_set(err, -ENAMETOOLONG, "socket directory path too long: %s", dir);
	int fd = try_socket(c->path, pid, owner, &e2);
	if (fd == -EPERM)
		return gcr_err_set(err, -EPERM, "%s", e2.msg);
	if (fd < 0) {
		DIR *d = opendir(dir);
		struct dirent *de;
		while (d != NULL && fd < 0 && (de = readdir(d)) != NULL) {
			if (strncmp(de->d_name, "gcr-", 4) != 0 || strstr(de->d_name, ".sock") == NULL)
				continue;
			if (snprintf(c->path, sizeof(c->path), "%s/%.100s", dir, de->d_name) >= (int)sizeof(c->path))
				continue;
			fd = try_socket(c->path, pid, owner, &e2);
		}
		if (d != NULL)
			closedir(d);
	}
	if (fd < 0)
		return gcr_err_set(err, -ENOENT,
				   "process %d is not a GCR process: no shim control socket answers for it in %s "
				   "(was it started with LD_PRELOAD=libgcr.so and has it initialised CUDA?)",
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
