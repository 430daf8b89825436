#!/usr/bin/env python3
"""train_precision.py - the step time of `tide train --precision bf16` beside
`--precision f32`, on the same machine, model, threads and tokens, in one run.

    python3 bench/train_precision.py [--tide PATH] [--layers 2] [--dtype f32]
        [--batch 2] [--seq 256] [--steps 3] [--reps 2] [--threads N] WORK_DIR

WORK_DIR holds what it writes once and reuses: the model (tinyllama-1.1b's
shapes cut to --layers decoder layers: hidden 2048, intermediate 5632, 32
heads and 4 KV heads, vocabulary 32000; `tide make-model --seed 0`) in
--dtype, and tokens.u16 (2^18 ids from a seeded generator).

Each run is `tide train --backend cpu --json` for --steps steps of batch x
seq tokens (accum 1); a step's time is its "wall_s" (forward, backward,
clipping and AdamW), the first step of each run left out (warm-up). The two
precisions alternate --reps times, so that a change in the machine's load
falls on both. Prints, per precision, the median step time, tokens/s, and
the first and last loss (the two runs train the same model on the same
tokens: their losses agree to bf16's rounding), then the speed-up, and the
bf16 products' kernel path as `tide train` names it.
"""

import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys


def run(tide, model, tokens, precision, a):
    cmd = [tide, "train", "--backend", "cpu", "--model", model, "--data", tokens, "--steps", str(a.steps),
           "--batch", str(a.batch), "--seq", str(a.seq), "--precision", precision, "--json"]
    if a.threads:
        cmd += ["--threads", str(a.threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    lines = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    steps = [o for o in lines if "step" in o and "wall_s" in o]
    summary = next(o for o in lines if o.get("summary"))
    assert summary["precision"] == precision, summary
    return steps, summary


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work_dir")
    ap.add_argument("--tide", default=os.path.join(here, "..", "build", "tide"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: tide's, all cores)")
    a = ap.parse_args()
    if a.steps < 2:
        sys.exit("--steps must be at least 2 (the first of each run is left out)")
    os.makedirs(a.work_dir, exist_ok=True)
    model = os.path.join(a.work_dir, f"tinyllama-1.1b-l{a.layers}-{a.dtype}")
    if not os.path.exists(os.path.join(model, "model.safetensors")):
        subprocess.run([a.tide, "make-model", "--config", "tinyllama-1.1b", "--layers", str(a.layers), "--dtype",
                        a.dtype, "--seed", "0", model], check=True, capture_output=True)
    tokens = os.path.join(a.work_dir, "tokens.u16")
    if not os.path.exists(tokens):
        rng = random.Random(0)
        n = 1 << 18
        with open(tokens, "wb") as f:
            f.write(struct.pack(f"<{n}H", *(rng.randrange(32000) for _ in range(n))))

    times = {"f32": [], "bf16": []}
    losses = {}
    for _ in range(a.reps):
        for p in ("f32", "bf16"):
            steps, summary = run(a.tide, model, tokens, p, a)
            times[p] += [s["wall_s"] for s in steps[1:]]
            losses[p] = (steps[0]["loss"], steps[-1]["loss"])
            threads = summary["threads"]
    tok = a.batch * a.seq
    print(f"model {os.path.basename(model)}, batch {a.batch} x seq {a.seq}, {threads} threads, "
          f"{len(times['f32'])} timed steps each")
    med = {}
    for p in ("f32", "bf16"):
        med[p] = statistics.median(times[p])
        print(f"  {p:5s} step {med[p]:.3f} s (min {min(times[p]):.3f}, max {max(times[p]):.3f}), "
              f"{tok / med[p]:.0f} tokens/s, loss {losses[p][0]:.4f} -> {losses[p][1]:.4f}")
    print(f"  bf16 / f32 step time: {med['bf16'] / med['f32']:.2f} (bf16 {med['f32'] / med['bf16']:.2f}x as fast)")
    hdr = subprocess.run([a.tide, "train", "--backend", "cpu", "--model", model, "--data", tokens, "--steps", "1",
                          "--batch", "1", "--seq", "8", "--precision", "bf16"], capture_output=True, text=True).stdout
    for line in hdr.splitlines():
        if line.startswith("precision"):
            print("  " + line)


if __name__ == "__main__":
    main()
