# tests/fakecuda/: the stand-in CUDA driver (libcuda.so.1 on host memory, for CI without a GPU),
# fakesmi to inspect and drive it, and its self-test.

FAKECUDA_LIB = tests/fakecuda/libcuda.so.1
fakecuda_sources = \
	tests/fakecuda/fakecuda_core.c \
	tests/fakecuda/fakecuda_mem.c \
	tests/fakecuda/fakecuda_copy.c \
	tests/fakecuda/fakecuda_exec.c \
	tests/fakecuda/fakecuda_pool_async.c \
	tests/fakecuda/fakecuda_ckpt.c \
	tests/fakecuda/fakecuda_procaddr.c
fakecuda_headers = tests/fakecuda/fakecuda.h tests/fakecuda/fakecuda_pool.h tests/fakecuda/fakecuda_test.h \
	tests/progs/gcr_kernels.h
# The digest math the stand-in's gcr_chunk_digest shares with the shim (distributed with shim/),
# and lib/'s way into another namespace's files, which the checkpoint client shares with gcrctl.
fakecuda_deps = shim/core/shim_digest_math.h lib/gcr_procns.h lib/gcr_error.h
fakecuda_lib_sources = lib/gcr_procns.c lib/gcr_error.c

# A plain rule, not libtool: the file must be named exactly libcuda.so.1 (the soname the
# runtime and the shim dlopen). -Bsymbolic keeps the cuGetProcAddress table pointing at our
# own entry points when a preloaded shim exports the same names.
noinst_DATA += $(FAKECUDA_LIB)
CLEANFILES += $(FAKECUDA_LIB)
EXTRA_DIST += $(fakecuda_sources) $(fakecuda_headers) tests/fakecuda/test_fakecuda.sh

$(FAKECUDA_LIB): $(fakecuda_sources:%=$(srcdir)/%) $(fakecuda_headers:%=$(srcdir)/%) \
		$(fakecuda_deps:%=$(srcdir)/%) $(fakecuda_lib_sources:%=$(srcdir)/%)
	@$(MKDIR_P) tests/fakecuda
	$(AM_V_CCLD)$(CC) $(DEFS) $(AM_CPPFLAGS) $(CPPFLAGS) $(CUDA_CPPFLAGS) \
		-I$(srcdir)/tests/progs $(SHIM_INCLUDES) -I$(srcdir)/lib $(AM_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden \
		-shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -Wl,-z,defs -o $@ \
		$(fakecuda_sources:%=$(srcdir)/%) $(fakecuda_lib_sources:%=$(srcdir)/%) $(AM_LDFLAGS) $(LDFLAGS) -pthread

noinst_PROGRAMS += tests/fakecuda/fakesmi
tests_fakecuda_fakesmi_SOURCES = tests/fakecuda/fakesmi.c
tests_fakecuda_fakesmi_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/lib
tests_fakecuda_fakesmi_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 -l:libnvidia-ml.so.1
EXTRA_tests_fakecuda_fakesmi_DEPENDENCIES = $(FAKECUDA_LIB) $(FAKENVML_LIB)

# The driver's own semantics, run by test_fakecuda.sh (which points LD_LIBRARY_PATH at the fake).
noinst_PROGRAMS += tests/fakecuda/test-fakecuda-api
tests_fakecuda_test_fakecuda_api_SOURCES = tests/fakecuda/test_fakecuda_api.c
tests_fakecuda_test_fakecuda_api_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(SHIM_INCLUDES)
tests_fakecuda_test_fakecuda_api_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1
EXTRA_tests_fakecuda_test_fakecuda_api_DEPENDENCIES = $(FAKECUDA_LIB)

TESTS += tests/fakecuda/test_fakecuda.sh

# The stand-in NVML (libnvidia-ml.so.1, the name gcr_nvml dlopens) beside the stand-in driver:
# it reads the pool the driver writes, so the restore room check sees what the fake GPU holds.
FAKENVML_LIB = tests/fakecuda/libnvidia-ml.so.1
noinst_DATA += $(FAKENVML_LIB)
CLEANFILES += $(FAKENVML_LIB)
EXTRA_DIST += tests/fakecuda/fakenvml.c tests/fakecuda/fakecuda_pool.h

$(FAKENVML_LIB): $(srcdir)/tests/fakecuda/fakenvml.c $(srcdir)/tests/fakecuda/fakecuda_pool.h \
		$(srcdir)/lib/gcr_nvml_abi.h
	@$(MKDIR_P) tests/fakecuda
	$(AM_V_CCLD)$(CC) $(DEFS) $(AM_CPPFLAGS) $(CPPFLAGS) -I$(srcdir)/lib -I$(srcdir)/tests/fakecuda \
		$(AM_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden -shared -Wl,-soname,libnvidia-ml.so.1 \
		-Wl,-z,defs -o $@ $(srcdir)/tests/fakecuda/fakenvml.c $(AM_LDFLAGS) $(LDFLAGS) -pthread
