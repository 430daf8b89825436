#!/usr/bin/env bash
# bundle.sh - builds tide with the CUDA backend here and packs the binaries
# with the shared libraries they need into one tarball, for a GPU machine that
# cannot install packages (no network, no OpenBLAS, liburing, cJSON or cmocka
# development files) but has an NVIDIA driver and the CUDA 13 runtime and
# cuBLAS, which are not packed.
#
#   scripts/bundle.sh [OUT.tar.xz]        (default build-bundle/tide-bundle.tar.xz)
#
# Environment: TIDE_BUNDLE_ARCHS (CUDA architectures, default 90: an H100 or
# H200), TIDE_BUNDLE_BUILD (build directory, default build-bundle).
#
# The tarball unpacks into a directory laid out like a build tree, so
# bench/gpu_suite.sh can use it in place of build-gpu/ (TIDE_SUITE_BUNDLE):
#   tide, test_*, bench_*   the programs (stripped)
#   lib/                    the libraries they load that are neither glibc's
#                           nor CUDA's (OpenBLAS and its Fortran runtime,
#                           liburing, cJSON, cmocka, OpenMP)
#   env.sh                  sets LD_LIBRARY_PATH for lib/ and CUDA's usual
#                           homes; source it before running anything
#   BUNDLE                  the commit, the architectures, the date
# The programs find the hardware profiles through TIDE_DATA (the tree's
# data/ directory), the tests their fixtures through TIDE_FIXTURES.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${TIDE_BUNDLE_BUILD:-$ROOT/build-bundle}
ARCHS=${TIDE_BUNDLE_ARCHS:-90}
OUT=${1:-$BUILD/tide-bundle.tar.xz}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

gen=()
if [ ! -f "$BUILD/CMakeCache.txt" ] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
mkdir -p "$BUILD"
log=$BUILD/bundle-configure.log
cmake -S "$ROOT" -B "$BUILD" ${gen[@]+"${gen[@]}"} -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" -DTIDE_CUDA=ON >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
if ! grep -q "CUDA backend enabled" "$log"; then
  echo "bundle: the CUDA backend is not enabled here (no nvcc or no CUDA toolkit); see $log" >&2
  exit 1
fi
cmake --build "$BUILD" -j "$(nproc)"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib"
progs=()
for f in "$BUILD"/tide "$BUILD"/test_* "$BUILD"/bench_*; do
  case $f in *cudaemu* | *cuda_emu*) continue ;; esac # the emulated GPU's programs: for machines without one
  [ -f "$f" ] && [ -x "$f" ] && progs+=("$f")
done
[ ${#progs[@]} -gt 0 ] || { echo "bundle: nothing built in $BUILD" >&2; exit 1; }
for f in "${progs[@]}"; do
  cp "$f" "$stage/"
  strip --strip-unneeded "$stage/$(basename "$f")" 2>/dev/null || true
done

# Libraries: what ldd resolves, less glibc's own, the C++/GCC runtime every
# system with a compiler has, and CUDA's (the GPU machine's driver and toolkit
# must match each other, so they are never shipped).
skip_re='/(libc|libm|libdl|librt|libpthread|libutil|libresolv|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so|/lib(cuda|cudart|cublas|cublasLt|nvidia-[^/]*|nvrtc|nvJitLink|cufile)\.so'
for f in "${progs[@]}"; do ldd "$f"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    if [[ $lib =~ $skip_re ]]; then continue; fi
    cp -L "$lib" "$stage/lib/"
  done

cat >"$stage/env.sh" <<'EOF'
# Source this file (bash): the bundle's libraries, then CUDA's usual homes.
_tide_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$_tide_bundle/lib:/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _tide_bundle
EOF
{
  echo "tide bundle"
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "cuda architectures $ARCHS"
  echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(nvcc --version 2>/dev/null | tail -n 1)"
  echo "libraries: $(cd "$stage/lib" && ls | tr '\n' ' ')"
} >"$stage/BUNDLE"
touch "$stage/.bundle"

mkdir -p "$(dirname "$OUT")"
tar -C "$stage" -cJf "$OUT" .
echo "bundle: wrote $OUT ($(du -h "$OUT" | cut -f1)): ${#progs[@]} programs, $(ls "$stage/lib" | wc -l) libraries"
