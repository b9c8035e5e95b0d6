#!/bin/sh
# Runs bench_overhead.py's interleaved pairs against a stand-in (tests/bench/test_overhead_pairs.py).
exec python3 "$top_srcdir/tests/bench/test_overhead_pairs.py" "$@"
