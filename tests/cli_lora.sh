#!/usr/bin/env bash
# cli_lora.sh - `tide train --lora-r` end to end: the adapter written in
# PEFT's format (the names and config fields PEFT's loader reads), offloaded
# LoRA steps checked bit for bit against the unconstrained run, a minimum
# budget below full fine-tuning's, --lora-init from the written adapter, and
# bad LoRA input (exit status, message, nothing written).
#
# What it proves: `tide train --lora-r 4` on the train-f32-gqa fixture writes
# adapter_model.safetensors with exactly the 28 PEFT names
# (base_model.model.model.layers.N.{self_attn.{q,k,v,o}_proj,mlp.{gate,up,down}_proj}.lora_{A,B}.weight)
# and adapter_config.json with peft_type LORA, r, lora_alpha and
# target_modules; --lora-targets q,v writes 8; offloaded at --budget min with
# --check every step and every adapter and moment is bit-identical, and that
# minimum is below full fine-tuning's minimum of the same step; --lora-init
# from the written adapter starts where it ended; r <= 0, an unknown target,
# --lora-alpha without a rank and a missing or malformed --lora-init are
# refused with a message and no --out written (a quantized base is QLoRA:
# tests/cli_qlora.sh);
# `tide plan --train --lora-r 16` of llama-7b has no masters, the adapters'
# moments alone (320 MB) and a minimum budget below full fine-tuning's.
# (The numbers against PyTorch + PEFT are test_train's test_torch_lora; that
# PEFT itself loads the output is scripts/make_lora_fixture.py --check.)
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
DATA=$FX/data.u16
RUN=(--model "$FX" --data "$DATA" --batch 2 --seq 16 --quiet)

expect 0 "help" -- "$TIDE" train --help
for o in --lora-r --lora-alpha --lora-targets --lora-init; do contains "$TMP/out" "$o" "train help lists $o"; done

# the adapter in PEFT's format
expect 0 "lora train" -- "$TIDE" train "${RUN[@]}" --steps 3 --lora-r 4 --lora-alpha 8 --out "$TMP/ad"
for f in adapter_model.safetensors adapter_config.json; do
    [ -s "$TMP/ad/$f" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: no $f"; FAILS=$((FAILS + 1)); }
done
[ ! -e "$TMP/ad/model.safetensors" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a full checkpoint written"; FAILS=$((FAILS + 1)); }
# the tensor names of a safetensors file (its header is JSON text)
names() { grep -ao '"base_model[^"]*\.weight"' "$1" | tr -d '"' | sort -u; }
names "$TMP/ad/adapter_model.safetensors" >"$TMP/names"
: >"$TMP/want"
for L in 0 1; do
    for m in self_attn.q_proj self_attn.k_proj self_attn.v_proj self_attn.o_proj mlp.gate_proj mlp.up_proj mlp.down_proj; do
        for ab in A B; do echo "base_model.model.model.layers.$L.$m.lora_$ab.weight" >>"$TMP/want"; done
    done
done
sort -o "$TMP/want" "$TMP/want"
expect 0 "PEFT's 28 adapter names" -- cmp "$TMP/want" "$TMP/names"
for k in '"peft_type":' '"LORA"' '"r":' '"lora_alpha":' '"target_modules":' '"q_proj"' '"down_proj"'; do
    contains "$TMP/ad/adapter_config.json" "$k" "adapter_config.json has $k"
done
expect 0 "lora targets q,v" -- "$TIDE" train "${RUN[@]}" --steps 1 --lora-r 2 --lora-targets q,v --out "$TMP/qv"
names "$TMP/qv/adapter_model.safetensors" >"$TMP/names"
[ "$(wc -l <"$TMP/names")" -eq 8 ] && PASSES=$((PASSES + 1)) || { echo "FAIL: q,v: $(wc -l <"$TMP/names") adapters"; FAILS=$((FAILS + 1)); }
contains "$TMP/qv/adapter_config.json" '"v_proj"' "q,v config"

# offloaded, bit for bit; a smaller minimum than full fine-tuning's
expect 0 "lora offloaded --check" -- "$TIDE" train "${RUN[@]}" --steps 3 --lora-r 4 --budget min --check --json
contains "$TMP/out" '"check_passed":true' "LoRA at the minimum budget is bit-identical"
lora_min=$(grep -o '"budget_bytes":[0-9]*' "$TMP/out" | tail -1 | cut -d: -f2)
expect 0 "full fine-tune at min" -- "$TIDE" train "${RUN[@]}" --steps 1 --budget min --json --no-refit
full_min=$(grep -o '"budget_bytes":[0-9]*' "$TMP/out" | tail -1 | cut -d: -f2)
echo "minimum budget: LoRA r 4 $lora_min bytes, full fine-tuning $full_min"
[ -n "$lora_min" ] && [ -n "$full_min" ] && [ "$lora_min" -lt "$full_min" ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: LoRA's minimum $lora_min is not below full fine-tuning's $full_min"; FAILS=$((FAILS + 1)); }

# --lora-init from the written adapter: r, alpha and targets from its config
expect 0 "lora-init" -- "$TIDE" train "${RUN[@]}" --steps 1 --lora-init "$TMP/ad" --out "$TMP/ad2"
expect 0 "lora-init keeps the targets" -- cmp <(names "$TMP/ad/adapter_model.safetensors") \
    <(names "$TMP/ad2/adapter_model.safetensors")

# tide plan --train --lora-r: no masters, a smaller state and minimum than full fine-tuning's
field() { grep -o "\"$1\":[0-9.e+]*" "$TMP/out" | tail -1 | cut -d: -f2; }
expect 0 "plan full" -- "$TIDE" plan --config llama-7b --train --batch 1 --seq 512 --budget min --json
full_min=$(field budget_bytes) full_mom=$(field moment_bytes)
expect 0 "plan lora" -- "$TIDE" plan --config llama-7b --train --batch 1 --seq 512 --budget min --json --lora-r 16
lora_min=$(field budget_bytes) lora_mom=$(field moment_bytes) lora_master=$(field master_bytes)
echo "llama-7b plan --budget min: full $full_min bytes (moments $full_mom), LoRA r 16 $lora_min (moments $lora_mom)"
# r 16 on every projection of 32 layers: 16 x (4 x 2 x 4096 + 3 x (4096 + 11008)) x 32 x 4 bytes x 2 moments
[ "$lora_master" = 0 ] && [ "$lora_mom" = 319815680 ] && [ "$lora_min" -lt "$full_min" ] && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: LoRA plan: masters $lora_master, moments $lora_mom, minimum $lora_min vs $full_min"; FAILS=$((FAILS + 1)); }
expect 2 "plan --lora-r without --train" -- "$TIDE" plan --config llama-7b --budget min --lora-r 16
expect 2 "plan bad target" -- "$TIDE" plan --config llama-7b --train --budget min --lora-r 16 --lora-targets z

# bad input: exit status, message, nothing written
expect 2 "r 0" -- "$TIDE" train "${RUN[@]}" --lora-r 0 --out "$TMP/bad"
contains "$TMP/err" "--lora-r" "r 0: message"
expect 2 "r -1" -- "$TIDE" train "${RUN[@]}" --lora-r -1 --out "$TMP/bad"
expect 2 "unknown target" -- "$TIDE" train "${RUN[@]}" --lora-r 4 --lora-targets q,x --out "$TMP/bad"
contains "$TMP/err" "'x'" "unknown target: message names it"
expect 2 "alpha without r" -- "$TIDE" train "${RUN[@]}" --lora-alpha 8 --out "$TMP/bad"
expect 1 "lora-init missing" -- "$TIDE" train "${RUN[@]}" --lora-init "$TMP/none" --out "$TMP/bad"
contains "$TMP/err" "adapter_config.json" "missing: message names the file"
mkdir -p "$TMP/mal"
echo '{"peft_type": "LORA", "r": 0, "lora_alpha": 8, "target_modules": ["q_proj"]}' >"$TMP/mal/adapter_config.json"
expect 1 "lora-init r 0" -- "$TIDE" train "${RUN[@]}" --lora-init "$TMP/mal" --out "$TMP/bad"
contains "$TMP/err" "r must be a positive integer" "malformed: message names r"
echo '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["mlp"]}' >"$TMP/mal/adapter_config.json"
expect 1 "lora-init unknown module" -- "$TIDE" train "${RUN[@]}" --lora-init "$TMP/mal" --out "$TMP/bad"
contains "$TMP/err" "'mlp'" "malformed: message names the module"
echo '{"peft_type": "LORA", "r": 4,' >"$TMP/mal/adapter_config.json"
expect 1 "lora-init not JSON" -- "$TIDE" train "${RUN[@]}" --lora-init "$TMP/mal" --out "$TMP/bad"
echo '{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}' >"$TMP/mal/adapter_config.json"
expect 1 "lora-init without weights" -- "$TIDE" train "${RUN[@]}" --lora-init "$TMP/mal" --out "$TMP/bad"
contains "$TMP/err" "adapter_model.safetensors" "no weights: message names the file"
expect 2 "lora with --resume" -- "$TIDE" train "${RUN[@]}" --lora-r 4 --resume "$TMP/ad"
[ ! -e "$TMP/bad" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused run wrote --out"; FAILS=$((FAILS + 1)); }
finish
