# lib/: code shared by the shim, gcrctl and the agent (errors, logs, the control
# protocol, Unix sockets). Built PIC so it can go into libgcr.so.
noinst_LTLIBRARIES += lib/libgcrcommon.la
lib_libgcrcommon_la_SOURCES = \
	lib/gcr_error.c lib/gcr_error.h \
	lib/gcr_log.c lib/gcr_log.h \
	lib/gcr_proto.c lib/gcr_proto.h \
	lib/gcr_sock.c lib/gcr_sock.h \
	lib/gcr_time.c lib/gcr_time.h \
	lib/gcr_meminfo.c lib/gcr_meminfo.h \
	lib/gcr_crc32c.c lib/gcr_crc32c.h \
	lib/gcr_sha256.c lib/gcr_sha256.h \
	lib/gcr_imagemac.c lib/gcr_imagemac.h \
	lib/gcr_image.c lib/gcr_image.h \
	lib/gcr_groupmsg.c lib/gcr_groupmsg.h \
	lib/gcr_uuid.c lib/gcr_uuid.h \
	lib/gcr_jsonbudget.c lib/gcr_jsonbudget.h \
	include/gcr/protocol.h
lib_libgcrcommon_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden $(JANSSON_CFLAGS)

# What gcrctl and the agent use to drive a process: the shim's client, the
# driver's checkpoint API (dlopen'd; cuda.h for prototypes only), CRIU (for AMD
# processes: docs/amd.md) and the flow.
noinst_LTLIBRARIES += lib/libgcrcontrol.la
lib_libgcrcontrol_la_SOURCES = \
	lib/gcr_client.c lib/gcr_client.h \
	lib/gcr_procns.c lib/gcr_procns.h \
	lib/gcr_driver.c lib/gcr_driver.h \
	lib/gcr_nvml.c lib/gcr_nvml.h lib/gcr_nvml_abi.h \
	lib/gcr_criu.c lib/gcr_criu.h \
	lib/gcr_ctrdump.c lib/gcr_ctrdump.h \
	lib/gcr_imgcr.c lib/gcr_imgcr.h \
	lib/gcr_cr.c lib/gcr_cr.h \
	lib/gcr_group.c lib/gcr_group.h \
	lib/gcr_scale.c lib/gcr_scale.h \
	lib/gcr_shimreply.c lib/gcr_shimreply.h
lib_libgcrcontrol_la_CPPFLAGS = $(AM_CPPFLAGS) $(CUDA_CPPFLAGS) $(JANSSON_CFLAGS)
lib_libgcrcontrol_la_LIBADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
# The manifest parser's libFuzzer target (tests/fuzz/run.sh builds and runs it).
EXTRA_DIST += tests/fuzz/fuzz_manifest.c tests/fuzz/dict/fuzz_manifest.dict tests/fuzz/corpus/fuzz_manifest
# A shared image's signed manifest (lib/gcr_imagemac.c), with and without the key.
EXTRA_DIST += tests/fuzz/fuzz_imagemac.c tests/fuzz/corpus/fuzz_imagemac
# The container status parser's libFuzzer target (lib/gcr_ctrdump.c).
EXTRA_DIST += tests/fuzz/fuzz_ctrdump.c tests/fuzz/corpus/fuzz_ctrdump
