#!/usr/bin/env bash
# python_api.sh BUILD_DIR - the Python package's tests (tests/python/, pytest)
# against this build's libtide.so and tide (TIDE_LIBRARY, TIDE_CLI: set by
# CMakeLists.txt), with the interpreter of the build's virtual environment
# BUILD_DIR/pyenv (scripts/setup.sh test installs numpy and pytest there).
# Exit 77 (skip) when numpy or pytest is not to be had.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=$1/pyenv/bin/python3
if [ ! -x "$py" ] || ! "$py" -c 'import numpy, pytest' 2>/dev/null; then
    echo "python_api: numpy and pytest are not installed in $1/pyenv (scripts/setup.sh test installs them): skipped"
    exit 77
fi
export PYTHONPATH=$here/python${PYTHONPATH:+:$PYTHONPATH}
# the built-in model goes to a cache of the test's own, never the user's
export TIDE_CACHE=${TMPDIR:-/tmp}/tide-python-api-cache.$$
trap 'rm -rf "$TIDE_CACHE"' EXIT
cd "$here" && "$py" -m pytest -q -p no:cacheprovider tests/python "${@:2}"
