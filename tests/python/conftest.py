"""Shared helpers of the Python package's tests: the fixtures and the CLI."""
import json
import os
import subprocess

import pytest

import tide

FX = os.environ.get("TIDE_FIXTURES") or os.path.join(os.path.dirname(__file__), "..", "fixtures")


def fx(*p):
    return os.path.join(FX, *p)


def cli(*args, ok=True):
    """Runs the tide program; returns (exit status, stdout, stderr)."""
    p = subprocess.run([tide.executable()] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    if ok:
        assert p.returncode == 0, p.stderr
    return p.returncode, p.stdout, p.stderr


def cli_json(*args):
    return [json.loads(ln) for ln in cli(*args)[1].splitlines() if ln.startswith("{")]


@pytest.fixture
def fixtures():
    return FX
