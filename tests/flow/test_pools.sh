#!/bin/sh
# Runs the stream-ordered memory flow (tests/flow/test_pools.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_pools.py" "$@"
