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
# --lora-alpha without a rank, a missing or malformed --lora-init and
# --resume of a full checkpoint with --lora-r are refused with a message and
# no --out written (a quantized base is QLoRA: tests/cli_qlora.sh);
# `tide plan --train --lora-r 16` of llama-7b's shapes (4 layers) has no masters, the adapters'
# moments alone (40 MB) and a minimum budget below full fine-tuning's.
# `tide run --lora` of the fixture's adapter gives PEFT's greedy ids, the
# same ids and logits offloaded at 25% with the weights on SSD (--check bit
# for bit), other logits than the base alone; `plan --lora` plans; a missing
# adapter, missing weights, shapes of another r and an unknown target exit 1
# naming the cause (run and chat), `serve --lora` for a model not given exits
# 2; on a q8_0 GGUF of the base an adapter without q_proj / k_proj runs
# offloaded and checked bit for bit and changes the logits, one with q_proj
# is refused (rotary order). LoRA resume: --save-every / --out write
# adapter_model.safetensors, adapter_config.json, optimizer.safetensors and
# config.json (no temporary left); a run resumed from step 2 to 4 prints the
# uninterrupted run's last step and writes the same adapter and optimizer
# files byte for byte, and offloaded at the minimum (with --check) the
# adapter of the uninterrupted run at that budget; another alpha,
# no --model, another batch are refused. --merge-out writes config.json and
# model.safetensors (no adapter) that tide run loads, with the adapter's
# run-time ids; an existing --merge-out, one without --out or without LoRA
# are refused and write nothing. `tide serve --model a=M --model b=M --lora
# a=ADAPTER` answers a's completion with tide run --lora's text and b's with
# the base's (which differ).
# (The numbers against PyTorch + PEFT are test_train's test_torch_lora; that
# PEFT itself loads the output is scripts/make_lora_fixture.py --check.)
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-f32-gqa
DATA=$FX/data.u16
RUN=(--model "$FX" --data "$DATA" --batch 2 --seq 16 --quiet)
AD=$TIDE_FIXTURES/train/lora-f32-gqa/adapter_init
PROMPT=1,17,42,99,5,63,120,8,77,31,2,54

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
expect 0 "lora offloaded --check" -- "$TIDE" train "${RUN[@]}" --steps 3 --lora-r 4 --budget min --hw a100-80g --check --json
contains "$TMP/out" '"check_passed":true' "LoRA at the minimum budget is bit-identical"
lora_min=$(grep -o '"budget_bytes":[0-9]*' "$TMP/out" | tail -1 | cut -d: -f2)
expect 0 "full fine-tune at min" -- "$TIDE" train "${RUN[@]}" --steps 1 --budget min --hw a100-80g --json --no-refit
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
# the plans run on llama-7b's layer shapes cut to 4 layers with a 4096-token
# vocabulary (a config.json alone): the searches for the minimum plan many
# times, and a small vocabulary keeps the embeddings and head a small part of
# the weights, as in the 32-layer model
L7B4=$TMP/llama-7b-4l
llama7b_config "$L7B4" 4096
expect 0 "plan full" -- "$TIDE" plan --model "$L7B4" --train --batch 1 --seq 512 --budget min --json
full_min=$(field budget_bytes) full_mom=$(field moment_bytes)
expect 0 "plan lora" -- "$TIDE" plan --model "$L7B4" --train --batch 1 --seq 512 --budget min --json --lora-r 16
lora_min=$(field budget_bytes) lora_mom=$(field moment_bytes) lora_master=$(field master_bytes)
echo "llama-7b (4 layers) plan --budget min: full $full_min bytes (moments $full_mom), LoRA r 16 $lora_min (moments $lora_mom)"
# r 16 on every projection of 4 layers: 16 x (4 x 2 x 4096 + 3 x (4096 + 11008)) x 4 x 4 bytes x 2 moments
[ "$lora_master" = 0 ] && [ "$lora_mom" = 39976960 ] && [ "$lora_min" -lt "$full_min" ] && PASSES=$((PASSES + 1)) ||
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
expect 2 "lora --resume of a full checkpoint" -- "$TIDE" train "${RUN[@]}" --lora-r 4 --resume "$FX"
contains "$TMP/err" "no LoRA state" "resume of a full checkpoint with --lora-r: message"
[ ! -e "$TMP/bad" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused run wrote --out"; FAILS=$((FAILS + 1)); }

# ---- LoRA resume: --out and --save-every write the adapter with its state
# (moments, step); a resumed run is the uninterrupted one bit for bit
expect 0 "lora 4 steps, saving every 2" -- "$TIDE" train "${RUN[@]}" --steps 4 --lora-r 4 --lr 1e-2 --shuffle 5 \
    --out "$TMP/lr4" --save-every 2 --json
grep '"step":3,' "$TMP/out" >"$TMP/whole.json"
for f in adapter_model.safetensors adapter_config.json optimizer.safetensors config.json; do
    [ -s "$TMP/lr4/$f" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: LoRA state has no $f"; FAILS=$((FAILS + 1)); }
done
[ -z "$(ls -d "$TMP"/lr4.tmp-* 2>/dev/null)" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a temporary left"; FAILS=$((FAILS + 1)); }
expect 0 "lora 2 steps" -- "$TIDE" train "${RUN[@]}" --steps 2 --lora-r 4 --lr 1e-2 --shuffle 5 --out "$TMP/lr2"
cp -r "$TMP/lr2" "$TMP/lr2-copy"
expect 0 "lora resume to 4 steps" -- "$TIDE" train "${RUN[@]}" --steps 4 --lr 1e-2 --shuffle 5 --resume "$TMP/lr2" \
    --out "$TMP/lr2" --json
grep '"step":3,' "$TMP/out" >"$TMP/resumed.json"
sed 's/"tokens_per_s.*//' "$TMP/whole.json" >"$TMP/a"; sed 's/"tokens_per_s.*//' "$TMP/resumed.json" >"$TMP/b"
[ -s "$TMP/a" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: no last step line"; FAILS=$((FAILS + 1)); }
expect 0 "resumed LoRA step equals the uninterrupted one" -- cmp "$TMP/a" "$TMP/b"
for f in adapter_model.safetensors optimizer.safetensors; do
    expect 0 "resumed LoRA $f equals the uninterrupted one" -- cmp "$TMP/lr4/$f" "$TMP/lr2/$f"
done
# offloaded at the minimum (row tiles and vocabulary blocks there, so both
# halves offloaded too: the same tiles in both runs)
M=(--budget min --hw a100-80g --no-refit)
expect 0 "lora 4 steps offloaded" -- "$TIDE" train "${RUN[@]}" --steps 4 --lora-r 4 --lr 1e-2 --shuffle 5 "${M[@]}" \
    --out "$TMP/lr4m"
expect 0 "lora 2 steps offloaded" -- "$TIDE" train "${RUN[@]}" --steps 2 --lora-r 4 --lr 1e-2 --shuffle 5 "${M[@]}" \
    --out "$TMP/lr2m"
expect 0 "lora resume offloaded at the minimum, checked" -- "$TIDE" train "${RUN[@]}" --steps 4 --lr 1e-2 --shuffle 5 \
    --resume "$TMP/lr2m" "${M[@]}" --check --json --out "$TMP/lr2c"
contains "$TMP/out" '"check_passed":true' "resumed LoRA offloaded: bit-identical"
expect 0 "resumed offloaded LoRA adapter equals the uninterrupted offloaded one" -- \
    cmp "$TMP/lr4m/adapter_model.safetensors" "$TMP/lr2c/adapter_model.safetensors"
# a save that fills the disk (the optimizer file is past 64 KiB): the earlier
# state stays whole, no temporary left
cp -r "$TMP/lr2m" "$TMP/lrfull"
(ulimit -f 64; trap '' XFSZ; "$TIDE" train "${RUN[@]}" --steps 1 --lora-r 4 --out "$TMP/lrfull" >"$TMP/out" 2>"$TMP/err"); rc=$?
[ "$rc" -eq 1 ] && PASSES=$((PASSES + 1)) || { echo "FAIL: LoRA save on a full disk: exit $rc"; FAILS=$((FAILS + 1)); }
for f in adapter_model.safetensors optimizer.safetensors adapter_config.json; do
    expect 0 "the earlier LoRA state's $f is intact" -- cmp "$TMP/lr2m/$f" "$TMP/lrfull/$f"
done
[ -z "$(ls -d "$TMP"/lrfull.tmp* 2>/dev/null)" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: temporary left"; FAILS=$((FAILS + 1)); }
expect 2 "lora resume with another alpha" -- "$TIDE" train "${RUN[@]}" --steps 4 --resume "$TMP/lr2-copy" --lora-alpha 16
expect 2 "lora resume without --model" -- "$TIDE" train --data "$DATA" --batch 2 --seq 16 --steps 4 --resume "$TMP/lr2-copy"
contains "$TMP/err" "needs --model" "lora resume without the base: message"
expect 1 "lora resume with another batch" -- "$TIDE" train --model "$FX" --data "$DATA" --batch 4 --seq 16 --steps 4 \
    --resume "$TMP/lr2-copy" --shuffle 5
expect 0 "tide run --lora on a saved LoRA state" -- "$TIDE" run --model "$FX" --lora "$TMP/lr4" --new-tokens 2 --backend cpu

# ---- --merge-out: the adapter merged into the base, loadable by tide run
# (against PEFT's merge_and_unload: test_lora's test_merged)
expect 0 "lora --merge-out" -- "$TIDE" train "${RUN[@]}" --steps 2 --lora-init "$AD" --lr 1e-2 --out "$TMP/mad" \
    --merge-out "$TMP/merged"
for f in config.json model.safetensors; do
    [ -s "$TMP/merged/$f" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: merged has no $f"; FAILS=$((FAILS + 1)); }
done
[ ! -e "$TMP/merged/adapter_model.safetensors" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: adapter in merged"; FAILS=$((FAILS + 1)); }
expect 0 "run the merged checkpoint" -- "$TIDE" run --model "$TMP/merged" --tokens $PROMPT --new-tokens 4 --json --quiet --backend cpu
grep -o '"tokens":\[[0-9,]*\]' "$TMP/out" >"$TMP/tm"
expect 0 "run the adapter" -- "$TIDE" run --model "$FX" --lora "$TMP/mad" --tokens $PROMPT --new-tokens 4 --json --quiet --backend cpu
grep -o '"tokens":\[[0-9,]*\]' "$TMP/out" >"$TMP/ta"
expect 0 "merged tokens equal the adapter's at run time" -- cmp "$TMP/tm" "$TMP/ta"
expect 1 "--merge-out exists" -- "$TIDE" train "${RUN[@]}" --steps 1 --lora-r 4 --out "$TMP/mad2" --merge-out "$TMP/merged"
contains "$TMP/err" "exists" "--merge-out onto an existing directory: message"
expect 2 "--merge-out without --out" -- "$TIDE" train "${RUN[@]}" --steps 1 --lora-r 4 --merge-out "$TMP/m3"
expect 2 "--merge-out without LoRA" -- "$TIDE" train "${RUN[@]}" --steps 1 --out "$TMP/m4" --merge-out "$TMP/m3"
[ ! -e "$TMP/m3" ] && [ ! -e "$TMP/mad2" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: a refused merge wrote"; FAILS=$((FAILS + 1)); }

# ---- tide run --lora: the fixture's adapter at run time (the logits against
# PEFT's are test_lora's); PEFT's greedy ids, offloaded and checked bit for bit
PEFT_GREEDY='[125,38,104,30]' # run_logits.safetensors "generated" (scripts/make_lora_fixture.py)
for c in run chat plan; do
    expect 0 "$c help" -- "$TIDE" $c --help
    contains "$TMP/out" "--lora" "$c help lists --lora"
done
hash_of() { grep -o '"logits_hash":"[0-9a-f]*"' "$TMP/out" | cut -d'"' -f4; }
expect 0 "run --lora" -- "$TIDE" run --model "$FX" --lora "$AD" --tokens $PROMPT --new-tokens 4 --json --quiet --backend cpu
contains "$TMP/out" "\"tokens\":$PEFT_GREEDY" "run --lora: PEFT's greedy ids"
lora_hash=$(hash_of)
expect 0 "run --lora offloaded --check" -- "$TIDE" run --model "$FX" --lora "$AD" --tokens $PROMPT --new-tokens 4 \
    --json --quiet --backend cpu --budget 25% --weights-on-ssd --ssd "$TMP" --check --hw a100-80g
contains "$TMP/out" '"check_bit_identical":true' "run --lora at 25%, weights on SSD: bit-identical"
contains "$TMP/out" "\"tokens\":$PEFT_GREEDY" "run --lora offloaded: PEFT's greedy ids"
[ "$(hash_of)" = "$lora_hash" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: offloaded logits differ"; FAILS=$((FAILS + 1)); }
expect 0 "run without the adapter" -- "$TIDE" run --model "$FX" --tokens $PROMPT --new-tokens 4 --json --quiet --backend cpu
[ "$(hash_of)" != "$lora_hash" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: --lora changed nothing"; FAILS=$((FAILS + 1)); }
expect 0 "plan --lora" -- "$TIDE" plan --model "$FX" --lora "$AD" --seq 16 --budget min --json
expect 0 "plan without" -- "$TIDE" plan --model "$FX" --seq 16 --budget min --json
expect 2 "plan --lora --train" -- "$TIDE" plan --model "$FX" --lora "$AD" --train --budget min

# bad adapters: exit 1, the cause named
mkdir -p "$TMP/badad"
expect 1 "run --lora missing dir" -- "$TIDE" run --model "$FX" --lora "$TMP/nowhere" --new-tokens 1 --backend cpu
contains "$TMP/err" "adapter_config.json" "missing adapter: message names the file"
sed 's/"r": 4/"r": 8/' "$AD/adapter_config.json" >"$TMP/badad/adapter_config.json"
expect 1 "run --lora no weights" -- "$TIDE" run --model "$FX" --lora "$TMP/badad" --new-tokens 1 --backend cpu
contains "$TMP/err" "adapter_model.safetensors" "no weights: message names the file"
cp "$AD/adapter_model.safetensors" "$TMP/badad/"
expect 1 "run --lora wrong shapes" -- "$TIDE" run --model "$FX" --lora "$TMP/badad" --new-tokens 1 --backend cpu
contains "$TMP/err" "r 8 on this model's" "wrong shapes: message"
sed 's/"down_proj"/"mlp"/' "$AD/adapter_config.json" >"$TMP/badad/adapter_config.json"
expect 1 "run --lora unknown target" -- "$TIDE" run --model "$FX" --lora "$TMP/badad" --new-tokens 1 --backend cpu
contains "$TMP/err" "'mlp'" "unknown target: message names it"
expect 1 "chat --lora bad" -- "$TIDE" chat --model "$FX" --lora "$TMP/nowhere" --backend cpu
contains "$TMP/err" "adapter_config.json" "chat: missing adapter named"
expect 2 "serve --lora for no model" -- "$TIDE" serve --model a="$FX" --lora b="$AD" --budget 1G
contains "$TMP/err" "no --model named 'b'" "serve --lora: the model named"

# a quantized GGUF base: an adapter without q_proj / k_proj (whose GGUF rows
# are in llama.cpp's rotary order) runs, offloaded and checked bit for bit
expect 0 "quantize the base" -- "$TIDE" quantize --type q8_0 "$FX" "$TMP/q8.gguf"
expect 0 "train a v,o,gate,up,down adapter" -- "$TIDE" train "${RUN[@]}" --steps 2 --lr 1e-2 --lora-r 4 \
    --lora-targets v,o,gate,up,down --out "$TMP/vo"
expect 0 "run q8_0 --lora" -- "$TIDE" run --model "$TMP/q8.gguf" --lora "$TMP/vo" --tokens $PROMPT --new-tokens 4 \
    --json --quiet --backend cpu --budget 25% --check --hw a100-80g
contains "$TMP/out" '"check_bit_identical":true' "q8_0 base with an adapter at 25%: bit-identical"
q_hash=$(hash_of)
expect 0 "run q8_0" -- "$TIDE" run --model "$TMP/q8.gguf" --tokens $PROMPT --new-tokens 4 --json --quiet --backend cpu
[ "$(hash_of)" != "$q_hash" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: --lora on q8_0 changed nothing"; FAILS=$((FAILS + 1)); }
expect 1 "run q8_0 --lora with q_proj" -- "$TIDE" run --model "$TMP/q8.gguf" --lora "$AD" --new-tokens 1 --backend cpu
contains "$TMP/err" "rotary order" "q_proj on a GGUF base: message"

# ---- tide serve --lora: a model served with an adapter answers what tide run
# --lora prints (a model with the built-in tokenizer; an adapter trained on it)
if command -v python3 >/dev/null && [ -n "${TIDE_DATA:-}" ]; then
    sed -e 's/"vocab_size": [0-9]*/"vocab_size": 4160/' "$TIDE_FIXTURES/tiny-bf16-gqa/config.json" >"$TMP/sm.json"
    expect 0 "make-model for serve" -- "$TIDE" make-model --config "$TMP/sm.json" --seed 7 "$TMP/sm"
    cp "$TIDE_DATA"/tokenizer/tokenizer.json "$TIDE_DATA"/tokenizer/tokenizer_config.json "$TMP/sm/"
    expect 0 "an adapter for it" -- "$TIDE" train --model "$TMP/sm" --data "$DATA" --batch 2 --seq 16 --steps 3 \
        --lr 3e-2 --lora-r 2 --lora-targets q,v,down --quiet --out "$TMP/smad"
    for w in "" "--lora $TMP/smad"; do
        expect 0 "run ${w:+with the adapter}" -- "$TIDE" run --model "$TMP/sm" $w --prompt "Once upon a time" \
            --new-tokens 6 --json --quiet --backend cpu
        python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["text"])' "$TMP/out" \
            >"$TMP/want${w:+-lora}"
    done
    cat >"$TMP/serve.py" <<'PY'
import http.client, json, re, subprocess, sys
tide, model, adapter, want, want_base = sys.argv[1:6]
p = subprocess.Popen([tide, "serve", "--model", "a=" + model, "--model", "b=" + model, "--lora", "a=" + adapter,
                      "--budget", "64M", "--hw", "h100-80g", "--port", "0", "--backend", "cpu", "--threads", "1"],
                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", p.stdout.readline())
ok = m is not None
for name, w in (("a", want), ("b", want_base)) if ok else ():
    c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=120)
    c.request("POST", "/v1/completions", body=json.dumps({"model": name, "prompt": "Once upon a time",
              "max_tokens": 6, "temperature": 0}), headers={"Content-Type": "application/json"})
    got = json.loads(c.getresponse().read())["choices"][0]["text"]
    w = open(w).read()[:-1]
    print(f"served {name}: {got!r}, tide run: {w!r}")
    ok = ok and got == w
p.terminate()
p.wait(60)
sys.exit(0 if ok else 1)
PY
    expect 0 "serve --lora answers as run --lora, the base as run" -- python3 "$TMP/serve.py" "$TIDE" "$TMP/sm" \
        "$TMP/smad" "$TMP/want-lora" "$TMP/want"
    cat "$TMP/out"
    ! cmp -s "$TMP/want" "$TMP/want-lora" && PASSES=$((PASSES + 1)) || { echo "FAIL: the adapter changed no text"; FAILS=$((FAILS + 1)); }
else
    skip_check "tide serve --lora" "python3 or TIDE_DATA missing"
fi
finish
