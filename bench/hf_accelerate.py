#!/usr/bin/env python3
"""hf_accelerate.py - the Hugging Face transformers + Accelerate side of the GPU
comparison: the same checkpoint, the same prompt, the same GPU budget as tide.

    python3 bench/hf_accelerate.py --budget BYTES|NGiB|none [--host BYTES|NGiB|auto]
        [--seq 2048] [--new-tokens 32] [--warmup 1] [--dtype bf16|f32]
        [--device cuda|cpu] [--json FILE] MODEL_DIR

MODEL_DIR is a Hugging Face-layout checkpoint (`tide make-model` or
bench_gpu_offload writes one). It is loaded with

    AutoModelForCausalLM.from_pretrained(MODEL_DIR, torch_dtype=torch.bfloat16,
        device_map="auto", max_memory={0: BUDGET, "cpu": HOST})

so Accelerate places as many weights as BUDGET allows on GPU 0 and the rest in
host memory, streaming them to the GPU in each forward through its hooks
(`--budget none` puts everything on GPU 0). Note that max_memory bounds the
weights Accelerate places; activations and the KV cache come on top, so the
peak GPU memory torch reports is printed too.

Measured, each timed with torch.cuda.synchronize() around it:
  - prefill of a SEQ-token prompt, the ids tide uses:
    ids[i] = ((1 + i * 2654435761) mod 2^32) mod vocab_size
  - greedy generation of NEW_TOKENS tokens (the prefill yields the first, then
    NEW_TOKENS - 1 single-token steps with the KV cache), each the argmax of the
    last logits, as `tide run` does.
One untimed warm-up forward of 16 tokens comes first (--warmup 0: none).

--device cpu is a smoke mode for machines without a GPU (everything on the
CPU, no budget; default --seq 64): it checks that the script, the checkpoint
and the installed packages work, not a performance figure. With --dtype f32
the generated tokens should equal `tide run --prompt-len SEQ --new-tokens N`'s.

Prints a summary and one JSON line. Exit status: 0 ok; 1 failure (missing
packages, no GPU, out of memory: the message says which); 2 usage error.
"""

import argparse
import importlib
import inspect
import json
import os
import re
import sys
import time

PROG = "hf_accelerate.py"


def fail(msg, code=1):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


def parse_bytes(s, what):
    """'3623878656', '3.5GiB', '512MiB', '2G' (binary), '2GB' (decimal) -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?B?)\s*", s, re.IGNORECASE)
    if not m:
        fail(f"bad {what} '{s}' (bytes, or a number with KiB/MiB/GiB, K/M/G, or KB/MB/GB)", 2)
    num, unit, suffix = float(m.group(1)), m.group(2).upper(), m.group(3)
    power = "KMGT".index(unit) + 1 if unit else 0
    base = 1000 if suffix.upper() == "B" and unit else 1024  # "GB" decimal; "G", "GiB" binary
    n = int(num * base**power)
    if n <= 0:
        fail(f"{what} '{s}' is not positive", 2)
    return n


def prompt_ids(seq, vocab):
    return [((1 + i * 2654435761) & 0xFFFFFFFF) % vocab for i in range(seq)]


def import_packages():
    mods, missing = {}, []
    for name in ("torch", "transformers", "accelerate"):
        try:
            mods[name] = importlib.import_module(name)
        except Exception as e:  # ImportError, or a broken install
            missing.append(f"{name} ({type(e).__name__}: {e})")
    if missing:
        fail(
            "this comparison needs torch, transformers and accelerate; missing or broken: "
            + "; ".join(missing)
            + ". Install them with: pip install torch transformers accelerate"
        )
    return mods["torch"], mods["transformers"], mods["accelerate"]


def version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", v)[:2])


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", help="Hugging Face-layout checkpoint directory")
    ap.add_argument("--budget", help="GPU memory for weights: bytes, NGiB, ... or 'none' (all on GPU 0)")
    ap.add_argument("--host", default="auto", help="host memory for offloaded weights (default: 90%% of available)")
    ap.add_argument("--seq", type=int, help="prompt tokens (default 2048; 64 with --device cpu)")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens to generate (default 32)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up forwards (default 1)")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16", help="torch_dtype to load with (default bf16)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--json", help="also write the JSON line to this file")
    a = ap.parse_args()

    cfg_path = os.path.join(a.model_dir, "config.json")
    if not os.path.isfile(cfg_path):
        fail(f"{a.model_dir} has no config.json (make one with: tide make-model --config llama-7b DIR)", 2)
    try:
        with open(cfg_path) as f:
            name = json.load(f).get("_name_or_path") or os.path.basename(os.path.abspath(a.model_dir))
    except (OSError, ValueError) as e:
        fail(f"{cfg_path}: {e}")
    seq = a.seq if a.seq is not None else (2048 if a.device == "cuda" else 64)
    if seq < 1 or a.new_tokens < 1 or a.warmup < 0:
        fail("--seq and --new-tokens must be >= 1, --warmup >= 0", 2)
    if a.device == "cuda" and not a.budget:
        fail("--budget is required with --device cuda (the GPU budget given to tide, in bytes; or 'none')", 2)
    budget = None
    if a.budget and a.budget.lower() != "none":
        budget = parse_bytes(a.budget, "--budget")

    torch, transformers, accelerate = import_packages()
    from transformers import AutoModelForCausalLM

    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail("--device cuda, but torch sees no CUDA device (torch %s, built for CUDA %s); use --device cpu for the "
             "smoke test" % (torch.__version__, torch.version.cuda))

    if a.host == "auto":
        try:
            import psutil

            host = int(psutil.virtual_memory().available * 0.9)
        except Exception:
            host = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") * 0.9)
    else:
        host = parse_bytes(a.host, "--host")

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    if cuda and budget is None:
        device_map, max_memory = {"": 0}, None
    elif cuda:
        device_map, max_memory = "auto", {0: budget, "cpu": host}
    else:
        device_map, max_memory = "auto", {"cpu": host}  # no GPU named: everything on the CPU
    kw = {"device_map": device_map}
    if max_memory is not None:
        kw["max_memory"] = max_memory
    # transformers >= 4.56 calls torch_dtype `dtype` (and warns about the old name)
    kw["dtype" if version_tuple(transformers.__version__) >= (4, 56) else "torch_dtype"] = dtype

    dev = torch.device("cuda:0" if cuda else "cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    print(f"{PROG}: loading {a.model_dir} (device_map={device_map!r}, max_memory={max_memory}, {a.dtype})",
          file=sys.stderr)
    t0 = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(a.model_dir, **kw)
    except Exception as e:
        fail(f"loading {a.model_dir} failed: {type(e).__name__}: {e}")
    model.eval()
    sync()
    load_s = time.perf_counter() - t0

    vocab = model.config.vocab_size
    ids = torch.tensor([prompt_ids(seq, vocab)], dtype=torch.long, device=dev)
    # modules per device as Accelerate placed them (no map: everything on dev)
    dmap = getattr(model, "hf_device_map", None) or {"": str(dev)}
    placement = {}
    for where in dmap.values():
        key = f"cuda:{where}" if isinstance(where, int) else str(where)
        placement[key] = placement.get(key, 0) + 1
    gpu_weight_bytes = sum(
        p.numel() * p.element_size() for p in model.parameters() if p.device.type == "cuda"
    )
    fwd_params = inspect.signature(model.forward).parameters
    keep = {"logits_to_keep": 1} if "logits_to_keep" in fwd_params else (
        {"num_logits_to_keep": 1} if "num_logits_to_keep" in fwd_params else {})

    status, err = "ok", ""
    prefill_s = decode_s = 0.0
    tokens = []
    peak_gpu = 0
    try:
        with torch.inference_mode():
            for _ in range(a.warmup):
                model(input_ids=ids[:, : min(16, seq)], use_cache=False, **keep)
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, **keep)
            sync()
            t1 = time.perf_counter()
            nxt = out.logits[:, -1, :].argmax(dim=-1)
            past = out.past_key_values
            tokens.append(int(nxt.item()))
            del out
            for _ in range(a.new_tokens - 1):
                out = model(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1, :].argmax(dim=-1)
                tokens.append(int(nxt.item()))
                del out
            sync()
            t2 = time.perf_counter()
        prefill_s, decode_s = t1 - t0, t2 - t1
        if cuda:
            peak_gpu = torch.cuda.max_memory_allocated(dev)
    except Exception as e:
        oom = type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower()
        status, err = ("oom" if oom else "error"), f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    n_dec = a.new_tokens - 1
    res = {
        "bench": "hf_accelerate",
        "status": status,
        "error": err,
        "model": os.path.abspath(a.model_dir),
        "config": name,
        "layers": model.config.num_hidden_layers,
        "device": str(dev),
        "gpu": torch.cuda.get_device_name(dev) if cuda else "",
        "dtype": a.dtype,
        "budget_bytes": budget if budget is not None else 0,
        "host_bytes": host,
        "placement": placement,
        "gpu_weight_bytes": gpu_weight_bytes,
        "attn_implementation": getattr(model.config, "_attn_implementation", ""),
        "seq": seq,
        "new_tokens": a.new_tokens,
        "load_s": round(load_s, 4),
        "prefill_s": round(prefill_s, 4),
        "prefill_tokens_per_s": round(seq / prefill_s, 2) if prefill_s > 0 else 0,
        "decode_s": round(decode_s, 4),
        "decode_tokens_per_s": round(n_dec / decode_s, 3) if decode_s > 0 and n_dec > 0 else 0,
        "gen_s": round(prefill_s + decode_s, 4),
        "gen_tokens_per_s": round(a.new_tokens / (prefill_s + decode_s), 3) if prefill_s + decode_s > 0 else 0,
        "peak_gpu_bytes": peak_gpu,
        "tokens": tokens,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
    }
    if status == "ok":
        where = f"{res['device']} ({res['gpu']})" if cuda else res["device"]
        print(f"{PROG}: {name} ({res['layers']} layers, {a.dtype}) on {where}; modules placed {placement}, "
              f"{gpu_weight_bytes / 2**30:.2f} GiB of weights on the GPU; loaded in {load_s:.1f} s")
        print(f"  prefill {seq} tokens: {prefill_s:.3f} s = {res['prefill_tokens_per_s']:.1f} tokens/s")
        print(f"  greedy generation of {a.new_tokens} tokens: {prefill_s + decode_s:.3f} s "
              f"({res['gen_tokens_per_s']:.2f} tokens/s); the {n_dec} decode steps {decode_s:.3f} s = "
              f"{res['decode_tokens_per_s']:.2f} tokens/s")
        if cuda:
            print(f"  peak GPU memory allocated by torch: {peak_gpu / 2**30:.2f} GiB (budget "
                  f"{(budget or 0) / 2**30:.2f} GiB bounds the weights only)")
        print(f"  tokens {tokens}")
    else:
        print(f"{PROG}: run failed ({status}): {err}", file=sys.stderr)
    line = json.dumps(res)
    print(line)
    if a.json:
        with open(a.json, "w") as f:
            f.write(line + "\n")
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
