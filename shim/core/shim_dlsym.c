/* shim_dlsym: interposes dlsym and dlvsym, because the CUDA runtime and PyTorch
 * find the driver by looking its entry points up on libcuda's own handle (and
 * frameworks built on HIP do the same with libamdhip64's). */
#include <dlfcn.h>
#include <stdatomic.h>

#include "shim_comm.h"
#include "shim_hooktab.h"
#include "shim_real.h"

/* HIP names: "hip..." and the C++ mangled "_Z<len>hip..." of hip_ext.h's launches. */
__attribute__((no_sanitize("address", "undefined"))) static int is_hip_name(const char *n)
{
	if (n[0] == '_' && n[1] == 'Z')
		for (n += 2; *n >= '0' && *n <= '9'; n++)
			;
	return n[0] == 'h' && n[1] == 'i' && n[2] == 'p';
}

/* NCCL names: "nccl..." and the profiling "pnccl...". */
__attribute__((no_sanitize("address", "undefined"))) static int is_nccl_name(const char *n)
{
	if (n[0] == 'p')
		n++;
	return n[0] == 'n' && n[1] == 'c' && n[2] == 'c' && n[3] == 'l';
}

/* Any driver or HIP runtime entry point the shim interposes is answered with its
 * wrapper, whatever handle it was looked up on (and so is NCCL's: a framework that opens it
 * with ctypes finds its functions by dlsym); everything else is left alone. */
__attribute__((no_sanitize("address", "undefined"))) static void *filter(void *found, const char *name)
{
	if (found == NULL || name == NULL)
		return found;
	enum shim_vendor vendor;
	if (is_hip_name(name)) {
		vendor = SHIM_HIP;
	} else if (name[0] == 'c' && name[1] == 'u') {
		vendor = SHIM_CUDA;
	} else if (is_nccl_name(name)) {
		void *w = shim_nccl_ops.wrap(found, name);
		return w != NULL ? w : found;
	} else {
		return found;
	}
	atomic_fetch_add_explicit(&shim_lookups.dlsym[vendor], 1, memory_order_relaxed);
	void *w = shim_real_wrap(vendor, found);
	if (w == NULL)
		return found;
	atomic_fetch_add_explicit(&shim_lookups.dlsym_wrapped[vendor], 1, memory_order_relaxed);
	return w;
}

/* Every lookup but RTLD_NEXT: the real answer, swapped for the wrapper where one exists.
 * Not static: the assembly entry points below jump to them by name. */
void *shim_dlsym_any(void *handle, const char *name);
void *shim_dlvsym_any(void *handle, const char *name, const char *version);

__attribute__((no_sanitize("address", "undefined"), used)) void *shim_dlsym_any(void *handle, const char *name)
{
	return filter(shim_real_dlsym(handle, name), name);
}

__attribute__((no_sanitize("address", "undefined"), used)) void *shim_dlvsym_any(void *handle, const char *name,
										   const char *version)
{
	return filter(shim_real_dlvsym(handle, name, version), name);
}

/* dlsym(RTLD_NEXT, ...) means "the next definition after the object that called me": glibc
 * finds that object from dlsym's own return address. Called from here, libc would search
 * after libgcr, so an interposer preloaded after the shim got its own function back and
 * recursed without end. The two entry points are therefore a few instructions of assembly:
 * for RTLD_NEXT they jump (not call) into libc's dlsym/dlvsym, so libc sees the caller's
 * return address and answers exactly as it would without GCR; every other handle goes to
 * the C functions above. Chosen over emulating RTLD_NEXT by walking the link maps after the
 * caller (dladdr1 + a lookup per object): that needs dlopen and dladdr per lookup, which
 * allocate, and interposers of malloc resolve malloc this way from inside malloc; and it
 * would miss glibc's rules (namespaces, versions, IFUNCs). RTLD_NEXT answers are not
 * swapped for wrappers: the caller is then an interposer whose next definition is what it
 * must reach (the shim's own wrapper when it comes before the shim). shim_real_dlsym_ptr
 * finds libc's function first (an interposer's constructor may run before the shim's). */
#if defined(__x86_64__)
/* Three argument registers are saved whichever function (24 bytes keep the stack 16-byte
 * aligned at the call); endbr64 makes the entry a valid indirect-branch target under CET. */
#define SHIM_NEXT_TRAMPOLINE(sym, any, ptr)                                                     \
	__asm__(".text\n"                                                                       \
		".globl " #sym "\n"                                                             \
		".type " #sym ", @function\n"                                                   \
		".p2align 4\n" #sym ":\n"                                                      \
		"	endbr64\n"                                                              \
		"	cmpq $-1, %rdi\n"                                                       \
		"	jne " #any "\n"                                                         \
		"	pushq %rdi\n"                                                           \
		"	pushq %rsi\n"                                                           \
		"	pushq %rdx\n"                                                           \
		"	call " #ptr "\n"                                                        \
		"	popq %rdx\n"                                                            \
		"	popq %rsi\n"                                                            \
		"	popq %rdi\n"                                                            \
		"	testq %rax, %rax\n"                                                     \
		"	jz 1f\n"                                                                \
		"	jmp *%rax\n"                                                            \
		"1:	ret\n"                                                                  \
		".size " #sym ", .-" #sym "\n")
#elif defined(__aarch64__)
#define SHIM_NEXT_TRAMPOLINE(sym, any, ptr)                                                     \
	__asm__(".text\n"                                                                       \
		".globl " #sym "\n"                                                             \
		".type " #sym ", %function\n"                                                   \
		".p2align 4\n" #sym ":\n"                                                      \
		"	cmn x0, #1\n"                                                           \
		"	b.ne " #any "\n"                                                        \
		"	stp x29, x30, [sp, #-48]!\n"                                            \
		"	mov x29, sp\n"                                                          \
		"	stp x0, x1, [sp, #16]\n"                                                \
		"	str x2, [sp, #32]\n"                                                    \
		"	bl " #ptr "\n"                                                          \
		"	mov x16, x0\n"                                                          \
		"	ldp x0, x1, [sp, #16]\n"                                                \
		"	ldr x2, [sp, #32]\n"                                                    \
		"	ldp x29, x30, [sp], #48\n"                                              \
		"	cbz x16, 1f\n"                                                          \
		"	br x16\n"                                                               \
		"1:	mov x0, #0\n"                                                           \
		"	ret\n"                                                                  \
		".size " #sym ", .-" #sym "\n")
#else
#error "shim_dlsym.c: dlsym(RTLD_NEXT) needs a jump trampoline for this architecture"
#endif

/* Declared for the version script and the export test; defined by the assembly below. */
SHIM_EXPORT void *dlsym(void *handle, const char *name);
SHIM_EXPORT void *dlvsym(void *handle, const char *name, const char *version);
SHIM_NEXT_TRAMPOLINE(dlsym, shim_dlsym_any, shim_real_dlsym_ptr);
SHIM_NEXT_TRAMPOLINE(dlvsym, shim_dlvsym_any, shim_real_dlvsym_ptr);
