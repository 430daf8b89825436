#!/usr/bin/env bash
# cli_run.sh - `tide run` and `tide make-model` end to end on small models:
# the summary and JSON, offloaded runs checked bit for bit for every policy,
# traces, spill directories left empty, and bad input (exit status, message).
#
# What it proves: `tide run` end to end, and each bad input's exit status and
# message; `--check` of a resident run against the plain engine, `--engine
# plain`.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/tiny-bf16-gqa

expect 0 "help" -- "$TIDE" run --help
for o in --budget --policy --host-budget --ssd --check --engine --trace --trace-svg --json TIDE_EXEC_SYNC; do
    contains "$TMP/out" "$o" "run help lists $o"
done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "make-model" "help lists make-model"

# a synthetic model from a Hugging Face config.json, more layers than the fixture
expect 0 "make-model" -- "$TIDE" make-model --config "$FX/config.json" --layers 6 --seed 3 "$TMP/m"
contains "$TMP/out" "6 layers" "make-model summary"
expect 0 "make-model is deterministic" -- "$TIDE" make-model --config "$FX/config.json" --layers 6 --seed 3 "$TMP/m2"
expect 0 "same bytes" -- cmp "$TMP/m/model.safetensors" "$TMP/m2/model.safetensors"

# --backend cpu where a check is about the CPU backend (auto takes a GPU where there is one)
expect 0 "resident run" -- "$TIDE" run --model "$TMP/m" --new-tokens 5 --json --backend cpu
for f in tokens prefill_tokens_per_s decode_tokens_per_s peak_bytes; do json_field "$TMP/out" "$f"; done
# the CPU backend has no events: it issues synchronously, and says so
contains "$TMP/out" '"async_issue":false' "JSON says the CPU issues synchronously"
cp "$TMP/out" "$TMP/resident.json"
expect 0 "run on an HF checkpoint" -- "$TIDE" run --model "$FX" --tokens 1,2,3,4 --new-tokens 3 --backend cpu
contains "$TMP/out" "generated" "summary shows the generated ids"
contains "$TMP/out" "synchronous issue" "summary shows how device work was issued"

# one engine: a resident run is an unconstrained plan on the executor, checked
# against the plain reference engine (no planner, verifier or executor)
expect 0 "resident run checked against the plain engine" -- "$TIDE" run --model "$TMP/m" --new-tokens 5 --check --json
contains "$TMP/out" '"engine":"planned"' "JSON names the engine"
contains "$TMP/out" '"check_bit_identical":true' "resident planned run: bit-identical to the plain engine"
contains "$TMP/out" '"reference_engine":"plain"' "JSON names the reference engine"
expect 0 "the plain engine" -- "$TIDE" run --model "$TMP/m" --new-tokens 5 --engine plain
contains "$TMP/out" "engine plain" "summary names the plain engine"
expect 2 "--engine plain with a budget" -- "$TIDE" run --model "$TMP/m" --engine plain --budget 50%
contains "$TMP/err" "--engine plain" "message names --engine plain"
expect 2 "bad --engine" -- "$TIDE" run --model "$TMP/m" --engine fast

# Without --hw an offloaded run first measures the machine (1 s, and under a
# sanitizer far more): the first offloaded run below does, the others plan with
# the profile measured once here (the same code from there on), HW.
expect 0 "probe" -- "$TIDE" probe --backend cpu --seconds 1 --ssd "$TMP" --out "$TMP/probed.json"
contains "$TMP/err" "probing the cpu backend" "probe says what it measures"
json_field "$TMP/probed.json" h2d_bw
HW=(--hw "$TMP/probed.json")

mkdir -p "$TMP/spill"
for p in tide static-layer lru; do
    hw=("${HW[@]}")
    [ $p = tide ] && hw=() # measures the machine
    expect 0 "offloaded at 50%, $p, checked" -- "$TIDE" run --model "$TMP/m" --new-tokens 5 --budget 50% \
        --policy $p --check --json --ssd "$TMP/spill" "${hw[@]}"
    contains "$TMP/out" '"check_passed":true' "$p: bit-identical to the unconstrained run"
    for f in policy budget_bytes peak_device_bytes bytes_h2d bytes_d2h bytes_ssd_read bytes_ssd_write wall_s \
             predicted_makespan_s unconstrained_wall_s; do
        json_field "$TMP/out" "$f"
    done
done
expect 0 "minimum budget, weights on SSD, pread path" -- "$TIDE" run --model "$TMP/m" --new-tokens 4 --budget min \
    --weights-on-ssd --pread --check --ssd "$TMP/spill" "${HW[@]}" --trace "$TMP/t.json" --trace-svg "$TMP/t.svg"
contains "$TMP/out" "check      passed" "min budget check passes"
contains "$TMP/t.json" '"device bytes"' "trace has the device-bytes counter"
contains "$TMP/t.svg" "measured" "svg has the measured panel"
contains "$TMP/t.svg" "predicted" "svg has the predicted panel"
if [ -z "$(ls -A "$TMP/spill")" ]; then PASSES=$((PASSES + 1)); else
    echo "FAIL: spill directory not empty: $(ls "$TMP/spill")"; FAILS=$((FAILS + 1)); fi

# Qwen2 (q/k/v biases): offloaded and tiled at the minimum, checked
expect 0 "qwen2 at the minimum, checked" -- "$TIDE" run --model "$TIDE_FIXTURES/tiny-qwen2" --budget min --check \
    --new-tokens 4 --json "${HW[@]}"
contains "$TMP/out" '"check_passed":true' "qwen2 run checked against the unconstrained run"

# bad input
expect 1 "token id past the vocabulary" -- "$TIDE" run --model "$TMP/m" --tokens 1,2,99999 --new-tokens 2
contains "$TMP/err" "99999" "message names the id"
expect 2 "bad --tile" -- "$TIDE" run --model "$TMP/m" --budget min --tile fine --new-tokens 2
contains "$TMP/err" "--tile" "message names --tile"
expect 2 "--tile without a budget" -- "$TIDE" run --model "$TMP/m" --tile none --new-tokens 2
expect 0 "tiled at the minimum, checked" -- "$TIDE" run --model "$TMP/m" --budget min --check --new-tokens 3 --json \
    "${HW[@]}"
contains "$TMP/out" '"check_passed":true' "tiled run checked against the unconstrained run"
expect 1 "budget below the minimum" -- "$TIDE" run --model "$TMP/m" --budget 4K --tile none --new-tokens 2 "${HW[@]}"
contains "$TMP/err" "needs at least" "message gives the minimum"
expect 1 "spill directory that does not exist" -- "$TIDE" run --model "$TMP/m" --budget min --weights-on-ssd \
    --new-tokens 2 --ssd /nonexistent/tide-spill
contains "$TMP/err" "/nonexistent/tide-spill" "message names the directory"
touch "$TMP/afile"
expect 1 "spill directory that is a file" -- "$TIDE" run --model "$TMP/m" --budget min --weights-on-ssd \
    --new-tokens 2 --ssd "$TMP/afile"
expect 1 "missing model" -- "$TIDE" run --model "$TMP/nothing-here"
contains "$TMP/err" "nothing-here" "message names the directory"
mkdir -p "$TMP/trunc" && cp "$TMP/m/config.json" "$TMP/trunc/" && head -c 100 "$TMP/m/model.safetensors" >"$TMP/trunc/model.safetensors"
expect 1 "truncated checkpoint" -- "$TIDE" run --model "$TMP/trunc"
contains "$TMP/err" "model.safetensors" "message names the file"
expect 1 "too many positions" -- "$TIDE" run --model "$TMP/m" --prompt-len 100 --new-tokens 100
expect 2 "bad budget" -- "$TIDE" run --model "$TMP/m" --budget lots
expect 2 "trace without a budget" -- "$TIDE" run --model "$TMP/m" --trace "$TMP/x.json"
expect 2 "bad tokens" -- "$TIDE" run --model "$TMP/m" --tokens 1,,x
expect 2 "unknown option" -- "$TIDE" run --frobnicate
expect 1 "host budget too small for what must live on host" -- "$TIDE" run --model "$TMP/m" --budget 50% \
    --host-budget 4K --new-tokens 2 "${HW[@]}"
contains "$TMP/err" "must live" "message says what must live on host"
# matmul modes: the CPU has both (auto is fast where it multiplies bf16
# natively); the summary and the JSON say which ran
json_field "$TMP/resident.json" matmul
contains "$TMP/resident.json" '"matmul":"f' "JSON gives the matmul mode"
contains "$TMP/resident.json" '"kernels":"matmul ' "JSON names the kernels in use"
expect 0 "--matmul f32" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --matmul f32 --backend cpu
contains "$TMP/out" "matmul f32" "summary gives the matmul mode"
expect 0 "--matmul fast on the CPU" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --matmul fast --backend cpu
contains "$TMP/out" "matmul fast" "summary gives the fast mode"
expect 2 "bad --matmul" -- "$TIDE" run --model "$TMP/m" --matmul tf32
contains "$TMP/err" "--matmul" "message names --matmul"
if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU here
    expect 1 "--backend cuda without a GPU" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --backend cuda
    contains "$TMP/err" "CUDA" "message says there is no CUDA device or backend"
fi

# pinned weight copies: forced on the CPU, the same tokens and logits
expect 0 "--pin-weights yes, checked" -- "$TIDE" run --model "$TMP/m" --new-tokens 4 --budget 50% \
    --pin-weights yes --check --json "${HW[@]}"
contains "$TMP/out" '"check_bit_identical":true' "pinned weights: bit-identical"
if grep -q '"pinned_weight_bytes":0[,}]' "$TMP/out"; then
    echo "FAIL: --pin-weights yes pinned nothing"; FAILS=$((FAILS + 1)); else PASSES=$((PASSES + 1)); fi
expect 0 "--pin-weights no" -- "$TIDE" run --model "$TMP/m" --new-tokens 2 --budget 50% --pin-weights no "${HW[@]}"
contains "$TMP/out" "weights    0 B pinned" "summary gives the pinned bytes"
expect 2 "bad --pin-weights" -- "$TIDE" run --model "$TMP/m" --budget 50% --pin-weights maybe
expect 2 "--pin-weights without a budget" -- "$TIDE" run --model "$TMP/m" --pin-weights yes
expect 2 "--direct-storage without --weights-on-ssd" -- "$TIDE" run --model "$TMP/m" --budget 50% --direct-storage
contains "$TMP/err" "--weights-on-ssd" "message names --weights-on-ssd"
expect 0 "--direct-storage on the CPU (no effect), checked" -- "$TIDE" run --model "$TMP/m" --budget 50% \
    --weights-on-ssd --direct-storage --check --new-tokens 3 "${HW[@]}"

# tide probe: the CPU through the backend, a bad directory, a GPU that is absent
expect 0 "plan with the probed profile" -- "$TIDE" plan --config tinyllama-1.1b --hw "$TMP/probed.json" \
    --budget 50% --seq 16
expect 1 "probe, missing directory" -- "$TIDE" probe --seconds 1 --ssd /nonexistent/tide-probe
contains "$TMP/err" "/nonexistent/tide-probe" "message names the directory"
expect 0 "probe --matmul fast on the CPU" -- "$TIDE" probe --seconds 1 --backend cpu --matmul fast --ssd "$TMP" \
    --out "$TMP/probed-fast.json"
expect 1 "probe, unknown --base" -- "$TIDE" probe --seconds 1 --base no-such-gpu
contains "$TMP/err" "no-such-gpu" "message names the profile"
expect 2 "probe, bad --backend" -- "$TIDE" probe --backend tpu
if ! nvidia-smi -L >/dev/null 2>&1; then  # no GPU here
    expect 1 "probe --backend cuda without a GPU" -- "$TIDE" probe --backend cuda
    contains "$TMP/err" "CUDA" "message says there is no CUDA device or backend"
fi

expect 2 "make-model without a config" -- "$TIDE" make-model "$TMP/x"
expect 1 "make-model, unknown config" -- "$TIDE" make-model --config nope "$TMP/x"

# KV cache types: a model of head_dim 32 (q8_0 takes whole blocks of 32 per
# head), each type offloaded at 25% and checked bit for bit against the plain
# engine; f16 and q8_0 caches give other logits than f32 (they round). With
# the probed profile: a run without --hw measures the machine first.
sed -e 's/"head_dim": 16/"head_dim": 32/' -e 's/"hidden_size": 96/"hidden_size": 128/' \
    -e 's/"num_attention_heads": 6/"num_attention_heads": 4/' "$FX/config.json" > "$TMP/kv-config.json"
expect 0 "make-model, head_dim 32" -- "$TIDE" make-model --config "$TMP/kv-config.json" --layers 2 --seed 5 "$TMP/kv"
for t in f32 f16 bf16 q8_0; do
    expect 0 "--cache-type $t, offloaded at 25%, checked" -- "$TIDE" run --model "$TMP/kv" --tokens 1,2,3,4,5,6 \
        --new-tokens 6 --budget 25% --check --json --backend cpu --cache-type $t "${HW[@]}"
    contains "$TMP/out" '"check_passed":true' "$t cache: bit-identical to the plain engine"
    contains "$TMP/out" "\"cache_type\":\"$t\"" "JSON names the $t cache"
    grep -o '"logits_hash":"[0-9a-f]*"' "$TMP/out" > "$TMP/kv-hash-$t"
    [ -s "$TMP/kv-hash-$t" ] || { echo "FAIL: no logits_hash in the $t run's JSON"; exit 1; }
done
for t in f16 q8_0; do
    expect 1 "$t cache rounds: other logits than f32" -- cmp -s "$TMP/kv-hash-f32" "$TMP/kv-hash-$t"
done
expect 2 "bad --cache-type" -- "$TIDE" run --model "$TMP/kv" --cache-type q4_0
contains "$TMP/err" "--cache-type 'q4_0'" "message names the bad --cache-type"
expect 1 "q8_0 cache, head_dim 16" -- "$TIDE" run --model "$FX" --tokens 1,2 --new-tokens 1 --cache-type q8_0
contains "$TMP/err" "multiple of 32" "message says why q8_0 is refused"
for c in chat serve plan; do
    expect 0 "$c help lists --cache-type" -- "$TIDE" $c --help
    contains "$TMP/out" "--cache-type" "$c help lists --cache-type"
done
expect 2 "plan, bad --cache-type" -- "$TIDE" plan --config tinyllama-mini --budget 50% --cache-type f8
expect 0 "plan, f32 cache" -- "$TIDE" plan --config tinyllama-mini --decode 4 --seq 256 --budget 50% --json
grep -o '"cache_bytes":[0-9]*' "$TMP/out" > "$TMP/kv-plan-f32"
expect 0 "plan, q8_0 cache" -- "$TIDE" plan --config tinyllama-mini --decode 4 --seq 256 --budget 50% --json \
    --cache-type q8_0
contains "$TMP/out" '"cache_type":"q8_0"' "plan JSON names the q8_0 cache"
grep -o '"cache_bytes":[0-9]*' "$TMP/out" > "$TMP/kv-plan-q8"
expect 1 "plan: the q8_0 cache is smaller" -- cmp -s "$TMP/kv-plan-f32" "$TMP/kv-plan-q8"
expect 2 "plan --train with --cache-type" -- "$TIDE" plan --config tinyllama-mini --train --budget 50% \
    --cache-type f16
finish
