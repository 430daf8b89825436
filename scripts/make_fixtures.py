#!/usr/bin/env python3
"""make_fixtures.py - whole-model reference fixtures from Hugging Face transformers.

What it makes: small, randomly initialised LlamaForCausalLM checkpoints (fixed
seeds) saved in the Hugging Face layout, plus what transformers computes for them,
so that tests/test_reference.c can check tide's whole forward pass and greedy
generation against an independent implementation.

How to run (needs python3 with torch and transformers; CPU only, a few seconds):

    python3 scripts/make_fixtures.py              # writes tests/fixtures/
    python3 scripts/make_fixtures.py --out DIR    # writes DIR/<name>/

CI never runs this script: the generated files are committed under
tests/fixtures/ and the C test reads them. Rerun it only to change or add a
fixture, then commit the result (and update tests/fixtures/README.md).

Per fixture directory DIR/<name>/:
    config.json                       HF config. transformers >= 5 writes "dtype" and
                                      "rope_parameters"; the classic keys
                                      "torch_dtype" and "rope_theta" are added with
                                      the same values so that loaders that follow
                                      the older layout (most Hub checkpoints) read
                                      it; tiny-bf16-gqa keeps the new layout only.
    model.safetensors                 or model-0000k-of-0000n.safetensors shards plus
                                      model.safetensors.index.json
    logits.f32                        (T, V) float32 little-endian, row-major: logits
                                      of every prompt position, one forward pass
    reference.json                    prompt, greedy tokens, shapes, margins, versions

The references are computed in float32: the saved checkpoint is loaded back with
dtype float32 (bf16/f16 weights upcast exactly), eager attention, eval mode, no
grad. That is what tide computes (weights in their storage dtype, arithmetic in
f32), so the only expected differences are summation order and libm rounding.

A fixture is accepted only when the smallest top-1/top-2 logit gap over all
prompt positions and all generation steps is >= MIN_GAP, so that greedy tokens
do not flip on float noise; otherwise the seed is bumped (seed + 1, + 2, ...)
deterministically until it is. The seed used is recorded in reference.json.
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

PROMPT_LEN = 11  # tokens in the prompt (batch 1)
N_NEW = 8  # greedy tokens generated after the prompt
MIN_GAP = 1e-3  # required top-1 minus top-2 logit margin
MAX_SEED_TRIES = 100

# name -> (storage dtype, LlamaConfig kwargs, base seed, max_shard_size or None)
FIXTURES = [
    (
        "tiny-f32-mha",
        torch.float32,
        dict(
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=256,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            rope_theta=10000.0,
            max_position_embeddings=128,
        ),
        1001,
        None,
    ),
    (
        "tiny-bf16-gqa",
        torch.bfloat16,
        dict(
            hidden_size=96,
            intermediate_size=256,
            num_hidden_layers=3,
            num_attention_heads=6,
            num_key_value_heads=2,
            vocab_size=320,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            max_position_embeddings=128,
        ),
        2002,
        None,
    ),
    (
        "tiny-f16-sharded",
        torch.float16,
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=200,
            tie_word_embeddings=False,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            max_position_embeddings=128,
        ),
        3003,
        "100KB",  # the f16 model is ~190 KB, so this gives 2 shards
    ),
    (
        "tiny-qwen2",  # Qwen2ForCausalLM: biases on q, k and v
        torch.bfloat16,
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=256,
            tie_word_embeddings=True,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            max_position_embeddings=128,
        ),
        5005,
        None,
    ),
]


def is_qwen2(name):
    return "qwen2" in name

DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def expected_names(cfg):
    """The exact HF LLaMA (Qwen2: and q/k/v biases) parameter names a checkpoint of cfg must hold."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    if cfg.model_type == "qwen2":
        for i in range(cfg.num_hidden_layers):
            names |= {f"model.layers.{i}.self_attn.{x}_proj.bias" for x in "qkv"}
    if not cfg.tie_word_embeddings:
        names.add("lm_head.weight")
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
            p + "self_attn.q_proj.weight",
            p + "self_attn.k_proj.weight",
            p + "self_attn.v_proj.weight",
            p + "self_attn.o_proj.weight",
            p + "mlp.gate_proj.weight",
            p + "mlp.up_proj.weight",
            p + "mlp.down_proj.weight",
        }
    return names


def build(kwargs, seed, qwen2=False):
    """A randomly initialised model (f32) whose logits are far from zero.

    The default init (std 0.02) makes every logit ~0 and greedy decoding
    degenerate; instead every linear weight is N(0, 0.2), the embedding N(0, 1)
    (N(0, 0.2) when tied, since it is also the output projection) and every norm
    weight 1 + N(0, 0.1). With the final RMSNorm giving unit-RMS rows, logits then
    have a standard deviation of about 0.2 * sqrt(hidden), i.e. 1.6 to 2.
    """
    if qwen2:
        cfg = Qwen2Config(**kwargs, initializer_range=0.2, use_sliding_window=False)
    else:
        cfg = LlamaConfig(**kwargs, initializer_range=0.2, attention_bias=False, mlp_bias=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg) if qwen2 else LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # deterministic order
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight" and not cfg.tie_word_embeddings:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    if not cfg.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    return model.eval()


def save(model, dtype, shard, d):
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):  # leave no stale shards from an earlier run
        if f.endswith(".safetensors") or f.endswith(".json") or f.endswith(".f32"):
            os.remove(os.path.join(d, f))
    model = model.to(dtype)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(d, safe_serialization=True, **kw)
    gc = os.path.join(d, "generation_config.json")
    if os.path.exists(gc):  # not part of a tide checkpoint
        os.remove(gc)
    # Add the classic keys next to the transformers-5 ones (see the top comment),
    # except in tiny-bf16-gqa, which keeps the transformers-5 layout as written
    # so that the loader's reading of "dtype" and "rope_parameters" is tested.
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cj = json.load(f)
    if os.path.basename(d) != "tiny-bf16-gqa":
        cj.setdefault("torch_dtype", DTYPE_NAME[dtype])
        theta = cj.get("rope_theta", (cj.get("rope_parameters") or {}).get("rope_theta"))
        cj["rope_theta"] = theta
    else:
        cj.pop("torch_dtype", None)
        cj.pop("rope_theta", None)
    with open(path, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")


def check_files(d, cfg, dtype, shard):
    """The checkpoint holds exactly the HF parameter names, in the storage dtype."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    if shard:
        assert len(files) >= 2, f"{d}: expected >= 2 shards, got {files}"
        assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))
    else:
        assert files == ["model.safetensors"], files
    seen = {}
    for f in files:
        with safe_open(os.path.join(d, f), framework="pt") as st:
            for k in st.keys():
                assert k not in seen, f"{k} in two shards"
                seen[k] = st.get_tensor(k).dtype
    want = expected_names(cfg)
    assert set(seen) == want, f"{d}: extra {set(seen) - want}, missing {want - set(seen)}"
    assert all(dt == dtype for dt in seen.values()), f"{d}: dtypes {set(seen.values())}"


def top2_gap(logits):
    """Smallest top-1 minus top-2 over the rows of a (R, V) tensor."""
    t = torch.topk(logits, 2, dim=-1).values
    return float((t[..., 0] - t[..., 1]).min())


def reference(d, prompt):
    """Float32 logits of every prompt position, greedy tokens, margins."""
    kw = {"attn_implementation": "eager"}
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56):
        kw["dtype"] = torch.float32
    else:
        kw["torch_dtype"] = torch.float32
    cls = Qwen2ForCausalLM if is_qwen2(os.path.basename(d)) else LlamaForCausalLM
    model = cls.from_pretrained(d, **kw).eval()
    assert next(model.parameters()).dtype == torch.float32
    ids = torch.tensor([prompt], dtype=torch.long)  # (1, T)
    with torch.no_grad():
        out = model(ids, use_cache=False)
        logits = out.logits[0].float()  # (T, V)
        gaps = [top2_gap(logits)]

        # Greedy decoding with the KV cache, one token per step (argmax, no EOS stop).
        gen = []
        step = model(ids, use_cache=True)
        past = step.past_key_values
        last = step.logits[0, -1]  # (V,)
        for _ in range(N_NEW):
            gaps.append(top2_gap(last[None]))
            tok = int(torch.argmax(last))
            gen.append(tok)
            step = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = step.past_key_values
            last = step.logits[0, -1]

        # Cross-check: the same tokens without the cache, and through generate().
        seq = list(prompt)
        for i in range(N_NEW):
            l = model(torch.tensor([seq]), use_cache=False).logits[0, -1]
            assert int(torch.argmax(l)) == gen[i], "cached and uncached greedy differ"
            seq.append(gen[i])
        g = model.generate(
            ids,
            do_sample=False,
            max_new_tokens=N_NEW,
            min_new_tokens=N_NEW,
            use_cache=True,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert g[0, len(prompt):].tolist() == gen, "generate() and the manual loop differ"
    # theta read back from the file we wrote must be the one we asked for
    rp = getattr(model.config, "rope_parameters", None) or {}
    theta = rp.get("rope_theta", getattr(model.config, "rope_theta", None))
    return logits, gen, min(gaps), theta


def make_one(out, name, dtype, kwargs, base_seed, shard):
    d = os.path.join(out, name)
    for seed in range(base_seed, base_seed + MAX_SEED_TRIES):
        model = build(kwargs, seed, is_qwen2(name))
        cfg = model.config
        save(model, dtype, shard, d)
        check_files(d, cfg, dtype, shard)
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, cfg.vocab_size, (PROMPT_LEN,), generator=g).tolist()
        logits, gen, gap, theta = reference(d, prompt)
        assert abs(theta - kwargs["rope_theta"]) < 1e-6 * kwargs["rope_theta"], theta
        if gap >= MIN_GAP:
            break
        print(f"{name}: seed {seed} min_top2_gap {gap:.3g} < {MIN_GAP}, next seed")
    else:
        sys.exit(f"{name}: no seed in {MAX_SEED_TRIES} tries gives a margin >= {MIN_GAP}")

    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    ref = {
        "name": name,
        "seed": seed,
        "storage_dtype": DTYPE_NAME[dtype],
        "compute_dtype": "float32",
        "prompt": prompt,
        "generated": gen,
        "logits_file": "logits.f32",
        "logits_shape": [PROMPT_LEN, cfg.vocab_size],
        "max_abs_logit": float(logits.abs().max()),
        "min_top2_gap": gap,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return ref, size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"))
    ap.add_argument("--only", help="make only this fixture (the others keep their files)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()

    total = 0
    print(f"torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"{'fixture':<18} {'seed':>5} {'bytes':>9} {'max|logit|':>10} {'min gap':>8}  generated")
    for name, dtype, kwargs, seed, shard in FIXTURES:
        if args.only and name != args.only:
            continue
        ref, size = make_one(args.out, name, dtype, kwargs, seed, shard)
        total += size
        print(
            f"{name:<18} {ref['seed']:>5} {size:>9} {ref['max_abs_logit']:>10.3f} "
            f"{ref['min_top2_gap']:>8.4f}  {ref['generated']}"
        )
    print(f"total {total} bytes in {os.path.abspath(args.out)}")


if __name__ == "__main__":
    main()
