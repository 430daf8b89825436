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
