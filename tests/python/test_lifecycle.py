"""1,000 opens and closes of a model keep the process's memory flat; Ctrl-C
(SIGINT to a subprocess) during a generation ends it with KeyboardInterrupt
and leaves nothing behind."""
import os
import signal
import subprocess
import sys
import textwrap

import tide
from conftest import fx

# what 1,000 cycles may add to the resident set: 4 MiB, 4 KiB a cycle (a
# leaked context, checkpoint or model would be far more: each maps the
# checkpoint and allocates its tables)
RSS_MARGIN = 4 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def cycle(path):
    with tide.Model(path, backend="cpu", threads=1) as m:
        m.forward([1, 2])


def test_open_close_1000_rss_flat():
    path = fx("tiny-f16-sharded")
    for _ in range(50):  # warm-up: allocator arenas, lazily loaded code
        cycle(path)
    before = rss()
    for _ in range(1000):
        cycle(path)
    after = rss()
    print("RSS before %.1f MiB, after 1000 cycles %.1f MiB" % (before / 2**20, after / 2**20))
    assert after - before <= RSS_MARGIN, (before, after)


CHILD = textwrap.dedent("""
    import sys, threading, tide
    m = tide.Model(sys.argv[1], backend="cpu", threads=1)
    prompt = list(range(1, 9))
    print("ready", flush=True)
    inside = False
    while True:
        try:
            inside = True
            m.generate(prompt, max_new_tokens=m.max_positions - len(prompt))
            inside = False
        except KeyboardInterrupt:
            if not inside:
                print("outside", flush=True)  # between two generations: try again
                continue
            break
    # nothing left: no generating thread, the model usable again
    assert threading.active_count() == 1, threading.enumerate()
    g = m.generate(prompt, max_new_tokens=4)
    assert len(g.tokens) == 4
    m.close()
    print("interrupted cleanly", flush=True)
""")


def test_ctrl_c_stops_a_generation():
    p = subprocess.Popen([sys.executable, "-c", CHILD, fx("tiny-f32-mha")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=os.environ)
    assert p.stdout.readline().strip() == "ready"
    for _ in range(20):
        import time
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        if line != "outside":
            break
    out, err = p.communicate(timeout=60)
    assert line == "interrupted cleanly", (line, out, err)
    assert p.returncode == 0, err


def test_python_m_tide():
    p = subprocess.run([sys.executable, "-m", "tide", "--version"], capture_output=True, text=True, env=os.environ)
    assert p.returncode == 0 and p.stdout.strip()
    p = subprocess.run([sys.executable, "-m", "tide", "run", "--frobnicate"], capture_output=True, text=True,
                       env=os.environ)
    assert p.returncode == 2 and "unknown option" in p.stderr


def test_ctrl_c_while_stopping_a_generation(monkeypatch):
    """Ctrl-C while the generating thread is waited for (here: a second one
    during the join that the first one started) still ends the call only
    after that thread has ended: none outlives the KeyboardInterrupt, nothing
    is freed under it, the model generates again. Both interrupts are raised
    at fixed points of the wait (no signal timing)."""
    import queue
    import threading
    m = tide.Model(fx("tiny-f32-mha"), backend="cpu", threads=1)
    prompt = list(range(1, 9))
    hits = {"get": 0, "join": 0}
    real_get, real_join = queue.Queue.get, threading.Thread.join

    def get(self, *a, **k):  # the first wait on the generation's queue: Ctrl-C
        if threading.current_thread() is threading.main_thread() and hits["get"] == 0:
            hits["get"] += 1
            raise KeyboardInterrupt
        return real_get(self, *a, **k)

    def join(self, *a, **k):  # the first join of the generating thread: Ctrl-C again
        if self.name == "tide-generate" and hits["join"] == 0:
            hits["join"] += 1
            raise KeyboardInterrupt
        return real_join(self, *a, **k)

    monkeypatch.setattr(queue.Queue, "get", get)
    monkeypatch.setattr(threading.Thread, "join", join)
    try:
        m.generate(prompt, max_new_tokens=m.max_positions - len(prompt))
        raise AssertionError("no KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    assert hits == {"get": 1, "join": 1}
    assert not [t for t in threading.enumerate() if t.name == "tide-generate"], threading.enumerate()
    monkeypatch.undo()
    assert len(m.generate(prompt, max_new_tokens=4).tokens) == 4
    m.close()
