#!/usr/bin/env python3
"""make_gguf_tok_fixtures.py - tokenizer-only GGUF files from the text and chat fixtures.

What it makes: for each tokenizer of tests/fixtures/text/ (bpe-llama3, bpe-gpt2,
bpe-qwen2, sp-llama2, sp-metaspace) and of tests/fixtures/chat/ (chatml,
gemma, llama2, llama3, mistral, zephyr), a GGUF file holding only the
tokenizer.* metadata (no tensors), its vocabulary extracted the way llama.cpp's
converter (convert_hf_to_gguf.py with gguf-py's vocab classes) extracts it:

  SentencePiece-style (byte_fallback BPE without a byte-level pre-tokenizer):
      tokenizer.ggml.model "llama"; tokens = the vocabulary by id (added tokens
      at their ids); token_type BYTE for <0xNN>, UNKNOWN for the unk token,
      CONTROL for the other special added tokens, USER_DEFINED for
      non-special added ones, NORMAL otherwise; scores: tokenizer.json holds
      none (the converter reads them from tokenizer.model), so each normal
      token gets the score a SentencePiece BPE model gives its pieces: minus
      its place in the vocabulary (these vocabularies are in merge order), 0
      for the others; add_space_prefix from the normalizer's Prepend or the
      Metaspace prepend_scheme.
  byte-level BPE:
      tokenizer.ggml.model "gpt2"; tokens as tokenizer.json spells them;
      merges as "a b"; token_type CONTROL / USER_DEFINED for added tokens;
      tokenizer.ggml.pre: llama.cpp's name of the pre-tokenizer ("gpt-2",
      "llama-bpe", "qwen2"), recognised here from the pre-tokenizer's regex
      (llama.cpp's converter recognises it by a hash of the tokenizer's output).
  both: bos/eos/unknown/padding ids from tokenizer_config.json (or
      special_tokens_map.json), eot_token_id from a second EOS id in
      generation_config.json, add_bos_token / add_eos_token from what the
      post-processor adds, tokenizer.chat_template from tokenizer_config.json.

Reference: GGUF holds no normalizer, no Metaspace prepend scheme and no
per-token lstrip/rstrip, so a GGUF tokenizer is the Hugging Face tokenizer
that its keys describe, as llama.cpp reads them (a space prefix on every piece
of text between added tokens, added tokens matched on the raw text and
stripping nothing; the family's normalizer and regex for byte-level BPE).
The script builds that tokenizer.json from the GGUF's keys (hf_of_gguf) and
records, with Hugging Face `tokenizers`, what it computes for
tests/fixtures/text/cases.json and mixed.txt (DIR/<name>/expected.json, the
format of the text fixtures' expected.json) and, for the chat fixtures, the
ids of each recorded render (DIR/chat-<name>/expected.json). It prints, and
writes into each expected.json as "differs_from_source", the cases where
those ids differ from the source fixture's own expected ids.

DIR/tiny-chat.gguf: a model and its tokenizer in one file, for the CLI tests
(tests/cli_gguf_tok.sh): tests/fixtures/gguf/tiny-f16-sharded.gguf's weights
and llama.* keys (written by scripts/make_gguf_fixtures.py) with chat/llama2's
tokenizer keys less its byte tokens (its vocabulary of 200 holds the 115 ids
left) and its chat template.

How to run (needs python3 with `gguf` and `tokenizers`; a few seconds):

    python3 scripts/make_gguf_tok_fixtures.py          # writes tests/fixtures/gguf-tok/

CI never runs this script: tests/test_tok_gguf.c reads the committed files.
"""
import argparse
import json
import os
import re
import sys

import gguf
import tokenizers
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_text_fixtures as mtf  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "tests", "fixtures")

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PRE = {"gpt-2": (GPT2_RE, False, False), "llama-bpe": (mtf.LLAMA3_RE, False, True), "qwen2": (mtf.QWEN2_RE, True, False)}

T = gguf.TokenType
SP = "\u2581"


def load(d, fn):
    p = os.path.join(d, fn)
    if not os.path.exists(p):
        return {}
    with open(p, encoding="utf-8") as f:
        return json.load(f)


def token_name(cfg, key):
    v = cfg.get(key)
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def pre_name(j):
    """llama.cpp's name of a byte-level tokenizer's pre-tokenizer."""
    pre = j.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if len(steps) == 1 and steps[0]["type"] == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2"
    if len(steps) == 2 and steps[0]["type"] == "Split" and steps[1]["type"] == "ByteLevel":
        rx = steps[0]["pattern"].get("Regex")
        for name, (r, _, _) in PRE.items():
            if rx == r:
                return name
    raise SystemExit("no llama.cpp pre-tokenizer name for %s" % json.dumps(pre)[:200])


def extract(d):
    """The GGUF keys of the tokenizer in directory d, as llama.cpp's converter writes them."""
    j = load(d, "tokenizer.json")
    cfg = load(d, "tokenizer_config.json")
    stm = load(d, "special_tokens_map.json")
    gen = load(d, "generation_config.json")
    m = j["model"]
    byte_level = (j.get("decoder") or {}).get("type") == "ByteLevel"
    spm = m.get("byte_fallback", False) and not byte_level
    added = {a["id"]: a for a in j["added_tokens"]}
    n = max(list(m["vocab"].values()) + list(added)) + 1
    tokens = ["[PAD%d]" % i for i in range(n)]
    types = [T.UNUSED] * n
    for s, i in m["vocab"].items():
        tokens[i] = s
        types[i] = T.BYTE if spm and re.fullmatch(r"<0x[0-9A-F]{2}>", s) else T.NORMAL
    unk = m.get("unk_token")
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = (T.UNKNOWN if a["content"] == unk else T.CONTROL) if a["special"] else T.USER_DEFINED
    k = {"model": "llama" if spm else "gpt2", "tokens": tokens, "types": [int(t) for t in types]}
    if spm:
        k["scores"] = [-float(i) if types[i] == T.NORMAL else 0.0 for i in range(n)]
        norm = j.get("normalizer") or {}
        norms = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
        pre = j.get("pre_tokenizer") or {}
        k["add_space_prefix"] = any(x.get("type") == "Prepend" for x in norms) or (
            pre.get("type") == "Metaspace" and pre.get("prepend_scheme", "always") != "never")
    else:
        k["merges"] = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
        k["pre"] = pre_name(j)
    ids = {t: i for i, t in enumerate(tokens)}
    for key in ("bos", "eos", "unk", "pad"):
        name = token_name(cfg, key + "_token") or token_name(stm, key + "_token")
        if name in ids:
            k[key] = ids[name]
    ge = gen.get("eos_token_id")
    if isinstance(ge, list):
        others = [x for x in ge if x != k.get("eos")]
        if others:
            k["eot"] = others[0]
    tok = Tokenizer.from_str(json.dumps(j))
    plain, full = tok.encode("x", add_special_tokens=False).ids, tok.encode("x", add_special_tokens=True).ids
    at = full.index(plain[0])
    k["add_bos"] = at > 0 and full[0] == k.get("bos")
    k["add_eos"] = len(full) > at + len(plain) and full[-1] == k.get("eos")
    if isinstance(cfg.get("chat_template"), str):
        k["chat_template"] = cfg["chat_template"]
    return k


def write_gguf(path, k):
    w = gguf.GGUFWriter(path, arch="llama")
    write_tok_keys(w, k)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tok_keys(w, k):
    w.add_tokenizer_model(k["model"])
    if "pre" in k:
        w.add_tokenizer_pre(k["pre"])
    w.add_token_list(k["tokens"])
    if "scores" in k:
        w.add_token_scores(k["scores"])
    w.add_token_types(k["types"])
    if "merges" in k:
        w.add_token_merges(k["merges"])
    for key, fn in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("eot", w.add_eot_token_id),
                    ("unk", w.add_unk_token_id), ("pad", w.add_pad_token_id)):
        if key in k:
            fn(k[key])
    w.add_add_bos_token(k["add_bos"])
    w.add_add_eos_token(k["add_eos"])
    if "add_space_prefix" in k:
        w.add_add_space_prefix(k["add_space_prefix"])
    if "chat_template" in k:
        w.add_chat_template(k["chat_template"])


def read_gguf(path):
    """The keys back from the file (what the C side reads)."""
    r = gguf.GGUFReader(path)
    f = {name: fld for name, fld in r.fields.items()}

    def val(name):
        fld = f.get(name)
        if fld is None:
            return None
        v = fld.contents()
        return v

    k = {"model": val("tokenizer.ggml.model"), "tokens": val("tokenizer.ggml.tokens"),
         "types": val("tokenizer.ggml.token_type")}
    for key, name in (("pre", "tokenizer.ggml.pre"), ("scores", "tokenizer.ggml.scores"),
                      ("merges", "tokenizer.ggml.merges"), ("bos", "tokenizer.ggml.bos_token_id"),
                      ("eos", "tokenizer.ggml.eos_token_id"), ("eot", "tokenizer.ggml.eot_token_id"),
                      ("unk", "tokenizer.ggml.unknown_token_id"), ("pad", "tokenizer.ggml.padding_token_id"),
                      ("add_bos", "tokenizer.ggml.add_bos_token"), ("add_eos", "tokenizer.ggml.add_eos_token"),
                      ("add_space_prefix", "tokenizer.ggml.add_space_prefix"),
                      ("chat_template", "tokenizer.chat_template")):
        v = val(name)
        if v is not None:
            k[key] = v
    return k


def hf_of_gguf(k):
    """The Hugging Face tokenizer.json a GGUF tokenizer's keys describe (tok_gguf.c builds the same)."""
    tokens, types = k["tokens"], k["types"]
    spm = k["model"] == "llama"
    addedt = (T.CONTROL, T.UNKNOWN, T.USER_DEFINED)
    first = {}
    for i, t in enumerate(tokens):
        first.setdefault(t, i)
    vocab = dict(first)  # every token (the first id of a repeated string), added ones included
    j = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "pre_tokenizer": None,
         "post_processor": None, "decoder": None}
    if spm:
        prefix = k.get("add_space_prefix", True)
        part = lambda i: i is not None and types[i] in (T.NORMAL, T.USER_DEFINED)  # noqa: E731
        cands = sorted((i for i, t in enumerate(tokens) if types[i] == T.NORMAL and len(t.encode()) > 1),
                       key=lambda i: (-k["scores"][i], i))
        merges = []
        for i in cands:
            t = tokens[i]
            for c in range(1, len(t)):
                a, b = first.get(t[:c]), first.get(t[c:])
                if part(a) and part(b):
                    merges.append([tokens[a], tokens[b]])
        unk = k.get("unk")
        if unk is None:
            unk = next((i for i, ty in enumerate(types) if ty == T.UNKNOWN), None)
        j["model"] = {"type": "BPE", "dropout": None, "unk_token": tokens[unk] if unk is not None else None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                      "byte_fallback": True, "ignore_merges": False, "vocab": vocab, "merges": merges}
        norms = ([{"type": "Prepend", "prepend": SP}] if prefix else []) + [
            {"type": "Replace", "pattern": {"String": " "}, "content": SP}]
        j["normalizer"] = {"type": "Sequence", "normalizers": norms}
        decs = [{"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}] + ([{"type": "Strip", "content": " ", "start": 1, "stop": 0}] if prefix else [])
        j["decoder"] = {"type": "Sequence", "decoders": decs}
    else:
        rx, nfc, ignore = PRE[k["pre"]]
        merges = [m.split(" ", 1) for m in k["merges"]]
        j["model"] = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore, "vocab": vocab, "merges": merges}
        if nfc:
            j["normalizer"] = {"type": "NFC"}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": rx}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
        j["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    j["added_tokens"] = [mtf.added(tokens[i], i, special=types[i] != T.USER_DEFINED, normalized=False)
                         for i in range(len(tokens)) if types[i] in addedt]
    add_bos = k.get("add_bos", spm or k.get("pre") == "llama-bpe")
    single = []
    specials = {}
    if add_bos and "bos" in k:
        single.append({"SpecialToken": {"id": "bos", "type_id": 0}})
        specials["bos"] = {"id": "bos", "ids": [k["bos"]], "tokens": [tokens[k["bos"]]]}
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    if k.get("add_eos") and "eos" in k:
        single.append({"SpecialToken": {"id": "eos", "type_id": 0}})
        specials["eos"] = {"id": "eos", "ids": [k["eos"]], "tokens": [tokens[k["eos"]]]}
    if specials:
        j["post_processor"] = {"type": "TemplateProcessing", "single": single, "pair": single,
                               "special_tokens": specials}
    return j


def write_model_gguf(path, model, k):
    """model's weights and llama.* metadata with the tokenizer keys k (a model
    file with nothing beside it, for `tide run` and `tide chat`)."""
    r = gguf.GGUFReader(model)
    w = gguf.GGUFWriter(path, arch=r.fields["general.architecture"].contents())
    for name, fld in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        v = fld.contents()
        if fld.types[0] == gguf.GGUFValueType.STRING:
            w.add_string(name, v)
        elif fld.types[0] == gguf.GGUFValueType.UINT32:
            w.add_uint32(name, v)
        elif fld.types[0] == gguf.GGUFValueType.FLOAT32:
            w.add_float32(name, v)
        else:
            raise SystemExit("%s: key %s of type %s not copied" % (model, name, fld.types))
    write_tok_keys(w, k)
    for t in r.tensors:
        w.add_tensor(t.name, t.data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def without_bytes(k):
    """k less its <0xNN> byte tokens (ids renumbered): a vocabulary small enough
    for the tiny model's embedding."""
    keep = [i for i, t in enumerate(k["types"]) if t != T.BYTE]
    new = {old: i for i, old in enumerate(keep)}
    out = dict(k)
    out["tokens"] = [k["tokens"][i] for i in keep]
    out["types"] = [k["types"][i] for i in keep]
    out["scores"] = [k["scores"][i] for i in keep]
    for key in ("bos", "eos", "unk", "pad", "eot"):
        if key in k:
            out[key] = new[k[key]]
    return out


def differs(exp, src):
    out = []
    for e, s in zip(exp["cases"], src["cases"]):
        modes = [m for m in ("ids", "ids_plain", "ids_bos") if e[m] != s[m]]
        if modes:
            out.append({"name": e["name"], "modes": modes})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(FIX, "gguf-tok"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    text = os.path.join(FIX, "text")
    cs = json.load(open(os.path.join(text, "cases.json"), encoding="utf-8"))["cases"]
    mixed = open(os.path.join(text, "mixed.txt"), encoding="utf-8", newline="").read()
    srcs = [(n, os.path.join(text, n), None) for n in ("bpe-llama3", "bpe-gpt2", "bpe-qwen2", "sp-llama2",
                                                       "sp-metaspace")]
    srcs += [("chat-" + n, os.path.join(FIX, "chat", n), n) for n in ("chatml", "gemma", "llama2", "llama3",
                                                                       "mistral", "zephyr")]
    for name, d, chat in srcs:
        odir = os.path.join(a.out, name)
        os.makedirs(odir, exist_ok=True)
        path = os.path.join(odir, "tokenizer.gguf")
        write_gguf(path, extract(d))
        k = read_gguf(path)
        j = hf_of_gguf(k)
        tok = Tokenizer.from_str(json.dumps(j))
        if chat is None:
            exp = mtf.record(j, cs, mixed)
            src = load(d, "expected.json")
            exp["differs_from_source"] = differs(exp, src)
            with open(os.path.join(odir, "expected.json"), "w", encoding="utf-8") as f:
                f.write("{\"cases\":[\n")
                f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in exp["cases"]))
                f.write("\n],\n\"mixed\":%s,\n\"decode\":%s,\n\"differs_from_source\":%s,\n"
                        "\"tokenizers_version\":%s}\n" % (
                            json.dumps(exp["mixed"]), json.dumps(exp["decode"], ensure_ascii=False),
                            json.dumps(exp["differs_from_source"], ensure_ascii=False),
                            json.dumps(tokenizers.__version__)))
            same_mixed = all(exp["mixed"][m] == src["mixed"][m] for m in ("ids", "ids_plain"))
            print("%-18s %-5s %5d tokens; cases differing from the source fixture: %s; mixed.txt %s" % (
                name, k["model"], len(k["tokens"]), [x["name"] for x in exp["differs_from_source"]] or "none",
                "same" if same_mixed else "DIFFERS"))
        else:
            src = load(d, "expected.json")
            out = {"family": src["family"], "cases": []}
            bad = []
            for c in src["cases"]:
                if "text" not in c:
                    continue
                tok.encode_special_tokens = False
                ids = tok.encode(c["text"], add_special_tokens=False).ids
                out["cases"].append({"name": c["name"], "ids": ids})
                if ids != c["ids"]:
                    bad.append(c["name"])
            out["differs_from_source"] = bad
            out["tokenizers_version"] = tokenizers.__version__
            with open(os.path.join(odir, "expected.json"), "w", encoding="utf-8") as f:
                json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
                f.write("\n")
            print("%-18s %-5s %5d tokens; chat renders whose ids differ from the source fixture: %s" % (
                name, k["model"], len(k["tokens"]), bad or "none"))
    # a model with its tokenizer in one file: tiny-f16-sharded's weights
    # (tests/fixtures/gguf, scripts/make_gguf_fixtures.py; vocabulary 200)
    # with chat/llama2's tokenizer less its byte tokens (115 ids) and template
    k = without_bytes(extract(os.path.join(FIX, "chat", "llama2")))
    path = os.path.join(a.out, "tiny-chat.gguf")
    write_model_gguf(path, os.path.join(FIX, "gguf", "tiny-f16-sharded.gguf"), k)
    print("%-18s tiny-f16-sharded's weights, %d tokens, the llama2 template" % ("tiny-chat.gguf", len(k["tokens"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
