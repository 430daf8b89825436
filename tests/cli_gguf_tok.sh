#!/usr/bin/env bash
# cli_gguf_tok.sh - text through a GGUF file's own tokenizer and chat template
# (tests/fixtures/gguf-tok/tiny-chat.gguf: tiny-f16-sharded's weights with a
# SentencePiece-style tokenizer and the llama2 template in its metadata, see
# tests/fixtures/README.md): `tide tokenize`, `tide run --prompt` (plain and
# --chat) and `tide chat` read them from the file alone, and the prompts they
# feed the model are the tokenizer's ids of the text (and of the template's
# render).
#
# What it proves: `--model FILE.gguf` needs no other file for text in and out.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
M=$TIDE_FIXTURES/gguf-tok/tiny-chat.gguf

# count TEXT [OPTIONS]: the number of ids `tide tokenize` gives
count() {
    local text=$1
    shift
    "$TIDE" tokenize --model "$M" --json "$@" "$text" | sed -e 's/^{"ids":\[\([0-9,]*\)\].*/\1/' | tr ',' '\n' | wc -l
}
# check WHAT GOT WANT
check() {
    if [ -n "$2" ] && [ "$2" = "$3" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: $2, expected $3"; FAILS=$((FAILS + 1)); fi
}

expect 0 "tokenize" -- "$TIDE" tokenize --model "$M" --json "Hello world"
contains "$TMP/out" '{"ids":[1,89,36,57,64,64,67,89,75,67,70,64,56],' "BOS, the space prefix, the pieces"

expect 0 "run --prompt" -- "$TIDE" run --model "$M" --backend cpu --prompt "Hello world" --new-tokens 4 --json
check "run's prompt tokens" "$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$TMP/out")" "$(count "Hello world")"
contains "$TMP/out" '"new_tokens":4' "four tokens generated"
json_field "$TMP/out" text

expect 0 "run --chat" -- "$TIDE" run --model "$M" --backend cpu --prompt "Hello world" --chat --new-tokens 2 --json
check "the llama2 render's tokens" "$(sed -n 's/.*"prompt_tokens":\([0-9]*\).*/\1/p' "$TMP/out")" \
    "$(count "<s>[INST] Hello world [/INST]" --no-bos)"

printf 'Hi there\n' >"$TMP/in.txt"
expect 0 "chat" -- "$TIDE" chat --model "$M" --backend cpu --new-tokens 3 <"$TMP/in.txt"
contains "$TMP/err" "1 turns" "one turn"
check "chat's first turn" "$(sed -n 's/.*prefill [^(]*(\([0-9]*\) tokens).*/\1/p' "$TMP/err")" \
    "$(count "<s>[INST] Hi there [/INST]" --no-bos)"

finish
