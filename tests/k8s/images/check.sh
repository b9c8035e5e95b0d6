#!/usr/bin/env bash
# Checks build.sh's image archives on a private containerd (test tooling, not part of the
# product): imports them and runs each with ctr, then removes everything it made.
#
#   tests/k8s/images/check.sh OUT_DIR      (OUT_DIR/{pause,gcr,workload}.tar from build.sh)
#
# pause     stays up until SIGTERM, then exits 0 (runs as the image's user, 65535)
# gcr       `gcr-agent --help` exits 0; in the image, every binary and the shim resolve their
#           libraries (the Dockerfile's ldd check), and the init container's tools exist
# workload  fakesmi prints its usage; gcr-testprog runs on the stand-in driver and fakesmi reads
#           its device memory, as root and as uid/gid 1000
# ctr 1.6's `run` has no --user, and a COMMAND given to it replaces ENTRYPOINT and CMD both; so
# the ENTRYPOINT and non-root runs use copies of the images with only their configuration
# changed (oci.py derive: CMD ["--help"]; USER 1000:1000; the same layers).
#
# The containerd is our own: root, state, socket and config in a temporary directory, CRI off,
# run in a private mount namespace with a tmpfs over /run, since containerd 1.6 puts shim
# sockets in /run/containerd/s whatever its --state (the node's containerd is never touched).
# Needs root, containerd, ctr and runc. About 15 s.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { printf 'images-check: %s\n' "$*" >&2; }
die() { printf 'images-check: FAIL: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 1 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || die "run as root"
for c in containerd ctr runc unshare python3; do
	command -v "$c" >/dev/null 2>&1 || die "'$c' not found in PATH"
done
OUT=$(cd "$1" && pwd)
for i in pause gcr workload; do [[ -f $OUT/$i.tar ]] || die "$OUT/$i.tar missing (run build.sh)"; done

# Everything below runs in a private mount namespace.
if [[ ${GCR_IMAGES_CHECK_NS:-} != "$$" ]]; then
	exec unshare --mount --propagation private env GCR_IMAGES_CHECK_NS=$$ "$0" "$@"
fi
mount -t tmpfs -o mode=0755 gcr-images-check /run

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gcr-images-check.XXXXXX")
ns=gcr-images-check-$$
sock=$tmp/containerd.sock
cd_pid=
# Every ctr below, also under timeout, talks to our containerd only.
export CONTAINERD_ADDRESS=$sock CONTAINERD_NAMESPACE=$ns

cleanup() {
	local rc=$? id p
	set +e
	if ((rc != 0)) && [[ -s $tmp/containerd.log ]]; then
		log "containerd's log ends:"
		tail -n 20 "$tmp/containerd.log" >&2
	fi
	if [[ -n $cd_pid ]]; then
		for id in $(ctr tasks ls -q 2>/dev/null); do
			ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1
			for _ in 1 2 3 4 5 6 7 8 9 10; do
				ctr tasks ls 2>/dev/null | grep -q "^$id .*RUNNING" || break
				sleep 0.2
			done
			ctr tasks delete "$id" >/dev/null 2>&1
		done
		for id in $(ctr containers ls -q 2>/dev/null); do ctr containers delete "$id" >/dev/null 2>&1; done
		kill "$cd_pid" 2>/dev/null && wait "$cd_pid" 2>/dev/null
	fi
	# Shims left behind (only ours: their command line names our socket).
	for p in /proc/[0-9]*; do
		grep -qsF -- "$sock" "$p/cmdline" && kill -9 "${p#/proc/}" 2>/dev/null
	done
	# Snapshot and task mounts under our directory (none after clean deletes).
	grep -F " $tmp/" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l
	rm -rf --one-file-system "$tmp"
	# The cgroups ctr made (/<namespace>/<id>, removed with each task): their now-empty parent.
	for p in /sys/fs/cgroup/"$ns" /sys/fs/cgroup/*/"$ns"; do
		[[ -d $p ]] && find "$p" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	if ((rc == 0)); then log "all checks passed"; else log "failed (rc $rc)"; fi
	exit $rc
}
trap cleanup EXIT

cat >"$tmp/config.toml" <<EOF
version = 2
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$sock"
[ttrpc]
  address = "$sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$tmp/opt"
EOF
containerd --config "$tmp/config.toml" --log-level warn >"$tmp/containerd.log" 2>&1 &
cd_pid=$!
for _ in $(seq 100); do
	ctr version >/dev/null 2>&1 && break
	kill -0 "$cd_pid" 2>/dev/null || { cat "$tmp/containerd.log" >&2; die "containerd exited"; }
	sleep 0.1
done
ctr version >/dev/null || die "containerd did not answer on $sock"
log "containerd $(ctr --version | awk '{print $3}') on $sock (namespace $ns)"

# ---- import: the names come from the archives' io.containerd.image.name ----
python3 "$HERE/oci.py" derive "$OUT/gcr.tar" "$tmp/gcr-help.tar" --name gcr-test/gcr:check-help \
	--cmd '["--help"]' >/dev/null
python3 "$HERE/oci.py" derive "$OUT/workload.tar" "$tmp/workload-1000.tar" \
	--name gcr-test/workload:check-1000 --user 1000:1000 >/dev/null
for a in "$OUT/pause.tar" "$OUT/gcr.tar" "$OUT/workload.tar" "$tmp/gcr-help.tar" "$tmp/workload-1000.tar"; do
	ctr images import "$a" >"$tmp/import.out" 2>&1 || { cat "$tmp/import.out" >&2; die "import $a"; }
done
names=$(ctr images ls -q)
for n in docker.io/gcr-test/pause:1 docker.io/gcr-test/gcr:dev docker.io/gcr-test/workload:dev; do
	grep -qxF "$n" <<<"$names" || die "import did not create $n (have: $names)"
	ctr images check "name==$n" | grep -q 'complete' || die "$n: content incomplete"
	log "imported $n"
done

# run ID IMAGE [ARGS...]: ctr run --rm with a time limit; output in $tmp/ID.out.
run() {
	local id=$1 image=$2
	shift 2
	timeout 120 ctr run --rm --fifo-dir "$tmp/fifo" "$image" "$id" "$@" >"$tmp/$id.out" 2>&1
}
expect() { # ID TEXT
	grep -qF -- "$2" "$tmp/$1.out" || { cat "$tmp/$1.out" >&2; die "$1: no '$2' in its output"; }
}

# ---- pause ----
timeout 120 ctr run --rm --fifo-dir "$tmp/fifo" docker.io/gcr-test/pause:1 pause >"$tmp/pause.out" 2>&1 &
run_pid=$!
for _ in $(seq 300); do
	ctr tasks ls 2>/dev/null | grep -q '^pause .*RUNNING' && break
	kill -0 "$run_pid" 2>/dev/null || break
	sleep 0.1
done
sleep 1
ctr tasks ls | grep -q '^pause .*RUNNING' || { ctr tasks ls; cat "$tmp/pause.out" >&2; die "pause: not running"; }
pid=$(ctr tasks ls | awk '$1 == "pause" {print $2}')
uid=$(awk '/^Uid:/ {print $2}' "/proc/$pid/status")
[[ $uid == 65535 ]] || die "pause: runs as uid $uid, not 65535"
ctr tasks kill -s SIGTERM pause
rc=0
wait "$run_pid" || rc=$?
[[ $rc -eq 0 ]] || { cat "$tmp/pause.out" >&2; die "pause: exited $rc after SIGTERM"; }
log "pause: up as uid 65535 until SIGTERM, then exit 0"

# pause reaps: run it as PID 1 over the workload image's files (which have a shell), orphan a
# child to it, and look for that child among the zombies once it has exited.
python3 - "$OUT/pause.tar" "$tmp/pause-bin" <<'PY'
import gzip, io, json, sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1])
    manifest = json.load(blob(json.load(t.extractfile("index.json"))["manifests"][0]["digest"]))
    layer = tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(manifest["layers"][0]["digest"]).read())))
    open(sys.argv[2], "wb").write(layer.extractfile("pause").read())
PY
chmod 0755 "$tmp/pause-bin"
ctr run -d --fifo-dir "$tmp/fifo" --mount "type=bind,src=$tmp/pause-bin,dst=/pause,options=rbind:ro" \
	docker.io/gcr-test/workload:dev reap /pause >/dev/null
for _ in $(seq 300); do
	ctr tasks ls 2>/dev/null | grep -q '^reap .*RUNNING' && break
	sleep 0.1
done
pid=$(ctr tasks ls | awk '$1 == "reap" && $3 == "RUNNING" {print $2}')
[[ -n $pid ]] || die "pause (reaping): did not start"
# children PID STATE...: the PIDs of PID's children in one of the states (R S D Z ...).
children() {
	local parent=$1 f
	shift
	for f in /proc/[0-9]*/stat; do
		# shellcheck disable=SC2016
		sed -n 's/^\([0-9]*\) (.*) \([A-Z]\) \([0-9]*\) .*/\1 \2 \3/p' "$f" 2>/dev/null
	done | awk -v p="$parent" -v s="$*" '$3 == p && index(s, $2) {print $1}'
}
timeout 60 ctr tasks exec --exec-id orphan reap sh -c 'sleep 3 & exit 0'
[[ -n $(children "$pid" R S D) ]] || die "pause (reaping): the orphan was not re-parented to pause"
for _ in $(seq 100); do
	[[ -z $(children "$pid" R S D Z) ]] && break
	sleep 0.1
done
[[ -z $(children "$pid" R S D Z) ]] || die "pause (reaping): its orphaned child stayed a zombie"
ctr tasks kill -s SIGTERM reap
for _ in $(seq 100); do
	ctr tasks ls | grep -q '^reap .*STOPPED' && break
	sleep 0.1
done
ctr tasks ls | grep -q '^reap .*STOPPED' || die "pause (reaping): still up after SIGTERM"
ctr tasks delete reap >/dev/null
ctr containers delete reap
log "pause: reaps the orphans it inherits as PID 1"

# ---- gcr ----
run agent-help docker.io/gcr-test/gcr:check-help || die "gcr: gcr-agent --help failed: $(cat "$tmp/agent-help.out")"
expect agent-help "usage: gcr-agent"
# shellcheck disable=SC2016 # runs in the image
run gcr-ldd docker.io/gcr-test/gcr:dev /bin/sh -ec '
	for f in /usr/local/bin/* /opt/gcr/lib/libgcr.so; do
		if ldd "$f" | grep "not found"; then echo "$f: missing libraries" >&2; exit 1; fi
	done
	ldd /opt/gcr/lib/libgcr.so | grep -q "libjansson.so.4 => /opt/gcr/lib/libjansson.so.4"
	for c in sh cp chmod mv ls basename; do command -v $c; done
	echo LDD-OK' || { cat "$tmp/gcr-ldd.out" >&2; die "gcr: the ldd check in the image failed"; }
expect gcr-ldd LDD-OK
log "gcr: ENTRYPOINT gcr-agent with --help exits 0; ldd check and the init container's tools pass in the container"

# ---- workload ----
# shellcheck disable=SC2016 # runs in the image
prog='set -e
	fakesmi >/tmp/usage 2>&1 || true
	grep -q "usage: fakesmi" /tmp/usage
	mkfifo /tmp/in
	gcr-testprog --module /usr/local/share/gcr-test/gcr_kernels.h --mib 4 --buffers 2 --threads 1 \
		--iters 2 --hold-after </tmp/in >/tmp/out &
	exec 3>/tmp/in
	n=0; until grep -q "RESULT ok" /tmp/out; do n=$((n+1)); [ $n -lt 300 ]; sleep 0.1; done
	echo "mem $(fakesmi mem $!) state $(fakesmi state $!)"
	echo exit >&3
	wait $!
	echo "uid $(id -u) gid $(id -g)"
	echo WORKLOAD-OK'
for img in dev check-1000; do
	id=workload-$img
	run "$id" docker.io/gcr-test/workload:$img sh -c "$prog" ||
		{ cat "$tmp/$id.out" >&2; die "workload ($img): failed"; }
	expect "$id" WORKLOAD-OK
	expect "$id" "state running"
	line=$(grep '^mem ' "$tmp/$id.out")
	[[ $line =~ ^mem\ ([0-9]+) && ${BASH_REMATCH[1]} -gt 0 ]] || die "workload ($img): $line"
	ids=$(grep '^uid ' "$tmp/$id.out")
	log "workload ($ids): fakesmi usage; gcr-testprog RESULT ok on the stand-in driver; fakesmi $line"
done
grep -q '^uid 1000 gid 1000$' "$tmp/workload-check-1000.out" || die "workload: not run as 1000:1000"
