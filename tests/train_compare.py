#!/usr/bin/env python3
"""train_compare.py - the command-line tests' comparisons of training runs
(tests/cli_mpi.sh, tests/cli_torchrun.sh, tests/cli_srun.sh, through
lib_cli.sh's train_compare): the per-step losses and gradient norms of
`tide train --json` lines (rank 0's, or a single process's), the validation
lines of every rank, and the tensors of two safetensors files.

    train_compare.py steps A B        every step of A within 1e-5 relative of B's
    train_compare.py same A B         every step of A equal to B's, bit for bit
    train_compare.py eval A B RANKS   every rank's validations in A within 1e-5 of B's
    train_compare.py torch A EXPECTED every step within 1e-5 relative of PyTorch's
    train_compare.py params A B       every f32/bf16 tensor within 1e-4 absolute

Prints "ok", or exits non-zero naming the first difference.
"""
import json, struct, sys

def steps(path, rank):
    out = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        if "step" in o and "loss" in o and "summary" not in o and o.get("rank", 0) == rank:
            out[o["step"]] = (o["loss"], o["grad_norm"])
    return out

def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for k, v in h.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "F32":
            out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif v["dtype"] == "BF16":
            out[k] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
    return out

mode = sys.argv[1]
if mode in ("steps", "same"):  # A B: every step of A (rank 0) within 1e-5 relative of B's ("same": equal)
    a, b = steps(sys.argv[2], 0), steps(sys.argv[3], 0)
    if not a or sorted(a) != sorted(b):
        sys.exit("steps differ: %s vs %s" % (sorted(a), sorted(b)))
    for s in a:
        for x, y, what in ((a[s][0], b[s][0], "loss"), (a[s][1], b[s][1], "grad norm")):
            if (x != y) if mode == "same" else abs(x - y) > 1e-5 * abs(y):
                sys.exit("step %d %s %.17g vs %.17g" % (s, what, x, y))
elif mode == "eval":  # A B RANKS: every rank's validations in A within 1e-5 relative of B's (one process)
    def evals(path, rank):
        out = {}
        for line in open(path):
            if line.startswith("{") and '"eval":true' in line:
                o = json.loads(line)
                if o.get("rank", 0) == rank:
                    out[o["step"]] = (o["eval_loss"], o["eval_targets"])
        return out
    b = evals(sys.argv[3], 0)
    if not b:
        sys.exit("no validation in " + sys.argv[3])
    for r in range(int(sys.argv[4])):
        a = evals(sys.argv[2], r)
        if sorted(a) != sorted(b):
            sys.exit("rank %d validated at steps %s, one process at %s" % (r, sorted(a), sorted(b)))
        for s in a:
            if a[s][1] != b[s][1] or abs(a[s][0] - b[s][0]) > 1e-5 * abs(b[s][0]):
                sys.exit("rank %d step %d: validation loss %.9g over %d targets vs %.9g over %d"
                         % (r, s, a[s][0], a[s][1], b[s][0], b[s][1]))
elif mode == "torch":  # A EXPECTED: every step's loss and grad norm within 1e-5 of PyTorch's
    a, e = steps(sys.argv[2], 0), json.load(open(sys.argv[3]))
    if len(a) != len(e["loss"]):
        sys.exit("%d steps, PyTorch %d" % (len(a), len(e["loss"])))
    for s in range(len(e["loss"])):
        for x, y, what in ((a[s][0], e["loss"][s], "loss"), (a[s][1], e["grad_norm"][s], "grad norm")):
            if abs(x - y) > 1e-5 * abs(y):
                sys.exit("step %d %s %.9g vs PyTorch %.9g" % (s, what, x, y))
elif mode == "params":  # A B: every tensor within 1e-4 absolute
    a, b = tensors(sys.argv[2]), tensors(sys.argv[3])
    if sorted(a) != sorted(b) or not a:
        sys.exit("tensor names differ")
    for k in a:
        d = max(abs(x - y) for x, y in zip(a[k], b[k]))
        if len(a[k]) != len(b[k]) or d > 1e-4:
            sys.exit("%s differs by %g" % (k, d))
else:
    sys.exit("train_compare.py: unknown mode " + mode)
print("ok")
