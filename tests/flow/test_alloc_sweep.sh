#!/bin/sh
# Runs the allocation-failure sweep (tests/flow/test_alloc_sweep.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_alloc_sweep.py" "$@"
