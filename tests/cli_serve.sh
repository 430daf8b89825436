#!/usr/bin/env bash
# cli_serve.sh - `tide serve` end to end on loopback: its help and usage
# errors here; the HTTP API (completions and chat, streamed and not, equal to
# `tide run`; concurrent clients; a client leaving mid-stream; bad requests;
# /metrics; memory over a few thousand requests; 503; SIGTERM; eviction of
# the least recently used model) in tests/serve_client.py, on three small
# models with the built-in tokenizer. Without python3 the HTTP checks cannot
# run: the test exits 77 (skipped) once the others have passed. OpenAI's own
# client is tests/cli_serve_openai.sh's.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
: "${TIDE_DATA:?TIDE_DATA must point at data}"
TOK=$TIDE_DATA/tokenizer

expect 0 "serve help" -- "$TIDE" serve --help
for o in --model --budget --host-budget --ssd --policy --port --host --max-batch --api-key --threads --backend \
         --quiet --queue --ctx --max-loaded --timeout --keep-alive --shutdown-grace --max-connections --http-threads --per-client evicted stream_options /v1/completions /v1/chat/completions /v1/models /health /metrics "one forward"; do
    contains "$TMP/out" "$o" "serve help lists $o"
done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "serve" "help lists serve"

# two small models whose vocabularies hold the built-in tokenizer's ids
# (and c: a's shape, other weights, for the eviction checks)
for m in a:tiny-bf16-gqa:7 b:tiny-f32-mha:7 c:tiny-bf16-gqa:9; do
    seed=${m##*:}
    m=${m%:*}
    sed -e 's/"vocab_size": [0-9]*/"vocab_size": 4160/' -e 's/"max_position_embeddings": 128/"max_position_embeddings": 4096/' \
        "$TIDE_FIXTURES/${m#*:}/config.json" > "$TMP/${m%%:*}.json"
    expect 0 "make-model ${m%%:*}" -- "$TIDE" make-model --config "$TMP/${m%%:*}.json" --seed "$seed" "$TMP/${m%%:*}"
    cp "$TOK"/tokenizer.json "$TOK"/tokenizer_config.json "$TOK"/generation_config.json "$TMP/${m%%:*}/"
done

# usage errors: exit status 2 and a message naming the cause
expect 2 "no model" -- "$TIDE" serve --budget 64M
contains "$TMP/err" "--model" "no model: message"
expect 2 "no budget" -- "$TIDE" serve --model a="$TMP/a"
contains "$TMP/err" "--budget" "no budget: message"
expect 2 "--max-batch 0" -- "$TIDE" serve --model a="$TMP/a" --budget 64M --max-batch 0
contains "$TMP/err" "max-batch" "--max-batch 0: message"
expect 2 "--max-batch 65" -- "$TIDE" serve --model a="$TMP/a" --budget 64M --max-batch 65
expect 2 "a percentage budget" -- "$TIDE" serve --model a="$TMP/a" --budget 25%
expect 2 "no model directory" -- "$TIDE" serve --model a="$TMP/none" --budget 64M
contains "$TMP/err" "config.json" "no model directory: message"
expect 2 "a name twice" -- "$TIDE" serve --model a="$TMP/a" --model a="$TMP/b" --budget 64M
expect 2 "a bad name" -- "$TIDE" serve --model 'a b'="$TMP/a" --budget 64M
expect 2 "NAME=DIR" -- "$TIDE" serve --model "$TMP/a" --budget 64M
expect 2 "bad policy" -- "$TIDE" serve --model a="$TMP/a" --budget 64M --policy fastest
expect 2 "bad --max-loaded" -- "$TIDE" serve --model a="$TMP/a" --budget 64M --max-loaded -1
contains "$TMP/err" "--max-loaded" "bad --max-loaded: message"
expect 2 "bad port" -- "$TIDE" serve --model a="$TMP/a" --budget 64M --port 70000
# a context the model can never hold: refused at start, naming the model
sed -e 's/"vocab_size": [0-9]*/"vocab_size": 4160/' "$TIDE_FIXTURES/tiny-bf16-gqa/config.json" > "$TMP/short.json"
contains "$TMP/short.json" '"max_position_embeddings": 128' "the short model's fixture has 128 positions"
expect 0 "make-model short" -- "$TIDE" make-model --config "$TMP/short.json" --seed 3 "$TMP/short"
expect 2 "--ctx beyond the positions" -- timeout 60 "$TIDE" serve --model a="$TMP/a" --model short="$TMP/short" --budget 64M \
    --ctx 4096 --port 0 --hw h100-80g --backend cpu
contains "$TMP/err" "'short'" "--ctx beyond the positions: names the model"
contains "$TMP/err" "128 positions" "--ctx beyond the positions: names its positions"
rm -rf "$TMP/short"
if ! command -v python3 >/dev/null; then
    # the checks above ran; the HTTP API's cannot: skipped, not passed
    skip_check "the HTTP API" "python3 not found"
    finish
    exit $?
fi
expect 1 "a port in use" -- bash -c "python3 -c 'import socket,time,subprocess,sys
s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen()
sys.exit(subprocess.run([\"$TIDE\",\"serve\",\"--model\",\"a=$TMP/a\",\"--budget\",\"64M\",\"--hw\",\"h100-80g\",\"--backend\",\"cpu\",\"--port\",str(s.getsockname()[1])]).returncode)'"
contains "$TMP/err" "cannot listen" "a port in use: message"

expect 0 "the HTTP API (serve_client.py)" -- python3 "$(dirname "$0")/serve_client.py" "$TIDE" "$TMP"
cat "$TMP/out"
finish
