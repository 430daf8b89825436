#!/usr/bin/env bash
# cli_install.sh - `cmake --install` ships the binary, both libraries (and
# the SONAME links), tide.h, tide.pc and the CMake package; an installed tide
# finds its hardware profiles in its own prefix, with no source tree, build
# tree or $TIDE_DATA to lean on. (tests/lib_install.sh builds a program
# against the installed library.)
#
# A fresh build of the `tide` binary and the libraries alone (no tests, no
# benchmarks, no CUDA, Debug: about 30 s on 2 cores) is configured with
# -DTIDE_SOURCE_DATA=OFF,
# which compiles out the last fallback of src/cost/hw.c, the source tree's
# data/. That is the honest way to show the source tree does not serve the
# profiles: this very script runs from inside it, so it cannot be hidden, and
# a check on what was printed could not tell two copies of one file apart.
# The build tree is removed after `cmake --install`, and TIDE_DATA is unset.
# Then, with only the installed files left:
#   - the binary copied alone to another directory (no ../share/tide beside
#     it) finds the profiles through the install prefix compiled in;
#   - the whole prefix moved elsewhere (so the compiled-in prefix is gone)
#     finds them beside the executable (../share/tide/hw);
#   - the lone copy then finds nothing, and says which directories it
#     searched and which names it knows; $TIDE_DATA still overrides.
# The binary given as $1 (the tree's own build) is not used.
#
# What it proves: `cmake --install` to a temporary prefix, the build tree
# removed: the installed `tide`, copied alone or with its prefix moved, finds
# its profiles and plans.
source "$(dirname "$0")/lib_cli.sh" "$1"
SRC=$(cd "$(dirname "$0")/.." && pwd)
unset TIDE_DATA

for tool in cmake ninja; do
    command -v $tool >/dev/null || { echo "skipped: $tool not found"; exit 77; }
done
# a machine that runs a prebuilt tide (scripts/bundle.sh) may lack the build's
# development files; where they are all present, configure must succeed
for mod in libcjson liburing openblas libpcre2-8 libutf8proc; do
    pkg-config --exists $mod 2>/dev/null || { echo "skipped: $mod development files not found (pkg-config)"; exit 77; }
done

B=$TMP/build P=$TMP/prefix
# stop: a step the rest depends on failed; show its output and give up.
stop() {
    sed 's/^/  | /' "$TMP/out" | tail -20
    finish
    exit 1
}
# Debug: what is under test is what gets installed and where the binary
# looks, not the code's speed (the suite's own build is Release), and it
# compiles in a third of Release's time
expect 0 "configure" -- cmake -S "$SRC" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DTIDE_BUILD_TESTS=OFF -DTIDE_BUILD_BENCH=OFF -DTIDE_CUDA=OFF -DTIDE_SOURCE_DATA=OFF \
    -DCMAKE_INSTALL_PREFIX="$P" || stop
expect 0 "build tide-cli and the libraries" -- cmake --build "$B" --target tide-cli tide_shared -j 2 || stop
expect 0 "install" -- cmake --install "$B" || stop
rm -rf "$B"

expect 0 "binary installed" -- test -x "$P/bin/tide"
expect 0 "header installed" -- test -f "$P/include/tide.h"
L=$P/lib
[ -d "$P/lib64" ] && L=$P/lib64
[ -d "$P/lib/x86_64-linux-gnu" ] && L=$P/lib/x86_64-linux-gnu
expect 0 "static library installed" -- test -f "$L/libtide.a"
expect 0 "shared library installed" -- test -f "$L/libtide.so.$(sed -n 's/^Version: //p' "$L/pkgconfig/tide.pc")"
expect 0 "SONAME link installed" -- test -L "$L/libtide.so.0"
expect 0 "development link installed" -- test -L "$L/libtide.so"
expect 0 "tide.pc installed" -- test -f "$L/pkgconfig/tide.pc"
expect 0 "CMake package installed" -- test -f "$L/cmake/tide/tideConfig.cmake"
expect 0 "CMake package version installed" -- test -f "$L/cmake/tide/tideConfigVersion.cmake"
expect 0 "CMake targets installed" -- test -n "$(find "$L/cmake/tide" -name 'tideTargets*.cmake')"
for f in "$SRC"/data/hw/*.json; do
    expect 0 "profile $(basename "$f") installed" -- cmp "$f" "$P/share/tide/hw/$(basename "$f")"
done

PLAN=(plan --config llama-7b --hw h100-80g --budget 50% --json)

# The binary alone, elsewhere: the compiled-in install prefix serves.
mkdir -p "$TMP/elsewhere/bin"
cp "$P/bin/tide" "$TMP/elsewhere/bin/tide"
expect 0 "copied binary, installed prefix in place" -- "$TMP/elsewhere/bin/tide" "${PLAN[@]}"
contains "$TMP/out" '"hw":"h100-80g"' "plan on h100-80g"

# The prefix moved: only the profiles beside the executable remain.
mv "$P" "$TMP/moved"
expect 0 "relocated prefix" -- "$TMP/moved/bin/tide" "${PLAN[@]}"
contains "$TMP/out" '"hw":"h100-80g"' "plan on h100-80g"
contains "$TMP/out" '"feasible":true' "feasible plan"

# The lone copy now has nowhere to look.
expect 1 "no profiles anywhere" -- "$TMP/elsewhere/bin/tide" "${PLAN[@]}"
contains "$TMP/err" "unknown hardware profile 'h100-80g'" "message names the profile"
contains "$TMP/err" "8x-h100-80g-nvlink, a10-24g, a100-80g, h100-80g, h100-80g-ndr-cluster, h200-141g, l4-24g, p100-16g, rtx-3090-24g, rtx-4090-24g, v100-32g" "message lists the known names"
contains "$TMP/err" "$TMP/elsewhere/share/tide/hw" "message names the executable's share/tide/hw"
contains "$TMP/err" "$P/share/tide/hw" "message names the install prefix's share/tide/hw"
if grep -qF "$SRC/data" "$TMP/err"; then
    echo "FAIL: the source tree's data/ was searched with TIDE_SOURCE_DATA=OFF"
    FAILS=$((FAILS + 1))
fi

# $TIDE_DATA comes first.
expect 0 "TIDE_DATA" -- env TIDE_DATA="$TMP/moved/share/tide" "$TMP/elsewhere/bin/tide" "${PLAN[@]}"
contains "$TMP/out" '"hw":"h100-80g"' "plan on h100-80g"

finish
