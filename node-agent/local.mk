# node-agent/: gcrctl (one machine, no Kubernetes) and gcr-agent (the node daemon).
include $(srcdir)/node-agent/agent.mk
