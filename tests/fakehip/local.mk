# tests/fakehip/: the stand-in HIP runtime (libamdhip64.so.5 on host memory, for CI without an
# AMD GPU) and fakehipsmi to inspect and drive it. Built against Debian's HIP headers.

FAKEHIP_LIB = tests/fakehip/libamdhip64.so.5
fakehip_sources = tests/fakehip/fakehip.c
fakehip_headers = tests/fakehip/fakehip.h

# A plain rule, not libtool: the file must carry the soname the shim dlopens. -Bsymbolic keeps
# the stand-in's own calls on its own functions when a preloaded shim exports the same names.
noinst_DATA += $(FAKEHIP_LIB)
CLEANFILES += $(FAKEHIP_LIB)
EXTRA_DIST += $(fakehip_sources) $(fakehip_headers)

$(FAKEHIP_LIB): $(fakehip_sources:%=$(srcdir)/%) $(fakehip_headers:%=$(srcdir)/%)
	@$(MKDIR_P) tests/fakehip
	$(AM_V_CCLD)$(CC) $(DEFS) $(AM_CPPFLAGS) $(CPPFLAGS) $(HIP_CPPFLAGS) \
		$(AM_CFLAGS) $(CFLAGS) -fPIC -fvisibility=hidden \
		-shared -Wl,-soname,libamdhip64.so.5 -Wl,-Bsymbolic -Wl,-z,defs -o $@ \
		$(fakehip_sources:%=$(srcdir)/%) $(AM_LDFLAGS) $(LDFLAGS) -pthread

noinst_PROGRAMS += tests/fakehip/fakehipsmi
tests_fakehip_fakehipsmi_SOURCES = tests/fakehip/fakehipsmi.c tests/fakehip/fakehip.h
tests_fakehip_fakehipsmi_CPPFLAGS = $(AM_CPPFLAGS) $(HIP_CPPFLAGS)
