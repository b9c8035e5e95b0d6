# shim/: libgcr.so, loaded with LD_PRELOAD into the GPU process. It needs libc and
# libjansson.so.4, which is installed beside it (RUNPATH $ORIGIN) because the
# container image it is injected into may not have it (Debian's libjansson.a is
# not PIC, so it cannot be linked in).
lib_LTLIBRARIES += shim/libgcr.la
shim_libgcr_la_SOURCES = $(SHIM_SOURCES)
# The dlsym interposer is kept out of SHIM_CORE_SOURCES so tests can link the rest
# into an ordinary program without taking over its dlsym.
SHIM_SOURCES = $(SHIM_CORE_SOURCES) shim/core/shim_dlsym.c
SHIM_CORE_SOURCES = \
	shim/core/shim_main.c shim/core/shim_main.h \
	shim/core/shim_config.c shim/core/shim_config.h \
	shim/core/shim_real.c shim/core/shim_real.h shim/core/shim_hooktab.h \
	shim/cuda/shim_cuda_real.c shim/cuda/shim_cuda_real.h \
	shim/cuda/shim_hook.c shim/cuda/shim_hook.h shim/cuda/shim_hooks.def \
	shim/hip/shim_hip_hook.c shim/hip/shim_hip_hook.h shim/hip/shim_hip_hooks.def \
	shim/hip/shim_hip_alloc.c shim/hip/shim_hip_alloc.h \
	shim/core/shim_gpu.h shim/cuda/shim_cuda.c shim/cuda/shim_cuda_alloc.c shim/hip/shim_hip.c \
	shim/cuda/shim_cuda_pool.c shim/cuda/shim_cuda_pool.h shim/cuda/shim_cuda_graph.c \
	shim/cuda/shim_cuda_digest.c shim/cuda/shim_cuda_digest.h \
	shim/cuda/shim_procaddr.c \
	shim/core/shim_gate.c shim/core/shim_gate.h \
	shim/core/shim_alloc.c shim/core/shim_alloc.h \
	shim/core/shim_pool.c shim/core/shim_pool.h \
	shim/core/shim_staging.c shim/core/shim_staging.h \
	shim/core/shim_digest.c shim/core/shim_digest.h shim/core/shim_digest_math.h shim/cuda/shim_digest_ptx.h \
	shim/core/shim_chunks.c shim/core/shim_chunks.h \
	shim/core/shim_cr.c shim/core/shim_cr.h \
	shim/core/shim_imagefile.c shim/core/shim_imagefile.h \
	shim/core/shim_ctl.c shim/core/shim_ctl.h \
	shim/core/shim_agent.c shim/core/shim_agent.h \
	shim/core/shim_comm.h \
	shim/nccl/shim_nccl_abi.h shim/nccl/shim_nccl_hooks.def shim/nccl/shim_nccl.h \
	shim/nccl/shim_nccl.c shim/nccl/shim_nccl_hook.c shim/nccl/shim_nccl_ops.c \
	shim/nccl/shim_nccl_poke.c shim/nccl/shim_nccl_poke.h
shim_libgcr_la_CPPFLAGS = $(AM_CPPFLAGS) $(SHIM_INCLUDES) $(CUDA_CPPFLAGS) $(HIP_CPPFLAGS) $(JANSSON_CFLAGS)
shim_libgcr_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden
shim_libgcr_la_LIBADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
shim_libgcr_la_LDFLAGS = $(AM_LDFLAGS) -module -avoid-version -shared \
	-Wl,--version-script=$(srcdir)/shim/libgcr.map -Wl,--exclude-libs,ALL -Wl,-z,nodelete \
	-Wl,-rpath,'$$ORIGIN' -Wl,--enable-new-dtags
EXTRA_DIST += shim/libgcr.map shim/cuda/shim_digest_kernel.cu
