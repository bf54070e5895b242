"""``decode_columns``: bulk decoding of CommitLog records into column arrays.

Checked against the record-at-a-time reader (``MessageExt``) on the golden
stores, for both implementations, plus batching, stop codes and core/pure
parity on damaged buffers.
"""

import pathlib
import random

import numpy as np
import pytest

from conftest import golden_store
from rmqstore import MessageStore, _pure
from rmqstore.format import layout as L
from test_kernels import k  # noqa: F401 - the fixture: each implementation in turn

try:
    from rmqstore import _core
except ImportError:
    _core = None

STOP_LIMIT, STOP_END = L.STOP_LIMIT, L.STOP_END


def _files(name):
    return sorted((golden_store(name) / "commitlog").iterdir())


def _strings(cols, name):
    off, data = cols[name + "_offsets"], cols[name + "_data"].tobytes()
    return [data[off[i] : off[i + 1]] for i in range(len(off) - 1)]


def _optional(cols, name):
    return [v.decode() if ok else None for v, ok in zip(_strings(cols, name), cols[name + "_valid"])]


def _properties(cols):
    keys, values = _strings(cols, "property_key"), _strings(cols, "property_value")
    off = cols["properties_offsets"]
    return [{keys[j].decode(): values[j].decode() for j in range(off[i], off[i + 1])} for i in range(len(off) - 1)]


def _decode_file(k, path, **kw):
    buf = pathlib.Path(path).read_bytes()
    return k.decode_columns(buf, 0, len(buf), int(path.name), 1 << 30, True, True, **kw)


@pytest.mark.parametrize("golden_set", ["tiny", "basic"])
def test_columns_match_the_record_reader(k, golden_set):
    with MessageStore.open(golden_store(golden_set), read_only=True) as store:
        expected = list(store.iter_messages())
    rows = []
    for path in _files(golden_set):
        next_pos, stop, cols = _decode_file(k, path, check_crc=True)
        assert stop == L.REC_BLANK  # every golden file ends in a blank record or zeros
        n = len(cols["physical_offset"])
        assert all(len(v) == n for name, v in cols.items() if not name.endswith(("_offsets", "_data")))
        strings = {name: _strings(cols, name) for name in ("topic", "born_host", "store_host", "msg_id", "body")}
        optional = {name: _optional(cols, name) for name in ("tags", "keys", "unique_key")}
        props = _properties(cols)
        for i in range(n):
            rows.append({
                **{name: int(cols[name][i]) for name in (
                    "physical_offset", "queue_offset", "born_timestamp", "store_timestamp",
                    "prepared_transaction_offset", "store_size", "queue_id", "flag", "sys_flag",
                    "reconsume_times", "body_crc")},
                "topic": strings["topic"][i].decode(), "born_host": strings["born_host"][i].decode(),
                "store_host": strings["store_host"][i].decode(), "msg_id": strings["msg_id"][i].decode(),
                "body": strings["body"][i], **{name: optional[name][i] for name in optional},
                "properties": props[i],
            })
        if n:
            assert next_pos == int(cols["physical_offset"][-1]) - int(path.name) + int(cols["store_size"][-1])
    assert len(rows) == len(expected) > 0
    for row, m in zip(rows, expected):
        assert row == {
            "physical_offset": m.physical_offset, "queue_offset": m.queue_offset,
            "born_timestamp": m.born_timestamp, "store_timestamp": m.store_timestamp,
            "prepared_transaction_offset": m.prepared_transaction_offset, "store_size": m.store_size,
            "queue_id": m.queue_id, "flag": m.flag, "sys_flag": m.sys_flag,
            "reconsume_times": m.reconsume_times, "body_crc": m.body_crc, "topic": m.topic,
            "born_host": m.born_host, "store_host": m.store_host, "msg_id": m.msg_id, "body": m.body,
            "tags": m.tags, "keys": m.keys, "unique_key": m.unique_key, "properties": m.properties,
        }


def test_dtypes_and_optional_columns(k):
    path = _files("basic")[0]
    buf = path.read_bytes()
    _, _, cols = k.decode_columns(buf, 0, len(buf), 0, 7, False, False)
    assert "body_offsets" not in cols and "properties_offsets" not in cols
    assert cols["physical_offset"].dtype == np.int64 and cols["queue_id"].dtype == np.int32
    assert cols["topic_offsets"].dtype == np.int32 and cols["topic_data"].dtype == np.uint8
    assert cols["tags_valid"].dtype == np.bool_
    assert len(cols["physical_offset"]) == 7 and len(cols["topic_offsets"]) == 8


def test_batches_resume_where_they_stopped(k):
    path = _files("basic")[0]
    buf = path.read_bytes()
    _, _, whole = k.decode_columns(buf, 0, len(buf), 0, 1 << 30, True, True)
    pos, got = 0, []
    while True:
        pos, stop, cols = k.decode_columns(buf, pos, len(buf), 0, 13, True, True)
        got.extend(cols["physical_offset"].tolist())
        if stop != STOP_LIMIT:
            break
        assert len(cols["physical_offset"]) == 13
    assert stop == L.REC_BLANK and got == whole["physical_offset"].tolist()
    # an end between records stops exactly there
    cut = int(whole["physical_offset"][10])
    next_pos, stop, cols = k.decode_columns(buf, 0, cut, 0, 1 << 30, False, False)
    assert (next_pos, stop, len(cols["queue_id"])) == (cut, STOP_END, 10)
    # an end inside a record: that record is truncated
    next_pos, stop, cols = k.decode_columns(buf, 0, cut + 5, 0, 1 << 30, False, False)
    assert (next_pos, stop, len(cols["queue_id"])) == (cut, L.REC_TRUNCATED, 10)
    # zero records asked for
    assert k.decode_columns(buf, 0, len(buf), 0, 0, False, False)[:2] == (0, STOP_LIMIT)


def test_stop_codes_on_damage(k):
    path = _files("basic")[0]
    buf = bytearray(path.read_bytes())
    _, _, cols = k.decode_columns(buf, 0, len(buf), 0, 1 << 30, True, True)
    third = int(cols["physical_offset"][3])
    # PHYSICALOFFSET not where the record lies
    bad = bytearray(buf)
    bad[third + 28 + 7] ^= 1
    assert k.decode_columns(bad, 0, len(bad), 0, 1 << 30, False, False)[:2] == (third, L.REC_BAD_OFFSET)
    assert k.decode_columns(bad, 0, len(bad), -1, 1 << 30, False, False)[1] == L.REC_BLANK  # check off
    # a flipped body byte: only the CRC check sees it
    bad = bytearray(buf)
    body_at = third + int(cols["store_size"][3]) - 1  # somewhere near the end: properties
    bad[third + 100] ^= 0xFF
    assert k.decode_columns(bad, 0, len(bad), 0, 1 << 30, False, False, check_crc=True)[:2] == (third, L.REC_BODY_CRC)
    assert body_at > third
    # bad magic
    bad = bytearray(buf)
    bad[third + 4] ^= 0x10
    assert k.decode_columns(bad, 0, len(bad), 0, 1 << 30, False, False)[:2] == (third, L.REC_BAD_MAGIC)
    with pytest.raises(ValueError):
        k.decode_columns(buf, -1, len(buf), 0, 10, False, False)
    with pytest.raises(ValueError):
        k.decode_columns(buf, 10, 5, 0, 10, False, False)


@pytest.mark.parametrize("with_hosts", [True, False])
@pytest.mark.parametrize("with_keys", [True, False])
@pytest.mark.parametrize("with_properties", [True, False])
def test_columns_left_out_on_request_and_the_rest_unchanged(k, with_hosts, with_keys, with_properties):
    """Without with_hosts the host and msgId columns are missing, without
    with_keys tags, keys and unique_key; every other column, the stop and
    the position are those of a full decode (the CRCs checked either way)."""
    hosts = {f"{c}_{p}" for c in ("born_host", "store_host", "msg_id") for p in ("offsets", "data")}
    keys = {f"{c}_{p}" for c in ("tags", "keys", "unique_key") for p in ("offsets", "data", "valid")}
    for path in _files("basic") + _files("tiny"):
        full = _decode_file(k, path, check_crc=True)
        buf = path.read_bytes()
        part = k.decode_columns(buf, 0, len(buf), int(path.name), 1 << 30, True, with_properties, True, with_hosts,
                                with_keys)
        assert part[:2] == full[:2]
        gone = (set() if with_hosts else hosts) | (set() if with_keys else keys) | \
            (set() if with_properties else {n for n in full[2] if n.startswith("propert")})
        assert set(part[2]) == set(full[2]) - gone and gone <= set(full[2])
        for name in part[2]:
            assert np.array_equal(part[2][name], full[2][name]), name


def _damaged(rnd, paths) -> bytearray:
    """One of *paths* read, with up to three random bytes overwritten."""
    buf = bytearray(rnd.choice(paths).read_bytes())
    for _ in range(rnd.randint(0, 3)):
        buf[rnd.randrange(min(len(buf), 70000))] = rnd.randrange(256)
    return buf


def _same(a, b):
    assert a[:2] == b[:2]
    assert a[2].keys() == b[2].keys()
    for name in a[2]:
        assert a[2][name].dtype == b[2][name].dtype, name
        assert np.array_equal(a[2][name], b[2][name]), name


@pytest.mark.parametrize("seed", range(40))
def test_core_matches_pure_on_damaged_files(seed):
    if _core is None:
        pytest.skip("rmqstore._core not built")
    rnd = random.Random(seed)
    buf = _damaged(rnd, _files("basic") + _files("tiny"))
    args = (0, rnd.choice([len(buf), rnd.randrange(len(buf))]), rnd.choice([0, -1]),
            rnd.choice([5, 1 << 30]), rnd.random() < 0.5, rnd.random() < 0.5, rnd.random() < 0.5,
            rnd.random() < 0.5, rnd.random() < 0.5)
    _same(_core.decode_columns(bytes(buf), *args), _pure.decode_columns(bytes(buf), *args))


# --- scan_records: the recovery walk in one call ---------------------------------


@pytest.mark.parametrize("golden_set", ["tiny", "basic"])
def test_scan_records_walks_what_decode_columns_decodes(k, golden_set):
    for path in _files(golden_set):
        buf = path.read_bytes()
        next_pos, _stop, cols = k.decode_columns(buf, 0, len(buf), int(path.name), 1 << 30, False, False)
        end, status, count = k.scan_records(buf, 0, len(buf), int(path.name), True, 2, 1 << 22)
        assert (end, count) == (next_pos, len(cols["queue_id"]))
        # a blank record, or zeros (which are no magic code: the recovery judges them)
        assert status == (L.REC_BLANK if any(buf[end : end + 8]) else L.REC_BAD_MAGIC)
        # an end on a record boundary, and one inside a record
        if len(cols["queue_id"]) > 2:
            second = int(cols["physical_offset"][2]) - int(path.name)
            assert k.scan_records(buf, 0, second, int(path.name), True, 2, 1 << 22) == (second, STOP_END, 2)
            assert k.scan_records(buf, 0, second + 1, int(path.name), True, 2, 1 << 22) == (
                second, L.REC_TRUNCATED, 2)


def test_scan_records_stops_at_damage(k):
    path = _files("basic")[0]
    buf = bytearray(path.read_bytes())
    _, _, cols = k.decode_columns(buf, 0, len(buf), 0, 1 << 30, False, False)
    third = int(cols["physical_offset"][3])
    bad = bytearray(buf)
    bad[third + 100] ^= 0xFF  # the body: only a CRC check sees it
    assert k.scan_records(bad, 0, len(bad), 0, True, 0, 1 << 22) == (third, L.REC_BODY_CRC, 3)
    assert k.scan_records(bad, 0, len(bad), 0, False, 0, 1 << 22)[1] == L.REC_BLANK
    bad = bytearray(buf)
    bad[third + 35] ^= 1  # PHYSICALOFFSET
    assert k.scan_records(bad, 0, len(bad), 0, False, 0, 1 << 22) == (third, L.REC_BAD_OFFSET, 3)
    assert k.scan_records(bad, 0, len(bad), -1, False, 0, 1 << 22)[1] == L.REC_BLANK
    assert k.scan_records(buf, 0, len(buf), 0, False, 0, 100)[1] == L.REC_BAD_SIZE  # max_size
    with pytest.raises(ValueError):
        k.scan_records(buf, 5, 4, 0, False, 0, 100)


@pytest.mark.parametrize("seed", range(30))
def test_scan_records_core_matches_pure(seed):
    if _core is None:
        pytest.skip("rmqstore._core not built")
    rnd = random.Random(seed)
    buf = _damaged(rnd, _files("basic"))
    args = (bytes(buf), 0, rnd.randrange(len(buf) + 1), rnd.choice([0, -1, 65536]), rnd.random() < 0.5,
            rnd.choice([0, 1, 2]), rnd.choice([500, 1 << 22]))
    assert _core.scan_records(*args) == _pure.scan_records(*args)


# --- decode_columns_at: the records of a pull, by physical offset ---------------------


def _segments(name):
    paths = _files(name)
    fs = len(paths[0].read_bytes())
    return [p.read_bytes() for p in paths], fs, int(paths[0].name)


def _row_of(cols, i):
    """Row *i* of decoded columns as a comparable dict (every column)."""
    row = {}
    for name, arr in cols.items():
        if name.endswith("_offsets"):
            base = name[: -len("_offsets")]
            if base == "properties":
                continue
            data = cols[base + "_data"].tobytes()
            if base.startswith("property_"):
                continue
            row[base] = data[arr[i] : arr[i + 1]]
        elif not name.endswith("_data"):
            row[name] = arr[i].item()
    return row


def test_decode_columns_at_equals_decode_columns_rows(k):
    bufs, fs, base = _segments("basic")
    whole = [k.decode_columns(b, 0, len(b), base + i * fs, 1 << 30, True, False)[2] for i, b in enumerate(bufs)]
    rows = [(c, i) for c in whole for i in range(len(c["physical_offset"]))]
    picks = random.Random(5).sample(rows, 40)
    offsets = [int(c["physical_offset"][i]) for c, i in picks]
    count, stop, cols = k.decode_columns_at(bufs, fs, base, offsets, True, False)
    assert (count, stop) == (40, STOP_END)
    assert [_row_of(cols, j) for j in range(40)] == [_row_of(c, i) for c, i in picks]
    # with properties: the same maps as decode_columns gives
    count, _, with_props = k.decode_columns_at(bufs, fs, base, offsets[:5], False, True)
    assert "body_offsets" not in with_props and len(with_props["properties_offsets"]) == 6


def test_decode_columns_at_stops_at_the_first_bad_offset(k):
    bufs, fs, base = _segments("basic")
    _, _, c = k.decode_columns(bufs[0], 0, len(bufs[0]), base, 3, False, False)
    good = [int(x) for x in c["physical_offset"]]
    for bad, code in ((good[1] + 1, L.REC_BAD_MAGIC), (base + len(bufs) * fs, L.REC_BAD_OFFSET),
                      (base - 1, L.REC_BAD_OFFSET)):
        count, stop, cols = k.decode_columns_at(bufs, fs, base, [good[0], bad, good[2]], False, False)
        assert (count, stop) == (1, code) and cols["physical_offset"].tolist() == [good[0]]
    # the segment under another base: PHYSICALOFFSET disagrees with where it is read
    assert k.decode_columns_at(bufs[:1], fs, base + fs, [base + fs + good[1]], False, False)[:2] == (
        0, L.REC_BAD_OFFSET)
    assert k.decode_columns_at(bufs, fs, base, [], True, True)[:2] == (0, STOP_END)
    with pytest.raises(TypeError):
        k.decode_columns_at(tuple(bufs), fs, base, good, False, False)
    with pytest.raises(ValueError):
        k.decode_columns_at(bufs, 0, base, good, False, False)


@pytest.mark.parametrize("seed", range(20))
def test_decode_columns_at_core_matches_pure(seed):
    if _core is None:
        pytest.skip("rmqstore._core not built")
    rnd = random.Random(seed)
    bufs, fs, base = _segments("basic")
    bufs = [bytes(_damaged(rnd, [p])) for p in _files("basic")]
    _, _, c = _pure.decode_columns(bufs[0], 0, len(bufs[0]), -1, 1 << 30, False, False)
    offsets = [int(x) for x in c["physical_offset"]] + [rnd.randrange(base, base + 3 * fs) for _ in range(3)]
    rnd.shuffle(offsets)
    args = (bufs, fs, base, offsets, rnd.random() < 0.5, rnd.random() < 0.5)
    a, b = _core.decode_columns_at(*args), _pure.decode_columns_at(*args)
    _same(a, b)


# --- MessageStore.get_message_columns: the bulk pull -----------------------------------


@pytest.mark.parametrize("golden_set", ["tiny", "basic"])
def test_column_pulls_equal_message_pulls(golden_set):
    from rmqstore import GetMessageStatus

    with MessageStore.open(golden_store(golden_set), read_only=True) as store:
        for topic, qid in store.queues():
            mx = store.get_max_offset_in_queue(topic, qid)
            off = store.get_min_offset_in_queue(topic, qid)
            while off < mx:
                want = store.get_messages(topic, qid, off, 3)
                got = store.get_message_columns(topic, qid, off, 3, with_properties=True)
                assert (got.status, got.next_begin_offset, got.min_offset, got.max_offset) == (
                    want.status, want.next_begin_offset, want.min_offset, want.max_offset)
                c = got.columns
                assert c["physical_offset"].tolist() == [m.physical_offset for m in want.messages]
                assert _strings(c, "body") == [m.body for m in want.messages]
                assert _optional(c, "tags") == [m.tags for m in want.messages]
                assert _properties(c) == [m.properties for m in want.messages]
                off = got.next_begin_offset
            edge = store.get_message_columns(topic, qid, mx, 3)
            assert edge.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and len(edge.columns["queue_id"]) == 0
        assert store.get_message_columns("NoSuchTopic", 0, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE


def test_column_pull_refuses_a_unit_that_is_not_its_record(tmp_path):
    from rmqstore import CorruptedFileError, Message, StoreConfig

    small = StoreConfig(mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=400,
                        max_hash_slot_num=64, max_index_num=256)
    with MessageStore.open(tmp_path / "s", config=small) as store:
        for i in range(6):
            store.put_message(Message("T", b"x%d" % i, queue_id=i % 2))
    # point unit 1 of queue 0 at queue 1's first record
    cq = next((tmp_path / "s" / "consumequeue" / "T" / "0").iterdir())
    other = next((tmp_path / "s" / "consumequeue" / "T" / "1").iterdir())
    data = bytearray(cq.read_bytes())
    data[20:40] = other.read_bytes()[:20]
    cq.write_bytes(bytes(data))
    with MessageStore.open(tmp_path / "s", read_only=True) as store:
        with pytest.raises(CorruptedFileError):
            store.get_message_columns("T", 0, 0, 10)
        assert len(store.get_message_columns("T", 0, 0, 1).columns["queue_id"]) == 1


@pytest.mark.parametrize("batch", [1, 3, 7, 50])
def test_column_pulls_equal_message_pulls_past_placeholders_and_cleaned_files(tmp_path, batch):
    """Units whose records were cleaned up and pre-blank placeholders are
    skipped alike by both pulls, across ConsumeQueue files, with the same
    statuses and next offsets."""
    import struct

    from rmqstore import Message, StoreConfig

    small = StoreConfig(mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200,
                        max_hash_slot_num=64, max_index_num=256)
    with MessageStore.open(tmp_path / "s", config=small) as store:
        for i in range(120):
            store.put_message(Message("T", b"m%03d" % i * 20, queue_id=i % 2, tags=f"t{i % 3}"))
    for f in sorted((tmp_path / "s" / "commitlog").iterdir())[:2]:
        f.unlink()  # cleaned up behind the queues' backs: their first units point at nothing
    cq = sorted((tmp_path / "s" / "consumequeue" / "T" / "0").iterdir())[-1]
    data = bytearray(cq.read_bytes())
    data[40:60] = struct.pack(">qiq", 0, 0x7FFFFFFF, 0)  # a pre-blank placeholder
    cq.write_bytes(bytes(data))
    with MessageStore.open(tmp_path / "s", read_only=True) as store:
        for qid in (0, 1):  # as in the moment between a CommitLog deletion and the queues' correction
            cq = store.consume_queue("T", qid)
            cq.min_logic_offset = cq.queue.files[0].file_from_offset
        statuses = set()
        for qid in (0, 1):
            mn, mx = store.get_min_offset_in_queue("T", qid), store.get_max_offset_in_queue("T", qid)
            for off in range(mn, mx + 1):
                want = store.get_messages("T", qid, off, batch)
                got = store.get_message_columns("T", qid, off, batch)
                assert (got.status, got.next_begin_offset, got.min_offset, got.max_offset) == (
                    want.status, want.next_begin_offset, want.min_offset, want.max_offset), (qid, off)
                assert got.columns["queue_offset"].tolist() == [m.queue_offset for m in want.messages]
                assert _strings(got.columns, "body") == [m.body for m in want.messages]
                statuses.add(want.status.name)
                if want.messages and want.messages[0].queue_offset > off:
                    statuses.add("skipped")
        assert {"FOUND", "OFFSET_OVERFLOW_ONE", "skipped"} <= statuses
