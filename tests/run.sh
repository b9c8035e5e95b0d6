#!/bin/bash
# The project's test command (README): installs what is missing, builds, then runs
# every tier and ends with one "N passed, N failed" line. Exit status 0 only if all
# tiers ran and passed; a tier that cannot run counts as failed, never as passed.
set -uo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
jobs=$(nproc 2>/dev/null || echo 2)
passed=0 failed=0
summary=()
failed_logs=() # name=log of each tier that failed, for "what failed" at the end

# Adds the counts of a tier from its output: automake's "# PASS:/# FAIL:/# ERROR:"
# or a final "N passed, N failed" line.
count() { # name log rc
	local name=$1 log=$2 rc=$3 p=0 f=0
	if grep -q '^# PASS:' "$log"; then
		p=$(awk '/^# PASS:/{s+=$3} END{print s+0}' "$log")
		f=$(awk '/^# (FAIL|ERROR|XPASS):/{s+=$3} END{print s+0}' "$log")
	else
		local line
		line=$(grep -oE '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
		if [ -n "$line" ]; then
			p=${line%% passed*}
			f=${line##*, }; f=${f%% failed}
		fi
	fi
	if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
	if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then f=1; fi # ran nothing: not a pass
	if [ "$f" -gt 0 ]; then failed_logs+=("$name=$log"); fi
	passed=$((passed + p)); failed=$((failed + f))
	summary+=("$(printf '%-14s %4d passed %4d failed (exit %d)' "$name" "$p" "$f" "$rc")")
}

tier() { # name command...
	local name=$1; shift
	local log="$top/build-logs/$name.log"
	echo "=== $name: $*"
	local t0=$SECONDS
	# Every tier is bounded, so a hang fails its tier instead of eating CI's time.
	if declare -F "$1" >/dev/null; then
		( "$@" ) 2>&1 | tee "$log"
	else
		timeout -k 30 "${TIER_TIMEOUT_S:-2400}" "$@" 2>&1 | tee "$log"
	fi
	count "$name" "$log" "${PIPESTATUS[0]}"
	summary[-1]="${summary[-1]} in $((SECONDS - t0)) s"
}

mkdir -p build-logs
scripts/install-deps.sh || { echo "install-deps failed"; echo "0 passed, 1 failed"; exit 1; }
./autogen.sh >build-logs/autogen.log 2>&1 || { cat build-logs/autogen.log; echo "0 passed, 1 failed"; exit 1; }

# CRIU >= 4 for the image tests (tests/flow/test_image.py): built from Debian's source once, then cached.
t_criu=$SECONDS
if GCR_CRIU=$(scripts/install-criu.sh 2>build-logs/install-criu.log); then
	export GCR_CRIU
	echo "install-criu: $GCR_CRIU in $((SECONDS - t_criu)) s"
else
	unset GCR_CRIU
	echo "install-criu: failed after $((SECONDS - t_criu)) s (the image tests will fail): $(tail -n 3 build-logs/install-criu.log)"
fi

build_only() { # dir configure-args...
	local dir=$1; shift
	mkdir -p "$dir" && cd "$dir" && "$top/configure" -q "$@" && make -j"$jobs"
}
check_only() { # dir
	cd "$1" && timeout -k 30 1500 make -j"$jobs" check || { cat tests/*.log tests/*/*.log 2>/dev/null | tail -n 200; return 1; }
}

# The Kubernetes test bed's Go binaries (about 14 min uncached on 2 cores, 0 s cached)
# build in the background while the C tiers run. The tier testbed-build asks for them
# again: testbed.sh holds a lock while it builds, so that call waits for the background
# build and then takes its result from the cache.
tests/k8s/testbed.sh build >"$top/build-logs/testbed-build-bg.log" 2>&1 &
testbed_built() {
	local t0=$SECONDS
	if tests/k8s/testbed.sh build; then
		echo "testbed build: ready after $((SECONDS - t0)) s of waiting"
		echo "1 passed, 0 failed"
	else
		tail -n 30 "$top/build-logs/testbed-build-bg.log"
		echo "0 passed, 1 failed"
		return 1
	fi
}

# The build every tier below uses, with the test programs (make check with no tests), so that
# the background check below builds nothing the Kubernetes tiers read. Without it nothing can
# run: one failure, and stop.
echo "=== build"
t_build=$SECONDS
if ! ( build_only build && make -j"$jobs" check TESTS= ) >build-logs/build.log 2>&1; then
	tail -n 100 build-logs/build.log
	echo "tests: 0 passed, 1 failed (the build failed)"
	exit 1
fi
echo "build: $((SECONDS - t_build)) s"

# Two lines of tiers at once. The machine has two cores, and the Kubernetes tiers below
# spend most of their time waiting on the API, the kubelet and their pods; the C tiers
# (the checks of the build, the sanitizer build, valgrind, fuzzing) are CPU-bound. So the
# C tiers run in the background, one after another, at a lower CPU and I/O priority so
# that the Kubernetes tiers' waits keep their timing; each writes its own log, and
# bg_collect at the end reports them as tiers like the others (their time is their own
# wall time in the background). Run 36 (serial): the C tiers took 1444 s, the Kubernetes
# tiers 2609 s, 4027 s in all; run 38 (this way, the same 2-core machine): 2625 s in all, the
# background's tiers done 1000 s before the Kubernetes tiers.
bg_tier() { # name command...: one background tier, its log and "rc seconds" file
	local name=$1; shift
	local t0=$SECONDS rc
	# bash -c: the command may be one of the functions exported below.
	timeout -k 30 "${TIER_TIMEOUT_S:-2400}" bash -c '"$@"' "$name" "$@" >"$top/build-logs/$name.log" 2>&1
	rc=$?
	echo "$rc $((SECONDS - t0))" >"$top/build-logs/$name.rc"
}
bg_names=(unit-and-flow sanitizers valgrind fuzz dp-sanitizers)
rm -f build-logs/*.rc
# ASan must come first in a process the shim is preloaded into; leaks are valgrind's tier.
build_check_san() {
	export GCR_TEST_PRELOAD_PREFIX
	GCR_TEST_PRELOAD_PREFIX=$(gcc -print-file-name=libasan.so)
	export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
	export GCR_TEST_TIME_SCALE=${GCR_TEST_TIME_SCALE:-3} # tests/unit/util.h: ASan, and a lower priority
	build_only build-san --enable-sanitizers && check_only "$top/build-san"
}
c_tiers() {
	bg_tier unit-and-flow check_only "$top/build"
	bg_tier sanitizers build_check_san
	# The fuzz targets (one process each) run beside valgrind (one process).
	bg_tier fuzz tests/fuzz/run.sh &
	bg_tier valgrind tests/valgrind.sh build
	wait
	# The device plugin against the ASan/UBSan build (LeakSanitizer on): its gRPC state machine.
	bg_tier dp-sanitizers env GCR_BUILD_DIR=build-san tests/dp/test_deviceplugin.sh
}
lowprio=(nice -n 10)
command -v ionice >/dev/null 2>&1 && lowprio+=(ionice -c 2 -n 7)
export -f bg_tier build_only check_only build_check_san c_tiers
export top jobs
"${lowprio[@]}" bash -c c_tiers &
c_pid=$!
bg_collect() { # reports the background tiers once they have all ended
	wait "$c_pid"
	local name rc secs
	for name in "${bg_names[@]}"; do
		echo "=== $name (background; build-logs/$name.log)"
		if read -r rc secs <"build-logs/$name.rc" 2>/dev/null; then
			# The whole log of a failed tier, the end of a passed one.
			if [ "$rc" -eq 0 ]; then tail -n 15 "build-logs/$name.log"; else cat "build-logs/$name.log"; fi
			count "$name" "build-logs/$name.log" "$rc"
			summary[-1]="${summary[-1]} in $secs s (background)"
		else
			count "$name" /dev/null 1 # it never ran
			summary[-1]="${summary[-1]} (never ran)"
		fi
	done
}

tier deviceplugin tests/dp/test_deviceplugin.sh
# The GPU node's tooling (tests/gpu/node): scripts parse, Go sources gofmt-clean, its workload's
# protocol bit-exact under the shim on the stand-in across a gcrctl suspend and resume (~10 s).
tier gpu-node-tools tests/gpu/node/check.sh build
tier testbed-build testbed_built
tier k8s tests/k8s/test_crds.sh
tier k8s-agent python3 tests/k8s/test_agent_e2e.py build
# API faults at final status writes, then a storm of >= 100 operations with kube-apiserver, etcd
# and agent restarts (issue 15). Own test bed; under 5 min on 2 cores when it passes.
TIER_TIMEOUT_S=${TIER_TIMEOUT_S:-900} tier k8s-storm python3 tests/k8s/test_storm_e2e.py build
tier k8s-chart tests/k8s/test_chart.sh
# The real-node tiers' container images, built once from the build tree (about 15 s each time
# otherwise); if this fails, each tier builds its own and reports the failure.
if tests/k8s/images/build.sh build "$top/build/node-images" >build-logs/node-images.log 2>&1; then
	export GCR_NODE_IMAGES="$top/build/node-images"
else
	tail -n 20 build-logs/node-images.log
fi
# A real node: kubelet, containerd, runc, the chart with its defaults (tests/k8s/node/README.md).
tier k8s-node python3 tests/k8s/test_node_e2e.py build
# GPU memory overcommit by suspend on the real node (docs/preemption.md): pods of different
# PriorityClass on one 512 MiB stand-in GPU, an agent restart, readiness, a wake lost with a killed
# agent, a held pod taken over by its owner's Checkpoint, the policy switched off (5 min).
tier k8s-overcommit python3 tests/k8s/test_overcommit_e2e.py build
# Eviction without loss, the checkpoint at deletion (docs/preemption.md): opted-in pods drained,
# deleted plainly, deleted with too little time, the policy off; the drained pod's image restored;
# pods already suspended (a Checkpoint, a GPUResidency at 0) drained: imaged from their suspended state.
tier k8s-evict python3 tests/k8s/test_evict_e2e.py build
# Eviction without loss, the replacement pod (docs/preemption.md): a Deployment's pod imaged by an
# eviction Checkpoint, deleted, its replacement restored from the node agent's registry.
tier k8s-replace python3 tests/k8s/test_replace_e2e.py build
# Two real nodes on this machine, one images directory both see (images.shared, docs/images.md,
# "Shared storage"): a pod imaged on gcr-node restored into a new pod on gcr-node-2; refused off;
# images on a ReadWriteMany claim; a drained pod's replacement restored on the other node.
tier k8s-twonode python3 tests/k8s/test_twonode_e2e.py build
# A hostile tenant on a shared node (issue 33): one real-node bed, the chart with the attacked routes
# on, every module tests/k8s/hostile/cases_*.py (shares per pod, input bounds, the registry, crashes);
# cases_shares alone: 9 cases in about 7 min.
tier k8s-hostile python3 tests/k8s/test_hostile_e2e.py build

bg_collect
# What failed, named from each failed tier's log at the end, where CI's excerpt of this output
# looks: its FAIL/ERROR lines, or where it has none (a tier that could not start), its last lines.
if [ "${#failed_logs[@]}" -gt 0 ]; then
	echo
	echo "=== what failed (from build-logs/*.log)"
	for nl in "${failed_logs[@]}"; do
		name=${nl%%=*} log=${nl#*=}
		fails=$(grep -h -m 20 -E '^(FAIL|ERROR)[: ]' "$log" 2>/dev/null)
		echo "--- $name"
		if [ -n "$fails" ]; then echo "$fails"; else tail -n 8 "$log" 2>/dev/null || echo "(no log)"; fi
	done
fi
echo
echo "=== summary"
printf '%s\n' "${summary[@]}"
echo "tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
