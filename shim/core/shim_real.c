/* shim_real: where the shim finds the real dynamic-linker entry points and the real
 * driver. dlsym is read out of libc's ELF symbol table so it never recurses. */
#include "shim_real.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "gcr_log.h"
#include "shim_hook.h"

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

struct shim_cu shim_cu;

static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static void *cuda_handle; /* written once under cuda_lock, then read lock-free */

int shim_real_load_cuda(const void *hint)
{
	if (__atomic_load_n(&cuda_handle, __ATOMIC_ACQUIRE) != NULL)
		return 0;
	pthread_mutex_lock(&cuda_lock);
	int rc = 0;
	if (cuda_handle != NULL)
		goto out;
	const char *path = "libcuda.so.1";
	Dl_info di, self;
	if (hint != NULL && dladdr(hint, &di) != 0 && di.dli_fname != NULL &&
	    !(dladdr((void *)&shim_real_load_cuda, &self) != 0 && self.dli_fbase == di.dli_fbase))
		path = di.dli_fname; /* the very library the application opened */
	void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (h == NULL)
		h = dlopen(path, RTLD_NOW);
	if (h == NULL) {
		GCR_LOG(GCR_LOG_ERROR, "shim", "cannot open the CUDA driver %s: %s", path, dlerror());
		rc = -ENOENT;
		goto out;
	}
	for (int i = 0; i < SHIM_HOOK_COUNT; i++)
		for (int v = 0; v < 2; v++)
			if (shim_hooks[i].name[v] != NULL)
				shim_hooks[i].real[v] = shim_real_dlsym(h, shim_hooks[i].name[v]);
#define X(f) shim_cu.f = (__typeof__(&f))shim_real_dlsym(h, #f);
	SHIM_CU_INTERNAL_LIST
#undef X
	__atomic_store_n(&cuda_handle, h, __ATOMIC_RELEASE);
	GCR_LOG(GCR_LOG_DEBUG, "shim", "driver loaded from %s", path);
out:
	pthread_mutex_unlock(&cuda_lock);
	return rc;
}

void *shim_real_cuda_handle(void)
{
	return __atomic_load_n(&cuda_handle, __ATOMIC_ACQUIRE);
}

void shim_real_relax_capture(void)
{
	if (shim_cu.cuThreadExchangeStreamCaptureMode != NULL) {
		CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
		shim_cu.cuThreadExchangeStreamCaptureMode(&mode);
	}
}
