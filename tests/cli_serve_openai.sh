#!/usr/bin/env bash
# cli_serve_openai.sh - `tide serve` answers OpenAI's own client (the openai
# package): completion, chat and streamed chat with usage on two small
# models, each equal to `tide run` (tests/serve_client.py openai). Its own
# test, so that a machine without python3 or the package reports it skipped
# (exit 77), never passed. scripts/setup.sh test puts the package into the
# build's virtual environment (pyenv/ beside the binary), used when present.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
: "${TIDE_DATA:?TIDE_DATA must point at data}"
TOK=$TIDE_DATA/tokenizer
PY=python3
[ -x "$(dirname "$TIDE")/pyenv/bin/python3" ] && PY=$(dirname "$TIDE")/pyenv/bin/python3
command -v "$PY" >/dev/null || { echo "skipped: python3 not found"; exit 77; }
"$PY" -c 'import openai' 2>/dev/null || { echo "skipped: the openai package is not installed"; exit 77; }
# cli_serve.sh's models a and b
for m in a:tiny-bf16-gqa:7 b:tiny-f32-mha:7; do
    seed=${m##*:}
    m=${m%:*}
    sed -e 's/"vocab_size": [0-9]*/"vocab_size": 4160/' -e 's/"max_position_embeddings": 128/"max_position_embeddings": 4096/' \
        "$TIDE_FIXTURES/${m#*:}/config.json" > "$TMP/${m%%:*}.json"
    expect 0 "make-model ${m%%:*}" -- "$TIDE" make-model --config "$TMP/${m%%:*}.json" --seed "$seed" "$TMP/${m%%:*}"
    cp "$TOK"/tokenizer.json "$TOK"/tokenizer_config.json "$TOK"/generation_config.json "$TMP/${m%%:*}/"
done
expect 0 "OpenAI's client (serve_client.py openai)" -- "$PY" "$(dirname "$0")/serve_client.py" "$TIDE" "$TMP" openai
cat "$TMP/out"
finish
