/* shim_staging: the host side of the data path. Buffers' data lives in ordinary
 * memory faulted in ahead of time; copy workers carry it over PCIe through two
 * small pinned slots each. Nothing is pinned while a suspend or resume is timed. */
#ifndef SHIM_STAGING_H
#define SHIM_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "gcr_error.h"
#include "shim_gpu.h"

/* The unit of transfer and of host placement (one pinned slot). */
#define SHIM_STAGING_CHUNK (2ull << 20)
/* The bound on a piece of a suspend to files: consecutive chunks of one allocation, written
 * at once. The size used is shim_staging_file_piece(). */
#define SHIM_STAGING_FILE_PIECE (256ull << 20)

/* A suspend to files writes pieces of up to this many bytes (GCR_IMAGE_PIECE_MIB, whole
 * chunks), from GCR_IMAGE_WRITERS copy workers: disks take a few large sequential writes
 * faster than many small ones. */
uint64_t shim_staging_file_piece(void);

/* The allocation path reports the bytes that may need staging; the background
 * thread grows the pool and starts copy workers to match (GCR_STAGING_THREADS per GPU
 * allocated on: device, or -1 unknown). gpu: the vendor whose calls
 * the staging makes (the first one noted); ctx: CUDA: the context the workers' pinned
 * slots are allocated in (NULL for HIP). */
void shim_staging_note_bytes(uint64_t bytes, int device, const struct shim_gpu_ops *gpu, void *ctx);

/* Before a suspend's copies: makes at least `need` bytes of pool available beyond
 * what is kept (faulting in on the spot if the background thread is behind, which
 * is counted in grown_inline), makes sure copy workers exist, and pauses the
 * background thread (the process may be locked by the driver next). */
int shim_staging_prepare(const struct shim_gpu_ops *gpu, uint64_t need, struct gcr_err *err);

/* Host placement: offsets in the pool's logical range, SHIM_STAGING_CHUNK aligned.
 * reset forgets every placement (nothing kept); alloc returns -ENOSPC past capacity. */
void shim_staging_reset(void);
int shim_staging_alloc(uint64_t size, uint64_t *off);

/* One piece of a transfer, at most SHIM_STAGING_CHUNK bytes: device bytes at dev
 * (on GPU device) <-> pool offset off. zero (in only): set the bytes to zero on the
 * GPU instead of copying. */
struct shim_xfer {
	uint64_t off; /* pool offset, or with file: the offset in that file */
	shim_gpu_va dev;
	uint32_t size;
	int16_t device;
	int16_t zero;
	uint32_t group; /* with groups: which group the piece belongs to */
	/* file set, in: the bytes come from an image file (fd, at off), read straight into the
	 * pinned slot and checked against crc (CRC-32C) before they go to the GPU. Out: they go
	 * from the pinned slot to the file at off (through dfd, the file opened O_DIRECT, when
	 * offset and length are page multiples and dfd >= 0), and the CRC-32C of each chunk of the
	 * piece (up to shim_staging_file_piece(), whole chunks) to crc_out[0], [1], ... */
	int16_t file;
	int fd, dfd;
	uint32_t crc;
	uint32_t *crc_out;
	const char *name; /* the file, for messages */
};

/* Optional, out only: pieces belong to ngroups groups (allocations); done(k) is
 * called on the calling thread as soon as every piece of group k is off the GPU
 * (at once for groups with no pieces), while the other copies go on, so the
 * caller can release that memory in the shadow of the copies. done is not called
 * again after it returned non-zero. */
struct shim_staging_groups {
	size_t ngroups;
	int (*done)(size_t group, void *ctx);
	void *ctx;
};

/* Moves every piece (out: device to pool; else back, from the pool or an image file) with all copy workers, and
 * returns once every copy finished; 0 or -errno (the first failure). */
int shim_staging_transfer(int out, const struct shim_xfer *x, size_t n, const struct shim_staging_groups *g,
			  struct gcr_err *err);
/* The order copy workers take x[0..n) in: with pieces on several GPUs, one of each GPU in turn
 * (each GPU's in table order), so every GPU's link is busy at once; *order NULL (table order)
 * when all are on one GPU. The caller frees *order. Returns 0, -EINVAL or -ENOMEM. */
int shim_staging_order(const struct shim_xfer *x, size_t n, size_t **order, struct gcr_err *err);

/* While suspended: the pool beyond `keep` bytes (the data just saved) is given
 * back to the system by the background thread, off the clock, and later growth
 * aims at keep plus new allocations. */
void shim_staging_trim(uint64_t keep);

/* Before a resume's copies: waits for a trim in progress. */
void shim_staging_quiesce(void);

/* After resume (or a failed suspend): background work may go on. */
void shim_staging_resume_background(void);

/* ---- images (shim_imagefile) ---- */
/* Host address of pool offset off, while suspended (the pool does not change then). */
char *shim_staging_host(uint64_t off);
/* While suspended, once the data is in image files: forgets every placement and gives the
 * whole pool back to the system, waiting until it is gone (CRIU must not dump it). Workers and
 * their pinned slots stay. */
void shim_staging_drop(void);

struct shim_staging_stats {
	uint64_t capacity;     /* pool bytes faulted in */
	uint64_t used;         /* pool bytes holding placed data */
	uint64_t ring;         /* pinned bytes: the workers' slots */
	uint64_t target;       /* pool bytes the background thread aims at */
	uint64_t grown_inline; /* pool bytes faulted in on the critical path (should stay 0) */
	int workers;
	int ready;             /* pool, workers and digest kernel all prepared */
	double fault_ms;       /* time spent faulting the pool in, all of it */
};
void shim_staging_stats(struct shim_staging_stats *st);

#endif
