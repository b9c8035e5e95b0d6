#!/bin/sh
# scripts/protoc-c.sh SRC.proto OUTDIR: writes OUTDIR/NAME.pb-c.c and OUTDIR/NAME.pb-c.h, the
# protobuf-c code of SRC.proto's messages. The build runs it (node-agent/agent.mk, into the build
# tree), and so does tests/fuzz/run.sh; the .proto files are the only sources.
#
# PROTOC_C: the compiler command (default protoc-c; configure may set
# "protoc --plugin=protoc-gen-c=..."). Services are left out of its input: they are served
# through gRPC core, and protobuf-c's RPC stubs would turn the kubelet's Registration.Register
# into a struct field named "register", a C keyword. The input keeps its name, so the outputs'
# names and their #include "NAME.pb-c.h" are those of a plain protoc-c run.
set -eu
[ $# -eq 2 ] || { echo "usage: $0 SRC.proto OUTDIR" >&2; exit 2; }
src=$1 out=$2
name=$(basename "$src" .proto)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gcr-protoc-c.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sed '/^service /,/^}/d' "$src" >"$tmp/$name.proto"
# shellcheck disable=SC2086 # PROTOC_C may be a command with arguments
${PROTOC_C:-protoc-c} --proto_path="$tmp" --c_out="$tmp" "$tmp/$name.proto"
# A failed compile leaves OUTDIR as it was.
mkdir -p "$out"
mv "$tmp/$name.pb-c.h" "$out/$name.pb-c.h"
mv "$tmp/$name.pb-c.c" "$out/$name.pb-c.c"
