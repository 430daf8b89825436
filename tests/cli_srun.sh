#!/usr/bin/env bash
# cli_srun.sh - `srun --mpi=pmix tide train`: data-parallel ranks started by
# Slurm, joined by Open MPI through PMIx (docs/training.md section 12), on a
# Slurm of this machine (scripts/slurm_local.sh starts one; .ci/run does).
#
# What it proves, on the committed PyTorch fixtures (tests/fixtures/train):
#   - 2 ranks under srun train the steps of one process with --accum 2
#     (losses and gradient norms 1e-5 relative, final parameters 1e-4
#     absolute), and bit for bit the same 2 ranks under mpirun: every step's
#     loss and norm, and the saved checkpoint;
#   - 3 ranks (srun --overcommit) under ZeRO-2 against --accum 3;
#   - srun without PMIx (--mpi=none): every rank refuses, naming
#     --mpi=pmix, before MPI could end it with its own message.
# Exit 77 when there is no srun, no Slurm controller answers (SLURM_CONF),
# or this tide has no MPI.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
HP=(--batch 2 --seq 16 --lr 1e-3 --min-lr 1e-4 --warmup 3 --weight-decay 0.1 --beta1 0.9 --beta2 0.95
    --eps 1e-8 --grad-clip 1.0 --threads 1 --quiet --json --precision f32)
RUN=(--model "$FX" --data "$FX/data.u16" "${HP[@]}")

if ! command -v srun >/dev/null 2>&1; then
    skip_check "srun" "Slurm's srun is not installed (scripts/slurm_local.sh installs and starts a one-node Slurm)"
    finish
    exit
fi
if ! timeout 30 srun -n 1 true >/dev/null 2>&1; then
    skip_check "srun" "no Slurm controller answers (scripts/slurm_local.sh starts one; SLURM_CONF names it)"
    finish
    exit
fi
"$TIDE" train "${RUN[@]}" --steps 1 --ranks 2 >/dev/null 2>"$TMP/probe"
if grep -q "this one has none" "$TMP/probe"; then
    skip_check "srun" "this tide was built without MPI"
    finish
    exit
fi
# Open MPI's own allocations kept until exit are not tide's leaks under a
# sanitizer build (lib_cli.sh's mpi_launcher: also the MPI array, for the
# comparison with mpirun), their suppressions matched with this unwinder
mpi_launcher
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" OMP_NUM_THREADS=1
# a hang's guard (srun's own): a step of these takes well under a second
SRUN=(timeout 300 srun --time=10 --export=ALL --mpi=pmix)

compare() { local what=$1; shift; train_compare "$what" "$@"; } # DESCRIPTION MODE A B

expect 0 "single --accum 2" -- "$TIDE" train "${RUN[@]}" --steps 10 --accum 2 --out "$TMP/one2"
cp "$TMP/out" "$TMP/one2.json"
expect 0 "2 ranks under srun" -- "${SRUN[@]}" -n 2 "$TIDE" train "${RUN[@]}" --steps 10 --zero 1 --out "$TMP/s2"
cp "$TMP/out" "$TMP/s2.json"
compare "2 ranks under srun vs --accum 2" steps "$TMP/s2.json" "$TMP/one2.json"
compare "2 ranks under srun: final parameters vs --accum 2" params "$TMP/s2/model.safetensors" \
    "$TMP/one2/model.safetensors"
contains "$TMP/s2.json" '"rank":1' "both ranks reported"
if command -v mpirun >/dev/null 2>&1; then
    expect 0 "2 ranks under mpirun" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 10 --zero 1 --out "$TMP/m2"
    cp "$TMP/out" "$TMP/m2.json"
    compare "srun's ranks and mpirun's: the same bits" same "$TMP/s2.json" "$TMP/m2.json"
    expect 0 "the saved checkpoints are the same bytes" -- cmp "$TMP/s2/model.safetensors" "$TMP/m2/model.safetensors"
else
    echo "note: no mpirun: the comparison with mpirun's ranks is not run"
fi

expect 0 "single --accum 3" -- "$TIDE" train "${RUN[@]}" --steps 4 --accum 3 --out "$TMP/one3"
cp "$TMP/out" "$TMP/one3.json"
expect 0 "3 ranks under srun, ZeRO-2" -- "${SRUN[@]}" -n 3 --overcommit "$TIDE" train "${RUN[@]}" --steps 4 --zero 2 \
    --out "$TMP/s3"
cp "$TMP/out" "$TMP/s3.json"
compare "3 ranks under srun vs --accum 3" steps "$TMP/s3.json" "$TMP/one3.json"
compare "3 ranks under srun: final parameters vs --accum 3" params "$TMP/s3/model.safetensors" \
    "$TMP/one3/model.safetensors"

# without PMIx: refused by each rank, naming the option
expect 1 "srun without PMIx" -- timeout 300 srun --time=10 --export=ALL --mpi=none -n 2 "$TIDE" train "${RUN[@]}" \
    --steps 1 --out "$TMP/nopmix"
contains "$TMP/err" "srun --mpi=pmix" "the missing option is named"
[ ! -e "$TMP/nopmix" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused launch wrote"; FAILS=$((FAILS + 1)); }
finish
