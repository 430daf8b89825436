"""The bad-input cases of the CLI's tests (tests/cli_run.sh, cli_text.sh,
cli_plan.sh, cli_train.sh) through the API: each raised as the right
tide.Error subclass, with tide's status and the message the CLI prints."""
import json
import os
import shutil

import pytest

import tide
from conftest import cli, fx


def same_message(e, *cli_args):
    """The library's message in e is the one `tide` prints for the same input."""
    rc, _, err = cli(*cli_args, ok=False)
    assert rc != 0
    assert e.message.split(": ", 1)[-1] in err, (e.message, err)


def test_missing_model(tmp_path):
    with pytest.raises(tide.InvalidInput) as ei:
        tide.Model(tmp_path / "nothing-here", backend="cpu")
    assert ei.value.status == tide._lib.E_NOT_FOUND and "nothing-here" in ei.value.message
    same_message(ei.value, "run", "--model", tmp_path / "nothing-here", "--backend", "cpu")


def test_truncated_checkpoint(tmp_path):
    d = tmp_path / "trunc"
    shutil.copytree(fx("tiny-f32-mha"), d)
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:1000])
    with pytest.raises(tide.Error) as ei:
        tide.Model(d, backend="cpu")
    assert isinstance(ei.value, (tide.InvalidInput, tide.IOError))
    same_message(ei.value, "run", "--model", d, "--backend", "cpu")


def test_token_past_the_vocabulary():
    with tide.Model(fx("tiny-f32-mha"), backend="cpu") as m, pytest.raises(tide.InvalidInput) as ei:
        m.generate([1, 2, 99999], max_new_tokens=2)
    assert ei.value.status == tide._lib.E_RANGE
    same_message(ei.value, "run", "--model", fx("tiny-f32-mha"), "--tokens", "1,2,99999", "--new-tokens", "2",
                 "--backend", "cpu")


def test_too_many_positions():
    with tide.Model(fx("tiny-f32-mha"), backend="cpu") as m, pytest.raises(tide.InvalidInput) as ei:
        m.generate(list(range(1, 101)), max_new_tokens=100)
    same_message(ei.value, "run", "--model", fx("tiny-f32-mha"), "--prompt-len", "100", "--new-tokens", "100",
                 "--backend", "cpu")


@pytest.mark.parametrize("kw", [dict(budget="lots"), dict(budget="150%"), dict(backend="tpu"),
                                dict(policy="fifo", budget="50%"), dict(ssd="/tmp"), dict(threads=0),
                                dict(lora="adapter")])
def test_bad_options(kw):
    kw.setdefault("backend", "cpu")
    with pytest.raises(tide.InvalidInput):
        tide.Model(fx("tiny-f32-mha"), **kw)


def test_bad_adapter(tmp_path):
    base = fx("train", "train-f32-gqa")
    with pytest.raises(tide.InvalidInput) as ei:
        tide.Model(base, backend="cpu", lora=tmp_path / "no-adapter")
    assert ei.value.status == tide._lib.E_NOT_FOUND and "adapter_config.json" in ei.value.message
    same_message(ei.value, "run", "--model", base, "--lora", tmp_path / "no-adapter", "--backend", "cpu")


def test_spill_directory_missing(tmp_path):
    m = tide.Model(fx("tiny-f32-mha"), backend="cpu", budget="min", ssd=str(tmp_path / "none"))
    with m, pytest.raises(tide.Error) as ei:
        m.generate([1, 2, 3], max_new_tokens=2)
    assert "none" in ei.value.message


def test_text_bad_inputs(tmp_path):
    with tide.Model(fx("tiny-f32-mha"), backend="cpu") as m:  # no tokenizer
        with pytest.raises(tide.InvalidInput) as ei:
            m.generate("Hello", max_new_tokens=2)
        same_message(ei.value, "run", "--model", fx("tiny-f32-mha"), "--prompt", "Hello", "--new-tokens", "2",
                     "--backend", "cpu")
    bad = tmp_path / "bad"
    shutil.copytree(fx("hf-text"), bad)
    (bad / "tokenizer.json").write_text("{ not json")
    with tide.Model(bad, backend="cpu") as m, pytest.raises(tide.InvalidInput) as ei:
        m.generate("Hello", max_new_tokens=2)
    same_message(ei.value, "run", "--model", bad, "--prompt", "Hello", "--new-tokens", "2", "--backend", "cpu")
    with tide.Model(fx("hf-text"), backend="cpu") as m:
        with pytest.raises(tide.InvalidInput, match="the prompt is empty"):
            m.generate("", max_new_tokens=2)
        with pytest.raises(tide.InvalidInput, match="temperature") as ei:  # the CLI's parser refuses it first
            m.generate("Hi", temperature=-1)
        assert ei.value.status == tide._lib.E_INVALID
        with pytest.raises(tide.InvalidInput):
            m.generate("Hi", temperature=0.5, top_p=1.5)
        with pytest.raises(tide.InvalidInput):
            m.generate("Hi", seed="x")
        with pytest.raises(tide.InvalidInput):
            m.generate("x " * 300, max_new_tokens=2)
        with pytest.raises(tide.InvalidInput) as ei:
            m.chat([{"role": "user", "content": "Hi"}], template="nosuch")
        assert ei.value.status == tide._lib.E_NOT_FOUND
        same_message(ei.value, "run", "--model", fx("hf-text"), "--chat", "--template", "nosuch", "--prompt", "Hi",
                     "--new-tokens", "2")


def test_plan_errors(tmp_path):
    with pytest.raises(tide.InfeasibleBudget, match="too small: it needs at least") as ei:
        tide.plan("llama-7b", budget="1M", seq=512)
    assert ei.value.status == tide._lib.E_INFEASIBLE
    with pytest.raises(tide.InvalidInput, match="no-such-gpu"):
        tide.plan("llama-7b", budget="50%", hw="no-such-gpu")
    with pytest.raises(tide.InvalidInput, match="llama-9000b"):
        tide.plan("llama-9000b", budget="50%")
    with pytest.raises(tide.InvalidInput, match="fifo"):
        tide.plan("llama-7b", budget="50%", policy="fifo")
    with pytest.raises(tide.InvalidInput, match="budget"):
        tide.plan("llama-7b", budget="12parsecs")
    with pytest.raises(tide.InvalidInput, match="frobnicate"):
        tide.plan("llama-7b", budget="50%", frobnicate=1)


def test_train_errors(tmp_path):
    m = fx("train", "train-f32-gqa")
    (tmp_path / "odd.u16").write_bytes(b"\x01\x00\x02")
    with pytest.raises(tide.Error, match="odd.u16"):
        tide.train(m, tmp_path / "odd.u16", steps=1, batch=2, seq=16, backend="cpu")
    (tmp_path / "big.u16").write_bytes(b"\xff\xff" * 200)
    with pytest.raises(tide.Error, match="vocabulary|65535"):
        tide.train(m, tmp_path / "big.u16", steps=1, batch=2, seq=16, backend="cpu")
    with pytest.raises(tide.InvalidInput, match="optimizer"):
        tide.train(m, m + "/data.u16", steps=1, optimizer="cpu")
