/* fakehip: the stand-in HIP runtime (libamdhip64.so.5) for CI without an AMD GPU. Device memory
 * is host memory: hipMalloc is an anonymous mapping; hipMemCreate is a memfd, hipMemMap maps it
 * at a reserved (PROT_NONE) address, hipMemSetAccess makes it readable and writable, so unmapped
 * or inaccessible ranges fault, as on a GPU. Work runs synchronously at submission. */
#include "fakehip.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FH_EXPORT __attribute__((visibility("default")))
#define FH_VERSION 50221153 /* HIP 5.2.21153, as Debian bookworm's runtime */
#define FH_GRAN ((size_t)2 << 20)
#define FH_MAX_DEVICES 8
#define FH_MAX_FAULTS 16

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* ---- initialisation, faults ---- */

static pthread_once_t fh_once = PTHREAD_ONCE_INIT;
static int fh_ndev = 1;
static size_t fh_total = (size_t)1024 << 20;
static __thread int fh_cur_dev;

struct fh_fault {
	char name[64];
	unsigned left;
	hipError_t code;
};
static pthread_mutex_t fh_mu = PTHREAD_MUTEX_INITIALIZER; /* every table below */
static struct fh_fault fh_faults[FH_MAX_FAULTS];
static int fh_nfaults;

static long env_long(const char *name, long dflt, long min, long max)
{
	const char *s = getenv(name);
	char *end;
	if (s == NULL || *s == '\0')
		return dflt;
	errno = 0;
	long v = strtol(s, &end, 10);
	return errno == 0 && *end == '\0' && v >= min && v <= max ? v : dflt;
}

static hipError_t fh_fault_arm(const char *name, unsigned nth, int code)
{
	hipError_t rc = hipSuccess;
	if (nth == 0 || code <= 0 || strlen(name) >= sizeof(fh_faults[0].name))
		return hipErrorInvalidValue;
	pthread_mutex_lock(&fh_mu);
	if (fh_nfaults == FH_MAX_FAULTS) {
		rc = hipErrorOutOfMemory;
	} else {
		snprintf(fh_faults[fh_nfaults].name, sizeof(fh_faults[0].name), "%s", name);
		fh_faults[fh_nfaults].left = nth;
		fh_faults[fh_nfaults].code = (hipError_t)code;
		fh_nfaults++;
	}
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

/* An armed fault for this call (every variant of a name counts), or hipSuccess. */
static hipError_t fh_fault_take(const char *name)
{
	hipError_t rc = hipSuccess;
	pthread_mutex_lock(&fh_mu);
	for (int i = 0; i < fh_nfaults; i++) {
		if (strcmp(fh_faults[i].name, name) != 0 || --fh_faults[i].left > 0)
			continue;
		rc = fh_faults[i].code;
		fh_faults[i--] = fh_faults[--fh_nfaults];
	}
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

static void fh_service_start(void);

static void fh_init(void)
{
	fh_ndev = (int)env_long("FAKEHIP_DEVICES", 1, 0, FH_MAX_DEVICES);
	fh_total = (size_t)env_long("FAKEHIP_MEM_MIB", 1024, 1, 1L << 20) << 20;
	/* FAKEHIP_FAIL=name:nth:code arms one fault from the start (for programs without a service). */
	const char *f = getenv("FAKEHIP_FAIL");
	char name[64];
	unsigned nth;
	int code;
	if (f != NULL && sscanf(f, "%63[^:]:%u:%d", name, &nth, &code) == 3)
		fh_fault_arm(name, nth, code);
	fh_service_start();
}

/* Every entry point: initialise, then answer an armed fault for its name. */
#define FH_ENTER(name)                                         \
	do {                                                   \
		pthread_once(&fh_once, fh_init);               \
		if (fh_ndev == 0)                              \
			return hipErrorNoDevice;               \
		hipError_t fh_rc_ = fh_fault_take(name);       \
		if (fh_rc_ != hipSuccess)                      \
			return fh_rc_;                         \
	} while (0)

/* ---- memory ---- */

enum fh_kind { FH_BUF, FH_RESERVE };

struct fh_range { /* a hipMalloc buffer or a reservation */
	char *p;
	size_t size;
	enum fh_kind kind;
	struct fh_range *next;
};

struct fh_phys { /* a hipMemCreate handle: a memfd */
	int fd;
	size_t size;
	int nmaps;
	int released;
	struct fh_phys *next;
};

struct fh_map {
	char *p;
	size_t size;
	struct fh_phys *phys;
	int access; /* read-write after hipMemSetAccess */
	struct fh_map *next;
};

struct fh_reg {
	void *p;
	size_t size;
	struct fh_reg *next;
};

static struct fh_range *fh_ranges;
static struct fh_phys *fh_physs;
static struct fh_map *fh_maps;
static struct fh_reg *fh_regs;
static size_t fh_used, fh_registered;

static struct fh_range *range_of(const void *p, size_t len)
{
	for (struct fh_range *r = fh_ranges; r != NULL; r = r->next)
		if ((const char *)p >= r->p && (const char *)p < r->p + r->size)
			return (size_t)((const char *)p - r->p) <= r->size - len ? r : NULL;
	return NULL;
}

/* Whether [p, p + len) lies in mappings with access; locked. */
static int mapped_ok(const char *p, size_t len)
{
	while (len > 0) {
		struct fh_map *m = fh_maps;
		while (m != NULL && !(p >= m->p && p < m->p + m->size))
			m = m->next;
		if (m == NULL || !m->access)
			return 0;
		size_t n = (size_t)(m->p + m->size - p);
		if (n >= len)
			return 1;
		p += n;
		len -= n;
	}
	return 1;
}

enum fh_side { FH_HOST, FH_DEVICE, FH_ANY };

/* Device memory must be a buffer or wholly mapped with access; an address the runtime does not
 * know is host memory, which FH_DEVICE refuses. */
static hipError_t check(const void *p, size_t len, enum fh_side side)
{
	if (len == 0 || side == FH_HOST)
		return hipSuccess;
	if (p == NULL)
		return hipErrorInvalidValue;
	hipError_t rc = hipSuccess;
	pthread_mutex_lock(&fh_mu);
	struct fh_range *r = range_of(p, 1);
	if (r == NULL)
		rc = side == FH_DEVICE ? hipErrorInvalidValue : hipSuccess;
	else if (r->kind == FH_BUF)
		rc = range_of(p, len) == r ? hipSuccess : hipErrorInvalidValue;
	else
		rc = mapped_ok(p, len) ? hipSuccess : hipErrorInvalidValue;
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

static hipError_t add_range(void **out, size_t size, enum fh_kind kind)
{
	if (out == NULL || size == 0)
		return hipErrorInvalidValue;
	size_t len = (size + FH_GRAN - 1) / FH_GRAN * FH_GRAN;
	struct fh_range *r = calloc(1, sizeof(*r));
	if (r == NULL)
		return hipErrorOutOfMemory;
	pthread_mutex_lock(&fh_mu);
	if (kind == FH_BUF && fh_used + len > fh_total) {
		pthread_mutex_unlock(&fh_mu);
		free(r);
		return hipErrorOutOfMemory;
	}
	int prot = kind == FH_BUF ? PROT_READ | PROT_WRITE : PROT_NONE;
	void *p = mmap(NULL, len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED) {
		pthread_mutex_unlock(&fh_mu);
		free(r);
		return hipErrorOutOfMemory;
	}
	*r = (struct fh_range){ .p = p, .size = len, .kind = kind, .next = fh_ranges };
	fh_ranges = r;
	if (kind == FH_BUF)
		fh_used += len;
	pthread_mutex_unlock(&fh_mu);
	*out = p;
	return hipSuccess;
}

static hipError_t del_range(void *p, enum fh_kind kind)
{
	hipError_t rc = hipErrorInvalidValue;
	pthread_mutex_lock(&fh_mu);
	for (struct fh_range **pp = &fh_ranges; *pp != NULL; pp = &(*pp)->next) {
		struct fh_range *r = *pp;
		if (r->p != p || r->kind != kind)
			continue;
		if (kind == FH_RESERVE)
			for (struct fh_map *m = fh_maps; m != NULL; m = m->next)
				if (m->p >= r->p && m->p < r->p + r->size)
					goto out; /* still mapped */
		munmap(r->p, r->size);
		if (kind == FH_BUF)
			fh_used -= r->size;
		*pp = r->next;
		free(r);
		rc = hipSuccess;
		break;
	}
out:
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

FH_EXPORT hipError_t hipMalloc(void **ptr, size_t size)
{
	FH_ENTER("hipMalloc");
	if (size == 0 && ptr != NULL) {
		*ptr = NULL;
		return hipSuccess;
	}
	return add_range(ptr, size, FH_BUF);
}

FH_EXPORT hipError_t hipExtMallocWithFlags(void **ptr, size_t sizeBytes, unsigned int flags)
{
	FH_ENTER("hipExtMallocWithFlags");
	return add_range(ptr, sizeBytes, FH_BUF);
}

FH_EXPORT hipError_t hipMallocManaged(void **dev_ptr, size_t size, unsigned int flags)
{
	FH_ENTER("hipMallocManaged");
	return add_range(dev_ptr, size, FH_BUF);
}

FH_EXPORT hipError_t hipMallocAsync(void **dev_ptr, size_t size, hipStream_t stream)
{
	FH_ENTER("hipMallocAsync");
	return add_range(dev_ptr, size, FH_BUF);
}

FH_EXPORT hipError_t hipMallocFromPoolAsync(void **dev_ptr, size_t size, hipMemPool_t mem_pool, hipStream_t stream)
{
	FH_ENTER("hipMallocFromPoolAsync");
	return add_range(dev_ptr, size, FH_BUF);
}

static size_t pitch_of(size_t width)
{
	return (width + 255) / 256 * 256;
}

FH_EXPORT hipError_t hipMallocPitch(void **ptr, size_t *pitch, size_t width, size_t height)
{
	FH_ENTER("hipMallocPitch");
	if (pitch == NULL || width == 0 || height == 0)
		return hipErrorInvalidValue;
	*pitch = pitch_of(width);
	return add_range(ptr, *pitch * height, FH_BUF);
}

FH_EXPORT hipError_t hipMemAllocPitch(hipDeviceptr_t *dptr, size_t *pitch, size_t widthInBytes, size_t height,
				      unsigned int elementSizeBytes)
{
	FH_ENTER("hipMemAllocPitch");
	if (pitch == NULL || widthInBytes == 0 || height == 0)
		return hipErrorInvalidValue;
	*pitch = pitch_of(widthInBytes);
	return add_range(dptr, *pitch * height, FH_BUF);
}

FH_EXPORT hipError_t hipFree(void *ptr)
{
	FH_ENTER("hipFree");
	return ptr == NULL ? hipSuccess : del_range(ptr, FH_BUF);
}

FH_EXPORT hipError_t hipFreeAsync(void *dev_ptr, hipStream_t stream)
{
	FH_ENTER("hipFreeAsync");
	return del_range(dev_ptr, FH_BUF);
}

FH_EXPORT hipError_t hipMemAddressReserve(void **ptr, size_t size, size_t alignment, void *addr,
					  unsigned long long flags)
{
	FH_ENTER("hipMemAddressReserve");
	if (size % FH_GRAN != 0)
		return hipErrorInvalidValue;
	return add_range(ptr, size, FH_RESERVE);
}

FH_EXPORT hipError_t hipMemAddressFree(void *devPtr, size_t size)
{
	FH_ENTER("hipMemAddressFree");
	return del_range(devPtr, FH_RESERVE);
}

FH_EXPORT hipError_t hipMemGetAllocationGranularity(size_t *granularity, const hipMemAllocationProp *prop,
						    hipMemAllocationGranularity_flags option)
{
	FH_ENTER("hipMemGetAllocationGranularity");
	if (granularity == NULL || prop == NULL || prop->location.type != hipMemLocationTypeDevice ||
	    prop->location.id < 0 || prop->location.id >= fh_ndev)
		return hipErrorInvalidValue;
	*granularity = FH_GRAN;
	return hipSuccess;
}

/* A handle's bytes count until it is released and no longer mapped; locked. */
static void phys_maybe_free(struct fh_phys *ph)
{
	if (!ph->released || ph->nmaps > 0)
		return;
	for (struct fh_phys **pp = &fh_physs; *pp != NULL; pp = &(*pp)->next)
		if (*pp == ph) {
			*pp = ph->next;
			break;
		}
	close(ph->fd);
	fh_used -= ph->size;
	free(ph);
}

static struct fh_phys *phys_find(hipMemGenericAllocationHandle_t h)
{
	for (struct fh_phys *ph = fh_physs; ph != NULL; ph = ph->next)
		if ((void *)ph == (void *)h && !ph->released)
			return ph;
	return NULL;
}

FH_EXPORT hipError_t hipMemCreate(hipMemGenericAllocationHandle_t *handle, size_t size,
				  const hipMemAllocationProp *prop, unsigned long long flags)
{
	FH_ENTER("hipMemCreate");
	if (handle == NULL || prop == NULL || size == 0 || size % FH_GRAN != 0 ||
	    prop->type != hipMemAllocationTypePinned || prop->location.type != hipMemLocationTypeDevice ||
	    prop->location.id < 0 || prop->location.id >= fh_ndev)
		return hipErrorInvalidValue;
	struct fh_phys *ph = calloc(1, sizeof(*ph));
	if (ph == NULL)
		return hipErrorOutOfMemory;
	hipError_t rc = hipSuccess;
	pthread_mutex_lock(&fh_mu);
	if (fh_used + size > fh_total) {
		rc = hipErrorOutOfMemory;
	} else if ((ph->fd = memfd_create("fakehip", MFD_CLOEXEC)) < 0 || ftruncate(ph->fd, (off_t)size) < 0) {
		if (ph->fd >= 0)
			close(ph->fd);
		rc = hipErrorOutOfMemory;
	} else {
		ph->size = size;
		ph->next = fh_physs;
		fh_physs = ph;
		fh_used += size;
		*handle = (hipMemGenericAllocationHandle_t)(void *)ph;
	}
	pthread_mutex_unlock(&fh_mu);
	if (rc != hipSuccess)
		free(ph);
	return rc;
}

FH_EXPORT hipError_t hipMemRelease(hipMemGenericAllocationHandle_t handle)
{
	FH_ENTER("hipMemRelease");
	pthread_mutex_lock(&fh_mu);
	struct fh_phys *ph = phys_find(handle);
	if (ph != NULL) {
		ph->released = 1;
		phys_maybe_free(ph);
	}
	pthread_mutex_unlock(&fh_mu);
	return ph != NULL ? hipSuccess : hipErrorInvalidValue;
}

FH_EXPORT hipError_t hipMemMap(void *ptr, size_t size, size_t offset, hipMemGenericAllocationHandle_t handle,
			       unsigned long long flags)
{
	FH_ENTER("hipMemMap");
	hipError_t rc = hipErrorInvalidValue;
	struct fh_map *m = calloc(1, sizeof(*m));
	if (m == NULL)
		return hipErrorOutOfMemory;
	pthread_mutex_lock(&fh_mu);
	struct fh_phys *ph = phys_find(handle);
	struct fh_range *r = range_of(ptr, size);
	int overlaps = 0;
	for (struct fh_map *o = fh_maps; o != NULL; o = o->next)
		overlaps |= (char *)ptr < o->p + o->size && o->p < (char *)ptr + size;
	if (ph != NULL && r != NULL && r->kind == FH_RESERVE && !overlaps && size % FH_GRAN == 0 &&
	    offset % FH_GRAN == 0 && offset <= ph->size && size <= ph->size - offset &&
	    mmap(ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset) != MAP_FAILED) {
		*m = (struct fh_map){ .p = ptr, .size = size, .phys = ph, .next = fh_maps };
		fh_maps = m;
		ph->nmaps++;
		m = NULL;
		rc = hipSuccess;
	}
	pthread_mutex_unlock(&fh_mu);
	free(m);
	return rc;
}

FH_EXPORT hipError_t hipMemUnmap(void *ptr, size_t size)
{
	FH_ENTER("hipMemUnmap");
	hipError_t rc = hipErrorInvalidValue;
	pthread_mutex_lock(&fh_mu);
	for (struct fh_map **pp = &fh_maps; *pp != NULL;) {
		struct fh_map *m = *pp;
		if (m->p < (char *)ptr || m->p >= (char *)ptr + size) {
			pp = &m->next;
			continue;
		}
		/* Back to a hole in the reservation: later accesses fault. */
		mmap(m->p, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
		*pp = m->next;
		m->phys->nmaps--;
		phys_maybe_free(m->phys);
		free(m);
		rc = hipSuccess;
	}
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

FH_EXPORT hipError_t hipMemSetAccess(void *ptr, size_t size, const hipMemAccessDesc *desc, size_t count)
{
	FH_ENTER("hipMemSetAccess");
	if (desc == NULL || count == 0)
		return hipErrorInvalidValue;
	int rw = 0;
	for (size_t i = 0; i < count; i++) {
		if (desc[i].location.type != hipMemLocationTypeDevice || desc[i].location.id < 0 ||
		    desc[i].location.id >= fh_ndev)
			return hipErrorInvalidValue;
		rw |= desc[i].flags == hipMemAccessFlagsProtReadWrite;
	}
	hipError_t rc = hipErrorInvalidValue;
	pthread_mutex_lock(&fh_mu);
	int covered = 1;
	/* The whole range must be mapped (access without access rights yet). */
	for (char *p = ptr; p < (char *)ptr + size;) {
		struct fh_map *m = fh_maps;
		while (m != NULL && !(p >= m->p && p < m->p + m->size))
			m = m->next;
		if (m == NULL) {
			covered = 0;
			break;
		}
		p = m->p + m->size;
	}
	if (covered && mprotect(ptr, size, rw ? PROT_READ | PROT_WRITE : PROT_READ) == 0) {
		for (struct fh_map *m = fh_maps; m != NULL; m = m->next)
			if (m->p >= (char *)ptr && m->p < (char *)ptr + size)
				m->access = rw;
		rc = hipSuccess;
	}
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

FH_EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total)
{
	FH_ENTER("hipMemGetInfo");
	if (free_bytes == NULL || total == NULL)
		return hipErrorInvalidValue;
	pthread_mutex_lock(&fh_mu);
	*free_bytes = fh_total - fh_used;
	*total = fh_total;
	pthread_mutex_unlock(&fh_mu);
	return hipSuccess;
}

FH_EXPORT hipError_t hipHostRegister(void *hostPtr, size_t sizeBytes, unsigned int flags)
{
	FH_ENTER("hipHostRegister");
	struct fh_reg *g = calloc(1, sizeof(*g));
	if (hostPtr == NULL || sizeBytes == 0 || g == NULL) {
		free(g);
		return hostPtr == NULL || sizeBytes == 0 ? hipErrorInvalidValue : hipErrorOutOfMemory;
	}
	pthread_mutex_lock(&fh_mu);
	*g = (struct fh_reg){ .p = hostPtr, .size = sizeBytes, .next = fh_regs };
	fh_regs = g;
	fh_registered += sizeBytes;
	pthread_mutex_unlock(&fh_mu);
	return hipSuccess;
}

FH_EXPORT hipError_t hipHostUnregister(void *hostPtr)
{
	FH_ENTER("hipHostUnregister");
	hipError_t rc = hipErrorHostMemoryNotRegistered;
	pthread_mutex_lock(&fh_mu);
	for (struct fh_reg **pp = &fh_regs; *pp != NULL; pp = &(*pp)->next)
		if ((*pp)->p == hostPtr) {
			struct fh_reg *g = *pp;
			*pp = g->next;
			fh_registered -= g->size;
			free(g);
			rc = hipSuccess;
			break;
		}
	pthread_mutex_unlock(&fh_mu);
	return rc;
}

/* ---- copies and sets: checked, then done at once ---- */

static hipError_t copy(void *dst, const void *src, size_t n, enum fh_side ds, enum fh_side ss)
{
	if (n > 0 && (dst == NULL || src == NULL))
		return hipErrorInvalidValue;
	hipError_t rc = check(dst, n, ds);
	if (rc == hipSuccess)
		rc = check(src, n, ss);
	if (rc == hipSuccess && n > 0)
		memmove(dst, src, n);
	return rc;
}

static void sides(hipMemcpyKind kind, enum fh_side *ds, enum fh_side *ss)
{
	*ds = kind == hipMemcpyHostToDevice || kind == hipMemcpyDeviceToDevice ? FH_DEVICE
	      : kind == hipMemcpyDefault					? FH_ANY
										: FH_HOST;
	*ss = kind == hipMemcpyDeviceToHost || kind == hipMemcpyDeviceToDevice ? FH_DEVICE
	      : kind == hipMemcpyDefault					? FH_ANY
										: FH_HOST;
}

static hipError_t copy_kind(void *dst, const void *src, size_t n, hipMemcpyKind kind)
{
	enum fh_side ds, ss;
	sides(kind, &ds, &ss);
	return copy(dst, src, n, ds, ss);
}

static hipError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
			 hipMemcpyKind kind)
{
	if (width > dpitch || width > spitch)
		return hipErrorInvalidValue;
	for (size_t y = 0; y < height; y++) {
		hipError_t rc = copy_kind((char *)dst + y * dpitch, (const char *)src + y * spitch, width, kind);
		if (rc != hipSuccess)
			return rc;
	}
	return hipSuccess;
}

static hipError_t set(void *dst, uint32_t value, size_t count, unsigned elem)
{
	hipError_t rc = check(dst, count * elem, FH_DEVICE);
	if (rc != hipSuccess)
		return rc;
	for (size_t i = 0; i < count; i++)
		memcpy((char *)dst + i * elem, &value, elem); /* little-endian: the low bytes */
	return hipSuccess;
}

static hipError_t set2d(void *dst, size_t pitch, int value, size_t width, size_t height)
{
	if (width > pitch)
		return hipErrorInvalidValue;
	for (size_t y = 0; y < height; y++) {
		hipError_t rc = set((char *)dst + y * pitch, (uint8_t)value, width, 1);
		if (rc != hipSuccess)
			return rc;
	}
	return hipSuccess;
}

#define FH_COPY(name, params, body)                 \
	FH_EXPORT hipError_t name params            \
	{                                           \
		FH_ENTER(#name);                    \
		return body;                        \
	}
/* The _spt twin of a call is the same call (one default stream per thread is not modelled). */
#define FH_COPY_SPT(name, params, body) FH_COPY(name, params, body) FH_COPY(name##_spt, params, body)

FH_COPY_SPT(hipMemcpy, (void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind),
	    copy_kind(dst, src, sizeBytes, kind))
FH_COPY_SPT(hipMemcpyAsync, (void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind, hipStream_t stream),
	    copy_kind(dst, src, sizeBytes, kind))
FH_COPY(hipMemcpyWithStream, (void *dst, const void *src, size_t sizeBytes, hipMemcpyKind kind, hipStream_t stream),
	copy_kind(dst, src, sizeBytes, kind))
FH_COPY(hipMemcpyHtoD, (hipDeviceptr_t dst, void *src, size_t sizeBytes), copy(dst, src, sizeBytes, FH_DEVICE, FH_HOST))
FH_COPY(hipMemcpyDtoH, (void *dst, hipDeviceptr_t src, size_t sizeBytes), copy(dst, src, sizeBytes, FH_HOST, FH_DEVICE))
FH_COPY(hipMemcpyDtoD, (hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes),
	copy(dst, src, sizeBytes, FH_DEVICE, FH_DEVICE))
FH_COPY(hipMemcpyHtoDAsync, (hipDeviceptr_t dst, void *src, size_t sizeBytes, hipStream_t stream),
	copy(dst, src, sizeBytes, FH_DEVICE, FH_HOST))
FH_COPY(hipMemcpyDtoHAsync, (void *dst, hipDeviceptr_t src, size_t sizeBytes, hipStream_t stream),
	copy(dst, src, sizeBytes, FH_HOST, FH_DEVICE))
FH_COPY(hipMemcpyDtoDAsync, (hipDeviceptr_t dst, hipDeviceptr_t src, size_t sizeBytes, hipStream_t stream),
	copy(dst, src, sizeBytes, FH_DEVICE, FH_DEVICE))
FH_COPY(hipMemcpyPeer, (void *dst, int dstDeviceId, const void *src, int srcDeviceId, size_t sizeBytes),
	copy(dst, src, sizeBytes, FH_DEVICE, FH_DEVICE))
FH_COPY(hipMemcpyPeerAsync,
	(void *dst, int dstDeviceId, const void *src, int srcDevice, size_t sizeBytes, hipStream_t stream),
	copy(dst, src, sizeBytes, FH_DEVICE, FH_DEVICE))
FH_COPY_SPT(hipMemcpy2D,
	    (void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, hipMemcpyKind kind),
	    copy2d(dst, dpitch, src, spitch, width, height, kind))
FH_COPY(hipMemcpy2DAsync,
	(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height, hipMemcpyKind kind,
	 hipStream_t stream),
	copy2d(dst, dpitch, src, spitch, width, height, kind))
FH_COPY_SPT(hipMemset, (void *dst, int value, size_t sizeBytes), set(dst, (uint8_t)value, sizeBytes, 1))
FH_COPY(hipMemsetAsync, (void *dst, int value, size_t sizeBytes, hipStream_t stream),
	set(dst, (uint8_t)value, sizeBytes, 1))
FH_COPY(hipMemsetD8, (hipDeviceptr_t dest, unsigned char value, size_t count), set(dest, value, count, 1))
FH_COPY(hipMemsetD8Async, (hipDeviceptr_t dest, unsigned char value, size_t count, hipStream_t stream),
	set(dest, value, count, 1))
FH_COPY(hipMemsetD16, (hipDeviceptr_t dest, unsigned short value, size_t count), set(dest, value, count, 2))
FH_COPY(hipMemsetD16Async, (hipDeviceptr_t dest, unsigned short value, size_t count, hipStream_t stream),
	set(dest, value, count, 2))
FH_COPY(hipMemsetD32, (hipDeviceptr_t dest, int value, size_t count), set(dest, (uint32_t)value, count, 4))
FH_COPY(hipMemsetD32Async, (hipDeviceptr_t dst, int value, size_t count, hipStream_t stream),
	set(dst, (uint32_t)value, count, 4))
FH_COPY_SPT(hipMemset2D, (void *dst, size_t pitch, int value, size_t width, size_t height),
	    set2d(dst, pitch, value, width, height))
FH_COPY(hipMemset2DAsync, (void *dst, size_t pitch, int value, size_t width, size_t height, hipStream_t stream),
	set2d(dst, pitch, value, width, height))
FH_COPY(hipMemPrefetchAsync, (const void *dev_ptr, size_t count, int device, hipStream_t stream),
	check(dev_ptr, count, FH_DEVICE))
FH_COPY(hipStreamWriteValue32, (hipStream_t stream, void *ptr, uint32_t value, unsigned int flags),
	set(ptr, value, 1, 4))
FH_COPY(hipStreamWriteValue64, (hipStream_t stream, void *ptr, uint64_t value, unsigned int flags),
	copy(ptr, &value, 8, FH_DEVICE, FH_HOST))
FH_COPY(hipStreamWaitValue32, (hipStream_t stream, void *ptr, uint32_t value, unsigned int flags, uint32_t mask),
	check(ptr, 4, FH_DEVICE))
FH_COPY(hipStreamWaitValue64, (hipStream_t stream, void *ptr, uint64_t value, unsigned int flags, uint64_t mask),
	check(ptr, 8, FH_DEVICE))

/* Arrays, symbols, 3-D and parameter-block copies are not modelled: they exist (so every
 * interposed name resolves) and answer hipErrorNotSupported. */
#define FH_NOTSUP(name, params) FH_COPY(name, params, hipErrorNotSupported)
#define FH_NOTSUP_SPT(name, params) FH_NOTSUP(name, params) FH_NOTSUP(name##_spt, params)
FH_NOTSUP(hipMemcpyParam2D, (const hip_Memcpy2D *pCopy))
FH_NOTSUP(hipMemcpyParam2DAsync, (const hip_Memcpy2D *pCopy, hipStream_t stream))
FH_NOTSUP_SPT(hipMemcpy3D, (const struct hipMemcpy3DParms *p))
FH_NOTSUP(hipMemcpy3DAsync, (const struct hipMemcpy3DParms *p, hipStream_t stream))
FH_NOTSUP_SPT(hipMemcpyToSymbol,
	      (const void *symbol, const void *src, size_t sizeBytes, size_t offset, hipMemcpyKind kind))
FH_NOTSUP_SPT(hipMemcpyFromSymbol,
	      (void *dst, const void *symbol, size_t sizeBytes, size_t offset, hipMemcpyKind kind))
FH_NOTSUP(hipMemcpyToSymbolAsync,
	  (const void *symbol, const void *src, size_t sizeBytes, size_t offset, hipMemcpyKind kind, hipStream_t stream))
FH_NOTSUP(hipMemcpyFromSymbolAsync,
	  (void *dst, const void *symbol, size_t sizeBytes, size_t offset, hipMemcpyKind kind, hipStream_t stream))
FH_NOTSUP_SPT(hipMemcpy2DToArray, (hipArray *dst, size_t wOffset, size_t hOffset, const void *src, size_t spitch,
				   size_t width, size_t height, hipMemcpyKind kind))
FH_NOTSUP_SPT(hipMemcpy2DFromArray, (void *dst, size_t dpitch, hipArray_const_t src, size_t wOffset, size_t hOffset,
				     size_t width, size_t height, hipMemcpyKind kind))
FH_NOTSUP(hipMemcpyToArray,
	  (hipArray *dst, size_t wOffset, size_t hOffset, const void *src, size_t count, hipMemcpyKind kind))
FH_NOTSUP(hipMemcpyFromArray,
	  (void *dst, hipArray_const_t srcArray, size_t wOffset, size_t hOffset, size_t count, hipMemcpyKind kind))
FH_NOTSUP(hipMemcpyHtoA, (hipArray *dstArray, size_t dstOffset, const void *srcHost, size_t count))
FH_NOTSUP(hipMemcpyAtoH, (void *dst, hipArray *srcArray, size_t srcOffset, size_t count))
FH_NOTSUP_SPT(hipMemset3D, (hipPitchedPtr pitchedDevPtr, int value, hipExtent extent))
FH_NOTSUP(hipMemset3DAsync, (hipPitchedPtr pitchedDevPtr, int value, hipExtent extent, hipStream_t stream))
FH_NOTSUP(hipGraphLaunch, (hipGraphExec_t graphExec, hipStream_t stream))
FH_NOTSUP(hipLaunchByPtr, (const void *func))
FH_NOTSUP(hipLaunchCooperativeKernelMultiDevice, (hipLaunchParams *launchParamsList, int numDevices, unsigned int flags))

/* ---- kernels: host functions ---- */

static hipError_t launch(const void *fn, dim3 grid, dim3 block, void **args)
{
	if (fn == NULL)
		return hipErrorInvalidDeviceFunction;
	fakehip_kernel_fn k;
	memcpy(&k, &fn, sizeof(k)); /* an object pointer to the host function it names */
	k(grid, block, args);
	return hipSuccess;
}

FH_COPY_SPT(hipLaunchKernel,
	    (const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes,
	     hipStream_t stream),
	    launch(function_address, numBlocks, dimBlocks, args))
FH_COPY_SPT(hipLaunchCooperativeKernel,
	    (const void *f, dim3 gridDim, dim3 blockDimX, void **kernelParams, unsigned int sharedMemBytes,
	     hipStream_t stream),
	    launch(f, gridDim, blockDimX, kernelParams))
FH_COPY(hipExtLaunchKernel,
	(const void *function_address, dim3 numBlocks, dim3 dimBlocks, void **args, size_t sharedMemBytes,
	 hipStream_t stream, hipEvent_t startEvent, hipEvent_t stopEvent, int flags),
	launch(function_address, numBlocks, dimBlocks, args))

static dim3 d3(unsigned x, unsigned y, unsigned z)
{
	dim3 d = { x, y, z };
	return d;
}

FH_COPY(hipModuleLaunchKernel,
	(hipFunction_t f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
	 unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, hipStream_t stream,
	 void **kernelParams, void **extra),
	launch((const void *)f, d3(gridDimX, gridDimY, gridDimZ), d3(blockDimX, blockDimY, blockDimZ), kernelParams))

/* HIP 5.x exports these two under their C++ names only; so does the stand-in. */
FH_EXPORT hipError_t fh_ext_module_launch(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
					  uint32_t ly, uint32_t lz, size_t shmem, hipStream_t s, void **params,
					  void **extra, hipEvent_t start, hipEvent_t stop, uint32_t flags)
	__asm__("_Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j");
hipError_t fh_ext_module_launch(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx, uint32_t ly,
				uint32_t lz, size_t shmem, hipStream_t s, void **params, void **extra, hipEvent_t start,
				hipEvent_t stop, uint32_t flags)
{
	FH_ENTER("hipExtModuleLaunchKernel");
	/* global work size is in threads, as HIP's extension takes it */
	return launch((const void *)f, d3(gx / (lx ? lx : 1), gy / (ly ? ly : 1), gz / (lz ? lz : 1)),
		      d3(lx, ly, lz), params);
}
FH_EXPORT hipError_t fh_hcc_module_launch(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx,
					  uint32_t ly, uint32_t lz, size_t shmem, hipStream_t s, void **params,
					  void **extra, hipEvent_t start, hipEvent_t stop)
	__asm__("_Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_");
hipError_t fh_hcc_module_launch(hipFunction_t f, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t lx, uint32_t ly,
				uint32_t lz, size_t shmem, hipStream_t s, void **params, void **extra, hipEvent_t start,
				hipEvent_t stop)
{
	return fh_ext_module_launch(f, gx, gy, gz, lx, ly, lz, shmem, s, params, extra, start, stop, 0);
}

FH_EXPORT hipError_t hipLaunchHostFunc(hipStream_t stream, hipHostFn_t fn, void *userData)
{
	FH_ENTER("hipLaunchHostFunc");
	if (fn == NULL)
		return hipErrorInvalidValue;
	fn(userData);
	return hipSuccess;
}

/* ---- devices, streams, events, errors ---- */

FH_EXPORT hipError_t hipInit(unsigned int flags)
{
	FH_ENTER("hipInit");
	return flags == 0 ? hipSuccess : hipErrorInvalidValue;
}

FH_EXPORT hipError_t hipRuntimeGetVersion(int *v)
{
	if (v == NULL)
		return hipErrorInvalidValue;
	*v = FH_VERSION;
	return hipSuccess;
}

FH_EXPORT hipError_t hipGetDeviceCount(int *count)
{
	FH_ENTER("hipGetDeviceCount");
	if (count == NULL)
		return hipErrorInvalidValue;
	*count = fh_ndev;
	return hipSuccess;
}

FH_EXPORT hipError_t hipSetDevice(int deviceId)
{
	FH_ENTER("hipSetDevice");
	if (deviceId < 0 || deviceId >= fh_ndev)
		return hipErrorInvalidDevice;
	fh_cur_dev = deviceId;
	return hipSuccess;
}

FH_EXPORT hipError_t hipGetDevice(int *deviceId)
{
	FH_ENTER("hipGetDevice");
	if (deviceId == NULL)
		return hipErrorInvalidValue;
	*deviceId = fh_cur_dev;
	return hipSuccess;
}

FH_EXPORT hipError_t hipDeviceCanAccessPeer(int *canAccessPeer, int deviceId, int peerDeviceId)
{
	FH_ENTER("hipDeviceCanAccessPeer");
	if (canAccessPeer == NULL || deviceId < 0 || deviceId >= fh_ndev || peerDeviceId < 0 || peerDeviceId >= fh_ndev)
		return hipErrorInvalidDevice;
	*canAccessPeer = deviceId != peerDeviceId;
	return hipSuccess;
}

/* Streams and events are tokens: work has finished by the time a call returns. */
struct fh_token {
	int magic;
};
#define FH_STREAM_MAGIC 0x5354
#define FH_EVENT_MAGIC 0x4556

static hipError_t token_new(void **out, int magic)
{
	struct fh_token *t = out ? malloc(sizeof(*t)) : NULL;
	if (t == NULL)
		return out ? hipErrorOutOfMemory : hipErrorInvalidValue;
	t->magic = magic;
	*out = t;
	return hipSuccess;
}

static hipError_t token_check(const void *t, int magic, int null_ok)
{
	if (t == NULL)
		return null_ok ? hipSuccess : hipErrorInvalidResourceHandle;
	return ((const struct fh_token *)t)->magic == magic ? hipSuccess : hipErrorInvalidResourceHandle;
}

static hipError_t token_free(void *t, int magic)
{
	hipError_t rc = token_check(t, magic, 0);
	if (rc == hipSuccess) {
		((struct fh_token *)t)->magic = 0;
		free(t);
	}
	return rc;
}

FH_COPY(hipStreamCreateWithFlags, (hipStream_t *stream, unsigned int flags), token_new((void **)stream, FH_STREAM_MAGIC))
FH_COPY(hipStreamCreate, (hipStream_t *stream), token_new((void **)stream, FH_STREAM_MAGIC))
FH_COPY(hipStreamDestroy, (hipStream_t stream), token_free(stream, FH_STREAM_MAGIC))
FH_COPY_SPT(hipStreamSynchronize, (hipStream_t stream), token_check(stream, FH_STREAM_MAGIC, 1))
FH_COPY_SPT(hipStreamWaitEvent, (hipStream_t stream, hipEvent_t event, unsigned int flags),
	    token_check(event, FH_EVENT_MAGIC, 0))
FH_COPY(hipEventCreate, (hipEvent_t *event), token_new((void **)event, FH_EVENT_MAGIC))
FH_COPY(hipEventCreateWithFlags, (hipEvent_t *event, unsigned flags), token_new((void **)event, FH_EVENT_MAGIC))
FH_COPY(hipEventDestroy, (hipEvent_t event), token_free(event, FH_EVENT_MAGIC))
FH_COPY(hipEventRecord, (hipEvent_t event, hipStream_t stream), token_check(event, FH_EVENT_MAGIC, 0))
FH_COPY(hipEventSynchronize, (hipEvent_t event), token_check(event, FH_EVENT_MAGIC, 0))
FH_COPY(hipDeviceSynchronize, (void), hipSuccess)

FH_EXPORT const char *hipGetErrorName(hipError_t e)
{
	switch (e) {
	case hipSuccess: return "hipSuccess";
	case hipErrorInvalidValue: return "hipErrorInvalidValue";
	case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
	case hipErrorNoDevice: return "hipErrorNoDevice";
	case hipErrorInvalidDevice: return "hipErrorInvalidDevice";
	case hipErrorInvalidResourceHandle: return "hipErrorInvalidResourceHandle";
	case hipErrorNotSupported: return "hipErrorNotSupported";
	case hipErrorNotFound: return "hipErrorNotFound";
	default: return "hipErrorUnknown";
	}
}

FH_EXPORT const char *hipGetErrorString(hipError_t e)
{
	return hipGetErrorName(e);
}

/* ---- the service: other processes read our memory use and arm faults ---- */

static char fh_sock[108];
static pid_t fh_owner;

static void fh_serve(int fd)
{
	char req[128], reply[64];
	size_t n = 0;
	while (n + 1 < sizeof(req) && read(fd, req + n, 1) == 1 && req[n] != '\n')
		n++;
	req[n] = '\0';
	char name[64];
	unsigned nth;
	int code;
	hipError_t rc = hipSuccess;
	unsigned long long value = 0;
	pthread_mutex_lock(&fh_mu);
	size_t used = fh_used, reg = fh_registered;
	pthread_mutex_unlock(&fh_mu);
	if (strcmp(req, "mem") == 0)
		value = used;
	else if (strcmp(req, "registered") == 0)
		value = reg;
	else if (sscanf(req, "fail %63s %u %d", name, &nth, &code) == 3)
		rc = fh_fault_arm(name, nth, code);
	else
		rc = hipErrorInvalidValue;
	int len = snprintf(reply, sizeof(reply), "%d %llu\n", (int)rc, value);
	if (write(fd, reply, (size_t)len) < 0)
		return;
}

static void *fh_service(void *arg)
{
	int lfd = (int)(intptr_t)arg;
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			break;
		}
		fh_serve(fd);
		close(fd);
	}
	return NULL;
}

static void fh_service_stop(void)
{
	if (getpid() == fh_owner)
		unlink(fh_sock);
}

static void fh_service_start(void)
{
	const char *dir = getenv("FAKEHIP_DIR");
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (dir == NULL || *dir == '\0' ||
	    snprintf(fh_sock, sizeof(fh_sock), FAKEHIP_SOCK_FMT, dir, (int)getpid()) >= (int)sizeof(a.sun_path))
		return;
	memcpy(a.sun_path, fh_sock, strlen(fh_sock) + 1);
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	unlink(fh_sock);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 8) < 0) {
		if (lfd >= 0)
			close(lfd);
		return;
	}
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	pthread_t th;
	if (pthread_create(&th, NULL, fh_service, (void *)(intptr_t)lfd) == 0) {
		pthread_detach(th);
		fh_owner = getpid();
		atexit(fh_service_stop);
	} else {
		close(lfd);
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}
