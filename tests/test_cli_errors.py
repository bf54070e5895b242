"""A user's mistake at the command line gets one line on stderr and exit
status 2, never a traceback, and changes nothing on disk: bad arguments
(times, counts, offsets, queue ids, text that has no UTF-8 form), paths that
are not a store (missing, a file, an empty directory, the broker directory
above the store). ``rmqstore demo`` deletes only a store it made itself.

Most cases run in-process through ``rmqstore.cli.main``; the non-UTF-8 argv
cases run ``python -m rmqstore`` with raw bytes in its argv, as a shell would
pass them.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import no_hang
from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.cli import main

ROOT = Path(__file__).resolve().parent.parent
SMALL = StoreConfig(
    mapped_file_size_commit_log=1 << 16, mapped_file_size_consume_queue=600, max_hash_slot_num=100, max_index_num=400
)
MAX_LONG = (1 << 63) - 1
MARKER = ".rmqstore-demo"


# --- helpers ---------------------------------------------------------------------------------------


def snapshot(root) -> dict:
    """Kind, size, mtime and content hash of everything under *root* (root itself included)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            p = os.path.join(dirpath, name) if name else dirpath
            if not name and dirpath != os.fspath(root):
                continue
            st = os.lstat(p)
            digest = None
            if stat.S_ISREG(st.st_mode):
                with open(p, "rb") as fh:
                    digest = hashlib.sha256(fh.read()).hexdigest()
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return out


def run(capsys, argv):
    """(exit code, stdout, stderr) of ``rmqstore <argv>`` run in-process."""
    try:
        with no_hang(30):
            code = main([str(a) for a in argv])
    except SystemExit as e:  # argparse's own exit: counted like a return
        code = e.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_refused(code, err, *expect):
    """Exit status 2 and exactly one non-empty line on stderr, holding each of *expect*."""
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip() and err.endswith("\n"), f"stderr is not one line: {err!r}"
    assert code == 2, (code, err)
    for text in expect:
        assert text in err, (text, err)


def make_store(root, n=50) -> Path:
    with MessageStore.open(root, config=SMALL) as s:
        for i in range(n):
            s.put_message(Message("T", b"body-%d" % i, queue_id=i % 2, keys=f"k{i}", tags="a"))
    return Path(root)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small store at ``broker/store`` and the wrong things a user may point the CLI at."""
    w = tmp_path_factory.mktemp("world")
    make_store(w / "broker" / "store")
    (w / "afile").write_text("not a store\n")
    (w / "empty").mkdir()
    (w / "clfile").mkdir()
    (w / "clfile" / "commitlog").write_text("a file where commitlog/ should be\n")
    (w / "cfgdir").mkdir()
    (w / "latin1.properties").write_bytes(b"brokerName=caf\xe9\nmappedFileSizeCommitLog=65536\n")
    (w / "banana.properties").write_text("mappedFileSizeCommitLog=banana\n")
    (w / "full").mkdir()
    (w / "full" / "keep.txt").write_text("mine\n")
    return w


def store_of(w) -> Path:
    return w / "broker" / "store"


def msg_id_of(w) -> str:
    with MessageStore.open(store_of(w), read_only=True) as s:
        return s.get_messages("T", 0, 0, 1).messages[0].msg_id


# --- a path that is not a store ------------------------------------------------------------------------

# the arguments after the store path that make each command otherwise valid
STORE_COMMANDS = {
    "info": [],
    "dump": [],
    "query-key": ["T", "k1"],
    "query-msgid": ["C0A8016400002A9F0000000000000000"],
    "print-queue": ["T", "0"],
    "offset-for-time": ["T", "0", "0"],
    "verify": [],
    "salvage": ["{out}"],
    "recover": [],
    "clean": [],
    "tail": ["--topic", "T", "--timeout", "0.1"],
}
NOT_A_STORE = {
    "missing": ("missing", "no store directory"),
    "file": ("afile", "not a directory"),
    "empty-dir": ("empty", "not a store"),
    "broker-dir": ("broker", os.path.join("broker", "store")),  # points the user at the store inside
    "commitlog-is-a-file": ("clfile", "commitlog"),
}


@pytest.mark.parametrize("where", sorted(NOT_A_STORE))
@pytest.mark.parametrize("command", sorted(STORE_COMMANDS))
def test_a_path_that_is_not_a_store(world, capsys, command, where):
    name, expect = NOT_A_STORE[where]
    out_dir = world / f"salvaged-{command}-{where}"
    argv = [command, world / name] + [a.format(out=out_dir) for a in STORE_COMMANDS[command]]
    before = snapshot(world)
    code, _, err = run(capsys, argv)
    assert_refused(code, err, f"rmqstore {command}: ", expect)
    assert snapshot(world) == before  # nothing created, nothing touched


@pytest.mark.parametrize("part", ["store", "commitlog"])
def test_unreadable_store(tmp_path, capsys, monkeypatch, small_demo, part):
    """A store (or its commitlog/) the user may not read: one line, exit 2.
    Permission bits do not stop root, so there the refusal is injected into
    os.listdir, where the store's files are found."""
    store = make_store(tmp_path / "s", n=3)
    target = os.fspath(store if part == "store" else store / "commitlog")
    os.chmod(target, 0)
    try:
        injected = os.access(target, os.R_OK)
        if injected:
            real = os.listdir

            def listdir(path="."):
                if isinstance(path, str) and path.rstrip(os.sep) == target:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
                return real(path)

            monkeypatch.setattr(os, "listdir", listdir)
        for command in ("info", "dump", "verify", "clean", "recover", "tail"):
            extra = ["--topic", "T", "--timeout", "0"] if command == "tail" else []
            code, _, err = run(capsys, [command, target if part == "store" else store] + extra)
            assert_refused(code, err, f"rmqstore {command}: ", "Permission denied")
        if not injected:  # (root could write there)
            code, _, err = run(capsys, ["demo", "--dir", os.path.join(target, "sub"), "--count", "10"])
            assert_refused(code, err, "rmqstore demo: ", "Permission denied")
    finally:
        os.chmod(target, 0o755)


# --- bad arguments on a good store -----------------------------------------------------------------------

S = "{store}"
BAD_ARGUMENTS = [
    # times: not a time, impossible dates, out of range, before the epoch, past a Java long
    ["dump", S, "--begin", "notatime"],
    ["dump", S, "--begin", "2024-13-45"],
    ["dump", S, "--begin", "99999-01-01"],
    ["dump", S, "--end", "nan"],
    ["dump", S, "--begin", "0000-01-01"],
    ["dump", S, "--begin", "-1"],
    ["dump", S, "--end", "0001-01-01T00:00:00+14:00"],
    ["dump", S, "--begin", str(10**30)],
    ["dump", S, "--begin", "2000", "--end", "1000"],
    # offsets and counts
    ["dump", S, "--from-offset", "-1"],
    ["dump", S, "--from-offset", str(2**64)],
    ["dump", S, "--to-offset", "-5"],
    ["dump", S, "--from-offset", "{second}", "--to-offset", "0"],
    ["dump", S, "--limit", "0"],
    ["dump", S, "--limit", "-1"],
    ["dump", S, "--limit", str(2**64)],
    ["dump", S, "--limit", "ten"],
    ["dump", S, "--queue-id", "-1"],
    ["dump", S, "--queue-id", str(2**31)],
    ["dump", S, "--topic", "\udcff"],
    ["dump", S, "--topic", ""],
    ["dump", S, "--body", "bogus"],
    ["dump", S, "--bogus-option"],
    ["dump"],
    ["query-key", S, "T", "k1", "--max", "0"],
    ["query-key", S, "T", "k1", "--max", "-1"],
    ["query-key", S, "T", "k1", "--max", str(2**31)],
    ["query-key", S, "T", "k1", "--max", str(2**64)],
    ["query-key", S, "T", "k1", "--begin", "bad"],
    ["query-key", S, "T", "k1", "--end", str(10**30)],
    ["query-key", S, "T", "k1", "--begin", "2000", "--end", "1000"],
    ["query-key", S, "\udcff", "k1"],
    ["query-key", S, "T", "k\udcff"],
    ["query-key", S, "T", "k\udcff", "--offsets-only"],
    ["query-key", S, "T", ""],
    ["query-key", S, "", "k1"],
    ["query-msgid", S, "zz"],
    ["query-msgid", S, "C0A80164"],
    ["query-msgid", S, "C0A8016400002A9F000000000000000\udcff"],
    ["query-msgid", S, "C0A8016400002A9F00000000000000000"],
    ["query-msgid", S, "C0A8016400002A9FFFFFFFFFFFFFFFFF"],  # a negative physical offset
    ["print-queue", S, "T", "-1"],
    ["print-queue", S, "T", str(2**31)],
    ["print-queue", S, "T", str(2**64)],
    ["print-queue", S, "T", "x"],
    ["print-queue", S, "T", "0", "--start", "-1"],
    ["print-queue", S, "T", "0", "--start", str(2**64)],
    ["print-queue", S, "T", "0", "--count", "0"],
    ["print-queue", S, "T", "0", "--count", "-1"],
    ["print-queue", S, "\udcff", "0"],
    ["print-queue", S, "", "0"],
    ["offset-for-time", S, "T", "0", "notatime"],
    ["offset-for-time", S, "T", "0", "nan"],
    ["offset-for-time", S, "T", "0", "2024-02-30"],
    ["offset-for-time", S, "T", "0", str(10**30)],
    ["offset-for-time", S, "T", "0", "-1"],
    ["offset-for-time", S, "T", "0", "0000-01-01"],
    ["offset-for-time", S, "T", "0", "0001-01-01T00:00:00+14:00"],
    ["offset-for-time", S, "T", str(2**40), "0"],
    ["offset-for-time", S, "T", "-1", "0"],
    ["offset-for-time", S, "\udcff", "0", "0"],
    ["offset-for-time", S, "T", "0", "0", "--boundary", "middle"],
    ["verify", S, "--config", "{world}/missing.properties"],
    ["verify", S, "--config", "{world}/cfgdir"],
    ["verify", S, "--config", "{world}/banana.properties"],
    ["salvage", S, "{world}/afile"],
    ["salvage", S, "{store}/inside"],
    ["salvage", S, "{store}"],
    ["salvage", S, "{world}/full"],
    ["salvage", S, "{world}/afile/below-a-file"],
    ["salvage", S, "{world}/salvage-out", "--config", "{world}/missing.properties"],
    ["recover", S, "--config", "{world}/missing.properties"],
    ["recover", S, "--config", "{world}/banana.properties"],
    ["clean", S, "--reserved-hours", "-1"],
    ["clean", S, "--reserved-hours", str(2**64)],
    ["clean", S, "--reserved-hours", "x"],
    ["clean", S, "--config", "{world}/missing.properties"],
    ["clean", S, "--config", "{world}/banana.properties"],
    ["tail", S, "--topic", "T", "--max", "0", "--timeout", "0.1"],
    ["tail", S, "--topic", "T", "--max", "-1", "--timeout", "0.1"],
    ["tail", S, "--topic", "T", "--timeout", "nan", "--max", "1"],
    ["tail", S, "--topic", "T", "--timeout", "-1"],
    ["tail", S, "--topic", "T", "--timeout", "inf", "--max", "1"],
    ["tail", S, "--topic", "T", "--interval", "-1", "--timeout", "0.1"],
    ["tail", S, "--topic", "T", "--interval", str(2**64), "--timeout", "0.1"],
    ["tail", S, "--topic", "T", "--queue", "-1", "--timeout", "0.1"],
    ["tail", S, "--topic", "T", "--queue", str(2**40), "--timeout", "0.1"],
    ["tail", S, "--topic", "\udcff", "--timeout", "0.1"],
    ["tail", S, "--topic", "", "--timeout", "0.1"],
    ["tail", S, "--timeout", "0.1"],
    ["demo", "--count", "0", "--dir", "{world}/demo-out"],
    ["demo", "--count", "-1", "--dir", "{world}/demo-out"],
    ["demo", "--count", str(2**64), "--dir", "{world}/demo-out"],
    ["demo", "--body-size", "-1", "--dir", "{world}/demo-out"],
    ["demo", "--body-size", str(2**64), "--dir", "{world}/demo-out"],
    ["demo", "--body-size", str(10**8), "--dir", "{world}/demo-out"],
    ["demo", "--dir", "{world}/afile"],
    ["demo", "--dir", "{world}/afile/below-a-file"],
    ["bogus-command"],
    [],
]


def _case_id(argv):
    shown = " ".join(a.replace("{store}", "S").replace("{world}/", "").replace("{second}", "N") for a in argv)
    return shown[:80] or "(nothing)"


@pytest.mark.parametrize("argv", BAD_ARGUMENTS, ids=[_case_id(a) for a in BAD_ARGUMENTS])
def test_bad_argument(world, capsys, argv):
    with MessageStore.open(store_of(world), read_only=True) as s:
        second = s.get_messages("T", 1, 0, 1).messages[0].physical_offset  # a record boundary past 0
    argv = [a.format(store=store_of(world), world=world, second=second) for a in argv]
    before = snapshot(world)
    code, out, err = run(capsys, argv)
    assert_refused(code, err, "rmqstore")
    assert out == ""
    assert snapshot(world) == before


def test_a_latin1_properties_file_is_read_as_java_reads_it(world, capsys):
    """A broker's .properties is ISO-8859-1 (Java's Properties.load): a byte
    that is not UTF-8 is no mistake."""
    code, _out, err = run(capsys, ["verify", store_of(world), "--config", f"{world}/latin1.properties"])
    assert code in (0, 1) and "error" not in err


def test_limits_themselves_are_accepted(world, capsys):
    """The edges of each range still work: the checks refuse only what is out of range."""
    store = store_of(world)
    before = snapshot(world)
    for argv, want in (
        (["dump", store, "--limit", "1", "--begin", "0", "--end", str(MAX_LONG), "--queue-id", str(2**31 - 1)], 0),
        (["dump", store, "--limit", "1", "--begin", "1970-01-01", "--end", "9999-12-31T23:59:59"], 0),
        (["dump", store, "--from-offset", "0", "--to-offset", "0"], 0),
        (["print-queue", store, "T", str(2**31 - 1)], 1),
        (["print-queue", store, "T", "0", "--start", str(MAX_LONG), "--count", "1"], 0),
        (["offset-for-time", store, "T", "0", str(MAX_LONG)], 0),
        (["query-key", store, "T", "k1", "--max", str(2**31 - 1), "--begin", "0", "--end", "0"], 1),
        (["query-key", store, "T", "k1", "--max", "1"], 0),
        (["tail", store, "--topic", "T", "--queue", str(2**31 - 1), "--timeout", "0", "--interval", "0"], 0),
    ):
        code, _, err = run(capsys, argv)
        assert code == want and "Traceback" not in err, (argv, code, err)
    assert snapshot(world) == before


def test_msg_id_of_the_store_still_found(world, capsys):
    code, out, _ = run(capsys, ["query-msgid", store_of(world), msg_id_of(world)])
    assert code == 0 and json.loads(out)["topic"] == "T"
    code, _, err = run(capsys, ["query-msgid", store_of(world), "C0A8016400002A9F00000000DEADBEEF"])
    assert code == 1 and "no message" in err  # well-formed, points nowhere: not found, not a usage error


# --- argv bytes that are not UTF-8 (subprocess) ---------------------------------------------------------------


def cli_process(*argv, cwd):
    """``python -m rmqstore *argv`` with each argument passed as raw bytes, under
    a UTF-8 locale whose stdout refuses what has no UTF-8 form."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # stdout strict, as under en_US.UTF-8 (C.UTF-8 alone would give surrogateescape)
    env.update(LC_ALL="C.UTF-8", PYTHONUTF8="0", PYTHONIOENCODING="utf-8:strict")
    args = [os.fsencode(sys.executable), b"-m", b"rmqstore"]
    args += [a if isinstance(a, bytes) else os.fsencode(a) for a in argv]
    r = subprocess.run(args, check=False, capture_output=True, env=env, cwd=cwd, timeout=120)
    return r.returncode, r.stdout.decode("utf-8"), r.stderr.decode("utf-8", "replace")


@pytest.mark.parametrize(
    "argv",
    [
        ["dump", "{store}", "--topic", b"T\xff"],
        ["query-key", "{store}", "T", b"k\xff"],
        ["query-key", "{store}", b"\xff", "k1", "--offsets-only"],
        ["offset-for-time", "{store}", b"T\xff", "0", "0"],
        ["print-queue", "{store}", b"T\xff", "0"],
        ["info", b"{world}/no-such-\xff"],
    ],
    ids=["dump-topic", "query-key-key", "query-key-topic", "offset-for-time-topic", "print-queue-topic",
         "info-missing-path"],
)
def test_non_utf8_argv(world, argv):
    def fill(a):
        if isinstance(a, bytes):
            return a.replace(b"{world}", os.fsencode(world))
        return a.format(store=store_of(world), world=world)

    before = snapshot(world)
    code, out, err = cli_process(*[fill(a) for a in argv], cwd=world)
    assert_refused(code, err, "rmqstore")
    assert out == ""
    assert snapshot(world) == before


def test_store_at_a_non_utf8_path_is_read(tmp_path):
    """A store whose path is not UTF-8 is a legal store: read commands work and
    print the path without a traceback (JSON stays valid and lossless)."""
    raw = os.path.join(os.fsencode(tmp_path), b"st\xff")
    make_store(os.fsdecode(raw), n=5)
    code, out, err = cli_process(b"info", raw, b"--json", cwd=tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert os.fsencode(json.loads(out)["store"]) == raw
    for argv in ([b"info", raw], [b"verify", raw], [b"dump", raw, b"--limit", b"1"]):
        code, out, err = cli_process(*argv, cwd=tmp_path)
        assert code == 0 and "Traceback" not in err and out, (argv, err)


# --- demo ------------------------------------------------------------------------------------------------


@pytest.fixture
def small_demo(monkeypatch):
    """`rmqstore demo` on small files: the demo's stores open with SMALL-like
    sizes instead of RocketMQ's 1 GiB defaults (only the sizes change)."""
    real_open = MessageStore.open.__func__
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=6000,
                      max_hash_slot_num=500, max_index_num=2000)

    def open_small(cls, root_dir, config=None, **kw):
        return real_open(cls, root_dir, config=config or cfg, **kw)

    monkeypatch.setattr(MessageStore, "open", classmethod(open_small))
    return cfg


def count_demo_messages(path) -> int:
    with MessageStore.open(path, read_only=True) as s:
        return sum(s.get_max_offset_in_queue("DemoTopic", q) - s.get_min_offset_in_queue("DemoTopic", q)
                   for q in range(8))


@pytest.mark.parametrize("keep", [False, True], ids=["replace", "keep"])
@pytest.mark.parametrize("kind", ["user-files", "foreign-store", "marker-and-user-file", "marker-is-a-directory"])
def test_demo_refuses_a_directory_it_did_not_make(tmp_path, capsys, small_demo, kind, keep):
    target = tmp_path / "target"
    if kind == "user-files":
        target.mkdir()
        (target / "thesis.tex").write_text("years of work\n")
        (target / "sub").mkdir()
        (target / "sub" / "data.bin").write_bytes(b"\x00\x01")
    elif kind == "foreign-store":  # looks exactly like a store, but the demo did not write it
        make_store(target, n=20)
    elif kind == "marker-and-user-file":
        make_store(target, n=20)
        (target / MARKER).write_text("")
        (target / "notes.txt").write_text("mine\n")
    else:
        make_store(target, n=20)
        (target / MARKER).mkdir()
    before = snapshot(tmp_path)
    code, _, err = run(capsys, ["demo", "--count", "100", "--dir", target] + (["--keep"] if keep else []))
    assert_refused(code, err, "rmqstore demo: ", str(target))
    assert snapshot(tmp_path) == before


def test_demo_replaces_its_own_store_and_keeps_on_request(tmp_path, capsys, monkeypatch, small_demo):
    """Run twice in the same place (the default ./rmqstore-demo): the second run
    finds the first run's store and replaces it; --keep appends."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, ["demo", "--count", "300"])
    assert code == 0, out + err
    demo = tmp_path / "rmqstore-demo"
    assert (demo / MARKER).is_file() and count_demo_messages(demo) == 300
    code, out, err = run(capsys, ["demo", "--count", "200"])
    assert code == 0, out + err
    assert count_demo_messages(demo) == 200  # replaced, not appended
    code, out, err = run(capsys, ["demo", "--count", "100", "--keep"])
    assert code == 0, out + err
    assert count_demo_messages(demo) == 300
    assert sorted(os.listdir(demo)) == sorted([MARKER, "checkpoint", "commitlog", "consumequeue", "index", "lock"])
    # the marker does not disturb the store's own checks
    code, out, err = run(capsys, ["verify", demo, "--strict"])
    assert code == 0, out + err


def test_demo_uses_an_empty_directory_and_a_non_utf8_name(tmp_path, capsys, small_demo):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run(capsys, ["demo", "--count", "50", "--dir", empty])
    assert code == 0 and (empty / MARKER).is_file() and count_demo_messages(empty) == 50, out + err
    odd = os.path.join(tmp_path, "d\udcff")  # from the bytes b"d\xff" on the command line
    code, out, err = run(capsys, ["demo", "--count", "50", "--dir", odd])
    assert code == 0 and "Traceback" not in err, out + err
    assert os.path.isfile(os.path.join(odd, MARKER))


@pytest.mark.parametrize("args", [
    ["spark"], ["spark", "rebuild-cq"], ["spark", "bogus", "x"], ["spark", "rebuild-cq", "EMPTY"],
    ["spark", "rebuild-index", "EMPTY"], ["spark", "rebuild-cq", "MISSING"],
])
def test_spark_jobs_check_their_arguments_before_spark_starts(tmp_path, capsys, args):
    """A rebuild writes: it must never create consumequeue/, index/ or a lock
    in a directory that is no store, nor start Spark for a mistake."""
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [str(empty) if a == "EMPTY" else str(tmp_path / "missing") if a == "MISSING" else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert os.listdir(empty) == []


def test_spark_without_pyspark_is_one_line(tmp_path, capsys, monkeypatch):
    """Without the spark extra, ``rmqstore spark`` says what to install (one
    line, exit 2), not a traceback."""
    import sys

    monkeypatch.setitem(sys.modules, "pyspark", None)  # (import pyspark raises ImportError)
    for name in [m for m in sys.modules if m == "rmqstore.spark" or m.startswith("rmqstore.spark.")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["spark", "rebuild-cq", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "rmqstore[spark]" in err
