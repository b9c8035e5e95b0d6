# tests/fakecuda/: the stand-in CUDA driver (libcuda.so.1 on host memory, for CI without a GPU),
# fakesmi to inspect and drive it, and its self-test.

FAKECUDA_LIB = tests/fakecuda/libcuda.so.1
fakecuda_sources = \
	tests/fakecuda/fakecuda_core.c \
	tests/fakecuda/fakecuda_mem.c \
	tests/fakecuda/fakecuda_copy.c \
	tests/fakecuda/fakecuda_exec.c \
	tests/fakecuda/fakecuda_ckpt.c \
	tests/fakecuda/fakecuda_procaddr.c
fakecuda_headers = tests/fakecuda/fakecuda.h tests/progs/gcr_kernels.h
# The digest math the stand-in's gcr_chunk_digest shares with the shim (distributed with shim/),
# and lib/'s way into another namespace's files, which the checkpoint client shares with gcrctl.
fakecuda_deps = shim/shim_digest_math.h lib/gcr_procns.h lib/gcr_error.h
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
		-I$(srcdir)/tests/progs -I$(srcdir)/shim -I$(srcdir)/lib $(AM_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden \
		-shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -Wl,-z,defs -o $@ \
		$(fakecuda_sources:%=$(srcdir)/%) $(fakecuda_lib_sources:%=$(srcdir)/%) $(AM_LDFLAGS) $(LDFLAGS) -pthread

noinst_PROGRAMS += tests/fakecuda/fakesmi
tests_fakecuda_fakesmi_SOURCES = tests/fakecuda/fakesmi.c
tests_fakecuda_fakesmi_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS)
tests_fakecuda_fakesmi_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1
EXTRA_tests_fakecuda_fakesmi_DEPENDENCIES = $(FAKECUDA_LIB)

# The driver's own semantics, run by test_fakecuda.sh (which points LD_LIBRARY_PATH at the fake).
noinst_PROGRAMS += tests/fakecuda/test-fakecuda-api
tests_fakecuda_test_fakecuda_api_SOURCES = tests/fakecuda/test_fakecuda_api.c
tests_fakecuda_test_fakecuda_api_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/shim
tests_fakecuda_test_fakecuda_api_LDADD = -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1
EXTRA_tests_fakecuda_test_fakecuda_api_DEPENDENCIES = $(FAKECUDA_LIB)

TESTS += tests/fakecuda/test_fakecuda.sh
