#!/usr/bin/env python3
"""gguf_convert.py - a Hugging Face-layout LLaMA checkpoint (config.json and
model.safetensors, or shards with model.safetensors.index.json; bf16, f16 or
f32) to a GGUF file that llama.cpp runs, with the `gguf` package.

    python3 bench/peer/gguf_convert.py [--f32] MODEL_DIR OUT.gguf

- Metadata: the "llama" architecture with the config's shapes, RMSNorm epsilon,
  rotary base and context length.
- Tensors keep their dtype (bf16 stays bf16, bit for bit; file type
  MOSTLY_BF16), except the 1-D norm weights, which llama.cpp wants in f32
  (widening is exact). --f32 widens every tensor to f32 (exactly): llama.cpp
  then multiplies f32 activations by f32 weights, as tide's f32 matmul mode
  does, where with bf16 weights it rounds the activations to bf16 first.
  Names follow llama.cpp: token_embd, output_norm, output,
  blk.N.attn_{norm,q,k,v,output}, blk.N.ffn_{norm,gate,up,down}.
- Rotary layout: Hugging Face rotates half-split pairs (i, i + d/2) of each
  head; GGML's LLaMA rope rotates adjacent pairs (2i, 2i + 1). The rows of
  q_proj and k_proj are permuted per head, (heads, 2, d/2, in) -> swap the
  middle axes -> (heads, d/2, 2, in), so llama.cpp's rope computes the same
  attention scores (k_proj with the KV heads' count).
- Tokenizer: a synthetic SentencePiece-style vocabulary of the config's size
  (<unk>, <s>, </s>, the 256 byte tokens, then placeholders): enough for
  llama.cpp to load, since the benchmark feeds token ids, never text.

Writes OUT.gguf.tmp, then renames it, so a file of that name is whole.
Exit status 0, 1 on a bad checkpoint, 2 on a usage error.
"""
import json
import os
import re
import struct
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("gguf_convert.py: the gguf package is missing (pip install gguf)")

ST_DTYPES = {"BF16": (np.uint16, gguf.GGMLQuantizationType.BF16),
             "F16": (np.float16, gguf.GGMLQuantizationType.F16),
             "F32": (np.float32, gguf.GGMLQuantizationType.F32)}


def st_tensors(model_dir):
    """Yields (name, dtype string, shape, memory-mapped array) for every tensor."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for fn in files:
        path = os.path.join(model_dir, fn)
        with open(path, "rb") as f:
            (hlen,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(hlen))
        for name, ti in header.items():
            if name == "__metadata__":
                continue
            if ti["dtype"] not in ST_DTYPES:
                raise ValueError(f"{path}: tensor {name}: dtype {ti['dtype']} not supported")
            npdt = ST_DTYPES[ti["dtype"]][0]
            start, end = ti["data_offsets"]
            shape = tuple(ti["shape"])
            n = int(np.prod(shape)) if shape else 1
            if end - start != n * np.dtype(npdt).itemsize:
                raise ValueError(f"{path}: tensor {name}: {end - start} bytes for shape {shape}")
            arr = np.memmap(path, dtype=npdt, mode="r", offset=8 + hlen + start, shape=shape)
            yield name, ti["dtype"], shape, arr


def rope_permute(w, n_head):
    """Rows of a q/k projection (n_head * d, in) from half-split to interleaved pairs."""
    d = w.shape[0] // n_head
    return np.ascontiguousarray(w.reshape(n_head, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def gguf_name(hf):
    """llama.cpp's name for a Hugging Face tensor name (Qwen2's q/k/v biases included), None for one it has
    no use for."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf)
    if not m or m.group(2) not in LAYER_NAMES:
        return None
    if m.group(3) == "bias" and m.group(2) not in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
        return None  # only Qwen2's q, k and v biases have a llama.cpp name
    return f"blk.{int(m.group(1))}.{LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def synthetic_vocab(w, n_vocab):
    tokens, scores, types = [], [], []
    T = gguf.TokenType
    for i in range(n_vocab):
        if i == 0:
            tok, ty = "<unk>", T.UNKNOWN
        elif i in (1, 2):
            tok, ty = ("<s>" if i == 1 else "</s>"), T.CONTROL
        elif i < 3 + 256:
            tok, ty = f"<0x{i - 3:02X}>", T.BYTE
        else:
            tok, ty = f"\u2581t{i}", T.NORMAL
        tokens.append(tok)
        scores.append(-float(i))
        types.append(ty)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def widen(a, st_dt):
    """An f32 copy of a safetensors array (exact for bf16 and f16)."""
    a = np.asarray(a)
    if st_dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def convert(model_dir, out_path, f32=False):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // n_head
    n_vocab = cfg["vocab_size"]
    if n_vocab < 3 + 256:
        raise ValueError(f"vocab_size {n_vocab} too small for the synthetic vocabulary (needs 259)")

    tmp = out_path + ".tmp"
    w = gguf.GGUFWriter(tmp, "llama")
    w.add_name(cfg.get("_name_or_path") or os.path.basename(os.path.normpath(model_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(hidden)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    # transformers 5 keeps rope_theta in rope_parameters
    rope_theta = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    w.add_rope_freq_base(float(rope_theta))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(n_vocab)
    synthetic_vocab(w, n_vocab)

    dtypes = set()
    names = set()
    for name, st_dt, shape, arr in st_tensors(model_dir):
        gname = gguf_name(name)
        if gname is None:
            raise ValueError(f"tensor {name} has no llama.cpp name")
        if name.endswith("q_proj.weight"):
            arr = rope_permute(arr, n_head)
        elif name.endswith("k_proj.weight"):
            arr = rope_permute(arr, n_kv)
        if len(shape) == 1 or f32:
            w.add_tensor(gname, np.ascontiguousarray(widen(arr, st_dt)))
            if len(shape) > 1:
                dtypes.add("F32")
        else:
            dtypes.add(st_dt)
            w.add_tensor(gname, arr, raw_dtype=ST_DTYPES[st_dt][1])
        names.add(gname)
    if "token_embd.weight" not in names:
        raise ValueError("no model.embed_tokens.weight in the checkpoint")
    ftype = {"BF16": gguf.LlamaFileType.MOSTLY_BF16, "F16": gguf.LlamaFileType.MOSTLY_F16,
             "F32": gguf.LlamaFileType.ALL_F32}
    w.add_file_type(ftype[dtypes.pop()] if len(dtypes) == 1 else gguf.LlamaFileType.ALL_F32)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    os.replace(tmp, out_path)
    return len(names)


def main():
    args = sys.argv[1:]
    f32 = bool(args) and args[0] == "--f32"
    args = args[1:] if f32 else args
    if len(args) != 2 or args[0].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    try:
        n = convert(args[0], args[1], f32)
    except (OSError, ValueError, KeyError) as e:
        print(f"gguf_convert.py: {e}", file=sys.stderr)
        return 1
    print(f"gguf_convert.py: {n} tensors -> {args[1]} ({os.path.getsize(args[1]) / 1e9:.2f} GB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
