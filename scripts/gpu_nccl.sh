#!/usr/bin/env bash
# gpu_nccl.sh - the NCCL checks a machine with a GPU runs in one call
# (docs/training.md section 12, "NCCL on CUDA"):
#
#   scripts/gpu_nccl.sh [BUILD_DIR] [OUTDIR]     (defaults build-gpu, nccl-out)
#
# Configures a Release build with CUDA for sm_80 and sm_90 (CMake must find
# NCCL and MPI: the configure line "tide: NCCL at ..." says so, and the
# script stops when it is missing), builds tide, test_nccl and what
# cli_comm.sh runs, then runs under ctest:
#   test_nccl      NCCL's all-reduce, reduce-scatter and all-gather on
#                  device buffers over one rank;
#   cli_comm_gpu   tide train --backend cuda --comm nccl (one rank, ZeRO 0,
#                  1, 2; then under mpirun -np 1) against the single-process
#                  CUDA step, bit for bit;
#   cli_comm       the CPU side again (option errors, one rank over MPI).
# On two or more GPUs it also runs 2 ranks over NCCL against one process
# with --accum 2 (losses within 1e-5 relative: f32 summation order).
# Without cmocka (no C tests) it runs tests/cli_comm.sh --gpu on tide alone.
# Logs go to OUTDIR; the exit status is ctest's (skipped tests count as
# passed there: read OUTDIR/ctest.log for "Skipped"), or cli_comm.sh's (77:
# skipped). About 3-5 minutes on
# 16 cores, most of it the build.
set -u
B=${1:-build-gpu}
OUT=${2:-nccl-out}
mkdir -p "$OUT"
{ nvidia-smi -L; nvcc --version | tail -1; mpirun --version 2>&1 | head -1; } >"$OUT/info.txt" 2>&1
GEN=()
command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
# test_nccl is a C test (built with the tests, which need cmocka); without
# cmocka the CLI checks run on tide alone
tests=ON
command -v pkg-config >/dev/null 2>&1 && pkg-config --exists cmocka || tests=OFF
cmake -S . -B "$B" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90" \
    -DTIDE_CUDA_EMU=OFF -DTIDE_BUILD_TESTS=$tests >"$OUT/configure.log" 2>&1 ||
    { echo "configure failed: $OUT/configure.log"; tail -5 "$OUT/configure.log"; exit 1; }
if ! grep -q "tide: NCCL at" "$OUT/configure.log"; then
    echo "this build has no NCCL (or no CUDA or MPI): $(grep -E 'NCCL|MPI|CUDA backend' "$OUT/configure.log" | head -3)"
    exit 1
fi
targets=(tide-cli)
[ $tests = ON ] && targets+=(test_nccl)
cmake --build "$B" -j"$(nproc)" --target "${targets[@]}" >"$OUT/build.log" 2>&1 ||
    { echo "build failed: $OUT/build.log"; tail -20 "$OUT/build.log"; exit 1; }
if [ $tests = ON ]; then
    timeout 900 ctest --test-dir "$B" -R '^(test_nccl|cli_comm_gpu|cli_comm)$' --output-on-failure \
        >"$OUT/ctest.log" 2>&1
    rc=$?
else
    echo "no cmocka: test_nccl not built; the CLI checks only" >"$OUT/ctest.log"
    TIDE_FIXTURES=$PWD/tests/fixtures timeout 900 bash tests/cli_comm.sh "$B/tide" --gpu >>"$OUT/ctest.log" 2>&1
    rc=$?
fi
tail -25 "$OUT/ctest.log"
echo "status $rc"
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$n" -ge 2 ] && command -v mpirun >/dev/null 2>&1; then
    FX=tests/fixtures/train/train-f32-gqa
    HP=(--model "$FX" --data "$FX/data.u16" --batch 2 --seq 16 --lr 1e-3 --steps 4 --threads 1 --quiet --json
        --backend cuda)
    "$B/tide" train "${HP[@]}" --accum 2 >"$OUT/one.json" 2>"$OUT/one.err"
    timeout 300 mpirun --allow-run-as-root -np 2 "$B/tide" train "${HP[@]}" --accum 1 --zero 1 \
        >"$OUT/two.json" 2>"$OUT/two.err"
    echo "2 ranks over NCCL: exit $?"
    python3 - "$OUT/one.json" "$OUT/two.json" <<'PY'
import json, sys
def steps(p):
    return {o["step"]: (o["loss"], o["grad_norm"]) for o in map(json.loads, (l for l in open(p) if l.startswith("{")))
            if "loss" in o and "summary" not in o and o.get("rank", 0) == 0}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
bad = [s for s in a if s not in b or any(abs(x - y) > 1e-5 * abs(x) for x, y in zip(a[s], b[s]))]
print("2 ranks vs --accum 2:", "same steps within 1e-5" if a and not bad else "DIFFER at %s" % bad)
PY
fi
exit $rc
