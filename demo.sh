#!/bin/bash
# The main job: installs build dependencies, builds GCR, and suspends and resumes a
# real GPU process on this machine's GPU (driver-API test program holding known data,
# checked bit-exact after resume). Without an NVIDIA GPU it says so and runs the same
# flow on the stand-in driver (tests/fakecuda).
set -euo pipefail
cd "$(dirname "$0")"
top=$(pwd)
scripts/install-deps.sh
[ -x configure ] || ./autogen.sh >/dev/null 2>&1
mkdir -p build && cd build
[ -f Makefile ] || "$top/configure" -q
make -j"$(nproc)" >/dev/null
cd "$top"

sock=$(mktemp -d /tmp/gcr-demo.XXXXXX)
export GCR_SOCKET_DIR=$sock
module=$top/tests/progs/gcr_kernels.h
mib=1024
if nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
	echo "demo: GPU found: $(nvidia-smi -L | head -n 1)"
	module=$sock/gcr_kernels.fatbin
	nvcc -fatbin -arch=native -o "$module" tests/progs/gcr_kernels.cu
	mem() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
		awk -F', *' -v p="$1" '$1==p{m+=$2} END{print (m+0) " MiB"}'; }
else
	echo "demo: no NVIDIA GPU (or no nvcc) here: running the same flow on the stand-in driver (tests/fakecuda)"
	export LD_LIBRARY_PATH=$top/build/tests/fakecuda FAKECUDA_DIR=$sock
	mib=64
	mem() { echo "$("$top/build/tests/fakecuda/fakesmi" mem "$1") bytes"; }
fi

coproc PROG { exec env LD_PRELOAD="$top/build/shim/.libs/libgcr.so" \
	"$top/build/tests/progs/gcr-testprog" --mib "$mib" --buffers 4 --threads 2 --iters 50 --wait --module "$module"; }
prog_out=${PROG[0]} prog_in=${PROG[1]} # bash unsets PROG when the program exits
read -r -t 120 ready <&"$prog_out"
pid=${ready#READY pid=}; pid=${pid%% *}
echo "demo: test program pid $pid holds $(mem "$pid") of GPU memory"
echo go >&"$prog_in"
while read -r -t 300 line <&"$prog_out"; do [ "$line" = DONE ] && break; done
gcrctl=$top/build/node-agent/gcrctl
$gcrctl suspend "$pid"
echo "demo: while suspended: $(mem "$pid") of GPU memory; $($gcrctl status "$pid")"
$gcrctl resume "$pid"
echo check >&"$prog_in"
read -r -t 300 result <&"$prog_out"
echo "demo: after resume the program checked its data: $result"
rm -rf "$sock"
[ "$result" = "RESULT ok" ]
