"""tide.plan, tide.train and `python -m tide`: the command-line program.

`tide plan` and `tide train` are programs on top of libtide (src/cli/): the
planning report and the training loop (data windows, the schedule, saves,
resumes, the JSON they print) are theirs. tide.plan and tide.train run that
very program, the one the package carries, and read its --json output, so
their figures are the CLI's by construction; a failure is raised as the
tide.Error its message and status name say.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from . import _lib
from ._errors import Error, error

_HERE = os.path.dirname(os.path.abspath(__file__))


def executable() -> str:
    """The `tide` program: $TIDE_CLI (a build tree's), else the one the wheel carries (bin/tide)."""
    env = os.environ.get("TIDE_CLI")
    if env:
        return env
    p = os.path.join(_HERE, "bin", "tide")
    if os.access(p, os.X_OK):
        return p
    raise Error("the tide program was not found in %s (install the package with `pip install .`, or point "
                "TIDE_CLI at a build tree's tide)" % os.path.dirname(p), _lib.E_NOT_FOUND)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m tide ARGS`: runs `tide ARGS`, standard streams and exit status passed through."""
    args = list(sys.argv[1:] if argv is None else argv)
    exe = executable()
    if argv is None:
        os.execv(exe, [exe] + args)  # the process becomes tide: signals, streams, status its own
    return subprocess.call([exe] + args)


def _args(opts: Dict[str, Any]) -> List[str]:
    """Keyword options as CLI options: foo_bar=1 -> --foo-bar 1; True -> the
    flag alone; False or None -> left out; a list -> the option repeated."""
    out: List[str] = []
    for k, v in opts.items():
        if v is None or v is False:
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif isinstance(v, (list, tuple)):
            for x in v:
                out += [flag, str(x)]
        else:
            out += [flag, os.fspath(v) if isinstance(v, os.PathLike) else str(v)]
    return out


_STATUS_NAMES = None
_TAIL = re.compile(r"^(.*) \(([^()]+)\)$", re.S)


def _failure(cmd: str, rc: int, stderr: str) -> Error:
    """The tide.Error of a failed command: exit 2 (a usage error) is bad
    input; exit 1 ends with the status name the library gave, when it gave one."""
    global _STATUS_NAMES
    if _STATUS_NAMES is None:
        _STATUS_NAMES = {_lib.lib.tide_status_str(s).decode(): s for s in range(_lib.E_BUSY + 1)}
    lines = [ln for ln in stderr.splitlines() if ln.startswith(("tide", cmd + ":")) and not ln.startswith("Try '")]
    # a usage error may come after getopt's own line ("unrecognized option '--x'"): both are kept
    msg = "; ".join(lines) if lines else (stderr.strip() or "tide %s failed with exit status %d" % (cmd, rc))
    status = _lib.E_INVALID
    m = _TAIL.match(lines[-1]) if lines else None
    if rc == 1 and m and m.group(2) in _STATUS_NAMES:
        status = _STATUS_NAMES[m.group(2)]
    elif rc not in (1, 2):
        return Error(msg, _lib.E_BACKEND if rc > 0 else _lib.E_INVALID)
    e = error(status, msg)
    e.exit_status = rc
    return e


def _stop(p: subprocess.Popen) -> None:
    """Ctrl-C reached Python: the child gets SIGINT too (it may not have,
    when the signal was sent to this process alone) and is waited for."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _run_json(cmd: str, args: List[str], on_line: Optional[Callable[[Dict[str, Any]], None]] = None):
    """Runs `tide CMD ARGS --json` (and --quiet: no progress lines, for
    train); returns the JSON objects it printed."""
    quiet = ["--quiet"] if cmd == "train" else []
    p = subprocess.Popen([executable(), cmd] + args + ["--json"] + quiet, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    objs: List[Dict[str, Any]] = []
    try:
        assert p.stdout is not None and p.stderr is not None
        for line in p.stdout:
            line = line.strip()
            if not line.startswith("{"):
                continue
            o = json.loads(line)
            objs.append(o)
            if on_line is not None:
                on_line(o)
        err = p.stderr.read()
        rc = p.wait()
    except BaseException:
        _stop(p)
        raise
    if rc != 0:
        raise _failure(cmd, rc, err)
    return objs


def plan(config_or_path: str, *, budget, hw: str = "h100-80g", batch: int = 1, seq: int = 2048, decode: int = 0,
         train: bool = False, **options: Any) -> Dict[str, Any]:
    """`tide plan --json`'s figures: a built-in configuration's name
    (tinyllama-1.1b, llama-7b, ...) or a model path (a directory's
    config.json or a GGUF file), planned under budget (bytes such as "20G",
    "25%", "min") on the hardware profile hw. Further options are the
    command's (dtype="q4_k", policy="lru", host_budget="64G",
    weights_on_ssd=True, tile="none", accum=2, optimizer="cpu", ...)."""
    src = os.fspath(config_or_path)
    where = ["--model", src] if os.path.exists(src) else ["--config", src]
    opts = dict(budget=budget, hw=hw, batch=batch, seq=seq, decode=decode or None, train=train)
    opts.update(options)
    objs = _run_json("plan", where + _args(opts))
    if not objs:
        raise Error("tide plan printed no JSON", _lib.E_FORMAT)
    return objs[-1]


def train(model: Optional[str], data: Optional[str], *, on_step: Optional[Callable[[Dict[str, Any]], Any]] = None,
          **options: Any) -> Dict[str, Any]:
    """Trains as `tide train` does (options: steps, batch, seq, accum, lr,
    min_lr, warmup, weight_decay, budget, policy, out, save_every, resume,
    backend, threads, ...) and returns its summary dict. on_step receives
    each step's dict (step, loss, grad_norm, lr, bytes moved, times) as the
    step ends; the summary's "step_log" lists them too. Ctrl-C stops the run (the program is interrupted; a
    checkpoint it saves is written to a temporary directory and renamed, so
    none is left half-written) and raises KeyboardInterrupt."""
    args: List[str] = []
    if model is not None:
        args += ["--model", os.fspath(model)]
    if data is not None:
        args += ["--data", os.fspath(data)]
    steps: List[Dict[str, Any]] = []

    def line(o: Dict[str, Any]) -> None:
        if "summary" in o or o.get("type") == "summary" or "step" not in o:
            return
        steps.append(o)
        if on_step is not None:
            on_step(o)

    objs = _run_json("train", args + _args(options), line)
    summary = [o for o in objs if o not in steps]
    if not summary:
        raise Error("tide train printed no summary", _lib.E_FORMAT)
    out = dict(summary[-1])
    out["step_log"] = steps
    return out
