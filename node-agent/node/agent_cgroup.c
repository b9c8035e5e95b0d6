/* agent_cgroup: finds the pod UID and container ID in /proc/<pid>/cgroup text.
 * Pure parsing on (pointer, length) spans, plus one bounded reader for /proc. */
#include "agent_cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Longest cgroup path we accept: the kernel's own path limit. */
#define CGROUP_PATH_MAX 4096
/* Longest slice of untrusted text quoted in an error message. */
#define QUOTE_MAX 80

struct span {
	const char *p;
	size_t n;
};

/* Components quoted in messages may hold control characters; keep one line. */
static int one_line(struct gcr_err *err, int rc)
{
	if (err != NULL)
		for (char *c = err->msg; *c != '\0'; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
	return rc;
}

static int span_eq(struct span s, const char *lit)
{
	size_t n = strlen(lit);
	return s.n == n && memcmp(s.p, lit, n) == 0;
}

static int span_starts(struct span s, const char *lit)
{
	size_t n = strlen(lit);
	return s.n >= n && memcmp(s.p, lit, n) == 0;
}

static int span_ends(struct span s, const char *lit)
{
	size_t n = strlen(lit);
	return s.n >= n && memcmp(s.p + s.n - n, lit, n) == 0;
}

static struct span span_skip(struct span s, size_t k)
{
	struct span r = { s.p + k, s.n - k };
	return r;
}

static int is_hex(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static char lower(char c)
{
	return (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
}

/* Copies exactly n hex digits, lowercased; out has room for n + 1. */
static int copy_hex(struct span s, size_t n, char *out)
{
	if (s.n != n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (!is_hex(s.p[i]))
			return -1;
		out[i] = lower(s.p[i]);
	}
	out[n] = '\0';
	return 0;
}

/* Accepts a canonical UID whose four separators are all '-' (cgroupfs) or all
 * '_' (systemd, which reserves '-' for slice nesting), or a static pod's 32-hex
 * config hash; writes the lowercase dashed form. */
static int parse_uid(struct span s, char out[AGENT_CGROUP_UID_LEN + 1])
{
	if (s.n == 32)
		return copy_hex(s, 32, out);
	if (s.n != AGENT_CGROUP_UID_LEN)
		return -1;
	char sep = s.p[8];
	if (sep != '-' && sep != '_')
		return -1;
	for (size_t i = 0; i < s.n; i++) {
		if (i == 8 || i == 13 || i == 18 || i == 23) {
			if (s.p[i] != sep)
				return -1;
			out[i] = '-';
		} else if (is_hex(s.p[i])) {
			out[i] = lower(s.p[i]);
		} else {
			return -1;
		}
	}
	out[s.n] = '\0';
	return 0;
}

static void set_runtime(struct agent_cgroup_pod *out, const char *rt)
{
	snprintf(out->runtime, sizeof(out->runtime), "%s", rt);
}

/* Container scope prefixes: the runtime each one means. conmon is CRI-O's
 * monitor process, which lives beside the container, not in it. */
static const struct {
	const char *prefix;
	const char *runtime;
	int conmon;
} scope_kinds[] = {
	{ "crio-conmon-", "cri-o", 1 },
	{ "cri-containerd-", "containerd", 0 },
	{ "crio-", "cri-o", 0 },
	{ "docker-", "docker", 0 },
};

/* The directory under the pod cgroup: a bare 64-hex ID (cgroupfs driver with
 * containerd or docker), or <runtime>-<id>[.scope] (systemd driver; CRI-O uses
 * the prefixed form with cgroupfs too). */
static int parse_container(struct span comp, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	if (copy_hex(comp, AGENT_CGROUP_CID_LEN, out->container_id) == 0) {
		set_runtime(out, "");
		return 0;
	}
	struct span s = comp;
	if (span_ends(s, ".scope"))
		s.n -= strlen(".scope");
	for (size_t i = 0; i < sizeof(scope_kinds) / sizeof(scope_kinds[0]); i++) {
		if (!span_starts(s, scope_kinds[i].prefix))
			continue;
		struct span id = span_skip(s, strlen(scope_kinds[i].prefix));
		if (copy_hex(id, AGENT_CGROUP_CID_LEN, out->container_id) != 0)
			break;
		if (scope_kinds[i].conmon) {
			out->container_id[0] = '\0';
			return gcr_err_set(err, -ENOENT, "process is CRI-O's conmon, not a container");
		}
		set_runtime(out, scope_kinds[i].runtime);
		return 0;
	}
	out->container_id[0] = '\0';
	return gcr_err_set(err, -EINVAL, "unrecognised container cgroup '%.*s'",
			   (int)(comp.n < QUOTE_MAX ? comp.n : QUOTE_MAX), comp.p);
}

/* The literal form some runc/containerd setups leave when a systemd cgroup
 * path is used without systemd: "<pod slice>:<prefix>:<id>". */
static int parse_colon_container(struct span tail, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	const char *colon = memchr(tail.p, ':', tail.n);
	if (colon == NULL)
		return gcr_err_set(err, -EINVAL, "systemd cgroup name without container ID");
	struct span prefix = { tail.p, (size_t)(colon - tail.p) };
	struct span id = span_skip(tail, prefix.n + 1);
	const char *rt = NULL;
	int conmon = 0;
	if (span_eq(prefix, "cri-containerd"))
		rt = "containerd";
	else if (span_eq(prefix, "crio"))
		rt = "cri-o";
	else if (span_eq(prefix, "crio-conmon"))
		rt = "cri-o", conmon = 1;
	else if (span_eq(prefix, "docker"))
		rt = "docker";
	if (rt == NULL || copy_hex(id, AGENT_CGROUP_CID_LEN, out->container_id) != 0) {
		out->container_id[0] = '\0';
		return gcr_err_set(err, -EINVAL, "unrecognised container in systemd cgroup name '%.*s'",
				   (int)(tail.n < QUOTE_MAX ? tail.n : QUOTE_MAX), tail.p);
	}
	if (conmon) {
		out->container_id[0] = '\0';
		return gcr_err_set(err, -ENOENT, "process is CRI-O's conmon, not a container");
	}
	set_runtime(out, rt);
	return 0;
}

/* systemd driver: "[<root>-]kubepods[-burstable|-besteffort]-pod<uid_>.slice",
 * where <root> is the kubelet's --cgroup-root ("kubelet" in kind). The pod slice
 * name spells out its whole ancestry, so it is recognised on its own, which also
 * works for paths relative to a cgroup namespace ("/../../kubepods-...").
 * Returns 1 on a pod slice (tail gets what follows ".slice"), 0 otherwise. */
static int match_systemd_pod(struct span comp, struct agent_cgroup_pod *out, struct span *tail)
{
	static const char kp[] = "kubepods";
	const char *at = memmem(comp.p, comp.n, kp, sizeof(kp) - 1);
	if (at == NULL || (at != comp.p && at[-1] != '-'))
		return 0;
	struct span s = span_skip(comp, (size_t)(at - comp.p) + sizeof(kp) - 1);
	if (span_starts(s, "-burstable-pod")) {
		out->qos = AGENT_CGROUP_QOS_BURSTABLE;
		s = span_skip(s, strlen("-burstable-pod"));
	} else if (span_starts(s, "-besteffort-pod")) {
		out->qos = AGENT_CGROUP_QOS_BESTEFFORT;
		s = span_skip(s, strlen("-besteffort-pod"));
	} else if (span_starts(s, "-pod")) {
		out->qos = AGENT_CGROUP_QOS_GUARANTEED;
		s = span_skip(s, strlen("-pod"));
	} else {
		return 0;
	}
	const char *dot = memmem(s.p, s.n, ".slice", strlen(".slice"));
	if (dot == NULL)
		return 0;
	struct span uid = { s.p, (size_t)(dot - s.p) };
	if (parse_uid(uid, out->pod_uid) != 0)
		return 0;
	*tail = span_skip(s, uid.n + strlen(".slice"));
	return 1;
}

/* cgroupfs driver: ".../kubepods[/burstable|/besteffort]/pod<uid>/<cid>". The
 * parent must be a QoS directory, or ".." when a cgroup namespace hid it. */
static int match_cgroupfs_pod(struct span comp, struct span parent, struct agent_cgroup_pod *out)
{
	if (!span_starts(comp, "pod") || parse_uid(span_skip(comp, 3), out->pod_uid) != 0)
		return 0;
	if (span_eq(parent, "kubepods"))
		out->qos = AGENT_CGROUP_QOS_GUARANTEED;
	else if (span_eq(parent, "burstable"))
		out->qos = AGENT_CGROUP_QOS_BURSTABLE;
	else if (span_eq(parent, "besteffort"))
		out->qos = AGENT_CGROUP_QOS_BESTEFFORT;
	else if (span_eq(parent, ".."))
		out->qos = AGENT_CGROUP_QOS_UNKNOWN;
	else
		return 0;
	return 1;
}

/* Next '/'-separated component of *rest, skipping empty ones; 0 at the end. */
static int next_component(struct span *rest, struct span *comp)
{
	while (rest->n > 0 && rest->p[0] == '/')
		*rest = span_skip(*rest, 1);
	if (rest->n == 0)
		return 0;
	const char *slash = memchr(rest->p, '/', rest->n);
	comp->p = rest->p;
	comp->n = slash ? (size_t)(slash - rest->p) : rest->n;
	*rest = span_skip(*rest, comp->n);
	return 1;
}

static int parse_path(struct span path, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	if (path.n == 0 || path.p[0] != '/')
		return gcr_err_set(err, -EINVAL, "cgroup path is not absolute");
	if (path.n > CGROUP_PATH_MAX)
		return gcr_err_set(err, -EINVAL, "cgroup path longer than %d bytes", CGROUP_PATH_MAX);
	if (memchr(path.p, '\0', path.n) != NULL)
		return gcr_err_set(err, -EINVAL, "cgroup path contains a NUL byte");

	/* The first pod wins: with nested kubelets (kind on a Kubernetes node)
	 * the outermost pod is the one this node's agent manages. */
	struct span rest = path, comp, parent = { "", 0 };
	while (next_component(&rest, &comp)) {
		struct span tail;
		if (match_systemd_pod(comp, out, &tail)) {
			if (tail.n == 0)
				break;
			if (tail.p[0] != ':')
				return gcr_err_set(err, -EINVAL, "malformed pod slice '%.*s'",
						   (int)(comp.n < QUOTE_MAX ? comp.n : QUOTE_MAX), comp.p);
			return parse_colon_container(span_skip(tail, 1), out, err);
		}
		if (match_cgroupfs_pod(comp, parent, out))
			break;
		/* The matchers may have written part of a UID before failing. */
		memset(out, 0, sizeof(*out));
		parent = comp;
	}
	if (out->pod_uid[0] == '\0')
		return gcr_err_set(err, -ENOENT, "not in a Kubernetes pod cgroup");
	/* Anything below the container directory is the container's own
	 * sub-cgroups (systemd in the container, nested runtimes): ignored. */
	if (!next_component(&rest, &comp))
		return 0;
	return parse_container(comp, out, err);
}

int agent_cgroup_parse_path(const char *path, size_t len, struct agent_cgroup_pod *out,
			    struct gcr_err *err)
{
	struct agent_cgroup_pod pod;
	memset(&pod, 0, sizeof(pod));
	memset(out, 0, sizeof(*out));
	if (path == NULL)
		return gcr_err_set(err, -EINVAL, "no cgroup path");
	struct span s = { path, len };
	int rc = parse_path(s, &pod, err);
	if (rc == 0)
		*out = pod;
	return one_line(err, rc);
}

/* Folds one line's result into the running one; lines of one process must
 * agree, or we would be guessing which pod it belongs to. */
static int merge(struct agent_cgroup_pod *acc, const struct agent_cgroup_pod *line, struct gcr_err *err)
{
	if (acc->pod_uid[0] == '\0') {
		*acc = *line;
		return 0;
	}
	if (strcmp(acc->pod_uid, line->pod_uid) != 0)
		return gcr_err_set(err, -EINVAL, "cgroup lines name different pods (%s, %s)",
				   acc->pod_uid, line->pod_uid);
	if (acc->container_id[0] != '\0' && line->container_id[0] != '\0' &&
	    strcmp(acc->container_id, line->container_id) != 0)
		return gcr_err_set(err, -EINVAL, "cgroup lines name different containers");
	if (acc->container_id[0] == '\0') {
		memcpy(acc->container_id, line->container_id, sizeof(acc->container_id));
		memcpy(acc->runtime, line->runtime, sizeof(acc->runtime));
	}
	if (acc->runtime[0] == '\0')
		memcpy(acc->runtime, line->runtime, sizeof(acc->runtime));
	if (acc->qos == AGENT_CGROUP_QOS_UNKNOWN)
		acc->qos = line->qos;
	return 0;
}

/* "<hierarchy id>:<controllers>:<path>"; v2 is "0::<path>". */
static int split_line(struct span line, struct span *path)
{
	size_t i = 0;
	while (i < line.n && line.p[i] >= '0' && line.p[i] <= '9')
		i++;
	if (i == 0 || i > 10 || i >= line.n || line.p[i] != ':')
		return -1;
	const char *c2 = memchr(line.p + i + 1, ':', line.n - i - 1);
	if (c2 == NULL)
		return -1;
	path->p = c2 + 1;
	path->n = line.n - (size_t)(path->p - line.p);
	return 0;
}

int agent_cgroup_parse(const char *text, size_t len, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	struct agent_cgroup_pod acc, one;
	struct gcr_err line_err = { 0, "" };
	int seen_lines = 0, conmon = 0;

	memset(out, 0, sizeof(*out));
	memset(&acc, 0, sizeof(acc));
	if (text == NULL || len == 0)
		return gcr_err_set(err, -EINVAL, "empty cgroup file");
	if (len > AGENT_CGROUP_MAX_TEXT)
		return gcr_err_set(err, -EINVAL, "cgroup file larger than %d bytes", AGENT_CGROUP_MAX_TEXT);

	struct span rest = { text, len };
	for (int lineno = 1; rest.n > 0; lineno++) {
		const char *nl = memchr(rest.p, '\n', rest.n);
		struct span line = { rest.p, nl ? (size_t)(nl - rest.p) : rest.n }, path;
		rest = span_skip(rest, line.n + (nl ? 1 : 0));
		if (line.n == 0)
			continue;
		seen_lines++;
		if (split_line(line, &path) != 0)
			return gcr_err_set(err, -EINVAL, "cgroup line %d is not 'id:controllers:path'", lineno);
		int rc = agent_cgroup_parse_path(path.p, path.n, &one, &line_err);
		if (rc == -ENOENT) {
			/* In hybrid v1/v2 setups some hierarchies (often the unified
			 * one) do not show the pod: those lines say nothing. conmon,
			 * on any line, means the process is not a container's. */
			if (strstr(line_err.msg, "conmon") != NULL)
				conmon = 1;
			continue;
		}
		if (rc < 0)
			return one_line(err, gcr_err_set(err, rc, "cgroup line %d: %s", lineno, line_err.msg));
		rc = merge(&acc, &one, err);
		if (rc < 0)
			return rc;
	}
	if (seen_lines == 0)
		return gcr_err_set(err, -EINVAL, "empty cgroup file");
	if (conmon)
		return gcr_err_set(err, -ENOENT, "process is CRI-O's conmon, not a container");
	if (acc.pod_uid[0] == '\0')
		return gcr_err_set(err, -ENOENT, "not in a Kubernetes pod cgroup");
	*out = acc;
	return 0;
}

int agent_cgroup_read_file(const char *path, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	/* One byte more than the limit tells "too large" from "exactly full". */
	static const size_t cap = AGENT_CGROUP_MAX_TEXT + 1;
	char *buf = NULL;
	size_t used = 0;
	struct stat st;
	int rc = 0;

	memset(out, 0, sizeof(*out));
	/* O_NONBLOCK: a FIFO planted at the path must not hang the agent. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		rc = -errno;
		return gcr_err_set(err, rc == -ENOENT ? -ESRCH : rc, "open %s: %s", path, strerror(-rc));
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
		rc = gcr_err_set(err, -EINVAL, "%s is not a regular file", path);
		goto out;
	}
	buf = malloc(cap);
	if (buf == NULL) {
		rc = gcr_err_set(err, -ENOMEM, "out of memory reading %s", path);
		goto out;
	}
	/* /proc files report size 0 and may come in several reads. */
	while (used < cap) {
		ssize_t n = read(fd, buf + used, cap - used);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			/* ESRCH: the process exited between open and read. */
			rc = gcr_err_set(err, rc, "read %s: %s", path, strerror(-rc));
			goto out;
		}
		if (n == 0)
			break;
		used += (size_t)n;
	}
	if (used > AGENT_CGROUP_MAX_TEXT) {
		rc = gcr_err_set(err, -EINVAL, "%s is larger than %d bytes", path, AGENT_CGROUP_MAX_TEXT);
		goto out;
	}
	rc = agent_cgroup_parse(buf, used, out, err);
	if (rc < 0)
		gcr_err_wrap(err, "%s", path);
out:
	free(buf);
	close(fd);
	return rc;
}

int agent_cgroup_read_pid(pid_t pid, struct agent_cgroup_pod *out, struct gcr_err *err)
{
	char path[64];
	memset(out, 0, sizeof(*out));
	if (pid <= 0)
		return gcr_err_set(err, -EINVAL, "invalid pid %d", (int)pid);
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
	return agent_cgroup_read_file(path, out, err);
}

const char *agent_cgroup_qos_name(enum agent_cgroup_qos qos)
{
	switch (qos) {
	case AGENT_CGROUP_QOS_GUARANTEED:
		return "Guaranteed";
	case AGENT_CGROUP_QOS_BURSTABLE:
		return "Burstable";
	case AGENT_CGROUP_QOS_BESTEFFORT:
		return "BestEffort";
	case AGENT_CGROUP_QOS_UNKNOWN:
		break;
	}
	return "";
}
