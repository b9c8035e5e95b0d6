# tests/unit/: one test binary per module of lib/ and shim/.
check_PROGRAMS += tests/unit/test_proto tests/unit/test_sock tests/unit/test_gate tests/unit/test_scale
TESTS += tests/unit/test_proto tests/unit/test_sock tests/unit/test_gate tests/unit/test_scale tests/unit/test_shim_exports.sh
tests_unit_test_proto_SOURCES = tests/unit/test_proto.c
tests_unit_test_proto_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_proto_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)
tests_unit_test_sock_SOURCES = tests/unit/test_sock.c
tests_unit_test_sock_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_sock_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)
EXTRA_DIST += tests/unit/test_shim_exports.sh
# The gate is tested inside a program built from the shim's own sources.
tests_unit_test_gate_SOURCES = tests/unit/test_gate.c $(SHIM_CORE_SOURCES)
tests_unit_test_gate_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit -I$(srcdir)/shim $(CUDA_CPPFLAGS) $(JANSSON_CFLAGS)
tests_unit_test_gate_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
# The scale-to-zero policy (lib/gcr_scale, in libgcrcontrol).
tests_unit_test_scale_SOURCES = tests/unit/test_scale.c
tests_unit_test_scale_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_scale_LDADD = lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl
