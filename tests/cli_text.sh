#!/usr/bin/env bash
# cli_text.sh - text in and text out end to end: `tide run --prompt` /
# --prompt-file / --chat on a small model with the built-in tokenizer
# (data/tokenizer), checked against the same run given the ids `tide
# tokenize` prints; sampling (seeded runs repeat, temperature 0 and top-k 1
# are greedy), --stop, offloaded text runs checked bit for bit, `tide chat`
# through a pipe and through a terminal (Ctrl-C stops an answer, Ctrl-D
# ends), and bad input (exit status, message naming the cause).
#
# What it proves: text in and out end to end on a small model with the
# built-in tokenizer: `--prompt` generates what the same ids given by `tide
# tokenize` generate, `--prompt-file` the same; seeded runs repeat, another
# seed differs, temperature 0 and top-k 1 are greedy; `--stop` ends the text
# right before the stop string; text runs offloaded under every policy and
# sampled at the minimum budget checked bit for bit; `--chat` prompts as the
# template gives them; `tide chat` through a pipe (one answer per line,
# `/clear`, offloaded answers equal resident ones) and in a pseudo-terminal
# (Ctrl-C stops an answer, Ctrl-D ends with exit 0); bad input (vocabulary
# larger than the embedding, missing and malformed tokenizer.json, empty and
# too-long prompts, unknown template, a model without a template, bad sampling
# values).
source "$(dirname "$0")/lib_cli.sh" "$1"
: "${TIDE_FIXTURES:?TIDE_FIXTURES must point at tests/fixtures}"
: "${TIDE_DATA:?TIDE_DATA must point at data}"
FX=$TIDE_FIXTURES/tiny-bf16-gqa
TOK=$TIDE_DATA/tokenizer

# json_str FILE FIELD: a string field of the one-line JSON object (escapes kept)
json_str() { sed -e "s/.*\"$2\":\"\(\([^\"\\\\]\|\\\\.\)*\)\".*/\1/" "$1"; }
# json_ids FILE FIELD: an int array field as "1,2,3"
json_ids() { sed -e "s/.*\"$2\":\[\([0-9,]*\)\].*/\1/" "$1"; }
# same WHAT GOT WANT
same() {
    if [ "$2" = "$3" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: got [$2], wanted [$3]"; FAILS=$((FAILS + 1)); fi
}
differ() {
    if [ "$2" != "$3" ]; then PASSES=$((PASSES + 1)); else
        echo "FAIL: $1: both [$2]"; FAILS=$((FAILS + 1)); fi
}

expect 0 "run help" -- "$TIDE" run --help
for o in --prompt --prompt-file --chat --system --template --temperature --top-k --top-p --min-p \
         --repeat-penalty --frequency-penalty --presence-penalty --seed --stop --no-parse-special; do
    contains "$TMP/out" "$o" "run help lists $o"
done
expect 0 "chat help" -- "$TIDE" chat --help
for o in --model --system --template --ctx --new-tokens --budget Ctrl-C Ctrl-D /clear --seed; do
    contains "$TMP/out" "$o" "chat help lists $o"
done
expect 0 "top-level help" -- "$TIDE" --help
contains "$TMP/out" "chat" "help lists chat"

# a small model whose vocabulary holds the built-in tokenizer's 4096 ids
sed -e 's/"vocab_size": 320/"vocab_size": 4160/' -e 's/"max_position_embeddings": 128/"max_position_embeddings": 4096/' \
    "$FX/config.json" > "$TMP/config.json"
expect 0 "make-model" -- "$TIDE" make-model --config "$TMP/config.json" --seed 7 "$TMP/m"
cp "$TOK"/tokenizer.json "$TOK"/tokenizer_config.json "$TOK"/generation_config.json "$TMP/m/"
M=$TMP/m

# text in: the ids of the prompt are what tide tokenize gives, the run equals
# the same run given those ids, and the text is the decoded ids
prompt="The planner moves tensors between memory tiers, ahead of time."
expect 0 "tokenize the prompt" -- "$TIDE" tokenize --model "$M" --json "$prompt"
ids=$(json_ids "$TMP/out" ids)
expect 0 "run --prompt" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12 --json
text_tokens=$(json_ids "$TMP/out" tokens)
json_field "$TMP/out" text
json_field "$TMP/out" stop_reason
n_prompt=$(sed -e 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$TMP/out")
same "prompt tokens" "$n_prompt" "$(echo "$ids" | tr ',' '\n' | wc -l)"
expect 0 "run --tokens of the same ids" -- "$TIDE" run --model "$M" --tokens "$ids" --new-tokens 12 --json
same "text prompt generates what its ids generate" "$text_tokens" "$(json_ids "$TMP/out" tokens)"
expect 0 "run --prompt, summary" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12
contains "$TMP/err" "generated  12 tokens" "summary after the text, on stderr"
contains "$TMP/err" "decode" "summary has the decode rate"
printf '%s' "$prompt" > "$TMP/prompt.txt"
expect 0 "run --prompt-file" -- "$TIDE" run --model "$M" --prompt-file "$TMP/prompt.txt" --new-tokens 12 --json
same "--prompt-file equals --prompt" "$(json_ids "$TMP/out" tokens)" "$text_tokens"

# sampling: seeded runs repeat; another seed differs; greedy equivalences
expect 0 "sampled run" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --temperature 1.5 --seed 11 --json
s1=$(json_ids "$TMP/out" tokens)
contains "$TMP/out" '"seed":"11"' "JSON records the seed"
expect 0 "sampled run again" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --temperature 1.5 --seed 11 --json
same "the same seed gives the same tokens" "$(json_ids "$TMP/out" tokens)" "$s1"
expect 0 "another seed" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --temperature 1.5 --seed 12 --json
differ "another seed gives other tokens" "$(json_ids "$TMP/out" tokens)" "$s1"
expect 0 "temperature 0" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12 --temperature 0 --seed 5 --json
same "temperature 0 is greedy" "$(json_ids "$TMP/out" tokens)" "$text_tokens"
expect 0 "top-k 1" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12 --temperature 3 --top-k 1 --seed 5 --json
same "top-k 1 is greedy" "$(json_ids "$TMP/out" tokens)" "$text_tokens"
expect 0 "all the controls" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 16 --temperature 0.8 \
    --top-k 40 --top-p 0.9 --min-p 0.02 --repeat-penalty 1.1 --frequency-penalty 0.2 --presence-penalty 0.1 \
    --penalty-last-n 64 --seed 3 --json
expect 0 "seed without temperature" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12 --seed 9 --json
same "a seed alone stays greedy" "$(json_ids "$TMP/out" tokens)" "$text_tokens"

# --stop: the text ends before the first occurrence, which is not printed
expect 0 "greedy text" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --quiet
full=$(cat "$TMP/out")
stop=${full:6:3}
if [ -n "${stop// /}" ]; then
    want=${full%%"$stop"*}
    expect 0 "run --stop" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --stop "$stop" --stop "zzzzqq" --quiet
    same "text stops before the stop string" "$(cat "$TMP/out")" "$want"
    expect 0 "run --stop, JSON" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 24 --stop "$stop" --json
    contains "$TMP/out" '"stop_reason":"stop"' "stop reason"
else
    echo "FAIL: the greedy text has no usable stop string at bytes 6-8: [$full]"; FAILS=$((FAILS + 1))
fi
expect 0 "run to the length" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 4 --json
contains "$TMP/out" '"stop_reason":"length"' "length stop reason"

# offloaded text runs are checked bit for bit against the reference
for p in tide static-layer lru; do
    expect 0 "offloaded text run ($p)" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 12 --budget 85% --hw h100-80g \
        --policy "$p" --check --json
    contains "$TMP/out" '"check_passed":true' "offloaded text check ($p)"
    same "offloaded text run ($p) generates the resident tokens" "$(json_ids "$TMP/out" tokens)" "$text_tokens"
done
expect 0 "sampled offloaded run checked" -- "$TIDE" run --model "$M" --prompt "$prompt" --new-tokens 16 --budget min --hw h100-80g \
    --temperature 1.2 --seed 4 --check --json
contains "$TMP/out" '"check_bit_identical":true' "sampled offloaded run bit-identical"

# --chat: the template's prompt; --system goes in front
expect 0 "run --chat" -- "$TIDE" run --model "$M" --chat --system "Be brief." --prompt "Hello" --new-tokens 6 --json
expect 0 "run --chat --template chatml" -- "$TIDE" run --model "$M" --chat --template chatml --system "Be brief." \
    --prompt "Hello" --new-tokens 6 --json
cp "$TMP/out" "$TMP/chatml.json"
expect 0 "tokenize the chat prompt" -- "$TIDE" tokenize --model "$M" --no-bos --json \
    $'<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n'
want_n=$(json_ids "$TMP/out" ids | tr ',' '\n' | wc -l)
expect 0 "run --chat again" -- "$TIDE" run --model "$M" --chat --system "Be brief." --prompt "Hello" --new-tokens 6 --json
same "the chat prompt is the template's" "$(sed -e 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$TMP/out")" "$want_n"
same "--template chatml gives the same prompt" "$(sed -e 's/.*"prompt_tokens":\([0-9]*\).*/\1/' "$TMP/chatml.json")" "$want_n"

# tide chat through a pipe: one answer line per input line; /clear forgets
printf 'Hello there\nWhat is a tensor?\n/clear\nHello there\n' > "$TMP/chat.in"
expect 0 "chat through a pipe" -- "$TIDE" chat --model "$M" --new-tokens 6 --quiet < "$TMP/chat.in"
same "three answers" "$(wc -l < "$TMP/out")" "3"
same "after /clear the first answer again" "$(sed -n 3p "$TMP/out")" "$(sed -n 1p "$TMP/out")"
expect 0 "chat offloaded" -- "$TIDE" chat --model "$M" --new-tokens 6 --quiet --budget 40% --hw h100-80g < "$TMP/chat.in"
cp "$TMP/out" "$TMP/chat-off.out"
expect 0 "chat resident" -- "$TIDE" chat --model "$M" --new-tokens 6 --quiet < "$TMP/chat.in"
same "offloaded chat answers as resident" "$(cat "$TMP/chat-off.out")" "$(cat "$TMP/out")"
printf 'Hi\n' > "$TMP/one.in"
expect 0 "chat statistics" -- "$TIDE" chat --model "$M" --new-tokens 4 < "$TMP/one.in"
contains "$TMP/err" "1 turns" "chat reports its turns"

# tide chat in a terminal: Ctrl-C stops an answer, the chat goes on, Ctrl-D ends
if command -v python3 >/dev/null; then
    expect 0 "chat in a terminal" -- python3 - "$TIDE" "$M" <<'EOF'
import os, pty, select, signal, sys, time
tide, model = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    # greedy: the answer is the same every run, long (no EOS within the context)
    os.execv(tide, [tide, "chat", "--model", model, "--new-tokens", "100000", "--ctx", "4096"])
out = b""
def read_for(secs, until=None):
    global out
    end = time.time() + secs
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                b = os.read(fd, 4096)
            except OSError:
                return False
            if not b:
                return False
            out += b
            if until and until in out:
                return True
    return True
read_for(20, b"> ")
os.write(fd, b"Tell me a long story\r")
read_for(20, b"story\r\n")
mark, end = len(out), time.time() + 20
while len(out) == mark and time.time() < end:  # the answer's first bytes
    read_for(0.05)
os.write(fd, b"\x03")                      # Ctrl-C: stops the answer
read_for(10, b"[stopped]")
mark = len(out)
read_for(10, b"> ")
# Ctrl-D ends the chat; the line editor may discard input typed while it
# sets the terminal up, so it is typed again until the chat ends
status, end = None, time.time() + 30
while status is None and time.time() < end:
    read_for(0.5)
    try:
        os.write(fd, b"\x04")
    except OSError:
        pass
    read_for(1.5)
    p, st = os.waitpid(pid, os.WNOHANG)
    if p == pid:
        status = st
if status is None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    sys.stderr.write("tide chat did not end after Ctrl-D\n")
    status = -1
ok = b"[stopped]" in out and status != -1 and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
if not ok:
    sys.stderr.write("status %r\noutput %r\n" % (status, out[-400:]))
sys.exit(0 if ok else 1)
EOF
else
    skip_check "chat in a terminal" "python3 not found"
fi

# bad input
mkdir -p "$TMP/small" && cp "$FX"/config.json "$FX"/model.safetensors "$TMP/small/" && cp "$TOK"/tokenizer.json "$TMP/small/"
expect 1 "tokenizer larger than the embedding" -- "$TIDE" run --model "$TMP/small" --prompt "Hello" --new-tokens 2
contains "$TMP/err" "exceed the model's vocabulary" "vocabulary mismatch named"
expect 1 "no tokenizer" -- "$TIDE" run --model "$FX" --prompt "Hello" --new-tokens 2
contains "$TMP/err" "tokenizer.json" "missing tokenizer named"
mkdir -p "$TMP/bad" && cp "$M"/config.json "$M"/model.safetensors "$TMP/bad/" && printf '{"model": ' > "$TMP/bad/tokenizer.json"
expect 1 "malformed tokenizer.json" -- "$TIDE" run --model "$TMP/bad" --prompt "Hello" --new-tokens 2
contains "$TMP/err" "malformed" "malformed tokenizer named"
expect 1 "empty prompt" -- "$TIDE" run --model "$M" --prompt "" --new-tokens 2
contains "$TMP/err" "empty" "empty prompt named"
yes "$prompt" | head -n 400 > "$TMP/long.txt"
expect 1 "prompt longer than the positions" -- "$TIDE" run --model "$M" --prompt-file "$TMP/long.txt" --new-tokens 2
contains "$TMP/err" "positions" "too long a prompt named"
expect 1 "unknown template name" -- "$TIDE" run --model "$M" --chat --template nosuch --prompt "Hi" --new-tokens 2
contains "$TMP/err" "unknown chat template 'nosuch'" "unknown template named"
contains "$TMP/err" "chatml" "the known templates listed"
mkdir -p "$TMP/notmpl" && cp "$M"/config.json "$M"/model.safetensors "$M"/tokenizer.json "$TMP/notmpl/"
expect 1 "no chat template" -- "$TIDE" run --model "$TMP/notmpl" --chat --prompt "Hi" --new-tokens 2
contains "$TMP/err" "--template" "a model without a template names --template"
expect 2 "bad --temperature" -- "$TIDE" run --model "$M" --prompt "Hi" --temperature -1
expect 2 "bad --top-p" -- "$TIDE" run --model "$M" --prompt "Hi" --top-p 1.5
expect 2 "bad --seed" -- "$TIDE" run --model "$M" --prompt "Hi" --seed x
expect 2 "two prompts" -- "$TIDE" run --model "$M" --prompt "Hi" --tokens 1,2
expect 2 "--chat without a text prompt" -- "$TIDE" run --model "$M" --chat --tokens 1,2
expect 2 "--stop without a text prompt" -- "$TIDE" run --model "$M" --tokens 1,2 --stop x
expect 1 "missing prompt file" -- "$TIDE" run --model "$M" --prompt-file "$TMP/nope.txt"
contains "$TMP/err" "nope.txt" "missing prompt file named"
expect 1 "chat: no tokenizer" -- "$TIDE" chat --model "$FX" < /dev/null
expect 2 "chat: bad option" -- "$TIDE" chat --model "$M" --top-k -3 < /dev/null

finish
