/* agent_cgroup: maps a process to its Kubernetes pod and container from the text
 * of /proc/<pid>/cgroup (cgroup v1 and v2, cgroupfs and systemd drivers). */
#ifndef AGENT_CGROUP_H
#define AGENT_CGROUP_H

#include <stddef.h>
#include <sys/types.h>

#include "gcr_error.h"

#define AGENT_CGROUP_UID_LEN 36 /* canonical 8-4-4-4-12 pod UID */
#define AGENT_CGROUP_CID_LEN 64 /* hex container ID */
/* /proc/<pid>/cgroup is a few hundred bytes even with every v1 controller;
 * anything larger is not a cgroup file and is refused rather than scanned. */
#define AGENT_CGROUP_MAX_TEXT (64 * 1024)

enum agent_cgroup_qos {
	AGENT_CGROUP_QOS_UNKNOWN = 0, /* relative path that hides the QoS level */
	AGENT_CGROUP_QOS_GUARANTEED,
	AGENT_CGROUP_QOS_BURSTABLE,
	AGENT_CGROUP_QOS_BESTEFFORT,
};

struct agent_cgroup_pod {
	/* Lowercase canonical UID with dashes. Static pods are named after the
	 * kubelet's 32-hex config hash instead (the mirror pod's
	 * kubernetes.io/config.hash annotation); that is kept as-is, 32 chars. */
	char pod_uid[AGENT_CGROUP_UID_LEN + 1];
	/* Lowercase hex; "" when the process sits in the pod cgroup itself. */
	char container_id[AGENT_CGROUP_CID_LEN + 1];
	/* "containerd", "cri-o", "docker", or "" when the cgroupfs driver's bare
	 * container directory does not say which runtime made it. */
	char runtime[16];
	enum agent_cgroup_qos qos;
};

/* Parses the text of /proc/<pid>/cgroup (len bytes, need not be NUL-terminated).
 * Returns 0 and fills out when the process is in a pod; -ENOENT when it is not
 * (host process, "0::/" inside a cgroup namespace, CRI-O's conmon); -EINVAL when
 * the text is malformed, a pod path cannot be parsed, or lines disagree. */
int agent_cgroup_parse(const char *text, size_t len, struct agent_cgroup_pod *out,
		       struct gcr_err *err) __attribute__((warn_unused_result));

/* Parses one cgroup path (the part after the second ':'); same results. */
int agent_cgroup_parse_path(const char *path, size_t len, struct agent_cgroup_pod *out,
			    struct gcr_err *err) __attribute__((warn_unused_result));

/* Reads a cgroup file (at most AGENT_CGROUP_MAX_TEXT bytes) and parses it; a
 * missing file gives -ESRCH (the process is gone), keeping -ENOENT for "not a pod". */
int agent_cgroup_read_file(const char *path, struct agent_cgroup_pod *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* agent_cgroup_read_file on /proc/<pid>/cgroup; -ESRCH when the process is gone. */
int agent_cgroup_read_pid(pid_t pid, struct agent_cgroup_pod *out, struct gcr_err *err)
	__attribute__((warn_unused_result));

/* "Guaranteed", "Burstable", "BestEffort" or "" (the names in pod.status.qosClass). */
const char *agent_cgroup_qos_name(enum agent_cgroup_qos qos);

#endif
