"""verify and salvage keep memory bounded on a big store (not by its number
of records). Slow: it writes a store of RMQSTORE_BIG_STORE_GB GiB of
CommitLog (e.g. 10) with 256-byte bodies and broker file sizes, then runs
``rmqstore verify`` and ``rmqstore salvage`` in child processes, sampling
their anonymous memory (RssAnon: the mapped store files are not counted,
they are page cache). Skipped unless the knob is set."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rmqstore import Message, MessageStore, StoreConfig

GB = float(os.environ.get("RMQSTORE_BIG_STORE_GB", "0") or 0)
LIMIT_MB = 256

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GB <= 0, reason="set RMQSTORE_BIG_STORE_GB (GiB of CommitLog) to run"),
    pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="samples /proc/<pid>/status"),
]


def run_sampled(argv) -> tuple:
    """Run *argv*; return (exit status, peak RssAnon in MB, seconds)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent)] + sys.path)}
    t = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.05)
    p.stderr.read()
    return p.returncode, peak / 1024, time.monotonic() - t


def test_verify_and_salvage_memory_is_bounded(tmp_path):
    root = tmp_path / "store"
    body = b"x" * 256
    n = 0
    with MessageStore.open(root, config=StoreConfig.broker_defaults(schedule_service_enable=False)) as s:
        while s.max_physical_offset < GB * (1 << 30):
            for i in range(10_000):
                s.put_message(Message(f"T{i % 8}", body, queue_id=i % 4, keys=f"k{n + i}"))
            n += 10_000
    code, verify_mb, verify_s = run_sampled([sys.executable, "-m", "rmqstore", "verify", str(root), "--quiet"])
    assert code == 0
    code, salvage_mb, salvage_s = run_sampled(
        [sys.executable, "-m", "rmqstore", "salvage", str(root), str(tmp_path / "copy"), "--quiet"])
    assert code == 0
    print(f"\n{n} messages, {GB} GiB: verify {verify_s:.0f} s, {verify_mb:.0f} MB anonymous; "
          f"salvage {salvage_s:.0f} s, {salvage_mb:.0f} MB anonymous")
    assert verify_mb < LIMIT_MB and salvage_mb < LIMIT_MB
