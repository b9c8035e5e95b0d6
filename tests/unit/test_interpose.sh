#!/bin/bash
# test_interpose: another interposer that finds the next definition with dlsym(RTLD_NEXT, ...)
# (tests/progs/libgcr-interposer.so: malloc, getenv, cuInit) works beside the shim whichever
# of the two is preloaded first: the program finishes with its data checked, the interposer
# saw its calls and got libc's getenv as "next", and the shim served (its control socket).
# Before the fix the shim answered RTLD_NEXT relative to itself, and an interposer after it
# got its own function back: an endless loop (here: the timeout).
set -u
b=$top_builddir src=$top_srcdir
shim=$b/shim/.libs/libgcr.so
interp=$b/tests/progs/libgcr-interposer.so
prefix=${GCR_TEST_PRELOAD_PREFIX:+$GCR_TEST_PRELOAD_PREFIX:}
pass=0 fail=0
check() { if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL ($order): $*"; fi; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
export GCR_SOCKET_DIR=$dir FAKECUDA_DIR=$dir LD_LIBRARY_PATH=$b/tests/fakecuda

# The count the interposer printed at exit for one of its functions.
seen() { sed -n "s/^gcr-interposer: .*\b$1 \([0-9]*\).*/\1/p" "$dir/out" | tail -n 1; }

for order in before after; do
	if [ "$order" = before ]; then preload=$prefix$interp:$shim; else preload=$prefix$shim:$interp; fi
	# Only the program is preloaded (env, exec'd at once, not timeout): a loop is cut at 120 s.
	timeout -k 5 120 env GCR_LOG_LEVEL=info LD_PRELOAD="$preload" "$b/tests/progs/gcr-testprog" \
		--mib 1 --iters 2 --threads 2 --module "$src/tests/progs/gcr_kernels.h" >"$dir/out" 2>&1
	rc=$?
	check test "$rc" -eq 0
	check grep -q '^RESULT ok' "$dir/out"
	check grep -q 'info shim: control socket' "$dir/out"
	check test "$(seen getenv)" -gt 0
	check test "$(seen next-getenv-is-libc)" = 1
	# In a sanitizer build the ASan runtime comes first and answers malloc itself.
	[ -n "$prefix" ] || check test "$(seen malloc)" -gt 0
	# First in line, the interposer's cuInit is the program's, and its next is the shim's.
	[ "$order" = after ] || check test "$(seen cuInit)" -gt 0
	[ "$rc" -eq 0 ] || tail -n 20 "$dir/out"
done
echo "test_interpose: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
