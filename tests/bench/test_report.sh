#!/bin/sh
# Runs the report.py checks (tests/bench/test_report.py) on synthetic logs.
exec python3 "$top_srcdir/tests/bench/test_report.py" "$@"
