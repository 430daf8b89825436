"""report.py - the end both reports of bench/peer_llamacpp.sh share: the
failures, then one JSON line per configuration on stdout (and appended to the
--json file), and the exit status (1 when anything failed)."""
import json
import sys


def finish(lines, fails, json_path):
    for f in fails:
        print(f"FAILED: {f}")
    print()
    out = open(json_path, "a") if json_path else None
    for line in lines:
        s = json.dumps(line, separators=(",", ":"))
        print(s)
        if out:
            out.write(s + "\n")
    sys.exit(1 if fails else 0)
