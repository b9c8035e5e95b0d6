#!/usr/bin/env bash
# tests/gpu/run_nccl.sh: the one command for groups of NCCL processes on a machine with 2 or more
# GPUs: builds, records the machine, runs tests/gpu/test_nccl_gpu.py (PyTorch ranks all-reducing,
# a tensor-parallel inference loop with 8 GiB of weights per rank, 3 suspend/resume cycles each at
# random moments, bit-exact, every GPU at 0 MiB while suspended; a member killed mid-operation; a
# group suspended longer than PyTorch's heartbeat timeout (5 s there); a
# lone member refused; the TP group's benchmark against the driver alone in the same run) and
# leaves logs and a report in $OUT.
#
# Usage, from anywhere (it cd's to the repo root):
#   OUT=/dir bash tests/gpu/run_nccl.sh [--only REGEX]... [--skip REGEX]...
# Env: GCR_TIME_BUDGET_S (480) bounds the whole run (later tests are reported NOT RUN when it is
#      near); GCR_BUILD_DONE=1 skips the build; GCR_NCCL_TRACE=1 has NCCL write its INIT and PROXY
#      lines, timestamped to the microsecond, beside each process's log (what a teardown waits
#      for); GCR_NCCL_POKE (shim/nccl/shim_nccl_poke.h); GCR_NCCL_RANKS (default: every GPU) and
#      the tuning variables test_nccl_gpu.py lists.
# $OUT receives run.log (all output), tests.jsonl, bench.jsonl, report.md and logs.tar.gz (build
# log, one log per process, versions).
set -u -o pipefail

START=$(date +%s)
BUDGET=${GCR_TIME_BUDGET_S:-480}
RESERVE=20
DEADLINE=$((START + BUDGET))

cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/gcr-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/gcr-nccl-logs.XXXXXX)
exec > >(tee -a "$OUT/run.log") 2>&1

TEST_ARGS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--only | --skip) TEST_ARGS+=("$1" "$2"); shift ;;
	*) echo "run_nccl.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

PYTHON=${PYTHON:-python3}
export GCR_DEADLINE=$((DEADLINE - RESERVE))
export GCR_TEST_LOG="$OUT/tests.jsonl"
export GCR_BENCH_LOG="$OUT/bench.jsonl"
export GCR_LOG_DIR="$LOGS/procs"
# Multicast (NVLS) stays off, as on these machines.
export NCCL_NVLS_ENABLE=0
if [ "${GCR_NCCL_TRACE:-0}" = 1 ]; then
	mkdir -p "$GCR_LOG_DIR"
	export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,PROXY NCCL_DEBUG_TIMESTAMP_LEVELS=ALL
	export NCCL_DEBUG_TIMESTAMP_FORMAT='[%T.%6f] ' NCCL_DEBUG_FILE="$GCR_LOG_DIR/nccl.%h.%p.log"
fi
unset LD_PRELOAD
SUMMARY=()
left() { echo $((GCR_DEADLINE - $(date +%s))); }
note() { SUMMARY+=("$1"); echo "=== $1"; }
section() { echo; echo "=================== $1 ($(($(date +%s) - START)) s elapsed, $(left) s left)"; }
pack() { tar czf "$OUT/logs.tar.gz.tmp" -C "$LOGS" . 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"; }
trap pack EXIT

section "machine"
{
	date -u
	uname -a
	nvidia-smi || echo "nvidia-smi FAILED"
	nvidia-smi topo -m || true
	nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv
	$PYTHON -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
	env | grep -E '^(NCCL|TORCH)_' | sort
	git log --oneline -1 2>/dev/null
} 2>&1 | tee "$LOGS/versions.txt"

section "build"
if [ "${GCR_BUILD_DONE:-0}" = 1 ]; then
	note "build: skipped (GCR_BUILD_DONE=1)"
elif timeout "$(left)" bash -c './autogen.sh && ./configure --with-cuda=/usr/local/cuda && make -j16' >"$LOGS/build.log" 2>&1; then
	note "build: ok"
else
	note "build: FAILED (last lines below; build.log in logs.tar.gz)"
	tail -40 "$LOGS/build.log"
fi
for f in node-agent/gcrctl shim/.libs/libgcr.so; do
	[ -e "$f" ] || note "MISSING $f"
done
# The NCCL interface the shim declares itself, against this machine's nccl.h (PyTorch's wheel).
if make tests/unit/test_nccl_abi >>"$LOGS/build.log" 2>&1 && tests/unit/test_nccl_abi; then
	note "nccl abi: ok"
else
	note "nccl abi: FAILED or no nccl.h found (see build.log)"
fi
# Every function of that nccl.h taking or returning a communicator is in the shim's list.
if NCCL_CPPFLAGS="$(sed -n 's/^NCCL_CPPFLAGS = //p' Makefile)" tests/unit/test_nccl_cover.sh; then
	note "nccl coverage: ok"
else
	note "nccl coverage: FAILED or no nccl.h found"
fi
pack

section "NCCL group tests and benchmark"
t=$(left)
if [ "$t" -lt 60 ]; then
	note "NOT RUN tests: time budget ($t s left)"
else
	timeout --kill-after=10 "$t" $PYTHON tests/gpu/test_nccl_gpu.py "${TEST_ARGS[@]}"
	rc=$?
	case $rc in
	0) note "tests: all passed" ;;
	3) note "tests: none failed, some NOT RUN" ;;
	124 | 137) note "TIMED OUT tests after the budget ($t s)" ;;
	*) note "tests: FAILURES (exit status $rc)" ;;
	esac
fi
pack

section "report"
touch "$GCR_TEST_LOG" "$GCR_BENCH_LOG"
$PYTHON - "$GCR_TEST_LOG" "$GCR_BENCH_LOG" >"$OUT/report.md" <<'EOF'
import json, sys
def lines(path):
    out = []
    for l in open(path):
        try:
            out.append(json.loads(l))
        except ValueError:
            pass
    return out
tests, bench = lines(sys.argv[1]), lines(sys.argv[2])
print("# NCCL groups on the GPU: report\n")
print("| test | status | s | notes / reason |\n|---|---|---|---|")
for t in tests:
    if t.get("kind") == "test":
        why = "; ".join(t.get("notes") or []) if t["status"] == "PASS" else (t.get("reason") or "")
        print("| %s | %s | %s | %s |" % (t["name"], t["status"], t.get("secs"), why.replace("\n", " ")[:400]))
print("\n## Suspend/resume cycles (ms)\n")
print("| test | cycle | suspend | freeze | drain | data+driver | resume | data+driver | rebuild | GPU MiB used while suspended |")
print("|---|---|---|---|---|---|---|---|---|---|")
f = lambda v: "%.0f" % v if isinstance(v, (int, float)) else "n/a"
for t in tests:
    if t.get("event") == "group-cycle":
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            t.get("test"), t.get("what"), f(t.get("suspend_ms")), f(t.get("freeze_ms")), f(t.get("drain_ms")),
            f(t.get("data_driver_ms")), f(t.get("resume_ms")), f(t.get("resume_cr_ms")), f(t.get("rebuild_ms")),
            t.get("gpu_used_mib")))
print("\n## Benchmark: the TP group against the driver alone, same run\n")
for b in bench:
    if b.get("kind") == "nccl-bench":
        print("- %d ranks x %s GiB (GCR_NCCL_POKE=%s): suspend median %s ms %s, resume median %s ms %s" % (
            b["ranks"], b["gib_per_rank"], b.get("nccl_poke", "all"), f(b["suspend_median_ms"]),
            [f(x) for x in b["suspend_ms"]], f(b["resume_median_ms"]), [f(x) for x in b["resume_ms"]]))
        if "driver_suspend" not in b:
            print("- driver alone: left out (GCR_NCCL_BENCH_DRIVER=0)")
            continue
        d = b.get("driver_suspend") or {}
        print("- driver alone, suspend: %s" % (("%s ms" % f(d.get("ms"))) if d.get("ok") else
                                               "failed after %s s: %s" % (d.get("wall_s"), d.get("error"))))
        d = b.get("driver_resume")
        if d:
            print("- driver alone, resume: %s" % (("%s ms" % f(d.get("ms"))) if d.get("ok") else
                                                  "failed after %s s: %s" % (d.get("wall_s"), d.get("error"))))
EOF
cat "$OUT/report.md"
cp "$GCR_TEST_LOG" "$GCR_BENCH_LOG" "$LOGS/" 2>/dev/null

section "summary"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/run.log" | tail -1
echo "total $(($(date +%s) - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
case "${SUMMARY[*]}" in
*FAIL* | *MISSING* | *"NOT RUN"* | *"TIMED OUT"*) exit 1 ;;
esac
exit 0
