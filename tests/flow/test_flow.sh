#!/bin/sh
# Runs the flow tests (tests/flow/test_flow.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_flow.py" "$@"
