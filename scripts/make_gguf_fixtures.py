#!/usr/bin/env python3
"""make_gguf_fixtures.py - the GGUF fixtures of tests/fixtures/gguf/, written
with the `gguf` package from the committed safetensors fixtures.

    python3 scripts/make_gguf_fixtures.py      # rewrites tests/fixtures/gguf/

- tiny-f32-mha.gguf: tests/fixtures/tiny-f32-mha, every tensor f32 (tied
  embeddings: no output.weight).
- tiny-f16-sharded.gguf: tests/fixtures/tiny-f16-sharded (both shards), the
  matrices f16, the 1-D norm weights widened to f32 (exactly), as llama.cpp's
  converter keeps them.
- tiny-f16-sharded-q8_0.gguf: the same weights with every matrix quantized to
  Q8_0 by gguf.quants.quantize (from their exact f32 values), norms f32.
- tiny-qwen2.gguf: tests/fixtures/tiny-qwen2 as a "qwen2" file: the bf16
  matrices kept, the norms and the q/k/v biases widened to f32, the q/k rows
  not permuted (tied embeddings: no output.weight).
- meta.gguf: no model; a metadata value of every type (each integer type,
  f32, f64, bool, string, arrays of each, an array of strings, nested arrays;
  the package writes no empty strings or arrays, test_gguf builds those),
  general.alignment 64, and one small tensor of each ggml type tide maps
  (raw bytes), for the reader's tests.

Also the seed corpus of the fuzz target fuzz/fuzz_gguf.c,
fuzz/corpus/fuzz_gguf/: meta.gguf and tiny-model.gguf, a one-layer "llama"
model of random f32/f16 weights (hidden 8, 2 heads, vocab 4), a few KB.

The model files follow bench/peer/gguf_convert.py (its helpers are used):
llama.cpp's tensor names, q_proj/k_proj rows permuted per head for ggml's
adjacent-pair rope, the "llama" architecture's keys. They carry no tokenizer:
the tests feed token ids. The output is deterministic for a given gguf
package version.
"""
import os
import shutil
import sys

import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
sys.path.insert(0, os.path.join(root, "bench", "peer"))

import gguf  # noqa: E402
import gguf_convert as gc  # noqa: E402

FIX = os.path.join(root, "tests", "fixtures")
OUT = os.path.join(FIX, "gguf")


def model_keys(w, cfg, name):
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads") or n_head
    head_dim = cfg["hidden_size"] // n_head
    w.add_name(name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0
    w.add_rope_freq_base(float(rope))
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-5)))
    w.add_vocab_size(cfg["vocab_size"])
    return n_head, n_kv


def write_model(src, out, mode, arch="llama"):
    """mode: "keep" (the checkpoint's dtype, norms f32) or "q8_0". arch "qwen2": llama.cpp's converter keeps
    the q/k rows in Hugging Face's order there (its rope for qwen2 is the half-split one) and writes the
    q, k and v biases in f32."""
    import json
    model_dir = os.path.join(FIX, src)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    path = os.path.join(OUT, out)
    w = gguf.GGUFWriter(path, arch)
    n_head, n_kv = model_keys(w, cfg, src)
    tensors = []
    for name, st_dt, shape, arr in gc.st_tensors(model_dir):
        gname = gc.gguf_name(name)
        if gname is None:
            raise ValueError(f"tensor {name} has no llama.cpp name")
        if arch != "llama":
            pass
        elif name.endswith("q_proj.weight"):
            arr = gc.rope_permute(arr, n_head)
        elif name.endswith("k_proj.weight"):
            arr = gc.rope_permute(arr, n_kv)
        tensors.append((gname, st_dt, shape, np.asarray(arr)))
    tensors.sort(key=lambda t: t[0])
    ftype = None
    for gname, st_dt, shape, arr in tensors:
        if len(shape) == 1:
            w.add_tensor(gname, np.ascontiguousarray(gc.widen(arr, st_dt)))
        elif mode == "q8_0":
            q = gguf.quants.quantize(np.ascontiguousarray(gc.widen(arr, st_dt)), gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            ftype = gguf.LlamaFileType.MOSTLY_Q8_0
        else:
            w.add_tensor(gname, np.ascontiguousarray(arr), raw_dtype=gc.ST_DTYPES[st_dt][1])
            ftype = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                     "BF16": gguf.LlamaFileType.MOSTLY_BF16}[st_dt]
    w.add_file_type(ftype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return path


def write_meta():
    path = os.path.join(OUT, "meta.gguf")
    w = gguf.GGUFWriter(path, "tide-test")
    VT = gguf.GGUFValueType
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_uint64("test.u64", 18000000000000000000)
    w.add_int64("test.i64", -9000000000000000000)
    w.add_float32("test.f32", 1.5)
    w.add_float64("test.f64", -2.25)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo")
    w.add_key_value("test.arr_u8", [1, 2, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("test.arr_i16", [-1, 2, -3], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("test.arr_i32", [7, -8, 9, -10], VT.ARRAY, sub_type=VT.INT32)
    w.add_key_value("test.arr_u64", [1, 1 << 40], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("test.arr_f32", [0.5, -1.0], VT.ARRAY, sub_type=VT.FLOAT32)
    w.add_key_value("test.arr_f64", [3.0], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_key_value("test.arr_bool", [True, False, True], VT.ARRAY, sub_type=VT.BOOL)
    w.add_array("test.arr_str", ["a", "", "\u2581t\u00e9"])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("test.nested_str", [["x", "yy"], ["zzz"]])
    rng = np.random.default_rng(7)
    w.add_tensor("t.f32", rng.standard_normal((3, 4)).astype(np.float32))
    w.add_tensor("t.f16", rng.standard_normal((2, 8)).astype(np.float16))
    w.add_tensor("t.bf16", rng.integers(0, 1 << 16, (5,), dtype=np.uint16).view(np.uint16),
                 raw_dtype=gguf.GGMLQuantizationType.BF16)
    QT = gguf.GGMLQuantizationType
    for qt in (QT.Q8_0, QT.Q4_0, QT.Q4_K, QT.Q5_K, QT.Q6_K):
        block, bsize = gguf.GGML_QUANT_SIZES[qt]
        raw = np.zeros((2, bsize), dtype=np.uint8)  # 2 rows of one block; zero scales: exact zeros
        w.add_tensor(f"t.{qt.name.lower()}", raw, raw_shape=raw.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return path


def write_tiny_model(path):
    """A one-layer llama model, hidden 8, heads 2 / kv 1, ffn 16, vocab 4."""
    w = gguf.GGUFWriter(path, "llama")
    cfg = {"num_attention_heads": 2, "num_key_value_heads": 1, "hidden_size": 8, "num_hidden_layers": 1,
           "intermediate_size": 16, "vocab_size": 4, "max_position_embeddings": 16, "rms_norm_eps": 1e-5}
    model_keys(w, cfg, "tiny-model")
    rng = np.random.default_rng(11)
    D, I, V, hd = 8, 16, 4, 4

    def m(rows, cols, dt=np.float32):
        return rng.standard_normal((rows, cols)).astype(dt)
    w.add_tensor("token_embd.weight", m(V, D))
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    w.add_tensor("output.weight", m(V, D, np.float16))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(D, np.float32))
    w.add_tensor("blk.0.attn_q.weight", m(2 * hd, D))
    w.add_tensor("blk.0.attn_k.weight", m(hd, D))
    w.add_tensor("blk.0.attn_v.weight", m(hd, D))
    w.add_tensor("blk.0.attn_output.weight", m(D, 2 * hd, np.float16))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(D, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", m(I, D))
    w.add_tensor("blk.0.ffn_up.weight", m(I, D))
    w.add_tensor("blk.0.ffn_down.weight", m(D, I))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=False)
    w.close()
    return path


def main():
    os.makedirs(OUT, exist_ok=True)
    made = [write_model("tiny-f32-mha", "tiny-f32-mha.gguf", "keep"),
            write_model("tiny-f16-sharded", "tiny-f16-sharded.gguf", "keep"),
            write_model("tiny-f16-sharded", "tiny-f16-sharded-q8_0.gguf", "q8_0"),
            write_model("tiny-qwen2", "tiny-qwen2.gguf", "keep", arch="qwen2"),
            write_meta()]
    seeds = os.path.join(root, "fuzz", "corpus", "fuzz_gguf")
    os.makedirs(seeds, exist_ok=True)
    shutil.copyfile(made[-1], os.path.join(seeds, "meta.gguf"))
    made += [os.path.join(seeds, "meta.gguf"), write_tiny_model(os.path.join(seeds, "tiny-model.gguf"))]
    for p in made:
        print(f"make_gguf_fixtures.py: {os.path.relpath(p, root)} ({os.path.getsize(p)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
