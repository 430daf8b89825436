#!/usr/bin/env python3
"""train_cpu.py - a CPU training step, tide against PyTorch, on the same
machine, threads, checkpoint and token windows; and tide offloaded against
tide unconstrained.

    python3 bench/train_cpu.py [--tide PATH] [--dtypes f32,bf16]
        [--precisions f32,bf16] [--threads N]
        [--warmup 1] [--steps 2] [--reps 1] [--batch 4] [--seq 256]
        [--lora R] [--lora-alpha A] [--lora-targets LIST] [--modes LIST]
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
    offloaded plans need), unless --hw names one;
  - lora-rR-aA-TARGETS/ (with --lora): the adapter both sides start from, a
    PEFT adapter directory (adapter_config.json, adapter_model.safetensors)
    written here with numpy from a seeded generator: A uniform in
    [-1/sqrt(K), 1/sqrt(K)) as PEFT's Kaiming initialisation draws it, B
    normal with std 0.02 (not PEFT's zero: the adapter then changes the
    step-0 loss, so the loss check covers the adapters' forward too).

Each step trains batch B x seq T tokens (accum 1) with AdamW (lr 3e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.1 on tensors of 2 or more dims),
the gradients' global norm clipped to 1.0. Row b of step s reads the T+1
tokens at ((s*B + b)*T) mod (n - T - 1): inputs its first T, targets its last
T, as `tide train` reads them.

  tide     `tide train --backend cpu --threads N --json`: each step's "wall_s"
           (the whole step graph: forward, backward, norm, clip and AdamW).
           f32 checkpoint: f32 parameters, moments and compute. bf16
           checkpoint: tide's mixed precision (bf16 parameters, f32 master
           weights and moments, compute in f32). --precisions bf16: the same
           runs with `--precision bf16` (products of bf16 operands with f32
           sums, kept activations bf16; docs/training.md section 13).
  PyTorch  LlamaForCausalLM from the same directory with dtype float32 and
           eager attention (the bf16 checkpoint is widened to f32: PyTorch
           trains in f32 either way), torch.optim.AdamW's default
           implementation, clip_grad_norm_(1.0), in a child process with
           torch.set_num_threads(N); timed around zero_grad, forward (logits,
           then cross-entropy), backward, clip and step. --precisions bf16:
           the forward and the loss under torch.autocast("cpu",
           dtype=torch.bfloat16), the parameters, gradients and AdamW f32.
  LoRA     (--lora R) the same step over LoRA adapters of rank R on the
           --lora-targets projections (default all seven) with the base
           frozen: tide `train --lora-r R --lora-alpha A --lora-targets L
           --lora-init ADAPTER`; PyTorch the same LlamaForCausalLM wrapped by
           PEFT's PeftModel.from_pretrained(model, ADAPTER, is_trainable=True)
           (LoraConfig r R, lora_alpha A, those target_modules, dropout 0,
           bias none), AdamW over the adapters (weight decay 0.1: every
           adapter is 2-D), clip_grad_norm_ over them. Both load the same
           adapter, so they do the same work from the same numbers: their
           step-0 losses must agree to f32 rounding (a relative 1e-4; 2e-3
           in bf16, whose two roundings differ: docs/training.md section 13),
           or the run counts as failed.
  offload  `tide train --budget 25% --hw PROFILE` on the CPU backend: the
           step planned into an arena of a quarter of its unconstrained peak
           (parameters, masters, moments, gradients and activations paged
           between the arena and host memory), with --check: the unconstrained
           run trains in step and every loss and the final parameters, master
           weights and moments must be bit-identical (its own steps are not
           timed). Target: offloaded / unconstrained <= 1.15.

Every run starts from the checkpoint and trains warmup + steps steps; the
first `warmup` steps are not timed. The runs alternate (tide, PyTorch,
tide offloaded; then tide LoRA, PyTorch + PEFT) `reps` times per dtype,
every second time in reverse order (a load that rises or falls during the
benchmark then weighs on each side alike). --modes picks the steps: full,
lora or both (default: full, and full,lora with --lora); the offloaded run
belongs to the full step. The table gives the median over all timed steps of all reps and
the minimum (on a shared machine, the step others disturbed least), in
seconds per step, and the ratios of both. The step-0 losses of tide and
PyTorch are printed beside each other: the same weights and tokens give the
same loss to f32 rounding.

--breakdown: two more tide runs on the last dtype (and the last of
--precisions), unconstrained and
offloaded, each 1 + 1 steps with --trace (the Perfetto trace of the last
step): the time per op kind in each (with the cost model's FLOPs), and the
offloaded step's busy time per stream (compute, host-to-device and
device-to-host copies), to show where the time goes. With the lora mode, one
more traced run of the LoRA step, its time per op kind printed beside the
full step's.

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
    if a.lora_dir:
        # the base frozen, the adapters from the directory the tide run
        # starts from, trainable
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, a.lora_dir, is_trainable=True)
        cfg = model.peft_config["default"]
        if cfg.lora_dropout != 0 or cfg.r != a.lora or cfg.lora_alpha != a.lora_alpha:
            raise SystemExit(f"{PROG}: {a.lora_dir}: PEFT read r {cfg.r}, alpha {cfg.lora_alpha}, dropout "
                             f"{cfg.lora_dropout} (expected {a.lora}, {a.lora_alpha}, 0)")
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if a.lora_dir and not all("lora_" in n for n, p in model.named_parameters() if p.requires_grad):
        raise SystemExit(f"{PROG}: PEFT left parameters other than the adapters trainable")
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
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

    import contextlib

    for s in range(a.total_steps):
        x, y = batch(s)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ac = torch.autocast("cpu", dtype=torch.bfloat16) if a.autocast else contextlib.nullcontext()
        with ac:
            logits = model(input_ids=x, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, vocab).float(), y.view(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        wall = time.perf_counter() - t0
        print(json.dumps({"step": s, "loss": loss.item(), "grad_norm": float(norm), "wall_s": wall}), flush=True)


def run_torch(a, model_dir, data, lora_dir=None, prec="f32"):
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", model_dir, "--data", data,
           "--threads", str(a.threads), "--batch", str(a.batch), "--seq", str(a.seq),
           "--total-steps", str(a.warmup + a.steps), a.work_dir]
    if prec == "bf16":
        cmd += ["--autocast"]
    if lora_dir:
        cmd += ["--lora", str(a.lora), "--lora-alpha", repr(a.lora_alpha), "--lora-dir", lora_dir]
    return run_steps(cmd, "PyTorch + PEFT" if lora_dir else "PyTorch")


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


def lora_args(a, lora_dir):
    """tide train's LoRA options for the adapter in lora_dir (they must agree
    with its adapter_config.json, which tide checks)."""
    return ["--lora-r", str(a.lora), "--lora-alpha", repr(a.lora_alpha), "--lora-targets", ",".join(a.targets),
            "--lora-init", lora_dir]


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


LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_SHORT = ("q", "k", "v", "o", "gate", "up", "down")


def parse_targets(text):
    """--lora-targets: tide's short names or PEFT's module names, in any
    order; returned as PEFT's names in tide's order."""
    got = set()
    for t in (x.strip() for x in text.split(",")):
        if t in LORA_SHORT:
            got.add(LORA_MODULES[LORA_SHORT.index(t)])
        elif t in LORA_MODULES:
            got.add(t)
        else:
            fail(f"--lora-targets: unknown target '{t}' (q,k,v,o,gate,up,down)", 2)
    return [m for m in LORA_MODULES if m in got]


def ensure_adapter(a, model_dir):
    """The PEFT adapter both sides start from (see the top of this file),
    written once per rank, alpha and targets: shapes from the checkpoint's
    config.json."""
    short = "-".join(LORA_SHORT[LORA_MODULES.index(m)] for m in a.targets)
    d = os.path.join(a.work_dir, f"lora-r{a.lora}-a{a.lora_alpha:g}-{short}")
    if os.path.isfile(os.path.join(d, "adapter_model.safetensors")):
        return d
    import numpy as np
    from safetensors.numpy import save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    D, I, H = c["hidden_size"], c["intermediate_size"], c["num_attention_heads"]
    hd = c.get("head_dim") or D // H
    q, kv = H * hd, c.get("num_key_value_heads", H) * hd
    shape = {"q_proj": (q, D), "k_proj": (kv, D), "v_proj": (kv, D), "o_proj": (D, q),
             "gate_proj": (I, D), "up_proj": (I, D), "down_proj": (D, I)}  # (out N, in K)
    part = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
            "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
    rng = np.random.default_rng(20261203)
    tensors = {}
    for L in range(c["num_hidden_layers"]):
        for m in a.targets:
            N, K = shape[m]
            pre = f"base_model.model.model.layers.{L}.{part[m]}.{m}"
            bound = 1.0 / np.sqrt(K)
            tensors[pre + ".lora_A.weight"] = rng.uniform(-bound, bound, (a.lora, K)).astype("<f4")
            tensors[pre + ".lora_B.weight"] = (0.02 * rng.standard_normal((N, a.lora))).astype("<f4")
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": a.lora, "lora_alpha": a.lora_alpha,
           "target_modules": list(a.targets), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
           "inference_mode": False, "base_model_name_or_path": os.path.abspath(model_dir)}
    log(f"writing the adapter {d}")
    tmp = d + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"))
    with open(os.path.join(tmp, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    if os.path.isdir(d):
        import shutil

        shutil.rmtree(d)
    os.replace(tmp, d)
    return d


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
    ap.add_argument("--precisions", default="f32",
                    help="compute precisions, comma-separated: f32 and/or bf16 (tide --precision bf16 against "
                    "PyTorch's autocast; default f32)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="threads (default: all cores)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per run (default 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per run (default 2)")
    ap.add_argument("--reps", type=int, default=1, help="alternations of the runs per dtype (default 1)")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lora", type=int, default=0, metavar="R",
                    help="also time a LoRA step of rank R, tide against PyTorch + PEFT (adds lora to --modes)")
    ap.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 R)")
    ap.add_argument("--lora-targets", default="q,k,v,o,gate,up,down",
                    help="LoRA targets: q,k,v,o,gate,up,down or PEFT's module names (default all seven)")
    ap.add_argument("--modes", help="steps to time: full and/or lora, comma-separated (default full; full,lora "
                    "with --lora)")
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
    ap.add_argument("--lora-dir", help=argparse.SUPPRESS)
    ap.add_argument("--autocast", action="store_true", help=argparse.SUPPRESS)
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
    precisions = [p for p in a.precisions.split(",") if p]
    if not precisions or any(p not in ("f32", "bf16") for p in precisions) or len(set(precisions)) != len(precisions):
        fail("--precisions takes f32 and/or bf16", 2)
    if a.lora < 0:
        fail("--lora R: a rank >= 1", 2)
    modes = [m for m in (a.modes or ("full,lora" if a.lora else "full")).split(",") if m]
    if not modes or any(m not in ("full", "lora") for m in modes) or len(set(modes)) != len(modes):
        fail("--modes takes full and/or lora", 2)
    if "lora" in modes and not a.lora:
        fail("--modes lora needs --lora R", 2)
    if a.lora:
        if a.lora_alpha is None:
            a.lora_alpha = 2.0 * a.lora
        if not (a.lora_alpha > 0):
            fail("--lora-alpha: a positive number", 2)
        if a.lora_alpha == int(a.lora_alpha):
            a.lora_alpha = int(a.lora_alpha)  # PEFT's config keeps an int; tide reads either
        a.targets = parse_targets(a.lora_targets)
    a.tide = find_tide(a.tide)
    os.makedirs(a.work_dir, exist_ok=True)

    mach, ver = machine(), versions(a.tide)
    if "lora" in modes:
        p = subprocess.run([sys.executable, "-c", "import peft, safetensors; print(peft.__version__)"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            fail("the LoRA comparison needs peft and safetensors: "
                 + (p.stderr.strip().splitlines() or ["import failed"])[-1] + ". Install them with: pip install peft")
        ver["peft"] = p.stdout.strip()
    env = {k: os.environ[k] for k in sorted(os.environ)
           if k.startswith(("OPENBLAS", "OMP_", "GOMP", "MKL", "KMP_", "TIDE_"))}
    emit = json_emitter(a.json)
    emit({"bench": "train_cpu", "machine": mach, "versions": ver, "env": env, "tide": a.tide,
          "load_average": os.getloadavg()})
    data = ensure_tokens(a)
    models = {d: ensure_model(a, d) for d in dtypes}
    hw = None if a.no_offload or "full" not in modes else ensure_profile(a)
    adapter = ensure_adapter(a, models[dtypes[0]]) if "lora" in modes else None

    failures = []
    results = []
    for d in dtypes:
        for prec in precisions:
            for mode in modes:
                r = measure(a, d, mode, models[d], data, hw, adapter, emit, failures, prec)
                emit(r)
                results.append(r)

    traced = {}
    if a.breakdown:
        d = dtypes[-1]
        sub = argparse.Namespace(**vars(a))
        sub.warmup, sub.steps = 1, 1
        runs = []
        if "full" in modes:
            runs.append(("unconstrained", []))
            if not a.no_offload:
                runs.append(("offloaded", ["--budget", a.budget, "--hw", hw]))
        if "lora" in modes:
            runs.append(("lora", lora_args(a, adapter)))
        for what, extra in runs:
            path = os.path.join(a.work_dir, f"trace-{d}-{what}.json")
            # the last --precisions entry (tide train's own default is auto)
            extra = ["--precision", precisions[-1]] + extra
            steps, _, err = run_steps(tide_cmd(sub, models[d], data, extra + ["--trace", path]),
                                      f"tide {d} {what} traced")
            if err:
                failures.append(f"tide {d} {what} traced: {err}")
            else:
                traced[what] = breakdown(path) + (steps[-1]["wall_s"], path)

    report(a, mach, ver, env, results, traced, dtypes, emit, precisions[-1])
    if failures:
        print("\nfailures:\n  " + "\n  ".join(failures))
    return 1 if failures else 0


def measure(a, d, mode, model, data, hw, adapter, emit, failures, prec="f32"):
    """The interleaved runs of one dtype, precision and mode (full: tide,
    PyTorch and tide offloaded; lora: tide and PyTorch + PEFT); returns the
    summary."""
    lora = mode == "lora"
    tag = (f"{d} LoRA r{a.lora}" if lora else d) + (" --precision bf16" if prec == "bf16" else "")
    pre = ["--precision", prec]  # always: tide train's own default is auto
    times = {"tide": [], "torch": [], "offload": []}
    losses = {"tide": None, "torch": None}
    loads = []
    check = None
    off_summary = None
    base = {"bench": "train_cpu", "dtype": d, "precision": prec, "mode": mode, "threads": a.threads,
            "batch": a.batch, "seq": a.seq}
    if lora:
        base.update({"lora_r": a.lora, "lora_alpha": a.lora_alpha, "lora_targets": a.targets})

    def run_tide(rep):
        load = os.getloadavg()[0]
        loads.append(load)
        steps, summ, err = run_steps(tide_cmd(a, model, data, pre + (lora_args(a, adapter) if lora else [])),
                                     f"tide {tag} rep {rep + 1}")
        if err:
            failures.append(f"tide {tag}: {err}")
            return
        times["tide"] += [s["wall_s"] for s in steps[a.warmup:]]
        losses["tide"] = [s["loss"] for s in steps]
        emit({**base, "run": "tide", "rep": rep, "load_average": load, "wall_s": [s["wall_s"] for s in steps],
              "loss": [s["loss"] for s in steps], "grad_norm": [s["grad_norm"] for s in steps],
              "peak_bytes": summ.get("peak_device_bytes") if summ else None})

    def run_pytorch(rep):
        load = os.getloadavg()[0]
        loads.append(load)
        steps, _, err = run_torch(a, model, data, adapter if lora else None, prec)
        if err:
            failures.append(f"PyTorch {tag}: {err}")
            return
        times["torch"] += [s["wall_s"] for s in steps[a.warmup:]]
        losses["torch"] = [s["loss"] for s in steps]
        emit({**base, "run": "torch_peft" if lora else "torch", "rep": rep, "load_average": load,
              "wall_s": [s["wall_s"] for s in steps], "loss": [s["loss"] for s in steps],
              "grad_norm": [s["grad_norm"] for s in steps]})

    def run_offloaded(rep):
        nonlocal check, off_summary
        extra = pre + ["--budget", a.budget, "--hw", hw] + ([] if a.no_check else ["--check"])
        steps, summ, err = run_steps(tide_cmd(a, model, data, extra), f"tide {d} offloaded rep {rep + 1}")
        if summ and "check_passed" in summ:
            check = summ["check_passed"] if check is None else (check and summ["check_passed"])
        if err:
            failures.append(f"tide {d} offloaded: {err}")
            return
        times["offload"] += [s["wall_s"] for s in steps[a.warmup:]]
        off_summary = summ
        emit({**base, "run": "tide_offloaded", "rep": rep, "budget": a.budget, "hw": hw,
              "budget_bytes": summ.get("budget_bytes") if summ else None,
              "peak_bytes": summ.get("peak_device_bytes") if summ else None,
              "predicted_step_s": summ.get("predicted_step_s") if summ else None,
              "wall_s": [s["wall_s"] for s in steps],
              "bytes_h2d": [s["bytes_h2d"] for s in steps], "bytes_d2h": [s["bytes_d2h"] for s in steps],
              "check_passed": summ.get("check_passed") if summ else None})

    offload = not lora and not a.no_offload
    order = [run_tide, run_pytorch] + ([run_offloaded] if offload else [])
    for rep in range(a.reps):
        # odd reps run in reverse order, so that a load that rises or
        # falls during the run weighs on each side alike
        for fn in (order if rep % 2 == 0 else order[::-1]):
            fn(rep)
    t, p, o = med(times["tide"]), med(times["torch"]), med(times["offload"])
    lt, lp = losses["tide"], losses["torch"]
    # the same work: step 0 (the same weights, adapters and tokens) agrees to
    # f32 rounding; later steps drift apart by the updates' rounding only
    loss_diff = abs(lt[0] - lp[0]) if lt and lp else None
    loss_tol = 2e-3 if prec == "bf16" else 1e-4
    loss_ok = None if loss_diff is None else loss_diff <= loss_tol * max(1.0, abs(lp[0]))
    if loss_ok is False:
        failures.append(f"{tag}: the step-0 losses differ (tide {lt[0]:.7f}, PyTorch {lp[0]:.7f}): "
                        f"the two sides do not do the same work")
    r = {**base, "table": "summary", "config": f"{CONFIG} {LAYERS} layers", "timed_steps": len(times["tide"]),
         "tide_step_s": t, "tide_step_min_s": min(times["tide"], default=float("nan")),
         "torch_step_s": p, "torch_step_min_s": min(times["torch"], default=float("nan")),
         "torch_over_tide": p / t if t == t and p == p else None,
         "torch_over_tide_min": (min(times["torch"]) / min(times["tide"])
                                 if times["torch"] and times["tide"] else None),
         "tide_tokens_per_s": a.batch * a.seq / t if t == t else None,
         "torch_tokens_per_s": a.batch * a.seq / p if p == p else None,
         "tide_steps_s": times["tide"], "torch_steps_s": times["torch"],
         "loss0_tide": lt[0] if lt else None, "loss0_torch": lp[0] if lp else None,
         "loss0_agrees": loss_ok, "load_average_min": min(loads, default=None),
         "load_average_max": max(loads, default=None)}
    if lt and lp and min(len(lt), len(lp)) > 1:
        r["loss_max_diff"] = max(abs(x - y) for x, y in zip(lt, lp))
    if offload:
        r.update({"offload_budget": a.budget, "offload_step_s": o,
                  "offload_step_min_s": min(times["offload"], default=float("nan")),
                  "offload_over_unconstrained": o / t if t == t and o == o else None,
                  "offload_over_unconstrained_min": (min(times["offload"]) / min(times["tide"])
                                                     if times["offload"] and times["tide"] else None),
                  "offload_budget_bytes": off_summary.get("budget_bytes") if off_summary else None,
                  "check_passed": check})
        if check is False:
            failures.append(f"tide {d} offloaded: --check found a difference")
    return r


def report(a, mach, ver, env, results, traced, dtypes, emit, trace_prec="f32"):
    tokens = a.batch * a.seq
    print()
    print(f"machine: {mach['cpu']} ({mach['isa']}), {mach['usable_cores']} usable cores of {mach['cores']}, "
          f"{mach['mem_gib']} GiB; {mach['os']}")
    print(f"versions: tide {ver['tide_commit']}; torch {ver['torch']} (CPU capability {ver['torch_cpu_capability']}, "
          f"{ver['torch_blas']}), transformers {ver['transformers']}, numpy {ver['numpy']}"
          + (f", peft {ver['peft']}" if ver.get("peft") else "") + "; "
          f"tide's BLAS: {ver['openblas']} (core {ver['openblas_core']})")
    print(f"environment: {', '.join(f'{k}={v}' for k, v in env.items()) or 'no OPENBLAS/OMP/MKL/TIDE variables set'}")
    print(f"model: {CONFIG} cut to {LAYERS} layers (307M parameters, untied head); batch {a.batch} x seq {a.seq} "
          f"({tokens} tokens) per step; {a.warmup} warm-up + {a.steps} timed steps per run, {a.reps} rep(s); "
          f"medians over the timed steps"
          + (f"; LoRA r {a.lora}, alpha {a.lora_alpha:g}, targets {','.join(a.targets)}, dropout 0"
             if a.lora else ""))
    print()
    off = any("offload_step_s" in r for r in results)

    def f(x, fmt="%.2f"):
        return fmt % x if x is not None and x == x else "-"

    head = ("| config | step | dtype | threads | load average | tide step s, median (min) | "
            "PyTorch step s, median (min) | PyTorch / tide, medians (mins) | tide tokens/s | PyTorch tokens/s |")
    sep = "|---|---|---|---|---|---|---|---|---|---|"
    if off:
        head += (f" tide offloaded at {a.budget}, step s, median (min) | offloaded / unconstrained, medians (mins); "
                 f"target <= 1.15 | bit-identical |")
        sep += "---|---|---|"
    print(head)
    print(sep)
    for r in results:
        dt = "tide f32, PyTorch f32" if r["dtype"] == "f32" else "tide bf16 (f32 masters and compute), PyTorch f32"
        if r["mode"] == "lora":
            dt = dt.replace("(f32 masters and compute)", "(f32 compute)")
        if r.get("precision") == "bf16":
            dt = (f"{r['dtype']} weights; tide --precision bf16, PyTorch autocast bf16")
        step = (f"LoRA r {r['lora_r']} (PyTorch + PEFT)" if r["mode"] == "lora" else "full")
        line = (f"| {r['config']} | {step} | {dt} | {r['threads']} | {f(r['load_average_min'], '%.1f')} to "
                f"{f(r['load_average_max'], '%.1f')} | {f(r['tide_step_s'])} ({f(r['tide_step_min_s'])}) | "
                f"{f(r['torch_step_s'])} ({f(r['torch_step_min_s'])}) | {f(r['torch_over_tide'], '%.3f')} "
                f"({f(r['torch_over_tide_min'], '%.3f')}) | "
                f"{f(r['tide_tokens_per_s'], '%.1f')} | {f(r['torch_tokens_per_s'], '%.1f')} |")
        if off:
            if "offload_step_s" in r:
                chk = {True: "yes", False: "NO", None: "not checked"}[r.get("check_passed")]
                line += (f" {f(r['offload_step_s'])} ({f(r['offload_step_min_s'])}) | "
                         f"{f(r['offload_over_unconstrained'], '%.3f')} "
                         f"({f(r['offload_over_unconstrained_min'], '%.3f')}) | {chk} |")
            else:
                line += " - | - | - |"
        print(line)
    print("\nPyTorch / tide above 1: tide's step is faster. Tokens/s from the medians. Load average: the 1-minute "
          "figure at the start of the dtype's runs (lowest to highest).")
    print()
    for r in results:
        if r["loss0_tide"] is not None and r["loss0_torch"] is not None:
            what = (f"{r['dtype']} LoRA" if r["mode"] == "lora" else r["dtype"]) + (
                ", precision bf16" if r.get("precision") == "bf16" else "")
            more = (f"; largest over the {a.warmup + a.steps} steps {r['loss_max_diff']:.2e}"
                    if "loss_max_diff" in r else "")
            print(f"step-0 loss, {what}: tide {r['loss0_tide']:.6f}, PyTorch {r['loss0_torch']:.6f} "
                  f"(difference {abs(r['loss0_tide'] - r['loss0_torch']):.2e}{more})")

    if traced:
        d = dtypes[-1]
        cols = [w for w in ("unconstrained", "offloaded", "lora") if w in traced]
        kinds = sorted(set(k for w in cols for k in traced[w][0]),
                       key=lambda k: -max(traced[w][0].get(k, {}).get("s", 0) for w in cols))
        print(f"\n### Time per op kind, one traced tide step ({d} weights, --precision {trace_prec}, "
              f"{a.threads} threads)\n")
        print("| op kind | " + " | ".join(f"{w} ops | {w} s | % | GFLOP (cost model) | GFLOP/s" for w in cols) + " |")
        print("|---|" + "---|---|---|---|---|" * len(cols))
        tot = {w: sum(x["s"] for x in traced[w][0].values()) for w in cols}
        for k in kinds:
            cells = []
            for w in cols:
                x = traced[w][0].get(k)
                if not x:
                    cells.append("- | - | - | - | -")
                    continue
                cells.append(f"{x['n']} | {x['s']:.3f} | {100 * x['s'] / tot[w] if tot[w] else 0:.1f} | "
                             f"{x['flops'] / 1e9:.1f} | {x['flops'] / 1e9 / x['s'] if x['s'] > 0 else 0:.1f}")
            print(f"| {k} | " + " | ".join(cells) + " |")
        for what in cols:
            by, streams, wall, path = traced[what]
            busy = ", ".join(f"{name} {v['s']:.2f} s" + (f" ({v['bytes'] / 1e9:.2f} GB)" if v["bytes"] else "")
                             for name, v in streams.items())
            print(f"\n{what}: step wall {wall:.2f} s; busy per stream: {busy}; trace {path}")
            for k, x in by.items():
                emit({"bench": "train_cpu", "table": "breakdown", "run": what, "dtype": d, "threads": a.threads,
                      "kind": k, "ops": x["n"], "s": x["s"], "gflop": x["flops"] / 1e9})
            emit({"bench": "train_cpu", "table": "streams", "run": what, "dtype": d, "wall_s": wall,
                  "streams": streams})


if __name__ == "__main__":
    sys.exit(main())
