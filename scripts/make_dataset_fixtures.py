#!/usr/bin/env python3
"""make_dataset_fixtures.py - the training data set fixture (tests/fixtures/dataset).

What it makes: a small random LLaMA checkpoint with the byte-level BPE tokenizer
and ChatML chat template of tests/fixtures/hf-text, three JSON Lines data sets
(plain documents, prompt/completion, chat), and what Hugging Face and PyTorch
make of them:

  - the ids of every document and example, and which ids are trained, from
    transformers' tokenizer and its Jinja chat template (apply_chat_template);
  - three training steps on the prompt/completion and on the chat examples:
    cross-entropy with ignore_index, summed over the whole step and divided by
    the number of targets not ignored, backward, clip_grad_norm_, AdamW; each
    step's loss, gradient norm and target count, the first step's gradients of
    a few tensors.

tests/test_dataset.c reads these with tide's data sets and trainer and
compares. CI never runs this script.

How to run (python3 with torch and transformers; CPU, a few seconds):

    python3 scripts/make_dataset_fixtures.py            # writes tests/fixtures/dataset/

The rules it follows are tide's (include/tide.h, "Training data sets"):
  document       tokenizer(text) ids (BOS from the template) + [EOS]
  prompt/compl.  tokenizer(prompt) ids + tokenizer(completion, no specials) ids
                 + [EOS]; trained: the completion and the EOS
  chat           the conversation rendered by apply_chat_template, cut where
                 each message begins and where each assistant message's text
                 begins (after the generation prompt's header), each piece
                 encoded on its own without specials; trained: the assistant
                 pieces (text and end of turn)
  rows           one example per row, the first T + 1 ids (longer ones
                 truncated), right-padded with EOS inputs and ignored targets;
                 row b of micro-batch m of step s holds example
                 ((s * accum + m) * B + b) mod N
"""

import json
import os
import shutil
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
SRC = os.path.join(ROOT, "tests", "fixtures", "hf-text")
OUT = os.path.join(ROOT, "tests", "fixtures", "dataset")

B, T, ACCUM, STEPS = 2, 48, 2, 3
LR, BETA1, BETA2, EPS, WD, CLIP = 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0
GRADS = ["model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.o_proj.weight"]

DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tide trains models larger than the memory of the device.",
    "Numbers like 12, 345 and 6789 are split into digits.",
    "A line with <|im_end|> special text inside it.",
    "Short one.",
    "The last document of the corpus ends here.",
]
PC = [
    ("What is 2+2?", " 4"),
    ("Name a colour.", " Blue, like the sky on a clear day."),
    ("Translate 'chat' from French:", " cat"),
    ("Count to five:", " one two three four five"),
    ("Say nothing long.", " ok"),
    ("Repeat the word tide three times, separated by commas, and then explain what a tide is in a long "
     "sentence that does not fit the row.", " tide, tide, tide: the rise and fall of the sea, twice a day."),
]
CHAT = [
    [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!")],
    [("user", "2+3?"), ("assistant", "5"), ("user", "And 4+4?"), ("assistant", "8")],
    [("user", "Colour of grass?"), ("assistant", "Green.")],
    [("system", "You answer in one word."), ("user", "Capital of France?"), ("assistant", "Paris"),
     ("user", "Of Italy?"), ("assistant", "Rome, which is a long answer that will be cut at the end of the row")],
    [("user", "Ping"), ("assistant", "Pong")],
]


def encode(tok, text, special):
    return tok(text, add_special_tokens=special)["input_ids"]


def doc_ids(tok, text):
    return encode(tok, text, True) + [tok.eos_token_id]


def pc_ids(tok, p, c):
    a, b = encode(tok, p, True), encode(tok, c, False) + [tok.eos_token_id]
    return a + b, [0] * len(a) + [1] * len(b)


def chat_ids(tok, conv):
    msgs = [{"role": r, "content": c} for r, c in conv]
    full = tok.apply_chat_template(msgs, tokenize=False)
    ids, train, at = [], [], 0
    for i, m in enumerate(msgs):
        head = at
        if m["role"] == "assistant":
            head = len(tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True))
        end = len(tok.apply_chat_template(msgs[: i + 1], tokenize=False))
        for a, b, tr in ((at, head, 0), (head, end, int(m["role"] == "assistant"))):
            if b > a:
                x = encode(tok, full[a:b], False)
                ids += x
                train += [tr] * len(x)
        at = end
    assert at == len(full)
    return ids, train


def rows(examples, step, micro):
    """The (inputs, targets) of micro-batch micro of step, -100 ignored."""
    x, y = [], []
    n = len(examples)
    for b in range(B):
        ids, tr = examples[((step * ACCUM + micro) * B + b) % n]
        ids, tr = ids[: T + 1], tr[: T + 1]
        L = len(ids)
        x.append([ids[t] if t < L else EOS for t in range(T)])
        y.append([ids[t + 1] if t + 1 < L and tr[t + 1] else -100 for t in range(T)])
    return torch.tensor(x), torch.tensor(y)


def train(model_dir, examples):
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    model.train()
    params = dict(model.named_parameters())
    decay = {k: p.dim() >= 2 for k, p in params.items()}
    opt = torch.optim.AdamW(
        [
            {"params": [p for k, p in params.items() if decay[k]], "weight_decay": WD},
            {"params": [p for k, p in params.items() if not decay[k]], "weight_decay": 0.0},
        ],
        lr=LR, betas=(BETA1, BETA2), eps=EPS, foreach=False, fused=False)
    log = {"loss": [], "grad_norm": [], "targets": []}
    grads = {}
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        batches = [rows(examples, step, m) for m in range(ACCUM)]
        n = sum(int((y != -100).sum()) for _, y in batches)
        total = 0.0
        for x, y in batches:
            logits = model(input_ids=x, use_cache=False).logits
            s = F.cross_entropy(logits.reshape(B * T, -1), y.reshape(B * T), ignore_index=-100, reduction="sum")
            (s / n).backward()  # the step's loss: every micro-batch's sum over the step's count
            total += s.item()
        if step == 0:
            grads = {k: params[k].grad.detach().reshape(-1).tolist() for k in GRADS}
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), CLIP)
        opt.step()
        log["loss"].append(total / n)
        log["grad_norm"].append(float(norm))
        log["targets"].append(n)
    return log, grads


def main():
    global EOS
    torch.manual_seed(7001)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    mdir = os.path.join(OUT, "model")
    os.makedirs(mdir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(SRC, f), mdir)
    tok = AutoTokenizer.from_pretrained(mdir)
    EOS = tok.eos_token_id
    cfg = LlamaConfig(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=EOS)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():  # norms away from 1, so their gradients mean something
        for k, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(mdir, safe_serialization=True)
    c = json.load(open(os.path.join(mdir, "config.json")))
    c["torch_dtype"] = "float32"
    c["rope_theta"] = 10000.0
    json.dump(c, open(os.path.join(mdir, "config.json"), "w"), indent=2)
    gen = os.path.join(mdir, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)

    def write(name, lines):
        with open(os.path.join(OUT, name), "w") as f:
            for x in lines:
                f.write(json.dumps(x) + "\n")

    write("docs.jsonl", [{"text": d} for d in DOCS])
    with open(os.path.join(OUT, "docs.txt"), "w") as f:
        for d in DOCS:
            f.write(d + "\n")
    write("pc.jsonl", [{"prompt": p, "completion": c} for p, c in PC])
    write("chat.jsonl", [{"messages": [{"role": r, "content": c} for r, c in conv]} for conv in CHAT])

    stream = [i for d in DOCS for i in doc_ids(tok, d)]
    pc = [pc_ids(tok, p, c) for p, c in PC]
    chat = [chat_ids(tok, conv) for conv in CHAT]
    exp = {
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "hparams": {"batch": B, "seq": T, "accum": ACCUM, "steps": STEPS, "lr": LR, "beta1": BETA1,
                    "beta2": BETA2, "eps": EPS, "weight_decay": WD, "grad_clip": CLIP},
        "docs_stream": stream,
    }
    for name, every in (("pc", pc), ("chat", chat)):
        ex = [(i, t) for i, t in every if any(t[1 : T + 1])]
        log, grads = train(mdir, ex)
        exp[name] = {
            "ids": [i for i, _ in ex], "train": [t for _, t in ex],
            "truncated": sum(len(i) > T + 1 for i, _ in every), "dropped": len(every) - len(ex),
            "pad_positions": sum(T - (min(len(i), T + 1) - 1) for i, _ in ex),
            **log, "grads_step0": grads,
        }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(exp, f)
    for name in ("pc", "chat"):
        print(name, "losses", exp[name]["loss"], "targets", exp[name]["targets"], "truncated",
              exp[name]["truncated"], "dropped", exp[name]["dropped"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
