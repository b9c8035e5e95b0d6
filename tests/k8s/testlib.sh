# tests/k8s/testlib.sh: what the shell tests against the test bed share: result
# counting, the run/expect_eq checks, and connecting to (or starting) the test bed.
# Sourced after the test sets TEST_NAME, TESTBED, TMP, KUBECTL and PASSED/FAILED.
# shellcheck shell=bash

log() { printf '%s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "$TEST_NAME" "$*" >&2; FAILED=$((FAILED + 1)); exit 1; }

pass() { PASSED=$((PASSED + 1)); printf 'ok     %s\n' "$1"; }
fail() {
	FAILED=$((FAILED + 1))
	printf 'FAIL   %s\n' "$1"
	[[ -n ${2:-} ]] && printf '%s\n' "$2" | sed 's/^/       | /' | head -n 20
	return 0
}
skip() { printf 'skip   %s\n' "$1"; }

# run NAME CMD...: passes if CMD succeeds. Output is kept in $OUT.
OUT=
run() {
	local name=$1
	shift
	if OUT=$("$@" 2>&1); then pass "$name"; else fail "$name" "$OUT"; fi
}
# expect_eq NAME WANT CMD...: passes if CMD prints exactly WANT.
expect_eq() {
	local name=$1 want=$2 got
	shift 2
	if got=$("$@" 2>&1) && [[ $got == "$want" ]]; then
		pass "$name"
	else
		fail "$name (want \"$want\", got \"$got\")"
	fi
}

kc() { "$KUBECTL" --cache-dir "$TMP/kcache" --request-timeout=30s "$@"; }

# Starts the test bed unless KUBECONFIG names a cluster (STARTED_BED=1 when it
# did), and refuses any API server not on loopback. Sets SERVER.
testbed_connect() {
	if [[ -z ${KUBECONFIG:-} ]]; then
		local env_out
		env_out=$("$TESTBED" up) || die "starting the test bed failed"
		eval "$env_out"
		STARTED_BED=1
	fi
	export KUBECONFIG
	[[ -r ${KUBECONFIG%%:*} ]] || die "KUBECONFIG ${KUBECONFIG%%:*} is not readable"
	SERVER=$(kc config view --minify -o 'jsonpath={.clusters[0].cluster.server}')
	case $SERVER in
	https://127.0.0.1:* | http://127.0.0.1:*) ;;
	*) die "the API server ($SERVER) is not on 127.0.0.1; refusing to run" ;;
	esac
}
