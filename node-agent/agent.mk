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
