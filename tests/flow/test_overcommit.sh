#!/bin/sh
# Runs the overcommit-by-suspend cases (tests/flow/test_overcommit.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_overcommit.py" "$@"
