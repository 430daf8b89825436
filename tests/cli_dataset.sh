#!/usr/bin/env bash
# cli_dataset.sh - `tide train --data` on text (tests/fixtures/dataset, made by
# scripts/make_dataset_fixtures.py) and `tide tokenize --out`, end to end.
#
# What it proves: a .jsonl and a .txt of documents train the same steps, bit
# for bit, as the token file `tide tokenize --out` writes from them (raw and
# .npy); prompt/completion and chat examples train with the loss on the
# completion (and on everything with --train-on all: more targets), the
# truncation warning counts the examples cut; --eval, --eval-split and
# --eval-every print the validation loss and put it in --json; an offloaded
# run on masked examples is bit-identical to the resident one (--check); bad
# input (malformed JSON on line N, a missing field, an unknown role, an empty
# file, a model without a tokenizer given a .jsonl, examples to a token file)
# is refused naming the file and line, exit status non-zero, no output file.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/dataset
M=$FX/model
run=(--model "$M" --threads 2 --batch 2 --seq 48 --json)

expect 0 "train help" -- "$TIDE" train --help
for o in --train-on --template --eval --eval-split --eval-every .jsonl; do
    contains "$TMP/out" "$o" "train help lists $o"
done
expect 0 "tokenize help" -- "$TIDE" tokenize --help
contains "$TMP/out" "--out FILE" "tokenize help lists --out"

# documents: the .jsonl, the .txt and the token files tokenize --out writes
expect 0 "tokenize --out (.jsonl)" -- "$TIDE" tokenize --model "$M" --file "$FX/docs.jsonl" --out "$TMP/docs.u16"
contains "$TMP/out" "6 documents" "document count"
expect 0 "tokenize --out (.txt)" -- "$TIDE" tokenize --model "$M" --file "$FX/docs.txt" --out "$TMP/txt.u16"
expect 0 "tokenize --out (.npy)" -- "$TIDE" tokenize --model "$M" --file "$FX/docs.jsonl" --out "$TMP/docs.npy"
expect 0 "tokenize --out (u32)" -- "$TIDE" tokenize --model "$M" --file "$FX/docs.jsonl" --out "$TMP/docs.u32" \
    --data-dtype u32
contains "$TMP/out" "train with --data-dtype u32" "u32 output says how to train on it"
if cmp -s "$TMP/docs.u16" "$TMP/txt.u16"; then PASSES=$((PASSES + 1)); else
    echo "FAIL: the .txt and the .jsonl give different token files"; FAILS=$((FAILS + 1)); fi
losses() { grep '"step"' "$TMP/out" | grep -v '"eval"' | sed -e 's/.*"loss":\([^,]*\),.*"grad_norm":\([^,]*\),.*/\1 \2/'; }
for f in docs.jsonl docs.txt; do
    expect 0 "train on $f" -- "$TIDE" train "${run[@]}" --seq 16 --steps 4 --shuffle 3 --data "$FX/$f"
    losses >"$TMP/$f.loss"
done
for f in docs.u16 docs.npy; do
    expect 0 "train on $f" -- "$TIDE" train "${run[@]}" --seq 16 --steps 4 --shuffle 3 --data "$TMP/$f"
    losses >"$TMP/$f.loss"
done
expect 0 "train on docs.u32" -- "$TIDE" train "${run[@]}" --seq 16 --steps 4 --shuffle 3 --data "$TMP/docs.u32" \
    --data-dtype u32
losses >"$TMP/docs.u32.loss"
for f in docs.txt docs.u16 docs.npy docs.u32; do
    if [ -s "$TMP/$f.loss" ] && cmp -s "$TMP/docs.jsonl.loss" "$TMP/$f.loss"; then PASSES=$((PASSES + 1)); else
        echo "FAIL: docs.jsonl and $f train different steps"; paste "$TMP/docs.jsonl.loss" "$TMP/$f.loss" | head -4
        FAILS=$((FAILS + 1)); fi
done

# examples: the loss on the completion only, or on everything
expect 0 "prompt/completion" -- "$TIDE" train "${run[@]}" --steps 2 --data "$FX/pc.jsonl"
grep '"step":0' "$TMP/out" | sed -e 's/.*"targets":\([0-9]*\).*/\1/' >"$TMP/n.completion"
contains "$TMP/err" "1 of the training examples are longer than --seq 48 + 1 tokens: truncated" "truncation warning"
expect 0 "prompt/completion --train-on all" -- "$TIDE" train "${run[@]}" --steps 2 --train-on all --data "$FX/pc.jsonl"
grep '"step":0' "$TMP/out" | sed -e 's/.*"targets":\([0-9]*\).*/\1/' >"$TMP/n.all"
if [ "$(cat "$TMP/n.completion")" -lt "$(cat "$TMP/n.all")" ] 2>/dev/null; then PASSES=$((PASSES + 1)); else
    echo "FAIL: --train-on all trains $(cat "$TMP/n.all") targets, completion $(cat "$TMP/n.completion")"
    FAILS=$((FAILS + 1)); fi
expect 0 "chat, text output" -- "$TIDE" train --model "$M" --threads 2 --batch 2 --seq 48 --steps 2 \
    --data "$FX/chat.jsonl"
contains "$TMP/out" "4 examples" "the header counts the examples kept"
contains "$TMP/out" "2 truncated, 1 left out" "the header counts those truncated and left out"
contains "$TMP/out" "padding" "the header gives the padding"

expect 0 "chat, --template zephyr" -- "$TIDE" train "${run[@]}" --steps 1 --template zephyr --data "$FX/chat.jsonl"
expect 1 "chat, an unknown --template" -- "$TIDE" train "${run[@]}" --steps 1 --template nosuch \
    --data "$FX/chat.jsonl"
contains "$TMP/err" "chat.jsonl:1: a \"messages\" row needs a chat template: unknown chat template 'nosuch'" \
    "unknown template named"

# validation
expect 0 "--eval-split --eval-every" -- "$TIDE" train "${run[@]}" --steps 4 --eval-split 0.34 --eval-every 2 \
    --data "$FX/pc.jsonl"
n=$(grep -c '"eval":true' "$TMP/out")
if [ "$n" = 2 ]; then PASSES=$((PASSES + 1)); else echo "FAIL: $n validations, wanted 2"; FAILS=$((FAILS + 1)); fi
contains "$TMP/out" '"eval_loss":' "summary has eval_loss"
expect 0 "--eval FILE" -- "$TIDE" train --model "$M" --threads 2 --batch 2 --seq 48 --steps 2 \
    --data "$FX/chat.jsonl" --eval "$FX/pc.jsonl"
contains "$TMP/out" "eval       final validation loss" "validation loss printed"
expect 2 "--eval-every without a set" -- "$TIDE" train "${run[@]}" --steps 2 --eval-every 2 --data "$FX/pc.jsonl"
expect 1 "--eval-split of a token file" -- "$TIDE" train "${run[@]}" --seq 16 --steps 2 --eval-split 0.1 \
    --data "$TMP/docs.u16"
contains "$TMP/err" "not from a token file" "eval split of a token file refused"

# offloaded, masked: bit for bit the resident step
expect 0 "chat offloaded --check" -- "$TIDE" train "${run[@]}" --steps 3 --budget 40% --hw a100-80g --check --data "$FX/chat.jsonl"
contains "$TMP/out" '"check_passed":true' "offloaded masked run bit-identical"

# bad input: named with its line, non-zero, nothing written
printf '{"text": "a"}\n{"text": "b"}\n{"text": \n' >"$TMP/bad.jsonl"
expect 1 "malformed line 3" -- "$TIDE" train "${run[@]}" --steps 1 --data "$TMP/bad.jsonl"
contains "$TMP/err" "bad.jsonl:3: malformed JSON" "names line 3"
expect 1 "tokenize --out of a bad file" -- "$TIDE" tokenize --model "$M" --file "$TMP/bad.jsonl" --out "$TMP/bad.u16"
contains "$TMP/err" "bad.jsonl:3:" "tokenize names line 3"
if [ -e "$TMP/bad.u16" ] || ls "$TMP"/bad.u16.* >/dev/null 2>&1; then
    echo "FAIL: tokenize --out left a file"; FAILS=$((FAILS + 1)); else PASSES=$((PASSES + 1)); fi
printf '{"prompt": "a"}\n' >"$TMP/missing.jsonl"
expect 1 "missing completion" -- "$TIDE" train "${run[@]}" --steps 1 --data "$TMP/missing.jsonl"
contains "$TMP/err" "missing.jsonl:1: \"prompt\" and \"completion\" must both be strings" "missing field named"
printf '{"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}\n' >"$TMP/role.jsonl"
expect 1 "unknown role" -- "$TIDE" train "${run[@]}" --steps 1 --data "$TMP/role.jsonl"
contains "$TMP/err" "role.jsonl:1: message 1 has the unknown role 'robot'" "unknown role named"
: >"$TMP/empty.jsonl"
expect 1 "empty file" -- "$TIDE" train "${run[@]}" --steps 1 --data "$TMP/empty.jsonl"
contains "$TMP/err" "empty.jsonl: no rows" "empty file named"
expect 1 "examples to a token file" -- "$TIDE" tokenize --model "$M" --file "$FX/pc.jsonl" --out "$TMP/pc.u16"
contains "$TMP/err" "cannot be written as a token file" "examples refused by tokenize --out"
[ -e "$TMP/pc.u16" ] && { echo "FAIL: tokenize --out left pc.u16"; FAILS=$((FAILS + 1)); }
expect 1 "a model without a tokenizer" -- "$TIDE" train --model "$TIDE_FIXTURES/tiny-f32-mha" --threads 2 \
    --batch 1 --seq 8 --steps 1 --data "$FX/docs.jsonl"
contains "$TMP/err" "is text: it is encoded with the model's tokenizer" "no tokenizer named"
finish
