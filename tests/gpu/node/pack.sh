#!/usr/bin/env bash
# tests/gpu/node/pack.sh: builds here everything the GPU node needs that the GPU machine lacks,
# and cuts it into parts that fit a device call (test tooling; tests/gpu/node/README.md).
#
#   tests/gpu/node/pack.sh [BUILD_DIR]      (root: the images are built with mmdebstrap)
#   GCR_NODE_PACK_IMAGES=DIR: take pause.tar and gcr.tar from DIR (a build.sh output) instead
#
# Into .gpunode/ (ignored by git): stage/ (the payload as files), part1..partN (one tar of stage/,
# xz-compressed, cut into pieces of at most GCR_NODE_PART_MIB, default 37 MiB), manifest (their
# sha256), sizes.txt (every file, raw and alone compressed). Then prints the device calls that
# carry and use them. The payload, in the order the parts carry it (run.sh unpack extracts every
# file the parts so far hold whole, so the toolkit and runc can be probed from part 1 on):
#   INDEX, versions.txt
#   bin/nvidia-ctk, bin/nvidia-container-runtime, bin/nvidia-cdi-hook   NVIDIA container toolkit
#   bin/runc                    static, with libseccomp
#   cni/bridge, cni/host-local, cni/loopback
#   criu/criu, criu/lib/*       CRIU 4.1.1 (scripts/install-criu.sh) and its libraries
#   bin/containerd-shim-runc-v2, bin/gcr-ctrd (containerd, ctr)   tools/ctrd
#   bin/gcr-node                kube-apiserver, controller-manager, scheduler, kubelet, kubectl,
#                               etcd, helm (Helm's library), the test device plugin, net, pki
#   images/pause.tar, images/gcr.tar   OCI archives (tests/k8s/images/build.sh), layers stored
#                               uncompressed so the payload's xz compresses them
# BUILD_DIR (default build/): a configured GCR build tree, for the GCR image.
set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
HERE=$TOP/tests/gpu/node
TOOLS=$HERE/tools
BUILD=$(cd "${1:-$TOP/build}" && pwd)
OUTD=$TOP/.gpunode
STAGE=$OUTD/stage
PART_MIB=${GCR_NODE_PART_MIB:-37} # a call carries at most 64 MiB: the tree (about 23 MiB on 2026-11-28) and one part
export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly

log() { printf 'pack: %s\n' "$*" >&2; }
die() { printf 'pack: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) == 0 ]] || die "run as root (tests/k8s/images/build.sh needs it)"
for c in go xz python3 gcc sha256sum split tar; do command -v "$c" >/dev/null || die "'$c' not found"; done
if [[ ! -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]]; then
	log "installing libseccomp-dev (a static runc links libseccomp.a)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev >&2 || die "apt-get install libseccomp-dev failed"
fi
modver() { awk -v m="$2" '($1 == m && $2 ~ /^v/) {print $2; exit} ($1 == "require" && $2 == m) {print $3; exit}' "$1"; }
start=$SECONDS
rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/cni" "$STAGE/criu/lib" "$STAGE/images"

# ---- Go ----
kver=$(modver "$TOOLS/kube/go.mod" k8s.io/kubernetes)
[[ $kver =~ ^v1\.([0-9]+)\. ]] || die "cannot tell the Kubernetes version from $TOOLS/kube/go.mod"
kld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kld+=" -X $p.gitVersion=$kver -X $p.gitMajor=1 -X $p.gitMinor=${BASH_REMATCH[1]}"
	kld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
log "gcr-node (Kubernetes $kver, etcd, helm, test device plugin, net, pki)"
(cd "$TOOLS/kube" && CGO_ENABLED=0 go build -trimpath -ldflags "$kld" -o "$STAGE/bin/gcr-node" ./gcr-node)
cver=$(modver "$TOOLS/ctrd/go.mod" github.com/containerd/containerd/v2)
[[ $cver == v2.* ]] || die "cannot tell the containerd version from $TOOLS/ctrd/go.mod"
log "gcr-ctrd (containerd $cver, ctr) and its runc shim"
cld="-s -w -X github.com/containerd/containerd/v2/version.Version=$cver"
(cd "$TOOLS/ctrd" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$cld" \
	-o "$STAGE/bin/gcr-ctrd" ./gcr-ctrd &&
	CGO_ENABLED=0 go build -trimpath -ldflags "$cld" -o "$STAGE/bin/containerd-shim-runc-v2" \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2)
tver=$(modver "$TOOLS/nvidia/go.mod" github.com/NVIDIA/nvidia-container-toolkit)
[[ $tver == v1.* ]] || die "cannot tell the toolkit version from $TOOLS/nvidia/go.mod"
log "NVIDIA container toolkit $tver (cgo: go-nvml opens libnvidia-ml at run time)"
(cd "$TOOLS/nvidia" && CGO_ENABLED=1 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -trimpath -o "$STAGE/bin/" \
	-ldflags "-s -w '-extldflags=-Wl,--export-dynamic -Wl,--unresolved-symbols=ignore-in-object-files -Wl,-z,lazy' -X github.com/NVIDIA/nvidia-container-toolkit/internal/info.version=${tver#v}" \
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk \
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime \
	github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook)
rver=$(modver "$TOOLS/runc/go.mod" github.com/opencontainers/runc)
[[ $rver == v1.* ]] || die "cannot tell the runc version from $TOOLS/runc/go.mod"
log "runc $rver (static, seccomp)"
(cd "$TOOLS/runc" && CGO_ENABLED=1 go build -trimpath -buildmode=pie -tags "seccomp urfave_cli_no_docs netgo osusergo" \
	-ldflags "-s -w -X main.gitCommit=$rver -linkmode external -extldflags -static-pie" \
	-o "$STAGE/bin/runc" github.com/opencontainers/runc)
file "$STAGE/bin/runc" | grep -q "static" || die "runc is not static: $(file "$STAGE/bin/runc")"
nver=$(modver "$TOOLS/cni/go.mod" github.com/containernetworking/plugins)
[[ $nver == v1.* ]] || die "cannot tell the CNI plugins' version from $TOOLS/cni/go.mod"
log "CNI plugins $nver (bridge, host-local, loopback)"
(cd "$TOOLS/cni" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$STAGE/cni/" \
	github.com/containernetworking/plugins/plugins/main/bridge \
	github.com/containernetworking/plugins/plugins/main/loopback \
	github.com/containernetworking/plugins/plugins/ipam/host-local)

# ---- CRIU and its libraries (all but glibc's: the GPU machine has its own, newer) ----
criu=$("$TOP/scripts/install-criu.sh") || die "scripts/install-criu.sh failed"
cp "$criu" "$STAGE/criu/criu"
ldd "$criu" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
	case $(basename "$lib") in
	libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libresolv.so.*) ;;
	*) cp -L "$lib" "$STAGE/criu/lib/" ;;
	esac
done
LD_LIBRARY_PATH=$STAGE/criu/lib "$STAGE/criu/criu" --version >/dev/null || die "the carried CRIU does not run"

# ---- images: the sandbox and GCR's (the Dockerfile's recipe), their layers uncompressed ----
img=${GCR_NODE_PACK_IMAGES:-}
if [[ -z $img ]]; then
	img=$OUTD/images
	rm -rf "$img"
	mkdir -p "$img"
	log "images (tests/k8s/images/build.sh $BUILD)"
	"$TOP/tests/k8s/images/build.sh" "$BUILD" "$img" >&2
fi
for i in pause gcr; do
	python3 "$TOP/tests/k8s/images/oci.py" plain "$img/$i.tar" "$STAGE/images/$i.tar" >/dev/null
done

# ---- versions, INDEX ----
{
	echo "packed $(date -u +%FT%TZ) from $(git -C "$TOP" log -1 --format='%h %s' 2>/dev/null)"
	echo "Kubernetes $kver, etcd $(modver "$TOOLS/kube/go.mod" go.etcd.io/etcd/server/v3), helm $(modver "$TOOLS/kube/go.mod" helm.sh/helm/v3) (library) in gcr-node"
	echo "containerd $cver in gcr-ctrd"
	echo "NVIDIA container toolkit $tver; runc $rver; CNI plugins $nver"
	echo "CRIU: $("$STAGE/criu/criu" --version 2>/dev/null | head -1 || LD_LIBRARY_PATH=$STAGE/criu/lib "$STAGE/criu/criu" --version | head -1)"
	echo "Go: $(go env GOVERSION)"
} >"$STAGE/versions.txt"
order=(versions.txt bin/nvidia-ctk bin/nvidia-container-runtime bin/nvidia-cdi-hook bin/runc cni/bridge cni/host-local
	cni/loopback criu/criu)
for f in "$STAGE"/criu/lib/*; do order+=("criu/lib/$(basename "$f")"); done
order+=(bin/containerd-shim-runc-v2 bin/gcr-ctrd bin/gcr-node images/pause.tar images/gcr.tar)
(cd "$STAGE" && for f in "${order[@]}"; do printf '%s %s %s\n' "$f" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"; done) >"$STAGE/INDEX"
[[ $(find "$STAGE" -type f | wc -l) == $((${#order[@]} + 1)) ]] || die "stage holds files the INDEX does not list"

# ---- the parts ----
log "compressing (xz, x86 filter, preset 9e, two threads: one stream, so every file a prefix of the parts holds can be extracted)"
rm -f "$OUTD"/part* "$OUTD/manifest"
(cd "$STAGE" && tar --owner=0 --group=0 --numeric-owner -cf - INDEX "${order[@]}") | xz --x86 --lzma2=preset=9e -T2 -c >"$OUTD/payload.xz"
split -b "${PART_MIB}M" -d -a 1 "$OUTD/payload.xz" "$OUTD/p"
n=0
for f in "$OUTD"/p[0-9]; do
	n=$((n + 1))
	mv "$f" "$OUTD/part$n"
done
{
	echo "parts $n"
	for i in $(seq 1 "$n"); do echo "part$i $(sha256sum "$OUTD/part$i" | cut -d' ' -f1)"; done
	echo "payload $(sha256sum "$OUTD/payload.xz" | cut -d' ' -f1)"
} >"$OUTD/manifest"
rm -f "$OUTD/payload.xz"
{
	printf '%-34s %12s %12s\n' file bytes xz-alone
	while read -r f size _; do
		printf '%-34s %12d %12d\n' "$f" "$size" "$(xz --x86 --lzma2=preset=6 -T2 -c "$STAGE/$f" | wc -c)"
	done <"$STAGE/INDEX"
	echo
	for i in $(seq 1 "$n"); do printf 'part%d %d bytes\n' "$i" "$(stat -c %s "$OUTD/part$i")"; done
} >"$OUTD/sizes.txt"
cat "$OUTD/sizes.txt" >&2
log "done in $((SECONDS - start)) s: $n part(s) in $OUTD"

# ---- the device calls ----
tree=$(cd "$TOP" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
biggest=$(stat -c %s "$OUTD/part1")
log "a call carries the tree ($((tree >> 20)) MiB, tracked and untracked files git does not ignore) and one part (at most $((biggest >> 20)) MiB): $(((tree + biggest) >> 20)) MiB of 64"
(((tree + biggest) < (62 << 20))) || log "WARNING: that is near the 64 MiB a call may carry: pack again with a smaller GCR_NODE_PART_MIB"
b=tests/gpu/node/run.sh
echo
echo "Device calls (each right after the last: the machine keeps files only while warm):"
for i in $(seq 1 "$n"); do
	case $i in
	1) cmd="bash $b unpack 1 probe model" ;;
	"$n") cmd="bash $b unpack $n up scenarios reference,cr,scale,nonroot,optout" ;;
	*) cmd="bash $b unpack $i" ;;
	esac
	echo "  $i. command: $cmd"
	echo "     carry: [\".gpunode/part$i\", \".gpunode/manifest\"]"
done
echo "  $((n + 1)). command: bash $b scenarios overcommit,hostmem,evict down"
echo "     carry: [\".gpunode/manifest\"]"
