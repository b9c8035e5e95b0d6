#!/bin/bash
# test_shim_hip_dlsym: hip_dlsym_check under the preloaded shim, on the stand-in HIP runtime.
set -u
so="$top_builddir/shim/.libs/libgcr.so"
sock=$(mktemp -d)
trap 'rm -rf "$sock"' EXIT
# Sanitizer builds need their runtime first in a preloaded process.
env LD_PRELOAD="${GCR_TEST_PRELOAD_PREFIX:+$GCR_TEST_PRELOAD_PREFIX:}$so" \
	LD_LIBRARY_PATH="$top_builddir/tests/fakehip" GCR_SOCKET_DIR="$sock" \
	"$top_builddir/tests/unit/hip-dlsym-check"
