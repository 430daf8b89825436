#!/usr/bin/env bash
# cli_mpi.sh - `mpirun -np N tide train`: data-parallel ranks on the CPU
# backend, Open MPI carrying the collectives (docs/training.md section 12).
#
# What it proves, on the committed PyTorch fixtures (tests/fixtures/train):
#   - 2 ranks x --accum 1 match PyTorch's 10 steps of the fixture (grad_accum
#     2) within test_train's single-process tolerances (losses and gradient
#     norms 1e-5 relative), and train the same steps as one process with
#     --accum 2: every step's loss and gradient norm within 1e-5 relative,
#     the final parameters within 1e-4 absolute; likewise ZeRO 0, 1 and 2;
#     3 ranks x --accum 1 against --accum 3 (shards of uneven rows) and 2
#     ranks x --accum 2 against --accum 4; the bf16 fixture's f32 masters
#     (sharded) within the same tolerance;
#   - ZeRO-2 over micro-batches (each one's gradients reduce-scattered into
#     the shard): 2 ranks x --accum 2 against --accum 4 and against ZeRO-1's
#     ranks, 3 ranks x --accum 2 against --accum 6, within the same
#     tolerances; offloaded (--budget 25%, and state on SSD) bit for bit the
#     same ranks unconstrained;
#   - LoRA over ranks: 2 ranks x --accum 1 against one process's LoRA with
#     --accum 2 under ZeRO 0, 1 and 2 (losses and norms 1e-5 relative, the
#     saved adapter and optimizer state 1e-4 absolute, adapter_config.json
#     byte for byte, no full checkpoint; --merge-out's merged base 1e-4
#     absolute); ZeRO-0 sends the adapters' bytes
#     a step and nothing of the frozen base; QLoRA (--base-type q8_0) 2
#     ranks against one process's --accum 2; offloaded LoRA ranks bit for bit
#     the same ranks unconstrained;
#   - each rank's master weights and moments (the summary's
#     state_bytes_this_rank) are 1/N of ZeRO-0's, up to the rows of uneven
#     shards;
#   - offloaded ranks at --budget 25% and with their state on SSD
#     (--host-budget 64K) are bit for bit the same ranks unconstrained
#     (--check passes on every rank);
#   - validation over ranks: 2 ranks' --eval (a token file, every 2 steps)
#     and 3 ranks' --eval-split (a .jsonl, some ranks' rows all padding)
#     report on every rank the validation loss and targets of one process
#     with --accum N (1e-5 relative, the counts equal); the text output's
#     validation is rank 0's alone;
#   - bf16 (--precision bf16): 3 ranks ZeRO-2 against one process's --accum 3
#     within the f32 tolerances (the same roundings on both);
#   - a save of 2 ranks resumed by 2 ranks is bit for bit the run that never
#     stopped (a LoRA one too); one process with --accum 2 resumes it too; by 3 ranks x
#     --accum 1 (another number of micro-batches a step) it is refused,
#     naming the accum;
#   - a rank killed mid-step ends the job: mpirun exits non-zero naming rank
#     1, well before the guard's limit (a hang would reach it); a rank that
#     stops answering makes the others' collective time out
#     (TIDE_NET_TIMEOUT), naming it, and the failed rank ends every rank;
#   - without a launcher --ranks 2 is refused naming mpirun, --zero without
#     ranks is a usage error (torchrun-style launches: tests/cli_torchrun.sh).
# Exit 77 when mpirun is absent or this tide has no MPI.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
FXB=$TIDE_FIXTURES/train/train-bf16-gqa
# f32 (the PyTorch fixtures' arithmetic); the bf16 case below asks for bf16
HP=(--batch 2 --seq 16 --lr 1e-3 --min-lr 1e-4 --warmup 3 --weight-decay 0.1 --beta1 0.9 --beta2 0.95
    --eps 1e-8 --grad-clip 1.0 --threads 1 --quiet --json --precision f32)
RUN=(--model "$FX" --data "$FX/data.u16" "${HP[@]}")
RUNB=(--model "$FXB" --data "$FXB/data.u16" "${HP[@]}")

# without a launcher
expect 2 "--ranks without a launch" -- "$TIDE" train "${RUN[@]}" --steps 1 --ranks 2
contains "$TMP/err" "mpirun -np 2" "--ranks names mpirun"
grep -q "this one has none" "$TMP/err" && no_mpi=1 || no_mpi=0
expect 2 "--zero without ranks" -- "$TIDE" train "${RUN[@]}" --steps 1 --zero 1
"$TIDE" train --help >"$TMP/help"
for o in --ranks --zero; do contains "$TMP/help" "$o" "train help lists $o"; done

if ! command -v mpirun >/dev/null 2>&1; then
    skip_check "ranks" "mpirun is not installed (openmpi-bin)"
    finish
    exit
fi
if [ "$no_mpi" = 1 ]; then
    skip_check "ranks" "this tide was built without MPI"
    finish
    exit
fi
# one machine, as many ranks as asked for; shared memory between them
# (lib_cli.sh's mpi_launcher, the MPI array); the unwinder its leak
# suppressions need under a sanitizer build, for every rank here
mpi_launcher
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}fast_unwind_on_malloc=0"

cmp_steps() { train_compare "$1" steps "$2" "$3"; } # DESCRIPTION A B
cmp_params() { # DESCRIPTION DIR_A DIR_B [FILE]: FILE (model.safetensors) of each, tensor by tensor
    local f=${4:-model.safetensors}
    train_compare "$1" params "$2/$f" "$3/$f"
}
fails() { ! "$@"; } # a command that must fail (mpirun's status is the aborting rank's)
field() { summary_field "$@"; } # FILE FIELD RANK

# 2 ranks x accum 1 = PyTorch's grad_accum 2, and one process's --accum 2
expect 0 "single --accum 2" -- "$TIDE" train "${RUN[@]}" --steps 10 --accum 2 --out "$TMP/one2"
cp "$TMP/out" "$TMP/one2.json"
for z in 0 1 2; do
    expect 0 "2 ranks ZeRO-$z" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 10 --zero $z --out "$TMP/r2z$z"
    cp "$TMP/out" "$TMP/r2z$z.json"
    cmp_steps "2 ranks ZeRO-$z vs --accum 2" "$TMP/r2z$z.json" "$TMP/one2.json"
    cmp_params "2 ranks ZeRO-$z final parameters vs --accum 2" "$TMP/r2z$z" "$TMP/one2"
done
train_compare "2 ranks vs PyTorch" torch "$TMP/r2z1.json" "$FX/expected.json"
# state: 1/N of ZeRO-0's on each rank
s0=$(field "$TMP/r2z0.json" state_bytes_this_rank 0)
s1a=$(field "$TMP/r2z1.json" state_bytes_this_rank 0) s1b=$(field "$TMP/r2z1.json" state_bytes_this_rank 1)
echo "state per rank: ZeRO-0 $s0 bytes, ZeRO-1 $s1a and $s1b"
[ -n "$s0" ] && [ -n "$s1a" ] && [ "$s1a" = "$s1b" ] && [ $((2 * s1a)) -ge "$s0" ] &&
    [ $((2 * s1a)) -le $((s0 + s0 / 20)) ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: ZeRO-1 state per rank $s1a/$s1b is not half of ZeRO-0's $s0"; FAILS=$((FAILS + 1)); }

# 3 ranks x accum 1 vs --accum 3 (uneven shards); 2 ranks x accum 2 vs --accum 4
expect 0 "single --accum 3" -- "$TIDE" train "${RUN[@]}" --steps 4 --accum 3 --out "$TMP/one3"
cp "$TMP/out" "$TMP/one3.json"
expect 0 "3 ranks" -- "${MPI[@]}" 3 "$TIDE" train "${RUN[@]}" --steps 4 --out "$TMP/r3"
cp "$TMP/out" "$TMP/r3.json"
cmp_steps "3 ranks vs --accum 3" "$TMP/r3.json" "$TMP/one3.json"
cmp_params "3 ranks final parameters vs --accum 3" "$TMP/r3" "$TMP/one3"
s3=$(field "$TMP/r3.json" state_bytes_this_rank 2)
[ -n "$s3" ] && [ $((3 * s3)) -ge "$s0" ] && [ $((3 * s3)) -le $((s0 + s0 / 10)) ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: 3 ranks' state per rank $s3 is not a third of $s0"; FAILS=$((FAILS + 1)); }
expect 0 "single --accum 4" -- "$TIDE" train "${RUN[@]}" --steps 3 --accum 4 --out "$TMP/one4"
cp "$TMP/out" "$TMP/one4.json"
expect 0 "2 ranks x accum 2" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 3 --accum 2 --out "$TMP/r22"
cp "$TMP/out" "$TMP/r22.json"
cmp_steps "2 ranks x accum 2 vs --accum 4" "$TMP/r22.json" "$TMP/one4.json"
cmp_params "2 ranks x accum 2 final parameters vs --accum 4" "$TMP/r22" "$TMP/one4"
# bf16: the sharded f32 masters
expect 0 "bf16 single" -- "$TIDE" train "${RUNB[@]}" --steps 4 --accum 2 --save-dtype f32 --out "$TMP/b1"
cp "$TMP/out" "$TMP/b1.json"
expect 0 "bf16 2 ranks" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 4 --save-dtype f32 --out "$TMP/b2"
cp "$TMP/out" "$TMP/b2.json"
cmp_steps "bf16 2 ranks vs --accum 2" "$TMP/b2.json" "$TMP/b1.json"
cmp_params "bf16 2 ranks master weights vs --accum 2" "$TMP/b2" "$TMP/b1"

# offloaded ranks, bit for bit against the same ranks unconstrained
expect 0 "2 ranks offloaded --check" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 3 --budget 25% --check
[ "$(grep -c '"check_passed":true' "$TMP/out")" = 2 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: offloaded ranks differ from the unconstrained ranks"; grep summary "$TMP/out"; FAILS=$((FAILS + 1)); }
mkdir -p "$TMP/ssd"
expect 0 "2 ranks, state on SSD, --check" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 3 --budget 25% \
    --host-budget 64K --ssd "$TMP/ssd" --check
[ "$(grep -c '"check_passed":true' "$TMP/out")" = 2 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: ranks with state on SSD differ from the unconstrained ranks"; FAILS=$((FAILS + 1)); }

# LoRA over ranks: the adapters' gradients reduced, the frozen base without
# collectives; 2 ranks x accum 1 = one process's --accum 2 (losses, norms,
# the saved adapter and its optimizer state), ZeRO 0, 1 and 2; offloaded
# ranks bit for bit the same ranks unconstrained
LORA=(--lora-r 4 --lora-alpha 8)
expect 0 "LoRA single --accum 2" -- "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 3 --accum 2 --out "$TMP/lo1" \
    --merge-out "$TMP/lom1"
cp "$TMP/out" "$TMP/lo1.json"
for z in 0 1 2; do
    mo=()
    [ $z = 1 ] && mo=(--merge-out "$TMP/lom2")
    expect 0 "LoRA 2 ranks ZeRO-$z" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 3 --zero $z \
        --out "$TMP/lo2z$z" "${mo[@]}"
    cp "$TMP/out" "$TMP/lo2z$z.json"
    cmp_steps "LoRA 2 ranks ZeRO-$z vs --accum 2" "$TMP/lo2z$z.json" "$TMP/lo1.json"
    cmp_params "LoRA 2 ranks ZeRO-$z adapter vs --accum 2" "$TMP/lo2z$z" "$TMP/lo1" adapter_model.safetensors
    cmp_params "LoRA 2 ranks ZeRO-$z optimizer state vs --accum 2" "$TMP/lo2z$z" "$TMP/lo1" optimizer.safetensors
    expect 0 "LoRA 2 ranks ZeRO-$z: PEFT's config as one process writes it" -- \
        cmp "$TMP/lo2z$z/adapter_config.json" "$TMP/lo1/adapter_config.json"
    [ ! -e "$TMP/lo2z$z/model.safetensors" ] && PASSES=$((PASSES + 1)) ||
        { echo "FAIL: LoRA ranks wrote a full checkpoint"; FAILS=$((FAILS + 1)); }
done
cmp_params "LoRA 2 ranks --merge-out (rank 0's) vs --accum 2" "$TMP/lom2" "$TMP/lom1"
# ZeRO-0's all-reduce over 2 ranks (a ring) sends each rank the adapters'
# bytes once a step: nothing of the base
ab=$(python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
print(sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in json.loads(b[8:8 + n]).items() if k != "__metadata__"))' \
    "$TMP/lo1/adapter_model.safetensors")
nb=$(field "$TMP/lo2z0.json" net_bytes_per_step 0)
echo "LoRA: adapters $ab bytes, ZeRO-0 sends $nb bytes a step per rank"
[ -n "$ab" ] && [ "$nb" = "$ab" ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: LoRA ranks send $nb bytes a step, the adapters are $ab"; FAILS=$((FAILS + 1)); }
# QLoRA: a quantized frozen base
expect 0 "QLoRA single --accum 2" -- "$TIDE" train "${RUN[@]}" "${LORA[@]}" --base-type q8_0 --steps 2 --accum 2
cp "$TMP/out" "$TMP/qlo1.json"
expect 0 "QLoRA 2 ranks" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" --base-type q8_0 --steps 2
cmp_steps "QLoRA 2 ranks vs --accum 2" "$TMP/out" "$TMP/qlo1.json"
expect 0 "LoRA 2 ranks ZeRO-2 x accum 2 offloaded --check" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" \
    --steps 2 --accum 2 --zero 2 --budget 25% --check
[ "$(grep -c '"check_passed":true' "$TMP/out")" = 2 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: offloaded LoRA ranks differ from the unconstrained ranks"; FAILS=$((FAILS + 1)); }

# validation over ranks: each rank evaluates its micro-batches of every
# validation batch, the losses and target counts all-reduced; every rank
# reports one process's validation loss (its --accum N*A): a token file
# with --eval, and 3 ranks on a .jsonl's --eval-split (ranks with nothing
# but padding rows in some batches)
expect 0 "validation single --accum 2" -- "$TIDE" train "${RUN[@]}" --steps 4 --accum 2 --eval "$FX/data.u16" \
    --eval-every 2
cp "$TMP/out" "$TMP/ev1.json"
expect 0 "validation 2 ranks" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 4 --eval "$FX/data.u16" \
    --eval-every 2
cp "$TMP/out" "$TMP/ev2.json"
cmp_evals() { train_compare "$1" eval "$2" "$3" "$4"; } # DESCRIPTION A B RANKS
cmp_evals "2 ranks' validation vs --accum 2" "$TMP/ev2.json" "$TMP/ev1.json" 2
cmp_steps "2 ranks validating: the steps of --accum 2" "$TMP/ev2.json" "$TMP/ev1.json"
[ "$(grep -c '"eval":true' "$TMP/ev2.json")" = 4 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: 2 ranks x 2 validations: $(grep -c '"eval":true' "$TMP/ev2.json") lines"; FAILS=$((FAILS + 1)); }
for r in 0 1; do
    [ "$(field "$TMP/ev2.json" eval_loss $r)" = "$(field "$TMP/ev2.json" eval_loss 0)" ] &&
        [ -n "$(field "$TMP/ev2.json" eval_loss $r)" ] && PASSES=$((PASSES + 1)) ||
        { echo "FAIL: rank $r's summary lacks rank 0's eval_loss"; FAILS=$((FAILS + 1)); }
done
expect 0 "validation 2 ranks, text" -- "${MPI[@]}" 2 "$TIDE" train --model "$FX" --data "$FX/data.u16" \
    --batch 2 --seq 16 --threads 1 --steps 2 --eval "$FX/data.u16"
[ "$(grep -c "final validation loss" "$TMP/out")" = 1 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: the text output's validation is not rank 0's alone"; FAILS=$((FAILS + 1)); }
DS=$TIDE_FIXTURES/dataset
DRUN=(--model "$DS/model" --data "$DS/pc.jsonl" --batch 2 --seq 48 --threads 1 --quiet --json --steps 2 --eval-split 0.34)
expect 0 "validation split single --accum 3" -- "$TIDE" train "${DRUN[@]}" --accum 3
cp "$TMP/out" "$TMP/evs1.json"
expect 0 "validation split 3 ranks" -- "${MPI[@]}" 3 "$TIDE" train "${DRUN[@]}"
cmp_evals "3 ranks' --eval-split validation vs --accum 3" "$TMP/out" "$TMP/evs1.json" 3

# resume: bit for bit the run that never stopped
expect 0 "2 ranks, 2 steps" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 2 --out "$TMP/half"
expect 0 "2 ranks resumed to 4" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 4 --resume "$TMP/half" \
    --out "$TMP/resumed"
expect 0 "2 ranks, 4 steps" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 4 --out "$TMP/whole"
for f in model.safetensors optimizer.safetensors; do
    expect 0 "resumed $f bit for bit" -- cmp "$TMP/resumed/$f" "$TMP/whole/$f"
done
# one process with --accum 2 (the same N*A) continues it: the checkpoint is whole
expect 0 "one process resumes a 2-rank state" -- "$TIDE" train "${RUNB[@]}" --steps 4 --accum 2 --resume "$TMP/half"
contains "$TMP/out" '"step":3' "the resumed process runs steps 3 and 4"
expect 0 "3 ranks resuming a 2-rank state fail" -- fails "${MPI[@]}" 3 "$TIDE" train "${RUNB[@]}" --steps 4 \
    --resume "$TMP/half" --out "$TMP/r3x"
contains "$TMP/err" "accum" "another number of micro-batches is named"
[ ! -e "$TMP/r3x" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused resume wrote"; FAILS=$((FAILS + 1)); }

# bf16 (--precision bf16): a micro-batch's gradients are the same numbers on
# a rank as in one process (the loss scaled over the whole step's rows on
# both), so 3 ranks ZeRO-2 train one process's --accum 3 within f32
# summation order, bf16's roundings the same
expect 0 "bf16 single --accum 3" -- "$TIDE" train "${RUN[@]}" --precision bf16 --steps 4 --accum 3 --out "$TMP/bf1"
cp "$TMP/out" "$TMP/bf1.json"
expect 0 "bf16 3 ranks ZeRO-2" -- "${MPI[@]}" 3 "$TIDE" train "${RUN[@]}" --precision bf16 --steps 4 --zero 2 \
    --out "$TMP/bf3"
cmp_steps "bf16 3 ranks ZeRO-2 vs --accum 3" "$TMP/out" "$TMP/bf1.json"
cmp_params "bf16 3 ranks ZeRO-2 final parameters vs --accum 3" "$TMP/bf3" "$TMP/bf1"

# LoRA resume over ranks (ZeRO-1: each rank resumes its shard of the
# adapters' moments from the whole state rank 0 wrote): bit for bit the run
# that never stopped
expect 0 "LoRA 2 ranks, 2 steps" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 2 --zero 1 \
    --out "$TMP/lohalf"
expect 0 "LoRA 2 ranks resumed to 4" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 4 --zero 1 \
    --resume "$TMP/lohalf" --out "$TMP/loresumed"
grep '"step":3,' "$TMP/out" | sed 's/"tokens_per_s.*//' >"$TMP/lor.json"
expect 0 "LoRA 2 ranks, 4 steps" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" "${LORA[@]}" --steps 4 --zero 1 \
    --out "$TMP/lowhole"
grep '"step":3,' "$TMP/out" | sed 's/"tokens_per_s.*//' >"$TMP/low.json"
[ -s "$TMP/low.json" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: no last LoRA step line"; FAILS=$((FAILS + 1)); }
expect 0 "LoRA ranks' resumed last step equals the uninterrupted one" -- cmp "$TMP/lor.json" "$TMP/low.json"
for f in adapter_model.safetensors optimizer.safetensors; do
    expect 0 "LoRA ranks resumed $f bit for bit" -- cmp "$TMP/loresumed/$f" "$TMP/lowhole/$f"
done

# ZeRO-2 over micro-batches: each one's gradients reduce-scattered into the
# shard; the steps of ZeRO-1's ranks and of one process's N*A; offloaded,
# bit for bit the same ranks unconstrained
expect 0 "2 ranks ZeRO-2 x accum 2" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 3 --accum 2 --zero 2 \
    --out "$TMP/r22z2"
cp "$TMP/out" "$TMP/r22z2.json"
cmp_steps "2 ranks ZeRO-2 x accum 2 vs --accum 4" "$TMP/r22z2.json" "$TMP/one4.json"
cmp_steps "2 ranks ZeRO-2 x accum 2 vs ZeRO-1" "$TMP/r22z2.json" "$TMP/r22.json"
cmp_params "2 ranks ZeRO-2 x accum 2 final parameters vs --accum 4" "$TMP/r22z2" "$TMP/one4"
expect 0 "single --accum 6" -- "$TIDE" train "${RUN[@]}" --steps 2 --accum 6 --out "$TMP/one6"
cp "$TMP/out" "$TMP/one6.json"
expect 0 "3 ranks ZeRO-2 x accum 2" -- "${MPI[@]}" 3 "$TIDE" train "${RUN[@]}" --steps 2 --accum 2 --zero 2 \
    --out "$TMP/r32z2"
cp "$TMP/out" "$TMP/r32z2.json"
cmp_steps "3 ranks ZeRO-2 x accum 2 vs --accum 6" "$TMP/r32z2.json" "$TMP/one6.json"
cmp_params "3 ranks ZeRO-2 x accum 2 final parameters vs --accum 6" "$TMP/r32z2" "$TMP/one6"
expect 0 "2 ranks ZeRO-2 x accum 2 offloaded --check" -- "${MPI[@]}" 2 "$TIDE" train "${RUN[@]}" --steps 2 \
    --accum 2 --zero 2 --budget 25% --check
[ "$(grep -c '"check_passed":true' "$TMP/out")" = 2 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: offloaded ZeRO-2 ranks over micro-batches differ from unconstrained"; FAILS=$((FAILS + 1)); }
rm -rf "$TMP/ssd" && mkdir -p "$TMP/ssd"
expect 0 "2 ranks ZeRO-2 x accum 2, state on SSD, --check" -- "${MPI[@]}" 2 "$TIDE" train "${RUNB[@]}" --steps 2 \
    --accum 2 --zero 2 --budget 25% --host-budget 64K --ssd "$TMP/ssd" --check
[ "$(grep -c '"check_passed":true' "$TMP/out")" = 2 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: ZeRO-2 ranks over micro-batches with state on SSD differ"; FAILS=$((FAILS + 1)); }

# a rank killed mid-step: the job ends, naming it (timeout: a hang's guard)
cat >"$TMP/kill1.sh" <<'SH'
#!/usr/bin/env bash
# rank 1 is killed (SIGKILL) two seconds in, while the ranks train
if [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then (sleep 2; kill -9 $$) & fi
exec "$@"
SH
chmod +x "$TMP/kill1.sh"
expect 0 "a rank killed ends the job" -- bash -c 'timeout 120 "$@"; rc=$?; [ $rc -ne 0 ] && [ $rc -ne 124 ]' _ \
    "${MPI[@]}" 2 "$TMP/kill1.sh" "$TIDE" train "${RUN[@]}" --steps 1000000
cat "$TMP/out" >>"$TMP/err"
contains "$TMP/err" "rank 1" "the killed rank is named"
# a rank that stops answering (SIGSTOP): the others' collective times out
# (TIDE_NET_TIMEOUT 2 s), names the collective and ends every rank
sed 's/kill -9/kill -STOP/' "$TMP/kill1.sh" >"$TMP/stop1.sh"
chmod +x "$TMP/stop1.sh"
expect 0 "a stuck rank ends the job" -- bash -c 'timeout 120 "$@"; rc=$?; [ $rc -ne 0 ] && [ $rc -ne 124 ]' _ \
    "${MPI[@]}" 2 -x TIDE_NET_TIMEOUT=2 "$TMP/stop1.sh" "$TIDE" train "${RUN[@]}" --steps 1000000
contains "$TMP/err" "timed out after" "the collective's timeout is reported"
contains "$TMP/err" "ending every rank" "the failed rank ends the others"
finish
