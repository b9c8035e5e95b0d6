#!/usr/bin/env bash
# Builds the test bed's container images as OCI archives for `ctr -n k8s.io images import`,
# with no Docker engine and no registry (test tooling, not part of the product).
#
#   tests/k8s/images/build.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is a configured tree (../configure in it); the targets the images need are made.
# Writes OUT_DIR/{pause,gcr,workload}.tar and prints one line per image: NAME ARCHIVE.
#   docker.io/gcr-test/pause:1      /pause (pause.c, static) and nothing else; user 65535
#   docker.io/gcr-test/gcr:dev      the Dockerfile's runtime stage: Debian bookworm minbase +
#                                   STAGE/runtime-packages.txt + ca-certificates, then
#                                   scripts/image-stage.sh's /usr/local/bin and /opt/gcr/lib,
#                                   plus CRIU (scripts/install-criu.sh) in /usr/local/sbin;
#                                   ENTRYPOINT gcr-agent; ldd-checked like the Dockerfile
#   docker.io/gcr-test/workload:dev the same Debian root file system + gcr-testprog, gcr-hostile, fakesmi and
#                                   gcrctl in /usr/local/bin, the stand-in libcuda.so.1 and libnvidia-ml.so.1 in
#                                   /usr/lib/x86_64-linux-gnu, the module file gcr-testprog
#                                   loads at /usr/local/share/gcr-test/gcr_kernels.h; no shim;
#                                   CMD sleep infinity
# The Debian root file system (mmdebstrap, about a minute) and its layer are cached in
# $GCR_TESTBED_CACHE/images-KEY (default ~/.cache/gcr-testbed), KEY a hash of the recipe and the
# package list; a cache entry is built in a temporary directory, marked complete and renamed.
# The gcr and workload images share that layer. Needs root (mmdebstrap --mode=root, chroot).
#
# Environment: GCR_TESTBED_CACHE; GCR_IMAGES_MIRROR (default http://deb.debian.org);
# SOURCE_DATE_EPOCH (clamps the times in our own layers; default: HEAD's commit time).
set -euo pipefail

[[ $# -eq 2 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/../../.." && pwd)
BUILD=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
CACHE=${GCR_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gcr-testbed}
MIRROR=${GCR_IMAGES_MIRROR:-http://deb.debian.org}
# Bump when the root file system recipe changes in a way the key does not see.
RECIPE=2
SUITE=bookworm
PAUSE_NAME=gcr-test/pause:1
GCR_NAME=gcr-test/gcr:dev
WORKLOAD_NAME=gcr-test/workload:dev

log() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (mmdebstrap --mode=root and chroot)"
for c in mmdebstrap python3 gcc make tar flock sha256sum chroot; do
	command -v "$c" >/dev/null 2>&1 || die "'$c' not found in PATH"
done
[[ -f $BUILD/Makefile ]] || die "$BUILD is not a configured build tree (no Makefile)"
start=$SECONDS
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$TOP" log -1 --format=%ct 2>/dev/null || echo 0)}

work=$(mktemp -d "${TMPDIR:-/tmp}/gcr-images.XXXXXX")
tmp= # a cache entry being built (removed if we stop before renaming it)
trap 'rm -rf "$work" ${tmp:+"$tmp"}' EXIT

# ---- the build tree: what the images ship ----
make -C "$BUILD" -s -j2 all tests/progs/gcr-testprog tests/fakecuda/fakesmi \
	tests/fakecuda/libcuda.so.1 tests/fakecuda/libnvidia-ml.so.1 >/dev/null
# CRIU in the GCR image (images of pods): scripts/install-criu.sh's (cached) build.
criu=$("$TOP/scripts/install-criu.sh" 2>>"$work/install-criu.log") || die "scripts/install-criu.sh failed: $(tail -n 3 "$work/install-criu.log")"
GCR_STAGE_CRIU=$criu "$TOP/scripts/image-stage.sh" "$BUILD" "$work/stage" >&2
mapfile -t packages < <(cat "$work/stage/runtime-packages.txt"; echo ca-certificates)

# ---- the Debian root file system (cached) ----
# Slim: no manual pages, info, locales or documentation but the copyright files; merged /usr
# through mmdebstrap's own hook (usr-is-merged, not usrmerge with its perl).
# shellcheck disable=SC2016 # the hook's $1 (the chroot) is mmdebstrap's to expand
mm_args=(--mode=root --variant=minbase --format=tar --skip=output/dev
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
	"--include=$(IFS=,; echo "${packages[*]}")"
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-exclude=/usr/share/lintian/*'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-include=/usr/share/doc/*/copyright'
	--customize-hook='rm -rf "$1"/var/log/apt/* "$1"/var/log/dpkg.log "$1"/var/log/alternatives.log "$1"/var/lib/dpkg/*-old "$1"/var/cache/debconf/*-old'
	"$SUITE" ROOTFS_TAR
	"deb $MIRROR/debian $SUITE main"
	"deb $MIRROR/debian $SUITE-updates main"
	"deb $MIRROR/debian-security $SUITE-security main")
key=$({
	echo "recipe $RECIPE"
	mmdebstrap --version
	dpkg --print-architecture
	printf '%s\n' "${mm_args[@]}"
	sha256sum "$HERE/oci.py" | cut -d' ' -f1
} | sha256sum | cut -c1-16)
entry=$CACHE/images-$key
mkdir -p "$CACHE"
exec 9>"$CACHE/images.lock"
flock 9
if [[ -f $entry/complete ]]; then
	log "root file system: cached ($entry)"
else
	log "root file system: mmdebstrap $SUITE with ${packages[*]} (about a minute)"
	rm -rf "$entry"
	tmp=$(mktemp -d "$CACHE/.images-$key.XXXXXX")
	args=("${mm_args[@]}")
	args[${#args[@]}-4]=$tmp/rootfs.tar
	if ! mmdebstrap --quiet "${args[@]}" >"$work/mmdebstrap.log" 2>&1; then
		tail -n 30 "$work/mmdebstrap.log" >&2
		die "mmdebstrap failed (the lines above are the end of its log)"
	fi
	python3 "$HERE/oci.py" layer "$tmp/rootfs.tar" "$tmp/rootfs.layer.tar.gz"
	# Unpacked too, for the checks below (chroot into it under an overlay, never written).
	mkdir "$tmp/rootfs"
	tar -xf "$tmp/rootfs.tar" -C "$tmp/rootfs" --numeric-owner
	rm "$tmp/rootfs.tar"
	printf '%s\n' "${packages[@]}" >"$tmp/packages.txt"
	date -u +%FT%TZ >"$tmp/complete"
	mv -T "$tmp" "$entry"
	tmp=
fi
flock -u 9
rootfs=$entry/rootfs
rootfs_layer=$entry/rootfs.layer.tar.gz

# Runs SCRIPT under chroot in the image's files: the cached ROOTFS with APP_DIR on top, as a
# read-only overlay in a private mount namespace (gone when it exits); a copy where overlayfs
# is refused. ROOTFS APP_DIR SCRIPT IMAGE.
check_in_root() {
	local dev=$work/check-dev root=$work/check-root
	# The layers hold no device nodes; ldd's shell wants /dev/null.
	mkdir -p "$dev/dev" "$root"
	[[ -e $dev/dev/null ]] || mknod -m 666 "$dev/dev/null" c 1 3
	# shellcheck disable=SC2016 # expanded by the inner shell
	local mnt='mount -t overlay -o "lowerdir=$1:$2:$3" gcr-images "$4"'
	if unshare --mount --propagation private sh -c "$mnt" sh "$dev" "$2" "$1" "$root" 2>/dev/null; then
		# shellcheck disable=SC2016
		unshare --mount --propagation private sh -c "$mnt"' && exec chroot "$4" /bin/sh -ec "$5"' \
			sh "$dev" "$2" "$1" "$root" "$3" >&2 || die "$4: the check in the image failed"
	else
		log "$4: overlayfs refused; checking in a copy"
		cp -a "$1/." "$2/." "$dev/." "$root/"
		chroot "$root" /bin/sh -ec "$3" >&2 || die "$4: the check in the image failed"
		rm -rf "$root"
	fi
}

# ---- pause ----
mkdir -p "$work/pause"
gcc -static -Os -s -Wall -Wextra -Werror -o "$work/pause/pause" "$HERE/pause.c"
python3 "$HERE/oci.py" layer "$work/pause" "$work/pause.layer.tar.gz" --owner 0:0 --mtime "$epoch"
name=$(python3 "$HERE/oci.py" image "$OUT/pause.tar" --name "$PAUSE_NAME" \
	--layer "$work/pause.layer.tar.gz" --entrypoint '["/pause"]' --user 65535:65535 \
	--workdir / --mtime "$epoch")
echo "$name $OUT/pause.tar"

# ---- gcr: the Dockerfile's runtime stage ----
app=$work/gcr
mkdir -p "$app/usr/local/bin" "$app/usr/local/sbin" "$app/opt/gcr/lib"
cp -a "$work/stage/usr/local/bin/." "$app/usr/local/bin/"
cp -a "$work/stage/usr/local/sbin/." "$app/usr/local/sbin/"
cp -a "$work/stage/opt/gcr/lib/." "$app/opt/gcr/lib/"
# shellcheck disable=SC2016 # runs in the image
check_in_root "$rootfs" "$app" '
	for f in /usr/local/bin/* /usr/local/sbin/criu /opt/gcr/lib/libgcr.so; do
		if ldd "$f" | grep "not found"; then echo "$f: missing libraries" >&2; exit 1; fi
	done
	test -x /usr/local/bin/gcr-agent && test -x /usr/local/bin/gcrctl
	/usr/local/sbin/criu --version | grep -q "^Version: 4"
	test -f /opt/gcr/lib/libgcr.so && test -f /opt/gcr/lib/libjansson.so.4
	for c in sh cp chmod mv ls basename; do command -v $c >/dev/null; done
	test -s /etc/ssl/certs/ca-certificates.crt
	echo "images: gcr: ldd check passed"' gcr
python3 "$HERE/oci.py" layer "$app" "$work/gcr.layer.tar.gz" --owner 0:0 --mtime "$epoch"
name=$(python3 "$HERE/oci.py" image "$OUT/gcr.tar" --name "$GCR_NAME" \
	--layer "$rootfs_layer" --layer "$work/gcr.layer.tar.gz" \
	--entrypoint '["/usr/local/bin/gcr-agent"]' --workdir / --mtime "$epoch" \
	--label org.opencontainers.image.title=gcr \
	--label 'org.opencontainers.image.description=GCR: fast checkpoint/restore of GPU processes (gcr-agent, gcrctl, shim)')
echo "$name $OUT/gcr.tar"

# ---- workload: the test program on the stand-in driver, no shim ----
app=$work/workload
mkdir -p "$app/usr/local/bin" "$app/usr/lib/x86_64-linux-gnu" "$app/usr/local/share/gcr-test"
cp "$BUILD/tests/progs/gcr-testprog" "$BUILD/tests/progs/gcr-hostile" "$BUILD/tests/fakecuda/fakesmi" \
	"$work/stage/usr/local/bin/gcrctl" "$app/usr/local/bin/"
cp "$BUILD/tests/fakecuda/libcuda.so.1" "$BUILD/tests/fakecuda/libnvidia-ml.so.1" "$app/usr/lib/x86_64-linux-gnu/"
# gcr-testprog --module: the stand-in driver loads any readable file (a GPU wants a fatbin).
cp "$TOP/tests/progs/gcr_kernels.h" "$app/usr/local/share/gcr-test/"
chmod 0755 "$app/usr/local/bin/"* && chmod 0644 "$app/usr/lib/x86_64-linux-gnu/"lib*.so.1 \
	"$app/usr/local/share/gcr-test/gcr_kernels.h"
# shellcheck disable=SC2016 # runs in the image
check_in_root "$rootfs" "$app" '
	for f in /usr/local/bin/* /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; do
		if ldd "$f" | grep "not found"; then echo "$f: missing libraries" >&2; exit 1; fi
	done
	ldd /usr/local/bin/gcr-testprog | grep -q "libcuda.so.1 => .*/x86_64-linux-gnu/libcuda.so.1"
	echo "images: workload: ldd check passed"' workload
python3 "$HERE/oci.py" layer "$app" "$work/workload.layer.tar.gz" --owner 0:0 --mtime "$epoch"
name=$(python3 "$HERE/oci.py" image "$OUT/workload.tar" --name "$WORKLOAD_NAME" \
	--layer "$rootfs_layer" --layer "$work/workload.layer.tar.gz" \
	--cmd '["sleep","infinity"]' --workdir / --mtime "$epoch")
echo "$name $OUT/workload.tar"

log "done in $((SECONDS - start)) s: $(du -ch "$OUT"/{pause,gcr,workload}.tar | tail -1 | cut -f1) in $OUT"
