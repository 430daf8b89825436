#!/usr/bin/env python3
"""serve_load.py - `tide serve` under load: aggregate tokens/s, request
latency and time to first token with 1, 4 and 16 concurrent streaming
clients, and the server's overhead per request against the library's own
timing of the same generation. Standard library only.

Usage: bench/serve_load.py [--quick] [--requests R] [--max-tokens N]
                           [--clients 1,4,16] [--rounds K] [--threads N]
                           [--budget X] [--max-batch B] [--backend cpu|cuda] [--model DIR] [--tide PATH]
                           [--bench-engine PATH] [--json FILE]

The model is the built-in one (tinyllama-1.1b's shapes, synthetic bf16
weights, the built-in tokenizer), in the directory `tide run` with no
--model writes it to ($TIDE_CACHE/models/..., else
$XDG_CACHE_HOME/tide/models/..., else ~/.cache/tide/models/...); when it is
not there, `tide run --new-tokens 1` generates it first (2.2 GB, once).
--model DIR serves another checkpoint (with a tokenizer) instead.

Each server runs on the CPU backend (--backend cuda: on the GPU), on 127.0.0.1 at a free port (--port 0,
the port read from the line it prints), with one budget (--budget, default
8G: the model whole) and --threads CPU threads per model (default: all
cores). The phases:

  1. one model: for N in --clients, N client threads each send R streamed
     completions (/v1/completions, a fixed prompt, temperature 0,
     max_tokens N (default 16), stream_options.include_usage) one after another, all
     released together. Per level: aggregate generated tokens/s (the
     usage's completion_tokens summed, over the first request's start to
     the last one's end), request latency p50/p99 (nearest rank), time to
     the first token's event p50.
  2. two models (the same weights served under two names, one budget): the
     same for each level above 1, the N clients split over the two. A
     model's requests that wait together run as one batch of up to
     --max-batch (the server's default 4; 1: one at a time, for comparison):
     one forward per decode step for all of them. Two models run at once,
     each within its share of the budget (on the same cores).
  3. overhead: 2K non-streamed requests through the server (one client,
     nothing else running), K before and K after `bench_engine --backend
     cpu --prompt P --new N --reps K+1` (build/bench_engine, beside --tide),
     which times the same generation through the library alone, warm
     (median of its timed reps on the planned engine, the first rep
     untimed), for the server's prompt length P and N = max_tokens, at the
     same threads: library time = P / prefill tokens/s + (N - 1) / decode
     tokens/s. Overhead per request = median server wall time - library
     time: HTTP, JSON, tokenizing, the pool's per-request planning and KV
     cache, the request queue. `tide run --prompt PROMPT --new-tokens N
     --json` runs once too: its greedy text and token count must be the
     server's, and its prefill_s + decode_s (a fresh process: the weights'
     pages first touched, cold) is printed beside them. Without
     bench_engine the overhead is taken against that tide run figure.

Every answer must be 200 with tide run's greedy text; on CUDA a batched
answer may part from it after a common start (cuBLAS rounds a product of 4
rows differently from one of 1), which is reported with the length of the
common start, not failed. Prints a markdown table
and one JSON line (also to --json FILE); exit status 1 if a check failed.
The defaults take about 3 minutes on 2 loaded cores; --quick (max_tokens 8,
clients 1 and 4, K = 1) about 1 minute.
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

PROMPT = "The planner moves tensors between memory tiers, ahead of time."
HERE = os.path.dirname(os.path.abspath(__file__))


def default_model_dir():
    """The directory `tide run` with no --model uses (cli_default_model_dir)."""
    name = "tinyllama-1.1b-synthetic-s0"
    c, x, h = os.environ.get("TIDE_CACHE"), os.environ.get("XDG_CACHE_HOME"), os.environ.get("HOME")
    if c:
        return os.path.join(c, "models", name)
    if x:
        return os.path.join(x, "tide", "models", name)
    if h:
        return os.path.join(h, ".cache", "tide", "models", name)
    return os.path.join("/tmp/tide-cache/models", name)


def pct(xs, p):
    """Nearest-rank percentile."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, -(-p * len(s) // 100) - 1))
    return s[k]


class Server:
    def __init__(self, tide, models, a, tmp):
        self.err = open(os.path.join(tmp, "serve-%d.err" % len(models)), "w+")
        args = [tide, "serve"] + [x for n, d in models.items() for x in ("--model", f"{n}={d}")] + [
            "--budget", a.budget, "--backend", a.backend, "--threads", str(a.threads), "--port", "0",
            "--queue", "64", "--ssd", tmp] + (["--max-batch", str(a.max_batch)] if a.max_batch else [])
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.p.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
        if not m:
            self.p.kill()
            self.p.wait()
            self.err.seek(0)
            sys.exit(f"serve_load: the server did not start: [{line.strip()}] {self.err.read()[-500:]}")
        self.port = int(m.group(1))

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.err.close()


def body(model, a, stream):
    b = {"model": model, "prompt": PROMPT, "max_tokens": a.max_tokens, "temperature": 0}
    if stream:
        b.update(stream=True, stream_options={"include_usage": True})
    return json.dumps(b)


def complete(port, model, a):
    """One non-streamed completion: (wall s, status, text, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=body(model, a, False), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    t = time.perf_counter() - t0
    c.close()
    if r.status != 200:
        return t, r.status, raw.decode(errors="replace")[:200], {}
    j = json.loads(raw)
    return t, 200, j["choices"][0]["text"], j["usage"]


def stream(port, model, a):
    """One streamed completion: dict(start, first, end, status, text, tokens), times from perf_counter."""
    out = {"start": time.perf_counter(), "first": None, "status": 0, "text": "", "tokens": 0}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        c.request("POST", "/v1/completions", body=body(model, a, True), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        out["status"] = r.status
        if r.status != 200:
            out["text"] = r.read().decode(errors="replace")[:200]
            return out
        text = []
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("choices"):
                if out["first"] is None:
                    out["first"] = time.perf_counter()
                text.append(ev["choices"][0]["text"])
            if ev.get("usage"):
                out["tokens"] = ev["usage"]["completion_tokens"]
        out["text"] = "".join(text)
    finally:
        out["end"] = time.perf_counter()
        c.close()
    return out


def load_level(port, names, n, a):
    """n clients, client i on names[i % len(names)], each R streamed requests in turn."""
    results, lock = [], threading.Lock()
    barrier = threading.Barrier(n)

    def client(i):
        barrier.wait()
        for _ in range(a.requests):
            o = stream(port, names[i % len(names)], a)
            with lock:
                results.append(o)

    ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    span = max(o["end"] for o in results) - min(o["start"] for o in results)
    ok = [o for o in results if o["status"] == 200]
    toks = sum(o["tokens"] for o in ok)
    lat = [o["end"] - o["start"] for o in ok]
    ttft = [o["first"] - o["start"] for o in ok if o["first"] is not None]
    return {"models": len(names), "clients": n, "requests": len(results), "ok": len(ok),
            "tokens": toks, "span_s": span, "tokens_per_s": toks / span if span > 0 else 0,
            "latency_p50_s": pct(lat, 50) if lat else None, "latency_p99_s": pct(lat, 99) if lat else None,
            "ttft_p50_s": pct(ttft, 50) if ttft else None,
            "texts": sorted({o["text"] for o in ok}), "bad": [o["status"] for o in results if o["status"] != 200]}


def tide_run(a, model_dir):
    args = [a.tide, "run", "--model", model_dir, "--prompt", PROMPT, "--new-tokens", str(a.max_tokens), "--json",
            "--backend", a.backend, "--threads", str(a.threads)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"serve_load: tide run failed: {p.stderr[-500:]}")
    return json.loads(p.stdout)


def bench_engine(a, model_dir, n_prompt):
    """The planned engine's warm time for n_prompt + max_tokens (s), or None."""
    if not os.access(a.bench_engine, os.X_OK):
        return None, None
    env = dict(os.environ, TIDE_THREADS=str(a.threads))
    p = subprocess.run([a.bench_engine, "--backend", a.backend, "--prompt", str(n_prompt), "--new", str(a.max_tokens),
                        "--reps", str(a.rounds + 1), model_dir], capture_output=True, text=True, env=env, timeout=600)
    j = next((json.loads(x) for x in p.stdout.splitlines() if x.startswith('{"bench":"engine"')), None)
    if p.returncode != 0 or j is None or j["planned_prefill_tps"] <= 0 or j["planned_decode_tps"] <= 0:
        sys.exit(f"serve_load: bench_engine failed: {p.stderr[-500:]}")
    return n_prompt / j["planned_prefill_tps"] + (a.max_tokens - 1) / j["planned_decode_tps"], j


def overhead(s, a, model_dir, fails):
    """Phase 3 on the one-model server s."""
    srv, texts, usage = [], set(), {}

    def server_rounds():
        nonlocal usage
        for _ in range(a.rounds):
            t, st, text, usage = complete(s.port, "m0", a)
            if st != 200:
                fails.append(f"overhead request: {st} {text}")
            srv.append(t)
            texts.add(text)

    server_rounds()
    lib, eng = bench_engine(a, model_dir, usage.get("prompt_tokens", 0))
    server_rounds()
    j = tide_run(a, model_dir)
    run_s = j["prefill_s"] + j["decode_s"]
    texts.add(j.get("text"))
    if usage.get("completion_tokens") != len(j["tokens"]) or usage.get("prompt_tokens") != j["prompt_tokens"]:
        fails.append(f"server usage {usage}, tide run {j['prompt_tokens']} + {len(j['tokens'])} tokens")
    if len(texts) != 1:
        fails.append("the server's text differs from tide run's")
    ms = statistics.median(srv)
    ref = lib if lib is not None else run_s
    return {"text": j.get("text"), "rounds": a.rounds, "prompt_tokens": usage.get("prompt_tokens"), "server_s": srv,
            "server_median_s": ms, "library_s": lib, "library_from": "bench_engine" if lib is not None else "tide run",
            "bench_engine": eng, "tide_run_s": run_s, "overhead_ms": (ms - ref) * 1e3,
            "overhead_pct": (ms / ref - 1) * 100 if ref > 0 else None}


def check_texts(rows, ref, backend, max_batch, fails):
    """Checks the greedy texts of the levels (each row's "texts", removed)
    against ref, tide run's text; appends to fails; returns a note or None."""
    # Greedy texts. A request that ran alone (one client per model, or
    # --max-batch 1) must give tide run's text on every backend. A batched
    # request must too on the CPU backend, whose products give every row the
    # bits it has alone. On CUDA, cuBLAS chooses its kernel (and with it the
    # order of each dot product's sums) by the rows of a product, so a batch
    # of 4 rounds differently from one row; on this model of random weights,
    # with many near-ties, the greedy tokens may then part after a common
    # start, which is reported, not failed.
    alone_texts, batched = set(), []
    for r in rows:
        ts = r.pop("texts")
        level = f"{r['models']} model(s), {r['clients']} clients"
        if r["clients"] // r["models"] <= 1 or max_batch == 1:
            alone_texts.update((level, t) for t in ts)
        else:
            batched.extend((level, t) for t in ts)
    if ref is None and alone_texts:
        ref = sorted(alone_texts)[0][1]
    differ_alone = sorted(x for x in alone_texts if x[1] != ref)
    differ_batched = sorted(x for x in batched if x[1] != ref)
    if differ_alone or (differ_batched and backend != "cuda"):
        fails.append("greedy texts differ from tide run's (" +
                     ", ".join(lv for lv, _ in differ_alone + differ_batched) + ")")
    batch_note = None
    if differ_batched and backend == "cuda":
        common = min(len(os.path.commonprefix([t, ref])) for _, t in differ_batched)
        levels = ", ".join(sorted({lv for lv, _ in differ_batched}))
        batch_note = (f"{len(differ_batched)} distinct batched text(s) ({levels}) part from the lone text after "
                      f"{common} of its {len(ref)} characters (cuBLAS rounds a batch's products differently; "
                      "the CPU backend is checked bit for bit)")
    if differ_alone or differ_batched:
        print(f"  tide run's text: {ref!r}", file=sys.stderr)
        for lv, t in differ_alone + differ_batched:
            print(f"  text of {lv}: {t!r}", file=sys.stderr)
    return batch_note


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="max_tokens 8, clients 1,4, --rounds 1")
    ap.add_argument("--requests", type=int, default=1, help="streamed requests per client (default 1)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per request (default 16, --quick 8)")
    ap.add_argument("--clients", default=None, help="concurrency levels (default 1,4,16; --quick 1,4)")
    ap.add_argument("--rounds", type=int, default=None, help="K: server requests before and after bench_engine, its timed reps - 1 (default 2, --quick 1)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads per model")
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"),
                    help="the servers' and the library runs' backend (default cpu)")
    ap.add_argument("--budget", default="8G", help="the server's budget (default 8G)")
    ap.add_argument("--max-batch", type=int, default=None,
                    help="the server's --max-batch (default: the server's own, 4)")
    ap.add_argument("--model", default=None, help="model directory (default: the built-in model)")
    ap.add_argument("--tide", default=os.path.join(HERE, "..", "build", "tide"), help="the tide binary")
    ap.add_argument("--bench-engine", default=None, help="the bench_engine binary (default: beside --tide)")
    ap.add_argument("--json", default=None, help="also write the JSON line to this file")
    a = ap.parse_args()
    a.max_tokens = a.max_tokens or (8 if a.quick else 16)
    a.rounds = a.rounds or (1 if a.quick else 2)
    a.bench_engine = a.bench_engine or os.path.join(os.path.dirname(a.tide), "bench_engine")
    levels = [int(x) for x in (a.clients or ("1,4" if a.quick else "1,4,16")).split(",")]
    if a.requests < 1 or a.max_tokens < 2 or a.rounds < 1 or min(levels) < 1:
        sys.exit("serve_load: --requests, --rounds and --clients must be positive, --max-tokens at least 2")
    if not os.access(a.tide, os.X_OK):
        sys.exit(f"serve_load: no tide binary at {a.tide} (--tide PATH)")

    model_dir = a.model or default_model_dir()
    if a.model is None and not (os.path.exists(os.path.join(model_dir, "model.safetensors")) and
                                os.path.exists(os.path.join(model_dir, "tokenizer.json"))):
        print(f"serve_load: generating the built-in model in {model_dir} (once)", file=sys.stderr)
        subprocess.run([a.tide, "run", "--prompt", "x", "--new-tokens", "1", "--backend", "cpu"],
                       check=True, stdout=subprocess.DEVNULL)
    fails = []
    t_all = time.perf_counter()
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = None
    rows, over = [], {}
    with tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        for names in (["m0"], ["m0", "m1"]):
            if len(names) > 1 and max(levels) == 1:
                break
            s = Server(a.tide, {n: model_dir for n in names}, a, tmp)
            try:
                for n in names:  # load and plan each model, touch its weights: not timed
                    _, st, text, _ = complete(s.port, n, a)
                    if st != 200:
                        fails.append(f"warm-up {n}: {st} {text}")
                for n in levels:
                    if len(names) > 1 and n == 1:
                        continue  # one client uses one model
                    r = load_level(s.port, names, n, a)
                    rows.append(r)
                    print(f"serve_load: {len(names)} model(s), {n} clients: {r['tokens_per_s']:.2f} tokens/s",
                          file=sys.stderr, flush=True)
                if len(names) == 1:
                    over = overhead(s, a, model_dir, fails)
            finally:
                s.stop()

    ref = over.pop("text") if over else None
    for r in rows:
        if r["bad"]:
            fails.append(f"{r['models']} model(s), {r['clients']} clients: statuses {r['bad']}")
    batch_note = check_texts(rows, ref, a.backend, a.max_batch, fails)

    print(f"\nmodel {model_dir}, {a.backend.upper()} backend, {a.threads} threads per model, budget {a.budget}, "
          f"max_tokens {a.max_tokens}, {a.requests} streamed request(s) per client"
          + (f", load average {load1:.2f} at start" if load1 is not None else ""))
    print(f"A model's requests waiting together run as one batch of up to {a.max_batch or 'the default 4'} "
          "(one forward per decode step). Two models run at once, on the same cores.\n")
    print("| models | clients | requests | tokens | tokens/s (aggregate) | latency p50 (s) | latency p99 (s) | TTFT p50 (s) |")
    print("|---|---|---|---|---|---|---|---|")
    f = lambda v: "-" if v is None else f"{v:.2f}"
    for r in rows:
        print(f"| {r['models']} | {r['clients']} | {r['ok']}/{r['requests']} | {r['tokens']} | "
              f"{r['tokens_per_s']:.2f} | {f(r['latency_p50_s'])} | {f(r['latency_p99_s'])} | {f(r['ttft_p50_s'])} |")
    if over:
        print(f"\n| overhead: {over['prompt_tokens']} + {a.max_tokens} tokens, one client, non-streamed | s |")
        print("|---|---|")
        print(f"| through the server, request to answer (median of {len(over['server_s'])}) | {over['server_median_s']:.3f} |")
        if over["library_s"] is not None:
            print(f"| library alone, warm (bench_engine, planned engine, median of {a.rounds} reps) | {over['library_s']:.3f} |")
        print(f"| tide run --json prefill_s + decode_s (one fresh process, cold) | {over['tide_run_s']:.3f} |")
        print(f"| overhead per request (server - {over['library_from']}) | {over['overhead_ms'] / 1e3:.3f} "
              f"({over['overhead_ms']:.0f} ms, {over['overhead_pct']:+.1f}%) |")
    if batch_note:
        print("\nnote: " + batch_note)
    for x in fails:
        print("FAIL: " + x)
    out = {"bench": "serve_load", "model": model_dir, "backend": a.backend, "threads": a.threads, "budget": a.budget,
           "max_tokens": a.max_tokens, "requests_per_client": a.requests, "loadavg_start": load1,
           "max_batch": a.max_batch or 4, "levels": rows, "overhead": over, "wall_s": time.perf_counter() - t_all,
           "batched_texts_note": batch_note, "checks_passed": not fails}
    line = json.dumps(out)
    print(line)
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(line + "\n")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
