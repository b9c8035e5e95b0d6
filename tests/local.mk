# tests/: unit tests, the stand-in CUDA driver, test programs and flow tests.
include $(srcdir)/tests/fakecuda/local.mk
include $(srcdir)/tests/fakehip/local.mk
include $(srcdir)/tests/fakenccl/local.mk
include $(srcdir)/tests/progs/local.mk
include $(srcdir)/tests/unit/local.mk
include $(srcdir)/tests/unit/agent.mk
include $(srcdir)/tests/flow/local.mk
EXTRA_DIST += tests/unit/util.h
include $(srcdir)/tests/bench/local.mk
