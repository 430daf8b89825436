#!/usr/bin/env bash
# gpu_suite.sh - a whole GPU session in one command: build with CUDA, test,
# benchmark, run Hugging Face Accelerate and tide on the same task, probe the
# machine, compare. bench/README.md ("GPU session") explains the figures.
#
#   bench/gpu_suite.sh OUTDIR [STAGE...]
#
# Stages, run in this order whatever order they are named in (none named: all):
#   info     GPU, drivers, compilers, Python packages              (seconds)
#   build    CMake (Ninja if present, else make), Release, sm_90,
#            into build-gpu/; tests off when cmocka is absent        (1-2 min)
#   test     test_backends, then ctest (or, without cmocka, the CLI
#            tests), then compute-sanitizer memcheck of test_backends  (2-4 min)
#   quick    bench_gpu_offload --quick on a 4-layer llama-7b, then
#            again with TIDE_EXEC_SYNC=1 (synchronous issue), then
#            bench_gpu_decode (decode's matmuls, bf16 and quantized
#            weights, against the memory bandwidth)                   (about 3 min)
#   bench    bench_gpu_offload on llama-7b, --matmul auto, then
#            --matmul f32 --reps 1; writes the model on first use      (5-8 min)
#   hf       bench/hf_accelerate.py at the bench's 25% budget and
#            unconstrained                                           (2-4 min)
#   tide     tide run, 2048-token prompt + 32 tokens, same budget and
#            unconstrained                                           (about 2 min)
#   probe    tide probe of this GPU, then the 25% run predicted with
#            the probed profile                                      (1-2 min)
#   serve    bench/serve_load.py --quick on the built-in model: tide
#            serve batching a model's requests, then --max-batch 1
#            (one at a time), 1 and 4 clients                         (2-3 min)
#   compare  tables and ratios from the JSON files                   (seconds)
# All stages: about 18-23 min on one H100 with 16 cores.
#
# Every log and JSON goes to OUTDIR under a fixed name (see bench/README.md);
# OUTDIR/summary.txt gets one line per step as soon as it ends: status (ok,
# skipped, FAILED, TIMEOUT), exit code, wall seconds, and a note. Exit 77 from
# a program (no GPU, no CUDA backend) is "skipped", not a failure. Each command
# runs under `timeout`, so a hang costs that command's limit, not the session.
# A failed stage does not stop the next ones, except a failed build.
#
# Environment:
#   TIDE_SUITE_MODEL   llama-7b checkpoint shared by bench, hf, tide and probe
#                      (default /tmp/tide-7b; written by the first of them
#                      that finds it absent)
#   TIDE_SUITE_WORK    where results that later stages read are kept too, so a
#                      later run of this script with another OUTDIR finds them
#                      (default /tmp/tide-gpu-suite, -cpu in CPU smoke mode)
#   TIDE_SUITE_LIMIT   seconds this run may take: each timeout is cut to what
#                      is left, and steps that cannot get 15 s are skipped
#   TIDE_SUITE_BUDGET  GPU budget in bytes for hf, tide and probe (default: the
#                      25% row of the bench's JSON)
#   TIDE_SUITE_BUNDLE  a tarball from scripts/bundle.sh (built elsewhere): the
#                      build stage unpacks it into build-gpu/ instead of
#                      compiling, for a machine without the libraries' dev
#                      packages; the test stage then runs each test program
#   TIDE_SUITE_CPU=1   smoke mode for a machine without a GPU: the benchmarks,
#                      tide and Accelerate run on the CPU on a tiny model with
#                      a 64-token prompt, to check this script; not GPU figures
#
# Exit status: 0 when no step failed or timed out, 1 otherwise, 2 usage error.

set -u -o pipefail

ALL_STAGES=(info build test quick bench hf tide probe serve compare)

usage() {
  echo "usage: bench/gpu_suite.sh OUTDIR [STAGE...]   (stages: ${ALL_STAGES[*]})" >&2
  exit 2
}
[ $# -ge 1 ] || usage
case $1 in -h|--help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
outdir=$1
shift
want=" ${*:-${ALL_STAGES[*]}} "
for s in $want; do
  case " ${ALL_STAGES[*]} " in *" $s "*) ;; *) echo "gpu_suite: unknown stage '$s'" >&2; usage ;; esac
done
mkdir -p "$outdir" || usage
OUT=$(cd "$outdir" && pwd)

export TIDE_DATA=$ROOT/data          # hardware profiles, wherever the tree lives
BUILD=$ROOT/build-gpu
CPU_MODE=${TIDE_SUITE_CPU:-0}
WORK=${TIDE_SUITE_WORK:-/tmp/tide-gpu-suite$([ "$CPU_MODE" = 1 ] && echo -cpu)}
NPROC=$(nproc 2>/dev/null || echo 4)
mkdir -p "$WORK"

if [ "$CPU_MODE" = 1 ]; then
  MODEL=${TIDE_SUITE_MODEL:-/tmp/tide-suite-tiny}
  SEQ=64
  TINY=$ROOT/tests/fixtures/tiny-bf16-gqa/config.json
  BENCH_ARGS=(--cpu --config "$TINY" --seq "$SEQ")
  RUN_ARGS=(--backend cpu)
  HF_ARGS=(--device cpu --seq "$SEQ")
  PROBE_ARGS=(--backend cpu --seconds 3)
else
  MODEL=${TIDE_SUITE_MODEL:-/tmp/tide-7b}
  SEQ=2048
  BENCH_ARGS=()
  RUN_ARGS=(--backend cuda)           # never a 7B model on the CPU by accident
  HF_ARGS=(--seq "$SEQ")
  PROBE_ARGS=(--backend cuda --base h100-80g)
fi
QUICK_MODEL=$MODEL-l4
NEW_TOKENS=32

HAVE_GPU=0
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' && HAVE_GPU=1
# shellcheck disable=SC1091  # a bundle unpacked by an earlier run (scripts/bundle.sh)
[ -f "$BUILD/.bundle" ] && . "$BUILD/env.sh"

DEADLINE=
[ -n "${TIDE_SUITE_LIMIT:-}" ] && DEADLINE=$(( $(date +%s) + TIDE_SUITE_LIMIT ))
SUMMARY=$OUT/summary.txt
N_FAILED=0
N_NOTIME=0
BUILD_FAILED=0

{
  echo
  echo "# gpu_suite $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname): stages${want% }"
  echo "# tree $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))," \
       "model $MODEL, GPU $([ $HAVE_GPU = 1 ] && echo present || echo absent)$([ "$CPU_MODE" = 1 ] &&
       echo ' (CPU smoke mode)')"
  printf '%-16s %-8s %4s %8s  %s\n' step status exit wall_s note
} >>"$SUMMARY"

say() { echo "gpu_suite: $*" >&2; }

# record STEP STATUS EXIT WALL NOTE: one line of the summary.
STAGE_ST=()
record() {
  printf '%-16s %-8s %4s %8s  %s\n' "$1" "$2" "$3" "$4" "$5" | tee -a "$SUMMARY" >&2
  case $2 in FAILED|TIMEOUT) N_FAILED=$((N_FAILED + 1)) ;; esac
  STAGE_ST+=("$2")
}

# stage_line STAGE SECONDS: the stage's own line after its steps' lines:
# FAILED if a step failed or timed out, ok if one ran, else skipped.
stage_line() {
  local st=skipped n_ok=0 n_skip=0 n_bad=0 x
  for x in ${STAGE_ST[@]+"${STAGE_ST[@]}"}; do
    case $x in ok) n_ok=$((n_ok + 1)) ;; skipped) n_skip=$((n_skip + 1)) ;; *) n_bad=$((n_bad + 1)) ;; esac
  done
  [ $n_ok -gt 0 ] && st=ok
  [ $n_bad -gt 0 ] && st=FAILED
  printf '%-16s %-8s %4s %8s  %s\n' "= $1" "$st" - "$2" \
    "steps: $n_ok ok, $n_skip skipped, $n_bad failed or timed out" | tee -a "$SUMMARY" >&2
  STAGE_ST=()
}

# clip SECONDS: the timeout to use, cut to what TIDE_SUITE_LIMIT leaves (5 s
# kept for the summary); fails when less than 15 s would be left.
clip() {
  if [ -z "$DEADLINE" ]; then echo "$1"; return 0; fi
  local left=$(( DEADLINE - $(date +%s) - 5 ))
  [ "$left" -ge 15 ] || return 1
  echo $(( $1 < left ? $1 : left ))
}

# last_line LOG: for a note, the log's last line that names a failure, else
# its last line (the step's own "== ..." lines excluded), cut short.
last_line() {
  local l
  l=$(grep -v -e '^[[:space:]]*$' -e '^== ' "$1" 2>/dev/null)
  { grep -i -E 'error|fail|cannot|unknown|invalid|bad |missing|no such|out of memory' <<<"$l" || echo "$l"; } |
    tail -n 1 | cut -c 1-110
}

# step NAME TIMEOUT LOG STDOUT -- COMMAND...: runs the command under timeout,
# stderr (and stdout unless STDOUT names a file for it, "-" otherwise) teed
# to OUTDIR/LOG, which it starts afresh; records and returns its exit status
# (75: not run, for want of time).
# STEP_NOTE, when set, is the note of the next step; STEP_NOTE_FN, a function
# given the log that prints it.
STEP_NOTE=
STEP_NOTE_FN=
step() {
  local name=$1 limit=$2 log=$OUT/$3 sink=$4 t rc t0 wall status note=$STEP_NOTE fn=$STEP_NOTE_FN
  shift 5
  STEP_NOTE=
  STEP_NOTE_FN=
  if ! t=$(clip "$limit"); then
    record "$name" skipped - 0 "no time left (TIDE_SUITE_LIMIT): run it again"
    N_NOTIME=$((N_NOTIME + 1))
    return 75
  fi
  echo "== $name: $* (timeout ${t} s)" | tee "$log" >&2
  t0=$(date +%s.%N)
  if [ "$sink" = - ]; then
    timeout -k 10 "$t" "$@" </dev/null 2>&1 | tee -a "$log"
  else
    timeout -k 10 "$t" "$@" </dev/null 2>&1 >"$OUT/$sink" | tee -a "$log" >&2
  fi
  rc=${PIPESTATUS[0]}
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  [ -n "$fn" ] && note=$("$fn" "$log")
  case $rc in
    0) status=ok ;;
    77) status=skipped  # the program's own reason, as it printed it
        note=${note:-$(grep -i 'skip' "$log" | head -n 1 | cut -c 1-110)}
        note=${note:-$(last_line "$log")} ;;
    124) status=TIMEOUT; note="killed after its ${t} s limit" ;;
    137) if awk -v w="$wall" -v t="$t" 'BEGIN { exit !(w >= t) }'; then
           status=TIMEOUT; note="killed after its ${t} s limit"
         else
           status=FAILED; note="killed (out of memory?); $(last_line "$log")"
         fi ;;
    *) status=FAILED; note="${note:+$note; }$(last_line "$log")" ;;
  esac
  echo "== $name: exit $rc ($status) after ${wall} s" >>"$log"
  record "$name" "$status" "$rc" "$wall" "$note"
  return "$rc"
}

# skip NAME WHY: a step that cannot run here.
skip() { record "$1" skipped - 0 "$2"; }

# fresh FILE...: removes a stage's results of an earlier run, here and in WORK,
# so that nothing stale is read as this run's.
fresh() {
  local f
  for f in "$@"; do rm -f "$OUT/$f" "$WORK/$f"; done
}

# keep FILE...: copies results from OUTDIR to WORK for later runs.
keep() {
  local f
  for f in "$@"; do
    [ -s "$OUT/$f" ] && [ "$OUT" != "$WORK" ] && cp -f "$OUT/$f" "$WORK/$f"
  done
  return 0
}

# result FILE: the path of a result, from this run's OUTDIR, else from WORK.
result() {
  if [ -s "$OUT/$1" ]; then echo "$OUT/$1"
  elif [ -s "$WORK/$1" ]; then echo "$WORK/$1"
  else return 1; fi
}

# json_ok FILE: FILE holds one JSON object (a `--json` run that exited 0 but
# printed nothing usable is a failure).
json_ok() { python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$1" 2>/dev/null; }

gpu_or_skip() { # STEP: true when this step may use a GPU (or runs in CPU mode)
  [ "$HAVE_GPU" = 1 ] || [ "$CPU_MODE" = 1 ] && return 0
  skip "$1" "no GPU (nvidia-smi lists none); TIDE_SUITE_CPU=1 runs it on the CPU"
  return 1
}

# budget25: the GPU budget in bytes of the bench's 25% rows (the same for
# every policy), or TIDE_SUITE_BUDGET.
budget25() {
  if [ -n "${TIDE_SUITE_BUDGET:-}" ]; then echo "$TIDE_SUITE_BUDGET"; return 0; fi
  local f
  f=$(result gpu-offload.json || result gpu-offload-f32.json) || return 1
  python3 - "$f" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try:
        d = json.loads(line)
    except ValueError:
        continue
    if d.get("row") == "offloaded" and d.get("budget_pct") == 25 and d.get("budget_bytes"):
        print(int(d["budget_bytes"]))
        sys.exit(0)
sys.exit(1)
EOF
}

# ------------------------------------------------------------------ stages

# info (seconds): what the machine has; everything goes to info.txt.
# shellcheck disable=SC2016  # the $ in single quotes are the inner shells'
stage_info() {
  local log=$OUT/info.txt
  : >"$log"
  section() { # LABEL COMMAND...: one section of info.txt, never fatal
    { echo "## $1"; shift; timeout 60 "$@" 2>&1 || echo "(exit $?)"; echo; } </dev/null >>"$log"
  }
  section "date, host" sh -c 'date -u; uname -a; echo "cores: $(nproc)"; free -g; df -h /tmp "$0"' "$ROOT"
  section "GPU" nvidia-smi --format=csv \
    --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max
  section "nvidia-smi" nvidia-smi
  section "nvcc" sh -c 'PATH=$PATH:/usr/local/cuda/bin; command -v nvcc && nvcc --version | tail -n 2'
  section "compute-sanitizer" sh -c 'PATH=$PATH:/usr/local/cuda/bin; command -v compute-sanitizer'
  section "cmake, ninja, cc" sh -c \
    'cmake --version | head -n 1; ninja --version || echo "no ninja: make"; cc --version | head -n 1'
  section "cmocka" sh -c \
    'pkg-config --modversion cmocka || echo "no cmocka: tests other than the CLI ones are not built"'
  section "python packages" python3 -c '
import importlib
for m in ("torch", "transformers", "accelerate", "safetensors", "psutil"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:
        print(m, "MISSING:", type(e).__name__, e)
try:
    import torch
    print("torch.cuda.is_available():", torch.cuda.is_available(), "CUDA", torch.version.cuda)
    if torch.cuda.is_available():
        print("device 0:", torch.cuda.get_device_name(0))
except Exception:
    pass'
  cat "$log"
  local gpu
  gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
  record info ok 0 - "${gpu:-no GPU}; info.txt"
}

# build (1-2 min on 16 cores): Release, CUDA for sm_90 only, into build-gpu/;
# with TIDE_SUITE_BUNDLE, the bundle unpacked there instead (seconds).
stage_build() {
  local gen=() tests=ON note
  if [ -n "${TIDE_SUITE_BUNDLE:-}" ]; then
    [ -f "$BUILD/CMakeCache.txt" ] && { say "$BUILD is a build tree: not replacing it with the bundle"; BUILD_FAILED=1; return 1; }
    rm -rf "$BUILD"
    mkdir -p "$BUILD"
    STEP_NOTE_FN=bundle_note
    step build.unpack 120 build.log - -- tar -C "$BUILD" -xJf "$TIDE_SUITE_BUNDLE" || { BUILD_FAILED=1; return 1; }
    use_bundle
    return 0
  fi
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then # an existing tree keeps its generator
    if command -v ninja >/dev/null; then gen=(-G Ninja); else gen=(-G "Unix Makefiles"); fi
  fi
  command -v pkg-config >/dev/null && pkg-config --exists cmocka || tests=OFF
  [ $tests = OFF ] && say "no cmocka: configuring with -DTIDE_BUILD_TESTS=OFF"
  if ! step build.configure 240 build-configure.log - -- cmake -S "$ROOT" -B "$BUILD" ${gen[@]+"${gen[@]}"} \
       -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DTIDE_BUILD_TESTS=$tests; then
    BUILD_FAILED=1
    return 1
  fi
  if grep -q "CUDA backend enabled" "$OUT/build-configure.log"; then
    note="CUDA backend enabled; tests $tests"
  else
    note="NO CUDA backend (no nvcc?): GPU steps will skip; tests $tests"
  fi
  STEP_NOTE=$note
  step build.compile 480 build.log - -- cmake --build "$BUILD" -j "$NPROC" || { BUILD_FAILED=1; return 1; }
}

# use_bundle: a bundle's programs load its libraries (scripts/bundle.sh).
use_bundle() {
  # shellcheck disable=SC1091  # written by scripts/bundle.sh
  [ -f "$BUILD/.bundle" ] && . "$BUILD/env.sh"
  return 0
}
bundle_note() { sed -n 's/^commit /bundle of /p' "$BUILD/BUNDLE" 2>/dev/null | cut -c 1-100; }

# The binaries the later stages need; builds first on a machine that has none.
ensure_built() {
  [ "$BUILD_FAILED" = 1 ] && return 1
  [ -x "$BUILD/tide" ] && [ -x "$BUILD/bench_gpu_offload" ] && return 0
  say "no build in $BUILD: building first"
  stage_build
}

# The checkpoint for hf, tide and probe when bench has not written one here:
# the same synthetic model (seed 0, bf16), positions raised for SEQ + 64 as
# the bench does.
ensure_model() {
  [ -f "$MODEL/config.json" ] && return 0
  local cfg=llama-7b
  [ "$CPU_MODE" = 1 ] && cfg=$TINY
  step model.make 300 model.log - -- "$BUILD/tide" make-model --config "$cfg" --dtype bf16 "$MODEL" || return 1
  python3 - "$MODEL/config.json" "$((SEQ + 64))" <<'EOF'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
c = json.load(open(path))
if c.get("max_position_embeddings", 0) < n:
    c["max_position_embeddings"] = n
    json.dump(c, open(path, "w"), indent=2)
EOF
}

# ctest_note LOG: ctest's verdict line and the tests it skipped.
ctest_note() {
  local skipped
  skipped=$(grep "(Skipped)" "$1" | awk '{ printf "%s%s", sep, $3; sep = " " }')
  echo "$(grep -E '^[0-9]+% tests passed' "$1" | tail -n 1)${skipped:+; skipped: $skipped}"
}

# test (2-4 min): every op on CUDA against the CPU, the whole suite, memcheck.
stage_test() {
  ensure_built || return 1
  if [ -x "$BUILD/test_backends" ]; then
    step test.backends 120 test-backends.log - -- "$BUILD/test_backends"
  else
    skip test.backends "not built (no cmocka)"
  fi
  if [ -f "$BUILD/.bundle" ]; then
    # a bundle has no ctest files: each test program, as ctest would run it
    local t n
    for t in "$BUILD"/test_*; do
      n=$(basename "$t")
      [ "$n" = test_backends ] && continue # ran above
      case $n in *cudaemu* | *cuda_emu*) continue ;; esac # the emulated GPU's: for machines without one
      step "test.$n" 300 "test-$n.log" - -- env TIDE_FIXTURES="$ROOT/tests/fixtures" TIDE_CLI="$BUILD/tide" "$t"
    done
    for t in "$ROOT"/tests/cli_*.sh; do
      n=$(basename "$t" .sh)
      step "test.$n" 240 "test-$n.log" - -- env TIDE_FIXTURES="$ROOT/tests/fixtures" bash "$t" "$BUILD/tide"
    done
  elif [ -f "$BUILD/CTestTestfile.cmake" ] && grep -q add_test "$BUILD/CTestTestfile.cmake"; then
    # test_backends runs again here; seconds, and ctest's own record of it.
    # The emulated GPU's tests (and its kernels') are for machines without a GPU.
    STEP_NOTE_FN=ctest_note
    # shellcheck disable=SC2016  # expanded by the inner shell
    step test.ctest 300 ctest.log - -- bash -c 'cd "$1" && exec ctest -j "$2" -E "cudaemu|cuda_emu" --output-on-failure' _ \
      "$BUILD" "$NPROC"
  else
    local t n
    for t in "$ROOT"/tests/cli_*.sh; do # without cmocka ctest has none; the CLI tests need only tide
      n=$(basename "$t" .sh)
      step "test.$n" 240 "test-$n.log" - -- env TIDE_FIXTURES="$ROOT/tests/fixtures" bash "$t" "$BUILD/tide"
    done
  fi
  local cs
  cs=$(command -v compute-sanitizer || { [ -x /usr/local/cuda/bin/compute-sanitizer ] &&
                                        echo /usr/local/cuda/bin/compute-sanitizer; })
  if [ -z "$cs" ]; then
    skip test.memcheck "no compute-sanitizer"
  elif [ ! -x "$BUILD/test_backends" ]; then
    skip test.memcheck "test_backends not built"
  elif [ "$HAVE_GPU" != 1 ]; then
    skip test.memcheck "no GPU"
  else
    # API errors are the test's own (a 4 PiB alloc, bad ids): only device
    # memory errors count, as exit 86
    step test.memcheck 180 memcheck.log - -- "$cs" --tool memcheck --report-api-errors no --error-exitcode 86 \
      "$BUILD/test_backends"
  fi
}

# quick (about 2 min; exits 77 at once without a GPU): 4-layer llama-7b, with
# asynchronous issue and with TIDE_EXEC_SYNC=1.
stage_quick() {
  ensure_built || return 1
  fresh gpu-quick.json gpu-quick-sync.json
  step quick 240 quick.log - -- "$BUILD/bench_gpu_offload" --quick ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} \
    --json "$OUT/gpu-quick.json" "$QUICK_MODEL"
  keep gpu-quick.json
  # the same with every device call waited for: what asynchronous issue gains
  step quick.sync 240 quick-sync.log - -- env TIDE_EXEC_SYNC=1 "$BUILD/bench_gpu_offload" --quick \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} --json "$OUT/gpu-quick-sync.json" "$QUICK_MODEL"
  keep gpu-quick-sync.json
  # decode's matmuls (one row) at llama-7b's shapes, bf16 and every block
  # type: tokens/s of the matmuls and GB/s against the device's bandwidth
  fresh gpu-decode.json
  step quick.decode 120 quick-decode.log - -- "$BUILD/bench_gpu_decode" --json "$OUT/gpu-decode.json"
  keep gpu-decode.json
  # resident runs on the planned engine against the plain one (the one-engine
  # price on a GPU: weights and cache warm in the arena)
  fresh engine.json
  step quick.engine 240 quick-engine.log - -- "$BUILD/bench_engine" --backend cuda --prompt 512 --new 32 --reps 3 \
    --json "$OUT/engine.json" "$QUICK_MODEL"
  keep engine.json
}

# bench (5-8 min: writing the 13.5 GB model about 1, --matmul auto 3-5 with
# tensor-core matmuls, f32 with one timed run 2-3): the full benchmark.
stage_bench() {
  ensure_built || return 1
  fresh gpu-offload.json gpu-offload-f32.json
  step bench.auto 330 bench-auto.log - -- "$BUILD/bench_gpu_offload" --matmul auto \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} --json "$OUT/gpu-offload.json" "$MODEL"
  keep gpu-offload.json
  step bench.f32 240 bench-f32.log - -- "$BUILD/bench_gpu_offload" --matmul f32 --reps 1 \
    ${BENCH_ARGS[@]+"${BENCH_ARGS[@]}"} --json "$OUT/gpu-offload-f32.json" "$MODEL"
  keep gpu-offload-f32.json
}

# hf (2-4 min: each run loads 13.5 GB, then a 2048-token prefill and 31
# decode steps, streaming 75% of the weights per step at the 25% budget).
stage_hf() {
  gpu_or_skip hf || return 0
  if ! python3 -c 'import torch, transformers, accelerate' 2>/dev/null; then
    skip hf "torch, transformers or accelerate missing (see info.txt)"
    return 0
  fi
  ensure_built && ensure_model || return 1
  fresh hf-25.json hf-none.json
  local b
  if b=$(budget25); then
    step hf.25 270 hf-25.log - -- python3 "$ROOT/bench/hf_accelerate.py" --budget "$b" "${HF_ARGS[@]}" \
      --new-tokens $NEW_TOKENS --json "$OUT/hf-25.json" "$MODEL"
    keep hf-25.json
  else
    skip hf.25 "no 25% budget: run the bench stage first, or set TIDE_SUITE_BUDGET"
  fi
  step hf.none 200 hf-none.log - -- python3 "$ROOT/bench/hf_accelerate.py" --budget none "${HF_ARGS[@]}" \
    --new-tokens $NEW_TOKENS --json "$OUT/hf-none.json" "$MODEL"
  keep hf-none.json
}

# run_json STEP TIMEOUT NAME ARGS...: tide run on the model, its JSON to
# OUTDIR/NAME.json, its messages to NAME.log.
run_json() {
  local name=$1 limit=$2 base=$3
  shift 3
  step "$name" "$limit" "$base.log" "$base.json" -- "$BUILD/tide" run --model "$MODEL" --prompt-len $SEQ \
    --new-tokens $NEW_TOKENS "${RUN_ARGS[@]}" "$@" --json
  local rc=$?
  [ $rc = 0 ] && cat "$OUT/$base.json" >&2
  if [ $rc = 0 ] && ! json_ok "$OUT/$base.json"; then
    record "$name" FAILED 0 - "exit 0 but no JSON object in $base.json"
    return 1
  fi
  keep "$base.json"
  return $rc
}

# tide (about 2 min: 1 at the budget, planning included; 1 unconstrained).
stage_tide() {
  gpu_or_skip tide || return 0
  ensure_built && ensure_model || return 1
  fresh tide-25.json tide-none.json
  local b
  if b=$(budget25); then
    run_json tide.25 180 tide-25 --budget "$b" --hw h100-80g
  else
    skip tide.25 "no 25% budget: run the bench stage first, or set TIDE_SUITE_BUDGET"
  fi
  run_json tide.none 150 tide-none --budget none
}

# probe (1-2 min): measure this GPU through the backend (matmuls in the
# default mode, as tide run uses, on top of the shipped h100-80g profile),
# then the 25% run predicted with that profile; compare puts its predicted
# vs measured makespan beside the shipped profile's (the tide stage's run).
stage_probe() {
  gpu_or_skip probe || return 0
  ensure_built || return 1
  fresh probe.json tide-25-probe.json
  step probe.measure 90 probe.log - -- "$BUILD/tide" probe "${PROBE_ARGS[@]}" --out "$OUT/probe.json" || return 0
  keep probe.json
  ensure_model || return 1
  local b
  if b=$(budget25); then
    run_json probe.run 180 tide-25-probe --budget "$b" --hw "$OUT/probe.json"
  else
    skip probe.run "no 25% budget: run the bench stage first, or set TIDE_SUITE_BUDGET"
  fi
}

# serve (2-3 min; the built-in model written on first use, about 1 min):
# tide serve under load with its default batches, then one request at a
# time, on the suite's backend.
stage_serve() {
  gpu_or_skip serve || return 0
  ensure_built || return 1
  local be=cuda
  [ "$CPU_MODE" = 1 ] && be=cpu
  fresh serve.json serve-b1.json
  step serve.batched 180 serve.log - -- python3 "$ROOT/bench/serve_load.py" --quick --backend "$be" \
    --tide "$BUILD/tide" --json "$OUT/serve.json"
  keep serve.json
  step serve.b1 180 serve-b1.log - -- python3 "$ROOT/bench/serve_load.py" --quick --backend "$be" --max-batch 1 \
    --tide "$BUILD/tide" --json "$OUT/serve-b1.json"
  keep serve-b1.json
}

# compare (seconds): reads the JSON files (OUTDIR first, then WORK).
stage_compare() {
  local files=() f p
  for f in gpu-offload.json gpu-offload-f32.json gpu-quick.json gpu-quick-sync.json gpu-decode.json hf-25.json hf-none.json tide-25.json \
           tide-none.json tide-25-probe.json probe.json; do
    p=$(result "$f") || p=
    files+=("$f=$p")
  done
  # the program goes to a file: step gives commands no standard input
  cat >"$WORK/compare.py" <<'EOF'
import json, sys

out_json, shipped_path, cpu_mode = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
paths = dict(a.split("=", 1) for a in sys.argv[4:])
res = {"cpu_smoke_mode": cpu_mode}


def lines(name):
    p = paths.get(name)
    if not p:
        return []
    rows = []
    for l in open(p):
        try:
            rows.append(json.loads(l))
        except ValueError:
            pass
    return rows


def one(name):
    r = lines(name)
    return r[-1] if r else None


def f(x, fmt=".3f"):
    return format(x, fmt) if isinstance(x, (int, float)) and not isinstance(x, bool) else "n/a"


def ratio(a, b):
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


if cpu_mode:
    print("CPU smoke mode: every figure below is from the CPU, not a GPU figure\n")
print("inputs:", ", ".join(f"{k} ({v})" for k, v in paths.items() if v) or "none")
print("missing:", ", ".join(k for k, v in paths.items() if not v) or "none")
found = 0

for name in ("gpu-offload.json", "gpu-offload-f32.json", "gpu-quick.json", "gpu-quick-sync.json"):
    rows = lines(name)
    if not rows:
        continue
    found += 1
    setup = next((r for r in rows if r.get("row") == "setup"), {})
    unc = next((r for r in rows if r.get("row") == "unconstrained"), {})
    off = [r for r in rows if r.get("row") == "offloaded"]
    print(f"\n## {name}: {setup.get('config', '?')} {setup.get('layers', '?')} layers, seq {setup.get('seq', '?')}, "
          f"matmul {setup.get('matmul', '?')}, backend {setup.get('backend', '?')}, hw {setup.get('hw', '?')}; "
          f"unconstrained {f(unc.get('wall_s'))} s ({unc.get('status', 'n/a')})")
    print(f"{'policy':>12} {'pct':>5} {'status':>10} {'wall_s':>8} {'x unc':>7} {'exec xLB':>8} {'pred xLB':>8} "
          f"{'exec/pred':>9} {'h2d ratio':>9} {'d2h ratio':>9} {'speedup':>7} identical")
    for r in off:
        ok = r.get("status") == "ok"
        print(f"{r.get('policy', '?'):>12} {f(r.get('budget_pct'), 'g'):>4}% {r.get('status', '?'):>10} "
              f"{f(r.get('wall_s')) if ok else '-':>8} {f(r.get('x_unconstrained')) if ok else '-':>7} "
              f"{f(r.get('exec_x_lb'), '.2f') if ok else '-':>8} {f(r.get('pred_x_lb'), '.2f') if ok else '-':>8} "
              f"{f(ratio(r.get('exec_s'), r.get('predicted_s')), '.2f') if ok else '-':>9} "
              f"{f(r.get('h2d_ratio')) if ok else '-':>9} {f(r.get('d2h_ratio')) if ok else '-':>9} "
              f"{f(r.get('tide_speedup'), '.2f') if ok and r.get('policy') != 'tide' else '-':>7} "
              f"{r.get('bit_identical') if ok else '-'}")
    okr = [r for r in off if r.get("status") == "ok"]
    tide_h2d = [r["h2d_ratio"] for r in okr if r.get("policy") == "tide" and r.get("bytes_h2d")
                and isinstance(r.get("h2d_ratio"), (int, float))]
    res[name] = {
        "matmul": setup.get("matmul"),
        "unconstrained_s": unc.get("wall_s"),
        "rows_ok": len(okr),
        "rows": len(off),
        "all_bit_identical": all(r.get("bit_identical") for r in okr) if okr else None,
        "tide_h2d_ratio_min": min(tide_h2d) if tide_h2d else None,
        "tide_never_slower": all(r.get("tide_speedup", 0) >= 1 for r in okr if r.get("policy") != "tide"
                                 and r.get("tide_speedup")) if okr else None,
    }
    print(f"rows ok {len(okr)} of {len(off)}; all bit-identical: {res[name]['all_bit_identical']}; "
          f"lowest tide h2d ratio {f(res[name]['tide_h2d_ratio_min'])} (target >= 0.9); "
          f"tide never slower than a baseline: {res[name]['tide_never_slower']}")

# asynchronous issue (events) vs TIDE_EXEC_SYNC=1, on the quick model: wall
# time of each row, ratio sync / async (above 1: asynchronous issue faster)
qa, qs = lines("gpu-quick.json"), lines("gpu-quick-sync.json")
if qa and qs:
    def rows_of(rows):
        d = {}
        for r in rows:
            if r.get("row") == "unconstrained" and r.get("status") == "ok":
                d[("unconstrained", 100)] = r.get("wall_s")
            elif r.get("row") == "offloaded" and r.get("status") == "ok":
                d[(r.get("policy"), r.get("budget_pct"))] = r.get("wall_s")
        return d
    da, ds = rows_of(qa), rows_of(qs)
    print("\n## asynchronous issue vs TIDE_EXEC_SYNC=1 (quick model; wall s; sync / async)")
    gains = {}
    for k in da:
        if k in ds:
            g = ratio(ds[k], da[k])
            gains[f"{k[0]}@{k[1]}"] = g
            print(f"{k[0]:>14} {f(k[1], 'g'):>4}%: async {f(da[k])} s, sync {f(ds[k])} s = {f(g, '.2f')}x")
    res["async_vs_sync"] = gains

# decode's matmuls (bench_gpu_decode): GB/s per weight type against the device
dec = lines("gpu-decode.json")
if dec:
    found += 1
    d0 = next((r for r in dec if r.get("row") == "device"), {})
    print(f"\n## decode matmuls ({d0.get('config')}, {d0.get('rows')} row): {d0.get('gpu')}, peak "
          f"{f(d0.get('peak_gbs'), '.0f')} GB/s, device copy {f(d0.get('copy_gbs'), '.0f')} GB/s")
    res["decode"] = {}
    for r in dec:
        if r.get("row") == "matmuls":
            res["decode"][r["dtype"]] = {k: r.get(k) for k in ("tokens_per_s", "gbs", "of_peak", "of_copy")}
            print(f"{r['dtype']:>6}: {f(r.get('tokens_per_s'), '.1f')} tokens/s, {f(r.get('gbs'), '.0f')} GB/s = "
                  f"{f(r.get('of_peak'), '.2f')} of peak, {f(r.get('of_copy'), '.2f')} of the copy")

# Hugging Face Accelerate vs tide: tokens/s, ratio tide / HF (above 1: tide faster)
bench25 = next((r for r in lines("gpu-offload.json") if r.get("row") == "offloaded" and r.get("budget_pct") == 25
                and r.get("policy") == "tide" and r.get("status") == "ok"), None)
hfr = {}
for b in ("25", "none"):
    t, h = one(f"tide-{b}.json"), one(f"hf-{b}.json")
    if not t and not h:
        continue
    found += 1
    t, h = t or {}, h or {}
    if h and h.get("status") != "ok":
        print(f"\nHF at budget {b}: {h.get('status')} ({h.get('error', '')})")
    e = {
        "tide_prefill_tokens_per_s": t.get("prefill_tokens_per_s"),
        "hf_prefill_tokens_per_s": h.get("prefill_tokens_per_s"),
        "prefill_ratio": ratio(t.get("prefill_tokens_per_s"), h.get("prefill_tokens_per_s")),
        "tide_decode_tokens_per_s": t.get("decode_tokens_per_s"),
        "hf_decode_tokens_per_s": h.get("decode_tokens_per_s"),
        "decode_ratio": ratio(t.get("decode_tokens_per_s"), h.get("decode_tokens_per_s")),
        "tide_matmul": t.get("matmul"),
        "same_tokens": (t.get("tokens") == h.get("tokens")) if t.get("tokens") and h.get("tokens") else None,
    }
    if t.get("tokens") and h.get("tokens"):
        e["same_leading_tokens"] = next((i for i, (x, y) in enumerate(zip(t["tokens"], h["tokens"])) if x != y),
                                        min(len(t["tokens"]), len(h["tokens"])))
    if b == "25" and bench25:
        e["bench_tide_prefill_tokens_per_s"] = bench25.get("tokens_per_s")
        e["bench_prefill_ratio"] = ratio(bench25.get("tokens_per_s"), h.get("prefill_tokens_per_s"))
    hfr[b] = e
if hfr:
    print("\n## tide vs Hugging Face Accelerate (tokens/s; ratio = tide / HF, above 1: tide faster)")
    for b, e in hfr.items():
        label = "25% budget" if b == "25" else "unconstrained"
        print(f"{label:>14}: prefill tide {f(e['tide_prefill_tokens_per_s'], '.1f')} vs HF "
              f"{f(e['hf_prefill_tokens_per_s'], '.1f')} = {f(e['prefill_ratio'], '.2f')}x; decode tide "
              f"{f(e['tide_decode_tokens_per_s'], '.2f')} vs HF {f(e['hf_decode_tokens_per_s'], '.2f')} = "
              f"{f(e['decode_ratio'], '.2f')}x; tide matmul {e['tide_matmul']}; same tokens {e['same_tokens']}"
              + (f" (first {e['same_leading_tokens']} equal)" if "same_leading_tokens" in e else ""))
        if "bench_prefill_ratio" in e:
            print(f"{'':>14}  prefill, bench's planned 25% tide row: {f(e['bench_tide_prefill_tokens_per_s'], '.1f')} "
                  f"tokens/s = {f(e['bench_prefill_ratio'], '.2f')}x HF")
res["tide_vs_hf"] = hfr

# predicted vs measured makespan of the 25% run: shipped profile vs probed
pr = {}
for label, name in (("shipped h100-80g", "tide-25.json"), ("probed", "tide-25-probe.json")):
    t = one(name)
    if not t:
        continue
    p, m = t.get("predicted_makespan_s"), t.get("measured_makespan_s")
    err = ratio(p, m)
    pr[label] = {"predicted_s": p, "measured_s": m, "error": err - 1 if err is not None else None}
if pr:
    found += 1
    print("\n## prediction of the 25% run (every plan's simulated makespan vs the executor's time, summed)")
    for label, e in pr.items():
        print(f"{label:>17}: predicted {f(e['predicted_s'])} s, measured {f(e['measured_s'])} s, error "
              f"{f(100 * e['error'] if e['error'] is not None else None, '+.1f')}%")
probe = one("probe.json")
if probe:
    try:
        shipped = json.load(open(shipped_path))
    except (OSError, ValueError):
        shipped = {}
    print("\n## probed profile vs shipped h100-80g")
    for k in ("mem_bw", "h2d_bw", "d2h_bw", "link_latency_s", "launch_s", "matmul_efficiency"):
        print(f"{k:>18}: probed {f(probe.get(k), '.4g')} vs shipped {f(shipped.get(k), '.4g')}")
    for k in ("f32", "bf16", "f16"):
        print(f"{'flops ' + k:>18}: probed {f(probe.get('flops', {}).get(k), '.4g')} vs shipped "
              f"{f(shipped.get('flops', {}).get(k), '.4g')}")
    pr["probe"] = probe
res["prediction"] = pr

json.dump(res, open(out_json, "w"), indent=1)
print(f"\nwrote {out_json}")
if not found:
    print("nothing to compare: skipped")
sys.exit(0 if found else 77)
EOF
  step compare 60 compare.txt - -- python3 "$WORK/compare.py" "$OUT/compare.json" "$ROOT/data/hw/h100-80g.json" \
    "$CPU_MODE" "${files[@]}"
}

# ------------------------------------------------------------------ main

T_START=$(date +%s)
for s in "${ALL_STAGES[@]}"; do
  case $want in *" $s "*) ;; *) continue ;; esac
  say "stage $s"
  t0=$(date +%s.%N)
  "stage_$s"
  stage_line "$s" "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
  if [ "$BUILD_FAILED" = 1 ]; then
    echo "# the build failed (build-configure.log, build.log): later stages not run" | tee -a "$SUMMARY" >&2
    break
  fi
done
echo "# total $(( $(date +%s) - T_START )) s; $N_FAILED step(s) failed or timed out; $N_NOTIME not run for" \
     "want of time" | tee -a "$SUMMARY" >&2
[ "$N_FAILED" = 0 ]
