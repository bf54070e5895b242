"""A put is all or nothing.

``put_message``, ``put_messages`` and ``put_message_columns`` either return
PUT_OK with every record written and dispatched, or raise with the write
position unchanged and nothing of the call readable after a reopen; the
store goes on working, and a caller that retries stores no duplicate.

Every file a put needs (a CommitLog segment, a queue's directory and file,
an index file) is made before its first byte is written; the failures are
injected where those files are made, as real errors of the operating system
(descriptors, file size, permissions) in child processes, and as faults of
``allocate_file`` in this one. Both implementations run every case.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from conftest import StepClock
from rmqstore import DiskFullError, Message, MessageStore, StoreConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CL_SIZE = 16 * 1024
CQ_UNITS = 10  # units per ConsumeQueue file
INDEX_NUM = 8  # 7 keys per index file


def config(flush="ASYNC_FLUSH", **kw):
    base = dict(
        mapped_file_size_commit_log=CL_SIZE, mapped_file_size_consume_queue=20 * CQ_UNITS,
        max_hash_slot_num=4, max_index_num=INDEX_NUM, flush_disk_type=flush, clean_service_enable=False,
        # these puts must make their files themselves (the service would have made
        # them ahead; test_files_ahead.py covers a service that cannot)
        make_files_ahead=False,
    )
    base.update(kw)
    return StoreConfig(**base)


def body(tag: str, i: int) -> bytes:
    return f"{tag}-{i:05d}".encode() * 8


def what_a_reopen_reads(root) -> tuple:
    """Every record a fresh read-only open finds, and its queues with their ends."""
    with MessageStore.open(root, read_only=True) as ro:
        records = [(m.topic, m.queue_id, m.queue_offset, m.body, m.keys) for m in ro.iter_messages()]
        queues = {q: ro.get_max_offset_in_queue(*q) for q in ro.queues()}
    return records, queues


def state(s) -> tuple:
    """What the open store answers: its end, its queues and their ends."""
    return s.max_physical_offset, {q: s.get_max_offset_in_queue(*q) for q in s.queues()}


# --- the files a put may need, and a fault where each is made ------------------------

SITES = ("commitlog", "new-queue", "queue-file", "index")


def prepare_site(s, site: str) -> list:
    """Bring store *s* to the point where the next messages need a new file of
    *site*; returns those messages (three, over two queues). Queue T/1
    exists and has room in every case."""
    s.put_message(Message("T", b"first", queue_id=1))
    if site == "commitlog":
        size = s.put_message(Message("T", body("c", 9), queue_id=0)).wrote_bytes
        while CL_SIZE - s.max_physical_offset % CL_SIZE >= size + 8:  # until one more does not fit
            s.put_message(Message("T", body("c", 9), queue_id=1))
        return [Message("T", body("c", i), queue_id=i % 2) for i in range(3)]
    if site == "new-queue":
        s.put_message(Message("T", body("old", 0), queue_id=0))
        return [Message("T", body("q", 0), queue_id=0), Message("New", body("q", 1), queue_id=3),
                Message("New", body("q", 2), queue_id=3)]
    if site == "queue-file":
        for i in range(CQ_UNITS):  # queue 0's first file is full
            s.put_message(Message("T", body("fill", i), queue_id=0))
        return [Message("T", body("f", i), queue_id=i % 2) for i in range(3)]
    if site == "index":
        for i in range(INDEX_NUM - 1):  # the index file is full
            s.put_message(Message("T", body("fill", i), queue_id=1, keys=f"fill{i}"))
        return [Message("T", body("k", i), queue_id=i % 2, keys=f"k{i}") for i in range(3)]
    raise AssertionError(site)


def fail_making(monkeypatch, site: str, error: str) -> None:
    """Every new file under *site*'s directory fails as the disk would."""
    import rmqstore.storage.index as index_mod
    import rmqstore.storage.mapped_file as mf_mod

    real = mf_mod.allocate_file
    where = {"commitlog": "commitlog", "new-queue": "consumequeue", "queue-file": "consumequeue",
             "index": "index"}[site]

    def allocate(fd, size, path):
        if f"{os.sep}{where}{os.sep}" in path:
            if error == "enospc":
                raise DiskFullError(errno.ENOSPC, "simulated: no space left on device", path)
            raise OSError(errno.EMFILE, "simulated: too many open files", path)
        return real(fd, size, path)

    monkeypatch.setattr(mf_mod, "allocate_file", allocate)
    monkeypatch.setattr(index_mod, "allocate_file", allocate)


def put(s, shape: str, msgs: list):
    if shape == "one":
        return [s.put_message(m) for m in msgs[:1]]
    if shape == "many":
        return s.put_messages(msgs)
    # columns: one topic per call
    topic = msgs[0].topic
    rows = [m for m in msgs if m.topic == topic]
    r = s.put_message_columns(topic, [m.body for m in rows], [m.queue_id for m in rows],
                              keys=[m.keys for m in rows])
    return list(r.physical_offsets)


def expected_count(shape: str, msgs: list) -> int:
    if shape == "one":
        return 1
    if shape == "many":
        return len(msgs)
    return sum(1 for m in msgs if m.topic == msgs[0].topic)


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("shape", ["one", "many", "columns"])
@pytest.mark.parametrize("site", SITES)
def test_a_file_that_cannot_be_made_fails_the_put_before_it_writes(tmp_path, monkeypatch, site, shape, flush):
    if shape == "columns" and site == "new-queue":
        pytest.skip("a columns call has one topic: covered by 'many' and 'one'")
    root = tmp_path / "s"
    with MessageStore.open(root, config(flush), clock=StepClock()) as s:
        msgs = prepare_site(s, site)
        if shape == "one" and site == "new-queue":
            msgs = msgs[1:]
        before = state(s)
        s.flush()
        on_disk = what_a_reopen_reads(root)
        with monkeypatch.context() as mp:
            fail_making(mp, site, "enospc" if flush == "SYNC_FLUSH" else "emfile")
            with pytest.raises(OSError):
                put(s, shape, msgs)
            assert state(s) == before  # nothing of the call, not even a queue offset
            assert what_a_reopen_reads(root) == on_disk
            # the store goes on at once for what needs no new file
            if site != "commitlog":
                r = s.put_message(Message("T", b"meanwhile", queue_id=1))
                assert s.get_message(r.wrote_offset).body == b"meanwhile"
        # the cause is gone: the same call succeeds, once
        put(s, shape, msgs)
        after_records = what_a_reopen_reads(root)[0]
    records, _queues = what_a_reopen_reads(root)
    assert records == after_records
    n = expected_count(shape, msgs)
    for m in msgs[:n]:
        assert sum(1 for r in records if r[3] == m.body) == 1, m.body
    # queue offsets are dense: no offset was used up by the failed call
    for (topic, qid) in {(r[0], r[1]) for r in records}:
        offsets = [r[2] for r in records if (r[0], r[1]) == (topic, qid)]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
    with MessageStore.open(root, config(flush)) as s:  # a writable reopen finds nothing to repair
        assert s.recovery_report["truncated_bytes"] == 0
        if site == "index":
            assert [m.body for m in s.query_messages("T", "k2")] == [msgs[2].body] if shape == "many" else True


def test_a_new_queue_that_fails_leaves_no_directory(tmp_path, monkeypatch):
    root = tmp_path / "s"
    with MessageStore.open(root, config()) as s:
        s.put_message(Message("T", b"x"))
        with monkeypatch.context() as mp:
            fail_making(mp, "new-queue", "emfile")
            with pytest.raises(OSError):
                s.put_messages([Message("T", b"y"), Message("Fresh", b"z", queue_id=7)])
        assert not (root / "consumequeue" / "Fresh").exists()
        assert s.queues() == [("T", 0)]
    assert what_a_reopen_reads(root)[1] == {("T", 0): 1}


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_an_interrupt_mid_batch_undoes_the_batch(tmp_path, flush):
    """A KeyboardInterrupt from the store clock at the 7th message of a
    batch (the clock is read per record, within the write): the six
    records before it are undone, files made for them included."""
    root = tmp_path / "s"

    class Interrupting(StepClock):
        armed = -1

        def __call__(self):
            if self.armed == 0:
                self.armed = -1
                raise KeyboardInterrupt
            self.armed -= 1
            return super().__call__()

    clock = Interrupting()
    batch = [Message("T", body("b", i), queue_id=i % 3, keys=f"b{i}") for i in range(40)]
    with MessageStore.open(root, config(flush), clock=clock) as s:
        s.put_messages([Message("T", b"first", queue_id=q) for q in range(3)])
        before = state(s)
        clock.armed = 6
        with pytest.raises(KeyboardInterrupt):
            s.put_messages(batch)
        assert state(s) == before
        assert s.query_messages("T", "b1") == []
        s.put_messages(batch)
        assert [m.body for m in s.query_messages("T", "b39")] == [batch[39].body]
    records = what_a_reopen_reads(root)[0]
    assert [r[3] for r in records] == [b"first"] * 3 + [m.body for m in batch]


def test_retrying_after_random_faults_stores_each_message_once(tmp_path, monkeypatch):
    """Random puts (one, many, columns; new queues, rolls, keys) while file
    making fails at random; each call that raised is retried until it
    succeeds. At the end every message is stored exactly once, in its
    queue at consecutive offsets. RMQSTORE_PUT_FAULT_ROUNDS sets the rounds."""
    import rmqstore.storage.index as index_mod
    import rmqstore.storage.mapped_file as mf_mod

    rounds = int(os.environ.get("RMQSTORE_PUT_FAULT_ROUNDS", "150"))
    rng = random.Random(1806)
    real = mf_mod.allocate_file
    failing = {"on": False}

    def allocate(fd, size, path):
        if failing["on"] and rng.random() < 0.5:
            raise OSError(errno.EMFILE, "simulated", path)
        return real(fd, size, path)

    monkeypatch.setattr(mf_mod, "allocate_file", allocate)
    monkeypatch.setattr(index_mod, "allocate_file", allocate)
    root = tmp_path / "s"
    sent = []
    seq = 0
    with MessageStore.open(root, config(), clock=StepClock()) as s:
        for _ in range(rounds):
            shape = rng.choice(["one", "many", "columns"])
            topic = rng.choice(["A", "B", f"T{rng.randrange(6)}"])
            n = 1 if shape == "one" else rng.randrange(1, 30)
            msgs = []
            for _ in range(n):
                msgs.append(Message(topic, body("r", seq) * rng.randrange(1, 4), queue_id=rng.randrange(3),
                                    keys=f"r{seq}" if rng.random() < 0.5 else None))
                seq += 1
            for _attempt in range(100):
                failing["on"] = rng.random() < 0.4
                end = s.max_physical_offset
                try:
                    put(s, shape, msgs)
                    break
                except OSError:
                    assert s.max_physical_offset == end
            else:
                raise AssertionError("a put never got through")
            failing["on"] = False
            sent += msgs
    records = what_a_reopen_reads(root)[0]
    assert sorted(r[3] for r in records) == sorted(m.body for m in sent)
    by_queue: dict = {}
    for topic, qid, qoff, _b, _k in records:
        by_queue.setdefault((topic, qid), []).append(qoff)
    for offsets in by_queue.values():
        assert offsets == list(range(len(offsets)))
    with MessageStore.open(root, read_only=True) as ro:  # every key indexed once
        for m in sent:
            if m.keys:
                assert [x.body for x in ro.query_messages(m.topic, m.keys)] == [m.body]


# --- real errors of the operating system, in a child process ---------------------------


def run_child(code: str, cwd) -> dict:
    """Run *code* in a fresh interpreter with this checkout's rmqstore and the
    kernel implementation this run uses; it prints one JSON line."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


CHILD_PRELUDE = """
import errno, json, os, resource, signal, sys
from rmqstore import Message, MessageStore, StoreConfig
cfg = StoreConfig(mapped_file_size_commit_log=16384, mapped_file_size_consume_queue=200, max_hash_slot_num=4,
                  max_index_num=8, clean_service_enable=False)
def records(root):
    with MessageStore.open(root, read_only=True) as ro:
        return [[m.topic, m.queue_id, m.queue_offset, m.body.decode()] for m in ro.iter_messages()]
"""


@pytest.mark.parametrize("free", [0, 1])
def test_out_of_descriptors_while_a_queue_file_is_made(tmp_path, free):
    # free 0: the queue file cannot be opened; 1: it can, but not mapped
    # (the mapping takes a descriptor of its own), and is removed again
    out = run_child(CHILD_PRELUDE + f"FREE = {free}" + """
root = sys.argv[1] if len(sys.argv) > 1 else "s"
# no thread of the store opens a descriptor meanwhile (a transient one
# closed between the count and the put would leave one more free): no
# files made ahead, no flush (so no checkpoint write) for a minute
cfg = cfg.replace(make_files_ahead=False, flush_interval_commit_log=60_000, flush_interval_consume_queue=60_000)
s = MessageStore.open(root, cfg)
s.put_message(Message("T", b"a", queue_id=0))
end = s.max_physical_offset
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
top = max(int(n) for n in os.listdir("/proc/self/fd"))
fillers = []  # every descriptor number up to top taken
while True:
    fd = os.open(os.devnull, os.O_RDONLY)
    if fd > top:
        os.close(fd)
        break
    fillers.append(fd)
for fd in fillers[len(fillers) - FREE:] if FREE else []:
    os.close(fd)
resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))  # FREE descriptors left
try:
    s.put_messages([Message("T", b"b", queue_id=0), Message("T", b"c", queue_id=1)])
    err = None
except OSError as e:
    err = e.errno
unchanged = s.max_physical_offset == end and s.get_max_offset_in_queue("T", 1) == 0
same_queue = s.put_message(Message("T", b"d", queue_id=0)).queue_offset  # needs no new file
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
queue_dir = os.path.join(root, "consumequeue", "T", "1")
left = os.listdir(queue_dir) if os.path.isdir(queue_dir) else []
s.put_messages([Message("T", b"b", queue_id=0), Message("T", b"c", queue_id=1)])
s.close()
print(json.dumps({"errno": err, "unchanged": unchanged, "same_queue": same_queue, "records": records(root),
                  "left": left}))
""", tmp_path)
    assert out["errno"] == errno.EMFILE
    assert out["unchanged"] and out["same_queue"] == 1 and out["left"] == []
    assert out["records"] == [["T", 0, 0, "a"], ["T", 0, 1, "d"], ["T", 0, 2, "b"], ["T", 1, 0, "c"]]


def test_an_index_file_that_cannot_be_made(tmp_path):
    """The file size limit (RLIMIT_FSIZE) lets segments and queue files be
    made but not an index file (200 KB): the store's first put, which makes
    the first index file, and a keyed put that fills one fail before they
    write, and succeed once the limit is lifted."""
    out = run_child(CHILD_PRELUDE + """
cfg = StoreConfig(mapped_file_size_commit_log=16384, mapped_file_size_consume_queue=200,
                  max_hash_slot_num=50000, max_index_num=8, clean_service_enable=False,
                  make_files_ahead=False)  # (the puts make their files: nothing made ahead)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
def limited(put):
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    end = s.max_physical_offset
    try:
        put()
        err = None
    except OSError as e:
        err = e.errno
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    return err, s.max_physical_offset == end
s = MessageStore.open("s", cfg)
first = limited(lambda: s.put_message(Message("T", b"a")))
s.put_message(Message("T", b"a"))
for i in range(7):  # the first index file is full
    s.put_message(Message("T", b"f%d" % i, keys="f%d" % i))
roll = limited(lambda: s.put_messages([Message("T", b"c"), Message("T", b"b", keys="kb")]))
s.put_messages([Message("T", b"c"), Message("T", b"b", keys="kb")])
found = [m.body.decode() for m in s.query_messages("T", "kb")]
s.close()
print(json.dumps({"first": first, "roll": roll, "found": found, "records": records("s")}))
""", tmp_path)
    assert out["first"] == [errno.EFBIG, True]
    assert out["roll"] == [errno.EFBIG, True]
    assert out["found"] == ["b"]
    assert [r[3] for r in out["records"]] == ["a", *[f"f{i}" for i in range(7)], "c", "b"]


def test_a_queue_directory_without_write_permission(tmp_path):
    """As a user without CAP_DAC_OVERRIDE (when run as root, the child drops
    to nobody once its modules are loaded): a new topic whose directory
    cannot be made fails before the record is written; other topics go on
    at once; the topic works once it can."""
    code = CHILD_PRELUDE + """
import tempfile
root = ROOT_DIR
if os.geteuid() == 0:
    with tempfile.TemporaryDirectory() as warm:  # every module a put loads, loaded as root
        with MessageStore.open(warm + "/w", cfg) as w:
            w.put_message(Message("W", b"w", keys="w"))
            w.get_messages("W", 0, 0)
        records(warm + "/w")
    import pwd
    nobody = pwd.getpwnam("nobody")
    os.chown(os.path.dirname(root), nobody.pw_uid, nobody.pw_gid)
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
s = MessageStore.open(root, cfg)
s.put_message(Message("Old", b"a"))
end = s.max_physical_offset
cq = os.path.join(root, "consumequeue")
os.chmod(cq, 0o555)
try:
    s.put_message(Message("New", b"b"))
    err = None
except OSError as e:
    err = e.errno
unchanged = s.max_physical_offset == end and not os.path.exists(os.path.join(cq, "New"))
other = s.put_message(Message("Old", b"c")).queue_offset
os.chmod(cq, 0o755)
s.put_message(Message("New", b"b"))
s.close()
print(json.dumps({"errno": err, "unchanged": unchanged, "other": other, "records": records(root)}))
"""
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("no unprivileged user to run as")
    base = tempfile.mkdtemp(prefix="rmqstore-perm-")  # (tmp_path's parents are root's alone)
    os.chmod(base, 0o755)
    try:
        out = run_child(code.replace("ROOT_DIR", repr(os.path.join(base, "s"))), base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert out["errno"] == errno.EACCES
    assert out["unchanged"] and out["other"] == 1
    assert out["records"] == [["Old", 0, 0, "a"], ["Old", 0, 1, "c"], ["New", 0, 0, "b"]]
