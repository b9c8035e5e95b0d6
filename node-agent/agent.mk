# node-agent/agent.mk: libgcragent, the gcr-agent's pure modules (input parsers
# for /proc/<pid>/cgroup, the agent's config file, kubeconfig, the watch stream, the
# scaler's selectors and activity notes, Checkpoint/Restore objects and their phases, the
# agent's own records), linked by the agent and its tests.
noinst_LTLIBRARIES += node-agent/libgcragent.la
node_agent_libgcragent_la_SOURCES = \
	node-agent/node/agent_cgroup.c node-agent/node/agent_cgroup.h \
	node-agent/daemon/agent_config.c node-agent/daemon/agent_config.h \
	node-agent/daemon/agent_opts.c node-agent/daemon/agent_opts.h \
	node-agent/node/agent_ocidist.c node-agent/node/agent_ocidist.h \
	node-agent/node/agent_share.c node-agent/node/agent_share.h \
	node-agent/kube/agent_kubeconfig.c node-agent/kube/agent_kubeconfig.h \
	node-agent/kube/agent_watch.c node-agent/kube/agent_watch.h \
	node-agent/kube/agent_quantity.c node-agent/kube/agent_quantity.h \
	node-agent/kube/agent_phase.c node-agent/kube/agent_phase.h \
	node-agent/kube/agent_podspec.c node-agent/kube/agent_podspec.h \
	node-agent/kube/agent_workq.c node-agent/kube/agent_workq.h \
	node-agent/msg/agent_scalemsg.c node-agent/msg/agent_scalemsg.h \
	node-agent/controller/agent_crobj.c node-agent/controller/agent_crobj.h \
	node-agent/controller/agent_record.c node-agent/controller/agent_record.h \
	node-agent/controller/agent_images.c node-agent/controller/agent_images.h \
	node-agent/msg/agent_roommsg.c node-agent/msg/agent_roommsg.h \
	node-agent/overcommit/agent_roompolicy.c node-agent/overcommit/agent_roompolicy.h \
	node-agent/overcommit/agent_victims.c node-agent/overcommit/agent_victims.h \
	node-agent/msg/agent_evictmsg.c node-agent/msg/agent_evictmsg.h
node_agent_libgcragent_la_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES)
node_agent_libgcragent_la_CFLAGS = $(AM_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS)
node_agent_libgcragent_la_LIBADD = lib/libgcrcommon.la $(JANSSON_LIBS) $(YAML_LIBS)

# gcr-agent: the node daemon (kube client, shim registry, controller, metrics, and the
# device plugin from libgcrdp below).
bin_PROGRAMS += node-agent/gcr-agent
node_agent_gcr_agent_SOURCES = \
	node-agent/daemon/agent_main.c \
	node-agent/kube/agent_kube.c node-agent/kube/agent_kube.h \
	node-agent/node/agent_registry.c node-agent/node/agent_registry.h \
	node-agent/controller/agent_controller.c node-agent/controller/agent_controller.h \
	node-agent/controller/agent_ctl.h node-agent/controller/agent_ctl_suspend.c \
	node-agent/controller/agent_ctl_image.c node-agent/controller/agent_ctl_restore.c \
	node-agent/controller/agent_ctl_podrestore.c \
	node-agent/controller/agent_ckimage.c node-agent/controller/agent_ckimage.h \
	node-agent/kube/agent_lease.c node-agent/kube/agent_lease.h \
	node-agent/kube/agent_leader.c node-agent/kube/agent_leader.h \
	node-agent/kube/agent_objmap.c node-agent/kube/agent_objmap.h \
	node-agent/kube/agent_informer.c node-agent/kube/agent_informer.h \
	node-agent/scaler/agent_scaler.c node-agent/scaler/agent_scaler.h \
	node-agent/scaler/agent_scaler_int.h node-agent/scaler/agent_scaler_status.c \
	node-agent/scaler/agent_gate.c node-agent/scaler/agent_gate.h \
	node-agent/scaler/agent_replace.c node-agent/scaler/agent_replace.h \
	node-agent/node/agent_activity.c node-agent/node/agent_activity.h \
	node-agent/node/agent_metrics.c node-agent/node/agent_metrics.h \
	node-agent/node/agent_ocireg.c node-agent/node/agent_ocireg.h \
	node-agent/overcommit/agent_room.c node-agent/overcommit/agent_room.h \
	node-agent/overcommit/agent_room_int.h node-agent/overcommit/agent_room_request.c \
	node-agent/overcommit/agent_room_hold.c \
	node-agent/evict/agent_evict.c node-agent/evict/agent_evict.h
node_agent_gcr_agent_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES)
node_agent_gcr_agent_CFLAGS = $(AM_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS) $(CURL_CFLAGS) $(MHD_CFLAGS) \
	$(GNUTLS_CFLAGS)
node_agent_gcr_agent_LDADD = node-agent/libgcragent.la node-agent/libgcrreg.la node-agent/libgcrdp.la \
	lib/libgcrcontrol.la $(JANSSON_LIBS) $(YAML_LIBS) $(CURL_LIBS) $(MHD_LIBS) $(GNUTLS_LIBS) -ldl

# The checkpoint-image registry's transport (TLS with GnuTLS: agent_regtls, agent_ocisrv) and the
# node's image store through the CRI (gRPC core, protobuf-c messages generated from cri.proto
# at build time, below). A library of their own so that their unit tests link them without the
# kube client.
noinst_LTLIBRARIES += node-agent/libgcrreg.la
node_agent_libgcrreg_la_SOURCES = \
	node-agent/node/agent_regtls.c node-agent/node/agent_regtls.h \
	node-agent/node/agent_ocisrv.c node-agent/node/agent_ocisrv.h \
	node-agent/node/agent_cristore.c node-agent/node/agent_cristore.h
nodist_node_agent_libgcrreg_la_SOURCES = node-agent/node/cri.pb-c.c node-agent/node/cri.pb-c.h
node_agent_libgcrreg_la_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES)
node_agent_libgcrreg_la_CFLAGS = $(AM_CFLAGS) $(GNUTLS_CFLAGS) $(GRPC_CFLAGS) $(PROTOBUF_C_CFLAGS)
node_agent_libgcrreg_la_LIBADD = node-agent/libgcragent.la lib/libgcrcommon.la $(GNUTLS_LIBS) $(GRPC_LIBS) \
	$(PROTOBUF_C_LIBS)
EXTRA_DIST += node-agent/node/cri.proto
# gcr-hold: a pod's preStop hook (eviction imaging), shipped beside the shim in /opt/gcr/lib
# (scripts/image-stage.sh). Static and libc-only, so it runs in any container image; hence
# no sanitizers either (they cannot link statically).
bin_PROGRAMS += node-agent/gcr-hold
node_agent_gcr_hold_SOURCES = node-agent/evict/gcr-hold.c
node_agent_gcr_hold_CPPFLAGS = -D_GNU_SOURCE
node_agent_gcr_hold_CFLAGS = -std=c11 $(WARN_CFLAGS)
node_agent_gcr_hold_LDFLAGS = -all-static

# The kubelet device plugin: protobuf-c messages generated at build time (below) from the
# kubelet's api.proto (committed, see scripts/gen-deviceplugin-proto.sh) and gRPC core.
noinst_LTLIBRARIES += node-agent/libgcrdp.la
node_agent_libgcrdp_la_SOURCES = \
	node-agent/deviceplugin/agent_dpmsg.c node-agent/deviceplugin/agent_dpmsg.h \
	node-agent/deviceplugin/agent_deviceplugin.c node-agent/deviceplugin/agent_deviceplugin.h
nodist_node_agent_libgcrdp_la_SOURCES = node-agent/deviceplugin/api.pb-c.c node-agent/deviceplugin/api.pb-c.h
node_agent_libgcrdp_la_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES)
node_agent_libgcrdp_la_CFLAGS = $(AM_CFLAGS) $(GRPC_CFLAGS) $(PROTOBUF_C_CFLAGS)
node_agent_libgcrdp_la_LIBADD = lib/libgcrcommon.la $(GRPC_LIBS) $(PROTOBUF_C_LIBS)
EXTRA_DIST += node-agent/deviceplugin/api.proto scripts/gen-deviceplugin-proto.sh

# The device plugin alone, for tests (tests/dp/test_deviceplugin.sh).
noinst_PROGRAMS += node-agent/gcr-dp-standalone
node_agent_gcr_dp_standalone_SOURCES = node-agent/deviceplugin/gcr-dp-standalone.c
node_agent_gcr_dp_standalone_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES)
node_agent_gcr_dp_standalone_LDADD = node-agent/libgcrdp.la

# The protobuf-c code of the .proto files above, made in the build tree (the .proto files are
# the only sources; scripts/protoc-c.sh). BUILT_SOURCES makes them before any object that
# includes them (agent_dpmsg.h, agent_cristore.c); the build tree's folders are in AGENT_INCLUDES.
# One run writes both files: the .h follows the .c, and is made again if it alone is gone.
PROTOC_C_GEN = $(AM_V_GEN)PROTOC_C='$(PROTOC_C)' $(SHELL) $(srcdir)/scripts/protoc-c.sh
PB_C_FILES = node-agent/node/cri.pb-c.c node-agent/node/cri.pb-c.h \
	node-agent/deviceplugin/api.pb-c.c node-agent/deviceplugin/api.pb-c.h
BUILT_SOURCES += $(PB_C_FILES)
CLEANFILES += $(PB_C_FILES)
EXTRA_DIST += scripts/protoc-c.sh
node-agent/node/cri.pb-c.c: $(srcdir)/node-agent/node/cri.proto $(srcdir)/scripts/protoc-c.sh
	$(PROTOC_C_GEN) $(srcdir)/node-agent/node/cri.proto node-agent/node
node-agent/node/cri.pb-c.h: node-agent/node/cri.pb-c.c
	@test -f $@ || { rm -f node-agent/node/cri.pb-c.c && $(MAKE) $(AM_MAKEFLAGS) node-agent/node/cri.pb-c.c; }
node-agent/deviceplugin/api.pb-c.c: $(srcdir)/node-agent/deviceplugin/api.proto $(srcdir)/scripts/protoc-c.sh
	$(PROTOC_C_GEN) $(srcdir)/node-agent/deviceplugin/api.proto node-agent/deviceplugin
node-agent/deviceplugin/api.pb-c.h: node-agent/deviceplugin/api.pb-c.c
	@test -f $@ || { rm -f node-agent/deviceplugin/api.pb-c.c && \
		$(MAKE) $(AM_MAKEFLAGS) node-agent/deviceplugin/api.pb-c.c; }
