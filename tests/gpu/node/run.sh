#!/usr/bin/env bash
# tests/gpu/node/run.sh: a real Kubernetes GPU node on the GPU machine, beside NVIDIA's own stack,
# with GCR's chart installed with its defaults, and the scenarios of issue 30 driven by kubectl
# alone (test tooling; tests/gpu/node/README.md says what runs and why).
#
#   run.sh [--standin] unpack N      take part N of the payload (carried as .gpunode/partN, with
#                                    .gpunode/manifest), extract what has arrived so far
#   run.sh [--standin] probe         the machine, the driver, nvidia-ctk's CDI spec, runc in it
#   run.sh [--standin] model         make the models once (GPU: 16 GB Llama, random, fixed seed)
#   run.sh [--standin] up            the node (setsid daemons), the CDI spec, the test device
#                                    plugin, the workload image, GCR's chart (helm install)
#   run.sh [--standin] scenarios [LIST]   comma list (default: all, in order); see scenarios.py
#   run.sh [--standin] down          everything stopped and removed but the payload and the models
#   run.sh [--standin] status        what runs
# Commands chain: `run.sh unpack 3 up scenarios reference,cr down` runs them in order (a command
# that fails stops the chain, except down, which always runs when asked).
#
# Every command writes to $OUT (default /tmp/gcr-node-out): run.log (all output, appended),
# results.jsonl and report.md (scenarios), logs.tar.gz (every component's log, configs, the CDI
# spec, pod logs), and ends with one "N passed, N failed" line for its steps. Bounded: the whole
# invocation stops starting work GCR_NODE_BUDGET_S (540) seconds after it began.
#
# --standin (or GCR_NODE_STANDIN=1): the rehearsal on a machine without a GPU (the CI machine):
# the same payload, node, toolkit, chart and scenarios, with the stand-in driver (tests/fakecuda,
# from GCR_NODE_BUILD, default build/) in a fake driver root, a hand-written CDI spec, a small
# stand-in workload instead of the model, and a PATH without ip, iptables, nft, runc or
# containerd, as on the GPU machine. Hold /tmp/gcr-realnode.lock around it on a shared machine.
set -u -o pipefail

START=$(date +%s)
BUDGET=${GCR_NODE_BUDGET_S:-540}
DEADLINE=$((START + BUDGET))
TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
HERE=$TOP/tests/gpu/node
STANDIN=${GCR_NODE_STANDIN:-0}
if [[ ${1:-} == --standin ]]; then
	STANDIN=1
	shift
fi
OUT=${OUT:-/tmp/gcr-node-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

# ---- layout ----
if [[ $STANDIN == 1 ]]; then
	STATE=${GCR_NODE_STATE:-/var/tmp/gcr-node-standin}
	BUILD=$(cd "${GCR_NODE_BUILD:-$TOP/build}" 2>/dev/null && pwd) || BUILD=
	DRIVER_ROOT=$STATE/fakedriver
	BACKEND=standin
else
	STATE=${GCR_NODE_STATE:-/var/tmp/gcr-node}
	DRIVER_ROOT=${GCR_NODE_DRIVER_ROOT:-/usr/local/nvidia}
	BACKEND=torch
fi
ROOT=$STATE/root    # the payload, extracted
S=$STATE/node       # this node's state (certificates, configs, logs); removed by down
LOGS=$S/logs
BIN=$STATE/bin      # a symlink per command of the multi-call binaries, and the rest
MODELS=${GCR_NODE_MODELS:-$STATE/models}
NODE_NAME=gcr-gpu-node
BRIDGE=gcrgpu0
NODE_IP=10.89.0.1
POD_CIDR=10.89.0.0/24
SVC_CIDR=10.97.0.0/24
SVC_IP=10.97.0.1 # the kubernetes Service's ClusterIP: an address of the bridge (no kube-proxy)
API_PORT=443     # the Service's port: the API server listens on it itself
KUBELET_PORT=10250
KUBELET_ROOT=/var/lib/kubelet
PAUSE_IMAGE=docker.io/gcr-test/pause:1
GCR_IMAGE_REPO=docker.io/gcr-test/gcr
GCR_IMAGE_TAG=dev
WORKLOAD_IMAGE=docker.io/gcr-test/gpu-workload:dev
RELEASE=gcr
SYSTEM_NS=gcr-system
DP_REPLICAS=${GCR_NODE_DP_REPLICAS:-6} # nvidia.com/gpu time-slicing: pods sharing the GPU
DP_STRATEGY=${GCR_NODE_DP_STRATEGY:-cdi-cri}
STANDIN_GPU_MIB=${GCR_NODE_STANDIN_GPU_MIB:-1024}
# The stand-in GPU's environment, which its CDI spec gives GPU containers (the scenarios give it to
# a kubectl exec, which NVIDIA's runtime does not edit); its pool under the CDI spec's mount.
STANDIN_GPU_ENV="FAKECUDA_POOL=/run/fakecuda-gpu/pool FAKECUDA_MEM_MIB=$STANDIN_GPU_MIB FAKECUDA_POPULATE=1"

PASSED=0 FAILED=0
log() { printf '%s run.sh: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
ok() { PASSED=$((PASSED + 1)); log "ok: $*"; }
bad() { FAILED=$((FAILED + 1)); log "FAILED: $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
section() { echo; echo "=================== $* ($(($(date +%s) - START)) s elapsed, $(left) s left)"; }

# bounded SECONDS CMD...: a step bounded by its own limit and by what is left of the budget.
bounded() {
	local t=$1 l
	shift
	l=$(left)
	((l < t)) && t=$l
	if ((t < 5)); then
		log "NOT RUN (budget): $*"
		return 125
	fi
	timeout --kill-after=10 "$t" "$@"
}

kubectl() { "$BIN/kubectl" --kubeconfig="$S/kubeconfig" "$@"; }

# ---- logs into $OUT (on every exit) ----
collect() {
	[[ -d $STATE ]] || return 0
	local tmp
	tmp=$(mktemp -d /tmp/gcr-node-logs.XXXXXX)
	mkdir -p "$tmp/node" "$tmp/pods"
	local s=$S # after down, the node's state (its logs, the scenarios' pod logs) is $S.old
	[[ -d $s ]] || s=$S.old
	[[ -d $s/logs ]] && cp -a "$s/logs/." "$tmp/node/" 2>/dev/null
	for f in "$s"/*.yaml "$s"/*.toml "$s"/*.conflist "$s"/cdi/* "$STATE"/probe/* "$ROOT"/versions.txt "$STATE"/unpack.log; do
		[[ -f $f ]] && cp "$f" "$tmp/node/" 2>/dev/null
	done
	[[ -d /var/log/pods ]] && cp -a /var/log/pods/. "$tmp/pods/" 2>/dev/null
	if [[ -S $S/containerd/containerd.sock && -x $BIN/kubectl && -f $S/kubeconfig ]]; then
		{
			for what in nodes "pods -A -o wide" "events -A --sort-by=.lastTimestamp" "checkpoints,restores,gpuresidencies -A -o wide" "runtimeclasses" "daemonsets,deployments -A"; do
				echo "\$ kubectl get $what"
				# shellcheck disable=SC2086
				timeout 20 "$BIN/kubectl" --kubeconfig="$S/kubeconfig" get $what 2>&1
			done
			echo "\$ kubectl describe node"
			timeout 20 "$BIN/kubectl" --kubeconfig="$S/kubeconfig" describe node "$NODE_NAME" 2>&1
		} >"$tmp/node/cluster.txt" 2>&1
	fi
	# Big logs: their last 3 MB (the start is in run.log's summary lines anyway).
	find "$tmp" -type f -size +3M | while read -r f; do
		tail -c 3000000 "$f" >"$f.tail" && mv "$f.tail" "$f" && echo "(cut to its last 3 MB)" >>"$f"
	done
	tar czf "$OUT/logs.tar.gz.tmp" -C "$tmp" . 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"
	rm -rf "$tmp"
}
finish() {
	collect
	echo
	log "$* ($(($(date +%s) - START)) s); files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
	echo "$PASSED passed, $FAILED failed"
}

# ---- the payload ----
# pack.sh's payload is one tar, xz-compressed and cut into parts of at most 40 MiB. Its first
# member is INDEX (path, size, sha256 of every file after it), the small tools come first and the
# big binaries and images last, so a machine holding parts 1..N extracts every file those parts
# hold whole, before the rest has come.
cmd_unpack() {
	local n=$1 manifest=$TOP/.gpunode/manifest src=$TOP/.gpunode/part$1 want have total i
	section "unpack part $n"
	[[ -f $manifest ]] || { bad "no $manifest (carry .gpunode/manifest with every part)"; return 1; }
	mkdir -p "$STATE/parts"
	total=$(awk '$1 == "parts" {print $2}' "$manifest")
	want=$(awk -v p="part$n" '$1 == p {print $2}' "$manifest")
	[[ -n $want && -n $total ]] || { bad "$manifest names no part$n"; return 1; }
	if [[ -f $src ]]; then
		have=$(sha256sum "$src" | cut -d' ' -f1)
		[[ $have == "$want" ]] || { bad "part$n: sha256 $have, the manifest says $want (another pack?)"; return 1; }
		cp "$src" "$STATE/parts/part$n.tmp" && mv "$STATE/parts/part$n.tmp" "$STATE/parts/part$n"
	elif [[ -f $STATE/parts/part$n ]]; then
		log "part$n: not carried this time, but already on the machine"
	else
		bad "part$n: not carried ($src) and not on the machine ($STATE/parts)"
		return 1
	fi
	for i in $(seq 1 "$total"); do
		if [[ -f $STATE/parts/part$i ]]; then
			want=$(awk -v p="part$i" '$1 == p {print $2}' "$manifest")
			have=$(sha256sum "$STATE/parts/part$i" | cut -d' ' -f1)
			if [[ $have != "$want" ]]; then
				log "part$i on the machine is another pack's: removed (carry this pack's part$i)"
				rm -f "$STATE/parts/part$i"
			fi
		fi
	done
	extract "$total"
}

# extract TOTAL: the contiguous parts 1..k present, decompressed and unpacked into ROOT; then
# every file INDEX lists is checked and the whole ones are kept (a partial last file is not).
extract() {
	local total=$1 k=0 i files=()
	for i in $(seq 1 "$total"); do
		[[ -f $STATE/parts/part$i ]] || break
		k=$i
		files+=("$STATE/parts/part$i")
	done
	((k > 0)) || { bad "part 1 is not on the machine yet"; return 1; }
	rm -rf "$ROOT.new"
	mkdir -p "$ROOT.new"
	# A prefix of the stream: xz and tar stop at its end with an error; what they gave is kept.
	cat "${files[@]}" | xz -dc 2>"$STATE/unpack.log" | tar -x -C "$ROOT.new" 2>>"$STATE/unpack.log"
	[[ -f $ROOT.new/INDEX ]] || { bad "no INDEX in the payload's first part"; return 1; }
	local whole=0 missing=0 p size sum
	while read -r p size sum; do
		if [[ -f $ROOT.new/$p && $(stat -c %s "$ROOT.new/$p") == "$size" ]] &&
			[[ $(sha256sum "$ROOT.new/$p" | cut -d' ' -f1) == "$sum" ]]; then
			whole=$((whole + 1))
		else
			rm -f "$ROOT.new/$p"
			missing=$((missing + 1))
		fi
	done <"$ROOT.new/INDEX"
	rm -rf "$ROOT"
	mv "$ROOT.new" "$ROOT"
	if ((k == total && missing == 0)); then
		touch "$ROOT/.complete"
		ok "payload complete: $whole files from $total parts ($(du -sh "$ROOT" | cut -f1))"
	elif ((k == total)); then
		bad "all $total parts here but $missing files are not whole: $(tail -2 "$STATE/unpack.log" | tr '\n' ' ')"
		return 1
	else
		ok "parts 1..$k of $total here: $whole files whole so far, $missing to come"
	fi
	links
}

# links: BIN, a name per command, pointing into ROOT (made again after each extract).
links() {
	rm -rf "$BIN"
	mkdir -p "$BIN"
	local c
	for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd helm \
		gcr-test-nvidia-dp gcr-node-net gcr-node-pki; do
		[[ -x $ROOT/bin/gcr-node ]] && ln -s "$ROOT/bin/gcr-node" "$BIN/$c"
	done
	for c in containerd ctr; do
		[[ -x $ROOT/bin/gcr-ctrd ]] && ln -s "$ROOT/bin/gcr-ctrd" "$BIN/$c"
	done
	for c in runc nvidia-ctk nvidia-container-runtime nvidia-cdi-hook containerd-shim-runc-v2; do
		[[ -x $ROOT/bin/$c ]] && ln -s "$ROOT/bin/$c" "$BIN/$c"
	done
	if [[ -x $ROOT/criu/criu ]]; then
		# CRIU with the libraries it was built with beside it (runc finds "criu" in PATH). On the
		# GPU machine, which has no iptables-restore (CRIU's default network lock during a dump:
		# "Locking network failed", run 58), it locks with nftables: libnftables, linked into this
		# CRIU, to the kernel's nf_tables. On the command line, not in runc's configuration file
		# /etc/criu/runc.conf: CRIU 4.1.1 (and 4.2) reads "network-lock" from a file passed over
		# RPC and then compares argv[optind] with "restore" where there is no argv, a NULL
		# dereference (criu/config.c:1059): the segfaults of run 58 and run 66. Runc starts
		# "criu swrk FD", whose command line CRIU parses first and keeps. GCR_NODE_CRIU_NETLOCK:
		# another method (iptables, nftables, skip). The rehearsal too: its PATH has no iptables.
		local lock="--network-lock ${GCR_NODE_CRIU_NETLOCK:-nftables} "
		# After each run it keeps a copy of CRIU's restore log in the node's logs: containerd removes
		# a failed restore's work directory, and the log with it. (Not exec: sh waits; the restored
		# tree still goes to runc, the subreaper, when CRIU exits.)
		cat >"$BIN/criu" <<-EOF
			#!/bin/sh
			LD_LIBRARY_PATH=$ROOT/criu/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} $ROOT/criu/criu $lock"\$@"
			rc=\$?
			mkdir -p "$LOGS/criu" 2>/dev/null
			find "$S/containerd" -name restore.log -mmin -10 2>/dev/null | while read -r f; do
				cp "\$f" "$LOGS/criu/restore-\$(date +%s%N).log" 2>/dev/null
			done
			exit \$rc
		EOF
		chmod 755 "$BIN/criu"
	fi
	return 0
}

need_payload() {
	[[ -f $ROOT/.complete ]] || { bad "the payload is not complete in $ROOT: run unpack 1..N first (the machine may have been given back: start again from part 1)"; return 1; }
	[[ -x $BIN/kubectl ]] || links
}

# The PATH the node's daemons get: ours first; on the stand-in, the host's tools without those
# the GPU machine lacks (ip, iptables, nft, runc, containerd), so nothing can lean on them.
node_path() {
	if [[ $STANDIN != 1 ]]; then
		echo "$BIN:$PATH"
		return
	fi
	local d=$STATE/hostpath f b
	if [[ ! -d $d ]]; then
		mkdir -p "$d"
		for f in /usr/local/sbin/* /usr/local/bin/* /usr/sbin/* /usr/bin/* /sbin/* /bin/*; do
			b=${f##*/}
			[[ -x $f && ! -e $d/$b ]] || continue
			case $b in
			ip | ip6tables* | iptables* | nft | ebtables* | arptables* | xtables* | runc | containerd* | ctr | criu | kube* | etcd | helm | nvidia-*) continue ;;
			esac
			ln -s "$f" "$d/$b"
		done
	fi
	echo "$BIN:$d"
}

# ---- probe: facts of the machine and of NVIDIA's parts, before anything depends on them ----
cmd_probe() {
	section "probe"
	local f
	local p=$STATE/probe
	mkdir -p "$p"
	{
		date -u; uname -a; id; nproc; free -g; df -h / /var/tmp
		echo "--- cgroup"; stat -fc %T /sys/fs/cgroup; cat /proc/self/cgroup
		cat /sys/fs/cgroup/cgroup.controllers /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
		echo "--- capabilities"; grep -E 'Cap(Eff|Bnd)' /proc/self/status
		echo "--- tools"; for c in python3 ldconfig iptables nft ip mount unshare nsenter setsid curl tar xz openssl; do printf '%s: %s\n' "$c" "$(command -v "$c" || echo -)"; done
		echo "--- net"; cat /proc/sys/net/ipv4/ip_forward; cat /proc/net/dev
		echo "--- driver root $DRIVER_ROOT"; ls -la "$DRIVER_ROOT" "$DRIVER_ROOT/bin" 2>&1 | head -40
		ls "$DRIVER_ROOT/lib64" 2>&1 | head -80
		echo "--- devices"; ls -la /dev/nvidia* /dev/nvidia-caps 2>&1
		cat /proc/driver/nvidia/version 2>&1
		[[ $STANDIN == 1 ]] || { nvidia-smi -L; nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used --format=csv; } 2>&1
	} >"$p/machine.txt" 2>&1
	ok "machine facts in $p/machine.txt"
	# The toolkit and runc come first in the payload: part 1 holds them.
	for f in bin/nvidia-ctk bin/nvidia-cdi-hook bin/nvidia-container-runtime bin/runc versions.txt; do
		[[ -f $ROOT/$f ]] || { bad "$ROOT/$f not unpacked yet"; return 1; }
	done
	[[ -x $BIN/runc ]] || links
	cat "$ROOT/versions.txt"
	"$BIN/nvidia-ctk" --version; "$BIN/runc" --version
	cdi_spec "$p" && ok "CDI spec $(cdi_devices "$p/nvidia.json" | tr '\n' ' ')" || { bad "CDI spec (see $p/cdi-generate.log)"; return 1; }
	probe_runc "$p"
}

cdi_devices() { python3 -c 'import json,sys; print("\n".join(d["name"] for d in json.load(open(sys.argv[1]))["devices"]))' "$1"; }

# cdi_spec DIR: the CDI spec of the node's GPUs in DIR/nvidia.json, as the GPU operator's toolkit
# writes it: nvidia-ctk cdi generate against the driver's root. The GPU machine's driver lives in
# /usr/local/nvidia, its device nodes in /dev; the stand-in's in a fake driver root of the same
# layout, whose NVML (tests/fakecuda) answers what nvidia-ctk asks, and to that spec the stand-in
# adds what its containers need besides (its pool and size: environment and one mount).
cdi_spec() {
	local d=$1 root=$DRIVER_ROOT dev=/
	mkdir -p "$d"
	if [[ $STANDIN == 1 ]]; then
		standin_driver || return 1
		dev=$DRIVER_ROOT
	fi
	# One device per GPU (by index and by UUID, the default name strategies) and "all"; the
	# spec's hooks call the nvidia-cdi-hook we carry, and the host's ldconfig.
	bounded 120 "$BIN/nvidia-ctk" --debug cdi generate --driver-root="$root" --dev-root="$dev" \
		--nvidia-cdi-hook-path="$BIN/nvidia-cdi-hook" --ldconfig-path=/sbin/ldconfig \
		--format=json --output="$d/nvidia.json" >"$d/cdi-generate.log" 2>&1
	local rc=$?
	grep -v 'level=debug' "$d/cdi-generate.log" | tail -n 15
	((rc == 0)) && [[ -s $d/nvidia.json ]] || return 1
	if [[ $STANDIN == 1 ]]; then
		python3 - "$d/nvidia.json" "$STATE/fakegpu" "$STANDIN_GPU_ENV" <<-'EOF'
		import json, sys
		path, gpu, env = sys.argv[1:4]
		spec = json.load(open(path))
		edits = spec.setdefault("containerEdits", {})
		edits.setdefault("env", []).extend(env.split())
		edits.setdefault("mounts", []).append({"hostPath": gpu, "containerPath": "/run/fakecuda-gpu",
		                                       "options": ["rw", "nosuid", "nodev", "rbind", "rprivate"]})
		json.dump(spec, open(path, "w"))
		EOF
	fi
	# Readable, beside it (a second *.json in a spec directory would define every device twice).
	python3 -m json.tool "$d/nvidia.json" >"$d/nvidia-spec.txt" 2>/dev/null
	return 0
}

# The GPUs the node advertises: every UUID of the spec (on the GPU machine nvidia-smi's order).
gpu_uuids() {
	if [[ $STANDIN == 1 ]]; then
		cdi_devices "$1" | grep '^GPU-' | head -n 1
	else
		# One GPU is what the scenarios need; on a machine with more, the first (overcommit
		# needs both its pods on one GPU). GCR_NODE_GPUS=all advertises every one.
		if [[ ${GCR_NODE_GPUS:-first} == all ]]; then
			nvidia-smi --query-gpu=uuid --format=csv,noheader
		else
			nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1
		fi
	fi
}

# probe_runc DIR: the toolkit's injection alone, before Kubernetes: nvidia-container-runtime (mode
# cdi) runs a container whose NVIDIA_VISIBLE_DEVICES asks for GPU 0 through runc, in a bundle
# whose root file system is the host's /usr (read-only), and the container runs nvidia-smi (or
# the stand-in's fakesmi) and lists what it got.
probe_runc() {
	local d=$1 b=$1/bundle rc
	rm -rf "$b"
	mkdir -p "$b/rootfs"
	workload_rootfs "$b/rootfs" || { bad "probe rootfs"; return 1; }
	nvidia_config "$d/nvidia-container-runtime.toml" "$d" "$d/nvidia-container-runtime.log"
	python3 - "$b/config.json" "$STANDIN" <<-'EOF'
	import json, sys
	path, standin = sys.argv[1], sys.argv[2] == "1"
	cmd = ("ls -la /dev/nvidia* /lib64 /bin/nvidia-smi 2>&1; cat /etc/ld.so.conf.d/*; "
	       + ("ldconfig -p | grep -E 'libcuda|libnvidia-ml'; nvidia-smi mem 1" if standin else "ldconfig -p | grep -E 'libcuda|libnvidia-ml'; nvidia-smi -L"))
	spec = {
	  "ociVersion": "1.2.0",
	  "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/sh", "-c", cmd],
	              "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "NVIDIA_VISIBLE_DEVICES=0"], "cwd": "/",
	              "noNewPrivileges": True},
	  "root": {"path": "rootfs", "readonly": False},
	  "hostname": "gcr-probe",
	  "mounts": [
	    {"destination": "/proc", "type": "proc", "source": "proc"},
	    {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
	    {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
	    {"destination": "/usr", "type": "bind", "source": "/usr", "options": ["rbind", "ro"]},
	  ],
	  "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network", "cgroup")],
	            "resources": {"devices": [{"allow": False, "access": "rwm"}]}},
	}
	json.dump(spec, open(path, "w"), indent=1)
	EOF
	# create (what containerd calls, and what NVIDIA's runtime modifies), then start; the
	# container's output goes where create's went.
	local id=gcr-probe-$$ i st=
	(cd "$b" && PATH=$(node_path) NVIDIA_CTK_CONFIG_FILE_PATH="$d/nvidia-container-runtime.toml" \
		bounded 60 "$BIN/nvidia-container-runtime" create --bundle "$b" "$id") >"$d/probe-runc.txt" 2>&1
	rc=$?
	if ((rc == 0)); then
		"$BIN/runc" start "$id" >>"$d/probe-runc.txt" 2>&1
		for i in $(seq 60); do
			st=$("$BIN/runc" state "$id" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null)
			[[ $st == stopped || -z $st ]] && break
			sleep 0.5
		done
	fi
	"$BIN/runc" delete -f "$id" >/dev/null 2>&1
	cat "$d/probe-runc.txt"
	# The driver must be there: nvidia-smi's list (GPU) or the stand-in's library in the cache.
	if ((rc == 0)) && grep -qE '^GPU [0-9]+:|libcuda.so.1' "$d/probe-runc.txt"; then
		ok "a container through nvidia-container-runtime (cdi) and runc got the driver"
		return 0
	fi
	bad "the runc probe (create exit $rc, state ${st:-?}; $d/nvidia-container-runtime.log): no driver in the container"
	tail -n 30 "$d/nvidia-container-runtime.log"
	return 1
}

# nvidia_config FILE SPECDIR LOG: the NVIDIA container runtime's configuration (toolkit 1.20):
# CDI mode, specs from SPECDIR, runc from our payload (on the stand-in, through the wrapper that
# names the stand-in driver's CRIU configuration), a debug log.
nvidia_config() {
	local runc=$BIN/runc
	if [[ $STANDIN == 1 ]]; then
		runc=$STATE/standin-runc
		cat >"$runc" <<-EOF
		#!/bin/sh
		exec python3 '$HERE/standin_runc.py' '$ROOT/bin/runc' '$STATE/criu-runc.conf' "\$@"
		EOF
		chmod 755 "$runc"
	fi
	cat >"$1" <<-EOF
	accept-nvidia-visible-devices-envvar-when-unprivileged = true
	accept-nvidia-visible-devices-as-volume-mounts = false
	[nvidia-container-cli]
	root = "$DRIVER_ROOT"
	ldconfig = "@/sbin/ldconfig"
	[nvidia-container-runtime]
	debug = "$3"
	log-level = "debug"
	mode = "cdi"
	runtimes = ["$runc"]
	[nvidia-container-runtime.modes.cdi]
	default-kind = "nvidia.com/gpu"
	annotation-prefixes = ["cdi.k8s.io/"]
	spec-dirs = ["$2"]
	[nvidia-ctk]
	path = "$BIN/nvidia-ctk"
	EOF
}

# ---- the stand-in driver (rehearsal only) ----
standin_driver() {
	[[ -n $BUILD && -f $BUILD/tests/fakecuda/libcuda.so.1 ]] || { bad "no stand-in driver in GCR_NODE_BUILD (${BUILD:-unset})/tests/fakecuda"; return 1; }
	local slots devs v=580.159.04 n
	# The GPU machine's driver root's layout: versioned libraries with their soname links in
	# lib64, tools in bin (fakesmi as nvidia-smi), and device nodes of the real driver's numbers
	# (nothing opens them: the stand-in works in memory).
	mkdir -p "$DRIVER_ROOT/lib64" "$DRIVER_ROOT/bin" "$DRIVER_ROOT/dev" "$STATE/fakegpu"
	cp "$BUILD/tests/fakecuda/libcuda.so.1" "$DRIVER_ROOT/lib64/libcuda.so.$v"
	cp "$BUILD/tests/fakecuda/libnvidia-ml.so.1" "$DRIVER_ROOT/lib64/libnvidia-ml.so.$v"
	ln -sf "libcuda.so.$v" "$DRIVER_ROOT/lib64/libcuda.so.1"
	ln -sf "libnvidia-ml.so.$v" "$DRIVER_ROOT/lib64/libnvidia-ml.so.1"
	cp "$BUILD/tests/fakecuda/fakesmi" "$DRIVER_ROOT/bin/nvidia-smi"
	for n in nvidia0:195:0 nvidiactl:195:255 nvidia-uvm:238:0 nvidia-uvm-tools:238:1; do
		IFS=: read -r name major minor <<<"$n"
		[[ -c $DRIVER_ROOT/dev/$name ]] || mknod -m 666 "$DRIVER_ROOT/dev/$name" c "$major" "$minor" ||
			{ bad "mknod $DRIVER_ROOT/dev/$name"; return 1; }
	done
	# The node's one stand-in GPU: a pool file every GPU container shares, at its full size
	# (tests/k8s/testbed.sh says why: CRIU restores only a file of the size it dumped).
	chmod 1777 "$STATE/fakegpu"
	if [[ ! -f $STATE/fakegpu/pool ]]; then
		install -m 0666 /dev/null "$STATE/fakegpu/pool"
		slots=$(sed -n 's/^#define FAKE_POOL_SLOTS \([0-9]*\).*/\1/p' "$TOP/tests/fakecuda/fakecuda_pool.h")
		devs=$(sed -n 's/^#define FAKE_POOL_DEVICES \([0-9]*\).*/\1/p' "$TOP/tests/fakecuda/fakecuda_pool.h")
		truncate -s $((slots * (8 + 8 * devs))) "$STATE/fakegpu/pool"
	fi
	# The stand-in driver's pool lock is an open-file-description lock CRIU must be told about
	# (the real driver's device files are closed by its checkpoint): runc passes the
	# configuration an annotation names to CRIU. A wrapper adds it, as the CI test bed's
	# stand-in runtime does; on the GPU machine runc is called directly.
	printf 'file-locks\n' >"$STATE/criu-runc.conf"
	return 0
}

# ---- the workload image: tiny, the host's userland by hostPath ----
# workload_rootfs DIR: the image's files. Real directories where CDI and the kubelet mount
# files (/lib64, /bin, /etc, ...): the host's /usr (and on the GPU /opt/torch) come read-only by
# hostPath, and a mount target under a read-only mount could not be made. The loader and sh are
# links into /usr.
workload_rootfs() {
	local r=$1
	mkdir -p "$r"/{bin,sbin,lib,lib64,usr,etc/ld.so.conf.d,tmp,var/tmp,root,home/gcr,opt/gcr-node,opt/torch,models,proc,sys,dev,run}
	chmod 1777 "$r/tmp" "$r/var/tmp"
	ln -sf /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$r/lib64/ld-linux-x86-64.so.2"
	ln -sf /usr/bin/sh "$r/bin/sh"
	ln -sf /usr/bin/bash "$r/bin/bash"
	printf 'root:x:0:0:root:/root:/bin/sh\ngcr:x:1000:1000:gcr:/home/gcr:/bin/sh\ngcr2:x:2000:2000:gcr2:/home/gcr:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\ngcr:x:1000:\ngcr2:x:2000:\nnogroup:x:65534:\n' >"$r/etc/group"
	printf 'include /etc/ld.so.conf.d/*.conf\n' >"$r/etc/ld.so.conf"
	printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$r/etc/nsswitch.conf"
	cp "$HERE/llm_serve.py" "$r/opt/gcr-node/llm_serve.py"
	cp "$TOP/tests/gpu/nccl_ranks.py" "$r/opt/gcr-node/nccl_ranks.py"
}

workload_image() {
	local w=$S/workload
	rm -rf "$w"
	mkdir -p "$w"
	workload_rootfs "$w/rootfs"
	python3 "$TOP/tests/k8s/images/oci.py" layer "$w/rootfs" "$w/layer.tar.gz" --owner 0:0 &&
		python3 "$TOP/tests/k8s/images/oci.py" image "$w/workload.tar" --name "$WORKLOAD_IMAGE" \
			--layer "$w/layer.tar.gz" --cmd '["sleep","infinity"]' --workdir / \
			--env PYTHONUNBUFFERED=1 --env HOME=/tmp >/dev/null
}

# ---- the node ----
free_port() {
	local p
	for p in "$@"; do
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return 0; }
	done
	return 1
}

start_daemon() { # NAME CMD...: setsid, survives this command (and this device call)
	local name=$1
	shift
	log "starting $name"
	printf '%s\0' "$@" >"$S/$name.args"
	PATH=$(node_path) NVIDIA_CTK_CONFIG_FILE_PATH="$S/nvidia-container-runtime.toml" \
		setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$S/$name.pid"
}

alive() { [[ -f $S/$1.pid ]] && kill -0 "$(cat "$S/$1.pid")" 2>/dev/null; }

wait_for() { # WHAT DAEMON SECONDS CMD...
	local what=$1 d=$2 t=$3 end
	shift 3
	end=$(($(date +%s) + t))
	until "$@" >/dev/null 2>&1; do
		if ! alive "$d"; then
			tail -n 25 "$LOGS/$d.log"
			bad "$d exited while waiting for $what"
			return 1
		fi
		if (($(date +%s) >= end || $(left) < 5)); then
			tail -n 25 "$LOGS/$d.log"
			bad "timed out after $t s waiting for $what"
			return 1
		fi
		sleep 0.5
	done
	ok "$what"
}

kubeconfig() { # FILE CERT-NAME
	cat >"$1" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: gcr-gpu-node
	  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: $S/pki/ca.crt}
	users:
	- name: $2
	  user: {client-certificate: $S/pki/$2.crt, client-key: $S/pki/$2.key}
	contexts:
	- name: gcr-gpu-node
	  context: {cluster: gcr-gpu-node, user: $2, namespace: default}
	current-context: gcr-gpu-node
	EOF
	chmod 600 "$1"
}

api_ready() { curl -fsS --max-time 3 --cacert "$S/pki/ca.crt" --cert "$S/pki/admin.crt" --key "$S/pki/admin.key" "https://$NODE_IP:$API_PORT/readyz"; }
node_ready() {
	[[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]] &&
		kubectl get serviceaccount default -n default && kubectl get configmap kube-root-ca.crt -n default
}

cmd_up() {
	section "up"
	need_payload || return 1
	[[ $(id -u) == 0 ]] || { bad "up needs root"; return 1; }
	if [[ -e $S/up ]]; then
		bad "a node is up already ($S): run down first"
		return 1
	fi
	[[ -e $KUBELET_ROOT/.gcr-gpu-node || ! -e $KUBELET_ROOT/.gcr-testbed ]] || { bad "$KUBELET_ROOT belongs to a CI test bed: down it first"; return 1; }
	rm -rf "$S"
	mkdir -p "$S" "$LOGS" "$S/cdi"
	touch "$S/up"
	log "mode: $([[ $STANDIN == 1 ]] && echo "stand-in driver (rehearsal)" || echo "GPU, driver root $DRIVER_ROOT"); cgroup $(stat -fc %T /sys/fs/cgroup)"
	"$BIN/gcr-node-pki" "$S/pki" "$NODE_NAME" "$NODE_IP" "$SVC_IP" kubernetes kubernetes.default \
		kubernetes.default.svc kubernetes.default.svc.cluster.local && ok "certificates" || { bad "certificates"; return 1; }
	for u in admin controller-manager scheduler node; do kubeconfig "$S/$u.kubeconfig" "$u"; done
	cp "$S/admin.kubeconfig" "$S/kubeconfig"

	# The network: the bridge with the node's address and the Service's ClusterIP. Pods reach
	# both as addresses of this host (no forwarding, no NAT: neither iptables nor nft here).
	"$BIN/gcr-node-net" up "$BRIDGE" "$NODE_IP/24" "$SVC_IP/32" && ok "bridge $BRIDGE" || { bad "bridge"; return 1; }
	mkdir -p "$S/cni/net.d" "$S/cni/ipam"
	cat >"$S/cni/net.d/10-gcr-gpu-node.conflist" <<-EOF
	{"cniVersion": "1.0.0", "name": "gcr-gpu-node",
	 "plugins": [{"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": true,
	   "ipam": {"type": "host-local", "dataDir": "$S/cni/ipam",
	            "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
	            "routes": [{"dst": "0.0.0.0/0", "gw": "$NODE_IP"}]}}]}
	EOF
	cp "$S/cni/net.d/10-gcr-gpu-node.conflist" "$S/"

	# etcd and the API server.
	local ep pp
	ep=$(free_port 2379 12379 22379) && pp=$(free_port 2380 12380 22380) || { bad "no free etcd port"; return 1; }
	start_daemon etcd "$BIN/etcd" --name=default --data-dir="$S/etcd" \
		--listen-client-urls="http://127.0.0.1:$ep" --advertise-client-urls="http://127.0.0.1:$ep" \
		--listen-peer-urls="http://127.0.0.1:$pp" --initial-advertise-peer-urls="http://127.0.0.1:$pp" \
		--initial-cluster="default=http://127.0.0.1:$pp" --unsafe-no-fsync=true --log-level=warn
	wait_for "etcd" etcd 60 curl -fsS --max-time 2 "http://127.0.0.1:$ep/health" || return 1
	# On the Service's port, on every address of the host (the default bind address): the
	# node's address for the kubelet and us, the ClusterIP for pods (the kubernetes Service).
	start_daemon apiserver "$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$ep" \
		--bind-address=0.0.0.0 --secure-port="$API_PORT" --advertise-address="$NODE_IP" \
		--cert-dir="$S/apiserver-certs" --tls-cert-file="$S/pki/apiserver.crt" --tls-private-key-file="$S/pki/apiserver.key" \
		--client-ca-file="$S/pki/ca.crt" --service-cluster-ip-range="$SVC_CIDR" \
		--service-account-issuer="https://$NODE_IP:$API_PORT" --service-account-key-file="$S/pki/sa.pub" \
		--service-account-signing-key-file="$S/pki/sa.key" --allow-privileged=true --profiling=false \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--kubelet-client-certificate="$S/pki/apiserver-kubelet-client.crt" --kubelet-client-key="$S/pki/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$S/pki/ca.crt" --kubelet-preferred-address-types=InternalIP
	wait_for "kube-apiserver /readyz" apiserver 120 api_ready || return 1

	# NVIDIA's part: the CDI spec, the runtime's configuration.
	cdi_spec "$S/cdi" && ok "CDI spec: $(cdi_devices "$S/cdi/nvidia.json" | tr '\n' ' ')" || { bad "CDI spec"; return 1; }
	nvidia_config "$S/nvidia-container-runtime.toml" "$S/cdi" "$LOGS/nvidia-container-runtime.log"

	# containerd 2.x, its default runtime NVIDIA's (as the GPU operator sets it), CDI on.
	mkdir -p "$S/containerd"
	cat >"$S/containerd.toml" <<-EOF
	version = 3
	root = "$S/containerd/root"
	state = "$S/containerd/state"
	disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
	  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
	  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
	[grpc]
	  address = "$S/containerd/containerd.sock"
	[plugins."io.containerd.cri.v1.images"]
	  snapshotter = "overlayfs"
	  [plugins."io.containerd.cri.v1.images".pinned_images]
	    sandbox = "$PAUSE_IMAGE"
	  # Registry host configurations (hosts.toml) where a node keeps them: the chart's agent writes
	  # the one for its checkpoint-image registry here (eviction.restore.certsDir, TLS).
	  [plugins."io.containerd.cri.v1.images".registry]
	    config_path = "/etc/containerd/certs.d"
	[plugins."io.containerd.cri.v1.runtime"]
	  enable_selinux = false
	  disable_apparmor = true
	  # Root without CAP_SYS_RESOURCE (both machines): no process may lower its oom_score_adj.
	  restrict_oom_score_adj = true
	  # Eviction without loss: a container created from a checkpoint image is restored.
	  enable_experimental_restore_via_create = true
	  enable_cdi = true
	  cdi_spec_dirs = ["$S/cdi"]
	  [plugins."io.containerd.cri.v1.runtime".containerd]
	    default_runtime_name = "nvidia"
	    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
	        BinaryName = "$BIN/runc"
	        SystemdCgroup = false
	    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
	        BinaryName = "$BIN/nvidia-container-runtime"
	        SystemdCgroup = false
	  [plugins."io.containerd.cri.v1.runtime".cni]
	    bin_dirs = ["$ROOT/cni"]
	    conf_dir = "$S/cni/net.d"
	EOF
	start_daemon containerd "$BIN/containerd" --config "$S/containerd.toml"
	wait_for "containerd" containerd 60 "$BIN/ctr" --address "$S/containerd/containerd.sock" version || return 1
	# The CRI socket where a node has it (the chart's eviction.restore.criSocket default): the agent
	# removes checkpoint images from the node's store through it.
	mkdir -p /run/containerd /etc/containerd/certs.d
	ln -sfn "$S/containerd/containerd.sock" /run/containerd/containerd.sock
	workload_image && ok "workload image" || { bad "workload image"; return 1; }
	local img
	for img in "$ROOT/images/pause.tar" "$ROOT/images/gcr.tar" "$S/workload/workload.tar"; do
		bounded 180 "$BIN/ctr" --address "$S/containerd/containerd.sock" -n k8s.io images import --no-unpack "$img" \
			>>"$LOGS/images.log" 2>&1 && ok "image $(basename "$img")" || { tail -5 "$LOGS/images.log"; bad "importing $img"; return 1; }
	done

	# The controllers, the kubelet.
	start_daemon controller-manager "$BIN/kube-controller-manager" --kubeconfig="$S/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$S/controller-manager.kubeconfig" --authorization-kubeconfig="$S/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=0 --leader-elect=false --use-service-account-credentials=true \
		--service-account-private-key-file="$S/pki/sa.key" --root-ca-file="$S/pki/ca.crt" \
		--cluster-signing-cert-file="$S/pki/ca.crt" --cluster-signing-key-file="$S/pki/ca.key" \
		--service-cluster-ip-range="$SVC_CIDR" --allocate-node-cidrs=false --controllers='*'
	start_daemon scheduler "$BIN/kube-scheduler" --kubeconfig="$S/scheduler.kubeconfig" \
		--authentication-kubeconfig="$S/scheduler.kubeconfig" --authorization-kubeconfig="$S/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=0 --leader-elect=false
	mkdir -p "$KUBELET_ROOT"
	touch "$KUBELET_ROOT/.gcr-gpu-node"
	local hp
	hp=$(free_port 10248 10258 20248) || hp=0
	cat >"$S/kubelet.yaml" <<-EOF
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
	cgroupDriver: cgroupfs
	failCgroupV1: false
	failSwapOn: false
	address: $NODE_IP
	port: $KUBELET_PORT
	readOnlyPort: 0
	healthzBindAddress: 127.0.0.1
	healthzPort: $hp
	tlsCertFile: $S/pki/kubelet.crt
	tlsPrivateKeyFile: $S/pki/kubelet.key
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: true}
	  x509: {clientCAFile: $S/pki/ca.crt}
	authorization: {mode: Webhook}
	resolvConf: /etc/resolv.conf
	evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	serializeImagePulls: false
	maxPods: 40
	EOF
	start_daemon kubelet "$BIN/kubelet" --config="$S/kubelet.yaml" --kubeconfig="$S/node.kubeconfig" \
		--hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --node-labels=nvidia.com/gpu.present=true \
		--root-dir="$KUBELET_ROOT" --v=2
	wait_for "node Ready, default ServiceAccount" kubelet 120 node_ready || return 1
	# What the GPU operator creates; the chart's agents ask for it by default.
	kubectl apply -f - >/dev/null <<-EOF && ok "RuntimeClass nvidia" || { bad "RuntimeClass"; return 1; }
	apiVersion: node.k8s.io/v1
	kind: RuntimeClass
	metadata: {name: nvidia}
	handler: nvidia
	EOF

	# The test device plugin for nvidia.com/gpu (CDI names in its Allocate answers).
	local uuids=() u
	mapfile -t uuids < <(gpu_uuids "$S/cdi/nvidia.json")
	((${#uuids[@]} > 0)) || { bad "no GPU UUID to advertise"; return 1; }
	local dpargs=(--cdi-spec "$S/cdi/nvidia.json" --replicas "$DP_REPLICAS" --strategy "$DP_STRATEGY")
	for u in "${uuids[@]}"; do dpargs+=(--uuid "$u"); done
	start_daemon device-plugin "$BIN/gcr-test-nvidia-dp" "${dpargs[@]}"
	wait_for "nvidia.com/gpu allocatable" device-plugin 60 gpu_allocatable || return 1

	# GCR's chart with its default values; only the image is ours (imported above, so the
	# default pull policy IfNotPresent finds it).
	KUBECONFIG=$S/kubeconfig bounded 300 "$BIN/helm" install "$RELEASE" "$TOP/helm/gcr" -n "$SYSTEM_NS" --create-namespace \
		--set "image.repository=$GCR_IMAGE_REPO" --set "image.tag=$GCR_IMAGE_TAG" --wait --timeout 240s \
		>"$LOGS/helm-install.log" 2>&1 && ok "helm install (defaults, image set): $(tr '\n' ' ' <"$LOGS/helm-install.log")" ||
		{ cat "$LOGS/helm-install.log"; bad "helm install"; diagnose; return 1; }
	wait_for "gpucr.dev/shim allocatable" kubelet 90 shim_allocatable || { diagnose; return 1; }
	kubectl get nodes -o wide
	kubectl get pods -A -o wide
	kubectl describe node "$NODE_NAME" | sed -n '/^Capacity/,/^System Info/p'
}

gpu_allocatable() { [[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') -gt 0 ]]; }
shim_allocatable() { [[ $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.gpucr\.dev/shim}') -gt 0 ]]; }

diagnose() {
	kubectl get pods -A -o wide 2>&1
	kubectl describe pods -n "$SYSTEM_NS" 2>&1 | tail -n 80
	local p
	for p in $(kubectl get pods -n "$SYSTEM_NS" -o name 2>/dev/null); do
		echo "--- logs $p"
		kubectl logs -n "$SYSTEM_NS" "$p" --all-containers --tail=60 2>&1
	done
	tail -n 40 "$LOGS/nvidia-container-runtime.log" 2>/dev/null
	tail -n 40 "$LOGS/containerd.log" 2>/dev/null
}

# ---- model ----
cmd_model() {
	section "model"
	local size d
	mkdir -p "$MODELS"
	for size in 8b tiny; do
		d=$MODELS/llama-$size
		if [[ -f $d/.complete ]]; then
			ok "model $size present ($(du -sh "$d" | cut -f1))"
			continue
		fi
		rm -rf "$d"
		if bounded 420 python3 "$HERE/llm_serve.py" make --backend "$BACKEND" --size "$size" --dir "$d"; then
			touch "$d/.complete"
			chmod -R a+rX "$MODELS"
			ok "model $size made ($(du -sh "$d" | cut -f1))"
		else
			bad "making model $size"
			return 1
		fi
	done
}

# ---- scenarios ----
cmd_scenarios() {
	local list=${1:-all}
	section "scenarios $list"
	need_payload || return 1
	[[ -e $S/up ]] || { bad "no node up"; return 1; }
	local rc
	GCR_TESTBED_BIN=$BIN GCR_TESTBED_NODE=$NODE_NAME GCR_TESTBED_DIR=$S KUBECONFIG=$S/kubeconfig \
		GCR_NODE_STATE=$STATE GCR_NODE_BACKEND=$BACKEND GCR_NODE_MODELS=$MODELS GCR_NODE_STANDIN=$STANDIN \
		GCR_NODE_STANDIN_GPU_ENV="$STANDIN_GPU_ENV" GCR_NODE_OUT=$OUT GCR_NODE_DEADLINE=$((DEADLINE - 20)) GCR_NODE_KUBELET_PORT=$KUBELET_PORT \
		GCR_NODE_WORKLOAD_IMAGE=$WORKLOAD_IMAGE GCR_NODE_IMAGE_REPO=$GCR_IMAGE_REPO GCR_NODE_IMAGE_TAG=$GCR_IMAGE_TAG \
		python3 "$HERE/scenarios.py" "$list"
	rc=$?
	if ((rc == 0)); then ok "scenarios $list"; else bad "scenarios $list (exit $rc)"; fi
	return $rc
}

# ---- down ----
stop_daemon() {
	local name=$1 pid i
	[[ -f $S/$name.pid ]] || return 0
	pid=$(cat "$S/$name.pid")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$pid" 2>/dev/null
	fi
	rm -f "$S/$name.pid"
}

cmd_down() {
	section "down"
	local sock=$S/containerd/containerd.sock ids c m ns
	stop_daemon device-plugin
	stop_daemon kubelet
	if [[ -S $sock ]]; then
		ids=$("$BIN/ctr" --address "$sock" -n k8s.io tasks ls -q 2>/dev/null)
		for c in $ids; do "$BIN/ctr" --address "$sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1; done
		for c in $ids; do timeout 10 "$BIN/ctr" --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1; done
	fi
	stop_daemon scheduler
	stop_daemon controller-manager
	stop_daemon containerd
	# The runc shims of this node (their command line names its socket), by pid.
	for c in /proc/[0-9]*; do
		[[ $(tr '\0' ' ' <"$c/cmdline" 2>/dev/null) == *"-address $sock"* ]] && kill -KILL "${c#/proc/}" 2>/dev/null
	done
	# Whatever is left in the pods' cgroups (both hierarchies), then the cgroups.
	for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
		[[ -d $c ]] && find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
	done
	sleep 0.5
	for m in $(awk -v a="$KUBELET_ROOT" -v b="$S/" '$2 == a || index($2, a "/") == 1 || index($2, b) == 1 {print $2}' /proc/self/mounts | sort -r); do
		umount -l "$m" 2>/dev/null
	done
	for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
		[[ -d $c ]] && find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null
	done
	for ns in /var/run/netns/cni-*; do
		[[ -e $ns ]] || continue
		umount "$ns" 2>/dev/null
		rm -f "$ns"
	done
	stop_daemon apiserver
	stop_daemon etcd
	[[ -x $BIN/gcr-node-net ]] && "$BIN/gcr-node-net" down "$BRIDGE"
	[[ -e $KUBELET_ROOT/.gcr-gpu-node ]] && rm -rf "$KUBELET_ROOT"
	# What the chart's hostPath volumes made (sockets, the agent's records, the shim, images): a
	# later node must not find this one's records.
	rm -rf /var/log/pods /var/log/containers /var/lib/gcr/images /run/gcr /opt/gcr "$S.old"
	[[ $(readlink /run/containerd/containerd.sock 2>/dev/null) == "$S/"* ]] && rm -f /run/containerd/containerd.sock
	rm -rf /etc/containerd/certs.d/127.0.0.1_*_
	# The node's state is kept one round (its logs were collected into $OUT already).
	[[ -d $S ]] && mv "$S" "$S.old"
	rm -f "$S.old/up"
	ok "down"
}

cmd_status() {
	local d
	for d in etcd apiserver containerd controller-manager scheduler kubelet device-plugin; do
		if alive "$d"; then log "$d running"; else log "$d not running"; fi
	done
	[[ -f $ROOT/.complete ]] && log "payload complete" || log "payload incomplete"
	ls "$MODELS" 2>/dev/null
}

# ---- main ----
is_cmd() { case ${1:-} in unpack | probe | model | up | scenarios | down | status) return 0 ;; esac; return 1; }
trap 'finish "run.sh done"' EXIT
log "run.sh $* (state $STATE, out $OUT, budget ${BUDGET} s$([[ $STANDIN == 1 ]] && echo ', stand-in'))"
rc=0
while [[ $# -gt 0 ]]; do
	cmd=$1
	shift
	arg=
	if [[ $cmd == unpack ]] || { [[ $cmd == scenarios ]] && [[ $# -gt 0 ]] && ! is_cmd "$1"; }; then
		arg=${1:?unpack needs a part number}
		shift
	fi
	if ((rc != 0)) && [[ $cmd != down ]]; then
		log "NOT RUN (an earlier command failed): $cmd $arg"
		continue
	fi
	case $cmd in
	unpack) cmd_unpack "$arg" ;;
	probe) cmd_probe ;;
	model) cmd_model ;;
	up) cmd_up ;;
	scenarios) cmd_scenarios "${arg:-all}" ;;
	down) cmd_down ;;
	status) cmd_status ;;
	*) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
	esac
	r=$?
	((r != 0)) && rc=$r
done
exit $rc
