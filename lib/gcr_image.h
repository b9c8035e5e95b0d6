/* gcr_image: the on-disk image of a process (docs/images.md): a directory holding
 * manifest.json, criu/ (CRIU's files) and gpu/ (the shim's data files). Writing it under a
 * partial name and committing it, the manifest's parser (fuzzed) and the verification that
 * refuses a partial, corrupt, truncated or mismatched image before anything is touched. */
#ifndef GCR_IMAGE_H
#define GCR_IMAGE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "gcr_crc32c.h"
#include "gcr_error.h"
#include "gcr_imagemac.h"

#define GCR_IMAGE_FORMAT 2 /* 1: SHA-256 checksums (phase 1), no longer read */
#define GCR_IMAGE_MANIFEST "manifest.json"
#define GCR_IMAGE_CRIU_DIR "criu"
#define GCR_IMAGE_GPU_DIR "gpu"
/* The shim's table of its data files (gpu/), copied into the manifest's "allocs". */
#define GCR_IMAGE_TABLE "gpu/allocs.json"
/* In the message of a chunk whose bytes do not match the manifest (the shim's load, the checks
 * here): callers that report such an image as refused look for it. */
#define GCR_IMAGE_CORRUPT "corrupt image"
#define GCR_IMAGE_PARTIAL ".partial." /* DIR.partial.<pid>: being written, never an image */
#define GCR_IMAGE_CHUNK (2ull << 20)   /* bytes per chunk of a GPU allocation */
/* The largest allocation table read (bytes): a process writes it, so its size is outside input.
 * About 110,000 chunks of GPU data (220 GiB of non-zero data in one process; a chunk's entry
 * is about 55 bytes, an all-zero one 7). docs/install.md, "Input bounds". */
#define GCR_IMAGE_MAX_TABLE (6ull << 20)
/* The largest manifest read (bytes): the table, and one line per file (GCR_IMAGE_MAX_FILES). */
#define GCR_IMAGE_MAX_JSON (16ull << 20)
/* The memory a table's or a manifest's parse may take (gcr_jsonbudget; bytes): an honest table
 * of GCR_IMAGE_MAX_TABLE bytes takes about 70 MiB, a hostile one fails here. */
#define GCR_IMAGE_PARSE_BUDGET (96ull << 20)
#define GCR_IMAGE_MAX_FILES 65536
#define GCR_IMAGE_NAME_MAX 256
#define GCR_IMAGE_NODE_MAX 254 /* a node name: a DNS subdomain, <= 253 */
#define GCR_IMAGE_CONTAINER_MAX 64 /* a container name: a DNS label, <= 63 */

/* One chunk of an allocation: all zero (nothing in the file) or len bytes at off. */
struct gcr_image_chunk {
	int zero;
	uint64_t off;
	uint32_t len;
	uint32_t crc; /* CRC-32C of the len bytes */
};

struct gcr_image_alloc {
	uint64_t address; /* where the application sees it (0: a handle it never mapped whole) */
	uint64_t size;
	uint32_t slot, gen; /* the shim's record, to find it again in the restored process */
	char file[GCR_IMAGE_NAME_MAX]; /* relative to the image, "gpu/..." */
	size_t nchunks;
	struct gcr_image_chunk *chunks; /* owned */
};

struct gcr_image_table {
	size_t n;
	struct gcr_image_alloc *a; /* owned */
};

struct gcr_image_file {
	char path[GCR_IMAGE_NAME_MAX]; /* relative, no ".." */
	uint64_t size;
	int has_crc;  /* 0 only for an allocation's data file: its chunks carry the checksums */
	uint32_t crc; /* CRC-32C of the whole file */
	int has_sha;  /* in a signed manifest, every file (gcr_imagemac) */
	uint8_t sha[GCR_SHA256_LEN];
};

/* What must match between an image and the machine that restores it. */
struct gcr_image_expect {
	char gpu_vendor[32], gpu_model[128], driver[64], shim_version[32];
	/* Shared storage: the manifest must carry a MAC under one of these keys and every file a
	 * SHA-256, which verify checks (NULL: neither is asked for). */
	const struct gcr_imagemac_keys *keys;
};

/* How the image was taken: GCR (the shim wrote gpu/, the driver's checkpoint moved the rest) or
 * the driver's checkpoint plus CRIU alone (the baseline: GPU data inside CRIU's pages). */
#define GCR_IMAGE_MODE_GCR "gcr"
#define GCR_IMAGE_MODE_DRIVER "driver"
/* The CPU side is the container runtime's checkpoint (the kubelet's archive, in
 * GCR_IMAGE_RUNTIME_ARCHIVE): restored by the runtime into a new pod, then the GPU data by
 * gcr_imgcr_resume_restored (docs/images.md, "Restore into a new pod"); never by CRIU here. */
#define GCR_IMAGE_MODE_RUNTIME "runtime"
#define GCR_IMAGE_RUNTIME_ARCHIVE GCR_IMAGE_CRIU_DIR "/kubelet-checkpoint.tar"

struct gcr_image_manifest {
	int format;
	char mode[16]; /* GCR_IMAGE_MODE_*; absent in the file means gcr */
	char gcr_version[32];
	long long created; /* seconds since the epoch */
	pid_t pid;
	char socket[GCR_IMAGE_NAME_MAX]; /* the shim's control socket when written */
	/* The Kubernetes node whose agent wrote it ("" outside Kubernetes, and in images from
	 * before the field): with images on storage every node shares, each agent's retention
	 * touches only its own (docs/images.md, "Shared storage"). */
	char node[GCR_IMAGE_NODE_MAX];
	/* The Kubernetes container the process ran in ("" outside Kubernetes and in images from
	 * before the field): a Restore into a new pod restores that container, by name. */
	char container[GCR_IMAGE_CONTAINER_MAX];
	struct gcr_image_expect env;     /* gpu vendor/model, driver, shim version (env.keys unused) */
	int signed_ok;                   /* its MAC was checked against keys (verify with expect->keys) */
	size_t nfiles;
	struct gcr_image_file *files; /* owned */
	struct gcr_image_table table;
};

/* ---- the table of GPU allocations (the shim writes it, the manifest carries it) ---- */
/* Parses an "allocs" array; checks every field: chunks cover size in order, offsets inside
 * no file twice, names under gpu/. On failure nothing is kept. */
int gcr_image_table_from_json(json_t *allocs, struct gcr_image_table *t, struct gcr_err *err);
/* Parses a table file's bytes ({"allocs": [...]}: gpu/allocs.json, outside input): at most
 * GCR_IMAGE_MAX_TABLE bytes, within GCR_IMAGE_PARSE_BUDGET (gcr_jsonbudget). 0, or -EFBIG (too
 * large to parse), -EBADMSG (not a table), -ENOMEM, with err saying which. */
int gcr_image_table_parse(const char *buf, size_t len, struct gcr_image_table *t, struct gcr_err *err);
/* The bytes the data file of allocation a must hold: up to its last non-zero chunk. */
uint64_t gcr_image_alloc_need(const struct gcr_image_alloc *a);
json_t *gcr_image_table_to_json(const struct gcr_image_table *t); /* NULL: out of memory */
void gcr_image_table_clear(struct gcr_image_table *t);

/* ---- the manifest ---- */
/* Parses manifest.json's bytes (buf, len: outside input). 0 or -EBADMSG / -ENOMEM. */
int gcr_image_manifest_parse(const char *buf, size_t len, struct gcr_image_manifest *m, struct gcr_err *err);
/* The same, and with keys (non-NULL) the manifest's MAC checked first (gcr_imagemac_check's
 * errors) and a SHA-256 required of every file; then m->signed_ok is 1. */
int gcr_image_manifest_parse_keyed(const char *buf, size_t len, const struct gcr_imagemac_keys *keys,
				   struct gcr_image_manifest *m, struct gcr_err *err);
void gcr_image_manifest_clear(struct gcr_image_manifest *m);

/* Writes dir/manifest.json for what dir holds now: every regular file under criu/ and gpu/ with
 * its size and CRC-32C (the table's data files: size only, their chunks carry CRCs), m's
 * identity fields and table; then fsyncs every file and directory. */
int gcr_image_manifest_write(const char *dir, const struct gcr_image_manifest *m, struct gcr_err *err);
/* The same with every file's SHA-256 (data files too: read back, from the page cache) and the
 * manifest signed with key (gcr_imagemac_sign); key NULL: as gcr_image_manifest_write. */
int gcr_image_manifest_write_signed(const char *dir, const struct gcr_image_manifest *m,
				    const struct gcr_imagemac_key *key, struct gcr_err *err);

/* While another program (CRIU) writes files into dir: a thread starts the disk write-back of
 * what they hold every few ms, so the manifest's fsync finds little left (the kernel itself
 * waits for 10% of memory to be dirty). start returns NULL when no thread could be made (then
 * the fsync does it all); stop joins it and frees it (NULL-safe). */
struct gcr_image_flusher;
struct gcr_image_flusher *gcr_image_flusher_start(const char *dir);
void gcr_image_flusher_stop(struct gcr_image_flusher *f);

/* A large copy (in to out) or read (out -1) that leaves neither file in the page cache, whose
 * pages are charged to the caller's memory cgroup: an image's files are as large as the GPU data
 * (16 GB for a Llama 8B) and the agent's limit 256 MiB, which dirty pages outran until the agent
 * was OOM-killed in a seal (GPU node runs 68 and 69, H200). Each 32 MiB window is written back
 * and dropped once the next one is on its way: at most two windows are dirty. step after each
 * chunk with the bytes done so far (both files from offset 0); end once out is fsynced. */
struct gcr_image_behind {
	int in, out;
	uint64_t started; /* write-back started below this; dropped below started - window */
};
void gcr_image_behind_step(struct gcr_image_behind *b, uint64_t total);
void gcr_image_behind_end(const struct gcr_image_behind *b);

/* ---- the directory ---- */
/* "DIR.partial.<pid>" into out. */
int gcr_image_partial_name(const char *dir, pid_t pid, char *out, size_t len, struct gcr_err *err);
/* Whether a path names a partial image (never to be taken for an image). */
int gcr_image_is_partial(const char *dir);
/* Renames partial to dir and fsyncs the parent: the commit point. -EEXIST when dir exists
 * (even an empty directory: an image is never put over anything). */
int gcr_image_commit(const char *partial, const char *dir, struct gcr_err *err);
/* Removes a directory tree (a failed checkpoint's partial image). NULL-safe, best effort. */
void gcr_image_remove(const char *dir);

/* Checks dir before anything is touched: not partial, manifest there and parsable, format
 * known, every listed file there with its size and CRC-32C, every data chunk's CRC-32C (read
 * by up to 16 threads), no unlisted file under gpu/ or criu/, the table's files listed and
 * the right size, and the environment matching expect (empty fields are not compared). On success *m holds the manifest (caller clears). Messages name
 * the problem and the file. -ENOENT, -EBADMSG, -EIO (missing, truncated, corrupt) or -ENOTSUP
 * (another GPU model, driver, shim or format). */
int gcr_image_verify(const char *dir, const struct gcr_image_expect *expect, struct gcr_image_manifest *m,
		     struct gcr_err *err);
/* The same in two halves, so a restore can check the GPU data while CRIU restores the CPU side
 * (the restored process stays held at the shim's gate until the data step): meta is everything
 * but the data chunks (manifest, environment, sizes, every whole-file CRC-32C); data is every
 * data chunk's CRC-32C (m from meta; m is not cleared on failure). */
int gcr_image_verify_meta(const char *dir, const struct gcr_image_expect *expect, struct gcr_image_manifest *m,
			  struct gcr_err *err);
/* threads: at most this many readers (0: up to 16, never more than the cores). With m->signed_ok,
 * also every data file's SHA-256 (whole files, one reader each). */
int gcr_image_verify_data(const char *dir, const struct gcr_image_manifest *m, int threads, struct gcr_err *err);
/* The machine check of verify_meta alone (expect's empty fields are not compared; the driver
 * mode's shim version neither): for a caller that learns the machine while it verifies. */
int gcr_image_env_check(const struct gcr_image_manifest *m, const struct gcr_image_expect *expect,
			struct gcr_err *err);

/* Writes len bytes of buf at off: through dfd (the file opened O_DIRECT; -1: none) when off and
 * len are multiples of GCR_IMAGE_DIRECT_ALIGN (the caller vouches for buf's alignment by passing
 * dfd), else, or where the filesystem refuses that write, through fd. 0 or -errno (-ENOSPC for a
 * write that made no progress). */
#define GCR_IMAGE_DIRECT_ALIGN 4096
int gcr_image_pwrite(int fd, int dfd, const void *buf, size_t len, uint64_t off);

/* Reads len bytes at off into buf, whole: 0, -EIO when the file ends first, or -errno. */
int gcr_image_pread(int fd, void *buf, size_t len, uint64_t off);

/* Test hook: with the environment variable env naming a FIFO, waits until a test has opened it
 * and closed it again (the test acts meanwhile: kills a client, changes a file; no sleep). */
void gcr_image_test_hold(const char *env);

/* Reads a whole file of at most max bytes (NUL-terminated, malloc'd). */
int gcr_image_read_file(const char *path, size_t max, char **buf, size_t *len, struct gcr_err *err);
/* The same from an open file (fd stays open): a regular file of at most max bytes, read whole;
 * -EFBIG when larger, -EBADMSG when not a regular file. */
int gcr_image_read_fd(int fd, const char *what, size_t max, char **buf, size_t *len, struct gcr_err *err);

#endif
