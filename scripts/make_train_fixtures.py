#!/usr/bin/env python3
"""make_train_fixtures.py - training reference fixtures from PyTorch.

What it makes: small LLaMA checkpoints (fixed seeds) in the Hugging Face layout,
a token file for each, and what ten steps of training with PyTorch give on them:
the loss, the gradient norm and the learning rate of every step, every
gradient of the first step, and every parameter (plus the AdamW moments) after
the last. A C test runs tide's trainer on the same checkpoint and tokens and
compares, as llm.c's test_gpt2.c does against its PyTorch reference.

How to run (needs python3 with torch and transformers; CPU only, a few seconds):

    python3 scripts/make_train_fixtures.py              # writes tests/fixtures/train/
    python3 scripts/make_train_fixtures.py --out DIR    # writes DIR/<name>/
    python3 scripts/make_train_fixtures.py --compare-f64
        # also reruns each fixture in float64 and prints how far the f32
        # results are from it (the basis of the README's tolerances)

CI never runs this script: the generated files are committed and the C test
reads them. Rerun it only to change or add a fixture, then commit the result and
update tests/fixtures/train/README.md, which states the file layouts and the
exact semantics emulated here (the contract of tide's trainer).

Per fixture directory DIR/<name>/:
    config.json             HF config; the classic keys "torch_dtype" and
                            "rope_theta" added (as in scripts/make_fixtures.py)
    model.safetensors       the initial weights, in the storage dtype
    data.u16                the tokens: raw little-endian uint16, no header
    expected.json           hyperparameters, per-step loss / grad_norm / lr /
                            clipped, seed, versions
    grads_step1.safetensors the first step's accumulated, unclipped f32
                            gradients, HF names
    final.safetensors       the parameters after the last step (storage dtype),
                            "master.<name>" f32 masters for a 16-bit model,
                            "exp_avg.<name>" / "exp_avg_sq.<name>" where kept

The script checks itself: the learning rates and data windows it used are
recomputed in plain Python and must agree exactly; every AdamW update is
recomputed from the formula in the README and must agree to one ulp (it agrees
bit for bit with the versions recorded). A seed makes a fixture only when its
run clips on some steps and not on others, every grad_norm at least 1% away
from the clip threshold (so that the decision does not hang on float noise),
and its loss falls; otherwise the seed is bumped (seed + 1, + 2, ...)
deterministically and the seed used is recorded.
"""

import argparse
import json
import math
import os
import random
import struct
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

# The run, shared by every fixture (the README's "Semantics" section).
B = 2  # rows per micro-batch
T = 16  # tokens per row
ACCUM = 2  # micro-batches per optimizer step
STEPS = 10
LR = 1e-3  # peak learning rate, reached at the end of warmup
MIN_LR = 1e-4
WARMUP = 3
WEIGHT_DECAY = 0.1  # on tensors with >= 2 dims only
BETA1, BETA2 = 0.9, 0.95
EPS = 1e-8
GRAD_CLIP = 1.0  # max global L2 norm

SHAPES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=64,
)

# name -> storage dtype, LlamaConfig kwargs, seed, tokens in data.u16, moments kept
FIXTURES = [
    ("train-f32-gqa", torch.float32, SHAPES, 5001, 4096, True),
    ("train-bf16-gqa", torch.bfloat16, SHAPES, 5002, 4096, False),
    (
        "train-f32-tied",
        torch.float32,
        dict(
            SHAPES,
            num_hidden_layers=1,
            num_key_value_heads=4,
            vocab_size=96,
            tie_word_embeddings=True,
        ),
        5003,
        # Few enough tokens that the windows wrap around (the largest start,
        # 624, is past 512 - T - 1 = 495).
        512,
        False,
    ),
]

INIT_STD = 0.02  # linear weights and embeddings: N(0, INIT_STD), the HF default
# RMSNorm weights: N(NORM_MEAN, NORM_STD). Not 1 (the HF default): the global
# gradient norm is about the RMS of the final norm's weight (it scales every
# hidden state the lm_head sees), so with weights near 1 every step sits at the
# clip threshold 1.0; at 0.5 the runs cross it both ways. Not all equal either,
# so that a backward pass that drops the norm weight is caught.
NORM_MEAN = 0.5
NORM_STD = 0.05
CLIP_MARGIN = 0.01  # every step's grad_norm at least 1% away from GRAD_CLIP
MAX_SEED_TRIES = 20

DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


# ---------------------------------------------------------------- the contract


def lr_at(step):
    """The learning rate of 0-based `step`, as the f32 value tide gives its kernels.

    Linear warmup to LR over WARMUP steps, then a half cosine from LR towards
    MIN_LR over the remaining steps (the last step stops short of MIN_LR).
    Computed with torch in f64, rounded once to f32.
    """
    s = torch.tensor(float(step), dtype=torch.float64)
    if step < WARMUP:
        x = LR * (s + 1) / WARMUP
    else:
        x = MIN_LR + 0.5 * (LR - MIN_LR) * (1 + torch.cos(math.pi * (s - WARMUP) / (STEPS - WARMUP)))
    return float(x.to(torch.float32))


def window_starts(n_tokens):
    """(STEPS, ACCUM, B) int64: the first token of every row of every micro-batch."""
    s = torch.arange(STEPS).view(STEPS, 1, 1)
    m = torch.arange(ACCUM).view(1, ACCUM, 1)
    b = torch.arange(B).view(1, 1, B)
    return torch.remainder(((s * ACCUM + m) * B + b) * T, n_tokens - T - 1)


def micro_batch(data, starts, step, micro):
    """Inputs and targets (B, T) of one micro-batch: a window of T + 1 tokens per row."""
    idx = starts[step, micro].view(B, 1) + torch.arange(T + 1).view(1, T + 1)  # (B, T+1)
    win = data[idx]
    return win[:, :-1], win[:, 1:]


def fma(a, b, c):
    """a * b + c with one rounding to f32 (an f32 product is exact in f64; the f64
    sum rounded again to f32 can differ from a true fused multiply-add by one ulp,
    in rare ties)."""
    return (a.double() * b.double() + c.double()).float()


def adamw_expected(p, g, m, v, step, lr, decay):
    """One AdamW update from the documented formula, all tensors f32.

    Python floats are f64 and become f32 when they meet an f32 tensor, as in
    torch's single-tensor AdamW (foreach=False, fused=False); its lerp_ and
    addcmul_ are fused multiply-adds on the CPU.
    """
    f32 = lambda x: torch.tensor(x, dtype=torch.float32)  # noqa: E731
    wd = WEIGHT_DECAY if decay else 0.0
    p = p * (1 - lr * wd)
    m = fma(f32(1 - BETA1), g - m, m)  # lerp_(g, 1 - beta1)
    v = fma(f32(1 - BETA2) * g, g, v * BETA2)  # mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias1 = 1 - BETA1**step
    bias2_sqrt = (1 - BETA2**step) ** 0.5
    denom = v.sqrt() / bias2_sqrt + EPS
    p = p + (-(lr / bias1)) * m / denom  # addcdiv_(m, denom, value=-lr / bias1)
    return p, m, v


def ulps(a, b):
    """The largest distance between a and b in f32 units in the last place (same signs)."""
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max())


# ---------------------------------------------------------------- the fixtures


def expected_names(cfg):
    """The exact HF LLaMA parameter names of cfg, in named_parameters() order."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [
            p + "self_attn.q_proj.weight",
            p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight",
            p + "self_attn.o_proj.weight",
            p + "mlp.gate_proj.weight",
            p + "mlp.up_proj.weight",
            p + "mlp.down_proj.weight",
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
        ]
    names.append("model.norm.weight")
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    return names


def make_tokens(seed, vocab, n):
    """n tokens of a seeded Markov chain over [0, vocab): learnable, so the loss falls.

    Every token has 4 successors drawn once, taken with probabilities
    0.7, 0.15, 0.1, 0.05. Pure Python, so it is the same whatever the torch version.
    """
    rng = random.Random(seed)
    succ = [rng.sample(range(vocab), 4) for _ in range(vocab)]
    cum = [0.7, 0.85, 0.95, 1.0]
    tok = [rng.randrange(vocab)]
    while len(tok) < n:
        u = rng.random()
        k = next(i for i, c in enumerate(cum) if u < c)
        tok.append(succ[tok[-1]][k])
    return tok


def build(kwargs, seed):
    """A LlamaForCausalLM in f32 with every parameter drawn from a generator seeded with seed."""
    cfg = LlamaConfig(**kwargs, initializer_range=INIT_STD, attention_bias=False, mlp_bias=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # deterministic order
            if name.endswith("norm.weight"):
                p.copy_(NORM_MEAN + NORM_STD * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(INIT_STD * torch.randn(p.shape, generator=gen))
    assert [n for n, _ in model.named_parameters()] == expected_names(cfg)
    return model


def save_checkpoint(model, dtype, d):
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):  # no stale files from an earlier run
        os.remove(os.path.join(d, f))
    model.to(dtype).save_pretrained(d, safe_serialization=True)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):  # not part of a tide checkpoint
        os.remove(gc)
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cj = json.load(f)
    cj.setdefault("torch_dtype", DTYPE_NAME[dtype])
    cj["rope_theta"] = cj.get("rope_theta", (cj.get("rope_parameters") or {}).get("rope_theta"))
    with open(path, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")


def load(d, compute):
    """The saved checkpoint loaded back in the compute dtype (16-bit weights upcast
    exactly), eager attention."""
    kw = {"attn_implementation": "eager"}
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56):
        kw["dtype"] = compute
    else:
        kw["torch_dtype"] = compute
    model = LlamaForCausalLM.from_pretrained(d, **kw)
    model.train()  # LLaMA has no dropout; train mode changes nothing but is what training runs
    assert all(p.dtype == compute for p in model.parameters())
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    else:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model


def save_tensors(tensors, path):
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, path)


def train(d, dtype, data, keep_moments, compute=torch.float32):
    """Runs STEPS steps on the checkpoint in d.

    Returns the per-step log, what was used (for the self-check), the window
    starts, the first step's gradients and the final tensors (as final.safetensors
    holds them). compute is float32 for the fixtures; float64 only to measure how
    far f32 rounding moves the results (--compare-f64).
    """
    model = load(d, compute)
    params = dict(model.named_parameters())  # the tensors forward/backward use
    with safe_open(os.path.join(d, "model.safetensors"), framework="pt") as st:
        stored = {k: st.get_tensor(k) for k in st.keys()}
    assert sorted(stored) == sorted(params), (sorted(stored), sorted(params))
    for k, p in params.items():
        assert stored[k].dtype == dtype and torch.equal(stored[k].to(compute), p.detach())

    # What AdamW updates: the parameters themselves for an f32 model, f32 masters
    # (the 16-bit weights upcast) for a 16-bit one. Both are in the compute dtype.
    mixed = dtype != torch.float32
    if mixed:
        opt_params = {k: torch.nn.Parameter(p.detach().clone()) for k, p in params.items()}
    else:
        opt_params = params
    decay = {k: p.dim() >= 2 for k, p in opt_params.items()}
    opt = torch.optim.AdamW(
        [
            {"params": [p for k, p in opt_params.items() if decay[k]], "weight_decay": WEIGHT_DECAY},
            {"params": [p for k, p in opt_params.items() if not decay[k]], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(BETA1, BETA2),
        eps=EPS,
        foreach=False,
        fused=False,
    )

    starts = window_starts(len(data))
    log = {"loss": [], "micro_loss": [], "grad_norm": [], "clip_scale": [], "clipped": [], "lr": []}
    used = {"lr": [], "rows": []}  # for the self-check
    adam_ulps = 0
    for step in range(STEPS):
        if mixed:  # the weights forward/backward see: the masters rounded to the storage dtype
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(opt_params[k].to(dtype).to(compute))
        model.zero_grad(set_to_none=True)
        step_loss, micro = 0.0, []
        for m in range(ACCUM):
            x, y = micro_batch(data, starts, step, m)
            used["rows"].append(torch.cat([x, y[:, -1:]], dim=1).tolist())
            logits = model(input_ids=x, use_cache=False).logits  # (B, T, V)
            ce = F.cross_entropy(logits.reshape(B * T, -1), y.reshape(B * T))  # mean over B*T
            loss = ce / ACCUM
            loss.backward()  # gradients add up over the micro-batches
            micro.append(ce.item())
            step_loss += loss.item()  # f32 values summed in f64

        if step == 0:
            grads1 = {k: p.grad.detach().clone() for k, p in params.items()}
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), GRAD_CLIP)
        scale = float(torch.clamp(GRAD_CLIP / (norm + 1e-6), max=1.0))  # what torch scaled by
        lr = lr_at(step)
        used["lr"].append(lr)
        for g in opt.param_groups:
            g["lr"] = lr
        if mixed:
            for k, p in opt_params.items():
                p.grad = params[k].grad

        check = compute == torch.float32  # the formula is written for f32 tensors
        if check:
            before = {k: (p.detach().clone(), p.grad.clone()) for k, p in opt_params.items()}
            moments = {}
            for k, p in opt_params.items():
                st = opt.state[p]  # empty before the first update: m = v = 0
                moments[k] = (
                    (st["exp_avg"].clone(), st["exp_avg_sq"].clone())
                    if st
                    else (torch.zeros_like(p), torch.zeros_like(p))
                )
        opt.step()
        for k, p in opt_params.items() if check else ():  # the update is the README's formula
            p0, g = before[k]
            pe, me, ve = adamw_expected(p0, g, *moments[k], step + 1, lr, decay[k])
            st = opt.state[p]
            worst = max(ulps(pe, p.detach()), ulps(me, st["exp_avg"]), ulps(ve, st["exp_avg_sq"]))
            assert worst <= 1, f"step {step} {k}: AdamW is {worst} ulps from the documented formula"
            adam_ulps = max(adam_ulps, worst)

        log["loss"].append(step_loss)
        log["micro_loss"].append(micro)
        log["grad_norm"].append(float(norm))
        log["clip_scale"].append(scale)
        log["clipped"].append(scale < 1.0)
        log["lr"].append(lr)

    final = {k: p.detach().to(dtype) for k, p in opt_params.items()}
    if mixed:
        final.update({"master." + k: p.detach() for k, p in opt_params.items()})
    if keep_moments:
        for k, p in opt_params.items():
            final["exp_avg." + k] = opt.state[p]["exp_avg"]
            final["exp_avg_sq." + k] = opt.state[p]["exp_avg_sq"]
    used["adam_ulps"] = adam_ulps
    return log, used, starts, grads1, final


def self_check(d, log, used, starts, n_tokens):
    """The schedule and the windows, recomputed in plain Python from the files."""
    f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]  # noqa: E731
    for s in range(STEPS):
        if s < WARMUP:
            x = LR * (s + 1) / WARMUP
        else:
            x = MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * (s - WARMUP) / (STEPS - WARMUP)))
        assert used["lr"][s] == f32(x) == log["lr"][s], (s, used["lr"][s], x)

    with open(os.path.join(d, "data.u16"), "rb") as f:
        raw = f.read()
    assert len(raw) == 2 * n_tokens
    tokens = list(struct.unpack(f"<{n_tokens}H", raw))
    rows = iter(used["rows"])
    for s in range(STEPS):
        for m in range(ACCUM):
            want = []
            for b in range(B):
                start = ((((s * ACCUM) + m) * B + b) * T) % (n_tokens - T - 1)
                assert start == int(starts[s, m, b])
                want.append(tokens[start : start + T + 1])
            assert next(rows) == want, (s, m)


def accept(log):
    """Why a run does not make a fixture, or None: it must clip on some steps and
    not on others, each decision clear of float noise, and its loss must fall."""
    if all(log["clipped"]) or not any(log["clipped"]):
        return f"clipped {log['clipped']}"
    near = [round(n, 4) for n in log["grad_norm"] if abs(n - GRAD_CLIP) < CLIP_MARGIN * GRAD_CLIP]
    if near:
        return f"grad_norm {near} within {CLIP_MARGIN:.0%} of {GRAD_CLIP}"
    if log["loss"][-1] >= log["loss"][0]:
        return f"loss did not fall: {log['loss']}"
    return None


def make_one(out, name, dtype, kwargs, base_seed, n_tokens, keep_moments):
    d = os.path.join(out, name)
    for seed in range(base_seed, base_seed + MAX_SEED_TRIES):
        model = build(kwargs, seed)
        cfg = model.config
        save_checkpoint(model, dtype, d)

        toks = make_tokens(seed, cfg.vocab_size, n_tokens)
        assert max(toks) < cfg.vocab_size <= 65536
        with open(os.path.join(d, "data.u16"), "wb") as f:
            f.write(struct.pack(f"<{n_tokens}H", *toks))
        data = torch.tensor(toks, dtype=torch.int64)

        log, used, starts, grads1, final = train(d, dtype, data, keep_moments)
        self_check(d, log, used, starts, n_tokens)
        why = accept(log)
        if why is None:
            break
        print(f"{name}: seed {seed}: {why}, next seed")
    else:
        sys.exit(f"{name}: no seed in {MAX_SEED_TRIES} tries makes a fixture")
    save_tensors(grads1, os.path.join(d, "grads_step1.safetensors"))
    save_tensors(final, os.path.join(d, "final.safetensors"))

    exp = {
        "name": name,
        "seed": seed,
        "storage_dtype": DTYPE_NAME[dtype],
        "compute_dtype": "float32",
        "master_dtype": "float32" if dtype != torch.float32 else None,
        "data_file": "data.u16",
        "data_dtype": "uint16le",
        "n_tokens": n_tokens,
        "hparams": {
            "batch_size": B,
            "seq_len": T,
            "grad_accum": ACCUM,
            "steps": STEPS,
            "lr": LR,
            "min_lr": MIN_LR,
            "warmup_steps": WARMUP,
            "weight_decay": WEIGHT_DECAY,
            "beta1": BETA1,
            "beta2": BETA2,
            "eps": EPS,
            "grad_clip": GRAD_CLIP,
        },
        "init": {"std": INIT_STD, "norm_mean": NORM_MEAN, "norm_std": NORM_STD},
        "moments_in_final": keep_moments,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        **log,  # per step: loss, micro_loss, grad_norm, clip_scale, clipped, lr
        "window_starts": starts.tolist(),
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    exp["_adam_ulps"] = used["adam_ulps"]
    return exp, size


def compare_f64(out, name, dtype, keep_moments):
    """How far the committed f32 results are from the same run in float64.

    A measure of f32 rounding alone (the f64 run rounds the learning rate and the
    16-bit weights exactly as the f32 one does), so of what a correct
    implementation that sums in another order may differ by.
    """
    d = os.path.join(out, name)
    with open(os.path.join(d, "expected.json")) as f:
        exp = json.load(f)
    with open(os.path.join(d, "data.u16"), "rb") as f:
        raw = f.read()
    data = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.int64)
    log, _, _, grads1, final = train(d, dtype, data, keep_moments, compute=torch.float64)
    with safe_open(os.path.join(d, "grads_step1.safetensors"), framework="pt") as st:
        g32 = {k: st.get_tensor(k).double() for k in st.keys()}
    with safe_open(os.path.join(d, "final.safetensors"), framework="pt") as st:
        f32 = {k: st.get_tensor(k) for k in st.keys()}

    rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))  # noqa: E731
    grad_rel = max(float((g32[k] - g).abs().max() / g.abs().max()) for k, g in grads1.items())
    master = "master." if dtype != torch.float32 else ""
    param_abs = max(float((f32[master + k].double() - final[master + k]).abs().max()) for k in grads1)
    line = (
        f"  vs float64: loss rel {rel(exp['loss'], log['loss']):.1e}, grad_norm rel "
        f"{rel(exp['grad_norm'], log['grad_norm']):.1e}, step-1 grads max|d|/max|g| {grad_rel:.1e}, "
        f"final {'masters' if master else 'params'} max|d| {param_abs:.1e}"
    )
    if keep_moments:
        for mom in ("exp_avg", "exp_avg_sq"):
            r = 0.0
            for k in grads1:
                want = final[f"{mom}.{k}"]
                r = max(r, float((f32[f"{mom}.{k}"].double() - want).abs().max() / want.abs().max()))
            line += f", {mom} max|d|/max {r:.1e}"
    if dtype != torch.float32:  # elements whose rounding to the storage dtype went the other way
        flips = sum(int((f32[k] != final[k].to(dtype)).sum()) for k in grads1)
        total = sum(g.numel() for g in grads1.values())
        line += f", final {DTYPE_NAME[dtype]} params differing {flips} of {total}"
    print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "train"))
    ap.add_argument(
        "--compare-f64",
        action="store_true",
        help="also rerun each fixture in float64 and print how far the f32 results are",
    )
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    total = 0
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    for name, dtype, kwargs, seed, n_tokens, keep_moments in FIXTURES:
        exp, size = make_one(args.out, name, dtype, kwargs, seed, n_tokens, keep_moments)
        total += size
        clipped = [s for s, c in enumerate(exp["clipped"]) if c]
        ulp = exp.pop("_adam_ulps")
        print(f"{name}: seed {seed}, {size} bytes, steps clipped {clipped}, AdamW formula within {ulp} ulp")
        print(f"  {'step':>4} {'lr':>10} {'loss':>8} {'grad_norm':>9}")
        for s in range(STEPS):
            mark = "  clipped" if exp["clipped"][s] else ""
            print(f"  {s:>4} {exp['lr'][s]:>10.3e} {exp['loss'][s]:>8.4f} {exp['grad_norm'][s]:>9.4f}{mark}")
        if args.compare_f64:
            compare_f64(args.out, name, dtype, keep_moments)
    print(f"total {total} bytes in {os.path.abspath(args.out)}")
    if total > 3_600_000:
        sys.exit("fixtures too large")


if __name__ == "__main__":
    main()
