# tests/unit/agent.mk: one test binary per libgcragent module.
AGENT_UNIT_TESTS = \
	tests/unit/test_agent_cgroup \
	tests/unit/test_agent_config \
	tests/unit/test_agent_kubeconfig \
	tests/unit/test_agent_watch \
	tests/unit/test_agent_registry \
	tests/unit/test_agent_metrics \
	tests/unit/test_agent_activity \
	tests/unit/test_agent_record \
	tests/unit/test_agent_images \
	tests/unit/test_agent_victims \
	tests/unit/test_agent_roommsg \
	tests/unit/test_agent_evictmsg \
	tests/unit/test_agent_ocidist \
	tests/unit/test_agent_share \
	tests/unit/test_agent_roompolicy \
	tests/unit/test_agent_quantity \
	tests/unit/test_agent_phase \
	tests/unit/test_agent_podspec \
	tests/unit/test_agent_workq \
	tests/unit/test_agent_informer \
	tests/unit/test_agent_opts
check_PROGRAMS += $(AGENT_UNIT_TESTS)
TESTS += $(AGENT_UNIT_TESTS)

AGENT_TEST_CPPFLAGS = $(AM_CPPFLAGS) $(AGENT_INCLUDES) -I$(top_srcdir)/tests/unit
AGENT_TEST_CFLAGS = $(AM_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS)
AGENT_TEST_LDADD = node-agent/libgcragent.la

tests_unit_test_agent_cgroup_SOURCES = tests/unit/test_agent_cgroup.c
tests_unit_test_agent_cgroup_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_cgroup_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_cgroup_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_config_SOURCES = tests/unit/test_agent_config.c
tests_unit_test_agent_config_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_config_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_config_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_kubeconfig_SOURCES = tests/unit/test_agent_kubeconfig.c
tests_unit_test_agent_kubeconfig_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_kubeconfig_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_kubeconfig_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_watch_SOURCES = tests/unit/test_agent_watch.c
tests_unit_test_agent_watch_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_watch_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_watch_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

tests_unit_test_agent_record_SOURCES = tests/unit/test_agent_record.c
tests_unit_test_agent_record_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_record_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_record_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

tests_unit_test_agent_images_SOURCES = tests/unit/test_agent_images.c
tests_unit_test_agent_images_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_images_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_images_LDADD = $(AGENT_TEST_LDADD) lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl

tests_unit_test_agent_victims_SOURCES = tests/unit/test_agent_victims.c
tests_unit_test_agent_victims_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_victims_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_victims_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_roommsg_SOURCES = tests/unit/test_agent_roommsg.c
tests_unit_test_agent_roommsg_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_roommsg_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_roommsg_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

tests_unit_test_agent_ocidist_SOURCES = tests/unit/test_agent_ocidist.c
tests_unit_test_agent_ocidist_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_ocidist_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_ocidist_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

# The registry's transport and TLS identity (node-agent/libgcrreg.la), a GnuTLS client playing containerd.
check_PROGRAMS += tests/unit/test_agent_ocisrv
TESTS += tests/unit/test_agent_ocisrv
tests_unit_test_agent_ocisrv_SOURCES = tests/unit/test_agent_ocisrv.c
tests_unit_test_agent_ocisrv_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_ocisrv_CFLAGS = $(AGENT_TEST_CFLAGS) $(GNUTLS_CFLAGS)
tests_unit_test_agent_ocisrv_LDADD = node-agent/libgcrreg.la $(AGENT_TEST_LDADD) $(GNUTLS_LIBS) $(JANSSON_LIBS)

tests_unit_test_agent_share_SOURCES = tests/unit/test_agent_share.c
tests_unit_test_agent_share_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_share_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_share_LDADD = $(AGENT_TEST_LDADD) -lpthread

tests_unit_test_agent_roompolicy_SOURCES = tests/unit/test_agent_roompolicy.c
tests_unit_test_agent_roompolicy_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_roompolicy_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_roompolicy_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_quantity_SOURCES = tests/unit/test_agent_quantity.c
tests_unit_test_agent_quantity_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_quantity_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_quantity_LDADD = $(AGENT_TEST_LDADD)

tests_unit_test_agent_phase_SOURCES = tests/unit/test_agent_phase.c
tests_unit_test_agent_phase_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_phase_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_phase_LDADD = $(AGENT_TEST_LDADD)

# The agent's daemon modules, compiled into their tests from source.
tests_unit_test_agent_registry_SOURCES = tests/unit/test_agent_registry.c node-agent/node/agent_registry.c
tests_unit_test_agent_registry_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_registry_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_registry_LDADD = $(AGENT_TEST_LDADD) lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl

tests_unit_test_agent_activity_SOURCES = tests/unit/test_agent_activity.c node-agent/node/agent_activity.c \
	node-agent/node/agent_registry.c
tests_unit_test_agent_activity_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_activity_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_activity_LDADD = $(AGENT_TEST_LDADD) lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl -lm

tests_unit_test_agent_metrics_SOURCES = tests/unit/test_agent_metrics.c node-agent/node/agent_metrics.c
tests_unit_test_agent_metrics_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_metrics_CFLAGS = $(AGENT_TEST_CFLAGS) $(CURL_CFLAGS) $(MHD_CFLAGS)
tests_unit_test_agent_metrics_LDADD = $(AGENT_TEST_LDADD) $(CURL_LIBS) $(MHD_LIBS)

# Sample inputs the tests read through $top_srcdir.
EXTRA_DIST += \
	tests/unit/data/kubeconfig/kind.yaml \
	tests/unit/data/kubeconfig/files.yaml \
	tests/unit/data/kubeconfig/token \
	tests/unit/data/serviceaccount/ca.crt \
	tests/unit/data/serviceaccount/namespace \
	tests/unit/data/serviceaccount/token

# The libFuzzer targets of these modules, built and run by tests/fuzz/run.sh
# (clang only, so not part of the automake build).
EXTRA_DIST += \
	tests/fuzz/run.sh \
	tests/fuzz/fuzz_cgroup.c tests/fuzz/fuzz_kubeconfig.c tests/fuzz/fuzz_watch.c \
	tests/fuzz/dict/fuzz_cgroup.dict tests/fuzz/dict/fuzz_kubeconfig.dict \
	tests/fuzz/dict/fuzz_watch.dict \
	tests/fuzz/corpus/fuzz_cgroup tests/fuzz/corpus/fuzz_kubeconfig tests/fuzz/corpus/fuzz_watch \
	tests/fuzz/fuzz_dpmsg.c tests/fuzz/dict/fuzz_dpmsg.dict tests/fuzz/corpus/fuzz_dpmsg \
	tests/fuzz/fuzz_scalemsg.c tests/fuzz/dict/fuzz_scalemsg.dict tests/fuzz/corpus/fuzz_scalemsg \
	tests/fuzz/fuzz_criu.c tests/fuzz/corpus/fuzz_criu \
	tests/fuzz/fuzz_ocipath.c tests/fuzz/dict/fuzz_ocipath.dict tests/fuzz/corpus/fuzz_ocipath \
	tests/fuzz/fuzz_ocihead.c tests/fuzz/dict/fuzz_ocihead.dict tests/fuzz/corpus/fuzz_ocihead

# The device plugin's messages (node-agent/libgcrdp.la); the plugin itself is tested
# against the Go kubelet stand-in by tests/dp/test_deviceplugin.sh.
check_PROGRAMS += tests/unit/test_agent_dpmsg
TESTS += tests/unit/test_agent_dpmsg
tests_unit_test_agent_dpmsg_SOURCES = tests/unit/test_agent_dpmsg.c
tests_unit_test_agent_dpmsg_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_dpmsg_CFLAGS = $(AM_CFLAGS) $(PROTOBUF_C_CFLAGS)
tests_unit_test_agent_dpmsg_LDADD = node-agent/libgcrdp.la $(PROTOBUF_C_LIBS)
EXTRA_DIST += tests/dp/test_deviceplugin.sh \
	tests/k8s/kubelet-standin/go.mod tests/k8s/kubelet-standin/go.sum \
	tests/k8s/kubelet-standin/main.go

tests_unit_test_agent_evictmsg_SOURCES = tests/unit/test_agent_evictmsg.c
tests_unit_test_agent_evictmsg_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_evictmsg_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_evictmsg_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

tests_unit_test_agent_podspec_SOURCES = tests/unit/test_agent_podspec.c
tests_unit_test_agent_podspec_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_podspec_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_podspec_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS)

tests_unit_test_agent_workq_SOURCES = tests/unit/test_agent_workq.c
tests_unit_test_agent_workq_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_workq_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_workq_LDADD = $(AGENT_TEST_LDADD) -lpthread

# The shared mirrors with the objmap and kube client beneath them (gcr-agent's, not the library's),
# fed by the test: no watch thread runs.
tests_unit_test_agent_informer_SOURCES = tests/unit/test_agent_informer.c \
	node-agent/kube/agent_informer.c node-agent/kube/agent_objmap.c node-agent/kube/agent_kube.c
tests_unit_test_agent_informer_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_informer_CFLAGS = $(AGENT_TEST_CFLAGS) $(CURL_CFLAGS)
tests_unit_test_agent_informer_LDADD = $(AGENT_TEST_LDADD) $(JANSSON_LIBS) $(CURL_LIBS) -lpthread

tests_unit_test_agent_opts_SOURCES = tests/unit/test_agent_opts.c
tests_unit_test_agent_opts_CPPFLAGS = $(AGENT_TEST_CPPFLAGS)
tests_unit_test_agent_opts_CFLAGS = $(AGENT_TEST_CFLAGS)
tests_unit_test_agent_opts_LDADD = $(AGENT_TEST_LDADD)
