#!/bin/bash
# Prints the path of a criu >= 4 binary. Uses $GCR_CRIU or a criu on $PATH when it is 4.x or
# newer; else builds Debian trixie's criu 4.1.1 from its source package (trixie's binary needs
# glibc 2.38, bookworm has 2.36), cached under ~/.cache/gcr-criu/<version>/ (a second run
# takes 0 s; with --cached it never builds). The tarball is checked against the SHA256 in Debian's signed Sources index.
set -euo pipefail
VERSION=4.1.1
cache=${GCR_CRIU_CACHE:-$HOME/.cache/gcr-criu}/$VERSION
is4() { "$1" --version 2>/dev/null | grep -qE '^Version: *([4-9]|[1-9][0-9])\.'; }
for c in "${GCR_CRIU:-}" "$cache/criu" "$(command -v criu 2>/dev/null || true)"; do
	if [ -n "$c" ] && [ -x "$c" ] && is4 "$c"; then echo "$c"; exit 0; fi
done
# --cached: only say where one is, never build (the test bed's containerd, tests/k8s/testbed.sh).
if [ "${1:-}" = --cached ]; then echo "install-criu: no criu >= 4 built or installed" >&2; exit 1; fi
echo "install-criu: building criu $VERSION from Debian's source into $cache" >&2
work=$(mktemp -d); chmod 755 "$work"; trap 'rm -rf "$work"' EXIT
need=(libbsd-dev libcap-dev libgnutls28-dev libnet1-dev libnftables-dev libnl-3-dev libprotobuf-c-dev
	libprotobuf-dev protobuf-c-compiler protobuf-compiler uuid-dev pkg-config python3-protobuf xz-utils)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
	apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi
mkdir -p "$work/lists/partial"
echo "deb-src http://deb.debian.org/debian trixie main" >"$work/sources.list"
apt=(apt-get -o Dir::Etc::sourcelist="$work/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$work/lists")
"${apt[@]}" update -qq >&2
# The .dsc answered 404 when this was written; the orig tarball is what is needed.
(cd "$work" && "${apt[@]}" source --download-only criu >&2 || true)
tarball=$(ls "$work"/criu_${VERSION}.orig.tar.* 2>/dev/null | head -n 1)
[ -n "$tarball" ] || { echo "install-criu: criu_${VERSION}.orig.tar.* not downloaded" >&2; exit 1; }
want=$(/usr/lib/apt/apt-helper cat-file "$work"/lists/*_source_Sources* 2>/dev/null | awk -v f="$(basename "$tarball")" '
	/^Checksums-Sha256:/ {s=1; next} /^[^ ]/ {s=0} s && $3 == f && !w {w=$1} END {print w}') || true
have=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ -z "$want" ] || [ "$want" != "$have" ]; then
	echo "install-criu: $(basename "$tarball"): SHA256 $have, the Sources index says '${want:-nothing}': refused" >&2
	exit 1
fi
tar -C "$work" -xf "$tarball"
src=$(find "$work" -maxdepth 1 -type d -name "criu-$VERSION*" | head -n 1)
make -C "$src" -j"${GCR_CRIU_JOBS:-2}" criu >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; exit 1; }
mkdir -p "$cache"
install -m 0755 "$src/criu/criu" "$cache/criu.new" && mv "$cache/criu.new" "$cache/criu"
is4 "$cache/criu" || { echo "install-criu: built criu does not report version 4" >&2; exit 1; }
echo "$cache/criu"
