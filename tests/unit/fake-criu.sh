#!/bin/sh
# fake-criu: stands in for criu in test_criu and the HIP flow tests. --version prints
# $FAKE_CRIU_VERSION_OUT (exit $FAKE_CRIU_VERSION_RC); any other command writes CRIU_LIBS_DIR and
# its arguments, one a line, to $FAKE_CRIU_LOG (appended after a "--" line when $FAKE_CRIU_APPEND
# is set), runs $FAKE_CRIU_HOOK (sh -c, the arguments as $1...; its output to the log), writes
# $FAKE_CRIU_PID to the file after --pidfile, prints $FAKE_CRIU_SAY and exits $FAKE_CRIU_RC.
if [ "$1" = "--version" ]; then
	printf '%s\n' "$FAKE_CRIU_VERSION_OUT"
	exit "${FAKE_CRIU_VERSION_RC:-0}"
fi
if [ -n "${FAKE_CRIU_APPEND:-}" ]; then
	{ echo "--"; echo "CRIU_LIBS_DIR=$CRIU_LIBS_DIR"; for a in "$@"; do echo "$a"; done; } >>"$FAKE_CRIU_LOG"
else
	{ echo "CRIU_LIBS_DIR=$CRIU_LIBS_DIR"; for a in "$@"; do echo "$a"; done; } >"$FAKE_CRIU_LOG"
fi
[ -n "${FAKE_CRIU_HOOK:-}" ] && sh -c "$FAKE_CRIU_HOOK" hook "$@" >>"$FAKE_CRIU_LOG" 2>&1
prev=
for a in "$@"; do
	[ "$prev" = "--pidfile" ] && [ -n "${FAKE_CRIU_PID:-}" ] && echo "$FAKE_CRIU_PID" >"$a"
	prev=$a
done
[ -n "${FAKE_CRIU_SAY:-}" ] && echo "$FAKE_CRIU_SAY" >&2
exit "${FAKE_CRIU_RC:-0}"
