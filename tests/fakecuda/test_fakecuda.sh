#!/bin/bash
# test_fakecuda.sh: the stand-in driver's self-test: gcr-testprog in every entry-point mode, and
# the checkpoint API driven by fakesmi while it waits or runs; synchronised on its output lines.
set -u

top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-$top_builddir}
PROG=$top_builddir/tests/progs/gcr-testprog
SMI=$top_builddir/tests/fakecuda/fakesmi
MODULE=$top_srcdir/tests/progs/gcr_kernels.h # any readable file serves as a module here
export LD_LIBRARY_PATH=$top_builddir/tests/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export FAKECUDA_DIR
FAKECUDA_DIR=$(mktemp -d "${TMPDIR:-/tmp}/fakecuda-test.XXXXXX") || exit 1
LINE_TIMEOUT=60 # seconds: only a guard against a hang, never used to wait for an event

passed=0
failed=0
declare -A pid_of in_of out_of

cleanup() {
	local n
	for n in "${!pid_of[@]}"; do kill -9 "${pid_of[$n]}" 2>/dev/null; done
	rm -rf "$FAKECUDA_DIR"
}
trap cleanup EXIT

ok() { passed=$((passed + 1)); echo "ok - $1"; }
not_ok() { failed=$((failed + 1)); echo "not ok - $1"; }
# check DESCRIPTION COMMAND...: passes when the command succeeds.
check() { local what=$1; shift; if "$@"; then ok "$what"; else not_ok "$what"; fi; }
equals() { [ "$1" = "$2" ] || { echo "  got '$1', expected '$2'" >&2; return 1; }; }
fails() { ! "$@" 2>/dev/null; }

# start NAME ARGS...: runs gcr-testprog in the background, its stdin and stdout on fifos
# (through the command in PROG_PREFIX, if set).
PROG_PREFIX=()
start() {
	local n=$1 fd
	shift
	mkfifo "$FAKECUDA_DIR/$n.in" "$FAKECUDA_DIR/$n.out"
	"${PROG_PREFIX[@]}" "$PROG" --module "$MODULE" "$@" <"$FAKECUDA_DIR/$n.in" >"$FAKECUDA_DIR/$n.out" \
		2>"$FAKECUDA_DIR/$n.err" &
	pid_of[$n]=$!
	exec {fd}>"$FAKECUDA_DIR/$n.in"
	in_of[$n]=$fd
	exec {fd}<"$FAKECUDA_DIR/$n.out"
	out_of[$n]=$fd
}

# expect NAME PREFIX: reads NAME's output up to the first line starting with PREFIX, prints it.
expect() {
	local line
	while read -r -t "$LINE_TIMEOUT" -u "${out_of[$1]}" line; do
		case $line in "$2"*) echo "$line"; return 0 ;; esac
	done
	echo "  $1: no '$2' line" >&2
	return 1
}

say() { echo "$2" >&"${in_of[$1]}"; }

# finish NAME: closes its stdin, waits, returns its exit status.
finish() {
	local rc
	exec {in_of[$1]}>&-
	wait "${pid_of[$1]}"
	rc=$?
	exec {out_of[$1]}<&-
	unset "pid_of[$1]"
	rm -f "$FAKECUDA_DIR/$1.in" "$FAKECUDA_DIR/$1.out"
	return $rc
}

ready_pid() { local l; l=$(expect "$1" READY) && l=${l#READY pid=} && echo "${l%% *}"; }

# ---- 0. the driver's own semantics ----
check "driver API semantics" "$top_builddir/tests/fakecuda/test-fakecuda-api"

# ---- 1. the workload in every way of finding the entry points ----
for api in link dlsym procaddr; do
	for ptds in "" --ptds; do
		out=$("$PROG" --module "$MODULE" --api $api $ptds --mib 8 --iters 4 --threads 3 \
			--pitch --small --async --vmm 2>/dev/null)
		check "run --api $api $ptds" equals "$(tail -n 1 <<<"$out")" "RESULT ok"
	done
done
out=$("$PROG" --module "$MODULE" --api procaddr --ptds --graph --mib 8 --iters 5 --vmm --small 2>/dev/null)
check "run --graph" equals "$(tail -n 1 <<<"$out")" "RESULT ok"
out=$("$PROG" --module "$MODULE" --managed --mib 4 --iters 2 2>/dev/null)
check "run --managed" equals "$(tail -n 1 <<<"$out")" "RESULT ok"
out=$("$PROG" --module /nonexistent --mib 4 2>/dev/null)
check "missing module" equals "$(tail -n 1 <<<"$out")" "ERROR cuModuleLoad CUDA_ERROR_FILE_NOT_FOUND"
check "fakesmi on a pid without CUDA" fails "$SMI" state $$

# ---- 2. checkpoint and restore while the program waits ----
start a --wait --mib 8 --iters 4 --pitch --small --async --vmm --graph
pid=$(ready_pid a)
check "state running" equals "$("$SMI" state "$pid")" running
mem=$("$SMI" mem "$pid")
check "holds device memory" test "${mem:-0}" -ge $((8 << 20))
check "restore thread id" test "$("$SMI" tid "$pid")" -gt 0
check "lock" "$SMI" lock "$pid"
check "state locked" equals "$("$SMI" state "$pid")" locked
check "lock twice is illegal" fails "$SMI" lock "$pid"
check "restore before checkpoint is illegal" fails "$SMI" restore "$pid"
check "checkpoint" "$SMI" checkpoint "$pid"
check "state checkpointed" equals "$("$SMI" state "$pid")" checkpointed
check "no device memory while checkpointed" equals "$("$SMI" mem "$pid")" 0
check "unlock while checkpointed is illegal" fails "$SMI" unlock "$pid"
check "restore" "$SMI" restore "$pid"
check "state locked after restore" equals "$("$SMI" state "$pid")" locked
check "device memory back" equals "$("$SMI" mem "$pid")" "$mem"
check "unlock" "$SMI" unlock "$pid"
check "state running after unlock" equals "$("$SMI" state "$pid")" running
say a go
check "iterations done" expect a DONE >/dev/null
say a check
check "data intact after checkpoint/restore" equals "$(expect a RESULT)" "RESULT ok"
check "exit status 0" finish a

# ---- 3. checkpoint in the middle of the iterations: the lock must wait for calls in flight,
# and calls made while locked must block ----
start b --wait --mib 32 --iters 60 --threads 4 --vmm --small
pid=$(ready_pid b)
say b go
expect b "ITER 2" >/dev/null
check "lock while running" "$SMI" lock "$pid" 0
check "checkpoint while running" "$SMI" checkpoint "$pid"
check "mid-run: no device memory" equals "$("$SMI" mem "$pid")" 0
check "mid-run: restore" "$SMI" restore "$pid"
check "mid-run: unlock" "$SMI" unlock "$pid"
check "mid-run: iterations done" expect b DONE >/dev/null
say b check
check "mid-run: data intact" equals "$(expect b RESULT)" "RESULT ok"
check "mid-run: exit status 0" finish b

# ---- 4. managed memory cannot be checkpointed; the process stays locked and usable ----
start c --wait --mib 4 --iters 3 --managed
pid=$(ready_pid c)
check "managed: lock" "$SMI" lock "$pid"
err=$("$SMI" checkpoint "$pid" 2>&1)
check "managed: checkpoint refused" equals "$?:$(grep -o CUDA_ERROR_NOT_SUPPORTED <<<"$err")" \
	"1:CUDA_ERROR_NOT_SUPPORTED"
check "managed: still locked" equals "$("$SMI" state "$pid")" locked
check "managed: unlock" "$SMI" unlock "$pid"
say c go
expect c DONE >/dev/null
say c check
check "managed: data intact" equals "$(expect c RESULT)" "RESULT ok"
check "managed: exit status 0" finish c

# ---- 5. fault injection ----
start d --wait --mib 4 --iters 3
pid=$(ready_pid d)
check "arm a fault" "$SMI" fail "$pid" cuMemcpyDtoH_v2 1 2
say d go
expect d DONE >/dev/null
say d check
check "injected error reported" equals "$(expect d ERROR)" "ERROR cuMemcpyDtoH CUDA_ERROR_OUT_OF_MEMORY"
finish d
check "injected error: exit status 2" equals "$?" 2

start e --wait --mib 4 --iters 5 --api procaddr --ptds
pid=$(ready_pid e)
check "arm a fault on the 3rd launch, any variant" "$SMI" fail "$pid" cuLaunchKernel 3 719
say e go
check "injected launch failure" equals "$(expect e ERROR)" "ERROR cuLaunchKernel CUDA_ERROR_LAUNCH_FAILED"
finish e
check "launch failure: exit status 2" equals "$?" 2

# A failed restore leaves the process checkpointed; the next one succeeds.
start f --wait --mib 4 --iters 2 --vmm
pid=$(ready_pid f)
check "arm a restore fault" "$SMI" fail "$pid" cuCheckpointProcessRestore 1 2
"$SMI" lock "$pid" && "$SMI" checkpoint "$pid"
check "restore fails" fails "$SMI" restore "$pid"
check "still checkpointed" equals "$("$SMI" state "$pid")" checkpointed
check "restore again" "$SMI" restore "$pid"
check "unlock after failed restore" "$SMI" unlock "$pid"
say f go
expect f DONE >/dev/null
say f check
check "failed restore: data intact" equals "$(expect f RESULT)" "RESULT ok"
finish f

# ---- 6. device memory is shared between processes: a restore can find it taken, and one that
# runs out of memory breaks the process for good (the real driver's bug, modelled) ----
export FAKECUDA_MEM_MIB=64
start g --wait --mib 40 --iters 2 --threads 1
pid=$(ready_pid g)
"$SMI" lock "$pid" && "$SMI" checkpoint "$pid"
start h --wait --mib 40 --iters 2 --threads 1
pid_h=$(ready_pid h)
check "restore with the memory taken fails" fails "$SMI" restore "$pid"
check "still checkpointed after OOM" equals "$("$SMI" state "$pid")" checkpointed
say h go
expect h DONE >/dev/null
say h check
check "the other process finishes" equals "$(expect h RESULT)" "RESULT ok"
finish h
check "restore once the memory is free: OPERATING_SYSTEM, for good" \
	equals "$("$SMI" restore "$pid" 2>&1)" "fakesmi: restore $pid: CUDA_ERROR_OPERATING_SYSTEM (304): no such process"
check "and again" fails "$SMI" restore "$pid"
kill -9 "$pid" # lost: nothing left to do with it
finish g 2>/dev/null
check "the lost process is ended" equals "$?" 137
# A restore needs FAKECUDA_RESTORE_SCRATCH_MIB beyond the footprint (64 MiB < 40 + 30).
export FAKECUDA_RESTORE_SCRATCH_MIB=30 # read by the target, whose service restores
start i --wait --mib 40 --iters 2 --threads 1
unset FAKECUDA_RESTORE_SCRATCH_MIB
pid=$(ready_pid i)
"$SMI" lock "$pid" && "$SMI" checkpoint "$pid"
check "restore with room for the footprint but not the driver's scratch fails" fails "$SMI" restore "$pid"
kill -9 "$pid"
finish i 2>/dev/null
check "ended" equals "$?" 137
start j --wait --mib 40 --iters 2 --threads 1
pid=$(ready_pid j)
"$SMI" lock "$pid" && "$SMI" checkpoint "$pid"
check "restore with room" "$SMI" restore "$pid"
"$SMI" unlock "$pid"
say j go
expect j DONE >/dev/null
say j check
check "shared memory: data intact" equals "$(expect j RESULT)" "RESULT ok"
finish j
unset FAKECUDA_MEM_MIB
check "socket removed at exit" test ! -e "$FAKECUDA_DIR/fakecuda-$pid.sock"

# ---- the shared pool: a dead process's slot naming a live one ----
# A PID namespace's inode number is reused once the namespace is gone, so a dead process's slot
# can carry the pid and namespace of a new one (pid 1 of a new container here; seen on the real
# node). The new process must not adopt it (it holds no lock on it), or the next process reaps
# its bytes as a dead process's and allocates them again.
stale_slot='import os, struct
fd = os.open(os.environ["FAKECUDA_DIR"] + "/fakecuda-pool", os.O_RDWR | os.O_CREAT, 0o600)
if os.fstat(fd).st_size < 256 * 72:
    os.ftruncate(fd, 256 * 72)
ns = os.stat("/proc/self/ns/pid").st_ino & 0xFFFFFFFF
os.pwrite(fd, struct.pack("<iI8Q", 1, ns, 48 << 20, 0, 0, 0, 0, 0, 0, 0), 255 * 72)'
if unshare --pid --fork true 2>/dev/null; then
	export FAKECUDA_MEM_MIB=64
	PROG_PREFIX=(unshare --pid --fork sh -c 'python3 -c "$0" && exec "$@"' "$stale_slot")
	start k --wait --mib 40 --iters 2 --threads 1
	PROG_PREFIX=()
	check "pid 1 of a new PID namespace starts over a stale slot of its pid" equals "$(expect k READY | cut -d' ' -f2)" "pid=1"
	start l --wait --mib 40 --iters 2 --threads 1
	check "its bytes still count for the next process: out of memory" \
		equals "$(expect l ERROR | awk '{print $NF}')" CUDA_ERROR_OUT_OF_MEMORY
	finish l
	say k go
	expect k DONE >/dev/null
	say k check
	check "the first process's data intact" equals "$(expect k RESULT)" "RESULT ok"
	finish k
	unset FAKECUDA_MEM_MIB
else
	not_ok "the stale-slot case needs PID namespaces (unshare --pid, as root): it could not run"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
