# tests/fakenccl/: the stand-in NCCL (libnccl.so.2 over the stand-in driver, for CI without a
# GPU): ranks in separate processes meet over Unix sockets, collectives block until every rank
# has joined, and each communicator shares device memory with its peers as NCCL does.

FAKENCCL_LIB = tests/fakenccl/libnccl.so.2
noinst_DATA += $(FAKENCCL_LIB)
CLEANFILES += $(FAKENCCL_LIB)
EXTRA_DIST += tests/fakenccl/fakenccl.c

# A plain rule, named exactly libnccl.so.2 (the soname the shim looks for). Not -Bsymbolic: like
# NCCL, the library reaches some of its own public names through the PLT, where a preloaded
# shim's wrappers catch them.
$(FAKENCCL_LIB): $(srcdir)/tests/fakenccl/fakenccl.c $(srcdir)/shim/nccl/shim_nccl_abi.h $(FAKECUDA_LIB)
	@$(MKDIR_P) tests/fakenccl
	$(AM_V_CCLD)$(CC) $(DEFS) $(AM_CPPFLAGS) $(CPPFLAGS) $(CUDA_CPPFLAGS) -I$(srcdir)/shim/nccl \
		$(AM_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden -shared -Wl,-soname,libnccl.so.2 -Wl,-z,defs \
		-o $@ $(srcdir)/tests/fakenccl/fakenccl.c -L$(top_builddir)/tests/fakecuda -l:libcuda.so.1 \
		$(AM_LDFLAGS) $(LDFLAGS) -pthread
