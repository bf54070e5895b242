"""The examples in examples/ run and do what their docstrings say."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="no source tree beside tests/ (a wheel's copy of the tests)")
def test_a_producer_and_a_group_of_consumer_processes(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "consumer_group.py"), "--messages", "2400",
                        "--consumers", "3", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[-1] == "2,400 handled of 2,400 put"  # exactly once: no member died
    shares = [int(line.split(": ")[1].split()[0].replace(",", "")) for line in lines[:-1]]
    assert len(shares) == 3 and sum(shares) == 2400
