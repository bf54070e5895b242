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
from test_kernels import k  # noqa: F401 - the fixture: each implementation in turn

from rmqstore import MessageStore
from rmqstore import _layout as L
from rmqstore import _pure

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
            rnd.choice([5, 1 << 30]), rnd.random() < 0.5, rnd.random() < 0.5, rnd.random() < 0.5)
    _same(_core.decode_columns(bytes(buf), *args), _pure.decode_columns(bytes(buf), *args))


# --- scan_records: the recovery walk in one call ---------------------------------


@pytest.mark.parametrize("golden_set", ["tiny", "basic"])
def test_scan_records_walks_what_decode_columns_decodes(k, golden_set):
    for path in _files(golden_set):
        buf = path.read_bytes()
        next_pos, stop, cols = k.decode_columns(buf, 0, len(buf), int(path.name), 1 << 30, False, False)
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
