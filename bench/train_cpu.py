#!/usr/bin/env python3
"""train_cpu.py - a CPU training step, tide against PyTorch, on the same
machine, threads, checkpoint and token windows; and tide offloaded against
tide unconstrained.

    python3 bench/train_cpu.py [--tide PATH] [--dtypes f32,bf16] [--threads N]
        [--warmup 1] [--steps 2] [--reps 1] [--batch 4] [--seq 256]
        [--budget 25%] [--hw PROFILE] [--no-offload] [--no-check]
        [--breakdown] [--quick] [--json FILE] WORK_DIR

WORK_DIR holds what the benchmark writes once and reuses:
  - tinyllama-1.1b-l4-f32/, tinyllama-1.1b-l4-bf16/: tinyllama-1.1b's shapes
    cut to 4 decoder layers (hidden 2048, intermediate 5632, 32 heads and 4 KV
    heads, vocabulary 32000, untied head; 307M parameters), written by
    `tide make-model --config tinyllama-1.1b --layers 4 --dtype D --seed 0`;
  - tokens.u16: 2^20 token ids in [0, 32000), raw little-endian uint16 from a
    seeded generator (`tide train --data`'s format);
  - cpu-profile.json: `tide probe --backend cpu` (the hardware profile the
    offloaded plans need), unless --hw names one.

Each step trains batch B x seq T tokens (accum 1) with AdamW (lr 3e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on tensors of 2 or more dims),
the gradients' global norm clipped to 1.0. Row b of step s reads the T+1
tokens at ((s*B + b)*T) mod (n - T - 1): inputs its first T, targets its last
T, as `tide train` reads them.

  tide     `tide train --backend cpu --threads N --json`: each step's "wall_s"
           (the whole step graph: forward, backward, norm, clip and AdamW).
           f32 checkpoint: f32 parameters, moments and compute. bf16
           checkpoint: tide's mixed precision (bf16 parameters, f32 master
           weights and moments, compute in f32).
  PyTorch  LlamaForCausalLM from the same directory with dtype float32 and
           eager attention (the bf16 checkpoint is widened to f32: PyTorch
           trains in f32 either way), torch.optim.AdamW's default
           implementation, clip_grad_norm_(1.0), in a child process with
           torch.set_num_threads(N); timed around zero_grad, forward (logits,
           then cross-entropy), backward, clip and step.
  offload  `tide train --budget 25% --hw PROFILE` on the CPU backend: the
           step planned into an arena of a quarter of its unconstrained peak
           (parameters, masters, moments, gradients and activations paged
           between the arena and host memory), with --check: the unconstrained
           run trains in step and every loss and the final parameters, master
           weights and moments must be bit-identical (its own steps are not
           timed). Target: offloaded / unconstrained <= 1.15.

Every run starts from the checkpoint and trains warmup + steps steps; the
first `warmup` steps are not timed. The runs alternate (tide, PyTorch,
tide offloaded) `reps` times per dtype, every second time in reverse order
(a load that rises or falls during the benchmark then weighs on each side
alike). The table gives the median over all timed steps of all reps and
the minimum (on a shared machine, the step others disturbed least), in
seconds per step, and the ratios of both. The step-0 losses of tide and
PyTorch are printed beside each other: the same weights and tokens give the
same loss to f32 rounding.

--breakdown: two more tide runs on the last dtype, unconstrained and
offloaded, each 1 + 1 steps with --trace (the Perfetto trace of the last
step): the time per op kind in each (with the cost model's FLOPs), and the
offloaded step's busy time per stream (compute, host-to-device and
device-to-host copies), to show where the time goes.

Environment: nothing is set. OPENBLAS_CORETYPE, OMP_* and the like are
passed on as found (and printed); tide takes its threads from --threads,
PyTorch from torch.set_num_threads.

Exit status: 0 ok; 1 a failure (a run failed, or --check found a
difference); 2 usage error.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

PROG = "train_cpu.py"
CONFIG = "tinyllama-1.1b"
LAYERS = 4
N_TOKENS = 1 << 20
LR, BETAS, EPS, WD, CLIP = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0


def fail(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def log(msg):
    print(f"{PROG}: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- PyTorch side


def torch_worker(a):
    """Runs in a child process: trains and prints one JSON line per step."""
    import numpy as np
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    kw = {"attn_implementation": "eager"}
    # transformers >= 4.56 calls torch_dtype `dtype`
    ver = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    kw["dtype" if ver >= (4, 56) else "torch_dtype"] = torch.float32
    model = LlamaForCausalLM.from_pretrained(a.model, **kw)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR, betas=BETAS, eps=EPS,
    )
    tok = np.fromfile(a.data, dtype="<u2").astype(np.int64)
    n, B, T = len(tok), a.batch, a.seq
    vocab = model.config.vocab_size

    def batch(s):
        rows = [((s * B + b) * T) % (n - T - 1) for b in range(B)]
        w = np.stack([tok[r : r + T + 1] for r in rows])
        w = torch.from_numpy(w)
        return w[:, :T].contiguous(), w[:, 1:].contiguous()

    for s in range(a.total_steps):
        x, y = batch(s)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=x, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab), y.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        wall = time.perf_counter() - t0
        print(json.dumps({"step": s, "loss": loss.item(), "grad_norm": float(norm), "wall_s": wall}), flush=True)


def run_torch(a, model_dir, data):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", model_dir, "--data", data,
           "--threads", str(a.threads), "--batch", str(a.batch), "--seq", str(a.seq),
           "--total-steps", str(a.warmup + a.steps), a.work_dir]
    return run_steps(cmd, "PyTorch")


# ------------------------------------------------------------------- tide side


def run_steps(cmd, what):
    """Runs a command printing one JSON object per step (and maybe a summary);
    returns (steps, summary)."""
    log(f"{what}: {' '.join(cmd)}")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    steps, summary = [], None
    for line in p.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        if o.get("summary"):
            summary = o
        elif "step" in o:
            steps.append(o)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["(no message)"])[-3:]
        return steps, summary, f"exit {p.returncode}: " + " | ".join(tail)
    return steps, summary, None


def tide_cmd(a, model_dir, data, extra=()):
    return [a.tide, "train", "--backend", "cpu", "--model", model_dir, "--data", data,
            "--steps", str(a.warmup + a.steps), "--batch", str(a.batch), "--seq", str(a.seq),
            "--accum", "1", "--lr", str(LR), "--beta1", str(BETAS[0]), "--beta2", str(BETAS[1]),
            "--eps", str(EPS), "--weight-decay", str(WD), "--grad-clip", str(CLIP),
            "--threads", str(a.threads), "--json", "--quiet", *extra]


# ------------------------------------------------------------------ set-up


def find_tide(path):
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    for d in ("build", "build-release"):
        p = os.path.join(here, "..", d, "tide")
        if os.access(p, os.X_OK):
            return os.path.normpath(p)
    fail("no tide binary found in build/ or build-release/; give one with --tide PATH", 2)


def ensure_model(a, dtype):
    d = os.path.join(a.work_dir, f"{CONFIG}-l{LAYERS}-{dtype}")
    if os.path.isfile(os.path.join(d, "config.json")):
        return d
    log(f"writing {d}")
    p = subprocess.run([a.tide, "make-model", "--config", CONFIG, "--layers", str(LAYERS), "--seed", "0",
                        "--dtype", dtype, d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        fail(f"tide make-model --dtype {dtype} failed: {p.stdout.strip()}")
    return d


def ensure_tokens(a):
    path = os.path.join(a.work_dir, "tokens.u16")
    if os.path.isfile(path) and os.path.getsize(path) == 2 * N_TOKENS:
        return path
    import numpy as np

    rng = np.random.default_rng(1234)
    tmp = path + ".tmp"
    rng.integers(0, 32000, size=N_TOKENS, dtype=np.uint16).astype("<u2").tofile(tmp)
    os.replace(tmp, path)
    return path


def ensure_profile(a):
    if a.hw:
        return a.hw
    path = os.path.join(a.work_dir, "cpu-profile.json")
    if os.path.isfile(path):
        return path
    log("measuring this machine for the offloaded plans (tide probe --backend cpu)")
    p = subprocess.run([a.tide, "probe", "--backend", "cpu", "--seconds", "5", "--out", path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        fail(f"tide probe failed: {p.stdout.strip()}")
    return path


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            fl = next((l for l in f if l.startswith("flags")), "").split()
        flags = "AVX-512" if "avx512f" in fl else "AVX2" if "avx2" in fl else "no AVX2"
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(l for l in f if l.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "isa": flags, "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
            "mem_gib": round(mem / 2**30, 1), "os": platform.platform(), "python": platform.python_version()}


def versions(tide, need_torch=True):
    """tide's commit and the Python side's versions; without need_torch a
    missing torch is recorded as absent instead of failing."""
    v = {}
    try:
        out = subprocess.run(["git", "-C", os.path.dirname(os.path.abspath(__file__)), "describe", "--always",
                              "--dirty"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
        v["tide_commit"] = out or "unknown"
    except OSError:
        v["tide_commit"] = "unknown"
    p = subprocess.run([sys.executable, "-c",
                        "import torch, transformers, numpy; "
                        "print(torch.__version__, transformers.__version__, numpy.__version__); "
                        "c=torch.__config__.show(); import re; "
                        "m=re.search(r'CPU capability usage: (\\S+)', c); print(m.group(1) if m else '?'); "
                        "print('mkl' if torch.backends.mkl.is_available() else 'no-mkl')"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0 and need_torch:
        fail("this comparison needs torch, transformers and numpy: "
             + (p.stderr.strip().splitlines() or ["import failed"])[-1]
             + ". Install them with: pip install torch transformers")
    if p.returncode == 0:
        lines = p.stdout.split("\n")
        v["torch"], v["transformers"], v["numpy"] = lines[0].split()
        v["torch_cpu_capability"], v["torch_blas"] = lines[1].strip(), lines[2].strip()
    else:
        v["torch"] = v["transformers"] = "absent"
    try:
        import ctypes

        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        v["openblas"] = lib.openblas_get_config().decode()
        v["openblas_core"] = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        v["openblas"] = v["openblas_core"] = "not found"
    return v


# ---------------------------------------------------------------- breakdown


def breakdown(trace_path):
    """Sums a trace's events: compute events by op kind (the first word of an
    event's name) into {kind: {"s", "n", "flops"}}, and every event's duration
    and bytes by stream (thread name) into {stream: {"s", "bytes"}}."""
    with open(trace_path) as f:
        tr = json.load(f)
    events = tr["traceEvents"] if isinstance(tr, dict) else tr
    names = {e.get("tid"): (e.get("args") or {}).get("name", "?") for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    by, streams = {}, {}
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        if e.get("cat") == "drop":  # a release: no work
            continue
        st = streams.setdefault(names.get(e.get("tid"), str(e.get("tid"))), {"s": 0.0, "bytes": 0})
        st["s"] += e.get("dur", 0) / 1e6
        if e.get("cat") != "compute":
            st["bytes"] += int(args.get("bytes", 0))
            continue
        kind = (e.get("name") or "?").split()[0]
        r = by.setdefault(kind, {"s": 0.0, "n": 0, "flops": 0.0})
        r["s"] += e.get("dur", 0) / 1e6
        r["n"] += 1
        r["flops"] += float(args.get("flops", 0))
    return by, streams


# --------------------------------------------------------------------- main


def json_emitter(path):
    """A function printing one JSON line per object, also written to path
    (when given; flushed after each line, closed at exit)."""
    jf = open(path, "w") if path else None

    def emit(o):
        line = json.dumps(o)
        print(line, flush=True)
        if jf:
            jf.write(line + "\n")
            jf.flush()

    return emit


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("work_dir", help="directory for the checkpoints, tokens and profile (reused)")
    ap.add_argument("--tide", help="the tide binary (default: build/tide of this tree)")
    ap.add_argument("--dtypes", default="f32,bf16", help="checkpoint dtypes, comma-separated (default f32,bf16)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads (default: all cores)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (default 2)")
    ap.add_argument("--reps", type=int, default=1, help="alternations of the runs per dtype (default 1)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--budget", default="25%", help="offloaded budget (default 25%% of the unconstrained peak)")
    ap.add_argument("--hw", help="hardware profile for the offloaded plans (default: measured once, kept in WORK_DIR)")
    ap.add_argument("--no-offload", action="store_true", help="skip the offloaded runs")
    ap.add_argument("--no-check", action="store_true", help="offloaded runs without --check")
    ap.add_argument("--breakdown", action="store_true", help="time per op kind of one traced tide step")
    ap.add_argument("--quick", action="store_true",
                    help="f32 only, no warm-up, 1 timed step (the defaults otherwise: both dtypes, 1 + 2)")
    ap.add_argument("--json", help="also write the JSON lines to this file")
    # the PyTorch child
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--total-steps", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        torch_worker(a)
        return 0
    if a.threads < 1 or a.warmup < 0 or a.steps < 1 or a.reps < 1 or a.batch < 1 or a.seq < 1:
        fail("--threads, --steps, --reps, --batch and --seq must be >= 1, --warmup >= 0", 2)
    if a.quick:
        a.warmup, a.steps = 0, 1
        if a.dtypes == ap.get_default("dtypes"):
            a.dtypes = "f32"
    dtypes = [d for d in a.dtypes.split(",") if d]
    if not dtypes or any(d not in ("f32", "bf16") for d in dtypes):
        fail("--dtypes takes f32 and/or bf16", 2)
    a.tide = find_tide(a.tide)
    os.makedirs(a.work_dir, exist_ok=True)

    mach, ver = machine(), versions(a.tide)
    env = {k: os.environ[k] for k in sorted(os.environ)
           if k.startswith(("OPENBLAS", "OMP_", "GOMP", "MKL", "KMP_", "TIDE_"))}
    emit = json_emitter(a.json)
    emit({"bench": "train_cpu", "machine": mach, "versions": ver, "env": env, "tide": a.tide})
    data = ensure_tokens(a)
    models = {d: ensure_model(a, d) for d in dtypes}
    hw = None if a.no_offload else ensure_profile(a)
    tokens = a.batch * a.seq

    failures = []
    results = []
    for d in dtypes:
        times = {"tide": [], "torch": [], "offload": []}
        loss0 = {}
        check = None
        off_summary = None
        def run_tide(rep):
            steps, summ, err = run_steps(tide_cmd(a, models[d], data), f"tide {d} rep {rep + 1}")
            if err:
                failures.append(f"tide {d}: {err}")
                return
            times["tide"] += [s["wall_s"] for s in steps[a.warmup:]]
            loss0["tide"] = steps[0]["loss"]
            emit({"bench": "train_cpu", "run": "tide", "dtype": d, "rep": rep, "threads": a.threads,
                  "batch": a.batch, "seq": a.seq, "wall_s": [s["wall_s"] for s in steps],
                  "loss": [s["loss"] for s in steps], "grad_norm": [s["grad_norm"] for s in steps],
                  "peak_bytes": summ.get("peak_device_bytes") if summ else None})

        def run_pytorch(rep):
            steps, _, err = run_torch(a, models[d], data)
            if err:
                failures.append(f"PyTorch {d}: {err}")
                return
            times["torch"] += [s["wall_s"] for s in steps[a.warmup:]]
            loss0["torch"] = steps[0]["loss"]
            emit({"bench": "train_cpu", "run": "torch", "dtype": d, "rep": rep, "threads": a.threads,
                  "batch": a.batch, "seq": a.seq, "wall_s": [s["wall_s"] for s in steps],
                  "loss": [s["loss"] for s in steps], "grad_norm": [s["grad_norm"] for s in steps]})

        def run_offloaded(rep):
            nonlocal check, off_summary
            extra = ["--budget", a.budget, "--hw", hw] + ([] if a.no_check else ["--check"])
            steps, summ, err = run_steps(tide_cmd(a, models[d], data, extra), f"tide {d} offloaded rep {rep + 1}")
            if summ and "check_passed" in summ:
                check = summ["check_passed"] if check is None else (check and summ["check_passed"])
            if err:
                failures.append(f"tide {d} offloaded: {err}")
                return
            times["offload"] += [s["wall_s"] for s in steps[a.warmup:]]
            off_summary = summ
            emit({"bench": "train_cpu", "run": "tide_offloaded", "dtype": d, "rep": rep,
                  "threads": a.threads, "budget": a.budget, "hw": hw,
                  "budget_bytes": summ.get("budget_bytes") if summ else None,
                  "peak_bytes": summ.get("peak_device_bytes") if summ else None,
                  "predicted_step_s": summ.get("predicted_step_s") if summ else None,
                  "wall_s": [s["wall_s"] for s in steps],
                  "bytes_h2d": [s["bytes_h2d"] for s in steps], "bytes_d2h": [s["bytes_d2h"] for s in steps],
                  "check_passed": summ.get("check_passed") if summ else None})

        order = [run_tide, run_pytorch] + ([] if a.no_offload else [run_offloaded])
        for rep in range(a.reps):
            # odd reps run in reverse order, so that a load that rises or
            # falls during the run weighs on each side alike
            for fn in (order if rep % 2 == 0 else order[::-1]):
                fn(rep)
        t, p, o = med(times["tide"]), med(times["torch"]), med(times["offload"])
        r = {"bench": "train_cpu", "table": "summary", "config": f"{CONFIG} {LAYERS} layers", "dtype": d,
             "threads": a.threads, "batch": a.batch, "seq": a.seq, "timed_steps": len(times["tide"]),
             "tide_step_s": t, "tide_step_min_s": min(times["tide"], default=float("nan")),
             "torch_step_s": p, "torch_step_min_s": min(times["torch"], default=float("nan")),
             "torch_over_tide": p / t if t == t and p == p else None,
             "torch_over_tide_min": (min(times["torch"]) / min(times["tide"])
                                     if times["torch"] and times["tide"] else None),
             "tide_tokens_per_s": tokens / t if t == t else None,
             "torch_tokens_per_s": tokens / p if p == p else None,
             "loss0_tide": loss0.get("tide"), "loss0_torch": loss0.get("torch")}
        if not a.no_offload:
            r.update({"offload_budget": a.budget, "offload_step_s": o,
                      "offload_step_min_s": min(times["offload"], default=float("nan")),
                      "offload_over_unconstrained": o / t if t == t and o == o else None,
                      "offload_over_unconstrained_min": (min(times["offload"]) / min(times["tide"])
                                                         if times["offload"] and times["tide"] else None),
                      "offload_budget_bytes": off_summary.get("budget_bytes") if off_summary else None,
                      "check_passed": check})
            if check is False:
                failures.append(f"tide {d} offloaded: --check found a difference")
        emit(r)
        results.append(r)

    traced = {}
    if a.breakdown:
        d = dtypes[-1]
        sub = argparse.Namespace(**vars(a))
        sub.warmup, sub.steps = 1, 1
        runs = [("unconstrained", [])]
        if not a.no_offload:
            runs.append(("offloaded", ["--budget", a.budget, "--hw", hw]))
        for what, extra in runs:
            path = os.path.join(a.work_dir, f"trace-{d}-{what}.json")
            steps, _, err = run_steps(tide_cmd(sub, models[d], data, extra + ["--trace", path]),
                                      f"tide {d} {what} traced")
            if err:
                failures.append(f"tide {d} {what} traced: {err}")
            else:
                traced[what] = breakdown(path) + (steps[-1]["wall_s"], path)

    # ---------------------------------------------------------------- report
    print()
    print(f"machine: {mach['cpu']} ({mach['isa']}), {mach['usable_cores']} usable cores of {mach['cores']}, "
          f"{mach['mem_gib']} GiB; {mach['os']}")
    print(f"versions: tide {ver['tide_commit']}; torch {ver['torch']} (CPU capability {ver['torch_cpu_capability']}, "
          f"{ver['torch_blas']}), transformers {ver['transformers']}, numpy {ver['numpy']}; "
          f"tide's BLAS: {ver['openblas']} (core {ver['openblas_core']})")
    print(f"environment: {', '.join(f'{k}={v}' for k, v in env.items()) or 'no OPENBLAS/OMP/MKL/TIDE variables set'}")
    print(f"model: {CONFIG} cut to {LAYERS} layers (307M parameters, untied head); batch {a.batch} x seq {a.seq} "
          f"({tokens} tokens) per step; {a.warmup} warm-up + {a.steps} timed steps per run, {a.reps} rep(s); "
          f"medians over the timed steps")
    print()
    off = not a.no_offload

    def f(x, fmt="%.2f"):
        return fmt % x if x is not None and x == x else "-"

    head = ("| config | dtype | threads | tide step s, median (min) | PyTorch step s, median (min) | "
            "PyTorch / tide, medians (mins) | tide tokens/s | PyTorch tokens/s |")
    sep = "|---|---|---|---|---|---|---|---|"
    if off:
        head += (f" tide offloaded at {a.budget}, step s, median (min) | offloaded / unconstrained, medians (mins); "
                 f"target <= 1.15 | bit-identical |")
        sep += "---|---|---|"
    print(head)
    print(sep)
    for r in results:
        dt = "tide f32, PyTorch f32" if r["dtype"] == "f32" else "tide bf16 (f32 masters and compute), PyTorch f32"
        line = (f"| {r['config']} | {dt} | {r['threads']} | {f(r['tide_step_s'])} ({f(r['tide_step_min_s'])}) | "
                f"{f(r['torch_step_s'])} ({f(r['torch_step_min_s'])}) | {f(r['torch_over_tide'], '%.3f')} "
                f"({f(r['torch_over_tide_min'], '%.3f')}) | "
                f"{f(r['tide_tokens_per_s'], '%.1f')} | {f(r['torch_tokens_per_s'], '%.1f')} |")
        if off:
            chk = {True: "yes", False: "NO", None: "not checked"}[r.get("check_passed")]
            line += (f" {f(r['offload_step_s'])} ({f(r['offload_step_min_s'])}) | "
                     f"{f(r['offload_over_unconstrained'], '%.3f')} ({f(r['offload_over_unconstrained_min'], '%.3f')}) "
                     f"| {chk} |")
        print(line)
    print("\nPyTorch / tide above 1: tide's step is faster. Tokens/s from the medians.")
    print()
    for r in results:
        if r["loss0_tide"] is not None and r["loss0_torch"] is not None:
            print(f"step-0 loss, {r['dtype']}: tide {r['loss0_tide']:.6f}, PyTorch {r['loss0_torch']:.6f} "
                  f"(difference {abs(r['loss0_tide'] - r['loss0_torch']):.2e})")

    if traced:
        d = dtypes[-1]
        res = traced.get("unconstrained")
        off = traced.get("offloaded")
        kinds = sorted(set((res[0] if res else {}).keys()) | set((off[0] if off else {}).keys()),
                       key=lambda k: -max((res[0].get(k, {}).get("s", 0) if res else 0),
                                          (off[0].get(k, {}).get("s", 0) if off else 0)))
        print(f"\n### Time per op kind, one traced tide step ({d}, {a.threads} threads)\n")
        print("| op kind | ops | unconstrained s | % | GFLOP (cost model) | GFLOP/s | offloaded s | offloaded / unconstrained |")
        print("|---|---|---|---|---|---|---|---|")
        tot_r = sum(r["s"] for r in res[0].values()) if res else 0
        for k in kinds:
            r = res[0].get(k) if res else None
            o = off[0].get(k) if off else None
            n = (r or o)["n"]
            fl = (r or o)["flops"]
            rs = r["s"] if r else float("nan")
            os_ = o["s"] if o else float("nan")
            print(f"| {k} | {n} | {rs:.3f} | {100 * rs / tot_r if tot_r else 0:.1f} | {fl / 1e9:.1f} | "
                  f"{fl / 1e9 / rs if r and rs > 0 else 0:.1f} | {os_:.3f} | "
                  f"{os_ / rs if r and o and rs > 0 else float('nan'):.2f} |")
        for what, tr in (("unconstrained", res), ("offloaded", off)):
            if not tr:
                continue
            by, streams, wall, path = tr
            busy = ", ".join(f"{name} {v['s']:.2f} s" + (f" ({v['bytes'] / 1e9:.2f} GB)" if v["bytes"] else "")
                             for name, v in streams.items())
            print(f"\n{what}: step wall {wall:.2f} s; busy per stream: {busy}; trace {path}")
            for k, r in by.items():
                emit({"bench": "train_cpu", "table": "breakdown", "run": what, "dtype": d, "threads": a.threads,
                      "kind": k, "ops": r["n"], "s": r["s"], "gflop": r["flops"] / 1e9})
            emit({"bench": "train_cpu", "table": "streams", "run": what, "dtype": d, "wall_s": wall,
                  "streams": streams})

    if failures:
        print("\nfailures:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
