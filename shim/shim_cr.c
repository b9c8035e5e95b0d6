/* shim_cr: moves the data of every physical allocation to staging and back, keeping
 * virtual addresses; every failure unwinds to the state the operation started in. */
#include "shim_cr.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "gcr_log.h"
#include "shim_alloc.h"
#include "shim_config.h"
#include "shim_gate.h"
#include "shim_hook.h"
#include "shim_real.h"
#include "shim_staging.h"

static pthread_mutex_t cr_lock = PTHREAD_MUTEX_INITIALIZER; /* one operation at a time */
static _Atomic int state;
static CUstream streams[SHIM_MAX_DEVICES];

static const char *const state_names[] = { "running", "suspending", "suspended", "resuming" };

enum shim_cr_state shim_cr_state(void)
{
	return (enum shim_cr_state)state;
}

const char *shim_cr_state_name(enum shim_cr_state s)
{
	return (unsigned)s < 4 ? state_names[s] : "unknown";
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cu_fail(struct gcr_err *err, int code, CUresult r, const char *what)
{
	const char *name = NULL;
	if (shim_cu.cuGetErrorName == NULL || shim_cu.cuGetErrorName(r, &name) != CUDA_SUCCESS)
		name = NULL;
	return gcr_err_set(err, code, "%s failed: %s (%d)", what, name ? name : "CUDA error", (int)r);
}

static int phys_device(const struct shim_phys *p)
{
	return p->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p->prop.location.id : 0;
}

/* Makes the device's copy context current and returns the shim's stream on it. */
static CUstream device_stream(int dev, struct gcr_err *err)
{
	CUcontext ctx = shim_alloc_device_ctx(dev);
	if (ctx == NULL || shim_cu.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
		gcr_err_set(err, -EIO, "no context for GPU %d", dev);
		return NULL;
	}
	if (streams[dev] == NULL) {
		CUresult r = shim_cu.cuStreamCreate(&streams[dev], CU_STREAM_NON_BLOCKING);
		if (r != CUDA_SUCCESS) {
			cu_fail(err, -EIO, r, "cuStreamCreate");
			return NULL;
		}
	}
	return streams[dev];
}

/* A device address where the whole of p is mapped and accessible, or 0. */
static CUdeviceptr covering_va(const struct shim_phys *p)
{
	for (size_t i = 0; i < shim_alloc_nmaps(); i++) {
		struct shim_map *m = shim_alloc_map_at(i);
		if (m->phys == p && m->offset == 0 && m->size >= p->size && m->ndesc > 0)
			return m->va;
	}
	return 0;
}

/* Copies p to or from staging through a temporary mapping, for handles that are
 * not wholly mapped anywhere. Synchronous: the mapping goes away right after. */
static int copy_via_scratch(struct shim_phys *p, int out, uint64_t off, CUstream s, struct gcr_err *err)
{
	CUdeviceptr va = 0;
	CUmemAccessDesc ad = { { CU_MEM_LOCATION_TYPE_DEVICE, phys_device(p) },
			       CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
	CUresult r = shim_cu.cuMemAddressReserve(&va, p->size, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return cu_fail(err, -ENOMEM, r, "cuMemAddressReserve (scratch)");
	int rc = 0;
	r = SHIM_REAL(cuMemMap, 0)(va, p->size, 0, p->real, 0);
	if (r != CUDA_SUCCESS) {
		rc = cu_fail(err, -EIO, r, "cuMemMap (scratch)");
		goto out_va;
	}
	r = SHIM_REAL(cuMemSetAccess, 0)(va, p->size, &ad, 1);
	if (r != CUDA_SUCCESS)
		rc = cu_fail(err, -EIO, r, "cuMemSetAccess (scratch)");
	if (rc == 0)
		rc = shim_staging_copy_sync(out, off, va, p->size, s, err);
	SHIM_REAL(cuMemUnmap, 0)(va, p->size);
out_va:
	shim_cu.cuMemAddressFree(va, p->size);
	return rc;
}

/* Moves the data of every handle marked staged, in one pipelined transfer; handles
 * not wholly mapped anywhere go through a temporary mapping, one at a time (out:
 * before the transfer, in: after it, when every slab is pinned again). */
static int move_staged(int out, double *ms_pin, struct gcr_err *err)
{
	size_t nphys = shim_alloc_nphys(), n = 0;
	struct shim_xfer *x = calloc(nphys + 1, sizeof(*x));
	if (x == NULL)
		return gcr_err_set(err, -ENOMEM, "out of memory");
	int rc = 0;
	for (int pass = 0; pass < 2 && rc == 0; pass++) {
		int scratch_pass = out ? pass == 0 : pass == 1;
		for (size_t i = 0; i < nphys && rc == 0; i++) {
			struct shim_phys *p = shim_alloc_phys_at(i);
			if (p == NULL || !p->staged)
				continue;
			CUdeviceptr va = covering_va(p);
			CUstream s = device_stream(phys_device(p), err);
			if (s == NULL) {
				rc = err->code;
			} else if (va == 0 && scratch_pass) {
				rc = copy_via_scratch(p, out, p->staged_off, s, err);
			} else if (va != 0 && !scratch_pass) {
				x[n++] = (struct shim_xfer){ .off = p->staged_off, .dev = va, .size = p->size,
							     .stream = s };
			}
		}
		if (rc == 0 && !scratch_pass)
			rc = shim_staging_transfer(out, x, n, shim_cfg.staging_unpin, ms_pin, err);
	}
	free(x);
	return rc;
}

/* Unmaps every mapping of released handles and re-creates nothing: used by
 * suspend. Stops at the first error; what was released stays marked so resume
 * (or the unwind) can re-create it. */
static int release_all(struct gcr_err *err)
{
	for (size_t i = 0; i < shim_alloc_nmaps(); i++) {
		struct shim_map *m = shim_alloc_map_at(i);
		CUresult r = SHIM_REAL(cuMemUnmap, 0)(m->va, m->size);
		if (r != CUDA_SUCCESS)
			return cu_fail(err, -EIO, r, "cuMemUnmap");
	}
	for (size_t i = 0; i < shim_alloc_nphys(); i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p == NULL || p->real == 0)
			continue; /* released by the app: the last unmap freed it */
		CUresult r = SHIM_REAL(cuMemRelease, 0)(p->real);
		if (r != CUDA_SUCCESS)
			return cu_fail(err, -EIO, r, "cuMemRelease");
		p->real = 0;
	}
	return 0;
}

/* Re-creates, maps and fills every staged handle. On failure unmaps and releases
 * what it made, so the process stays suspended and a retry starts clean. */
static int remap_all(struct shim_cr_report *rep, struct gcr_err *err)
{
	int rc = 0;
	double t0 = now_ms();
	size_t nphys = shim_alloc_nphys(), nmaps = shim_alloc_nmaps();
	for (size_t i = 0; i < nphys && rc == 0; i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p == NULL || !p->staged)
			continue;
		CUresult r = SHIM_REAL(cuMemCreate, 0)(&p->real, p->size, &p->prop, 0);
		if (r == CUDA_ERROR_OUT_OF_MEMORY) {
			size_t free_b = 0, total_b = 0;
			if (shim_cu.cuMemGetInfo_v2 != NULL)
				shim_cu.cuMemGetInfo_v2(&free_b, &total_b);
			rc = gcr_err_set(err, -ENOMEM,
					 "not enough GPU memory on GPU %d: need %zu more bytes, %zu free",
					 phys_device(p), p->size, free_b);
		} else if (r != CUDA_SUCCESS) {
			rc = cu_fail(err, -EIO, r, "cuMemCreate");
		}
		if (r != CUDA_SUCCESS)
			p->real = 0;
	}
	size_t mapped = 0;
	for (size_t i = 0; i < nmaps && rc == 0; i++, mapped++) {
		struct shim_map *m = shim_alloc_map_at(i);
		CUresult r = SHIM_REAL(cuMemMap, 0)(m->va, m->size, m->offset, m->phys->real, 0);
		if (r == CUDA_SUCCESS && m->ndesc > 0)
			r = SHIM_REAL(cuMemSetAccess, 0)(m->va, m->size, m->desc, (size_t)m->ndesc);
		if (r != CUDA_SUCCESS) {
			rc = cu_fail(err, -EIO, r, "cuMemMap/cuMemSetAccess");
			if (r == CUDA_SUCCESS)
				mapped++;
		}
	}
	rep->ms_map = now_ms() - t0;
	t0 = now_ms();
	if (rc == 0)
		rc = move_staged(0, &rep->ms_repin, err);
	rep->ms_copy = now_ms() - t0;
	if (rc == 0)
		return 0;
	/* Unwind: nothing half-restored stays behind. */
	for (size_t i = 0; i < mapped && i < nmaps; i++) {
		struct shim_map *m = shim_alloc_map_at(i);
		SHIM_REAL(cuMemUnmap, 0)(m->va, m->size);
	}
	for (size_t i = 0; i < nphys; i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p != NULL && p->staged && p->real != 0) {
			SHIM_REAL(cuMemRelease, 0)(p->real);
			p->real = 0;
		}
	}
	return rc;
}

static void finish_resume(void)
{
	for (size_t i = 0; i < shim_alloc_nphys(); i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p == NULL || !p->staged)
			continue;
		p->staged = 0;
		shim_alloc_after_remap(p);
	}
}

int shim_cr_suspend(int timeout_ms, struct shim_cr_report *rep, struct gcr_err *err)
{
	memset(rep, 0, sizeof(*rep));
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	double t_start = now_ms(), t0 = t_start;
	if (state != SHIM_CR_RUNNING) {
		rc = gcr_err_set(err, -EALREADY, "already suspended (state %s)", shim_cr_state_name(state));
		goto out;
	}
	if (shim_real_cuda_handle() == NULL) {
		rc = gcr_err_set(err, -ENODEV, "the process has not initialised CUDA");
		goto out;
	}
	pthread_mutex_lock(&shim_alloc_lock);
	rc = shim_alloc_check_movable(err);
	pthread_mutex_unlock(&shim_alloc_lock);
	if (rc < 0)
		goto out;
	state = SHIM_CR_SUSPENDING;
	rc = shim_gate_close(timeout_ms, err);
	if (rc < 0) {
		state = SHIM_CR_RUNNING;
		goto out;
	}
	rep->ms_gate = now_ms() - t0;
	t0 = now_ms();
	/* Allocation calls are gated too, so the table is stable from here. */
	pthread_mutex_lock(&shim_alloc_lock);
	CUcontext ctxs[64];
	size_t nctx = shim_alloc_contexts(ctxs, 64);
	for (size_t i = 0; i < nctx && rc == 0; i++) {
		CUresult r = shim_cu.cuCtxSetCurrent(ctxs[i]);
		if (r == CUDA_SUCCESS)
			r = shim_cu.cuCtxSynchronize();
		if (r != CUDA_SUCCESS)
			rc = cu_fail(err, -EIO, r, "cuCtxSynchronize (application work failed?)");
	}
	rep->ms_sync = now_ms() - t0;
	uint64_t total = 0;
	size_t nphys = shim_alloc_nphys();
	for (size_t i = 0; i < nphys; i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p != NULL && (p->real != 0 || p->nmaps > 0))
			total += p->size;
	}
	t0 = now_ms();
	if (rc == 0)
		rc = shim_staging_prepare(total, err);
	for (size_t i = 0; i < nphys && rc == 0; i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p == NULL || (p->real == 0 && p->nmaps == 0))
			continue;
		if (p->real == 0) {
			/* Released by the app, alive through its mappings: copy through one. */
			if (covering_va(p) == 0) {
				rc = gcr_err_set(err, -ENOTSUP, "a released, partly mapped allocation cannot be staged");
				break;
			}
		}
		p->staged = 1;
		p->staged_off = shim_staging_take(p->size);
		rep->bytes += p->size;
		rep->handles++;
	}
	if (rc == 0)
		rc = move_staged(1, &rep->ms_unpin, err);
	rep->ms_copy = now_ms() - t0;
	if (rc < 0) {
		for (size_t i = 0; i < nphys; i++) {
			struct shim_phys *p = shim_alloc_phys_at(i);
			if (p != NULL)
				p->staged = 0;
		}
		goto unwind_gate;
	}
	t0 = now_ms();
	rep->mappings = shim_alloc_nmaps();
	rc = release_all(err);
	rep->ms_release = now_ms() - t0;
	if (rc < 0) {
		/* Some memory is gone: bring all of it back from staging. */
		struct gcr_err err2;
		for (size_t i = 0; i < nphys; i++) {
			struct shim_phys *p = shim_alloc_phys_at(i);
			if (p != NULL && p->staged && p->real != 0) {
				SHIM_REAL(cuMemRelease, 0)(p->real);
				p->real = 0;
			}
		}
		for (size_t i = 0; i < shim_alloc_nmaps(); i++) {
			struct shim_map *m = shim_alloc_map_at(i);
			SHIM_REAL(cuMemUnmap, 0)(m->va, m->size);
		}
		struct shim_cr_report r2;
		if (remap_all(&r2, &err2) < 0) {
			GCR_LOG(GCR_LOG_ERROR, "shim", "suspend unwind failed: %s; process stays suspended", err2.msg);
			pthread_mutex_unlock(&shim_alloc_lock);
			state = SHIM_CR_SUSPENDED;
			goto out;
		}
		finish_resume();
		goto unwind_gate;
	}
	pthread_mutex_unlock(&shim_alloc_lock);
	state = SHIM_CR_SUSPENDED;
	rep->ms_total = now_ms() - t_start;
	goto out;
unwind_gate:
	pthread_mutex_unlock(&shim_alloc_lock);
	shim_staging_resume_background();
	state = SHIM_CR_RUNNING;
	shim_gate_open();
out:
	pthread_mutex_unlock(&cr_lock);
	return rc;
}

int shim_cr_resume(struct shim_cr_report *rep, struct gcr_err *err)
{
	memset(rep, 0, sizeof(*rep));
	pthread_mutex_lock(&cr_lock);
	int rc = 0;
	double t_start = now_ms();
	if (state != SHIM_CR_SUSPENDED) {
		rc = gcr_err_set(err, -EINVAL, "not suspended (state %s)", shim_cr_state_name(state));
		goto out;
	}
	state = SHIM_CR_RESUMING;
	pthread_mutex_lock(&shim_alloc_lock);
	rc = remap_all(rep, err);
	if (rc < 0) {
		pthread_mutex_unlock(&shim_alloc_lock);
		state = SHIM_CR_SUSPENDED;
		goto out;
	}
	for (size_t i = 0; i < shim_alloc_nphys(); i++) {
		struct shim_phys *p = shim_alloc_phys_at(i);
		if (p != NULL && p->staged) {
			rep->bytes += p->size;
			rep->handles++;
		}
	}
	rep->mappings = shim_alloc_nmaps();
	finish_resume();
	pthread_mutex_unlock(&shim_alloc_lock);
	shim_staging_resume_background();
	state = SHIM_CR_RUNNING;
	shim_gate_open();
	rep->ms_total = now_ms() - t_start;
out:
	pthread_mutex_unlock(&cr_lock);
	return rc;
}
