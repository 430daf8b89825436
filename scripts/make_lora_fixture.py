#!/usr/bin/env python3
"""Makes the LoRA training fixture tests/fixtures/train/lora-f32-gqa/ with PyTorch + PEFT.

The base is the committed train-f32-gqa checkpoint and its data.u16 (made by
scripts/make_train_fixtures.py); the run is that script's (batch 2, seq 16, 2
micro-batches, 10 steps, warmup + cosine, AdamW; lr 1e-2 to 1e-3, clipping at 0.14), over the
adapters of get_peft_model(LoraConfig(r=4, lora_alpha=8, every projection,
dropout 0)) with the base frozen. The adapters start from fixed values drawn
here (A and B both nonzero, so that step 1 has gradients for both), saved with
PEFT's save_pretrained as adapter_init/; tide starts from them through
--lora-init (tide_trainer_opts.lora_init), so its own initialisation does not
enter the comparison.

Writes into the fixture directory:
  adapter_init/adapter_config.json, adapter_init/adapter_model.safetensors
  expected.json            base_dir, data_file, lora {r, alpha, targets},
                           hparams, per step loss / grad_norm / clipped / lr
  grads_step1.safetensors  every adapter's gradient of step 1 (PEFT's saved
                           names: no ".default")
  final.safetensors        every adapter and its AdamW moments after 10 steps
  run_logits.safetensors   the adapter applied at run time (tide run --lora):
                           for adapter_init/ on the base and RUN_PROMPT,
                           "prompt" (i32), "logits" of PEFT's unmerged
                           forward, "merged_logits" after merge_and_unload,
                           "base_logits" without the adapter (all f32, every
                           position) and "generated", PEFT's greedy
                           continuation of RUN_NEW ids (the logits' top two
                           at least RUN_MARGIN apart at each step, so that
                           f32 rounding cannot change it)

  python3 scripts/make_lora_fixture.py              # rewrites the fixture
  python3 scripts/make_lora_fixture.py --run        # rewrites run_logits only
  python3 scripts/make_lora_fixture.py --check DIR  # loads the adapter tide
      wrote in DIR (tide train --lora-r 4 ... --out DIR) with
      PeftModel.from_pretrained and prints how far its weights and its logits
      are from final.safetensors'

Deterministic (fixed seeds, deterministic algorithms, one thread).
"""

import argparse
import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_train_fixtures as mtf  # noqa: E402

import peft  # noqa: E402
from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from safetensors import safe_open  # noqa: E402

NAME = "lora-f32-gqa"
BASE = "train-f32-gqa"
R, ALPHA = 4, 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SEED = 7001
INIT_STD_A, INIT_STD_B = 0.1, 0.02


def saved_name(k):
    """PEFT's saved name of a parameter name of the PEFT model."""
    return k.replace(".default.weight", ".weight")


def peft_model(base_dir):
    model = mtf.load(base_dir, torch.float32)
    cfg = LoraConfig(r=R, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    return get_peft_model(model, cfg)


# The LoRA run's own rate and clip (the adapters are small: a full fine-tune's
# 1e-3 hardly moves them, and their gradient norm sits far below 1.0): set
# into make_train_fixtures' schedule before the run.
LORA_LR, LORA_MIN_LR, LORA_CLIP = 1e-2, 1e-3, 0.14


def make(out):
    mtf.LR, mtf.MIN_LR, mtf.GRAD_CLIP = LORA_LR, LORA_MIN_LR, LORA_CLIP
    base_dir = os.path.join(out, BASE)
    d = os.path.join(out, NAME)
    os.makedirs(d, exist_ok=True)
    pm = peft_model(base_dir)
    params = {k: p for k, p in pm.named_parameters() if p.requires_grad}
    assert params and all("lora_" in k for k in params)
    gen = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for k, p in params.items():
            p.copy_((INIT_STD_A if ".lora_A." in k else INIT_STD_B) * torch.randn(p.shape, generator=gen))
    init_dir = os.path.join(d, "adapter_init")
    shutil.rmtree(init_dir, ignore_errors=True)
    pm.save_pretrained(init_dir)
    for f in os.listdir(init_dir):  # the model card is not part of the adapter
        if f not in ("adapter_config.json", "adapter_model.safetensors"):
            os.remove(os.path.join(init_dir, f))
    # deterministic and free of this machine's paths: the base relative, the
    # modules (a set in PEFT) in tide's order
    cp = os.path.join(init_dir, "adapter_config.json")
    with open(cp) as f:
        cj = json.load(f)
    cj["base_model_name_or_path"] = "../../" + BASE
    assert sorted(cj["target_modules"]) == sorted(TARGETS)
    cj["target_modules"] = TARGETS
    with open(cp, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")

    with open(os.path.join(base_dir, "data.u16"), "rb") as f:
        raw = f.read()
    import struct
    data = torch.tensor(struct.unpack(f"<{len(raw) // 2}H", raw), dtype=torch.int64)
    opt = torch.optim.AdamW(list(params.values()), lr=mtf.LR, betas=(mtf.BETA1, mtf.BETA2), eps=mtf.EPS,
                            weight_decay=mtf.WEIGHT_DECAY, foreach=False, fused=False)
    starts = mtf.window_starts(len(data))
    B, T, A = mtf.B, mtf.T, mtf.ACCUM
    log = {"loss": [], "grad_norm": [], "clipped": [], "lr": []}
    pm.train()
    for step in range(mtf.STEPS):
        pm.zero_grad(set_to_none=True)
        step_loss = 0.0
        for m in range(A):
            x, y = mtf.micro_batch(data, starts, step, m)
            logits = pm(input_ids=x, use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(B * T, -1), y.reshape(B * T)) / A
            loss.backward()
            step_loss += loss.item()
        if step == 0:
            grads1 = {saved_name(k): p.grad.detach().clone() for k, p in params.items()}
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), mtf.GRAD_CLIP)
        assert abs(float(norm) - mtf.GRAD_CLIP) > mtf.CLIP_MARGIN * mtf.GRAD_CLIP, (step, float(norm))
        lr = mtf.lr_at(step)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        log["loss"].append(step_loss)
        log["grad_norm"].append(float(norm))
        log["clipped"].append(float(norm) > mtf.GRAD_CLIP)
        log["lr"].append(lr)
    assert log["loss"][-1] < log["loss"][0], log["loss"]
    assert any(log["clipped"]) and not all(log["clipped"]), log["grad_norm"]
    final = {}
    for k, p in params.items():
        n = saved_name(k)
        final[n] = p.detach()
        final["exp_avg." + n] = opt.state[p]["exp_avg"]
        final["exp_avg_sq." + n] = opt.state[p]["exp_avg_sq"]
    mtf.save_tensors(grads1, os.path.join(d, "grads_step1.safetensors"))
    mtf.save_tensors(final, os.path.join(d, "final.safetensors"))
    exp = {
        "name": NAME,
        "base_dir": "../" + BASE,
        "data_file": "../" + BASE + "/data.u16",
        "lora": {"r": R, "alpha": ALPHA, "targets": TARGETS, "init": "adapter_init", "init_seed": SEED,
                 "init_std_a": INIT_STD_A, "init_std_b": INIT_STD_B},
        "hparams": {"batch_size": B, "seq_len": T, "grad_accum": A, "steps": mtf.STEPS, "lr": mtf.LR,
                    "min_lr": mtf.MIN_LR, "warmup_steps": mtf.WARMUP, "weight_decay": mtf.WEIGHT_DECAY,
                    "beta1": mtf.BETA1, "beta2": mtf.BETA2, "eps": mtf.EPS, "grad_clip": mtf.GRAD_CLIP},
        "torch_version": torch.__version__,
        "peft_version": peft.__version__,
        **log,
    }
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(exp, f, indent=2)
        f.write("\n")
    print(f"{NAME}: losses {[round(x, 4) for x in log['loss']]}, clipped {log['clipped']}")


RUN_PROMPT = [1, 17, 42, 99, 5, 63, 120, 8, 77, 31, 2, 54]
RUN_NEW = 4
RUN_MARGIN = 1e-3


def make_run(out):
    """run_logits.safetensors: PEFT's forward of the base with adapter_init/ applied."""
    base_dir = os.path.join(out, BASE)
    d = os.path.join(out, NAME)
    x = torch.tensor([RUN_PROMPT], dtype=torch.int64)
    with torch.no_grad():
        base_logits = mtf.load(base_dir, torch.float32)(input_ids=x).logits[0]
        pm = PeftModel.from_pretrained(mtf.load(base_dir, torch.float32), os.path.join(d, "adapter_init"))
        pm.eval()
        logits = pm(input_ids=x).logits[0]
        # greedy, one whole forward per step (no cache): each step's choice clear
        ids = list(RUN_PROMPT)
        for _ in range(RUN_NEW):
            last = pm(input_ids=torch.tensor([ids])).logits[0, -1]
            top = torch.topk(last, 2).values
            assert float(top[0] - top[1]) > RUN_MARGIN, (ids, top)
            ids.append(int(last.argmax()))
        merged = pm.merge_and_unload()
        merged_logits = merged(input_ids=x).logits[0]
    mtf.save_tensors({"prompt": torch.tensor(RUN_PROMPT, dtype=torch.int32), "logits": logits,
                      "merged_logits": merged_logits, "base_logits": base_logits,
                      "generated": torch.tensor(ids[len(RUN_PROMPT):], dtype=torch.int32)},
                     os.path.join(d, "run_logits.safetensors"))
    dm = float((merged_logits - logits).abs().max())
    db = float((base_logits - logits).abs().max())
    print(f"{NAME}: run logits max|merged - unmerged| {dm:.3g}, max|base - adapted| {db:.3g}, "
          f"greedy {ids[len(RUN_PROMPT):]}")


def check(out, adapter_dir):
    """PEFT loads tide's adapter; its weights and logits against the fixture's final adapter."""
    base_dir = os.path.join(out, BASE)
    with safe_open(os.path.join(out, NAME, "final.safetensors"), framework="pt") as st:
        want = {k: st.get_tensor(k) for k in st.keys() if not k.startswith("exp_avg")}
    pm = PeftModel.from_pretrained(mtf.load(base_dir, torch.float32), adapter_dir)
    got = {saved_name(k): p.detach() for k, p in pm.named_parameters() if "lora_" in k}
    assert sorted(got) == sorted(want), (sorted(set(got) ^ set(want)))[:4]
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    ref = peft_model(base_dir)
    with torch.no_grad():
        for k, p in ref.named_parameters():
            if "lora_" in k:
                p.copy_(want[saved_name(k)])
        x = torch.arange(16).view(1, 16) % pm.config.vocab_size
        dl = float((pm(input_ids=x).logits - ref(input_ids=x).logits).abs().max())
    print(f"peft loaded {adapter_dir}: {len(got)} adapters, max|tide - torch| {worst:.3g}, logits max|d| {dl:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "train"))
    ap.add_argument("--check", metavar="DIR", help="load tide's adapter in DIR with PEFT and compare")
    ap.add_argument("--run", action="store_true", help="rewrite run_logits.safetensors only")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if a.check:
        check(a.out, a.check)
    elif a.run:
        make_run(a.out)
    else:
        make(a.out)
        make_run(a.out)


if __name__ == "__main__":
    main()
