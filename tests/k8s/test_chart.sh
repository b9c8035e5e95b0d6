#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions are called through run/refuse/expect_eq and traps
# Test the Helm chart (helm/gcr), the manifests rendered from it (deploy/), the
# image recipe (Dockerfile) and the chart's RBAC against a real kube-apiserver.
#
#   tests/k8s/test_chart.sh
#
# Without KUBECONFIG it starts the test bed (tests/k8s/testbed.sh up) and stops
# it at the end. With KUBECONFIG set it uses that cluster (its server must be on
# 127.0.0.1), works in namespaces of its own and removes what it created.
#   GCR_BUILD_DIR               configured+built tree for the image layout check
#                               (default: build/, as tests/run.sh makes it)
#   GCR_SERVICEMONITOR_CRD      the ServiceMonitor CRD file (default: from the
#                               prometheus-operator Go module, via go mod download)
# Prints "N passed, N failed" last; exits non-zero on any failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CHART=$ROOT/helm/gcr
TESTBED=$HERE/testbed.sh
CHECKS=$HERE/chart_checks.py
# The ServiceMonitor CRD comes from this release of prometheus-operator.
PROMOP_MODULE=github.com/prometheus-operator/prometheus-operator@v0.85.0
PROMOP_CRD=example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml

PASSED=0
FAILED=0
STARTED_BED=0
CREATED_CRDS=()
CREATED_NS=()
CREATED_CLUSTER=() # cluster-scoped RBAC objects, "kind/name"
ID=$$-$RANDOM
NS=gcr-chart-$ID         # the default render, applied for real
NS_OTHER=gcr-chart-o-$ID # the non-default render (dry run) and "another namespace"
NS_SA=gcr-chart-sa-$ID   # chart_sa_kubeconfig.sh
REL=gcr-chart-$ID
REL_OTHER=gcr-chart-o-$ID
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcr-test-chart.XXXXXX")
TEST_NAME=test_chart
# shellcheck source=tests/k8s/testlib.sh
source "$HERE/testlib.sh"


cleanup() {
	local rc=$? c
	set +e
	if ((STARTED_BED)); then
		"$TESTBED" down "$GCR_TESTBED_DIR" >/dev/null
	elif [[ -n ${KUBECTL:-} && -n ${KUBECONFIG:-} ]]; then
		for c in "${CREATED_NS[@]}"; do
			kc delete namespace "$c" --ignore-not-found --wait=false >/dev/null 2>&1
		done
		for c in "${CREATED_CLUSTER[@]}"; do
			kc delete "$c" --ignore-not-found >/dev/null 2>&1
		done
		for c in "${CREATED_CRDS[@]}"; do
			kc delete crd "$c" --ignore-not-found >/dev/null 2>&1
		done
	fi
	rm -rf "$TMP"
	if ((rc != 0 && FAILED == 0)); then
		log "test_chart: error: stopped early (exit status $rc)"
		FAILED=1
	fi
	((FAILED == 0)) || rc=1
	# The summary is the last line, also when the test stopped early.
	echo "$PASSED passed, $FAILED failed"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# refuse NAME EXPECT CMD...: passes if CMD fails and its output contains EXPECT.
refuse() {
	local name=$1 expect=$2
	shift 2
	if OUT=$("$@" 2>&1); then
		fail "$name (was accepted)" "$OUT"
	elif [[ $OUT != *"$expect"* ]]; then
		fail "$name (expected \"$expect\")" "$OUT"
	else
		pass "$name"
	fi
}
# checks CMD...: runs chart_checks.py, one result per "ok"/"FAIL" line it prints.
checks() {
	local line
	while IFS= read -r line; do
		case $line in
		"ok     "*) PASSED=$((PASSED + 1)) ;;
		"FAIL   "*) FAILED=$((FAILED + 1)) ;;
		esac
		printf '%s\n' "$line"
	done < <(python3 "$CHECKS" "$@" 2>&1 || echo "FAIL   chart_checks.py $1 exited non-zero")
}

BIN=$("$TESTBED" build) || die "building the test bed binaries failed"
KUBECTL=$BIN/kubectl
HELM=$BIN/helm
python3 -c 'import yaml' 2>/dev/null || die "python3 with PyYAML is needed"
h() { "$HELM" "$@"; }

# --- chart, without a cluster ---------------------------------------------------

run "helm lint --strict (default values)" h lint --strict "$CHART"
run "helm lint --strict (tests/k8s/values-test.yaml)" h lint --strict "$CHART" -f "$HERE/values-test.yaml"

if OUT=$(diff -r "$ROOT/crd" "$CHART/crds" -x examples 2>&1) &&
	[[ $(cd "$ROOT/crd" && ls -1 ./*.yaml) == $(cd "$CHART/crds" && ls -1 ./*.yaml) ]]; then
	pass "chart crds/ identical to crd/"
else
	fail "chart crds/ identical to crd/ (cp crd/gpucr.dev_*.yaml helm/gcr/crds/)" "$OUT"
fi
run "deploy/gcr.yaml is what scripts/render-manifests.sh renders" \
	env HELM="$HELM" "$ROOT/scripts/render-manifests.sh" --check

run "helm template (default values)" \
	h template "$REL" "$CHART" --namespace "$NS" --include-crds --output-dir "$TMP/ignored"
h template "$REL" "$CHART" --namespace "$NS" --include-crds >"$TMP/default.yaml"
h template "$REL" "$CHART" --namespace "$NS" >"$TMP/default-nocrds.yaml"
run "helm template (values-test.yaml, namespace $NS_OTHER)" \
	h template "$REL_OTHER" "$CHART" --namespace "$NS_OTHER" -f "$HERE/values-test.yaml"
h template "$REL_OTHER" "$CHART" --namespace "$NS_OTHER" -f "$HERE/values-test.yaml" >"$TMP/test.yaml"

checks rbac "$TMP/default-nocrds.yaml" "$HERE/rbac-expected.txt"
checks default "$TMP/default-nocrds.yaml" "$NS"
checks test "$TMP/test.yaml" "$NS_OTHER"
if OUT=$(diff <(python3 "$CHECKS" rules "$TMP/default-nocrds.yaml") \
	<(python3 "$CHECKS" rules "$TMP/test.yaml")); then
	pass "values do not change the RBAC rules"
else
	fail "values do not change the RBAC rules" "$OUT"
fi
refuse "bad driver.mode refused" "driver.mode must be" \
	h template x "$CHART" --set driver.mode=bogus
refuse "registry socket outside the socket dir refused" "must be inside agent.socketDir" \
	h template x "$CHART" --set agent.registrySocket=/tmp/agent.sock
refuse "zero slots refused" "slots must be at least 1" \
	h template x "$CHART" --set devicePlugin.slots=0
refuse "socketRoot in the registry socket's directory refused" "must not be the registry socket's directory" \
	h template x "$CHART" --set devicePlugin.socketRoot=/run/gcr/agent/alloc
refuse "socketRoot outside the socket dir refused" "socketRoot must be inside agent.socketDir" \
	h template x "$CHART" --set devicePlugin.socketRoot=/var/run/alloc
refuse "scaler.enabled=false refused (the scaler creates the node heartbeat Leases)" \
	"the scaler creates the node agents' heartbeat Leases" h template x "$CHART" --set scaler.enabled=false
refuse "eviction.enabled without images.kubelet refused" "eviction.enabled needs images.kubelet.enabled" \
	h template x "$CHART" --set eviction.enabled=true
refuse "eviction.rateMiBs 0 refused" "eviction.rateMiBs must be in 1..100000" \
	h template x "$CHART" --set eviction.rateMiBs=0
eviction_on() {
	local r
	r=$(h template x "$CHART" --set eviction.enabled=true --set images.kubelet.enabled=true) &&
		[[ $r == *'eviction: "true"'* ]] && [[ $(python3 "$CHECKS" rules <(printf '%s\n' "$r")) == *"node ClusterRole gpucr.dev checkpoints create"* ]]
}
run "eviction.enabled (with images.kubelet): on in the config, and the node agents may create Checkpoints" eviction_on
metrics_override() {
	local r
	r=$(h template x "$CHART" --set metrics.bindAddress=0.0.0.0) &&
		[[ $(grep -c -- '--metrics-address=0.0.0.0:9464' <<<"$r") == 2 ]] && [[ $r != *'$(POD_IP)'* ]]
}
run "metrics.bindAddress override used as given by both workloads" metrics_override
refuse "serviceAccount.create=false needs a name" "serviceAccount.name is required" \
	h template x "$CHART" --set serviceAccount.create=false --set serviceAccount.scalerName=s
refuse "serviceAccount.create=false needs the scaler's name too" "serviceAccount.scalerName is required" \
	h template x "$CHART" --set serviceAccount.create=false --set serviceAccount.name=n
no_kubelet_dir() {
	local r
	r=$(h template x "$CHART" --set devicePlugin.enabled=false) && [[ $r != *"path: /var/lib/kubelet"* ]]
}
run "devicePlugin.enabled=false: no kubelet hostPath" no_kubelet_dir
overcommit_off() {
	local r
	r=$(h template x "$CHART" --set overcommit.enabled=false) &&
		[[ $r == *'overcommit: "false"'* && $r != *'GCR_OVERCOMMIT: '* && $r == *'shimEnv: {}'* ]]
}
run "overcommit.enabled=false: the policy off, no GCR_OVERCOMMIT for the shims" overcommit_off
refuse "eviction.restore without images.kubelet refused" "eviction.restore.enabled needs images.kubelet.enabled" \
	h template x "$CHART" --set eviction.restore.enabled=true
restore_on() {
	local on off
	on=$(h template x "$CHART" --set images.kubelet.enabled=true --set eviction.restore.enabled=true \
		--set eviction.restore.registryPort=5099) &&
		off=$(h template x "$CHART" --set images.kubelet.enabled=true) &&
		[[ $on == *'hostNetwork: true'* && $on == *'restoreRegistryPort: 5099'* ]] &&
		[[ $on == *'verbs: ["patch", "delete"]'* ]] &&
		[[ $off != *'hostNetwork: true'* && $off != *'restoreRegistryPort'* && $off != *'verbs: ["patch", "delete"]'* ]]
}
run "eviction.restore: hostNetwork, the registry port and the scaler's pod writes only when on" restore_on
# The registry's TLS (containerd's host directory for the port, only it) and the CRI socket (the
# store sweep), mounted only with eviction.restore; criSocket "" leaves the socket out.
restore_mounts() {
	local on nosock off
	on=$(h template x "$CHART" --set images.kubelet.enabled=true --set eviction.restore.enabled=true \
		--set eviction.restore.registryPort=5099) &&
		nosock=$(h template x "$CHART" --set images.kubelet.enabled=true --set eviction.restore.enabled=true \
			--set eviction.restore.criSocket=) &&
		off=$(h template x "$CHART" --set images.kubelet.enabled=true) &&
		python3 - "$on" "$nosock" "$off" <<-'PY'
		import sys, yaml
		def ds(text):
		    d = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "DaemonSet"][0]
		    pod = d["spec"]["template"]["spec"]
		    vols = {v["name"]: v for v in pod["volumes"]}
		    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
		    cm = [d for d in yaml.safe_load_all(text) if d and d.get("kind") == "ConfigMap"][0]
		    return vols, mounts, yaml.safe_load(cm["data"]["config.yaml"])
		vols, mounts, cfg = ds(sys.argv[1])
		hosts = "/etc/containerd/certs.d/127.0.0.1_5099_"
		ok = (vols["registry-hosts"]["hostPath"] == {"path": hosts, "type": "DirectoryOrCreate"} and
		      mounts["registry-hosts"]["mountPath"] == hosts and
		      vols["cri-socket"]["hostPath"] == {"path": "/run/containerd/containerd.sock", "type": "Socket"} and
		      mounts["cri-socket"]["mountPath"] == "/run/containerd/containerd.sock" and
		      cfg["restoreRegistryCertsDir"] == "/etc/containerd/certs.d" and
		      cfg["restoreCriEndpoint"] == "/run/containerd/containerd.sock")
		vols, mounts, cfg = ds(sys.argv[2])
		ok = ok and "cri-socket" not in vols and "cri-socket" not in mounts and "restoreCriEndpoint" not in cfg
		vols, mounts, cfg = ds(sys.argv[3])
		ok = ok and not {"registry-hosts", "cri-socket"} & set(vols) and "restoreRegistryCertsDir" not in cfg
		sys.exit(0 if ok else 1)
		PY
}
run "eviction.restore: containerd's host directory for the registry and the CRI socket, only when on" restore_mounts
refuse "eviction.restore.certsDir relative refused" "eviction.restore.certsDir must be an absolute path" \
	h template x "$CHART" --set images.kubelet.enabled=true --set eviction.restore.enabled=true \
	--set eviction.restore.certsDir=etc/certs.d
images_shared() {
	local on
	on=$(h template x "$CHART" --set images.shared=true) && [[ $on == *'imagesShared: "true"'* ]] &&
		[[ $(python3 "$CHECKS" rules <(printf '%s\n' "$on")) == $(python3 "$CHECKS" rules "$TMP/default-nocrds.yaml") ]]
}
run "images.shared: on in the agent's config, the RBAC rules unchanged" images_shared
# Shared images are signed: the key's Secret (made by the chart, or the operator's), mounted
# read-only into the agent, named in its config; none without shared storage.
images_key() {
	local made mine off
	made=$(h template x "$CHART" --set images.shared=true) &&
		mine=$(h template x "$CHART" --set images.claim=gcr-images --set images.key.secretName=my-key) &&
		off=$(h template x "$CHART") &&
		python3 - "$made" "$mine" "$off" <<-'PY'
		import base64, sys, yaml
		def docs(text):
		    return [d for d in yaml.safe_load_all(text) if d]
		def agent(text):
		    d = [d for d in docs(text) if d.get("kind") == "DaemonSet"][0]["spec"]["template"]["spec"]
		    cm = [d for d in docs(text) if d.get("kind") == "ConfigMap"][0]
		    return ({v["name"]: v for v in d["volumes"]}, {m["name"]: m for m in d["containers"][0]["volumeMounts"]},
		            yaml.safe_load(cm["data"]["config.yaml"]))
		sec = [d for d in docs(sys.argv[1]) if d.get("kind") == "Secret"]
		vols, mounts, cfg = agent(sys.argv[1])
		ok = (len(sec) == 1 and sec[0]["metadata"]["name"] == "x-gcr-images-key" and
		      len(base64.b64decode(sec[0]["data"]["key"])) == 64 and
		      sec[0]["metadata"]["annotations"].get("helm.sh/resource-policy") == "keep" and
		      vols["images-key"]["secret"]["secretName"] == "x-gcr-images-key" and
		      mounts["images-key"] == {"name": "images-key", "mountPath": "/etc/gcr-images-key", "readOnly": True} and
		      cfg["imagesKeyDir"] == "/etc/gcr-images-key")
		vols, mounts, cfg = agent(sys.argv[2])
		ok = ok and not [d for d in docs(sys.argv[2]) if d.get("kind") == "Secret"] and \
		    vols["images-key"]["secret"]["secretName"] == "my-key"
		vols, mounts, cfg = agent(sys.argv[3])
		ok = ok and "images-key" not in vols and "imagesKeyDir" not in cfg and \
		    not [d for d in docs(sys.argv[3]) if d.get("kind") == "Secret"]
		sys.exit(0 if ok else 1)
		PY
}
run "images.shared/claim: the images key's Secret made or named, mounted read-only, in the agent's config" images_key
images_claim() {
	local on
	on=$(h template x "$CHART" --set images.claim=gcr-images) && [[ $on == *'imagesShared: "true"'* ]] &&
		python3 - "$on" <<-'PY'
		import sys, yaml
		ds = [d for d in yaml.safe_load_all(sys.argv[1]) if d and d.get("kind") == "DaemonSet"][0]
		v = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "images"][0]
		sys.exit(0 if v == {"name": "images", "persistentVolumeClaim": {"claimName": "gcr-images"}} else 1)
		PY
}
run "images.claim: the images volume is that claim, shared implied" images_claim
refuse "images.claim with images.pods refused" "images.claim and images.pods.enabled exclude each other" \
	h template x "$CHART" --set images.claim=gcr-images --set images.pods.enabled=true

# --- Dockerfile (no Docker engine here: lint, and the install layout) ------------

DF=$ROOT/Dockerfile
if [[ -f $DF ]]; then
	missing=()
	# COPY sources from the build context (not --from=stage) must exist.
	while read -r src; do
		[[ -e $ROOT/$src ]] || missing+=("$src")
	done < <(awk '$1 == "COPY" && $2 !~ /^--from=/ {for (i = 2; i < NF; i++) if ($i !~ /^--/) print $i}' "$DF")
	if ((${#missing[@]} == 0)); then pass "Dockerfile: every COPY source exists"; else
		fail "Dockerfile: every COPY source exists" "${missing[*]}"; fi
	# It builds the way CI does: CI's package script, autogen, configure, make.
	want=("scripts/install-deps.sh" "./autogen.sh" "../configure" "make -j" "scripts/image-stage.sh")
	absent=()
	for w in "${want[@]}"; do grep -qF -- "$w" "$DF" || absent+=("$w"); done
	grep -q 'install-deps.sh' "$ROOT/tests/run.sh" && grep -q './autogen.sh' "$ROOT/tests/run.sh" ||
		absent+=("(tests/run.sh no longer runs install-deps.sh and autogen.sh)")
	if ((${#absent[@]} == 0)); then pass "Dockerfile builds as CI does (install-deps, autogen, configure, make)"; else
		fail "Dockerfile builds as CI does" "missing: ${absent[*]}"; fi
	if grep -qE '^FROM \$\{DEBIAN_IMAGE\} AS build' "$DF" && grep -qE '^ARG DEBIAN_IMAGE=debian:bookworm$' "$DF" &&
		grep -qE '^FROM \$\{DEBIAN_IMAGE\}-slim$' "$DF"; then
		pass "Dockerfile: debian:bookworm build stage, bookworm-slim runtime"
	else
		fail "Dockerfile: debian:bookworm build stage, bookworm-slim runtime"
	fi
	# The paths the chart relies on are the ones the image has.
	if grep -q 'command: \["/usr/local/bin/gcr-agent"\]' "$CHART/templates/daemonset.yaml" &&
		grep -q '/usr/local/bin/gcr-agent' "$DF" && grep -q '/opt/gcr/lib/' "$DF" &&
		grep -q 'for f in /opt/gcr/lib/\*' "$CHART/templates/daemonset.yaml"; then
		pass "Dockerfile and chart agree on /usr/local/bin/gcr-agent and /opt/gcr/lib"
	else
		fail "Dockerfile and chart agree on /usr/local/bin/gcr-agent and /opt/gcr/lib"
	fi
	if OUT=$(grep -nE '^\s*(ADD|RUN .*curl|RUN .*wget)' "$DF"); then
		fail "Dockerfile fetches nothing outside package managers" "$OUT"
	else
		pass "Dockerfile fetches nothing outside package managers"
	fi
else
	fail "Dockerfile exists"
fi
BUILD=${GCR_BUILD_DIR:-$ROOT/build}
if [[ -f $BUILD/Makefile && -f $BUILD/shim/.libs/libgcr.so ]]; then
	if OUT=$("$ROOT/scripts/image-stage.sh" "$BUILD" "$TMP/stage" 2>&1) &&
		[[ -x $TMP/stage/usr/local/bin/gcrctl && -f $TMP/stage/opt/gcr/lib/libgcr.so &&
			-f $TMP/stage/opt/gcr/lib/libjansson.so.4 ]] &&
		grep -qx libjansson4 "$TMP/stage/runtime-packages.txt"; then
		pass "image layout from $BUILD: bin/, /opt/gcr/lib (shim + libjansson.so.4), runtime packages"
	else
		fail "image layout from $BUILD (scripts/image-stage.sh)" "$OUT"
	fi
	[[ -x $TMP/stage/usr/local/bin/gcr-agent ]] ||
		log "test_chart: note: the build has no gcr-agent yet; the Dockerfile's final check needs it"
else
	skip "image layout: no built tree at $BUILD (tests/run.sh builds one; or set GCR_BUILD_DIR)"
fi

# --- test bed -------------------------------------------------------------------

testbed_connect
log "API server: $SERVER, namespaces $NS, $NS_OTHER, $NS_SA"

newns() {
	kc create namespace "$1" >/dev/null || die "cannot create namespace $1"
	CREATED_NS+=("$1")
}
apply() { kc apply --server-side --field-manager=gcr-chart-test "$@"; }
dry_run_edited() { sed "$1" "$2" | apply --dry-run=server -f -; } # sed-expr file

for f in "$CHART"/crds/*.yaml; do
	name=$(awk '/^metadata:/ {m=1} m && /^  name:/ {print $2; exit}' "$f")
	kc get crd "$name" >/dev/null 2>&1 || CREATED_CRDS+=("$name")
done
run "chart CRDs applied" apply -f "$CHART/crds/"
run "chart CRDs Established" kc wait --for=condition=Established --timeout=60s \
	crd/checkpoints.gpucr.dev crd/restores.gpucr.dev

# Default values: dry run of everything, then for real into a fresh namespace.
newns "$NS"
CREATED_CLUSTER+=("clusterrole/$REL" "clusterrolebinding/$REL" "clusterrole/$REL-scaler" "clusterrolebinding/$REL-scaler")
run "default render: server-side apply, dry run" apply --dry-run=server -f "$TMP/default.yaml"
run "default render: server-side apply into $NS" apply -f "$TMP/default.yaml"
expect_eq "scaler Deployment stored: role scaler, no hostPID, its ServiceAccount" "--role=scaler  $REL-scaler" \
	kc -n "$NS" get deployment "$REL-scaler" -o \
	'jsonpath={.spec.template.spec.containers[0].args[1]} {.spec.template.spec.hostPID} {.spec.template.spec.serviceAccountName}'
expect_eq "DaemonSet stored: hostPID, nodeSelector, 2 probes" "true true /healthz /readyz" \
	kc -n "$NS" get daemonset "$REL" -o \
	'jsonpath={.spec.template.spec.hostPID} {.spec.template.spec.nodeSelector.nvidia\.com/gpu\.present} {.spec.template.spec.containers[0].livenessProbe.httpGet.path} {.spec.template.spec.containers[0].readinessProbe.httpGet.path}'
names_in() { # namespace: the chart's namespaced objects there, on one line
	kc -n "$1" get configmap,daemonset,deployment,role,rolebinding,serviceaccount -o name | sort | tr '\n' ' ' | sed 's/ $//'
}
expect_eq "all objects of the default render exist" \
	"configmap/$REL daemonset.apps/$REL deployment.apps/$REL-scaler role.rbac.authorization.k8s.io/$REL role.rbac.authorization.k8s.io/$REL-scaler rolebinding.rbac.authorization.k8s.io/$REL rolebinding.rbac.authorization.k8s.io/$REL-scaler serviceaccount/$REL serviceaccount/$REL-scaler" \
	names_in "$NS"
run "ClusterRoles and ClusterRoleBindings of both identities exist" kc get "clusterrole/$REL" "clusterrolebinding/$REL" \
	"clusterrole/$REL-scaler" "clusterrolebinding/$REL-scaler"
run "re-apply is a no-op (idempotent)" apply -f "$TMP/default.yaml"

# deploy/gcr.yaml as a user applies it (its own Namespace, release "gcr"): only on
# a test bed of our own, since it creates gcr-system and cluster-wide "gcr" objects.
if ((STARTED_BED)); then
	run "deploy/gcr.yaml: kubectl apply --server-side" apply -f "$ROOT/deploy/gcr.yaml"
	deployed() { # the namespace's Pod Security level and the DaemonSet in it
		printf '%s %s' "$(kc get namespace gcr-system -o 'jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}')" \
			"$(kc -n gcr-system get daemonset gcr -o name)"
	}
	expect_eq "... namespace gcr-system exempt from Pod Security, DaemonSet gcr there" \
		"privileged daemonset.apps/gcr" deployed
else
	skip "deploy/gcr.yaml not applied: this cluster is not our own test bed (it would create gcr-system and cluster-wide \"gcr\" objects)"
fi

# Non-default values, in another namespace, with the ServiceMonitor's real CRD.
newns "$NS_OTHER"
smcrd=${GCR_SERVICEMONITOR_CRD:-}
why=
if [[ -z $smcrd ]]; then
	if gobin=$(command -v go || ls /usr/local/go/bin/go 2>/dev/null) &&
		dir=$(cd "$TMP" && GOTOOLCHAIN=local GOFLAGS=-mod=mod "$gobin" mod download -json "$PROMOP_MODULE" 2>&1 |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' 2>/dev/null); then
		smcrd=$dir/$PROMOP_CRD
	else
		why="no Go toolchain or the module proxy is unreachable ($PROMOP_MODULE)"
	fi
fi
if [[ -n $smcrd && -f $smcrd ]]; then
	kc get crd servicemonitors.monitoring.coreos.com >/dev/null 2>&1 ||
		CREATED_CRDS+=(servicemonitors.monitoring.coreos.com)
	run "ServiceMonitor CRD (prometheus-operator ${PROMOP_MODULE#*@}) applied" apply -f "$smcrd"
	run "ServiceMonitor CRD Established" kc wait --for=condition=Established --timeout=60s \
		crd/servicemonitors.monitoring.coreos.com
	cp "$TMP/test.yaml" "$TMP/test-apply.yaml"
else
	[[ -n $why ]] || why="$smcrd does not exist"
	skip "ServiceMonitor object of the values-test render not applied: $why"
	python3 - "$TMP/test.yaml" "$TMP/test-apply.yaml" <<-'EOF'
	import sys, yaml
	docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] != "ServiceMonitor"]
	yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
	EOF
fi
run "values-test render: server-side apply, dry run, namespace $NS_OTHER" \
	apply --dry-run=server -f "$TMP/test-apply.yaml"
if grep -q '^kind: ServiceMonitor' "$TMP/test-apply.yaml"; then
	refuse "ServiceMonitor schema is enforced (bad interval refused)" "interval" \
		dry_run_edited 's/interval: 15s/interval: soon/' "$TMP/test-apply.yaml"
fi
refuse "an unknown field in the render is refused (strict validation)" 'hostPidz: field not declared in schema' \
	dry_run_edited 's/^      hostPID: true$/      hostPID: true\n      hostPidz: true/' "$TMP/default-nocrds.yaml"

# --- the chart's ServiceAccount: what it may and may not do ------------------------

# Two identities: node (ServiceAccount $REL, the DaemonSet's) and scaler ($REL-scaler).
TOKEN_node=$(kc -n "$NS" create token "$REL" --duration=10m 2>"$TMP/token.err") || TOKEN_node=
TOKEN_scaler=$(kc -n "$NS" create token "$REL-scaler" --duration=10m 2>>"$TMP/token.err") || TOKEN_scaler=
if [[ -n $TOKEN_node && -n $TOKEN_scaler ]]; then pass "tokens for the chart's two ServiceAccounts"; else
	fail "tokens for the chart's two ServiceAccounts" "$(cat "$TMP/token.err")"; fi
TOKEN=$TOKEN_node
CA=$(kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority}')
if [[ -z $CA ]]; then
	kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}' |
		base64 -d >"$TMP/ca.crt"
	CA=$TMP/ca.crt
fi
sa() { # kubectl as the chart's ServiceAccount (token only)
	"$KUBECTL" --kubeconfig /dev/null --cache-dir "$TMP/kcache-sa" --request-timeout=30s \
		--server "$SERVER" --certificate-authority "$CA" --token "$TOKEN" "$@"
}
for TOKEN in "$TOKEN_scaler" "$TOKEN_node"; do # RBAC changes reach the authorizer through a watch
	for _ in $(seq 60); do
		[[ $(sa auth can-i list checkpoints.gpucr.dev -A 2>/dev/null) == yes ]] && break
		sleep 0.25
	done
done

# can VERB RESOURCE NAMESPACE-ARGS...: kubectl auth can-i as the ServiceAccount.
can() {
	local verb=$1 res=$2 sub=()
	shift 2
	if [[ $res == */* ]]; then sub=(--subresource="${res#*/}"); res=${res%%/*}; fi
	sa auth can-i "$verb" "$res" "${sub[@]}" "$@" 2>/dev/null || true # "no" exits 1
}
# sa_patch PATH JSON: a merge PATCH as the ServiceAccount, as the agent sends it
# (libcurl, no GET first: kubectl patch would read the object before patching).
sa_patch() {
	curl -sS --fail-with-body --max-time 30 --cacert "$CA" -H "Authorization: Bearer $TOKEN" \
		-X PATCH -H 'Content-Type: application/merge-patch+json' --data "$2" "$SERVER$1"
}
while read -r who kind group res verb; do
	tok=TOKEN_$who
	TOKEN=${!tok:-}
	r=${res%%/*}
	[[ $group != core ]] && r=$r.$group
	[[ $res == */* ]] && r=$r/${res#*/}
	if [[ $kind == ClusterRole ]]; then
		expect_eq "$who SA may $verb $res ($group) in another namespace" yes can "$verb" "$r" -n "$NS_OTHER"
		if [[ $verb == list || $verb == watch ]]; then
			expect_eq "$who SA may $verb $res ($group) in all namespaces" yes can "$verb" "$r" -A
		fi
	else
		expect_eq "$who SA may $verb $res ($group) in its namespace" yes can "$verb" "$r" -n "$NS"
		expect_eq "$who SA may not $verb $res ($group) in another namespace" no can "$verb" "$r" -n "$NS_OTHER"
	fi
done < <(sed 's/#.*//; /^[[:space:]]*$/d' "$HERE/rbac-expected.txt")
# What only the scaler may do: the node identity is refused it (the split's point).
TOKEN=$TOKEN_node
while read -r verb res; do
	expect_eq "node SA may not $verb $res" no can "$verb" "$res" -n "$NS_OTHER"
	# Leases: not in its own namespace either, where it gets and updates its heartbeat.
	[[ $res == leases.* ]] && expect_eq "node SA may not $verb $res in its namespace" no can "$verb" "$res" -n "$NS"
done <<EOF
create checkpoints.gpucr.dev
delete checkpoints.gpucr.dev
create restores.gpucr.dev
delete restores.gpucr.dev
create leases.coordination.k8s.io
list leases.coordination.k8s.io
patch pods/status
update pods/status
patch gpuresidencies.gpucr.dev
list gpuresidencies.gpucr.dev
patch gpuresidencies.gpucr.dev/status
EOF
# Calls neither identity may make.
while read -r verb res ns; do
	nsarg=(-n "$ns")
	[[ $ns == all ]] && nsarg=(-A)
	[[ $ns == cluster ]] && nsarg=()
	for who in node scaler; do
		tok=TOKEN_$who
		TOKEN=${!tok}
		expect_eq "$who SA may not $verb $res ($ns)" no can "$verb" "$res" "${nsarg[@]}"
	done
done <<EOF
get secrets $NS
list secrets all
watch secrets all
get configmaps $NS_OTHER
create pods/exec $NS_OTHER
create pods/attach $NS_OTHER
create pods/portforward $NS_OTHER
create pods/eviction $NS_OTHER
delete pods $NS_OTHER
create pods $NS_OTHER
patch pods $NS_OTHER
update pods/status $NS_OTHER
update checkpoints.gpucr.dev $NS_OTHER
update checkpoints.gpucr.dev/status $NS_OTHER
get restores.gpucr.dev $NS_OTHER
patch restores.gpucr.dev $NS_OTHER
get gpuresidencies.gpucr.dev $NS_OTHER
create gpuresidencies.gpucr.dev $NS_OTHER
update gpuresidencies.gpucr.dev $NS_OTHER
delete gpuresidencies.gpucr.dev $NS_OTHER
update gpuresidencies.gpucr.dev/scale $NS_OTHER
patch gpuresidencies.gpucr.dev/scale $NS_OTHER
update gpuresidencies.gpucr.dev/status $NS_OTHER
create events $NS_OTHER
patch events.events.k8s.io $NS_OTHER
delete events.events.k8s.io $NS_OTHER
get leases.coordination.k8s.io $NS_OTHER
create leases.coordination.k8s.io kube-system
update leases.coordination.k8s.io kube-node-lease
delete leases.coordination.k8s.io $NS
patch leases.coordination.k8s.io $NS
list leases.coordination.k8s.io all
get nodes cluster
create serviceaccounts/token $NS
impersonate users cluster
create clusterrolebindings cluster
escalate clusterroles cluster
EOF

# The node agent's real calls, made with its token.
TOKEN=$TOKEN_node
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
kc -n "$NS_OTHER" apply --server-side --field-manager=gcr-chart-test -f "$ROOT/crd/examples/checkpoint.yaml" >/dev/null ||
	die "cannot create the example Checkpoint"
run "SA lists checkpoints and restores in all namespaces" sa get checkpoints.gpucr.dev,restores.gpucr.dev -A
expect_eq "SA sees the example Checkpoint" "checkpoint.gpucr.dev/trainer-0-suspend" \
	sa -n "$NS_OTHER" get checkpoints.gpucr.dev -o name
run "SA lists the pods of its node (field selector spec.nodeName)" \
	sa get pods -A --field-selector spec.nodeName=node-a
run "SA patches Checkpoint status (PATCH .../status)" \
	sa_patch "/apis/gpucr.dev/v1alpha1/namespaces/$NS_OTHER/checkpoints/trainer-0-suspend/status" \
	"{\"status\":{\"phase\":\"Running\",\"nodeName\":\"node-a\",\"startTime\":\"$now\"}}"
expect_eq "... and it is stored" "Running node-a" \
	kc -n "$NS_OTHER" get checkpoint trainer-0-suspend -o 'jsonpath={.status.phase} {.status.nodeName}'
# Its finalizer (gpucr.dev/resume-on-delete) is the one write it makes to a Checkpoint itself;
# the CRD keeps spec immutable whoever patches.
run "SA adds its finalizer to a Checkpoint (PATCH metadata.finalizers)" \
	sa_patch "/apis/gpucr.dev/v1alpha1/namespaces/$NS_OTHER/checkpoints/trainer-0-suspend" \
	'{"metadata":{"finalizers":["gpucr.dev/resume-on-delete"]}}'
expect_eq "... and it is stored" "gpucr.dev/resume-on-delete" \
	kc -n "$NS_OTHER" get checkpoint trainer-0-suspend -o 'jsonpath={.metadata.finalizers[0]}'
run "SA removes it again" \
	sa_patch "/apis/gpucr.dev/v1alpha1/namespaces/$NS_OTHER/checkpoints/trainer-0-suspend" \
	'{"metadata":{"finalizers":null}}'
refuse "a Checkpoint's spec stays immutable, also for the SA" "spec is immutable" \
	sa_patch "/apis/gpucr.dev/v1alpha1/namespaces/$NS_OTHER/checkpoints/trainer-0-suspend" \
	'{"spec":{"podName":"other"}}'
cat >"$TMP/event.yaml" <<EOF
apiVersion: events.k8s.io/v1
kind: Event
metadata:
  name: trainer-0-suspend.gcr-test
  namespace: $NS_OTHER
eventTime: "$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)"
reportingController: gpucr.dev/gcr-agent
reportingInstance: gcr-agent-node-a
action: Checkpoint
reason: Running
type: Normal
note: suspending 1 process
regarding:
  apiVersion: gpucr.dev/v1alpha1
  kind: Checkpoint
  name: trainer-0-suspend
  namespace: $NS_OTHER
EOF
run "SA creates an events.k8s.io Event" sa create -f "$TMP/event.yaml"
refuse "SA cannot patch an Event (the agent only creates them)" "Forbidden" \
	sa_patch "/apis/events.k8s.io/v1/namespaces/$NS_OTHER/events/trainer-0-suspend.gcr-test" \
	"{\"series\":{\"count\":2,\"lastObservedTime\":\"$(date -u +%Y-%m-%dT%H:%M:%S.000000Z)\"}}"
cat >"$TMP/lease.yaml" <<EOF
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: gcr-agent-node-a
  namespace: NAMESPACE
spec:
  holderIdentity: node-a
  leaseDurationSeconds: 40
EOF
sa_lease() { sed "s/NAMESPACE/$1/" "$TMP/lease.yaml" | sa create -f -; } # namespace
refuse "node SA cannot create its node lease, even in its namespace (the scaler does)" "forbidden" \
	sa_lease "$NS"
sed "s/NAMESPACE/$NS/" "$TMP/lease.yaml" >"$TMP/lease-ns.yaml"
sed "/holderIdentity/d" "$TMP/lease-ns.yaml" >"$TMP/lease-idle.yaml"
refuse "node SA cannot renew a missing lease into existence (PUT authorized as create)" "forbidden" \
	sa replace -f "$TMP/lease-ns.yaml"
TOKEN=$TOKEN_scaler
run "scaler SA creates the node lease in its namespace, with no holder" sa create -f "$TMP/lease-idle.yaml"
run "scaler SA lists the leases of its namespace" sa -n "$NS" get leases
TOKEN=$TOKEN_node
run "node SA reads it back" sa -n "$NS" get lease gcr-agent-node-a -o yaml
if [[ $OUT == *"leaseDurationSeconds: 40"* && $OUT != *holderIdentity* ]]; then
	printf '%s\n' "${OUT/leaseDurationSeconds: 40/holderIdentity: node-a
  leaseDurationSeconds: 40}" >"$TMP/lease-get.yaml"
	run "node SA renews it (PUT, holder set)" sa replace -f "$TMP/lease-get.yaml"
	expect_eq "... and it is stored" "node-a" kc -n "$NS" get lease gcr-agent-node-a -o 'jsonpath={.spec.holderIdentity}'
else
	fail "node SA renews it (PUT, holder set)" "no holder-less lease read back: $OUT"
fi
refuse "SA cannot create a lease in another namespace" "forbidden" sa_lease "$NS_OTHER"
refuse "SA cannot read secrets" "forbidden" sa -n "$NS" get secrets

# --- chart_sa_kubeconfig.sh: the agent's end-to-end tests run as this SA ----------

CREATED_NS+=("$NS_SA")
CREATED_CLUSTER+=("clusterrole/gcr-$NS_SA" "clusterrolebinding/gcr-$NS_SA" "clusterrole/gcr-$NS_SA-scaler"
	"clusterrolebinding/gcr-$NS_SA-scaler")
run "chart_sa_kubeconfig.sh writes a ServiceAccount kubeconfig" \
	env KUBECTL="$KUBECTL" HELM="$HELM" "$HERE/chart_sa_kubeconfig.sh" "$NS_SA" "$TMP/sa.kubeconfig"
expect_eq "... authenticating as the chart's ServiceAccount" "system:serviceaccount:$NS_SA:gcr-$NS_SA" \
	printf '%s' "$OUT"
ksa() { "$KUBECTL" --kubeconfig "$TMP/sa.kubeconfig" --cache-dir "$TMP/kcache-sa2" --request-timeout=30s "$@"; }
run "... which may list checkpoints in all namespaces" ksa get checkpoints -A
ksa_lease() { sed "s/NAMESPACE/$NS_SA/" "$TMP/lease.yaml" | ksa create -f -; }
refuse "... but not create a lease, even in its namespace" "forbidden" ksa_lease
refuse "... but not read secrets" "forbidden" ksa get secrets
stored_rules() { # ClusterRole $1 as the script applied it, as "group resource verb;..."
	kc get clusterrole "$1" -o yaml | python3 -c 'import sys, yaml
for r in yaml.safe_load(sys.stdin)["rules"]:
    for g in r["apiGroups"]:
        for res in r["resources"]:
            for v in r["verbs"]:
                print(g or "core", res, v)' | sort | tr '\n' ';'
}
expect_eq "... its ClusterRole is the chart's node ClusterRole" \
	"$(python3 "$CHECKS" rules "$TMP/default-nocrds.yaml" | sed -n 's/^node ClusterRole //p' | sort | tr '\n' ';')" \
	stored_rules "gcr-$NS_SA"
run "chart_sa_kubeconfig.sh ... scaler: a kubeconfig of the scaler's ServiceAccount" \
	env KUBECTL="$KUBECTL" HELM="$HELM" "$HERE/chart_sa_kubeconfig.sh" "$NS_SA" "$TMP/sa-scaler.kubeconfig" scaler
expect_eq "... authenticating as the scaler's ServiceAccount" "system:serviceaccount:$NS_SA:gcr-$NS_SA-scaler" \
	printf '%s' "$OUT"
expect_eq "... whose ClusterRole is the chart's scaler ClusterRole" \
	"$(python3 "$CHECKS" rules "$TMP/default-nocrds.yaml" | sed -n 's/^scaler ClusterRole //p' | sort | tr '\n' ';')" \
	stored_rules "gcr-$NS_SA-scaler"
ksc() { "$KUBECTL" --kubeconfig "$TMP/sa-scaler.kubeconfig" --cache-dir "$TMP/kcache-sa3" --request-timeout=30s "$@"; }
both_can_create() { # the scaler's answer, then the node identity's
	printf '%s %s' "$(ksc auth can-i create checkpoints.gpucr.dev -n default || true)" \
		"$(ksa auth can-i create checkpoints.gpucr.dev -n default || true)"
}
expect_eq "... which may create Checkpoints, where the node identity may not" "yes no" both_can_create
if [[ $(stat -c %a "$TMP/sa.kubeconfig" 2>/dev/null) == 600 ]]; then
	pass "... and the kubeconfig is mode 0600"
else
	fail "... and the kubeconfig is mode 0600" "$(stat -c %a "$TMP/sa.kubeconfig" 2>&1)"
fi

exit 0 # the EXIT trap tears down, prints the summary and sets the status
