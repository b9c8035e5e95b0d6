#!/bin/sh
# Runs the HIP flow tests (tests/flow/test_hip_flow.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_hip_flow.py" "$@"
