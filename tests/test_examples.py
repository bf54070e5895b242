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


@pytest.mark.skipif(not os.path.isdir(EXAMPLES), reason="no source tree beside tests/ (a wheel's copy of the tests)")
def test_delays_retries_and_dead_letters(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "delays_and_retries.py"), "--retries", "2",
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert p.returncode == 0, p.stderr
    lines = [line.split("  ", 1)[-1] for line in p.stdout.splitlines()]
    assert lines[-2:] == ["poison: tried 3 times, parked in %DLQ%billing (first topic Orders)", "all handled"]
    got = lines[:-2]
    assert sorted(got) == sorted(["order 1", "poison", "order 2", "reminder", "poison (retry 1)", "poison (retry 2)"])
    assert got.index("poison") < got.index("poison (retry 1)") < got.index("poison (retry 2)")
    # the delayed message came after the plain ones put after it: not before its second
    assert got.index("reminder") > got.index("order 2")
