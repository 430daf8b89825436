#!/usr/bin/env bash
# setup.sh - installs what tide needs on Debian 12 (only the missing packages),
# builds it, and then does one of:
#   scripts/setup.sh run [tide run options]   build only `tide`, run `tide run`
#                                             (default model)
#   scripts/setup.sh test                     run the whole test suite (ctest)
#   scripts/setup.sh build                    build only
# Environment: BUILD_DIR (default build), TIDE_SANITIZE (address|thread),
# JOBS (default: number of cores).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
mode=${1:-build}
[ $# -gt 0 ] && shift

packages=(build-essential cmake ninja-build pkg-config libopenblas-dev liburing-dev
          libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev libdnnl-dev libedit-dev
          libmicrohttpd-dev libopenmpi-dev openmpi-bin python3 python3-venv)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTIDE_SANITIZE="${TIDE_SANITIZE:-}" >/dev/null
# `run` needs the command-line program alone (the CMake target tide-cli, its
# output named tide); `build` and `test` build everything, the tests too.
if [ "$mode" = run ]; then
  cmake --build "$build" -j "$jobs" --target tide-cli
else
  cmake --build "$build" -j "$jobs"
fi

case "$mode" in
  build) ;;
  run) exec "$build/tide" run "$@" ;;
  test)
    # the `openai` client for cli_serve's check of tide serve against it, the
    # `gguf` reader for cli_quantize's check of the files tide writes, and
    # numpy, pytest and scikit-build-core for the Python package's tests
    # (python_api, python_wheel), in a virtual environment of the build's own
    # (best effort: without a package index those checks say they were skipped)
    if [ ! -x "$build/pyenv/bin/python3" ] ||
       ! "$build/pyenv/bin/python3" -c 'import openai, gguf, numpy, pytest, scikit_build_core' 2>/dev/null; then
      { python3 -m venv "$build/pyenv" &&
        "$build/pyenv/bin/python3" -m pip install --quiet openai gguf numpy pytest scikit-build-core; } >/dev/null 2>&1 ||
        echo "setup: openai, gguf, numpy, pytest and scikit-build-core could not be installed into $build/pyenv;" \
             "cli_serve, cli_quantize, python_api and python_wheel skip their checks by them" >&2
    fi
    cd "$build" && exec ctest --output-on-failure -j "$jobs" "$@" ;;
  *) echo "usage: scripts/setup.sh [build|run|test] [args]" >&2; exit 2 ;;
esac
