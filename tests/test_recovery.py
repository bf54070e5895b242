"""Writable recovery of damaged and crashed stores.

1. A corruption matrix: each case writes a store with a fake clock (several
   CommitLog segments, several ConsumeQueue files per queue, several index
   files), closes it or drops it like kill -9 (``_crash()``, with the
   checkpoint naming nothing flushed), damages files, and reopens it
   writable. Damage where a crash tears (after what the checkpoint counts as
   flushed, in the last two segments) is cut: recovery yields the longest
   valid prefix — every message before the damage intact and findable by
   queue offset, key, unique key, msgId and time; nothing at or after the
   damage returned. Damage a crash cannot cause, with records that validate
   behind it (a closed store's, or an older segment's), is refused with a
   CorruptedFileError naming the damaged file and an int offset, changing
   nothing, and a read-only open reads around it. Never another exception,
   a hang, or a wrong message. After recovery new puts continue the queues
   densely, and recovering twice gives byte-identical files (recovery is
   idempotent).
2. Crashes during recovery (an exception injected at many points of
   recovery, and SIGKILL of a forked child recovering a larger store): the
   next recovery gives the same files as an uninterrupted one.
3. A hypothesis state machine against an in-memory model: puts, batches,
   pulls, key queries, clean reopen, crash, and a damaged tail after a crash.
4. Arbitrary bytes as a CommitLog, ConsumeQueue, index or checkpoint file:
   read-only opens and every read either work or raise CorruptedFileError.
"""

from __future__ import annotations

import inspect
import os
import random
import shutil
import signal
import struct
import time
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from conftest import StepClock, no_hang, read_bytes, scaled
from rmqstore import CorruptedFileError, GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.commitlog import CommitLog
from rmqstore.storage.checkpoint import StoreCheckpoint
from rmqstore.storage.consumequeue import ConsumeQueue
from rmqstore.storage.index import IndexService
from rmqstore.storage.mapped_file import MappedFile, MappedFileQueue

HOST = "10.0.0.7:10911"
T0 = 1_700_000_000_000
FS = 4096  # CommitLog segment
CQ_UNITS = 8
CQ_FS = 20 * CQ_UNITS
CFG = StoreConfig(
    mapped_file_size_commit_log=FS,
    mapped_file_size_consume_queue=CQ_FS,
    max_hash_slot_num=8,
    max_index_num=16,
)
QUEUES = (("RA", 0), ("RA", 1), ("RB", 0))
N = 60

# record layout (IPv4 hosts, v1): field offsets inside a record
OFF_TOTALSIZE, OFF_MAGIC, OFF_BODYCRC, OFF_PHYSICALOFFSET, OFF_BODYLENGTH, OFF_BODY = 0, 4, 8, 28, 84, 88


class Rec:
    """What a put returned, plus what was put."""

    __slots__ = ("key", "uniq", "topic", "qid", "qoff", "phy", "size", "ts", "body", "msg_id", "props_len")

    def __init__(self, key, uniq, topic, qid, qoff, phy, size, ts, body, msg_id, props_len):
        self.key, self.uniq, self.topic, self.qid, self.qoff = key, uniq, topic, qid, qoff
        self.phy, self.size, self.ts, self.body, self.msg_id, self.props_len = phy, size, ts, body, msg_id, props_len

    @property
    def end(self):
        return self.phy + self.size

    def __repr__(self):
        return f"Rec({self.key} {self.topic}/{self.qid}@{self.qoff} phy={self.phy} size={self.size})"


def _message(key, uniq, topic, qid, body):
    return Message(topic, body, queue_id=qid, tags="T" + key[-1], keys=key, unique_key=uniq)


def put_all(store, specs) -> list:
    """Put ``(key, uniq, topic, qid, body)`` specs (one batch); return their Recs."""
    msgs = [_message(*sp) for sp in specs]
    results = store.put_messages(msgs) if len(msgs) > 1 else [store.put_message(msgs[0])]
    out = []
    for (key, uniq, topic, qid, body), m, r in zip(specs, msgs, results):
        out.append(Rec(key, uniq, topic, qid, r.queue_offset, r.wrote_offset, r.wrote_bytes, r.store_timestamp,
                       bytes(body), r.msg_id, len(m.encode_properties())))
    return out


def open_store(root, clock=None, **kw):
    with no_hang(30):
        return MessageStore.open(root, config=CFG, store_host=HOST, clock=clock or StepClock(T0 + 10**8, 1000), **kw)


def build(root, n=N, crash=False, seed=0) -> list:
    """Write *n* messages (singles and small batches, bodies of 0-300 bytes,
    one key and one unique key each) with a clock stepping 1 s; close the
    store, or drop it as kill -9 would."""
    rnd = random.Random(seed)
    recs = []
    s = open_store(root, StepClock(T0, 1000))
    i = 0
    while i < n:
        k = min(n - i, 1 if rnd.random() < 0.7 else rnd.randint(2, 4))
        specs = []
        for _ in range(k):
            topic, qid = rnd.choice(QUEUES)
            specs.append((f"key-{i}", f"UNIQ{i:06d}", topic, qid, rnd.randbytes(rnd.choice((0, 5, 60, 150, 300)))))
            i += 1
        recs.extend(put_all(s, specs))
    if crash:
        s._crash()
        forget_flushes(root)
    else:
        s.close()
    layout = file_layout(root)
    assert len(layout["commitlog"]) >= 3, layout
    assert all(len(layout["consumequeue"][q]) >= 2 for q in QUEUES), layout
    assert len(layout["index"]) >= 2, layout
    return recs


def forget_flushes(root) -> None:
    """Make the checkpoint name nothing as flushed (its confirmPhyOffset 0):
    a crash before any complete flush, so the whole tail is where a crash
    tears (the flusher thread may or may not have run before the crash)."""
    patch(os.path.join(str(root), "checkpoint"), 32, bytes(8))


def file_layout(root) -> dict:
    root = str(root)
    out = {"commitlog": sorted(os.listdir(os.path.join(root, "commitlog"))), "consumequeue": {}, "index": []}
    for topic, qid in QUEUES:
        d = os.path.join(root, "consumequeue", topic, str(qid))
        out["consumequeue"][(topic, qid)] = sorted(os.listdir(d)) if os.path.isdir(d) else []
    if os.path.isdir(os.path.join(root, "index")):
        out["index"] = sorted(n for n in os.listdir(os.path.join(root, "index")) if n.isdigit())
    return out


def cl_path(root, phy):
    return os.path.join(str(root), "commitlog", f"{phy - phy % FS:020d}")


def cq_dir(root, topic, qid):
    return os.path.join(str(root), "consumequeue", topic, str(qid))


def index_paths(root):
    d = os.path.join(str(root), "index")
    return [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.isdigit()]


def patch(path, offset, data: bytes):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def xor(path, offset, mask=0x01):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([b ^ mask]))


def write_abort(root):
    with open(os.path.join(str(root), "abort"), "w") as fh:
        fh.write("4242")


# Known byte differences between recoveries that should give identical files.
# Each is a bug with a strict-xfail reproducer of its own (below); while it
# stands, the other tests compare everything else. Set to False once fixed.
#   test_recovery_creates_no_empty_index_file
KNOWN_BUG_EMPTY_INDEX_FILE = False
#   test_checkpoint_index_time_after_a_cut
KNOWN_BUG_STALE_INDEX_MSG_TIMESTAMP = False


def snapshot(root, exact=False) -> dict:
    """Every file's bytes by relative path (the lock file aside). Index files,
    whose names are wall-clock times, are keyed by their rank instead. Unless
    *exact*, the known deviations above are normalised away."""
    root = str(root)
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            rel = os.path.relpath(p, root)
            if rel == "lock":
                continue
            out[rel] = read_bytes(p)
    idx = sorted(k for k in out if k.startswith("index" + os.sep))
    contents = [out.pop(k) for k in idx]
    if not exact and KNOWN_BUG_EMPTY_INDEX_FILE:
        contents = [c for c in contents if len(c) < 40 or struct.unpack_from(">i", c, 36)[0] > 1]
    for rank, c in enumerate(contents):
        out[f"index#{rank}"] = c
    if not exact and KNOWN_BUG_STALE_INDEX_MSG_TIMESTAMP and len(out.get("checkpoint", b"")) >= 24:
        cp = out["checkpoint"]
        out["checkpoint"] = cp[:16] + bytes(8) + cp[24:]
    return out


def assert_same_files(a: dict, b: dict, what: str):
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    detail = []
    for k in differ[:5]:
        x, y = a.get(k), b.get(k)
        if x is None or y is None:
            detail.append(f"{k}: {'missing' if x is None else len(x)} vs {'missing' if y is None else len(y)} bytes")
        else:
            first = next((i for i in range(min(len(x), len(y))) if x[i] != y[i]), min(len(x), len(y)))
            detail.append(f"{k}: first difference at byte {first} ({len(x)} vs {len(y)} bytes)")
    assert not differ, f"{what}: files differ: {detail}"


# --- what a store must hold ---------------------------------------------------------------------


def same(m, r):
    assert m is not None, r
    assert (m.physical_offset, m.store_size, m.topic, m.queue_id, m.queue_offset) == (
        r.phy, r.size, r.topic, r.qid, r.qoff), (m, r)
    assert (m.keys, m.unique_key, m.store_timestamp, m.msg_id) == (r.key, r.uniq, r.ts, r.msg_id), (m, r)
    assert m.body == r.body, r


def check_store(s, recs, cut=None, extra=(), queues=QUEUES):
    """*s* holds exactly the records of *recs* that start before *cut* (all of
    them when None), followed by *extra*; every one findable every way, none
    of the others findable any way."""
    live = [r for r in recs if cut is None or r.phy < cut]
    lost = [r for r in recs if cut is not None and r.phy >= cut]
    every = live + list(extra)
    got = list(s.iter_messages())
    assert [m.physical_offset for m in got] == [r.phy for r in every], (
        f"CommitLog holds {[m.physical_offset for m in got][-5:]}..., expected ...{[r.phy for r in every][-5:]}"
    )
    for m, r in zip(got, every):
        same(m, r)
    if not extra:
        end = live[-1].end if live else 0
        mpo = s.max_physical_offset
        if cut is None:
            # as below: when the damaged records began with one that opened a
            # segment, the end is that segment's start (after the blank record)
            assert mpo == end or (mpo % FS == 0 and mpo - FS < end < mpo), (mpo, end)
        else:
            # the first damaged record's offset; or, when that record opened a
            # segment, the end of the last survivor (the blank record's place)
            assert mpo == cut or (cut % FS == 0 and mpo == end and cut - FS < end <= cut), (mpo, cut, end)
    all_queues = set(queues) | {(r.topic, r.qid) for r in extra}
    for q in s.queues():
        if q not in all_queues:
            assert s.get_max_offset_in_queue(*q) == 0, q
    for topic, qid in sorted(all_queues):
        want = sorted((r for r in every if (r.topic, r.qid) == (topic, qid)), key=lambda r: r.qoff)
        assert [r.qoff for r in want] == list(range(len(want))), (topic, qid)
        got_max = s.get_max_offset_in_queue(topic, qid)
        assert got_max == len(want), (topic, qid, got_max, len(want))
        assert s.get_min_offset_in_queue(topic, qid) == 0
        pulled, off = [], 0
        while off < len(want):
            res = s.get_messages(topic, qid, off, 3)
            assert res.status is GetMessageStatus.FOUND and res.messages, (topic, qid, off, res.status)
            pulled += res.messages
            off = res.next_begin_offset
        assert [m.physical_offset for m in pulled] == [r.phy for r in want], (topic, qid)
        for m, r in zip(pulled, want):
            same(m, r)
        if want:
            assert s.get_messages(topic, qid, len(want), 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
    for r in every:
        assert [m.physical_offset for m in s.query_messages(r.topic, r.key)] == [r.phy], ("by key", r)
        assert [m.physical_offset for m in s.query_messages(r.topic, r.uniq)] == [r.phy], ("by unique key", r)
        same(s.look_message_by_msg_id(r.msg_id), r)
        assert s.get_offset_in_queue_by_time(r.topic, r.qid, r.ts, "lower") == r.qoff, ("by time", r)
        assert s.get_offset_in_queue_by_time(r.topic, r.qid, r.ts, "upper") == r.qoff, ("by time", r)
    taken = {r.phy for r in extra}
    for r in lost:
        assert s.query_messages(r.topic, r.key) == [], ("lost message found by key", r)
        assert s.query_messages(r.topic, r.uniq) == [], ("lost message found by unique key", r)
        if r.phy not in taken:
            assert s.look_message_by_msg_id(r.msg_id) is None, ("lost message found by msgId", r)
            assert s.get_message(r.phy) is None, ("lost message still readable", r)


def check_zero_tails(root, s):
    """Nothing stale past the recovered ends (docs/recovery.md#pitfall-stale-bytes-after-truncation)."""
    mpo = s.max_physical_offset
    names = sorted(os.listdir(os.path.join(str(root), "commitlog")))
    if names:
        # the segment holding the end, then any made ahead (docs/format.md#files-made-ahead): zeros from the end on
        assert any(int(n) <= mpo <= int(n) + FS for n in names), (names[-1], mpo)
        for name in names:
            start = int(name)
            if start + FS <= mpo:
                continue
            data = read_bytes(os.path.join(str(root), "commitlog", name))
            assert not any(data[max(0, mpo - start) :]), f"stale bytes after the CommitLog end {mpo} in {name}"
    for topic, qid in s.queues():
        n = s.get_max_offset_in_queue(topic, qid) * 20
        d = cq_dir(root, topic, qid)
        files = sorted(os.listdir(d)) if os.path.isdir(d) else []
        for f in files:
            start = int(f)
            data = read_bytes(os.path.join(d, f))
            if start + CQ_FS <= n:
                continue
            assert not any(data[max(0, n - start) :]), f"stale units after the end of {topic}/{qid} in {f}"


def recover_and_check(root, recs, cut=None, refusable=()):
    """Reopen writable and check (see the module docstring). *refusable*: files
    a CorruptedFileError may name instead. Returns "recovered" or "refused"."""
    try:
        s = open_store(root)
    except CorruptedFileError as e:
        assert refusable, f"recovery refused the store: {e!r}"
        assert e.path is not None and any(os.path.exists(p) and os.path.samefile(e.path, p) for p in refusable), (
            f"{e!r} names {e.path}, not one of {refusable}"
        )
        assert isinstance(e.offset, int) and not isinstance(e.offset, bool), f"offset {e.offset!r} is not an int"
        with pytest.raises(CorruptedFileError) as again:  # refusing is stable
            open_store(root).close()
        assert again.value.path == e.path
        return "refused"
    try:
        check_store(s, recs, cut)
        check_zero_tails(root, s)
    finally:
        s._crash()
    first = snapshot(root)
    # recovering again (a crash after recovery) changes nothing
    s = open_store(root)
    try:
        check_store(s, recs, cut)
    finally:
        s._crash()
    assert_same_files(first, snapshot(root), "a second recovery")
    # and clean close + reopen + close gives the same files as one clean close
    with open_store(root) as s:
        check_store(s, recs, cut)
    first = snapshot(root)
    with open_store(root) as s:
        pass
    assert_same_files(first, snapshot(root), "close, reopen, close")
    # new puts go on densely where recovery ended
    s = open_store(root, StepClock(T0 + 10**7, 1000))
    extra = []
    try:
        end = s.max_physical_offset
        before = {q: s.get_max_offset_in_queue(*q) for q in QUEUES}
        for i, (topic, qid) in enumerate(QUEUES * 2):
            (r,) = put_all(s, [(f"new-{i}", f"NEWU{i:04d}", topic, qid, b"after recovery %d" % i)])
            assert r.qoff == before[(topic, qid)] + sum(1 for x in extra if (x.topic, x.qid) == (topic, qid)), r
            extra.append(r)
        first_phy = extra[0].phy
        assert first_phy == end or (first_phy % FS == 0 and end < first_phy < end + FS), (first_phy, end)
        check_store(s, recs, cut, extra)
    finally:
        s.close()
    with open_store(root) as s:
        check_store(s, recs, cut, extra)
        check_zero_tails(root, s)
    with no_hang(30):
        s = MessageStore.open(root, read_only=True)
    with s:
        check_store(s, recs, cut, extra)
    return "recovered"


@pytest.fixture
def root(tmp_path):
    return tmp_path / "store"


def _first_in_file(recs, file_index, nth=0):
    inside = [r for r in recs if r.phy // FS == file_index]
    return inside[min(nth, len(inside) - 1)]


def _last_file_index(recs):
    return recs[-1].phy // FS


CRASH = pytest.mark.parametrize("crash", [False, True], ids=["closed", "crashed"])


# --- CommitLog damage ------------------------------------------------------------------------------


@CRASH
@pytest.mark.parametrize("where", ["mid-record", "record-boundary"])
def test_truncated_last_commitlog_file(root, crash, where):
    recs = build(root, crash=crash)
    r = _first_in_file(recs, _last_file_index(recs), 1)
    path = cl_path(root, r.phy)
    os.truncate(path, r.phy % FS + (10 if where == "mid-record" else 0))
    recover_and_check(root, recs, cut=r.phy, refusable=[path])


@CRASH
def test_truncated_middle_commitlog_file(root, crash):
    recs = build(root, crash=crash)
    r = _first_in_file(recs, _last_file_index(recs) - 1, 2)
    path = cl_path(root, r.phy)
    os.truncate(path, r.phy % FS + 10)
    recover_and_check(root, recs, cut=r.phy, refusable=[path])


@CRASH
def test_empty_preallocated_next_segment(root, crash):
    recs = build(root, crash=crash)
    nxt = (_last_file_index(recs) + 1) * FS
    open(cl_path(root, nxt), "wb").close()
    assert recover_and_check(root, recs) == "recovered"
    assert not os.path.exists(cl_path(root, nxt)) or os.path.getsize(cl_path(root, nxt)) == FS


@CRASH
def test_zero_length_last_segment(root, crash):
    """The last segment lost all its bytes: its records are gone, the rest stays."""
    recs = build(root, crash=crash)
    last = _last_file_index(recs) * FS
    os.truncate(cl_path(root, last), 0)
    assert recover_and_check(root, recs, cut=last) == "recovered"


TORN_PROPERTIES_BUG = (
    "BUG: recovery accepts a record whose properties tail was zeroed (a torn write at the end of data): "
    "check_record validates the body CRC and the lengths but not the property bytes, so the record comes "
    "back with damaged KEYS/UNIQ_KEY"
)


@CRASH
@pytest.mark.parametrize("inside", [
    0, 1, 30,
    -1,
], ids=["record-start", "second-byte", "mid-record", "last-byte"])
def test_zeroed_tail_of_last_file(root, crash, inside):
    recs = build(root, crash=crash)
    r = _first_in_file(recs, _last_file_index(recs), 1)
    pos = r.phy % FS + (inside if inside >= 0 else r.size - 1)
    patch(cl_path(root, r.phy), pos, bytes(FS - pos))
    assert recover_and_check(root, recs, cut=r.phy) == "recovered"


FIELDS = {
    "totalsize": OFF_TOTALSIZE + 3,
    "magic": OFF_MAGIC + 1,
    "body-crc": OFF_BODYCRC + 2,
    "physical-offset": OFF_PHYSICALOFFSET + 7,
    "body-length": OFF_BODYLENGTH + 3,
    "body": None,  # a byte in the middle of the body
    "topic-length": "topic",
}


@CRASH
@pytest.mark.parametrize("file", ["middle", "last"])
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_flipped_record_byte(root, crash, file, field):
    recs = build(root, crash=crash)
    fi = _last_file_index(recs) - (1 if file == "middle" else 0)
    candidates = [r for r in recs if r.phy // FS == fi and len(r.body) > 0]
    r = candidates[min(1, len(candidates) - 1)]
    where = FIELDS[field]
    if where is None:
        where = OFF_BODY + len(r.body) // 2
    elif where == "topic":
        where = OFF_BODY + len(r.body)
    xor(cl_path(root, r.phy), r.phy % FS + where)
    if crash:  # torn where a crash tears: cut
        assert recover_and_check(root, recs, cut=r.phy) == "recovered"
    else:  # in flushed data, records that validate behind it: the disk's damage
        refused_and_read_around(root, recs, r)


def refused_and_read_around(root, recs, bad) -> None:
    """A writable open refuses damage at record *bad* (naming its file and an
    int offset, twice, writing nothing); a read-only open reads around it:
    every other record is there, by physical offset and by queue offset."""
    before = snapshot(root, exact=True)
    assert recover_and_check(root, recs, refusable=(cl_path(root, bad.phy),)) == "refused"
    assert_same_files(before, snapshot(root, exact=True), "a refused open")
    with MessageStore.open(root, read_only=True) as ro:
        assert ro.recovery_report["damage"], ro.recovery_report
        for r in recs:
            m = ro.get_message(r.phy)
            if r is bad:
                continue
            assert m is not None and m.keys == r.key, r
            pulled = ro.get_messages(r.topic, r.qid, r.qoff, 1).messages
            assert [x.physical_offset for x in pulled] == [r.phy], r


def test_stale_records_are_not_resurrected(root):
    """Recovery cuts at damaged record k, erasing k..n on disk (docs/recovery.md#pitfall-stale-bytes-after-truncation),
    not just forget them: repairing k's byte afterwards and crashing again
    must not bring k..n back (their bytes were valid records)."""
    recs = build(root, crash=True)
    k = next(r for r in recs if r.phy // FS == _last_file_index(recs) - 1 and r.phy % FS and r.body)
    path = cl_path(root, k.phy)
    flip_at = k.phy % FS + OFF_BODYCRC
    xor(path, flip_at)
    with open_store(root) as s:  # recovery truncates at k
        check_store(s, recs, cut=k.phy)
    data = read_bytes(path)
    assert not any(data[k.phy % FS :]), "recovery left stale bytes after the cut"
    later = [n for n in os.listdir(os.path.join(str(root), "commitlog")) if int(n) > k.phy]
    assert all(not any(read_bytes(os.path.join(str(root), "commitlog", n))) for n in later), later
    xor(path, flip_at)  # "repair" k: with stale bytes left, k..n would validate again
    s = open_store(root)
    s._crash()
    write_abort(root)
    s = open_store(root)
    try:
        check_store(s, recs, cut=k.phy)
        # new, shorter records over the cut, then a crash: still nothing old comes back
        extra = put_all(s, [(f"new-{i}", f"NEWU{i:04d}", "RA", 0, b"n") for i in range(3)])
    finally:
        s._crash()
    s = open_store(root)
    with s:
        check_store(s, recs, cut=k.phy, extra=extra)
        check_zero_tails(root, s)


# --- checkpoint damage ------------------------------------------------------------------------------


@pytest.mark.parametrize("abort", [False, True], ids=["no-abort", "abort"])
@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_checkpoint_damage(root, damage, abort):
    recs = build(root, crash=False)
    cp = os.path.join(str(root), "checkpoint")
    if damage == "garbage":
        patch(cp, 0, random.Random(7).randbytes(4096))
    else:
        os.unlink(cp)
    if abort:
        write_abort(root)
    assert recover_and_check(root, recs) == "recovered"


# --- index damage -------------------------------------------------------------------------------------


@CRASH
@pytest.mark.parametrize("which", ["newest", "all"])
def test_missing_index_files_are_rebuilt(root, crash, which):
    """docs/recovery.md#pitfall-index-lost-after-crash: entries lost with index files are rebuilt from the CommitLog."""
    recs = build(root, crash=crash)
    paths = index_paths(root)
    for p in paths if which == "all" else paths[-1:]:
        os.unlink(p)
    assert recover_and_check(root, recs) == "recovered"


@CRASH
@pytest.mark.parametrize("size", ["half", "header-only", "zero"])
def test_truncated_index_file(root, crash, size):
    recs = build(root, crash=crash)
    newest = index_paths(root)[-1]
    full = os.path.getsize(newest)
    os.truncate(newest, {"half": full // 2, "header-only": 40, "zero": 0}[size])
    recover_and_check(root, recs, refusable=[newest])


@CRASH
def test_zeroed_newest_index_file(root, crash):
    recs = build(root, crash=crash)
    newest = index_paths(root)[-1]
    patch(newest, 0, bytes(os.path.getsize(newest)))
    assert recover_and_check(root, recs) == "recovered"


# --- ConsumeQueue ahead of / behind the CommitLog ------------------------------------------------------


def _cq_files(root, topic, qid):
    d = cq_dir(root, topic, qid)
    return [os.path.join(d, n) for n in sorted(os.listdir(d))]


def _unit(phy, size, tags=0):
    return struct.pack(">qiq", phy, size, tags)


@CRASH
@pytest.mark.parametrize("how", ["in-last-file", "new-file"])
def test_consume_queue_ahead_of_commitlog(root, crash, how):
    """Units pointing past the CommitLog end (valid-looking) must be dropped."""
    recs = build(root, crash=crash)
    end = recs[-1].end
    topic, qid = QUEUES[0]
    n = sum(1 for r in recs if (r.topic, r.qid) == (topic, qid))
    fake = b"".join(_unit(end + 200 * i, 150) for i in range(CQ_UNITS))
    if how == "in-last-file" and n % CQ_UNITS:
        last = _cq_files(root, topic, qid)[-1]
        pos = n * 20 - int(os.path.basename(last))
        patch(last, pos, fake[: CQ_FS - pos])
    else:
        start = (n * 20 + CQ_FS - 1) // CQ_FS * CQ_FS
        if n * 20 % CQ_FS:  # fill the last file, then one more file
            last = _cq_files(root, topic, qid)[-1]
            pos = n * 20 - int(os.path.basename(last))
            patch(last, pos, fake[: CQ_FS - pos])
        with open(os.path.join(cq_dir(root, topic, qid), f"{start:020d}"), "wb") as fh:
            fh.write(fake)
    assert recover_and_check(root, recs) == "recovered"


@CRASH
def test_commitlog_cut_below_the_consume_queues(root, crash):
    """The CommitLog lost its tail (zeroed) while the queues kept their units."""
    recs = build(root, crash=crash)
    r = recs[len(recs) * 2 // 3]
    fi = r.phy // FS
    patch(cl_path(root, r.phy), r.phy % FS, bytes(FS - r.phy % FS))
    for n in os.listdir(os.path.join(str(root), "commitlog")):
        if int(n) > fi * FS:
            patch(os.path.join(str(root), "commitlog", n), 0, bytes(FS))
    assert recover_and_check(root, recs, cut=r.phy) == "recovered"


def _lose_units(root, recs, how):
    """Lose ConsumeQueue units of old and new messages alike."""
    topic, qid = QUEUES[1]
    files = _cq_files(root, topic, qid)
    n = sum(1 for r in recs if (r.topic, r.qid) == (topic, qid))
    if how == "delete-last-files":
        for f in files[1:]:
            os.unlink(f)
    elif how == "zero-last-units":
        k = n - 3  # all but the first three
        for f in files:
            start = int(os.path.basename(f))
            lo, hi = max(start, (n - k) * 20), min(start + CQ_FS, n * 20)
            if lo < hi:
                patch(f, lo - start, bytes(hi - lo))
    elif how == "delete-all-queues":
        shutil.rmtree(os.path.join(str(root), "consumequeue"))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["delete-last-files", "zero-last-units", "delete-all-queues"])
def test_consume_queue_behind_commitlog_after_crash(root, how):
    """Crashed store (abort file kept): recovery re-dispatches what the
    queues miss, so every message is consumable again, densely."""
    recs = build(root, crash=True)
    _lose_units(root, recs, how)
    assert recover_and_check(root, recs) == "recovered"


@pytest.mark.xfail(strict=True, reason="BUG: abnormal recovery starts at the checkpoint's safe time only "
                   "(store/recovery.py _abnormal_start); units a queue lost before that time are never "
                   "re-dispatched, and re-dispatched later units leave a pre-blank gap (RocketMQ behaves the same)")
@pytest.mark.parametrize("how", ["delete-last-files", "zero-last-units", "delete-all-queues"])
def test_consume_queue_behind_commitlog_abort_after_clean_close(root, how):
    """Same damage, abort file present, but the checkpoint is the one a clean
    close wrote (it vouches for every unit): recovery must still notice that
    a queue lags behind the CommitLog and re-dispatch it."""
    recs = build(root, crash=False)
    _lose_units(root, recs, how)
    write_abort(root)
    assert recover_and_check(root, recs) == "recovered"


# --- states a kill -9 can leave behind --------------------------------------------------------------


def _next_name(directory, step):
    names = sorted(n for n in os.listdir(directory) if n.isdigit())
    return os.path.join(directory, f"{int(names[-1]) + step:020d}")


def _make_file(path, size):
    with open(path, "wb") as fh:
        fh.truncate(size)


KILL_STATES = {
    # killed between creating a file and giving it its size / content
    "empty-next-commitlog-segment": lambda root: _make_file(_next_name(os.path.join(root, "commitlog"), FS), 0),
    "zeroed-next-commitlog-segment": lambda root: _make_file(_next_name(os.path.join(root, "commitlog"), FS), FS),
    "empty-next-cq-file": lambda root: _make_file(_next_name(cq_dir(root, *QUEUES[0]), CQ_FS), 0),
    "zeroed-next-cq-file": lambda root: _make_file(_next_name(cq_dir(root, *QUEUES[0]), CQ_FS), CQ_FS),
    "empty-new-queue-file": lambda root: (os.makedirs(cq_dir(root, "RC", 0)),
                                          _make_file(os.path.join(cq_dir(root, "RC", 0), "0" * 20), 0)),
    "empty-new-index-file": lambda root: _make_file(os.path.join(root, "index", "99991231235959999"), 0),
    "zeroed-new-index-file":
        lambda root: _make_file(os.path.join(root, "index", "99991231235959999"), CFG.index_file_size),
    "empty-checkpoint": lambda root: _make_file(os.path.join(root, "checkpoint"), 0),
}
KILL_STATE_BUGS: dict = {}  # none left: each state below must recover


@pytest.mark.parametrize(
    "state",
    [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KILL_STATE_BUGS[s])) if s in KILL_STATE_BUGS else s
     for s in sorted(KILL_STATES)],
)
def test_states_a_kill_leaves_behind(root, state):
    """A kill -9 can stop the store between creating a file and writing it;
    such files hold nothing, and the store must open with everything intact."""
    recs = build(root, crash=True)
    KILL_STATES[state](str(root))
    assert recover_and_check(root, recs) == "recovered"


def test_kill_between_index_entries_of_one_record(root):
    """A kill after a record's UNIQ_KEY entry but before its KEYS entry: the
    next recovery must index the missing key (re-dispatch must not skip a
    record just because the index already reaches its offset)."""
    recs = build(root, crash=False)
    s = open_store(root)
    real_put = IndexService._put

    class Killed(BaseException):
        pass

    def put(self, f, key, phy, ts):
        if key == "RA#victim":
            raise Killed()
        return real_put(self, f, key, phy, ts)

    try:
        IndexService._put = put
        s._undo = lambda mark: None  # a kill: the process is gone before a failed put could be undone
        with pytest.raises(Killed):
            s.put_message(Message("RA", b"v", queue_id=0, keys="victim", unique_key="VICTIMUNIQ"))
    finally:
        IndexService._put = real_put
        s._crash()
    with open_store(root) as s:
        (m,) = s.query_messages("RA", "VICTIMUNIQ")
        assert [x.physical_offset for x in s.query_messages("RA", "victim")] == [m.physical_offset]
        victim = Rec("victim", "VICTIMUNIQ", "RA", 0, m.queue_offset, m.physical_offset,
                     m.store_size, m.store_timestamp, b"v", m.msg_id, 0)
        check_store(s, recs + [], cut=None, extra=[victim])


@pytest.mark.parametrize("k", [1, 3, 10])
def test_zeroed_properties_tail_of_the_last_record(root, k):
    """A power loss that zeroes the last *k* bytes of written data tears the
    last record inside its properties. Body CRC and length formula still
    pass, but the record is not what was written: it must not come back.
    (Every non-empty property blob RocketMQ writes ends with 0x02.)"""
    recs = build(root, crash=True)
    last = recs[-1]
    assert last.props_len > k
    patch(cl_path(root, last.phy), last.end % FS - k if last.end % FS else FS - k, bytes(k))
    assert recover_and_check(root, recs, cut=last.phy) == "recovered"


# --- crashes during recovery ----------------------------------------------------------------------------


class Interrupted(BaseException):
    """Stands for the process dying at this point of recovery."""


def _damage_for_recovery(root, recs):
    """A crashed store that gives recovery work everywhere: torn CommitLog
    tail, a lagging queue, a queue ahead, a lost index file."""
    r = _first_in_file(recs, _last_file_index(recs) - 1, 3)  # the whole last segment goes too
    patch(cl_path(root, r.phy), r.phy % FS + 20, bytes(FS - r.phy % FS - 20))
    topic, qid = QUEUES[1]
    for path in _cq_files(root, topic, qid)[-2:]:  # units before the cut lost too: re-dispatch has work
        os.unlink(path)
    os.unlink(index_paths(root)[-1])
    return r.phy


INTERRUPT_POINTS = [
    # (class, method, on its nth call, die before or after running it)
    (CommitLog, "truncate", 1, "after"),  # CommitLog cut, index not yet fixed
    (MappedFileQueue, "truncate_dirty", 2, "before"),  # some queues cut at their valid end, others not
    (ConsumeQueue, "recover_end", 2, "before"),  # still reading: nothing written yet
    (ConsumeQueue, "truncate_dirty_logic_files", 2, "before"),  # some queues cut, others not
    (MappedFile, "zero_tail", 1, "before"),  # a tail cut but not zeroed
    (MappedFile, "zero_tail", 1, "after"),
    (MappedFile, "destroy", 1, "after"),  # one segment beyond the end deleted, others not
    (MessageStore, "_dispatch", 3, "before"),  # in the middle of re-dispatch (of the lost units)
    (IndexService, "build_index", 3, "after"),  # in the middle of the index rebuild
    (IndexService, "truncate", 1, "before"),
    (StoreCheckpoint, "flush", 1, "before"),  # everything done but the checkpoint
    (MessageStore, "_recover_index", 1, "before"),
]


def _recovery_dies(victim, monkeypatch, cls, name, nth, when):
    """Open the store at *victim* with the *nth* call of ``cls.name`` dying
    (Interrupted) before or after it runs; that point must be on the path."""
    real = inspect.getattr_static(cls, name)  # (a staticmethod stays one; may be a base class's)
    calls = [0]

    def interrupted(*a, **kw):
        calls[0] += 1
        if calls[0] == nth and when == "before":
            raise Interrupted(f"before {cls.__name__}.{name} call {nth}")
        result = real(*a, **kw)
        if calls[0] == nth:
            raise Interrupted(f"after {cls.__name__}.{name} call {nth}")
        return result

    monkeypatch.setattr(cls, name, interrupted)
    with pytest.raises(Interrupted):
        open_store(victim)
    monkeypatch.setattr(cls, name, real)


def _reference_and_victim(tmp_path, base, monkeypatch, cls, name, nth, when, check=None):
    """Two copies of the store at *base*: ``reference`` recovered without
    interruption (*check* run on the open store, then a crash), ``victim``
    with its recovery dying at the *nth* call of ``cls.name``. Returns both
    paths."""
    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    s = open_store(reference)
    if check is not None:
        check(s)
    s._crash()
    victim = tmp_path / "victim"
    shutil.copytree(base, victim)
    _recovery_dies(victim, monkeypatch, cls, name, nth, when)
    return reference, victim


@pytest.mark.parametrize(
    "cls,name,nth,when", INTERRUPT_POINTS, ids=[f"{c.__name__}.{n}-{w}-{i}" for c, n, i, w in INTERRUPT_POINTS]
)
def test_crash_during_recovery(tmp_path, monkeypatch, cls, name, nth, when):
    """Recovery dies at one point (injected); the next recovery gives the same
    files as a recovery that was never interrupted."""
    base = tmp_path / "base"
    recs = build(base, crash=True)
    cut = _damage_for_recovery(base, recs)
    reference, victim = _reference_and_victim(
        tmp_path, base, monkeypatch, cls, name, nth, when, check=lambda s: check_store(s, recs, cut)
    )
    want = snapshot(reference)
    s = open_store(victim)
    try:
        check_store(s, recs, cut)
    finally:
        s._crash()
    assert_same_files(want, snapshot(victim), f"recovery interrupted {when} {cls.__name__}.{name} call {nth}")
    assert recover_and_check(victim, recs, cut) == "recovered"


def test_recovery_creates_no_empty_index_file(root):
    recs = build(root, crash=False)
    newest = index_paths(root)[-1]
    assert struct.unpack_from(">i", read_bytes(newest), 36)[0] == CFG.max_index_num  # full
    before = snapshot(root, exact=True)
    with open_store(root) as s:
        check_store(s, recs)
    after = snapshot(root, exact=True)
    assert sorted(k for k in after if k.startswith("index#")) == sorted(k for k in before if k.startswith("index#"))
    # and so a crash right after this recovery, and another one, change nothing
    write_abort(root)
    s = open_store(root)
    s._crash()
    first = snapshot(root, exact=True)
    s = open_store(root)
    s._crash()
    assert_same_files(first, snapshot(root, exact=True), "a second recovery")


def test_checkpoint_index_time_after_a_cut(tmp_path, monkeypatch):
    base = tmp_path / "base"
    recs = build(base, crash=True)
    cut = _damage_for_recovery(base, recs)
    reference, victim = _reference_and_victim(  # dies in the middle of re-dispatch
        tmp_path, base, monkeypatch, IndexService, "build_index", 3, "before"
    )
    s = open_store(victim)
    s._crash()
    cp = StoreCheckpoint(reference / "checkpoint")
    cp.load()
    last_kept = max(r.ts for r in recs if r.phy < cut)
    assert cp.index_msg_timestamp <= last_kept, (cp.index_msg_timestamp, last_kept)
    assert read_bytes(victim / "checkpoint") == read_bytes(reference / "checkpoint")


def test_checkpoint_lost_after_an_index_rebuild(tmp_path, monkeypatch):
    """Recovery rebuilds a lost index (several files fill up) and dies before
    the checkpoint is written; the next recovery finds the index whole, rolls
    no file, and must still name the newest full index file in the
    checkpoint, as the uninterrupted recovery does."""
    base = tmp_path / "base"
    recs = build(base, n=1500, crash=True, seed=3)
    shutil.rmtree(base / "index")
    reference, victim = _reference_and_victim(tmp_path, base, monkeypatch, StoreCheckpoint, "flush", 1, "before")
    s = open_store(victim)
    try:
        check_store(s, recs, cut=None)
    finally:
        s._crash()
    assert len(index_paths(victim)) > 2  # the rebuild filled files
    assert_same_files(snapshot(reference), snapshot(victim), "checkpoint lost after an index rebuild")


def test_kill_during_recovery_of_a_larger_store(tmp_path):
    """SIGKILL a forked child at several moments of a long recovery (all
    queues and the whole index lost after a crash, so everything is rebuilt);
    the store recovered at last equals the one an uninterrupted recovery gives."""
    base = tmp_path / "base"
    recs = build(base, n=1500, crash=True, seed=3)
    r = _first_in_file(recs, _last_file_index(recs) - 1, 3)  # where a crash tears
    patch(cl_path(base, r.phy), r.phy % FS + 30, bytes(FS - r.phy % FS - 30))
    shutil.rmtree(base / "consumequeue")
    shutil.rmtree(base / "index")
    reference = tmp_path / "reference"
    shutil.copytree(base, reference)
    t0 = time.monotonic()
    s = open_store(reference)
    took = time.monotonic() - t0
    s._crash()
    want = snapshot(reference)

    victim = tmp_path / "victim"
    shutil.copytree(base, victim)
    rnd = random.Random(11)
    for i in range(6):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                MessageStore.open(victim, config=CFG, store_host=HOST, clock=StepClock(T0 + 10**8, 1000))
                code = 0
                time.sleep(10)  # recovered: hold on until killed (never close)
            finally:
                os._exit(code)
        time.sleep(rnd.uniform(0.0, took * 1.2) if i else 0.001)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    s = open_store(victim)
    try:
        check_store(s, recs, cut=r.phy)
    finally:
        s._crash()
    assert_same_files(want, snapshot(victim), "recovery killed several times")


# --- stateful model ---------------------------------------------------------------------------------------

# BUG (test_zeroed_properties_tail_of_the_last_record): while a tail zeroed
# inside the last record's properties goes unnoticed, the damage rule below
# zeroes at least from the torn record's properties-length field on (which
# recovery does detect). Set to True once that test passes.
TORN_PROPERTIES_DETECTED = True

SM_TOPICS = (("SA", 2), ("SB", 1))
SM_QUEUES = [(t, q) for t, n in SM_TOPICS for q in range(n)]
sm_spec = st.tuples(st.sampled_from(SM_QUEUES), st.binary(max_size=400))


class CrashModel(RuleBasedStateMachine):
    """Model: the messages acknowledged and not lost to a damaged tail."""

    base_dir = None
    counter = 0

    @initialize()
    def start(self):
        CrashModel.counter += 1
        self.root = os.path.join(CrashModel.base_dir, f"m{CrashModel.counter}")
        self.clock = StepClock(T0, 1000)
        self.store = open_store(self.root, self.clock)
        self.recs: list = []  # in CommitLog order
        self.n = 0
        self.crashed_end = None

    def _spec(self, spec):
        (topic, qid), body = spec
        self.n += 1
        return (f"sm-{self.n}", f"SMU{self.n:08d}", topic, qid, body)

    @precondition(lambda self: self.store is not None)
    @rule(spec=sm_spec)
    def put(self, spec):
        self._add(put_all(self.store, [self._spec(spec)]))

    @precondition(lambda self: self.store is not None)
    @rule(specs=st.lists(sm_spec, min_size=2, max_size=5))
    def put_batch(self, specs):
        self._add(put_all(self.store, [self._spec(sp) for sp in specs]))

    def _add(self, new):
        for r in new:
            want = sum(1 for x in self.recs if (x.topic, x.qid) == (r.topic, r.qid))
            assert r.qoff == want, (r, want)
            assert not self.recs or r.phy >= self.recs[-1].end
            self.recs.append(r)

    @precondition(lambda self: self.store is not None and self.recs)
    @rule(data=st.data())
    def get(self, data):
        r = data.draw(st.sampled_from(self.recs))
        res = self.store.get_messages(r.topic, r.qid, r.qoff, 1)
        assert res.status is GetMessageStatus.FOUND
        same(res.messages[0], r)

    @precondition(lambda self: self.store is not None and self.recs)
    @rule(data=st.data())
    def query(self, data):
        r = data.draw(st.sampled_from(self.recs))
        assert [m.physical_offset for m in self.store.query_messages(r.topic, r.key)] == [r.phy]
        assert [m.physical_offset for m in self.store.query_messages(r.topic, r.uniq)] == [r.phy]

    @precondition(lambda self: self.store is not None)
    @rule()
    def reopen(self):
        self.store.close()
        self.store = open_store(self.root, self.clock)
        assert self.store.recovery_report["stopped_because"] is None

    @precondition(lambda self: self.store is not None)
    @rule()
    def crash(self):
        self.store._crash()
        self.store = None
        self.crashed_end = self.recs[-1].end if self.recs else None

    @precondition(lambda self: self.store is None and self.crashed_end is not None and self.recs)
    @rule(k=st.one_of(st.integers(1, 64), st.integers(1, 1500)))
    def damage_tail(self, k):
        """Zero the last *k* bytes of written data (within the last record's
        segment): records overlapping the zeros are lost."""
        end = self.crashed_end
        seg = (end - 1) // FS * FS
        z0 = max(seg, end - k)
        if not TORN_PROPERTIES_DETECTED:
            first = next(r for r in self.recs if r.end > z0)
            z0 = min(z0, first.end - first.props_len - 2)
            z0 = max(z0, first.phy)
        patch(cl_path(self.root, seg), z0 - seg, bytes(end - z0))
        self.recs = [r for r in self.recs if r.end <= z0]
        self.crashed_end = None  # one damage per crash: the next one needs another crash

    @precondition(lambda self: self.store is None)
    @rule()
    def recover(self):
        self.store = open_store(self.root, self.clock)
        self.crashed_end = None

    @invariant()
    def dense_queues(self):
        if self.store is None:
            return
        for topic, qid in SM_QUEUES:
            want = sum(1 for r in self.recs if (r.topic, r.qid) == (topic, qid))
            assert self.store.get_max_offset_in_queue(topic, qid) == want, (topic, qid)

    @invariant()
    def commitlog_is_the_model(self):
        if self.store is not None:
            assert [m.physical_offset for m in self.store.iter_messages()] == [r.phy for r in self.recs]

    @precondition(lambda self: self.store is not None)
    @rule()
    def check_everything(self):
        check_store(self.store, self.recs, queues=SM_QUEUES)

    def teardown(self):
        if not hasattr(self, "root"):
            return
        if self.store is None:
            self.store = open_store(self.root, self.clock)
        try:
            check_store(self.store, self.recs, queues=SM_QUEUES)
        finally:
            self.store.close()


def test_crash_model(tmp_path):
    CrashModel.base_dir = str(tmp_path)
    run_state_machine_as_test(
        CrashModel,
        settings=settings(max_examples=scaled(25), stateful_step_count=25, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


# --- arbitrary bytes ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_base(tmp_path_factory):
    """A small valid store to damage (built once)."""
    root = tmp_path_factory.mktemp("fuzz-base") / "store"
    recs = build(root, n=N, crash=False, seed=9)
    return str(root), recs


def _target(root, kind):
    if kind == "commitlog":
        return os.path.join(root, "commitlog", sorted(os.listdir(os.path.join(root, "commitlog")))[1])
    if kind == "consumequeue":
        return _cq_files(root, *QUEUES[0])[-1]
    if kind == "index":
        return index_paths(root)[-1]
    return os.path.join(root, "checkpoint")


damage_strategy = st.one_of(
    st.tuples(st.just("replace"), st.binary(max_size=6000)),
    st.tuples(st.just("random-same-size"), st.integers(0, 2**32 - 1)),
    st.tuples(st.just("patch"),
              st.lists(st.tuples(st.integers(0, 8191), st.binary(min_size=1, max_size=16)), min_size=1, max_size=6)),
)


def _read_everything(s, recs, kind):
    """Every read API; each may only work or raise CorruptedFileError, and what
    it returns must be what was written (for a damaged CommitLog: at least the
    record's place and its CRC-protected body)."""
    by_phy = {r.phy: r for r in recs}

    def check(m):
        if m is None:
            return
        r = by_phy.get(m.physical_offset)
        assert r is not None, f"returned a record that was never written: {m!r}"
        if kind == "commitlog":
            assert m.body == r.body, f"returned a damaged body: {m!r}"
        else:
            same(m, r)

    ops = [lambda: list(s.iter_messages())]
    for topic, qid in s.queues():
        mx = s.get_max_offset_in_queue(topic, qid)
        mn = s.get_min_offset_in_queue(topic, qid)
        for off in {0, mn, max(mn, mx - 1), mx}:
            ops.append(lambda t=topic, q=qid, o=off: s.get_messages(t, q, o, 32).messages)
            ops.append(lambda t=topic, q=qid, o=off: s.get_messages(t, q, o, 4, tags="Ty || T3").messages)
        for ts in (0, T0, T0 + 20_000, T0 + 10**9):
            for b in ("lower", "upper"):
                ops.append(lambda t=topic, q=qid, x=ts, b=b: s.get_offset_in_queue_by_time(t, q, x, b))
    for r in recs[::7]:
        ops.append(lambda r=r: s.query_offsets(r.topic, r.key))
        ops.append(lambda r=r: s.query_messages(r.topic, r.key))
        ops.append(lambda r=r: s.query_messages(r.topic, r.uniq, begin=r.ts - 5000, end=r.ts + 5000))
        ops.append(lambda r=r: [s.look_message_by_msg_id(r.msg_id)])
        ops.append(lambda r=r: [s.get_message(r.phy)])
    ops.append(lambda: [s.get_message(FS + 13)])
    for op in ops:
        try:
            out = op()
        except CorruptedFileError as e:
            assert e.offset is None or isinstance(e.offset, int)
            continue
        if isinstance(out, list):
            for m in out:
                if not isinstance(m, int):
                    check(m)


@pytest.mark.parametrize("kind", ["commitlog", "consumequeue", "index", "checkpoint"])
def test_arbitrary_bytes_read_only(tmp_path_factory, fuzz_base, kind):
    base, recs = fuzz_base
    work = tmp_path_factory.mktemp(f"fuzz-{kind}")
    counter = [0]

    @settings(max_examples=scaled(60), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(damage=damage_strategy)
    def run(damage):
        counter[0] += 1
        root = os.path.join(str(work), f"s{counter[0]}")
        shutil.copytree(base, root)
        path = _target(root, kind)
        mode, payload = damage
        if mode == "replace":
            with open(path, "wb") as fh:
                fh.write(payload)
        elif mode == "random-same-size":
            patch(path, 0, random.Random(payload).randbytes(os.path.getsize(path)))
        else:
            size = os.path.getsize(path)
            for pos, data in payload:
                if size:
                    patch(path, pos % size, data[: size - pos % size])
        try:
            with no_hang(20):
                try:
                    s = MessageStore.open(root, read_only=True)
                except CorruptedFileError as e:
                    assert e.path is not None and isinstance(e.offset, (int, type(None)))
                    return
                try:
                    _read_everything(s, recs, kind)
                finally:
                    s.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    run()


def _view_message(r):
    """The first message of a zero-copy pull, as the reads above give it (body only)."""
    return SimpleNamespace(body=bytes(r.bodies()[0]))


def _column_message(r):
    c = r.columns
    return SimpleNamespace(body=c["body_data"][c["body_offsets"][0] : c["body_offsets"][1]].tobytes())


@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_damaged_body_in_an_old_segment_is_never_returned(root, read_only):
    """Bit rot in a segment that clean-shutdown recovery does not rescan: the
    message may be refused (CorruptedFileError) or cut away, never returned
    with a body other than the one written."""
    recs = build(root, crash=False)
    assert _last_file_index(recs) >= 3  # segment 0 lies outside the last three
    r = next(x for x in recs if x.phy < FS and len(x.body) > 10)
    xor(cl_path(root, r.phy), r.phy % FS + OFF_BODY + 3)
    s = MessageStore.open(root, read_only=True) if read_only else open_store(root)
    with s:
        reads = [
            lambda: s.get_message(r.phy),
            lambda: s.look_message_by_msg_id(r.msg_id),
            lambda: s.get_messages(r.topic, r.qid, r.qoff, 1).messages[0],
            lambda: s.query_messages(r.topic, r.key)[0],
            lambda: next(m for m in s.iter_messages() if m.physical_offset == r.phy),
            lambda: _view_message(s.get_message_views(r.topic, r.qid, r.qoff, 1)),
            lambda: _column_message(s.get_message_columns(r.topic, r.qid, r.qoff, 1)),
        ]
        for read in reads:
            try:
                m = read()
            except (CorruptedFileError, IndexError, StopIteration):
                continue
            assert m is None or m.body == r.body, f"{m!r} came back with a damaged body"
