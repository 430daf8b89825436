"""tide.Model against the tide program on the committed fixtures: the same
ids, the same logits (bit for bit: the generation's logits hash), the same
text; streaming pieces join to the text; forward() against the reference
logits of tests/fixtures/tiny-f32-mha."""
import json

import numpy as np
import pytest

import tide
from conftest import cli, cli_json, fx


def test_ids_and_logits_equal_the_cli():
    ref = json.load(open(fx("tiny-f32-mha", "reference.json")))
    prompt = ref["prompt"]
    out = cli_json("run", "--model", fx("tiny-f32-mha"), "--tokens", ",".join(map(str, prompt)),
                   "--new-tokens", "8", "--json", "--quiet", "--backend", "cpu")[-1]
    with tide.Model(fx("tiny-f32-mha"), backend="cpu") as m:
        g = m.generate(prompt, max_new_tokens=8)
        assert g.tokens == out["tokens"] == ref["generated"]
        assert "%016x" % g.stats["logits_hash"] == out["logits_hash"]
        assert g.text is None and g.stop_reason == "length"
        logits = m.forward(prompt)
    want = np.fromfile(fx("tiny-f32-mha", "logits.f32"), dtype=np.float32).reshape(ref["logits_shape"])
    assert logits.shape == want.shape and logits.dtype == np.float32
    assert np.abs(logits - want).max() / np.abs(want).max() <= 1e-4
    assert int(logits[-1].argmax()) == ref["generated"][0]


def test_lora_equals_the_cli():
    """lora= applies the adapter as tide run --lora does: the same ids and
    logits bit for bit, PEFT's greedy ids (tests/fixtures/train/lora-f32-gqa)."""
    base, ad = fx("train", "train-f32-gqa"), fx("train", "lora-f32-gqa", "adapter_init")
    prompt = [1, 17, 42, 99, 5, 63, 120, 8, 77, 31, 2, 54]
    out = cli_json("run", "--model", base, "--lora", ad, "--tokens", ",".join(map(str, prompt)), "--new-tokens",
                   "4", "--json", "--quiet", "--backend", "cpu")[-1]
    with tide.Model(base, backend="cpu", lora=ad) as m:
        g = m.generate(prompt, max_new_tokens=4)
        assert g.tokens == out["tokens"] == [125, 38, 104, 30]
        assert "%016x" % g.stats["logits_hash"] == out["logits_hash"]
    with tide.Model(base, backend="cpu") as m:
        assert "%016x" % m.generate(prompt, max_new_tokens=4).stats["logits_hash"] != out["logits_hash"]


def test_forward_batch_rows_equal_single_rows():
    with tide.Model(fx("tiny-f32-mha"), backend="cpu") as m:
        a = m.forward([[1, 2, 3], [4, 5, 6]])
        assert a.shape == (2, 3, 256)
        np.testing.assert_array_equal(a[1], m.forward([4, 5, 6]))


def test_text_equals_the_cli():
    out = cli_json("run", "--model", fx("hf-text"), "--prompt", "Once upon a time", "--new-tokens", "12", "--json",
                   "--quiet", "--backend", "cpu")[-1]
    with tide.Model(fx("hf-text"), backend="cpu") as m:
        g = m.generate("Once upon a time", max_new_tokens=12)
        assert g.tokens == out["tokens"] and g.text == out["text"] and g.stop_reason == out["stop_reason"]
        assert "%016x" % g.stats["logits_hash"] == out["logits_hash"]
        pieces = list(m.generate("Once upon a time", max_new_tokens=12, stream=True))
        assert len(pieces) > 1 and "".join(pieces) == out["text"]


def test_sampling_and_stop_equal_the_cli():
    args = ["--temperature", "0.9", "--top-k", "40", "--top-p", "0.95", "--seed", "7"]
    out = cli_json("run", "--model", fx("hf-text"), "--prompt", "The cat", "--new-tokens", "24", "--json", "--quiet",
                   "--backend", "cpu", *args)[-1]
    with tide.Model(fx("hf-text"), backend="cpu") as m:
        g = m.generate("The cat", max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=7)
        assert g.tokens == out["tokens"] and g.text == out["text"]
        stop = g.text[5:7]
        out = cli_json("run", "--model", fx("hf-text"), "--prompt", "The cat", "--new-tokens", "24", "--json",
                       "--quiet", "--backend", "cpu", "--stop", stop, *args)[-1]
        g2 = m.generate("The cat", max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=7, stop=stop)
        assert g2.text == out["text"] and g2.stop_reason == out["stop_reason"] == "stop"
        assert stop not in g2.text
        s = list(m.generate("The cat", max_new_tokens=24, temperature=0.9, top_k=40, top_p=0.95, seed=7, stop=stop,
                            stream=True))
        assert "".join(s) == g2.text


def test_chat_equals_the_cli():
    model = fx("hf-text")  # a chatml template in its tokenizer_config.json
    out = cli_json("run", "--model", model, "--chat", "--system", "Be brief.", "--prompt", "Hi there",
                   "--new-tokens", "10", "--json", "--quiet", "--backend", "cpu")[-1]
    with tide.Model(model, backend="cpu") as m:
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
        g = m.chat(msgs, max_new_tokens=10)
        assert g.tokens == out["tokens"] and g.text == out["text"]
        assert "".join(m.chat(msgs, max_new_tokens=10, stream=True)) == g.text
        with pytest.raises(tide.InvalidInput, match="message 0"):
            m.chat([{"content": "no role"}])


def test_tokenize_round_trip():
    with tide.Model(fx("hf-text"), backend="cpu") as m:
        ids = m.tokenize("Once upon a time")
        assert ids and m.detokenize(ids) == "Once upon a time"
        assert m.tokenize("Once upon a time", add_special=False) == ids[1:]


def test_closed_model_and_context_manager():
    m = tide.Model(fx("tiny-f32-mha"), backend="cpu")
    m.close()
    m.close()
    with pytest.raises(tide.InvalidInput, match="closed"):
        m.generate([1, 2], max_new_tokens=1)
