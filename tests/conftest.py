"""Shared helpers for the rmqstore test-suite.

Everything here is independent of rmqstore's own encoders so the tests can
compute expectations on their own (Java string hash, property parsing, ...).
Golden data lives in ``tests/data/golden/<set>/`` and is never written to:
tests that might modify a store copy it into ``tmp_path`` first.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import pathlib
import shutil
import signal
import stat
import threading

import pytest

# A run started in the background by a shell without job control (`cmd &` in a
# script, nohup) inherits SIGINT ignored, and Python then leaves it ignored,
# in this process and in every child it starts: the Ctrl-C tests would wait
# for an interrupt that never comes. The run takes Ctrl-C as a terminal gives
# it (a handler, unlike "ignored", is reset to the default in children).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

GOLDEN = pathlib.Path(__file__).parent / "data" / "golden"
GOLDEN_SETS = ("tiny", "basic")

STORE_HOST = "192.168.1.100:10911"
V1_MAGIC = -626843481  # 0xDAA320A7
V2_MAGIC = -626843477  # 0xDAA320AB
BLANK_MAGIC = -875286124  # 0xCBD43194
MAX_LONG = (1 << 63) - 1

TRANSACTION_BITS = {"prepared": 4, "commit": 8, "rollback": 12}

# default delay levels of RocketMQ (level -> ms)
DELAY_LEVEL_MS = {
    1: 1000, 2: 5000, 3: 10000, 4: 30000, 5: 60000, 6: 120000, 7: 180000, 8: 240000, 9: 300000,
    10: 360000, 11: 420000, 12: 480000, 13: 540000, 14: 600000, 15: 1200000, 16: 1800000,
    17: 3600000, 18: 7200000,
}


# --- golden data ----------------------------------------------------------------


def golden_dir(name: str) -> pathlib.Path:
    return GOLDEN / name


def golden_store(name: str) -> pathlib.Path:
    return GOLDEN / name / "store"


@functools.cache
def load_dump(name: str) -> dict:
    with open(GOLDEN / name / "dump.json", encoding="utf-8") as fh:
        return json.load(fh)


@functools.cache
def load_input(name: str) -> dict:
    with open(GOLDEN / name / "input.json", encoding="utf-8") as fh:
        return json.load(fh)


def dump_messages(name: str) -> list:
    """The ``kind == "message"`` records of dump.json, in CommitLog order."""
    return [r for r in load_dump(name)["commitlog"]["records"] if r["kind"] == "message"]


def make_writable(root) -> None:
    """chmod u+w every file and directory under *root* (golden files may be read-only)."""
    root = pathlib.Path(root)
    for p in [root, *root.rglob("*")]:
        mode = p.stat().st_mode
        p.chmod(mode | stat.S_IWUSR | (stat.S_IXUSR if p.is_dir() else 0))


def copy_golden_store(name: str, dst) -> pathlib.Path:
    """Copy the golden ``store/`` of set *name* to *dst* (must not exist) and make it writable."""
    dst = pathlib.Path(dst)
    shutil.copytree(golden_store(name), dst)
    make_writable(dst)
    return dst


@pytest.fixture(params=GOLDEN_SETS)
def golden_set(request) -> str:
    return request.param


# --- independent re-implementations (expectations) --------------------------------


def java_hash(s: str) -> int:
    """Java ``String.hashCode()`` (UTF-16 code units), signed 32-bit."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def parse_properties_ordered(prop_string: str) -> dict:
    """Ordered dict from a stored property string, keeping pairs with empty
    values (which RocketMQ's decoder would drop) so the exact bytes can be
    rebuilt: split at \\x02, drop the trailing empty piece, split each at the
    first \\x01."""
    out = {}
    if not prop_string:
        return out
    pieces = prop_string.split("\x02")
    assert pieces[-1] == "", "a stored property string ends with \\x02"
    for piece in pieces[:-1]:
        name, sep, value = piece.partition("\x01")
        assert sep, f"property piece without separator: {piece!r}"
        out[name] = value
    return out


def rocketmq_properties(prop_string: str) -> dict:
    """RocketMQ's ``string2messageProperties``: empty names/values are dropped."""
    out = {}
    for seg in prop_string.split("\x02"):
        name, sep, value = seg.partition("\x01")
        if sep and name and value:
            out[name] = value
    return out


def input_body(m: dict) -> bytes:
    if "bodyBase64" in m:
        return base64.b64decode(m["bodyBase64"])
    if "body" in m:
        return m["body"].encode("utf-8")
    return b""


def input_sys_flag(m: dict) -> int:
    return m.get("sysFlag", 0) | TRANSACTION_BITS.get(m.get("transaction"), 0)


@pytest.fixture(params=["python", "cython"])
def impl(request):
    """Each kernel implementation in turn, selected for the whole process
    (the stores a test opens take it), the previous one restored after."""
    from kernel_switch import select

    if request.param == "cython":
        from test_kernels import _need_core

        _need_core()
    previous = select(request.param)
    yield request.param
    select(previous)


class ListClock:
    """A store clock returning the given timestamps one per call."""

    def __init__(self, timestamps):
        self._it = iter(list(timestamps))
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        return next(self._it)


class StepClock:
    """A store clock that returns ``start``, ``start + step``, ... (or a fixed
    value that tests may set via ``.now``)."""

    def __init__(self, start: int = 1_700_000_000_000, step: int = 1):
        self.now = start
        self.step = step

    def __call__(self) -> int:
        t = self.now
        self.now += self.step
        return t


# --- hang guard (pytest-timeout is not installed) -----------------------------------


@contextlib.contextmanager
def no_hang(seconds: float = 20.0):
    """Fail (instead of hanging forever) if the body runs longer than *seconds*.
    Uses SIGALRM, so only in the main thread; a no-op elsewhere."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _boom(signum, frame):
        raise TimeoutError(f"operation did not finish within {seconds} s (hang?)")

    old = signal.signal(signal.SIGALRM, _boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def read_bytes(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def env_pure_python() -> bool:
    return os.environ.get("RMQSTORE_PURE_PYTHON", "").strip().lower() not in ("", "0", "false", "no")


# Hypothesis: CI runs a fixed, reproducible set of examples (a red CI is then a
# real, repeatable failure); developers get fresh random examples each run.
# RMQSTORE_HYPOTHESIS_SCALE (default 1) multiplies the example counts of every
# property test, for long fuzzing runs: RMQSTORE_HYPOTHESIS_SCALE=50 pytest.
from hypothesis import settings as _hyp_settings  # noqa: E402

HYPOTHESIS_SCALE = max(1, int(os.environ.get("RMQSTORE_HYPOTHESIS_SCALE", "1")))


def scaled(n: int) -> int:
    """A test's example count times RMQSTORE_HYPOTHESIS_SCALE."""
    return n * HYPOTHESIS_SCALE


_hyp_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    _hyp_settings.load_profile("ci")


# --- an S3-compatible server (moto) for stores named by s3:// URIs ----------------------------------


class S3Server:
    """A moto S3 server on a free local port.

    ``uri(path)`` names ``s3://<bucket>/<path>`` with the endpoint, scheme and
    test credentials in the URI itself (Spark's executors do not inherit
    environment variables set after the session starts);
    ``env`` is the same as the standard AWS variables."""

    def __init__(self, port: int, bucket: str = "rmqstore-tests"):
        self.port = port
        self.bucket = bucket
        self.endpoint = f"127.0.0.1:{port}"
        self.env = {"AWS_ENDPOINT_URL": f"http://{self.endpoint}", "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def uri(self, path: str) -> str:
        return (f"s3://testing:testing@{self.bucket}/{path.strip('/')}"
                f"?endpoint_override={self.endpoint}&scheme=http&region=us-east-1")

    def filesystem(self):
        from pyarrow import fs

        return fs.S3FileSystem(access_key="testing", secret_key="testing", region="us-east-1",
                               endpoint_override=self.endpoint, scheme="http",
                               allow_bucket_creation=True, allow_bucket_deletion=True)


@pytest.fixture(scope="session")
def s3_server():
    """A running :class:`S3Server` with its bucket made. Skipped without
    moto's server (``pip install -e '.[test]'``), an error under
    ``RMQSTORE_REQUIRE_SPARK=1`` (CI)."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    try:
        import moto.server  # noqa: F401
        import pyarrow.fs  # noqa: F401
    except ImportError as e:
        if os.environ.get("RMQSTORE_REQUIRE_SPARK") == "1":
            raise
        pytest.skip(f"no S3 test server: {e}; pip install -e '.[spark,test]'")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)
        server = S3Server(port)
        server.filesystem().create_dir(server.bucket)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
