"""tide.Model: a checkpoint opened on a backend, through libtide's C API."""

from __future__ import annotations

import ctypes
import os
import queue
import re
import threading
from ctypes import POINTER, byref, c_char_p, c_int, c_int32, c_size_t, c_void_p
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._errors import InvalidInput, check, error

L = _lib.lib

# The built-in model (src/cli/cli.h: TIDE_DEFAULT_CONFIG, TIDE_DEFAULT_SEED),
# generated once into the cache as `tide run` does (src/cli/util.c).
DEFAULT_CONFIG = "tinyllama-1.1b"
DEFAULT_SEED = 0

_BYTES = re.compile(r"^([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)([kKmMgGtT]i?)?([bB])?$")


def parse_bytes(v: Union[int, str], what: str) -> int:
    """Bytes as an int or a string such as "2G", "512MiB" (powers of 1024, as the CLI reads them)."""
    if isinstance(v, bool):
        raise InvalidInput("bad %s %r (bytes such as 2G)" % (what, v))
    if isinstance(v, int):
        if v <= 0:
            raise InvalidInput("bad %s %r (a positive number of bytes)" % (what, v))
        return v
    m = _BYTES.match(str(v))
    if not m:
        raise InvalidInput("bad %s '%s' (bytes such as 2G)" % (what, v))
    mul = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get((m.group(2) or " ")[0].lower(), 1)
    n = int(float(m.group(1)) * mul + 0.5)
    if n <= 0:
        raise InvalidInput("bad %s '%s' (a positive number of bytes)" % (what, v))
    return n


def _budget(budget: Union[None, int, str], o: _lib.OffloadOpts) -> None:
    """--budget's forms: None or "none", "min", "auto", "25%", bytes."""
    if budget is None or budget == "none":
        o.budget_kind = _lib.BUDGET_NONE
    elif budget == "min":
        o.budget_kind = _lib.BUDGET_MIN
    elif budget == "auto":
        o.budget_kind = _lib.BUDGET_AUTO
    elif isinstance(budget, str) and budget.endswith("%"):
        try:
            pct = float(budget[:-1])
        except ValueError:
            pct = -1
        if not 0 < pct <= 100:
            raise InvalidInput("bad budget '%s' (bytes such as 2G, a percentage such as 25%%, auto, min or none)"
                               % budget)
        o.budget_kind, o.fraction = _lib.BUDGET_FRACTION, pct / 100
    else:
        try:
            o.bytes = parse_bytes(budget, "budget")
        except InvalidInput:
            raise InvalidInput("bad budget '%s' (bytes such as 2G, a percentage such as 25%%, auto, min or none)"
                               % (budget,)) from None
        o.budget_kind = _lib.BUDGET_BYTES


def cache_dir() -> str:
    """Where the built-in model lives: $TIDE_CACHE/models, else $XDG_CACHE_HOME/tide/models, else
    ~/.cache/tide/models (as src/cli/util.c)."""
    c, x, h = os.environ.get("TIDE_CACHE"), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME")
    if c:
        return os.path.join(c, "models")
    if x:
        return os.path.join(x, "tide", "models")
    if h:
        return os.path.join(h, ".cache", "tide", "models")
    return "/tmp/tide-cache/models"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _tokenizer_data_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "share", "tide", "tokenizer"),
              os.path.join(here, "..", "..", "data", "tokenizer")):  # a source tree
        if os.path.exists(os.path.join(d, "tokenizer.json")):
            return d
    raise error(_lib.E_NOT_FOUND, "the built-in tokenizer's files were not found beside the tide package")


def default_model(ctx) -> str:
    """The built-in model's directory, generated on first use (2.2 GB): the
    same bytes as `tide run` makes, its tokenizer beside it."""
    d = os.path.join(cache_dir(), "%s-synthetic-s%d" % (DEFAULT_CONFIG, DEFAULT_SEED))
    if not os.path.exists(os.path.join(d, "model.safetensors")):  # written last
        os.makedirs(d, exist_ok=True)
        cfg = ctypes.create_string_buffer(_lib.LLAMA_CONFIG_ROOM)
        check(L.tide_llama_config_named(ctx, DEFAULT_CONFIG.encode(), cfg), ctx, "default model")
        check(L.tide_checkpoint_make_synthetic(ctx, cfg, DEFAULT_SEED, 0, d.encode()), ctx,
              "generating the default model")
    if not os.path.exists(os.path.join(d, "tokenizer.json")):  # its presence means the set is whole
        src = _tokenizer_data_dir()
        for name in ("tokenizer_config.json", "generation_config.json", "tokenizer.json"):
            with open(os.path.join(src, name), "rb") as f:
                _write_atomic(os.path.join(d, name), f.read())
    return d


@dataclass
class Generation:
    """What Model.generate and Model.chat return: the generated ids, their
    text (None for an ids prompt on a model without a tokenizer), why it
    stopped ("eos", "stop", "length") and tide_gen_stats as a dict."""
    tokens: List[int]
    text: Optional[str]
    stop_reason: str
    stats: Dict[str, Any] = field(default_factory=dict)


def _stats_dict(s: _lib.GenStats) -> Dict[str, Any]:
    return {name: getattr(s, name) for name, _ in s._fields_}


def _ids_array(ids: Sequence[int], what: str):
    try:
        a = np.asarray(ids, dtype=np.int64)
    except (TypeError, ValueError):
        raise InvalidInput("bad %s: a sequence of token ids" % what) from None
    if a.ndim != 1 or a.size == 0:
        raise InvalidInput("bad %s: a non-empty sequence of token ids" % what)
    if a.min() < -(1 << 31) or a.max() >= (1 << 31):
        raise InvalidInput("bad %s: token ids are 32-bit" % what)
    arr = (c_int32 * a.size)(*a.tolist())
    return arr, int(a.size)


class Model:
    """A model: a Hugging Face-layout checkpoint directory or a .gguf file
    (None: the built-in model), opened on a backend ("auto", "cpu", "cuda").

    budget offloads every run under a device memory budget (bytes as an int
    or "2G", "25%" of the unconstrained peak, "auto", "min"; None: resident);
    policy, ssd (spill directories, comma-separated), host_budget are those of
    `tide run`. threads: CPU threads (None: all cores). lora: a PEFT LoRA
    adapter directory (adapter_config.json, adapter_model.safetensors)
    applied at run time, as `tide run --lora`. One model is used by one
    thread at a time. A context manager; close() frees it at once.
    """

    def __init__(self, path: Optional[Union[str, os.PathLike]] = None, *, backend: str = "auto",
                 budget: Union[None, int, str] = None, policy: str = "tide", ssd: Optional[str] = None,
                 host_budget: Union[None, int, str] = None, threads: Optional[int] = None,
                 lora: Optional[Union[str, os.PathLike]] = None):
        self._ctx = self._be = self._ck = self._m = self._tok = None
        self._lock = threading.Lock()
        if backend not in _lib.BACKENDS:
            raise InvalidInput("unknown backend '%s' (auto, cpu or cuda)" % backend)
        if policy not in ("tide", "static-layer", "lru"):
            raise InvalidInput("unknown policy '%s' (tide, static-layer or lru)" % policy)
        if threads is not None and (not isinstance(threads, int) or not 1 <= threads <= 4096):
            raise InvalidInput("bad threads %r (1 to 4096)" % (threads,))
        off = L.tide_offload_opts_default()
        _budget(budget, off)
        self._offload = off.budget_kind != _lib.BUDGET_NONE
        if not self._offload and (ssd is not None or host_budget is not None or policy != "tide"):
            raise InvalidInput("ssd, policy and host_budget need a budget")
        self._keep = [policy.encode(), ssd.encode() if ssd else None]  # the option struct points at them
        off.policy = self._keep[0]
        off.ssd_dirs = self._keep[1]
        if host_budget is not None:
            off.host_budget = parse_bytes(host_budget, "host_budget")
        self._off = off
        self._ctx = L.tide_ctx_new()
        if not self._ctx:
            raise error(_lib.E_NOMEM, "out of memory")
        try:
            L.tide_ctx_set_threads(self._ctx, threads or 0)
            be = c_void_p()
            check(L.tide_backend_new(self._ctx, _lib.BACKENDS[backend], byref(be)), self._ctx, "backend")
            self._be = be
            self.path = os.fspath(path) if path is not None else default_model(self._ctx)
            ck = c_void_p()
            check(L.tide_checkpoint_open(self._ctx, self.path.encode(), byref(ck)), self._ctx, "loading the model")
            self._ck = ck
            if lora is not None:
                self.lora = os.fspath(lora)
                check(L.tide_checkpoint_add_lora(ck, self.lora.encode()), self._ctx, "--lora")
            check(L.tide_checkpoint_prefetch(ck), self._ctx, "loading the model")
            cfg = L.tide_checkpoint_config(ck).contents
            self.config_name = cfg.name.decode()
            self.vocab_size = cfg.vocab_size
            self.max_positions = cfg.max_position_embeddings
            self.n_layers = cfg.num_hidden_layers
            self._shape = (0, 0)  # (max_batch, ctx_len) of self._m
            self._tok_err = None
        except BaseException:
            self.close()
            raise

    # -- life

    def close(self) -> None:
        """Frees the model, its tokenizer, checkpoint, backend and context (again: nothing)."""
        for attr, free in (("_m", L.tide_model_free), ("_tok", L.tide_tokenizer_free),
                           ("_ck", L.tide_checkpoint_free), ("_be", L.tide_backend_free),
                           ("_ctx", L.tide_ctx_free)):
            h = getattr(self, attr, None)
            if h:
                free(h)
            setattr(self, attr, None)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    def _live(self):
        if not self._ctx:
            raise InvalidInput("the model is closed")

    @property
    def backend(self) -> str:
        """The backend's name ("cpu", "cuda")."""
        self._live()
        return L.tide_backend_name(self._be).decode()

    # -- pieces

    def _model(self, batch: int, positions: int):
        """The tide_model with room for batch rows of `positions` positions."""
        if positions > self.max_positions:
            raise InvalidInput("%d positions exceed the model's %d" % (positions, self.max_positions))
        if self._m and self._shape[0] >= batch and self._shape[1] >= positions:
            return self._m
        if self._m:
            L.tide_model_free(self._m)
            self._m = None
        ctx_len = min(self.max_positions, max(positions, self._shape[1], 256))
        mo = L.tide_model_opts_default()
        mo.max_batch, mo.ctx_len = max(batch, self._shape[0], 1), ctx_len
        sync = os.environ.get("TIDE_EXEC_SYNC", "")
        mo.sync_issue = bool(sync) and sync != "0"
        m = c_void_p()
        check(L.tide_model_new(self._ctx, self._ck, self._be, byref(mo), byref(m)), self._ctx,
              "preparing the model")
        self._m = m
        self._shape = (mo.max_batch, ctx_len)
        if self._offload:
            check(L.tide_model_set_offload(m, byref(self._off)), self._ctx, "offloading")
        return m

    def _tokenizer(self):
        if self._tok:
            return self._tok
        if self._tok_err:
            raise self._tok_err
        t = c_void_p()
        try:
            check(L.tide_tokenizer_open(self._ctx, self.path.encode(), byref(t)), self._ctx, "the model's tokenizer")
            n = L.tide_tokenizer_n_vocab(t)
            if n > self.vocab_size:
                L.tide_tokenizer_free(t)
                raise InvalidInput("the tokenizer's %d ids exceed the model's vocabulary of %d (embedding rows): "
                                   "they do not belong together" % (n, self.vocab_size))
        except InvalidInput as e:
            self._tok_err = e
            raise
        self._tok = t
        return t

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> List[int]:
        """The ids of text through the model's tokenizer (with the BOS it adds when add_special)."""
        self._live()
        tok = self._tokenizer()
        return self._encode(tok, text, (_lib.TOKENIZE_ADD_SPECIAL if add_special else 0) |
                            (0 if parse_special else _lib.TOKENIZE_SPECIAL_AS_TEXT))

    def _encode(self, tok, text: str, flags: int) -> List[int]:
        b = text.encode()
        ids, n = POINTER(c_int32)(), c_int()
        check(L.tide_tokenizer_encode_prompt(tok, b, len(b), flags, byref(ids), byref(n)), self._ctx)
        try:
            return ids[:n.value]
        finally:
            L.tide_free_ids(ids)

    def detokenize(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of ids (special tokens skipped unless skip_special is False)."""
        self._live()
        tok = self._tokenizer()
        ids = list(ids)
        arr = (c_int32 * max(len(ids), 1))(*ids)
        flags = _lib.DECODE_SKIP_SPECIAL if skip_special else 0
        n = c_size_t()
        cap = 4 * len(ids) + 16
        while True:
            buf = ctypes.create_string_buffer(cap)
            check(L.tide_tokenizer_decode(tok, arr, len(ids), flags, buf, cap, byref(n)), self._ctx)
            if n.value < cap:
                return buf.raw[:n.value].decode()
            cap = n.value + 1

    # -- runs

    def forward(self, ids: Union[Sequence[int], np.ndarray], start_pos: int = 0) -> np.ndarray:
        """Logits of the ids (float32): shape (len(ids), vocab) for a sequence,
        (batch, seq, vocab) for a 2-D array of ids; from position start_pos."""
        self._live()
        a = np.asarray(ids)
        two_d = a.ndim == 2
        if not two_d:
            a = a.reshape(1, -1)
        if a.ndim != 2 or a.size == 0:
            raise InvalidInput("forward: ids must be a non-empty sequence or a 2-D array (batch, seq)")
        b, t = a.shape
        arr, _ = _ids_array(a.reshape(-1), "ids")
        out = np.empty((b, t, self.vocab_size), dtype=np.float32)
        with self._lock:
            m = self._model(b, start_pos + t)
            check(L.tide_model_forward(m, arr, b, t, start_pos,
                                       out.ctypes.data_as(POINTER(ctypes.c_float))), self._ctx, "forward")
        return out if two_d else out[0]

    def generate(self, prompt: Union[str, Sequence[int]], max_new_tokens: int = 16, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 0.0, min_p: float = 0.0, repetition_penalty: float = 0.0,
                 seed: Optional[int] = None, stop: Union[None, str, Sequence[str]] = None,
                 stream: bool = False) -> Union[Generation, Iterator[str]]:
        """Generates up to max_new_tokens after prompt: a text (through the
        model's tokenizer, with the BOS it adds; generation stops at its EOS
        and at any `stop` string) or a list of ids. Greedy unless temperature
        > 0 (then top_k, top_p, min_p, repetition_penalty and seed apply; no
        seed: a random one). Returns a Generation, or with stream=True an
        iterator of text pieces (a text prompt, or ids on a model with a
        tokenizer) that join to the whole text. Ctrl-C stops it
        (KeyboardInterrupt) at the next token."""
        self._live()
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidInput("the prompt is empty")
            tok = self._tokenizer()
            ids = self._encode(tok, prompt, _lib.TOKENIZE_ADD_SPECIAL)
            text_mode = True
        else:
            ids = list(_ids_array(prompt, "prompt")[0])
            text_mode = False
            tok = None
            if stream or stop:
                tok = self._tokenizer()
        return self._run(ids, tok, None, text_mode, max_new_tokens,
                         dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repetition_penalty=repetition_penalty, seed=seed), stop, stream)

    def chat(self, messages: Sequence[Dict[str, str]], max_new_tokens: int = 256, *, template: Optional[str] = None,
             stream: bool = False, **sampling) -> Union[Generation, Iterator[str]]:
        """One assistant turn after messages ([{"role": "system"|"user"|
        "assistant", "content": ...}, ...]) formatted with the model's chat
        template (or the family `template` names: llama2, llama3, chatml,
        mistral, zephyr, gemma); stops at the template's end of turn. Other
        keywords are generate's sampling options and stop."""
        self._live()
        tok = self._tokenizer()
        tmpl = c_void_p()
        check(L.tide_chat_template_get(self._ctx, tok, template.encode() if template else None, byref(tmpl)),
              self._ctx, "chat template")
        try:
            keep = []
            msgs = (_lib.ChatMsg * max(len(messages), 1))()
            for i, msg in enumerate(messages):
                try:
                    role, content = msg["role"].encode(), msg["content"].encode()
                except (KeyError, TypeError, AttributeError):
                    raise InvalidInput("chat: message %d is not a dict with a role and a content" % i) from None
                keep += [role, content]
                msgs[i].role, msgs[i].content = role, content
            out, n = c_void_p(), c_size_t()
            check(L.tide_chat_format(self._ctx, tmpl, msgs, len(messages), True, byref(out), byref(n)), self._ctx,
                  "chat template")
            text = ctypes.string_at(out, n.value).decode()
            L.tide_free_text(out)
            ids = self._encode(tok, text, 0)
            stop = sampling.pop("stop", None)
            samp = {k: sampling.pop(k, d) for k, d in (("temperature", 0.0), ("top_k", 0), ("top_p", 0.0),
                                                         ("min_p", 0.0), ("repetition_penalty", 0.0),
                                                         ("seed", None))}
            if sampling:
                raise InvalidInput("chat: unknown option %s" % ", ".join(sorted(sampling)))
            return self._run(ids, tok, tmpl, True, max_new_tokens, samp, stop, stream, free_tmpl=True)
        except BaseException:
            L.tide_chat_template_free(tmpl)
            raise

    def _run(self, ids, tok, tmpl, text_mode, max_new, samp, stop, stream, free_tmpl=False):
        try:
            job = _Job(self, ids, tok, tmpl, text_mode, max_new, samp, stop, stream)
        except BaseException:
            if free_tmpl:
                L.tide_chat_template_free(tmpl)
            raise
        if free_tmpl:
            job.tmpl_owned = True
        if stream:
            return job.pieces()
        return job.result()


class _Job:
    """One generation, run on a thread of its own so that the calling thread
    stays free to take Ctrl-C (KeyboardInterrupt) and to stream: tide calls
    its callbacks (each id, each piece of text) on that thread; the GIL is
    released while libtide runs."""

    def __init__(self, model: Model, ids, tok, tmpl, text_mode, max_new, samp, stop, stream):
        self.tmpl_owned = False
        self.model, self.tmpl = model, tmpl
        ctx = model._ctx
        if not isinstance(max_new, int) or isinstance(max_new, bool) or not 0 <= max_new <= (1 << 20):
            raise InvalidInput("bad max_new_tokens %r (0 to 1048576)" % (max_new,))
        if stop is not None and not text_mode and not stream and tok is None:
            raise InvalidInput("stop strings need a text prompt")
        if len(ids) + max(max_new - 1, 0) > model.max_positions:
            raise InvalidInput("%d prompt + %d new tokens exceed the model's %d positions"
                               % (len(ids), max_new, model.max_positions))
        self.ids = (c_int32 * len(ids))(*ids)
        self.n_prompt, self.max_new = len(ids), max_new
        self.text_mode, self.tok = text_mode, tok
        self.cancel = threading.Event()
        self.q: "queue.Queue" = queue.Queue()
        self.sampler = self.tg = None
        self.stop_ids = None
        so = L.tide_sampler_opts_default()
        try:
            so.temperature, so.top_k, so.top_p, so.min_p = (float(samp["temperature"]), int(samp["top_k"]),
                                                            float(samp["top_p"]), float(samp["min_p"]))
            so.repetition_penalty = float(samp["repetition_penalty"])
        except (TypeError, ValueError):
            raise InvalidInput("bad sampling option (numbers)") from None
        seed = samp["seed"]
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") if so.temperature > 0 else 0
        if not isinstance(seed, int) or not 0 <= seed < (1 << 64):
            raise InvalidInput("bad seed %r (0 to 2^64-1)" % (seed,))
        so.seed = self.seed = seed
        sampling = any(samp[k] for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")) or \
            samp["seed"] is not None
        try:
            if text_mode or sampling:
                # text is drawn from the tokenizer's ids only, as `tide run` does
                nv = L.tide_tokenizer_n_vocab(tok) if tok else model.vocab_size
                s = c_void_p()
                check(L.tide_sampler_new(ctx, byref(so), nv, byref(s)), ctx, "sampling options")
                self.sampler = s
            if text_mode:
                n = L.tide_tokenizer_stop_ids(tok, tmpl, None, 0)
                self.stop_ids = (c_int32 * max(n, 1))()
                L.tide_tokenizer_stop_ids(tok, tmpl, self.stop_ids, n)
                self.n_stop_ids = n
            else:
                self.n_stop_ids = 0
            if tok is not None:
                stops = [stop] if isinstance(stop, str) else list(stop or [])
                self._stops = [s.encode() for s in stops]
                arr = (c_char_p * max(len(stops), 1))(*self._stops)
                to = L.tide_textgen_opts_default()
                to.stops, to.n_stops = arr, len(stops)
                tg = c_void_p()
                check(L.tide_textgen_new(ctx, tok, byref(to), byref(tg)), ctx, "stop")
                self.tg = tg
        except BaseException:
            self.free()
            raise
        self._on_token = _lib.ON_TOKEN(self._token_cb)
        self._emit = _lib.EMIT(self._emit_cb)
        self.status = None
        self.out = (c_int32 * max(max_new, 1))()
        self.n_out = c_int()
        self.stats = _lib.GenStats()
        self.failure: Optional[BaseException] = None

    # callbacks (on the generating thread)
    def _token_cb(self, user, tid):
        return 1 if self.cancel.is_set() else 0

    def _emit_cb(self, user, piece, n):
        self.q.put(ctypes.string_at(piece, n).decode(errors="replace"))

    def _work(self):
        m = self.model
        try:
            with m._lock:
                mm = m._model(1, self.n_prompt + max(self.max_new - 1, 0))
                go = L.tide_gen_opts_default()
                go.sampler = self.sampler
                go.stop_ids = self.stop_ids if self.n_stop_ids else None
                go.n_stop_ids = self.n_stop_ids
                go.on_token = self._on_token
                if self.sampler:
                    check(L.tide_sampler_start(self.sampler, self.seed, self.ids, self.n_prompt), m._ctx, "sampler")
                if self.tg:
                    L.tide_textgen_set_emit(self.tg, self._emit, None)
                    st = L.tide_textgen_generate(self.tg, mm, self.ids, self.n_prompt, self.max_new, byref(go),
                                                 self.out, byref(self.n_out), byref(self.stats))
                else:
                    st = L.tide_model_generate_ex(mm, self.ids, self.n_prompt, self.max_new, byref(go), self.out,
                                                  byref(self.n_out), byref(self.stats))
                check(st, m._ctx, "run")
        except BaseException as e:  # handed to the caller's thread
            self.failure = e
        finally:
            self.q.put(None)

    def _run(self, yield_pieces: bool):
        """Runs the generation on its own thread and waits for it (yielding
        its text pieces with yield_pieces). Whatever ends the wait (its end,
        Ctrl-C at any moment, the consumer closing the stream) the thread is
        stopped and joined before this returns or raises, so nothing it uses
        is freed under it and no generating thread outlives the call."""
        t = threading.Thread(target=self._work, name="tide-generate", daemon=True)
        try:
            t.start()
            while True:
                try:
                    piece = self.q.get(timeout=0.05)
                except queue.Empty:
                    continue
                if piece is None:
                    break
                if yield_pieces:
                    yield piece
        except BaseException:  # KeyboardInterrupt, or the consumer closing the stream
            self.cancel.set()
            raise
        finally:
            self._join(t)

    def _join(self, t: threading.Thread):
        """Joins t (if it started); a Ctrl-C while waiting stops the
        generation and is raised once t has ended."""
        if t.ident is None:
            return
        interrupted = None
        while True:
            try:
                t.join()
                break
            except BaseException as e:
                self.cancel.set()
                interrupted = e
        if interrupted is not None:
            raise interrupted

    def result(self) -> Generation:
        try:
            for _ in self._run(False):
                pass
            return self._finish()
        finally:
            self.free()

    def pieces(self) -> Iterator[str]:
        try:
            yield from self._run(True)
            g = self._finish()
            self.result_ = g
        finally:
            self.free()

    def _finish(self) -> Generation:
        if self.failure is not None:
            raise self.failure
        n = self.n_out.value
        toks = list(self.out[:n])
        text = None
        stopped = False
        if self.tg:
            ln = c_size_t()
            p = L.tide_textgen_text(self.tg, byref(ln))
            text = ctypes.string_at(p, ln.value).decode(errors="replace")
            stopped = L.tide_textgen_stopped(self.tg)
        reason = "stop" if stopped else ("eos" if n < self.max_new else "length")
        stats = _stats_dict(self.stats)
        if self.sampler and self.seed is not None:
            stats["seed"] = self.seed
        return Generation(toks, text, reason, stats)

    def free(self):
        if self.tg:
            L.tide_textgen_free(self.tg)
            self.tg = None
        if self.sampler:
            L.tide_sampler_free(self.sampler)
            self.sampler = None
        if self.tmpl_owned and self.tmpl:
            L.tide_chat_template_free(self.tmpl)
            self.tmpl = None
