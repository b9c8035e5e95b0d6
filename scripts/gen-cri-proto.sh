#!/bin/sh
# Regenerates node-agent/node/cri.pb-c.[ch] (committed) from node-agent/node/cri.proto, the
# subset of the CRI's runtime.v1 messages gcr-agent's image sweep uses (agent_cristore.c).
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp node-agent/node/cri.proto "$tmp/"
protoc-c --proto_path="$tmp" --c_out="$tmp" "$tmp/cri.proto"
cp "$tmp/cri.pb-c.c" "$tmp/cri.pb-c.h" node-agent/node/
