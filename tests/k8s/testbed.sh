#!/usr/bin/env bash
# GCR Kubernetes test bed (test tooling only, not part of the product).
#
# Two shapes. `up`: a control plane without nodes, the way controller-runtime's
# envtest runs one: etcd and kube-apiserver on 127.0.0.1, generated CA, serving and
# client certs, RBAC authorization, a service-account key pair for issuing tokens,
# an admin kubeconfig, and an audit log of every request at Metadata level
# (DIR/audit.log, policy DIR/audit-policy.yaml) so tests can see which calls a
# client made. `up-node` (root): a real single-node cluster: the same plus the
# controller manager, the scheduler, containerd 2.x (built from its Go module) with
# runc (Debian's package), a real kubelet, kube-proxy and a bridge CNI network
# (tests/k8s/node/README.md).
#
#   tests/k8s/testbed.sh build        build (or reuse) etcd, kube-apiserver,
#                                     kubectl, helm, kubelet, kube-scheduler,
#                                     kube-controller-manager, kube-proxy, and
#                                     (in a cache of its own) containerd,
#                                     containerd-shim-runc-v2, ctr;
#                                     prints the Kubernetes bin dir
#   eval "$(tests/k8s/testbed.sh up)" start; exports KUBECONFIG,
#                                     GCR_TESTBED_DIR and GCR_TESTBED_BIN
#   eval "$(tests/k8s/testbed.sh up-node)"
#                                     start a real node (root); imports the OCI
#                                     archives in $GCR_TESTBED_IMAGES into
#                                     containerd; also exports GCR_TESTBED_NODE
#   tests/k8s/testbed.sh down [DIR]   stop and remove (DIR defaults to
#                                     $GCR_TESTBED_DIR, then the last one started)
#   tests/k8s/testbed.sh status [DIR] say whether it is up
#   tests/k8s/testbed.sh restart-apiserver [DIR]
#                                     stop kube-apiserver and start it again
#                                     (same port and state), for watch tests
#   tests/k8s/testbed.sh restart-etcd [DIR]
#                                     the same for etcd
#   tests/k8s/testbed.sh stop-apiserver [DIR] / start-apiserver [DIR]
#   tests/k8s/testbed.sh stop-etcd [DIR] / start-etcd [DIR]
#                                     the two halves of restart-*, so a test can
#                                     hold one down across a moment it chooses;
#                                     start-* waits for readiness (start-apiserver
#                                     needs etcd up: /readyz checks it)
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
#   GCR_TESTBED_IMAGES          up-node: directory of OCI image archives (*.tar)
#                               to import; must hold the sandbox image
#   GCR_TESTBED_PAUSE_IMAGE     up-node: the sandbox image's name
#                               (default docker.io/gcr-test/pause:1, tests/k8s/images/build.sh's)
#   GCR_TESTBED_DRIVER_DIR      up-node: the stand-in driver (libcuda.so.1,
#                               libnvidia-ml.so.1, fakesmi) the "nvidia" runtime class injects
#   GCR_TESTBED_GPU_MIB         up-node: the stand-in GPU's memory (4096 MiB)
#   GCR_TESTBED_NODES           up-node: 1 (default) or 2: also gcr-node-2, a second real node
#                               in namespaces of its own on this machine (tests/k8s/node/README.md);
#                               exports GCR_TESTBED_NODE2
#   GCR_CRIU                    up-node: CRIU (>= 4) for runc's checkpoint and restore
#                               (default: scripts/install-criu.sh's cached build, if any)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS=$HERE/tools
CACHE=${GCR_TESTBED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gcr-testbed}
TIMEOUT=${GCR_TESTBED_TIMEOUT:-120}
NODES=${GCR_TESTBED_NODES:-1} # up-node: 2 adds gcr-node-2 (below, "the second node")
# Bump when the build recipe below changes in a way the key does not see.
RECIPE=3
MODULES=(etcd kube helm)
BINARIES=(etcd kube-apiserver kubectl helm kubelet kube-controller-manager kube-scheduler kube-proxy)
# containerd has a cache of its own: bumping it does not rebuild the Kubernetes binaries.
CTRD_RECIPE=1
CTRD_BINARIES=(containerd containerd-shim-runc-v2 ctr)
# Where a node has its runtime's CRI socket and containerd its registry host configurations:
# the chart's defaults (eviction.restore.criSocket, certsDir), so the tests set neither.
CRI_SOCKET=/run/containerd/containerd.sock
REGISTRY_CERTS_DIR=/etc/containerd/certs.d

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

ctrd_dir() {
	find_go
	need sha256sum
	local key
	key=$({
		echo "recipe $CTRD_RECIPE"
		GOTOOLCHAIN=local "$GO" env GOVERSION GOOS GOARCH
		cat "$TOOLS/containerd/go.mod" "$TOOLS/containerd/go.sum"
	} | sha256sum | cut -c1-16)
	printf '%s/containerd-%s\n' "$CACHE" "$key"
}

# containerd 2.x (tools/containerd/go.mod): its CRI checkpoints containers and restores them
# into new pods, which bookworm's containerd 1.6 cannot. Static Go (no cgo): the btrfs,
# devmapper and zfs snapshotters, which need cgo or are not used here, are left out.
build_containerd() {
	local dir tmp start ver b
	find_go
	dir=$(ctrd_dir)
	if [[ -f $dir/.complete ]]; then
		touch "$dir"
		log "using cached containerd in $dir"
		printf '%s\n' "$dir"
		return 0
	fi
	mkdir -p "$CACHE"
	if command -v flock >/dev/null 2>&1; then
		exec 9>"$CACHE/build.lock"
		flock 9
		if [[ -f $dir/.complete ]]; then
			log "using cached containerd in $dir"
			printf '%s\n' "$dir"
			return 0
		fi
	fi
	tmp=$(mktemp -d "$CACHE/build-ctrd.XXXXXX")
	start=$SECONDS
	ver=$(modver "$TOOLS/containerd/go.mod" github.com/containerd/containerd/v2)
	[[ $ver == v2.* ]] || { rm -rf "$tmp"; die "cannot tell the containerd version from $TOOLS/containerd/go.mod"; }
	log "building containerd $ver into $dir (uncached: about 3 min on 2 cores)"
	if ! (cd "$TOOLS/containerd" && export GOTOOLCHAIN=local GOWORK=off GOFLAGS=-mod=readonly CGO_ENABLED=0 &&
		"$GO" mod download && "$GO" build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
		"-ldflags=-s -w -X github.com/containerd/containerd/v2/version.Version=$ver" -o "$tmp/" \
		github.com/containerd/containerd/v2/cmd/containerd \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr); then
		rm -rf "$tmp"
		die "building containerd failed"
	fi
	for b in "${CTRD_BINARIES[@]}"; do
		[[ -x $tmp/$b ]] || { rm -rf "$tmp"; die "build did not produce $b"; }
	done
	"$tmp/containerd" --version >"$tmp/versions.txt"
	sed 's/^/testbed:   /' "$tmp/versions.txt" >&2
	touch "$tmp/.complete"
	rm -rf "$dir"
	mv "$tmp" "$dir" || die "cannot move $tmp to $dir"
	ls -1dt "$CACHE"/containerd-* 2>/dev/null | tail -n +3 | while read -r b; do
		log "pruning old containerd $b"
		rm -rf "$b"
	done
	log "containerd built in $((SECONDS - start)) s"
	printf '%s\n' "$dir"
}

build_kube() {
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
	log "building kube-apiserver, kubectl, kubelet, kube-controller-manager, kube-scheduler, kube-proxy"
	(cd "$TOOLS/kube" && "$GO" build -trimpath "-ldflags=$kld" -o "$tmp/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
		k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy) ||
		die "building the Kubernetes binaries failed"
	log "building helm"
	(cd "$TOOLS/helm" && "$GO" build -trimpath "-ldflags=$hld" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm) ||
		die "building helm failed"
	for b in "${BINARIES[@]}"; do
		[[ -x $tmp/$b ]] || die "build did not produce $b"
	done
	"$tmp/etcd" --version >"$tmp/versions.txt"
	"$tmp/kube-apiserver" --version >>"$tmp/versions.txt"
	"$tmp/kubectl" version --client >>"$tmp/versions.txt"
	"$tmp/kubelet" --version >>"$tmp/versions.txt"
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

cmd_build() {
	local kube
	kube=$(build_kube) || exit 1
	build_containerd >/dev/null || exit 1
	printf '%s\n' "$kube"
}

# modver GO.MOD MODULE: the version GO.MOD requires of MODULE.
modver() {
	awk -v m="$2" '($1 == m && $2 ~ /^v/) {print $2; exit} ($1 == "require" && $2 == m) {print $3; exit}' "$1"
}

# A TCP port on 127.0.0.1 nobody listens on (and not in the used list), below the kernel's
# ephemeral range: a port there may be the local end of some client's connection, which a
# connect test does not see but which makes bind fail (seen with several test beds at once).
free_port() {
	local p i used=" $* " lo=32768 hi
	read -r lo hi </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
	((lo > 12000)) || lo=32768
	for i in $(seq 200); do
		p=$((10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000)))
		[[ $used == *" $p "* ]] && continue
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			printf '%s\n' "$p"
			return 0
		fi
	done
	die "no free TCP port found on 127.0.0.1"
}

# sign NAME SUBJECT EXTENSIONS: a key pair and a certificate from the CA (in the cwd).
sign() {
	openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
		-keyout "$1.key" -out "$1.csr" -subj "$2"
	printf '%s\n' "$3" >"$1.ext"
	openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key \
		-set_serial "0x$(openssl rand -hex 16)" -days 7 \
		-extfile "$1.ext" -out "$1.crt"
	rm -f "$1.csr" "$1.ext"
}

CLIENT_EXT=$(printf '%s\n' "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth")

gen_certs() { # pki-dir [extra apiserver SANs]
	local pki=$1 sans="IP:127.0.0.1,DNS:localhost${2:+,$2}"
	mkdir -p "$pki"
	(
		cd "$pki"
		umask 077
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
			-keyout ca.key -out ca.crt -days 7 \
			-subj "/CN=gcr-testbed-ca" \
			-addext "basicConstraints=critical,CA:TRUE" \
			-addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
		sign apiserver "/CN=kube-apiserver" \
			"$(printf '%s\n' "subjectAltName=$sans" \
				"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth")"
		# Admin user, like envtest's: member of system:masters.
		sign admin "/O=system:masters/CN=admin" "$CLIENT_EXT"
		# Service-account token signing key pair.
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out sa.key
		openssl pkey -in sa.key -pubout -out sa.pub
	) 2>"$pki/openssl.log" || { cat "$pki/openssl.log" >&2; die "certificate generation failed"; }
}

# pid alive and really ours (its command line names the state dir)?
ours() {
	local pid=$1 dir=$2
	[[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
	local cmd
	cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline") || return 1
	[[ $cmd == *"$dir"* ]]
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

# The real node's addresses. Pods live on the bridge NODE_BRIDGE (NODE_POD_CIDR); the
# node's own address on it (NODE_IP) is where the API server and the kubelet listen, so
# pods reach both without any address outside this machine. Services get
# NODE_SERVICE_CIDR, translated by kube-proxy; a blackhole route keeps anything
# kube-proxy did not translate from leaving the machine, and the FORWARD rules below
# keep pods from reaching anything but this host.
NODE_BRIDGE=gcrbr0
NODE_IP=10.88.0.1
NODE_POD_CIDR=10.88.0.0/24
NODE_SERVICE_CIDR=10.96.0.0/24
NODE_SERVICE_IP=10.96.0.1
NODE_NAME=gcr-node
KUBELET_ROOT=/var/lib/kubelet # the chart's default devicePlugin.kubeletDir lives here
NODE_EXEC=() # how a node's processes start: nothing for the first, nsenter for the second

new_state() {
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
}

# kubeconfig FILE SERVER USER-CERT-NAME: a kubeconfig authenticating with pki/NAME.{crt,key}.
kubeconfig() {
	cat >"$1" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: gcr-testbed
	  cluster:
	    server: $2
	    certificate-authority: $STATE/pki/ca.crt
	users:
	- name: $3
	  user:
	    client-certificate: $STATE/pki/$3.crt
	    client-key: $STATE/pki/$3.key
	contexts:
	- name: gcr-testbed
	  context:
	    cluster: gcr-testbed
	    user: $3
	    namespace: default
	current-context: gcr-testbed
	EOF
	chmod 600 "$1"
}

# start_control_plane MODE (api | node): etcd and kube-apiserver; sets API_URL.
start_control_plane() {
	local mode=$1 etcd_port peer_port api_port addr=127.0.0.1
	[[ $mode == node ]] && addr=$NODE_IP
	etcd_port=${GCR_TESTBED_ETCD_PORT:-$(free_port)}
	peer_port=$(free_port "$etcd_port")
	api_port=${GCR_TESTBED_APISERVER_PORT:-$(free_port "$etcd_port" "$peer_port")}

	log "starting etcd on 127.0.0.1:$etcd_port (state $STATE)"
	local etcd_args=("$BIN/etcd" \
		--name=default \
		--data-dir="$STATE/etcd" \
		--listen-client-urls="http://127.0.0.1:$etcd_port" \
		--advertise-client-urls="http://127.0.0.1:$etcd_port" \
		--listen-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
		--initial-cluster="default=http://127.0.0.1:$peer_port" \
		--unsafe-no-fsync=true \
		--log-level=warn)
	printf '%s\0' "${etcd_args[@]}" >"$STATE/etcd.args"
	start_proc etcd "$STATE/etcd.log" "${etcd_args[@]}"
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

	log "starting kube-apiserver on https://$addr:$api_port"
	local extra=()
	# shellcheck disable=SC2206
	[[ -n ${GCR_TESTBED_APISERVER_ARGS:-} ]] && extra=($GCR_TESTBED_APISERVER_ARGS)
	local mode_args
	if [[ $mode == api ]]; then
		# ServiceAccount admission is off, as in envtest: nothing creates the
		# "default" service accounts without a controller-manager.
		mode_args=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1
			--endpoint-reconciler-type=none
			--service-cluster-ip-range=10.0.0.0/24
			--authorization-mode=RBAC
			--disable-admission-plugins=ServiceAccount)
	else
		# As a cluster runs it: the Node authorizer and NodeRestriction for the
		# kubelet, service accounts, the "kubernetes" Service's endpoints, and
		# verified TLS to the kubelet (exec, logs).
		mode_args=(--bind-address="$NODE_IP" --advertise-address="$NODE_IP"
			--service-cluster-ip-range="$NODE_SERVICE_CIDR"
			--authorization-mode=Node,RBAC
			--enable-admission-plugins=NodeRestriction
			--kubelet-client-certificate="$STATE/pki/apiserver-kubelet-client.crt"
			--kubelet-client-key="$STATE/pki/apiserver-kubelet-client.key"
			--kubelet-certificate-authority="$STATE/pki/ca.crt"
			--kubelet-preferred-address-types=InternalIP)
	fi
	# --shutdown-watch-termination-grace-period: on SIGTERM the open watches are closed (their
	# clients relist elsewhere) instead of holding the stop up for 20 s and more, as k0s and
	# OpenShift run it.
	local api_args=("$BIN/kube-apiserver" \
		--etcd-servers="http://127.0.0.1:$etcd_port" \
		--secure-port="$api_port" \
		--cert-dir="$STATE/apiserver-certs" \
		--tls-cert-file="$STATE/pki/apiserver.crt" \
		--tls-private-key-file="$STATE/pki/apiserver.key" \
		--client-ca-file="$STATE/pki/ca.crt" \
		--service-account-issuer="https://$addr:$api_port" \
		--service-account-key-file="$STATE/pki/sa.pub" \
		--service-account-signing-key-file="$STATE/pki/sa.key" \
		--allow-privileged=true \
		--profiling=false \
		--audit-policy-file="$STATE/audit-policy.yaml" \
		--audit-log-path="$STATE/audit.log" \
		--audit-log-format=json \
		--audit-log-mode=blocking \
		--shutdown-watch-termination-grace-period=2s \
		"${mode_args[@]}" \
		"${extra[@]}")
	# Kept so that restart-apiserver starts the same command line again.
	printf '%s\0' "${api_args[@]}" >"$STATE/apiserver.args"
	start_proc apiserver "$STATE/apiserver.log" "${api_args[@]}"
	API_URL=https://$addr:$api_port
	kubeconfig "$STATE/kubeconfig" "$API_URL" admin
	wait_for "kube-apiserver /readyz" apiserver \
		curl -fsS --max-time 5 --cacert "$STATE/pki/ca.crt" \
		--cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" \
		"$API_URL/readyz"
	# RBAC bootstrap policy is part of readyz (poststarthook/rbac/bootstrap-roles).
}

write_env() {
	cat >"$STATE/env" <<-EOF
	export KUBECONFIG='$STATE/kubeconfig'
	export GCR_TESTBED_DIR='$STATE'
	export GCR_TESTBED_BIN='$BIN'
	EOF
	[[ ${1:-} == node ]] && printf "export GCR_TESTBED_NODE='%s'\nexport GCR_TESTBED_CTRD='%s'\n" "$NODE_NAME" "$CTRD" >>"$STATE/env"
	[[ ${1:-} == node && -d $STATE/node2 ]] && printf "export GCR_TESTBED_NODE2='%s'\n" "$NODE2_NAME" >>"$STATE/env"
	return 0
}

cmd_up() {
	need openssl curl setsid
	BIN=$(cmd_build)
	new_state
	# From here on, a failure tears down what was started.
	trap 'rc=$?; if ((rc != 0)); then log "up failed; tearing down"; GCR_TESTBED_KEEP=1 stop_all "$STATE"; fi' EXIT
	gen_certs "$STATE/pki"
	start_control_plane api
	write_env
	trap - EXIT
	log "ready: $API_URL"
	log "KUBECONFIG=$STATE/kubeconfig; stop with: $0 down $STATE"
	cat "$STATE/env"
}

# ---- the real node (up-node) ----

node_certs() {
	(
		cd "$STATE/pki"
		umask 077
		sign controller-manager "/CN=system:kube-controller-manager" "$CLIENT_EXT"
		sign scheduler "/CN=system:kube-scheduler" "$CLIENT_EXT"
		sign kube-proxy "/CN=system:kube-proxy" "$CLIENT_EXT"
		sign node "/O=system:nodes/CN=system:node:$NODE_NAME" "$CLIENT_EXT"
		sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$CLIENT_EXT"
		sign kubelet "/CN=$NODE_NAME" \
			"$(printf '%s\n' "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME" \
				"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth")"
	) 2>>"$STATE/pki/openssl.log" || { cat "$STATE/pki/openssl.log" >&2; die "certificate generation failed"; }
}

# The bridge first: the API server listens on its address. The bridge CNI plugin
# takes it over as it is. Pods may talk to this host only: forwarding to or from the
# bridge is dropped, and the service range is routed onto the bridge (never the
# machine's own network) unless kube-proxy's rules translate it first. A route, not a
# blackhole: the host's own processes (hostNetwork pods, e.g. the agent with
# eviction.restore) reach services as on a real node, where the kernel routes before
# kube-proxy's OUTPUT rules translate, and a blackhole refuses the connect() itself.
node_network() {
	# A MAC of its own: a bridge without one takes its lowest port's, so it changed as pods came
	# and went, and pods kept sending to the old one for seconds (their ARP entry): the kubelet's
	# probes of them timed out (the GPU node's runs 68-74, and its stand-in rehearsal).
	ip link add "$NODE_BRIDGE" address 02:67:63:72:00:01 type bridge
	ip addr add "$NODE_IP/${NODE_POD_CIDR#*/}" dev "$NODE_BRIDGE"
	ip link set "$NODE_BRIDGE" up
	ip route add "$NODE_SERVICE_CIDR" dev "$NODE_BRIDGE"
	iptables -w -I FORWARD -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP -m comment --comment gcr-testbed
	iptables -w -I FORWARD ! -i "$NODE_BRIDGE" -o "$NODE_BRIDGE" -j DROP -m comment --comment gcr-testbed
	cni_conf "$STATE" "$NODE_BRIDGE" "$NODE_POD_CIDR" "$NODE_IP"
}

# cni_conf DIR BRIDGE POD-CIDR GATEWAY: the bridge network of one node's pods (DIR/cni).
cni_conf() {
	local dir=$1 bridge=$2 cidr=$3 gw=$4
	mkdir -p "$dir/cni/net.d" "$dir/cni/ipam"
	cat >"$dir/cni/net.d/10-gcr-testbed.conflist" <<-EOF
	{
	  "cniVersion": "1.0.0",
	  "name": "gcr-testbed",
	  "plugins": [{
	    "type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": false,
	    "hairpinMode": true,
	    "ipam": {"type": "host-local", "dataDir": "$dir/cni/ipam",
	             "ranges": [[{"subnet": "$cidr", "gateway": "$gw"}]],
	             "routes": [{"dst": "0.0.0.0/0"}]}
	  }]
	}
	EOF
}

# node_containerd [DIR PIDNAME-PREFIX]: a node's containerd, its state in DIR (default $STATE), started
# through NODE_EXEC (the second node's namespaces; empty for the first).
node_containerd() {
	local driver=${GCR_TESTBED_DRIVER_DIR:-} d=${1:-$STATE} pfx=${2:-}
	mkdir -p "$d/containerd" "$d/bin"
	# The "nvidia" handler: runc behind the stand-in of NVIDIA's runtime, which adds
	# the stand-in driver to containers that ask for GPUs (node/nvidia-runtime-standin.py).
	# The node's one stand-in GPU: a pool file all GPU containers share, any uid writing it.
	mkdir -p "$d/gpu"
	chmod 1777 "$d/gpu"
	install -m 0666 /dev/null "$d/gpu/pool"
	# At the size the stand-in driver gives it on first use (FAKE_POOL_SLOTS slots of struct
	# fake_pool_slot: two 32-bit ids, a 64-bit count per device): CRIU refuses to restore a
	# process whose open file has another size than at the dump, so a process dumped on one node
	# restores on the other only if that node's pool is sized already.
	local slots devs
	slots=$(sed -n 's/^#define FAKE_POOL_SLOTS \([0-9]*\).*/\1/p' "$HERE/../fakecuda/fakecuda_pool.h")
	devs=$(sed -n 's/^#define FAKE_POOL_DEVICES \([0-9]*\).*/\1/p' "$HERE/../fakecuda/fakecuda_pool.h")
	[[ -n $slots && -n $devs ]] || die "cannot read the pool's size from tests/fakecuda/fakecuda_pool.h"
	truncate -s $((slots * (8 + 8 * devs))) "$d/gpu/pool"
	cat >"$d/bin/nvidia-container-runtime" <<-EOF
	#!/bin/sh
	exec python3 '$HERE/node/nvidia-runtime-standin.py' --driver-dir '$driver' --gpu-dir '$d/gpu' \\
		--mem-mib '${GCR_TESTBED_GPU_MIB:-4096}' --criu-config '$d/criu-runc.conf' -- "\$@"
	EOF
	# What runc's CRIU needs for GPU containers here (the stand-in driver's pool lock).
	printf 'file-locks\n' >"$d/criu-runc.conf"
	chmod 755 "$d/bin/nvidia-container-runtime"
	# CRIU for runc's checkpoint and restore (the CRI's checkpoint, restore into a new pod):
	# runc and containerd look for "criu" in PATH.
	local criu=${GCR_CRIU:-}
	[[ -n $criu ]] || criu=$("$HERE/../../scripts/install-criu.sh" --cached 2>/dev/null) || criu=
	[[ -n $criu && -x $criu ]] && ln -sf "$criu" "$d/bin/criu"
	# Version 3 (containerd 2.x): the CRI's image and runtime halves are plugins of their own.
	cat >"$d/containerd/config.toml" <<-EOF
	version = 3
	root = "$d/containerd/root"
	state = "$d/containerd/state"
	disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
	  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
	  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
	[grpc]
	  address = "$d/containerd/containerd.sock"
	[plugins."io.containerd.cri.v1.images"]
	  snapshotter = "overlayfs"
	  [plugins."io.containerd.cri.v1.images".pinned_images]
	    sandbox = "$PAUSE_IMAGE"
	  # Registry host configurations (hosts.toml) as on a real node: the chart's agent writes the
	  # one for its checkpoint-image registry here (eviction.restore.certsDir, TLS).
	  [plugins."io.containerd.cri.v1.images".registry]
	    config_path = "$REGISTRY_CERTS_DIR"
	[plugins."io.containerd.cri.v1.runtime"]
	  enable_selinux = false
	  disable_apparmor = true
	  # These machines withhold CAP_SYS_RESOURCE even from root, so no process may lower its
	  # oom_score_adj: runc's "failed to update /proc/self/oom_score_adj: Permission denied"
	  # (the kubelet asks -998 for sandboxes). Clamp to our own value, as rootless setups do.
	  restrict_oom_score_adj = true
	  # A container created from a checkpoint image is restored (containerd PR 10365); off by
	  # default since 2.2.x/2.3.x, gone in 2.4 (tests/k8s/node/README.md).
	  enable_experimental_restore_via_create = true
	  [plugins."io.containerd.cri.v1.runtime".containerd]
	    default_runtime_name = "runc"
	    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
	        SystemdCgroup = false
	    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia.options]
	        BinaryName = "$d/bin/nvidia-container-runtime"
	        SystemdCgroup = false
	  [plugins."io.containerd.cri.v1.runtime".cni]
	    bin_dirs = ["/usr/lib/cni"]
	    conf_dir = "$d/cni/net.d"
	EOF
	# The node's containerd configuration root, as a node has it (the first node's is the host's
	# own path, the second node's a private one).
	"${NODE_EXEC[@]}" mkdir -p "$REGISTRY_CERTS_DIR"
	log "starting containerd ($("$CTRD/containerd" --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}'), criu ${criu:-none})"
	# Its own runc shim and CRIU first in PATH (containerd finds the shim there).
	PATH="$d/bin:$CTRD:$PATH" start_proc "${pfx}containerd" "$d/containerd.log" "${NODE_EXEC[@]}" "$CTRD/containerd" --config "$d/containerd/config.toml"
	wait_for "containerd" "${pfx}containerd" "$CTRD/ctr" --address "$d/containerd/containerd.sock" version
	# Its CRI socket also where a node has it (the chart's eviction.restore.criSocket): a link.
	"${NODE_EXEC[@]}" ln -sfn "$d/containerd/containerd.sock" "$CRI_SOCKET"
	local img n=0
	for img in "${GCR_TESTBED_IMAGES:-/nonexistent}"/*.tar; do
		[[ -f $img ]] || continue
		"$CTRD/ctr" --address "$d/containerd/containerd.sock" -n k8s.io images import --no-unpack "$img" >>"$d/images.log" 2>&1 ||
			{ cat "$d/images.log" >&2; die "importing $img into containerd failed"; }
		n=$((n + 1))
	done
	# Listed first, then searched: with pipefail, grep -q ending early can kill ctr by SIGPIPE
	# and fail the pipeline although the image is there (seen once in CI-like runs).
	local listed
	listed=$("$CTRD/ctr" --address "$d/containerd/containerd.sock" -n k8s.io images ls -q) || die "ctr images ls failed"
	grep -qxF "$PAUSE_IMAGE" <<<"$listed" ||
		die "the sandbox image $PAUSE_IMAGE is not among the images in ${GCR_TESTBED_IMAGES:-(GCR_TESTBED_IMAGES unset)}"
	log "imported $n image archive(s)"
}

# node_kubelet [DIR PIDNAME-PREFIX NAME IP CERT PORT CGROUP-ROOT]: a node's kubelet (default: the
# first node's), started through NODE_EXEC; its pki/CERT.* serve, pki/CERT-client.* (node: node.*)
# authenticate it.
node_kubelet() {
	local d=${1:-$STATE} pfx=${2:-} name=${3:-$NODE_NAME} ip=${4:-$NODE_IP} cert=${5:-kubelet} port=${6:-}
	local croot=${7:-} hport user=node
	[[ $cert == kubelet ]] || user=$cert-client
	[[ -n $port ]] || port=$(free_port)
	hport=$(free_port "$port")
	kubeconfig "$d/kubelet.kubeconfig" "$API_URL" "$user"
	# cgroupfs: no systemd on these machines. failCgroupV1 false: they have a cgroup v1
	# hierarchy, which kubelet 1.37 still runs on but refuses by default.
	cat >"$d/kubelet.yaml" <<-EOF
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	containerRuntimeEndpoint: unix://$d/containerd/containerd.sock
	cgroupDriver: cgroupfs
	failCgroupV1: false
	failSwapOn: false
	# The second node's pods under a root of their own: two kubelets never share /kubepods.
	${croot:+cgroupRoot: $croot}
	address: $ip
	port: $port
	readOnlyPort: 0
	healthzBindAddress: 127.0.0.1
	healthzPort: $hport
	tlsCertFile: $STATE/pki/$cert.crt
	tlsPrivateKeyFile: $STATE/pki/$cert.key
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: true}
	  x509: {clientCAFile: $STATE/pki/ca.crt}
	authorization: {mode: Webhook}
	resolvConf: /etc/resolv.conf
	# A CI disk may be fuller than a node's: no eviction or image GC unless it is full.
	evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	serializeImagePulls: false
	maxPods: 40
	EOF
	echo "$port" >"$d/kubelet.port"
	log "starting kubelet (node $name, $KUBELET_ROOT, https://$ip:$port)"
	# The label GPU feature discovery puts on a GPU node: the chart's default nodeSelector.
	start_proc "${pfx}kubelet" "$d/kubelet.log" "${NODE_EXEC[@]}" "$BIN/kubelet" \
		--config="$d/kubelet.yaml" \
		--kubeconfig="$d/kubelet.kubeconfig" \
		--hostname-override="$name" \
		--node-ip="$ip" \
		--node-labels=nvidia.com/gpu.present=true \
		--root-dir="$KUBELET_ROOT" \
		--v=2
}

node_controllers() {
	local p1 p2 p3 p4
	p1=$(free_port); p2=$(free_port "$p1"); p3=$(free_port "$p1" "$p2"); p4=$(free_port "$p1" "$p2" "$p3")
	kubeconfig "$STATE/controller-manager.kubeconfig" "$API_URL" controller-manager
	kubeconfig "$STATE/scheduler.kubeconfig" "$API_URL" scheduler
	kubeconfig "$STATE/kube-proxy.kubeconfig" "$API_URL" kube-proxy
	log "starting kube-controller-manager, kube-scheduler"
	start_proc controller-manager "$STATE/controller-manager.log" "$BIN/kube-controller-manager" \
		--kubeconfig="$STATE/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
		--authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$p1" \
		--leader-elect=false \
		--use-service-account-credentials=true \
		--service-account-private-key-file="$STATE/pki/sa.key" \
		--root-ca-file="$STATE/pki/ca.crt" \
		--cluster-signing-cert-file="$STATE/pki/ca.crt" \
		--cluster-signing-key-file="$STATE/pki/ca.key" \
		--service-cluster-ip-range="$NODE_SERVICE_CIDR" \
		--allocate-node-cidrs=false \
		--controllers='*'
	start_proc scheduler "$STATE/scheduler.log" "$BIN/kube-scheduler" \
		--kubeconfig="$STATE/scheduler.kubeconfig" \
		--authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
		--authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port="$p2" \
		--leader-elect=false
	node_proxy "$STATE" "" "$NODE_NAME" "$NODE_IP" "$NODE_POD_CIDR" "$p3" "$p4"
}

# node_proxy DIR PIDNAME-PREFIX NAME IP POD-CIDR HEALTHZ-PORT METRICS-PORT: a node's kube-proxy,
# started through NODE_EXEC (in the second node's network namespace, rules of its own).
node_proxy() {
	local d=$1 pfx=$2 name=$3 ip=$4 cidr=$5
	# conntrack maxPerCore 0: leave the host's conntrack sysctls as they are.
	cat >"$d/kube-proxy.yaml" <<-EOF
	apiVersion: kubeproxy.config.k8s.io/v1alpha1
	kind: KubeProxyConfiguration
	clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
	mode: iptables
	clusterCIDR: $cidr
	hostnameOverride: $name
	bindAddress: $ip
	healthzBindAddress: 127.0.0.1:$6
	metricsBindAddress: 127.0.0.1:$7
	conntrack: {maxPerCore: 0, min: 0}
	nodePortAddresses: ["$ip/32"]
	EOF
	log "starting kube-proxy (iptables, node $name)"
	start_proc "${pfx}kube-proxy" "$d/kube-proxy.log" "${NODE_EXEC[@]}" "$BIN/kube-proxy" --config="$d/kube-proxy.yaml"
}

kubectl_bed() { "$BIN/kubectl" --kubeconfig="$STATE/kubeconfig" "$@"; }

node_ready() {
	[[ $(kubectl_bed get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]] &&
		kubectl_bed get serviceaccount default -n default &&
		kubectl_bed get configmap kube-root-ca.crt -n default &&
		[[ -n $(kubectl_bed get endpointslices -n default -l kubernetes.io/service-name=kubernetes -o jsonpath='{.items[0].endpoints[0].addresses[0]}') ]]
}

# ---- the second node (GCR_TESTBED_NODES=2) ----
# gcr-node-2 runs on this same machine: its containerd, kubelet and kube-proxy live in a network
# namespace of their own (a veth to the host: the API server at NODE_IP reaches its kubelet at
# NODE2_IP, its pods get a bridge and subnet of their own, its kube-proxy rules of their own) and a
# mount namespace of their own, where the host paths a node owns (kubelet root, pod logs, the
# chart's socket and shim directories, the runtimes' sockets) are private bind mounts of
# directories under DIR/node2/root. Everything else is the host's, in particular the chart's
# images.hostPath (/var/lib/gcr/images): both nodes see one directory, as every node of a cluster
# sees one NFS share (images.shared). Its pods' cgroups are under /gcr-node-2 (the kubelet's
# cgroupRoot), apart from the first node's /kubepods.
NODE2_NAME=gcr-node-2
NODE2_NETNS=gcr-node-2
NODE2_VETH=gcrn2 # the host's end; the node's is eth0 in its namespace
NODE2_HOST_IP=10.88.2.1
NODE2_IP=10.88.2.2
NODE2_BRIDGE=gcrbr1
NODE2_POD_CIDR=10.88.1.0/24
NODE2_POD_GW=10.88.1.1
NODE2_CGROUP=gcr-node-2
NODE2_PRIVATE=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/gcr /opt/gcr/lib
	/run/netns /run/containerd /run/nri /etc/containerd/certs.d)

node2_certs() {
	(
		cd "$STATE/pki"
		umask 077
		sign node2-client "/O=system:nodes/CN=system:node:$NODE2_NAME" "$CLIENT_EXT"
		sign node2 "/CN=$NODE2_NAME" \
			"$(printf '%s\n' "subjectAltName=IP:$NODE2_IP,DNS:$NODE2_NAME" \
				"keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth")"
	) 2>>"$STATE/pki/openssl.log" || { cat "$STATE/pki/openssl.log" >&2; die "certificate generation failed"; }
}

ns2() { nsenter --net="/var/run/netns/$NODE2_NETNS" "$@"; }

# The veth, addresses and routes; the host forwards nothing to or from it (as for the bridge).
node2_network() {
	ip netns add "$NODE2_NETNS"
	ip link add "$NODE2_VETH" type veth peer name eth0 netns "$NODE2_NETNS"
	ip addr add "$NODE2_HOST_IP/24" dev "$NODE2_VETH"
	ip link set "$NODE2_VETH" up
	ip -n "$NODE2_NETNS" link set lo up
	ip -n "$NODE2_NETNS" addr add "$NODE2_IP/24" dev eth0
	ip -n "$NODE2_NETNS" link set eth0 up
	ip -n "$NODE2_NETNS" route add default via "$NODE2_HOST_IP"
	ip route add "$NODE2_POD_CIDR" via "$NODE2_IP" dev "$NODE2_VETH"
	ns2 sysctl -qw net.ipv4.ip_forward=1
	iptables -w -I FORWARD -i "$NODE2_VETH" -j DROP -m comment --comment gcr-testbed
	iptables -w -I FORWARD -o "$NODE2_VETH" -j DROP -m comment --comment gcr-testbed
	# Its pods' bridge made here with a MAC of its own (node_network says why); the CNI plugin
	# takes it as it is.
	ip -n "$NODE2_NETNS" link add "$NODE2_BRIDGE" address 02:67:63:72:00:02 type bridge
	ip -n "$NODE2_NETNS" link set "$NODE2_BRIDGE" up
	cni_conf "$STATE/node2" "$NODE2_BRIDGE" "$NODE2_POD_CIDR" "$NODE2_POD_GW"
}

# Its cgroup root in every hierarchy (cpuset's filled from the root's, or no task could join).
node2_cgroups() {
	local c
	for c in /sys/fs/cgroup/*/ /sys/fs/cgroup/; do
		[[ -e ${c}cgroup.procs && ! -L ${c%/} ]] || continue
		[[ $c == /sys/fs/cgroup/ && ! -e ${c}cgroup.controllers ]] && continue # v1: not a hierarchy
		mkdir -p "$c$NODE2_CGROUP"
		if [[ -e ${c}cpuset.cpus && ! -s $c$NODE2_CGROUP/cpuset.cpus ]]; then
			cat "${c}cpuset.cpus" >"$c$NODE2_CGROUP/cpuset.cpus"
			cat "${c}cpuset.mems" >"$c$NODE2_CGROUP/cpuset.mems"
		fi
	done
}

# The mount namespace, held by one process (node2/ns), entered by every process of the node.
node2_namespaces() {
	local d=$STATE/node2 p
	for p in "${NODE2_PRIVATE[@]}"; do
		mkdir -p "$d/root$p"
		if [[ ! -e $p ]]; then
			mkdir -p "$p"
			printf '%s\n' "$p" >>"$d/mountpoints-made"
		fi
	done
	# shellcheck disable=SC2016
	local script='set -e; d=$1; shift; for p in "$@"; do mount --bind "$d/root$p" "$p"; done
		touch "$d/ns-ready"; exec -a "gcr-testbed-node2-ns $d" sleep infinity'
	start_proc node2/ns "$d/ns.log" nsenter --net="/var/run/netns/$NODE2_NETNS" \
		unshare --mount --propagation private bash -c "$script" node2-ns "$d" "${NODE2_PRIVATE[@]}"
	wait_for "the second node's namespaces" node2/ns test -e "$d/ns-ready"
	readlink "/proc/$(cat "$d/ns.pid")/ns/mnt" >"$d/mntns"
	NODE_EXEC=(nsenter -t "$(cat "$d/ns.pid")" -m -n --)
}

node2_ready() {
	[[ $(kubectl_bed get node "$NODE2_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]
}

node2_up() {
	local t0=$SECONDS p3 p4
	mkdir -p "$STATE/node2"
	log "starting the second node $NODE2_NAME (namespaces, $NODE2_IP, pods $NODE2_POD_CIDR)"
	node2_certs
	node2_network
	node2_cgroups
	node2_namespaces
	node_containerd "$STATE/node2" node2/
	p3=$(free_port); p4=$(free_port "$p3")
	node_proxy "$STATE/node2" node2/ "$NODE2_NAME" "$NODE2_IP" "$NODE2_POD_CIDR" "$p3" "$p4"
	# The same kubelet port as the first node: the chart's images.kubelet.port is one value.
	node_kubelet "$STATE/node2" node2/ "$NODE2_NAME" "$NODE2_IP" node2 "$(cat "$STATE/kubelet.port")" "/$NODE2_CGROUP"
	wait_for "node $NODE2_NAME Ready" node2/kubelet node2_ready
	NODE_EXEC=()
	log "node $NODE2_NAME ready in $((SECONDS - t0)) s"
}

# Kills the second node's processes, its pods and whatever is left in its namespaces, then
# removes the namespaces, the veth, the rules, its cgroups and the mount points it made. Safe to
# run twice and after a failed start.
node2_stop() {
	local dir=$1 d=$1/node2 sock c ids p i mntns=
	[[ -d $d ]] || return 0
	sock=$d/containerd/containerd.sock
	local ctr=${CTRD:+$CTRD/}ctr
	stop_one "$dir" node2/kubelet
	if [[ -S $sock ]]; then
		ids=$("$ctr" --address "$sock" -n k8s.io tasks ls -q 2>/dev/null || true)
		for c in $ids; do "$ctr" --address "$sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
		for c in $ids; do timeout 10 "$ctr" --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true; done
	fi
	stop_one "$dir" node2/kube-proxy
	stop_one "$dir" node2/containerd
	pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
	# Whatever else still runs in its mount namespace (a shim, a container) or its pods' cgroups.
	[[ -f $d/mntns ]] && mntns=$(cat "$d/mntns")
	for i in 1 2 3; do
		for p in /proc/[0-9]*; do
			[[ -n $mntns && $(readlink "$p/ns/mnt" 2>/dev/null) == "$mntns" && ${p#/proc/} != "$(cat "$d/ns.pid" 2>/dev/null)" ]] &&
				kill -KILL "${p#/proc/}" 2>/dev/null
		done
		for c in /sys/fs/cgroup/*/"$NODE2_CGROUP" /sys/fs/cgroup/"$NODE2_CGROUP"; do
			[[ -d $c ]] && find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null
		done
		sleep 0.2
	done
	stop_one "$dir" node2/ns
	ip netns del "$NODE2_NETNS" 2>/dev/null || true
	ip link del "$NODE2_VETH" 2>/dev/null || true
	while iptables -w -D FORWARD -i "$NODE2_VETH" -j DROP -m comment --comment gcr-testbed 2>/dev/null; do :; done
	while iptables -w -D FORWARD -o "$NODE2_VETH" -j DROP -m comment --comment gcr-testbed 2>/dev/null; do :; done
	for i in $(seq 50); do
		local left=0
		for c in /sys/fs/cgroup/*/"$NODE2_CGROUP" /sys/fs/cgroup/"$NODE2_CGROUP"; do
			[[ -d $c && ! -L $c ]] || continue
			find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
			[[ -d $c ]] && left=1
		done
		((left == 0)) && break
		sleep 0.2
	done
	if [[ -f $d/mountpoints-made ]]; then
		tac "$d/mountpoints-made" | while read -r p; do rmdir "$p" 2>/dev/null || true; done
		rm -f "$d/mountpoints-made"
	fi
}

cmd_up_node() {
	need openssl curl setsid ip iptables runc python3
	[[ $NODES == 1 || $NODES == 2 ]] || die "GCR_TESTBED_NODES must be 1 or 2 (got $NODES)"
	[[ $NODES == 1 ]] || need nsenter unshare sysctl
	[[ $(id -u) == 0 ]] || die "up-node needs root (containerd, kubelet, network)"
	local t0=$SECONDS
	PAUSE_IMAGE=${GCR_TESTBED_PAUSE_IMAGE:-docker.io/gcr-test/pause:1}
	BIN=$(cmd_build)
	CTRD=$(ctrd_dir)
	[[ -f $CTRD/.complete ]] || die "containerd is not in $CTRD after the build"
	if [[ -e $KUBELET_ROOT/.gcr-testbed ]]; then
		# A bed whose kubelet still runs is another run's; one whose kubelet is gone was killed
		# before its down (a CI job stopped, a machine image taken mid-run): its leftovers go.
		pgrep -x kubelet >/dev/null && die "$KUBELET_ROOT belongs to a running test bed; run down first"
		log "$KUBELET_ROOT: leftovers of a test bed no kubelet serves any more; cleaning them"
		node_cleanup /nonexistent-gcr-testbed
		[[ -L $CRI_SOCKET && ! -e $CRI_SOCKET ]] && rm -f "$CRI_SOCKET"
	fi
	# Another bed's socket and network are refused before anything is made: the teardown of a
	# failed start (the trap below) would remove them.
	[[ -e $CRI_SOCKET || -L $CRI_SOCKET ]] && die "$CRI_SOCKET exists: another containerd or test bed runs"
	ip link show "$NODE_BRIDGE" >/dev/null 2>&1 && die "$NODE_BRIDGE exists: another test bed runs (down it first)"
	if [[ $NODES == 2 ]]; then
		[[ -e /var/run/netns/$NODE2_NETNS ]] && die "network namespace $NODE2_NETNS exists: another test bed runs (down it first)"
		ip link show "$NODE2_VETH" >/dev/null 2>&1 && die "$NODE2_VETH exists: another test bed runs (down it first)"
	fi
	new_state
	touch "$STATE/.gcr-testbed-node"
	# Host paths a node has that this machine may lack: made here, removed by down.
	local p
	for p in /run/containerd /etc/containerd /etc/containerd/certs.d; do
		if [[ ! -e $p ]]; then
			mkdir -p "$p"
			printf '%s\n' "$p" >>"$STATE/host-paths-made"
		fi
	done
	trap 'rc=$?; if ((rc != 0)); then log "up-node failed; tearing down"; GCR_TESTBED_KEEP=1 stop_all "$STATE"; fi' EXIT
	gen_certs "$STATE/pki" "IP:$NODE_IP,IP:$NODE_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	node_certs
	node_network
	start_control_plane node
	node_containerd
	mkdir -p "$KUBELET_ROOT"
	touch "$KUBELET_ROOT/.gcr-testbed"
	node_controllers
	node_kubelet
	wait_for "node $NODE_NAME Ready, default ServiceAccount, kubernetes endpoints" kubelet node_ready
	[[ $NODES == 2 ]] && node2_up
	# What the GPU operator creates on a GPU cluster; served by the stand-in runtime above.
	kubectl_bed apply -f - >/dev/null <<-EOF
	apiVersion: node.k8s.io/v1
	kind: RuntimeClass
	metadata: {name: nvidia}
	handler: nvidia
	EOF
	write_env node
	trap - EXIT
	log "node $NODE_NAME ready in $((SECONDS - t0)) s: $API_URL (kubelet $(cat "$STATE/kubelet.port"))"
	log "KUBECONFIG=$STATE/kubeconfig; stop with: $0 down $STATE"
	cat "$STATE/env"
}

# Kills what is left in the node's pod cgroups, unmounts what the kubelet and
# containerd left, removes pod network namespaces, the bridge and the rules. Safe to
# run twice and after a failed start.
node_cleanup() {
	local dir=$1 c m ns
	for c in /sys/fs/cgroup/*/kubepods; do
		[[ -d $c ]] || continue
		find "$c" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
	done
	# Mounts under the kubelet's root and the state dir, deepest first.
	# (The kubelet bind-mounts its root onto itself, to make it a shared mount.)
	for m in $(awk -v a="$KUBELET_ROOT" -v b="$dir/" '$2 == a || index($2, a "/") == 1 || index($2, b) == 1 {print $2}' /proc/self/mounts | sort -r); do
		umount -l "$m" 2>/dev/null || true
	done
	for c in /sys/fs/cgroup/*/kubepods; do
		[[ -d $c ]] || continue
		find "$c" -depth -type d -exec rmdir {} \; 2>/dev/null || true
	done
	for ns in /var/run/netns/cni-*; do
		[[ -e $ns ]] || continue
		umount "$ns" 2>/dev/null || true
		rm -f "$ns"
	done
	if [[ -x ${BIN:-}/kube-proxy ]]; then
		"$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	while iptables -w -D FORWARD -i "$NODE_BRIDGE" ! -o "$NODE_BRIDGE" -j DROP -m comment --comment gcr-testbed 2>/dev/null; do :; done
	while iptables -w -D FORWARD ! -i "$NODE_BRIDGE" -o "$NODE_BRIDGE" -j DROP -m comment --comment gcr-testbed 2>/dev/null; do :; done
	ip route del "$NODE_SERVICE_CIDR" dev "$NODE_BRIDGE" 2>/dev/null || true
	ip route del blackhole "$NODE_SERVICE_CIDR" 2>/dev/null || true # a bed from before the route
	ip link del "$NODE_BRIDGE" 2>/dev/null || true
	[[ -e $KUBELET_ROOT/.gcr-testbed ]] && rm -rf "$KUBELET_ROOT"
	rm -rf /var/log/pods /var/log/containers
	# The CRI socket's link, the agents' registry host directories, the paths made for them.
	[[ -L $CRI_SOCKET && $(readlink "$CRI_SOCKET") == "$dir/"* ]] && rm -f "$CRI_SOCKET"
	local h
	for h in "$REGISTRY_CERTS_DIR"/127.0.0.1_*_; do
		[[ -f $h/hosts.toml ]] && grep -q '^# Written by gcr-agent' "$h/hosts.toml" && rm -rf "$h"
		[[ -d $h ]] && rmdir "$h" 2>/dev/null
	done
	if [[ -f $dir/host-paths-made ]]; then
		tac "$dir/host-paths-made" | while read -r h; do rmdir "$h" 2>/dev/null || true; done
	fi
}

# Containers first, through containerd while it runs (their shims unmount and
# clean up), so little is left for node_cleanup.
node_stop() {
	local dir=$1 sock=$1/containerd/containerd.sock ids
	[[ -n ${BIN:-} ]] || BIN=$(sed -n "s/^export GCR_TESTBED_BIN='\(.*\)'$/\1/p" "$dir/env" 2>/dev/null)
	[[ -n ${CTRD:-} ]] || CTRD=$(sed -n "s/^export GCR_TESTBED_CTRD='\(.*\)'$/\1/p" "$dir/env" 2>/dev/null)
	local ctr=${CTRD:+$CTRD/}ctr
	node2_stop "$dir"
	stop_one "$dir" kubelet
	if [[ -S $sock ]]; then
		ids=$("$ctr" --address "$sock" -n k8s.io tasks ls -q 2>/dev/null || true)
		for c in $ids; do "$ctr" --address "$sock" -n k8s.io tasks kill -s KILL "$c" >/dev/null 2>&1 || true; done
		for c in $ids; do timeout 10 "$ctr" --address "$sock" -n k8s.io tasks delete -f "$c" >/dev/null 2>&1 || true; done
	fi
	stop_one "$dir" kube-proxy
	stop_one "$dir" scheduler
	stop_one "$dir" controller-manager
	stop_one "$dir" containerd
	pkill -KILL -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
	node_cleanup "$dir"
}

stop_one() { # dir name [grace in 0.2 s steps, default 100]
	local dir=$1 name=$2 grace=${3:-100} pid i
	[[ -f $dir/$name.pid ]] || return 0
	pid=$(cat "$dir/$name.pid")
	if ours "$pid" "$dir"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq "$grace"); do
			ours "$pid" "$dir" || break
			sleep 0.2
		done
		if ours "$pid" "$dir"; then
			((grace < 100)) || log "$name (pid $pid) did not stop in $((grace / 5)) s; killing it"
			kill -KILL "$pid" 2>/dev/null || true
			# Gone before anyone starts another: a restart that started the next one while
			# this one still held its port saw the new one exit at once (bind in use).
			for i in $(seq 100); do
				ours "$pid" "$dir" || break
				sleep 0.1
			done
		fi
	fi
	rm -f "$dir/$name.pid"
}

stop_all() { # dir
	local dir=$1
	[[ -d $dir ]] || return 0
	[[ -f $dir/.gcr-testbed-node ]] && node_stop "$dir"
	# At the end the state is thrown away: kube-apiserver, whose graceful stop waits 20 s and
	# more for its clients' open watches, gets 1 s (a restart, stop_only, still waits).
	stop_one "$dir" apiserver 5
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

# restart NAME READINESS-CMD...: stops NAME and starts it again with the same command
# line (same port, certificates and data): clients see their connections drop and
# come back. stop-* and start-* are its two halves. Every start after the first
# appends to NAME.log.restart.
stop_only() { # name
	local name=$1
	[[ -f $STATE/$name.pid ]] || die "$name is not running (no $STATE/$name.pid)"
	log "stopping $name"
	stop_one "$STATE" "$name"
	log "$name stopped"
}

start_only() { # name readiness-cmd...
	local name=$1 args
	shift
	if [[ -f $STATE/$name.pid ]] && ours "$(cat "$STATE/$name.pid")" "$STATE"; then
		die "$name is running already (pid $(cat "$STATE/$name.pid"))"
	fi
	mapfile -d '' args <"$STATE/$name.args"
	log "starting $name"
	setsid "${args[@]}" >>"$STATE/$name.log.restart" 2>&1 </dev/null &
	printf '%s\n' "$!" >"$STATE/$name.pid"
	wait_for "$name ready" "$name" "$@"
	log "$name back"
}

restart_one() {
	local name=$1
	stop_one "$STATE" "$name"
	log "restarting $name"
	start_only "$@"
}

bed_dir() {
	local dir
	dir=$(state_arg "${1:-}")
	[[ -n $dir && -f $dir/.gcr-testbed && -f $dir/apiserver.args ]] || die "no test bed to restart"
	STATE=$dir
}

api_url() { sed -n 's/^ *server: //p' "$STATE/kubeconfig" | head -n 1; }

# apiserver_ctl restart|start|stop [DIR]
apiserver_ctl() {
	bed_dir "${2:-}"
	local ready=(curl -fsS --max-time 5 --cacert "$STATE/pki/ca.crt"
		--cert "$STATE/pki/admin.crt" --key "$STATE/pki/admin.key" "$(api_url)/readyz")
	case $1 in
	restart) restart_one apiserver "${ready[@]}" ;;
	start) start_only apiserver "${ready[@]}" ;;
	stop) stop_only apiserver ;;
	esac
}

etcd_ctl() {
	bed_dir "${2:-}"
	local url
	url=$(tr '\0' '\n' <"$STATE/etcd.args" | sed -n 's/^--advertise-client-urls=//p')
	case $1 in
	restart) restart_one etcd curl -fsS --max-time 2 "$url/health" ;;
	start) start_only etcd curl -fsS --max-time 2 "$url/health" ;;
	stop) stop_only etcd ;;
	esac
}

cmd_status() {
	local dir up=0 want=(etcd apiserver) n
	dir=$(state_arg "${1:-}")
	[[ -n $dir && -f $dir/.gcr-testbed ]] || { log "down"; return 1; }
	[[ -f $dir/.gcr-testbed-node ]] && want+=(containerd controller-manager scheduler kube-proxy kubelet)
	[[ -d $dir/node2 ]] && want+=(node2/ns node2/containerd node2/kube-proxy node2/kubelet)
	for n in "${want[@]}"; do
		if ours "$(cat "$dir/$n.pid" 2>/dev/null || true)" "$dir"; then
			log "$n running"
			up=$((up + 1))
		else
			log "$n not running"
		fi
	done
	((up == ${#want[@]})) && cat "$dir/env"
	((up == ${#want[@]}))
}

case ${1:-} in
build) cmd_build ;;
up) cmd_up ;;
up-node) cmd_up_node ;;
down) cmd_down "${2:-}" ;;
status) cmd_status "${2:-}" ;;
restart-apiserver | start-apiserver | stop-apiserver) apiserver_ctl "${1%-apiserver}" "${2:-}" ;;
restart-etcd | start-etcd | stop-etcd) etcd_ctl "${1%-etcd}" "${2:-}" ;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
