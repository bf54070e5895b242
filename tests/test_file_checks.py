"""Every file is checked against itself.

A header whose fields contradict its own file — an index file's counts,
times and offsets, the checkpoint's fields, a consumerOffset.json of any
shape — gives a typed error or is read around, and ``verify`` reports it:

* index: a lie in one index file never makes a query loop, crash or hide
  the keys other index files hold; a writable open rebuilds a lying newest
  file from the CommitLog and reads around older ones.
* checkpoint: fields that contradict the store (negative, far in the
  future, offsets past the CommitLog) are read as 0 with a warning: the
  checkpoint only advises where recovery starts.
* consumer offsets: a document that is not an offset table (whatever its
  shape, depth or encoding) is a CorruptedFileError naming the file
  (``load`` then falls back to ``.bak``); names that cannot be written as
  UTF-8 are refused at commit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import struct
import time

import pytest

from conftest import StepClock, no_hang
from rmqstore import (
    ConsumerOffsetStore,
    CorruptedFileError,
    IllegalMessageError,
    Message,
    MessageStore,
    StoreConfig,
)
from rmqstore import _kernels as k
from rmqstore.service.offsets import parse_offset_json
from rmqstore.storage.checkpoint import StoreCheckpoint
from rmqstore.tools import verify_store

T0 = 1_700_000_000_000
TOPIC = "T"
S, N = 16, 40  # index geometry: 39 entries a file, ~20 records
CFG = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 1000,
                  max_hash_slot_num=S, max_index_num=N)
MSGS = 90  # one key each: three index files (39, 39 and 12 entries)
BASE = 40 + 4 * S


def _patch(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


# --- index files ----------------------------------------------------------------------------


def _build(root) -> dict:
    """A store whose records are a second apart, each with key k<i>; returns
    ``{key: (physical offset, store time)}``."""
    out = {}
    with MessageStore.open(root, CFG, clock=StepClock(T0, 1000)) as s:
        for i in range(MSGS):
            r = s.put_message(Message(TOPIC, b"b%d" % i, keys=f"k{i}"))
            out[f"k{i}"] = (r.wrote_offset, r.store_timestamp)
    return out


def _index_files(root) -> list:
    return sorted((root / "index").iterdir())


def _holder(root, key: str) -> str:
    """Name of the index file holding the entry of *key*."""
    h = k.index_key_hash(f"{TOPIC}#{key}")
    for p in _index_files(root):
        data = p.read_bytes()
        count = struct.unpack_from(">i", data, 36)[0]
        if any(struct.unpack_from(">i", data, BASE + 20 * e)[0] == h for e in range(1, count)):
            return p.name
    raise AssertionError(f"{key} is in no index file")


def _chain_cycle(data: bytes):
    """Patch making the longest slot chain of a file a cycle: its oldest entry
    links back to its newest."""
    best = []
    for slot in range(S):
        e = struct.unpack_from(">i", data, 40 + 4 * slot)[0]
        chain = []
        while e > 0 and e not in chain:
            chain.append(e)
            e = struct.unpack_from(">i", data, BASE + 20 * e + 16)[0]
        best = max(best, chain, key=len)
    assert len(best) >= 2
    return [(BASE + 20 * best[-1] + 16, struct.pack(">i", best[0]))]


def _lie(data: bytes, lie: str) -> list:
    """(offset, bytes) patches telling *lie* in the index file *data*."""
    fb, fe, _bp, ep, _sc, count = struct.unpack_from(">qqqqii", data, 0)
    used = next(i for i in range(S) if struct.unpack_from(">i", data, 40 + 4 * i)[0])
    return {
        "count-negative": [(36, struct.pack(">i", -3))],
        "count-past-entries": [(36, struct.pack(">i", N + 5))],
        "slot-count-negative": [(32, struct.pack(">i", -1))],
        "slot-count-huge": [(32, struct.pack(">i", 10**6))],
        "times-reversed": [(0, struct.pack(">qq", fe, fb))],
        "begin-time-negative": [(0, struct.pack(">q", -5))],
        "begin-time-1970": [(0, struct.pack(">q", 1))],
        "end-time-far-future": [(8, struct.pack(">q", 1 << 62))],
        "end-time-1970": [(8, struct.pack(">q", 1))],
        "end-offset-past-last-entry": [(24, struct.pack(">q", ep + 10**6))],
        "end-offset-zero": [(24, struct.pack(">q", 0))],
        "begin-offset-past-end": [(16, struct.pack(">q", ep + 1))],
        "slot-past-count": [(40 + 4 * used, struct.pack(">i", count + 3))],
        "chain-cycle": _chain_cycle(data),
    }[lie]


LIES = ["count-negative", "count-past-entries", "slot-count-negative", "slot-count-huge", "times-reversed",
        "begin-time-negative", "begin-time-1970", "end-time-far-future", "end-time-1970",
        "end-offset-past-last-entry", "end-offset-zero", "begin-offset-past-end", "slot-past-count", "chain-cycle"]


# lies about what the geometry is inferred from: slot and entry counts, slots
GEOMETRY_EVIDENCE = {
    "count-negative", "count-past-entries", "slot-count-negative", "slot-count-huge", "slot-past-count",
}


def _found(s, key: str, phy: int, ts: int) -> bool:
    """*key* is found, alone and right, over all time and in a window of 3 s around it
    (a file's first entry is dated one record late: its time difference is taken
    from the previous file's end, then the file's begin time becomes its own)."""
    with no_hang():
        wide = s.query_messages(TOPIC, key)
        narrow = s.query_offsets(TOPIC, key, 64, ts - 1500, ts + 1500)
    return [m.physical_offset for m in wide] == [phy] and narrow == [phy]


def _open_read_only(root, lie, victim):
    """A read-only open, or None where it named *victim*: without a config the
    geometry comes from the files, and a file whose counts or slots break that
    evidence is named (the geometry is then not certain)."""
    try:
        with no_hang(30):
            return MessageStore.open(root, read_only=True)
    except CorruptedFileError as e:
        assert lie in GEOMETRY_EVIDENCE and e.path == str(victim), e
        return None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("built") / "s"
    keys = _build(root)
    return root, keys


@pytest.mark.parametrize("which", [0, 1, 2], ids=["oldest", "middle", "newest"])
@pytest.mark.parametrize("lie", LIES)
def test_a_lying_index_file_hides_no_other_file_s_keys(built, tmp_path, lie, which):
    root = tmp_path / "s"
    shutil.copytree(built[0], root)
    keys = built[1]
    files = _index_files(root)
    assert len(files) == 3
    victim = files[which]
    holders = {key: _holder(root, key) for key in keys}
    others = [key for key in keys if holders[key] != victim.name]
    assert others and len(others) < len(keys)
    for off, b in _lie(victim.read_bytes(), lie):
        _patch(victim, off, b)

    # verify names the file
    problems = verify_store(root)
    assert any(p.file == f"index/{victim.name}" and p.severity == "error" for p in problems), problems

    # read-only: every key of the other files is found; nothing loops or crashes
    ro = _open_read_only(root, lie, victim)
    if ro is not None:
        with ro:
            missing = [key for key in others if not _found(ro, key, *keys[key])]
            assert not missing, f"read-only: keys of other files hidden: {missing}"
            for key in keys:  # the lying file's own keys: any answer, never a wrong message
                with no_hang():
                    assert all(m.properties.get("KEYS") == key for m in ro.query_messages(TOPIC, key))

    # writable: the same, a lying newest file is rebuilt, new keys are indexed
    with no_hang(30):
        w = MessageStore.open(root, CFG, clock=StepClock(T0 + 10**6, 1000))
    with w:
        want = list(keys) if which == 2 and lie not in ("slot-past-count", "chain-cycle") else others
        missing = [key for key in want if not _found(w, key, *keys[key])]
        assert not missing, f"writable: keys hidden: {missing}"
        new = [w.put_message(Message(TOPIC, b"new%d" % i, keys=f"new{i}")) for i in range(30)]
        for i, r in enumerate(new):
            assert [m.physical_offset for m in w.query_messages(TOPIC, f"new{i}")] == [r.wrote_offset]
    ro = _open_read_only(root, lie, victim)
    if ro is not None:
        with ro:
            for i, r in enumerate(new):
                assert [m.physical_offset for m in ro.query_messages(TOPIC, f"new{i}")] == [r.wrote_offset]
            missing = [key for key in others if not _found(ro, key, *keys[key])]
            assert not missing, f"reopened: keys of other files hidden: {missing}"


def test_every_index_file_lying(built, tmp_path):
    """A writable open rebuilds them all from the CommitLog; a read-only one
    reads around them without looping."""
    root = tmp_path / "s"
    shutil.copytree(built[0], root)
    keys = built[1]
    for p in _index_files(root):
        for off, b in _lie(p.read_bytes(), "begin-time-1970"):
            _patch(p, off, b)
    assert {p.file for p in verify_store(root) if p.severity == "error"} == {
        f"index/{p.name}" for p in _index_files(root)}
    with no_hang(30), MessageStore.open(root, read_only=True) as ro:
        for key in keys:
            assert all(m.properties.get("KEYS") == key for m in ro.query_messages(TOPIC, key))
    with no_hang(30), MessageStore.open(root, CFG) as w:
        missing = [key for key in keys if not _found(w, key, *keys[key])]
        assert not missing, missing
        r = w.put_message(Message(TOPIC, b"new", keys="new"))
        assert [m.physical_offset for m in w.query_messages(TOPIC, "new")] == [r.wrote_offset]
    assert verify_store(root) == []


def test_a_lying_index_file_neither_blocks_nor_jumps_expiry(built, tmp_path):
    """An old file whose end offset lies far ahead is damaged: it sorts first
    and expires with the first sound file after it, never blocking the
    others (nor becoming the file new keys go to)."""
    root = tmp_path / "s"
    shutil.copytree(built[0], root)
    oldest, middle, newest = _index_files(root)
    for off, b in _lie(oldest.read_bytes(), "end-offset-past-last-entry"):
        _patch(oldest, off, b)
    middle_end = struct.unpack_from(">q", middle.read_bytes(), 24)[0]
    with MessageStore.open(root, CFG) as w:
        idx = w.index
        assert [f.name for f in idx.files] == [oldest.name, middle.name, newest.name]
        assert [f.damaged for f in idx.files] == [True, False, False]
        assert idx.expired_head_count(0) == 0
        assert idx.expired_head_count(middle_end) == 0  # the middle file still indexes records there
        assert idx.expired_head_count(middle_end + 1) == 2


def test_a_lying_end_time_never_reaches_the_checkpoint(built, tmp_path):
    """The checkpoint's indexMsgTimestamp names the newest full index file's
    end time: never one a damaged file claims."""
    root = tmp_path / "s"
    shutil.copytree(built[0], root)
    oldest, middle, _newest = _index_files(root)
    for p in (oldest, middle):  # both full files
        for off, b in _lie(p.read_bytes(), "end-time-far-future"):
            _patch(p, off, b)
    with MessageStore.open(root, CFG) as w:
        assert w.index.newest_full_end_timestamp() == 0
    assert struct.unpack_from(">q", (root / "checkpoint").read_bytes(), 16)[0] == 0


def test_healthy_index_files_have_no_header_problem(built):
    from rmqstore.storage.index import IndexService

    idx = IndexService(built[0] / "index", S, N, read_only=True)
    idx.load()
    try:
        assert [f.header_problem() for f in idx.files] == [None, None, None]
    finally:
        idx.close()
    assert verify_store(built[0]) == []


# --- checkpoint -----------------------------------------------------------------------------

CP_CFG = StoreConfig(mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=20 * 64,
                     max_hash_slot_num=S, max_index_num=N)
CP_MSGS = 120  # five CommitLog segments
FUTURE = time.time_ns() // 1_000_000 + 10 * 86_400_000  # ten days ahead of this machine
# (field offset, value); fields: physic, logics, index timestamps, master flushed, confirm offsets
CP_LIES = {
    "physic-time-negative": (0, -1),
    "physic-time-far-future": (0, FUTURE),
    "logics-time-far-future": (8, FUTURE),
    "logics-time-max": (8, (1 << 63) - 1),
    "index-time-negative": (16, -7),
    "index-time-far-future": (16, FUTURE),
    "master-flushed-offset-past-commitlog": (24, 10**12),
    "master-flushed-offset-negative": (24, -1),
    "confirm-offset-past-commitlog": (32, 1 << 40),
}
CP_NAMES = ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp", "master_flushed_offset",
            "confirm_phy_offset")


@pytest.fixture(scope="module")
def segmented(tmp_path_factory):
    root = tmp_path_factory.mktemp("cp") / "s"
    with MessageStore.open(root, CP_CFG, clock=StepClock(T0, 1000)) as s:
        rs = [s.put_message(Message(TOPIC, b"c%d" % i, queue_id=i % 2, keys=f"c{i}")) for i in range(CP_MSGS)]
    assert len(os.listdir(root / "commitlog")) >= 4
    return root, [r.wrote_offset for r in rs]


def _all_there(s, phys) -> None:
    for q in (0, 1):
        got = s.get_messages(TOPIC, q, 0, CP_MSGS).messages
        assert [m.physical_offset for m in got] == phys[q::2]
    for i in (0, CP_MSGS // 2, CP_MSGS - 1):
        assert [m.physical_offset for m in s.query_messages(TOPIC, f"c{i}")] == [phys[i]]


@pytest.mark.parametrize("lie", sorted(CP_LIES))
def test_a_checkpoint_field_that_contradicts_the_store_is_read_around(segmented, tmp_path, lie, caplog):
    root = tmp_path / "s"
    shutil.copytree(segmented[0], root)
    phys = segmented[1]
    offset, value = CP_LIES[lie]
    name = CP_NAMES[offset // 8]
    honest = struct.unpack(">qqqqq", (root / "checkpoint").read_bytes()[:40])
    _patch(root / "checkpoint", offset, struct.pack(">q", value))

    find = [p for p in verify_store(root) if p.file == "checkpoint"]
    assert [(p.offset, p.severity) for p in find] == [(offset, "error")], find
    assert name in find[0].problem

    cp = StoreCheckpoint(root / "checkpoint")
    with caplog.at_level(logging.WARNING, logger="rmqstore.checkpoint"):
        assert cp.load() is True
    assert getattr(cp, name) == 0  # read around: recovery then starts earlier, never later
    assert [getattr(cp, n) for n in CP_NAMES if n != name] == [v for n, v in zip(CP_NAMES, honest) if n != name]
    assert any(name in r.getMessage() for r in caplog.records)

    with MessageStore.open(root, read_only=True) as ro:
        _all_there(ro, phys)
    (root / "abort").write_bytes(b"")  # a crash: recovery reads the checkpoint
    with no_hang(60), MessageStore.open(root, CP_CFG, clock=StepClock(T0 + 10**7, 1000)) as w:
        if name in ("physic_msg_timestamp", "logics_msg_timestamp"):
            # a time it cannot trust: the scan starts at the first segment
            assert w.recovery_report["start_file"].endswith("0" * 20)
        assert w.recovery_report["truncated_bytes"] == 0
        _all_there(w, phys)
        r = w.put_message(Message(TOPIC, b"after", keys="after"))
        assert [m.physical_offset for m in w.query_messages(TOPIC, "after")] == [r.wrote_offset]
    assert [p for p in verify_store(root) if p.file == "checkpoint"] == []  # written back as read


def test_an_honest_checkpoint_has_no_problem(segmented):
    assert [p for p in verify_store(segmented[0]) if p.file == "checkpoint"] == []
    cp = StoreCheckpoint(segmented[0] / "checkpoint")
    assert cp.load()
    assert cp.physic_msg_timestamp == cp.logics_msg_timestamp == T0 + 1000 * (CP_MSGS - 1)


# --- consumer offsets -------------------------------------------------------------------------

DEEP = 100_000  # far deeper than json.loads goes
BAD_OFFSET_FILES = {
    "top-level-list": b"[1, 2]",
    "top-level-string": b'"T@G"',
    "top-level-number": b"42",
    "table-list": b'{"offsetTable": [1]}',
    "table-string": b'{"offsetTable": "T@G"}',
    "table-number": b'{"offsetTable": 7}',
    "queues-list": b'{"offsetTable": {"T@G": [1, 2]}}',
    "queues-number": b'{"offsetTable": {"T@G": 3}}',
    "offset-word": b'{"offsetTable": {"T@G": {"0": "many"}}}',
    "offset-fraction": b'{"offsetTable": {"T@G": {"0": 1.5}}}',
    "offset-past-long": b'{"offsetTable": {"T@G": {"0": 99999999999999999999}}}',
    "offset-long-float": b'{"offsetTable": {"T@G": {"0": 1e300}}}',
    "offset-bool": b'{"offsetTable": {"T@G": {"0": true}}}',
    "offset-nested": b'{"offsetTable": {"T@G": {"0": {"a": {"b": [1]}}}}}',
    "offset-nan": b'{"offsetTable": {"T@G": {"0": NaN}}}',
    "offset-infinity": b'{"offsetTable": {"T@G": {"0": -Infinity}}}',
    "queue-id-word": b'{"offsetTable": {"T@G": {"zero": 1}}}',
    "queue-id-past-int": b'{"offsetTable": {"T@G": {"4294967296": 1}}}',
    "data-version-list": b'{"dataVersion": [], "offsetTable": {}}',
    "data-version-counter-word": b'{"dataVersion": {"counter": "x"}, "offsetTable": {}}',
    "deep-array": b"[" * DEEP + b"]" * DEEP,
    "deep-object": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "deep-table": b'{"offsetTable": {"T@G": ' + b"[" * DEEP + b"]" * DEEP + b"}}",
    "deep-member": b'{"offsetTable": {}, "lmqOffsetTable": ' + b"[" * DEEP + b"]" * DEEP + b"}",
    "not-utf8": b'{"offsetTable": {"T@G\xff": {"0": 1}}}',
    "lone-surrogate-key": b'{"offsetTable": {"T@\\ud800": {"0": 1}}}',
    "lone-surrogate-queue-id": b'{"offsetTable": {"T@G": {"\\udc00": 1}}}',
    "lone-surrogate-in-member": b'{"offsetTable": {}, "lmqOffsetTable": {"\\ud800@G": {"0": 1}}}',
    "lone-surrogate-member-name": b'{"offsetTable": {}, "\\udfff": 1}',
    "truncated": b'{"offsetTable": {"T@G": {"0": 1',
}


def _offsets_path(root):
    return os.path.join(str(root), "config", "consumerOffset.json")


def _offset_problems(root) -> list:
    return [(p.file, p.severity) for p in verify_store(root) if p.file.startswith("config/")]


@pytest.mark.parametrize("doc", sorted(BAD_OFFSET_FILES))
def test_a_consumer_offset_file_that_is_not_an_offset_table(tmp_path, doc):
    """Whatever the shape, depth or encoding: a CorruptedFileError naming the
    file, so loading falls back to a good .bak; never another exception."""
    data = BAD_OFFSET_FILES[doc]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        with pytest.raises(ValueError) as e:  # and nothing else
            parse_offset_json(text)
        assert type(e.value) in (ValueError, json.JSONDecodeError), repr(e.value)

    root = tmp_path / "s"
    path = _offsets_path(root)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as fh:
        fh.write(data)
    with pytest.raises(CorruptedFileError) as e:
        ConsumerOffsetStore(path).load()
    assert e.value.path == path
    assert _offset_problems(root) == [("config/consumerOffset.json", "error")]

    # with a good .bak, the store reads it and replaces the bad file on the next commit
    with open(path + ".bak", "w", encoding="utf-8") as fh:
        fh.write('{"offsetTable": {"T@G": {"0": 7}}}')
    assert _offset_problems(root) == [("config/consumerOffset.json", "warning")]
    with MessageStore.open(root, CFG) as s:
        assert s.get_committed_offset("G", "T", 0) == 7
        s.commit_offset("G", "T", 1, 8)
    with MessageStore.open(root, read_only=True) as ro:
        assert ro.consumer_offsets().table() == {"T@G": {0: 7, 1: 8}}
    assert verify_store(root) == []


def test_a_consumer_offset_file_is_read_as_fastjson_reads_it(tmp_path):
    """Numbers or strings holding one, in range; a negative offset (RocketMQ's
    "none") and a key without '@' kept as they are, a null queue map skipped:
    and the table so read is written back."""
    path = tmp_path / "c.json"
    path.write_bytes(b'{"offsetTable": {"T@G": {"0": -1, "1": "5", "2": 3.0}, "nosep": {"0": 1}, "N@G": null}, '
                     b'"lmqOffsetTable": {"%LMQ%x@G": {"0": 2}}}')
    s = ConsumerOffsetStore(path)
    assert s.load()
    assert s.table() == {"T@G": {0: -1, 1: 5, 2: 3}, "nosep": {0: 1}}
    s.commit("G", "T", 3, 9)
    s.close()
    again = ConsumerOffsetStore(path)
    again.load()
    assert again.table() == {"T@G": {0: -1, 1: 5, 2: 3, 3: 9}, "nosep": {0: 1}}
    assert json.loads(path.read_text(encoding="utf-8"))["lmqOffsetTable"] == {"%LMQ%x@G": {"0": 2}}


@pytest.mark.parametrize("name", ["G\ud800", "\udfffG", "a\ud83db"], ids=["high", "low", "inside"])
def test_a_name_that_cannot_be_written_never_reaches_the_offset_table(tmp_path, name):
    """A lone surrogate in a group or topic is refused at commit with the
    library's error: in the table, every later save would fail."""
    root = tmp_path / "s"
    with MessageStore.open(root, CFG) as s:
        s.put_message(Message(TOPIC, b"x"))
        offsets = s.consumer_offsets()
        for args in ((name, TOPIC), ("G", name)):
            with pytest.raises(IllegalMessageError):
                s.commit_offset(*args, 0, 1)
            with pytest.raises(IllegalMessageError):
                offsets.commit(*args, 0, 1, sync=False)
            with pytest.raises(IllegalMessageError):
                offsets.commit_many(*args, {0: 1})
            with pytest.raises(IllegalMessageError):
                s.consumer(*args)
            assert offsets.get(*args, 0) is None  # a lookup is harmless
        assert offsets.table() == {}
        s.commit_offset("组", "T😀", 0, 5)  # other non-ASCII names are fine
        s.commit_offset("G", TOPIC, 0, 1)
    with MessageStore.open(root, read_only=True) as ro:
        assert ro.consumer_offsets().table() == {"T😀@组": {0: 5}, f"{TOPIC}@G": {0: 1}}
