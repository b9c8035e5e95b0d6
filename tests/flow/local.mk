# tests/flow/: the whole C/R flow (shim + gcrctl + driver checkpoint API) on the stand-in driver.
TESTS += tests/flow/test_flow.sh
EXTRA_DIST += tests/flow/test_flow.sh tests/flow/test_flow.py
# The HIP backend on the stand-in runtime (tests/fakehip).
TESTS += tests/flow/test_hip_flow.sh
EXTRA_DIST += tests/flow/test_hip_flow.sh tests/flow/test_hip_flow.py
# gcr-agent on a bare node: paths derived from --socket-dir, a non-root shim registering.
TESTS += tests/flow/test_agent_paths.sh
EXTRA_DIST += tests/flow/test_agent_paths.sh tests/flow/test_agent_paths.py
# The control socket under hostile peers: idle, polling, flooding, vanishing clients, taken names.
TESTS += tests/flow/test_hostile.sh
EXTRA_DIST += tests/flow/test_hostile.sh tests/flow/test_hostile.py
# Every host allocation of a suspend and of a resume failing in turn (tests/progs/libgcr-interposer.so).
TESTS += tests/flow/test_alloc_sweep.sh
EXTRA_DIST += tests/flow/test_alloc_sweep.sh tests/flow/test_alloc_sweep.py
# Process images with the real CRIU (GCR_CRIU, scripts/install-criu.sh): fails, never skips, without one.
TESTS += tests/flow/test_image.sh
EXTRA_DIST += tests/flow/test_image.sh tests/flow/test_image.py
# Images of a process in a PID namespace (a container's shape): gcrctl checkpoint --container.
TESTS += tests/flow/test_image_container.sh
EXTRA_DIST += tests/flow/test_image_container.sh tests/flow/test_image_container.py
# Stream-ordered memory (pools, graph memory) on the shim's fast path, suspended at random moments.
TESTS += tests/flow/test_pools.sh
EXTRA_DIST += tests/flow/test_pools.sh tests/flow/test_pools.py
# Overcommit by suspend: gcr-agent without Kubernetes, processes of different priority on one
# small stand-in GPU (docs/preemption.md).
TESTS += tests/flow/test_overcommit.sh
EXTRA_DIST += tests/flow/test_overcommit.sh tests/flow/test_overcommit.py
# Groups of processes that communicate through NCCL (the stand-in tests/fakenccl), suspended and
# resumed as one (gcrctl --group): bit-exact cycles, split communicators, several devices, members
# killed, stopped or failing mid-operation, refusals (docs/design.md, "Groups").
TESTS += tests/flow/test_nccl.sh
EXTRA_DIST += tests/flow/test_nccl.sh tests/flow/test_nccl.py
