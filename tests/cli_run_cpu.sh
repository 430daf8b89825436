#!/usr/bin/env bash
# cli_run_cpu.sh - `tide run` offloaded on the CPU backend, whose device memory
# is host memory: tensors homed in host memory are used in place (nothing
# crosses the host link), offloading streams the weights from SSD, and every
# run is bit-identical to the unconstrained reference run (the plain engine,
# run after it); the peak RSS of both runs is reported, and the offloaded
# one's held below the reference's (the README's memory claim); the predicted
# against measured prefill and decode are reported.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/tiny-bf16-gqa

# json_num FILE FIELD: the number a one-line JSON object holds in FIELD
json_num() {
    sed -n "s/.*\"$2\":\([-0-9.eE+]*\).*/\1/p" "$1"
}

# positive FILE FIELD DESCRIPTION: FIELD is a number > 0
positive() {
    local v
    v=$(json_num "$1" "$2")
    if [ -n "$v" ] && awk "BEGIN { exit !($v > 0) }"; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $3: $2 is '$v'"; FAILS=$((FAILS + 1)); fi
}

expect 0 "help" -- "$TIDE" run --help
for o in "host memory" "--weights-on-ssd" "peak resident memory" "unconstrained peak"; do
    contains "$TMP/out" "$o" "run help explains $o"
done

# the fixture's architecture, wider and deeper (about 50 MB of bf16 weights),
# so that 10% of its peak holds its largest op
mkdir -p "$TMP/cfg"
sed -e 's/"hidden_size": [0-9]*/"hidden_size": 512/' -e 's/"intermediate_size": [0-9]*/"intermediate_size": 1408/' \
    -e 's/"head_dim": [0-9]*/"head_dim": 64/' -e 's/"num_attention_heads": [0-9]*/"num_attention_heads": 8/' \
    -e 's/"vocab_size": [0-9]*/"vocab_size": 2000/' "$FX/config.json" >"$TMP/cfg/config.json"
expect 0 "make-model" -- "$TIDE" make-model --config "$TMP/cfg/config.json" --layers 8 --seed 5 "$TMP/m"
mkdir -p "$TMP/spill"
# the machine measured once for the offloaded runs below (--hw HW), not once
# per run as a run without --hw does first (that path: cli_run)
expect 0 "probe" -- "$TIDE" probe --backend cpu --seconds 1 --ssd "$TMP" --out "$TMP/hw.json"
HW=(--hw "$TMP/hw.json")

# weights streamed from SSD at 25% and 10% of the unconstrained peak
for b in 25% 10%; do
    expect 0 "weights on SSD at $b, checked" -- "$TIDE" run --model "$TMP/m" --backend cpu --new-tokens 6 \
        --budget $b --weights-on-ssd --ssd "$TMP/spill" --check --json "${HW[@]}"
    contains "$TMP/out" '"check_bit_identical":true' "weights on SSD at $b: bit-identical to the unconstrained run"
    contains "$TMP/out" '"bytes_h2d":0,' "weights on SSD at $b: nothing copied host to device"
    contains "$TMP/out" '"bytes_d2h":0,' "weights on SSD at $b: nothing copied device to host"
    contains "$TMP/out" '"weights_on_ssd":true' "JSON says the weights are on SSD"
    positive "$TMP/out" bytes_ssd_read "weights on SSD at $b: read from SSD"
    positive "$TMP/out" run_peak_rss_bytes "weights on SSD at $b: this run's peak RSS"
    positive "$TMP/out" reference_peak_rss_bytes "weights on SSD at $b: the reference run's peak RSS"
    positive "$TMP/out" predicted_decode_s "weights on SSD at $b: a predicted decode"
    json_field "$TMP/out" budget_fraction
    cp "$TMP/out" "$TMP/ssd$b.json"
done
# the budget is what it says: 10% of the peak is smaller than 25%
b25=$(json_num "$TMP/ssd25%.json" budget_bytes)
b10=$(json_num "$TMP/ssd10%.json" budget_bytes)
if awk "BEGIN { exit !($b10 < $b25) }"; then PASSES=$((PASSES + 1)); else
    echo "FAIL: 10% budget ($b10) not below 25% ($b25)"; FAILS=$((FAILS + 1)); fi

# the headline claim (README's memory table): weights streamed from SSD keep
# the process's resident memory below the unconstrained run's. Asserted on
# what each run adds to the process's resident memory at its start (the
# model's 50 MB against a baseline of about 170 MB): at 25% at most 0.8 of
# the reference run's growth (0.65 measured), at 10% less than at 25%, and
# each peak below the reference's.
r25=$(json_num "$TMP/ssd25%.json" run_peak_rss_bytes); s25=$(json_num "$TMP/ssd25%.json" run_start_rss_bytes)
f25=$(json_num "$TMP/ssd25%.json" reference_peak_rss_bytes)
r10=$(json_num "$TMP/ssd10%.json" run_peak_rss_bytes); s10=$(json_num "$TMP/ssd10%.json" run_start_rss_bytes)
f10=$(json_num "$TMP/ssd10%.json" reference_peak_rss_bytes)
echo "peak RSS: 25%: $r25 (start $s25, reference $f25); 10%: $r10 (start $s10, reference $f10)"
if awk "BEGIN { g25 = $r25 - $s25; g10 = $r10 - $s10; exit !($r25 < $f25 && $r10 < $f10 && g25 <= 0.8 * ($f25 - $s25) && g10 < g25) }"
then PASSES=$((PASSES + 1)); else
    echo "FAIL: weights on SSD: the peak RSS is not below the unconstrained run's as claimed"; FAILS=$((FAILS + 1)); fi

# weights homed in host memory: used in place, no copy, no read
expect 0 "weights on host at 25%, checked" -- "$TIDE" run --model "$TMP/m" --backend cpu --new-tokens 6 \
    --budget 25% --ssd "$TMP/spill" --check --json "${HW[@]}"
contains "$TMP/out" '"check_bit_identical":true' "weights in place at 25%: bit-identical"
contains "$TMP/out" '"bytes_h2d":0,' "weights in place: nothing copied host to device"
contains "$TMP/out" '"bytes_ssd_read":0,' "weights in place: nothing read from SSD"

# the baselines copy every tensor into the arena, as on a device
expect 0 "static-layer at 50%, checked" -- "$TIDE" run --model "$TMP/m" --backend cpu --new-tokens 4 \
    --budget 50% --policy static-layer --check --json "${HW[@]}"
contains "$TMP/out" '"check_bit_identical":true' "static-layer on the CPU: bit-identical"
positive "$TMP/out" bytes_h2d "static-layer on the CPU copies weights in"

# the summary: memory of both runs, predictions against measurements
expect 0 "summary" -- "$TIDE" run --model "$TMP/m" --backend cpu --new-tokens 4 --budget 10% --weights-on-ssd \
    --ssd "$TMP/spill" --check "${HW[@]}"
contains "$TMP/out" "memory     peak RSS" "summary gives the peak RSS"
contains "$TMP/out" "during the unconstrained reference run" "summary gives the reference run's peak RSS"
contains "$TMP/out" "predicted  prefill" "summary gives the predicted prefill"
contains "$TMP/out" "decode" "summary gives the predicted decode"
contains "$TMP/out" "(10% of the unconstrained peak)" "summary states the fraction"
contains "$TMP/out" "homed on SSD" "summary says where the weights are"
contains "$TMP/out" "check      passed, tokens and logits bit-identical" "summary: bit-identical"
if [ -z "$(ls -A "$TMP/spill")" ]; then PASSES=$((PASSES + 1)); else
    echo "FAIL: spill directory not empty: $(ls "$TMP/spill")"; FAILS=$((FAILS + 1)); fi

# bad input keeps its clear errors
expect 1 "weights on SSD, budget below the minimum" -- "$TIDE" run --model "$TMP/m" --backend cpu --budget 4K \
    --weights-on-ssd --tile none --new-tokens 2 "${HW[@]}"
contains "$TMP/err" "needs at least" "message gives the minimum"
expect 2 "--weights-on-ssd without a budget" -- "$TIDE" run --model "$TMP/m" --weights-on-ssd
finish
