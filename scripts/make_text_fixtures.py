#!/usr/bin/env python3
"""make_text_fixtures.py - tokenizer reference fixtures from Hugging Face `tokenizers`.

What it makes: small tokenizers of the kinds tide reads (trained here on a
generated corpus with the `tokenizers` library, fixed seeds, no download), and
what `tokenizers` computes with them for a corpus of awkward strings, so that
tests/test_tokenizer.c can check tide's encoder and decoder against an
independent implementation.

How to run (needs python3 with `tokenizers`; a few seconds):

    python3 scripts/make_text_fixtures.py              # writes tests/fixtures/text/
    python3 scripts/make_text_fixtures.py --out DIR

CI never runs this script: the files are committed and the C test reads them.

Tokenizers (DIR/<name>/tokenizer.json + tokenizer_config.json):
    bpe-llama3   byte-level BPE: Split with Llama 3's regex (Isolated), then
                 ByteLevel without its own regex; ignore_merges; merges as
                 [a, b] pairs; TemplateProcessing "<|begin_of_text|> $A";
                 generation_config.json with two EOS ids
    bpe-gpt2     byte-level BPE: ByteLevel with GPT-2's built-in regex; merges
                 as "a b" strings; a special "<mask>" with lstrip and a
                 non-special added token; special_tokens_map.json for BOS/EOS
    bpe-qwen2    byte-level BPE as Qwen2 ships it: NFC normalizer, Split with
                 Qwen2's regex (single digits), ByteLevel post-processor (no
                 BOS), ChatML special tokens
    sp-llama2    SentencePiece-style BPE as Llama 2 / TinyLlama ship it:
                 normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer,
                 byte_fallback <0xNN> tokens, unk with fuse_unk, decoder
                 Replace/ByteFallback/Fuse/Strip, TemplateProcessing "<s> $A"
    sp-metaspace the same model in the Metaspace pre-tokenizer form (prepend_scheme
                 "first", split false; decoder Metaspace, ByteFallback, Fuse),
                 with ChatML specials ("<|im_end|>" with rstrip) and a
                 non-special added token

Reference files (DIR/):
    cases.json   the awkward strings: {"name", "text"} or, for invalid UTF-8 and
                 text with NUL, {"name", "hex"} (the bytes; `tokenizers` is given their
                 decoding with U+FFFD for each maximal invalid subpart, which is
                 what tide does with invalid input)
    mixed.txt    ~100 KB of mixed text (encoded whole)
    <name>/expected.json
        cases[i]: ids (add_special_tokens=False, special tokens recognised),
                  ids_plain (special-token text encoded as ordinary text:
                  encode_special_tokens=True), ids_bos (add_special_tokens=True),
                  text (decode(ids)), text_skip (skip_special_tokens=True);
                  text_hex / text_skip_hex instead where the text holds NUL
        mixed:    count and FNV-1a 64 of the ids of mixed.txt in both modes
                  (little-endian int32 ids hashed byte by byte)
        decode:   id lists whose bytes are not valid UTF-8, and their decoding
        tokenizers_version: the library's version that recorded them
    variants.json  pipeline options the five tokenizers do not use (Split
                 behaviors, Digits, Metaspace schemes, unk handling, single_word, rstrip
                 and normalized added tokens, decoders...), each as edits of one
                 of them, with the ids of every case (both special-token modes
                 where tokens are added) or, for decoders, the decoding of its
                 ids with BOS
"""
import argparse
import json
import os
import random
import sys

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
            r"|\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for on that with as by at from this it be are an or which have not "
         "tokenizer model memory device plan tensor offload budget layer weight cache token text string "
         "quick brown fox jumps over lazy dog hello world python function return value number").split()
ACCENTED = ["café", "naïve", "résumé", "Ångström", "façade", "über", "señor", "Zürich", "déjà vu", "coöperate"]
CJK = ["東京", "日本語のテキスト", "中文分词", "한국어", "漢字かな交じり文", "北京欢迎你"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇫🇷", "🤖"]
CODE = ["def f(x):\n    return x * 2\n", "int main(void) { return 0; }", "for (i = 0; i < n; ++i) a[i] += b[i];",
        "if x != None and y >= 3:\n\tprint(f'{x!r}')", "#include <stdio.h>", "SELECT * FROM t WHERE id = 42;"]


def gen_text(rng, n_chars):
    out = []
    size = 0
    while size < n_chars:
        r = rng.random()
        if r < 0.55:
            s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            s = s[0].upper() + s[1:] + rng.choice([".", ",", "!", "?", ";", ":"])
        elif r < 0.65:
            s = " ".join(rng.choice(ACCENTED) for _ in range(rng.randint(1, 4)))
        elif r < 0.72:
            s = "".join(rng.choice(CJK) for _ in range(rng.randint(1, 3)))
        elif r < 0.76:
            s = rng.choice(EMOJI) + " " + rng.choice(WORDS)
        elif r < 0.84:
            s = rng.choice(CODE)
        elif r < 0.92:
            s = str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice([" ", ".", ",", "%", " km"])
        else:
            s = rng.choice(["\n", "\n\n", "\t", "  ", "   ", " \n "])
        out.append(s)
        out.append(rng.choice([" ", " ", " ", "\n", ""]))
        size += len(s) + 1
    return "".join(out)


def cases():
    c = [
        ("empty", ""),
        ("space", " "),
        ("spaces", "     "),
        ("whitespace run", "a  b   c    d"),
        ("leading space", " Hello world"),
        ("trailing spaces", "Hello world   "),
        ("newlines", "line one\nline two\n\nline four\n"),
        ("crlf", "a\r\nb\r\n"),
        ("tabs", "\tindented\t\ttwice\t"),
        ("mixed whitespace", " \t \n \u00a0 \u2003x\u3000y"),
        ("only newlines", "\n\n\n"),
        ("plain", "The quick brown fox jumps over the lazy dog."),
        ("contractions", "I'm sure you'll see it's what they've done, isn't it? We'D"),
        ("nfc accents", "café naïve résumé Ångström"),
        ("nfd accents", "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m"),
        ("combining only", "\u0301\u0308"),
        ("nfc edge cases", "A\u030a \u212b \u2126 \u1100\u1161\u11a8 e\u0301\u0316 \u0958 \u0344 \uf900 x\u0345"),
        ("cjk", "東京は日本の首都です。北京欢迎你！한국어 텍스트"),
        ("emoji", "I like 😀 and 👍🏽!"),
        ("zwj family", "family: 👨‍👩‍👧‍👦 flag: 🏳️‍🌈 🇫🇷"),
        ("digits", "1 12 123 1234 12345 123456789012345"),
        ("decimals", "3.14159 and -2.5e10, 1,000,000"),
        ("code", "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n"),
        ("c code", "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}"),
        ("punctuation", "...!!!???---___***&&&^^^%%%$$$###@@@"),
        ("urls", "see https://example.org/a/b?c=d&e=f#g and mail@example.org"),
        ("rare chars", "Ω ∑ ∞ ≈ ≠ ← → ♠ ♣ ♥ ♦ ℃ ㎞"),
        ("bmp edge", "\ufeffBOM \ufffd replacement \uffff"),
        ("astral", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 𐍈"),
        ("control chars", "a\x00b\x01c\x7fd\x1b[0m"),
        ("long word", "pneumonoultramicroscopicsilicovolcanoconiosis" * 3),
        ("long repeat", "a" * 300),
        ("sp marker in text", "▁already ▁marked"),
        ("special bos", "<s>Hello"),
        ("special inside", "Hello <s> world</s> again"),
        ("special adjacent", "<s><s></s>"),
        ("special llama3", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"),
        ("special partial", "<|eot_id <|eot_id|x <s < /s>"),
        ("special endoftext", "one<|endoftext|>two <|endoftext|> three"),
        ("mask lstrip", "Paris is the <mask> of France.   <mask>"),
        ("added non-special", "a tidetoken b tidetokentidetoken"),
        ("chatml", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"),
    ]
    # JSON strings cannot carry NUL through every reader: such text goes as bytes too
    out = [{"name": n, "hex": t.encode().hex()} if "\x00" in t else {"name": n, "text": t} for n, t in c]
    out += [
        {"name": "invalid lone continuation", "hex": b"ab\x80cd".hex()},
        {"name": "invalid truncated 3-byte", "hex": b"x\xe4\xb8 y".hex()},
        {"name": "invalid ff", "hex": b"\xff\xfe hello".hex()},
        {"name": "invalid surrogate", "hex": b"a\xed\xa0\x80b".hex()},
        {"name": "invalid overlong", "hex": b"\xc0\xafz\xe0\x80\xaf".hex()},
        {"name": "invalid at end", "hex": "😀".encode()[:3].hex()},
    ]
    return out


def case_text(c):
    if "hex" in c:
        return bytes.fromhex(c["hex"]).decode("utf-8", errors="replace")
    return c["text"]


def fnv_ids(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def train_bytelevel(text, vocab_size, pre, specials):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.split("\n"), trainer=tr)
    return json.loads(tok.to_str())


def train_sentencepiece(text, vocab_size):
    specials = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    # characters kept out of the training text are left to byte fallback (the
    # trainer's limit_alphabet would choose among equally rare ones by hash
    # order, which differs from run to run)
    rare = set("👨👩👧👦🏳🌈🇫🇷\u200d\ufe0f한국어텍스트漢字交じ文")
    text = "".join(c for c in text if c not in rare)
    tr = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(text.split("\n"), trainer=tr)
    j = json.loads(tok.to_str())
    # Llama 2's layout: <unk>, <s>, </s> are added tokens; the byte tokens live
    # in the model's vocabulary only.
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in ("<unk>", "<s>", "</s>")]
    return j


def added(content, tid, special=True, lstrip=False, rstrip=False, normalized=None, single_word=False):
    return {"id": tid, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def template(tok, tid):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": tok, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tok: {"id": tok, "ids": [tid], "tokens": [tok]}}}


def make_llama3(text):
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    j = train_bytelevel(text, 1200, pre, [])
    # Llama 3 keeps its special tokens after the vocabulary
    n = len(j["model"]["vocab"])
    j["added_tokens"] = [added(s, n + i) for i, s in enumerate(specials)]
    j["model"]["ignore_merges"] = True
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template("<|begin_of_text|>", n)]}
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True,
           "model_max_length": 8192, "tokenizer_class": "PreTrainedTokenizerFast",
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in j["added_tokens"]}}
    gen = {"bos_token_id": n, "eos_token_id": [n + 1, n + 4]}
    return j, {"tokenizer_config.json": cfg, "generation_config.json": gen}


def make_gpt2(text):
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    j = train_bytelevel(text, 900, pre, ["<|endoftext|>"])
    n = len(j["model"]["vocab"])
    j["added_tokens"].append(added("<mask>", n, lstrip=True))
    j["added_tokens"].append(added("tidetoken", n + 1, special=False))
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    cfg = {"add_prefix_space": False, "model_max_length": 1024, "tokenizer_class": "GPT2Tokenizer"}
    stm = {"bos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": True, "rstrip": False,
                         "single_word": False}, "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    return j, {"tokenizer_config.json": cfg, "special_tokens_map.json": stm}


def make_qwen2(text):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    j = train_bytelevel(text, 800, pre, [])
    n = len(j["model"]["vocab"])
    j["added_tokens"] = [added(s, n + i) for i, s in enumerate(specials)]
    j["normalizer"] = {"type": "NFC"}
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    cfg = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "model_max_length": 32768,
           "tokenizer_class": "Qwen2Tokenizer"}
    return j, {"tokenizer_config.json": cfg}


def make_sp(text):
    base = train_sentencepiece(text, 1000)
    n = len(base["model"]["vocab"])
    llama2 = json.loads(json.dumps(base))
    llama2["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    llama2["pre_tokenizer"] = None
    llama2["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    llama2["post_processor"] = template("<s>", 1)
    llama2["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in llama2["model"]["merges"]]
    cfg2 = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "legacy": True, "model_max_length": 2048, "tokenizer_class": "LlamaTokenizer"}
    meta = json.loads(json.dumps(base))
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    meta["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}
    meta["post_processor"] = template("<s>", 1)
    meta["added_tokens"] += [added("<|im_start|>", n), added("<|im_end|>", n + 1, rstrip=True),
                             added("tidetoken", n + 2, special=False)]
    def tok_obj(content):  # the older tokenizer_config.json form of a token
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False, "rstrip": False,
                "single_word": False}
    cfgm = {"add_bos_token": True, "bos_token": tok_obj("<s>"), "eos_token": tok_obj("<|im_end|>"),
            "tokenizer_class": "LlamaTokenizer"}
    return (llama2, {"tokenizer_config.json": cfg2}), (meta, {"tokenizer_config.json": cfgm})


def record(j, cs, mixed):
    tok = Tokenizer.from_str(json.dumps(j))
    exp = {"cases": [], "decode": []}
    for c in cs:
        s = case_text(c)
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=False).ids
        bos = tok.encode(s, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        rec = {"name": c["name"], "ids": ids, "ids_plain": plain, "ids_bos": bos}
        for key, skip in (("text", False), ("text_skip", True)):
            d = tok.decode(ids, skip_special_tokens=skip)
            if "\x00" in d:
                rec[key + "_hex"] = d.encode().hex()
            else:
                rec[key] = d
        exp["cases"].append(rec)
    m = {}
    for mode in ("ids", "ids_plain"):
        tok.encode_special_tokens = mode == "ids_plain"
        ids = tok.encode(mixed, add_special_tokens=False).ids
        m[mode] = {"count": len(ids), "fnv": fnv_ids(ids)}
        if mode == "ids":
            assert tok.decode(ids, skip_special_tokens=False) == mixed, "mixed text does not round-trip"
    exp["mixed"] = m
    # id lists whose bytes are not whole UTF-8 sequences (byte-level pieces
    # of "é" and "😀" cut short, or byte-fallback tokens)
    # Byte-level only: `tokenizers`' ByteFallback decoder turns a whole run of
    # byte tokens that is not valid UTF-8 into one U+FFFD per byte (valid
    # characters in the run included), which a streaming decoder cannot do;
    # tide replaces each maximal invalid subpart instead (test_tokenizer.c
    # checks that rule by hand).
    vocab = j["model"]["vocab"]
    if j["decoder"]["type"] == "ByteLevel":
        for lst in [["Ã"], ["ð", "Ł"], ["Ġ", "©"], ["ð", "Ł", "ĺ"], ["©", "A"]]:
            ids = [vocab[t] for t in lst]
            exp["decode"].append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
    return exp


# Variants: a fixture's tokenizer.json with parts replaced ("set": dotted key ->
# value; "add": added tokens appended), each pipeline option tide reads that
# the five tokenizers above do not use. test_tokenizer.c applies the same
# edits and compares with the ids (and, for decoders, the text) recorded here.
def variants():
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    rep = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}
    v = [("bytelevel add_prefix_space", "bpe-gpt2",
          {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                             "use_regex": True}}, [])]
    for beh in ["Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        for inv in [False, True]:
            v.append(("split %s%s" % (beh, " inverted" if inv else ""), "bpe-llama3", {"pre_tokenizer": {
                "type": "Sequence", "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": "\\s+|\\p{P}"}, "behavior": beh, "invert": inv}, bl]}},
                []))
    v.append(("split string, then ByteLevel's regex", "bpe-llama3", {"pre_tokenizer": {
        "type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": "\n"}, "behavior": "MergedWithNext", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}}, []))
    for ind in [True, False]:
        v.append(("digits%s" % (" individual" if ind else ""), "bpe-gpt2", {"pre_tokenizer": {
            "type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": ind},
                                                  {"type": "ByteLevel", "add_prefix_space": False,
                                                   "trim_offsets": True, "use_regex": True}]}}, []))
    for sch in ["always", "never", "first"]:
        v.append(("metaspace %s split" % sch, "sp-metaspace", {"pre_tokenizer": {
            "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": sch, "split": True}}, []))
    v.append(("metaspace legacy add_prefix_space", "sp-metaspace", {"pre_tokenizer": {
        "type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}}, []))
    v.append(("normalizer Replace regex", "sp-llama2", {"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"Regex": "\\s+"},
                                                   "content": "\u2581"}]}}, []))
    v.append(("no ignore_merges", "bpe-llama3", {"model.ignore_merges": False}, []))
    v.append(("unk without fusing, no byte fallback", "sp-llama2",
              {"model.fuse_unk": False, "model.byte_fallback": False}, []))
    v.append(("unk fused, no byte fallback", "sp-llama2", {"model.byte_fallback": False}, []))
    v.append(("no unk, no byte fallback", "sp-llama2", {"model.byte_fallback": False, "model.unk_token": None}, []))
    # ids one past where `tokenizers` puts them (902, 903): it assigns its own
    v.append(("single_word and rstrip tokens", "bpe-gpt2", {}, [
        added("the", 903, special=False, single_word=True, normalized=False),
        added("<rs>", 904, rstrip=True)]))
    v.append(("normalized added tokens", "sp-llama2", {}, [added("world", 1000, special=False)]))
    v.append(("normalized added token under NFC", "bpe-qwen2", {}, [added("cafe\u0301", 803, special=False)]))
    v.append(("decoder none", "sp-llama2", {"decoder": None}, []))
    v.append(("decoder Metaspace always", "sp-metaspace", {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}}, []))
    v.append(("decoder Metaspace never", "sp-metaspace", {"decoder": {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}}, []))
    v.append(("decoder Strip 2", "sp-llama2", {"decoder": {"type": "Sequence", "decoders": [
        rep, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 0}]}},
              []))
    return v


def apply_variant(j, sets, adds):
    j = json.loads(json.dumps(j))
    for k, val in sets.items():
        o = j
        path = k.split(".")
        for p in path[:-1]:
            o = o[p]
        o[path[-1]] = val
    j["added_tokens"] = j["added_tokens"] + adds
    return j


def record_variant(j, cs, sets, adds):
    """A decoder variant records the decoding of each case's ids with BOS (its
    encoding is the base's); an added-token variant the ids in both modes;
    any other the ids."""
    tok = Tokenizer.from_str(json.dumps(j))
    dec_only = list(sets) == ["decoder"]
    rec = {"text": []} if dec_only else {"ids": [], "ids_plain": []} if adds else {"ids": []}
    for c in cs:
        s = case_text(c)
        tok.encode_special_tokens = False
        if dec_only:
            rec["text"].append(tok.decode(tok.encode(s, add_special_tokens=True).ids, skip_special_tokens=False))
            continue
        rec["ids"].append(tok.encode(s, add_special_tokens=False).ids)
        if adds:
            tok.encode_special_tokens = True
            rec["ids_plain"].append(tok.encode(s, add_special_tokens=False).ids)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                  "fixtures", "text"))
    a = ap.parse_args()
    rng = random.Random(15)
    train = gen_text(rng, 300_000)
    mixed = gen_text(random.Random(1515), 100_000)
    cs = cases()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump({"cases": cs}, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(a.out, "mixed.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(mixed)
    sp2, spm = make_sp(train)
    toks = {"bpe-llama3": make_llama3(train), "bpe-gpt2": make_gpt2(train), "bpe-qwen2": make_qwen2(train),
            "sp-llama2": sp2, "sp-metaspace": spm}
    for name, (j, extra) in toks.items():
        d = os.path.join(a.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        for fn, obj in extra.items():
            with open(os.path.join(d, fn), "w", encoding="utf-8") as f:
                json.dump(obj, f, ensure_ascii=False, indent=1)
                f.write("\n")
        exp = record(j, cs, mixed)
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            f.write("{\"cases\":[\n")
            f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in exp["cases"]))
            f.write("\n],\n\"mixed\":%s,\n\"decode\":%s,\n\"tokenizers_version\":%s}\n" % (
                json.dumps(exp["mixed"]), json.dumps(exp["decode"], ensure_ascii=False),
                json.dumps(tokenizers.__version__)))
        print("%-13s vocab %d, %d added, mixed.txt -> %d ids" %
              (name, len(j["model"]["vocab"]), len(j["added_tokens"]), exp["mixed"]["ids"]["count"]))
    out = []
    for name, base, sets, adds in variants():
        rec = record_variant(apply_variant(toks[base][0], sets, adds), cs, sets, adds)
        out.append(json.dumps({"name": name, "base": base, "set": sets, "add": adds, **rec}, ensure_ascii=False,
                              separators=(",", ":")))
    with open(os.path.join(a.out, "variants.json"), "w", encoding="utf-8") as f:
        f.write("{\"variants\":[\n" + ",\n".join(out) + "\n]}\n")
    print("%d variants" % len(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
