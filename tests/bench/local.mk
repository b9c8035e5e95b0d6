# tests/bench/: bench/report.py checked on synthetic logs (stdlib; plots only where matplotlib is).
TESTS += tests/bench/test_report.sh
EXTRA_DIST += tests/bench/test_report.sh tests/bench/test_report.py
