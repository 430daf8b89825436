#!/usr/bin/env python3
"""make_builtin_tokenizer.py - the built-in model's tokenizer.

The built-in model (a synthetic checkpoint tide generates when no --model is
given) needs a tokenizer so that `tide run --prompt "Hello"` and `tide chat`
work with no model directory. This script trains one with the `tokenizers`
library on tide's own text (its README files, sources and scripts: text
written for the project), with fixed settings, and writes it into
data/tokenizer/, from where the build embeds it into the `tide` binary.

The tokenizer: byte-level BPE with Llama 3's split regex (every byte
encodable, no unknown token), 4096 ids: 4092 learned and four special tokens
after them, <|begin_of_text|> (BOS, added in front of a prompt by the
post-processor), <|end_of_text|>, <|im_start|> and <|im_end|> (ChatML turns;
the chat template is ChatML's). Both <|end_of_text|> and <|im_end|> end
generation.

How to run (needs python3 with `tokenizers`; a few seconds):

    python3 scripts/make_builtin_tokenizer.py            # writes data/tokenizer/

The files are committed; builds never run this script.
"""
import argparse
import json
import os
import subprocess

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 4096
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}"
                 "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                 "{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def corpus(root):
    """The project's tracked text files (README files, sources, scripts), in
    path order so that the training input is the same on every machine."""
    files = subprocess.run(["git", "-C", root, "ls-files"], check=True, capture_output=True,
                           text=True).stdout.split("\n")
    keep = (".md", ".c", ".h", ".cu", ".py", ".sh", ".txt")
    lines = []
    for f in sorted(files):
        if not f.endswith(keep) or f.startswith("tests/fixtures/") or f.startswith("data/"):
            continue
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            lines.extend(fh.read().split("\n"))
    return lines


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(root, "data", "tokenizer"))
    args = ap.parse_args()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=VOCAB - len(SPECIALS), show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(root), trainer=tr)
    j = json.loads(tok.to_str())
    n = len(j["model"]["vocab"])
    j["added_tokens"] = [{"id": n + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    j["model"]["ignore_merges"] = True
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    bos = SPECIALS[0]
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": bos, "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {bos: {"id": bos, "ids": [n], "tokens": [bos]}}}
    cfg = {"bos_token": bos, "eos_token": "<|end_of_text|>", "model_max_length": 2048,
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                    for a in j["added_tokens"]}}
    gen = {"bos_token_id": n, "eos_token_id": [n + 1, n + 3]}
    os.makedirs(args.out, exist_ok=True)
    for name, obj, indent in (("tokenizer.json", j, None), ("tokenizer_config.json", cfg, 2),
                              ("generation_config.json", gen, 2)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=indent, separators=(",", ":") if indent is None else None)
            f.write("\n")
    print("%s: %d ids (%d learned, %d special)" % (args.out, n + len(SPECIALS), n, len(SPECIALS)))


if __name__ == "__main__":
    main()
