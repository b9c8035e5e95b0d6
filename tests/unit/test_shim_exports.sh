#!/bin/bash
# test_shim_exports: libgcr.so exports exactly the interposed driver, HIP runtime and NCCL entry
# points (every name in shim_hooks.def, shim_hip_hooks.def and shim_nccl_hooks.def, with its
# per-thread twin, C++ mangled name or NCCL profiling name) plus dlsym and dlvsym.
set -u
so="$top_builddir/shim/.libs/libgcr.so"
def="$top_srcdir/shim/cuda/shim_hooks.def"
hipdef="$top_srcdir/shim/hip/shim_hip_hooks.def"
nccldef="$top_srcdir/shim/nccl/shim_nccl_hooks.def"
# The mangled names of the CXX entries: the string after "#define SHIM_HIP_CXX_<sym> \".
mangled() { awk -v s="SHIM_HIP_CXX_$1" '$1 == "#define" && $2 == s { getline; gsub(/[\t "]/, ""); print }' \
	"$top_srcdir/shim/hip/shim_hip_hook.c"; }
pass=0 fail=0
check() { if "$@"; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $*"; fi; }

actual=$(nm -D --defined-only "$so" | awk '{print $3}' | sed 's/@.*//' | sort -u)
expected=$( { echo dlsym; echo dlvsym;
  sed -n 's/^SHIM_\(GATE\|CUSTOM\)(\([A-Za-z0-9_]*\), \([A-Z]*\).*/\2 \3/p' "$def" |
  while read -r sym var; do
    echo "$sym"
    case $var in PTDS) echo "${sym}_ptds";; PTSZ) echo "${sym}_ptsz";; esac
  done
  sed -n 's/^SHIM_HIP_\(GATE\|CUSTOM\)(\([A-Za-z0-9_]*\), \([A-Z]*\).*/\2 \3/p' "$hipdef" |
  while read -r sym var; do
    echo "$sym"
    case $var in SPT) echo "${sym}_spt";; CXX) mangled "$sym";; esac
  done
  sed -n 's/^SHIM_NCCL_\(COLL\|USE\|CUSTOM\)(\([A-Za-z0-9_]*\), \([A-Z]*\).*/\2 \3/p' "$nccldef" |
  while read -r sym var; do
    echo "$sym"
    case $var in P) echo "p${sym}";; esac
  done; } | sort -u)
extra=$(comm -23 <(echo "$actual") <(echo "$expected"))
missing=$(comm -13 <(echo "$actual") <(echo "$expected"))
check test -z "$extra"
[ -z "$extra" ] || echo "exported but not in the hook list: $extra"
check test -z "$missing"
[ -z "$missing" ] || echo "in the hook list but not exported: $missing"
check test "$(echo "$expected" | wc -l)" -gt 100
# The HIP list is there too: at least 70 HIP names, the mangled launches among them.
check test "$(echo "$expected" | grep -c '^hip')" -gt 70
check grep -q '^_Z24hipExtModuleLaunchKernelP' <(echo "$expected")
# Every NCCL function that takes or returns a communicator, and its profiling twin.
check test "$(echo "$expected" | grep -c '^p\?nccl')" -gt 80
check grep -q '^pncclAllReduce$' <(echo "$expected")
# The shim must need nothing from the container image beyond libc and jansson.
needed=$(readelf -d "$so" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p' | grep -v -e '^libc\.so' -e '^libjansson\.so' -e '^ld-linux' -e '^libasan' -e '^libubsan' || true)
check test -z "$needed"
[ -z "$needed" ] || echo "unexpected dependencies: $needed"
check grep -q 'RUNPATH.*\$ORIGIN' <(readelf -d "$so")
echo "test_shim_exports: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
