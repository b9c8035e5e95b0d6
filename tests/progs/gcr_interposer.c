/* gcr_interposer: a second LD_PRELOAD interposer for the tests, written the way profilers and
 * allocation tracers are: malloc, calloc, realloc, free, getenv and cuInit found with
 * dlsym(RTLD_NEXT, ...). It counts what it sees (one line on stderr at exit) and, for the
 * allocation-failure sweep, fails the Nth allocation inside a window the shim opens around
 * each suspend and resume (GCR_TEST_ALLOC_WINDOW; the shim calls gcr_failmalloc_window).
 *
 * GCR_FAILMALLOC_DIR/nth, read when a window opens, holds N (0: count only); when it closes,
 * GCR_FAILMALLOC_DIR/last gets "<allocations> <fired 0|1>". Only syscalls on that path: the
 * allocator must not allocate. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef void *(*malloc_fn)(size_t);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void (*free_fn)(void *);
typedef char *(*getenv_fn)(const char *);
typedef int (*cuinit_fn)(unsigned int);

EXPORT void gcr_failmalloc_window(int open_it);
EXPORT int cuInit(unsigned int flags);

static _Atomic(malloc_fn) next_malloc;
static _Atomic(calloc_fn) next_calloc;
static _Atomic(realloc_fn) next_realloc;
static _Atomic(free_fn) next_free;
static _Atomic(getenv_fn) next_getenv;
static _Atomic(cuinit_fn) next_cuinit;

static atomic_ulong seen_malloc, seen_getenv, seen_cuinit;

/* dlsym itself may allocate while malloc is being resolved: those few requests are served
 * from here (never freed back to libc). 64 KiB is far more than glibc's dlsym asks for. */
static _Alignas(16) char boot_arena[64 << 10];
static atomic_size_t boot_used;
static __thread int resolving __attribute__((tls_model("initial-exec")));

static void *boot_alloc(size_t n)
{
	n = (n + 15) & ~(size_t)15;
	size_t off = atomic_fetch_add(&boot_used, n);
	if (off + n > sizeof(boot_arena))
		return NULL;
	return boot_arena + off;
}

static int in_boot(const void *p)
{
	return (const char *)p >= boot_arena && (const char *)p < boot_arena + sizeof(boot_arena);
}

/* A resolution failing means the chain is broken: stop loudly rather than recurse. */
static void *next(const char *name)
{
	resolving = 1;
	void *f = dlsym(RTLD_NEXT, name);
	resolving = 0;
	return f;
}

static void resolve_alloc(void)
{
	if (atomic_load(&next_malloc) != NULL)
		return;
	atomic_store(&next_calloc, (calloc_fn)next("calloc"));
	atomic_store(&next_realloc, (realloc_fn)next("realloc"));
	atomic_store(&next_free, (free_fn)next("free"));
	atomic_store(&next_malloc, (malloc_fn)next("malloc"));
}

/* ---- the failure window ---- */

static atomic_int window_open;
static atomic_long window_count, window_nth;
static atomic_int window_fired;

static void file_path(char *buf, size_t cap, const char *leaf)
{
	const char *dir = NULL;
	getenv_fn g = atomic_load(&next_getenv);
	if (g != NULL)
		dir = g("GCR_FAILMALLOC_DIR");
	if (dir == NULL || (size_t)snprintf(buf, cap, "%s/%s", dir, leaf) >= cap)
		buf[0] = '\0';
}

/* Returns 1 when this allocation is the one to fail. */
static int should_fail(void)
{
	if (!atomic_load(&window_open))
		return 0;
	long n = atomic_fetch_add(&window_count, 1) + 1;
	if (n != atomic_load(&window_nth))
		return 0;
	atomic_store(&window_fired, 1);
	errno = ENOMEM;
	return 1;
}

EXPORT void gcr_failmalloc_window(int open_it)
{
	char path[512];
	if (open_it) {
		long nth = 0;
		file_path(path, sizeof(path), "nth");
		int fd = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
		if (fd >= 0) {
			char b[32] = { 0 };
			ssize_t r = read(fd, b, sizeof(b) - 1);
			close(fd);
			if (r > 0)
				nth = strtol(b, NULL, 10);
		}
		atomic_store(&window_count, 0);
		atomic_store(&window_fired, 0);
		atomic_store(&window_nth, nth);
		atomic_store(&window_open, 1);
		return;
	}
	atomic_store(&window_open, 0);
	file_path(path, sizeof(path), "last");
	int fd = path[0] ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
	if (fd >= 0) {
		char b[64];
		int len = snprintf(b, sizeof(b), "%ld %d\n", atomic_load(&window_count), atomic_load(&window_fired));
		ssize_t w = write(fd, b, (size_t)len);
		(void)w;
		close(fd);
	}
}

/* ---- the interposed functions ---- */

EXPORT void *malloc(size_t n)
{
	if (resolving)
		return boot_alloc(n);
	resolve_alloc();
	atomic_fetch_add_explicit(&seen_malloc, 1, memory_order_relaxed);
	if (should_fail())
		return NULL;
	return atomic_load(&next_malloc)(n);
}

EXPORT void *calloc(size_t n, size_t size)
{
	if (resolving) {
		void *p = boot_alloc(n * size);
		return p; /* static storage: already zero */
	}
	resolve_alloc();
	atomic_fetch_add_explicit(&seen_malloc, 1, memory_order_relaxed);
	if (should_fail())
		return NULL;
	return atomic_load(&next_calloc)(n, size);
}

EXPORT void *realloc(void *p, size_t n)
{
	if (resolving || in_boot(p)) {
		void *q = resolving ? boot_alloc(n) : malloc(n);
		if (q != NULL && p != NULL) {
			/* The old size is unknown: copy what fits before the arena's end. */
			size_t room = (size_t)(boot_arena + sizeof(boot_arena) - (char *)p);
			memcpy(q, p, n < room ? n : room);
		}
		return q;
	}
	resolve_alloc();
	atomic_fetch_add_explicit(&seen_malloc, 1, memory_order_relaxed);
	if (should_fail())
		return NULL;
	return atomic_load(&next_realloc)(p, n);
}

EXPORT void free(void *p)
{
	if (p == NULL || in_boot(p))
		return;
	resolve_alloc();
	atomic_load(&next_free)(p);
}

EXPORT char *getenv(const char *name)
{
	getenv_fn g = atomic_load(&next_getenv);
	if (g == NULL) {
		g = (getenv_fn)next("getenv");
		atomic_store(&next_getenv, g);
	}
	atomic_fetch_add_explicit(&seen_getenv, 1, memory_order_relaxed);
	return g(name);
}

EXPORT int cuInit(unsigned int flags)
{
	cuinit_fn f = atomic_load(&next_cuinit);
	if (f == NULL) {
		f = (cuinit_fn)next("cuInit");
		atomic_store(&next_cuinit, f);
	}
	atomic_fetch_add_explicit(&seen_cuinit, 1, memory_order_relaxed);
	return f != NULL ? f(flags) : 3; /* CUDA_ERROR_NOT_INITIALIZED */
}

/* RTLD_NEXT must give this library what it would get without GCR: libc's getenv. */
static int next_is_libc(void)
{
	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	if (libc == NULL)
		return 0;
	int same = dlsym(libc, "getenv") == next("getenv");
	dlclose(libc);
	return same;
}

__attribute__((constructor)) static void interposer_init(void)
{
	resolve_alloc();
	getenv("GCR_FAILMALLOC_DIR"); /* resolves getenv, so the window can find its files */
}

__attribute__((destructor)) static void interposer_report(void)
{
	char b[160];
	int len = snprintf(b, sizeof(b), "gcr-interposer: malloc %lu getenv %lu cuInit %lu next-getenv-is-libc %d\n",
			   atomic_load(&seen_malloc), atomic_load(&seen_getenv), atomic_load(&seen_cuinit),
			   next_is_libc());
	ssize_t w = write(STDERR_FILENO, b, (size_t)len);
	(void)w;
}
