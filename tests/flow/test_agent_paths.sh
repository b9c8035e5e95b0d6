#!/bin/sh
# Runs gcr-agent's path and registry cases (tests/flow/test_agent_paths.py) against this build.
exec python3 "$top_srcdir/tests/flow/test_agent_paths.py" "$@"
