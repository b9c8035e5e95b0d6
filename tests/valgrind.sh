#!/bin/bash
# valgrind (memcheck) over the C unit tests, gcrctl, and the shim inside a test
# program on the stand-in driver (and a HIP one on the stand-in runtime), through
# suspend/resume. Any memcheck error or
# definite leak fails. Usage: tests/valgrind.sh BUILD_DIR
set -uo pipefail
b=$(cd "${1:-build}" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
vg=(valgrind -q --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --show-possibly-lost=no
    --suppressions="$src/tests/valgrind.supp")
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "PASS $1"; }
ko() { fail=$((fail + 1)); echo "FAIL $1"; }
# The program's pid from its READY line (prog_out), or "".
read_ready() {
	pid=""
	while read -r -t 120 line <&"$prog_out"; do
		case $line in READY*) pid=${line#READY pid=}; pid=${pid%% *}; break ;; esac
	done
}
# Asks the program to check its data; flow_ok=1 when it answers "RESULT ok".
check_result() {
	echo check >&"$prog_in"
	while read -r -t 120 line <&"$prog_out"; do
		case $line in "RESULT ok") flow_ok=1 ;; esac
		case $line in RESULT*) break ;; esac
	done
}

# test_thread_churn: 2k threads here (100k in the other tiers); the leak check covers freeing.
export GCR_TEST_CHURN_THREADS=2000
# Deadlines live peers must meet in the unit tests (tests/unit/util.h, test_ms): valgrind runs
# them many times slower, and in CI beside the Kubernetes tiers at a lower priority.
export GCR_TEST_TIME_SCALE=${GCR_TEST_TIME_SCALE:-6}
for t in "$b"/tests/unit/test_*; do
	[ -x "$t" ] && [ -f "$t" ] && [[ "$t" != *.sh ]] || continue
	if top_srcdir=$src top_builddir=$b "${vg[@]}" "$t" >/dev/null; then ok "$(basename "$t")"; else ko "$(basename "$t")"; fi
done

# gcrctl's error paths: a bad pid must be a clean error (exit 1), not a memcheck error (99).
"${vg[@]}" "$b/node-agent/gcrctl" --json status 4000000 >/dev/null 2>&1
rc=$?; [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] && ok "gcrctl-bad-pid" || ko "gcrctl-bad-pid (exit $rc)"

# The shim and gcrctl through a full suspend/resume on the stand-in driver.
sock=$(mktemp -d)
export GCR_SOCKET_DIR=$sock FAKECUDA_DIR=$sock LD_LIBRARY_PATH=$b/tests/fakecuda
coproc PROG { exec "${vg[@]}" env LD_PRELOAD="$b/shim/.libs/libgcr.so" \
	"$b/tests/progs/gcr-testprog" --mib 8 --buffers 2 --threads 2 --iters 4 --wait \
	--module "$src/tests/progs/gcr_kernels.h" 2>&1; }
# Bash unsets PROG once the program exits: keep copies of its handles and pid.
prog_out=${PROG[0]} prog_in=${PROG[1]} prog_pid=$PROG_PID
read_ready
flow_ok=0
if [ -n "$pid" ]; then
	echo go >&"$prog_in"
	while read -r -t 120 line <&"$prog_out"; do [ "$line" = DONE ] && break; done
	# suspend/resume, then the same through gcrctl scale (lib/gcr_scale's threads).
	if "${vg[@]}" "$b/node-agent/gcrctl" suspend "$pid" && "${vg[@]}" "$b/node-agent/gcrctl" resume "$pid" &&
		"${vg[@]}" "$b/node-agent/gcrctl" --json scale --replicas 0 "$pid" >/dev/null &&
		"${vg[@]}" "$b/node-agent/gcrctl" --json scale --replicas 1 --sample-ms 10 "$pid" >/dev/null; then
		check_result
	fi
fi
exec {prog_in}>&-
wait "$prog_pid" 2>/dev/null; rc=$?
[ "$flow_ok" -eq 1 ] && [ "$rc" -eq 0 ] && ok "shim-under-valgrind" || ko "shim-under-valgrind (result $flow_ok, exit $rc)"
rm -rf "$sock"

# The same for a HIP process on the stand-in runtime: the data step (keep-context), and the full
# mode's CRIU steps against the fake criu (which leaves the process running).
sock=$(mktemp -d)
mkdir -p "$sock/plugins" && : >"$sock/plugins/amdgpu_plugin.so"
export GCR_SOCKET_DIR=$sock FAKEHIP_DIR=$sock LD_LIBRARY_PATH=$b/tests/fakehip
coproc HPROG { exec "${vg[@]}" env LD_PRELOAD="$b/shim/.libs/libgcr.so" \
	"$b/tests/progs/gcr-hipprog" --mib 4 --buffers 2 --threads 2 --wait 2>&1; }
prog_out=${HPROG[0]} prog_in=${HPROG[1]} prog_pid=$HPROG_PID
flow_ok=0
read_ready
if [ -n "$pid" ] && "${vg[@]}" "$b/node-agent/gcrctl" suspend --no-driver "$pid" &&
	"${vg[@]}" "$b/node-agent/gcrctl" resume --no-driver "$pid" &&
	GCR_CRIU=$src/tests/unit/fake-criu.sh CRIU_LIBS_DIR=$sock/plugins FAKE_CRIU_VERSION_OUT="Version: 4.1" \
	FAKE_CRIU_LOG=$sock/criu.log FAKE_CRIU_PID=$pid \
	"${vg[@]}" "$b/node-agent/gcrctl" --images-dir "$sock/images" suspend "$pid" &&
	GCR_CRIU=$src/tests/unit/fake-criu.sh CRIU_LIBS_DIR=$sock/plugins FAKE_CRIU_VERSION_OUT="Version: 4.1" \
	FAKE_CRIU_LOG=$sock/criu.log FAKE_CRIU_PID=$pid \
	"${vg[@]}" "$b/node-agent/gcrctl" --images-dir "$sock/images" resume "$pid"; then
	check_result
fi
exec {prog_in}>&-
wait "$prog_pid" 2>/dev/null; rc=$?
[ "$flow_ok" -eq 1 ] && [ "$rc" -eq 0 ] && ok "hip-shim-under-valgrind" || ko "hip-shim-under-valgrind (result $flow_ok, exit $rc)"
rm -rf "$sock"
# A group of two NCCL ranks on the stand-in NCCL (the shim's communicators, hold, teardown and
# rebuild under memcheck) suspended and resumed as one by gcrctl --group (lib/gcr_group), while
# they all-reduce if it is quick enough, else idle after their last step.
sock=$(mktemp -d)
export GCR_SOCKET_DIR=$sock FAKECUDA_DIR=$sock LD_LIBRARY_PATH=$b/tests/fakecuda:$b/tests/fakenccl
npids=() nrc=() nin=()
for r in 0 1; do
	mkfifo "$sock/in$r"
	"${vg[@]}" env LD_PRELOAD="$b/shim/.libs/libgcr.so" "$b/tests/progs/gcr-ncclprog" --rank $r --nranks 2 \
		--id-file "$sock/id" --steps 500 --mib 2 --pace-ms 10 --wait --module "$src/tests/progs/gcr_kernels.h" \
		<"$sock/in$r" >"$sock/rank$r.out" 2>&1 &
	npids+=($!)
	exec {fd}>"$sock/in$r"
	nin+=("$fd")
done
# Every wait bounded: a line in both outputs within 120 s.
both() {
	for _ in $(seq 600); do
		grep -q "$1" "$sock/rank0.out" && grep -q "$1" "$sock/rank1.out" && return 0
		sleep 0.2
	done
	return 1
}
flow_ok=0
if both '^READY'; then
	for fd in "${nin[@]}"; do echo go >&"$fd"; done
	gpids=$(grep -ho '^READY pid=[0-9]*' "$sock"/rank0.out "$sock"/rank1.out | sed 's/READY pid=//' | paste -sd,)
	both '^STEP 3$' && "${vg[@]}" "$b/node-agent/gcrctl" --json suspend --group "$gpids" >/dev/null &&
		"${vg[@]}" "$b/node-agent/gcrctl" --json resume --group "$gpids" >/dev/null && both '^DONE$' && flow_ok=1
fi
for fd in "${nin[@]}"; do echo exit >&"$fd"; exec {fd}>&-; done
for p in "${npids[@]}"; do
	[ "$flow_ok" -eq 1 ] || kill "$p" 2>/dev/null
	wait "$p"; nrc+=($?)
done
d0=$(grep '^DIGEST' "$sock/rank0.out") d1=$(grep '^DIGEST' "$sock/rank1.out")
[ "$flow_ok" -eq 1 ] && [ "${nrc[*]}" = "0 0" ] && [ -n "$d0" ] && [ "$d0" = "$d1" ] && ok "nccl-group-under-valgrind" ||
	{ ko "nccl-group-under-valgrind (cycle $flow_ok, exits ${nrc[*]})"; for o in "$sock"/rank*.out; do tail -n 5 "$o"; done; }
rm -rf "$sock"
echo "valgrind: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
