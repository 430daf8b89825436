#!/usr/bin/env bash
# cli_comm.sh - `tide train --comm mpi|tcp|nccl`: which carrier runs a rank's
# collectives, and one rank in one process (docs/training.md section 12,
# "NCCL on CUDA").
#
#   cli_comm.sh TIDE          the checks that need no GPU:
#     - option errors: --comm other than mpi, tcp or nccl, --comm nccl on the CPU
#       backend, --comm mpi on CUDA (usage errors, status 2);
#     - with TIDE_CUDAEMU (the emulated GPU's tide, built without NCCL):
#       --comm nccl is refused saying the build has no NCCL;
#     - on a machine without a GPU, --comm nccl fails naming the missing
#       device (status 1, no checkpoint written);
#     - one rank over MPI on the CPU backend (--comm mpi in one process:
#       the rank's step, its collectives over itself) is the single-process
#       step bit for bit: every step's loss and gradient norm, and the saved
#       model and optimizer state byte for byte, under ZeRO 0 and 1 with
#       --accum 2 and ZeRO 2 with --accum 1.
#   cli_comm.sh TIDE --gpu    the same one rank on the CUDA backend with
#     NCCL (--comm nccl, then under mpirun -np 1) against the single-process
#     CUDA step, bit for bit as above; exit 77 without a GPU or without
#     NCCL in this build.
source "$(dirname "$0")/lib_cli.sh" "$1"
MODE=${2:-cpu}
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
HP=(--model "$FX" --data "$FX/data.u16" --batch 2 --seq 16 --lr 1e-3 --min-lr 1e-4 --warmup 3 --weight-decay 0.1
    --threads 1 --quiet --json)
export OMPI_MCA_mca_base_component_disable_dlclose=1
# under a sanitizer build: Open MPI's allocations kept until exit are not
# tide's (tests/lsan_mpi.supp, which says why use_tls=0 here)
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan_mpi.supp:print_suppressions=0:use_tls=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"

# the steps' losses and gradient norms of a run's JSON lines, as printed
steps() { python3 -c '
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        o = json.loads(line)
        if "step" in o and "loss" in o and "summary" not in o:
            print(o["step"], repr(o["loss"]), repr(o["grad_norm"]))' "$1"; }

# same DESCRIPTION A B: runs A and B (directories A.out, B.out) trained the
# same steps bit for bit
same() {
    local what=$1 a=$2 b=$3
    steps "$TMP/$a.json" >"$TMP/$a.steps"
    steps "$TMP/$b.json" >"$TMP/$b.steps"
    if [ ! -s "$TMP/$a.steps" ] || ! cmp -s "$TMP/$a.steps" "$TMP/$b.steps"; then
        echo "FAIL: $what: the steps differ"
        diff "$TMP/$a.steps" "$TMP/$b.steps" | head -6
        FAILS=$((FAILS + 1))
        return
    fi
    PASSES=$((PASSES + 1))
    for f in model.safetensors optimizer.safetensors; do
        if cmp -s "$TMP/$a.out/$f" "$TMP/$b.out/$f"; then PASSES=$((PASSES + 1))
        else echo "FAIL: $what: $f differs"; FAILS=$((FAILS + 1)); fi
    done
}

# run NAME ARGS...: tide train, its JSON lines in NAME.json, saved to NAME.out
run() {
    local name=$1
    shift
    expect 0 "$name" -- "$@" --out "$TMP/$name.out"
    cp "$TMP/out" "$TMP/$name.json"
}

# one_rank BACKEND CARRIER [LAUNCH...]: the single process against one rank
one_rank() {
    local be=$1 cm=$2
    shift 2
    for z in 0 1 2; do
        local acc=2
        [ "$z" = 2 ] && acc=1
        run "$be-one-$acc" "$TIDE" train "${HP[@]}" --steps 4 --accum $acc --backend "$be"
        run "$be-$cm-$z" "$@" "$TIDE" train "${HP[@]}" --steps 4 --accum $acc --backend "$be" --comm "$cm" --zero $z
        same "$be: one rank over $cm, ZeRO-$z, --accum $acc${1:+ under $1}" "$be-one-$acc" "$be-$cm-$z"
    done
}

mpi_ok() { "$TIDE" train --help >/dev/null && ! "$TIDE" train "${HP[@]}" --steps 1 --ranks 2 2>&1 | grep -q "this one has none"; }

if [ "$MODE" = --gpu ]; then
    if ! mpi_ok; then
        skip_check "NCCL" "this tide was built without MPI (one process's NCCL rank joins MPI's singleton)"
        finish
        exit
    fi
    "$TIDE" train "${HP[@]}" --steps 1 --backend cuda --comm nccl >/dev/null 2>"$TMP/probe"
    if grep -q "built without it" "$TMP/probe"; then
        skip_check "NCCL" "this tide was built without NCCL"
    elif grep -q "no CUDA device" "$TMP/probe"; then
        skip_check "NCCL" "no GPU: $(grep -o 'no CUDA device[^(]*' "$TMP/probe" | head -1)"
    else
        one_rank cuda nccl
        if command -v mpirun >/dev/null 2>&1; then
            for z in 0 1; do
                run "cuda-mpirun-$z" mpirun --allow-run-as-root -np 1 "$TIDE" train "${HP[@]}" --steps 4 --accum 2 \
                    --backend cuda --comm nccl --zero $z
                same "cuda: one rank over NCCL, ZeRO-$z, under mpirun -np 1" cuda-one-2 "cuda-mpirun-$z"
            done
        fi
    fi
    finish
    exit
fi

# option errors
expect 2 "--comm other" -- "$TIDE" train "${HP[@]}" --steps 1 --comm gloo
contains "$TMP/err" "mpi, tcp or nccl" "--comm names its values"
expect 2 "--comm nccl on the CPU" -- "$TIDE" train "${HP[@]}" --steps 1 --comm nccl --backend cpu
contains "$TMP/err" "--backend cuda" "--comm nccl names --backend cuda"
expect 2 "--comm mpi on CUDA" -- "$TIDE" train "${HP[@]}" --steps 1 --comm mpi --backend cuda
contains "$TMP/err" "NCCL" "--comm mpi on CUDA names NCCL"
"$TIDE" train --help >"$TMP/help"
contains "$TMP/help" "--comm C" "train help lists --comm"

# a build without NCCL (the emulated GPU's)
if [ -n "${TIDE_CUDAEMU:-}" ]; then
    expect 2 "--comm nccl without NCCL" -- "$TIDE_CUDAEMU" train "${HP[@]}" --steps 1 --comm nccl
    contains "$TMP/err" "built without it" "a build without NCCL says so"
    expect 2 "--backend cuda ranks without NCCL" -- env OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 \
        "$TIDE_CUDAEMU" train "${HP[@]}" --steps 1 --backend cuda
    contains "$TMP/err" "built without it" "CUDA ranks without NCCL: the message"
else
    skip_check "no NCCL" "TIDE_CUDAEMU (the emulated GPU's tide) is not set"
fi

if ! mpi_ok; then
    skip_check "one rank" "this tide was built without MPI"
    finish
    exit
fi

# no GPU: NCCL's rank fails naming the device, and writes nothing
if "$TIDE" train "${HP[@]}" --steps 1 --backend cuda 2>&1 | grep -q "no CUDA device"; then
    expect 1 "--comm nccl without a GPU" -- "$TIDE" train "${HP[@]}" --steps 2 --comm nccl --out "$TMP/nogpu"
    contains "$TMP/err" "no CUDA device" "NCCL without a GPU names the device"
    [ ! -e "$TMP/nogpu" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a failed rank wrote $TMP/nogpu"; FAILS=$((FAILS + 1)); }
fi

# one rank over MPI on the CPU: the single process's steps, bit for bit
one_rank cpu mpi
finish
