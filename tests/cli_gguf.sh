#!/usr/bin/env bash
# cli_gguf.sh - the commands on GGUF files (tests/fixtures/gguf, see
# tests/fixtures/README.md): `tide run --model FILE.gguf --tokens ...` gives
# the tokens the safetensors directory it was made from gives (greedy, with the
# weights in memory and homed on SSD, f32 and f16), `tide plan` reads the
# configuration from the metadata, `tide serve` accepts the file, and a GGUF
# file has no tokenizer yet (as a directory without tokenizer.json: text
# prompts and `tide tokenize` fail naming the file), `tide train` refuses it.
#
# What it proves: GGUF checkpoints run end to end through the CLI with the
# same greedy tokens as their safetensors checkpoints.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
G=$TIDE_FIXTURES/gguf
IDS=17,3,150,99,4,128,61

# generated FILE: the "generated" line's ids
generated() { sed -n 's/^generated  *//p' "$1"; }

# the machine measured once for the offloaded runs below (--hw HW), not once
# per run as a run without --hw does first (that path: cli_run)
expect 0 "probe" -- "$TIDE" probe --backend cpu --seconds 1 --ssd "$TMP" --out "$TMP/hw.json"
HW=(--hw "$TMP/hw.json")

for pair in tiny-f32-mha:tiny-f32-mha tiny-f16-sharded:tiny-f16-sharded; do
    gg=$G/${pair%%:*}.gguf st=$TIDE_FIXTURES/${pair#*:}
    expect 0 "run $st" -- "$TIDE" run --model "$st" --backend cpu --tokens $IDS --new-tokens 8
    want=$(generated "$TMP/out")
    for mode in "" "--weights-on-ssd --budget 50% --ssd $TMP ${HW[*]}"; do
        # shellcheck disable=SC2086
        expect 0 "run $gg $mode" -- "$TIDE" run --model "$gg" --backend cpu --tokens $IDS --new-tokens 8 $mode
        got=$(generated "$TMP/out")
        if [ -n "$want" ] && [ "$got" = "$want" ]; then PASSES=$((PASSES + 1)); else
            echo "FAIL: $gg $mode: generated '$got', the safetensors directory '$want'"; FAILS=$((FAILS + 1)); fi
        contains "$TMP/out" "model      $gg" "run names the GGUF file"
    done
done

# weights homed on SSD are read from the GGUF file at its tensors' offsets
# (32-byte aligned, not 4096: the executor's unaligned path)
expect 0 "run --check on a GGUF file" -- "$TIDE" run --model "$G/tiny-f16-sharded.gguf" --backend cpu --tokens $IDS \
    --new-tokens 4 --budget 50% --weights-on-ssd --ssd "$TMP" "${HW[@]}" --check --json
contains "$TMP/out" '"check_bit_identical":true' "offloaded GGUF run bit-identical to the reference engine"
contains "$TMP/out" '"weights_on_ssd":true' "weights homed on SSD"
if grep -q '"bytes_ssd_read":[1-9]' "$TMP/out"; then PASSES=$((PASSES + 1)); else
    echo "FAIL: no bytes read from the GGUF file"; FAILS=$((FAILS + 1)); fi

expect 0 "plan --model FILE.gguf" -- "$TIDE" plan --model "$G/tiny-f16-sharded.gguf" --seq 16 --budget 50%
contains "$TMP/out" "plan        tiny-f16-sharded prefill" "plan reads the GGUF metadata"

# no tokenizer in these files: text needs one, as for a directory without tokenizer.json
expect 1 "text prompt" -- "$TIDE" run --model "$G/tiny-f32-mha.gguf" --backend cpu --prompt hello
contains "$TMP/err" "tiny-f32-mha.gguf" "the tokenizer message names the file"
expect 1 "tokenize" -- "$TIDE" tokenize --model "$G/tiny-f32-mha.gguf" hello
contains "$TMP/err" "tiny-f32-mha.gguf" "tokenize names the file"

# damaged and unsupported files
head -c 1000 "$G/tiny-f32-mha.gguf" >"$TMP/cut.gguf"
expect 1 "truncated GGUF" -- "$TIDE" run --model "$TMP/cut.gguf" --backend cpu --tokens 1,2
contains "$TMP/err" "cut.gguf" "the message names the file"
contains "$TMP/err" "past the end" "the message says what is wrong"
expect 0 "Q8_0 GGUF at the minimum budget, tiled, weights on SSD, checked" -- "$TIDE" run \
    --model "$G/tiny-f16-sharded-q8_0.gguf" --backend cpu --tokens 1,2,3,4,5 --new-tokens 4 --budget min \
    --weights-on-ssd --ssd "$TMP" "${HW[@]}" --check --json
contains "$TMP/out" '"check_passed":true' "the offloaded Q8_0 run equals the unconstrained one"

# training needs Hugging Face's q/k order: refused, saying so
expect 1 "train on a GGUF file" -- "$TIDE" train --model "$G/tiny-f32-mha.gguf" \
    --data "$TIDE_FIXTURES/train/train-f32-tied/data.u16" --seq 16 --steps 1
contains "$TMP/err" "llama.cpp's order" "train says why"

# serve takes a GGUF file as a model
printf 'hello' >"$TMP/cut.txt"
expect 2 "serve: a text file is no model" -- "$TIDE" serve --model m="$TMP/cut.txt" --budget 1G
contains "$TMP/err" "neither a GGUF file nor a directory" "serve says what a model is"

finish
