# node-agent/: gcrctl (one machine, no Kubernetes) and gcr-agent (the node daemon).
bin_PROGRAMS += node-agent/gcrctl
node_agent_gcrctl_SOURCES = node-agent/cli/gcrctl.c
node_agent_gcrctl_CPPFLAGS = $(AM_CPPFLAGS) $(JANSSON_CFLAGS)
node_agent_gcrctl_LDADD = lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl

include $(srcdir)/node-agent/agent.mk
