#!/usr/bin/env bash
# Test the GCR CustomResourceDefinitions (crd/) against a real kube-apiserver.
#
#   tests/k8s/test_crds.sh
#
# Without KUBECONFIG it starts the test bed (tests/k8s/testbed.sh up) and stops
# it at the end. With KUBECONFIG set it uses that cluster (its server must be on
# 127.0.0.1), works in a namespace of its own and removes what it created.
# Prints "N passed, N failed" last; exits non-zero on any failure.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CRD=${GCR_CRD_DIR:-$ROOT/crd} # GCR_CRD_DIR: test other CRD files (e.g. mutated copies)
TESTBED=$HERE/testbed.sh

PASSED=0
FAILED=0
STARTED_BED=0
CREATED_CRDS=()
NS=gcr-crd-test-$$-$RANDOM
TMP=$(mktemp -d "${TMPDIR:-/tmp}/gcr-test-crds.XXXXXX")
TEST_NAME=test_crds
# shellcheck source=tests/k8s/testlib.sh
source "$HERE/testlib.sh"


cleanup() {
	local rc=$? c
	set +e
	if ((STARTED_BED)); then
		"$TESTBED" down "$GCR_TESTBED_DIR" >/dev/null
	elif [[ -n ${KUBECTL:-} ]]; then
		kc delete namespace "$NS" --ignore-not-found --wait=false >/dev/null 2>&1
		for c in "${CREATED_CRDS[@]}"; do
			kc delete crd "$c" --ignore-not-found >/dev/null 2>&1
		done
	fi
	rm -rf "$TMP"
	if ((rc != 0 && FAILED == 0)); then
		log "test_crds: error: stopped early (exit status $rc)"
		FAILED=1
	fi
	((FAILED == 0)) || rc=1
	# The summary is the last line, also when the test stopped early.
	echo "$PASSED passed, $FAILED failed"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- test bed ---------------------------------------------------------------

BIN=$("$TESTBED" build) || die "building the test bed binaries failed"
KUBECTL=$BIN/kubectl
testbed_connect
log "API server: $SERVER, namespace $NS"

# reject NAME EXPECT CMD...: passes if CMD fails, the API server answered and
# its message contains EXPECT.
reject() {
	local name=$1 expect=$2
	shift 2
	if OUT=$("$@" 2>&1); then
		fail "$name (was accepted)" "$OUT"
	elif [[ $OUT != *"Error from server"* && ! $OUT =~ The\ [A-Za-z]+\ \"[^\"]*\"\ is\ invalid: ]]; then
		# kubectl prints server-side errors as "Error from server (...)", or,
		# for a 422 Invalid Status, as 'The Kind "name" is invalid: ...'.
		fail "$name (not rejected by the API server)" "$OUT"
	elif [[ $OUT != *"$expect"* ]]; then
		fail "$name (expected \"$expect\")" "$OUT"
	else
		pass "$name"
	fi
}

# --- CRDs -------------------------------------------------------------------

compgen -G "$CRD/gpucr.dev_*.yaml" >/dev/null || die "no CRD files $CRD/gpucr.dev_*.yaml"
for f in "$CRD"/gpucr.dev_*.yaml; do
	name=$(awk '/^metadata:/ {m=1} m && /^  name:/ {print $2; exit}' "$f")
	if ! kc get crd "$name" >/dev/null 2>&1; then CREATED_CRDS+=("$name"); fi
	run "apply CRD $(basename "$f")" kc apply --server-side --field-manager=gcr-test -f "$f"
done
run "CRDs Established" kc wait --for=condition=Established --timeout=60s \
	crd/checkpoints.gpucr.dev crd/restores.gpucr.dev crd/gpuresidencies.gpucr.dev
run "CRD names accepted" kc wait --for=condition=NamesAccepted --timeout=60s \
	crd/checkpoints.gpucr.dev crd/restores.gpucr.dev crd/gpuresidencies.gpucr.dev
expect_eq "CRDs are namespaced" "Namespaced Namespaced Namespaced" \
	kc get crd checkpoints.gpucr.dev restores.gpucr.dev gpuresidencies.gpucr.dev -o 'jsonpath={.items[*].spec.scope}'

kc create namespace "$NS" >/dev/null || die "cannot create namespace $NS"
k() { kc -n "$NS" "$@"; }

# --- examples ---------------------------------------------------------------

n_valid=0
for f in "$CRD"/examples/*.yaml; do
	run "valid example $(basename "$f") created" k create --validate=strict -f "$f"
	n_valid=$((n_valid + 1))
done
((n_valid >= 2)) || fail "at least 2 valid examples (found $n_valid)"
expect_eq "action defaults to Suspend" "Suspend" \
	k get checkpoint trainer-0-suspend -o 'jsonpath={.spec.action}'
expect_eq "keepContext defaults to false" "false" \
	k get checkpoint trainer-0-suspend -o 'jsonpath={.spec.keepContext}'
expect_eq "keepContext: true accepted and kept" "true" \
	k get checkpoint trainer-0-switch -o 'jsonpath={.spec.keepContext}'

n_invalid=0
for f in "$CRD"/examples/invalid/*.yaml; do
	expect=$(sed -n 's/^# expect: //p' "$f" | head -n 1)
	if [[ -z $expect ]]; then
		fail "invalid example $(basename "$f") has no '# expect:' line"
		continue
	fi
	reject "invalid example $(basename "$f") rejected" "$expect" \
		k create --dry-run=server --validate=strict -f "$f"
	n_invalid=$((n_invalid + 1))
done
((n_invalid >= 5)) || fail "at least 5 invalid examples (found $n_invalid)"
# The same, for real (not a dry run), once.
reject "invalid example rejected without dry run" "spec.podName: Invalid value" \
	k create -f "$CRD/examples/invalid/checkpoint-podname-uppercase.yaml"
expect_eq "nothing invalid was stored" "" \
	k get checkpoint invalid-checkpoint-podname-uppercase --ignore-not-found -o name

# --- immutability -----------------------------------------------------------

reject "Checkpoint spec is immutable" "spec is immutable" \
	k patch checkpoint trainer-0-suspend --type=merge -p '{"spec":{"podName":"other-pod"}}'
reject "Checkpoint spec.timeoutSeconds cannot be added" "spec is immutable" \
	k patch checkpoint trainer-0-suspend --type=merge -p '{"spec":{"timeoutSeconds":5}}'
reject "Checkpoint spec.keepContext is immutable" "spec is immutable" \
	k patch checkpoint trainer-0-switch --type=merge -p '{"spec":{"keepContext":false}}'
reject "Checkpoint spec.keepContext cannot be turned on" "spec is immutable" \
	k patch checkpoint trainer-0-suspend --type=merge -p '{"spec":{"keepContext":true}}'
reject "Restore spec is immutable" "spec is immutable" \
	k patch restore trainer-0-resume --type=merge -p '{"spec":{"checkpointName":"other"}}'
run "metadata stays mutable" \
	k label checkpoint trainer-0-suspend gpucr.dev/test=yes
expect_eq "spec unchanged" "trainer-0" \
	k get checkpoint trainer-0-suspend -o 'jsonpath={.spec.podName}'

# --- status subresource -----------------------------------------------------

# columns CMD...: prints the table with runs of spaces turned into one space.
columns() { "$@" | sed 's/  */ /g; s/ $//'; }

now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
running=$(cat <<EOF
{"status":{"phase":"Running","nodeName":"node-a","startTime":"$now","observedGeneration":1,
 "processes":[{"pid":4242,"containerName":"main","state":"Locked"}],
 "conditions":[{"type":"Ready","status":"False","reason":"InProgress","message":"locking",
   "lastTransitionTime":"$now"}]}}
EOF
)
run "status subresource: Checkpoint Running" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p "$running"
expect_eq "status stored" "Running node-a 4242 Ready" \
	k get checkpoint trainer-0-suspend \
	-o 'jsonpath={.status.phase} {.status.nodeName} {.status.processes[0].pid} {.status.conditions[0].type}'
run "status through the main resource is accepted" \
	k patch checkpoint trainer-0-suspend --type=merge -p '{"status":{"phase":"Failed"}}'
expect_eq "... but leaves status unchanged" "Running" \
	k get checkpoint trainer-0-suspend -o 'jsonpath={.status.phase}'
reject "status: unknown phase rejected" "Unsupported value" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p '{"status":{"phase":"Done"}}'
reject "status: negative bytes rejected" "status.bytes.total" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p '{"status":{"bytes":{"total":-1}}}'
reject "status: unknown mode rejected" "Unsupported value" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p '{"status":{"mode":"DataOnly"}}'
reject "status: Succeeded needs completionTime" "completionTime is required" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p '{"status":{"phase":"Succeeded"}}'
done_patch=$(cat <<EOF
{"status":{"phase":"Succeeded","completionTime":"$now","message":"suspended 1 process","mode":"Full",
 "bytes":{"vmm":1073741824,"driver":4294967296,"total":5368709120},
 "durations":{"gate":3,"data":120,"lock":40,"checkpoint":1021,"total":1184}}}
EOF
)
run "status subresource: Checkpoint Succeeded" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p "$done_patch"
expect_eq "int64 sizes kept" "5368709120" \
	k get checkpoint trainer-0-suspend -o 'jsonpath={.status.bytes.total}'
reject "status: final phase cannot change" "phase Succeeded or Failed is final" \
	k patch checkpoint trainer-0-suspend --subresource=status --type=merge -p '{"status":{"phase":"Running"}}'
run "status subresource: Restore Succeeded" \
	k patch restore trainer-0-resume --subresource=status --type=merge -p "{\"status\":{
	 \"phase\":\"Succeeded\",\"nodeName\":\"node-a\",\"podName\":\"trainer-0\",
	 \"startTime\":\"$now\",\"completionTime\":\"$now\",
	 \"mode\":\"Full\",\"durations\":{\"restore\":900,\"unlock\":5,\"data\":30,\"total\":935}}}"
run "Restore status: unknown fields are pruned" \
	k patch restore trainer-0-resume --subresource=status --type=merge -p '{"status":{"durations":{"gate":1}}}'
expect_eq "... and not stored; status.mode kept" "935 . Full" \
	k get restore trainer-0-resume -o 'jsonpath={.status.durations.total} {.status.durations.gate}. {.status.mode}'
if k get restore trainer-0-resume -o yaml >"$TMP/restore.yaml" 2>&1 &&
	sed -i 's/^status:$/status:\n  bogus: 1/' "$TMP/restore.yaml" &&
	grep -q '^  bogus: 1$' "$TMP/restore.yaml"; then
	reject "Restore status: strict field validation on the status subresource" \
		'unknown field "status.bogus"' \
		k replace --subresource=status --validate=strict -f "$TMP/restore.yaml"
else
	fail "Restore status: strict field validation on the status subresource" "$(cat "$TMP/restore.yaml")"
fi

# --- printer columns, short names, category ---------------------------------

if OUT=$(columns k get checkpoints) &&
	[[ ${OUT%%$'\n'*} == "NAME PHASE POD NODE SETBYAGENT AGE DURATION(MS)" ]]; then
	pass "Checkpoint printer columns"
else
	fail "Checkpoint printer columns" "$OUT"
fi
if OUT=$(columns k get checkpoints trainer-0-suspend --no-headers) &&
	[[ $OUT =~ ^trainer-0-suspend\ Succeeded\ trainer-0\ node-a\ [0-9][0-9smhdy]*\ 1184$ ]]; then
	pass "Checkpoint printer column values"
else
	fail "Checkpoint printer column values" "$OUT"
fi
if OUT=$(columns k get checkpoints trainer-0-suspend -o wide --no-headers) &&
	[[ $OUT =~ ^trainer-0-suspend\ Succeeded\ trainer-0\ node-a\ Full\ [0-9][0-9smhdy]*\ 1184\ 5368709120\ suspended\ 1\ process$ ]]; then
	pass "Checkpoint wide columns (mode, bytes, message)"
else
	fail "Checkpoint wide columns (mode, bytes, message)" "$OUT"
fi
if OUT=$(columns k get restores trainer-0-resume) &&
	[[ $OUT =~ NAME\ PHASE\ CHECKPOINT\ POD\ NODE\ AGE\ DURATION\(MS\) ]] &&
	[[ $OUT =~ trainer-0-resume\ Succeeded\ trainer-0-suspend\ trainer-0\ node-a\ [0-9][0-9smhdy]*\ 935 ]]; then
	pass "Restore printer columns"
else
	fail "Restore printer columns" "$OUT"
fi
run "short name gcrck" k get gcrck trainer-0-suspend
run "short name gcrrs" k get gcrrs trainer-0-resume
if OUT=$(k get gcr -o name 2>&1) &&
	[[ $OUT == *checkpoint.gpucr.dev/trainer-0-suspend* && $OUT == *restore.gpucr.dev/trainer-0-resume* &&
		$OUT == *gpuresidency.gpucr.dev/llm* ]]; then
	pass "category gcr lists all three kinds"
else
	fail "category gcr lists all three kinds" "$OUT"
fi

# --- GPUResidency: the scale subresource (kubectl scale, HPA, KEDA) ----------

run "kubectl scale gpuresidency" k scale gpuresidency/llm --replicas=0
expect_eq "kubectl scale set spec.replicas" "0" k get gpuresidency llm -o 'jsonpath={.spec.replicas}'
run "status subresource: GPUResidency" \
	k patch gpuresidency llm --subresource=status --type=merge -p "{\"status\":{\"replicas\":2,
	 \"suspended\":1,\"selector\":\"app=llm\",\"observedGeneration\":2,
	 \"pods\":[{\"name\":\"llm-0\",\"state\":\"Suspended\",\"node\":\"node-a\"}],
	 \"conditions\":[{\"type\":\"Ready\",\"status\":\"False\",\"reason\":\"Scaling\",
	 \"message\":\"1 to suspend\",\"lastTransitionTime\":\"$now\"}]}}"
# What the HPA and KEDA read and write: GET and PUT of .../gpuresidencies/llm/scale (autoscaling/v1 Scale).
SCALE_PATH=/apis/gpucr.dev/v1alpha1/namespaces/$NS/gpuresidencies/llm/scale
if OUT=$(kc get --raw "$SCALE_PATH") &&
	python3 -c 'import json,sys; s=json.loads(sys.argv[1]); assert s["kind"]=="Scale", s
assert s["spec"].get("replicas", 0)==0 and s["status"]["replicas"]==2 and s["status"]["selector"]=="app=llm", s' "$OUT"; then
	pass "GET /scale: spec.replicas, status.replicas and status.selector mapped"
else
	fail "GET /scale: spec.replicas, status.replicas and status.selector mapped" "$OUT"
fi
if OUT=$(printf '%s' "$OUT" | python3 -c 'import json,sys; s=json.load(sys.stdin); s["spec"]["replicas"]=3; print(json.dumps(s))' |
	kc replace --raw "$SCALE_PATH" -f - 2>&1) &&
	[[ $(k get gpuresidency llm -o 'jsonpath={.spec.replicas}') == 3 ]]; then
	pass "PUT /scale sets spec.replicas"
else
	fail "PUT /scale sets spec.replicas" "$OUT"
fi
reject "a negative replica count rejected" "spec.replicas: Invalid value" \
	k patch gpuresidency llm --type=merge -p '{"spec":{"replicas":-1}}'
reject "GPUResidency: selector cannot be emptied" "selector must have matchLabels or matchExpressions" \
	k patch gpuresidency llm --type=json -p '[{"op":"replace","path":"/spec/selector","value":{}}]'
reject "GPUResidency status: unknown pod state rejected" "Unsupported value" \
	k patch gpuresidency llm --subresource=status --type=merge -p '{"status":{"pods":[{"name":"x","state":"Gone"}]}}'
if OUT=$(columns k get gpuresidencies llm) &&
	[[ ${OUT%%$'\n'*} == "NAME DESIRED RESIDENT SUSPENDED READY AGE" ]] &&
	[[ $OUT =~ llm\ 3\ 2\ 1\ False\ [0-9][0-9smhdy]* ]]; then
	pass "GPUResidency printer columns"
else
	fail "GPUResidency printer columns" "$OUT"
fi
run "short name gpures" k get gpures llm

# --- RBAC -------------------------------------------------------------------

run "create ServiceAccount" k create serviceaccount gcr-noperm
TOKEN=
if TOKEN=$(k create token gcr-noperm --duration=10m 2>"$TMP/token.err") && [[ -n $TOKEN ]]; then
	pass "issue a service-account token"
else
	fail "issue a service-account token" "$(cat "$TMP/token.err")"
fi
CA=$(kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority}')
if [[ -z $CA ]]; then
	kc config view --minify --raw -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}' |
		base64 -d >"$TMP/ca.crt"
	CA=$TMP/ca.crt
fi
sa() { # kubectl as the service account (token only, no client certificate)
	"$KUBECTL" --kubeconfig /dev/null --cache-dir "$TMP/kcache-sa" --request-timeout=30s \
		--server "$SERVER" --certificate-authority "$CA" --token "$1" -n "$NS" "${@:2}"
}
SA_USER="system:serviceaccount:$NS:gcr-noperm"
reject "RBAC: service account cannot list checkpoints" \
	"User \"$SA_USER\" cannot list resource \"checkpoints\"" sa "$TOKEN" get checkpoints
reject "RBAC: service account cannot create checkpoints" \
	"User \"$SA_USER\" cannot create resource \"checkpoints\"" \
	sa "$TOKEN" create -f "$CRD/examples/checkpoint-full.yaml"
reject "RBAC: service account cannot read secrets" "forbidden" sa "$TOKEN" get secrets
if OUT=$(sa "not-a-valid-token" get checkpoints 2>&1); then
	fail "authn: a forged token is refused (was accepted)" "$OUT"
elif [[ $OUT == *"(Unauthorized)"* ]]; then
	pass "authn: a forged token is refused"
else
	fail "authn: a forged token is refused (expected Unauthorized)" "$OUT"
fi
run "grant list on checkpoints" \
	k create role gcr-reader --verb=get,list --resource=checkpoints.gpucr.dev
run "bind it to the service account" \
	k create rolebinding gcr-reader --role=gcr-reader --serviceaccount="$NS:gcr-noperm"
ok=0
for _ in $(seq 40); do # RBAC changes reach the authorizer through a watch
	if OUT=$(sa "$TOKEN" get checkpoints -o name 2>&1); then ok=1; break; fi
	sleep 0.25
done
if ((ok)) && [[ $OUT == *checkpoint.gpucr.dev/trainer-0-suspend* ]]; then
	pass "RBAC: granted list works with the token"
else
	fail "RBAC: granted list works with the token" "$OUT"
fi
reject "RBAC: grant does not extend to restores" \
	"User \"$SA_USER\" cannot list resource \"restores\"" sa "$TOKEN" get restores
reject "RBAC: grant does not extend to create" \
	"cannot create resource \"checkpoints\"" sa "$TOKEN" create -f "$CRD/examples/checkpoint-full.yaml"

# --- done ---------------------------------------------------------------------

exit 0 # the EXIT trap tears down, prints the summary and sets the status
