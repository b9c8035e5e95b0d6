# node-agent/agent.mk: libgcragent, the gcr-agent's pure modules (input parsers
# for /proc/<pid>/cgroup, kubeconfig and the watch stream), linked by the agent and its tests.
noinst_LTLIBRARIES += node-agent/libgcragent.la
node_agent_libgcragent_la_SOURCES = \
	node-agent/agent_cgroup.c node-agent/agent_cgroup.h \
	node-agent/agent_kubeconfig.c node-agent/agent_kubeconfig.h \
	node-agent/agent_watch.c node-agent/agent_watch.h
node_agent_libgcragent_la_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/node-agent
node_agent_libgcragent_la_CFLAGS = $(AM_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS)
node_agent_libgcragent_la_LIBADD = lib/libgcrcommon.la $(JANSSON_LIBS) $(YAML_LIBS)

# gcr-agent: the node daemon (kube client, shim registry, controller, metrics).
bin_PROGRAMS += node-agent/gcr-agent
node_agent_gcr_agent_SOURCES = \
	node-agent/agent_main.c \
	node-agent/agent_kube.c node-agent/agent_kube.h \
	node-agent/agent_registry.c node-agent/agent_registry.h \
	node-agent/agent_controller.c node-agent/agent_controller.h \
	node-agent/agent_metrics.c node-agent/agent_metrics.h
node_agent_gcr_agent_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/node-agent
node_agent_gcr_agent_CFLAGS = $(AM_CFLAGS) $(JANSSON_CFLAGS) $(YAML_CFLAGS) $(CURL_CFLAGS) $(MHD_CFLAGS)
node_agent_gcr_agent_LDADD = node-agent/libgcragent.la lib/libgcrcontrol.la \
	$(JANSSON_LIBS) $(YAML_LIBS) $(CURL_LIBS) $(MHD_LIBS) -ldl
