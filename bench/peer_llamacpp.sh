#!/usr/bin/env bash
# peer_llamacpp.sh - tide against llama.cpp on the CPU, same weights, same
# prompt ids, same threads, interleaved in one run.
#
#   bench/peer_llamacpp.sh [--tide PATH] [--model DIR] [--rounds N] [--threads N]
#                          [--prompt N] [--new N] [--cache DIR] [--sdist FILE]
#                          [--commit NAME] [--json FILE] [--quant "TYPE ..."]
#
# 1. llama.cpp: the source that llama-cpp-python's source distribution vendors
#    (`pip download --no-deps --no-binary :all: llama-cpp-python`, or --sdist
#    FILE), built CPU-only, Release, for the instruction sets /proc/cpuinfo
#    lists (not GGML_NATIVE, which died with an illegal instruction on
#    quantized types on a VM whose flags list AMX), as a static library with
#    bench/peer/llama_driver.c (greedy generation from exact token ids) and
#    bench/peer/llama_quant.c (llama.cpp's quantizer, llama_model_quantize),
#    through bench/peer/CMakeLists.txt. Kept in the cache directory (default
#    ${XDG_CACHE_HOME:-~/.cache}/tide/peer-llamacpp), so later runs neither
#    download nor build.
# 2. The model (default: tide's built-in one, written by `tide make-model` if
#    absent) converted by bench/peer/gguf_convert.py (the `gguf` package;
#    installed into the cache directory if Python lacks it), with llama.cpp's
#    Q/K row permutation for its rotary layout: a bf16 GGUF (the weights as
#    stored) for the timed runs, and an f32 one (widened exactly) for the check.
# 3. The check: llama.cpp in f32 throughout (f32 GGUF, f32 KV cache, flash
#    attention off) must generate exactly the tokens of tide's f32 matmul mode.
#    At its defaults llama.cpp rounds activations to bf16 and runs the CPU
#    flash attention with Q in f16, so its logits differ from f32 ones by up to
#    about 0.05 on this model, and greedy tokens part where two logits are
#    closer than that (the synthetic model has many such near-ties); the
#    report says where each timed configuration first leaves the f32 tokens,
#    with llama.cpp's gap between its two largest logits there.
# 4. Rounds (default 3), each running every configuration once as a fresh
#    process, in an order rotated from round to round: llama.cpp at its
#    defaults on the bf16 GGUF; tide in its default CPU matmul mode; tide
#    --matmul f32 and --matmul fast where they differ from the default and the
#    CPU backend accepts them. Each prefills --prompt ids (default 512; tide's
#    deterministic prompt, passed as a list to both) and generates --new
#    tokens (default 32) greedily with --threads threads (default 2). Prefill
#    tokens/s = prompt / prefill time (for tide: including planning its first
#    graph); decode tokens/s = (new - 1) / the time of the single-token steps,
#    as tide counts. Each configuration must give the same tokens every round.
# 5. Prints the machine, the load average before and after, the median tokens/s
#    of each configuration and the ratios tide / llama.cpp: of the medians,
#    the median over rounds of each round's ratio (paired runs, next to each
#    other in time), and of the best runs, the ones others disturbed least,
#    which the target (>= 1.0 in tide's default mode) is judged on: on a
#    loaded machine llama.cpp's decode slows far more than tide's (its threads
#    meet at a barrier after every op), so medians there flatter tide. Then
#    JSON lines (appended to --json FILE). --commit
#    names the tide build measured (default: the repository's HEAD, "+dirty"
#    when its tree has changes).
#
# --quant "Q8_0 Q4_K_M" (any of Q8_0 Q4_0 Q4_K_M Q5_K_M Q6_K): instead of 3-5,
#    llama.cpp's quantizer makes each type's file from the f32 GGUF (its own
#    mixes), and the rounds run llama.cpp and tide (`tide run --model
#    FILE.gguf`, its default mode) on each file, interleaved; the report gives
#    per type both engines' tokens/s, the ratios tide / llama.cpp (medians,
#    paired, bests: the target is >= 1.0 on the bests), and how many generated
#    tokens the two engines share (their arithmetic differs: llama.cpp rounds
#    activations to 8 bits per block as tide does, but sums in another order).
#
# Exit status: 0; 1 when a run fails or tokens differ; 2 usage; 77 when a
# prerequisite is missing (cmake, a C/C++ compiler, python3 with numpy, pip's
# network access for the first download).
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
tide="$repo/build/tide"
model=""
rounds=3
threads=2
n_prompt=512
n_new=32
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tide/peer-llamacpp"
sdist=""
json=""
commit=""
qtypes=""

usage() {
    sed -n '5,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    --tide) tide=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --prompt) n_prompt=$2; shift 2 ;;
    --new) n_new=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --sdist) sdist=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    --quant) qtypes=$2; shift 2 ;;
    *) usage ;;
    esac
done
case "$rounds$threads$n_prompt$n_new" in *[!0-9]*) usage ;; esac
[ "$rounds" -ge 1 ] && [ "$threads" -ge 1 ] && [ "$n_prompt" -ge 1 ] && [ "$n_new" -ge 2 ] || usage
for q in $qtypes; do case "$q" in Q8_0 | Q4_0 | Q4_K_M | Q5_K_M | Q6_K) ;; *) usage ;; esac; done

skip() { echo "peer_llamacpp: skipped: $*" >&2; exit 77; }
fail() { echo "peer_llamacpp: $*" >&2; exit 1; }
log() { echo "peer_llamacpp: $*" >&2; }

for t in cmake cc c++ python3; do command -v $t >/dev/null || skip "$t not found"; done
python3 -c 'import numpy' 2>/dev/null || skip "python3 has no numpy"
[ -x "$tide" ] || fail "no tide command at $tide (build it, or give --tide PATH)"
mkdir -p "$cache" || fail "cannot create $cache"
cache=$(cd "$cache" && pwd)

# ---------------------------------------------------------------- llama.cpp
if [ -z "$sdist" ]; then
    sdist=$(ls -t "$cache"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
    if [ -z "$sdist" ]; then
        log "downloading llama-cpp-python's source distribution"
        python3 -m pip download --no-deps --no-binary :all: -d "$cache" llama-cpp-python >"$cache/download.log" 2>&1 ||
            skip "pip could not download llama-cpp-python (no network?), see $cache/download.log"
        sdist=$(ls -t "$cache"/llama_cpp_python-*.tar.gz 2>/dev/null | head -n1)
        [ -n "$sdist" ] || skip "pip downloaded no llama_cpp_python-*.tar.gz"
    fi
fi
[ -f "$sdist" ] || fail "no file $sdist"
pkg=$(basename "$sdist" .tar.gz)
src="$cache/$pkg/vendor/llama.cpp"
if [ ! -f "$src/include/llama.h" ]; then
    log "unpacking $pkg"
    tar -xzf "$sdist" -C "$cache" || fail "cannot unpack $sdist"
    [ -f "$src/include/llama.h" ] || fail "$sdist has no vendor/llama.cpp/include/llama.h"
fi
# the instruction sets /proc/cpuinfo lists, in ggml's option names (all of
# avx512 f, bw, cd, dq and vl for GGML_AVX512)
cpu_flags() {
    local f out="" have
    have=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    for f in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
             avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
        case "$have" in *" ${f%%:*} "*) out="$out ${f##*:}" ;; esac
    done
    case "$have" in *" avx512f "*) case "$have" in *" avx512bw "*) case "$have" in *" avx512cd "*)
        case "$have" in *" avx512dq "*) case "$have" in *" avx512vl "*) out="$out AVX512" ;; esac ;; esac ;; esac ;;
        esac ;; esac
    echo "${out# }"
}
flags=$(cpu_flags)
bdir="$cache/build-$pkg-$(echo "$flags" | cksum | cut -d' ' -f1)"
driver="$bdir/llama_driver"
quant="$bdir/llama_quant"
if [ ! -x "$driver" ] || [ ! -x "$quant" ] || [ "$here/peer/llama_driver.c" -nt "$driver" ] ||
    [ "$here/peer/llama_quant.c" -nt "$quant" ] || [ "$here/peer/CMakeLists.txt" -nt "$driver" ]; then
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    log "building llama.cpp ($pkg, CPU, Release, $flags), llama_driver and llama_quant in $bdir"
    { cmake -S "$here/peer" -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_SRC="$src" \
        -DPEER_CPU_FLAGS="$flags" &&
        cmake --build "$bdir" --target llama_driver llama_quant -j "$(nproc)"; } >"$bdir.log" 2>&1 ||
        fail "llama.cpp build failed, see $bdir.log"
fi

# ---------------------------------------------------------------- model and GGUF
if [ -z "$model" ]; then
    base="${TIDE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tide}"
    model="$base/models/tinyllama-1.1b-synthetic-s0"
fi
if [ ! -f "$model/config.json" ]; then
    log "writing the built-in model to $model"
    "$tide" make-model --config tinyllama-1.1b --seed 0 "$model" >&2 || fail "tide make-model failed"
fi
pyenv=()
if ! python3 -c 'import gguf' 2>/dev/null; then
    if ! PYTHONPATH="$cache/py" python3 -c 'import gguf' 2>/dev/null; then
        log "installing the gguf package into $cache/py"
        python3 -m pip install --quiet --target "$cache/py" gguf >"$cache/pip-gguf.log" 2>&1 ||
            skip "cannot install the gguf package, see $cache/pip-gguf.log"
    fi
    pyenv=(env "PYTHONPATH=$cache/py${PYTHONPATH:+:$PYTHONPATH}")
fi
weights=$(ls "$model"/*.safetensors | head -n1)
gguf="$cache/$(basename "$model")-bf16.gguf"
gguf32="$cache/$(basename "$model")-f32.gguf"
for f in "$gguf" "$gguf32"; do
    if [ ! -f "$f" ] || [ "$weights" -nt "$f" ] || [ "$here/peer/gguf_convert.py" -nt "$f" ]; then
        log "converting $model to $f"
        opt=()
        [ "$f" = "$gguf32" ] && opt=(--f32)
        "${pyenv[@]}" python3 "$here/peer/gguf_convert.py" "${opt[@]}" "$model" "$f" >&2 || fail "conversion failed"
    fi
done

# The report's machine (cpu, flags) and tide build (commit, unless --commit).
machine_and_commit() {
    cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
    flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx|avx2$|fma$)' | sort -u | tr '\n' ' ')
    if [ -z "$commit" ]; then
        commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
        [ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+dirty"
    fi
}

# ---------------------------------------------------------------- quantized files
# Each type's file from the f32 GGUF by llama.cpp's own quantizer, then
# llama.cpp and tide on each file, interleaved rounds, and the report.
quant_mode() {
    local q f c j r out files=() qnames=()
    for q in $qtypes; do
        f="$cache/$(basename "$model")-$q.gguf"
        if [ ! -f "$f" ] || [ "$gguf32" -nt "$f" ]; then
            log "quantizing $gguf32 to $q with llama.cpp's quantizer"
            "$quant" "$gguf32" "$f.tmp" "$q" "$(nproc)" >"$f.log" 2>&1 || fail "llama_quant $q failed, see $f.log"
            mv "$f.tmp" "$f" || fail "cannot rename $f.tmp"
        fi
        files+=("$f" "$f")
        qnames+=("llama.cpp $q" "tide $q")
    done
    local ncfg=${#files[@]}
    log "$("$tide" --version 2>/dev/null | head -n1), llama.cpp from $pkg; $rounds rounds of $ncfg configurations, $threads threads, prompt $n_prompt, $n_new new tokens"
    local load0 load1
    load0=$(cut -d' ' -f1-3 /proc/loadavg)
    for ((r = 0; r < rounds; r++)); do
        for ((j = 0; j < ncfg; j++)); do
            c=$(((j + r) % ncfg))
            out="$work/r$r-c$c.json"
            if [ $((c % 2)) = 0 ]; then
                "$driver" --model "${files[$c]}" --margins --threads "$threads" --new-tokens "$n_new" --tokens "$ids" \
                    >"$out" 2>"$work/r$r-c$c.err"
            else
                "$tide" run --backend cpu --model "${files[$c]}" --threads "$threads" --new-tokens "$n_new" \
                    --tokens "$ids" --json --quiet >"$out" 2>"$work/r$r-c$c.err"
            fi || { tail -n5 "$work/r$r-c$c.err" >&2; fail "round $((r + 1)): ${qnames[$c]} failed"; }
            log "round $((r + 1)): ${qnames[$c]} done"
        done
    done
    load1=$(cut -d' ' -f1-3 /proc/loadavg)
    local cpu flags
    machine_and_commit
    PEER_DIR="$here/peer" python3 - "$work" "$rounds" "$ncfg" "$json" "$cpu" "$(nproc)" "$flags" "$commit" "$pkg" \
        "$load0" "$load1" \
        "${qnames[@]}" <<'PYEOF'
import json, os, statistics, sys
sys.path.insert(0, os.environ["PEER_DIR"])
from report import finish
work, rounds, ncfg, json_path, cpu, ncores, flags, commit, pkg, load0, load1 = sys.argv[1:12]
rounds, ncfg = int(rounds), int(ncfg)
names = sys.argv[12:12 + ncfg]
last = lambda path: json.loads(open(path).read().strip().splitlines()[-1])
runs = [[last(f"{work}/r{r}-c{c}.json") for r in range(rounds)] for c in range(ncfg)]
fails = [f"{names[c]} generates different tokens in different rounds" for c in range(ncfg)
         if any(x["tokens"] != runs[c][0]["tokens"] for x in runs[c])]
r0 = runs[0][0]
print(f"# tide vs llama.cpp on llama.cpp's quantized files, CPU: prompt {r0['prompt_tokens']} tokens, "
      f"{r0['new_tokens']} generated, {r0['threads']} threads, {rounds} interleaved rounds\n")
print(f"machine: {cpu}, {ncores} cores; flags: {flags.strip()}; load average {load0} before, {load1} after")
print(f"tide {commit}; llama.cpp vendored by {pkg}: {r0.get('system_info', '').strip(' |')}\n")
print("| file | engine | prefill tokens/s (range) | decode tokens/s (range) | best prefill / llama.cpp "
      "| best decode / llama.cpp | paired prefill / decode | tokens equal to llama.cpp's |")
print("|---|---|---|---|---|---|---|---|")
lines, verdicts = [], []
for c in range(0, ncfg, 2):
    q = names[c].split()[-1]
    for e in (c, c + 1):
        P = [x["prefill_tokens_per_s"] for x in runs[e]]
        D = [x["decode_tokens_per_s"] for x in runs[e]]
        bp = max(P) / max(x["prefill_tokens_per_s"] for x in runs[c])
        bd = max(D) / max(x["decode_tokens_per_s"] for x in runs[c])
        pp = statistics.median(runs[e][r]["prefill_tokens_per_s"] / runs[c][r]["prefill_tokens_per_s"] for r in range(rounds))
        pd = statistics.median(runs[e][r]["decode_tokens_per_s"] / runs[c][r]["decode_tokens_per_s"] for r in range(rounds))
        a, b = runs[c][0]["tokens"], runs[e][0]["tokens"]
        n = 0
        while n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        print(f"| {q} | {names[e].split()[0]} | {statistics.median(P):.2f} ({min(P):.1f}-{max(P):.1f}) "
              f"| {statistics.median(D):.2f} ({min(D):.2f}-{max(D):.2f}) | {bp:.3f} | {bd:.3f} | {pp:.3f} / {pd:.3f} "
              f"| {'all' if n == len(a) else f'first {n} of {len(a)}'} |")
        if e == c + 1:
            verdicts.append(f"{q}: prefill {bp:.3f} {'met' if bp >= 1 else 'NOT met'}, "
                            f"decode {bd:.3f} {'met' if bd >= 1 else 'NOT met'}")
        lines.append({"bench": "peer_llamacpp_quant", "file": q, "engine": names[e].split()[0],
                      "prompt": r0["prompt_tokens"], "new": r0["new_tokens"], "threads": r0["threads"],
                      "rounds": rounds, "prefill_tps": round(statistics.median(P), 3),
                      "decode_tps": round(statistics.median(D), 3), "best_prefill_ratio": round(bp, 4),
                      "best_decode_ratio": round(bd, 4), "paired_prefill_ratio": round(pp, 4),
                      "paired_decode_ratio": round(pd, 4), "tokens_equal_to_llama_cpp": n, "commit": commit,
                      "llama_cpp": pkg, "load": [load0, load1]})
print("\ntarget tide / llama.cpp >= 1.0 on the best run of each: " + "; ".join(verdicts))
finish(lines, fails, json_path)
PYEOF
}

# ---------------------------------------------------------------- runs
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")
ids=$(python3 -c 'import sys; n, v = int(sys.argv[1]), int(sys.argv[2]); print(",".join(str(((1 + i * 2654435761) % 2**32) % v) for i in range(n)))' "$n_prompt" "$vocab")
work=$(mktemp -d "${TMPDIR:-/tmp}/peer-llamacpp.XXXXXX") || fail "mktemp failed"
trap 'rm -rf "$work"' EXIT

if [ -n "$qtypes" ]; then
    quant_mode "$@"
    exit $?
fi

# Configurations: name and command. tide's default mode is whatever `tide run`
# picks without --matmul; f32 and fast are added when they are other modes
# and the backend takes them (tried on a 2-token run).
names=(llama.cpp tide)
modes=("" "")
run_cfg() { # configuration $1: the driver, or tide with matmul mode ${modes[$1]} (empty: its default)
    if [ "$1" = check ]; then
        "$driver" --model "$gguf32" --kv f32 --flash-attn off --margins --threads "$threads" --new-tokens "$n_new" \
            --tokens "$ids"
    elif [ "$1" = 0 ]; then
        "$driver" --model "$gguf" --margins --threads "$threads" --new-tokens "$n_new" --tokens "$ids"
    else
        "$tide" run --backend cpu --model "$model" --threads "$threads" --new-tokens "$n_new" --tokens "$ids" \
            --json --quiet ${modes[$1]:+--matmul "${modes[$1]}"}
    fi
}
probe_mode() { # prints the mode tide resolves, or nothing when refused
    "$tide" run --backend cpu --model "$model" --threads "$threads" --prompt-len 2 --new-tokens 2 --json --quiet "$@" \
        2>"$work/probe.err" | python3 -c 'import json,sys; print(json.load(sys.stdin)["matmul"])' 2>/dev/null
}
default_mode=$(probe_mode) || true
[ -n "$default_mode" ] || fail "tide run failed on $model: $(tail -n1 "$work/probe.err")"
for mode in f32 fast; do
    [ "$mode" = "$default_mode" ] && continue
    got=$(probe_mode --matmul "$mode") || true
    if [ "$got" = "$mode" ]; then
        names+=("tide --matmul $mode")
        modes+=("$mode")
    else
        log "tide --matmul $mode: not available on the CPU ($(tail -n1 "$work/probe.err"))"
    fi
done
ncfg=${#names[@]}
f32cfg=1 # the configuration that runs tide's f32 mode
for ((c = 2; c < ncfg; c++)); do [ "${modes[$c]}" = f32 ] && f32cfg=$c; done
if [ "$default_mode" != f32 ] && [ "${modes[$f32cfg]}" != f32 ]; then
    fail "tide has no f32 matmul mode on the CPU to check against"
fi
load0=$(cut -d' ' -f1-3 /proc/loadavg)
log "check: llama.cpp in f32 (f32 GGUF, f32 KV cache, flash attention off)"
run_cfg check >"$work/check.json" 2>"$work/check.err" || { tail -n5 "$work/check.err" >&2; fail "the check run failed"; }

log "$("$tide" --version 2>/dev/null | head -n1) (default matmul $default_mode), llama.cpp from $pkg; $rounds rounds of $ncfg configurations, $threads threads, prompt $n_prompt, $n_new new tokens"
for ((r = 0; r < rounds; r++)); do
    for ((j = 0; j < ncfg; j++)); do
        c=$(((j + r) % ncfg))
        out="$work/r$r-c$c.json"
        if ! run_cfg "$c" >"$out" 2>"$work/r$r-c$c.err"; then
            tail -n5 "$work/r$r-c$c.err" >&2
            fail "round $((r + 1)): ${names[$c]} failed"
        fi
        log "round $((r + 1)): ${names[$c]} done"
    done
done

# ---------------------------------------------------------------- report
load1=$(cut -d' ' -f1-3 /proc/loadavg)
machine_and_commit
PEER_DIR="$here/peer" python3 - "$work" "$rounds" "$ncfg" "$f32cfg" "$json" "$cpu" "$(nproc)" "$flags" "$commit" "$pkg" "$default_mode" \
    "$load0" "$load1" "${names[@]}" <<'EOF'
import json, os, statistics, sys
sys.path.insert(0, os.environ["PEER_DIR"])
from report import finish
(work, rounds, ncfg, f32cfg, json_path, cpu, ncores, flags, commit, pkg, default_mode,
 load0, load1) = sys.argv[1:14]
rounds, ncfg, f32cfg = int(rounds), int(ncfg), int(f32cfg)
names = sys.argv[14:14 + ncfg]
last = lambda path: json.loads(open(path).read().strip().splitlines()[-1])
runs = [[last(f"{work}/r{r}-c{c}.json") for r in range(rounds)] for c in range(ncfg)]
check = last(f"{work}/check.json")
ref = check["tokens"]
fails = []
if any(x["tokens"] != ref for x in runs[f32cfg]):
    fails.append(f"{names[f32cfg]} (f32) does not generate llama.cpp's f32 tokens")
for c in range(ncfg):
    if any(x["tokens"] != runs[c][0]["tokens"] for x in runs[c]):
        fails.append(f"{names[c]} generates different tokens in different rounds")


def agree(t, ref=ref):
    n = 0
    while n < len(ref) and n < len(t) and t[n] == ref[n]:
        n += 1
    return n


med = lambda c, k: statistics.median(x[k] for x in runs[c])
rng = lambda c, k: (min(x[k] for x in runs[c]), max(x[k] for x in runs[c]))
r0 = runs[0][0]
print(f"# tide vs llama.cpp on the CPU: prompt {r0['prompt_tokens']} tokens, {r0['new_tokens']} generated, "
      f"{r0['threads']} threads, median of {rounds} interleaved rounds\n")
print(f"machine: {cpu}, {ncores} cores; flags: {flags.strip()}; load average {load0} before, {load1} after")
print(f"tide {commit} (default CPU matmul mode: {default_mode}); llama.cpp vendored by {pkg}")
print(f"llama.cpp: {r0.get('system_info', '').strip(' |')}\n")
print("| engine | prefill tokens/s | decode tokens/s | prefill / llama.cpp | decode / llama.cpp "
      "| paired prefill / decode ratio | best prefill / decode tokens/s | ratio of the bests "
      "| tokens equal to the f32 check's | to llama.cpp's |")
print("|---|---|---|---|---|---|---|---|---|---|")
p0, d0 = med(0, "prefill_tokens_per_s"), med(0, "decode_tokens_per_s")
pb0, db0 = rng(0, "prefill_tokens_per_s")[1], rng(0, "decode_tokens_per_s")[1]
lines = []
for c in range(ncfg):
    p, d = med(c, "prefill_tokens_per_s"), med(c, "decode_tokens_per_s")
    (pa, pb), (da, db) = rng(c, "prefill_tokens_per_s"), rng(c, "decode_tokens_per_s")
    # paired: each round's run against llama.cpp's run of the same round, median over rounds
    pp = statistics.median(runs[c][r]["prefill_tokens_per_s"] / runs[0][r]["prefill_tokens_per_s"] for r in range(rounds))
    pd = statistics.median(runs[c][r]["decode_tokens_per_s"] / runs[0][r]["decode_tokens_per_s"] for r in range(rounds))
    n = agree(runs[c][0]["tokens"])
    eq = "all" if n == len(ref) else f"first {n} of {len(ref)}"
    nl = agree(runs[c][0]["tokens"], r0["tokens"])
    eql = "all" if nl == len(ref) else f"first {nl}"
    label = names[c] + (" (bf16 GGUF, its defaults)" if c == 0 else f" (matmul {runs[c][0].get('matmul', '')})")
    print(f"| {label} | {p:.2f} ({pa:.1f}-{pb:.1f}) | {d:.2f} ({da:.1f}-{db:.1f}) | {p / p0:.3f} | {d / d0:.3f} "
          f"| {pp:.3f} / {pd:.3f} | {pb:.2f} / {db:.2f} | {pb / pb0:.3f} / {db / db0:.3f} | {eq} | {eql} |")
    lines.append({"bench": "peer_llamacpp", "engine": names[c], "matmul": runs[c][0].get("matmul", "bf16"),
                  "prompt": r0["prompt_tokens"], "new": r0["new_tokens"], "threads": r0["threads"],
                  "rounds": rounds, "prefill_tps": round(p, 3), "decode_tps": round(d, 3),
                  "prefill_ratio": round(p / p0, 4), "decode_ratio": round(d / d0, 4),
                  "paired_prefill_ratio": round(pp, 4), "paired_decode_ratio": round(pd, 4),
                  "best_prefill_tps": round(pb, 3), "best_decode_tps": round(db, 3),
                  "best_prefill_ratio": round(pb / pb0, 4), "best_decode_ratio": round(db / db0, 4),
                  "prefill_tps_runs": [round(x["prefill_tokens_per_s"], 3) for x in runs[c]],
                  "decode_tps_runs": [round(x["decode_tokens_per_s"], 3) for x in runs[c]],
                  "tokens_equal_to_f32": n, "tokens_equal_to_llama_cpp": nl, "commit": commit, "llama_cpp": pkg, "load": [load0, load1]})
print()
print("per round (prefill / decode tokens/s):")
for r in range(rounds):
    print(f"  round {r + 1}: " + "; ".join(f"{names[c]} {runs[c][r]['prefill_tokens_per_s']:.1f} / "
                                          f"{runs[c][r]['decode_tokens_per_s']:.2f}" for c in range(ncfg)))
print(f"\ncheck: llama.cpp in f32 (f32 GGUF, f32 KV cache, no flash attention): {' '.join(map(str, ref))}")
print(f"  {names[f32cfg]} (f32 mode): {'the same tokens' if runs[f32cfg][0]['tokens'] == ref else 'DIFFERENT tokens'}; "
      f"smallest gap between llama.cpp's two largest logits {min(check['margins']):.4f}")
n = agree(r0["tokens"])
if n < len(ref):
    print(f"  llama.cpp at its defaults (bf16 activations, f16 flash attention) leaves them at token {n + 1}, "
          f"where its two largest logits are {r0['margins'][n]:.4f} apart "
          f"(the f32 run's gap there: {check['margins'][n]:.4f})")
pt, dt = rng(1, "prefill_tokens_per_s")[1] / pb0, rng(1, "decode_tokens_per_s")[1] / db0
print(f"target tide (default mode) / llama.cpp >= 1.0, on the best run of each (the one others disturbed least): "
      f"prefill {pt:.3f} {'met' if pt >= 1 else 'NOT met'}, decode {dt:.3f} {'met' if dt >= 1 else 'NOT met'}")
finish(lines, fails, json_path)
EOF
