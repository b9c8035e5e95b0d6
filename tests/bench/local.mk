# tests/bench/: bench/report.py checked on synthetic logs (stdlib; plots only where matplotlib is),
# and bench_overhead.py's interleaved pairs against a stand-in of the benchmark programs.
TESTS += tests/bench/test_report.sh tests/bench/test_overhead_pairs.sh
EXTRA_DIST += tests/bench/test_report.sh tests/bench/test_report.py tests/bench/test_overhead_pairs.sh \
	tests/bench/test_overhead_pairs.py tests/bench/turns_standin.py tests/bench/tally.py
