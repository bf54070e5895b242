"""RocketMQ's dispatch rules (rmqstore.dispatch): which records get a
ConsumeQueue unit, which are indexed and under which keys, and the tags code
with its delay rule. The Python rule, the pure twin's and the core's (each
written once) must agree, directly and in what a put writes to the files.
"""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

from conftest import ListClock
from rmqstore import MessageStore, StoreConfig, _pure, dispatch
from rmqstore.format.layout import SCHEDULE_TOPIC
from rmqstore.storage import consumequeue, index
from test_kernels import _need_core

RANDOM_FLAGS = [random.Random(19).randint(-(1 << 31), (1 << 31) - 1) for _ in range(2000)]
ALL_FLAGS = list(range(16)) + RANDOM_FLAGS
#: tags and their Java hashes (docs/format.md#tags-code), non-ASCII, outside the BMP and a lone surrogate
TAGS = {
    None: 0, "": 0, "TagA": 2598919, "tag1 || tag2": 50908463, "TopicTest#key1": -1655984460, "Aa": 2112, "BB": 2112,
    "\u00e9t\u00e9": None, "\u6807\u7b7e": None, "\U0001f600 smile": None, "\udc80": None,
}
T0 = 1_700_000_000_000


def _kernels(name):
    return _pure if name == "pure" else _need_core()


def test_unit_and_index_rules_by_transaction_type():
    for flag, unit, indexed in ((0x0, True, True), (0x4, False, True), (0x8, True, True), (0xC, False, False)):
        for other in (0, 0x1, 0x2, 0x30, 0x700, 0x7FFFFFF0, -16):
            assert dispatch.gets_consume_queue_unit(flag | other) is unit
            assert dispatch.gets_index_entries(flag | other) is indexed


@pytest.mark.parametrize("impl", ["pure", "core"])
def test_unit_rule_agrees(impl):
    k = _kernels(impl)
    for flag in ALL_FLAGS:  # (the arrays' forms restate the rules: checked against both kernels)
        tran = flag & 0xC
        assert k.gets_consume_queue_unit(flag) is (tran in (0x0, 0x8)), flag
        assert k.gets_index_entries(flag) is (tran != 0xC), flag
        assert k.gets_consume_queue_unit(flag) is dispatch.gets_consume_queue_unit(flag), flag
        assert k.gets_index_entries(flag) is dispatch.gets_index_entries(flag), flag
    flags = np.array(ALL_FLAGS, dtype=np.int32)
    assert dispatch.consume_queue_mask(flags).tolist() == [dispatch.gets_consume_queue_unit(f) for f in ALL_FLAGS]
    assert dispatch.index_mask(flags).tolist() == [dispatch.gets_index_entries(f) for f in ALL_FLAGS]
    with pytest.raises(TypeError):
        k.gets_consume_queue_unit("8")


@pytest.mark.parametrize("impl", ["pure", "core"])
def test_delay_level_is_javas_parse_int_capped(impl):
    """The DELAY rule's parse (docs/format.md#delay-rule): Java's
    Integer.parseInt (an optional sign, ASCII digits, i32), capped at the
    last level; 0 for no delay, -1 where parseInt throws."""
    k = _kernels(impl)
    cases = {
        "3": 3, "+3": 3, "18": 18, "19": 18, "2147483647": 18, "007": 7, "0": 0, "-0": 0, "-1": 0,
        "-2147483648": 0, "": 0, "x": -1, "+": -1, "-": -1, "1.5": -1, " 1": -1, "1 ": -1, "2147483648": -1,
        "-2147483649": -1, "\u0663": -1, "1_0": -1, "99999999999999999999": -1,
    }
    for text, want in cases.items():
        assert k.delay_level(text, 18) == want, text
        assert dispatch.java_parse_int(text) is None if want == -1 else True, text
    assert k.delay_level("5", 0) == 0  # no levels at all: no delay
    with pytest.raises(TypeError):
        k.delay_level(3, 18)
    with pytest.raises(ValueError):
        k.delay_level("3", -1)


@pytest.mark.parametrize("impl", ["pure", "core"])
def test_tags_hash_agrees(impl):
    k = _kernels(impl)
    for tags, want in TAGS.items():
        got = k.tags_hash(tags)
        assert got == dispatch.tags_hash(tags) == dispatch.tags_code("T", {"TAGS": tags} if tags else {}, T0, None)
        if want is not None:
            assert got == want, tags
    with pytest.raises(TypeError):
        k.tags_hash(b"TagA")


def test_delay_rule():
    cfg = StoreConfig()  # levels 1s 5s 10s 30s 1m ... 2h (18)
    code = dispatch.tags_code
    assert code(SCHEDULE_TOPIC, {"TAGS": "TagA", "DELAY": "3"}, T0, cfg) == T0 + 10_000
    assert code(SCHEDULE_TOPIC, {"DELAY": "+1"}, T0, cfg) == T0 + 1000
    assert code(SCHEDULE_TOPIC, {"DELAY": "99"}, T0, cfg) == T0 + 2 * 3600_000  # capped at the highest level
    for kept in ("0", "-2", "x", "\u0663", "", "99999999999"):  # level <= 0, or no Java int: the tags hash
        assert code(SCHEDULE_TOPIC, {"TAGS": "TagA", "DELAY": kept}, T0, cfg) == 2598919, kept
    assert code("T", {"TAGS": "TagA", "DELAY": "3"}, T0, cfg) == 2598919  # other topics: no delay rule


def test_index_keys_and_old_names():
    assert dispatch.index_keys("U1", " k1  k2 ") == ["U1", "k1", "k2"]
    assert dispatch.index_keys(None, None) == [] and dispatch.index_keys("", "") == []
    assert index.keys_of is dispatch.index_keys and consumequeue.tags_code is dispatch.tags_code
    for uniq, keys in (("U1", " k1  k2 "), (None, "a"), ("", None), ("u", "\u6807 \u7b7e")):
        assert _pure._index_keys(uniq, keys) == dispatch.index_keys(uniq, keys)


def test_index_key_rows_as_index_keys():
    pa = pytest.importorskip("pyarrow")
    rows = [("T", "U1", " k1  k2 "), ("S", None, None), ("T", "", "a"), ("T\u00e9", "u", None), ("T", None, "  ")]
    owner, full = dispatch.index_key_rows(*(pa.array(list(c), pa.string()) for c in zip(*rows)))
    want = [(i, f"{t}#{key}") for i, (t, u, ks) in enumerate(rows) for key in dispatch.index_keys(u, ks)]
    assert list(zip(owner.tolist(), full.to_pylist())) == want


# --- what a put writes: the put paths (core, twin, step by step) against the Python rules ---------

CFG = StoreConfig(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 400,
                  max_hash_slot_num=64, max_index_num=400, clean_service_enable=False)


def _messages(topic):
    from rmqstore import Message

    msgs = []
    tags = list(TAGS)
    for i in range(64):
        flag = (0x0, 0x4, 0x8, 0xC, 0x1, 0x9, 0x2)[i % 7]
        props = {"DELAY": ("3", "0", "x", "40")[i % 4]} if topic == SCHEDULE_TOPIC else None
        msgs.append(Message(
            topic, b"b%d" % i, queue_id=i % 2, tags=tags[i % len(tags)] if tags[i % len(tags)] != "\udc80" else None,
            keys=(f"k{i}", "a b", " k\u00e9  z ", None)[i % 4], unique_key=(f"U{i}", None)[i % 2],
            properties=props, sys_flag=flag,
        ))
    return msgs


@pytest.mark.parametrize("topic", ["T", SCHEDULE_TOPIC])
def test_what_puts_write_follows_the_rules(impl, tmp_path, topic):
    msgs = _messages(topic)
    records = []
    with MessageStore.open(tmp_path, CFG, clock=ListClock(range(T0, T0 + 1000))) as s:
        for m in msgs[:32]:  # (the first of each queue binds it: the rest may take the kernel's path)
            s.put_message(m)
        s.put_messages(msgs[32:])
        phy, end = s.min_physical_offset, s.max_physical_offset
        while phy < end:
            ext = s.get_message(phy)
            records.append(ext)
            phy += ext.store_size
        cfg = s.config
        found = {}
        for ext in records:
            for key in dispatch.index_keys(ext.unique_key, ext.keys):
                found.setdefault(key, {m.physical_offset for m in s.query_messages(topic, key, 1000)})
    assert len(records) == len(msgs)
    units = {}
    for qid in (0, 1):
        qdir = os.path.join(tmp_path, "consumequeue", topic, str(qid))
        for name in sorted(os.listdir(qdir)):
            with open(os.path.join(qdir, name), "rb") as f:
                data = f.read()
            for p in range(0, len(data), 20):
                phy, size, code = struct.unpack_from(">qiq", data, p)
                if size:
                    units[phy] = code
    n_keys = 0
    for ext in records:
        props = ext.properties
        if dispatch.gets_consume_queue_unit(ext.sys_flag):
            assert units.pop(ext.physical_offset) == dispatch.tags_code(topic, props, ext.store_timestamp, cfg)
        if dispatch.gets_index_entries(ext.sys_flag):
            keys = dispatch.index_keys(props.get("UNIQ_KEY"), props.get("KEYS"))
            n_keys += len(keys)
            assert all(ext.physical_offset in found[key] for key in keys)
        else:
            assert not any(ext.physical_offset in found.get(key, ()) for key in found)
    assert units == {}  # no unit for a prepared or rollback record
    (name,) = os.listdir(os.path.join(tmp_path, "index"))
    with open(os.path.join(tmp_path, "index", name), "rb") as f:
        assert struct.unpack_from(">i", f.read(40), 36)[0] == 1 + n_keys  # (the count starts at one)
