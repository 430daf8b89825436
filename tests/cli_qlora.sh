#!/usr/bin/env bash
# cli_qlora.sh - `tide train --lora-r` on a quantized base (QLoRA) end to
# end, and `tide plan --train --lora-r --base-type`.
#
# What it proves: a GGUF Q8_0 file `tide quantize` makes of the
# train-f32-gqa fixture trains LoRA adapters (the loss falls over the steps)
# and writes a PEFT adapter with the 28 PEFT names; offloaded at the minimum
# budget with --check every QLoRA step is bit-identical to the unconstrained
# run, on the GGUF base and with --base-type q8_0 on the safetensors base;
# the minimum of --base-type q8_0 is below LoRA's on the bf16 base; a QLoRA
# run resumed with its --base-type is the uninterrupted one byte for byte (the
# state records the base type, and a resume on another base is refused); bad input
# is refused with exit 1, a message naming the cause, and no --out written:
# an unknown --base-type, --base-type without --lora-r, a type whose blocks
# the rows cannot hold (q4_k's 256 on rows of 64), --base-type on a GGUF
# base; `tide plan --train --lora-r 16 --base-type q4_k` of llama-7b's shapes (4 layers) has
# weights a third or less of the bf16 LoRA plan's, and a smaller minimum.
# (The numbers against the f32 path on the dequantized base are
# tests/test_qlora.c's; offloading bit for bit over every policy is
# tests/test_train.c's test_lora_offload_bit_identical.)
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
BF=$TIDE_FIXTURES/train/train-bf16-gqa
DATA=$FX/data.u16
RUN=(--data "$DATA" --batch 2 --seq 16 --quiet)

expect 0 "help" -- "$TIDE" train --help
contains "$TMP/out" "--base-type" "train help lists --base-type"
expect 0 "plan help" -- "$TIDE" plan --help
contains "$TMP/out" "--base-type" "plan help lists --base-type"

# a GGUF Q8_0 base
expect 0 "quantize" -- "$TIDE" quantize --type q8_0 "$FX" "$TMP/base.gguf"
expect 0 "qlora on gguf" -- "$TIDE" train --model "$TMP/base.gguf" "${RUN[@]}" --steps 6 --lora-r 4 --lr 1e-2 \
    --json --out "$TMP/ad"
first=$(grep -o '"loss":[0-9.e+-]*' "$TMP/out" | head -1 | cut -d: -f2)
last=$(grep -o '"loss":[0-9.e+-]*' "$TMP/out" | sed -n 6p | cut -d: -f2)
echo "QLoRA on the GGUF Q8_0 base: loss $first -> $last over 6 steps"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 0 && b > 0 && b < a) }' && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: the loss did not fall ($first -> $last)"; FAILS=$((FAILS + 1)); }
names() { grep -ao '"base_model[^"]*\.weight"' "$1" | tr -d '"' | sort -u; }
[ "$(names "$TMP/ad/adapter_model.safetensors" | wc -l)" -eq 28 ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: the adapter has not PEFT's 28 names"; FAILS=$((FAILS + 1)); }
contains "$TMP/ad/adapter_config.json" '"LORA"' "adapter_config.json"

# offloaded, bit for bit
expect 0 "qlora gguf --check" -- "$TIDE" train --model "$TMP/base.gguf" "${RUN[@]}" --steps 3 --lora-r 4 \
    --budget min --hw a100-80g --check --json
contains "$TMP/out" '"check_passed":true' "GGUF QLoRA at the minimum budget is bit-identical"
# (the minima compared in f32: on this tiny model a bf16 step's minimum is
# the fixed workspaces', not the weights'; tide plan shows llama-7b's)
expect 0 "qlora base-type --check" -- "$TIDE" train --model "$BF" "${RUN[@]}" --steps 3 --lora-r 4 \
    --base-type q8_0 --budget min --hw a100-80g --check --json --no-refit --precision f32
contains "$TMP/out" '"check_passed":true' "--base-type q8_0 at the minimum budget is bit-identical"
q_min=$(grep -o '"budget_bytes":[0-9]*' "$TMP/out" | tail -1 | cut -d: -f2)
expect 0 "lora bf16 at min" -- "$TIDE" train --model "$BF" "${RUN[@]}" --steps 1 --lora-r 4 --budget min --hw a100-80g --json \
    --no-refit --precision f32
l_min=$(grep -o '"budget_bytes":[0-9]*' "$TMP/out" | tail -1 | cut -d: -f2)
echo "minimum budget: QLoRA (q8_0) $q_min bytes, LoRA on the bf16 base $l_min"
[ -n "$q_min" ] && [ -n "$l_min" ] && [ "$q_min" -lt "$l_min" ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: QLoRA's minimum $q_min is not below LoRA's $l_min"; FAILS=$((FAILS + 1)); }

# tide plan --train --lora-r --base-type
field() { grep -o "\"$1\":[0-9.e+]*" "$TMP/out" | tail -1 | cut -d: -f2; }
# the plans run on llama-7b's layer shapes cut to 4 layers with a 4096-token
# vocabulary (a config.json alone): the searches for the minimum plan many
# times, and a small vocabulary keeps the embeddings and head a small part of
# the weights, as in the 32-layer model
L7B4=$TMP/llama-7b-4l
llama7b_config "$L7B4" 4096
expect 0 "plan lora" -- "$TIDE" plan --model "$L7B4" --train --batch 1 --seq 512 --budget min --json --lora-r 16
l_w=$(field weight_bytes) l_min=$(field budget_bytes)
expect 0 "plan qlora" -- "$TIDE" plan --model "$L7B4" --train --batch 1 --seq 512 --budget min --json --lora-r 16 \
    --base-type q4_k
q_w=$(field weight_bytes) q_min=$(field budget_bytes)
echo "llama-7b (4 layers) plan --budget min: LoRA weights $l_w bytes, minimum $l_min; QLoRA q4_k weights $q_w, minimum $q_min"
[ -n "$q_w" ] && [ -n "$l_w" ] && [ "$((q_w * 3))" -le "$l_w" ] && [ "$q_min" -lt "$l_min" ] &&
    PASSES=$((PASSES + 1)) || { echo "FAIL: QLoRA plan: weights $q_w vs $l_w, minimum $q_min vs $l_min"; FAILS=$((FAILS + 1)); }
expect 2 "plan --base-type without --lora-r" -- "$TIDE" plan --config llama-7b --train --budget min --base-type q4_k
expect 1 "plan unknown --base-type" -- "$TIDE" plan --config llama-7b --train --budget min --lora-r 16 \
    --base-type q9
contains "$TMP/err" "'q9'" "plan unknown --base-type: message names it"

# bad input: exit 1, a message, nothing written
expect 1 "unknown --base-type" -- "$TIDE" train --model "$FX" "${RUN[@]}" --lora-r 4 --base-type q3_k --out "$TMP/bad"
contains "$TMP/err" "'q3_k'" "unknown --base-type: message names it"
# ---- QLoRA resume: the state records the base type; a resumed run with the
# same --base-type is the uninterrupted one bit for bit, another is refused
QR=(--model "$FX" "${RUN[@]}" --lora-r 4 --lr 1e-2 --shuffle 5)
expect 0 "qlora 4 steps" -- "$TIDE" train "${QR[@]}" --base-type q8_0 --steps 4 --out "$TMP/q4"
expect 0 "qlora 2 steps" -- "$TIDE" train "${QR[@]}" --base-type q8_0 --steps 2 --out "$TMP/q2"
expect 0 "qlora resumed to 4" -- "$TIDE" train --model "$FX" "${RUN[@]}" --lr 1e-2 --shuffle 5 \
    --base-type q8_0 --steps 4 --resume "$TMP/q2" --out "$TMP/q4r"
for f in adapter_model.safetensors optimizer.safetensors; do
    cmp -s "$TMP/q4/$f" "$TMP/q4r/$f" && PASSES=$((PASSES + 1)) || { echo "FAIL: resumed QLoRA $f differs"; FAILS=$((FAILS + 1)); }
done
expect 1 "qlora resumed without --base-type" -- "$TIDE" train --model "$FX" "${RUN[@]}" --lr 1e-2 --shuffle 5 \
    --steps 4 --resume "$TMP/q2" --out "$TMP/bad"
contains "$TMP/err" "quantized to q8_0" "resume on another base: message names the state's base type"

expect 1 "--base-type without --lora-r" -- "$TIDE" train --model "$FX" "${RUN[@]}" --base-type q8_0 --out "$TMP/bad"
contains "$TMP/err" "needs LoRA" "--base-type without --lora-r: message"
expect 1 "rows not whole blocks" -- "$TIDE" train --model "$FX" "${RUN[@]}" --lora-r 4 --base-type q4_k \
    --out "$TMP/bad"
contains "$TMP/err" "rows of 64" "rows not whole blocks: message names the row length"
contains "$TMP/err" "q_proj" "rows not whole blocks: message names the weight"
expect 1 "--base-type on a GGUF base" -- "$TIDE" train --model "$TMP/base.gguf" "${RUN[@]}" --lora-r 4 \
    --base-type q4_0 --out "$TMP/bad"
contains "$TMP/err" "quantized already" "--base-type on GGUF: message"
expect 1 "full fine-tune of a GGUF base" -- "$TIDE" train --model "$TMP/base.gguf" "${RUN[@]}" --out "$TMP/bad"
[ ! -e "$TMP/bad" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused run wrote --out"; FAILS=$((FAILS + 1)); }
finish
