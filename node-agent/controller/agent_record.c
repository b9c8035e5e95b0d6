/* agent_record: the node agent's records of its Checkpoints, on disk (agent_record.h). */
#include "agent_record.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gcr_log.h"

/* Linux's PID_MAX_LIMIT (2^22): no pid is larger. */
#define PID_MAX 4194304

static const char *const state_names[AGENT_REC_NSTATES] = { "suspending", "suspended", "failed", "resuming",
							     "resumed",    "imaging",   "imaged" };
static const char *const step_names[AGENT_REC_NSTEPS] = { "start", "suspend", "dump", "seal", "back", "move" };
/* The marker of when this store began to record every Checkpoint the agent ends. */
#define SINCE_FILE ".since"

const char *agent_record_state_name(enum agent_record_state s)
{
	return (unsigned)s < AGENT_REC_NSTATES ? state_names[s] : "unknown";
}

const char *agent_record_step_name(enum agent_record_step s)
{
	return (unsigned)s < AGENT_REC_NSTEPS ? step_names[s] : "unknown";
}

static json_t *image_encode(const struct agent_record_image *m)
{
	return json_pack("{s:s, s:b, s:b, s:s, s:i, s:I, s:b, s:s, s:s, s:s, s:s, s:s}", "route",
			 m->kubelet ? "kubelet" : "agent", "fromSuspended", m->from_suspended, "converted", m->converted,
			 "step", agent_record_step_name(m->step), "attempt", m->attempt, "dumpAt", (json_int_t)m->dump_at,
			 "kept", m->kept, "path", m->path, "work", m->work, "partial", m->partial, "archive", m->archive,
			 "container", m->container);
}

/* A uid (agent_crobj_is_token); "" too when empty_ok. */
static int token_ok(const char *s, int empty_ok)
{
	return s != NULL && ((empty_ok && s[0] == '\0') || agent_crobj_is_token(s));
}

json_t *agent_record_encode(const struct agent_record *r)
{
	json_t *procs = json_array();
	for (int i = 0; i < r->n; i++)
		json_array_append_new(procs, json_pack("{s:i, s:I, s:s}", "pid", (int)r->p[i].pid, "start",
						       (json_int_t)r->p[i].start, "container", r->p[i].container));
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:b, s:s, s:o, s:s, s:s, s:O?, s:O?}", "version", 1,
			      "uid", r->uid, "namespace", r->ns, "name", r->name, "pod", r->pod, "podUID", r->pod_uid,
			      "keepContext", r->keep_context, "state", agent_record_state_name(r->state), "processes",
			      procs, "restoreUID", r->rs_uid, "restoreName", r->rs_name, "checkpointStatus",
			      r->ck_status, "restoreStatus", r->rs_status);
	/* Absent in an older agent's records: a Suspend. */
	if (j != NULL && r->action == AGENT_REC_ACT_IMAGE) {
		json_object_set_new(j, "action", json_string("image"));
		json_object_set_new(j, "image", image_encode(&r->img));
	}
	return j;
}

void agent_record_clear(struct agent_record *r)
{
	if (r == NULL)
		return;
	json_decref(r->ck_status);
	json_decref(r->rs_status);
	r->ck_status = r->rs_status = NULL;
}

void agent_record_set_status(json_t **slot, json_t *status)
{
	json_decref(*slot);
	*slot = status ? json_deep_copy(status) : NULL;
}

/* NULL, or an object whose phase is final. */
static int status_ok(json_t *st)
{
	if (st == NULL || json_is_null(st))
		return 1;
	enum agent_phase ph = agent_phase_of(json_string_value(json_object_get(st, "phase")));
	return json_is_object(st) && (ph == AGENT_PHASE_SUCCEEDED || ph == AGENT_PHASE_FAILED);
}

static int copy_str(char *dst, size_t len, json_t *j, int (*ok)(const char *))
{
	const char *s = json_string_value(j);
	if (s == NULL || !ok(s) || strlen(s) >= len)
		return -1;
	snprintf(dst, len, "%s", s);
	return 0;
}

static int uid_ok(const char *s)
{
	return token_ok(s, 0);
}

static int uid_or_empty(const char *s)
{
	return token_ok(s, 1);
}

static int name_or_empty(const char *s)
{
	return s[0] == '\0' || agent_crobj_is_subdomain(s);
}

static int label_or_empty(const char *s)
{
	return s[0] == '\0' || agent_crobj_is_label(s);
}

/* "", or an absolute path without a ".." component (records are root's, but a damaged one must
 * never make the agent remove something else). */
static int path_or_empty(const char *s)
{
	if (s[0] == '\0')
		return 1;
	if (s[0] != '/' || strstr(s, "/../") != NULL)
		return 0;
	size_t n = strlen(s);
	return !(n >= 3 && strcmp(s + n - 3, "/..") == 0);
}

static int image_decode(json_t *j, struct agent_record_image *m)
{
	const char *route = json_string_value(json_object_get(j, "route"));
	const char *st = json_string_value(json_object_get(j, "step"));
	json_t *fs = json_object_get(j, "fromSuspended"), *cv = json_object_get(j, "converted"),
	       *kept = json_object_get(j, "kept"), *at = json_object_get(j, "attempt"), *da = json_object_get(j, "dumpAt");
	if (!json_is_object(j) || route == NULL || (strcmp(route, "kubelet") != 0 && strcmp(route, "agent") != 0) ||
	    st == NULL || !json_is_boolean(fs) || !json_is_boolean(cv) || !json_is_boolean(kept) ||
	    !json_is_integer(at) || json_integer_value(at) < 1 || json_integer_value(at) > 9 || !json_is_integer(da) ||
	    json_integer_value(da) < 0)
		return -1;
	m->kubelet = strcmp(route, "kubelet") == 0;
	m->from_suspended = json_is_true(fs);
	m->converted = json_is_true(cv);
	m->kept = json_is_true(kept);
	m->attempt = (int)json_integer_value(at);
	m->dump_at = (long long)json_integer_value(da);
	m->step = AGENT_REC_NSTEPS;
	for (int i = 0; i < AGENT_REC_NSTEPS; i++)
		if (strcmp(st, step_names[i]) == 0)
			m->step = (enum agent_record_step)i;
	if (m->step == AGENT_REC_NSTEPS ||
	    copy_str(m->path, sizeof(m->path), json_object_get(j, "path"), path_or_empty) < 0 ||
	    copy_str(m->work, sizeof(m->work), json_object_get(j, "work"), path_or_empty) < 0 ||
	    copy_str(m->partial, sizeof(m->partial), json_object_get(j, "partial"), path_or_empty) < 0 ||
	    copy_str(m->archive, sizeof(m->archive), json_object_get(j, "archive"), path_or_empty) < 0 ||
	    copy_str(m->container, sizeof(m->container), json_object_get(j, "container"), label_or_empty) < 0)
		return -1;
	return 0;
}

int agent_record_decode(json_t *j, struct agent_record *r, struct gcr_err *err)
{
	memset(r, 0, sizeof(*r));
	if (!json_is_object(j) || json_integer_value(json_object_get(j, "version")) != 1)
		return gcr_err_set(err, -EINVAL, "not a version 1 record");
	if (copy_str(r->uid, sizeof(r->uid), json_object_get(j, "uid"), uid_ok) < 0 ||
	    copy_str(r->ns, sizeof(r->ns), json_object_get(j, "namespace"), agent_crobj_is_label) < 0 ||
	    copy_str(r->name, sizeof(r->name), json_object_get(j, "name"), agent_crobj_is_subdomain) < 0 ||
	    copy_str(r->pod, sizeof(r->pod), json_object_get(j, "pod"), agent_crobj_is_subdomain) < 0 ||
	    copy_str(r->pod_uid, sizeof(r->pod_uid), json_object_get(j, "podUID"), uid_ok) < 0 ||
	    copy_str(r->rs_uid, sizeof(r->rs_uid), json_object_get(j, "restoreUID"), uid_or_empty) < 0 ||
	    copy_str(r->rs_name, sizeof(r->rs_name), json_object_get(j, "restoreName"), name_or_empty) < 0)
		return gcr_err_set(err, -EINVAL, "record with a missing or malformed name or uid");
	json_t *kc = json_object_get(j, "keepContext");
	if (!json_is_boolean(kc))
		return gcr_err_set(err, -EINVAL, "record without keepContext");
	r->keep_context = json_is_true(kc);
	const char *st = json_string_value(json_object_get(j, "state"));
	r->state = AGENT_REC_NSTATES;
	for (int i = 0; st != NULL && i < AGENT_REC_NSTATES; i++)
		if (strcmp(st, state_names[i]) == 0)
			r->state = (enum agent_record_state)i;
	if (r->state == AGENT_REC_NSTATES)
		return gcr_err_set(err, -EINVAL, "record with an unknown state");
	json_t *procs = json_object_get(j, "processes");
	if (!json_is_array(procs) || json_array_size(procs) > AGENT_RECORD_MAX_PROCS)
		return gcr_err_set(err, -EINVAL, "record without a list of at most %d processes", AGENT_RECORD_MAX_PROCS);
	size_t i;
	json_t *e;
	json_array_foreach(procs, i, e)
	{
		json_t *pid = json_object_get(e, "pid"), *start = json_object_get(e, "start");
		if (!json_is_integer(pid) || json_integer_value(pid) < 1 || json_integer_value(pid) > PID_MAX ||
		    !json_is_integer(start) || json_integer_value(start) < 0 ||
		    copy_str(r->p[i].container, sizeof(r->p[i].container), json_object_get(e, "container"),
			     label_or_empty) < 0)
			return gcr_err_set(err, -EINVAL, "record with a malformed process %zu", i);
		r->p[i].pid = (pid_t)json_integer_value(pid);
		r->p[i].start = (unsigned long long)json_integer_value(start);
	}
	r->n = (int)json_array_size(procs);
	const char *act = json_string_value(json_object_get(j, "action"));
	if (json_object_get(j, "action") != NULL &&
	    (act == NULL || (strcmp(act, "suspend") != 0 && strcmp(act, "image") != 0)))
		return gcr_err_set(err, -EINVAL, "record with an unknown action");
	r->action = act != NULL && strcmp(act, "image") == 0 ? AGENT_REC_ACT_IMAGE : AGENT_REC_ACT_SUSPEND;
	if (r->action == AGENT_REC_ACT_IMAGE && image_decode(json_object_get(j, "image"), &r->img) < 0)
		return gcr_err_set(err, -EINVAL, "record of an Image with a missing or malformed \"image\"");
	if ((r->state == AGENT_REC_IMAGING || r->state == AGENT_REC_IMAGED) && r->action != AGENT_REC_ACT_IMAGE)
		return gcr_err_set(err, -EINVAL, "record in state %s that is not an Image's", st);
	json_t *cs = json_object_get(j, "checkpointStatus"), *rs = json_object_get(j, "restoreStatus");
	if (!status_ok(cs) || !status_ok(rs))
		return gcr_err_set(err, -EINVAL, "record with a status that is not final");
	r->ck_status = json_is_object(cs) ? json_deep_copy(cs) : NULL;
	r->rs_status = json_is_object(rs) ? json_deep_copy(rs) : NULL;
	return 0;
}

/* ---- the store ---- */

struct agent_record_store {
	char *dir;
	long long since;
	pthread_mutex_t lock; /* guards recs */
	json_t *recs;         /* uid -> encoded record */
};

static int path_of(const struct agent_record_store *s, const char *uid, const char *pfx, const char *sfx,
		   char *out, size_t len)
{
	return snprintf(out, len, "%s/%s%s%s", s->dir, pfx, uid, sfx) >= (int)len ? -ENAMETOOLONG : 0;
}

static void load_one(struct agent_record_store *s, const char *fname)
{
	char path[1024], bad[1100];
	struct gcr_err err;
	snprintf(path, sizeof(path), "%s/%s", s->dir, fname);
	json_error_t je;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	struct agent_record r;
	int rc = j == NULL ? gcr_err_set(&err, -EINVAL, "%s", je.text) : agent_record_decode(j, &r, &err);
	char want[AGENT_CROBJ_UID_LEN + 8];
	if (rc == 0) {
		snprintf(want, sizeof(want), "%s.json", r.uid);
		if (strcmp(want, fname) != 0)
			rc = gcr_err_set(&err, -EINVAL, "holds the record of uid %s", r.uid);
		agent_record_clear(&r);
	}
	if (rc < 0) {
		snprintf(bad, sizeof(bad), "%s.bad", path);
		GCR_LOG(GCR_LOG_ERROR, "record", "%s: %s; set aside as %s", path, err.msg, bad);
		if (rename(path, bad) < 0)
			GCR_LOG(GCR_LOG_ERROR, "record", "rename %s: %s", path, strerror(errno));
		json_decref(j);
		return;
	}
	json_object_set_new(s->recs, r.uid, j);
}

/* The store's SINCE_FILE, made now when missing (an older agent's directory: from now on). */
static long long since_read(const char *dir)
{
	char path[1100], buf[32];
	snprintf(path, sizeof(path), "%s/" SINCE_FILE, dir);
	long long t = (long long)time(NULL), v = 0;
	FILE *f = fopen(path, "re");
	if (f != NULL) {
		if (fgets(buf, sizeof(buf), f) != NULL && sscanf(buf, "%lld", &v) == 1 && v > 0 && v <= t)
			t = v;
		fclose(f);
		if (v > 0)
			return t;
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd >= 0) {
		int n = snprintf(buf, sizeof(buf), "%lld\n", t);
		if (write(fd, buf, (size_t)n) != n || fsync(fd) < 0)
			GCR_LOG(GCR_LOG_WARN, "record", "%s: %s", path, strerror(errno));
		close(fd);
	}
	return t;
}

long long agent_record_store_since(struct agent_record_store *s)
{
	return s->since;
}

int agent_record_store_new(const char *dir, struct agent_record_store **out, struct gcr_err *err)
{
	*out = NULL;
	char parent[1024];
	if (snprintf(parent, sizeof(parent), "%s", dir) >= (int)sizeof(parent) || dir[0] != '/')
		return gcr_err_set(err, -EINVAL, "record directory %.200s: want an absolute path", dir);
	for (char *p = strchr(parent + 1, '/'); p != NULL; p = strchr(p + 1, '/')) {
		*p = '\0'; /* missing parents: traversable, not listable */
		if (mkdir(parent, 0711) < 0 && errno != EEXIST)
			return gcr_err_set(err, -errno, "cannot create %s: %s", parent, strerror(errno));
		*p = '/';
	}
	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return gcr_err_set(err, -errno, "cannot create the record directory %s: %s", dir, strerror(errno));
	struct stat sb;
	if (lstat(dir, &sb) < 0)
		return gcr_err_set(err, -errno, "%s: %s", dir, strerror(errno));
	/* Records decide which processes are resumed: nobody else may write them. */
	if (!S_ISDIR(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 022) != 0)
		return gcr_err_set(err, -EPERM,
				   "record directory %s must be a directory owned by uid %u and writable by it only",
				   dir, (unsigned)geteuid());
	struct agent_record_store *s = calloc(1, sizeof(*s));
	if (s == NULL || (s->dir = strdup(dir)) == NULL || (s->recs = json_object()) == NULL) {
		agent_record_store_free(s);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	pthread_mutex_init(&s->lock, NULL);
	DIR *d = opendir(dir);
	if (d == NULL) {
		int e = errno;
		agent_record_store_free(s);
		return gcr_err_set(err, -e, "%s: %s", dir, strerror(e));
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		size_t n = strlen(de->d_name);
		if (de->d_name[0] == '.' && n > 4 && strcmp(de->d_name + n - 4, ".tmp") == 0) {
			unlinkat(dirfd(d), de->d_name, 0); /* a write cut short: the old record stands */
			continue;
		}
		if (de->d_name[0] != '.' && n > 5 && strcmp(de->d_name + n - 5, ".json") == 0)
			load_one(s, de->d_name);
	}
	closedir(d);
	s->since = since_read(dir);
	GCR_LOG(GCR_LOG_INFO, "record", "%zu record(s) in %s", json_object_size(s->recs), dir);
	*out = s;
	return 0;
}

void agent_record_store_free(struct agent_record_store *s)
{
	if (s == NULL)
		return;
	if (s->recs != NULL)
		pthread_mutex_destroy(&s->lock);
	json_decref(s->recs);
	free(s->dir);
	free(s);
}

int agent_record_get(struct agent_record_store *s, const char *uid, struct agent_record *out)
{
	struct gcr_err err;
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&s->lock);
	json_t *j = json_object_get(s->recs, uid);
	int rc = j == NULL ? -ENOENT : agent_record_decode(j, out, &err);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

int agent_record_put(struct agent_record_store *s, const struct agent_record *r, struct gcr_err *err)
{
	char tmp[1024], path[1024];
	if (!token_ok(r->uid, 0) || path_of(s, r->uid, ".", ".tmp", tmp, sizeof(tmp)) < 0 ||
	    path_of(s, r->uid, "", ".json", path, sizeof(path)) < 0)
		return gcr_err_set(err, -EINVAL, "record without a valid uid");
	json_t *j = agent_record_encode(r);
	char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
	if (text == NULL) {
		json_decref(j);
		return gcr_err_set(err, -ENOMEM, "out of memory");
	}
	size_t len = strlen(text);
	int rc = 0;
	if (len > AGENT_RECORD_FILE_MAX)
		rc = gcr_err_set(err, -E2BIG, "record of %s is %zu bytes", r->uid, len);
	int fd = rc < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (rc == 0 && fd < 0)
		rc = gcr_err_set(err, -errno, "%s: %s", tmp, strerror(errno));
	for (size_t off = 0; rc == 0 && off < len;) {
		ssize_t w = write(fd, text + off, len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			rc = gcr_err_set(err, w < 0 ? -errno : -EIO, "write %s: %s", tmp, strerror(errno));
		else
			off += (size_t)w;
	}
	if (rc == 0 && fsync(fd) < 0)
		rc = gcr_err_set(err, -errno, "fsync %s: %s", tmp, strerror(errno));
	if (fd >= 0 && close(fd) < 0 && rc == 0)
		rc = gcr_err_set(err, -errno, "close %s: %s", tmp, strerror(errno));
	if (rc == 0 && rename(tmp, path) < 0)
		rc = gcr_err_set(err, -errno, "rename %s: %s", tmp, strerror(errno));
	if (rc == 0 && fsync_dir(s->dir) < 0)
		GCR_LOG(GCR_LOG_WARN, "record", "fsync %s: %s", s->dir, strerror(errno));
	free(text);
	if (rc < 0) {
		unlink(tmp);
		json_decref(j);
		return rc;
	}
	pthread_mutex_lock(&s->lock);
	json_object_set_new(s->recs, r->uid, j);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int agent_record_del(struct agent_record_store *s, const char *uid, struct gcr_err *err)
{
	char path[1024];
	if (!token_ok(uid, 0) || path_of(s, uid, "", ".json", path, sizeof(path)) < 0)
		return gcr_err_set(err, -EINVAL, "record without a valid uid");
	if (unlink(path) < 0 && errno != ENOENT)
		return gcr_err_set(err, -errno, "unlink %s: %s", path, strerror(errno));
	pthread_mutex_lock(&s->lock);
	json_object_del(s->recs, uid);
	pthread_mutex_unlock(&s->lock);
	return 0;
}

json_t *agent_record_list(struct agent_record_store *s)
{
	json_t *a = json_array();
	const char *uid;
	json_t *j;
	pthread_mutex_lock(&s->lock);
	json_object_foreach(s->recs, uid, j)
	{
		json_array_append_new(a, json_pack("{s:s, s:O, s:O, s:O}", "uid", uid, "ns", json_object_get(j, "namespace"),
						   "name", json_object_get(j, "name"), "pod", json_object_get(j, "pod")));
	}
	pthread_mutex_unlock(&s->lock);
	return a;
}
