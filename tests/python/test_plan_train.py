"""tide.plan and tide.train: the figures of `tide plan --json` and the
losses of `tide train --json`."""
import pytest

import tide
from conftest import cli_json, fx


@pytest.mark.parametrize("kw,args", [
    (dict(budget="25%", seq=512), ["--budget", "25%", "--seq", "512"]),
    (dict(budget="min", seq=256, decode=4, hw="a100-80g"), ["--budget", "min", "--seq", "256", "--decode", "4",
                                                            "--hw", "a100-80g"]),
    (dict(budget="30%", seq=256, batch=2, train=True), ["--budget", "30%", "--seq", "256", "--batch", "2",
                                                        "--train"]),
])
def test_plan_equals_the_cli(kw, args):
    config = "tinyllama-1.1b" if kw.get("train") else "llama-7b"
    p = tide.plan(config, **kw)
    if "hw" not in kw:
        args = args + ["--hw", "h100-80g"]  # tide.plan's default profile
    want = cli_json("plan", "--config", config, "--json", *args)[-1]
    # every figure but the time the planner took
    assert p.pop("plan_seconds") > 0 and want.pop("plan_seconds") > 0
    assert p == want and p["feasible"]


def test_plan_of_a_model_path():
    p = tide.plan(fx("tiny-bf16-gqa"), budget="50%", seq=64)
    assert p["config"] and p["verified"]


def test_train_three_steps_equal_the_cli(tmp_path):
    m = fx("train", "train-f32-gqa")
    opts = dict(steps=3, batch=2, seq=16, backend="cpu")
    seen = []
    s = tide.train(m, m + "/data.u16", on_step=seen.append, out=tmp_path / "ck", **opts)
    want = cli_json("train", "--model", m, "--data", m + "/data.u16", "--steps", "3", "--batch", "2", "--seq", "16",
                    "--backend", "cpu", "--json", "--quiet")
    steps = [o for o in want if "summary" not in o]
    assert [o["loss"] for o in seen] == [o["loss"] for o in steps]
    assert [o["grad_norm"] for o in seen] == [o["grad_norm"] for o in steps]
    assert len(seen) == 3 and all("lr" in o and "bytes_h2d" in o for o in seen)
    assert s["final_loss"] == steps[-1]["loss"] and s["step_log"] == seen
    assert (tmp_path / "ck" / "model.safetensors").exists()
