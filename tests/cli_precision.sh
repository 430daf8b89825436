#!/usr/bin/env bash
# cli_precision.sh - `tide train --precision` and `tide plan --train
# --precision` (docs/training.md, section 13):
#   - bf16 against PyTorch's autocast (tests/fixtures/train/autocast-gqa,
#     made by scripts/make_autocast_fixture.py): every step's loss within a
#     relative 2e-3 and gradient norm within 5e-3 of torch.autocast(cpu,
#     bfloat16)'s. Why that much: bf16 rounds every product's operands to 8
#     bits of mantissa, so two correct bf16 steps differ by rounding noise
#     that compounds over the steps; PyTorch's own two autocast runs of the
#     fixture, which differ only in the attention kernel (SDPA, eager), are
#     up to 4.6e-4 apart in loss and 2.1e-3 in gradient norm, and tide's bf16
#     step lands 4.9e-4 and 1.4e-3 from the SDPA run. The bound is about four
#     times PyTorch's own spread in loss, twice in gradient norm. A
#     wrong rounding, a product left in f32 where bf16 is kept, or a lost
#     term is far outside it; the kernels' exact arithmetic is
#     test_kernels_bf16's.
#   - f32 unchanged: --precision f32 within 1e-5 of PyTorch's f32 run of the
#     same fixture (as test_train holds the other fixtures).
#   - bf16 is a step of its own (not the f32 one's bits) and `auto` is bf16
#     where cpuid reports AVX512_BF16 (or AMX-BF16), else f32.
#   - offloaded bf16 steps bit for bit the unconstrained bf16 step (--check):
#     every policy cli_train.sh checks, state on SSD at the minimum budget, row
#     tiles with the head in vocabulary blocks; LoRA and QLoRA too.
#   - the planner's kept activations: every one a bf16 step keeps in bf16
#     planned at half its f32 bytes (the residual stream h, hm and the head's
#     input gradient stay f32), checked exactly against the model's shapes.
#   - refusals: an unknown precision, --precision bf16 on --backend cuda (not
#     built), plan --precision without --train.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
AC=$TIDE_FIXTURES/train/autocast-gqa
FX=$TIDE_FIXTURES/train/train-bf16-gqa
F32=$TIDE_FIXTURES/train/train-f32-gqa

expect 0 "train help" -- "$TIDE" train --help
contains "$TMP/out" "--precision P" "train help lists --precision"
expect 0 "plan help" -- "$TIDE" plan --help
contains "$TMP/out" "--precision P" "plan help lists --precision"

# ---- against PyTorch: f32 and autocast bf16
run_ac() {
    expect 0 "autocast fixture, --precision $1" -- "$TIDE" train --model "$AC" --data "$AC/data.u16" --steps 10 \
        --batch 2 --seq 16 --accum 2 --lr 3e-3 --min-lr 3e-4 --warmup 3 --precision "$1" --json
    cp "$TMP/out" "$TMP/ac_$1.json"
}
run_ac f32
run_ac bf16
contains "$TMP/ac_bf16.json" '"precision":"bf16"' "the summary names bf16"
contains "$TMP/ac_f32.json" '"precision":"f32"' "the summary names f32"
if python3 - "$AC/expected.json" "$TMP/ac_f32.json" "$TMP/ac_bf16.json" <<'EOF'; then PASSES=$((PASSES + 1)); else echo "FAIL: against PyTorch"; FAILS=$((FAILS + 1)); fi
import json, sys
exp = json.load(open(sys.argv[1]))
def steps(path):
    return [o for o in map(json.loads, open(path)) if "step" in o and "loss" in o]
ok = True
for name, path, key, tl, tg in (("f32", sys.argv[2], "f32", 1e-5, 1e-5), ("bf16", sys.argv[3], "bf16", 2e-3, 5e-3)):
    got = steps(path)
    if len(got) != len(exp[key]["loss"]):
        print(f"{name}: {len(got)} steps, the fixture has {len(exp[key]['loss'])}")
        ok = False
        continue
    wl = max(abs(g["loss"] - w) / w for g, w in zip(got, exp[key]["loss"]))
    wg = max(abs(g["grad_norm"] - w) / w for g, w in zip(got, exp[key]["grad_norm"]))
    print(f"{name}: loss within {wl:.2e} (bound {tl:g}), grad norm within {wg:.2e} (bound {tg:g}) of PyTorch")
    ok &= wl <= tl and wg <= tg
# the bf16 step is not the f32 one
f, b = steps(sys.argv[2]), steps(sys.argv[3])
if all(x["loss"] == y["loss"] for x, y in zip(f, b)):
    print("bf16 gave the f32 step's losses")
    ok = False
sys.exit(0 if ok else 1)
EOF

# ---- auto: bf16 where the CPU has bf16 products in hardware
expect 0 "--precision auto" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" --steps 1 --batch 2 --seq 16 \
    --precision auto --json
if grep -qE '^flags.*(avx512_bf16|amx_bf16)' /proc/cpuinfo && grep -qE '^flags.* avx512f ' /proc/cpuinfo; then
    contains "$TMP/out" '"precision":"bf16"' "auto is bf16 on a CPU with AVX512_BF16"
else
    contains "$TMP/out" '"precision":"f32"' "auto is f32 on a CPU without bf16 products"
fi
expect 0 "the header names the bf16 path" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" --steps 1 \
    --batch 2 --seq 16 --precision bf16
contains "$TMP/out" "precision  bf16" "the header names the precision"

# ---- offloaded bf16 steps: bit for bit the unconstrained bf16 step
mkdir -p "$TMP/spill"
for pb in tide:25% static-layer:50% lru:25% checkpoint-layer:25% zero-offload:25%; do
    p=${pb%%:*} b=${pb#*:}
    expect 0 "bf16 offloaded at $b, $p, checked" -- "$TIDE" train --model "$FX" --data "$FX/data.u16" --steps 3 \
        --batch 2 --seq 16 --accum 2 --budget "$b" --policy "$p" --hw h100-80g --check --json --ssd "$TMP/spill" \
        --precision bf16
    contains "$TMP/out" '"check_passed":true' "bf16, $p: bit-identical to the unconstrained run"
done
expect 0 "bf16, state on SSD at the minimum, checked" -- "$TIDE" train --model "$FX" --data "$FX/data.u16" \
    --steps 2 --batch 2 --seq 16 --budget min --host-budget 600K --hw h100-80g --check --json --ssd "$TMP/spill" \
    --precision bf16
contains "$TMP/out" '"check_passed":true' "bf16, SSD-homed state: bit-identical"
expect 0 "bf16, tiled minimum, checked" -- "$TIDE" train --model "$FX" --data "$FX/data.u16" --steps 2 --batch 2 \
    --seq 16 --accum 2 --budget min --optimizer cpu --hw h100-80g --check --json --ssd "$TMP/spill" --precision bf16
contains "$TMP/out" '"check_passed":true' "bf16, tiled: bit-identical to the resident run of the same tiles"
contains "$TMP/out" '"tile_seqs":1' "bf16, tiled: one sequence a tile"
if grep -q '"vocab_blocks":1,' "$TMP/out"; then
    echo "FAIL: the tiled minimum did not run the head in vocabulary blocks"
    FAILS=$((FAILS + 1))
else
    PASSES=$((PASSES + 1))
fi
# f32 base (its weights rounded to bf16 as the products read them)
expect 0 "bf16 on an f32 model, offloaded, checked" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" \
    --steps 2 --batch 2 --seq 16 --accum 2 --budget 25% --hw h100-80g --check --json --precision bf16
contains "$TMP/out" '"check_passed":true' "bf16 on an f32 model: bit-identical"

# ---- LoRA and QLoRA share the bf16 step graph
for extra in "" "--base-type q8_0"; do
    expect 0 "bf16 LoRA $extra, offloaded, checked" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" \
        --steps 2 --batch 2 --seq 16 --accum 2 --lora-r 4 $extra --budget 25% --hw h100-80g --check --json \
        --precision bf16
    contains "$TMP/out" '"check_passed":true' "bf16 LoRA $extra: bit-identical"
    contains "$TMP/out" '"precision":"bf16"' "bf16 LoRA $extra: the summary says so"
done

# ---- the planner: kept activations at bf16's bytes
for p in f32 bf16; do
    expect 0 "plan --train --precision $p" -- "$TIDE" plan --train --model "$F32" --batch 2 --seq 16 --budget 50% \
        --tile none --hw h100-80g --precision "$p" --json
    cp "$TMP/out" "$TMP/plan_$p.json"
done
contains "$TMP/plan_bf16.json" '"precision":"bf16"' "plan JSON names bf16"
if python3 - "$F32/config.json" "$TMP/plan_f32.json" "$TMP/plan_bf16.json" <<'EOF'; then PASSES=$((PASSES + 1)); else echo "FAIL: kept activations"; FAILS=$((FAILS + 1)); fi
import json, sys
c = json.load(open(sys.argv[1]))
f, b = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
D, I, L = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
kd = c["num_key_value_heads"] * D // c["num_attention_heads"]
R = 2 * 16
# kept per layer and row in bf16: xn, qr, a, xn2 (D each), kr, v (kd), g, u, s (I)
half = R * L * (4 * D + 2 * kd + 3 * I) * 2
kf, kb = f["kept_activation_bytes"], b["kept_activation_bytes"]
print(f"kept activations: f32 {kf} bytes, bf16 {kb} bytes; the bf16-kept ones {2 * half} -> {half}")
ok = kf - kb == half and kb < kf and b["unconstrained_peak_bytes"] < f["unconstrained_peak_bytes"]
# the f32 rest: h of every layer and the last, hm, and the head's input gradient
ok &= kb - half == R * 4 * (L * 2 * D + 2 * D)
sys.exit(0 if ok else 1)
EOF
expect 0 "plan table" -- "$TIDE" plan --train --model "$F32" --batch 2 --seq 16 --budget 50% --hw h100-80g \
    --precision bf16
contains "$TMP/out" "precision   bf16" "the plan table names bf16"

# ---- refusals
expect 2 "unknown --precision" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" --precision f16
contains "$TMP/err" "--precision 'f16'" "names the value"
expect 2 "bf16 on --backend cuda" -- "$TIDE" train --model "$F32" --data "$F32/data.u16" --backend cuda \
    --precision bf16
contains "$TMP/err" "--precision bf16 on --backend cuda is not built" "names why"
expect 2 "plan --precision without --train" -- "$TIDE" plan --config llama-7b --budget 25% --precision bf16
contains "$TMP/err" "needs --train" "plan names why"
expect 2 "plan --precision auto" -- "$TIDE" plan --train --config llama-7b --budget 25% --precision auto
finish
