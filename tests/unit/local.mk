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
tests_unit_test_gate_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(SHIM_INCLUDES) $(CUDA_CPPFLAGS) $(HIP_CPPFLAGS) $(JANSSON_CFLAGS)
tests_unit_test_gate_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
# The gate's per-thread records are freed at thread exit: 100k threads, bounded memory.
check_PROGRAMS += tests/unit/test_thread_churn
TESTS += tests/unit/test_thread_churn
tests_unit_test_thread_churn_SOURCES = tests/unit/test_thread_churn.c $(SHIM_CORE_SOURCES)
tests_unit_test_thread_churn_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_thread_churn_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
# The layering rules of docs/architecture.md, checked on the sources.
TESTS += tests/unit/test_architecture.sh
EXTRA_DIST += tests/unit/test_architecture.sh
# Another dlsym(RTLD_NEXT) interposer beside the shim, in both preload orders; and the one
# line a shim that cannot serve prints.
TESTS += tests/unit/test_interpose.sh tests/unit/test_shim_notice.sh
EXTRA_DIST += tests/unit/test_interpose.sh tests/unit/test_shim_notice.sh tests/unit/test_thread_churn.c
# The scale-to-zero policy (lib/gcr_scale, in libgcrcontrol).
tests_unit_test_scale_SOURCES = tests/unit/test_scale.c
tests_unit_test_scale_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_scale_LDADD = lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl
# Checked reads of the shim's replies (lib/gcr_shimreply, in libgcrcontrol).
check_PROGRAMS += tests/unit/test_shimreply
TESTS += tests/unit/test_shimreply
tests_unit_test_shimreply_SOURCES = tests/unit/test_shimreply.c
tests_unit_test_shimreply_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_shimreply_LDADD = lib/libgcrcontrol.la $(JANSSON_LIBS) -ldl

# The HIP backend: its hook table, gate and allocation records, and its shim_gpu_ops, each
# inside a program built from the shim's sources, on the stand-in runtime (tests/fakehip).
check_PROGRAMS += tests/unit/test_shim_hip_hook tests/unit/test_shim_hip_ops tests/unit/hip-dlsym-check
# The CUDA operations table: each operation against the driver function it must call.
check_PROGRAMS += tests/unit/test_shim_cuda_ops
TESTS += tests/unit/test_shim_cuda_ops
tests_unit_test_shim_cuda_ops_SOURCES = tests/unit/test_shim_cuda_ops.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_cuda_ops_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_cuda_ops_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_cuda_ops_DEPENDENCIES = $(FAKECUDA_LIB)
TESTS += tests/unit/test_shim_hip_hook tests/unit/test_shim_hip_ops tests/unit/test_shim_hip_dlsym.sh
EXTRA_DIST += tests/unit/test_shim_hip_dlsym.sh tests/unit/hip_util.h tests/unit/gate_util.h
SHIM_TEST_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(SHIM_INCLUDES) $(CUDA_CPPFLAGS) $(HIP_CPPFLAGS) $(JANSSON_CFLAGS)
tests_unit_test_shim_hip_hook_SOURCES = tests/unit/test_shim_hip_hook.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_hip_hook_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_hip_hook_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_hip_hook_DEPENDENCIES = $(FAKEHIP_LIB)
tests_unit_test_shim_hip_ops_SOURCES = tests/unit/test_shim_hip_ops.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_hip_ops_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_hip_ops_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_hip_ops_DEPENDENCIES = $(FAKEHIP_LIB)
# The runtimes' loading (shim_real): what the shim does on a driver that lacks what it needs.
check_PROGRAMS += tests/unit/test_shim_real
TESTS += tests/unit/test_shim_real
tests_unit_test_shim_real_SOURCES = tests/unit/test_shim_real.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_real_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_real_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_real_DEPENDENCIES = $(FAKEHIP_LIB)
tests_unit_hip_dlsym_check_SOURCES = tests/unit/hip_dlsym_check.c
tests_unit_hip_dlsym_check_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(SHIM_INCLUDES)
tests_unit_hip_dlsym_check_LDADD = -ldl
EXTRA_tests_unit_hip_dlsym_check_DEPENDENCIES = $(FAKEHIP_LIB) shim/libgcr.la

# A container's CRIU dump (lib/gcr_ctrdump.c): status parser, init walk on a fake /proc.
check_PROGRAMS += tests/unit/test_ctrdump
TESTS += tests/unit/test_ctrdump
tests_unit_test_ctrdump_SOURCES = tests/unit/test_ctrdump.c
tests_unit_test_ctrdump_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_ctrdump_LDADD = lib/libgcrcontrol.la lib/libgcrcommon.la $(JANSSON_LIBS) -ldl

# CRIU detection and commands (lib/gcr_criu.c) against a fake criu script.
check_PROGRAMS += tests/unit/test_criu
TESTS += tests/unit/test_criu
EXTRA_DIST += tests/unit/fake-criu.sh
tests_unit_test_criu_SOURCES = tests/unit/test_criu.c
tests_unit_test_criu_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_criu_LDADD = lib/libgcrcontrol.la lib/libgcrcommon.la $(JANSSON_LIBS) -ldl

# The image checksum (lib/gcr_crc32c): known answers, instruction against table.
check_PROGRAMS += tests/unit/test_gcr_uuid
TESTS += tests/unit/test_gcr_uuid
tests_unit_test_gcr_uuid_SOURCES = tests/unit/test_gcr_uuid.c
tests_unit_test_gcr_uuid_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_gcr_uuid_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)

check_PROGRAMS += tests/unit/test_gcr_crc32c
TESTS += tests/unit/test_gcr_crc32c
tests_unit_test_gcr_crc32c_SOURCES = tests/unit/test_gcr_crc32c.c
tests_unit_test_gcr_crc32c_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_gcr_crc32c_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)

# Host memory and the memory cgroup (lib/gcr_meminfo): v2 and v1 layouts, no limit, page cache.
check_PROGRAMS += tests/unit/test_gcr_meminfo
TESTS += tests/unit/test_gcr_meminfo
tests_unit_test_gcr_meminfo_SOURCES = tests/unit/test_gcr_meminfo.c
tests_unit_test_gcr_meminfo_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit
tests_unit_test_gcr_meminfo_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)

# The image directory (lib/gcr_image): partial names, commit, verify's refusals.
check_PROGRAMS += tests/unit/test_gcr_image
TESTS += tests/unit/test_gcr_image
tests_unit_test_gcr_image_SOURCES = tests/unit/test_gcr_image.c
tests_unit_test_gcr_image_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_gcr_image_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)
check_PROGRAMS += tests/unit/test_gcr_jsonbudget
TESTS += tests/unit/test_gcr_jsonbudget
tests_unit_test_gcr_jsonbudget_SOURCES = tests/unit/test_gcr_jsonbudget.c
tests_unit_test_gcr_jsonbudget_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_gcr_jsonbudget_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -lpthread

# The suspend/resume flow and the combined process state (lib/gcr_cr, in libgcrcontrol)
# against a stand-in shim the test serves for its own pid; no GPU, no driver.
check_PROGRAMS += tests/unit/test_gcr_cr
TESTS += tests/unit/test_gcr_cr
tests_unit_test_gcr_cr_SOURCES = tests/unit/test_gcr_cr.c
tests_unit_test_gcr_cr_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_gcr_cr_LDADD = lib/libgcrcontrol.la lib/libgcrcommon.la $(JANSSON_LIBS) -ldl -lpthread

# The allocation table, the suspend/resume state machine and the staging data path, each in a
# program built from the shim's sources on the stand-in driver (tests/fakecuda).
check_PROGRAMS += tests/unit/test_shim_alloc tests/unit/test_shim_cr tests/unit/test_shim_staging
TESTS += tests/unit/test_shim_alloc tests/unit/test_shim_cr tests/unit/test_shim_staging
EXTRA_DIST += tests/unit/fakecuda_util.h
tests_unit_test_shim_alloc_SOURCES = tests/unit/test_shim_alloc.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_alloc_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_alloc_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_alloc_DEPENDENCIES = $(FAKECUDA_LIB)
tests_unit_test_shim_cr_SOURCES = tests/unit/test_shim_cr.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_cr_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_cr_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_cr_DEPENDENCIES = $(FAKECUDA_LIB)
tests_unit_test_shim_staging_SOURCES = tests/unit/test_shim_staging.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_staging_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_staging_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_staging_DEPENDENCIES = $(FAKECUDA_LIB)

# The stream-ordered arena (shim_pool) on fake GPU callbacks: no driver.
check_PROGRAMS += tests/unit/test_shim_pool
TESTS += tests/unit/test_shim_pool
tests_unit_test_shim_pool_SOURCES = tests/unit/test_shim_pool.c shim/core/shim_pool.c shim/core/shim_pool.h
tests_unit_test_shim_pool_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_pool_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -lpthread
# Stream-ordered allocation through the CUDA entry points, on the stand-in driver's pools.
check_PROGRAMS += tests/unit/test_shim_cuda_pool
TESTS += tests/unit/test_shim_cuda_pool
tests_unit_test_shim_cuda_pool_SOURCES = tests/unit/test_shim_cuda_pool.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_cuda_pool_CPPFLAGS = $(SHIM_TEST_CPPFLAGS) -I$(srcdir)/tests/fakecuda
tests_unit_test_shim_cuda_pool_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_cuda_pool_DEPENDENCIES = $(FAKECUDA_LIB)

# The shim's side of overcommit (shim_agent) against a scripted agent: no GPU, no driver.
check_PROGRAMS += tests/unit/test_shim_agent
TESTS += tests/unit/test_shim_agent
tests_unit_test_shim_agent_SOURCES = tests/unit/test_shim_agent.c shim/core/shim_agent.c shim/core/shim_config.c
tests_unit_test_shim_agent_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_agent_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)

# The group operations' lists (lib/gcr_groupmsg): round trips and every refusal.
check_PROGRAMS += tests/unit/test_groupmsg
TESTS += tests/unit/test_groupmsg
tests_unit_test_groupmsg_SOURCES = tests/unit/test_groupmsg.c
tests_unit_test_groupmsg_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/tests/unit $(JANSSON_CFLAGS)
tests_unit_test_groupmsg_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS)
# The shim's NCCL module on the stand-in driver and the stand-in NCCL (shim/nccl).
check_PROGRAMS += tests/unit/test_shim_nccl_poke
TESTS += tests/unit/test_shim_nccl_poke
tests_unit_test_shim_nccl_poke_SOURCES = tests/unit/test_shim_nccl_poke.c shim/nccl/shim_nccl_poke.c
tests_unit_test_shim_nccl_poke_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_nccl_poke_LDADD = lib/libgcrcommon.la

check_PROGRAMS += tests/unit/test_shim_nccl
TESTS += tests/unit/test_shim_nccl
tests_unit_test_shim_nccl_SOURCES = tests/unit/test_shim_nccl.c $(SHIM_CORE_SOURCES)
tests_unit_test_shim_nccl_CPPFLAGS = $(SHIM_TEST_CPPFLAGS)
tests_unit_test_shim_nccl_LDADD = lib/libgcrcommon.la $(JANSSON_LIBS) -ldl
EXTRA_tests_unit_test_shim_nccl_DEPENDENCIES = $(FAKECUDA_LIB) $(FAKENCCL_LIB)
# The NCCL interface the shim declares itself, against a real nccl.h (configure found one), and
# every function of it that takes or returns a communicator in the shim's list.
EXTRA_DIST += tests/unit/test_nccl_cover.sh tests/unit/test_nccl_abi.c tests/unit/nccl_stub/cuda_runtime.h \
	tests/unit/nccl_stub/cuda_fp16.h tests/unit/nccl_stub/cuda_bf16.h tests/unit/nccl_stub/cuda_fp8.h
if HAVE_NCCL_H
check_PROGRAMS += tests/unit/test_nccl_abi
TESTS += tests/unit/test_nccl_abi tests/unit/test_nccl_cover.sh
tests_unit_test_nccl_abi_SOURCES = tests/unit/test_nccl_abi.c
tests_unit_test_nccl_abi_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/shim/nccl -I$(srcdir)/tests/unit/nccl_stub \
	$(NCCL_CPPFLAGS) $(CUDA_CPPFLAGS)
endif
