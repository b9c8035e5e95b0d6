#!/usr/bin/env bash
# GCR Kubernetes test bed (test tooling only, not part of the product).
#
# A control plane without nodes, the way controller-runtime's envtest runs one:
# etcd and kube-apiserver on 127.0.0.1, generated CA, serving and client certs,
# RBAC authorization, a service-account key pair for issuing tokens, an admin
# kubeconfig, and an audit log of every request at Metadata level (DIR/audit.log,
# policy DIR/audit-policy.yaml) so tests can see which calls a client made.
# No kubelet, controller-manager or scheduler.
#
#   tests/k8s/testbed.sh build        build (or reuse) etcd, kube-apiserver,
#                                     kubectl and helm; prints the bin dir
#   eval "$(tests/k8s/testbed.sh up)" start; exports KUBECONFIG,
#                                     GCR_TESTBED_DIR and GCR_TESTBED_BIN
#   tests/k8s/testbed.sh down [DIR]   stop and remove (DIR defaults to
#                                     $GCR_TESTBED_DIR, then the last one started)
#   tests/k8s/testbed.sh status [DIR] say whether it is up
#   tests/k8s/testbed.sh restart-apiserver [DIR]
#                                     stop kube-apiserver and start it again
#                                     (same port and state), for watch tests
#
# Binaries are built from the Go module proxy with the go.mod/go.sum files under
# tests/k8s/tools/ and cached in $GCR_TESTBED_CACHE (default
# ~/.cache/gcr-testbed), keyed by those files, the Go version and the platform.
#
# Environment:
#   GCR_TESTBED_CACHE           cache directory (default ${XDG_CACHE_HOME:-~/.cache}/gcr-testbed)
#   GCR_TESTBED_DIR             state directory for up (default: a new mktemp dir)
#   GCR_TESTBED_ETCD_PORT       fixed etcd client port (default: a free random one)
#   GCR_TESTBED_APISERVER_PORT  fixed kube-apiserver port (default: a free random one)
#   GCR_TESTBED_APISERVER_ARGS  extra kube-apiserver arguments (word-split)
#   GCR_TESTBED_TIMEOUT         seconds to wait for readiness (default 120)
#   GCR_TESTBED_KEEP=1          down keeps the state directory (logs)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS=$HERE/tools
CACHE=${GCR_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gcr-testbed}
TIMEOUT=${GCR_TESTBED_TIMEOUT:-120}
# Bump when the build recipe below changes in a way the key does not see.
RECIPE=2
MODULES=(etcd kube helm)
BINARIES=(etcd kube-apiserver kubectl helm)

log() { printf 'testbed: %s\n' "$*" >&2; }
die() { printf 'testbed: error: %s\n' "$*" >&2; exit 1; }

need() {
	local c
	for c in "$@"; do
		command -v "$c" >/dev/null 2>&1 || die "'$c' not found in PATH (needed by $0)"
	done
}

find_go() {
	if [[ -n ${GO:-} ]]; then :
	elif command -v go >/dev/null 2>&1; then GO=go
	elif [[ -x /usr/local/go/bin/go ]]; then GO=/usr/local/go/bin/go
	else die "Go toolchain not found: put go in PATH or set GO=/path/to/go"
	fi
}

# Cache key: the tool modules, the Go version, the platform and the recipe.
bin_dir() {
	find_go
	need sha256sum
	local key m
	key=$({
		echo "recipe $RECIPE"
		GOTOOLCHAIN=local "$GO" env GOVERSION GOOS GOARCH
		for m in "${MODULES[@]}"; do
			echo "== $m"
			cat "$TOOLS/$m/go.mod" "$TOOLS/$m/go.sum"
		done
	} | sha256sum | cut -c1-16)
	printf '%s/bin-%s\n' "$CACHE" "$key"
}

cmd_build() {
	local dir tmp start m b
	find_go
	dir=$(bin_dir)
	if [[ -f $dir/.complete ]]; then
		touch "$dir" # most recently used: kept by the pruning below
		log "using cached binaries in $dir"
		printf '%s\n' "$dir"
		return 0
	fi
	mkdir -p "$CACHE"
	# One build at a time per cache; a second one waits and reuses the result.
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$CACHE/build.lock"
		flock 9
		if [[ -f $dir/.complete ]]; then
			log "using cached binaries in $dir"
			printf '%s\n' "$dir"
			return 0
		fi
	fi
	tmp=$(mktemp -d "$CACHE/build.XXXXXX")
	# shellcheck disable=SC2064
	trap "rm -rf '$tmp'" EXIT
	start=$SECONDS
	log "building test bed binaries into $dir (uncached: about 12 min on 2 cores)"
	export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0
	local flags=(-trimpath "-ldflags=-s -w") kver hver hk8s kld hld p
	# Version stamps, as the upstream release builds set them (otherwise the
	# API server reports v0.0.0-master, which breaks kubeVersion checks).
	kver=$(modver "$TOOLS/kube/go.mod" k8s.io/kubernetes)
	hver=$(modver "$TOOLS/helm/go.mod" helm.sh/helm/v3)
	hk8s=$(modver "$TOOLS/helm/go.mod" k8s.io/client-go)
	[[ $kver =~ ^v1\.([0-9]+)\. ]] || die "cannot tell the Kubernetes version from $TOOLS/kube/go.mod"
	kld="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		kld+=" -X $p.gitVersion=$kver -X $p.gitMajor=1 -X $p.gitMinor=${BASH_REMATCH[1]}"
		kld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	[[ $hver == v3.* && $hk8s =~ ^v0\.([0-9]+)\. ]] || die "cannot tell the helm versions from $TOOLS/helm/go.mod"
	hld="-s -w -X helm.sh/helm/v3/internal/version.version=$hver"
	for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
		hld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=${BASH_REMATCH[1]}"
	done
	for m in "${MODULES[@]}"; do
		log "go mod download ($m)"
		(cd "$TOOLS/$m" && "$GO" mod download) || die "go mod download failed in $TOOLS/$m"
	done
	log "building etcd"
	(cd "$TOOLS/etcd" && "$GO" build "${flags[@]}" -o "$tmp/etcd" go.etcd.io/etcd/server/v3) ||
		die "building etcd failed"
	log "building kube-apiserver and kubectl"
	(cd "$TOOLS/kube" && "$GO" build -trimpath "-ldflags=$kld" -o "$tmp/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl) ||
		die "building kube-apiserver/kubectl failed"
	log "building helm"
	(cd "$TOOLS/helm" && "$GO" build -trimpath "-ldflags=$hld" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) ||
		die "building helm failed"
	for b in "${BINARIES[@]}"; do
		[[ -x $tmp/$b ]] || die "build did not produce $b"
	done
	"$tmp/etcd" --version >"$tmp/versions.txt"
	"$tmp/kube-apiserver" --version >>"$tmp/versions.txt"
	"$tmp/kubectl" version --client >>"$tmp/versions.txt"
	"$tmp/helm" version --short >>"$tmp/versions.txt"
	sed 's/^/testbed:   /' "$tmp/versions.txt" >&2
	touch "$tmp/.complete"
	rm -rf "$dir"
	mv "$tmp" "$dir" || die "cannot move $tmp to $dir"
	trap - EXIT
	# Keep the three most recently used sets of binaries.
	ls -1dt "$CACHE"/bin-* 2>/dev/null | tail -n +4 | while read -r p; do
		log "pruning old binaries $p"
		rm -rf "$p"
	done
	log "built in $((SECONDS - start)) s"
	printf '%s\n' "$dir"
}

# modver GO.MOD MODULE: the version GO.MOD requires of MODULE.
modver() {
	awk -v m="$2" '($1 == m && $2 ~ /^v/) {print $2; exit} ($1 == "require" && $2 == m) {print $3; exit}' "$1"
}

# A TCP port on 127.0.0.1 nobody listens on (and not in the used list).
free_port() {
	local p i used=" $* "
	for i in $(seq 200); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
		[[ $used == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			printf '%s\n' "$p"
			return 0
		fi
	done
	die "no free TCP port found on 127.0.0.1"
}

gen_certs() {
	local pki=$1 ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
	mkdir -p "$pki"
	(
		cd "$pki"
		umask 077
		openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 7 \
			-subj "/CN=gcr-testbed-ca" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
		sign() { # name subject extensions
			openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2"
			printf '%s\n' "$3" >"$1.ext"
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key \
				-set_serial "0x$(openssl rand -hex 16)" -days 7 \
				-extfile "$1.ext" -out "$1.crt"
			rm -f "$1.csr" "$1.ext"
		}
		sign apiserver "/CN=kube-apiserver" \
			"$(printf '%s\n' "subjectAltName=IP:127.0.0.1,DNS:localhost" \
				"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth")"
		# Admin user, like envtest's: member of system:masters.
		sign admin "/O=system:masters/CN=admin" \
			"$(printf '%s\n' "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth")"
		# Service-account token signing key pair.
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out sa.key
		openssl pkey -in sa.key -pubout -out sa.pub
	) 2>"$pki/openssl.log" || { cat "$pki/openssl.log" >&2; die "certificate generation failed"; }
}

# pid alive and really ours (its command line names the state dir)?
ours() {
	local pid=$1 dir=$2
	[[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$dir"
}

start_proc() { # name logfile cmd...
	local name=$1 logf=$2
	shift 2
	setsid "$@" >"$logf" 2>&1 </dev/null &
	printf '%s\n' "$!" >"$STATE/$name.pid"
}

wait_for() { # what pidname cmd...
	local what=$1 name=$2 deadline=$((SECONDS + TIMEOUT)) pid
	shift 2
	pid=$(cat "$STATE/$name.pid")
	until "$@" >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null; then
			tail -n 30 "$STATE/$name.log" >&2 || true
			die "$name exited while waiting for $what (log: $STATE/$name.log)"
		fi
		if ((SECONDS >= deadline)); then
			tail -n 30 "$STATE/$name.log" >&2 || true
			die "timed out after ${TIMEOUT}s waiting for $what (log: $STATE/$name.log)"
		fi
		sleep 0.5
	done
}

cmd_up() {
	need openssl curl setsid
	local bin etcd_port peer_port api_port
	bin=$(cmd_build)
	if [[ -n ${GCR_TESTBED_DIR:-} ]]; then
		STATE=$GCR_TESTBED_DIR
		[[ -e $STATE/apiserver.pid ]] && die "$STATE already holds a test bed; run down first"
		mkdir -p "$STATE"
	else
		STATE=$(mktemp -d "${TMPDIR:-/tmp}/gcr-testbed.XXXXXX")
	fi
	STATE=$(cd "$STATE" && pwd)
	touch "$STATE/.gcr-testbed"
	mkdir -p "$CACHE"
	printf '%s\n' "$STATE" >"$CACHE/current"

	# From here on, a failure tears down what was started.
	trap 'rc=$?; if ((rc != 0)); then log "up failed; tearing down"; GCR_TESTBED_KEEP=1 stop_all "$STATE"; fi' EXIT

	gen_certs "$STATE/pki"
	etcd_port=${GCR_TESTBED_ETCD_PORT:-$(free_port)}
	peer_port=$(free_port "$etcd_port")
	api_port=${GCR_TESTBED_APISERVER_PORT:-$(free_port "$etcd_port" "$peer_port")}

	log "starting etcd on 127.0.0.1:$etcd_port (state $STATE)"
	start_proc etcd "$STATE/etcd.log" "$bin/etcd" \
		--name=default \
		--data-dir="$STATE/etcd" \
		--listen-client-urls="http://127.0.0.1:$etcd_port" \
		--advertise-client-urls="http://127.0.0.1:$etcd_port" \
		--listen-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-cluster="default=http://127.0.0.1:$peer_port" \
		--unsafe-no-fsync=true \
		--log-level=warn
	wait_for "etcd /health" etcd curl -fsS --max-time 2 "http://127.0.0.1:$etcd_port/health"

	# Every request at Metadata level (who, verb, resource, decision; no bodies):
	# tests read it to compare what a client used with what its RBAC grants.
	cat >"$STATE/audit-policy.yaml" <<-EOF
	apiVersion: audit.k8s.io/v1
	kind: Policy
	omitStages: ["RequestReceived"]
	rules:
	- level: Metadata
	EOF

	log "starting kube-apiserver on https://127.0.0.1:$api_port"
	local extra=()
	# shellcheck disable=SC2206
	[[ -n ${GCR_TESTBED_APISERVER_ARGS:-} ]] && extra=($GCR_TESTBED_APISERVER_ARGS)
	# ServiceAccount admission is off, as in envtest: nothing creates the
	# "default" service accounts without a controller-manager.
	local api_args=("$bin/kube-apiserver" \
		--etcd-servers="http://127.0.0.1:$etcd_port" \
		--bind-address=127.0.0.1 \
		--advertise-address=127.0.0.1 \
		--endpoint-reconciler-type=none \
		--secure-port="$api_port" \
		--cert-dir="$STATE/apiserver-certs" \
		--tls-cert-file="$STATE/pki/apiserver.crt" \
		--tls-private-key-file="$STATE/pki/apiserver.key" \
		--client-ca-file="$STATE/pki/ca.crt" \
		--authorization-mode=RBAC \
		--service-account-issuer="https://127.0.0.1:$api_port" \
		--service-account-key-file="$STATE/pki/sa.pub" \
		--service-account-signing-key-file="$STATE/pki/sa.key" \
		--service-cluster-ip-range=10.0.0.0/24 \
		--allow-privileged=true \
		--disable-admission-plugins=ServiceAccount \
		--profiling=false \
		--audit-policy-file="$STATE/audit-policy.yaml" \
		--audit-log-path="$STATE/audit.log" \
		--audit-log-format=json \
		--audit-log-mode=blocking \
		"${extra[@]}")
	# Kept so that restart-apiserver starts the same command line again.
	printf '%s\0' "${api_args[@]}" >"$STATE/apiserver.args"
	start_proc apiserver "$STATE/apiserver.log" "${api_args[@]}"

	cat >"$STATE/kubeconfig" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: gcr-testbed
	  cluster:
	    server: https://127.0.0.1:$api_port
	    certificate-authority: $STATE/pki/ca.crt
	users:
	- name: admin
	  user:
	    client-certificate: $STATE/pki/admin.crt
	    client-key: $STATE/pki/admin.key
	contexts:
	- name: gcr-testbed
	  context:
	    cluster: gcr-testbed
	    user: admin
	    namespace: default
	current-context: gcr-testbed
	EOF
	chmod 600 "$STATE/kubeconfig"

	wait_for "kube-apiserver /readyz" apiserver \
		curl -fsS --max-time 5 --cacert "$STATE/pki/ca.crt" \
		--cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" \
		"https://127.0.0.1:$api_port/readyz"
	# RBAC bootstrap policy is part of readyz (poststarthook/rbac/bootstrap-roles).

	cat >"$STATE/env" <<-EOF
	export KUBECONFIG='$STATE/kubeconfig'
	export GCR_TESTBED_DIR='$STATE'
	export GCR_TESTBED_BIN='$bin'
	EOF
	trap - EXIT
	log "ready: https://127.0.0.1:$api_port (etcd 127.0.0.1:$etcd_port)"
	log "KUBECONFIG=$STATE/kubeconfig; stop with: $0 down $STATE"
	cat "$STATE/env"
}

stop_one() { # dir name
	local dir=$1 name=$2 pid i
	[[ -f $dir/$name.pid ]] || return 0
	pid=$(cat "$dir/$name.pid")
	if ours "$pid" "$dir"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 100); do
			ours "$pid" "$dir" || break
			sleep 0.2
		done
		if ours "$pid" "$dir"; then
			log "$name (pid $pid) did not stop in 20 s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	rm -f "$dir/$name.pid"
}

stop_all() { # dir
	local dir=$1
	[[ -d $dir ]] || return 0
	stop_one "$dir" apiserver
	stop_one "$dir" etcd
	if [[ ${GCR_TESTBED_KEEP:-0} == 1 ]]; then
		log "kept $dir"
	elif [[ -f $dir/.gcr-testbed ]]; then
		rm -rf "$dir"
	fi
	if [[ -f $CACHE/current && $(cat "$CACHE/current") == "$dir" ]]; then
		rm -f "$CACHE/current"
	fi
}

state_arg() {
	local dir=${1:-${GCR_TESTBED_DIR:-}}
	if [[ -z $dir && -f $CACHE/current ]]; then
		dir=$(cat "$CACHE/current")
	fi
	printf '%s\n' "$dir"
}

cmd_down() {
	local dir
	dir=$(state_arg "${1:-}")
	if [[ -z $dir || ! -d $dir ]]; then
		log "no test bed to stop"
		return 0
	fi
	[[ -f $dir/.gcr-testbed ]] || die "$dir is not a test bed directory"
	stop_all "$dir"
	log "stopped $dir"
}

# Stops and starts kube-apiserver with the same arguments (same port, same
# certificates, same etcd): clients see their connections drop and come back.
cmd_restart_apiserver() {
	local dir api_args
	dir=$(state_arg "${1:-}")
	[[ -n $dir && -f $dir/.gcr-testbed && -f $dir/apiserver.args ]] || die "no test bed to restart"
	STATE=$dir
	mapfile -d '' api_args <"$STATE/apiserver.args"
	stop_one "$STATE" apiserver
	log "restarting kube-apiserver"
	start_proc apiserver "$STATE/apiserver.log.restart" "${api_args[@]}"
	local port
	port=$(sed -n 's/^--secure-port=//p' < <(tr '\0' '\n' <"$STATE/apiserver.args"))
	wait_for "kube-apiserver /readyz" apiserver \
		curl -fsS --max-time 5 --cacert "$STATE/pki/ca.crt" \
		--cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" \
		"https://127.0.0.1:$port/readyz"
	log "kube-apiserver back on https://127.0.0.1:$port"
}

cmd_status() {
	local dir up=0 n
	dir=$(state_arg "${1:-}")
	[[ -n $dir && -f $dir/.gcr-testbed ]] || { log "down"; return 1; }
	for n in etcd apiserver; do
		if ours "$(cat "$dir/$n.pid" 2>/dev/null || true)" "$dir"; then
			log "$n running"
			up=$((up + 1))
		else
			log "$n not running"
		fi
	done
	((up == 2)) && cat "$dir/env"
	((up == 2))
}

case ${1:-} in
build) cmd_build ;;
up) cmd_up ;;
down) cmd_down "${2:-}" ;;
status) cmd_status "${2:-}" ;;
restart-apiserver) cmd_restart_apiserver "${2:-}" ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
