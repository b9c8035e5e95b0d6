# lib/: code shared by the shim, gcrctl and the agent (errors, logs, the control
# protocol, Unix sockets). Built PIC so it can go into libgcr.so.
noinst_LTLIBRARIES += lib/libgcrcommon.la
lib_libgcrcommon_la_SOURCES = \
	lib/gcr_error.c lib/gcr_error.h \
	lib/gcr_log.c lib/gcr_log.h \
	lib/gcr_proto.c lib/gcr_proto.h \
	lib/gcr_sock.c lib/gcr_sock.h \
	include/gcr/protocol.h
lib_libgcrcommon_la_CFLAGS = $(AM_CFLAGS) -fvisibility=hidden $(JANSSON_CFLAGS)
