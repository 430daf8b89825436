#!/usr/bin/env python3
"""quant_check.py - reads a GGUF file written by `tide quantize` with the `gguf`
package and checks it against the checkpoint it came from.

    python3 tests/quant_check.py MODEL_DIR OUT.gguf TYPE

Checks: GGUF v3, general.architecture llama (qwen2 for a Qwen2 checkpoint, with its
q/k/v biases in F32 and q/k rows unpermuted), general.file_type (llama.cpp's
LLAMA_FTYPE of TYPE), general.quantization_version 2, general.alignment 32, the
llama.* shapes of config.json; every tensor under llama.cpp's name with its
dimensions; each weight's type as llama.cpp's mix rules give it (head Q6_K or
Q8_0; attn_v / ffn_down Q6_K on the use_more_bits layers of the _M mixes; Q8_0
where rows are not whole 256-blocks; norms F32); the dequantized values (by
gguf.quants) against the checkpoint's, q/k rows permuted to llama.cpp's rotary
order, within each type's bound (docs/quantization.md), block by block; the
tokenizer's tokens, BOS/EOS and chat template against tokenizer.json and
tokenizer_config.json. Exit 0 when everything holds, 1 otherwise (each failure
printed), 77 when gguf or numpy is missing.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError:
    print("skipped: the gguf and numpy Python packages are needed")
    sys.exit(77)

FTYPE = {"Q8_0": 7, "Q4_0": 2, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
BASE = {"Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q4_K_M": Q.Q4_K, "Q5_K_M": Q.Q5_K, "Q6_K": Q.Q6_K}
FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL:", msg)


def st_tensors(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    out = {}
    for fn in files:
        raw = open(os.path.join(d, fn), "rb").read()
        (hl,) = struct.unpack("<Q", raw[:8])
        hdr = json.loads(raw[8:8 + hl])
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            buf = raw[8 + hl + a:8 + hl + b]
            if v["dtype"] == "BF16":
                x = (np.frombuffer(buf, np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif v["dtype"] == "F16":
                x = np.frombuffer(buf, np.float16).astype(np.float32)
            else:
                x = np.frombuffer(buf, np.float32)
            out[k] = x.reshape(v["shape"])
    return out


def permute(w, heads):
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def more_bits(i, n):
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def want_type(mix, kind, layer, n_layers, row):
    t = BASE[mix]
    if kind == "head":
        t = Q.Q8_0 if row % 256 else (t if t == Q.Q8_0 else Q.Q6_K)
    elif kind in ("attn_v", "ffn_down"):
        if mix in ("Q4_K_M", "Q5_K_M") and more_bits(layer, n_layers):
            t = Q.Q6_K
        if kind == "attn_v" and n_layers == 80 and t == Q.Q4_K:
            t = Q.Q5_K
    qk = gguf.GGML_QUANT_SIZES[t][0]
    if row % qk:
        t = Q.Q8_0 if row % 32 == 0 else Q.F16
    return t


def f16_err(h):
    return np.maximum(np.abs(h) * 2.0 ** -10, 2.0 ** -24)


def block_bounds(t, x, raw):
    """Per-element bounds of |x - dequantized|, from the input x (blocks of the
    type) and the raw blocks (their stored scales)."""
    qk, size = gguf.GGML_QUANT_SIZES[t]
    nb = x.size // qk
    xb = x.reshape(nb, qk).astype(np.float64)
    rb = raw.reshape(nb, size)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    slack = amax * 2.0 ** -18 + 1e-30
    if t in (Q.Q8_0, Q.Q4_0):
        d16 = np.abs(rb[:, 0:2].copy().view(np.float16).astype(np.float64))
        d = amax / (127 if t == Q.Q8_0 else 8)
        b = d / 2 + 127 * np.abs(d16 - d) if t == Q.Q8_0 else d + 8 * np.abs(d16 - d)
        return np.broadcast_to(b + slack, xb.shape)
    if t in (Q.Q4_K, Q.Q5_K):
        nmax = 15 if t == Q.Q4_K else 31
        d16 = rb[:, 0:2].copy().view(np.float16).astype(np.float64)
        m16 = rb[:, 2:4].copy().view(np.float16).astype(np.float64)
        dS = d16 / 2 + 63 * f16_err(d16)
        dM = m16 / 2 + 63 * f16_err(m16)
        xs = xb.reshape(nb, 8, 32)
        R = xs.max(axis=2) - np.minimum(xs.min(axis=2), 0)
        b = 4 * R / nmax + nmax * dS + dM + slack
        return np.repeat(b, 32, axis=1)
    d16 = np.abs(rb[:, 208:210].copy().view(np.float16).astype(np.float64))
    dS = d16 / 2 + 128 * f16_err(d16)
    return np.broadcast_to(amax / 16 + 32 * dS + slack, xb.shape)


def field_val(r, k):
    fl = r.fields.get(k)
    if fl is None:
        return None
    if fl.types and fl.types[0] == gguf.GGUFValueType.STRING:
        return bytes(fl.parts[fl.data[0]]).decode("utf-8")
    return fl.parts[fl.data[0]][0]


def check_from_gguf(model, r, path, mix):
    """A GGUF input: every tensor of OUT within its bound of the input's
    dequantized values (same names, rows already in llama.cpp's order), the
    tokenizer keys copied byte for byte, the shapes' metadata equal."""
    a = gguf.GGUFReader(model)
    arch = field_val(a, "general.architecture")
    if field_val(r, "general.architecture") != arch:
        fail(f"general.architecture {field_val(r, 'general.architecture')}, the input's is {arch}")
    for k in a.fields:
        if k.startswith("tokenizer.") or k.startswith(f"{arch}."):
            fb = r.fields.get(k)
            if fb is None or [bytes(p) for p in a.fields[k].parts] != [bytes(p) for p in fb.parts]:
                fail(f"{k} not copied from {model}")
    if int(field_val(r, "general.file_type")) != FTYPE[mix]:
        fail("general.file_type")
    L = int(field_val(a, f"{arch}.block_count"))
    srcs = {t.name: t for t in a.tensors}
    got = {t.name: t for t in r.tensors}
    if set(srcs) != set(got):
        fail(f"tensor names differ: {sorted(set(srcs) ^ set(got))}")
    tied = "output.weight" not in srcs
    worst = {}
    for name, t in got.items():
        if name not in srcs:
            continue
        x = gguf.quants.dequantize(np.asarray(srcs[name].data), Q(srcs[name].tensor_type)).reshape(-1)
        qt = Q(t.tensor_type)
        parts = name.split(".")
        if len(t.shape) == 1:
            want = Q.F32
        else:
            kind = {"output": "head", "token_embd": "head" if tied else "embed"}.get(parts[0], parts[-2])
            want = want_type(mix, kind, int(parts[1]) if parts[0] == "blk" else 0, L, int(t.shape[0]))
        if qt != want:
            fail(f"{name}: type {qt.name}, want {want.name}")
            continue
        y = gguf.quants.dequantize(np.asarray(t.data), qt).reshape(-1).astype(np.float64)
        if qt == Q.F32:
            if not np.array_equal(y, x.astype(np.float64)):
                fail(f"{name}: f32 values differ")
            continue
        bound = block_bounds(qt, x, np.asarray(t.data).reshape(-1)).reshape(-1)
        err = np.abs(y - x)
        worst[qt.name] = max(worst.get(qt.name, 0), float((err / bound).max()))
        if not (err <= bound).all():
            fail(f"{name}: an element beyond its bound")
    print(f"{path}: {len(got)} tensors from {model}; worst error / bound by type: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(worst.items())))
    return 1 if FAILS else 0


def main():
    model, path, mix = sys.argv[1], sys.argv[2], sys.argv[3]
    r = gguf.GGUFReader(path)
    if model.endswith(".gguf"):
        return check_from_gguf(model, r, path, mix)
    cfg = json.load(open(os.path.join(model, "config.json")))
    f = {k: v for k, v in r.fields.items()}

    def val(k):
        if k not in f:
            return None
        fl = f[k]
        if fl.types and fl.types[0] == gguf.GGUFValueType.STRING:
            return bytes(fl.parts[fl.data[0]]).decode("utf-8")
        if fl.types and fl.types[0] == gguf.GGUFValueType.ARRAY:
            return fl
        return fl.parts[fl.data[0]][0]

    if int(val("GGUF.version")) != 3:
        fail("not GGUF v3")
    # Qwen2: its own key prefix, q/k/v biases, q/k rows in Hugging Face's order
    qwen2 = cfg.get("model_type") == "qwen2"
    a = "qwen2" if qwen2 else "llama"
    for k, want in [("general.architecture", a), ("general.file_type", FTYPE[mix]),
                    ("general.quantization_version", 2), ("general.alignment", 32),
                    (f"{a}.embedding_length", cfg["hidden_size"]), (f"{a}.block_count", cfg["num_hidden_layers"]),
                    (f"{a}.feed_forward_length", cfg["intermediate_size"]),
                    (f"{a}.attention.head_count", cfg["num_attention_heads"]),
                    (f"{a}.attention.head_count_kv", cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
                    (f"{a}.context_length", cfg["max_position_embeddings"]),
                    (f"{a}.vocab_size", cfg["vocab_size"])]:
        got = val(k)
        if got is None or (got != want if isinstance(want, str) else int(got) != want):
            fail(f"{k} = {got}, want {want}")
    if abs(float(val(f"{a}.rope.freq_base")) - cfg.get("rope_theta", 10000.0)) > 1e-3 * cfg.get("rope_theta", 1e4):
        fail(f"{a}.rope.freq_base")
    if abs(float(val(f"{a}.attention.layer_norm_rms_epsilon")) - cfg["rms_norm_eps"]) > 1e-9:
        fail("rms eps")

    src = st_tensors(model)
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    L = cfg["num_hidden_layers"]
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    tied = cfg.get("tie_word_embeddings", False)
    expect = {}
    for hf, x in src.items():
        if hf == "model.embed_tokens.weight":
            expect["token_embd.weight"] = (x, "head" if tied else "embed", 0)
        elif hf == "model.norm.weight":
            expect["output_norm.weight"] = (x, "norm", 0)
        elif hf == "lm_head.weight":
            expect["output.weight"] = (x, "head", 0)
        else:
            parts = hf.split(".")
            i, role, suffix = int(parts[2]), ".".join(parts[3:-1]), parts[-1]
            if suffix == "bias":
                if not qwen2 or role not in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    fail(f"{hf}: a bias the checkpoint should not have")
                expect[f"blk.{i}.{names[role]}.bias"] = (x, "norm", i)
                continue
            if role == "self_attn.q_proj" and not qwen2:
                x = permute(x, H)
            elif role == "self_attn.k_proj" and not qwen2:
                x = permute(x, KV)
            kind = "norm" if names[role].endswith("_norm") else names[role]
            expect[f"blk.{i}.{names[role]}.weight"] = (x, kind, i)
    got = {t.name: t for t in r.tensors}
    if set(got) != set(expect):
        fail(f"tensor names differ: missing {sorted(set(expect) - set(got))}, extra {sorted(set(got) - set(expect))}")
    worst = {}
    for name, (x, kind, layer) in expect.items():
        t = got.get(name)
        if t is None:
            continue
        if list(t.shape) != list(reversed(x.shape)):
            fail(f"{name}: dims {list(t.shape)}, want {list(reversed(x.shape))}")
            continue
        qt = Q(t.tensor_type)
        want = Q.F32 if kind == "norm" else want_type(mix, kind, layer, L, x.shape[-1])
        if qt != want:
            fail(f"{name}: type {qt.name}, want {want.name}")
            continue
        y = gguf.quants.dequantize(np.asarray(t.data), qt).reshape(x.shape).astype(np.float64)
        if qt == Q.F32:
            if not np.array_equal(y, x.astype(np.float64)):
                fail(f"{name}: f32 values differ")
            continue
        bound = block_bounds(qt, x.reshape(-1), np.asarray(t.data).reshape(-1)).reshape(x.shape)
        err = np.abs(y - x.astype(np.float64))
        ratio = float((err / bound).max())
        worst[qt.name] = max(worst.get(qt.name, 0), ratio)
        if not (err <= bound).all():
            i = np.unravel_index(np.argmax(err - bound), x.shape)
            fail(f"{name}: element {i}: |{x[i]} - {y[i]}| > bound {bound[i]}")

    tj = os.path.join(model, "tokenizer.json")
    if os.path.exists(tj):
        tok = json.load(open(tj))
        pieces = {v: k for k, v in tok["model"]["vocab"].items()}
        for a in tok.get("added_tokens", []):
            pieces[a["id"]] = a["content"]
        toks = val("tokenizer.ggml.tokens")
        ntok = len(toks.data)
        if ntok != cfg["vocab_size"]:
            fail(f"{ntok} tokens, vocab_size {cfg['vocab_size']}")
        for i in range(min(ntok, len(pieces))):
            s = bytes(toks.parts[toks.data[i]]).decode("utf-8")
            if i in pieces and s != pieces[i]:
                fail(f"token {i}: {s!r}, tokenizer.json has {pieces[i]!r}")
                break
        byte_level = "ByteLevel" in json.dumps(tok.get("pre_tokenizer")) or "ByteLevel" in json.dumps(tok.get("decoder"))
        if val("tokenizer.ggml.model") != ("gpt2" if byte_level else "llama"):
            fail(f"tokenizer.ggml.model {val('tokenizer.ggml.model')}")
        if byte_level:
            m = val("tokenizer.ggml.merges")
            mf = tok["model"]["merges"]
            first = mf[0] if isinstance(mf[0], str) else " ".join(mf[0])
            if m is None or bytes(m.parts[m.data[0]]).decode("utf-8") != first:
                fail("tokenizer.ggml.merges does not start with tokenizer.json's first merge")
        tc = os.path.join(model, "tokenizer_config.json")
        if os.path.exists(tc):
            tcfg = json.load(open(tc))
            for key, field in (("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")):
                name = tcfg.get(key)
                name = name.get("content") if isinstance(name, dict) else name
                if name is not None:
                    ids = [i for i, p in pieces.items() if p == name]
                    if val(field) is None or int(val(field)) not in ids:
                        fail(f"{field} = {val(field)}, want the id of {name!r}")
            if isinstance(tcfg.get("chat_template"), str) and val("tokenizer.chat_template") != tcfg["chat_template"]:
                fail("tokenizer.chat_template differs from tokenizer_config.json's")
    print(f"{path}: {len(got)} tensors; worst error / bound by type: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(worst.items())))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
