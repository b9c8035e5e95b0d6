#!/bin/bash
# test_shim_notice: a shim that cannot serve says so once on stderr, one line starting "gcr: ",
# whatever GCR_LOG_LEVEL says (no control socket, no registration with the node agent), and
# a shim that is well says nothing at all.
set -u
b=$top_builddir src=$top_srcdir
preload=${GCR_TEST_PRELOAD_PREFIX:+$GCR_TEST_PRELOAD_PREFIX:}$b/shim/.libs/libgcr.so
pass=0 fail=0
check() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL ($what): $*"; cat "$dir/err"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
: >"$dir/not-a-dir"
export FAKECUDA_DIR=$dir LD_LIBRARY_PATH=$b/tests/fakecuda

# Runs the test program to its end under the shim with the given environment; its stderr,
# less the program's own lines, goes to $dir/err.
run() {
	timeout -k 5 120 env "$@" LD_PRELOAD="$preload" "$b/tests/progs/gcr-testprog" --mib 1 --iters 2 \
		--module "$src/tests/progs/gcr_kernels.h" 2>"$dir/err.all" >"$dir/out"
	rc=$?
	grep -v '^gcr-testprog: ' "$dir/err.all" >"$dir/err"
}
count() { grep -c "$1" "$dir/err"; }

what="all well"
for level in "" warn; do
	run GCR_SOCKET_DIR="$dir" ${level:+GCR_LOG_LEVEL=$level}
	check test "$rc" -eq 0
	check test ! -s "$dir/err"
done

what="no control socket"
for level in "" error warn; do
	run GCR_SOCKET_DIR="$dir/not-a-dir" ${level:+GCR_LOG_LEVEL=$level}
	check test "$rc" -eq 0
	check grep -q '^RESULT ok' "$dir/out"
	check test "$(count '^gcr: pid [0-9]* has no control socket.*cannot be suspended$')" -eq 1
	check test "$(count 'control socket')" -eq 1 # said once, not again as a warning
done

what="not registered"
for level in "" warn; do
	run GCR_SOCKET_DIR="$dir" GCR_AGENT_SOCKET="$dir/no-agent.sock" ${level:+GCR_LOG_LEVEL=$level}
	check test "$rc" -eq 0
	check test "$(count '^gcr: pid [0-9]* not registered with the node agent')" -eq 1
	check test "$(count 'not registered')" -eq 1
done
echo "test_shim_notice: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
