/* fakecuda_mem: device memory on host pages: cuMemAlloc-family and host allocations, the VMM
 * API (reservations, memfd-backed physical handles, mappings), accounting, checkpoint/restore. */
#include "fakecuda.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fakecuda_pool.h"

#define FAKE_PAGE ((size_t)4096)
#define FAKE_PITCH_ALIGN ((size_t)512) /* cuMemAllocPitch row alignment, bytes */

enum fake_alloc_kind {
	FAKE_ALLOC_DEVICE,  /* cuMemAlloc, cuMemAllocPitch */
	FAKE_ALLOC_ASYNC,   /* a stream-ordered pool's block (fakecuda_pool_async.c) */
	FAKE_ALLOC_MANAGED, /* cuMemAllocManaged */
	FAKE_ALLOC_HOST,    /* cuMemAllocHost, cuMemHostAlloc: pinned host memory */
	FAKE_ALLOC_REGISTERED, /* cuMemHostRegister: the caller's memory, not ours */
};

struct fake_alloc {
	struct fake_alloc *next;
	enum fake_alloc_kind kind;
	char *base;
	size_t size;    /* as requested */
	size_t map_len; /* bytes mapped and charged (page-rounded); 0 for registered memory */
	struct fake_ctx *ctx; /* NULL for pool memory, which outlives contexts */
	int dev;              /* the device charged; -1: host memory */
	unsigned long long id;
	void *saved; /* contents while checkpointed */
};

struct fake_resv { /* cuMemAddressReserve */
	struct fake_resv *next;
	char *base;
	size_t size;
};

struct fake_phys { /* cuMemCreate */
	struct fake_phys *next;
	unsigned long long id; /* the CUmemGenericAllocationHandle */
	int fd;                /* memfd; -1 while checkpointed */
	size_t size;
	CUmemAllocationProp prop;
	unsigned int refs; /* create + retains - releases; lives while refs or maps */
	unsigned int maps;
	void *saved;
	bool exported; /* its file descriptor was given out (cuMemExportToShareableHandle) */
	bool imported; /* another process's memory (cuMemImportFromShareableHandle): not charged here */
};

struct fake_map { /* cuMemMap */
	struct fake_map *next;
	char *va;
	size_t size, offset;
	struct fake_phys *phys;
	int prot; /* set by cuMemSetAccess; PROT_NONE until then */
	unsigned long long access;
};

/* All under the device lock. */
static struct fake_alloc *fake_allocs;
static struct fake_resv *fake_resvs;
static struct fake_phys *fake_physs;
static struct fake_map *fake_maps;
static size_t fake_used[FAKE_MAX_DEVICES]; /* bytes this process holds per device */
static unsigned long long fake_next_id = 1;

static size_t fake_round(size_t n, size_t align)
{
	return (n + align - 1) / align * align;
}

static bool fake_is_device_kind(enum fake_alloc_kind kind)
{
	return kind == FAKE_ALLOC_DEVICE || kind == FAKE_ALLOC_ASYNC || kind == FAKE_ALLOC_MANAGED;
}

/* ---- accounting: a device's memory is shared by every fake process using one FAKECUDA_DIR,
 * as a GPU is shared, so a restore can find the memory taken by someone else ---- */

_Static_assert(FAKE_POOL_DEVICES == FAKE_MAX_DEVICES, "the pool has a column per device");

static struct fake_pool_slot *fake_pool; /* NULL: the file could not be used; count locally */
static int fake_pool_fd = -1;
static bool fake_pool_tried;
static pid_t fake_pool_opener; /* a forked child opens the pool anew: see fake_slot_alive */
/* The slot whose lock this process holds, -1 none yet. Not (pid, pidns): a PID namespace's inode
 * number is reused once it is gone, so a dead process's slot can carry a live process's pid and
 * namespace (found on the real node: a new pod's program wrote its bytes into such a slot,
 * which it held no lock on, and the next pod's program reaped them as a dead process's). */
static int fake_pool_mine = -1;

static void fake_pool_open(void)
{
	size_t len = FAKE_POOL_SLOTS * sizeof(struct fake_pool_slot);
	char path[4096];
	struct stat st;
	void *p;

	fake_pool_tried = true;
	fake_pool_opener = getpid();
	fake_pool_mine = -1;
	fake_pool_path(path, sizeof(path));
	fake_pool_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fake_pool_fd < 0)
		return;
	if (fstat(fake_pool_fd, &st) != 0 ||
	    ((size_t)st.st_size < len && ftruncate(fake_pool_fd, (off_t)len) != 0))
		goto fail;
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fake_pool_fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	fake_pool = p;
	return;
fail:
	close(fake_pool_fd);
	fake_pool_fd = -1;
}

/* Liveness across PID namespaces: a process holds an open-file-description write lock on its
 * slot's bytes for as long as it lives, and the kernel drops it when the process dies, even
 * by SIGKILL. kill(pid, 0) could not tell: processes of several containers share the pool and
 * each sees only its own namespace's pids (found on the real node: one pod's process reaped
 * another's slot, and NVML then listed the other on no GPU). A lock held through our own open
 * file description never conflicts with us, hence a new one in a forked child. */
static struct flock fake_slot_range(int i, short type)
{
	return (struct flock){ .l_type = type, .l_whence = SEEK_SET,
			       .l_start = (off_t)i * (off_t)sizeof(struct fake_pool_slot),
			       .l_len = (off_t)sizeof(struct fake_pool_slot) };
}

static bool fake_slot_alive(int i)
{
	struct flock fl = fake_slot_range(i, F_WRLCK);

	if (fcntl(fake_pool_fd, F_OFD_GETLK, &fl) != 0)
		return true; /* cannot tell: never take a slot that may be someone's */
	return fl.l_type != F_UNLCK;
}

static uint32_t fake_pidns(void)
{
	struct stat ns;

	return stat("/proc/self/ns/pid", &ns) == 0 ? (uint32_t)ns.st_ino : 0;
}

/* The pool unmapped and its file closed: this process's lock on its slot goes with the file
 * unless another process shares the description (a forked child's parent). */
static void fake_pool_close(void)
{
	munmap(fake_pool, FAKE_POOL_SLOTS * sizeof(struct fake_pool_slot));
	close(fake_pool_fd);
	fake_pool = NULL;
	fake_pool_fd = -1;
	fake_pool_mine = -1;
}

/* A forked child must not use its parent's open file description (see fake_slot_alive). */
static void fake_pool_reopen_after_fork(void)
{
	if (fake_pool_fd < 0 || fake_pool_opener == getpid())
		return;
	fake_pool_close(); /* the parent's lock stays: it holds the description too */
	fake_pool_open();
}

/* Reserves bytes on dev for this process: CUDA_ERROR_OUT_OF_MEMORY when the device (all
 * processes together) would exceed FAKECUDA_MEM_MIB. Device lock held. */
static CUresult fake_charge(int dev, size_t bytes)
{
	pid_t me = getpid();
	uint32_t myns = fake_pidns();
	uint64_t others = 0;
	struct fake_pool_slot *mine = NULL;
	CUresult rc = CUDA_SUCCESS;
	int i;

	if (!fake_pool_tried)
		fake_pool_open();
	fake_pool_reopen_after_fork();
	if (fake_pool == NULL) {
		if (fake_used[dev] + bytes > fake_device_total(dev))
			return CUDA_ERROR_OUT_OF_MEMORY;
		fake_used[dev] += bytes;
		return CUDA_SUCCESS;
	}
	flock(fake_pool_fd, LOCK_EX);
	for (i = 0; i < FAKE_POOL_SLOTS; i++) {
		struct fake_pool_slot *s = &fake_pool[i];

		if (i == fake_pool_mine) {
			struct flock fl = fake_slot_range(i, F_WRLCK);

			/* After a CRIU restore (into a new pod: another PID namespace) the slot must name
			 * this process as it is now, and its lock must be ours again: CRIU restores it
			 * (file-locks), and if it could not, another slot is taken below. */
			if (fcntl(fake_pool_fd, F_OFD_SETLK, &fl) == 0) {
				mine = s;
				s->pid = me;
				s->pidns = myns;
			} else {
				fake_pool_mine = -1;
			}
		} else if (s->pid != 0 && !fake_slot_alive(i)) {
			memset(s, 0, sizeof(*s));
		} else if (s->pid != 0) {
			others += s->used[dev];
		}
	}
	for (i = 0; i < FAKE_POOL_SLOTS && mine == NULL; i++) {
		struct flock fl = fake_slot_range(i, F_WRLCK);

		if (fake_pool[i].pid == 0 && fcntl(fake_pool_fd, F_OFD_SETLK, &fl) == 0) {
			mine = &fake_pool[i];
			fake_pool_mine = i;
			memset(mine, 0, sizeof(*mine));
			mine->pid = me;
			mine->pidns = myns;
		}
	}
	if (others + fake_used[dev] + bytes > fake_device_total(dev)) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	} else {
		fake_used[dev] += bytes;
		if (mine != NULL)
			memcpy(mine->used, fake_used, sizeof(mine->used));
	}
	flock(fake_pool_fd, LOCK_UN);
	return rc;
}

/* The driver's checkpoint closes the process's device files, and with them whatever the kernel
 * tied to them; the stand-in's match is its pool slot and the slot's lock. Left held, a CRIU
 * dump carries the lock, and its restore fails (criu file-lock.c: "Can not set ofd lock") once
 * another process has taken the dead original's slot (seen in the GPU node's rehearsal). The
 * next charge, at restore, takes a slot anew. Device lock held. */
static void fake_pool_leave(void)
{
	if (fake_pool == NULL)
		return;
	if (fake_pool_mine >= 0 && fake_pool_opener == getpid()) {
		flock(fake_pool_fd, LOCK_EX);
		memset(&fake_pool[fake_pool_mine], 0, sizeof(fake_pool[fake_pool_mine]));
		flock(fake_pool_fd, LOCK_UN);
	}
	fake_pool_close(); /* drops the slot's lock */
	fake_pool_tried = false;
}

static size_t fake_pool_others(int dev)
{
	size_t others = 0;
	int i;

	/* The real driver's free memory is the device's, whoever holds the rest: a process that has
	 * charged nothing yet still sees the others (found by tests/gpu/node's overcommit). */
	if (!fake_pool_tried)
		fake_pool_open();
	fake_pool_reopen_after_fork();
	if (fake_pool == NULL)
		return 0;
	flock(fake_pool_fd, LOCK_EX);
	for (i = 0; i < FAKE_POOL_SLOTS; i++)
		if (fake_pool[i].pid != 0 && i != fake_pool_mine && fake_slot_alive(i))
			others += fake_pool[i].used[dev];
	flock(fake_pool_fd, LOCK_UN);
	return others;
}

static void fake_discharge(int dev, size_t bytes)
{
	fake_used[dev] -= bytes;
	fake_pool_reopen_after_fork();
	if (fake_pool == NULL || fake_pool_mine < 0)
		return;
	flock(fake_pool_fd, LOCK_EX);
	memcpy(fake_pool[fake_pool_mine].used, fake_used, sizeof(fake_used));
	flock(fake_pool_fd, LOCK_UN);
}

size_t fake_mem_used(void)
{
	size_t sum = 0;
	int i;

	fake_lock();
	for (i = 0; i < FAKE_MAX_DEVICES; i++)
		sum += fake_used[i];
	fake_unlock();
	return sum;
}

/* ---- address space helpers ---- */

/* Puts [p, p + len) back to reserved, inaccessible address space: the pages are dropped, and
 * any access faults (SIGSEGV), as a GPU access to unbacked memory faults. */
static int fake_unback(void *p, size_t len)
{
	void *r = mmap(p, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		       -1, 0);

	return r == MAP_FAILED ? -1 : 0;
}

/* ---- lookups (device lock held) ---- */

static struct fake_alloc *fake_alloc_find(const char *p, size_t len)
{
	struct fake_alloc *a;

	for (a = fake_allocs; a != NULL; a = a->next)
		if (p >= a->base && p < a->base + a->size && len <= (size_t)(a->base + a->size - p))
			return a;
	return NULL;
}

static struct fake_resv *fake_resv_find(const char *p, size_t len)
{
	struct fake_resv *r;

	for (r = fake_resvs; r != NULL; r = r->next)
		if (p >= r->base && p < r->base + r->size && len <= (size_t)(r->base + r->size - p))
			return r;
	return NULL;
}

static struct fake_map *fake_map_find(const char *p)
{
	struct fake_map *m;

	for (m = fake_maps; m != NULL; m = m->next)
		if (p >= m->va && p < m->va + m->size)
			return m;
	return NULL;
}

static struct fake_phys *fake_phys_find(unsigned long long id)
{
	struct fake_phys *ph;

	for (ph = fake_physs; ph != NULL; ph = ph->next)
		if (ph->id == id && ph->refs > 0)
			return ph;
	return NULL;
}

CUresult fake_mem_check(CUdeviceptr dp, size_t len, bool write, bool host_ok)
{
	const char *p = (const char *)(uintptr_t)dp, *cur;
	unsigned long long need =
		write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
	CUresult rc = CUDA_SUCCESS;
	struct fake_map *m;

	if (dp == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (len == 0)
		len = 1;
	fake_lock();
	if (fake_alloc_find(p, len) != NULL) {
		rc = CUDA_SUCCESS;
	} else if (fake_resv_find(p, len) != NULL) {
		/* Reserved but unmapped, or mapped without access: the driver refuses the copy. */
		for (cur = p; cur < p + len; cur = m->va + m->size) {
			m = fake_map_find(cur);
			if (m == NULL || (m->access & need) != need) {
				rc = CUDA_ERROR_INVALID_VALUE;
				break;
			}
		}
	} else if (!host_ok) {
		rc = CUDA_ERROR_INVALID_VALUE;
	}
	fake_unlock();
	return rc;
}

/* ---- cuMemAlloc family ---- */

static CUresult fake_alloc_new(enum fake_alloc_kind kind, size_t size, struct fake_alloc **out)
{
	struct fake_ctx *ctx;
	struct fake_alloc *a;
	CUresult rc;
	void *p;

	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return rc;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	a = calloc(1, sizeof(*a));
	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->kind = kind;
	a->size = size;
	a->map_len = fake_round(size, FAKE_PAGE);
	a->ctx = ctx;
	a->dev = ctx->dev;
	fake_lock();
	rc = fake_is_device_kind(kind) ? fake_charge(ctx->dev, a->map_len) : CUDA_SUCCESS;
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		free(a);
		return rc;
	}
	/* Device memory is never swapped-in lazily by the driver, but host pages are; that is
	 * fine: a fresh cuMemAlloc has undefined contents and zero pages are a valid value. */
	p = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		 -1, 0);
	fake_lock();
	if (p == MAP_FAILED) {
		if (fake_is_device_kind(kind))
			fake_discharge(ctx->dev, a->map_len);
		fake_unlock();
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->base = p;
	a->id = fake_next_id++;
	a->next = fake_allocs;
	fake_allocs = a;
	fake_unlock();
	*out = a;
	return CUDA_SUCCESS;
}

/* Unlinks and frees the allocation at base if its kind is one of mask; device lock held. */
static CUresult fake_alloc_free_locked(const char *base, unsigned int mask)
{
	struct fake_alloc **pp, *a;

	for (pp = &fake_allocs; *pp != NULL; pp = &(*pp)->next) {
		a = *pp;
		if (a->base != base || !(mask & (1u << a->kind)))
			continue;
		*pp = a->next;
		if (a->kind != FAKE_ALLOC_REGISTERED)
			munmap(a->base, a->map_len);
		if (fake_is_device_kind(a->kind) && a->dev >= 0)
			fake_discharge(a->dev, a->map_len);
		free(a->saved);
		free(a);
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

static CUresult fake_alloc_free(CUdeviceptr dp, unsigned int mask)
{
	CUresult rc;

	fake_lock();
	rc = fake_alloc_free_locked((const char *)(uintptr_t)dp, mask);
	fake_unlock();
	return rc;
}

void fake_mem_free_ctx(struct fake_ctx *ctx)
{
	struct fake_alloc *a;

	fake_lock();
	for (a = fake_allocs; a != NULL;) {
		struct fake_alloc *next = a->next;

		if (a->ctx == ctx)
			fake_alloc_free_locked(a->base, 1u << a->kind);
		a = next;
	}
	fake_unlock();
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
	struct fake_alloc *a;
	CUresult rc;

	FAKE_ENTER("cuMemAlloc");
	if (dptr == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_alloc_new(FAKE_ALLOC_DEVICE, size, &a);
	if (rc == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)a->base;
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
					size_t height, unsigned int elem)
{
	struct fake_alloc *a;
	size_t p;
	CUresult rc;

	FAKE_ENTER("cuMemAllocPitch");
	if (dptr == NULL || pitch == NULL || width == 0 || height == 0 ||
	    (elem != 4 && elem != 8 && elem != 16))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	p = fake_round(width, FAKE_PITCH_ALIGN);
	rc = fake_alloc_new(FAKE_ALLOC_DEVICE, p * height, &a);
	if (rc == CUDA_SUCCESS) {
		*dptr = (CUdeviceptr)(uintptr_t)a->base;
		*pitch = p;
	}
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuMemFree");
	rc = fake_ctx_current(&ctx);
	/* Pool memory too (the runtime's cudaFree accepts it): back to its pool at once. */
	if (rc == CUDA_SUCCESS && dptr != 0 && fake_pool_owns(dptr))
		rc = fake_pool_free_now(dptr);
	else if (rc == CUDA_SUCCESS && dptr != 0)
		rc = fake_alloc_free(dptr, (1u << FAKE_ALLOC_DEVICE) | (1u << FAKE_ALLOC_MANAGED));
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
	struct fake_alloc *a;
	CUresult rc;

	FAKE_ENTER("cuMemAllocManaged");
	if (dptr == NULL || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	rc = fake_alloc_new(FAKE_ALLOC_MANAGED, size, &a);
	if (rc == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)a->base;
	return fake_leave(rc);
}

/* ---- memory of the stream-ordered pools (fakecuda_pool_async.c) ---- */

CUresult fake_mem_pool_map(int dev, size_t len, CUdeviceptr *out)
{
	struct fake_alloc *a = calloc(1, sizeof(*a));
	CUresult rc = CUDA_SUCCESS;
	void *p;

	if (a == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	a->kind = dev >= 0 ? FAKE_ALLOC_ASYNC : FAKE_ALLOC_HOST;
	a->size = len;
	a->map_len = fake_round(len, FAKE_PAGE);
	a->dev = dev;
	fake_lock();
	if (dev >= 0)
		rc = fake_charge(dev, a->map_len);
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		free(a);
		return rc;
	}
	p = mmap(NULL, a->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		 -1, 0);
	fake_lock();
	if (p == MAP_FAILED) {
		if (dev >= 0)
			fake_discharge(dev, a->map_len);
		fake_unlock();
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->base = p;
	a->id = fake_next_id++;
	a->next = fake_allocs;
	fake_allocs = a;
	fake_unlock();
	*out = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

void fake_mem_pool_unmap(CUdeviceptr p)
{
	fake_alloc_free(p, (1u << FAKE_ALLOC_ASYNC) | (1u << FAKE_ALLOC_HOST));
}

void fake_mem_pool_resize(CUdeviceptr p, size_t size)
{
	struct fake_alloc *a;

	fake_lock();
	a = fake_alloc_find((const char *)(uintptr_t)p, 1);
	if (a != NULL && a->base == (char *)(uintptr_t)p && size <= a->map_len)
		a->size = size;
	fake_unlock();
}

void fake_mem_free_alloc(CUdeviceptr p)
{
	fake_alloc_free(p, 1u << FAKE_ALLOC_DEVICE);
}

bool fake_mem_is_alloc(CUdeviceptr p)
{
	struct fake_alloc *a;
	bool is;

	fake_lock();
	a = fake_alloc_find((const char *)(uintptr_t)p, 1);
	is = a != NULL && a->kind == FAKE_ALLOC_DEVICE && a->base == (char *)(uintptr_t)p;
	fake_unlock();
	return is;
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
	struct fake_ctx *ctx;
	size_t t, used;
	CUresult rc;

	FAKE_ENTER("cuMemGetInfo");
	rc = fake_ctx_current(&ctx);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	if (free_bytes == NULL || total == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	t = fake_device_total(ctx->dev);
	fake_lock();
	used = fake_used[ctx->dev] + fake_pool_others(ctx->dev);
	fake_unlock();
	used += fake_ctx_lmem(ctx->dev);
	*total = t;
	*free_bytes = used < t ? t - used : 0;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	const char *p = (const char *)(uintptr_t)dptr;
	struct fake_alloc *a;
	struct fake_ctx *ctx;
	CUresult rc = CUDA_SUCCESS;
	CUdeviceptr base = 0;
	size_t size = 0;

	FAKE_ENTER("cuMemGetAddressRange");
	if (fake_ctx_current(&ctx) != CUDA_SUCCESS)
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	fake_lock();
	/* Only allocations: VMM mappings are not found, as in the driver. */
	if ((a = fake_alloc_find(p, 1)) != NULL) {
		base = (CUdeviceptr)(uintptr_t)a->base;
		size = a->size;
	} else {
		rc = CUDA_ERROR_NOT_FOUND;
	}
	fake_unlock();
	if (rc == CUDA_SUCCESS && pbase != NULL)
		*pbase = base;
	if (rc == CUDA_SUCCESS && psize != NULL)
		*psize = size;
	return fake_leave(rc);
}

/* Legacy IPC: as the driver, only memory of cuMemAlloc (not VMM mappings, not managed or
 * stream-ordered memory) can be exported. The handle names this process and the allocation;
 * nothing opens it here (the shim refuses or passes the export, which is what is tested). */
FAKE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
	const char *p = (const char *)(uintptr_t)dptr;
	struct fake_alloc *a;
	struct fake_ctx *ctx;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuIpcGetMemHandle");
	if (handle == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (fake_ctx_current(&ctx) != CUDA_SUCCESS)
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	fake_lock();
	a = fake_alloc_find(p, 1);
	if (a == NULL || a->kind != FAKE_ALLOC_DEVICE || a->base != p) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else {
		memset(handle, 0, sizeof(*handle));
		snprintf(handle->reserved, sizeof(handle->reserved), "fakecuda-ipc %d %llu", (int)getpid(), a->id);
	}
	fake_unlock();
	return fake_leave(rc);
}

/* ---- host memory ---- */

static CUresult fake_host_alloc(void **pp, size_t size, unsigned int flags)
{
	struct fake_alloc *a;
	CUresult rc;

	if (pp == NULL || (flags & ~(unsigned int)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
						  CU_MEMHOSTALLOC_WRITECOMBINED)))
		return CUDA_ERROR_INVALID_VALUE;
	rc = fake_alloc_new(FAKE_ALLOC_HOST, size, &a);
	if (rc == CUDA_SUCCESS)
		*pp = a->base;
	return rc;
}

FAKE_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
	FAKE_ENTER("cuMemAllocHost");
	return fake_leave(fake_host_alloc(pp, size, 0));
}

FAKE_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	FAKE_ENTER("cuMemHostAlloc");
	return fake_leave(fake_host_alloc(pp, size, flags));
}

FAKE_EXPORT CUresult cuMemFreeHost(void *p)
{
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuMemFreeHost");
	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS)
		rc = fake_alloc_free((CUdeviceptr)(uintptr_t)p, 1u << FAKE_ALLOC_HOST);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
	const unsigned int known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
				   CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
	struct fake_alloc *a, *o;
	struct fake_ctx *ctx;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemHostRegister");
	if (fake_ctx_current(&ctx) != CUDA_SUCCESS)
		return fake_leave(CUDA_ERROR_INVALID_CONTEXT);
	if (p == NULL || size == 0 || (flags & ~known))
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	a = calloc(1, sizeof(*a));
	if (a == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	a->kind = FAKE_ALLOC_REGISTERED;
	a->base = p;
	a->size = size;
	a->ctx = ctx;
	fake_lock();
	for (o = fake_allocs; o != NULL; o = o->next)
		if (o->base < a->base + size && a->base < o->base + o->size)
			rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (rc == CUDA_SUCCESS) {
		a->id = fake_next_id++;
		a->next = fake_allocs;
		fake_allocs = a;
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS)
		free(a);
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemHostUnregister(void *p)
{
	struct fake_ctx *ctx;
	CUresult rc;

	FAKE_ENTER("cuMemHostUnregister");
	rc = fake_ctx_current(&ctx);
	if (rc == CUDA_SUCCESS && fake_alloc_free((CUdeviceptr)(uintptr_t)p,
						  1u << FAKE_ALLOC_REGISTERED) != CUDA_SUCCESS)
		rc = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	return fake_leave(rc);
}

/* ---- pointer attributes ---- */

FAKE_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr dptr)
{
	const char *p = (const char *)(uintptr_t)dptr;
	struct fake_alloc *a;
	struct fake_map *m;
	struct fake_alloc found = {0};
	bool host, managed, is_map = false;
	char *range_base;
	size_t range_size;
	int dev = 0;

	FAKE_ENTER("cuPointerGetAttribute");
	if (data == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	if ((a = fake_alloc_find(p, 1)) != NULL) {
		found = *a;
	} else if ((m = fake_map_find(p)) != NULL) {
		/* The driver reports the reservation as the range of a VMM pointer. */
		struct fake_resv *r = fake_resv_find(p, 1);

		is_map = true;
		found.base = r != NULL ? r->base : m->va;
		found.size = r != NULL ? r->size : m->size;
		found.id = m->phys->id;
		dev = m->phys->prop.location.id;
	}
	fake_unlock();
	if (found.base == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	host = !is_map && (found.kind == FAKE_ALLOC_HOST || found.kind == FAKE_ALLOC_REGISTERED);
	managed = !is_map && found.kind == FAKE_ALLOC_MANAGED;
	if (!is_map)
		dev = found.dev < 0 ? 0 : found.dev;
	range_base = found.base;
	range_size = found.size;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = is_map ? NULL : (CUcontext)found.ctx;
		break;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = dptr;
		break;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		if (!host && !managed)
			return fake_leave(CUDA_ERROR_INVALID_VALUE);
		*(void **)data = (void *)p;
		break;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
		*(unsigned long long *)data = found.id;
		break;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED: /* "booleans": the driver writes 4 bytes */
		*(unsigned int *)data = managed;
		break;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(unsigned int *)data = 1;
		break;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = dev;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)(uintptr_t)range_base;
		break;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = range_size;
		break;
	default:
		return fake_leave(CUDA_ERROR_NOT_SUPPORTED);
	}
	return fake_leave(CUDA_SUCCESS);
}

/* ---- virtual memory management ---- */

static CUresult fake_prop_check(const CUmemAllocationProp *prop)
{
	if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		return CUDA_ERROR_INVALID_VALUE;
	if (prop->location.id < 0 || prop->location.id >= fake_device_count())
		return CUDA_ERROR_INVALID_DEVICE;
	return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
						   const CUmemAllocationProp *prop,
						   CUmemAllocationGranularity_flags option)
{
	CUresult rc = CUDA_SUCCESS;

	/* The VMM calls need no current context (measured with driver 580). */
	FAKE_ENTER("cuMemGetAllocationGranularity");
	if ((granularity == NULL ||
				   (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
				    option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
		rc = CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS)
		rc = fake_prop_check(prop);
	if (rc == CUDA_SUCCESS)
		*granularity = FAKE_GRANULARITY;
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
					 CUdeviceptr addr, unsigned long long flags)
{
	struct fake_resv *r;
	char *p = MAP_FAILED, *q;
	size_t align, extra;

	FAKE_ENTER("cuMemAddressReserve");
	align = alignment ? alignment : FAKE_GRANULARITY;
	if (ptr == NULL || size == 0 || size % FAKE_GRANULARITY || flags != 0 ||
	    (align & (align - 1)) || align % FAKE_GRANULARITY || addr % FAKE_GRANULARITY)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	/* addr is a hint, as in the driver: used when free and suitably aligned. */
	if (addr != 0 && addr % align == 0) {
		p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && p != (char *)(uintptr_t)addr) {
			munmap(p, size);
			p = MAP_FAILED;
		}
	}
	if (p == MAP_FAILED) {
		/* Over-reserve and trim both ends to get the alignment. */
		extra = align > FAKE_PAGE ? align : 0;
		q = mmap(NULL, size + extra, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			 -1, 0);
		if (q == MAP_FAILED) {
			free(r);
			return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
		}
		p = (char *)fake_round((uintptr_t)q, align);
		if (p > q)
			munmap(q, (size_t)(p - q));
		if (q + size + extra > p + size)
			munmap(p + size, (size_t)(q + size + extra - (p + size)));
	}
	r->base = p;
	r->size = size;
	fake_lock();
	r->next = fake_resvs;
	fake_resvs = r;
	fake_unlock();
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	char *p = (char *)(uintptr_t)ptr;
	struct fake_resv **pp, *r = NULL;
	struct fake_map *m;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemAddressFree");
	fake_lock();
	for (pp = &fake_resvs; *pp != NULL; pp = &(*pp)->next) {
		if ((*pp)->base == p && (*pp)->size == size) {
			r = *pp;
			break;
		}
	}
	for (m = fake_maps; r != NULL && m != NULL; m = m->next)
		if (m->va >= r->base && m->va < r->base + r->size)
			r = NULL; /* still mapped: unmap first */
	if (r != NULL) {
		*pp = r->next;
		munmap(r->base, r->size);
		free(r);
		rc = CUDA_SUCCESS;
	}
	fake_unlock();
	return fake_leave(rc);
}

/* FAKECUDA_POPULATE=1: device memory is taken at cuMemCreate, as a GPU's is, not as the
 * memfd's pages are written. Where the "device" is the container's own memory (the GPU node's
 * rehearsal), a sparse one let the shim's staging fault in host memory the program's copy into
 * the device then needed: the pod went over its limit (OOMKilled), which on a GPU cannot be. */
static int fake_populate(int fd, size_t size)
{
	return fake_device_populate() ? fallocate(fd, 0, 0, (off_t)size) : 0;
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
				 const CUmemAllocationProp *prop, unsigned long long flags)
{
	struct fake_phys *ph;
	CUresult rc = CUDA_SUCCESS;
	int fd;

	FAKE_ENTER("cuMemCreate");
	if ((handle == NULL || size == 0 || size % FAKE_GRANULARITY || flags != 0))
		rc = CUDA_ERROR_INVALID_VALUE;
	if (rc == CUDA_SUCCESS)
		rc = fake_prop_check(prop);
	if (rc != CUDA_SUCCESS)
		return fake_leave(rc);
	ph = calloc(1, sizeof(*ph));
	if (ph == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	/* A memfd is sparse: host pages are only used once written. Its name carries the device, so
	 * a process importing it knows where it lives (fake_import_device). */
	char name[32];
	snprintf(name, sizeof(name), "fakecuda-phys-dev%d", prop->location.id);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size) != 0 || fake_populate(fd, size) != 0) {
		if (fd >= 0)
			close(fd);
		free(ph);
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	ph->fd = fd;
	ph->size = size;
	ph->prop = *prop;
	ph->refs = 1;
	fake_lock();
	rc = fake_charge(prop->location.id, size);
	if (rc == CUDA_SUCCESS) {
		ph->id = fake_next_id++;
		ph->next = fake_physs;
		fake_physs = ph;
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS) {
		close(fd);
		free(ph);
		return fake_leave(rc);
	}
	*handle = ph->id;
	return fake_leave(CUDA_SUCCESS);
}

/* Frees physical memory no handle and no mapping refers to any more; device lock held. */
static void fake_phys_reap(struct fake_phys *ph)
{
	struct fake_phys **pp;

	if (ph->refs > 0 || ph->maps > 0)
		return;
	for (pp = &fake_physs; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == ph) {
			*pp = ph->next;
			break;
		}
	}
	if (ph->fd >= 0)
		close(ph->fd);
	if (!ph->imported)
		fake_discharge(ph->prop.location.id, ph->size);
	free(ph->saved);
	free(ph);
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	struct fake_phys *ph;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemRelease");
	fake_lock();
	ph = fake_phys_find(handle);
	if (ph != NULL) {
		ph->refs--;
		fake_phys_reap(ph);
		rc = CUDA_SUCCESS;
	}
	fake_unlock();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	struct fake_map *m;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemRetainAllocationHandle");
	if (handle == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	m = fake_map_find(addr);
	if (m != NULL) {
		m->phys->refs++;
		*handle = m->phys->id;
		rc = CUDA_SUCCESS;
	}
	fake_unlock();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
							    CUmemGenericAllocationHandle handle)
{
	struct fake_phys *ph;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemGetAllocationPropertiesFromHandle");
	if (prop == NULL)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	ph = fake_phys_find(handle);
	if (ph != NULL) {
		*prop = ph->prop;
		rc = CUDA_SUCCESS;
	}
	fake_unlock();
	return fake_leave(rc);
}

/* Sharing physical memory between processes, as NCCL does between its ranks: a POSIX file
 * descriptor of the memfd behind the handle (passed to the peer over a Unix socket), which the
 * peer imports and maps; both see the same pages. Only handles created with that type
 * requested can be exported, as on the device. */
FAKE_EXPORT CUresult cuMemExportToShareableHandle(void *shareable,
						  CUmemGenericAllocationHandle handle,
						  CUmemAllocationHandleType type,
						  unsigned long long flags)
{
	struct fake_phys *ph;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemExportToShareableHandle");
	if (shareable == NULL || flags != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return fake_leave(CUDA_ERROR_NOT_SUPPORTED);
	fake_lock();
	ph = fake_phys_find(handle);
	if (ph != NULL && ph->fd >= 0 &&
	    (ph->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
		int fd = fcntl(ph->fd, F_DUPFD_CLOEXEC, 0);
		rc = fd >= 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
		if (fd >= 0) {
			*(int *)shareable = fd;
			ph->exported = true;
		}
	}
	fake_unlock();
	return fake_leave(rc);
}

/* The device of an exported memfd, from its name ("/memfd:fakecuda-phys-devN (deleted)"). */
static int fake_import_device(int fd)
{
	char link[64], target[128];
	int dev = -1;
	ssize_t n;

	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return -1;
	target[n] = '\0';
	const char *p = strstr(target, "fakecuda-phys-dev");
	if (p == NULL || sscanf(p, "fakecuda-phys-dev%d", &dev) != 1 || dev < 0 || dev >= fake_device_count())
		return -1;
	return dev;
}

FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
						    CUmemAllocationHandleType type)
{
	struct fake_phys *ph;
	struct stat st;
	int fd = (int)(intptr_t)osHandle, dev;

	FAKE_ENTER("cuMemImportFromShareableHandle");
	if (handle == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	dev = fake_import_device(fd);
	if (dev < 0 || fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % FAKE_GRANULARITY)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	ph = calloc(1, sizeof(*ph));
	if (ph == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	ph->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (ph->fd < 0) {
		free(ph);
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	}
	ph->size = (size_t)st.st_size;
	ph->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	ph->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	ph->prop.location.id = dev;
	ph->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	ph->refs = 1;
	ph->imported = true;
	fake_lock();
	ph->id = fake_next_id++;
	ph->next = fake_physs;
	fake_physs = ph;
	*handle = ph->id;
	fake_unlock();
	return fake_leave(CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
			      CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	char *va = (char *)(uintptr_t)ptr;
	struct fake_phys *ph;
	struct fake_map *m, *o;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemMap");
	if (size == 0 || size % FAKE_GRANULARITY || offset % FAKE_GRANULARITY ||
	    ptr % FAKE_GRANULARITY || flags != 0)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	m = calloc(1, sizeof(*m));
	if (m == NULL)
		return fake_leave(CUDA_ERROR_OUT_OF_MEMORY);
	fake_lock();
	ph = fake_phys_find(handle);
	if (ph == NULL || offset > ph->size || size > ph->size - offset ||
	    fake_resv_find(va, size) == NULL)
		rc = CUDA_ERROR_INVALID_VALUE;
	for (o = fake_maps; rc == CUDA_SUCCESS && o != NULL; o = o->next)
		if (o->va < va + size && va < o->va + o->size)
			rc = CUDA_ERROR_INVALID_VALUE; /* already mapped */
	/* Mapped but not accessible until cuMemSetAccess, as on the device. */
	if (rc == CUDA_SUCCESS &&
	    mmap(va, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset) == MAP_FAILED)
		rc = CUDA_ERROR_OUT_OF_MEMORY;
	if (rc == CUDA_SUCCESS) {
		m->va = va;
		m->size = size;
		m->offset = offset;
		m->phys = ph;
		m->prot = PROT_NONE;
		ph->maps++;
		m->next = fake_maps;
		fake_maps = m;
	}
	fake_unlock();
	if (rc != CUDA_SUCCESS)
		free(m);
	return fake_leave(rc);
}

/* Whether the mappings inside [va, va + size) cover it exactly, none sticking out; counts them. */
static bool fake_maps_cover(char *va, size_t size, size_t *count)
{
	struct fake_map *m;
	size_t covered = 0;

	*count = 0;
	for (m = fake_maps; m != NULL; m = m->next) {
		if (!(m->va < va + size && va < m->va + m->size))
			continue;
		if (m->va < va || m->va + m->size > va + size)
			return false;
		covered += m->size;
		(*count)++;
	}
	return *count > 0 && covered == size;
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	char *va = (char *)(uintptr_t)ptr;
	struct fake_map **pp, *m;
	size_t n;
	CUresult rc = CUDA_SUCCESS;

	FAKE_ENTER("cuMemUnmap");
	if (size == 0 || size % FAKE_GRANULARITY || ptr % FAKE_GRANULARITY)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	if (!fake_maps_cover(va, size, &n))
		rc = CUDA_ERROR_INVALID_VALUE;
	for (pp = &fake_maps; rc == CUDA_SUCCESS && *pp != NULL;) {
		m = *pp;
		if (m->va < va || m->va >= va + size) {
			pp = &m->next;
			continue;
		}
		*pp = m->next;
		fake_unback(m->va, m->size); /* the range stays reserved */
		m->phys->maps--;
		fake_phys_reap(m->phys);
		free(m);
	}
	fake_unlock();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
				    size_t count)
{
	char *va = (char *)(uintptr_t)ptr;
	unsigned long long access = 0;
	struct fake_map *m;
	CUresult rc = CUDA_SUCCESS;
	size_t i, n;
	int prot;

	FAKE_ENTER("cuMemSetAccess");
	if (desc == NULL || count == 0 || size == 0 || size % FAKE_GRANULARITY || ptr % FAKE_GRANULARITY)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	for (i = 0; i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
		    desc[i].location.id < 0 || desc[i].location.id >= fake_device_count() ||
		    (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
		     desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
		     desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
			return fake_leave(CUDA_ERROR_INVALID_VALUE);
		access |= desc[i].flags;
	}
	/* Host pages stand for every device: the widest access granted wins. */
	prot = access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
	       : access == CU_MEM_ACCESS_FLAGS_PROT_READ  ? PROT_READ
							  : PROT_NONE;
	fake_lock();
	if (!fake_maps_cover(va, size, &n))
		rc = CUDA_ERROR_INVALID_VALUE;
	for (m = fake_maps; rc == CUDA_SUCCESS && m != NULL; m = m->next) {
		if (m->va < va || m->va >= va + size)
			continue;
		if (mprotect(m->va, m->size, prot) != 0) {
			rc = CUDA_ERROR_UNKNOWN;
			break;
		}
		m->prot = prot;
		m->access = access;
	}
	fake_unlock();
	return fake_leave(rc);
}

FAKE_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
				    CUdeviceptr ptr)
{
	struct fake_map *m;
	CUresult rc = CUDA_ERROR_INVALID_VALUE;

	FAKE_ENTER("cuMemGetAccess");
	if (flags == NULL || location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
		return fake_leave(CUDA_ERROR_INVALID_VALUE);
	fake_lock();
	m = fake_map_find((const char *)(uintptr_t)ptr);
	if (m != NULL) {
		*flags = m->access;
		rc = CUDA_SUCCESS;
	}
	fake_unlock();
	return fake_leave(rc);
}

/* ---- checkpoint and restore (the service calls these with the gate closed) ---- */

/* Copies len bytes out of (save) or into (!save) physical memory through a private window, so
 * memory mapped without access, or not mapped at all, is saved too. */
static int fake_phys_copy(struct fake_phys *ph, bool save)
{
	void *w = mmap(NULL, ph->size, PROT_READ | PROT_WRITE, MAP_SHARED, ph->fd, 0);

	if (w == MAP_FAILED)
		return -1;
	if (save)
		memcpy(ph->saved, w, ph->size);
	else
		memcpy(w, ph->saved, ph->size);
	munmap(w, ph->size);
	return 0;
}

CUresult fake_mem_checkpoint(void)
{
	struct fake_alloc *a;
	struct fake_phys *ph;
	struct fake_map *m;
	CUresult rc = CUDA_SUCCESS;

	fake_lock();
	for (a = fake_allocs; a != NULL; a = a->next)
		if (a->kind == FAKE_ALLOC_MANAGED)
			rc = CUDA_ERROR_NOT_SUPPORTED; /* as the driver: no checkpoint of UVM */
	/* Memory shared with another process: a copy restored here would no longer be shared (the
	 * stand-in refuses rather than break the peer). */
	for (ph = fake_physs; ph != NULL; ph = ph->next)
		if (ph->exported || ph->imported)
			rc = CUDA_ERROR_NOT_SUPPORTED;
	/* Take all host memory first, so nothing is released unless everything can be saved. */
	for (a = fake_allocs; rc == CUDA_SUCCESS && a != NULL; a = a->next)
		if (fake_is_device_kind(a->kind) && (a->saved = malloc(a->size)) == NULL)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
	for (ph = fake_physs; rc == CUDA_SUCCESS && ph != NULL; ph = ph->next)
		if ((ph->saved = malloc(ph->size)) == NULL)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
	for (ph = fake_physs; rc == CUDA_SUCCESS && ph != NULL; ph = ph->next)
		if (fake_phys_copy(ph, true) != 0)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
	if (rc != CUDA_SUCCESS) {
		for (a = fake_allocs; a != NULL; a = a->next) {
			free(a->saved);
			a->saved = NULL;
		}
		for (ph = fake_physs; ph != NULL; ph = ph->next) {
			free(ph->saved);
			ph->saved = NULL;
		}
		fake_unlock();
		return rc;
	}
	for (a = fake_allocs; a != NULL; a = a->next) {
		if (!fake_is_device_kind(a->kind))
			continue;
		memcpy(a->saved, a->base, a->size);
		fake_unback(a->base, a->map_len);
		fake_discharge(a->dev, a->map_len);
	}
	for (m = fake_maps; m != NULL; m = m->next)
		fake_unback(m->va, m->size);
	for (ph = fake_physs; ph != NULL; ph = ph->next) {
		close(ph->fd);
		ph->fd = -1;
		fake_discharge(ph->prop.location.id, ph->size);
	}
	fake_pool_leave();
	fake_unlock();
	return CUDA_SUCCESS;
}

static size_t fake_restore_scratch(void)
{
	const char *e = getenv("FAKECUDA_RESTORE_SCRATCH_MIB");

	return e != NULL ? (size_t)strtoul(e, NULL, 10) << 20 : 0;
}

CUresult fake_mem_restore(void)
{
	size_t need[FAKE_MAX_DEVICES] = {0};
	struct fake_alloc *a;
	struct fake_phys *ph;
	struct fake_map *m;
	CUresult rc = CUDA_SUCCESS;
	bool charged;
	int dev;

	fake_lock();
	for (a = fake_allocs; a != NULL; a = a->next)
		if (fake_is_device_kind(a->kind))
			need[a->dev] += a->map_len;
	for (ph = fake_physs; ph != NULL; ph = ph->next)
		need[ph->prop.location.id] += ph->size;
	/* Charge the whole footprint first: the device may have been filled meanwhile. */
	for (dev = 0; dev < FAKE_MAX_DEVICES && rc == CUDA_SUCCESS; dev++) {
		rc = need[dev] ? fake_charge(dev, need[dev]) : CUDA_SUCCESS;
		if (rc != CUDA_SUCCESS)
			while (dev-- > 0)
				fake_discharge(dev, need[dev]);
	}
	/* The driver's restore needs room for its own work besides the footprint
	 * (FAKECUDA_RESTORE_SCRATCH_MIB, per device restored; given back once done). */
	for (dev = 0; dev < FAKE_MAX_DEVICES && rc == CUDA_SUCCESS; dev++) {
		if (need[dev] == 0 || fake_restore_scratch() == 0)
			continue;
		rc = fake_charge(dev, fake_restore_scratch());
		if (rc == CUDA_SUCCESS)
			fake_discharge(dev, fake_restore_scratch());
		else
			for (int d = 0; d < FAKE_MAX_DEVICES; d++)
				if (need[d] != 0)
					fake_discharge(d, need[d]);
	}
	charged = rc == CUDA_SUCCESS;
	for (ph = fake_physs; rc == CUDA_SUCCESS && ph != NULL; ph = ph->next) {
		char name[32];
		snprintf(name, sizeof(name), "fakecuda-phys-dev%d", ph->prop.location.id);
		ph->fd = memfd_create(name, MFD_CLOEXEC);
		if (ph->fd < 0 || ftruncate(ph->fd, (off_t)ph->size) != 0 || fake_phys_copy(ph, false) != 0)
			rc = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (rc != CUDA_SUCCESS) {
		for (ph = fake_physs; ph != NULL; ph = ph->next) {
			if (ph->fd >= 0)
				close(ph->fd);
			ph->fd = -1;
		}
		for (dev = 0; charged && dev < FAKE_MAX_DEVICES; dev++)
			fake_discharge(dev, need[dev]);
		fake_unlock();
		return rc;
	}
	for (a = fake_allocs; a != NULL; a = a->next) {
		if (!fake_is_device_kind(a->kind))
			continue;
		mmap(a->base, a->map_len, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		memcpy(a->base, a->saved, a->size);
		free(a->saved);
		a->saved = NULL;
	}
	for (m = fake_maps; m != NULL; m = m->next)
		mmap(m->va, m->size, m->prot, MAP_SHARED | MAP_FIXED, m->phys->fd, (off_t)m->offset);
	for (ph = fake_physs; ph != NULL; ph = ph->next) {
		free(ph->saved);
		ph->saved = NULL;
	}
	fake_unlock();
	return CUDA_SUCCESS;
}
