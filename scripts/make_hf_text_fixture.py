#!/usr/bin/env python3
"""make_hf_text_fixture.py - a whole Hugging Face model directory, text in and text out.

What it makes: tests/fixtures/hf-text/, a tiny randomly initialised
LlamaForCausalLM (float32, fixed seed) saved with save_pretrained beside a
byte-level BPE tokenizer trained here with `tokenizers`, a tokenizer_config.json
with a ChatML chat template and a generation_config.json: the files a Hub
checkpoint ships. With it, what transformers prints for a few prompts
(tokenizer -> generate -> decode, greedy) and for one chat (apply_chat_template
-> generate -> decode), so that tests/cli_text_hf.sh can check that `tide run
--prompt TEXT` and `tide run --chat` print exactly that text.

How to run (needs python3 with torch, transformers and tokenizers; CPU, seconds):

    python3 scripts/make_hf_text_fixture.py               # writes tests/fixtures/hf-text/
    python3 scripts/make_hf_text_fixture.py --out DIR

CI never runs this script: the files are committed and the test reads them.

Files (DIR/):
    config.json, model.safetensors   save_pretrained, float32, transformers 5 layout
                                     plus the classic "torch_dtype" / "rope_theta"
    tokenizer.json                   byte-level BPE: Split with Llama 3's regex
                                     (Isolated) + ByteLevel, 256 byte tokens and
                                     merges up to N_BPE ids, then the specials
                                     <|begin_of_text|> <|end_of_text|> <|im_start|>
                                     <|im_end|>; TemplateProcessing adds BOS
    tokenizer_config.json            bos/eos tokens, the ChatML chat_template
    generation_config.json           bos_token_id; eos_token_id = [<|end_of_text|>,
                                     <|im_end|>]
    expected.json                    per case: the prompt (or messages), its ids,
                                     the greedy ids, their decoding, the stop
                                     reason and the smallest top-1/top-2 gap
    cases/<name>.*                   the same, one raw file each, for the shell
                                     test: .prompt (the bytes of the prompt, or of
                                     the user message), .system, .rendered (the
                                     chat template's text), .ids and .tokens (ids
                                     joined by commas), .text (the decoded text,
                                     raw), .json (the text as a JSON string body,
                                     escaped as cJSON escapes it), .stop (the
                                     stop reason: eos or length)

The reference runs in float32, eager attention, as make_fixtures.py's: tide's
f32 path (--matmul f32) differs from it only in summation order and libm.
Generation is model.generate(do_sample=False, max_new_tokens=N_NEW) with
eos_token_id = the ids tide stops on (tokenizer_config.json's eos_token and
every id of generation_config.json's eos_token_id; a chat also stops on the
template's end of turn, <|im_end|>, already among them); a stop on one of them
is recorded (the id is the last generated, as both transformers and tide
write it; decode(skip_special_tokens=True) leaves it out of the text). A
manual greedy loop with the KV cache records each step's top-1/top-2 logit
gap and must give the same ids. The seed is accepted only when every case's
smallest gap is >= MIN_GAP and every case generates at least MIN_DISTINCT
different ids (so the text is not one token repeated); otherwise it is bumped
by one.
"""

import argparse
import json
import os
import random
import sys
import warnings

import tokenizers
import torch
import transformers
from tokenizers import Regex, Tokenizer, pre_tokenizers
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_text_fixtures import LLAMA3_RE, added, gen_text, template, train_bytelevel  # noqa: E402

N_BPE = 380  # byte tokens + merges; the specials follow, 384 ids in all
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
N_NEW = 16
MIN_GAP = 1e-3
MIN_DISTINCT = 4
BASE_SEED = 4004
MAX_SEED_TRIES = 200

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=False,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
)

# (name, text): prompts encoded as tokenizer(text) gives them, BOS added
PROMPTS = [
    ("ascii", "The quick brown fox jumps over the lazy dog."),
    ("accents-emoji", "Café naïve résumé, déjà vu à Zürich 😀 👍🏽!"),
    ("code", "for (i = 0; i < n; ++i) a[i] += b[i];"),
    ("multiline", "line one\nline two\n\n\tindented, after a blank line\nend\n"),
]
# (name, system message, user message): apply_chat_template with add_generation_prompt
CHAT = ("chat", "You are a terse assistant.", "Name three colours of the sea.")


def make_tokenizer():
    """tokenizer.json (as a dict), tokenizer_config.json, generation_config.json."""
    text = gen_text(random.Random(44), 120_000)
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    j = train_bytelevel(text, N_BPE, pre, [])
    n = len(j["model"]["vocab"])
    assert n == N_BPE, f"trained {n} ids, wanted {N_BPE}"
    j["added_tokens"] = [added(s, n + i) for i, s in enumerate(SPECIALS)]
    j["model"]["ignore_merges"] = True
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m for m in j["model"]["merges"]]
    j["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        template("<|begin_of_text|>", n)]}
    cfg = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>",
           # transformers 5 ignores the clean-up for BPE tokenizers, transformers 4
           # applies it; false gives the same text with both
           "clean_up_tokenization_spaces": False, "model_max_length": MODEL["max_position_embeddings"],
           "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
           "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                    for a in j["added_tokens"]}}
    gen = {"bos_token_id": n, "eos_token_id": [n + 1, n + 3]}
    return j, cfg, gen


def build(vocab, seed):
    """A random model whose logits are far from zero (make_fixtures.py's scheme):
    linear weights N(0, 0.2), the untied embedding N(0, 1), norm weights
    1 + N(0, 0.1); logits then have a standard deviation of about 1.6."""
    cfg = LlamaConfig(**MODEL, vocab_size=vocab, initializer_range=0.2, attention_bias=False, mlp_bias=False,
                      bos_token_id=vocab - 4, eos_token_id=vocab - 3)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    return model.eval()


def write_json(path, obj, indent=1):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")


def save(d, model, tok_json, tok_cfg, gen_cfg):
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):  # no stale files from an earlier run
        if os.path.isfile(os.path.join(d, f)):
            os.remove(os.path.join(d, f))
    model.save_pretrained(d, safe_serialization=True)
    path = os.path.join(d, "config.json")
    with open(path) as f:
        cj = json.load(f)
    cj.setdefault("torch_dtype", "float32")
    cj["rope_theta"] = cj.get("rope_theta", (cj.get("rope_parameters") or {}).get("rope_theta"))
    with open(path, "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    # the generation config as a Hub checkpoint ships it, not save_pretrained's
    GenerationConfig(**gen_cfg).save_pretrained(d)
    with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False, separators=(",", ":"))
    write_json(os.path.join(d, "tokenizer_config.json"), tok_cfg)


def top2_gap(row):
    t = torch.topk(row, 2).values
    return float(t[0] - t[1])


def greedy(model, prompt, stop_ids):
    """generate() and a manual cached loop: the ids (EOS included when it
    stops), the stop reason and the smallest top-1/top-2 gap of the steps."""
    ids = torch.tensor([prompt], dtype=torch.long)  # (1, T)
    gen, gaps = [], []
    step = model(ids, use_cache=True)
    past, last = step.past_key_values, step.logits[0, -1]  # (V,)
    for _ in range(N_NEW):
        gaps.append(top2_gap(last))
        tok = int(torch.argmax(last))
        gen.append(tok)
        if tok in stop_ids:
            break
        step = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past, last = step.past_key_values, step.logits[0, -1]
    g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=N_NEW,
                       eos_token_id=list(stop_ids), pad_token_id=stop_ids[0], use_cache=True)
    out = g[0, len(prompt):].tolist()
    assert out == gen, f"generate() {out} and the manual loop {gen} differ"
    reason = "eos" if gen[-1] in stop_ids else "length"
    return gen, reason, min(gaps)


def cases(tok):
    """(name, prompt ids, extra fields) for every case, through transformers' tokenizer."""
    out = []
    for name, text in PROMPTS:
        ids = tok(text).input_ids  # add_special_tokens=True: BOS first
        out.append((name, ids, {"prompt": text}))
    name, system, user = CHAT
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = enc["input_ids"] if isinstance(enc, (dict, transformers.BatchEncoding)) else enc
    assert ids == tok(rendered, add_special_tokens=False).input_ids
    out.append((name, list(ids), {"system": system, "prompt": user, "rendered": rendered}))
    return out


def write_cases(d, recs):
    cd = os.path.join(d, "cases")
    os.makedirs(cd, exist_ok=True)
    for f in os.listdir(cd):
        os.remove(os.path.join(cd, f))

    def put(name, ext, s):
        with open(os.path.join(cd, f"{name}.{ext}"), "w", encoding="utf-8", newline="") as f:
            f.write(s)

    for r in recs:
        n = r["name"]
        put(n, "prompt", r["prompt"])
        if "system" in r:
            put(n, "system", r["system"])
            put(n, "rendered", r["rendered"])
        put(n, "ids", ",".join(map(str, r["prompt_ids"])))
        put(n, "tokens", ",".join(map(str, r["generated"])))
        put(n, "text", r["text"])
        put(n, "stop", r["stop_reason"])
        # cJSON and Python escape the same set: " \ \b \f \n \r \t, other
        # controls as \u00xx (lower-case hex), everything else as UTF-8
        put(n, "json", json.dumps(r["text"], ensure_ascii=False)[1:-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "hf-text"))
    a = ap.parse_args()
    torch.set_grad_enabled(False)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # past_key_values' rename
    d = os.path.abspath(a.out)

    tok_json, tok_cfg, gen_cfg = make_tokenizer()
    vocab = len(tok_json["model"]["vocab"]) + len(tok_json["added_tokens"])
    raw = Tokenizer.from_str(json.dumps(tok_json))
    for seed in range(BASE_SEED, BASE_SEED + MAX_SEED_TRIES):
        save(d, build(vocab, seed), tok_json, tok_cfg, gen_cfg)
        tok = AutoTokenizer.from_pretrained(d)
        assert len(tok) == vocab, (len(tok), vocab)
        # what tide stops on: eos_token, then generation_config's eos_token_id
        stop_ids = [tok.convert_tokens_to_ids(tok_cfg["eos_token"])]
        stop_ids += [i for i in gen_cfg["eos_token_id"] if i not in stop_ids]
        model = LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
        assert model.config.vocab_size == vocab and next(model.parameters()).dtype == torch.float32
        recs, ok = [], True
        for name, ids, extra in cases(tok):
            if "rendered" not in extra:  # the library's own encoding agrees
                assert ids == raw.encode(extra["prompt"], add_special_tokens=True).ids
            gen, reason, gap = greedy(model, ids, stop_ids)
            text = tok.decode(gen, skip_special_tokens=True)
            recs.append({"name": name, **extra, "prompt_ids": ids, "generated": gen, "text": text,
                         "stop_reason": reason, "min_top2_gap": gap})
            if gap < MIN_GAP or len(set(gen)) < MIN_DISTINCT:
                print(f"seed {seed}: {name}: gap {gap:.3g}, {len(set(gen))} distinct ids; next seed")
                ok = False
                break
        if ok:
            break
    else:
        sys.exit(f"no seed in {MAX_SEED_TRIES} tries gives every case a gap >= {MIN_GAP}")

    exp = {"seed": seed, "new_tokens": N_NEW, "stop_ids": stop_ids, "compute_dtype": "float32",
           "min_top2_gap": min(r["min_top2_gap"] for r in recs), "cases": recs,
           "torch_version": torch.__version__, "transformers_version": transformers.__version__,
           "tokenizers_version": tokenizers.__version__}
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:  # a case a line
        head = {k: v for k, v in exp.items() if k != "cases"}
        f.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [\n')
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in recs))
        f.write("\n]}\n")
    write_cases(d, recs)

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"tokenizers {tokenizers.__version__}; seed {seed}, vocab {vocab}, stop ids {stop_ids}")
    for r in recs:
        print(f"{r['name']:<14} {len(r['prompt_ids']):>3} prompt ids, {len(r['generated'])} generated "
              f"({r['stop_reason']}), gap {r['min_top2_gap']:.4f}: {r['text']!r}")
    total = 0
    for root, _, files in os.walk(d):
        for f in sorted(files):
            size = os.path.getsize(os.path.join(root, f))
            total += size
            print(f"  {os.path.relpath(os.path.join(root, f), d):<28} {size:>8}")
    print(f"total {total} bytes in {d}")


if __name__ == "__main__":
    main()
