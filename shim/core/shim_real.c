/* shim_real: where the shim finds the real dynamic-linker entry points and the real GPU
 * runtimes. dlsym is read out of libc's ELF symbol table so it never recurses; each runtime
 * is one row of the runtimes table below (how to find it, its hook table, what it must have),
 * loaded by the same code for every vendor. */
#include "shim_real.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_gpu.h"

/* Sanitizer runtimes resolve their own interceptors through dlsym before they are
 * initialised: the code on that path must not be instrumented, and must not call
 * libc string functions (they may be intercepted and not ready yet). */
#define SHIM_EARLY __attribute__((no_sanitize("address", "undefined")))

SHIM_EARLY static int early_streq(const char *a, const char *b)
{
	while (*a != '\0' && *a == *b) {
		a++;
		b++;
	}
	return *a == *b;
}

SHIM_EARLY static int early_contains(const char *hay, const char *needle)
{
	for (; *hay != '\0'; hay++) {
		const char *h = hay, *n = needle;
		while (*n != '\0' && *h == *n) {
			h++;
			n++;
		}
		if (*n == '\0')
			return 1;
	}
	return 0;
}

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlsym_fn real_dlsym;
static dlvsym_fn real_dlvsym;

struct elf_find {
	const char *want[2]; /* "dlsym", "dlvsym" */
	void *found[2];
};

/* Number of entries in the dynamic symbol table, from DT_HASH or DT_GNU_HASH. */
SHIM_EARLY static size_t sym_count(const ElfW(Word) *hash, const uint32_t *gnu)
{
	if (hash != NULL)
		return hash[1];
	if (gnu == NULL)
		return 0;
	uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
	const uint32_t *buckets = gnu + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
	const uint32_t *chain = buckets + nbuckets;
	uint32_t last = 0;
	for (uint32_t i = 0; i < nbuckets; i++)
		if (buckets[i] > last)
			last = buckets[i];
	if (last < symoffset)
		return symoffset;
	while ((chain[last - symoffset] & 1) == 0)
		last++;
	return last + 1;
}

/* Looks dlsym and dlvsym up in one loaded object's dynamic symbol table. */
SHIM_EARLY static void find_in_object(const struct link_map *lm, struct elf_find *f)
{
	const ElfW(Dyn) *dyn = lm->l_ld;
	ElfW(Addr) base = lm->l_addr;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Word) *hash = NULL;
	const uint32_t *gnu = NULL;
	const ElfW(Versym) *versym = NULL;
	for (; dyn != NULL && dyn->d_tag != DT_NULL; dyn++) {
		ElfW(Addr) p = dyn->d_un.d_ptr;
		/* ld.so relocates these in place on most targets; add the base if not. */
		if (p < base)
			p += base;
		switch (dyn->d_tag) {
		case DT_SYMTAB: symtab = (const void *)p; break;
		case DT_STRTAB: strtab = (const void *)p; break;
		case DT_HASH: hash = (const void *)p; break;
		case DT_GNU_HASH: gnu = (const void *)p; break;
		case DT_VERSYM: versym = (const void *)p; break;
		default: break;
		}
	}
	if (symtab == NULL || strtab == NULL)
		return;
	size_t n = sym_count(hash, gnu);
	for (size_t i = 0; i < n; i++) {
		const ElfW(Sym) *s = &symtab[i];
		if (s->st_value == 0 || ELF64_ST_TYPE(s->st_info) != STT_FUNC)
			continue;
		/* Only the default version (not hidden): what a plain link would bind. */
		if (versym != NULL && (versym[i] & 0x8000))
			continue;
		for (int w = 0; w < 2; w++)
			if (f->found[w] == NULL && early_streq(strtab + s->st_name, f->want[w]))
				f->found[w] = (void *)(base + s->st_value);
	}
}

SHIM_EARLY int shim_real_init(void)
{
	if (real_dlsym != NULL)
		return 0;
	struct elf_find f = { .want = { "dlsym", "dlvsym" } };
	/* The dynamic linker's own list of loaded objects: walking it calls nothing,
	 * so it is safe before any interceptor (ASan's, say) is ready. */
	for (const struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next)
		if (lm->l_name != NULL && early_contains(lm->l_name, "libc.so"))
			find_in_object(lm, &f);
	if (f.found[0] == NULL || f.found[1] == NULL) {
		gcr_log_problem("shim", "cannot find dlsym in libc; lookups by dlsym are not interposed");
		return -ENOENT;
	}
	real_dlvsym = (dlvsym_fn)f.found[1];
	__atomic_store_n(&real_dlsym, (dlsym_fn)f.found[0], __ATOMIC_RELEASE);
	return 0;
}

SHIM_EARLY void *shim_real_dlsym(void *handle, const char *name)
{
	dlsym_fn fn = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
	if (fn == NULL && shim_real_init() == 0)
		fn = real_dlsym;
	return fn ? fn(handle, name) : NULL;
}

SHIM_EARLY void *shim_real_dlvsym(void *handle, const char *name, const char *version)
{
	if (real_dlvsym == NULL && shim_real_init() < 0)
		return NULL;
	return real_dlvsym(handle, name, version);
}

SHIM_EARLY void *shim_real_dlsym_ptr(void)
{
	dlsym_fn fn = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
	if (fn == NULL && shim_real_init() == 0)
		fn = real_dlsym;
	return (void *)fn;
}

SHIM_EARLY void *shim_real_dlvsym_ptr(void)
{
	if (__atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE) == NULL && shim_real_init() < 0)
		return NULL;
	return (void *)real_dlvsym;
}

struct shim_lookups shim_lookups;
atomic_int shim_real_ready[SHIM_VENDORS];

/* The object holding addr, unless it is the shim itself (the application looked a wrapper up). */
static const char *object_of(const void *addr)
{
	Dl_info di, self;
	if (addr == NULL || dladdr(addr, &di) == 0 || di.dli_fname == NULL)
		return NULL;
	if (dladdr((void *)&shim_real_load, &self) != 0 && self.dli_fbase == di.dli_fbase)
		return NULL;
	return di.dli_fname;
}

/* The object holding addr if it is a HIP runtime. */
static const char *hip_runtime_of(const void *addr)
{
	const char *path = object_of(addr);
	return path != NULL && strstr(path, "libamdhip64") != NULL ? path : NULL;
}

static void *dlopen_loaded_first(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	return h != NULL ? h : dlopen(path, RTLD_NOW);
}

static void *open_cuda(const void *hint, const char **path)
{
	*path = object_of(hint); /* the very library the application opened */
	if (*path == NULL)
		*path = "libcuda.so.1";
	void *h = dlopen_loaded_first(*path);
	if (h == NULL)
		GCR_LOG(GCR_LOG_ERROR, "shim", "cannot open the CUDA driver %s: %s", *path, dlerror());
	return h;
}

static void *open_hip(const void *hint, const char **path)
{
	*path = hip_runtime_of(hint);
	void *h = *path != NULL ? dlopen(*path, RTLD_NOW | RTLD_NOLOAD) : NULL;
	static const char *const sonames[] = SHIM_HIP_SONAMES;
	const size_t n = sizeof(sonames) / sizeof(sonames[0]);
	/* The runtime the application already loaded wins over any newer one on disk. */
	for (size_t i = 0; h == NULL && i < n; i++)
		if ((h = dlopen(sonames[i], RTLD_NOW | RTLD_NOLOAD)) != NULL)
			*path = sonames[i];
	for (size_t i = 0; h == NULL && i < n; i++)
		if ((h = dlopen(sonames[i], RTLD_NOW)) != NULL)
			*path = sonames[i];
	if (h == NULL)
		GCR_LOG(GCR_LOG_ERROR, "shim", "cannot open the HIP runtime (libamdhip64.so.7/6/5)");
	return h;
}

struct runtime {
	const char *what;
	struct shim_hook *hooks;
	unsigned count;
	void *(*open)(const void *hint, const char **path);
	/* Whether a lookup's answer may name the runtime to load (NULL: any may). */
	const char *(*owns)(const void *fn);
	const struct shim_gpu_ops *gpu; /* its backend: bind, relax_capture */
	int serve_on_use; /* the first call through a hook serves (no init call all programs make) */
	pthread_mutex_t lock;
	void *handle;	  /* written once under lock, then read lock-free */
	int serves;	  /* set with handle */
};

static struct runtime runtimes[SHIM_VENDORS] = {
	[SHIM_CUDA] = { .what = "CUDA driver", .hooks = shim_hooks, .count = SHIM_HOOK_COUNT,
			.open = open_cuda, .gpu = &shim_cuda_ops, .lock = PTHREAD_MUTEX_INITIALIZER },
	[SHIM_HIP] = { .what = "HIP runtime", .hooks = shim_hip_hooks, .count = SHIM_HIP_HOOK_COUNT,
		       .open = open_hip, .owns = hip_runtime_of, .serve_on_use = 1, .gpu = &shim_hip_ops,
		       .lock = PTHREAD_MUTEX_INITIALIZER },
};

int shim_real_load(enum shim_vendor vendor, const void *hint)
{
	struct runtime *rt = &runtimes[vendor];
	if (__atomic_load_n(&rt->handle, __ATOMIC_ACQUIRE) != NULL)
		return 0;
	pthread_mutex_lock(&rt->lock);
	int rc = 0;
	if (rt->handle != NULL)
		goto out;
	const char *path = NULL;
	void *h = rt->open(hint, &path);
	if (h == NULL) {
		rc = -ENOENT;
		goto out;
	}
	for (unsigned i = 0; i < rt->count; i++)
		for (int v = 0; v < 2; v++)
			if (rt->hooks[i].name[v] != NULL)
				rt->hooks[i].real[v] = shim_real_dlsym(h, rt->hooks[i].name[v]);
	rt->serves = rt->gpu->bind == NULL || rt->gpu->bind(h, path);
	__atomic_store_n(&rt->handle, h, __ATOMIC_RELEASE);
	GCR_LOG(GCR_LOG_DEBUG, "shim", "%s loaded from %s", rt->what, path);
out:
	pthread_mutex_unlock(&rt->lock);
	return rc;
}

void *shim_real_handle(enum shim_vendor vendor)
{
	return __atomic_load_n(&runtimes[vendor].handle, __ATOMIC_ACQUIRE);
}

static void (*serve_fn)(void);

void shim_real_on_serve(void (*serve)(void))
{
	__atomic_store_n(&serve_fn, serve, __ATOMIC_RELEASE);
}

/* 1 once serving was started or is not possible; 0 while no serve function is set (a call
 * that comes before the library's constructor ran). */
static int serve(enum shim_vendor vendor)
{
	if (!runtimes[vendor].serves)
		return 1;
	void (*fn)(void) = __atomic_load_n(&serve_fn, __ATOMIC_ACQUIRE);
	if (fn == NULL)
		return 0;
	fn();
	return 1;
}

void shim_real_serve(enum shim_vendor vendor)
{
	if (shim_real_handle(vendor) != NULL)
		serve(vendor);
}

void *shim_real_hook_slow(enum shim_vendor vendor, unsigned id, int variant)
{
	struct runtime *rt = &runtimes[vendor];
	if (shim_real_load(vendor, NULL) < 0)
		return NULL;
	if (!rt->serve_on_use || serve(vendor))
		atomic_store_explicit(&shim_real_ready[vendor], 1, memory_order_release);
	return rt->hooks[id].real[variant];
}

void *shim_real_wrap(enum shim_vendor vendor, void *real_fn)
{
	struct runtime *rt = &runtimes[vendor];
	if (real_fn == NULL)
		return NULL;
	if (shim_real_handle(vendor) == NULL &&
	    ((rt->owns != NULL && rt->owns(real_fn) == NULL) || shim_real_load(vendor, real_fn) < 0))
		return NULL;
	for (unsigned i = 0; i < rt->count; i++)
		for (int v = 0; v < 2; v++)
			if (rt->hooks[i].real[v] == real_fn)
				return rt->hooks[i].wrapper[v];
	return NULL;
}

void *shim_real_wrap_name(enum shim_vendor vendor, const char *name)
{
	const struct runtime *rt = &runtimes[vendor];
	for (unsigned i = 0; i < rt->count; i++)
		for (int v = 0; v < 2; v++)
			if (rt->hooks[i].name[v] != NULL && strcmp(rt->hooks[i].name[v], name) == 0)
				return rt->hooks[i].wrapper[v];
	return NULL;
}

struct shim_hook *shim_real_hooks(enum shim_vendor vendor, unsigned *count)
{
	*count = runtimes[vendor].count;
	return runtimes[vendor].hooks;
}

void shim_real_relax_capture(void)
{
	for (int v = 0; v < SHIM_VENDORS; v++)
		if (runtimes[v].gpu->relax_capture != NULL && shim_real_handle((enum shim_vendor)v) != NULL)
			runtimes[v].gpu->relax_capture();
}
