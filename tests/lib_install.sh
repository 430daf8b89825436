#!/usr/bin/env bash
# lib_install.sh - a program links tide the way it links any installed
# library: the build tree ($2) is installed into a temporary prefix, and
# examples/generate.c is built against what was installed, through
# pkg-config (libtide.so; and `--static`, libtide.a with Libs.private and
# Requires.private) and through CMake (find_package(tide), tide::tide). Each
# build runs on a small model with the built-in tokenizer (data/tokenizer),
# made by the installed `tide make-model`, at half its unconstrained peak; the
# tokens each prints are those of `tide run` on the same prompt and budget,
# and each prints the library's version and the statistics.
source "$(dirname "$0")/lib_cli.sh" "$1"
BUILD=${2:?usage: $0 TIDE BUILD_DIR}
SRC=$(cd "$(dirname "$0")/.." && pwd)
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
: "${TIDE_DATA:?TIDE_DATA must point at data}"
# a sanitized libtide.so needs its runtime in the program, which a plain
# build of the example does not link
[ -z "${TIDE_SANITIZE:-}" ] || { echo "skipped: a TIDE_SANITIZE=$TIDE_SANITIZE build"; exit 77; }
for tool in cmake cc pkg-config; do
    command -v $tool >/dev/null || { echo "skipped: $tool not found"; exit 77; }
done
stop() {
    sed 's/^/  | /' "$TMP/out" "$TMP/err" | tail -20
    finish
    exit 1
}
same() {
    if [ "$2" = "$3" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: got [$2], wanted [$3]"; FAILS=$((FAILS + 1)); fi
}

P=$TMP/prefix
expect 0 "install" -- cmake --install "$BUILD" --prefix "$P" || stop
L=$(dirname "$(find "$P" -name tide.pc -path '*/pkgconfig/*' | head -1)")
L=${L%/pkgconfig}
expect 0 "tide.pc installed" -- test -f "$L/pkgconfig/tide.pc" || stop
VERSION=$(sed -n 's/^Version: //p' "$L/pkgconfig/tide.pc")
export PKG_CONFIG_PATH=$L/pkgconfig

# through pkg-config: the shared library, then the static one
expect 0 "pkg-config --cflags --libs tide" -- pkg-config --cflags --libs tide || stop
contains "$TMP/out" "-ltide" "pkg-config names the library"
expect 0 "build with pkg-config" -- \
    cc "$SRC/examples/generate.c" -o "$TMP/gen-pc" $(pkg-config --cflags --libs tide) -Wl,-rpath,"$L" || stop
expect 0 "linked to libtide.so" -- sh -c "readelf -d '$TMP/gen-pc' | grep -q 'libtide.so.0'"
# (both libraries lie in one directory: -l:libtide.a picks the archive, the
# rest of the line is what --static adds for it)
static_libs=$(pkg-config --static --libs tide | sed 's/-ltide\b/-l:libtide.a/')
expect 0 "build with pkg-config --static" -- \
    cc "$SRC/examples/generate.c" -o "$TMP/gen-static" $(pkg-config --cflags tide) $static_libs || stop
expect 1 "static build needs no libtide.so" -- sh -c "readelf -d '$TMP/gen-static' | grep -q libtide"

# through the CMake package
G=()
command -v ninja >/dev/null && G=(-G Ninja)
expect 0 "configure with find_package(tide)" -- \
    cmake -S "$SRC/examples" -B "$TMP/ex" "${G[@]}" -DCMAKE_PREFIX_PATH="$P" || stop
expect 0 "build with CMake" -- cmake --build "$TMP/ex" || stop

# a small model whose vocabulary holds the built-in tokenizer's 4096 ids
FX=$TIDE_FIXTURES/tiny-bf16-gqa
sed -e 's/"vocab_size": 320/"vocab_size": 4160/' "$FX/config.json" > "$TMP/config.json"
expect 0 "make-model" -- "$P/bin/tide" make-model --config "$TMP/config.json" --seed 7 "$TMP/m" || stop
cp "$TIDE_DATA"/tokenizer/tokenizer.json "$TIDE_DATA"/tokenizer/tokenizer_config.json \
   "$TIDE_DATA"/tokenizer/generation_config.json "$TMP/m/"

prompt="The planner moves tensors between memory tiers, ahead of time."
expect 0 "tide run" -- "$P/bin/tide" run --model "$TMP/m" --prompt "$prompt" --new-tokens 12 --budget 50% --json || stop
want=$(sed -e 's/.*"tokens":\[\([0-9,]*\)\].*/\1/' "$TMP/out")
[ -n "$want" ] || { echo "FAIL: tide run printed no tokens"; FAILS=$((FAILS + 1)); }
for g in "$TMP/gen-pc" "$TMP/gen-static" "$TMP/ex/generate"; do
    name=${g#$TMP/}
    expect 0 "$name runs" -- "$g" "$TMP/m" "$prompt" 12 0.5 || continue
    contains "$TMP/out" "tide $VERSION (header $VERSION)" "$name: library and header versions"
    same "$name: tokens equal tide run's" "$(sed -n 's/^tokens: //p' "$TMP/out")" "$want"
    contains "$TMP/out" "text: " "$name: decoded text"
    contains "$TMP/out" "stats: prompt " "$name: generation statistics"
    contains "$TMP/out" "peak device" "$name: offload statistics"
done
# its failures name their cause
expect 1 "a missing model" -- "$TMP/ex/generate" "$TMP/none" "hi"
contains "$TMP/err" "$TMP/none" "the message names the directory"

finish
