#!/usr/bin/env bash
# cli_text_hf.sh - text in and text out against Hugging Face transformers, end
# to end: on a whole Hub-layout model directory (tests/fixtures/hf-text, made by
# scripts/make_hf_text_fixture.py: a tiny f32 LLaMA, a byte-level BPE
# tokenizer, a ChatML template, two EOS ids), `tide run --prompt TEXT` prints
# exactly the text transformers' greedy generate() + decode() gave, with the
# same ids and the same stop (one case stops on EOS); `tide run --chat
# --system` generates from the prompt apply_chat_template gave; `tide
# tokenize` gives the recorded prompt ids; offloaded runs (--budget 50%
# --check) print the same; --prompt-file reads a multi-line prompt exactly.
# The expected texts hold U+FFFD (byte tokens that are not whole UTF-8
# sequences) and control characters, so the JSON escaping and the streaming
# decoder are compared too. --matmul f32: the reference is f32, and its
# smallest top-1/top-2 logit gap (expected.json) is far above f32 rounding.
#
# What it proves: a tiny f32 LLaMA saved by transformers with a trained
# byte-level BPE tokenizer and a ChatML template (`tests/fixtures/hf-text`,
# `scripts/make_hf_text_fixture.py`; top-2 logit gaps of at least 0.012 at
# every greedy step): for five prompts (ASCII, accents and emoji, code, a
# multi-line prompt from a file that stops on EOS, a chat with a system
# message) `tide run --prompt`/`--chat` prints exactly the text transformers'
# greedy `generate` + `decode` gives, the same ids and stop reason, resident
# and offloaded; `tide tokenize` gives the same prompt ids.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
M=$TIDE_FIXTURES/hf-text
C=$M/cases
N=16

# json_str FILE FIELD: a string field of the one-line JSON object (escapes kept)
json_str() { sed -e "s/.*\"$2\":\"\(\([^\"\\\\]\|\\\\.\)*\)\".*/\1/" "$1"; }
# json_ids FILE FIELD: an int array field as "1,2,3"
json_ids() { sed -e "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/" "$1"; }
# same WHAT GOT WANT
same() {
    if [ "$2" = "$3" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: got [$2], wanted [$3]"; FAILS=$((FAILS + 1)); fi
}
# slurp VAR FILE: the file's bytes into VAR, trailing newlines kept
slurp() { local s; s=$(cat "$2"; printf x); printf -v "$1" '%s' "${s%x}"; }
# check_json CASE WHAT: the --json run in $TMP/out generated what transformers did
check_json() {
    same "$1: $2: tokens" "$(json_ids "$TMP/out" tokens)" "$(cat "$C/$1.tokens")"
    same "$1: $2: text" "$(json_str "$TMP/out" text)" "$(cat "$C/$1.json")"
    same "$1: $2: stop reason" "$(json_str "$TMP/out" stop_reason)" "$(cat "$C/$1.stop")"
}
# check_raw CASE WHAT: the --quiet run's standard output is the text and one newline
check_raw() {
    { cat "$C/$1.text"; echo; } > "$TMP/want"
    if cmp -s "$TMP/out" "$TMP/want"; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: $2: printed text differs"
        od -c "$TMP/out" | head -4 | sed 's/^/  got:  /'
        od -c "$TMP/want" | head -4 | sed 's/^/  want: /'
        FAILS=$((FAILS + 1))
    fi
}

RUN=(run --model "$M" --new-tokens "$N" --matmul f32)

for c in ascii accents-emoji code multiline; do
    slurp p "$C/$c.prompt"
    # the prompt's ids: those transformers' tokenizer gave (BOS added)
    expect 0 "$c: tokenize" -- "$TIDE" tokenize --model "$M" --json "$p"
    same "$c: prompt ids" "$(json_ids "$TMP/out" ids)" "$(cat "$C/$c.ids")"

    expect 0 "$c: run --prompt --json" -- "$TIDE" "${RUN[@]}" --prompt "$p" --json
    check_json "$c" "resident"
    same "$c: prompt tokens" "$(sed -e 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$TMP/out")" \
        "$(tr ',' ' ' < "$C/$c.ids" | wc -w | tr -d ' ')"
    expect 0 "$c: run --prompt --quiet" -- "$TIDE" "${RUN[@]}" --prompt "$p" --quiet
    check_raw "$c" "resident"

    expect 0 "$c: offloaded, checked" -- "$TIDE" "${RUN[@]}" --prompt "$p" --json --budget 50% --hw h100-80g --check
    check_json "$c" "offloaded"
    contains "$TMP/out" '"check_passed":true' "$c: offloaded run equals the plain reference"
    expect 0 "$c: offloaded --quiet" -- "$TIDE" "${RUN[@]}" --prompt "$p" --quiet --budget 50% --hw h100-80g
    check_raw "$c" "offloaded"
done

# a multi-line prompt from a file, its bytes exactly (the trailing newline too)
expect 0 "multiline: tokenize --file" -- "$TIDE" tokenize --model "$M" --json --file "$C/multiline.prompt"
same "multiline: prompt ids from the file" "$(json_ids "$TMP/out" ids)" "$(cat "$C/multiline.ids")"
expect 0 "multiline: run --prompt-file" -- "$TIDE" "${RUN[@]}" --prompt-file "$C/multiline.prompt" --json
check_json multiline "--prompt-file"
expect 0 "multiline: run --prompt-file --quiet" -- "$TIDE" "${RUN[@]}" --prompt-file "$C/multiline.prompt" --quiet
check_raw multiline "--prompt-file"
expect 0 "multiline: --prompt-file offloaded" -- "$TIDE" "${RUN[@]}" --prompt-file "$C/multiline.prompt" --json \
    --budget 50% --hw h100-80g --check
check_json multiline "--prompt-file offloaded"

# the chat: the template's rendering reads as apply_chat_template's ids (no
# BOS added: the template writes what it wants), and --chat generates what
# transformers generated from those ids
expect 0 "chat: tokenize the rendering" -- "$TIDE" tokenize --model "$M" --json --no-bos --file "$C/chat.rendered"
same "chat: prompt ids" "$(json_ids "$TMP/out" ids)" "$(cat "$C/chat.ids")"
slurp sys "$C/chat.system"
slurp user "$C/chat.prompt"
expect 0 "chat: run --chat --json" -- "$TIDE" "${RUN[@]}" --chat --system "$sys" --prompt "$user" --json
check_json chat "resident"
same "chat: prompt tokens" "$(sed -e 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$TMP/out")" \
    "$(tr ',' ' ' < "$C/chat.ids" | wc -w | tr -d ' ')"
expect 0 "chat: run --tokens of apply_chat_template's ids" -- "$TIDE" "${RUN[@]}" --tokens "$(cat "$C/chat.ids")" --json
same "chat: the ids generate the same" "$(json_ids "$TMP/out" tokens)" "$(cat "$C/chat.tokens")"
expect 0 "chat: run --chat --quiet" -- "$TIDE" "${RUN[@]}" --chat --system "$sys" --prompt "$user" --quiet
check_raw chat "resident"
expect 0 "chat: offloaded, checked" -- "$TIDE" "${RUN[@]}" --chat --system "$sys" --prompt "$user" --json \
    --budget 50% --hw h100-80g --check
check_json chat "offloaded"
contains "$TMP/out" '"check_passed":true' "chat: offloaded run equals the plain reference"

finish
