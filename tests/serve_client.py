#!/usr/bin/env python3
"""serve_client.py - drives `tide serve` over loopback HTTP (standard library
only) for tests/cli_serve.sh.

Usage: serve_client.py TIDE TMPDIR [openai] (TMPDIR holds models a/, b/ and
c/, each a small checkpoint with the built-in tokenizer; c has a's shape,
other weights).

With `openai` (tests/cli_serve_openai.sh): only OpenAI's own client (the
openai package) against one server on models a and b: completion, chat,
streamed chat with usage, each equal to `tide run`; exit status 77
(skipped) where the package is not installed.

Five servers, each on a free port (--port 0, the port read from the line the
server prints):
  1. both models under one budget, with --api-key: completions and chat,
     streamed and not, greedy text equal to `tide run --prompt` (and `tide
     run --chat`) on the same model; stop strings; concurrent clients on both
     models; a client that leaves mid-stream; bad requests (400, 404, 405,
     413, 401); /metrics as Prometheus text; /v1/models; a loop of 10,000
     requests (/health, malformed JSON, unknown model, no key, a wrong type,
     then 300 completions; 2000 under a sanitizer) each answered with its status, the server's
     resident memory before and after within RSS_MARGIN.
  2. --queue 1: a stream its client does not read holds model a, so a
     second request for a gets 503 while b still answers; then SIGTERM with
     that stream open: exit status 0 within 20 s, no spill file left.
  3. eviction: a, b and c where only two fit at a time, by --max-loaded 2,
     by a budget under policy tide (the minimums of two fit, not of three)
     and under policy equal (the pool refuses a third): requests alternating
     over the three all get tide run's greedy text, /metrics counts
     evictions, the log names the model evicted and why; with a and b held
     by streams, c gets 503 naming them (--max-loaded 2: then 200 once they
     end; policy equal: naming the budget too).
Prints "N passed, M failed"; exit status 1 on a failure.
Environment: TIDE_SERVE_BACKEND (default cpu) and TIDE_SERVE_BUDGET (default
64M) to run the same checks on a GPU (e.g. cuda and auto); TIDE_SANITIZE
set (a sanitized build): the memory margin is not checked.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

TIDE, TMP = sys.argv[1], sys.argv[2]
MODELS = {"a": os.path.join(TMP, "a"), "b": os.path.join(TMP, "b")}
ALL_MODELS = dict(MODELS, c=os.path.join(TMP, "c"))
KEY = "test-key-123"
N_LOOP, N_LOOP_GEN = 10000, 300  # requests in the loop, of which completions
if os.environ.get("TIDE_SANITIZE"):  # the sanitizer runs check the same paths, 5x shorter
    N_LOOP, N_LOOP_GEN = 2000, 60
RSS_MARGIN = 8 << 20  # resident memory may grow this much over the loop (allocator noise), no more
BACKEND = os.environ.get("TIDE_SERVE_BACKEND", "cpu")
BUDGET = os.environ.get("TIDE_SERVE_BUDGET", "64M")
PROMPT = "The planner moves tensors between memory tiers, ahead of time."
passes = fails = 0


def check(cond, what, detail=""):
    global passes, fails
    if cond:
        passes += 1
    else:
        fails += 1
        print(f"FAIL: {what}" + (f": {detail}" if detail else ""), flush=True)
    return cond


class Server:
    def __init__(self, name, extra, models=MODELS, budget=BUDGET):
        self.spill = os.path.join(TMP, "spill-" + name)
        os.makedirs(self.spill, exist_ok=True)
        self.err = open(os.path.join(TMP, name + ".err"), "w")
        args = [TIDE, "serve"] + [a for m in models for a in ("--model", f"{m}={models[m]}")] + [
                "--budget", str(budget), "--hw", "h100-80g", "--ssd", self.spill, "--port", "0", "--backend", BACKEND, "--threads", "1"] + extra
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err, text=True)
        line = self.p.stdout.readline()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/v1", line)
        if not m:
            self.p.wait(10)
            raise SystemExit(f"FAIL: the server did not start: [{line}] " + open(self.err.name).read())
        self.port = int(m.group(1))

    def rss(self):
        with open(f"/proc/{self.p.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


def request(port, method, path, body=None, key=KEY, raw=None, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    data = raw if raw is not None else (json.dumps(body) if body is not None else None)
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    b = r.read()
    if not conn:
        c.close()
    try:
        j = json.loads(b)
    except ValueError:
        j = None
    return r.status, j, b


def stream(port, path, body):
    """The events of a streamed answer: (chunks, got [DONE])."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    r = c.getresponse()
    check(r.status == 200, f"stream {path} status", r.status)
    check("text/event-stream" in (r.getheader("Content-Type") or ""), "stream content type")
    chunks, done = [], False
    for ev in r.read().decode().split("\n\n"):
        if not ev:
            continue
        check(ev.startswith("data: "), "event starts with 'data: '", ev[:40])
        data = ev[6:]
        if data == "[DONE]":
            done = True
        else:
            chunks.append(json.loads(data))
    c.close()
    return chunks, done


def stream_text(chunks, chat):
    if chat:
        return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    return "".join(c["choices"][0]["text"] for c in chunks)


def tide_run(model, prompt, n, chat=False):
    args = [TIDE, "run", "--model", ALL_MODELS[model], "--prompt", prompt, "--new-tokens", str(n), "--json",
            "--backend", BACKEND, "--threads", "1"] + (["--chat"] if chat else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    check(out.returncode == 0, "tide run", out.stderr[-300:])
    return json.loads(out.stdout)


def open_raw_stream(port, body, rcvbuf=None):
    """A stream read by hand: returns the socket after its first event."""
    s, got = start_raw_stream(port, body, rcvbuf)
    s.settimeout(30)
    check(b"200 OK" in got and b"data: " in got, "raw stream started", got[:80])
    return s


def metric(text, name, labels=""):
    m = re.search("^" + re.escape(name + labels) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def first_server():
    srv = Server("one", ["--ctx", "128", "--api-key", KEY])
    port = srv.port
    # before any request: both listed, neither loaded
    st, j, _ = request(port, "GET", "/v1/models")
    check(st == 200 and [m["id"] for m in j["data"]] == ["a", "b"], "/v1/models lists both", j)
    check(all(m["loaded"] is False for m in j["data"]), "models load lazily", j)
    st, j, _ = request(port, "GET", "/health", key=None)
    check(st == 200 and j == {"status": "ok"}, "/health without a key")

    # greedy completions equal tide run's text; streamed equals whole
    refs = {}
    for m in MODELS:
        ref = tide_run(m, PROMPT, 12)
        refs[m] = ref["text"]
        st, j, _ = request(port, "POST", "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12,
                                                              "temperature": 0})
        check(st == 200, f"completion {m}", j)
        if st != 200:
            continue
        c = j["choices"][0]
        check(j["object"] == "text_completion" and j["model"] == m and j["id"], f"completion {m} shape", j)
        check(c["text"] == ref["text"], f"completion {m} equals tide run --prompt", f"{c['text']!r} vs {ref['text']!r}")
        check(c["finish_reason"] == ("length" if ref["stop_reason"] == "length" else "stop"), f"finish {m}", c)
        u = j["usage"]
        check(u["prompt_tokens"] == ref["prompt_tokens"] and u["completion_tokens"] == len(ref["tokens"])
              and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], f"usage {m}", u)
        chunks, done = stream(port, "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12})
        check(done and stream_text(chunks, False) == ref["text"], f"streamed completion {m} equals whole")
        check(chunks and chunks[-1]["choices"][0]["finish_reason"] == c["finish_reason"], f"stream finish {m}")
        check(all("usage" not in ch for ch in chunks), f"stream {m}: no usage unless asked for")
        # stream_options.include_usage: OpenAI's last chunk, no choices and the usage
        chunks, done = stream(port, "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12,
                                                        "stream_options": {"include_usage": True}})
        check(done and len(chunks) >= 2 and chunks[-1]["choices"] == [] and chunks[-1]["usage"] == u,
              f"stream {m} with include_usage: a last chunk with the usage", chunks[-1:])
        check(all(ch["usage"] is None for ch in chunks[:-1]), f"stream {m} with include_usage: usage null before")
        check(stream_text(chunks[:-1], False) == ref["text"], f"stream {m} with include_usage: the text")
        # chat: greedy equals tide run --chat
        cref = tide_run(m, "Hello", 8, chat=True)
        body = {"model": m, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
        st, j, _ = request(port, "POST", "/v1/chat/completions", body)
        check(st == 200 and j["object"] == "chat.completion", f"chat {m}", j)
        if st == 200:
            msg = j["choices"][0]["message"]
            check(msg["role"] == "assistant" and msg["content"] == cref["text"], f"chat {m} equals tide run --chat",
                  f"{msg['content']!r} vs {cref['text']!r}")
        chunks, done = stream(port, "/v1/chat/completions", body)
        check(done and chunks and chunks[0]["choices"][0]["delta"].get("role") == "assistant", f"chat stream {m} role")
        check(all(c["object"] == "chat.completion.chunk" for c in chunks), f"chat chunks {m}")
        check(stream_text(chunks, True) == cref["text"], f"streamed chat {m} equals tide run --chat")
    st, j, _ = request(port, "GET", "/v1/models")
    check(all(m["loaded"] for m in j["data"]), "models loaded after use", j)

    # a stop string: the text ends before it
    full = refs["a"]
    stop = full[6:9]
    if check(stop.strip() != "", "a usable stop string", repr(full)):
        st, j, _ = request(port, "POST", "/v1/completions", {"model": "a", "prompt": PROMPT, "max_tokens": 12,
                                                              "stop": [stop, "zzqq"]})
        check(st == 200 and j["choices"][0]["text"] == full.split(stop)[0]
              and j["choices"][0]["finish_reason"] == "stop", "stop string", j)
    # sampling: seeded requests repeat
    body = {"model": "b", "prompt": PROMPT, "max_tokens": 16, "temperature": 1.3, "top_p": 0.9, "top_k": 50,
            "seed": 5, "frequency_penalty": 0.2, "presence_penalty": 0.1, "repetition_penalty": 1.1}
    t1 = request(port, "POST", "/v1/completions", body)[1]
    t2 = request(port, "POST", "/v1/completions", body)[1]
    check(t1 and t2 and t1["choices"][0]["text"] == t2["choices"][0]["text"], "seeded sampling repeats")

    # concurrent clients on both models
    results = []

    def worker(m, k):
        for i in range(3):
            if (i + k) % 2:
                chunks, done = stream(port, "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12})
                results.append((m, stream_text(chunks, False) if done else None))
            else:
                st, j, _ = request(port, "POST", "/v1/completions", {"model": m, "prompt": PROMPT, "max_tokens": 12})
                results.append((m, j["choices"][0]["text"] if st == 200 else None))
    ths = [threading.Thread(target=worker, args=(m, k)) for m in MODELS for k in range(2)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(120)
    check(len(results) == 12 and all(t == refs[m] for m, t in results), "concurrent clients get the greedy text",
          [r for r in results if r[1] != refs[r[0]]][:2])
    text = request(port, "GET", "/metrics")[2].decode()
    nb = [metric(text, "tide_model_batches_total", f'{{model="{m}"}}') for m in MODELS]
    check(all(v is not None for v in nb), "/metrics counts each model's batches", nb)
    print(f"  concurrent clients: batches of several requests per model {nb}")

    # a client that leaves mid-stream: the server goes on
    s = open_raw_stream(port, {"model": "a", "prompt": PROMPT, "max_tokens": 100})
    s.close()
    st, j, _ = request(port, "POST", "/v1/completions", {"model": "a", "prompt": PROMPT, "max_tokens": 12})
    check(st == 200 and j["choices"][0]["text"] == refs["a"], "answers after a client left mid-stream")
    depth = None
    for _ in range(100):
        text = request(port, "GET", "/metrics")[2].decode()
        depth = metric(text, "tide_queue_depth", '{model="a"}')
        if depth == 0:
            break
        time.sleep(0.05)
    check(depth == 0, "the stream left is freed (queue depth 0)", depth)

    # bad requests
    def bad(what, status, body=None, raw=None, path="/v1/completions", key=KEY, method="POST", text=None):
        st, j, b = request(port, method, path, body, key=key, raw=raw)
        ok = check(st == status, f"{what}: status", f"{st} (wanted {status}) {b[:200]!r}")
        ok = ok and check(j is not None and isinstance(j.get("error"), dict) and j["error"].get("message")
                          and j["error"].get("type"), f"{what}: error JSON", b[:200])
        if ok and text:
            check(text in j["error"]["message"], f"{what}: message names {text}", j["error"]["message"])
    bad("malformed JSON", 400, raw='{"model": "a", "prompt": ')
    bad("not an object", 400, raw="[1, 2]")
    bad("prompt of the wrong type", 400, {"model": "a", "prompt": 5}, text="'prompt'")
    bad("max_tokens of the wrong type", 400, {"model": "a", "prompt": "x", "max_tokens": "many"}, text="'max_tokens'")
    bad("temperature of the wrong type", 400, {"model": "a", "prompt": "x", "temperature": "hot"}, text="'temperature'")
    bad("stream of the wrong type", 400, {"model": "a", "prompt": "x", "stream": 1}, text="'stream'")
    bad("stream_options without stream", 400, {"model": "a", "prompt": "x", "stream_options": {"include_usage": True}},
        text="'stream_options'")
    bad("include_usage of the wrong type", 400, {"model": "a", "prompt": "x", "stream": True,
                                                  "stream_options": {"include_usage": "yes"}}, text="include_usage")
    bad("stop of the wrong type", 400, {"model": "a", "prompt": "x", "stop": 3}, text="'stop'")
    bad("top_p out of range", 400, {"model": "a", "prompt": "x", "top_p": 2}, text="'top_p'")
    bad("n = 2", 400, {"model": "a", "prompt": "x", "n": 2}, text="'n'")
    bad("echo asked for", 400, {"model": "a", "prompt": "x", "echo": True}, text="'echo'")
    bad("logprobs asked for", 400, {"model": "a", "prompt": "x", "logprobs": 2}, text="'logprobs'")
    bad("missing model", 400, {"prompt": "x"}, text="'model'")
    bad("messages of the wrong type", 400, {"model": "a", "messages": "hi"}, path="/v1/chat/completions",
        text="'messages'")
    bad("a bad role", 400, {"model": "a", "messages": [{"role": "robot", "content": "hi"}]},
        path="/v1/chat/completions", text="role")
    bad("unknown model", 404, {"model": "nope", "prompt": "x"}, text="nope")
    bad("unknown path", 404, {}, path="/v1/nothing")
    bad("wrong method", 405, None, path="/v1/completions", method="GET")
    bad("oversize body", 413, raw=json.dumps({"model": "a", "prompt": "x" * (3 << 19)}))
    bad("prompt longer than the context", 400, {"model": "a", "prompt": " ".join(["tensor"] * 400)}, text="context")
    bad("max_tokens beyond the context", 400, {"model": "a", "prompt": PROMPT, "max_tokens": 1000}, text="context")
    # strict parsing: a NUL in a string is refused naming the field; exactly one JSON value
    bad("a NUL in the model name", 400, raw='{"model": "a\\u0000x", "prompt": "x"}', text="'model'")
    bad("a NUL in the prompt", 400, raw='{"model": "a", "prompt": "x\\u0000y"}', text="'prompt'")
    bad("a NUL in a message", 400, raw='{"model": "a", "messages": [{"role": "user", "content": "hi"}, '
        '{"role": "user", "content": "a\\u0000"}]}', path="/v1/chat/completions", text="'messages[1].content'")
    bad("a raw NUL in a stop string", 400, raw='{"model": "a", "prompt": "x", "stop": ["ok", "s\x00t"]}',
        text="'stop[1]'")
    bad("bytes after the JSON object", 400, raw='{"model": "a", "prompt": "x"}\x00garbage', text="after")
    bad("a second JSON value", 400, raw='{"model": "a", "prompt": "x"} {}', text="after")
    st, j, b = request(port, "POST", "/v1/completions", None, key=KEY,
                       raw='{"model": "a", "prompt": "x\\\\u0000", "max_tokens": 2}')
    check(st == 200, "an escaped backslash before u0000 is text: 200", f"{st} {b[:200]!r}")
    # two framings of one body: Transfer-Encoding and Content-Length together get 400 naming both
    body = json.dumps({"model": "a", "prompt": "x", "max_tokens": 2}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
              + b"\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
              % (len(body), len(body), body))
    got = b""
    while True:
        piece = s.recv(4096)
        if not piece:
            break
        got += piece
    s.close()
    head, _, rest = got.partition(b"\r\n\r\n")
    try:
        msg = json.loads(rest)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = ""
    check(head.startswith(b"HTTP/1.1 400") and "Transfer-Encoding" in msg and "Content-Length" in msg,
          "Transfer-Encoding with Content-Length: 400 naming both", got[:300])
    bad("no key", 401, None, path="/v1/models", method="GET", key=None)
    bad("wrong key", 401, {"model": "a", "prompt": "x"}, key="wrong")

    # /metrics: Prometheus text, requests counted
    st, _, b = request(port, "GET", "/metrics")
    text = b.decode()
    line_re = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
                         r'(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*\})? -?[0-9.eE+-]+$')
    badl = [l for l in text.splitlines() if l and not l.startswith("# HELP ") and not l.startswith("# TYPE ")
            and not line_re.match(l)]
    check(st == 200 and not badl, "/metrics parses as Prometheus text", badl[:3])
    n_ok = metric(text, "tide_requests_total", '{endpoint="/v1/completions",status="200"}')
    check(n_ok is not None and n_ok >= 20, "/metrics counts completions", n_ok)
    check((metric(text, "tide_requests_total", '{endpoint="/v1/completions",status="400"}') or 0) >= 8,
          "/metrics counts 400s")
    check(metric(text, "tide_requests_total", '{endpoint="/v1/models",status="401"}') == 1, "/metrics counts 401s")
    for m in MODELS:
        for name in ("tide_model_share_bytes", "tide_model_held_bytes", "tide_tokens_generated_total"):
            check(metric(text, name, f'{{model="{m}"}}') is not None, f"/metrics has {name} of {m}")
    for name in ("tide_replans_total", "tide_drifted_total", "tide_pool_budget_bytes"):
        check(metric(text, name) is not None, f"/metrics has {name}")
    if BUDGET == "64M":
        check(metric(text, "tide_pool_budget_bytes") == 64 << 20, "/metrics budget")

    # a few thousand small requests: resident memory stays put
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for i in range(50):
        request(port, "POST", "/v1/completions", {"model": "ab"[i % 2], "prompt": PROMPT, "max_tokens": 4}, conn=c)
        request(port, "GET", "/health", conn=c)
    before = srv.rss()
    # 10,000 requests in a loop: every status answered as it should be
    kinds = [("GET", "/health", None, KEY, None, 200),
             ("POST", "/v1/completions", None, KEY, "{not json", 400),
             ("POST", "/v1/completions", {"model": "nope", "prompt": PROMPT}, KEY, None, 404),
             ("POST", "/v1/completions", {"model": "a", "prompt": PROMPT}, None, None, 401),
             ("POST", "/v1/completions", {"model": "a", "prompt": 7}, KEY, None, 400)]
    ok, bad = 0, []
    for i in range(N_LOOP - N_LOOP_GEN):
        method, path, body, key, raw, want = kinds[i % len(kinds)]
        st = request(port, method, path, body, key=key, raw=raw, conn=c)[0]
        ok += st == want
        if st != want and len(bad) < 3:
            bad.append((path, want, st))
    for i in range(N_LOOP_GEN):
        st = request(port, "POST", "/v1/completions", {"model": "ab"[i % 2], "prompt": PROMPT, "max_tokens": 4},
                     conn=c)[0]
        ok += st == 200
    c.close()
    after = srv.rss()
    check(ok == N_LOOP, f"{N_LOOP} requests in a loop answered with the right status (200/400/401/404)", bad)
    if os.environ.get("TIDE_SANITIZE"):
        print("skipped: the memory margin under a sanitizer (its quarantine keeps freed memory)", flush=True)
    else:
        check(after <= before + RSS_MARGIN, f"resident memory within {RSS_MARGIN >> 20} MiB over {N_LOOP} requests",
              f"{before} -> {after}")
    print(f"rss: {before >> 10} KiB before, {after >> 10} KiB after {N_LOOP} requests ({N_LOOP_GEN} completions)",
          flush=True)

    srv.p.send_signal(signal.SIGINT)
    rc = srv.p.wait(30)
    check(rc == 0, "SIGINT: exit status 0", rc)
    check(os.listdir(srv.spill) == [], "no spill file left", os.listdir(srv.spill))
    return refs


def openai_part(port, refs):
    import openai
    cl = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY)
    for m in MODELS:
        r = cl.completions.create(model=m, prompt=PROMPT, max_tokens=12, temperature=0)
        check(r.choices[0].text == refs[m], f"openai completion {m}", r.choices[0].text)
        r = cl.chat.completions.create(model=m, messages=[{"role": "user", "content": "Hello"}], max_tokens=8)
        whole = r.choices[0].message.content
        check(isinstance(whole, str) and r.usage.completion_tokens >= 1, f"openai chat {m}")
        parts = [ch.choices[0].delta.content or "" for ch in cl.chat.completions.create(
            model=m, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, stream=True) if ch.choices]
        check("".join(parts) == whole, f"openai streamed chat {m} equals whole")
        last = list(cl.chat.completions.create(model=m, messages=[{"role": "user", "content": "Hello"}], max_tokens=8,
                                               stream=True, stream_options={"include_usage": True}))[-1]
        check(last.usage is not None and last.usage.completion_tokens == r.usage.completion_tokens
              and last.usage.prompt_tokens == r.usage.prompt_tokens, f"openai stream {m} with include_usage", last)
    print("openai package: completion, chat, streamed chat (with usage) on both models", flush=True)


def second_server():
    srv = Server("two", ["--ctx", "512", "--queue", "1", "--shutdown-grace", "1"])
    port = srv.port
    # a stream whose client reads nothing more: its producer is held, model a busy
    s = open_raw_stream(port, {"model": "a", "prompt": PROMPT, "max_tokens": 480}, rcvbuf=2048)
    st, j, _ = request(port, "POST", "/v1/completions", {"model": "a", "prompt": PROMPT, "max_tokens": 4})
    check(st == 503 and j and j["error"]["type"], "queue full: 503", (st, j))
    st, j, _ = request(port, "POST", "/v1/completions", {"model": "b", "prompt": PROMPT, "max_tokens": 4})
    check(st == 200, "the other model still answers", (st, j))
    srv.p.send_signal(signal.SIGTERM)
    try:
        rc = srv.p.wait(20)
    except subprocess.TimeoutExpired:
        srv.p.kill()
        rc = "hung"
    s.close()
    check(rc == 0, "SIGTERM during a stream: exit status 0", rc)
    check(os.listdir(srv.spill) == [], "no spill file left after SIGTERM", os.listdir(srv.spill))


def start_raw_stream(port, body, rcvbuf=None):
    """A stream read by hand: (socket, bytes so far, up to its first event);
    rcvbuf: a small receive buffer, for a client that stops reading."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(60)
    s.connect(("127.0.0.1", port))
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while b"data: " not in got:
        piece = s.recv(4096)
        if not piece:
            break
        got += piece
    return s, got


def read_to_end(s, got):
    """got and everything the server sends on s until it closes it (or 60 s)."""
    try:
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            got += piece
    except OSError:
        pass
    s.close()
    return got


def dechunk(raw):
    """(status line, body, whether the chunked body ended with its last chunk)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = b""
    while True:
        line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return head.split(b"\r\n")[0], body, False
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            return head.split(b"\r\n")[0], body, False
        if n == 0:
            return head.split(b"\r\n")[0], body, rest.startswith(b"\r\n")
        body, rest = body + rest[:n], rest[n + 2:]


def shutdown_servers():
    """SIGTERM with streams in flight: each ends whole; a second signal skips the grace."""
    body = {"model": "a", "prompt": PROMPT, "max_tokens": 4000}
    srv = Server("stop", ["--ctx", "4096", "--shutdown-grace", "0"])
    socks = [start_raw_stream(srv.port, body) for _ in range(4)]
    out = [None] * len(socks)
    readers = [threading.Thread(target=lambda i=i: out.__setitem__(i, read_to_end(*socks[i])))
               for i in range(len(socks))]
    for t in readers:
        t.start()
    srv.p.send_signal(signal.SIGTERM)
    for t in readers:
        t.join()
    try:
        rc = srv.p.wait(30)
    except subprocess.TimeoutExpired:
        srv.p.kill()
        rc = "hung"
    for i, got in enumerate(out):
        status, body_bytes, ended = dechunk(got)
        check(b" 200 " in status, f"SIGTERM: stream {i} was answered 200", status)
        events = [e for e in body_bytes.split(b"\n\n") if e]
        finish = [json.loads(e[6:])["choices"][0].get("finish_reason") for e in events[:-1]
                  if e.startswith(b"data: {")]
        check(events and events[-1] == b"data: [DONE]", f"SIGTERM: stream {i} ends with data: [DONE]", got[-200:])
        check(finish and finish[-1] in ("length", "stop"), f"SIGTERM: stream {i} has a last chunk with its "
              "finish_reason", finish[-3:])
        check(ended, f"SIGTERM: stream {i} ends its chunked body with the last chunk", got[-40:])
    check(rc == 0, "SIGTERM with streams in flight: exit status 0", rc)
    check(os.listdir(srv.spill) == [], "SIGTERM with streams in flight: no spill file left", os.listdir(srv.spill))
    # a request whose body is still arriving holds the 60 s grace: a second
    # SIGTERM ends the wait (the bound below is far under the grace)
    srv = Server("stop2", ["--ctx", "512", "--shutdown-grace", "60"])
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n\r\n".encode() + b'{"model": "a",')
    time.sleep(0.3)
    srv.p.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    check(srv.p.poll() is None, "the grace: still running 0.5 s after SIGTERM with a stream in flight",
          open(srv.err.name).read()[-600:])
    t0 = time.time()
    srv.p.send_signal(signal.SIGTERM)
    try:
        rc = srv.p.wait(30)
    except subprocess.TimeoutExpired:
        srv.p.kill()
        rc = "hung"
    s.close()
    check(rc == 0, "a second SIGTERM: exit status 0", rc)
    check(time.time() - t0 < 30, "a second SIGTERM: the grace is not waited out")
    check(os.listdir(srv.spill) == [], "a second SIGTERM: no spill file left", os.listdir(srv.spill))
    check("stopping at once" in open(srv.err.name).read(), "a second SIGTERM: the log says it stops at once")


def timeout_server():
    """--timeout: a request dribbled a byte at a time is cut off; an idle connection is not."""
    srv = Server("slow", ["--ctx", "512", "--timeout", "2", "--keep-alive", "60"])
    idle = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    slow = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    req = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 200 + b"\r\n\r\n"
    t0, cut = time.time(), False
    for i in range(len(req) - 4):  # never the whole request
        try:
            slow.sendall(req[i:i + 1])
            slow.settimeout(0.5)
            if slow.recv(1024) == b"":
                cut = True
                break
        except socket.timeout:
            pass
        except OSError:
            cut = True
            break
        if time.time() - t0 > 30:
            break
    check(cut, "--timeout 2: a request sent a byte at a time is cut off")
    check(time.time() - t0 < 20, "--timeout 2: cut off well before 20 s", time.time() - t0)
    slow.close()
    # the idle connection, older than the timeout, still takes a request
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    idle.settimeout(30)
    got = idle.recv(4096)
    check(got.startswith(b"HTTP/1.1 200"), "--timeout 2: an idle connection kept (--keep-alive 60) is answered",
          got[:80])
    idle.close()
    log = stop(srv, "--timeout")
    check("cut off by --timeout" in log, "--timeout: the log counts the connection cut off", log[-300:])


def idle_flood_server():
    """1,100 connections that send nothing: /health and a completion still answered, on a few threads;
    then 200 clients leave mid-stream: resident memory within RSS_MARGIN."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1100 + 64
    if soft < want:
        try:  # the hard limit too where it is lower (root may raise it)
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard if hard == resource.RLIM_INFINITY or hard >= want
                                                        else want))
        except (ValueError, OSError) as e:
            check(False, "1,100 idle connections: the test's open-file limit", (soft, hard, e))
            return
    srv = Server("flood", ["--ctx", "512"])
    idle = []
    for _ in range(1100):
        idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=30))
    time.sleep(0.5)
    st, j, _ = request(srv.port, "GET", "/health")
    check(st == 200, "1,100 idle connections held: /health answered", st)
    st, j, _ = request(srv.port, "POST", "/v1/completions", {"model": "a", "prompt": PROMPT, "max_tokens": 4})
    check(st == 200, "1,100 idle connections held: a completion answered", (st, j))
    with open(f"/proc/{srv.p.pid}/status") as f:
        threads = int(next(line for line in f if line.startswith("Threads:")).split()[1])
    check(threads < 100, "1,100 idle connections: the server's threads stay few (no thread per connection)", threads)
    for c in idle:
        c.close()
    # 200 clients that leave mid-stream: each generation ends, nothing kept
    def leave():
        c, got = start_raw_stream(srv.port, {"model": "a", "prompt": PROMPT, "max_tokens": 400})
        c.close()
    leave()
    time.sleep(0.5)
    before = srv.rss()
    for _ in range(200):
        leave()
    deadline = time.time() + 30
    while time.time() < deadline:  # the last producers end at their next token
        st, _, b = request(srv.port, "GET", "/metrics")
        if metric(b.decode(), "tide_queue_depth", '{model="a"}') == 0:
            break
        time.sleep(0.1)
    after = srv.rss()
    check(metric(b.decode(), "tide_queue_depth", '{model="a"}') == 0, "200 clients leaving mid-stream: none in flight after")
    if not os.environ.get("TIDE_SANITIZE"):
        check(after <= before + RSS_MARGIN, f"resident memory within {RSS_MARGIN >> 20} MiB over 200 clients leaving "
              "mid-stream", f"{before >> 10} KiB before, {after >> 10} KiB after")
    print(f"rss: {before >> 10} KiB before, {after >> 10} KiB after 200 clients left mid-stream", flush=True)
    stop(srv, "1,100 idle connections")


def per_client_server():
    """--per-client 4: a fifth connection from 127.0.0.2 is answered 503; 127.0.0.1 is never limited."""
    srv = Server("perclient", ["--ctx", "512", "--per-client", "4"])

    def conn_from(src):
        c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        c.settimeout(30)
        c.bind((src, 0))
        c.connect(("127.0.0.1", srv.port))
        return c
    held = [conn_from("127.0.0.2") for _ in range(4)]
    time.sleep(1)  # accepted (and counted) before the fifth arrives
    fifth = conn_from("127.0.0.2")
    fifth.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = b""
    try:
        while True:
            piece = fifth.recv(4096)
            if not piece:
                break
            got += piece
    except OSError:
        pass
    fifth.close()
    check(got.startswith(b"HTTP/1.1 503"), "--per-client 4: the fifth connection of 127.0.0.2 gets 503", got[:120])
    check(b"per-client" in got and b"server_overloaded" in got, "--per-client: the 503 says why", got[-200:])
    loop = [socket.create_connection(("127.0.0.1", srv.port), timeout=30) for _ in range(8)]
    st, _, _ = request(srv.port, "GET", "/health")
    check(st == 200, "--per-client 4: 127.0.0.1 with 9 connections is not limited", st)
    # one of 127.0.0.2's connections closed: it may open another
    held.pop().close()
    time.sleep(1)  # its close seen by the server
    again = conn_from("127.0.0.2")
    again.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    got = again.recv(4096)
    check(got.startswith(b"HTTP/1.1 200"), "--per-client 4: under the limit again, 127.0.0.2 is answered", got[:80])
    again.close()
    for c in held + loop:
        c.close()
    stop(srv, "--per-client")


def stop(srv, what):
    srv.p.send_signal(signal.SIGTERM)
    rc = srv.p.wait(30)
    check(rc == 0, f"{what}: SIGTERM, exit status 0", rc)
    check(os.listdir(srv.spill) == [], f"{what}: no spill file left", os.listdir(srv.spill))
    return open(srv.err.name).read()


def alternate(port, refs, what):
    """Requests over a, b, c in turn, twice (one of each streamed): each must
    get its model's greedy text."""
    bad = []
    for i, m in enumerate("abcabc"):
        body = {"model": m, "prompt": PROMPT, "max_tokens": 12}
        if i >= 3:
            chunks, done = stream(port, "/v1/completions", body)
            got = stream_text(chunks, False) if done else None
        else:
            st, j, b = request(port, "POST", "/v1/completions", body)
            got = j["choices"][0]["text"] if st == 200 else (st, b[:300])
        if got != refs[m]:
            bad.append((m, got, refs[m]))
    check(not bad, f"{what}: requests alternating over three models get tide run's text", bad[:2])
    st, j, _ = request(port, "GET", "/v1/models")
    check(st == 200 and all(isinstance(m.get("evictions"), int) for m in j["data"])
          and sum(m["evictions"] for m in j["data"]) > 0, f"{what}: /v1/models reports evictions", j)
    return j


def evicting_servers(refs):
    refs = dict(refs, c=tide_run("c", PROMPT, 12)["text"])
    check(refs["c"] != refs["a"], "c's greedy text differs from a's (other weights)", refs["c"])
    # --max-loaded 2 (a budget that holds all three)
    srv = Server("lru", ["--ctx", "512", "--max-loaded", "2"], models=ALL_MODELS)
    j = alternate(srv.port, refs, "--max-loaded 2")
    check(sum(m["loaded"] for m in j["data"]) == 2, "--max-loaded 2: two models loaded", j)
    text = request(srv.port, "GET", "/metrics")[2].decode()
    n = metric(text, "tide_evictions_total")
    check(n is not None and n >= 4, "--max-loaded 2: /metrics counts the evictions", n)
    check(metric(text, "tide_model_evictions_total", '{model="a"}') >= 1, "--max-loaded 2: a's evictions")
    # the minimums at this context (a and c share a shape; two of the three are loaded)
    mins = {m: int(metric(text, "tide_model_min_bytes", f'{{model="{m}"}}') or 0) for m in "abc"}
    mins["a"] = max(mins["a"], mins["c"])
    # a and b held by streams their clients do not read: c has nothing to evict
    held = [open_raw_stream(srv.port, {"model": m, "prompt": PROMPT, "max_tokens": 480}, rcvbuf=2048) for m in "ab"]
    st, j, _ = request(srv.port, "POST", "/v1/completions", {"model": "c", "prompt": PROMPT, "max_tokens": 4})
    msg = j["error"]["message"] if j and isinstance(j.get("error"), dict) else ""
    check(st == 503 and "--max-loaded 2" in msg and "a (" in msg and "b (" in msg,
          "no model idle: 503 naming the limit and the models holding it", (st, msg))
    for h in held:
        h.close()
    for _ in range(200):
        if metric(request(srv.port, "GET", "/metrics")[2].decode(), "tide_queue_depth", '{model="a"}') == 0:
            break
        time.sleep(0.05)
    st, j, _ = request(srv.port, "POST", "/v1/completions", {"model": "c", "prompt": PROMPT, "max_tokens": 12})
    check(st == 200 and j["choices"][0]["text"] == refs["c"], "c loads once a model is idle again", (st, j))
    log = stop(srv, "--max-loaded 2")
    check(re.search(r"evicted [ab] \(least recently used, no request\): --max-loaded 2 reached, loading c", log),
          "--max-loaded 2: the log says which model was evicted and why", log[-600:])
    if not check(mins["a"] and mins["b"], "the models' minimums read from /metrics", mins):
        return
    # a budget that holds the minimums of two of them (a and c share a shape), not of three
    budget = 2 * mins["a"] + mins["b"] // 2
    for policy, why in (("tide", r"the loaded models' minimums with \w's come to .*, over the budget of"),
                        ("equal", r"the pool refused \w beside it: policy equal")):
        srv = Server("budget-" + policy, ["--ctx", "512", "--policy", policy], models=ALL_MODELS, budget=budget)
        alternate(srv.port, refs, f"policy {policy}, budget {budget}")
        text = request(srv.port, "GET", "/metrics")[2].decode()
        check((metric(text, "tide_evictions_total") or 0) > 0, f"policy {policy}: /metrics counts evictions")
        check(metric(text, "tide_pool_time_sliced") == 0, f"policy {policy}: the loaded models fit together")
        if policy == "equal":
            # a and b held by streams: the pool refuses c and nothing can go
            held = [open_raw_stream(srv.port, {"model": m, "prompt": PROMPT, "max_tokens": 480}, rcvbuf=2048)
                    for m in "ab"]
            st, j, _ = request(srv.port, "POST", "/v1/completions", {"model": "c", "prompt": PROMPT, "max_tokens": 4})
            msg = j["error"]["message"] if j and isinstance(j.get("error"), dict) else ""
            check(st == 503 and "budget of" in msg and "held by a (" in msg and "b (" in msg,
                  "policy equal, no model idle: 503 naming the budget and the models holding it", (st, msg))
            for h in held:
                h.close()
        log = stop(srv, f"policy {policy}")
        check(re.search(r"evicted [abc] \(least recently used, no request\): " + why, log),
              f"policy {policy}: the log says which model was evicted and why", log[-600:])


def openai_only():
    try:
        import openai  # noqa: F401
    except ImportError:
        print("skipped: the openai package is not installed", flush=True)
        sys.exit(77)
    srv = Server("openai", ["--ctx", "128", "--api-key", KEY])
    refs = {m: tide_run(m, PROMPT, 12)["text"] for m in MODELS}
    openai_part(srv.port, refs)
    srv.p.send_signal(signal.SIGINT)
    check(srv.p.wait(30) == 0, "SIGINT: exit status 0")


if len(sys.argv) > 3 and sys.argv[3] == "openai":
    openai_only()
else:
    refs = first_server()
    second_server()
    shutdown_servers()
    timeout_server()
    idle_flood_server()
    per_client_server()
    evicting_servers(refs)
print(f"{passes} passed, {fails} failed")
sys.exit(1 if fails else 0)
