#!/bin/bash
# Every function of a real nccl.h (the one configure found, NCCL_CPPFLAGS) that takes or returns a
# communicator is in the shim's list (shim/nccl/shim_nccl_hooks.def): one left out would hand the
# shim's handle to NCCL unmapped. Skipped (77) without an nccl.h.
set -euo pipefail
top=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
dir=$(printf '%s\n' ${NCCL_CPPFLAGS:-} | grep -v '^-' | head -n 1 || true)
[ -n "$dir" ] && [ -f "$dir/nccl.h" ] || { echo "no nccl.h (NCCL_CPPFLAGS=${NCCL_CPPFLAGS:-})"; exit 77; }
exec python3 - "$dir/nccl.h" "$top/shim/nccl/shim_nccl_hooks.def" <<'PY'
import re, sys
hdr, hooks = (open(p).read() for p in sys.argv[1:3])
strip = lambda s: re.sub(r'//[^\n]*', '', re.sub(r'/\*.*?\*/', '', s, flags=re.S))
hdr = strip(hdr)
listed = set(re.findall(r'^\s*SHIM_NCCL_\w+\(\s*(\w+)', strip(hooks), re.M))
decl = re.compile(r'([A-Za-z_][\w\s\*]*?)\b(nccl\w+)\s*\(([^;{}]*?)\)\s*;')
found, missing = 0, []
for ret, name, params in decl.findall(hdr):
    if 'ncclComm_t' not in ret + params:
        continue
    found += 1
    if name not in listed:
        missing.append(name)
print("%s: %d functions take or return a communicator; the list has %d entries" % (sys.argv[1], found, len(listed)))
for m in missing:
    print("FAIL %s takes or returns a communicator and is not in shim_nccl_hooks.def" % m)
if found < 20:
    print("FAIL only %d found: the header was not parsed" % found)
    sys.exit(1)
sys.exit(1 if missing else 0)
PY
