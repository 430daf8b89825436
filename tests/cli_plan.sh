#!/usr/bin/env bash
# cli_plan.sh - `tide plan` end to end: the table, the JSON, minimum budgets,
# and every kind of bad input (exit status and the message naming the cause).
#
# What it proves: `tide plan` of inference graphs end to end (its table, JSON
# and minimum budgets), and each bad input's exit status and message; `tide
# plan --train` is tested in cli_train, but for data-parallel ranks (--ranks,
# --zero) here.
source "$(dirname "$0")/lib_cli.sh" "$1"

expect 0 "help" -- "$TIDE" plan --help
contains "$TMP/out" "--budget" "plan help lists --budget"

expect 0 "llama-65b at 20% of v100-32g" -- "$TIDE" plan --config llama-65b --hw v100-32g --budget 20% --seq 2048
for w in "verified    yes" "peak device" "bytes host->device" "predicted makespan" "of ideal" "x of lower bound" "planning time"; do
    contains "$TMP/out" "$w" "plan table"
done

expect 0 "json" -- "$TIDE" plan --config llama-7b --hw h100-80g --budget 25% --batch 8 --seq 2048 --json \
    --trace "$TMP/trace.json" --out "$TMP/plan.json"
for f in feasible policy budget_bytes peak_device_bytes bytes_h2d bytes_d2h bytes_ssd_read bytes_ssd_write \
         makespan_s ideal_s lower_bound_s plan_seconds; do
    json_field "$TMP/out" "$f"
done
contains "$TMP/out" '"feasible":true' "feasible plan"
contains "$TMP/trace.json" '"traceEvents"' "trace written"
contains "$TMP/plan.json" '"tide-plan"' "plan written"
if command -v python3 >/dev/null; then
    expect 0 "trace is valid JSON" -- python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TMP/trace.json"
else
    skip_check "trace is valid JSON" "python3 not found"
fi

# The minimum-budget searches plan many times: they run on llama-7b's
# shapes cut to 4 layers (a config.json alone: plan needs no weights), whose
# largest ops, and so whose minimums, are llama-7b's.
L7B4=$TMP/llama-7b-4l
llama7b_config "$L7B4"
for p in tide static-layer lru; do
    expect 0 "min budget, $p" -- "$TIDE" plan --model "$L7B4" --budget min --seq 512 --policy $p
    contains "$TMP/out" "the minimum for $p" "min budget note"
done
# tiling: the minimum with tiles is far below the untiled one (the largest
# op's working set), and a budget below the untiled minimum plans tiled
expect 0 "min budget untiled" -- "$TIDE" plan --model "$L7B4" --budget min --seq 512 --tile none --json
untiled=$(sed -n 's/.*"budget_bytes":\([0-9.e+]*\).*/\1/p' "$TMP/out")
contains "$TMP/out" '"tile_level":0' "untiled level"
expect 0 "min budget tiled" -- "$TIDE" plan --model "$L7B4" --budget min --seq 512 --json
tiled=$(sed -n 's/.*"budget_bytes":\([0-9.e+]*\).*/\1/p' "$TMP/out")
expect 0 "tiled minimum ($tiled) below a quarter of the untiled one ($untiled)" -- \
    awk -v a="$tiled" -v b="$untiled" 'BEGIN { exit !(a > 0 && a * 4 < b) }'
expect 0 "below the untiled minimum" -- "$TIDE" plan --model "$L7B4" --budget 100M --seq 512
contains "$TMP/out" "tiling      level" "tiling named in the table"
expect 1 "below the untiled minimum, tiling off" -- "$TIDE" plan --model "$L7B4" --budget 100M --seq 512 --tile none
contains "$TMP/err" "needs at least" "untiled message gives the minimum"
expect 2 "bad --tile" -- "$TIDE" plan --config llama-7b --budget min --tile 9
contains "$TMP/err" "--tile" "message names --tile"

expect 0 "decode steps" -- "$TIDE" plan --config llama-2-70b --hw h100-80g --batch 4 --seq 512 --decode 8 --budget 25%
expect 0 "weights on ssd" -- "$TIDE" plan --config llama-7b --hw h100-80g --budget 10% --seq 512 --weights-on-ssd --json
json_field "$TMP/out" bytes_ssd_read

# bad input
# --dtype: block-typed weights sized by their blocks (tinyllama-1.1b: 1,100,048,384
# parameters in 2-D weights, 22 x 2 + 1 norms of 2048 f32)
expect 0 "dtype q4_k" -- "$TIDE" plan --config tinyllama-1.1b --dtype q4_k --seq 256 --budget 50% --json
contains "$TMP/out" '"dtype":"q4_k"' "dtype in the JSON"
w4=$(grep -o '"weight_bytes":[0-9]*' "$TMP/out" | cut -d: -f2)
expect 0 "dtype bf16" -- "$TIDE" plan --config tinyllama-1.1b --dtype bf16 --seq 256 --budget 50% --json
w16=$(grep -o '"weight_bytes":[0-9]*' "$TMP/out" | cut -d: -f2)
norms=$(( (22 * 2 + 1) * 2048 ))
if [ -z "$w4" ] || [ -z "$w16" ] || [ $(( (w16 - 2 * norms) / 2 / 256 * 144 + 4 * norms )) -ne "$w4" ]; then
    echo "FAIL: q4_k weight bytes $w4 are not 144 bytes per 256 of bf16's $w16 (norms f32)"
    FAILS=$((FAILS + 1))
fi
expect 0 "dtype q4_k_m" -- "$TIDE" plan --config llama-2-70b --dtype q4_k_m --decode 2 --hw rtx-4090-24g --budget 22G
contains "$TMP/out" "weights     mixed types" "a mix's weights"
contains "$TMP/out" "hw source   datasheet" "datasheet profile named"
expect 2 "bad --dtype" -- "$TIDE" plan --config llama-7b --dtype q3_k --budget 50%
expect 2 "--dtype with --train" -- "$TIDE" plan --config llama-7b --dtype q4_k --train --budget 50%

# co-offload: on a desktop profile (a slow link, 70 GB/s host memory) decode
# MATMULs go to the host CPU and the plan is faster; off keeps them on the device
expect 0 "host compute auto" -- "$TIDE" plan --config llama-2-70b --dtype q4_k --decode 4 --hw rtx-4090-24g \
    --budget 22G --json
contains "$TMP/out" '"verified":true' "co-offloaded plan verified"
hc=$(grep -o '"host_computes":[0-9]*' "$TMP/out" | cut -d: -f2)
ma=$(grep -o '"makespan_s":[0-9.e+-]*' "$TMP/out" | cut -d: -f2)
expect 0 "host compute off" -- "$TIDE" plan --config llama-2-70b --dtype q4_k --decode 4 --hw rtx-4090-24g \
    --budget 22G --json --host-compute off
contains "$TMP/out" '"host_computes":0' "off places nothing on the host"
mo=$(grep -o '"makespan_s":[0-9.e+-]*' "$TMP/out" | cut -d: -f2)
if [ -z "$hc" ] || [ "$hc" -le 0 ] || ! awk -v a="$ma" -v o="$mo" 'BEGIN { exit !(a < o) }'; then
    echo "FAIL: co-offload placed $hc computes on the host, makespan $ma against $mo off"
    FAILS=$((FAILS + 1))
fi
expect 2 "bad --host-compute" -- "$TIDE" plan --config llama-7b --host-compute maybe --budget 50%

expect 1 "budget below the minimum" -- "$TIDE" plan --config llama-7b --budget 1M --seq 512
contains "$TMP/err" "needs at least" "below-minimum message gives the minimum"
expect 1 "budget above the device" -- "$TIDE" plan --config llama-7b --hw v100-32g --budget 100G --seq 512
contains "$TMP/err" "100.00 GiB" "message gives the budget"
contains "$TMP/err" "32.00 GiB" "message gives the device memory"
expect 1 "unknown profile" -- "$TIDE" plan --config llama-7b --hw no-such-gpu --budget 50%
contains "$TMP/err" "h100-80g" "unknown profile lists the shipped ones"
expect 1 "unknown config" -- "$TIDE" plan --config llama-9000b --budget 50%
contains "$TMP/err" "tinyllama-1.1b" "unknown config lists the built-in ones"
printf '{"name": "x", "device_mem_bytes": "lots"}' >"$TMP/bad.json"
expect 1 "malformed profile" -- "$TIDE" plan --config llama-7b --hw "$TMP/bad.json" --budget 50%
contains "$TMP/err" "bad.json" "malformed profile message names the file"
mkdir -p "$TMP/m"
printf '{"hidden_size": 64, ' >"$TMP/m/config.json"
expect 1 "malformed config.json" -- "$TIDE" plan --model "$TMP/m" --budget 50%
contains "$TMP/err" "config.json" "malformed config message names the file"
expect 2 "negative seq" -- "$TIDE" plan --config llama-7b --budget 50% --seq -5
expect 2 "absurd budget" -- "$TIDE" plan --config llama-7b --budget 12parsecs
expect 2 "percentage over 100" -- "$TIDE" plan --config llama-7b --budget 150%
expect 2 "no budget" -- "$TIDE" plan --config llama-7b
expect 2 "unknown policy" -- "$TIDE" plan --config llama-7b --budget 50% --policy fifo
expect 2 "unknown option" -- "$TIDE" plan --config llama-7b --budget 50% --frobnicate

# data-parallel training: one of 8 ranks of llama-2-70b's shapes (cut to 4
# layers: the whole model is a planner bench's, bench/) on one NVLink node
L70B4=$TMP/llama-2-70b-4l
mkdir -p "$L70B4"
sed -e 's/"hidden_size": 4096/"hidden_size": 8192/' -e 's/"intermediate_size": 11008/"intermediate_size": 28672/' \
    -e 's/"num_attention_heads": 32/"num_attention_heads": 64/' -e 's/"num_key_value_heads": 32/"num_key_value_heads": 8/' \
    "$L7B4/config.json" >"$L70B4/config.json"
expect 0 "ranks 8 json" -- "$TIDE" plan --train --ranks 8 --zero 2 --hw 8x-h100-80g-nvlink --model "$L70B4" \
    --seq 256 --budget 100% --optimizer device --tile none --json
for f in ranks zero collectives_per_step net_bytes_per_rank net_bytes_intra_node_per_rank \
         net_bytes_inter_node_per_rank state_bytes_this_rank step_s pct_of_ideal; do
    json_field "$TMP/out" "$f"
done
contains "$TMP/out" '"verified":true' "rank plan verified"
contains "$TMP/out" '"ranks":8' "ranks in json"
contains "$TMP/out" '"net_bytes_inter_node_per_rank":0' "one node: nothing between nodes"
expect 0 "ranks table" -- "$TIDE" plan --train --ranks 16 --hw h100-80g-ndr-cluster --config tinyllama-mini \
    --batch 2 --seq 64 --budget 50%
for w in "16 data-parallel, ZeRO-1" "bytes net/step/rank" "between nodes" "perfect scaling" "verified    yes"; do
    contains "$TMP/out" "$w" "ranks table"
done
expect 2 "ranks 0" -- "$TIDE" plan --train --ranks 0 --config tinyllama-mini --budget 50%
contains "$TMP/err" "bad --ranks" "bad ranks message"
expect 2 "ranks not a number" -- "$TIDE" plan --train --ranks eight --config tinyllama-mini --budget 50%
expect 2 "zero 3" -- "$TIDE" plan --train --ranks 2 --zero 3 --config tinyllama-mini --budget 50%
contains "$TMP/err" "bad --zero" "bad zero message"
expect 2 "zero without ranks" -- "$TIDE" plan --train --zero 1 --config tinyllama-mini --budget 50%
contains "$TMP/err" "--zero needs --ranks" "zero without ranks message"
expect 2 "ranks without train" -- "$TIDE" plan --ranks 2 --config tinyllama-mini --budget 50%
expect 1 "ranks on a profile without a network" -- "$TIDE" plan --train --ranks 2 --config tinyllama-mini \
    --budget 50% --hw h100-80g
contains "$TMP/err" "cannot run collectives over 2 ranks" "no network message"
expect 0 "zero 2 with accum" -- "$TIDE" plan --train --ranks 2 --zero 2 --accum 2 --hw 8x-h100-80g-nvlink \
    --config tinyllama-mini --batch 2 --seq 64 --budget 50%
contains "$TMP/out" "ZeRO-2" "zero 2 accum: the stage"
contains "$TMP/out" "verified    yes" "zero 2 accum: verified"
finish
