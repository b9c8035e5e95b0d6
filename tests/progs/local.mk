# tests/progs/: test programs run under the shim: gcr-testprog (driver API, runs unchanged on the
# stand-in driver and on a GPU) and the CUDA kernels it loads (compiled with nvcc on the GPU host).

# Linked against the stand-in driver, without an rpath: at run time LD_LIBRARY_PATH picks the
# fake, and on a GPU host the system's libcuda.so.1 is used.
noinst_PROGRAMS += tests/progs/gcr-testprog
tests_progs_gcr_testprog_SOURCES = tests/progs/gcr_testprog.c tests/progs/gcr_kernels.h
tests_progs_gcr_testprog_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_progs_gcr_testprog_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 -ldl
EXTRA_tests_progs_gcr_testprog_DEPENDENCIES = $(FAKECUDA_LIB)

# gcr-poolprog: stream-ordered memory (pools, cross-stream frees, graphs with memory nodes),
# linked the same way.
noinst_PROGRAMS += tests/progs/gcr-poolprog
tests_progs_gcr_poolprog_SOURCES = tests/progs/gcr_poolprog.c tests/progs/gcr_kernels.h
tests_progs_gcr_poolprog_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_progs_gcr_poolprog_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 -lpthread -ldl
EXTRA_tests_progs_gcr_poolprog_DEPENDENCIES = $(FAKECUDA_LIB)

# gcr-ncclprog: one rank of a group all-reducing every step through NCCL (the stand-in here;
# LD_LIBRARY_PATH picks the real libnccl.so.2 on a GPU host).
noinst_PROGRAMS += tests/progs/gcr-ncclprog
tests_progs_gcr_ncclprog_SOURCES = tests/progs/gcr_ncclprog.c
tests_progs_gcr_ncclprog_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/shim/nccl
tests_progs_gcr_ncclprog_LDADD = -L$(top_builddir)/tests/fakenccl -l:libnccl.so.2 \
	-L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 -ldl
EXTRA_tests_progs_gcr_ncclprog_DEPENDENCIES = $(FAKENCCL_LIB) $(FAKECUDA_LIB)

# gcr-hostile: a hostile tenant's pod against the node agent (the k8s-hostile tier): floods of
# its shared tables, planted input. libc only.
noinst_PROGRAMS += tests/progs/gcr-hostile
tests_progs_gcr_hostile_SOURCES = tests/progs/gcr_hostile.c

# nvcc -fatbin -arch=sm_90 -o gcr_kernels.fatbin tests/progs/gcr_kernels.cu
EXTRA_DIST += tests/progs/gcr_kernels.cu

# gcr-hipprog: HIP on the stand-in runtime (tests/fakehip); its kernels are host functions.
noinst_PROGRAMS += tests/progs/gcr-hipprog
tests_progs_gcr_hipprog_SOURCES = tests/progs/gcr_hipprog.c
tests_progs_gcr_hipprog_CPPFLAGS = $(AM_CPPFLAGS) $(HIP_CPPFLAGS) -I$(srcdir)/tests/fakehip
tests_progs_gcr_hipprog_LDADD = -L$(top_builddir)/tests/fakehip -l:libamdhip64.so.5
EXTRA_tests_progs_gcr_hipprog_DEPENDENCIES = $(FAKEHIP_LIB)

# libgcr-interposer.so: a second interposer using dlsym(RTLD_NEXT, ...), preloaded before and
# after the shim (tests/unit/test_interpose.sh) and the allocation-failure sweep's injector
# (tests/flow/test_alloc_sweep.py). A plain rule (no libtool: a check-only shared object), and
# without the sanitizers: in a sanitizer build the ASan runtime comes first and owns malloc.
INTERPOSER_LIB = tests/progs/libgcr-interposer.so
check_DATA = $(INTERPOSER_LIB)
CLEANFILES += $(INTERPOSER_LIB)
EXTRA_DIST += tests/progs/gcr_interposer.c
$(INTERPOSER_LIB): $(srcdir)/tests/progs/gcr_interposer.c
	@$(MKDIR_P) tests/progs
	$(AM_V_CCLD)$(CC) -std=c11 -pthread $(WARN_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden -shared \
		-Wl,-z,defs -o $@ $(srcdir)/tests/progs/gcr_interposer.c -ldl
