#!/usr/bin/env bash
# Puts the Helm chart's own RBAC on a running test bed and writes a kubeconfig
# that authenticates as one of the chart's two ServiceAccounts, so the agent's
# end-to-end tests run with exactly the permissions the chart grants (a missing
# rule fails them, as it would fail the agent in a cluster).
#
#   eval "$(tests/k8s/testbed.sh up)"
#   tests/k8s/chart_sa_kubeconfig.sh NAMESPACE OUT [node|scaler]
#   KUBECONFIG=OUT gcr-agent --role=node ...    # lease namespace: NAMESPACE
#
# IDENTITY (default node): node is the DaemonSet's ServiceAccount (gcr-agent
# --role=node), scaler the scaler Deployment's (--role=scaler).
# Applies (server-side, as the test bed's admin: $KUBECONFIG) the namespace, the
# chart's CRDs and its ServiceAccount, ClusterRole(Binding) and Role(Binding),
# rendered with release name $GCR_RELEASE (default gcr-NAMESPACE, so two
# namespaces do not share cluster-scoped names). The token comes from
# `kubectl create token` ($GCR_TOKEN_DURATION, default 1h) and is written into
# OUT (mode 0600) with the API server's CA; the context's namespace is NAMESPACE.
# Waits until the token can list checkpoints. Prints the ServiceAccount's user name.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

die() { printf 'chart_sa_kubeconfig: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 2 || $# -eq 3 ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
NS=$1
OUT=$2
IDENTITY=${3:-node}
case $IDENTITY in
node) COMPONENT=agent ;;
scaler) COMPONENT=scaler ;;
*) die "identity must be node or scaler (got $IDENTITY)" ;;
esac
RELEASE=${GCR_RELEASE:-gcr-$NS}
[[ -n ${KUBECONFIG:-} ]] || die "KUBECONFIG is not set (eval \"\$(tests/k8s/testbed.sh up)\" first)"

BIN=${GCR_TESTBED_BIN:-$("$HERE/testbed.sh" build)}
KUBECTL=${KUBECTL:-$BIN/kubectl}
HELM=${HELM:-$BIN/helm}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcr-chart-sa.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

kc() { "$KUBECTL" --cache-dir "$TMP/kcache" --request-timeout=30s "$@"; }

SERVER=$(kc config view --minify -o 'jsonpath={.clusters[0].cluster.server}')
case $SERVER in
https://127.0.0.1:* | https://localhost:*) ;;
*) die "the API server ($SERVER) is not a local test bed; refusing" ;;
esac

kc get namespace "$NS" >/dev/null 2>&1 || kc create namespace "$NS" >/dev/null ||
	die "cannot create namespace $NS"
kc apply --server-side --field-manager=gcr-chart -f "$ROOT/helm/gcr/crds/" >/dev/null ||
	die "applying the chart's CRDs failed"
"$HELM" template "$RELEASE" "$ROOT/helm/gcr" --namespace "$NS" \
	--show-only templates/serviceaccount.yaml --show-only templates/rbac.yaml >"$TMP/rbac.yaml" ||
	die "helm template failed"
kc apply --server-side --field-manager=gcr-chart -f "$TMP/rbac.yaml" >/dev/null ||
	die "applying the chart's RBAC failed"
SA=$(python3 -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "ServiceAccount" and d["metadata"]["labels"].get("app.kubernetes.io/component") == sys.argv[2]:
        print(d["metadata"]["name"])' "$TMP/rbac.yaml" "$COMPONENT")
[[ -n $SA ]] || die "no $IDENTITY ServiceAccount in the chart's render"
kc wait --for=condition=Established --timeout=60s crd/checkpoints.gpucr.dev crd/restores.gpucr.dev >/dev/null

TOKEN=$(kc -n "$NS" create token "$SA" --duration="${GCR_TOKEN_DURATION:-1h}") ||
	die "kubectl create token failed"
CA_DATA=$(kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
if [[ -z $CA_DATA ]]; then
	CA=$(kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority}')
	[[ -r $CA ]] || die "no CA in $KUBECONFIG"
	CA_DATA=$(base64 -w0 <"$CA")
fi

mkdir -p "$(dirname "$OUT")"
(
	umask 077
	cat >"$OUT.tmp" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: gcr-testbed
	  cluster:
	    server: $SERVER
	    certificate-authority-data: $CA_DATA
	users:
	- name: $SA
	  user:
	    token: $TOKEN
	contexts:
	- name: gcr-chart-sa
	  context:
	    cluster: gcr-testbed
	    user: $SA
	    namespace: $NS
	current-context: gcr-chart-sa
	EOF
)
mv "$OUT.tmp" "$OUT"

# RBAC reaches the authorizer through a watch: wait until the grant is seen.
for _ in $(seq 60); do
	if [[ $("$KUBECTL" --kubeconfig "$OUT" --cache-dir "$TMP/kcache-sa" auth can-i list checkpoints.gpucr.dev -A 2>/dev/null) == yes ]]; then
		echo "system:serviceaccount:$NS:$SA"
		exit 0
	fi
	sleep 0.25
done
die "the ServiceAccount's token still cannot list checkpoints after 15 s"
