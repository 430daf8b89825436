#!/usr/bin/env bash
# fuzz.sh - builds the libFuzzer targets of fuzz/ (clang, -DTIDE_FUZZ=ON, in
# BUILD_DIR, default build-fuzz) and runs each for FUZZ_SECONDS (default 30)
# on a copy of its seed corpus fuzz/corpus/TARGET (the repository is never
# written). Fails when a target crashes, leaks, hangs past 10 s on one input or
# exceeds 2 GB, printing the target, the end of its report and the reproducer
# (path, hex and base64).
#   scripts/fuzz.sh [TARGET...]     all targets when none is named
# Environment: FUZZ_SECONDS, BUILD_DIR, JOBS (build jobs, and how many targets
# run at once; default: cores),
# FUZZ_REQUIRE=1 (no clang is a failure, exit 1; else it is a skip, exit 77),
# FUZZ_KEEP=DIR (keep the grown corpora and crash files in DIR).
# Reproduce a crash: BUILD_DIR/fuzz/TARGET FILE (docs/testing.md, "Fuzzing").
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
build=${BUILD_DIR:-build-fuzz}
secs=${FUZZ_SECONDS:-30}
jobs=${JOBS:-$(getconf _NPROCESSORS_ONLN)} # not nproc: it honours OMP_NUM_THREADS, which CI sets to 1
all=(fuzz_safetensors fuzz_gguf fuzz_config fuzz_tokenizer fuzz_tok_gguf fuzz_chat fuzz_serve fuzz_tokens fuzz_plan
     fuzz_hw)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")

cc=$(command -v clang || true)
if [ -z "$cc" ] || ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
     "$cc" -x c -fsanitize=fuzzer,address,undefined -o /dev/null - 2>/dev/null; then
  echo "fuzz: clang with libFuzzer not found (Debian: apt-get install clang)" >&2
  [ "${FUZZ_REQUIRE:-0}" = 1 ] && exit 1
  exit 77
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
CC="$cc" cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTIDE_FUZZ=ON \
  -DTIDE_CUDA=OFF -DTIDE_BUILD_BENCH=OFF -DTIDE_BUILD_TESTS=OFF "${launcher[@]}" >/dev/null
if ! cmake --build "$build" -j "$jobs" --target fuzz >"$build/build.log" 2>&1; then
  echo "fuzz.sh: the fuzz targets do not build:" >&2
  grep -E -A5 "error|FAILED" "$build/build.log" | head -40 >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tide-fuzz.XXXXXX")
# the targets' scratch files (fuzz/fuzz_util.h): in memory where possible
shm=$(mktemp -d /dev/shm/tide-fuzz.XXXXXX 2>/dev/null || mktemp -d "$work/shm.XXXXXX")
export TIDE_FUZZ_DIR=$shm
trap 'rm -rf "$work" "$shm"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TIDE_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# One target's run, its verdict in $work/$t/verdict ("ok" or "failed") and
# what it prints in $work/$t/report (stdout) and $work/$t/report.err.
run_target() {
  local t=$1 bin=$build/fuzz/$1 corpus=$work/$1/corpus art=$work/$1/crash/ log=$work/$1/log start=$SECONDS
  mkdir -p "$corpus" "$art"
  cp fuzz/corpus/"$t"/* "$corpus"/ 2>/dev/null || true
  if "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$art" "$corpus" >"$log" 2>&1; then
    stats=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    cov=$(grep -E '^#[0-9]+.*(DONE|pulse|NEW|REDUCE).*cov:' "$log" | tail -1 | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+) corp: ([0-9]+).*/cov \1, features \2, corpus \3/')
    echo "fuzz: $t ok: ${stats:-?} runs in $((SECONDS - start)) s, $cov" >"$work/$t/report"
    echo ok >"$work/$t/verdict"
  else
    {
      echo "fuzz: $t FAILED; the end of its report:"
      tail -n 60 "$log"
      for f in "$art"*; do
        [ -f "$f" ] || continue
        echo "fuzz: $t reproducer $f ($(stat -c %s "$f") bytes)"
        echo "  hex:    $(head -c 4096 "$f" | od -An -tx1 -v | tr -d ' \n')"
        echo "  base64: $(head -c 4096 "$f" | base64 -w0)"
        echo "  rerun:  $bin FILE (the bytes above in FILE)"
      done
    } >"$work/$t/report.err"
    echo failed >"$work/$t/verdict"
  fi
}
for t in "${targets[@]}"; do
  [ -x "$build/fuzz/$t" ] || { echo "fuzz: no target $t" >&2; exit 2; }
done
# the targets run $jobs at a time (each one is single-threaded), reported in
# the order named
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then wait -n || true; running=$((running - 1)); fi
  run_target "$t" &
  running=$((running + 1))
done
wait
failed=()
for t in "${targets[@]}"; do
  [ -f "$work/$t/report" ] && cat "$work/$t/report"
  [ -f "$work/$t/report.err" ] && cat "$work/$t/report.err" >&2
  [ -f "$work/$t/verdict" ] || echo "fuzz: $t: its run stopped without a verdict" >&2
  [ "$(cat "$work/$t/verdict" 2>/dev/null)" = ok ] || failed+=("$t")
  if [ -n "${FUZZ_KEEP:-}" ]; then mkdir -p "$FUZZ_KEEP"; cp -r "$work/$t" "$FUZZ_KEEP/"; fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: failed: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran ${secs} s each without a failure"
