#!/usr/bin/env python3
"""make_autocast_fixture.py - the mixed-precision reference of `tide train --precision bf16`.

What it makes: tests/fixtures/train/autocast-gqa/, a small random LLaMA (f32,
the shapes of train-f32-gqa, but weights ten times larger so that bf16
rounding shows in the loss), its token file, and the per-step losses and
gradient norms of ten training steps with PyTorch

  - in f32 (eager attention), the reference of `--precision f32`;
  - under torch.autocast(device_type="cpu", dtype=torch.bfloat16) with the
    SDPA attention (transformers' default), the reference of
    `--precision bf16`;
  - under the same autocast with eager attention: a second, equally valid
    bf16 run, whose distance from the first measures bf16's rounding noise
    (the basis of the tolerance; tests/fixtures/train/README.md).

Autocast is what mixed-precision training in PyTorch means on a CPU: every
linear layer's input and weight rounded to bf16, the product summed in f32
and rounded to a bf16 output; RMSNorm (transformers upcasts to f32), the
attention softmax and the cross-entropy (on logits.float()) in f32; the
backward through the same casts, so the f32 master weights get f32
gradients; AdamW in f32 on the masters.

How to run (needs python3 with torch and transformers; CPU only, seconds):

    python3 scripts/make_autocast_fixture.py            # writes tests/fixtures/train/autocast-gqa/
    python3 scripts/make_autocast_fixture.py --out DIR  # writes DIR/autocast-gqa/

CI never runs it: the files are committed and tests/cli_precision.sh reads
them. Deterministic (fixed seeds, one thread, deterministic algorithms).
The batches, schedule, clipping and AdamW are make_train_fixtures.py's
(imported from it), with a peak learning rate of 3e-3 (down to 3e-4).
"""

import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_train_fixtures as M  # noqa: E402

NAME = "autocast-gqa"
SEED = 6001
N_TOKENS = 4096
INIT_STD = 0.1  # linear weights and embeddings (train-f32-gqa: 0.02)
NORM_MEAN, NORM_STD = 1.0, 0.05  # RMSNorm weights
LR, MIN_LR = 3e-3, 3e-4


def lr_at(step):
    """make_train_fixtures' schedule scaled to LR, MIN_LR: f64, rounded once to f32."""
    s = torch.tensor(float(step), dtype=torch.float64)
    if step < M.WARMUP:
        x = LR * (s + 1) / M.WARMUP
    else:
        x = MIN_LR + 0.5 * (LR - MIN_LR) * (1 + torch.cos(torch.pi * (s - M.WARMUP) / (M.STEPS - M.WARMUP)))
    return float(x.to(torch.float32))


def run(d, data, bf16, attn):
    """STEPS steps from the checkpoint in d: per step (loss, grad_norm)."""
    model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation=attn)
    model.train()
    params = dict(model.named_parameters())
    decay = {k: p.dim() >= 2 for k, p in params.items()}
    opt = torch.optim.AdamW(
        [
            {"params": [p for k, p in params.items() if decay[k]], "weight_decay": M.WEIGHT_DECAY},
            {"params": [p for k, p in params.items() if not decay[k]], "weight_decay": 0.0},
        ],
        lr=LR,
        betas=(M.BETA1, M.BETA2),
        eps=M.EPS,
        foreach=False,
        fused=False,
    )
    starts = M.window_starts(len(data))
    losses, norms, micro = [], [], []
    for step in range(M.STEPS):
        model.zero_grad(set_to_none=True)
        step_loss, ml = 0.0, []
        for m in range(M.ACCUM):
            x, y = M.micro_batch(data, starts, step, m)
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=x, use_cache=False).logits  # bf16 under autocast
            ce = F.cross_entropy(logits.float().reshape(M.B * M.T, -1), y.reshape(M.B * M.T))
            (ce / M.ACCUM).backward()
            ml.append(ce.item())
            step_loss += (ce / M.ACCUM).item()
        if bf16:
            assert all(p.grad.dtype == torch.float32 for p in params.values()), "f32 gradients of f32 masters"
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), M.GRAD_CLIP)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(step_loss)
        norms.append(float(norm))
        micro.append(ml)
    return losses, norms, micro


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "train"))
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    d = os.path.join(a.out, NAME)
    M.INIT_STD, M.NORM_MEAN, M.NORM_STD = INIT_STD, NORM_MEAN, NORM_STD
    model = M.build(M.SHAPES, SEED)
    M.save_checkpoint(model, torch.float32, d)
    tokens = M.make_tokens(SEED, M.SHAPES["vocab_size"], N_TOKENS)
    with open(os.path.join(d, "data.u16"), "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    data = torch.tensor(tokens, dtype=torch.long)

    f32 = run(d, data, False, "eager")
    bf16 = run(d, data, True, "sdpa")
    eager = run(d, data, True, "eager")
    spread = max(abs(x - y) / abs(y) for x, y in zip(eager[0], bf16[0]))
    gap = max(abs(x - y) / abs(y) for x, y in zip(f32[0], bf16[0]))
    out = {
        "name": NAME,
        "seed": SEED,
        "storage_dtype": "float32",
        "data_file": "data.u16",
        "data_dtype": "uint16le",
        "n_tokens": N_TOKENS,
        "init": {"std": INIT_STD, "norm_mean": NORM_MEAN, "norm_std": NORM_STD},
        "hparams": {
            "batch_size": M.B,
            "seq_len": M.T,
            "grad_accum": M.ACCUM,
            "steps": M.STEPS,
            "lr": LR,
            "min_lr": MIN_LR,
            "warmup_steps": M.WARMUP,
            "weight_decay": M.WEIGHT_DECAY,
            "beta1": M.BETA1,
            "beta2": M.BETA2,
            "eps": M.EPS,
            "grad_clip": M.GRAD_CLIP,
        },
        "lr": [lr_at(s) for s in range(M.STEPS)],
        "f32": {"loss": f32[0], "grad_norm": f32[1], "micro_loss": f32[2], "attention": "eager"},
        "bf16": {"loss": bf16[0], "grad_norm": bf16[1], "micro_loss": bf16[2], "attention": "sdpa",
                 "autocast": "cpu, bfloat16"},
        "bf16_eager": {"loss": eager[0], "grad_norm": eager[1], "micro_loss": eager[2], "attention": "eager",
                       "autocast": "cpu, bfloat16"},
        "bf16_spread_rel": spread,
        "f32_bf16_gap_rel": gap,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"{d}: bf16 losses {bf16[0][0]:.4f} .. {bf16[0][-1]:.4f}; eager vs sdpa autocast {spread:.2e} "
          f"(relative, the largest step), f32 vs bf16 {gap:.2e}")


if __name__ == "__main__":
    main()
