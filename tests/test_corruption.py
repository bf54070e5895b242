"""Damaged copies of the golden ``basic`` store (RocketMQ-written).

Every case must either open and return only valid data, or raise
CorruptedFileError naming the damaged file; never another exception, never a
hang. The golden store is always copied into tmp_path before it is damaged.
"""

from __future__ import annotations

import base64
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import (
    STORE_HOST,
    copy_golden_store,
    dump_messages,
    load_dump,
    load_input,
    no_hang,
    read_bytes,
    scaled,
)
from rmqstore import CorruptedFileError, GetMessageStatus, Message, MessageStore, StoreConfig

GOLD = "basic"
FILE_SIZE = 65536
CL_NAMES = ["00000000000000000000", "00000000000000065536", "00000000000000131072"]
LAST = CL_NAMES[-1]


def _records():
    return dump_messages(GOLD)


def _by_offset():
    return {r["physicalOffset"]: r for r in _records()}


def _config():
    # (recovery is what these test: the golden store's two delayed records,
    # long due, stay where they are; their delivery is test_schedule's)
    return StoreConfig.from_dict(load_input(GOLD)["storeConfig"]).replace(schedule_service_enable=False)


def _data_end():
    last = load_dump(GOLD)["commitlog"]["files"][-1]
    return last["fileFromOffset"] + last["dataEndPosition"]


def _last_file_records():
    return [r for r in _records() if r["file"] == LAST]


def patch_file(path, offset, data: bytes):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def xor_byte(path, offset, mask=0xFF):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([b ^ mask]))


@pytest.fixture
def root(tmp_path):
    return copy_golden_store(GOLD, tmp_path / "store")


def _same_as_dump(m, r):
    assert m.physical_offset == r["physicalOffset"]
    assert m.store_size == r["totalSize"]
    assert m.body == base64.b64decode(r["body"])
    assert m.topic == r["topic"]
    assert (m.queue_id, m.queue_offset, m.flag, m.sys_flag) == (r["queueId"], r["queueOffset"], r["flag"], r["sysFlag"])
    assert (m.born_timestamp, m.store_timestamp, m.born_host) == (
        r["bornTimestamp"], r["storeTimestamp"], r["bornHost"])
    assert m.properties_blob.decode("utf-8") == r["propertiesString"]
    assert m.body_crc == r["bodyCRC"]


def assert_valid_prefix(store, cut):
    """The store holds exactly the golden records below physical offset *cut*,
    and every queue exactly its units pointing below *cut*."""
    want = [r for r in _records() if r["physicalOffset"] < cut]
    got = list(store.iter_messages())
    assert len(got) == len(want)
    for m, r in zip(got, want):
        _same_as_dump(m, r)
    data_end = want[-1]["physicalOffset"] + want[-1]["totalSize"]
    assert store.max_physical_offset == (data_end if cut == _data_end() else cut)
    for q in load_dump(GOLD)["consumeQueues"]:
        topic, qid = q["topic"], q["queueId"]
        units = [u for u in q["units"] if u["commitLogOffset"] < cut]
        assert store.get_max_offset_in_queue(topic, qid) == len(units), (topic, qid)
        pulled = []
        off = 0
        while off < len(units):
            res = store.get_messages(topic, qid, off, max_count=16)
            assert res.status is GetMessageStatus.FOUND
            pulled.extend(res.messages)
            off = res.next_begin_offset
        assert [m.physical_offset for m in pulled] == [u["commitLogOffset"] for u in units]


def assert_read_around(store, bad):
    """The store holds every golden record but the one at physical offset
    *bad* (damage a crash cannot cause: the read-only open reads around it
    and reports it), by physical offset and through its queue."""
    assert [d["physical_offset"] for d in store.recovery_report["damage"]] == [bad]
    for r in _records():
        m = store.get_message(r["physicalOffset"])
        if r["physicalOffset"] == bad:
            assert m is None
            continue
        _same_as_dump(m, r)
    for q in load_dump(GOLD)["consumeQueues"]:
        topic, qid = q["topic"], q["queueId"]
        assert store.get_max_offset_in_queue(topic, qid) == len(q["units"]), (topic, qid)
        for u in q["units"]:
            if u["commitLogOffset"] != bad:
                got = store.get_messages(topic, qid, u["queueOffset"], 1).messages
                assert [m.physical_offset for m in got] == [u["commitLogOffset"]]


def open_or_corrupted(path, damaged, **kw):
    """Open read-only; returns the store, or None after checking that the error
    is a CorruptedFileError naming *damaged*."""
    try:
        with no_hang():
            return MessageStore.open(path, read_only=True, **kw)
    except CorruptedFileError as e:
        assert e.path is not None and os.path.samefile(e.path, damaged), (e.path, damaged)
        assert e.offset is None or isinstance(e.offset, int)
        return None


# --- CommitLog header damage ---------------------------------------------------------------------

# (name, byte within the record, xor mask); the record is an IPv4/IPv4 v1 one
HEADER_FLIPS = [
    ("totalsize-low", 3, 0x01),
    ("totalsize-high", 0, 0x40),
    ("magic", 5, 0xFF),
    ("body-crc", 9, 0x10),
    ("physical-offset", 35, 0x01),
    ("sysflag-v6-bit", 39, 0x10),
    ("body-length", 87, 0x01),
]


@pytest.mark.parametrize("name,pos,mask", HEADER_FLIPS, ids=[f[0] for f in HEADER_FLIPS])
def test_flipped_header_byte_stops_recovery(root, name, pos, mask):
    victim = _last_file_records()[5]
    assert victim["sysFlag"] & 0x30 == 0 and victim["bodyLength"] > 0
    xor_byte(root / "commitlog" / LAST, victim["filePosition"] + pos, mask)
    with MessageStore.open(root, read_only=True) as s:
        rep = s.recovery_report["stopped_because"]
        assert isinstance(rep, str) and rep
        assert s.max_physical_offset == victim["physicalOffset"]
        assert s.get_message(victim["physicalOffset"]) is None
        assert_valid_prefix(s, victim["physicalOffset"])
        prev = _last_file_records()[4]
        _same_as_dump(s.get_message(prev["physicalOffset"]), prev)
        assert s.look_message_by_msg_id(victim["msgId"]) is None


def test_topic_and_properties_length_damage(root):
    victim = _last_file_records()[7]
    topic_len_pos = victim["filePosition"] + 88 + victim["bodyLength"]
    xor_byte(root / "commitlog" / LAST, topic_len_pos, 0x02)
    with MessageStore.open(root, read_only=True) as s:
        assert s.recovery_report["stopped_because"]
        assert_valid_prefix(s, victim["physicalOffset"])


def test_bad_body_crc(root):
    victim = _last_file_records()[3]
    xor_byte(root / "commitlog" / LAST, victim["filePosition"] + 88 + victim["bodyLength"] // 2, 0x01)
    with MessageStore.open(root, read_only=True) as s:
        assert "crc" in s.recovery_report["stopped_because"].lower()
        assert_valid_prefix(s, victim["physicalOffset"])
    # without the CRC check recovery keeps the record, damage and all; reads
    # check the CRC themselves and never return it
    with MessageStore.open(root, config=StoreConfig(check_crc_on_recover=False), read_only=True) as s:
        assert s.recovery_report["stopped_because"] is None
        assert s.max_physical_offset == _data_end()
        assert s.get_message(victim["physicalOffset"]) is None
        with pytest.raises(CorruptedFileError, match="body CRC"):
            s.get_messages(victim["topic"], victim["queueId"], victim["queueOffset"], 1)
        with pytest.raises(CorruptedFileError, match="body CRC"):
            s.get_message_views(victim["topic"], victim["queueId"], victim["queueOffset"], 1)


def test_bad_body_crc_in_the_first_file(root):
    """Normal recovery scans the last three files, so damage in file 0 is
    found too: a segment before the last two, which no crash tears, with
    records that validate behind it. Read-only reads around it; writable
    refuses it, changing nothing."""
    victim = _records()[40]
    assert victim["file"] == CL_NAMES[0]
    xor_byte(root / "commitlog" / CL_NAMES[0], victim["filePosition"] + 88, 0x80)
    with MessageStore.open(root, read_only=True) as s:
        assert s.recovery_report["stopped_because"]
        assert_read_around(s, victim["physicalOffset"])
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != "lock"}
    with pytest.raises(CorruptedFileError) as ei:
        MessageStore.open(root, config=_config(), store_host=STORE_HOST)
    assert ei.value.path.endswith(CL_NAMES[0]) and ei.value.offset == victim["filePosition"]
    assert "rmqstore salvage" in str(ei.value)
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != "lock"} == before


@pytest.mark.parametrize(
    "name",
    [
        CL_NAMES[0],
        CL_NAMES[1],
        LAST,
    ],
)
def test_truncated_commitlog_file(root, name):
    path = root / "commitlog" / name
    os.truncate(path, 40000)
    with pytest.raises(CorruptedFileError) as ei, no_hang():
        MessageStore.open(root, read_only=True).close()
    assert os.path.samefile(ei.value.path, path)


@pytest.mark.parametrize("name", CL_NAMES)
def test_truncated_commitlog_file_writable(root, name):
    path = root / "commitlog" / name
    os.truncate(path, 40000)
    with pytest.raises(CorruptedFileError) as ei:
        MessageStore.open(root, config=_config(), store_host=STORE_HOST).close()
    assert os.path.samefile(ei.value.path, path)
    assert os.path.getsize(path) == 40000  # nothing "repaired" behind our back
    # the failed open released the lock: a second attempt fails the same way
    with pytest.raises(CorruptedFileError):
        MessageStore.open(root, config=_config(), store_host=STORE_HOST).close()


@pytest.mark.parametrize("rel,size", [(f"commitlog/{LAST}", 40000)], ids=["segment"])
def test_corrupted_error_offsets_are_ints(root, rel, size):
    os.truncate(root / rel, size)
    with pytest.raises(CorruptedFileError) as ei:
        MessageStore.open(root, read_only=True).close()
    assert os.path.samefile(ei.value.path, root / rel)
    assert isinstance(ei.value.offset, int)


@pytest.mark.parametrize("start_in_record", [0, 30], ids=["at-record-start", "mid-record"])
def test_zeroed_tail_of_last_file(root, start_in_record):
    victim = _last_file_records()[12]
    pos = victim["filePosition"] + start_in_record
    patch_file(root / "commitlog" / LAST, pos, bytes(FILE_SIZE - pos))
    with MessageStore.open(root, read_only=True) as s:
        if start_in_record == 0:
            assert s.recovery_report["stopped_because"] is None  # zeros = end of data
        else:
            assert s.recovery_report["stopped_because"]
        assert_valid_prefix(s, victim["physicalOffset"])


def test_zeroed_whole_last_file(root):
    patch_file(root / "commitlog" / LAST, 0, bytes(FILE_SIZE))
    with MessageStore.open(root, read_only=True) as s:
        assert_valid_prefix(s, 2 * FILE_SIZE)
        assert s.max_physical_offset == 2 * FILE_SIZE


def test_garbage_blank_magic_stops_at_file_end(root):
    """A damaged END_OF_FILE record in file 0: the next segment's records
    validate, so the read-only open reads on there."""
    blank_pos = load_dump(GOLD)["commitlog"]["files"][0]["blankRecordPosition"]
    patch_file(root / "commitlog" / CL_NAMES[0], blank_pos + 4, b"\x12\x34\x56\x78")
    with MessageStore.open(root, read_only=True) as s:
        assert s.recovery_report["stopped_because"]
        assert [d["resumes_at"] for d in s.recovery_report["damage"]] == [FILE_SIZE]
        assert [m.physical_offset for m in s.iter_messages()] == [r["physicalOffset"] for r in _records()]


# --- ConsumeQueue damage --------------------------------------------------------------------------


def _unit(topic, qid, q):
    cq = next(c for c in load_dump(GOLD)["consumeQueues"] if (c["topic"], c["queueId"]) == (topic, qid))
    u = cq["units"][q]
    return u, f"consumequeue/{topic}/{qid}/{u['file']}"


def test_unit_pointing_into_the_middle_of_a_record(root):
    u, rel = _unit("TopicTest", 0, 5)
    patch_file(root / rel, u["filePosition"], struct.pack(">q", u["commitLogOffset"] + 10))
    with MessageStore.open(root, read_only=True) as s:
        with pytest.raises(CorruptedFileError) as ei:
            s.get_messages("TopicTest", 0, 3, max_count=10)
        e = ei.value
        assert isinstance(e.offset, int)
        rec_file = root / "commitlog" / _by_offset()[u["commitLogOffset"]]["file"]
        assert os.path.samefile(e.path, root / rel) or os.path.samefile(e.path, rec_file)
        # the units before and after are fine
        assert len(s.get_messages("TopicTest", 0, 0, max_count=5).messages) == 5
        assert s.get_messages("TopicTest", 0, 6, max_count=5).messages[0].queue_offset == 6


def test_unit_pointing_at_another_record_of_other_size(root):
    u, rel = _unit("TopicTest", 0, 5)
    other = next(r for r in _records() if r["totalSize"] != u["size"] and r["physicalOffset"] < u["commitLogOffset"])
    patch_file(root / rel, u["filePosition"], struct.pack(">q", other["physicalOffset"]))
    with MessageStore.open(root, read_only=True) as s:
        with pytest.raises(CorruptedFileError) as ei:
            s.get_messages("TopicTest", 0, 5, max_count=1)
        assert os.path.samefile(ei.value.path, root / rel)
        assert ei.value.offset == u["filePosition"]


@pytest.mark.parametrize("where", ["past-data-end", "far-beyond"])
def test_unit_pointing_past_the_commitlog_end(root, where):
    u, rel = _unit("TopicTest", 0, 5)
    phy = _data_end() + 1000 if where == "past-data-end" else 10**12
    patch_file(root / rel, u["filePosition"], struct.pack(">q", phy))
    with MessageStore.open(root, read_only=True) as s:
        with pytest.raises(CorruptedFileError) as ei:
            s.get_messages("TopicTest", 0, 5, max_count=1)
        assert isinstance(ei.value.offset, int)


def test_unit_pointing_at_a_same_size_record_of_another_queue(root):
    dump = load_dump(GOLD)
    target = next(c for c in dump["consumeQueues"] if (c["topic"], c["queueId"]) == ("TopicTest", 0))
    for q, u in enumerate(target["units"]):  # noqa: B007 - q and u are the unit found, used after the break
        other = next((r for r in _records() if r["totalSize"] == u["size"] and r["topic"] != "TopicTest"), None)
        if other is not None:
            break
    rel = f"consumequeue/TopicTest/0/{u['file']}"
    patch_file(root / rel, u["filePosition"], struct.pack(">q", other["physicalOffset"]))
    with MessageStore.open(root, read_only=True) as s:
        try:
            res = s.get_messages("TopicTest", 0, q, max_count=1)
        except CorruptedFileError:
            return
        m = res.messages[0]
        assert (m.topic, m.queue_id, m.queue_offset) == ("TopicTest", 0, q)


def test_garbage_last_consume_queue_unit_is_cut(root):
    """A last unit with a negative offset is invalid: recovery cuts the queue there."""
    cq = next(c for c in load_dump(GOLD)["consumeQueues"] if (c["topic"], c["queueId"]) == ("OrderTopic", 3))
    u = cq["units"][-1]
    rel = f"consumequeue/OrderTopic/3/{u['file']}"
    patch_file(root / rel, u["filePosition"], b"\xff" * 8)
    with MessageStore.open(root, read_only=True) as s:
        assert s.get_max_offset_in_queue("OrderTopic", 3) == len(cq["units"]) - 1
        got = s.get_messages("OrderTopic", 3, 0, max_count=100).messages
        assert [m.physical_offset for m in got] == [x["commitLogOffset"] for x in cq["units"][:-1]]


# --- index damage -----------------------------------------------------------------------------------


def _garble_index(root, seed, header=False):
    rnd = random.Random(seed)
    for f in sorted((root / "index").iterdir()):
        size = os.path.getsize(f)
        start = 0 if header else 40
        patch_file(f, start, bytes(rnd.getrandbits(8) for _ in range(size - start)))


def _carries(m_or_r, topic, key):
    props = m_or_r.properties if hasattr(m_or_r, "properties_blob") else (m_or_r["properties"] or {})
    return props.get("UNIQ_KEY") == key or key in (props.get("KEYS") or "").split(" ")


def _check_queries_only_valid(s, queries):
    records = _by_offset()
    for q in queries:
        with no_hang():
            offs = s.query_offsets(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
            msgs = s.query_messages(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"])
        assert len(offs) <= min(q["maxNum"], 64)
        assert len({m.physical_offset for m in msgs}) == len(msgs)
        for m in msgs:
            assert m.topic == q["topic"] and _carries(m, q["topic"], q["key"])
            if m.physical_offset in records:
                _same_as_dump(m, records[m.physical_offset])


def test_garbage_index_read_only(root):
    _garble_index(root, seed=1)
    s = open_or_corrupted(root, root / "index" / sorted(os.listdir(root / "index"))[0])
    if s is not None:
        with s:
            _check_queries_only_valid(s, load_dump(GOLD)["queries"]["keyQueries"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_garbage_index_writable(root, seed):
    """With the geometry given by the config, garbage slots and entries never
    hang a query nor produce a message that does not carry the key; new
    messages are indexed and found."""
    _garble_index(root, seed)
    queries = load_dump(GOLD)["queries"]["keyQueries"]
    with MessageStore.open(root, config=_config(), store_host=STORE_HOST) as s:
        _check_queries_only_valid(s, queries)
        rs = [s.put_message(Message("TopicTest", b"new", keys=f"fresh-{i}")) for i in range(5)]
        for i, r in enumerate(rs):
            assert [m.physical_offset for m in s.query_messages("TopicTest", f"fresh-{i}")] == [r.wrote_offset]
        _check_queries_only_valid(s, queries)


def test_index_header_end_offset_beyond_commitlog(root):
    last = sorted((root / "index").iterdir())[-1]
    patch_file(last, 24, struct.pack(">q", 10**12))
    try:
        s = MessageStore.open(root, config=_config(), store_host=STORE_HOST)
    except CorruptedFileError:
        return
    with s:
        r = s.put_message(Message("TopicTest", b"new", keys="fresh-key"))
        assert [m.physical_offset for m in s.query_messages("TopicTest", "fresh-key")] == [r.wrote_offset]


def _chain(file_dump, slot):
    entries = {e["index"]: e for e in file_dump["entries"]}
    head = next(u["index"] for u in file_dump["usedSlots"] if u["slot"] == slot)
    chain = [head]
    while entries[chain[-1]]["prevIndex"]:
        chain.append(entries[chain[-1]]["prevIndex"])
    return chain, entries


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writable"])
@pytest.mark.parametrize("kind", ["cycle", "self-loop"])
def test_index_chain_loop_terminates(root, read_only, kind):
    idx = load_dump(GOLD)["index"]
    first = sorted(idx["files"], key=lambda f: f["name"])[0]  # oldest file: queried last
    slots, base = idx["hashSlotNum"], 40 + 4 * idx["hashSlotNum"]
    queries = [q for q in load_dump(GOLD)["queries"]["keyQueries"] if q.get("auto")]
    # a queried key whose chain in the oldest file has at least 3 entries
    for q in queries:
        chain, entries = _chain(first, q["keyHash"] % slots) if any(
            u["slot"] == q["keyHash"] % slots for u in first["usedSlots"]) else ([], {})
        if len(chain) >= 3 and any(entries[n]["keyHash"] == q["keyHash"] for n in chain):
            break
    else:
        pytest.fail("no long chain in the golden index")
    tail = chain[-1]
    target = chain[0] if kind == "cycle" else tail
    path = root / "index" / first["name"]
    patch_file(path, base + 20 * tail + 16, struct.pack(">i", target))
    kw = {"read_only": True} if read_only else {"config": _config(), "store_host": STORE_HOST}
    with no_hang():
        s = MessageStore.open(root, **kw)
    with s:
        with no_hang():
            offs = s.query_offsets(q["topic"], q["key"], 64)
            msgs = s.query_messages(q["topic"], q["key"], 64)
        assert len(offs) <= 64
        assert set(offs) == set(q["phyOffsets"])
        if kind == "cycle":
            assert len(offs) > len(set(offs))  # went round the loop, and still stopped
        else:
            assert offs == q["phyOffsets"]
        seen = []
        for o in q["phyOffsets"]:
            if o not in seen and _carries(_by_offset()[o], q["topic"], q["key"]):
                seen.append(o)
        assert [m.physical_offset for m in msgs] == seen
        _check_queries_only_valid(s, queries[:40])


# --- checkpoint damage --------------------------------------------------------------------------------


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writable"])
def test_missing_checkpoint(root, read_only):
    os.unlink(root / "checkpoint")
    kw = {"read_only": True} if read_only else {"config": _config(), "store_host": STORE_HOST}
    with MessageStore.open(root, **kw) as s:
        assert_valid_prefix(s, _data_end())
    assert (root / "checkpoint").exists() != read_only
    if not read_only:
        assert os.path.getsize(root / "checkpoint") == 4096


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "abort-file"])
@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "writable"])
def test_garbage_checkpoint(root, read_only, crash):
    patch_file(root / "checkpoint", 0, random.Random(7).randbytes(4096))
    if crash:
        (root / "abort").write_bytes(b"")
    kw = {"read_only": True} if read_only else {"config": _config(), "store_host": STORE_HOST}
    with no_hang():
        s = MessageStore.open(root, **kw)
    with s:
        assert s.last_exit_ok is not crash
        assert_valid_prefix(s, _data_end())


@pytest.mark.parametrize("value", [-1, 0, 2**63 - 1], ids=["negative", "zero", "max"])
def test_crash_recovery_with_extreme_checkpoint_times(root, value):
    patch_file(root / "checkpoint", 0, struct.pack(">qqq", value, value, value))
    (root / "abort").write_bytes(b"")
    with MessageStore.open(root, config=_config(), store_host=STORE_HOST) as s:
        assert_valid_prefix(s, _data_end())
        r = s.put_message(Message("TopicTest", b"after crash", queue_id=0))
        assert r.wrote_offset == _data_end()


@pytest.mark.parametrize("size", [0, 10])
def test_short_checkpoint(root, size):
    """A checkpoint a crash left empty or short only advises where recovery
    starts: it is ignored (full scan), never a reason to refuse the store."""
    os.truncate(root / "checkpoint", size)
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            assert_valid_prefix(s, _data_end())
    assert os.path.getsize(root / "checkpoint") == 4096  # the writable open rewrote it


# --- random damage --------------------------------------------------------------------------------------

_ORIGINAL = {}


def _original_commitlog():
    if not _ORIGINAL:
        from conftest import golden_store

        _ORIGINAL["data"] = b"".join(read_bytes(golden_store(GOLD) / "commitlog" / n) for n in CL_NAMES)
    return _ORIGINAL["data"]


@settings(max_examples=scaled(25), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flips=st.lists(
        st.tuples(
            st.one_of(st.integers(0, 3 * FILE_SIZE - 1), st.integers(2 * FILE_SIZE, 2 * FILE_SIZE + 32000)),
            st.integers(1, 255),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_random_byte_flips(tmp_path_factory, flips):
    root = copy_golden_store(GOLD, tmp_path_factory.mktemp("flip") / "store")
    for pos, mask in flips:
        xor_byte(root / "commitlog" / CL_NAMES[pos // FILE_SIZE], pos % FILE_SIZE, mask)
    records = _records()
    offsets = [r["physicalOffset"] for r in records]
    touched = {pos for pos, _ in flips}
    try:
        with no_hang():
            s = MessageStore.open(root, read_only=True)
    except CorruptedFileError as e:
        assert os.path.samefile(os.path.dirname(e.path), root / "commitlog")
        return
    with s:
        try:
            with no_hang():
                got = list(s.iter_messages())
        except CorruptedFileError as e:
            assert os.path.samefile(os.path.dirname(e.path), root / "commitlog")
            return
        # recovery keeps a prefix of the original records, less what lies in
        # damage it read around (damage a crash cannot cause, in file 0)
        kept = [m.physical_offset for m in got]
        cl_end = s.max_physical_offset
        skipped = [(d["physical_offset"], d["resumes_at"]) for d in s.recovery_report["damage"]]
        assert kept == [o for o in offsets if o < cl_end and not any(a <= o < b for a, b in skipped)]
        for a, b in skipped:  # only around a flip
            assert any(a <= p < b for p in touched), (a, b, touched)
        assert cl_end <= _data_end()
        by_offset = {r["physicalOffset"]: r for r in records}
        for m in got:
            r = by_offset[m.physical_offset]
            start, end = r["physicalOffset"], r["physicalOffset"] + r["totalSize"]
            if any(start <= p < end for p in touched):
                # header fields outside the length formula are not protected by
                # any checksum; offset, size and (CRC-checked) body are
                assert m.store_size == r["totalSize"]
                assert m.body == base64.b64decode(r["body"])
            else:
                _same_as_dump(m, r)
        if not any(p < _data_end() for p in touched):
            assert len(got) == len(records)
        for q in load_dump(GOLD)["consumeQueues"][:3]:
            n = s.get_max_offset_in_queue(q["topic"], q["queueId"])
            if not n:
                continue
            try:
                res = s.get_messages(q["topic"], q["queueId"], 0, max_count=64)
            except CorruptedFileError:
                # allowed only when a flip hit the header of one of this queue's
                # records (queue id/offset and topic are checked against the unit)
                hit = [
                    u for u in q["units"][:n]
                    if any(u["commitLogOffset"] <= p < u["commitLogOffset"] + u["size"] for p in touched)
                ]
                assert hit
                continue
            assert [m.physical_offset for m in res.messages] == [u["commitLogOffset"] for u in q["units"][:n]][:64]


# --- writable recovery of a damaged store ------------------------------------------------------------------


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "abort-file"])
def test_writable_recovery_truncates_and_continues(root, crash):
    victim = _last_file_records()[10]
    cut = victim["physicalOffset"]
    patch_file(root / "commitlog" / LAST, victim["filePosition"] + 10, bytes(50))
    if crash:
        (root / "abort").write_bytes(b"")
    dump = load_dump(GOLD)
    records = _by_offset()
    cfg = _config()
    new = []
    with MessageStore.open(root, config=cfg, store_host=STORE_HOST) as s:
        assert s.recovery_report["stopped_because"]
        assert s.max_physical_offset == cut
        assert_valid_prefix(s, cut)
        # ConsumeQueue files are zeroed after their last kept unit
        for q in dump["consumeQueues"]:
            kept = [u for u in q["units"] if u["commitLogOffset"] < cut]
            if len(kept) == len(q["units"]):
                continue
            if kept:
                last = kept[-1]
                f = root / "consumequeue" / q["topic"] / str(q["queueId"]) / last["file"]
                assert not any(read_bytes(f)[last["filePosition"] + 20 :])
        for i, (topic, qid) in enumerate([("TopicTest", 0), ("OrderTopic", 2), ("TopicTest", 0), ("NewTopic", 1)] * 3):
            before = s.get_max_offset_in_queue(topic, qid)
            r = s.put_message(Message(topic, b"new-%d" % i * 20, queue_id=qid, keys=f"new-key-{i}"))
            assert r.queue_offset == before
            new.append((topic, qid, r))
        assert new[0][2].wrote_offset == cut
    new_end = new[-1][2].wrote_offset + new[-1][2].wrote_bytes
    data = read_bytes(root / "commitlog" / LAST)
    assert not any(data[new_end - 2 * FILE_SIZE :]), "stale bytes after the cut must be zeroed"

    for kw in ({"read_only": True}, {"config": cfg, "store_host": STORE_HOST}):
        with MessageStore.open(root, **kw) as s:
            assert s.recovery_report["stopped_because"] is None
            got = list(s.iter_messages())
            old = [r for r in _records() if r["physicalOffset"] < cut]
            assert [m.physical_offset for m in got] == (
                [r["physicalOffset"] for r in old] + [r.wrote_offset for _, _, r in new])
            for q in dump["consumeQueues"]:
                units = [u["commitLogOffset"] for u in q["units"] if u["commitLogOffset"] < cut]
                units += [r.wrote_offset for t, qq, r in new if (t, qq) == (q["topic"], q["queueId"])]
                assert s.get_max_offset_in_queue(q["topic"], q["queueId"]) == len(units)
                pulled, off = [], 0
                while off < len(units):
                    res = s.get_messages(q["topic"], q["queueId"], off, max_count=32)
                    pulled += [m.physical_offset for m in res.messages]
                    off = res.next_begin_offset
                assert pulled == units
            assert [m.physical_offset for m in s.get_messages("NewTopic", 1, 0).messages] == [
                r.wrote_offset for t, _, r in new if t == "NewTopic"]
            # stale index entries (docs/recovery.md#pitfall-index-not-truncated) never surface: old keys find survivors
            for q in dump["queries"]["keyQueries"]:
                if not q.get("auto"):
                    continue
                want = []
                for o in q["phyOffsets"]:
                    if o < cut and o not in want and _carries(records[o], q["topic"], q["key"]):
                        want.append(o)
                assert [m.physical_offset for m in s.query_messages(q["topic"], q["key"])] == want


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "abort-file"])
def test_messages_written_after_truncation_are_indexed(root, crash):
    victim = _last_file_records()[10]
    patch_file(root / "commitlog" / LAST, victim["filePosition"] + 10, bytes(50))
    if crash:
        (root / "abort").write_bytes(b"")
    with MessageStore.open(root, config=_config(), store_host=STORE_HOST) as s:
        assert s.max_physical_offset == victim["physicalOffset"]
        r = s.put_message(Message("TopicTest", b"new", keys="new-key"))
        assert r.wrote_offset == victim["physicalOffset"]
        assert [m.physical_offset for m in s.query_messages("TopicTest", "new-key")] == [r.wrote_offset]


# --- missing, extra and misplaced files -------------------------------------------------------------------


def _both_modes():
    return [{"read_only": True}, {"config": _config(), "store_host": STORE_HOST}]


def test_deleted_last_commitlog_file(root):
    os.unlink(root / "commitlog" / LAST)
    end_of_file1 = FILE_SIZE + load_dump(GOLD)["commitlog"]["files"][1]["blankRecordPosition"]
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            want = [r for r in _records() if r["physicalOffset"] < 2 * FILE_SIZE]
            assert [m.physical_offset for m in s.iter_messages()] == [r["physicalOffset"] for r in want]
            assert s.max_physical_offset == end_of_file1
            for q in load_dump(GOLD)["consumeQueues"]:
                n = sum(1 for u in q["units"] if u["commitLogOffset"] < 2 * FILE_SIZE)
                assert s.get_max_offset_in_queue(q["topic"], q["queueId"]) == n
            if not s.read_only:
                r = s.put_message(Message("TopicTest", b"reuses file 1", queue_id=3))
                assert r.wrote_offset == end_of_file1
                assert r.queue_offset == sum(1 for u in next(
                    c for c in load_dump(GOLD)["consumeQueues"] if (c["topic"], c["queueId"]) == ("TopicTest", 3)
                )["units"] if u["commitLogOffset"] < 2 * FILE_SIZE)


def test_no_commitlog_files_empties_every_queue(root):
    for name in CL_NAMES:
        os.unlink(root / "commitlog" / name)
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            assert list(s.iter_messages()) == []
            assert s.max_physical_offset == 0
            for q in load_dump(GOLD)["consumeQueues"]:
                assert s.get_max_offset_in_queue(q["topic"], q["queueId"]) == 0
                assert s.get_messages(q["topic"], q["queueId"], 0).messages == []
            assert s.query_messages("TopicTest", "order-1002") == []


def test_empty_and_junk_files_are_ignored(root):
    (root / "commitlog" / f"{3 * FILE_SIZE:020d}").write_bytes(b"")  # created, never written
    (root / "commitlog" / "README").write_text("not a segment")
    (root / "commitlog" / "0000000000000000000x").write_bytes(b"junk")
    (root / "consumequeue" / "TopicTest" / "0" / "notes.txt").write_text("junk")
    (root / "consumequeue" / "TopicTest" / "not-a-queue").mkdir()
    (root / "index" / "README").write_text("junk")
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            assert_valid_prefix(s, _data_end())
            assert s.max_physical_offset == _data_end()
            if not s.read_only:
                assert s.put_message(Message("TopicTest", b"x")).wrote_offset == _data_end()


@pytest.mark.parametrize("missing,after", [
    (CL_NAMES[1], f"commitlog/{CL_NAMES[2]}"),
    ("consumequeue/TopicTest/0/00000000000000000320", "consumequeue/TopicTest/0/00000000000000000640"),
], ids=["commitlog", "consumequeue"])
def test_gap_between_segments(root, missing, after):
    os.unlink(root / ("commitlog/" + missing if "/" not in missing else missing))
    for kw in _both_modes():
        with pytest.raises(CorruptedFileError) as ei:
            MessageStore.open(root, **kw).close()
        assert os.path.samefile(ei.value.path, root / after)


def test_lost_first_consume_queue_file(root):
    os.unlink(root / "consumequeue" / "TopicTest" / "0" / f"{0:020d}")
    units = next(c for c in load_dump(GOLD)["consumeQueues"] if (c["topic"], c["queueId"]) == ("TopicTest", 0))["units"]
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            assert s.get_min_offset_in_queue("TopicTest", 0) == 16
            assert s.get_max_offset_in_queue("TopicTest", 0) == 50
            res = s.get_messages("TopicTest", 0, 0)
            assert res.status is GetMessageStatus.OFFSET_TOO_SMALL and res.next_begin_offset == 16
            got = s.get_messages("TopicTest", 0, 16, max_count=100).messages
            assert [m.physical_offset for m in got][:16] == [u["commitLogOffset"] for u in units[16:32]]
            assert s.get_offset_in_queue_by_time("TopicTest", 0, 0) == 16


def test_truncated_consume_queue_file(root):
    rel = "consumequeue/TopicTest/0/00000000000000000320"
    os.truncate(root / rel, 100)
    for kw in _both_modes():
        with pytest.raises(CorruptedFileError) as ei:
            MessageStore.open(root, **kw).close()
        assert os.path.samefile(ei.value.path, root / rel)


@pytest.mark.parametrize("read_only", [
    True,
    False,
], ids=["read-only", "writable"])
def test_truncated_index_file(root, read_only):
    path = sorted((root / "index").iterdir())[0]
    os.truncate(path, 100)
    kw = {"read_only": True} if read_only else {"config": _config(), "store_host": STORE_HOST}
    with pytest.raises(CorruptedFileError) as ei:
        MessageStore.open(root, **kw).close()
    assert os.path.samefile(ei.value.path, path)


def test_deleted_index_directory(root):
    """Read-only: no index, no answers. Writable: the index is rebuilt from the
    CommitLog (docs/recovery.md#pitfall-index-lost-after-crash), same geometry, into the very bytes RocketMQ wrote."""
    import shutil

    golden = {p.name: p.read_bytes() for p in (root / "index").iterdir()}
    shutil.rmtree(root / "index")
    with MessageStore.open(root, read_only=True) as s:
        assert_valid_prefix(s, _data_end())
        assert s.query_offsets("TopicTest", "order-1002") == []
    with MessageStore.open(root, config=_config(), store_host=STORE_HOST) as s:
        assert_valid_prefix(s, _data_end())
        assert s.recovery_report["index_keys_added"] > 0
        for q in load_dump(GOLD)["queries"]["keyQueries"]:
            assert s.query_offsets(q["topic"], q["key"], q["maxNum"], q["begin"], q["end"]) == q["phyOffsets"]
        r = s.put_message(Message("TopicTest", b"x", keys="after-index-loss"))
        assert [m.physical_offset for m in s.query_messages("TopicTest", "after-index-loss")] == [r.wrote_offset]
    rebuilt = sorted((root / "index").iterdir())
    assert [p.read_bytes() for p in rebuilt[: len(golden)]][:-1] == [golden[n] for n in sorted(golden)][:-1]


@pytest.mark.parametrize("size", [320, 0], ids=["all-zero", "empty"])
def test_zero_consume_queue_file_after_a_full_one(root, size):
    """OrderTopic/0 has exactly two full files; a third, never-written file
    (docs/recovery.md#pitfall-unit-zero-unchecked: its unit 0 is invalid) adds no units."""
    (root / "consumequeue" / "OrderTopic" / "0" / f"{640:020d}").write_bytes(bytes(size))
    for kw in _both_modes():
        with MessageStore.open(root, **kw) as s:
            assert s.get_max_offset_in_queue("OrderTopic", 0) == 32
            assert_valid_prefix(s, _data_end())
            if not s.read_only:
                r = s.put_message(Message("OrderTopic", b"x", queue_id=0))
                assert r.queue_offset == 32
                assert s.get_messages("OrderTopic", 0, 32).messages[0].physical_offset == r.wrote_offset


# --- index geometry, as a read-only open infers it ------------------------------------------


def _fits_by_definition(data: bytes, s: int, n: int) -> bool:
    """The rule index._geometry_fits checks, one slot at a time: entry 0
    unused, header count <= n, as many non-zero slots as the header's slot
    count, each pointing below the entry count at an entry whose key hash
    is >= 0 and falls in that slot."""
    slot_count, count = struct.unpack_from(">ii", data, 32)
    count = max(count, 1)
    base = 40 + 4 * s
    if count > n or any(data[base : base + 20]):
        return False
    used = 0
    for slot in range(s):
        v = struct.unpack_from(">i", data, 40 + 4 * slot)[0]
        if v == 0:
            continue
        used += 1
        if not 0 < v < count:
            return False
        key_hash = struct.unpack_from(">i", data, base + 20 * v)[0]
        if key_hash < 0 or key_hash % s != slot:
            return False
    return used == slot_count


def _golden_index(tmp_path):
    root = copy_golden_store(GOLD, tmp_path / "s")
    names = sorted(os.listdir(root / "index"))
    return [str(root / "index" / name) for name in names]


# geometries of the golden files' size (6440 bytes: 100 slots, 300 entries) and two others of that size
GEOMETRIES = [(100, 300), (105, 299), (95, 301)]


def test_index_geometry_of_the_golden_files(tmp_path):
    """RocketMQ's files fit their own geometry only; a read-only open without
    a config infers it, and names the file that breaks it."""
    from rmqstore.storage.index import _geometry_fits, infer_index_geometry

    paths = _golden_index(tmp_path)
    for p in paths:
        assert [_geometry_fits(p, s, n) for s, n in GEOMETRIES] == [True, False, False]
    assert infer_index_geometry(paths) == (100, 300)
    patch_file(paths[1], 40 + 4 * 7, struct.pack(">i", 299))  # a slot pointing past the entries written
    with pytest.raises(CorruptedFileError, match="geometry") as e:
        infer_index_geometry(paths)
    assert e.value.path == paths[1]


def test_index_geometry_from_a_sample_of_the_key_hashes(tmp_path, monkeypatch):
    """The key hashes are read for a sample of the used slots only (a read-only
    open must not walk a large store's index); a sample still tells the
    files' geometry from the others of their size."""
    from rmqstore.storage import index_checks
    from rmqstore.storage.index import _geometry_fits, infer_index_geometry

    paths = _golden_index(tmp_path)
    monkeypatch.setattr(index_checks, "_HASH_SAMPLE", 2)
    for p in paths:
        assert [_geometry_fits(p, s, n) for s, n in GEOMETRIES] == [True, False, False]
    assert infer_index_geometry(paths) == (100, 300)


@pytest.mark.parametrize("damage", [
    "entry-0-used", "slot-past-count", "slot-negative", "negative-key-hash", "hash-in-another-slot",
    "slot-count-high", "slot-count-low", "count-past-n", "empty-file",
])
def test_index_geometry_check_refuses_each_broken_rule(tmp_path, damage):
    from rmqstore.storage.index import _geometry_fits

    p = _golden_index(tmp_path)[0]
    data = read_bytes(p)
    slot_count, count = struct.unpack_from(">ii", data, 32)
    used = [i for i in range(100) if struct.unpack_from(">i", data, 40 + 4 * i)[0]]
    first = used[0]
    v = struct.unpack_from(">i", data, 40 + 4 * first)[0]
    base = 40 + 400
    free = next(i for i in range(100) if i not in used)
    patches = {
        "entry-0-used": [(base + 3, b"\x01")],
        "slot-past-count": [(40 + 4 * first, struct.pack(">i", count))],
        "slot-negative": [(40 + 4 * first, struct.pack(">i", -v))],
        "negative-key-hash": [(base + 20 * v, struct.pack(">i", first - 100))],  # (in its slot, mod 100)
        "hash-in-another-slot": [(40 + 4 * first, bytes(4)), (40 + 4 * free, struct.pack(">i", v))],
        "slot-count-high": [(32, struct.pack(">i", slot_count + 1))],
        "slot-count-low": [(32, struct.pack(">i", slot_count - 1))],
        "count-past-n": [(36, struct.pack(">i", 301))],
        "empty-file": [(32, struct.pack(">ii", 0, 0) + bytes(len(data) - 40))],
    }
    for off, b in patches[damage]:
        patch_file(p, off, b)
    want = damage == "empty-file"  # no keys at all: any geometry of the size fits
    assert _fits_by_definition(read_bytes(p), 100, 300) is want
    assert _geometry_fits(p, 100, 300) is want


@settings(max_examples=scaled(40), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(patches=st.lists(st.tuples(st.integers(32, 40 + 400 + 20 * 120), st.binary(min_size=1, max_size=4)),
                        min_size=1, max_size=4))
def test_index_geometry_check_agrees_with_its_definition(tmp_path_factory, patches):
    """Bytes overwritten in the header, the slots and the first entries:
    _geometry_fits answers as the slot-by-slot definition, for the file's
    geometry and two others of its size."""
    from rmqstore.storage.index import _geometry_fits

    p = _golden_index(tmp_path_factory.mktemp("geo"))[1]
    for off, b in patches:
        patch_file(p, off, b)
    data = read_bytes(p)
    for s, n in GEOMETRIES:
        assert _geometry_fits(p, s, n) is _fits_by_definition(data, s, n), (s, n)
