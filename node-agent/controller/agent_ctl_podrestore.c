/* agent_ctl_podrestore: a Restore of an Image into a new pod created from its checkpoint: the pod's
 * restored process found, the image checked and copied in, the process resumed, or its container
 * ended. */
#include "config.h"

#include "agent_controller.h"
#include "agent_ctl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_crobj.h"
#include "agent_images.h"
#include "agent_phase.h"
#include "agent_podspec.h"
#include "gcr_cr.h"
#include "gcr_image.h"
#include "gcr_imgcr.h"
#include "gcr_sock.h"
#include "gcr_time.h"

/* ---- Restore of an Image into a new pod (docs/images.md, "Restore into a new pod") ---- */

/* The processes of pod_uid's container cid on this node (host pids, by /proc/<pid>/cgroup),
 * at most max. */
static int container_pids(const char *pod_uid, const char *cid, pid_t *out, int max)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	int n = 0;
	while (d != NULL && n < max && (de = readdir(d)) != NULL) {
		char *end;
		long v = strtol(de->d_name, &end, 10);
		if (*end != '\0' || v <= 0)
			continue;
		struct agent_cgroup_pod cp;
		struct gcr_err e;
		if (agent_cgroup_read_pid((pid_t)v, &cp, &e) == 0 && strcmp(cp.pod_uid, pod_uid) == 0 &&
		    strcmp(cp.container_id, cid) == 0)
			out[n++] = (pid_t)v;
	}
	if (d != NULL)
		closedir(d);
	return n;
}

/* Ends every process of the restored container (its init with them, so the runtime sees it
 * exit): what is left of a restore that failed is never left half-running. */
static void end_container(const pid_t *pids, int n)
{
	for (int i = 0; i < n; i++)
		(void)kill(pids[i], SIGKILL);
}

/* The restored GCR process among pids: the one whose shim answers and is suspended (held at
 * its gate, as dumped: gcr_cr_state's suspended in the full mode). 0 when none (yet). */
static pid_t restored_shim(struct agent_controller *c, const pid_t *pids, int n)
{
	struct gcr_cr_opts cro = { .socket_dir = c->socket_dir, .mode = GCR_CR_FULL, .timeout_ms = 5000 };
	for (int i = 0; i < n; i++) {
		struct gcr_cr_proc_state ps;
		struct gcr_err e;
		if (gcr_cr_state(pids[i], &cro, &ps, &e) == 0 && ps.shim && ps.state == GCR_CR_ST_SUSPENDED)
			return pids[i];
	}
	return 0;
}

/* A Restore whose Checkpoint is an Image with the kubelet's CPU side: the new pod spec.podName,
 * created from that checkpoint (the runtime restored its container, the process held at its
 * shim's gate), gets the GPU data: the image checked whole first (manifest, sizes, every
 * checksum), copied into the pod's socket directory, read by the shim, resumed. Any failure
 * ends the restored container (nothing half-running) with a Failed status and a Warning Event. */
/* The container an image was taken from (its manifest's "container"), "" when it names none (an
 * image from before the field) or cannot be read (its check refuses it later). */
static void image_container(const char *path, char *out, size_t len)
{
	char mf[PATH_MAX + 32], *buf = NULL;
	size_t n = 0;
	struct gcr_image_manifest m;
	struct gcr_err err;
	out[0] = '\0';
	snprintf(mf, sizeof(mf), "%s/%s", path, GCR_IMAGE_MANIFEST);
	if (gcr_image_read_file(mf, GCR_IMAGE_MAX_JSON, &buf, &n, &err) == 0 &&
	    gcr_image_manifest_parse(buf, n, &m, &err) == 0) {
		if (agent_crobj_is_label(m.container))
			snprintf(out, len, "%s", m.container);
		gcr_image_manifest_clear(&m);
	}
	free(buf);
}

/* "a, b" of pod's containers, for a message. */
static void pod_containers(json_t *pod, char *out, size_t len)
{
	size_t i, used = 0;
	json_t *ct;
	out[0] = '\0';
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "containers"), i, ct)
	{
		const char *n = json_string_value(json_object_get(ct, "name"));
		int w = snprintf(out + used, len - used, "%s%.63s", i ? ", " : "", n ? n : "?");
		if (w < 0 || (size_t)w >= len - used)
			break;
		used += (size_t)w;
	}
}

/* The image's GPU files, open read-only, to hand to the restored process's shim (image-read
 * with "files"): the table and each allocation's data file, names pointing into the manifest.
 * n 0: more than one request carries, the caller copies instead. */
struct handover {
	const char *names[GCR_SOCK_MAX_FDS];
	int fds[GCR_SOCK_MAX_FDS];
	int n;
};

static void handover_close(struct handover *h)
{
	for (int i = 0; i < h->n; i++)
		close(h->fds[i]);
	h->n = 0;
}

/* Whether a has a data file: any chunk not all zero. */
static int has_data(const struct gcr_image_alloc *a)
{
	for (size_t c = 0; c < a->nchunks; c++)
		if (!a->chunks[c].zero)
			return 1;
	return 0;
}

static int handover_open(int sfd, const struct gcr_image_manifest *m, struct handover *h, struct gcr_err *err)
{
	size_t need = 1;
	for (size_t i = 0; i < m->table.n; i++)
		need += (size_t)has_data(&m->table.a[i]);
	if (need > GCR_SOCK_MAX_FDS)
		return 0;
	for (size_t i = 0; i <= m->table.n; i++) {
		const char *name = i == 0 ? GCR_IMAGE_TABLE : m->table.a[i - 1].file;
		if (i > 0 && !has_data(&m->table.a[i - 1]))
			continue;
		int fd = openat(sfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			int e = errno;
			handover_close(h);
			return gcr_err_set(err, -e, "cannot open the image's %s: %s", name, strerror(e));
		}
		h->names[h->n] = name;
		h->fds[h->n++] = fd;
	}
	return 0;
}

void agent_ctl_restore_image(struct agent_controller *c, struct op *o, const struct agent_crobj *ckd)
{
	const struct agent_crobj *d = &o->d;
	char path[PATH_MAX], inside[PATH_MAX], node[256], what[600], msg[PATH_MAX + 2 * GCR_ERR_MSG_MAX];
	struct gcr_err err = { 0 };
	if (!ckd->cpu_kubelet) {
		agent_ctl_fail(c, o, "NotRestorable", "Checkpoint %s/%s is an Image whose CPU side is the agent's CRIU dump: no pod "
			       "can be created from it (spec.cpuCheckpoint Kubelet makes one that can); nothing was done", d->ns,
			       ckd->name);
		return;
	}
	if (d->pod[0] == '\0') {
		agent_ctl_fail(c, o, "InvalidSpec", "restoring Image %s needs spec.podName, the new pod created from its checkpoint; "
			       "nothing was done", ckd->name);
		return;
	}
	if (ckd->phase != AGENT_PHASE_SUCCEEDED) {
		if (ckd->phase == AGENT_PHASE_FAILED)
			agent_ctl_fail(c, o, "CheckpointFailed", "Checkpoint %s/%s failed; there is no image to restore", d->ns, ckd->name);
		else if (d->phase == AGENT_PHASE_NONE)
			agent_ctl_set_status(c, o, AGENT_PHASE_PENDING, "WaitingForCheckpoint",
					     "waiting for the Checkpoint to finish", NULL);
		return;
	}
	enum pod_where where;
	json_t *pod = agent_ctl_find_pod(c, d->ns, d->pod, &where, node, sizeof(node));
	snprintf(what, sizeof(what), "pod %s/%s", d->ns, d->pod);
	if (pod == NULL) {
		if (where == POD_OTHER_NODE)
			agent_ctl_other_node(c, o, node, what);
		else if (where == POD_MISSING)
			agent_ctl_fail(c, o, "PodNotFound", "pod %s/%s not found; nothing was done", d->ns, d->pod);
		else
			agent_ctl_retry_later(c, o->key, 1000); /* unknown, or not scheduled yet */
		return;
	}
	/* Another node's image: here too when the images directory is shared (the image check
	 * below still refuses another GPU model, driver or shim version). */
	if (!c->images_shared && ckd->node[0] != '\0' && strcmp(ckd->node, c->node) != 0) {
		json_decref(pod);
		agent_ctl_fail(c, o, "ImageElsewhere", "the image of Checkpoint %s is on node %s, the pod on %s (images are node-local; "
			       "images.shared says a directory every node shares); nothing was done", ckd->name, ckd->node, c->node);
		return;
	}
	/* The restored container: the one the image was taken from, by the name its manifest keeps (a
	 * pod's other containers, sidecars, are never touched); an image from before the field: the
	 * container whose process waits restored at its shim's gate. */
	char cname[GCR_IMAGE_CONTAINER_MAX] = "", cid[AGENT_CGROUP_CID_LEN + 8] = "", uid[AGENT_CROBJ_UID_LEN];
	const char *pu = agent_ctl_md_str(pod, "uid");
	snprintf(uid, sizeof(uid), "%s", pu ? pu : "");
	if (agent_images_path(c->images_dir, d->ns, ckd->target, ckd->name, path, sizeof(path), &err) == 0)
		image_container(path, cname, sizeof(cname));
	if (cname[0] != '\0' && agent_podspec_container(pod, cname) == NULL) {
		char names[300];
		pod_containers(pod, names, sizeof(names));
		json_decref(pod);
		agent_ctl_fail(c, o, "ContainerNotFound", "the image of Checkpoint %s was taken from container %s; pod %s/%s has no "
			       "container %s (it has: %s); nothing was done", ckd->name, cname, d->ns, d->pod, cname, names);
		return;
	}
	pid_t pids[64], pid = 0;
	int n = 0;
	json_t *css = json_object_get(json_object_get(pod, "status"), "containerStatuses"), *cst;
	size_t ci;
	json_array_foreach(css, ci, cst)
	{
		const char *nm = json_string_value(json_object_get(cst, "name"));
		const char *id = json_object_get(json_object_get(cst, "state"), "running") ? agent_ctl_status_container_id(cst) : NULL;
		if (nm == NULL || id == NULL || (cname[0] != '\0' && strcmp(nm, cname) != 0))
			continue;
		snprintf(cid, sizeof(cid), "%s", id);
		n = container_pids(uid, cid, pids, 64);
		pid = n > 0 ? restored_shim(c, pids, n) : 0;
		if (pid != 0 || cname[0] != '\0')
			break;
		n = 0; /* not this one: no container of the pod is ended for another's image */
	}
	json_decref(pod);
	if (pid == 0) {
		/* Not restored yet (the runtime restores when the container starts): wait, bounded. */
		double now = gcr_time_mono_ms();
		agent_informers_lock(c->inf);
		json_t *seen = json_object_get(c->first_seen, d->uid);
		double first = seen ? (double)json_integer_value(seen) : now;
		if (seen == NULL)
			json_object_set_new(c->first_seen, d->uid, json_integer((json_int_t)now));
		agent_informers_unlock(c->inf);
		int bound = d->timeout_s > 0 ? d->timeout_s * 1000 : c->grace_ms;
		if (now - first < bound) {
			if (d->phase == AGENT_PHASE_NONE)
				agent_ctl_set_status(c, o, AGENT_PHASE_PENDING, "WaitingForPod",
						     "waiting for the pod's restored process (held at its shim's gate)", NULL);
			agent_ctl_retry_later(c, o->key, 500);
			return;
		}
		if (n > 0)
			end_container(pids, n);
		agent_ctl_fail(c, o, "NoRestoredProcess", "pod %s/%s has no restored GCR process waiting for its GPU data after %d s "
			       "(was it created from Checkpoint %s's image?)%s", d->ns, d->pod, bound / 1000, ckd->name,
			       n > 0 ? "; its container was ended" : "; nothing was done");
		return;
	}
	double t0 = gcr_time_mono_ms();
	snprintf(msg, sizeof(msg), "restoring the GPU data of Checkpoint %s into pid %d of pod %s", ckd->name, (int)pid,
		 d->pod);
	if (agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg, json_pack("{s:s}", "podName", d->pod)) < 0)
		return;
	int rc = agent_images_path(c->images_dir, d->ns, ckd->target, ckd->name, path, sizeof(path), &err);
	struct gcr_image_manifest m = { 0 };
	struct gcr_image_expect here;
	struct gcr_imagemac_keys keys = { 0 };
	gcr_imgcr_expect_here(&here);
	if (rc == 0 && (rc = agent_ctl_load_keys(c, &keys, &err)) == 0 && keys.n > 0)
		here.keys = &keys;
	/* The image's manifest, sizes and small files here; the GPU data where it is read, never in
	 * a pass of its own (on the GPU node that pass read 21 GB from disk for 85 s before the
	 * copy read it again, run 72). The shim checks each chunk's CRC-32C as it loads it and
	 * fails the resume on a mismatch, so the process, held at its gate, is ended, never run.
	 * Signed (shared storage): the manifest's MAC, then every file's SHA-256 as it is copied
	 * below (the CPU side by containerd against the digest the registry took from this
	 * manifest). */
	if (rc == 0)
		rc = gcr_image_verify_meta(path, &here, &m, &err);
	if (rc == 0 && strcmp(m.mode, GCR_IMAGE_MODE_RUNTIME) != 0)
		rc = gcr_err_set(&err, -ENOTSUP, "%s is not an image with the kubelet's CPU side (mode %s)", path, m.mode);
	if (rc < 0)
		gcr_err_wrap(&err, "image refused");
	double t_verify = gcr_time_mono_ms() - t0;
	int pfd = -1, sfd = -1;
	struct gcr_imgcr_result rr = { 0 };
	struct handover ho = { .n = 0 };
	if (rc == 0 && (sfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		rc = gcr_err_set(&err, -errno, "cannot open %s: %s", path, strerror(errno));
	/* Unsigned: the image's files handed to the shim as read-only descriptors, nothing copied
	 * (run 74: the copy into the pod's socket directory took 36 s of a 64 s restore, and on tmpfs
	 * it would be memory charged to the agent). Signed, or more files than one request carries:
	 * copied into the pod's directory, each file's SHA-256 checked as it is read. */
	if (rc == 0 && !m.signed_ok)
		rc = handover_open(sfd, &m, &ho, &err);
	if (rc == 0 && ho.n == 0)
		rc = agent_images_pod_dir(pid, d->uid, &pfd, inside, sizeof(inside), &err);
	if (rc == 0 && ho.n == 0) {
		long long b = agent_images_copy_dir_checked(sfd, pfd, GCR_IMAGE_GPU_DIR, m.signed_ok ? &m : NULL, &err);
		rc = b < 0 ? (int)b : 0;
		if (rc < 0 && m.signed_ok)
			gcr_err_wrap(&err, "image refused");
	}
	const char *how = ho.n > 0 ? "the image's files handed over, nothing copied"
			  : m.signed_ok ? "copied into the pod, each file's SHA-256 checked"
					: "copied into the pod (more files than one request carries)";
	gcr_imagemac_clear(&keys);
	if (sfd >= 0)
		close(sfd);
	if (rc == 0) {
		struct gcr_cr_opts cro = { .socket_dir = c->socket_dir, .mode = GCR_CR_FULL,
					   .timeout_ms = agent_ctl_timeout_ms_of(d), .call_ms = agent_ctl_image_op_ms(d) };
		struct gcr_imgcr_files f = { .names = ho.names, .fds = ho.fds, .n = ho.n };
		agent_ctl_test_pause(c, "before-rs");
		rc = ho.n > 0 ? gcr_imgcr_resume_restored_fds(pid, &f, &cro, &rr, &err)
			      : gcr_imgcr_resume_restored(pid, inside, &cro, &rr, &err);
		if (rc < 0 && strstr(err.msg, GCR_IMAGE_CORRUPT) != NULL)
			gcr_err_wrap(&err, "image refused");
	}
	handover_close(&ho);
	gcr_image_manifest_clear(&m); /* after the handover: its names are the manifest's */
	if (pfd >= 0) {
		agent_images_pod_remove(pid, inside);
		close(pfd);
	}
	double total = gcr_time_mono_ms() - t0;
	if (rc < 0) {
		n = container_pids(uid, cid, pids, 64);
		end_container(pids, n);
		snprintf(msg, sizeof(msg), "restore of Checkpoint %s into pod %s failed: %s; the restored container was "
			 "ended (nothing left running)", ckd->name, d->pod, err.msg);
		agent_ctl_set_status(c, o, AGENT_PHASE_FAILED, "RestoreFailed", msg, json_pack("{s:s}", "podName", d->pod));
		agent_ctl_event(c, o->obj, "Restore", "Warning", "RestoreFailed", msg);
		agent_metrics_op(c->metrics, "restore", 0, total, 0);
		agent_ctl_mark_done(c, d->uid);
		return;
	}
	snprintf(msg, sizeof(msg), "pid %d of pod %s resumed with the GPU data of Checkpoint %s (%lld bytes; %s)",
		 (int)pid, d->pod, ckd->name, rr.bytes, how);
	json_t *extra = json_pack("{s:s, s:s, s:{s:I, s:I}, s:{s:I, s:I, s:I, s:I}}", "podName", d->pod, "mode",
				  "Full", "bytes", "vmm", (json_int_t)rr.bytes, "total", (json_int_t)rr.bytes,
				  "durations", "verify", (json_int_t)t_verify, "data", (json_int_t)rr.ms_read,
				  "restore", (json_int_t)rr.ms_resume, "total", (json_int_t)total);
	agent_ctl_set_status(c, o, AGENT_PHASE_SUCCEEDED, "Restored", msg, extra);
	agent_ctl_event(c, o->obj, "Restore", "Normal", "Restored", msg);
	agent_metrics_op(c->metrics, "restore", 1, total, rr.bytes);
	agent_ctl_mark_done(c, d->uid);
}
