#!/usr/bin/env bash
# mpi_ranks.sh - data-parallel ranks on the CPU: 2 ranks x 1 thread
# (`mpirun -np 2 tide train --accum A --threads 1`, and the same 2 ranks
# started torchrun-style, their collectives over TCP) against 1 process x 2
# threads (`tide train --accum 2A --threads 2`, and x 1 thread) on the same
# step, for ZeRO 0, 1 and 2 (docs/training.md section 12).
#
#     bash bench/mpi_ranks.sh [TIDE] [WORK_DIR]
#
# The model: the built-in tinyllama-mini (4 layers of width 256, a
# 2048-token vocabulary, bf16 weights with f32 master weights and moments),
# made once in WORK_DIR with `tide make-model`; the data: a generated token
# file; batch 4 x seq 128, --accum 1 per rank, 2 warm-up steps then 6 timed.
# For each run it prints the measured step (the mean of the steps after the
# first), the bytes one rank sent a step as the executor counted them (each
# collective's size, ring algorithms) beside `tide plan --train --ranks 2`'s
# figure for the same step (the planner's own formula, src/cost/cost.c), the
# collectives' busy time a step and how much of it overlapped the compute
# stream (the measured timeline). Environment: MPIRUN (default "mpirun
# --oversubscribe --allow-run-as-root"), STEPS (default 8).
set -euo pipefail
TIDE=${1:-build/tide}
WORK=${2:-/tmp/tide-mpi-bench}
STEPS=${STEPS:-8}
MPIRUN=${MPIRUN:-mpirun --oversubscribe --allow-run-as-root --mca pml ob1 --mca btl self,vader --mca btl_vader_single_copy_mechanism none}
mkdir -p "$WORK"
M=$WORK/tinyllama-mini
[ -f "$M/model.safetensors" ] || "$TIDE" make-model --config tinyllama-mini --seed 1 "$M" >/dev/null 2>&1
D=$WORK/tokens.u16
[ -f "$D" ] || python3 -c "
import random, struct
r = random.Random(7)
open('$D', 'wb').write(struct.pack('<%dH' % 200000, *[r.randrange(256) for _ in range(200000)]))"
COMMON=(--model "$M" --data "$D" --batch 4 --seq 128 --steps "$STEPS" --lr 1e-3 --quiet --json)

# the JSON summary's numeric field
field() { grep '"summary":true' "$1" | head -1 | grep -o "\"$2\":[0-9.e+-]*" | cut -d: -f2; }

printf '%-28s %10s %14s %14s %10s %9s\n' run "step s" "sent B/step" "planned B" "net s" overlap
for th in 2 1; do
    "$TIDE" train "${COMMON[@]}" --accum 2 --threads $th >"$WORK/one$th.json"
    printf '%-28s %10.4f %14s %14s %10s %9s\n' "1 process x $th thread(s)" "$(field "$WORK/one$th.json" measured_step_s)" \
        - - - -
done
# 2 ranks torchrun-style (the variables torchrun sets), their collectives
# over TCP on loopback
tcp2() {
    local port
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    WORLD_SIZE=2 RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 "$@" >/dev/null &
    local p1=$!
    WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 "$@"
    wait $p1
}
for z in 0 1 2; do
    "$TIDE" plan --model "$M" --train --batch 4 --seq 128 --ranks 2 --zero $z --hw 8x-h100-80g-nvlink --budget 100% --json \
        >"$WORK/plan$z.json"
    planned=$(grep -o '"net_bytes_per_rank":[0-9.e+]*' "$WORK/plan$z.json" | cut -d: -f2)
    for carrier in mpi tcp; do
        if [ $carrier = mpi ]; then
            $MPIRUN -np 2 -x OMP_NUM_THREADS=1 "$TIDE" train "${COMMON[@]}" --accum 1 --threads 1 --zero $z >"$WORK/r$z$carrier.json"
        else
            tcp2 "$TIDE" train "${COMMON[@]}" --accum 1 --threads 1 --zero $z >"$WORK/r$z$carrier.json"
        fi
        f=$WORK/r$z$carrier.json
        ns=$(field "$f" net_s_per_step)
        ov=$(field "$f" net_overlap_s_per_step)
        printf '%-28s %10.4f %14s %14.0f %10.4f %8.0f%%\n' "2 ranks x 1 thread ZeRO-$z $carrier" \
            "$(field "$f" measured_step_s)" "$(field "$f" net_bytes_per_step)" "$planned" \
            "$ns" "$(python3 -c "print(100 * $ov / $ns if $ns > 0 else 0)")"
    done
done
