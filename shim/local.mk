# shim/: libgcr.so, loaded with LD_PRELOAD into the GPU process. It needs libc and
# libjansson.so.4, which is installed beside it (RUNPATH $ORIGIN) because the
# container image it is injected into may not have it (Debian's libjansson.a is
# not PIC, so it cannot be linked in).
lib_LTLIBRARIES += shim/libgcr.la
shim_libgcr_la_SOURCES = $(SHIM_SOURCES)
# The dlsym interposer is kept out of SHIM_CORE_SOURCES so tests can link the rest
# into an ordinary program without taking over its dlsym.
SHIM_SOURCES = $(SHIM_CORE_SOURCES) shim/shim_dlsym.c
SHIM_CORE_SOURCES = \
	shim/shim_main.c \
	shim/shim_config.c shim/shim_config.h \
	shim/shim_real.c shim/shim_real.h \
	shim/shim_hook.c shim/shim_hook.h shim/shim_hooks.def \
	shim/shim_hip_hook.c shim/shim_hip_hook.h shim/shim_hip_hooks.def \
	shim/shim_hip_alloc.c shim/shim_hip_alloc.h \
	shim/shim_gpu.h shim/shim_cuda.c shim/shim_hip.c \
	shim/shim_procaddr.c \
	shim/shim_gate.c shim/shim_gate.h \
	shim/shim_alloc.c shim/shim_alloc.h \
	shim/shim_staging.c shim/shim_staging.h \
	shim/shim_digest.c shim/shim_digest.h shim/shim_digest_math.h shim/shim_digest_ptx.h \
	shim/shim_image.c shim/shim_image.h \
	shim/shim_cr.c shim/shim_cr.h \
	shim/shim_ctl.c shim/shim_ctl.h
shim_libgcr_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(HIP_CPPFLAGS) $(JANSSON_CFLAGS)
shim_libgcr_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden
shim_libgcr_la_LIBADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
shim_libgcr_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-Wl,--version-script=$(srcdir)/shim/libgcr.map -Wl,--exclude-libs,ALL -Wl,-z,nodelete \
	-Wl,-rpath,'$$ORIGIN' -Wl,--enable-new-dtags
EXTRA_DIST += shim/libgcr.map shim/shim_digest_kernel.cu
