#!/usr/bin/env python3
"""make_chat_fixtures.py - chat-template reference fixtures from transformers.

What it makes: for each chat-template family tide formats in C
(src/text/chat.c), a tiny tokenizer directory whose tokenizer_config.json
holds a Jinja chat template written here to reproduce that family's published
prompt format, and what transformers' apply_chat_template renders with it, so
that tests/test_chat.c can check tide's formatting byte for byte against the
Jinja rendering.

How to run (needs python3 with `tokenizers` and `transformers`; seconds):

    python3 scripts/make_chat_fixtures.py              # writes tests/fixtures/chat/
    python3 scripts/make_chat_fixtures.py --out DIR

CI never runs this script: the files are committed and the C test reads them.

The families and the variant each template reproduces (system handling first):
    llama2   Llama 2 chat. A leading system message goes inside the first
             [INST] as "<<SYS>>\\n" + system + "\\n<</SYS>>\\n\\n" before the user's
             text (the two stripped together); every user turn is BOS +
             "[INST] " + text.strip() + " [/INST]", every assistant turn
             " " + text.strip() + " " + EOS. Roles must
             alternate user/assistant after the optional system message; a
             system message elsewhere raises. No generation prompt (the prompt
             already ends with [/INST]).
    llama3   Llama 3 Instruct. BOS, then per message
             "<|start_header_id|>" + role + "<|end_header_id|>\\n\\n" +
             text|trim + "<|eot_id|>"; any role, in any order; the generation
             prompt is the assistant's header. No default system prompt.
    chatml   ChatML as the Qwen and OpenHermes-style models write it:
             "<|im_start|>" + role + "\\n" + text + "<|im_end|>\\n" per message,
             text untouched, any role, no BOS, no default system prompt;
             generation prompt "<|im_start|>assistant\\n".
    mistral  Mistral Instruct v0.1/v0.2 ("<s>[INST] {user} [/INST]{answer}</s>"):
             BOS once; user "[INST] " + text + " [/INST]"; assistant text + EOS,
             nothing trimmed. A leading system message is put before the first
             user's text followed by "\\n\\n"; a system message elsewhere and
             roles that do not alternate raise. No generation prompt.
    zephyr   Zephyr / TinyLlama chat: "<|" + role + "|>\\n" + text + EOS + "\\n"
             per message (system, user, assistant, any order; another role
             raises); generation prompt "<|assistant|>\\n".
    gemma    Gemma 3 style: BOS; "<start_of_turn>" + role + "\\n" + text|trim +
             "<end_of_turn>\\n" with the assistant's role written "model"; a
             leading system message is put, untrimmed and followed by "\\n\\n",
             at the start of the first user turn (Gemma 1 and 2 templates
             raise on it instead); roles must alternate; generation prompt
             "<start_of_turn>model\\n".

Tokenizers: trained here (fixed seed, no download) with the `tokenizers`
library in the forms tide reads (scripts/make_text_fixtures.py's builders),
small (a few hundred ids), with the family's special tokens as added tokens:
byte-level BPE for llama3 and chatml, SentencePiece-style BPE with byte
fallback for the others (gemma with a Replace-only normalizer and <bos>/<eos>,
as Gemma ships).
tokenizer_config.json names PreTrainedTokenizerFast so that transformers runs
tokenizer.json as it is.

DIR/<family>/expected.json:
    family, transformers_version, and cases[i]: {name, messages: [{role,
    content}], add_generation_prompt} and either text (the rendering) with ids
    (its encoding without added special tokens, which is what tokenize=True
    gives; checked equal to `tokenizers`' own encoding) or error (the message
    the template raised).
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_text_fixtures import (LLAMA3_RE, QWEN2_RE, added, gen_text, template,  # noqa: E402
                                train_bytelevel, train_sentencepiece)

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer, pre_tokenizers  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

# ---------------------------------------------------------------- templates
# Written for these fixtures; each renders its family's prompt format.

LLAMA2 = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set sys_text = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set sys_text = none -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if m['role'] not in ['user', 'assistant'] -%}"
    "{{- raise_exception('a ' ~ m['role'] ~ ' message is allowed only first') -}}"
    "{%- elif (m['role'] == 'user') != (loop.index0 is even) -%}"
    "{{- raise_exception('roles must alternate user/assistant after the optional system message') -}}"
    "{%- endif -%}"
    "{%- set text = m['content'] -%}"
    "{%- if loop.first and sys_text is not none -%}"
    "{%- set text = '<<SYS>>\\n' ~ sys_text ~ '\\n<</SYS>>\\n\\n' ~ text -%}"
    "{%- endif -%}"
    "{%- if m['role'] == 'user' -%}{{- bos_token ~ '[INST] ' ~ text.strip() ~ ' [/INST]' -}}"
    "{%- else -%}{{- ' ' ~ text.strip() ~ ' ' ~ eos_token -}}{%- endif -%}"
    "{%- endfor -%}")

LLAMA3 = (
    "{%- for m in messages -%}"
    "{%- if loop.first -%}{{- bos_token -}}{%- endif -%}"
    "{{- '<|start_header_id|>' ~ m['role'] ~ '<|end_header_id|>\\n\\n' ~ (m['content'] | trim) ~ '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}")

CHATML = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' ~ m['role'] ~ '\\n' ~ m['content'] ~ '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")

MISTRAL = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] ~ '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{{- bos_token -}}"
    "{%- for m in turns -%}"
    "{%- if m['role'] not in ['user', 'assistant'] -%}"
    "{{- raise_exception('a ' ~ m['role'] ~ ' message is allowed only first') -}}"
    "{%- elif (m['role'] == 'user') != (loop.index0 is even) -%}"
    "{{- raise_exception('roles must alternate user/assistant after the optional system message') -}}"
    "{%- endif -%}"
    "{%- if m['role'] == 'user' -%}"
    "{{- '[INST] ' ~ (prefix if loop.first else '') ~ m['content'] ~ ' [/INST]' -}}"
    "{%- else -%}{{- m['content'] ~ eos_token -}}{%- endif -%}"
    "{%- endfor -%}")

ZEPHYR = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ '<|system|>\\n' ~ m['content'] ~ eos_token ~ '\\n' }}"
    "{% elif m['role'] == 'user' %}{{ '<|user|>\\n' ~ m['content'] ~ eos_token ~ '\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ '<|assistant|>\\n' ~ m['content'] ~ eos_token ~ '\\n' }}"
    "{% else %}{{ raise_exception('unknown role ' ~ m['role']) }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")

GEMMA = (
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] ~ '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for m in turns -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 is even) or m['role'] not in ['user', 'assistant'] -%}"
    "{{- raise_exception('roles must alternate user/assistant after the optional system message') -}}"
    "{%- endif -%}"
    "{{- '<start_of_turn>' ~ ('model' if m['role'] == 'assistant' else m['role']) ~ '\\n' -}}"
    "{{- (prefix if loop.first else '') ~ (m['content'] | trim) ~ '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}")

# ---------------------------------------------------------------- conversations

SYSTEM = "  You are a terse assistant.\nAnswer in one line. "
TURNS = [
    ("user", "Hello!  "),
    ("assistant", " Hi \u2014 how can I help?\n"),
    ("user", "Translate: \u00abcaf\u00e9\u00bb \u2192 \u6771\u4eac\nline two\n\n"),
    ("assistant", "\u3000Done.\t"),
    ("user", "\tThanks \U0001F600"),
]


def msgs(pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def conversations():
    base = [("with system", msgs([("system", SYSTEM)] + TURNS)),
            ("without system", msgs(TURNS)),
            ("single user", msgs([("user", "What is 2+2?")]))]
    odd = [("assistant first", msgs([("assistant", "I start."), ("user", "Fine.")])),
           ("two users", msgs([("user", "one"), ("user", "two")])),
           ("system later", msgs([("user", "hi"), ("system", "be brief"), ("user", "again")])),
           ("system only", msgs([("system", "You are helpful.")])),
           ("empty content", msgs([("user", ""), ("assistant", "  ")])),
           ("tool role", msgs([("user", "run it"), ("tool", "{\"ok\": true}")]))]
    out = []
    for name, m in base:
        for gen in (False, True):
            out.append({"name": "%s%s" % (name, ", generation prompt" if gen else ""), "messages": m,
                        "add_generation_prompt": gen})
    for name, m in odd:
        out.append({"name": name, "messages": m, "add_generation_prompt": True})
    return out

# ---------------------------------------------------------------- tokenizers


def specials_at_end(j, specials):
    n = len(j["model"]["vocab"])
    j["added_tokens"] = j["added_tokens"] + [added(s, n + i) for i, s in enumerate(specials)]
    return j


def bytelevel(text, regex, specials, bos):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    j = train_bytelevel(text, 330, pre, [])
    j["added_tokens"] = []
    j = specials_at_end(j, specials)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    if bos:
        ids = {a["content"]: a["id"] for a in j["added_tokens"]}
        j["post_processor"] = template(bos, ids[bos])
    return j


def sentencepiece(text, extra, gemma=False):
    j = train_sentencepiece(text, 330)
    if gemma:  # Gemma: spaces become the marker, nothing prepended
        j["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}
    else:  # Llama 2's form
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}] + ([] if gemma else [{"type": "Strip", "content": " ", "start": 1, "stop": 0}])}
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    j = specials_at_end(j, extra)
    bos = "<s>"
    if gemma:  # Gemma's names for BOS and EOS
        names = {"<s>": "<bos>", "</s>": "<eos>"}
        j["model"]["vocab"] = {names.get(k, k): v for k, v in j["model"]["vocab"].items()}
        for a in j["added_tokens"]:
            a["content"] = names.get(a["content"], a["content"])
        bos = "<bos>"
    j["post_processor"] = template(bos, 1)
    return j


def families(text):
    sp = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    return {
        "llama2": (sentencepiece(text, []), sp, LLAMA2),
        "llama3": (bytelevel(text, LLAMA3_RE, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                               "<|end_header_id|>", "<|eot_id|>"], "<|begin_of_text|>"),
                   {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, LLAMA3),
        "chatml": (bytelevel(text, QWEN2_RE, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None),
                   {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, CHATML),
        "mistral": (sentencepiece(text, []), sp, MISTRAL),
        "zephyr": (sentencepiece(text, []), sp, ZEPHYR),
        "gemma": (sentencepiece(text, ["<start_of_turn>", "<end_of_turn>"], gemma=True),
                  {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>"}, GEMMA),
    }


def record(d, raw, cs):
    tok = AutoTokenizer.from_pretrained(d)
    ref = Tokenizer.from_str(json.dumps(raw))
    out = []
    for c in cs:
        rec = dict(c)
        try:
            text = tok.apply_chat_template(c["messages"], tokenize=False,
                                           add_generation_prompt=c["add_generation_prompt"])
        except Exception as e:  # the template's raise_exception
            rec["error"] = str(e)
            out.append(rec)
            continue
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, (d, c["name"])
        if text:  # tokenize=True gives the same ids (an empty text it refuses)
            enc = tok.apply_chat_template(c["messages"], tokenize=True,
                                          add_generation_prompt=c["add_generation_prompt"])
            assert list(enc["input_ids"] if hasattr(enc, "keys") else enc) == ids, (d, c["name"])
        rec["text"] = text
        rec["ids"] = ids
        out.append(rec)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                                  "fixtures", "chat"))
    a = ap.parse_args()
    text = gen_text(random.Random(25), 60_000)
    cs = conversations()
    for fam, (j, cfg, tmpl) in families(text).items():
        d = os.path.join(a.out, fam)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        cfg = dict(cfg, tokenizer_class="PreTrainedTokenizerFast", chat_template=tmpl)
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=1)
            f.write("\n")
        rec = record(d, j, cs)
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            f.write("{\"family\":%s,\"transformers_version\":%s,\"cases\":[\n" % (
                json.dumps(fam), json.dumps(transformers.__version__)))
            f.write(",\n".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rec))
            f.write("\n]}\n")
        print("%-8s vocab %d, %d cases, %d raise" % (fam, len(j["model"]["vocab"]) + len(j["added_tokens"]),
                                                      len(rec), sum("error" in r for r in rec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
