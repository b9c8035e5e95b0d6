#!/usr/bin/env bash
# tests/dp/test_deviceplugin.sh: the device plugin (gcr-dp-standalone) against the Go
# kubelet stand-in (tests/k8s/kubelet-standin), then isolation between allocations, then
# gcr-agent itself with its devicePlugin section on, against the stand-in.
#
# Run from anywhere after a build. Environment:
#   GCR_BUILD_DIR      build directory holding node-agent/gcr-dp-standalone and gcr-agent (default build)
#   GCR_TESTBED_CACHE  where the stand-in binary is cached, as tests/k8s/testbed.sh
#                      (default ${XDG_CACHE_HOME:-~/.cache}/gcr-testbed)
#   GO                 Go toolchain (default: go in PATH, else /usr/local/go/bin/go)
#   GCR_DP_KEEP        set: keep the work directory (logs, Allocate dumps)
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${GCR_BUILD_DIR:-$top/build}
[[ $build = /* ]] || build=$top/$build
plugin=$build/node-agent/gcr-dp-standalone
cache=${GCR_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gcr-testbed}
standin_src=$top/tests/k8s/kubelet-standin
passed=0 failed=0

pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }
check() { # message command...
	local msg=$1; shift
	if "$@"; then pass "$msg"; else fail "$msg"; fi
}
check_not() { # message command... (passes when the command fails)
	local msg=$1; shift
	if "$@" >/dev/null 2>&1; then fail "$msg"; else pass "$msg"; fi
}
finish() {
	echo "$passed passed, $failed failed"
	[[ $failed -eq 0 && $passed -gt 0 ]]
	exit
}

# ---- the stand-in: built once per source/Go version, cached outside the repository ----
find_go() {
	if [[ -n ${GO:-} ]]; then :
	elif command -v go >/dev/null 2>&1; then GO=go
	elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
	else return 1
	fi
}
build_standin() {
	local key dir tmp
	find_go || { echo "no Go toolchain" >&2; return 1; }
	key=$({ GOTOOLCHAIN=local "$GO" env GOVERSION GOOS GOARCH
		cat "$standin_src/go.mod" "$standin_src/go.sum" "$standin_src/main.go"; } | sha256sum | cut -c1-16)
	dir=$cache/kubelet-standin-$key
	standin=$dir/kubelet-standin
	[[ -x $standin ]] && return 0
	mkdir -p "$cache" && tmp=$(mktemp -d "$cache/standin.XXXXXX") || return 1
	echo "building the kubelet stand-in into $dir" >&2
	if (cd "$standin_src" && GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
		"$GO" build -trimpath -ldflags='-s -w' -o "$tmp/kubelet-standin" .); then
		mkdir -p "$dir" && mv "$tmp/kubelet-standin" "$standin"
	fi
	rm -rf "$tmp"
	[[ -x $standin ]]
}

if [[ ! -x $plugin ]]; then
	fail "no $plugin: build first (make in $build)"
	finish
fi
t0=$SECONDS
if build_standin; then
	pass "kubelet stand-in ready ($((SECONDS - t0)) s)"
else
	fail "kubelet stand-in does not build"
	finish
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gcr-dp.XXXXXX")
pids=()
cleanup() {
	local p
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	[[ -n ${GCR_DP_KEEP:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
chmod 0755 "$work"
mkdir -p "$work/kubelet" "$work/shim"
kdir=$work/kubelet root=$work/alloc agent=$work/agent/agent.sock

# ---- configuration the plugin refuses ----
refuses() { # what flags...
	local what=$1; shift
	if "$plugin" --kubelet-dir "$kdir" --shim-dir "$work/shim" --socket-root "$root" \
		--agent-socket "$agent" "$@" >"$work/refused.log" 2>&1; then
		fail "plugin refuses $what (it started)"
	else
		pass "plugin refuses $what: $(tail -n 1 "$work/refused.log")"
	fi
}
refuses "a socket root inside the agent socket's dir" --socket-root "$work/agent/alloc"
refuses "2000 slots" --slots 2000
refuses "a resource name without a domain" --resource shim
refuses "a relative kubelet dir" --kubelet-dir kubelet
refuses "an endpoint with a slash" --endpoint ../x.sock

# ---- the plugin against the stand-in ----
"$plugin" --kubelet-dir "$kdir" --slots 4 --shim-dir "$work/shim" --socket-root "$root" \
	--agent-socket "$agent" --cdi-device gpucr.dev/shim=all --poll-ms 50 2>"$work/plugin.log" &
ppid=$!
pids+=("$ppid")
for _ in $(seq 50); do [[ -S $kdir/gcr-shim.sock ]] && break; sleep 0.1; done
check "plugin serves $kdir/gcr-shim.sock" test -S "$kdir/gcr-shim.sock"
check "plugin socket is mode 0600" test "$(stat -c %a "$kdir/gcr-shim.sock")" = 600

timeout 120 "$standin" -dir "$kdir" -slots 4 -shim-host-dir "$work/shim" -socket-root "$root" \
	-cdi-device gpucr.dev/shim=all -plugin-pid "$ppid" -dump "$work/alloc.json" -timeout 5s \
	>"$work/standin.log" 2>&1
rc=$?
sed 's/^/  standin: /' "$work/standin.log"
line=$(grep -oE '^[0-9]+ passed, [0-9]+ failed' "$work/standin.log" | tail -n 1)
sp=${line%% passed*} sf=${line##*, }; sf=${sf%% failed}
# Its checks count as ours; an exit without a clean summary is one more failure.
passed=$((passed + ${sp:-0})) failed=$((failed + ${sf:-0}))
if [[ -z $line || $rc -ne 0 ]] && [[ ${sf:-0} -eq 0 ]]; then
	fail "kubelet stand-in: exit $rc, ${line:-no summary}"
fi

# ---- isolation ----
readarray -t dirs < <(python3 - "$work/alloc.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("A", "B"):
    print(next(m["host_path"] for m in d[k]["mounts"] if m["container_path"] == "/run/gcr/sock"))
PY
)
adir=${dirs[0]:-} bdir=${dirs[1]:-}
if [[ -z $adir || -z $bdir || ! -d $adir || ! -d $bdir ]]; then
	fail "allocation socket dirs from the stand-in's dump"
	finish
fi
check "socket root is 0711: entered, never listed" test "$(stat -c %a "$root")" = 711
check "allocation dirs are 1733: a shim may create its socket, nobody lists or removes another's" \
	test "$(stat -c %a "$adir")" = 1733 -a "$(stat -c %a "$bdir")" = 1733

# A stand-in shim: listens on <dir>/gcr-<pid>.sock (mode 0600, as shim_ctl.c does).
cat >"$work/fakeshim.py" <<'PY'
import os, socket, sys
path = os.path.join(sys.argv[1], "gcr-%d.sock" % os.getpid())
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path); os.chmod(path, 0o600); s.listen(4)
print(path, flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"shim\n"); c.close()
PY
cat >"$work/connect.py" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(2)
try:
    s.connect(sys.argv[1]); print(s.recv(16).decode().strip()); sys.exit(0)
except OSError as e:
    print("refused:", e); sys.exit(1)
PY
# Not in a command substitution: its subshell's pids+= would be lost and cleanup would leave
# the shims running (holding, among others, the flock of whatever ran this tier).
start_shim() { # dir name -> sets shim_sock
	python3 "$work/fakeshim.py" "$1" >"$work/shim.$2" 2>&1 &
	pids+=("$!")
	for _ in $(seq 50); do [[ -s $work/shim.$2 ]] && break; sleep 0.1; done
	shim_sock=$(head -n 1 "$work/shim.$2")
}
start_shim "$adir" a
asock=$shim_sock
start_shim "$bdir" b
bsock=$shim_sock
check "shims listen in A's and B's dirs" test -S "$asock" -a -S "$bsock"

# The container of allocation A: its own private mount namespace in which only A's dir is
# mounted at the container path and every allocation dir under the socket root is hidden.
if unshare -m --propagation private true 2>/dev/null; then
	mkdir -p "$work/ctr/run/gcr/sock"
	out=$(unshare -m --propagation private bash -c '
		mount --bind "$1" "$2/ctr/run/gcr/sock" && mount -t tmpfs -o mode=0711 none "$3" || exit 9
		echo "list: $(ls "$2/ctr/run/gcr/sock" 2>/dev/null | tr "\n" " ")"
		python3 "$2/connect.py" "$2/ctr/run/gcr/sock/$(basename "$4")" && echo own=ok
		python3 "$2/connect.py" "$5" || echo other=refused
		ls "$3" | grep -q . && echo rootvisible=yes || echo rootvisible=no
	' _ "$adir" "$work" "$root" "$asock" "$bsock" 2>&1)
	echo "$out" | sed 's/^/  container A: /'
	check "container A reaches its own shim through its socket dir" grep -q '^own=ok' <<<"$out"
	check "container A cannot reach B's shim (path not there)" grep -q '^other=refused' <<<"$out"
	check "container A sees no allocation dir under the socket root" grep -q '^rootvisible=no' <<<"$out"
else
	fail "unshare -m not permitted: cannot build a container's mount view"
fi

# A host process of another uid that somehow learnt nothing: it cannot list the socket root
# (so cannot find B's dir), nor connect to B's shim even with its path (0600, other owner).
# A Python that uid 65534 may run (a per-user pyenv may not be).
nobody_py=
for p in "$(command -v python3)" "$(python3 -c 'import sys; print(sys.executable)' 2>/dev/null)" /usr/bin/python3; do
	if [[ -n $p ]] && setpriv --reuid=65534 --regid=65534 --clear-groups "$p" -c '' 2>/dev/null; then
		nobody_py=$p
		break
	fi
done
if [[ $(id -u) -eq 0 && -n $nobody_py ]]; then
	as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
	check "uid 65534 can create its own socket in A's dir (control)" \
		as_nobody "$nobody_py" -c "import socket; s=socket.socket(socket.AF_UNIX); s.bind('$adir/gcr-nobody.sock')"
	check_not "uid 65534 cannot list the socket root" as_nobody ls "$root"
	check_not "uid 65534 cannot list allocation A's dir" as_nobody ls "$adir"
	out=$(as_nobody "$nobody_py" "$work/connect.py" "$bsock" 2>&1)
	echo "  uid 65534 -> B's shim: $out"
	check "uid 65534 cannot connect to B's shim, even knowing its path" grep -q 'Permission denied' <<<"$out"
	as_nobody rm -f "$bsock" 2>/dev/null
	check "uid 65534 cannot remove B's shim socket" test -S "$bsock"
else
	fail "not root, or no Python for uid 65534: cannot test another uid"
fi

# Pod identity: the plugin hands every pod the same, identity-free settings; the agent's
# registry derives pod and container from the caller's cgroups, never from what it is told.
check "Allocate envs carry no pod identity and are the same for A and B" python3 - "$work/alloc.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
want = {"LD_PRELOAD", "GCR_SOCKET_DIR", "GCR_AGENT_SOCKET"}
a, b = d["A"]["envs"], d["B"]["envs"]
ok = set(a) == want and a == b
for v in list(a.values()) + list(b.values()):
    ok = ok and not any(w in v.lower() for w in ("pod", "namespace", "uid="))
ok = ok and all(m["read_only"] for m in d["A"]["mounts"] if m["container_path"] != "/run/gcr/sock")
sys.exit(0 if ok else 1)
PY

# ---- stop ----
kill -TERM "$ppid"
for _ in $(seq 100); do kill -0 "$ppid" 2>/dev/null || break; sleep 0.1; done
wait "$ppid"
check "plugin stops on SIGTERM with status 0" test $? -eq 0
check "plugin removed its socket" test ! -e "$kdir/gcr-shim.sock"
check_not "plugin log has no error line" grep -q '^error' "$work/plugin.log"
grep -E '^(error|warn)' "$work/plugin.log" | sed 's/^/  plugin: /' | head -n 20

# ---- gcr-agent itself with its devicePlugin section on (as the chart renders it) ----
# No API server here (the watches never list, so /readyz stays 503): what is checked is
# the device plugin's part of /readyz, registration and Allocate through the stand-in.
agent_bin=$build/node-agent/gcr-agent
if [[ ! -x $agent_bin ]]; then
	fail "no $agent_bin: build first"
	finish
fi
akdir=$work/kubelet-agent aroot=$work/alloc-agent arun=$work/agentrun
mkdir -p "$akdir" "$arun" "$work/proc"
chmod 0700 "$arun"
# Any CA will do: nothing answers on port 1 (the agent always verifies TLS).
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/ca.key" -out "$work/ca.crt" -days 1 \
	-subj /CN=gcr-dp-test >/dev/null 2>&1 || cp /etc/ssl/certs/ca-certificates.crt "$work/ca.crt"
cat >"$work/agent.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: none
  cluster:
    server: https://127.0.0.1:1
    certificate-authority: $work/ca.crt
users:
- name: u
  user:
    token: t
contexts:
- name: c
  context:
    cluster: none
    user: u
current-context: c
KC
agent_cfg() { # enabled slots [shimEnv lines] -> a config.yaml shaped like the chart's configmap.yaml
	local env=${3:-'    GCR_VMM_MIN_BYTES: "1048576"'}
	cat <<CFG
logLevel: "debug"
leaseNamespace: "gcr-system"
devicePlugin:
  enabled: $1
  resourceName: "gpucr.dev/shim"
  slots: $2
  kubeletDir: "$akdir"
  shimHostDir: "$work/shim"
  shimContainerDir: "/opt/gcr/lib"
  socketContainerDir: "/run/gcr/sock"
  cdiDevice: ""
  shimEnv:
$env
  socketRoot: "$aroot"
  pollMs: 50
CFG
}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
agent_args=(--kubeconfig "$work/agent.kubeconfig" --node-name node-dp --socket-dir "$arun"
	--registry-socket "$arun/agent.sock" --record-dir "$work/records" --metrics-address "127.0.0.1:$port" --proc-root "$work/proc")
agent_refuses() { # what enabled slots [shimEnv lines]
	agent_cfg "$2" "$3" "${4:-}" >"$work/agent-bad.yaml"
	timeout 10 "$agent_bin" --config "$work/agent-bad.yaml" "${agent_args[@]}" >"$work/agent-bad.log" 2>&1
	local rc=$?
	if ((rc == 0 || rc == 124)); then # 124: still running after 10 s, i.e. it started
		fail "agent refuses $1 (it ran: exit $rc)"
	else
		pass "agent refuses $1: $(grep -m1 '^gcr-agent:' "$work/agent-bad.log")"
	fi
}
agent_refuses "devicePlugin.slots: 0" true 0
agent_refuses "devicePlugin.slots: 2000" true 2000
agent_refuses "devicePlugin.enabled: maybe" maybe 4
agent_refuses "shimEnv name with a dash" true 4 '    BAD-NAME: "1"'
agent_refuses "shimEnv name starting with a digit" true 4 '    1X: "1"'
agent_refuses "shimEnv overriding LD_PRELOAD" true 4 '    LD_PRELOAD: "/tmp/evil.so"'
agent_refuses "shimEnv overriding GCR_AGENT_SOCKET" true 4 '    GCR_AGENT_SOCKET: "/tmp/x"'
agent_refuses "shimEnv with a nested value" true 4 '    X: {a: b}'
agent_refuses "shimEnv with 33 entries" true 4 "$(for i in $(seq 33); do printf '    V%d: "x"\n' "$i"; done)"
agent_refuses "shimEnv value over 1024 bytes" true 4 "    V: \"$(head -c 1025 /dev/zero | tr '\0' x)\""
agent_refuses "shimEnv disabled plugin, bad name still refused" false 4 '    A.B: "1"'
# The agent's records decide which processes are resumed: never in a directory pods see.
agent_cfg true 4 "" >"$work/agent-bad.yaml"
if timeout 10 "$agent_bin" --config "$work/agent-bad.yaml" "${agent_args[@]}" --record-dir "$arun/records" \
	>"$work/agent-bad.log" 2>&1 || (($? == 124)); then
	fail "agent refuses a record dir inside the registry socket's directory (it ran)"
elif grep -q "recordDir .* lies in a directory the device plugin mounts into pods" "$work/agent-bad.log"; then
	pass "agent refuses a record dir inside the registry socket's directory: $(grep -m1 '^gcr-agent:' "$work/agent-bad.log")"
else
	fail "agent refuses a record dir inside the registry socket's directory (other reason)" "$(cat "$work/agent-bad.log")"
fi
readyz() { python3 - "$port" <<'PY'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s/readyz" % sys.argv[1], timeout=2); print(r.status, r.read().decode().strip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip().replace("\n", "; "))
except OSError as e:
    print(0, e)
PY
}
agent_cfg true 4 >"$work/agent.yaml"
"$agent_bin" --config "$work/agent.yaml" "${agent_args[@]}" >"$work/agent.log" 2>&1 &
apid=$!
pids+=("$apid")
for _ in $(seq 50); do [[ -S $akdir/gcr-shim.sock ]] && break; sleep 0.1; done
check "agent's device plugin serves $akdir/gcr-shim.sock" test -S "$akdir/gcr-shim.sock"
r=$(readyz)
echo "  agent /readyz before the kubelet: $r"
check "agent /readyz waits for the device plugin's registration" grep -q 'device plugin registered with the kubelet' <<<"$r"
check "agent reads shimEnv (no 'ignored' line for it)" \
	bash -c "! grep -q 'devicePlugin.shimEnv ignored' '$work/agent.log'"

timeout 120 "$standin" -dir "$akdir" -slots 4 -shim-host-dir "$work/shim" -socket-root "$aroot" \
	-extra-env GCR_VMM_MIN_BYTES=1048576 -plugin-pid 0 -dump "$work/alloc-agent.json" -timeout 5s >"$work/standin-agent.log" 2>&1
rc=$?
sed 's/^/  standin (agent): /' "$work/standin-agent.log"
line=$(grep -oE '^[0-9]+ passed, [0-9]+ failed' "$work/standin-agent.log" | tail -n 1)
sp=${line%% passed*} sf=${line##*, }; sf=${sf%% failed}
passed=$((passed + ${sp:-0})) failed=$((failed + ${sf:-0}))
if [[ -z $line || $rc -ne 0 ]] && [[ ${sf:-0} -eq 0 ]]; then
	fail "kubelet stand-in against gcr-agent: exit $rc, ${line:-no summary}"
fi
r=$(readyz)
echo "  agent /readyz after the kubelet: $r"
check "agent /readyz no longer waits for the device plugin (registered)" \
	bash -c "[[ '$r' == 503* ]] && ! grep -q 'device plugin' <<<'$r'"
check "agent's Allocate: the registry socket as GCR_AGENT_SOCKET, its dir mounted, shimEnv added" \
	python3 - "$work/alloc-agent.json" "$arun" "$work/shim" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("A", "B"):
    e, m = d[k]["envs"], {x["container_path"]: x["host_path"] for x in d[k]["mounts"]}
    assert e["GCR_AGENT_SOCKET"] == "/run/gcr/agent/agent.sock", e
    assert e["GCR_SOCKET_DIR"] == "/run/gcr/sock", e
    assert e["LD_PRELOAD"].startswith("/opt/gcr/lib/"), e
    assert e["GCR_VMM_MIN_BYTES"] == "1048576", e  # the chart's shimEnv
    assert m.get("/run/gcr/agent") == sys.argv[2], m
    assert m.get("/opt/gcr/lib") == sys.argv[3], m
PY
kill -TERM "$apid"
for _ in $(seq 100); do kill -0 "$apid" 2>/dev/null || break; sleep 0.1; done
wait "$apid"
check "agent stops on SIGTERM with status 0" test $? -eq 0
check "agent's device plugin removed its socket" test ! -e "$akdir/gcr-shim.sock"
grep -E '^(error|warn) deviceplugin' "$work/agent.log" | sed 's/^/  agent: /' | head -n 20
finish
