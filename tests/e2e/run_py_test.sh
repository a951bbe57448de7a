#!/usr/bin/env bash
# Runs a Python end-to-end test with Debian's interpreter (the `python3` on PATH
# may be a pyenv shim without python3-grpcio). Usage: run_py_test.sh TEST.py ARGS...
set -euo pipefail
test_py="$1"
shift
export PYTHONPATH="$(dirname "$test_py")${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec /usr/bin/python3 "$test_py" "$@"
