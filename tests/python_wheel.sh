#!/usr/bin/env bash
# python_wheel.sh BUILD_DIR - `pip wheel .` (scikit-build-core running the
# CMake build of libtide.so and tide only, pyproject.toml) with the build's
# virtual environment BUILD_DIR/pyenv, the wheel installed into a fresh
# virtual environment, and the package used from outside the source tree:
# its own libtide.so (no TIDE_LIBRARY, no LD_LIBRARY_PATH), `python -m tide`,
# a generation on a fixture, tide.plan with a profile the wheel carries.
# Exit 77 (skip) when scikit-build-core or numpy cannot be installed.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
py=$build/pyenv/bin/python3
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
if [ ! -x "$py" ] || ! "$py" -c 'import scikit_build_core' 2>/dev/null; then
    echo "python_wheel: scikit-build-core is not installed in $build/pyenv (scripts/setup.sh test installs it): skipped"
    exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "python_wheel: FAIL: $*"; exit 1; }
unset TIDE_LIBRARY TIDE_CLI TIDE_DATA LD_LIBRARY_PATH PYTHONPATH
start=$(date +%s)
# the wheel's CMake build in a directory of its own beside the build (kept, so
# that a second run is incremental); no isolation: pyenv has the backend
# Debug (-C cmake.build-type): what is under test is the wheel's contents and
# how the package finds them, not the code's speed (pyproject.toml's Release
# is what `pip install .` builds), and it compiles in a third of the time
"$py" -m pip wheel --quiet --no-build-isolation --no-deps -w "$tmp/dist" \
    -C build-dir="$build/pywheel" -C cmake.build-type=Debug "$here" > "$tmp/wheel.log" 2>&1 || { tail -30 "$tmp/wheel.log"; fail "pip wheel"; }
end=$(date +%s)
whl=$(ls "$tmp"/dist/tide-*.whl) || fail "no wheel written"
echo "python_wheel: built $(basename "$whl") ($(du -k "$whl" | cut -f1) KiB) in $((end - start)) s"
python3 -m venv "$tmp/venv" || fail "python3 -m venv"
if ! "$tmp/venv/bin/python" -m pip install --quiet numpy > "$tmp/pip.log" 2>&1; then
    echo "python_wheel: numpy could not be installed into a fresh virtual environment: skipped"; exit 77
fi
"$tmp/venv/bin/python" -m pip install --quiet --no-deps "$whl" || fail "pip install of the wheel"
# the listing into a file first: `unzip -l | grep -q` under pipefail fails
# whenever grep exits at its match before unzip has written everything
unzip -l "$whl" > "$tmp/wheel.list" || fail "unzip -l of the wheel"
grep -q 'tide/lib/libtide.so.0$' "$tmp/wheel.list" || fail "the wheel has no tide/lib/libtide.so.0"
grep -q 'tide/share/tide/hw/h100-80g.json' "$tmp/wheel.list" || fail "the wheel has no hardware profiles"
cd "$tmp" || exit 1
"$tmp/venv/bin/python" - "$TIDE_FIXTURES" <<'PY' || fail "the installed package"
import os, sys, tide
fx = sys.argv[1]
site = os.path.dirname(tide.__file__)
assert tide.LIBRARY_PATH.startswith(site), ("libtide.so not the wheel's", tide.LIBRARY_PATH)
assert tide.executable().startswith(site), tide.executable()
with tide.Model(os.path.join(fx, "hf-text"), backend="cpu") as m:
    g = m.generate("Once upon a time", max_new_tokens=8)
    assert len(g.tokens) == 8 and g.text, g
p = tide.plan("llama-7b", budget="25%", hw="h100-80g", seq=512)
assert p["hw"] == "h100-80g" and p["feasible"], p
print("python_wheel: installed package generates %r and plans llama-7b" % g.text)
PY
ver=$("$tmp/venv/bin/python" -m tide --version) && [ -n "$ver" ] || fail "python -m tide --version"
help=$("$tmp/venv/bin/tide" --help) && [[ $help == *make-model* ]] || fail "the tide entry point"
echo "python_wheel: ok"
