#!/usr/bin/env bash
# cli_quantize.sh - `tide quantize` end to end: a synthetic checkpoint (rows
# of whole 256-blocks, 9 layers so that the _M mixes' more-bits layers differ
# from the others) with a byte-level tokenizer, one with a SentencePiece-style
# tokenizer, one without a tokenizer, the hf-text fixture (rows of 64: the
# fallbacks), and GGUF files as input, quantized to every type; the `gguf` Python package reads each file
# back and tests/quant_check.py checks names, shapes, types, metadata, the
# tokenizer and every dequantized value against the checkpoint within its
# type's bound (skipped, 77, when gguf is not importable). Also: the same input
# gives the same bytes; bad input (unknown type, unreadable input, an output
# that cannot be written, a write cut short) fails with a message and leaves
# no file behind.
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
CHECK=$(dirname "$0")/quant_check.py
# the build's virtual environment (pyenv/ beside the binary, where
# scripts/setup.sh test installs gguf) when it has the package
PY=python3
[ -x "$(dirname "$TIDE")/pyenv/bin/python3" ] && "$(dirname "$TIDE")/pyenv/bin/python3" -c "import gguf, numpy" 2>/dev/null &&
    PY=$(dirname "$TIDE")/pyenv/bin/python3
have_gguf=1
"$PY" -c "import gguf, numpy" 2>/dev/null || have_gguf=0

# check DIR FILE TYPE: the gguf package reads FILE back and it matches DIR
check() {
    if [ "$have_gguf" -eq 0 ]; then skip_check "$2" "the gguf Python package is not importable"; return; fi
    if "$PY" "$CHECK" "$1" "$2" "$3" >"$TMP/check" 2>&1; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $2 ($3) does not match $1:"; sed 's/^/  | /' "$TMP/check" | head -12; FAILS=$((FAILS + 1)); fi
}

expect 0 "help" -- "$TIDE" quantize --help
for o in --type Q8_0 Q4_0 Q4_K_M Q5_K_M Q6_K; do contains "$TMP/out" "$o" "quantize help lists $o"; done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "quantize" "help lists quantize"

cat >"$TMP/cfg.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 9, "vocab_size": 384,
 "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16"}
JSON
expect 0 "make a model" -- "$TIDE" make-model --config "$TMP/cfg.json" "$TMP/m"
cp "$TIDE_FIXTURES"/hf-text/tokenizer.json "$TIDE_FIXTURES"/hf-text/tokenizer_config.json "$TMP/m/"
for t in Q8_0 Q4_0 Q4_K_M Q5_K_M Q6_K; do
    expect 0 "quantize $t" -- "$TIDE" quantize --type "$t" "$TMP/m" "$TMP/m-$t.gguf"
    contains "$TMP/out" "bits/weight" "$t: bits per weight printed"
    contains "$TMP/out" "tokenizer: gpt2, 384 tokens" "$t: the byte-level tokenizer"
    check "$TMP/m" "$TMP/m-$t.gguf" "$t"
done
grep -q "q6_k " "$TMP/out" && PASSES=$((PASSES + 1)) || { echo "FAIL: Q6_K has no q6_k line"; FAILS=$((FAILS + 1)); }
expect 0 "quantize Q4_K_M again" -- "$TIDE" quantize --type q4_k_m "$TMP/m" "$TMP/again.gguf"
if cmp -s "$TMP/m-Q4_K_M.gguf" "$TMP/again.gguf"; then PASSES=$((PASSES + 1)); else
    echo "FAIL: the same input gave different bytes"; FAILS=$((FAILS + 1)); fi

# a SentencePiece-style tokenizer (byte fallback, Metaspace): tokenizer.ggml.model llama
sed -e 's/"vocab_size": 384/"vocab_size": 1024/' -e 's/"num_hidden_layers": 9/"num_hidden_layers": 2/' \
    "$TMP/cfg.json" >"$TMP/cfg2.json"
expect 0 "make a model (SentencePiece tokenizer)" -- "$TIDE" make-model --config "$TMP/cfg2.json" "$TMP/sp"
cp "$TIDE_FIXTURES"/text/sp-llama2/tokenizer.json "$TIDE_FIXTURES"/text/sp-llama2/tokenizer_config.json "$TMP/sp/"
expect 0 "quantize (SentencePiece tokenizer)" -- "$TIDE" quantize --type Q5_K_M "$TMP/sp" "$TMP/sp.gguf"
contains "$TMP/out" "tokenizer: llama, 1000 tokens" "SentencePiece-style tokenizer"
check "$TMP/sp" "$TMP/sp.gguf" Q5_K_M

# no tokenizer.json: a placeholder vocabulary
expect 0 "make a model (no tokenizer)" -- "$TIDE" make-model --config "$TMP/cfg2.json" "$TMP/bare"
expect 0 "quantize (no tokenizer)" -- "$TIDE" quantize --type Q6_K "$TMP/bare" "$TMP/bare.gguf"
contains "$TMP/out" "placeholder vocabulary" "no tokenizer said"
check "$TMP/bare" "$TMP/bare.gguf" Q6_K

# rows of 64 elements: Q4_K and Q6_K fall back to Q8_0
expect 0 "quantize hf-text" -- "$TIDE" quantize --type Q4_K_M "$TIDE_FIXTURES/hf-text" "$TMP/hf.gguf"
contains "$TMP/out" "fell back" "fallbacks reported"
check "$TIDE_FIXTURES/hf-text" "$TMP/hf.gguf" Q4_K_M

# Qwen2 (q/k/v biases): a "qwen2" file, the biases F32, q/k rows unpermuted; it
# runs offloaded and checked; its GGUF form (a fixture) quantized too
expect 0 "quantize qwen2" -- "$TIDE" quantize --type Q8_0 "$TIDE_FIXTURES/tiny-qwen2" "$TMP/qw.gguf"
check "$TIDE_FIXTURES/tiny-qwen2" "$TMP/qw.gguf" Q8_0
expect 0 "run the qwen2 file offloaded" -- "$TIDE" run --model "$TMP/qw.gguf" --tokens 1,2,3,4 --new-tokens 4 \
    --budget 50% --weights-on-ssd --check --quiet
contains "$TMP/out" "check      passed" "qwen2 file: check passed"
expect 0 "quantize a qwen2 GGUF" -- "$TIDE" quantize --type Q8_0 "$TIDE_FIXTURES/gguf/tiny-qwen2.gguf" "$TMP/qw2.gguf"
check "$TIDE_FIXTURES/gguf/tiny-qwen2.gguf" "$TMP/qw2.gguf" Q8_0

# a GGUF input (one of the files above, and a fixture of the GGUF reader's): its
# tokenizer and llama metadata copied, every weight within its bound of the
# input's dequantized values
expect 0 "quantize a GGUF file" -- "$TIDE" quantize --type Q4_K_M "$TMP/m-Q8_0.gguf" "$TMP/re.gguf"
contains "$TMP/out" "tokenizer: gpt2, 384 tokens" "GGUF input: the tokenizer copied"
check "$TMP/m-Q8_0.gguf" "$TMP/re.gguf" Q4_K_M
expect 0 "quantize a GGUF fixture" -- "$TIDE" quantize --type Q5_K_M "$TIDE_FIXTURES/gguf/tiny-f16-sharded.gguf" "$TMP/fx.gguf"
check "$TIDE_FIXTURES/gguf/tiny-f16-sharded.gguf" "$TMP/fx.gguf" Q5_K_M

# bad input
expect 2 "unknown type" -- "$TIDE" quantize --type Q3_K_M "$TMP/m" "$TMP/x.gguf"
contains "$TMP/err" "Q3_K_M" "unknown type named"
expect 2 "missing output" -- "$TIDE" quantize "$TMP/m"
expect 1 "unreadable input" -- "$TIDE" quantize "$TMP/nothing-here" "$TMP/x.gguf"
contains "$TMP/err" "nothing-here" "missing input named"
expect 1 "output directory missing" -- "$TIDE" quantize "$TMP/m" "$TMP/no/such/dir/x.gguf"
contains "$TMP/err" "no/such/dir" "unwritable output named"
# a NaN in a weight: refused, naming the tensor
mkdir "$TMP/nan" && cp "$TIDE_FIXTURES"/hf-text/*.json "$TIDE_FIXTURES"/hf-text/model.safetensors "$TMP/nan/"
size=$(stat -c %s "$TMP/nan/model.safetensors")
printf '\x00\x00\xc0\x7f' | dd of="$TMP/nan/model.safetensors" bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
expect 1 "a NaN weight" -- "$TIDE" quantize "$TMP/nan" "$TMP/nan.gguf"
contains "$TMP/err" "NaN or infinity" "NaN weight named"
[ ! -e "$TMP/nan.gguf" ] && PASSES=$((PASSES + 1)) || { echo "FAIL: nan.gguf written"; FAILS=$((FAILS + 1)); }
# a write cut short (a file size limit, as a full disk would): an error, nothing left
mkdir "$TMP/small"
( trap '' XFSZ; ulimit -f 1024; exec "$TIDE" quantize --type Q8_0 "$TMP/m" "$TMP/small/x.gguf" ) >"$TMP/out" 2>"$TMP/err"
rc=$?
if [ "$rc" -eq 1 ]; then PASSES=$((PASSES + 1)); else echo "FAIL: cut-short write: exit $rc"; FAILS=$((FAILS + 1)); fi
contains "$TMP/err" "write failed" "cut-short write reported"
left=$(ls -A "$TMP/small")
if [ -z "$left" ]; then PASSES=$((PASSES + 1)); else echo "FAIL: left behind: $left"; FAILS=$((FAILS + 1)); fi
ls -A "$TMP" | grep -q '\.tmp\.' && { echo "FAIL: a temporary file left"; FAILS=$((FAILS + 1)); }
finish
