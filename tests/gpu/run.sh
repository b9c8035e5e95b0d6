#!/usr/bin/env bash
# tests/gpu/run.sh: the one entry point on the GPU machine: build, compile the CUDA test programs,
# record the machine, run the GPU tests and (with --bench) the benchmarks; results land in $OUT.
#
# Usage, from anywhere (it cd's to the repo root):
#   OUT=/dir bash tests/gpu/run.sh [--no-tests] [--only REGEX]... [--skip REGEX]... [--image]
#        [--bench] [--no-cr] [--no-overhead] [--bench-sizes "1 4 16 64"] [--bench-reps 3]
#        [--bench-cases sizes,keep,serving,reserved] [--bench-keep "1 16"] [--bench-reserved 60:4]
#        [--bench-serving 16:1] [--bench-serving-cycles 4] [--driver-reps-big 1]
#        [--bench-torch | --bench-torch-progs "torch torch-async"] [--overhead-reps 3] [--overhead-args "ARGS for bench_overhead.py"]
# --image also runs tests/gpu/test_image_gpu.py (process images: CRIU from $GCR_CRIU, else .gpubuild/criu/criu).
# (bench/bench_cr.py --help says what each case runs; "none" turns --bench-reserved/--bench-serving off,
# and --bench-cases none runs only the --bench-torch-progs programs' size runs.)
# Env: GCR_BUILD_DONE=1 skips the autotools build; GCR_TIME_BUDGET_S (540) bounds the whole run and
#      later phases are reported NOT RUN when it is near; NVCC (/usr/local/cuda/bin/nvcc);
#      GCR_GPU_BUILD (build-gpu: where the nvcc outputs go); GCRCTL, GCR_SHIM, TESTPROG as harness.py.
# $OUT receives run.log (all output), tests.jsonl, bench.jsonl, report.md, logs.tar.gz
# (build and nvcc logs, one log per program run, versions), and plots/*.png where matplotlib is
# installed (else regenerate them anywhere: python3 bench/report.py --plots DIR OUT/bench.jsonl).
set -u -o pipefail

START=$(date +%s)
BUDGET=${GCR_TIME_BUDGET_S:-540}
RESERVE=25 # s kept at the end for the report and packing the logs
DEADLINE=$((START + BUDGET))

cd "$(dirname "$0")/../.." || exit 2
OUT=${OUT:-/tmp/gcr-out}
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/gcr-run-logs.XXXXXX)
exec > >(tee -a "$OUT/run.log") 2>&1

RUN_TESTS=1 RUN_IMAGE=0 RUN_BENCH=0 RUN_CR=1 RUN_OVERHEAD=1 BENCH_TORCH_PROGS=
BENCH_SIZES="1 4 16 64" BENCH_REPS=3 OVERHEAD_REPS=3 OVERHEAD_ARGS=
BENCH_CASES=sizes,keep,serving,reserved BENCH_KEEP="1 16" BENCH_RESERVED=60:4 BENCH_SERVING=16:1
BENCH_SERVING_CYCLES=4 DRIVER_REPS_BIG=1
TEST_ARGS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--no-tests) RUN_TESTS=0 ;;
	--image) RUN_IMAGE=1 ;;
	--only | --skip) TEST_ARGS+=("$1" "$2"); shift ;;
	--bench) RUN_BENCH=1 ;;
	--no-cr) RUN_CR=0 ;;
	--no-overhead) RUN_OVERHEAD=0 ;;
	--bench-sizes) BENCH_SIZES=$2; shift ;;
	--bench-reps) BENCH_REPS=$2; shift ;;
	--bench-torch) BENCH_TORCH_PROGS=torch ;;
	--bench-torch-progs) BENCH_TORCH_PROGS=$2; shift ;;
	--bench-cases) BENCH_CASES=$2; shift ;;
	--bench-keep) BENCH_KEEP=$2; shift ;;
	--bench-reserved) BENCH_RESERVED=$2; shift ;;
	--bench-serving) BENCH_SERVING=$2; shift ;;
	--bench-serving-cycles) BENCH_SERVING_CYCLES=$2; shift ;;
	--driver-reps-big) DRIVER_REPS_BIG=$2; shift ;;
	--overhead-reps) OVERHEAD_REPS=$2; shift ;;
	--overhead-args) OVERHEAD_ARGS=$2; shift ;;
	*) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
	esac
	shift
done

PYTHON=${PYTHON:-python3}
export GCR_GPU_BUILD=${GCR_GPU_BUILD:-build-gpu}
export GCR_DEADLINE=$((DEADLINE - RESERVE))
export GCR_TEST_LOG="$OUT/tests.jsonl"
export GCR_BENCH_LOG="$OUT/bench.jsonl"
export GCR_LOG_DIR="$LOGS/procs"
unset LD_PRELOAD
SUMMARY=()

left() { echo $((GCR_DEADLINE - $(date +%s))); }
note() { SUMMARY+=("$1"); echo "=== $1"; }
section() { echo; echo "=================== $1 ($(($(date +%s) - START)) s elapsed, $(left) s left)"; }

# Packs every log so far into $OUT/logs.tar.gz; run after each phase so a killed run keeps them.
pack() {
	find "$LOGS" -type f -size +5M | while read -r f; do
		tail -c 2000000 "$f" >"$f.tail" && mv "$f.tail" "$f" && echo "(cut to its last 2 MB)" >>"$f"
	done
	tar czf "$OUT/logs.tar.gz.tmp" -C "$LOGS" . 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
}
trap pack EXIT

# Runs a command bounded by what is left of the budget; prints and returns its exit status.
bounded() {
	local name=$1; shift
	local t; t=$(left)
	if [ "$t" -lt 30 ]; then
		note "NOT RUN $name: time budget ($t s left)"
		return 125
	fi
	timeout --kill-after=10 "$t" "$@"
	local rc=$?
	[ $rc -eq 124 ] || [ $rc -eq 137 ] && note "TIMED OUT $name after the budget ($t s)"
	return $rc
}

section "machine"
{
	date -u
	uname -a
	nvidia-smi || echo "nvidia-smi FAILED"
	nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current --format=csv
	echo "compute apps now:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits
	NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
	[ -x "$NVCC" ] || NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
	"$NVCC" --version | tail -2
	gcc --version | head -1
	$PYTHON --version
	for t in autoreconf automake libtoolize pkg-config; do printf '%s: %s\n' "$t" "$(command -v $t || echo MISSING)"; done
	git log --oneline -1 2>/dev/null
} 2>&1 | tee "$LOGS/versions.txt"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
[ -x "$NVCC" ] || NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
CUDA_HOME=$(dirname "$(dirname "$NVCC")")
# One "env" record heads the test log; bench/report.py prints it as the machine section.
NVCC="$NVCC" $PYTHON - <<'EOF' >>"$GCR_TEST_LOG"
import json, os, subprocess, time
def q(args):
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=120).stdout.strip()
    except Exception as e:
        return "n/a (%s)" % e
print(json.dumps({"kind": "env", "t": time.time(),
                  "gpu": q(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
                  "kernel": q(["uname", "-r"]),
                  "nvcc": (q([os.environ["NVCC"], "--version"]).splitlines() or ["n/a"])[-1],
                  "torch": q(["python3", "-c", "import torch; print(torch.__version__, torch.version.cuda)"]),
                  "commit": q(["git", "log", "--oneline", "-1"])}))
EOF
tail -1 "$GCR_TEST_LOG"

section "build"
if [ "${GCR_BUILD_DONE:-0}" = 1 ]; then
	note "build: skipped (GCR_BUILD_DONE=1)"
else
	if bounded build bash -c './autogen.sh && ./configure --with-cuda=/usr/local/cuda && make -j16' >"$LOGS/build.log" 2>&1; then
		note "build: ok"
	else
		note "build: FAILED (last lines below; full log in logs.tar.gz build.log)"
		tail -40 "$LOGS/build.log"
	fi
fi
for v in GCRCTL:node-agent/gcrctl GCR_SHIM:shim/.libs/libgcr.so TESTPROG:tests/progs/gcr-testprog; do
	n=${v%%:*} d=${v#*:}; p=${!n:-$d}
	if [ -e "$p" ]; then echo "$n = $p ($(stat -c %s "$p") bytes)"; else note "MISSING $n = $p"; fi
done

section "nvcc"
mkdir -p "$GCR_GPU_BUILD"
nv() { # name, then nvcc arguments
	local name=$1; shift
	if bounded "nvcc $name" "$NVCC" "$@" >>"$LOGS/nvcc.log" 2>&1; then
		echo "nvcc $name: ok"
	else
		note "nvcc $name: FAILED"
		tail -20 "$LOGS/nvcc.log"
	fi
}
if [ -f tests/progs/gcr_kernels.cu ]; then
	nv fatbin -fatbin -arch=sm_90 -o "$GCR_GPU_BUILD/gcr_kernels.fatbin" tests/progs/gcr_kernels.cu
else
	note "MISSING tests/progs/gcr_kernels.cu: no fatbin for gcr-testprog"
fi
RPATH=(-Xlinker -rpath -Xlinker "$CUDA_HOME/lib64")
nv rt_test -O2 -arch=sm_90 -o "$GCR_GPU_BUILD/rt_test" tests/gpu/rt_test.cu
nv rt_test_shared -O2 -arch=sm_90 --cudart shared "${RPATH[@]}" -o "$GCR_GPU_BUILD/rt_test_shared" tests/gpu/rt_test.cu
nv launch_bench -O2 -arch=sm_90 --cudart shared "${RPATH[@]}" -o "$GCR_GPU_BUILD/launch_bench" bench/launch_bench.cu
pack

if [ "$RUN_TESTS" = 1 ]; then
	section "GPU tests"
	bounded tests $PYTHON tests/gpu/test_gpu.py "${TEST_ARGS[@]}"
	rc=$?
	case $rc in
	0) note "tests: all passed" ;;
	3) note "tests: none failed, some NOT RUN" ;;
	125) ;;
	*) note "tests: FAILURES (exit status $rc)" ;;
	esac
	pack
fi

if [ "$RUN_IMAGE" = 1 ]; then
	section "GPU image tests"
	bounded image_tests $PYTHON tests/gpu/test_image_gpu.py
	rc=$?
	case $rc in
	0) note "image tests: all passed" ;;
	3) note "image tests: none failed, some NOT RUN" ;;
	125) ;;
	*) note "image tests: FAILURES (exit status $rc)" ;;
	esac
	pack
fi

if [ "$RUN_BENCH" = 1 ] && [ "$RUN_CR" = 1 ]; then
	section "bench: checkpoint/restore latency"
	if [ "$BENCH_CASES" != none ]; then
		# shellcheck disable=SC2086
		bounded bench_cr $PYTHON bench/bench_cr.py --reps "$BENCH_REPS" --cases "$BENCH_CASES" \
			--keep-context "$BENCH_KEEP" --reserved "$BENCH_RESERVED" --serving "$BENCH_SERVING" \
			--serving-cycles "$BENCH_SERVING_CYCLES" --driver-reps-big "$DRIVER_REPS_BIG" $BENCH_SIZES
		rc=$?
		[ $rc -eq 0 ] && note "bench_cr: ok" || { [ $rc -ne 125 ] && note "bench_cr: some runs FAILED or NOT RUN (exit $rc)"; }
	fi
	for prog in $BENCH_TORCH_PROGS; do
		# shellcheck disable=SC2086
		bounded "bench_cr_$prog" $PYTHON bench/bench_cr.py --prog "$prog" --cases sizes --reps "$BENCH_REPS" $BENCH_SIZES
		rc=$?
		[ $rc -eq 0 ] && note "bench_cr $prog: ok" || { [ $rc -ne 125 ] && note "bench_cr $prog: some runs FAILED or NOT RUN (exit $rc)"; }
	done
	pack
fi
if [ "$RUN_BENCH" = 1 ] && [ "$RUN_OVERHEAD" = 1 ]; then
	section "bench: steady-state overhead"
	bounded bench_overhead $PYTHON bench/bench_overhead.py --reps "$OVERHEAD_REPS" $OVERHEAD_ARGS
	rc=$?
	[ $rc -eq 0 ] && note "bench_overhead: ok" || { [ $rc -ne 125 ] && note "bench_overhead: some runs FAILED or NOT RUN (exit $rc)"; }
fi

section "report"
touch "$GCR_TEST_LOG" "$GCR_BENCH_LOG"
timeout 60 $PYTHON bench/report.py "$GCR_TEST_LOG" "$GCR_BENCH_LOG" >"$OUT/report.md" 2>&1 || echo "report.py FAILED"
cat "$OUT/report.md"
if $PYTHON -c 'import matplotlib' 2>/dev/null; then
	timeout 60 $PYTHON bench/report.py --plots "$OUT/plots" "$GCR_BENCH_LOG" >/dev/null || echo "plots FAILED"
else
	echo "(no matplotlib here: plots not drawn; python3 bench/report.py --plots DIR bench.jsonl elsewhere)"
fi
echo "compute apps left:"; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits

section "summary"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/run.log" | tail -1
echo "total $(($(date +%s) - START)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
case "${SUMMARY[*]}" in
*FAIL* | *MISSING* | *"NOT RUN"* | *"TIMED OUT"*) exit 1 ;;
esac
exit 0
