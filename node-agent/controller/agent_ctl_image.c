/* agent_ctl_image: a Checkpoint with action Image, the controller's side: its record, statuses and
 * Events (agent_ckimage runs the Image), and the images' retention and sweeps. */
#include "config.h"

#include "agent_controller.h"
#include "agent_ctl.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "agent_ckimage.h"
#include "agent_crobj.h"
#include "agent_images.h"
#include "agent_ocidist.h"
#include "agent_ocireg.h"
#include "agent_phase.h"
#include "agent_quantity.h"
#include "agent_record.h"
#include "gcr_image.h"
#include "gcr_imagemac.h"
#include "gcr_log.h"
#include "gcr_nvml.h"
#include "gcr_time.h"

/* What Images leave behind (in pods' directories, the kubelet's archives) is looked for this often
 * (ms): the sweep reads every allocation's directory. */
#define LEFTOVER_SWEEP_MS 10000

/* ---- Checkpoint with action Image (agent_ckimage runs it; here its record and statuses) ---- */

/* Whose images this node's retention removes (agent_images.h): on shared storage only its own;
 * node-local, every one in the directory (also those from before manifests named the node). */
static const char *images_owner(const struct agent_controller *c)
{
	return c->images_shared ? c->node : NULL;
}

/* The images key (shared storage): *keys loaded when the agent has a key directory; 0 when it
 * has none (*keys->n 0) or they loaded, else -errno with why. The caller clears them. */
int agent_ctl_load_keys(struct agent_controller *c, struct gcr_imagemac_keys *keys, struct gcr_err *err)
{
	memset(keys, 0, sizeof(*keys));
	return c->key_dir == NULL ? 0 : gcr_imagemac_load(c->key_dir, keys, err);
}

/* After an image of a pod committed at path: its pod directory keeps images.keep images.
 * Returns how many were removed (0 when pruning failed: logged, the image stands). */
static int image_prune(struct agent_controller *c, const struct agent_crobj *d, const char *path)
{
	char pod_dir[PATH_MAX];
	struct gcr_err err;
	snprintf(pod_dir, sizeof(pod_dir), "%s", path);
	char *slash = strrchr(pod_dir, '/');
	if (slash != NULL)
		*slash = '\0';
	int pruned = agent_images_prune(pod_dir, c->images_keep, images_owner(c), &err);
	if (pruned < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: pruning %s: %s", d->ns, d->name, pod_dir, err.msg);
	return pruned > 0 ? pruned : 0;
}

/* What a pod's process may make the agent copy into its image (agent_ckimage_cfg.copy_bound;
 * docs/install.md, "Input bounds"): the bytes it holds on the GPU now (NVML: the driver's count,
 * not the shim's word; a suspended process, or where NVML cannot say: every GPU's memory), and no
 * more than its container's ephemeral-storage limit when it has one, so that the copy counts
 * against the pod that made it. 0 with err: no bound. */
unsigned long long agent_ctl_copy_bound(void *data, const struct agent_record *r, int suspended, char *why, size_t len,
					struct gcr_err *err)
{
	struct agent_controller *c = data;
	struct gcr_nvml_use use[GCR_NVML_MAX_DEVICES];
	int k = 0;
	unsigned long long gpu = 0, limit = 0;
	if (!suspended && gcr_nvml_proc_use(r->p[0].pid, use, GCR_NVML_MAX_DEVICES, &k, err) == 0) {
		for (int i = 0; i < k; i++)
			gpu += use[i].bytes;
		snprintf(why, len, "%llu MiB on the GPU", gpu >> 20);
	} else {
		char gpus[GCR_NVML_MAX_DEVICES][GCR_NVML_UUID_LEN];
		int n = 0;
		if (!suspended)
			GCR_LOG(GCR_LOG_WARN, "controller", "pid %d: its GPU bytes unknown (%s); its image's files are "
				"bounded by the node's GPU memory", (int)r->p[0].pid, err->msg);
		for (int i = 0; gcr_nvml_gpus(gpus, GCR_NVML_MAX_DEVICES, &n, err) == 0 && i < n; i++) {
			unsigned long long fr = 0, total = 0;
			if (gcr_nvml_mem(gpus[i], &fr, &total, err) == 0)
				gpu += total;
		}
		snprintf(why, len, "%llu MiB: the node's GPU memory", gpu >> 20);
	}
	json_t *pod = agent_ctl_cache_get(c, K_POD, r->ns, r->pod), *ct;
	size_t i;
	json_array_foreach(json_object_get(json_object_get(pod, "spec"), "containers"), i, ct) {
		const char *name = json_string_value(json_object_get(ct, "name"));
		const char *q = json_string_value(json_object_get(
			json_object_get(json_object_get(ct, "resources"), "limits"), "ephemeral-storage"));
		if (name != NULL && strcmp(name, r->p[0].container) == 0 && q != NULL &&
		    agent_quantity_parse(q, strlen(q), &limit) == 0 && limit < gpu) {
			snprintf(why, len, "%llu MiB: container %.63s's ephemeral-storage limit %.32s", limit >> 20,
				 r->p[0].container, q);
			gpu = limit;
		}
	}
	json_decref(pod);
	if (gpu == 0)
		gcr_err_set(err, -EIO, "the bytes pid %d may write cannot be bounded (NVML: %s)", (int)r->p[0].pid,
			    err->msg);
	return gpu;
}

/* The checkpoint image's reference on this node's registry (agent_ocireg), with a new 128-bit
 * token as its tag: what a user's new pod names to be created from this Checkpoint's image. Not
 * for an eviction's (its replacement pod gets its own token from the scaler) nor without the
 * registry: -ENOENT. */
static int publish_ref(struct agent_controller *c, const struct op *o, char *ref, size_t len)
{
	json_t *labels = json_object_get(json_object_get(o->obj, "metadata"), "labels");
	const char *ev = json_string_value(json_object_get(labels, AGENT_OCIREG_LABEL_EVICTION));
	char token[AGENT_OCIDIST_TOKEN_LEN + 1];
	struct gcr_err err;
	if (c->registry_port <= 0 || (ev != NULL && strcmp(ev, "true") == 0))
		return -ENOENT;
	if (agent_ocidist_token(token, &err) < 0) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: no image reference (%s)", o->d.ns, o->d.name,
			err.msg);
		return -ENOENT;
	}
	return agent_ocidist_ref(c->registry_port, o->d.ns, o->d.name, token, ref, len) < 0 ? -ENOENT : 0;
}

/* An Image's every wait on its process: spec.timeoutSeconds, else this (ms): its suspend and
 * resume move the GPU data at the disk's speed, not PCIe's. */
#define IMAGE_OP_DEFAULT_MS (10 * 60 * 1000)

int agent_ctl_image_op_ms(const struct agent_crobj *d)
{
	return d->timeout_s > 0 ? d->timeout_s * 1000 : IMAGE_OP_DEFAULT_MS;
}

/* The Image of r (state imaging) run or finished by agent_ckimage, then its outcome into the
 * record first and the status after (sync_checkpoint writes it again if that write is lost).
 * Not over (its process not back yet): the record stays imaging, retried with backoff. */
void agent_ctl_run_image(struct agent_controller *c, struct op *o, struct agent_record *r)
{
	struct agent_ckimage_out out;
	agent_ckimage_run(c->img, r, agent_ctl_timeout_ms_of(&o->d), agent_ctl_image_op_ms(&o->d), &out);
	struct proc p = { .pid = r->p[0].pid };
	snprintf(p.container, sizeof(p.container), "%s", r->img.container);
	if (!out.final) {
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: %s", r->ns, r->name, out.msg);
		agent_ctl_save(c, r);
		/* Said once: a write of the same again would bring its own event, and a try, back at once. */
		const char *said = agent_ctl_status_str(o->obj, "message");
		if (o->obj != NULL && (said == NULL || strcmp(said, out.msg) != 0))
			agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", out.msg,
					     json_pack("{s:o}", "processes", agent_ctl_procs_json(&p, 1, out.state)));
		agent_ctl_retry_later(c, o->key, 0);
		agent_ckimage_out_clear(&out);
		return;
	}
	json_t *extra = out.extra != NULL ? json_incref(out.extra) : json_object();
	char msg[sizeof(out.msg) + 900];
	snprintf(msg, sizeof(msg), "%s", out.msg);
	if (out.ok) {
		if (image_prune(c, &o->d, r->img.path) > 0)
			snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), "; older images of the pod past the limit "
				 "removed");
		char ref[700];
		if (r->img.kubelet && o->obj != NULL && publish_ref(c, o, ref, sizeof(ref)) == 0) {
			json_object_set_new(json_object_get(extra, "image"), "reference", json_string(ref));
			/* The reference carries the token: status.image.reference only, never the message, an
			 * Event or a log line (docs/install.md, "The image registry"). */
			snprintf(msg + strlen(msg), sizeof(msg) - strlen(msg), "; a new pod restores it from the image "
				 "named in status.image.reference");
		}
	}
	json_object_set_new(extra, "processes", agent_ctl_procs_json(&p, 1, out.state));
	json_t *st = agent_ctl_build_status(c, o, out.ok ? AGENT_PHASE_SUCCEEDED : AGENT_PHASE_FAILED, out.reason, msg, extra);
	agent_record_set_status(&r->ck_status, st);
	r->state = out.ok ? AGENT_REC_IMAGED : AGENT_REC_FAILED;
	agent_ctl_save(c, r);
	if (o->obj != NULL && agent_ctl_write_status(c, o, st) == 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "Checkpoint %s/%s: %s (%s) %s", o->d.ns, o->d.name,
			out.ok ? "Succeeded" : "Failed", out.reason, msg);
	json_decref(st);
	if (o->obj != NULL)
		agent_ctl_event(c, o->obj, "Checkpoint", out.ok ? "Normal" : "Warning", out.ok ? "ImageWritten" : out.reason, msg);
	agent_metrics_op(c->metrics, "checkpoint", out.ok, out.ms_total, out.bytes);
	agent_ctl_mark_done(c, r->uid);
	agent_ctl_retry_reset(c, o->key);
	agent_ckimage_out_clear(&out);
}

/* A new Image of the pod's one GCR process: refused at once where nothing can be done, else
 * recorded (imaging, step start) before anything is touched, then run. */
void agent_ctl_new_image(struct agent_controller *c, struct op *o, json_t *pod, const struct agent_registry_proc *rp,
			 int n)
{
	const struct agent_crobj *d = &o->d;
	struct gcr_err err;
	if (n != 1) {
		agent_ctl_fail(c, o, "ImageFailed", "pod %s/%s has %d processes under the GCR shim; an image holds one (name its "
			       "container in spec.containerName); nothing was done", d->ns, d->target, n);
		return;
	}
	if (gcr_image_is_partial(d->name)) {
		agent_ctl_fail(c, o, "InvalidSpec", "Checkpoint name %s holds \"%s\", which names a partial image (never taken for "
			       "an image, never removed by retention): an Image needs another name; nothing was done", d->name,
			       GCR_IMAGE_PARTIAL);
		return;
	}
	if (d->cpu_kubelet && c->kubelet_url == NULL) {
		agent_ctl_fail(c, o, "ImageFailed", "spec.cpuCheckpoint Kubelet: this agent has no kubelet URL (the chart's "
			       "images.kubelet.enabled is off); nothing was done");
		return;
	}
	struct agent_record r = { .keep_context = 0, .state = AGENT_REC_IMAGING, .action = AGENT_REC_ACT_IMAGE, .n = 1 };
	snprintf(r.uid, sizeof(r.uid), "%s", d->uid);
	snprintf(r.ns, sizeof(r.ns), "%s", d->ns);
	snprintf(r.name, sizeof(r.name), "%s", d->name);
	snprintf(r.pod, sizeof(r.pod), "%s", d->target);
	snprintf(r.pod_uid, sizeof(r.pod_uid), "%s", rp[0].pod_uid);
	r.p[0].pid = rp[0].pid;
	r.p[0].start = rp[0].start;
	agent_ctl_container_name_of(pod, rp[0].container_id, r.p[0].container, sizeof(r.p[0].container));
	r.img = (struct agent_record_image){ .kubelet = d->cpu_kubelet, .step = AGENT_REC_STEP_START, .attempt = 1 };
	snprintf(r.img.container, sizeof(r.img.container), "%s", r.p[0].container);
	if (agent_images_path(c->images_dir, d->ns, d->target, d->name, r.img.path, sizeof(r.img.path), &err) < 0) {
		agent_ctl_fail(c, o, "ImageFailed", "%s; nothing was done", err.msg);
		return;
	}
	if (d->cpu_kubelet && r.img.container[0] == '\0') {
		agent_ctl_fail(c, o, "ImageFailed", "pod %s/%s lists no container for pid %d: the kubelet checkpoints a container "
			       "by name; nothing was done", d->ns, d->target, (int)rp[0].pid);
		return;
	}
	if (agent_record_put(c->rec, &r, &err) < 0) {
		agent_ctl_fail(c, o, "RecordFailed", "cannot record the operation on the node (%s); nothing was done", err.msg);
		return;
	}
	char msg[PATH_MAX + 200];
	snprintf(msg, sizeof(msg), "writing an image of pid %d to %s%s", (int)rp[0].pid, r.img.path,
		 d->cpu_kubelet ? " (CPU side by the kubelet)" : "");
	struct proc p = { .pid = rp[0].pid };
	snprintf(p.container, sizeof(p.container), "%s", r.p[0].container);
	int rc = agent_ctl_set_status(c, o, AGENT_PHASE_RUNNING, "InProgress", msg,
				      json_pack("{s:o}", "processes", agent_ctl_procs_json(&p, 1, "Running")));
	if (rc == -ECANCELED) {
		agent_record_clear(&r);
		return; /* stopping: recorded at step start, run after the restart */
	}
	if (rc < 0) { /* gone, or someone wrote a final phase: it is not run */
		GCR_LOG(GCR_LOG_WARN, "controller", "Checkpoint %s/%s: not run (its status cannot be written)", d->ns,
			d->name);
		agent_record_del(c->rec, r.uid, &err);
		agent_record_clear(&r);
		return;
	}
	agent_ctl_test_pause(c, "before-cr");
	agent_ctl_run_image(c, o, &r);
	agent_ctl_test_pause(c, "after-cr");
	agent_record_clear(&r);
}

/* An Image's record whose Checkpoint is gone: one cut short is brought back and cleaned all the
 * same (no status to write); the record goes once nothing is left for the sweep. */
void agent_ctl_orphan_image(struct agent_controller *c, const char *key, struct agent_record *r)
{
	struct gcr_err err;
	if (r->state == AGENT_REC_IMAGING) {
		struct op o = { .kind = K_CK, .key = key };
		snprintf(o.d.ns, sizeof(o.d.ns), "%s", r->ns);
		snprintf(o.d.name, sizeof(o.d.name), "%s", r->name);
		snprintf(o.d.uid, sizeof(o.d.uid), "%s", r->uid);
		agent_ctl_run_image(c, &o, r);
		if (r->state == AGENT_REC_IMAGING)
			return; /* retried */
	}
	if (agent_ckimage_pending(r, (long long)time(NULL))) {
		agent_ctl_retry_later(c, key, SWEEP_MS * 5);
		return;
	}
	agent_record_del(c->rec, r->uid, &err);
	agent_ctl_retry_reset(c, key);
}

/* Whether Checkpoint ns/name is in the (listed) cache: agent_images_sweep's question. */
static int ck_exists(void *data, const char *ns, const char *name)
{
	struct agent_controller *c = data;
	char key[600];
	snprintf(key, sizeof(key), "%s/%s", ns, name);
	agent_informers_lock(c->inf);
	int have = !agent_ctl_synced_locked(c) ? -1 : agent_ctl_cached_locked(c, K_CK, key) != NULL;
	agent_informers_unlock(c->inf);
	return have;
}

void agent_ctl_sweep_images(struct agent_controller *c)
{
	struct gcr_err err;
	int n = agent_images_sweep(c->images_dir, images_owner(c), ck_exists, c, &err);
	if (n < 0)
		GCR_LOG(GCR_LOG_WARN, "controller", "images sweep: %s", err.msg);
	else if (n > 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "images sweep: %d image(s) whose Checkpoint is gone removed", n);
	/* What Images left (agent_ckimage_sweep): less often, it reads every pod's directories. */
	double now = gcr_time_mono_ms();
	if (now - c->last_leftovers < LEFTOVER_SWEEP_MS)
		return;
	c->last_leftovers = now;
	n = agent_ckimage_sweep(c->img, c->alloc_root);
	if (n > 0)
		GCR_LOG(GCR_LOG_INFO, "controller", "leftovers sweep: %d leftover(s) of images removed (partial images, "
			"the kubelet's archives, pods' copies, what pods put in their image directories)", n);
}
