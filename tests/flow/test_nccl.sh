#!/bin/sh
# Runs the NCCL group flow tests (tests/flow/test_nccl.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_nccl.py" "$@"
