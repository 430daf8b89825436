#!/usr/bin/env bash
# cli_train.sh - `tide train` and `tide plan --train` end to end: the per-step
# lines and JSON, offloaded training checked bit for bit, checkpoints that
# load in `tide run`, resumption, and bad input (exit status, message, no
# checkpoint left looking whole).
#
# What it proves: `tide train` and `tide plan --train` end to end, and each
# bad input's exit status and message; `tide train` resident and offloaded for
# every policy (state on SSD at the minimum budget), and with every AdamW
# update on the host CPU (at 25%, the minimum, and with the state on SSD;
# `--optimizer auto` at the all-host minimum, below the device updates' own,
# placing some on the host, bit-identical; likewise `--policy zero-offload` at
# the minimum, state on host and on SSD), checked bit for bit, checkpoints
# that `tide run` loads, resume equal to the uninterrupted run, the replan
# line and `refit` object of a run on a profile with rates far too slow and
# none with `--no-refit`, the demonstration, `tide plan --train`; row tiles
# (`tide train` at its tiled minimum below the untiled one, checked bit for
# bit, and refused there with `--tile none`; `tide plan --train` of llama-7b (4 layers)
# at its tiled minimum (tiles of one sequence, the vocabulary in 4 blocks)
# under a seventh of the untiled one and under two thirds of row tiles' alone,
# its `tiling` line and JSON fields, zero-offload untiled unless asked, bad
# `--tile`); bad training input (odd-sized, short and out-of-vocabulary data,
# `--seq` beyond the positions, an unwritable `--out`, a disk filling up
# mid-save with the earlier checkpoint left whole, a resume of another shape
# or model).
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/train/train-bf16-gqa
DATA=$FX/data.u16

expect 0 "help" -- "$TIDE" train --help
for o in --data --steps --batch --seq --accum --lr --min-lr --warmup --weight-decay --beta1 --beta2 --eps \
         --grad-clip --shuffle --budget --host-budget --ssd --policy --hw --check --out --save-every --resume \
         --json --trace --data-dtype --save-dtype --no-refit; do
    contains "$TMP/out" "$o" "train help lists $o"
done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "train" "help lists train"

# resident, one line per step
expect 0 "resident training" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 4 --batch 2 --seq 16 --accum 2
contains "$TMP/out" "step     4" "a line per step"
contains "$TMP/out" "grad norm" "the step line has the gradient norm"
contains "$TMP/out" "summary" "a summary"

# JSON: one object per step and a summary; offloaded and checked for every policy
mkdir -p "$TMP/spill"
# (static-layer needs two whole layers and the activations' peak: 25% is below its minimum)
for pb in tide:25% static-layer:50% lru:25% checkpoint-layer:25% zero-offload:25%; do
    p=${pb%%:*} b=${pb#*:}
    expect 0 "offloaded at $b, $p, checked" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 3 --batch 2 \
        --seq 16 --accum 2 --budget $b --policy $p --hw h100-80g --check --json --ssd "$TMP/spill"
    for f in step loss grad_norm lr tokens_per_s wall_s bytes_h2d bytes_d2h bytes_ssd_read bytes_ssd_write \
             peak_device_bytes budget_bytes policy predicted_step_s measured_step_s; do
        json_field "$TMP/out" "$f"
    done
    contains "$TMP/out" '"check_passed":true' "$p: bit-identical to the unconstrained run"
    [ "$(grep -c '"step":' "$TMP/out")" -eq 3 ] && PASSES=$((PASSES + 1)) || { echo "FAIL: 3 step objects"; FAILS=$((FAILS + 1)); }
done
[ -z "$(ls -A "$TMP/spill")" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: files left in the spill directory"; FAILS=$((FAILS + 1)); }

# the training state homed on SSD (a host budget too small for it), at the minimum budget
expect 0 "state on SSD, minimum budget, checked" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 \
    --seq 16 --budget min --host-budget 600K --hw h100-80g --check --json --ssd "$TMP/spill"
contains "$TMP/out" '"check_passed":true' "SSD-homed state: bit-identical"
[ -z "$(ls -A "$TMP/spill")" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: state file left behind"; FAILS=$((FAILS + 1)); }

# row tiles in a real run: at its minimum the step runs in tiles of one
# sequence, bit for bit the resident run of the same tiles (--check), below the
# untiled minimum; --tile none keeps it whole; --tile needs a budget
expect 0 "untiled minimum" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 --seq 16 --accum 2 \
    --budget min --optimizer cpu --tile none --hw h100-80g --json
contains "$TMP/out" '"tile_seqs":2,' "--tile none: one tile of the micro-batch"
umin=$(sed -n 's/.*"budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out" | tail -1)
expect 0 "tiled minimum, checked" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 --seq 16 \
    --accum 2 --budget min --optimizer cpu --hw h100-80g --check --json --ssd "$TMP/spill"
contains "$TMP/out" '"tile_seqs":1,' "the minimum tiles one sequence at a time"
contains "$TMP/out" '"check_passed":true' "tiled: bit-identical to the resident run of the same tiles"
tmin=$(sed -n 's/.*"budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out" | tail -1)
awk -v t="$tmin" -v u="$umin" 'BEGIN { exit !(t > 0 && t < u) }' && PASSES=$((PASSES + 1)) || { echo "FAIL: tiled minimum $tmin not below the untiled $umin"; FAILS=$((FAILS + 1)); }
expect 0 "tiled, text summary" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
    --budget min --optimizer cpu --hw h100-80g --quiet
contains "$TMP/out" "row tiles of 1 of the 2 sequences" "the summary names the tiles"
expect 1 "the tiled minimum with --tile none" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 \
    --seq 16 --accum 2 --budget "$tmin" --optimizer cpu --tile none --hw h100-80g --quiet
contains "$TMP/err" "infeasible" "--tile none below the untiled minimum: infeasible"
expect 2 "--tile without --budget" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --tile 1
expect 2 "bad --tile" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --budget min --tile x

# AdamW on the host CPU (computation co-offload): every update there, at 25%,
# at the minimum and with the state homed on SSD (moved into host memory,
# updated there and moved home), bit-identical to the unconstrained run
for args in "--budget 25%" "--budget min" "--budget min --host-budget 600K"; do
    expect 0 "AdamW on the CPU ($args), checked" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 \
        --seq 16 --accum 2 $args --optimizer cpu --hw h100-80g --check --json --ssd "$TMP/spill"
    contains "$TMP/out" '"check_passed":true' "AdamW on the CPU ($args): bit-identical"
    groups=$(sed -n 's/.*"optimizer_groups":\([0-9]*\).*/\1/p' "$TMP/out" | tail -1)
    contains "$TMP/out" "\"optimizer_host_groups\":$groups" "AdamW on the CPU ($args): every update on the host"
done
# the last of them read and wrote its state on SSD, and left nothing behind
grep -q '"bytes_ssd_write":[1-9]' "$TMP/out" && PASSES=$((PASSES + 1)) || { echo "FAIL: state on SSD written"; FAILS=$((FAILS + 1)); }
[ -z "$(ls -A "$TMP/spill")" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: state file left behind"; FAILS=$((FAILS + 1)); }
expect 0 "AdamW placed by the plan (the CPU backend: on the device)" -- "$TIDE" train --model "$FX" --data "$DATA" \
    --steps 1 --batch 2 --seq 16 --budget 50% --optimizer auto --hw h100-80g --quiet
contains "$TMP/out" "updates on the host CPU" "summary says where AdamW ran"
# --optimizer auto on the CPU backend keeps the updates on the device unless
# the arena cannot hold an update's operands: below that minimum (at the
# all-host one) the plan puts some on the host CPU and the step runs
expect 0 "the all-host minimum budget" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
    --accum 2 --budget min --optimizer cpu --hw h100-80g --json
host_min=$(sed -n 's/.*"budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out" | tail -1)
expect 0 "auto below the device updates' minimum ($host_min bytes), checked" -- "$TIDE" train --model "$FX" \
    --data "$DATA" --steps 2 --batch 2 --seq 16 --accum 2 --budget "$host_min" --hw h100-80g --check --json
contains "$TMP/out" '"check_passed":true' "auto below the device updates' minimum: bit-identical"
grep -q '"optimizer_host_groups":[1-9]' "$TMP/out" && PASSES=$((PASSES + 1)) ||
    { echo "FAIL: auto below the device updates' minimum placed no update on the host"; FAILS=$((FAILS + 1)); }
expect 2 "--optimizer without a budget" -- "$TIDE" train --model "$FX" --data "$DATA" --optimizer cpu
expect 2 "--optimizer cpu under a baseline" -- "$TIDE" train --model "$FX" --data "$DATA" --budget 50% --policy lru \
    --optimizer cpu
expect 2 "unknown --optimizer" -- "$TIDE" train --model "$FX" --data "$DATA" --budget 50% --optimizer gpu

# the profiled cost model: a profile a hundred thousand times too slow for
# this machine (h100-80g's rates over 1e5: seconds predicted for steps of
# milliseconds) is refitted after the second step and the step replanned,
# still bit-identical to the unconstrained run; --no-refit keeps the plan
cat > "$TMP/slow.json" <<'JSON'
{"name": "slow", "device_mem_bytes": 85899345920,
 "flops": {"f32": 67e7, "f16": 989e7, "bf16": 989e7, "i32": 67e7}, "matmul_efficiency": 0.75,
 "mem_bw": 3350e4, "h2d_bw": 50e4, "d2h_bw": 50e4, "link_latency_s": 1e-5, "launch_s": 5e-6,
 "host_mem_bytes": 549755813888, "ssd_count": 2, "ssd_read_bw": 6.5e4, "ssd_write_bw": 3.5e4,
 "ssd_latency_s": 1e-4, "host_flops": 8e7, "host_mem_bw": 5e6}
JSON
expect 0 "a wrong profile, refitted" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 3 --batch 2 --seq 16 \
    --accum 2 --budget 25% --hw "$TMP/slow.json" --check --ssd "$TMP/spill"
contains "$TMP/out" "replanned after step 2: measured" "the replan line"
contains "$TMP/out" "refit      after step 2" "the summary's refit line"
contains "$TMP/out" "check      passed" "replanned: bit-identical"
expect 0 "a wrong profile, refitted, JSON" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 3 --batch 2 \
    --seq 16 --budget 25% --hw "$TMP/slow.json" --check --json --ssd "$TMP/spill"
contains "$TMP/out" '"refit":{"after_step":2,"replanned":true' "the summary's refit object"
contains "$TMP/out" '"check_passed":true' "replanned, JSON: bit-identical"
for f in refit_measured_s refit_predicted_s refit_new_predicted_s predicted_before_s predicted_after_s \
         measured_after_s; do
    json_field "$TMP/out" "$f"
done
expect 0 "a wrong profile, --no-refit" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 3 --batch 2 --seq 16 \
    --budget 25% --hw "$TMP/slow.json" --no-refit --json --ssd "$TMP/spill"
contains "$TMP/out" '"refit":null' "--no-refit: no refit"
! grep -q 'replanned' "$TMP/out" && PASSES=$((PASSES + 1)) || { echo "FAIL: --no-refit replanned"; FAILS=$((FAILS + 1)); }
expect 0 "a wrong profile, --no-refit, text" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 3 --batch 2 \
    --seq 16 --budget 25% --hw "$TMP/slow.json" --no-refit --ssd "$TMP/spill"
! grep -q 'replanned\|^refit' "$TMP/out" && PASSES=$((PASSES + 1)) || { echo "FAIL: --no-refit printed a refit"; FAILS=$((FAILS + 1)); }
[ -z "$(ls -A "$TMP/spill")" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: files left behind"; FAILS=$((FAILS + 1)); }
expect 2 "--no-refit without a budget" -- "$TIDE" train --model "$FX" --data "$DATA" --no-refit

# checkpoints: save, load in tide run, resume bit for bit
expect 0 "train 4 steps, saving every 2" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 4 --batch 2 --seq 16 \
    --out "$TMP/ck4" --save-every 2 --json
grep '"step":3,' "$TMP/out" > "$TMP/whole.json"
for f in config.json model.safetensors optimizer.safetensors; do
    [ -f "$TMP/ck4/$f" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: checkpoint has no $f"; FAILS=$((FAILS + 1)); }
done
expect 0 "the saved checkpoint runs" -- "$TIDE" run --model "$TMP/ck4" --tokens 1,2,3 --new-tokens 2
expect 0 "train 2 steps, save" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 --seq 16 --out "$TMP/ck2"
expect 0 "resume to 4 steps" -- "$TIDE" train --resume "$TMP/ck2" --data "$DATA" --steps 4 --batch 2 --seq 16 --json
grep '"step":3,' "$TMP/out" > "$TMP/resumed.json"
# the last step's loss and gradient norm are those of the run that never stopped
sed 's/"tokens_per_s.*//' "$TMP/whole.json" > "$TMP/a"; sed 's/"tokens_per_s.*//' "$TMP/resumed.json" > "$TMP/b"
expect 0 "resumed run equals the uninterrupted one" -- cmp "$TMP/a" "$TMP/b"
expect 0 "--save-dtype f32" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
    --out "$TMP/ckf" --save-dtype f32
contains "$TMP/ckf/config.json" "float32" "f32 checkpoint's config says so"

# zero-offload: every AdamW update on the host CPU, with the state on host and
# homed on SSD, bit-identical; it takes no device placement of the optimizer
for args in "--budget min" "--budget min --host-budget 600K"; do
    expect 0 "zero-offload ($args), checked" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 \
        --seq 16 --accum 2 $args --policy zero-offload --hw h100-80g --check --json --ssd "$TMP/spill"
    contains "$TMP/out" '"check_passed":true' "zero-offload ($args): bit-identical"
    groups=$(sed -n 's/.*"optimizer_groups":\([0-9]*\).*/\1/p' "$TMP/out" | tail -1)
    contains "$TMP/out" "\"optimizer_host_groups\":$groups" "zero-offload ($args): every update on the host"
done
[ -z "$(ls -A "$TMP/spill")" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: zero-offload left files behind"; FAILS=$((FAILS + 1)); }
expect 2 "zero-offload with --optimizer device" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 2 --batch 2 \
    --seq 16 --budget 25% --policy zero-offload --optimizer device --hw h100-80g
contains "$TMP/err" "every AdamW update on the host CPU" "zero-offload with --optimizer device names why"

# the demonstration (no arguments: the built-in model and corpus) is exercised
# with a few steps of a smaller batch
expect 0 "demonstration, 2 steps of 2 sequences" -- "$TIDE" train --steps 2 --batch 2 --json
contains "$TMP/out" '"check_passed":true' "demonstration checks bit for bit"

# plan --train: the searches plan many times, so they run on llama-7b's
# shapes cut to 4 layers (a config.json alone; its ops are llama-7b's, so are
# the minimums' working sets): 4 x 9 + 3 = 39 parameters
L7B4=$TMP/llama-7b-4l
llama7b_config "$L7B4"
expect 0 "plan a training step" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --tile none
for w in "master weights" "moments" "gradients" "activations" "ideal step" "lower bound" "planning time"; do
    contains "$TMP/out" "$w" "plan --train table has $w"
done
expect 0 "plan --train, checkpoint-layer" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --policy checkpoint-layer
contains "$TMP/out" "policy checkpoint-layer" "plan --train names checkpoint-layer"
contains "$TMP/out" "verified    yes" "checkpoint-layer plan verified"
expect 2 "checkpoint-layer without --train" -- "$TIDE" plan --config llama-7b --budget 25% --policy checkpoint-layer
contains "$TMP/err" "needs --train" "checkpoint-layer without --train names why"
expect 0 "plan --train, zero-offload" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --policy zero-offload
contains "$TMP/out" "policy zero-offload" "plan --train names zero-offload"
contains "$TMP/out" "verified    yes" "zero-offload plan verified"
contains "$TMP/out" "39 of 39 updates on the host CPU" "zero-offload: every update on the host"
expect 2 "zero-offload without --train" -- "$TIDE" plan --config llama-7b --budget 25% --policy zero-offload
contains "$TMP/err" "needs --train" "zero-offload without --train names why"
expect 2 "zero-offload in tide run" -- "$TIDE" run --model "$FX" --budget 25% --policy zero-offload
contains "$TMP/err" "plans a training step" "tide run --policy zero-offload names why"
expect 0 "plan --train --json at the minimum" -- "$TIDE" plan --train --config tinyllama-1.1b --batch 2 --seq 256 \
    --budget min --json
for f in pct_of_ideal x_lower_bound step_s ideal_step_s master_bytes moment_bytes gradient_bytes \
         kept_activation_bytes plan_seconds; do
    json_field "$TMP/out" "$f"
done
expect 2 "--accum without --train" -- "$TIDE" plan --config llama-7b --budget 25% --accum 2
# where AdamW runs: auto moves updates to the host CPU on the a100 profile and
# says by how much it beats all-device; device and cpu are what they say
# (untiled steps: the placement is the point here, row tiles below)
expect 0 "plan --train, AdamW placed" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --json --tile none
for f in optimizer_groups optimizer_host_groups device_optimizer_step_s; do json_field "$TMP/out" "$f"; done
grep -q '"optimizer_host_groups":[1-9]' "$TMP/out" && PASSES=$((PASSES + 1)) || { echo "FAIL: auto placed no update on the host"; FAILS=$((FAILS + 1)); }
auto_step=$(sed -e 's/.*"step_s":\([0-9.e+-]*\).*/\1/' "$TMP/out")
dev_step=$(sed -e 's/.*"device_optimizer_step_s":\([0-9.e+-]*\).*/\1/' "$TMP/out")
awk -v a="$auto_step" -v d="$dev_step" 'BEGIN { exit !(a < d) }' && PASSES=$((PASSES + 1)) || { echo "FAIL: auto step $auto_step not below all-device $dev_step"; FAILS=$((FAILS + 1)); }
expect 0 "plan --train --optimizer device" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --optimizer device --tile none
contains "$TMP/out" "AdamW: 0 of 39 updates on the host CPU" "device placement"
expect 0 "plan --train --optimizer cpu" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 4 \
    --budget 25% --hw a100-80g --optimizer cpu --tile none
contains "$TMP/out" "AdamW: 39 of 39 updates on the host CPU" "cpu placement"
# row tiles of a training step: the minimum with --optimizer cpu falls below
# the untiled step's, which --tile none keeps; the baselines tile only when told
expect 0 "plan --train, tiled minimum" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 1 \
    --budget min --hw a100-80g --optimizer cpu --json
for f in tile_level tile_seqs max_working_set_bytes untiled_max_working_set_bytes untiled_min_budget_bytes; do
    json_field "$TMP/out" "$f"
done
contains "$TMP/out" '"tile_seqs":1,' "the smallest minimum tiles one sequence at a time"
contains "$TMP/out" '"vocab_blocks":4,' "... with the embedding and the head in 4 vocabulary blocks"
tmin=$(sed -n 's/.*"budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out")
umin=$(sed -n 's/.*"untiled_min_budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out")
awk -v t="$tmin" -v u="$umin" 'BEGIN { exit !(t > 0 && 7 * t < u) }' && PASSES=$((PASSES + 1)) || { echo "FAIL: tiled minimum $tmin not below a seventh of the untiled $umin"; FAILS=$((FAILS + 1)); }
expect 0 "plan --train at the tiled minimum, text" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 \
    --accum 1 --budget "$tmin" --hw a100-80g --optimizer cpu
contains "$TMP/out" "row tiles of 1 of the 8 sequences, embedding and head in " "the tiling line"
# row tiles alone (level 3) stop at the head's loss, several times that
expect 0 "plan --train, row tiles alone" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 --accum 1 \
    --budget min --hw a100-80g --optimizer cpu --tile 3 --json
contains "$TMP/out" '"vocab_blocks":1,' "level 3 keeps the vocabulary whole"
rmin=$(sed -n 's/.*"budget_bytes":\([0-9]*\).*/\1/p' "$TMP/out")
awk -v t="$tmin" -v r="$rmin" 'BEGIN { exit !(t > 0 && 3 * t < 2 * r) }' && PASSES=$((PASSES + 1)) || { echo "FAIL: the minimum with vocabulary blocks $tmin is not below two thirds of row tiles' $rmin"; FAILS=$((FAILS + 1)); }
expect 1 "the tiled minimum with --tile none" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 \
    --accum 1 --budget "$tmin" --hw a100-80g --optimizer cpu --tile none
contains "$TMP/err" "silu_mul_bwd) needs at least" "--tile none below the untiled step names the op"
expect 0 "plan --train, zero-offload untiled at min" -- "$TIDE" plan --train --model "$L7B4" --batch 8 --seq 2048 \
    --accum 1 --budget min --hw a100-80g --policy zero-offload --json
contains "$TMP/out" '"tile_level":0,' "zero-offload is not tiled unless asked"
expect 2 "bad --tile with --train" -- "$TIDE" plan --train --config llama-7b --budget min --tile 7
expect 2 "--optimizer without --train" -- "$TIDE" plan --config llama-7b --budget 25% --optimizer cpu
expect 2 "--optimizer cpu under lru" -- "$TIDE" plan --train --config llama-7b --budget 25% --policy lru --optimizer cpu

# the matmul mode: f32 by default on the CPU; the fast mode offloaded stays bit-identical
expect 0 "default matmul on the CPU" -- "$TIDE" train --backend cpu --model "$FX" --data "$DATA" --steps 1 --batch 2 \
    --seq 16 --json
contains "$TMP/out" '"matmul":"f32"' "training keeps f32 matmuls on the CPU by default"
expect 0 "--matmul fast, offloaded, checked" -- "$TIDE" train --backend cpu --matmul fast --model "$FX" --data "$DATA" \
    --steps 2 --batch 2 --seq 16 --budget 25% --hw h100-80g --check --json
contains "$TMP/out" '"check_passed":true' "fast mode: bit-identical to the unconstrained run"
expect 2 "unknown --matmul" -- "$TIDE" train --model "$FX" --data "$DATA" --matmul half

# bad input
printf 'abc' > "$TMP/odd.u16"
expect 1 "odd-sized data" -- "$TIDE" train --model "$FX" --data "$TMP/odd.u16" --steps 1 --batch 2 --seq 16
contains "$TMP/err" "odd.u16" "message names the file"
head -c 20 "$DATA" > "$TMP/short.u16"
expect 1 "data shorter than a window" -- "$TIDE" train --model "$FX" --data "$TMP/short.u16" --steps 1 --batch 2 --seq 16
contains "$TMP/err" "short.u16" "message names the file"
python3 -c 'import sys; sys.stdout.buffer.write(bytes([5,0]*100 + [0xff,0xff] + [5,0]*100))' > "$TMP/big.u16"
expect 1 "token id beyond the vocabulary" -- "$TIDE" train --model "$FX" --data "$TMP/big.u16" --steps 1 --batch 2 --seq 16
contains "$TMP/err" "65535" "message names the id"
expect 1 "--seq beyond the model's positions" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 1 --seq 100000
contains "$TMP/err" "max_position_embeddings" "message names the limit"
touch "$TMP/afile"
expect 1 "--out under a file" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 --out "$TMP/afile/ck"
expect 1 "--out a file" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 --out "$TMP/afile"
contains "$TMP/err" "afile" "message names the path"
# an existing directory where no file can be created (root passes permission
# bits, not /proc's nor a read-only mount's refusal): refused before the first step
expect 1 "--out where no file can be created" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
    --out /proc/self
contains "$TMP/err" "no file can be created" "unwritable --out: message"
if ! grep -q "step" "$TMP/out"; then PASSES=$((PASSES + 1)); else echo "FAIL: unwritable --out: a step ran"; FAILS=$((FAILS + 1)); fi
mkdir -p "$TMP/ro"
if mount -t tmpfs -o ro,size=1m tmpfs "$TMP/ro" 2>/dev/null; then # where mounting is allowed (root in CI)
    expect 1 "--out a mount point" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
        --out "$TMP/ro"
    contains "$TMP/err" "mount point" "--out a mount point: message names the cause"
    expect 1 "--out inside a read-only mount" -- "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 \
        --seq 16 --out "$TMP/ro/ck"
    contains "$TMP/err" "Read-only file system" "read-only --out: message names the cause"
    umount "$TMP/ro"
fi
# a save that fills the disk: the earlier checkpoint stays whole
cp -r "$TMP/ck2" "$TMP/ckfull"
(ulimit -f 64; trap '' XFSZ; "$TIDE" train --model "$FX" --data "$DATA" --steps 1 --batch 2 --seq 16 \
    --out "$TMP/ckfull" >"$TMP/out" 2>"$TMP/err"); rc=$?
[ "$rc" -eq 1 ] && PASSES=$((PASSES + 1)) || { echo "FAIL: full disk: exit $rc"; FAILS=$((FAILS + 1)); }
expect 0 "the earlier checkpoint is intact" -- cmp "$TMP/ck2/optimizer.safetensors" "$TMP/ckfull/optimizer.safetensors"
[ -z "$(ls -d "$TMP"/ckfull.tmp* 2>/dev/null)" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: temporary left"; FAILS=$((FAILS + 1)); }
# resuming a state that does not match
expect 1 "resume with another batch" -- "$TIDE" train --resume "$TMP/ck2" --data "$DATA" --steps 4 --batch 4 --seq 16
contains "$TMP/err" "batch" "message names the mismatch"
expect 1 "resume into another model" -- "$TIDE" train --model "$TIDE_FIXTURES/train/train-f32-tied" --resume "$TMP/ck2" \
    --data "$DATA" --steps 4 --batch 2 --seq 16
contains "$TMP/err" "ck2" "message names the checkpoint"
expect 2 "--check without a budget" -- "$TIDE" train --model "$FX" --data "$DATA" --check
expect 2 "--model without --data" -- "$TIDE" train --model "$FX"
expect 2 "bad --lr" -- "$TIDE" train --model "$FX" --data "$DATA" --lr x
finish
