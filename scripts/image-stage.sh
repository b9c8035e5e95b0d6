#!/usr/bin/env bash
# Lays out what the GCR image ships, from a configured and built tree: runs
# make install into STAGE, puts the shim and the libjansson.so.4 it needs
# together under STAGE/opt/gcr/lib (what the chart's init container copies to
# the node), drops headers and libtool files, checks every shipped binary finds
# its libraries, and writes STAGE/runtime-packages.txt: the Debian packages
# owning those libraries (the image's runtime stage installs exactly these).
#
#   scripts/image-stage.sh BUILD_DIR STAGE_DIR
#
# Used by the Dockerfile, and by tests/k8s/test_chart.sh on CI's build tree.
set -euo pipefail

[[ $# -eq 2 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
build=$1
stage=$(mkdir -p "$2" && cd "$2" && pwd)
prefix=/usr/local
shimdir=/opt/gcr/lib

die() { printf 'image-stage: %s\n' "$*" >&2; exit 1; }

make -C "$build" -s install DESTDIR="$stage" >/dev/null
[[ -f $stage$prefix/lib/libgcr.so ]] || die "make install did not install $prefix/lib/libgcr.so"
[[ -x $stage$prefix/bin/gcrctl ]] || die "make install did not install $prefix/bin/gcrctl"

mkdir -p "$stage$shimdir"
mv "$stage$prefix/lib/libgcr.so" "$stage$shimdir/"
# The shim's RUNPATH is $ORIGIN: libjansson.so.4 must sit beside it.
jansson=$(ldd "$stage$shimdir/libgcr.so" | awk '$1 == "libjansson.so.4" {print $3}')
[[ -f $jansson ]] || die "libgcr.so does not link libjansson.so.4"
cp -L "$jansson" "$stage$shimdir/libjansson.so.4"
# (Output captured first: grep -q exiting early would fail the pipe with SIGPIPE.)
dyn=$(readelf -d "$stage$shimdir/libgcr.so")
# shellcheck disable=SC2016 # a literal $ORIGIN
grep -q 'RUNPATH.*\[\$ORIGIN\]' <<<"$dyn" || die "libgcr.so has no RUNPATH \$ORIGIN"
rm -rf "${stage:?}$prefix/lib" "${stage:?}$prefix/include" "${stage:?}$prefix/share"
# gcr-hold, the preStop hook of pods imaged at eviction (docs/preemption.md), runs inside
# workload containers: beside the shim, which the device plugin mounts into each of them.
[[ -x $stage$prefix/bin/gcr-hold ]] || die "make install did not install $prefix/bin/gcr-hold"
mv "$stage$prefix/bin/gcr-hold" "$stage$shimdir/gcr-hold"
[[ $(file -b "$stage$shimdir/gcr-hold") == *"statically linked"* ]] || die "gcr-hold is not statically linked"

# GCR_STAGE_CRIU: a CRIU >= 4 binary shipped as /usr/local/sbin/criu (images of pods, docs/images.md
# "Pods"; the test bed's images set it; the Dockerfile does not yet), its libraries' packages below.
if [[ -n ${GCR_STAGE_CRIU:-} ]]; then
	[[ -x $GCR_STAGE_CRIU ]] || die "GCR_STAGE_CRIU=$GCR_STAGE_CRIU is not an executable"
	install -D -m 0755 "$GCR_STAGE_CRIU" "$stage$prefix/sbin/criu"
fi

# Every shipped ELF file must resolve its libraries; the shim from its own dir.
libs=()
while IFS= read -r -d '' f; do
	[[ $(file -b "$f") == ELF* ]] || continue
	[[ $(file -b "$f") == *"statically linked"* ]] && continue # gcr-hold: needs no library
	out=$(ldd "$f") || die "ldd $f failed"
	if grep -q 'not found' <<<"$out"; then
		die "$f: $(grep 'not found' <<<"$out" | tr -s ' \t' ' ')"
	fi
	while read -r p; do libs+=("$p"); done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<<"$out")
done < <(find "$stage" -type f -print0)
out=$(ldd "$stage$shimdir/libgcr.so")
grep -qF "libjansson.so.4 => $stage$shimdir/libjansson.so.4" <<<"$out" ||
	die "libgcr.so does not load libjansson.so.4 from its own directory: $out"

# The packages owning those libraries (not the ones we ship ourselves).
owner() {
	local p=$1 q
	for q in "$p" "$(readlink -f "$p")" "${p#/usr}" "/usr$p"; do
		out=$(dpkg -S "$q" 2>/dev/null) && { sed -n '1s/:.*//p' <<<"$out"; return 0; }
	done
	return 1
}
: >"$stage/runtime-packages.txt"
for p in $(printf '%s\n' "${libs[@]}" | sort -u); do
	[[ $p == "$stage"/* ]] && continue
	owner "$p" >>"$stage/runtime-packages.txt" || die "no Debian package owns $p"
done
sort -u -o "$stage/runtime-packages.txt" "$stage/runtime-packages.txt"
echo "image-stage: $stage: $(find "$stage" -type f | wc -l) files; runtime packages:" \
	"$(tr '\n' ' ' <"$stage/runtime-packages.txt")"
