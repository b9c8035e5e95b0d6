# tests/progs/: test programs run under the shim: gcr-testprog (driver API, runs unchanged on the
# stand-in driver and on a GPU) and the CUDA kernels it loads (compiled with nvcc on the GPU host).

# Linked against the stand-in driver, without an rpath: at run time LD_LIBRARY_PATH picks the
# fake, and on a GPU host the system's libcuda.so.1 is used.
noinst_PROGRAMS += tests/progs/gcr-testprog
tests_progs_gcr_testprog_SOURCES = tests/progs/gcr_testprog.c tests/progs/gcr_kernels.h
tests_progs_gcr_testprog_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_progs_gcr_testprog_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 -ldl
EXTRA_tests_progs_gcr_testprog_DEPENDENCIES = $(FAKECUDA_LIB)

# nvcc -fatbin -arch=sm_90 -o gcr_kernels.fatbin tests/progs/gcr_kernels.cu
EXTRA_DIST += tests/progs/gcr_kernels.cu

# gcr-hipprog: HIP on the stand-in runtime (tests/fakehip); its kernels are host functions.
noinst_PROGRAMS += tests/progs/gcr-hipprog
tests_progs_gcr_hipprog_SOURCES = tests/progs/gcr_hipprog.c
tests_progs_gcr_hipprog_CPPFLAGS = $(AM_CPPFLAGS) $(HIP_CPPFLAGS) -I$(srcdir)/tests/fakehip
tests_progs_gcr_hipprog_LDADD = -L$(top_builddir)/tests/fakehip -l:libamdhip64.so.5
EXTRA_tests_progs_gcr_hipprog_DEPENDENCIES = $(FAKEHIP_LIB)
