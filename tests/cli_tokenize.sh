#!/usr/bin/env bash
# cli_tokenize.sh - `tide tokenize` end to end on the committed tokenizer
# fixtures (tests/fixtures/text): the ids equal what Hugging Face tokenizers
# recorded in expected.json in every mode, the text and JSON forms, --file with
# bytes read exactly (invalid UTF-8, NUL, standard input), and bad input (exit
# status, message naming the file and the problem).
#
# What it proves: `tide tokenize` against the recorded ids of the five
# tokenizers and of their GGUF files, text and JSON forms, `--file` with invalid UTF-8 and NUL and
# from standard input, bad input (missing, truncated, unsupported
# tokenizer.json).
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
FX=$TIDE_FIXTURES/text

# ids FIXTURE CASE FIELD: the recorded ids of a case, as "1,2,3"
ids() {
    grep -F "{\"name\":\"$2\"," "$FX/$1/expected.json" | sed -e "s/.*\"$3\":\[\([0-9,]*\)\].*/\1/"
}
# same WHAT: tide's JSON ids ($TMP/out) equal $want
same() {
    local got
    got=$(sed -e 's/^{"ids":\[\([0-9,]*\)\].*/\1/' "$TMP/out")
    if [ "$got" = "$want" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: ids [$got], expected [$want]"; FAILS=$((FAILS + 1)); fi
}

expect 0 "help" -- "$TIDE" tokenize --help
for o in --model --file --json --no-bos --no-parse-special; do
    contains "$TMP/out" "$o" "tokenize help lists $o"
done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "tokenize" "help lists tokenize"

# the text form: ids and pieces, a count
expect 0 "text form" -- "$TIDE" tokenize --model "$FX/sp-llama2" "Hello world"
contains "$TMP/out" "'<s>'" "BOS piece"
contains "$TMP/out" "'▁Hello'" "SentencePiece piece"
contains "$TMP/out" "3 tokens" "token count"

# every mode against the recorded ids
text=$'<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>'
for fx in bpe-llama3 bpe-gpt2 bpe-qwen2 sp-llama2 sp-metaspace; do
    expect 0 "$fx: json" -- "$TIDE" tokenize --model "$FX/$fx" --json "$text"
    json_field "$TMP/out" ids
    json_field "$TMP/out" pieces
    want=$(ids $fx "special llama3" ids_bos) same "$fx: with BOS"
    expect 0 "$fx: --no-bos" -- "$TIDE" tokenize --model "$FX/$fx" --json --no-bos "$text"
    want=$(ids $fx "special llama3" ids) same "$fx: without BOS"
    expect 0 "$fx: --no-parse-special" -- "$TIDE" tokenize --model "$FX/$fx" --json --no-bos --no-parse-special "$text"
    want=$(ids $fx "special llama3" ids_plain) same "$fx: special tokens as text"
done
# the same from each fixture's GGUF file (tests/fixtures/gguf-tok: every mode
# of this case gives the source tokenizer's ids, test_tok_gguf.c)
GX=$TIDE_FIXTURES/gguf-tok
for fx in bpe-llama3 bpe-gpt2 bpe-qwen2 sp-llama2 sp-metaspace; do
    expect 0 "$fx.gguf: json" -- "$TIDE" tokenize --model "$GX/$fx/tokenizer.gguf" --json "$text"
    want=$(ids $fx "special llama3" ids_bos) same "$fx.gguf: with BOS"
    expect 0 "$fx.gguf: --no-bos --no-parse-special" -- "$TIDE" tokenize --model "$GX/$fx/tokenizer.gguf" --json \
        --no-bos --no-parse-special "$text"
    want=$(ids $fx "special llama3" ids_plain) same "$fx.gguf: special tokens as text"
done
expect 1 "missing .gguf" -- "$TIDE" tokenize --model "$TMP/none.gguf" "hi"
contains "$TMP/err" "none.gguf" "message names the file"
head -c 100 "$GX/sp-llama2/tokenizer.gguf" >"$TMP/cut.gguf"
expect 1 "truncated .gguf" -- "$TIDE" tokenize --model "$TMP/cut.gguf" "hi"
contains "$TMP/err" "cut.gguf" "message names the truncated file"

expect 0 "pieces in JSON" -- "$TIDE" tokenize --model "$FX/bpe-llama3" --json "$text"
contains "$TMP/out" '"pieces":["<|begin_of_text|>","<|begin_of_text|>","<|start_header_id|>"' "JSON pieces"

# --file: the bytes exactly (invalid UTF-8; NUL and control characters)
for c in "invalid surrogate" "control chars" "invalid at end"; do
    hex=$(grep -F "\"name\": \"$c\"" -A1 "$FX/cases.json" | sed -n 's/.*"hex": "\([0-9a-f]*\)".*/\1/p')
    printf "$(printf '%s' "$hex" | sed -e 's/../\\x&/g')" >"$TMP/in.bin"
    expect 0 "--file, $c" -- "$TIDE" tokenize --model "$FX/bpe-gpt2" --json --no-bos --file "$TMP/in.bin"
    want=$(ids bpe-gpt2 "$c" ids) same "--file, $c"
done
"$TIDE" tokenize --model "$FX/sp-llama2" --json --file - <"$TMP/in.bin" >"$TMP/out" 2>"$TMP/err"
want=$(ids sp-llama2 "invalid at end" ids_bos) same "--file - (standard input)"
printf '' >"$TMP/empty.txt"
expect 0 "empty file" -- "$TIDE" tokenize --model "$FX/sp-llama2" --file "$TMP/empty.txt"
contains "$TMP/out" "1 token" "empty text: BOS only"

# bad input
expect 2 "no --model" -- "$TIDE" tokenize "hi"
expect 2 "no text" -- "$TIDE" tokenize --model "$FX/sp-llama2"
expect 2 "text and --file" -- "$TIDE" tokenize --model "$FX/sp-llama2" --file "$TMP/empty.txt" "hi"
expect 2 "unknown option" -- "$TIDE" tokenize --model "$FX/sp-llama2" --bos "hi"
expect 1 "missing file" -- "$TIDE" tokenize --model "$FX/sp-llama2" --file "$TMP/nothing.txt"
contains "$TMP/err" "nothing.txt" "message names the file"
expect 1 "missing model directory" -- "$TIDE" tokenize --model "$TMP/no-model" "hi"
contains "$TMP/err" "no-model/tokenizer.json" "message names tokenizer.json"
mkdir -p "$TMP/bad"
head -c 300 "$FX/sp-llama2/tokenizer.json" >"$TMP/bad/tokenizer.json"
expect 1 "truncated tokenizer.json" -- "$TIDE" tokenize --model "$TMP/bad" "hi"
contains "$TMP/err" "bad/tokenizer.json: malformed JSON" "message names the file and the problem"
mkdir -p "$TMP/uni"
sed -e 's/"type":"BPE"/"type":"Unigram"/' "$FX/sp-llama2/tokenizer.json" >"$TMP/uni/tokenizer.json"
expect 1 "unsupported model type" -- "$TIDE" tokenize --model "$TMP/uni" "hi"
contains "$TMP/err" "model type Unigram is not supported" "message names the model type"
mkdir -p "$TMP/nfkc"
sed -e 's/"normalizer":{"type":"Sequence"[^]]*\]}/"normalizer":{"type":"NFKC"}/' "$FX/sp-llama2/tokenizer.json" \
    >"$TMP/nfkc/tokenizer.json"
expect 1 "unsupported normalizer" -- "$TIDE" tokenize --model "$TMP/nfkc" "hi"
contains "$TMP/err" "normalizer NFKC is not supported" "message names the normalizer"
finish
