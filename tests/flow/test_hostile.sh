#!/bin/sh
# Runs the hostile-peer tests (tests/flow/test_hostile.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_hostile.py" "$@"
