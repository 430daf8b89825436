#!/usr/bin/env python3
"""Encoding throughput of tide's tokenizer against Hugging Face `tokenizers`.

    python3 bench/tokenizer_peer.py [--mb 10] [--reps 5] [--bench PATH]
                                    [--tokenizers a,b,...] [--json FILE] WORK_DIR

Writes WORK_DIR/text-<MB>mb.txt once: mixed text made by the text fixtures'
generator (scripts/make_text_fixtures.py: English, accented words, CJK, emoji
and ZWJ sequences, code, digit runs, whitespace), seeded. For each of the
committed fixture tokenizers (tests/fixtures/text/NAME), encodes the whole
text as one string, nothing added around it, on one thread: tide through
build/bench_tokenize, `tokenizers` through Tokenizer.encode in this process
with its thread pool held to one thread. Both are timed around the encode
alone (loading apart), best and median of --reps; the ids must be the same
(count and FNV-1a 64 hash) or the row fails. Prints a markdown table with
tide / tokenizers of the medians and one JSON line per tokenizer. Exit 0, 1
when a run fails or the ids differ, 2 for a usage error or a missing module.
"""
import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))


def fnv1a(ids):
    h = 1469598103934665603
    for v in ids:
        v &= 0xFFFFFFFF
        for b in range(4):
            h ^= (v >> (8 * b)) & 0xFF
            h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bench", default=os.path.join(ROOT, "build", "bench_tokenize"))
    ap.add_argument("--tokenizers", default="bpe-llama3,bpe-gpt2,bpe-qwen2,sp-llama2,sp-metaspace")
    ap.add_argument("--json")
    ap.add_argument("work_dir")
    a = ap.parse_args()
    if a.reps < 1 or a.mb <= 0:
        ap.error("--reps and --mb must be positive")
    try:
        import tokenizers
    except ImportError:
        print("tokenizer_peer.py: the tokenizers module is missing (pip install tokenizers)", file=sys.stderr)
        return 2
    if not os.access(a.bench, os.X_OK):
        print("tokenizer_peer.py: %s not found: build the benchmarks first" % a.bench, file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import make_text_fixtures as fx

    os.makedirs(a.work_dir, exist_ok=True)
    path = os.path.join(a.work_dir, "text-%gmb.txt" % a.mb)
    if not os.path.exists(path):
        text = fx.gen_text(random.Random(20261125), int(a.mb * 1e6))
        tmp = path + ".part"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    nbytes = len(text.encode("utf-8"))

    print("machine: %s, %d cores; Python %s; tokenizers %s; text %s (%.2f MB)" %
          (platform.processor() or platform.machine(), os.cpu_count(), platform.python_version(),
           tokenizers.__version__, path, nbytes / 1e6))
    rows, failed, out = [], False, []
    for name in [n for n in a.tokenizers.split(",") if n]:
        tdir = os.path.join(ROOT, "tests", "fixtures", "text", name)
        r = subprocess.run([a.bench, "--reps", str(a.reps), "--json", tdir, path], capture_output=True, text=True)
        if r.returncode:
            print("%s: bench_tokenize failed: %s" % (name, r.stderr.strip()), file=sys.stderr)
            failed = True
            continue
        tide = json.loads(r.stdout.strip().splitlines()[-1])
        t0 = time.perf_counter()
        tok = tokenizers.Tokenizer.from_file(os.path.join(tdir, "tokenizer.json"))
        load = time.perf_counter() - t0
        secs, ids = [], None
        for _ in range(a.reps):
            t0 = time.perf_counter()
            enc = tok.encode(text, add_special_tokens=False)
            secs.append(time.perf_counter() - t0)
            ids = enc.ids
        h = fnv1a(ids)
        same = len(ids) == tide["ids"] and h == tide["hash"]
        failed |= not same
        hf_med = statistics.median(secs)
        row = {"bench": "tokenize", "tokenizer": name, "bytes": nbytes, "ids": tide["ids"], "same_ids": same,
               "tide_median_mb_per_s": tide["median_mb_per_s"], "tide_best_mb_per_s": tide["best_mb_per_s"],
               "tokenizers_median_mb_per_s": nbytes / 1e6 / hf_med, "tokenizers_best_mb_per_s": nbytes / 1e6 / min(secs),
               "tide_load_s": tide["load_s"], "tokenizers_load_s": load,
               "tide_over_tokenizers": hf_med / tide["median_s"]}
        rows.append(row)
        print(json.dumps(row))
    print()
    print("| tokenizer | ids | same ids | tide MB/s, median (best) | tokenizers MB/s, median (best) | tide / tokenizers (target >= 1) | load: tide / tokenizers |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %s | %.2f (%.2f) | %.2f (%.2f) | %.1f | %.3f s / %.3f s |" %
              (r["tokenizer"], r["ids"], "yes" if r["same_ids"] else "NO", r["tide_median_mb_per_s"],
               r["tide_best_mb_per_s"], r["tokenizers_median_mb_per_s"], r["tokenizers_best_mb_per_s"],
               r["tide_over_tokenizers"], r["tide_load_s"], r["tokenizers_load_s"]))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
