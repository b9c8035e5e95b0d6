#!/bin/sh
# Images on the stand-in driver with the real CRIU (tests/flow/test_image.py).
exec python3 "$top_srcdir/tests/flow/test_image.py" "$@"
