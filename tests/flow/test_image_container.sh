#!/bin/sh
# Images of a process in a PID namespace (tests/flow/test_image_container.py).
exec python3 "$top_srcdir/tests/flow/test_image_container.py" "$@"
