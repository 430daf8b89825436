#!/usr/bin/env bash
# peer_llamacpp.sh - tide against llama.cpp on the CPU, same weights, same
# prompt ids, same threads, interleaved in one run.
#
#   bench/peer_llamacpp.sh [--tide PATH] [--model DIR] [--rounds N] [--threads N]
#                          [--prompt N] [--new N] [--cache DIR] [--sdist FILE]
#                          [--json FILE]
#
# 1. llama.cpp: the source that llama-cpp-python's source distribution vendors
#    (`pip download --no-deps --no-binary :all: llama-cpp-python`, or --sdist
#    FILE), built CPU-only, Release, GGML_NATIVE, as a static library with
#    bench/peer/llama_driver.c (greedy generation from exact token ids),
#    through bench/peer/CMakeLists.txt. Kept in the cache directory (default
#    ${XDG_CACHE_HOME:-~/.cache}/tide/peer-llamacpp), so later runs neither
#    download nor build.
# 2. The model (default: tide's built-in one, written by `tide make-model` if
#    absent) converted to a bf16 GGUF by bench/peer/gguf_convert.py (the `gguf`
#    package; installed into the cache directory if Python lacks it), with
#    llama.cpp's Q/K row permutation for its rotary layout.
# 3. Rounds (default 3), each running every configuration once as a fresh
#    process, in an order rotated from round to round: llama.cpp; tide in its
#    default CPU matmul mode; tide --matmul f32 and --matmul fast where they
#    differ from the default and the CPU backend accepts them. Each prefills
#    --prompt ids (default 512; tide's deterministic prompt, passed as a list
#    to both) and generates --new tokens (default 32) greedily with --threads
#    threads (default 2). Prefill tokens/s = prompt / prefill time; decode
#    tokens/s = (new - 1) / the time of the single-token steps, as tide counts.
# 4. Every run's tokens must equal llama.cpp's first run's. Prints the median
#    tokens/s of each configuration and the ratios tide / llama.cpp (target
#    >= 1.0 in the default mode), then JSON lines (appended to --json FILE).
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

usage() {
    sed -n '4,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
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
    *) usage ;;
    esac
done
case "$rounds$threads$n_prompt$n_new" in *[!0-9]*) usage ;; esac
[ "$rounds" -ge 1 ] && [ "$threads" -ge 1 ] && [ "$n_prompt" -ge 1 ] && [ "$n_new" -ge 2 ] || usage

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
bdir="$cache/build-$pkg"
driver="$bdir/llama_driver"
if [ ! -x "$driver" ] || [ "$here/peer/llama_driver.c" -nt "$driver" ] || [ "$here/peer/CMakeLists.txt" -nt "$driver" ]; then
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    log "building llama.cpp ($pkg, CPU, Release, native) and llama_driver in $bdir"
    { cmake -S "$here/peer" -B "$bdir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DLLAMA_SRC="$src" &&
        cmake --build "$bdir" --target llama_driver -j "$(nproc)"; } >"$bdir.log" 2>&1 ||
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
if [ ! -f "$gguf" ] || [ "$weights" -nt "$gguf" ] || [ "$here/peer/gguf_convert.py" -nt "$gguf" ]; then
    log "converting $model to $gguf"
    "${pyenv[@]}" python3 "$here/peer/gguf_convert.py" "$model" "$gguf" >&2 || fail "conversion failed"
fi

# ---------------------------------------------------------------- runs
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$model/config.json")
ids=$(python3 -c 'import sys; n, v = int(sys.argv[1]), int(sys.argv[2]); print(",".join(str(((1 + i * 2654435761) % 2**32) % v) for i in range(n)))' "$n_prompt" "$vocab")
work=$(mktemp -d "${TMPDIR:-/tmp}/peer-llamacpp.XXXXXX") || fail "mktemp failed"
trap 'rm -rf "$work"' EXIT

# Configurations: name and command. tide's default mode is whatever `tide run`
# picks without --matmul; f32 and fast are added when they are other modes
# and the backend takes them (tried on a 2-token run).
names=(llama.cpp tide)
modes=("" "")
run_cfg() { # configuration $1: the driver, or tide with matmul mode ${modes[$1]} (empty: its default)
    if [ "$1" = 0 ]; then
        "$driver" --model "$gguf" --threads "$threads" --new-tokens "$n_new" --tokens "$ids"
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
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512|amx|avx2$|fma$)' | sort -u | tr '\n' ' ')
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
python3 - "$work" "$rounds" "$ncfg" "$json" "$cpu" "$(nproc)" "$flags" "$commit" "$pkg" "$default_mode" "${names[@]}" <<'EOF'
import json, statistics, sys
work, rounds, ncfg, json_path, cpu, ncores, flags, commit, pkg, default_mode = sys.argv[1:11]
rounds, ncfg = int(rounds), int(ncfg)
names = sys.argv[11:11 + ncfg]
runs = [[json.loads(open(f"{work}/r{r}-c{c}.json").read().strip().splitlines()[-1]) for r in range(rounds)]
        for c in range(ncfg)]
ref = runs[0][0]["tokens"]
diff = [(names[c], r + 1) for c in range(ncfg) for r in range(rounds) if runs[c][r]["tokens"] != ref]
med = lambda c, k: statistics.median(x[k] for x in runs[c])
rng = lambda c, k: (min(x[k] for x in runs[c]), max(x[k] for x in runs[c]))
sysinfo = runs[0][0].get("system_info", "")
print(f"# tide vs llama.cpp on the CPU: prompt {runs[0][0]['prompt_tokens']} tokens, "
      f"{runs[0][0]['new_tokens']} generated, {runs[0][0]['threads']} threads, median of {rounds} interleaved rounds\n")
print(f"machine: {cpu}, {ncores} cores; flags: {flags.strip()}")
print(f"tide {commit} (default CPU matmul mode: {default_mode}); llama.cpp vendored by {pkg}")
print(f"llama.cpp: {sysinfo.strip(' |')}\n")
print("| engine | prefill tokens/s | decode tokens/s | prefill / llama.cpp | decode / llama.cpp |")
print("|---|---|---|---|---|")
p0, d0 = med(0, "prefill_tokens_per_s"), med(0, "decode_tokens_per_s")
lines = []
for c in range(ncfg):
    p, d = med(c, "prefill_tokens_per_s"), med(c, "decode_tokens_per_s")
    (pa, pb), (da, db) = rng(c, "prefill_tokens_per_s"), rng(c, "decode_tokens_per_s")
    print(f"| {names[c]} | {p:.2f} ({pa:.1f}-{pb:.1f}) | {d:.2f} ({da:.1f}-{db:.1f}) | {p / p0:.3f} | {d / d0:.3f} |")
    lines.append({"bench": "peer_llamacpp", "engine": names[c], "matmul": runs[c][0].get("matmul", ""),
                  "prompt": runs[c][0]["prompt_tokens"], "new": runs[c][0]["new_tokens"],
                  "threads": runs[c][0]["threads"], "rounds": rounds, "prefill_tps": round(p, 3),
                  "decode_tps": round(d, 3), "prefill_ratio": round(p / p0, 4), "decode_ratio": round(d / d0, 4),
                  "prefill_tps_runs": [round(x["prefill_tokens_per_s"], 3) for x in runs[c]],
                  "decode_tps_runs": [round(x["decode_tokens_per_s"], 3) for x in runs[c]],
                  "same_tokens": all(x["tokens"] == ref for x in runs[c]), "commit": commit, "llama_cpp": pkg})
print()
print("per round (prefill / decode tokens/s):")
for r in range(rounds):
    print(f"  round {r + 1}: " + "; ".join(f"{names[c]} {runs[c][r]['prefill_tokens_per_s']:.1f} / "
                                          f"{runs[c][r]['decode_tokens_per_s']:.2f}" for c in range(ncfg)))
pt, dt = med(1, "prefill_tokens_per_s") / p0, med(1, "decode_tokens_per_s") / d0
print(f"\ntokens: {'identical in every run' if not diff else 'DIFFER: ' + ', '.join(f'{n} round {r}' for n, r in diff)}"
      f" ({' '.join(map(str, ref[:8]))} ...)")
print(f"target tide (default mode) / llama.cpp >= 1.0: prefill {pt:.3f} {'met' if pt >= 1 else 'NOT met'}, "
      f"decode {dt:.3f} {'met' if dt >= 1 else 'NOT met'}\n")
out = open(json_path, "a") if json_path else None
for l in lines:
    s = json.dumps(l, separators=(",", ":"))
    print(s)
    if out:
        out.write(s + "\n")
sys.exit(1 if diff else 0)
EOF
