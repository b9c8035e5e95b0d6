#!/usr/bin/env bash
# tests/gpu/node/check.sh BUILD_DIR: the GPU node's tooling checked in CI, cheaply (a few seconds;
# the node itself is rehearsed with run.sh --standin, which needs the real-node lock and minutes):
# the scripts parse, the Go sources are gofmt-clean, and the workload's protocol holds on the
# stand-in driver under the shim: a run suspended and resumed by gcrctl mid-loop prints exactly
# the digests and chain of an uninterrupted run, and its weight checks pass; and the server, as
# the first process of a PID namespace (a container's), ends on SIGTERM. Ends with
# "N passed, N failed".
set -u -o pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=$(cd "${1:-$HERE/../../../build}" && pwd)
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
bad() { failed=$((failed + 1)); echo "FAILED: $*"; }

for f in run.sh pack.sh check.sh tools/gen-gomod.sh; do
	bash -n "$HERE/$f" && ok "bash -n $f" || bad "bash -n $f"
done
python3 -m py_compile "$HERE/scenarios.py" "$HERE/llm_serve.py" "$HERE/standin_runc.py" && ok "python compiles" || bad "python"
if command -v gofmt >/dev/null || [[ -x /usr/local/go/bin/gofmt ]]; then
	g=$(command -v gofmt || echo /usr/local/go/bin/gofmt)
	out=$("$g" -l "$HERE/tools")
	[[ -z $out ]] && ok "gofmt" || bad "gofmt: $out"
else
	bad "no gofmt"
fi

# The workload on the stand-in driver, under the shim, suspended and resumed mid-loop.
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; rm -rf "$work"' EXIT
pid=
export LD_LIBRARY_PATH=$BUILD/tests/fakecuda FAKECUDA_DIR=$work/gpu FAKECUDA_MEM_MIB=512 GCR_SOCKET_DIR=$work/sock
mkdir -p "$work/gpu" "$work/sock"
serve=(python3 "$HERE/llm_serve.py" serve --backend standin --dir "$work/m" --check-every 8)
if python3 "$HERE/llm_serve.py" make --backend standin --size tiny --dir "$work/m" >/dev/null &&
	"${serve[@]}" --max-iters 16 >"$work/ref.txt"; then
	ok "an uninterrupted stand-in run"
else
	bad "the uninterrupted stand-in run"
fi
LD_PRELOAD=$BUILD/shim/.libs/libgcr.so "${serve[@]}" --max-iters 40 --pace-s 0.05 >"$work/run.txt" 2>"$work/run.err" &
pid=$!
for _ in $(seq 100); do grep -q '^ITER 3 ' "$work/run.txt" 2>/dev/null && break; sleep 0.1; done
if "$BUILD/node-agent/gcrctl" suspend --unchecked "$pid" >"$work/ctl.txt" 2>&1 &&
	"$BUILD/node-agent/gcrctl" resume --unchecked "$pid" >>"$work/ctl.txt" 2>&1; then
	ok "gcrctl suspend and resume mid-loop"
else
	bad "gcrctl: $(cat "$work/ctl.txt")"
fi
wait "$pid"
python3 - "$work/ref.txt" "$work/run.txt" <<'EOF' && ok "bit-exact against the uninterrupted run" || bad "not bit-exact"
import hashlib, sys
def iters(path):
    out = []
    for line in open(path):
        f = line.split()
        if f and f[0] == "ITER":
            kv = dict(x.split("=", 1) for x in f[2:])
            out.append((int(f[1]), kv["d"], kv["chain"]))
        if f and f[0] == "WCHECK" and f[2] != "ok":
            sys.exit(f"{path}: {line.strip()}")
    return out
ref, run = iters(sys.argv[1]), iters(sys.argv[2])
digests = [d for _, d, _ in ref]
chain = b""
assert len(ref) == 16 and len(run) == 40, (len(ref), len(run))
for k, (i, d, c) in enumerate(run):
    chain = hashlib.sha256(chain + digests[i % 16].encode()).digest()
    assert i == k and d == digests[i % 16] and c == chain.hex()[:16], f"iteration {i}: {d} {c}"
EOF

# The server as a container runs it: the first process of its PID namespace, which ignores a
# signal it has no handler for. The kubelet's SIGTERM at a pod's deletion must end it (without
# its handler, kubectl drain waited out the 300 s grace period: the GPU node's rehearsal).
# unshare's child is the namespace's pid 1; its pid here is what a kubelet's runtime signals.
unshare --pid --fork --kill-child "${serve[@]}" --max-iters 0 --pace-s 0.05 >"$work/term.txt" 2>&1 &
ns_pid=$!
init=
# Its second iteration, followed as the file grows (tail ends with unshare), 10 s at most.
if timeout 10 grep -q -m 1 '^ITER 1 ' <(tail --pid="$ns_pid" -n +1 -f "$work/term.txt"); then
	init=$(pgrep -P "$ns_pid" | head -n 1)
fi
if [[ -n $init ]]; then
	# The bound: 137 below if SIGTERM did nothing (its fds away from our output's pipe).
	(sleep 10 && kill -KILL "$ns_pid") >/dev/null 2>&1 &
	bound=$!
	kill -TERM "$init"
	wait "$ns_pid"
	rc=$?
	pkill -P "$bound" sleep
	kill "$bound" 2>/dev/null
	if ((rc == 0)) && grep -q '^TERM ' "$work/term.txt"; then
		ok "the server ends on SIGTERM as its PID namespace's first process"
	else
		bad "the server on SIGTERM as its PID namespace's first process: exit $rc (137: outlived it by 10 s): $(tail -n 2 "$work/term.txt")"
	fi
else
	kill -KILL "$ns_pid" 2>/dev/null
	bad "the server in its own PID namespace did not start: $(tail -n 2 "$work/term.txt")"
fi

echo "$passed passed, $failed failed"
((failed == 0))
