/* agent_registry: the shims' registry socket: who connected (host pid from peer
 * credentials), which pod and container (from <procRoot>/<pid>/cgroup). */
#include "agent_registry.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gcr_client.h"
#include "gcr_log.h"
#include "gcr_proto.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* How long the server thread sleeps in poll, in ms: the bound on noticing stop. */
#define POLL_MS 200
/* Longest line a shim sends here (bytes): "register" and "room" are far shorter. */
#define LINE_MAX_BYTES 4096
/* Most of a process's environ read for its overcommit settings (bytes). */
#define ENVIRON_MAX (256 * 1024)
/* How long a reply from this thread may take to leave (ms); the shim reads it at once. */
#define REPLY_MS 200
/* Connections taken from the listen queue per wake of the server thread: a pod flooding the
 * socket must not leave another pod's registration waiting behind it one poll at a time. */
#define ACCEPT_BATCH 64
/* How often every entry's process is looked at (ms): an entry whose process exited or whose
 * pid now names another process (its start time changed) is dropped, even while some other
 * process holds its connection open (a child that registered and passed its socket on). */
#define SWEEP_MS 2000

struct entry {
	int used;
	int fd; /* registry connection, or -1 for a shim found by the start-up scan */
	struct gcr_linebuf lb; /* what the shim sent, by lines */
	struct agent_registry_proc p;
};

struct agent_registry {
	int lfd;
	char *socket_path, *proc_root;
	pthread_t th;
	int started;
	atomic_int stop;
	int flags; /* AGENT_REGISTRY_* */
	struct agent_share *share; /* each pod's share of the entries (NULL: the table's bound only) */
	double last_sweep;         /* monotonic ms */
	struct agent_registry_handler h;
	pthread_mutex_t lock; /* guards e */
	struct entry e[AGENT_REGISTRY_MAX];
};

static int pid_alive(pid_t pid)
{
	return kill(pid, 0) == 0 || errno == EPERM;
}

/* Field 22 of <proc_root>/<pid>/stat, the start time in clock ticks after boot; 0 when it
 * cannot be read. The command name (field 2) may hold spaces and ')', so fields are
 * counted from the last ')'. *state (may be NULL) gets field 3 ('?' when unreadable). */
static unsigned long long stat_of(const char *proc_root, pid_t pid, char *state)
{
	char path[512], buf[1024];
	if (state != NULL)
		*state = '?';
	snprintf(path, sizeof(path), "%s/%d/stat", proc_root, (int)pid);
	FILE *f = fopen(path, "re");
	if (f == NULL)
		return 0;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	if (p != NULL && p[1] == ' ' && p[2] != '\0' && state != NULL)
		*state = p[2];
	for (int field = 2; p != NULL && field < 22; field++)
		p = strchr(p + 1, ' ');
	return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

static unsigned long long start_time(const char *proc_root, pid_t pid)
{
	return stat_of(proc_root, pid, NULL);
}

unsigned long long agent_registry_start_time(struct agent_registry *r, pid_t pid)
{
	return start_time(r->proc_root, pid);
}

/* The overcommit settings in <proc_root>/<pid>/environ (defaults when unreadable). */
static void read_environ(const char *proc_root, pid_t pid, struct agent_roommsg_env *env)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%d/environ", proc_root, (int)pid);
	char *buf = malloc(ENVIRON_MAX);
	size_t n = 0;
	FILE *f = buf != NULL ? fopen(path, "re") : NULL;
	if (f != NULL) {
		n = fread(buf, 1, ENVIRON_MAX, f);
		fclose(f);
	}
	agent_roommsg_environ(buf != NULL ? buf : "", n, env);
	free(buf);
	if (env->bad)
		GCR_LOG(GCR_LOG_WARN, "registry", "pid %d: an invalid %s, %s or %s in its environment; the default "
			"taken", (int)pid, GCR_OVERCOMMIT_ENV, GCR_PRIORITY_ENV, GCR_PREEMPTIBLE_ENV);
}

/* Fills p's pod from the cgroup file; -ENOENT when the process is not in a pod. */
static int identify(struct agent_registry *r, pid_t pid, struct agent_registry_proc *p,
		    struct gcr_err *err)
{
	char path[512];
	struct agent_cgroup_pod pod;
	snprintf(path, sizeof(path), "%s/%d/cgroup", r->proc_root, (int)pid);
	int rc = agent_cgroup_read_file(path, &pod, err);
	if (rc == -ENOENT && (r->flags & AGENT_REGISTRY_OUTSIDE_PODS)) {
		memset(&pod, 0, sizeof(pod)); /* a process on the machine: no pod, no container */
		rc = 0;
	}
	if (rc < 0)
		return rc;
	p->pid = pid;
	p->start = start_time(r->proc_root, pid);
	read_environ(r->proc_root, pid, &p->env);
	snprintf(p->pod_uid, sizeof(p->pod_uid), "%s", pod.pod_uid);
	snprintf(p->container_id, sizeof(p->container_id), "%s", pod.container_id);
	return 0;
}

/* Frees entry e and its pod's share of it (its connection closed). Caller holds the lock. */
static void drop_locked(struct agent_registry *r, struct entry *e)
{
	if (e->fd >= 0)
		close(e->fd);
	gcr_linebuf_free(&e->lb);
	if (r->share != NULL)
		agent_share_give(r->share, e->p.pod_uid);
	e->used = 0;
	e->fd = -1;
}

/* Adds (or replaces) the entry of pid; takes fd. An entry of another pod is one of that pod's
 * share (agent_share: refused past it, to that pod alone). Caller holds the lock. 0, or -errno
 * when not added (fd closed). */
static int add_locked(struct agent_registry *r, int fd, const struct agent_registry_proc *p)
{
	struct entry *free_e = NULL;
	for (int i = 0; i < AGENT_REGISTRY_MAX; i++) {
		struct entry *e = &r->e[i];
		if (e->used && e->p.pid == p->pid && strcmp(e->p.pod_uid, p->pod_uid) == 0) {
			if (e->fd >= 0 && fd >= 0) {
				close(e->fd);
				gcr_linebuf_free(&e->lb);
			}
			if (fd >= 0) {
				e->fd = fd;
				gcr_linebuf_init(&e->lb, LINE_MAX_BYTES);
			}
			e->p = *p;
			return 0;
		}
		if (e->used && e->p.pid == p->pid) /* the pid now names a process of another pod */
			drop_locked(r, e);
		if (!e->used && free_e == NULL)
			free_e = e;
	}
	struct gcr_err err;
	char who[32];
	snprintf(who, sizeof(who), "pid %d", (int)p->pid);
	int rc = r->share != NULL ? agent_share_take(r->share, p->pod_uid, who, NULL, &err) : 0;
	if (rc == 0 && free_e == NULL) {
		if (r->share != NULL)
			agent_share_give(r->share, p->pod_uid);
		rc = gcr_err_set(&err, -ENOSPC, "table full (%d processes)", AGENT_REGISTRY_MAX);
		GCR_LOG(GCR_LOG_WARN, "registry", "%s; pid %d not tracked", err.msg, (int)p->pid);
	}
	if (rc < 0) {
		if (fd >= 0)
			close(fd);
		return rc;
	}
	*free_e = (struct entry){ .used = 1, .fd = fd, .p = *p };
	gcr_linebuf_init(&free_e->lb, LINE_MAX_BYTES);
	return 0;
}

static void scan_cb(pid_t pid, const char *path, void *data)
{
	struct agent_registry *r = data;
	struct agent_registry_proc p = { 0 };
	struct gcr_err err;
	if (identify(r, pid, &p, &err) < 0) {
		GCR_LOG(GCR_LOG_INFO, "registry", "shim %s (pid %d) not in a pod: %s", path, (int)pid, err.msg);
		return;
	}
	pthread_mutex_lock(&r->lock);
	int rc = add_locked(r, -1, &p);
	pthread_mutex_unlock(&r->lock);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "registry", "found running shim pid %d (pod %s container %.12s)", (int)pid,
			p.pod_uid, p.container_id);
}

/* The device plugin's per-allocation dirs (<alloc_root>/<id>/) hold the sockets of shims in
 * containers, named by their own pids; their peer credentials give the host pids. */
static void scan_alloc_root(struct agent_registry *r, const char *alloc_root)
{
	DIR *d = opendir(alloc_root);
	if (d == NULL) {
		if (errno != ENOENT)
			GCR_LOG(GCR_LOG_WARN, "registry", "scan of %s: %s", alloc_root, strerror(errno));
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		char dir[512];
		struct gcr_err e2;
		if (de->d_name[0] == '.' ||
		    snprintf(dir, sizeof(dir), "%s/%s", alloc_root, de->d_name) >= (int)sizeof(dir))
			continue;
		gcr_sock_reap(dir, &e2); /* the sockets of shims killed while we were away */
		if (gcr_client_list(dir, scan_cb, r, &e2) < 0)
			GCR_LOG(GCR_LOG_DEBUG, "registry", "scan of %s: %s", dir, e2.msg);
	}
	closedir(d);
}

int agent_registry_new(const char *socket_path, const char *socket_dir, const char *alloc_root,
		       const char *proc_root, int flags, struct agent_registry **out, struct gcr_err *err)
{
	*out = NULL;
	struct agent_registry *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	pthread_mutex_init(&r->lock, NULL);
	r->lfd = -1;
	r->flags = flags;
	r->socket_path = strdup(socket_path);
	r->proc_root = strdup(proc_root);
	if (r->socket_path == NULL || r->proc_root == NULL) {
		agent_registry_free(r);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	/* Open to every local user: a shim in a non-root container must be able to register, and
	 * a connection can only register its own process (the pid comes from its credentials). */
	int fd = gcr_sock_listen_shared(socket_path, err);
	if (fd < 0) {
		agent_registry_free(r);
		return fd;
	}
	r->lfd = fd;
	/* Non-blocking: the server thread takes what the queue holds, up to ACCEPT_BATCH a wake. */
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
		int e = errno;
		agent_registry_free(r);
		return gcr_err_set(err, -e, "registry socket %s: %s", socket_path, strerror(e));
	}
	/* Shims accept only root or their owner; the registry is the same. */
	struct gcr_err e2;
	int reaped = gcr_sock_reap(socket_dir, &e2);
	if (reaped > 0)
		GCR_LOG(GCR_LOG_INFO, "registry", "removed %d dead shim sockets from %s", reaped, socket_dir);
	if (gcr_client_list(socket_dir, scan_cb, r, &e2) < 0)
		GCR_LOG(GCR_LOG_INFO, "registry", "scan of %s: %s", socket_dir, e2.msg);
	/* A restarted agent must find the shims in containers too: they registered with the
	 * agent before it and do not register again (found on a real node: a Restore after the
	 * agent pod was replaced said "no longer registered"). */
	if (alloc_root != NULL)
		scan_alloc_root(r, alloc_root);
	*out = r;
	return 0;
}

/* Takes one connection from the listen queue; 0 when there was none. */
static int accept_one(struct agent_registry *r)
{
	int fd = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return 0;
	struct gcr_peer peer;
	struct gcr_err err;
	struct agent_registry_proc p = { 0 };
	int prc = gcr_sock_peer(fd, &peer, &err);
	if (prc < 0 || peer.pid <= 0) {
		GCR_LOG(GCR_LOG_WARN, "registry", "registration refused: %s",
			prc < 0 ? err.msg : "the peer's pid is outside our PID namespace");
		close(fd);
		return 1;
	}
	int rc = identify(r, peer.pid, &p, &err);
	if (rc < 0) {
		GCR_LOG(GCR_LOG_WARN, "registry", "registration of pid %d (uid %d) refused, it is not in a pod: %s",
			(int)peer.pid, (int)peer.uid, err.msg);
		close(fd);
		return 1;
	}
	pthread_mutex_lock(&r->lock);
	rc = add_locked(r, fd, &p);
	pthread_mutex_unlock(&r->lock);
	if (rc == 0)
		GCR_LOG(GCR_LOG_INFO, "registry", "registered pid %d (pod %s container %.12s)", (int)p.pid,
			p.pod_uid, p.container_id);
	return 1;
}

static void reply_line(int fd, char *line)
{
	struct gcr_err err;
	if (line != NULL && gcr_sock_write_all(fd, line, strlen(line), REPLY_MS, &err) < 0)
		GCR_LOG(GCR_LOG_DEBUG, "registry", "reply not sent: %s", err.msg);
	free(line);
}

/* One line from e's shim: "register" is a hint and believed in nothing; "room" goes to the
 * overcommit handler. Caller holds the lock. */
static void handle_line(struct agent_registry *r, struct entry *e, const char *line)
{
	struct agent_roommsg_room req;
	struct gcr_err err;
	int kind = agent_roommsg_parse(line, strlen(line), &req, &err);
	if (kind < 0) {
		GCR_LOG(GCR_LOG_WARN, "registry", "pid %d sent a bad line: %s", (int)e->p.pid, err.msg);
		reply_line(e->fd, gcr_proto_reply_err_line(req.id, kind, err.msg));
		return;
	}
	if (kind == AGENT_ROOMMSG_WAKE) {
		if (r->h.wake != NULL)
			r->h.wake(r->h.data, &e->p, &req);
		else
			GCR_LOG(GCR_LOG_INFO, "registry", "wake from pid %d ignored: overcommit is off", (int)e->p.pid);
		return;
	}
	if (kind != AGENT_ROOMMSG_ROOM)
		return;
	int dup_fd = r->h.room != NULL ? fcntl(e->fd, F_DUPFD_CLOEXEC, 0) : -1;
	if (dup_fd < 0) {
		reply_line(e->fd, gcr_proto_reply_ok_line(req.id, json_pack("{s:b, s:i, s:i, s:s}", "granted", 0,
			"suspended", 0, "freed", 0, "reason", r->h.room == NULL ? "overcommit is off on this node"
										   : "the agent is out of descriptors")));
		return;
	}
	r->h.room(r->h.data, &e->p, dup_fd, &req);
}

/* Reads what the shim sent; EOF or an error means the process is gone. Caller holds the lock. */
static void read_one(struct agent_registry *r, struct entry *e)
{
	struct gcr_err err;
	long n = gcr_linebuf_fill(&e->lb, e->fd, &err);
	char *line;
	int rc;
	while ((rc = gcr_linebuf_next(&e->lb, &line, &err)) > 0)
		handle_line(r, e, line);
	if (rc < 0 || n == -EMSGSIZE || n == -EBADMSG) {
		GCR_LOG(GCR_LOG_WARN, "registry", "pid %d: %s; its connection is closed", (int)e->p.pid, err.msg);
		n = -ECONNRESET;
	}
	if (n >= 0 || n == -EAGAIN || n == -EWOULDBLOCK || n == -EINTR)
		return;
	GCR_LOG(GCR_LOG_INFO, "registry", "pid %d gone (connection closed)", (int)e->p.pid);
	drop_locked(r, e);
	if (r->h.gone != NULL)
		r->h.gone(r->h.data, &e->p);
}

/* Whether e's process still runs: its pid alive and not a zombie (an exited child its parent
 * has not reaped keeps its pid), and, when its start time is known, the same process (not a
 * later one that got the pid). */
static int same_process(struct agent_registry *r, const struct entry *e)
{
	if (!pid_alive(e->p.pid))
		return 0;
	char state;
	unsigned long long start = stat_of(r->proc_root, e->p.pid, &state);
	if (state == 'Z' || state == 'X')
		return 0;
	return e->p.start == 0 || start == e->p.start;
}

/* Drops the entries whose process is gone, connection open or not. Caller holds the lock. */
static void sweep_locked(struct agent_registry *r)
{
	for (int i = 0; i < AGENT_REGISTRY_MAX; i++) {
		struct entry *e = &r->e[i];
		if (!e->used || same_process(r, e))
			continue;
		GCR_LOG(GCR_LOG_INFO, "registry", "pid %d (pod %s) gone%s", (int)e->p.pid, e->p.pod_uid,
			e->fd >= 0 ? " while its connection stays open (another process holds it): dropped" : "");
		struct agent_registry_proc p = e->p;
		drop_locked(r, e);
		if (r->h.gone != NULL)
			r->h.gone(r->h.data, &p);
	}
}

static void *serve(void *data)
{
	struct agent_registry *r = data;
	struct pollfd *pfd = calloc(AGENT_REGISTRY_MAX + 1, sizeof(*pfd));
	int *idx = calloc(AGENT_REGISTRY_MAX + 1, sizeof(*idx));
	if (pfd == NULL || idx == NULL)
		goto out;
	while (!atomic_load(&r->stop)) {
		int n = 0;
		pfd[n++] = (struct pollfd){ .fd = r->lfd, .events = POLLIN };
		pthread_mutex_lock(&r->lock);
		for (int i = 0; i < AGENT_REGISTRY_MAX; i++) {
			if (r->e[i].used && r->e[i].fd >= 0) {
				idx[n] = i;
				pfd[n++] = (struct pollfd){ .fd = r->e[i].fd, .events = POLLIN };
			}
		}
		pthread_mutex_unlock(&r->lock);
		int ready = poll(pfd, (nfds_t)n, POLL_MS);
		for (int k = 0; ready > 0 && (pfd[0].revents & POLLIN) && k < ACCEPT_BATCH && accept_one(r); k++)
			;
		pthread_mutex_lock(&r->lock);
		for (int j = 1; ready > 0 && j < n; j++)
			if (pfd[j].revents && r->e[idx[j]].used && r->e[idx[j]].fd == pfd[j].fd)
				read_one(r, &r->e[idx[j]]);
		double now = gcr_time_mono_ms();
		if (now - r->last_sweep >= SWEEP_MS) {
			r->last_sweep = now;
			sweep_locked(r);
		}
		pthread_mutex_unlock(&r->lock);
	}
out:
	free(pfd);
	free(idx);
	return NULL;
}

void agent_registry_set_share(struct agent_registry *r, struct agent_share *s)
{
	pthread_mutex_lock(&r->lock);
	r->share = s;
	/* The start-up scan's entries: counted now; past a pod's share, not tracked. */
	for (int i = 0; s != NULL && i < AGENT_REGISTRY_MAX; i++) {
		struct entry *e = &r->e[i];
		char who[32];
		struct gcr_err err;
		snprintf(who, sizeof(who), "pid %d", (int)e->p.pid);
		if (e->used && agent_share_take(s, e->p.pod_uid, who, NULL, &err) < 0) {
			r->share = NULL; /* nothing of it to give back */
			drop_locked(r, e);
			r->share = s;
		}
	}
	pthread_mutex_unlock(&r->lock);
}

void agent_registry_set_handler(struct agent_registry *r, const struct agent_registry_handler *h)
{
	pthread_mutex_lock(&r->lock); /* the thread calls the handler under it */
	r->h = *h;
	pthread_mutex_unlock(&r->lock);
}

int agent_registry_start(struct agent_registry *r, struct gcr_err *err)
{
	int rc = pthread_create(&r->th, NULL, serve, r);
	if (rc != 0)
		return gcr_err_set(err, -rc, "cannot start the registry thread: %s", strerror(rc));
	r->started = 1;
	return 0;
}

void agent_registry_free(struct agent_registry *r)
{
	if (r == NULL)
		return;
	if (r->started) {
		atomic_store(&r->stop, 1);
		pthread_join(r->th, NULL);
	}
	for (int i = 0; i < AGENT_REGISTRY_MAX; i++) {
		if (r->e[i].used && r->e[i].fd >= 0)
			close(r->e[i].fd);
		gcr_linebuf_free(&r->e[i].lb);
	}
	if (r->lfd >= 0) {
		close(r->lfd);
		unlink(r->socket_path);
	}
	pthread_mutex_destroy(&r->lock);
	free(r->socket_path);
	free(r->proc_root);
	free(r);
}

/* Drops scanned entries whose process has exited (they have no connection). */
static int live_locked(struct agent_registry *r, struct entry *e)
{
	if (!e->used)
		return 0;
	if (e->fd < 0 && !pid_alive(e->p.pid)) {
		drop_locked(r, e);
		return 0;
	}
	return 1;
}

int agent_registry_find(struct agent_registry *r, const char *pod_uid, const char *container_id,
			struct agent_registry_proc *out, int max)
{
	int n = 0;
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < AGENT_REGISTRY_MAX && n < max; i++) {
		struct entry *e = &r->e[i];
		if (!live_locked(r, e) || (pod_uid != NULL && strcmp(e->p.pod_uid, pod_uid) != 0))
			continue;
		if (container_id != NULL && container_id[0] != '\0' &&
		    strcmp(e->p.container_id, container_id) != 0)
			continue;
		out[n++] = e->p;
	}
	pthread_mutex_unlock(&r->lock);
	return n;
}

int agent_registry_get(struct agent_registry *r, pid_t pid, struct agent_registry_proc *out)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < AGENT_REGISTRY_MAX; i++) {
		if (live_locked(r, &r->e[i]) && r->e[i].p.pid == pid) {
			*out = r->e[i].p;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return rc;
}

int agent_registry_count(struct agent_registry *r)
{
	int n = 0;
	pthread_mutex_lock(&r->lock);
	for (int i = 0; i < AGENT_REGISTRY_MAX; i++)
		n += live_locked(r, &r->e[i]);
	pthread_mutex_unlock(&r->lock);
	return n;
}
