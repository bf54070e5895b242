"""rmqstore.arrow: CommitLog records as Arrow columns (no Spark needed).

Every check compares against the plain reader (``MessageStore.iter_messages``)
on the golden stores and on a generated store with the awkward cases (IPv6
hosts, empty bodies and properties, transactions, delay messages, keys with
extra spaces, several CommitLog files).
"""

from __future__ import annotations

import os
import shutil

import pytest

if os.environ.get("RMQSTORE_REQUIRE_SPARK") != "1":
    pytest.importorskip("pyarrow")

import pyarrow as pa

from conftest import GOLDEN_SETS, StepClock, golden_store
from rmqstore import (
    Message,
    MessageStore,
    StoreConfig,
    arrow,
)
from rmqstore.exceptions import CorruptedFileError

SMALL = dict(
    mapped_file_size_commit_log=16 * 1024,
    mapped_file_size_consume_queue=20 * 32,
    max_hash_slot_num=32,
    max_index_num=40,
)


def make_store(root, count: int = 300, config=None, start_ms: int = 1_726_732_800_000) -> list:
    """A store of *count* varied messages in small files; returns the
    ``Message`` list in put order."""
    cfg = StoreConfig(**(config or SMALL))
    msgs = []
    for i in range(count):
        topic = ("TopicA", "TopicB", "%RETRY%group", "SCHEDULE_TOPIC_XXXX")[i % 7 % 4]
        props = {"orderId": str(i)} if i % 3 else {}
        if topic == "SCHEDULE_TOPIC_XXXX":
            props["DELAY"] = str(1 + i % 5)
        kw: dict = {}
        if i % 4 != 3:
            kw["tags"] = f"Tag{i % 5}"
        if i % 5 == 0:
            kw["keys"] = f"k{i}  shared k{i % 7}"
        if i % 2 == 0:
            kw["unique_key"] = f"U{i:08d}"
        if i % 11 == 0:
            kw["born_host"] = "[2001:db8::1]:40000"
        if i % 13 == 5:
            kw["sys_flag"] = 4  # prepared: no ConsumeQueue unit
        elif i % 13 == 6:
            kw["sys_flag"] = 8  # commit
        elif i % 29 == 7:
            kw["sys_flag"] = 12  # rollback: not indexed either
        body = b"" if i % 17 == 0 else (f"body-{i}-".encode() * (1 + i % 9))
        msgs.append(Message(topic, body, queue_id=i % 3, flag=i - 5, properties=props or None,
                            born_timestamp=start_ms + i * 997, reconsume_times=i % 4, **kw))
    clock = StepClock(start_ms, step=1_500)
    with MessageStore.open(root, config=cfg, clock=clock) as st:
        for m in msgs:
            st.put_message(m)
    return msgs


def plain_rows(root) -> list:
    with MessageStore.open(root, read_only=True) as st:
        return list(st.iter_messages())


def assert_same(rows: list, msgs: list, broker: str) -> None:
    """Arrow rows (``to_pylist``) against MessageExt, field by field."""
    assert len(rows) == len(msgs)
    for r, m in zip(rows, msgs):
        assert r["broker"] == broker
        for name in ("physical_offset", "topic", "queue_id", "queue_offset", "born_host", "store_host",
                     "sys_flag", "flag", "reconsume_times", "tags", "keys", "unique_key", "msg_id",
                     "store_size", "prepared_transaction_offset", "body_crc"):
            assert r[name] == getattr(m, name), (name, r[name], getattr(m, name))
        assert r["body"] == m.body
        assert dict(r["properties"]) == m.properties
        assert [k for k, _ in r["properties"]] == list(m.properties)
        for name in ("store_timestamp", "born_timestamp"):
            assert r[name].timestamp() * 1000 == pytest.approx(getattr(m, name), abs=0.5)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed") / "broker-x" / "store"
    make_store(root)
    return root


@pytest.mark.parametrize("name", GOLDEN_SETS)
def test_golden_store_matches_plain_reader(name):
    table = arrow.read_table(golden_store(name))
    assert table.schema == arrow.arrow_schema()
    assert_same(table.to_pylist(), plain_rows(golden_store(name)), name)


def test_generated_store_matches_plain_reader(mixed):
    msgs = plain_rows(mixed)
    assert len(os.listdir(mixed / "commitlog")) > 3
    assert any(m.born_host.startswith("[") for m in msgs) and any(not m.body for m in msgs)
    assert_same(arrow.read_table(mixed, batch_rows=7).to_pylist(), msgs, "broker-x")


def test_splits_cut_only_at_record_starts(mixed):
    whole = arrow.store_splits(mixed)
    cut = arrow.store_splits(mixed, split_bytes=1000)
    assert len(whole) == len(os.listdir(mixed / "commitlog"))
    assert len(cut) > 2 * len(whole)
    msgs = {m.physical_offset for m in plain_rows(mixed)}
    for s in cut:
        if s.start:
            assert s.file_offset + s.start in msgs
    rows = [r for s in cut for b in arrow.read_split(s, ["physical_offset"]) for r in b.column(0).to_pylist()]
    assert rows == sorted(msgs)


def test_narrow_and_chosen_columns(mixed):
    narrow = arrow.read_table(mixed, arrow.NARROW_COLUMNS)
    assert "body" not in narrow.schema.names and "properties" not in narrow.schema.names
    full = arrow.read_table(mixed)
    assert narrow.equals(full.select(list(arrow.NARROW_COLUMNS)))
    two = arrow.read_table(mixed, ["topic", "physical_offset"])
    assert two.schema.names == ["topic", "physical_offset"]
    with pytest.raises(ValueError):
        arrow.arrow_schema(["nope"])


def test_scan_filter_is_exact_and_prunes(mixed):
    msgs = plain_rows(mixed)
    mid = msgs[len(msgs) // 2]
    f = arrow.ScanFilter(topics=frozenset(["TopicB"]), queue_ids=frozenset([1, 2]),
                         min_store_timestamp=msgs[20].store_timestamp, max_physical_offset=mid.physical_offset)
    want = [m.physical_offset for m in msgs if m.topic == "TopicB" and m.queue_id in (1, 2)
            and m.store_timestamp >= msgs[20].store_timestamp and m.physical_offset <= mid.physical_offset]
    got = arrow.read_table(mixed, ["physical_offset"], scan_filter=f).column(0).to_pylist()
    assert got == want and want
    kept = arrow.store_splits(mixed, scan_filter=f)
    assert 0 < len(kept) < len(arrow.store_splits(mixed))
    late = arrow.ScanFilter(min_store_timestamp=msgs[-1].store_timestamp)
    assert len(arrow.store_splits(mixed, scan_filter=late)) == 1
    assert arrow.read_table(mixed, ["physical_offset"], scan_filter=late).num_rows == 1


def test_several_brokers_and_names(tmp_path, mixed):
    table = arrow.read_table([golden_store("tiny"), mixed], ["broker", "topic"])
    assert table.column("broker").to_pylist() == ["tiny"] * 5 + ["broker-x"] * len(plain_rows(mixed))
    named = arrow.read_table([golden_store("tiny")], ["broker"], brokers=["b1"])
    assert set(named.column(0).to_pylist()) == {"b1"}
    with pytest.raises(ValueError):
        arrow.read_table([golden_store("tiny")], brokers=["a", "b"])
    assert arrow.broker_name("/data/broker-a/store") == "broker-a"
    assert arrow.broker_name("/data/broker-b") == "broker-b"


def test_corrupt_record_raises_or_stops(tmp_path, mixed):
    root, msgs, victim = _damaged_copy(tmp_path, mixed, "magic")
    with pytest.raises(CorruptedFileError) as e:
        arrow.read_table(root)
    assert e.value.offset == victim.physical_offset
    got = arrow.read_table(root, ["physical_offset"], on_corrupt="stop").column(0).to_pylist()
    assert got[:5] == [m.physical_offset for m in msgs[:5]] and victim.physical_offset not in got


def _damaged_copy(tmp_path, mixed, how: str):
    """A copy of *mixed* with its 6th record damaged: "magic" breaks its
    magic code, "header" zeroes its first 8 bytes (zeros with valid records
    after them), "body" flips a body byte (only the CRC tells)."""
    root = tmp_path / "store"
    shutil.copytree(mixed, root)
    msgs = plain_rows(root)
    victim = msgs[5]
    seg = sorted(os.listdir(root / "commitlog"))[0]
    with open(root / "commitlog" / seg, "r+b") as fh:
        if how == "magic":
            fh.seek(victim.physical_offset + 4)
            fh.write(b"\x00\x00\x00\x01")
        elif how == "header":
            fh.seek(victim.physical_offset)
            fh.write(bytes(8))
        else:
            at = fh.read().find(victim.body, victim.physical_offset)
            assert victim.body and at > victim.physical_offset
            fh.seek(at)
            fh.write(bytes([victim.body[0] ^ 0x40]))
    return root, msgs, victim


@pytest.mark.parametrize("how", ["header", "body"])
def test_damage_is_never_silent(tmp_path, mixed, how):
    """A zeroed header inside the data is damage, not the end of the data;
    a flipped body byte is caught by the CRC check, on by default. fail
    names the position, skip reads every other record and counts what it
    skipped, stop ends the split there."""
    root, msgs, victim = _damaged_copy(tmp_path, mixed, how)
    with pytest.raises(CorruptedFileError) as e:
        arrow.read_table(root, ["physical_offset"])
    assert e.value.offset == victim.physical_offset and "onCorrupt=skip" in str(e.value)
    splits = arrow.store_splits(root, "b")
    stats: dict = {}
    got = [x for s in splits for b in arrow.read_split(s, ["physical_offset"], on_corrupt="skip", stats=stats)
           for x in b.column(0).to_pylist()]
    assert got == [m.physical_offset for m in msgs if m is not victim]
    assert stats == {"skipped_records": 1, "skipped_bytes": victim.store_size}
    got = arrow.read_table(root, ["physical_offset"], on_corrupt="stop").column(0).to_pylist()
    assert got[:5] == [m.physical_offset for m in msgs[:5]] and victim.physical_offset not in got
    if how == "body":  # (opting out of the CRC check reads the damaged body as it is)
        assert arrow.read_table(root, ["physical_offset"], check_crc=False).num_rows == len(msgs)
    with pytest.raises(ValueError):
        arrow.read_table(root, on_corrupt="ignore")


def test_scan_end_tells_damage_from_a_write_in_progress(tmp_path, mixed):
    """A live reader's end: a record that does not validate with valid data
    after it is damage (fail raises, skip goes past, stop stays before it),
    while a torn tail with nothing after it is a write in progress."""
    root, msgs, victim = _damaged_copy(tmp_path, mixed, "header")
    end = msgs[-1].physical_offset + msgs[-1].store_size
    assert arrow.scan_end(root, 0) == victim.physical_offset  # (stop, the default: logged)
    with pytest.raises(CorruptedFileError) as e:
        arrow.scan_end(root, 0, "fail")
    assert e.value.offset == victim.physical_offset
    assert arrow.scan_end(root, 0, "skip") == end
    # the last record torn: nothing valid after it, so no damage in any mode
    last = msgs[-1]
    seg = sorted(os.listdir(root / "commitlog"))[-1]
    with open(root / "commitlog" / seg, "r+b") as fh:
        fh.seek(last.physical_offset - int(seg) + last.store_size - 3)
        fh.write(b"\xff\xff\xff")
    assert arrow.scan_end(root, msgs[-2].physical_offset, "fail") == last.physical_offset


def test_scan_end_follows_a_live_store(tmp_path):
    root = tmp_path / "live"
    cfg = StoreConfig(**SMALL)
    with MessageStore.open(root, config=cfg) as st:
        assert arrow.scan_end(root, 0) == 0
        st.put_messages([Message("T", b"x" * 3000) for _ in range(12)])
        end = arrow.scan_end(root, 0)
        assert end == st.max_physical_offset
        st.put_message(Message("T", b"y"))
        assert arrow.scan_end(root, end) == st.max_physical_offset
        splits = arrow.range_splits(root, "b", end, st.max_physical_offset)
        rows = [b for s in splits for b in arrow.read_split(s, ["body"])]
        assert pa.Table.from_batches(rows).column(0).to_pylist() == [b"y"]


def test_timestamps_beyond_the_microsecond_range_read_as_null(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, config=StoreConfig(**SMALL)) as st:
        st.put_message(Message("T", b"a", born_timestamp=1 << 62))
        st.put_message(Message("T", b"b", born_timestamp=-1))
    t = arrow.read_table(root, ["born_timestamp", "store_timestamp"])
    born = t.column("born_timestamp").to_pylist()
    assert born[0] is None and born[1].timestamp() == -0.001
    assert t.column("store_timestamp").null_count == 0
