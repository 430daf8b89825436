#!/usr/bin/env bash
# cli_serve.sh - `tide serve` end to end on loopback: its help and usage
# errors here; the HTTP API (completions and chat, streamed and not, equal to
# `tide run`; concurrent clients; a client leaving mid-stream; bad requests;
# /metrics; memory over a few thousand requests; 503; SIGTERM; eviction of
# the least recently used model) in tests/serve_client.py, on three small
# models with the built-in tokenizer.
#
# What it proves: `tide serve` on loopback (`tests/serve_client.py`, Python's
# standard library) with two small models under one budget: completions and
# chat, streamed and not, greedy text equal to `tide run --prompt` / `--chat`
# on the same model, usage counts equal to its tokens; stop strings; seeded
# sampling repeats; concurrent clients on both models; a client that leaves
# mid-stream, after which the server answers and its queue is empty; bad
# requests (malformed JSON, fields of the wrong type named, unknown model and
# path, wrong method, a 1.5 MiB body, a prompt longer than the context, a
# missing or wrong key: 400, 404, 405, 413, 401 with OpenAI's error JSON);
# `/metrics` parsed as Prometheus text and counting requests; `/v1/models`;
# 10,000 requests in a loop (`/health`, malformed JSON, an unknown model, no
# key, a wrong type, then 300 completions; 2000 under a sanitizer) each
# answered with its status (200/400/404/401), the server's resident memory
# within 8 MiB over them; a stream its client does not read holding a model
# with `--queue 1` (503 for that model, 200 for the other), then SIGTERM: exit
# status 0, no spill file left; three models where two fit (`--max-loaded 2`,
# and budgets under `--policy tide` and `equal`): requests alternating over
# them all get `tide run`'s text, the least recently used idle model evicted,
# counted in `/metrics` and `/v1/models` and logged with its reason, a 503
# naming the models that hold the budget when none is idle;
# `stream_options.include_usage`; OpenAI's `openai` package against it
# (completion, chat, streamed chat with usage, on both models;
# `scripts/setup.sh test` installs it into a virtual environment of the build,
# `build/pyenv`, from the package index, and the check says "skipped" where it
# could not); usage errors.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
: "${TIDE_DATA:?TIDE_DATA must point at data}"
TOK=$TIDE_DATA/tokenizer

expect 0 "serve help" -- "$TIDE" serve --help
for o in --model --budget --host-budget --ssd --policy --port --host --max-batch --api-key --threads --backend \
         --quiet --queue --ctx --max-loaded evicted stream_options /v1/completions /v1/chat/completions /v1/models /health /metrics "one forward"; do
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
if ! command -v python3 >/dev/null; then
    echo "skipped: the HTTP checks need python3"
    finish
    exit $?
fi
expect 1 "a port in use" -- bash -c "python3 -c 'import socket,time,subprocess,sys
s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen()
sys.exit(subprocess.run([\"$TIDE\",\"serve\",\"--model\",\"a=$TMP/a\",\"--budget\",\"64M\",\"--hw\",\"h100-80g\",\"--backend\",\"cpu\",\"--port\",str(s.getsockname()[1])]).returncode)'"
contains "$TMP/err" "cannot listen" "a port in use: message"

# the build's virtual environment (scripts/setup.sh test) has the openai client
PY=python3
[ -x "$(dirname "$TIDE")/pyenv/bin/python3" ] && PY=$(dirname "$TIDE")/pyenv/bin/python3
expect 0 "the HTTP API (serve_client.py)" -- "$PY" "$(dirname "$0")/serve_client.py" "$TIDE" "$TMP"
cat "$TMP/out"
finish
