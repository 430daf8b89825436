#!/usr/bin/env bash
# cli_torchrun.sh - `tide train` ranks started torchrun-style: each process
# given WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT, the ranks meeting at
# rank 0 and running their collectives over TCP (src/net/comm_tcp.c,
# docs/training.md section 12). The launcher here starts the ranks as
# torchrun does (the same variables) and, as torchrun does, ends the others
# once one fails; where torchrun itself is installed it runs too.
#
# What it proves, on the committed PyTorch fixtures (tests/fixtures/train):
#   - 2 ranks x --accum 1 under ZeRO 0, 1 and 2 train the steps of one
#     process with --accum 2 (losses and gradient norms 1e-5 relative, final
#     parameters 1e-4 absolute) and PyTorch's (1e-5); where this tide has MPI,
#     bit for bit the same 2 ranks under mpirun (a ring of 2 sums a + b as
#     MPI does): every step's loss and norm, and the saved checkpoint;
#   - 3 ranks x --accum 2 under ZeRO-2 (uneven shards) against --accum 6;
#     each rank's state 1/N of ZeRO-0's;
#   - offloaded ranks (--budget 25%, and state on SSD) bit for bit the same
#     ranks unconstrained (--check on every rank);
#   - LoRA over 2 ranks against one process's --accum 2 (the adapter 1e-4);
#   - a save of 2 ranks resumed by 2 ranks is bit for bit the run that never
#     stopped;
#   - the header names the carrier (tcp);
#   - a rank killed mid-step: the other fails at once naming it, and exits
#     non-zero; a stuck rank (SIGSTOP): the other's collective times out
#     (TIDE_NET_TIMEOUT), naming it, and it ends itself;
#   - usage: --comm mpi under a torchrun-style launch, --comm tcp without
#     one, --ranks that differs from WORLD_SIZE, MASTER_ADDR missing, each
#     refused with a message;
#   - torchrun --nproc-per-node 2 --no-python (where installed): the same
#     steps, bit for bit, as the variables set by hand.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
FXB=$TIDE_FIXTURES/train/train-bf16-gqa
HP=(--batch 2 --seq 16 --lr 1e-3 --min-lr 1e-4 --warmup 3 --weight-decay 0.1 --beta1 0.9 --beta2 0.95
    --eps 1e-8 --grad-clip 1.0 --threads 1 --quiet --json --precision f32)
RUN=(--model "$FX" --data "$FX/data.u16" "${HP[@]}")
RUNB=(--model "$FXB" --data "$FXB/data.u16" "${HP[@]}")
export OMP_NUM_THREADS=1

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# ranks N command...: N ranks torchrun-style on this machine, as torchrun
# starts them; once one fails the others are killed, as torchrun does
# (RANKS_KEEP=1: left to end by themselves), and after RANKS_GUARD seconds
# (default 600: a hang's guard) every rank is. Prints every rank's stdout
# (rank 0's first) and stderr; each rank's status goes to $TMP/status.R; the
# status is the first failing rank's.
ranks() {
    local n=$1 port r rc=0 st pid p guard
    shift
    port=$(free_port)
    local pids=()
    for ((r = 0; r < n; r++)); do
        WORLD_SIZE=$n RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            "$@" >"$TMP/rank$r.out" 2>"$TMP/rank$r.err" &
        pids+=($!)
    done
    (sleep "${RANKS_GUARD:-600}"; kill -9 "${pids[@]}" 2>/dev/null) &
    guard=$!
    local left=("${pids[@]}")
    while [ ${#left[@]} -gt 0 ]; do
        wait -n -p pid "${left[@]}"
        st=$?
        local still=()
        for ((p = 0; p < n; p++)); do [ "${pids[p]}" = "$pid" ] && echo "$st" >"$TMP/status.$p"; done
        for p in "${left[@]}"; do [ "$p" = "$pid" ] || still+=("$p"); done
        left=("${still[@]}")
        if [ "$st" -ne 0 ] && [ "$rc" -eq 0 ]; then
            rc=$st
            [ "${RANKS_KEEP:-0}" = 1 ] || kill -9 "${left[@]}" 2>/dev/null
        fi
    done
    kill "$guard" 2>/dev/null
    wait "$guard" 2>/dev/null
    for ((r = 0; r < n; r++)); do cat "$TMP/rank$r.out"; cat "$TMP/rank$r.err" >&2; done
    return "$rc"
}

compare() { local what=$1; shift; train_compare "$what" "$@"; } # DESCRIPTION MODE A B
field() { summary_field "$@"; } # FILE FIELD RANK
checks_passed() { # DESCRIPTION N: every one of N ranks' summaries says check_passed
    [ "$(grep -c '"check_passed":true' "$TMP/out")" = "$2" ] && PASSES=$((PASSES + 1)) ||
        { echo "FAIL: $1: $(grep -c '"check_passed":true' "$TMP/out") of $2 ranks passed --check"; FAILS=$((FAILS + 1)); }
}

# usage and the environment's mistakes
expect 2 "--comm mpi under a torchrun-style launch" -- env WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=1 "$TIDE" train "${RUN[@]}" --steps 1 --comm mpi
contains "$TMP/err" "--comm tcp" "--comm mpi under torchrun names tcp"
expect 2 "--comm tcp without a launch" -- "$TIDE" train "${RUN[@]}" --steps 1 --comm tcp
contains "$TMP/err" "torchrun --nproc-per-node" "--comm tcp alone names torchrun"
expect 2 "--ranks 3 under 2" -- env WORLD_SIZE=2 RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 \
    "$TIDE" train "${RUN[@]}" --steps 1 --ranks 3
expect 1 "MASTER_ADDR missing" -- env WORLD_SIZE=2 RANK=1 MASTER_PORT=1 "$TIDE" train "${RUN[@]}" --steps 1
contains "$TMP/err" "needs MASTER_ADDR" "the missing variable is named"
expect 2 "--ranks 2 alone" -- "$TIDE" train "${RUN[@]}" --steps 1 --ranks 2
contains "$TMP/err" "torchrun --nproc-per-node 2 --no-python" "--ranks alone names torchrun"
"$TIDE" train --help >"$TMP/help"
contains "$TMP/help" "torchrun --nproc-per-node N --no-python" "train help names torchrun"
contains "$TMP/help" "mpi|tcp|nccl" "train help lists --comm tcp"

# 2 ranks x accum 1 = one process's --accum 2 = PyTorch's grad_accum 2
expect 0 "single --accum 2" -- "$TIDE" train "${RUN[@]}" --steps 10 --accum 2 --out "$TMP/one2"
cp "$TMP/out" "$TMP/one2.json"
for z in 0 1 2; do
    expect 0 "2 ranks ZeRO-$z" -- ranks 2 "$TIDE" train "${RUN[@]}" --steps 10 --zero $z --out "$TMP/t2z$z"
    cp "$TMP/out" "$TMP/t2z$z.json"
    compare "2 ranks ZeRO-$z vs --accum 2" steps "$TMP/t2z$z.json" "$TMP/one2.json"
    compare "2 ranks ZeRO-$z final parameters vs --accum 2" params "$TMP/t2z$z/model.safetensors" \
        "$TMP/one2/model.safetensors"
done
compare "2 ranks vs PyTorch" torch "$TMP/t2z1.json" "$FX/expected.json"
expect 0 "the header names the carrier" -- ranks 2 "$TIDE" train --model "$FX" --data "$FX/data.u16" --steps 1 \
    --batch 2 --seq 16 --threads 1 --precision f32
contains "$TMP/out" "collectives on tcp" "the header's ranks line"
s0=$(field "$TMP/t2z0.json" state_bytes_this_rank 0) s1=$(field "$TMP/t2z1.json" state_bytes_this_rank 1)
echo "state per rank: ZeRO-0 $s0 bytes, ZeRO-1 $s1"
[ -n "$s0" ] && [ -n "$s1" ] && [ $((s1 * 2)) -le $((s0 + 4096)) ] && [ $((s1 * 2)) -ge $((s0 - 4096)) ] &&
    PASSES=$((PASSES + 1)) || { echo "FAIL: ZeRO-1's state per rank $s1 is not half of ZeRO-0's $s0"; FAILS=$((FAILS + 1)); }

# the same 2 ranks under mpirun: the same bits
mpi_ok=0
if command -v mpirun >/dev/null 2>&1; then
    "$TIDE" train "${RUN[@]}" --steps 1 --ranks 2 >/dev/null 2>"$TMP/probe"
    grep -q "this one has none" "$TMP/probe" || mpi_ok=1
fi
if [ "$mpi_ok" = 1 ]; then
    mpi_launcher
    expect 0 "2 ranks under mpirun" -- env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0" \
        "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 10 --zero 1 --out "$TMP/m2z1"
    cp "$TMP/out" "$TMP/m2z1.json"
    compare "2 ranks over TCP and under mpirun: the same bits" same "$TMP/t2z1.json" "$TMP/m2z1.json"
    expect 0 "the saved checkpoints are the same bytes" -- cmp "$TMP/t2z1/model.safetensors" "$TMP/m2z1/model.safetensors"
else
    echo "note: no mpirun or no MPI in this tide: the comparison with MPI's ranks is not run"
fi

# 3 ranks x accum 2, ZeRO-2 (uneven shards) = --accum 6
expect 0 "single --accum 6" -- "$TIDE" train "${RUN[@]}" --steps 4 --accum 6 --out "$TMP/one6"
cp "$TMP/out" "$TMP/one6.json"
expect 0 "3 ranks x accum 2 ZeRO-2" -- ranks 3 "$TIDE" train "${RUN[@]}" --steps 4 --accum 2 --zero 2 --out "$TMP/t3"
cp "$TMP/out" "$TMP/t3.json"
compare "3 ranks x accum 2 vs --accum 6" steps "$TMP/t3.json" "$TMP/one6.json"
compare "3 ranks final parameters vs --accum 6" params "$TMP/t3/model.safetensors" "$TMP/one6/model.safetensors"

# offloaded ranks: bit for bit the same ranks unconstrained
expect 0 "2 ranks offloaded --check" -- ranks 2 "$TIDE" train "${RUN[@]}" --steps 3 --budget 25% --check
checks_passed "offloaded ranks" 2
mkdir -p "$TMP/ssd"
expect 0 "2 ranks ZeRO-2 x accum 2, state on SSD, --check" -- ranks 2 "$TIDE" train "${RUNB[@]}" --steps 2 \
    --accum 2 --zero 2 --budget 25% --host-budget 64K --ssd "$TMP/ssd" --check
checks_passed "ranks with state on SSD" 2

# LoRA over ranks
LORA=(--lora-r 4 --lora-alpha 8)
expect 0 "LoRA single --accum 2" -- "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 4 --accum 2 --out "$TMP/lo1"
cp "$TMP/out" "$TMP/lo1.json"
expect 0 "LoRA 2 ranks" -- ranks 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 4 --zero 1 --out "$TMP/lo2"
cp "$TMP/out" "$TMP/lo2.json"
compare "LoRA 2 ranks vs --accum 2" steps "$TMP/lo2.json" "$TMP/lo1.json"
compare "LoRA 2 ranks' adapter vs --accum 2" params "$TMP/lo2/adapter_model.safetensors" \
    "$TMP/lo1/adapter_model.safetensors"

# resume: bit for bit the run that never stopped
expect 0 "2 ranks, 4 steps" -- ranks 2 "$TIDE" train "${RUNB[@]}" --steps 4 --out "$TMP/whole"
expect 0 "2 ranks, 2 steps" -- ranks 2 "$TIDE" train "${RUNB[@]}" --steps 2 --out "$TMP/half"
expect 0 "2 ranks resumed to 4" -- ranks 2 "$TIDE" train "${RUNB[@]}" --steps 4 --resume "$TMP/half" \
    --out "$TMP/resumed"
for f in model.safetensors optimizer.safetensors; do
    expect 0 "resumed $f bit for bit" -- cmp "$TMP/resumed/$f" "$TMP/whole/$f"
done

# a rank killed mid-step: the other fails at once, naming it, and ends
# itself (the guard: a hang's, never reached when it works)
cat >"$TMP/kill1.sh" <<'SH'
#!/usr/bin/env bash
# rank 1 is killed (SIGKILL) once it has printed a step (its stdout is a
# file): the ranks have met and train, however loaded the machine is
if [ "$RANK" = 1 ]; then
    out=$(readlink "/proc/$$/fd/1")
    (for _ in $(seq 1000); do grep -q '"step"' "$out" 2>/dev/null && break; sleep 0.1; done; kill -9 $$) &
fi
exec "$@"
SH
chmod +x "$TMP/kill1.sh"
RANKS_KEEP=1 RANKS_GUARD=120 expect 137 "a rank killed" -- ranks 2 "$TMP/kill1.sh" "$TIDE" train "${RUN[@]}" \
    --steps 1000000
expect 0 "the other rank failed by itself (status 1, not the guard's kill)" -- grep -qx 1 "$TMP/status.0"
contains "$TMP/rank0.err" "rank 1 closed its connection (it failed or died)" "the killed rank is named"
contains "$TMP/rank0.err" "rank 0 of 2 failed" "the surviving rank ends itself"
# a rank that stops answering (SIGSTOP): the other's collective times out
# (TIDE_NET_TIMEOUT 2 s), naming it
sed 's/kill -9/kill -STOP/' "$TMP/kill1.sh" >"$TMP/stop1.sh"
chmod +x "$TMP/stop1.sh"
RANKS_GUARD=120 expect 1 "a stuck rank" -- ranks 2 env TIDE_NET_TIMEOUT=2 "$TMP/stop1.sh" "$TIDE" train \
    "${RUN[@]}" --steps 1000000
expect 0 "rank 0 failed by itself" -- grep -qx 1 "$TMP/status.0"
contains "$TMP/rank0.err" "timed out after" "the collective's timeout is reported"
contains "$TMP/rank0.err" "rank 1 stopped answering" "the stuck rank is named"

# torchrun itself, where installed: the same bits as the variables by hand
if command -v torchrun >/dev/null 2>&1; then
    expect 0 "torchrun --nproc-per-node 2" -- torchrun --nproc-per-node 2 --no-python "$TIDE" train "${RUN[@]}" \
        --steps 10 --zero 1
    compare "torchrun's ranks: the same bits" same "$TMP/out" "$TMP/t2z1.json"
else
    echo "note: torchrun is not installed: its launch is checked through the variables it sets"
fi
finish
