#!/bin/sh
# fake-criu: stands in for criu in test_criu. --version prints $FAKE_CRIU_VERSION_OUT (exit
# $FAKE_CRIU_VERSION_RC); any other command writes CRIU_LIBS_DIR and its arguments, one a line,
# to $FAKE_CRIU_LOG, prints $FAKE_CRIU_SAY and exits $FAKE_CRIU_RC.
if [ "$1" = "--version" ]; then
	printf '%s\n' "$FAKE_CRIU_VERSION_OUT"
	exit "${FAKE_CRIU_VERSION_RC:-0}"
fi
{ echo "CRIU_LIBS_DIR=$CRIU_LIBS_DIR"; for a in "$@"; do echo "$a"; done; } >"$FAKE_CRIU_LOG"
[ -n "${FAKE_CRIU_SAY:-}" ] && echo "$FAKE_CRIU_SAY" >&2
exit "${FAKE_CRIU_RC:-0}"
