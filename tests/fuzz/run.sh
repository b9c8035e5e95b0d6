#!/bin/sh
# tests/fuzz/run.sh: builds each libFuzzer target with clang (ASan + UBSan) and
# runs it FUZZ_SECONDS from its seed corpus; fails if any target crashes.
#
# Run from the repository root. Environment:
#   FUZZ_SECONDS  seconds per target (default 12: CI runs each briefly; longer by hand)
#   FUZZ_WORKDIR  build outputs, grown corpora and crash artifacts
#                 (default: a fresh directory under ${TMPDIR:-/tmp}, removed when every
#                 target passed; a failure's stays for its artifacts)
#   FUZZ_TARGETS  space-separated subset of the targets below (default: all)
#   CLANG         compiler (default clang-14)
#   PROTOC_C      protobuf-c's compiler (default protoc-c), for the generated code below
set -u

# One line per target: name|sources besides the common ones|pkg-config modules.
# The target's own file is tests/fuzz/<name>.c and its seeds are under
# tests/fuzz/corpus/<name>/; a dictionary tests/fuzz/dict/<name>.dict is optional.
# @GEN@/ names protobuf-c code made here from a .proto file (PROTOS below), as the build does.
TARGETS='
fuzz_cgroup|node-agent/node/agent_cgroup.c|
fuzz_proto|lib/gcr_proto.c|jansson
fuzz_kubeconfig|node-agent/kube/agent_kubeconfig.c|yaml-0.1
fuzz_watch|node-agent/kube/agent_watch.c|jansson
fuzz_dpmsg|node-agent/deviceplugin/agent_dpmsg.c @GEN@/api.pb-c.c|libprotobuf-c
fuzz_scalemsg|node-agent/msg/agent_scalemsg.c lib/gcr_shimreply.c lib/gcr_groupmsg.c lib/gcr_proto.c|jansson
fuzz_criu|lib/gcr_criu.c|
fuzz_ctrdump|lib/gcr_ctrdump.c lib/gcr_criu.c|
fuzz_linebuf|lib/gcr_sock.c|
fuzz_shimreply|lib/gcr_shimreply.c lib/gcr_groupmsg.c lib/gcr_proto.c|jansson
fuzz_crobj|node-agent/controller/agent_crobj.c node-agent/controller/agent_record.c node-agent/kube/agent_phase.c lib/gcr_uuid.c|jansson
fuzz_agentconfig|node-agent/daemon/agent_config.c|yaml-0.1
fuzz_manifest|lib/gcr_image.c lib/gcr_imagemac.c lib/gcr_crc32c.c lib/gcr_sha256.c lib/gcr_jsonbudget.c|jansson
fuzz_roommsg|node-agent/msg/agent_roommsg.c lib/gcr_proto.c|jansson
fuzz_roompolicy|node-agent/overcommit/agent_roompolicy.c|
fuzz_quantity|node-agent/kube/agent_quantity.c|
fuzz_evictmsg|node-agent/msg/agent_evictmsg.c|jansson
fuzz_ocipath|node-agent/node/agent_ocidist.c lib/gcr_sha256.c|jansson
fuzz_groupmsg|lib/gcr_groupmsg.c lib/gcr_shimreply.c lib/gcr_proto.c|jansson
fuzz_ocihead|node-agent/node/agent_ocidist.c lib/gcr_sha256.c|jansson
fuzz_imagemac|lib/gcr_image.c lib/gcr_imagemac.c lib/gcr_crc32c.c lib/gcr_sha256.c lib/gcr_jsonbudget.c|jansson
fuzz_ncclpoke|shim/nccl/shim_nccl_poke.c|
'
# Linked into every target.
COMMON_SOURCES='lib/gcr_error.c lib/gcr_log.c lib/gcr_time.c'
# The .proto files whose C code (scripts/protoc-c.sh) the targets compile from @GEN@/.
PROTOS='node-agent/deviceplugin/api.proto'

FUZZ_SECONDS=${FUZZ_SECONDS:-12}
CLANG=${CLANG:-clang-14}
own_workdir=0 # one made here goes once every target passed; a failure's artifacts stay
[ -n "${FUZZ_WORKDIR:-}" ] || { FUZZ_WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/gcr-fuzz.XXXXXX") && own_workdir=1; }
GEN=$FUZZ_WORKDIR/gen
CFLAGS_FUZZ="-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined
	-fno-sanitize-recover=all -fno-omit-frame-pointer -Iinclude -Ilib -Inode-agent/daemon -Inode-agent/node -Inode-agent/msg -Inode-agent/kube -Inode-agent/controller -Inode-agent/scaler -Inode-agent/deviceplugin -Inode-agent/overcommit -Inode-agent/evict -Ishim/nccl -I$GEN"

if [ ! -f tests/fuzz/run.sh ]; then
	echo "run.sh: run me from the repository root" >&2
	exit 2
fi
mkdir -p "$FUZZ_WORKDIR" || exit 2
echo "fuzz: ${FUZZ_SECONDS}s per target, outputs in $FUZZ_WORKDIR"
# A failure here fails the targets that compile the missing code, not the others.
for p in $PROTOS; do
	scripts/protoc-c.sh "$p" "$GEN" || echo "fuzz: scripts/protoc-c.sh $p failed (PROTOC_C=${PROTOC_C:-protoc-c})"
done

passed=0
failed=0
# A here-document keeps the loop in this shell, so the counters survive it.
while IFS='|' read -r name sources modules; do
	[ -n "$name" ] || continue
	if [ -n "${FUZZ_TARGETS:-}" ]; then
		case " $FUZZ_TARGETS " in *" $name "*) ;; *) continue ;; esac
	fi
	bin="$FUZZ_WORKDIR/$name"
	sources=$(printf '%s\n' "$sources" | sed "s|@GEN@|$GEN|g")
	log="$FUZZ_WORKDIR/$name.log"
	pkg_cflags=''
	pkg_libs=''
	if [ -n "$modules" ]; then
		pkg_cflags=$(pkg-config --cflags $modules) && pkg_libs=$(pkg-config --libs $modules) || {
			echo "FAIL $name: pkg-config $modules"
			failed=$((failed + 1))
			continue
		}
	fi
	# shellcheck disable=SC2086 # word splitting of flag lists is intended
	if ! $CLANG $CFLAGS_FUZZ $pkg_cflags -o "$bin" "tests/fuzz/$name.c" $sources $COMMON_SOURCES \
		$pkg_libs >"$FUZZ_WORKDIR/$name.build.log" 2>&1; then
		cat "$FUZZ_WORKDIR/$name.build.log"
		echo "FAIL $name: does not build"
		failed=$((failed + 1))
		continue
	fi
	# New inputs go to a scratch corpus; the committed seeds are only read.
	corpus="$FUZZ_WORKDIR/$name.corpus"
	mkdir -p "$corpus" "$FUZZ_WORKDIR/$name.artifacts"
	dict=''
	[ -f "tests/fuzz/dict/$name.dict" ] && dict="-dict=tests/fuzz/dict/$name.dict"
	seeds=''
	[ -d "tests/fuzz/corpus/$name" ] && seeds="tests/fuzz/corpus/$name"
	# shellcheck disable=SC2086 # empty $dict / $seeds must vanish
	"$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$FUZZ_WORKDIR/$name.artifacts/" $dict \
		"$corpus" $seeds >"$log" 2>&1
	rc=$?
	if [ $rc -eq 0 ]; then
		runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
		echo "PASS $name: ${runs:-?} runs"
		passed=$((passed + 1))
	else
		tail -n 60 "$log"
		echo "FAIL $name: exit $rc; artifacts:" "$FUZZ_WORKDIR/$name.artifacts"/*
		failed=$((failed + 1))
	fi
done <<EOT
$TARGETS
EOT

echo "$passed passed, $failed failed"
if [ "$failed" -eq 0 ] && [ "$own_workdir" -eq 1 ]; then
	rm -rf "$FUZZ_WORKDIR"
fi
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
