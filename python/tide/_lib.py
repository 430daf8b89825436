"""ctypes declarations of the part of include/tide.h the package uses.

ctypes, not cffi: it is in the standard library (nothing to build or install
beside libtide.so), it releases the GIL around every foreign call, and a
CFUNCTYPE callback takes the GIL back on whatever thread tide calls it from.
The structs mirror tide.h's layouts field for field; the versioned option
structs carry their ``size`` (docs/library.md, "ABI rules"), which the library
checks, so a mismatch is refused (TIDE_E_INVALID) rather than misread.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float, c_int,
                    c_int32, c_size_t, c_uint, c_uint64, c_void_p)

_HERE = os.path.dirname(os.path.abspath(__file__))

# status codes (tide_status)
OK, E_INVALID, E_NOMEM, E_IO, E_FORMAT, E_NOT_FOUND, E_UNSUPPORTED, E_RANGE, E_INFEASIBLE, E_NO_DEVICE, \
    E_BACKEND, E_VERIFY, E_BUSY = range(13)

BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
BUDGET_NONE, BUDGET_BYTES, BUDGET_FRACTION, BUDGET_MIN, BUDGET_AUTO = range(5)
TOKENIZE_ADD_SPECIAL = 1
TOKENIZE_SPECIAL_AS_TEXT = 2
DECODE_SKIP_SPECIAL = 1


class LlamaConfigHead(Structure):
    """The leading fields of tide_llama_config (read through a pointer only)."""
    _fields_ = [("name", c_char * 64), ("hidden_size", c_int), ("intermediate_size", c_int),
                ("num_hidden_layers", c_int), ("num_attention_heads", c_int), ("num_key_value_heads", c_int),
                ("vocab_size", c_int), ("max_position_embeddings", c_int)]


class ModelOpts(Structure):
    _fields_ = [("size", c_size_t), ("max_batch", c_int), ("ctx_len", c_int), ("sync_issue", c_bool)]


class OffloadOpts(Structure):
    _fields_ = [("size", c_size_t), ("budget_kind", c_int), ("bytes", c_uint64), ("fraction", c_double),
                ("policy", c_char_p), ("host_budget", c_uint64), ("ssd_dirs", c_char_p),
                ("weights_on_ssd", c_bool), ("direct_storage", c_bool), ("hw", c_char_p), ("tile", c_int),
                ("pin_weights", c_int), ("optimizer", c_char_p), ("timeline", c_bool), ("no_warm", c_bool),
                ("no_refit", c_bool)]


class GenStats(Structure):
    _fields_ = [("prefill_s", c_double), ("decode_s", c_double), ("prefill_tokens", c_int),
                ("decode_tokens", c_int), ("prefill_tokens_per_s", c_double), ("decode_tokens_per_s", c_double),
                ("peak_bytes", c_uint64), ("weight_bytes", c_uint64), ("state_bytes", c_uint64),
                ("budget_bytes", c_uint64), ("peak_device_bytes", c_uint64), ("bytes_h2d", c_uint64),
                ("bytes_d2h", c_uint64), ("bytes_ssd_read", c_uint64), ("bytes_ssd_write", c_uint64),
                ("predicted_s", c_double), ("predicted_prefill_s", c_double), ("exec_s", c_double),
                ("ssd_read_s", c_double), ("logits_hash", c_uint64), ("tile_level", c_int),
                ("pinned_weight_bytes", c_uint64), ("warm_weight_bytes", c_uint64), ("async_issue", c_bool),
                ("batch", c_int), ("batch_steps", c_int)]


class SamplerOpts(Structure):
    _fields_ = [("size", c_size_t), ("temperature", c_double), ("top_k", c_int32), ("top_p", c_double),
                ("min_p", c_double), ("repetition_penalty", c_double), ("frequency_penalty", c_double),
                ("presence_penalty", c_double), ("penalty_last_n", c_int32), ("seed", c_uint64)]


ON_TOKEN = CFUNCTYPE(c_int, c_void_p, c_int32)
EMIT = CFUNCTYPE(None, c_void_p, POINTER(c_char), c_size_t)


class GenOpts(Structure):
    _fields_ = [("size", c_size_t), ("sampler", c_void_p), ("stop_ids", POINTER(c_int32)), ("n_stop_ids", c_int),
                ("start_pos", c_int), ("on_token", ON_TOKEN), ("user", c_void_p)]


class TextgenOpts(Structure):
    _fields_ = [("stops", POINTER(c_char_p)), ("n_stops", c_int), ("decode_flags", c_uint), ("emit", EMIT),
                ("emit_user", c_void_p)]


class ChatMsg(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


# Room for a whole tide_llama_config (tide_llama_config_named fills one):
# larger than this version's struct, which the tests check against the header.
LLAMA_CONFIG_ROOM = 1 << 16


def _find_library() -> str:
    """libtide.so: $TIDE_LIBRARY (a build tree's), else the copy the wheel
    installed beside this package (lib/libtide.so.0)."""
    env = os.environ.get("TIDE_LIBRARY")
    if env:
        return env
    for name in ("libtide.so.0", "libtide.so"):
        p = os.path.join(_HERE, "lib", name)
        if os.path.exists(p):
            return p
    raise ImportError("tide: libtide.so was not found in %s (install the package with `pip install .`, "
                      "or point TIDE_LIBRARY at a build tree's libtide.so)" % os.path.join(_HERE, "lib"))


def _declare(lib: ctypes.CDLL) -> None:
    vp, st = c_void_p, c_int
    P = POINTER
    sig = {
        "tide_version": (c_char_p, []),
        "tide_status_str": (c_char_p, [c_int]),
        "tide_ctx_new": (vp, []),
        "tide_ctx_free": (None, [vp]),
        "tide_ctx_last_error": (c_char_p, [vp]),
        "tide_ctx_last_status": (c_int, [vp]),
        "tide_ctx_set_threads": (None, [vp, c_int]),
        "tide_ctx_threads": (c_int, [vp]),
        "tide_checkpoint_open": (st, [vp, c_char_p, P(vp)]),
        "tide_checkpoint_free": (None, [vp]),
        "tide_checkpoint_config": (P(LlamaConfigHead), [vp]),
        "tide_checkpoint_prefetch": (st, [vp]),
        "tide_checkpoint_add_lora": (st, [vp, c_char_p]),
        "tide_checkpoint_make_synthetic": (st, [vp, vp, c_uint64, c_uint64, c_char_p]),
        "tide_llama_config_named": (st, [vp, c_char_p, vp]),
        "tide_backend_new": (st, [vp, c_int, P(vp)]),
        "tide_backend_free": (None, [vp]),
        "tide_backend_name": (c_char_p, [vp]),
        "tide_model_opts_default": (ModelOpts, []),
        "tide_model_new": (st, [vp, vp, vp, P(ModelOpts), P(vp)]),
        "tide_model_free": (None, [vp]),
        "tide_offload_opts_default": (OffloadOpts, []),
        "tide_model_set_offload": (st, [vp, P(OffloadOpts)]),
        "tide_gen_opts_default": (GenOpts, []),
        "tide_model_generate_ex": (st, [vp, P(c_int32), c_int, c_int, P(GenOpts), P(c_int32), P(c_int),
                                        P(GenStats)]),
        "tide_model_forward": (st, [vp, P(c_int32), c_int, c_int, c_int, P(c_float)]),
        "tide_sampler_opts_default": (SamplerOpts, []),
        "tide_sampler_new": (st, [vp, P(SamplerOpts), c_int32, P(vp)]),
        "tide_sampler_free": (None, [vp]),
        "tide_sampler_start": (st, [vp, c_uint64, P(c_int32), c_int]),
        "tide_tokenizer_open": (st, [vp, c_char_p, P(vp)]),
        "tide_tokenizer_free": (None, [vp]),
        "tide_tokenizer_n_vocab": (c_int32, [vp]),
        "tide_tokenizer_encode_prompt": (st, [vp, c_char_p, c_size_t, c_uint, P(P(c_int32)), P(c_int)]),
        "tide_free_ids": (None, [P(c_int32)]),
        "tide_tokenizer_decode": (st, [vp, P(c_int32), c_size_t, c_uint, c_char_p, c_size_t, P(c_size_t)]),
        "tide_tokenizer_stop_ids": (c_int, [vp, vp, P(c_int32), c_int]),
        "tide_chat_template_get": (st, [vp, vp, c_char_p, P(vp)]),
        "tide_chat_template_free": (None, [vp]),
        "tide_chat_template_name": (c_char_p, [vp]),
        "tide_chat_format": (st, [vp, vp, P(ChatMsg), c_int, c_bool, P(c_void_p), P(c_size_t)]),
        "tide_free_text": (None, [c_void_p]),
        "tide_textgen_opts_default": (TextgenOpts, []),
        "tide_textgen_new": (st, [vp, vp, P(TextgenOpts), P(vp)]),
        "tide_textgen_free": (None, [vp]),
        "tide_textgen_set_emit": (None, [vp, EMIT, vp]),
        "tide_textgen_generate": (st, [vp, vp, P(c_int32), c_int, c_int, P(GenOpts), P(c_int32), P(c_int),
                                       P(GenStats)]),
        "tide_textgen_text": (c_void_p, [vp, P(c_size_t)]),
        "tide_textgen_stopped": (c_bool, [vp]),
        "tide_textgen_status": (c_int, [vp]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


lib = ctypes.CDLL(_find_library())
_declare(lib)
LIBRARY_PATH = lib._name
