"""Behaviour of the embedded store: writing, rolling, reading, queries,
recovery after a clean or unclean shutdown, lifecycle and configuration."""

from __future__ import annotations

import itertools
import os
import re
import struct
import subprocess
import sys
import zlib

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

import rmqstore
from conftest import (
    BLANK_MAGIC,
    DELAY_LEVEL_MS,
    V1_MAGIC,
    V2_MAGIC,
    ListClock,
    StepClock,
    env_pure_python,
    java_hash,
    read_bytes,
    scaled,
)
from rmqstore import (
    ConfigError,
    GetMessageStatus,
    Message,
    MessageStore,
    PutMessageStatus,
    StoreClosedError,
    StoreConfig,
    StoreLockedError,
    StoreReadOnlyError,
)
from rmqstore.message import decode_offset_msg_id, encode_host

SMALL = StoreConfig(
    mapped_file_size_commit_log=4096,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=16,
    max_index_num=32,
)
T0 = 1_700_000_000_000


def rec_size(body_len, topic_len, props_len, born_v6=False, store_v6=False, v2=False):
    """Independent CommitLog record length formula (docs/format.md#record-length)."""
    hosts = (12 if born_v6 else 0) + (12 if store_v6 else 0)
    return 84 + hosts + 4 + body_len + (2 if v2 else 1) + topic_len + 2 + props_len


def cl_files(root):
    d = os.path.join(root, "commitlog")
    return sorted(os.listdir(d))


def cl_bytes(root, name):
    return read_bytes(os.path.join(root, "commitlog", name))


# --- put / get round trip with rolling files ----------------------------------------------


def _fill(store, n, seed=0):
    """Put *n* messages of varying sizes over 3 topics / 3 queues; returns the
    list of (Message, PutMessageResult)."""
    import random

    rnd = random.Random(seed)
    out = []
    for i in range(n):
        topic = ("TopicA", "TopicB", "Topic-C")[i % 3]
        qid = rnd.randrange(3)
        body = bytes(rnd.getrandbits(8) for _ in range(rnd.choice((0, 1, 17, 200, 700))))
        msg = Message(
            topic, body, queue_id=qid, tags=f"Tag{i % 4}", keys=[f"key-{i}", f"grp-{i % 5}"],
            unique_key=rmqstore.new_unique_key(), properties={"n": str(i)},
        )
        out.append((msg, store.put_message(msg)))
    return out


def _check_all(store, written):
    by_queue = {}
    for msg, res in written:
        m = store.get_message(res.wrote_offset)
        assert m is not None
        assert (m.topic, m.queue_id, m.queue_offset, m.body) == (
            msg.topic, msg.queue_id, res.queue_offset, bytes(msg.body))
        assert (m.tags, m.keys, m.unique_key) == (msg.tags, msg.keys, msg.unique_key)
        assert m.store_size == res.wrote_bytes
        assert m.store_timestamp == res.store_timestamp
        assert m.msg_id == res.msg_id
        by_queue.setdefault((msg.topic, msg.queue_id), []).append(res)
    for (topic, qid), results in by_queue.items():
        assert [r.queue_offset for r in results] == list(range(len(results)))
        assert store.get_max_offset_in_queue(topic, qid) == len(results)
        assert store.get_min_offset_in_queue(topic, qid) == 0
        got = []
        off = 0
        while off < len(results):
            res = store.get_messages(topic, qid, off, max_count=4)
            assert res.status is GetMessageStatus.FOUND
            got.extend(res.messages)
            off = res.next_begin_offset
        assert [m.physical_offset for m in got] == [r.wrote_offset for r in results]
    for msg, res in [w for w in written if w[0].keys][::7]:
        key = msg.keys.split()[0]
        assert [m.physical_offset for m in store.query_messages(msg.topic, key)] == [res.wrote_offset]
        assert [m.physical_offset for m in store.query_messages(msg.topic, msg.unique_key)] == [res.wrote_offset]


def test_round_trip_with_rolling_and_reopen(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, SMALL, clock=StepClock()) as s:
        written = _fill(s, 90)
        _check_all(s, written)
        end = s.max_physical_offset
        assert s.min_physical_offset == 0
        last = written[-1][1]
        assert end == last.wrote_offset + last.wrote_bytes
        # grp-* keys: every message with the key, newest first
        grp = [r.wrote_offset for m, r in written if "grp-3" in m.keys.split()]
        assert [m.physical_offset for m in s.query_messages("TopicA", "grp-3")] == sorted(
            (r.wrote_offset for m, r in written if m.topic == "TopicA" and "grp-3" in m.keys.split()), reverse=True
        )
        assert sorted(s.query_offsets("TopicA", "grp-3") + s.query_offsets("TopicB", "grp-3")
                      + s.query_offsets("Topic-C", "grp-3")) == sorted(grp)
    files = cl_files(root)
    assert len(files) >= 4
    assert files == [f"{i * 4096:020d}" for i in range(len(files))]
    assert len(os.listdir(root / "index")) >= 3
    assert any(len(os.listdir(root / "consumequeue" / "TopicA" / str(q))) >= 2 for q in range(3))

    # every full file ends with a blank record right after its last record
    ends = {}
    for _msg, res in written:
        f = res.wrote_offset // 4096
        ends[f] = max(ends.get(f, 0), res.wrote_offset % 4096 + res.wrote_bytes)
    for f, end_pos in ends.items():
        if f == len(files) - 1:
            continue
        data = cl_bytes(root, files[f])
        assert struct.unpack_from(">ii", data, end_pos) == (4096 - end_pos, BLANK_MAGIC)
        assert not any(data[end_pos + 8 :])

    with MessageStore.open(root, SMALL, clock=StepClock(T0 + 10_000)) as s:
        assert s.recovery_report["stopped_because"] is None
        assert s.max_physical_offset == end
        _check_all(s, written)
        more = [(m, s.put_message(m)) for m in (Message("TopicA", b"again", queue_id=q) for q in range(3))]
        for m, r in more:
            before = sum(1 for mm, _ in written if (mm.topic, mm.queue_id) == ("TopicA", m.queue_id))
            assert r.queue_offset == before
        assert more[0][1].wrote_offset == end
        _check_all(s, written + more)
    with MessageStore.open(root, read_only=True) as s:
        _check_all(s, written + more)
        assert [m.physical_offset for m in s.iter_messages()] == [r.wrote_offset for _, r in written + more]


def test_iter_messages_from_offset(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        written = _fill(s, 30, seed=3)
        offs = [r.wrote_offset for _, r in written]
        assert [m.physical_offset for m in s.iter_messages(offs[10])] == offs[10:]
        assert list(s.iter_messages(s.max_physical_offset)) == []


# --- file rolling at the exact boundary ----------------------------------------------------


def test_record_leaving_exactly_eight_bytes_then_one_byte_too_big(tmp_path):
    # topic "T8" (2 bytes), no properties: size = 93 + body
    assert rec_size(1, 2, 0) == 94
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        r1 = s.put_message(Message("T8", b"a" * (4088 - 93)))
        assert (r1.wrote_offset, r1.wrote_bytes) == (0, 4088)  # leaves exactly 8 bytes
        r2 = s.put_message(Message("T8", b"b"))
        assert r2.wrote_offset == 4096  # 94 + 8 > 8: next file
        # second file: fill to leave `free` bytes, then a record of free - 7 bytes
        r3 = s.put_message(Message("T8", b"c" * 1000))
        used = 94 + r3.wrote_bytes
        free = 4096 - used
        r4 = s.put_message(Message("T8", b"d" * (free - 7 - 93)))
        assert r4.wrote_bytes == free - 7
        assert r4.wrote_offset == 8192
        r5 = s.put_message(Message("T8", b"e" * (4096 - r4.wrote_bytes - 8 - 93)))
        assert r5.wrote_offset == 8192 + r4.wrote_bytes  # fits exactly with 8 to spare
        r6 = s.put_message(Message("T8", b"f"))
        assert r6.wrote_offset == 3 * 4096
        assert [r.queue_offset for r in (r1, r2, r3, r4, r5, r6)] == list(range(6))
        msgs = list(s.iter_messages())
        assert [m.body[:1] for m in msgs] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    f0, f1, f2 = (cl_bytes(tmp_path, n) for n in cl_files(tmp_path)[:3])
    with MessageStore.open(tmp_path, SMALL) as s:
        assert s.recovery_report["stopped_because"] is None
        assert s.max_physical_offset == r6.wrote_offset + r6.wrote_bytes
        assert [m.body[:1] for m in s.iter_messages()] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert f0[4088:4096].hex() == "00000008cbd43194"
    assert struct.unpack_from(">ii", f1, used) == (free, BLANK_MAGIC)
    assert not any(f1[used + 8 :])
    assert f2[4088:4096].hex() == "00000008cbd43194"
    assert struct.unpack_from(">ii", f0, 0) == (4088, V1_MAGIC)


def test_reopen_when_last_file_has_exactly_eight_bytes_left(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        r1 = s.put_message(Message("T8", b"a" * (4088 - 93)))
    assert cl_files(tmp_path) == ["0" * 20]
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0 + 10)) as s:
        assert s.recovery_report["stopped_because"] is None
        assert s.max_physical_offset == 4088
        r2 = s.put_message(Message("T8", b"b"))
        assert (r2.wrote_offset, r2.queue_offset) == (4096, 1)
    assert cl_bytes(tmp_path, "0" * 20)[4088:].hex() == "00000008cbd43194"
    with MessageStore.open(tmp_path, read_only=True) as s:
        assert [m.physical_offset for m in s.iter_messages()] == [r1.wrote_offset, r2.wrote_offset]


# --- hosts, ids, magic versions ------------------------------------------------------------


def test_ipv6_hosts_and_long_topics(tmp_path):
    with MessageStore.open(tmp_path, SMALL, store_host="[fe80::1]:10911", clock=StepClock()) as s:
        r = s.put_message(Message("T6", b"A", born_host="[2001:db8::7]:52013"))
        m = s.get_message(r.wrote_offset)
        assert m.sys_flag & 0x30 == 0x30
        assert m.born_host == "[2001:db8:0:0:0:0:0:7]:52013"
        assert m.store_host == "[fe80:0:0:0:0:0:0:1]:10911"
        assert m.store_size == rec_size(1, 2, 0, True, True) == 118
        assert len(r.msg_id) == 56 and re.fullmatch(r"[0-9A-F]{56}", r.msg_id)
        assert r.msg_id == "FE80000000000000000000000000000100002A9F" + f"{r.wrote_offset:016X}"
        assert s.look_message_by_msg_id(r.msg_id).physical_offset == r.wrote_offset
        # IPv4 born host on an IPv6 store: only the store bit
        r = s.put_message(Message("T6", b"B", born_host="10.0.0.1:1"))
        assert s.get_message(r.wrote_offset).sys_flag & 0x30 == 0x20
        # a caller's v6 bits are ignored and recomputed
        r = s.put_message(Message("T6", b"C", born_host="10.0.0.1:1", store_host="10.0.0.2:2", sys_flag=0x30))
        m = s.get_message(r.wrote_offset)
        assert m.sys_flag & 0x30 == 0 and m.store_host == "10.0.0.2:2"
        assert len(m.msg_id) == 32

        long_topic = "%RETRY%" + "G" * 130
        r = s.put_message(Message(long_topic, b"retry-body", reconsume_times=1))
        m = s.get_message(r.wrote_offset)
        assert m.magic_code == V2_MAGIC == -626843477
        assert m.topic == long_topic
        t127 = "T" * 127
        r127 = s.put_message(Message(t127, b"x"))
        assert s.get_message(r127.wrote_offset).magic_code == V1_MAGIC
        # 64 two-byte chars: 64 chars but 128 UTF-8 bytes -> v2 (decided on bytes)
        t_utf8 = "é" * 64
        ru = s.put_message(Message(t_utf8, b"x"))
        assert s.get_message(ru.wrote_offset).magic_code == V2_MAGIC
        assert s.get_messages(long_topic, 0, 0).messages[0].body == b"retry-body"
        assert s.get_messages(t_utf8, 0, 0).messages[0].topic == t_utf8
        lt = r
    # raw bytes: 2-byte topic length right after the body
    data = b"".join(cl_bytes(tmp_path, n) for n in cl_files(tmp_path))
    start = lt.wrote_offset
    body_len_pos = start + 84 + 12 + 12  # store host is IPv6; born host defaults to it
    assert struct.unpack_from(">i", data, body_len_pos)[0] == 10
    assert data[body_len_pos + 4 + 10 : body_len_pos + 4 + 12] == b"\x00\x89"
    assert struct.unpack_from(">i", data, r127.wrote_offset + 4)[0] == V1_MAGIC


# --- docs/format.md byte vectors through the public API ---------------------------------------


def test_spec_vector_r2_ipv6_record(tmp_path):
    want = bytes.fromhex(
        "00000076daa320a753d99e8b000000000000000000000000000000000000000000000000000000300000000000000001"
        "00000000000000000000000000000001 00000001 0000000000000002 fe800000000000000000000000000001 00002a9f"
        "00000000 0000000000000000 00000001 41 02 5436 0000".replace(" ", "")
    )
    with MessageStore.open(tmp_path, SMALL, store_host="[fe80::1]:10911", clock=ListClock([2])) as s:
        r = s.put_message(Message("T6", b"A", born_timestamp=1, born_host="[::1]:1"))
        assert r.msg_id == "FE80000000000000000000000000000100002A9F0000000000000000"
    data = cl_bytes(tmp_path, cl_files(tmp_path)[0])
    assert data[: len(want)] == want
    assert not any(data[len(want) :])


def test_spec_vector_r4_crc_property(tmp_path):
    want = bytes.fromhex(
        "000000b4daa320a70d6cfbdc000000010000000000000000000000000000000000000000000000000000018bcfe56800c0a8010a0000d431"
        "0000018bcfe5687b0a00000100002a9f000000000000000000000000000000086372632d626f647909546f706963546573740048544147530154"
        "61674102554e49515f4b4559014330413830313041313039323142364433353836303532363543303030303033025f5f43524333322301363239"
        "3135323339393002"
    )
    cfg = SMALL.replace(enabled_append_prop_crc=True)
    with MessageStore.open(tmp_path, cfg, store_host="10.0.0.1:10911", clock=ListClock([1700000000123])) as s:
        s.put_message(Message("TopicTest", b"crc-body", queue_id=1, born_timestamp=1700000000000,
                              born_host="192.168.1.10:54321",
                              properties={"TAGS": "TagA", "UNIQ_KEY": "C0A8010A10921B6D358605265C000003"}))
    assert cl_bytes(tmp_path, cl_files(tmp_path)[0])[: len(want) + 8] == want + bytes(8)


def test_spec_vector_r3_v2_record(tmp_path):
    topic = "%RETRY%" + "G" * 130
    with MessageStore.open(tmp_path, SMALL.replace(mapped_file_size_commit_log=8192), store_host="10.0.0.1:10911",
                           clock=StepClock(1700000000123)) as s:
        s.put_message(Message("filler", b"f" * (2048 - 91 - 6)))
        r = s.put_message(Message(topic, b"retry-body", reconsume_times=1, born_timestamp=1700000000000,
                                  born_host="192.168.1.10:54321", tags="TagA",
                                  unique_key="C0A8010A10921B6D358605265C000002"))
        assert (r.wrote_offset, r.wrote_bytes) == (2048, 291)
    data = cl_bytes(tmp_path, cl_files(tmp_path)[0])
    assert data[2048 : 2048 + 12].hex() == "00000123daa320ab3bbfc442"
    assert data[2048 + 88 + 10 : 2048 + 88 + 12].hex() == "0089"


# --- transactions ---------------------------------------------------------------------------


def test_transaction_records(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        r0 = s.put_message(Message("Tx", b"plain", keys="k-plain"))
        rp = s.put_message(Message("Tx", b"half", keys="k-prep", sys_flag=4))
        assert rp.queue_offset == 0
        assert s.get_max_offset_in_queue("Tx", 0) == 1
        assert s.query_offsets("Tx", "k-prep") == [rp.wrote_offset]
        assert [m.body for m in s.query_messages("Tx", "k-prep")] == [b"half"]
        rr = s.put_message(Message("Tx", b"rolled back", keys="k-rb", sys_flag=12,
                                   prepared_transaction_offset=rp.wrote_offset))
        assert rr.queue_offset == 0
        assert s.get_max_offset_in_queue("Tx", 0) == 1
        assert s.query_offsets("Tx", "k-rb") == []
        rc = s.put_message(Message("Tx", b"committed", keys="k-commit", sys_flag=8,
                                   prepared_transaction_offset=rp.wrote_offset))
        assert rc.queue_offset == 1
        assert s.get_max_offset_in_queue("Tx", 0) == 2
        assert s.query_offsets("Tx", "k-commit") == [rc.wrote_offset]
        got = s.get_messages("Tx", 0, 0).messages
        assert [m.physical_offset for m in got] == [r0.wrote_offset, rc.wrote_offset]
        assert got[1].prepared_transaction_offset == rp.wrote_offset
        assert got[1].transaction_type == 8
        assert s.get_message(rp.wrote_offset).queue_offset == 0
        assert s.get_message(rr.wrote_offset).transaction_type == 12
        # a prepared message in a queue that has no unit yet creates no queue
        s.put_message(Message("TxOnly", b"half", sys_flag=4))
        assert s.consume_queue("TxOnly", 0) is None
        assert s.get_messages("TxOnly", 0, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0 + 5000)) as s:
        assert s.get_max_offset_in_queue("Tx", 0) == 2
        assert s.put_message(Message("Tx", b"next")).queue_offset == 2


# --- tags codes and delay levels ----------------------------------------------------------------


@pytest.mark.parametrize(
    "delay,tags,expect",
    [
        ("1", "TagA", lambda ts: ts + 1000),
        ("3", None, lambda ts: ts + 10000),
        ("18", "TagA", lambda ts: ts + 7200000),
        ("19", "TagA", lambda ts: ts + 7200000),
        ("99", None, lambda ts: ts + 7200000),
        ("0", "TagA", lambda ts: java_hash("TagA")),
        ("-2", None, lambda ts: 0),
        ("abc", "TagA", lambda ts: java_hash("TagA")),
        ("abc", None, lambda ts: 0),
        ("", "TagB", lambda ts: java_hash("TagB")),
    ],
)
def test_schedule_topic_tags_code(tmp_path, delay, tags, expect):
    props = {"REAL_TOPIC": "TopicTest", "REAL_QID": "0"}
    if delay:
        props["DELAY"] = delay
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0 + 123)) as s:
        r = s.put_message(Message("SCHEDULE_TOPIC_XXXX", b"later", queue_id=2, tags=tags, properties=props))
        assert r.status is PutMessageStatus.PUT_OK
        unit = s.consume_queue("SCHEDULE_TOPIC_XXXX", 2).get_unit(0)
        assert unit == (r.wrote_offset, r.wrote_bytes, expect(r.store_timestamp))
        # outside the schedule topic a DELAY above 0 moves the message there
        # (docs/service.md#delayed-delivery), one of 0 or below stays, and one
        # Java cannot parse is refused, as the broker refuses the send
        plain = Message("Plain", b"x", tags=tags, properties={"DELAY": delay})
        if delay in ("abc", ""):
            with pytest.raises(rmqstore.IllegalMessageError, match="DELAY"):
                s.put_message(plain)
            plain.properties = None
        r2 = s.put_message(plain)
        m2 = s.get_message(r2.wrote_offset)
        if plain.properties and int(delay) > 0:
            level = min(int(delay), 18)
            assert (m2.topic, m2.queue_id) == ("SCHEDULE_TOPIC_XXXX", level - 1)
            assert m2.properties["DELAY"] == str(level)
            assert (m2.properties["REAL_TOPIC"], m2.properties["REAL_QID"]) == ("Plain", "0")
            assert s.get_max_offset_in_queue("Plain", 0) == 0
        else:
            assert m2.topic == "Plain" and "REAL_TOPIC" not in m2.properties
            assert s.consume_queue("Plain", 0).get_unit(0)[2] == (java_hash(tags) if tags else 0)
        r3 = s.put_message(Message("SCHEDULE_TOPIC_XXXX", b"after", queue_id=2))
        assert r3.queue_offset == 1 + (delay == "3")  # (level 3 is queue 2: the Plain message's too)
    # the record stays readable and dispatchable after a restart
    with MessageStore.open(tmp_path, SMALL) as s:
        assert s.recovery_report["stopped_because"] is None
        assert s.get_max_offset_in_queue("SCHEDULE_TOPIC_XXXX", 2) == 2 + (delay == "3")
        assert s.get_message(r.wrote_offset).properties.get("DELAY") == (delay or None)
        assert s.get_message(r2.wrote_offset) is not None


@pytest.mark.parametrize("delay", [" 3", "3 ", "1_0"])
def test_delay_values_java_rejects(tmp_path, delay):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0)) as s:
        s.put_message(Message("SCHEDULE_TOPIC_XXXX", b"x", queue_id=2, tags="TagA", properties={"DELAY": delay}))
        assert s.consume_queue("SCHEDULE_TOPIC_XXXX", 2).get_unit(0)[2] == java_hash("TagA")


def test_delay_table_values():
    cfg = StoreConfig()
    assert cfg.max_delay_level == 18
    assert [cfg.delay_millis(i) for i in range(1, 19)] == [DELAY_LEVEL_MS[i] for i in range(1, 19)]
    custom = StoreConfig(message_delay_level="1s 2m 3h 1d")
    assert [custom.delay_millis(i) for i in range(1, 5)] == [1000, 120000, 10800000, 86400000]
    with pytest.raises(ConfigError):
        StoreConfig(message_delay_level="1s 5x")


def test_tags_code_negative_hash(tmp_path):
    tag = "TopicTest#key1"
    assert java_hash(tag) == -1655984460
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        r = s.put_message(Message("T", b"x", tags=tag))
        assert s.consume_queue("T", 0).get_unit(0)[2] == -1655984460
        s.put_message(Message("T", b"y", tags="标签"))
        assert s.consume_queue("T", 0).get_unit(1)[2] == 857175
        s.put_message(Message("T", b"z", tags="😀"))
        assert s.consume_queue("T", 0).get_unit(2)[2] == java_hash("😀")
        assert [m.physical_offset for m in s.get_messages("T", 0, 0, tags=tag).messages] == [r.wrote_offset]
        assert [m.tags for m in s.get_messages("T", 0, 0, tags="😀").messages] == ["😀"]
    with open(os.path.join(tmp_path, "consumequeue", "T", "0", "0" * 20), "rb") as fh:
        unit = fh.read(20)
    assert unit[12:].hex() == "ffffffff9d4baeb4"


# --- CRC32 property ---------------------------------------------------------------------------


def test_append_prop_crc(tmp_path):
    cfg = SMALL.replace(enabled_append_prop_crc=True)
    with MessageStore.open(tmp_path, cfg, clock=StepClock()) as s:
        results = [
            s.put_message(Message("Crc", b"crc-body", tags="TagA", unique_key="U1")),
            s.put_message(Message("Crc", b"")),  # no properties at all
            s.put_message(Message("Crc", b"x" * 300, properties={"__CRC32#": "0000000000", "a": "b"})),
        ] + [s.put_message(Message("Crc", bytes([i]) * 500, keys=f"k{i}")) for i in range(20)]
        for r in results:
            m = s.get_message(r.wrote_offset)
            blob = m.properties_blob
            assert re.fullmatch(rb"(.*\x02)?__CRC32#\x01[0-9]{10}\x02", blob, re.S), blob
            assert blob.count(b"__CRC32#") == 1
    data = b"".join(cl_bytes(tmp_path, n) for n in cl_files(tmp_path))
    for r in results:
        rec = data[r.wrote_offset : r.wrote_offset + r.wrote_bytes]
        crc = zlib.crc32(rec[:-20]) & 0x7FFFFFFF
        assert rec[-20:] == b"__CRC32#\x01" + str(crc).zfill(10)[::-1].encode() + b"\x02"
    assert data[results[1].wrote_offset + results[1].wrote_bytes - 22 :][:2] == b"\x00\x14"  # props length 20
    with MessageStore.open(tmp_path, SMALL.replace(force_verify_prop_crc=True)) as s:
        assert s.recovery_report["stopped_because"] is None
        assert [m.physical_offset for m in s.iter_messages()] == [r.wrote_offset for r in results]
        assert s.get_max_offset_in_queue("Crc", 0) == len(results)
        assert s.get_message(results[2].wrote_offset).properties["a"] == "b"


def test_prop_crc_detects_tampered_header(tmp_path):
    """With force_verify_prop_crc, a flipped FLAG byte (not covered by the body
    CRC) makes that record invalid: in a closed store's flushed data, the
    disk's damage, which a read-only open reads around."""
    cfg = SMALL.replace(enabled_append_prop_crc=True)
    with MessageStore.open(tmp_path, cfg, clock=StepClock()) as s:
        rs = [s.put_message(Message("Crc", b"body%d" % i)) for i in range(5)]
    path = os.path.join(tmp_path, "commitlog", cl_files(tmp_path)[0])
    data = bytearray(read_bytes(path))
    data[rs[3].wrote_offset + 19] ^= 0x01  # FLAG
    with open(path, "wb") as fh:
        fh.write(data)
    with MessageStore.open(tmp_path, read_only=True) as s:  # body CRC still fine
        assert s.recovery_report["stopped_because"] is None
        assert s.get_message(rs[3].wrote_offset).flag == 1
    with MessageStore.open(tmp_path, SMALL.replace(force_verify_prop_crc=True), read_only=True) as s:
        assert s.recovery_report["stopped_because"]
        assert [d["physical_offset"] for d in s.recovery_report["damage"]] == [rs[3].wrote_offset]
        assert s.max_physical_offset == rs[4].wrote_offset + rs[4].wrote_bytes


# --- batches ------------------------------------------------------------------------------------


def test_put_messages_batch(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        s.put_message(Message("B", b"first", queue_id=1))
        msgs = [Message("B", b"m%d" % i * 100, queue_id=1, keys=f"b{i}") for i in range(40)]
        msgs.insert(5, Message("B", b"other queue", queue_id=0))
        results = s.put_messages(iter(msgs))
        assert len(results) == len(msgs)
        q1 = [r for m, r in zip(msgs, results) if m.queue_id == 1]
        assert [r.queue_offset for r in q1] == list(range(1, 41))
        assert results[5].queue_offset == 0
        for m, r in zip(msgs, results):
            assert r.status is PutMessageStatus.PUT_OK
            got = s.get_message(r.wrote_offset)
            assert got.body == m.body and got.queue_id == m.queue_id
        offs = [r.wrote_offset for r in results]
        assert offs == sorted(offs)
        for a, b in itertools.pairwise(results):
            assert b.wrote_offset == a.wrote_offset + a.wrote_bytes or b.wrote_offset % 4096 == 0
        assert s.put_messages([]) == []


@pytest.mark.parametrize("how", ["put_messages", "put_message_columns"])
def test_a_first_batch_into_new_queues_prepares_one_message_per_queue(tmp_path, impl, monkeypatch, how):
    """A batch into a new store, over queues no put has made yet: only each
    queue's first message takes the step-by-step path (which makes the
    queue's file and binds it); the rest go through the kernel as checked,
    and the store holds what one put per message writes."""
    prepared = []
    real = MessageStore._prepare
    monkeypatch.setattr(MessageStore, "_prepare", lambda self, m: prepared.append(m) or real(self, m))
    topics = ("TopicA", "TopicB") if how == "put_messages" else ("TopicA",)
    msgs = [Message(topics[i % len(topics)], b"b%d" % i * 20, queue_id=i % 3, keys=f"k{i}") for i in range(60)]
    # files that take the whole batch (a file roll goes step by step too);
    # one store time, as put_message_columns stamps a call once
    cfg = SMALL.replace(mapped_file_size_commit_log=1 << 16, mapped_file_size_consume_queue=2000, max_index_num=256)
    with MessageStore.open(tmp_path / "batch", cfg, clock=lambda: T0) as s:
        if how == "put_messages":
            results = [(r.wrote_offset, r.wrote_bytes, r.queue_offset) for r in s.put_messages(msgs)]
        else:
            got = s.put_message_columns("TopicA", [m.body for m in msgs], [m.queue_id for m in msgs],
                                        keys=[m.keys for m in msgs])
            results = list(zip(got.physical_offsets.tolist(), got.sizes.tolist(), got.queue_offsets.tolist()))
    firsts = {}
    for m in msgs:
        firsts.setdefault((m.topic, m.queue_id), m)
    assert [(m.topic, m.queue_id, m.body) for m in prepared] == [(m.topic, m.queue_id, m.body) for m in firsts.values()]
    prepared.clear()
    with MessageStore.open(tmp_path / "one", cfg, clock=lambda: T0) as s:
        assert results == [(r.wrote_offset, r.wrote_bytes, r.queue_offset) for r in map(s.put_message, msgs)]
    for name in cl_files(tmp_path / "one"):
        assert cl_bytes(tmp_path / "batch", name) == cl_bytes(tmp_path / "one", name)
    for topic, qid in firsts:
        d = os.path.join("consumequeue", topic, str(qid))
        assert sorted(os.listdir(tmp_path / "batch" / d)) == sorted(os.listdir(tmp_path / "one" / d))
        for f in os.listdir(tmp_path / "one" / d):
            assert read_bytes(tmp_path / "batch" / d / f) == read_bytes(tmp_path / "one" / d / f)


@pytest.mark.parametrize("how", ["put_messages", "put_message_columns"])
@pytest.mark.parametrize("bad", ["topic", "size"])
def test_a_bad_message_in_a_first_batch_raises_before_anything_is_written(tmp_path, impl, bad, how):
    """New queues' messages are still validated before anything is
    written: the batch raises, the new store stays empty."""
    topic = "Topic/Bad" if bad == "topic" and how == "put_message_columns" else "TopicA"
    msgs = [Message(topic, b"ok", queue_id=i % 3) for i in range(10)]
    msgs.append(Message("Topic/Bad", b"x") if bad == "topic" else Message("TopicA", bytes(5000)))
    with MessageStore.open(tmp_path, SMALL) as s:
        with pytest.raises(rmqstore.IllegalMessageError if bad == "topic" else rmqstore.MessageTooLargeError):
            if how == "put_messages":
                s.put_messages(msgs)
            else:
                s.put_message_columns(topic, [m.body for m in msgs], [m.queue_id for m in msgs])
        assert s.max_physical_offset == 0 and s.get_messages("TopicA", 0, 0, 10).messages == []
    assert not os.path.exists(tmp_path / "consumequeue" / "TopicA")


def test_messages_with_hosts_store_what_the_step_by_step_path_stores(tmp_path, impl, monkeypatch):
    """Messages carrying their born / store hosts (a RocketMQ store's
    records copied, e.g. by the Spark writer) go through the kernel under
    ASYNC_FLUSH: byte-identical to SYNC_FLUSH's step-by-step path, read
    back with their hosts; a host put refuses still raises its error."""
    hosts = ["10.0.0.1:5000", "[2001:db8::1]:10911", None]
    msgs = [Message("T", b"m%d" % i, queue_id=i % 2, born_host=hosts[i % 3], store_host=hosts[(i + 1) % 3],
                    keys=f"k{i}") for i in range(30)]
    prepared = []
    real = MessageStore._prepare
    monkeypatch.setattr(MessageStore, "_prepare", lambda self, m: prepared.append(m) or real(self, m))
    for name, flush in (("fast", "ASYNC_FLUSH"), ("steps", "SYNC_FLUSH")):
        with MessageStore.open(tmp_path / name, SMALL.replace(flush_disk_type=flush), clock=lambda: T0) as s:
            results = s.put_messages(msgs[:15]) + [s.put_message(m) for m in msgs[15:]]
            assert [m.born_host_raw for m in s.get_messages("T", 1, 0, 15).messages] == \
                [encode_host(m.born_host or "127.0.0.1:10911") for m in msgs[1::2]]
            assert [r.msg_id for r in results] == [
                (encode_host(m.store_host or "127.0.0.1:10911") + struct.pack(">q", r.wrote_offset)).hex().upper()
                for m, r in zip(msgs, results)]
            if name == "fast":  # (each queue's first message, and each new file's, go step by step)
                assert len(prepared) < 10
    assert _files(tmp_path / "fast") == _files(tmp_path / "steps")
    with MessageStore.open(tmp_path / "fast", SMALL) as s:
        bad = Message("T", b"x", queue_id=0)
        bad.born_host = "not a host"
        with pytest.raises(rmqstore.IllegalMessageError):
            s.put_message(bad)
        with pytest.raises(rmqstore.IllegalMessageError):
            s.put_messages([msgs[0], bad])


def test_a_first_batch_raises_its_first_bad_messages_error(tmp_path, impl):
    """Bad messages in a batch into new queues raise in order: a body too
    large before a topic with no UTF-8 form (a lone surrogate), which is an
    IllegalMessageError however it is put."""
    msgs = [Message("TopicA", b"ok"), Message("TopicA", bytes(5000)), Message("Topic\ud800", b"x")]
    with MessageStore.open(tmp_path, SMALL) as s:
        with pytest.raises(rmqstore.MessageTooLargeError):
            s.put_messages(msgs)
        with pytest.raises(rmqstore.IllegalMessageError, match="surrogate"):
            s.put_messages(msgs[::2])
        with pytest.raises(rmqstore.IllegalMessageError, match="surrogate"):
            s.put_message(msgs[2])
        with pytest.raises(rmqstore.IllegalMessageError, match="surrogate"):
            s.put_message_columns("Topic\ud800", [b"x"])
        assert s.max_physical_offset == 0


# --- time search ----------------------------------------------------------------------------------


def _expected_lower(times, ts):
    for i, t in enumerate(times):
        if t >= ts:
            return i
    return len(times)


def _expected_upper(times, ts):
    best = 0
    for i, t in enumerate(times):
        if t <= ts:
            best = i
    return best


def test_offset_by_time_spec_vectors(tmp_path):
    times = [T0 + 100, T0 + 100, T0 + 100, T0 + 300, T0 + 300]
    with MessageStore.open(tmp_path, SMALL, clock=ListClock(times)) as s:
        for _ in times:
            s.put_message(Message("Time", b"t"))
        g = s.get_offset_in_queue_by_time
        for ts, lo, up in [(50, 0, 0), (100, 0, 2), (200, 3, 2), (300, 3, 4), (400, 5, 4)]:
            assert g("Time", 0, T0 + ts, "lower") == lo, ts
            assert g("Time", 0, T0 + ts, "upper") == up, ts
            assert g("Time", 0, T0 + ts, "LOWER") == lo
        assert g("Time", 0, 0) == 0
        assert g("Time", 0, 2**62, "lower") == s.get_max_offset_in_queue("Time", 0)


@settings(max_examples=scaled(20), deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.integers(1, 4), min_size=1, max_size=12),
       gaps=st.lists(st.integers(1, 3000), min_size=12, max_size=12))
def test_offset_by_time_equal_timestamps(tmp_path_factory, groups, gaps):
    """Several messages per store time, over several ConsumeQueue files (10
    units each): LOWER gives the first message of a time, UPPER the last."""
    times = []
    t = T0
    for n, gap in zip(groups, gaps):
        t += gap
        times += [t] * n
    root = tmp_path_factory.mktemp("bytime")
    with MessageStore.open(root, SMALL, clock=ListClock(times)) as s:
        s.put_messages([Message("Time", b"t%d" % i, queue_id=1) for i in range(len(times))])
        g = s.get_offset_in_queue_by_time
        probes = sorted(set(times) | {times[0] - 1, times[-1] + 1} | {x + 1 for x in times})
        for ts in probes:
            assert g("Time", 1, ts, "lower") == _expected_lower(times, ts), (times, ts)
            assert g("Time", 1, ts, "upper") == _expected_upper(times, ts), (times, ts)
        assert g("Time", 1, times[0] - 1, "upper") == 0
        assert g("Time", 1, times[-1] + 1, "lower") == len(times) == s.get_max_offset_in_queue("Time", 1)


# --- key index ------------------------------------------------------------------------------------


def test_query_messages_filters_hash_collisions(tmp_path):
    assert java_hash("Aa") == java_hash("BB")
    assert java_hash("Coll#Aa") == java_hash("Coll#BB")
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        ra = s.put_message(Message("Coll", b"a", keys="Aa"))
        rb = s.put_message(Message("Coll", b"b", keys="BB"))
        rc = s.put_message(Message("Other", b"c", keys="Aa"))
        assert s.query_offsets("Coll", "Aa") == [rb.wrote_offset, ra.wrote_offset]
        assert [m.physical_offset for m in s.query_messages("Coll", "Aa")] == [ra.wrote_offset]
        assert [m.physical_offset for m in s.query_messages("Coll", "BB")] == [rb.wrote_offset]
        assert [m.physical_offset for m in s.query_messages("Other", "Aa")] == [rc.wrote_offset]
        assert s.query_messages("Coll", "Cc") == []
        assert s.query_offsets("Coll", "Aa", max_count=1) == [rb.wrote_offset]
        # the collision takes no place of max_count (docs/recovery.md#lookups-by-key)
        assert [m.physical_offset for m in s.query_messages("Coll", "Aa", max_count=1)] == [ra.wrote_offset]


def test_query_messages_topic_with_hash_sign(tmp_path):
    """Index keys are topic#key, so topic "a#b" with key "c" and topic "a" with
    key "b#c" share one index key; query_messages tells them apart (docs/recovery.md#pitfall-index-hash-collisions)."""
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        r1 = s.put_message(Message("a#b", b"1", keys="c"))
        r2 = s.put_message(Message("a", b"2", keys="b#c"))
        assert s.query_offsets("a", "b#c") == [r2.wrote_offset, r1.wrote_offset]
        assert [m.physical_offset for m in s.query_messages("a", "b#c")] == [r2.wrote_offset]
        assert [m.physical_offset for m in s.query_messages("a#b", "c")] == [r1.wrote_offset]


def test_query_time_range_and_keys_with_spaces(tmp_path):
    clock = StepClock(T0, step=2000)
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        rs = [s.put_message(Message("K", b"%d" % i, keys=f"  shared   k{i} ")) for i in range(10)]
        assert [m.physical_offset for m in s.query_messages("K", "shared")] == [r.wrote_offset for r in rs][::-1]
        assert [m.physical_offset for m in s.query_messages("K", "k4")] == [rs[4].wrote_offset]
        assert s.query_offsets("K", "") == []
        got = s.query_offsets("K", "shared", 64, rs[2].store_timestamp - 1000, rs[5].store_timestamp)
        assert set(got) >= {rs[3].wrote_offset, rs[4].wrote_offset, rs[5].wrote_offset}
        assert all(rs[1].wrote_offset < g <= rs[5].wrote_offset for g in got)
        assert len(s.query_offsets("K", "shared", max_count=3)) == 3
        with pytest.raises(TypeError):
            s.query_offsets("K", 5)


def test_index_disabled(tmp_path):
    with MessageStore.open(tmp_path, SMALL.replace(message_index_enable=False), clock=StepClock()) as s:
        s.put_message(Message("K", b"x", keys="k1"))
        assert s.query_offsets("K", "k1") == []
        assert s.get_messages("K", 0, 0).messages[0].keys == "k1"


# --- msg ids ---------------------------------------------------------------------------------------


def test_look_message_by_msg_id(tmp_path):
    with MessageStore.open(tmp_path, SMALL, store_host="10.0.0.1:10911", clock=StepClock()) as s:
        rs = [s.put_message(Message("Id", b"x%d" % i)) for i in range(3)]
        for r in rs:
            assert r.msg_id == "0A00000100002A9F" + f"{r.wrote_offset:016X}"
            assert s.look_message_by_msg_id(r.msg_id).physical_offset == r.wrote_offset
        good = rs[1].msg_id
        spaced = " ".join(good[i : i + 2] for i in range(0, 32, 2)).ljust(56)  # 56 characters, good's 16 bytes
        for bad in ["", "zz", good[:-1], "G" * 32, good + "00", None, 12345, "0A00000100002A9F" + "F" * 16, spaced]:
            assert s.look_message_by_msg_id(bad) is None, bad
        assert decode_offset_msg_id(good.lower()) == ("10.0.0.1:10911", rs[1].wrote_offset)
        for bad in ["zz", good[:-1], "G" * 32, spaced, None]:
            with pytest.raises(ValueError):
                decode_offset_msg_id(bad)
        other_host = "0A00000200002A9F" + good[16:]
        assert s.look_message_by_msg_id(other_host) is None
        other_port = "0A00000100002AA0" + good[16:]
        assert s.look_message_by_msg_id(other_port) is None
        mid_record = good[:16] + f"{rs[1].wrote_offset + 1:016X}"
        assert s.look_message_by_msg_id(mid_record) is None
        beyond = good[:16] + f"{s.max_physical_offset:016X}"
        assert s.look_message_by_msg_id(beyond) is None


def test_new_unique_key():
    keys = [rmqstore.new_unique_key() for _ in range(2000)]
    assert len(set(keys)) == len(keys)
    for k in keys[:50]:
        assert re.fullmatch(r"[0-9A-F]{32}", k)
    # pid field (bytes 4-5) is this process's pid truncated to 16 bits
    assert int(keys[0][8:12], 16) == os.getpid() & 0xFFFF


def test_implementation_flag():
    assert rmqstore.IMPLEMENTATION in ("cython", "python")
    if not env_pure_python():
        pytest.skip("RMQSTORE_PURE_PYTHON is not set")
    assert rmqstore.IMPLEMENTATION == "python"


# --- lifecycle --------------------------------------------------------------------------------------


def test_lifecycle(tmp_path):
    s = MessageStore.open(tmp_path, SMALL, clock=StepClock())
    try:
        assert (tmp_path / "abort").exists()
        assert (tmp_path / "abort").read_text() == str(os.getpid())
        assert read_bytes(tmp_path / "lock") == b"lock"
        r = s.put_message(Message("L", b"x", keys="lk"))
        s.flush()
        with pytest.raises(StoreLockedError) as ei:
            MessageStore.open(tmp_path, SMALL)
        assert isinstance(ei.value, BlockingIOError)
        # a reader beside the writer
        with MessageStore.open(tmp_path, read_only=True) as ro:
            assert ro.get_message(r.wrote_offset).body == b"x"
            assert ro.get_messages("L", 0, 0).messages[0].body == b"x"
            with pytest.raises(StoreReadOnlyError) as ei:
                ro.put_message(Message("L", b"y"))
            assert isinstance(ei.value, PermissionError)
            with pytest.raises(StoreReadOnlyError):
                ro.put_messages([Message("L", b"y")])
            ro.flush()  # a no-op, not an error
        assert s.put_message(Message("L", b"y")).queue_offset == 1
    finally:
        s.close()
    assert s.closed
    assert not (tmp_path / "abort").exists()
    s.close()  # idempotent
    for call in (
        lambda: s.put_message(Message("L", b"z")),
        lambda: s.put_messages([Message("L", b"z")]),
        lambda: s.get_message(0),
        lambda: s.get_messages("L", 0, 0),
        lambda: list(s.iter_messages()),
        lambda: s.query_offsets("L", "lk"),
        lambda: s.look_message_by_msg_id(r.msg_id),
        lambda: s.get_max_offset_in_queue("L", 0),
        lambda: s.get_offset_in_queue_by_time("L", 0, 0),
        s.flush,
    ):
        with pytest.raises(StoreClosedError) as ei:
            call()
        assert isinstance(ei.value, ValueError)
    # the lock is released: reopening works, twice in a row
    with MessageStore.open(tmp_path, SMALL) as s2:
        assert s2.get_max_offset_in_queue("L", 0) == 2
        assert (tmp_path / "abort").exists()
    with MessageStore.open(tmp_path, SMALL) as s3:
        assert [m.body for m in s3.query_messages("L", "lk")] == [b"x"]
    assert "closed" in repr(s3)


def test_read_only_open_does_not_write(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        s.put_message(Message("R", b"x"))
    before = {p: read_bytes(p) for p in tmp_path.rglob("*") if p.is_file()}
    with MessageStore.open(tmp_path, read_only=True) as s:
        assert s.read_only
        assert len(list(s.iter_messages())) == 1
        assert not (tmp_path / "abort").exists()
    after = {p: read_bytes(p) for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before
    with pytest.raises(FileNotFoundError):
        MessageStore.open(tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()


def test_lock_excludes_other_process(tmp_path):
    with MessageStore.open(tmp_path, SMALL):
        code = (
            "import sys, rmqstore\n"
            "try:\n"
            "    rmqstore.MessageStore.open(sys.argv[1])\n"
            "except rmqstore.StoreLockedError:\n"
            "    sys.exit(7)\n"
            "sys.exit(0)\n"
        )
        env = dict(os.environ)
        src = os.path.dirname(os.path.dirname(rmqstore.__file__))
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
        res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, timeout=60)
        assert res.returncode == 7, res.stderr.decode()


def test_unclean_shutdown_recovers(tmp_path):
    """An ``abort`` file left behind means a crash: abnormal recovery re-dispatches
    and nothing is duplicated or lost."""
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        written = _fill(s, 40, seed=5)
    (tmp_path / "abort").write_text("12345")
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0 + 100_000)) as s:
        assert s.last_exit_ok is False
        assert s.recovery_report["stopped_because"] is None
        _check_all(s, written)
        for msg, _res in written[::5]:
            assert len(s.query_messages(msg.topic, msg.keys.split()[0])) == 1
    assert not (tmp_path / "abort").exists()


def test_lost_consume_queues_are_rebuilt(tmp_path):
    """Recovery dispatches what the ConsumeQueues miss (here: all of them)."""
    import shutil

    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        written = _fill(s, 40, seed=6)
    shutil.rmtree(tmp_path / "consumequeue")
    with MessageStore.open(tmp_path, SMALL, clock=StepClock(T0 + 100_000)) as s:
        _check_all(s, written)


def test_concurrent_puts_keep_queue_offsets_dense(tmp_path):
    import threading

    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        results = {}

        def work(t):
            results[t] = [s.put_message(Message("Conc", b"%d-%d" % (t, i), queue_id=t % 2, keys=f"t{t}"))
                          for i in range(40)]

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for qid in (0, 1):
            offs = sorted(r.queue_offset for t in results if t % 2 == qid for r in results[t])
            assert offs == list(range(80))
            got = s.get_messages("Conc", qid, 0, max_count=100).messages
            assert len(got) == 80
        phys = sorted(r.wrote_offset for rs in results.values() for r in rs)
        assert [m.physical_offset for m in s.iter_messages()] == phys
        for t in range(4):
            assert len(s.query_messages("Conc", f"t{t}")) == 40


def test_defaults_filled_by_the_store(tmp_path):
    with MessageStore.open(tmp_path, SMALL, store_host="10.1.2.3:4567", clock=ListClock([T0 + 5])) as s:
        r = s.put_message(Message("D", b""))
        m = s.get_message(r.wrote_offset)
        assert m.born_timestamp == m.store_timestamp == T0 + 5
        assert m.born_host == m.store_host == "10.1.2.3:4567"
        assert m.body == b"" and m.body_crc == 0 and m.properties_blob == b"" and m.properties == {}
        assert m.store_size == 91 + 1
        assert (m.tags, m.keys, m.unique_key) == (None, None, None)
        assert s.consume_queue("D", 0).get_unit(0) == (r.wrote_offset, 92, 0)


@pytest.mark.parametrize("change", [
    {"mapped_file_size_commit_log": 8192},
    {"mapped_file_size_consume_queue": 400},
    {"max_hash_slot_num": 17},
], ids=["commitlog", "consumequeue", "index"])
def test_config_disagreeing_with_files(tmp_path, change):
    with MessageStore.open(tmp_path, SMALL, clock=StepClock()) as s:
        s.put_message(Message("T", b"x", keys="k"))
    with pytest.raises(ConfigError):
        MessageStore.open(tmp_path, SMALL.replace(**change)).close()


def test_crash_with_lost_consume_queue_pages(tmp_path):
    """Power loss after the CommitLog pages reached the disk but the newest
    ConsumeQueue pages did not: abnormal recovery (abort file present) starts
    from the checkpoint's safe point and rebuilds the lost units."""
    import shutil

    clock = StepClock(T0, step=1000)
    root = tmp_path / "s"
    with MessageStore.open(root, SMALL, clock=clock) as s:
        first = [s.put_message(Message("PL", b"a%d" % i * 40, queue_id=i % 2, keys=f"pl{i}")) for i in range(30)]
    s = MessageStore.open(root, SMALL, clock=clock)
    try:
        second = [s.put_message(Message("PL", b"b%d" % i * 40, queue_id=i % 2, keys=f"pl{i}")) for i in range(30, 60)]
        crash = tmp_path / "crash"
        shutil.copytree(root, crash)  # abort present, checkpoint as of the first close
    finally:
        s.close()
    assert (crash / "abort").exists()
    kept = {0: 15, 1: 15}  # units of the first session survive
    for qid, n in kept.items():
        qdir = crash / "consumequeue" / "PL" / str(qid)
        for f in sorted(qdir.iterdir()):
            start = int(f.name)
            data = bytearray(read_bytes(f))
            cut = max(0, n * 20 - start)
            if cut >= len(data):
                continue
            if cut == 0 and start > 0:
                f.unlink()
                continue
            data[cut:] = bytes(len(data) - cut)
            f.write_bytes(bytes(data))
    with MessageStore.open(crash, read_only=True) as s:  # the damage is real
        assert [s.get_max_offset_in_queue("PL", q) for q in (0, 1)] == [15, 15]
    with MessageStore.open(crash, SMALL, clock=StepClock(T0 + 10**6)) as s:
        assert s.last_exit_ok is False
        for qid in (0, 1):
            want = [r.wrote_offset for i, r in enumerate(first + second) if i % 2 == qid]
            assert s.get_max_offset_in_queue("PL", qid) == 30
            got = s.get_messages("PL", qid, 0, max_count=64).messages
            assert [m.physical_offset for m in got] == want
            assert [m.queue_offset for m in got] == list(range(30))
        for i, r in enumerate(first + second):
            assert [m.physical_offset for m in s.query_messages("PL", f"pl{i}")] == [r.wrote_offset]
        assert s.put_message(Message("PL", b"next", queue_id=0)).queue_offset == 30


# --- configuration -------------------------------------------------------------------------------


def test_config_from_dict_and_properties(tmp_path):
    a = StoreConfig.from_dict({"mappedFileSizeCommitLog": 65536, "maxHashSlotNum": 100, "flushDiskType": "SYNC_FLUSH"})
    b = StoreConfig.from_dict(
        {"mapped_file_size_commit_log": 65536, "max_hash_slot_num": 100, "flush_disk_type": "SYNC_FLUSH"})
    assert a == b
    assert a.mapped_file_size_commit_log == 65536 and a.max_hash_slot_num == 100
    assert a.flush_disk_type == rmqstore.SYNC_FLUSH
    assert StoreConfig.from_dict({"enabledAppendPropCRC": "true"}).enabled_append_prop_crc is True
    with pytest.raises(ConfigError) as ei:
        StoreConfig.from_dict({"noSuchSetting": 1})
    assert isinstance(ei.value, ValueError)
    assert StoreConfig.from_dict({"noSuchSetting": 1, "maxIndexNum": 10}, strict=False).max_index_num == 10
    assert StoreConfig(mapped_file_size_consume_queue=1001).mapped_file_size_consume_queue == 1020
    assert StoreConfig(mapped_file_size_consume_queue=1000).mapped_file_size_consume_queue == 1000
    # a service's sizes by default; a broker's one call away
    assert StoreConfig().mapped_file_size_commit_log == 4 * 1024 * 1024 + 128 * 1024
    assert StoreConfig().mapped_file_size_consume_queue == 400_000
    assert StoreConfig().index_file_size == 1_680_040
    broker = StoreConfig.broker_defaults()
    assert broker.mapped_file_size_commit_log == 1 << 30 and broker.mapped_file_size_consume_queue == 6_000_000
    assert broker.index_file_size == 420_000_040
    assert StoreConfig.broker_defaults(flush_disk_type="SYNC_FLUSH").flush_disk_type == "SYNC_FLUSH"
    other = {f: v for f, v in broker.to_dict().items() if v != StoreConfig().to_dict()[f]}
    assert set(other) == {"mapped_file_size_commit_log", "mapped_file_size_consume_queue", "max_hash_slot_num",
                          "max_index_num"}  # only the file sizes differ
    for bad in (
        {"mapped_file_size_commit_log": "abc"},
        {"mapped_file_size_commit_log": 100},
        {"enabled_append_prop_crc": "maybe"},
        {"flush_disk_type": "SOMETIMES"},
        {"max_index_num": 1},
        {"mapped_file_size_consume_queue": 0},
        {"max_message_size": 0},
    ):
        with pytest.raises(ConfigError):
            StoreConfig.from_dict(bad)
    with pytest.raises(ConfigError):
        StoreConfig(max_hash_slot_num=True)
    props = tmp_path / "broker.properties"
    props.write_text(
        "# broker config\n"
        "brokerClusterName=DefaultCluster\n"
        "brokerName = broker-a\n"
        "! another comment\n"
        "\n"
        "mappedFileSizeCommitLog=65536\n"
        "mappedFileSizeConsumeQueue=1001\n"
        "maxHashSlotNum:100\n"
        "flushDiskType=SYNC_FLUSH\n"
        "messageIndexEnable=false\n"
        "storePathRootDir=/data/rocketmq/store\n",
        encoding="utf-8",
    )
    c = StoreConfig.from_properties(props)
    assert c.mapped_file_size_commit_log == 65536
    assert c.mapped_file_size_consume_queue == 1020
    assert c.max_hash_slot_num == 100
    assert c.max_index_num == 20_000_000  # not named: the broker reading the file has its default
    assert c.flush_disk_type == "SYNC_FLUSH"
    assert c.message_index_enable is False
    assert c.to_dict()["max_hash_slot_num"] == 100
    # open() accepts a dict with camelCase names
    camel = {"mappedFileSizeCommitLog": 4096, "maxIndexNum": 32, "maxHashSlotNum": 16}
    with MessageStore.open(tmp_path / "s", camel) as s:
        assert s.config.mapped_file_size_commit_log == 4096
        s.put_message(Message("C", b"x"))
    assert os.path.getsize(tmp_path / "s" / "commitlog" / ("0" * 20)) == 4096
    with pytest.raises(ConfigError):
        MessageStore.open(tmp_path / "s2", config=42)


def test_config_check_crc_on_recover_camel_case(tmp_path):
    assert StoreConfig.from_dict({"checkCRCOnRecover": "false"}).check_crc_on_recover is False
    props = tmp_path / "broker.properties"
    props.write_text("checkCRCOnRecover=false\n", encoding="utf-8")
    assert StoreConfig.from_properties(props).check_crc_on_recover is False


def test_sync_flush_store_works(tmp_path):
    with MessageStore.open(tmp_path, SMALL.replace(flush_disk_type="SYNC_FLUSH"), clock=StepClock()) as s:
        r = s.put_message(Message("F", b"x"))
        assert r.status is PutMessageStatus.PUT_OK
    with MessageStore.open(tmp_path, read_only=True) as s:
        assert s.get_message(r.wrote_offset).body == b"x"


# --- stateful model test ----------------------------------------------------------------------------

TOPICS = ("SA", "SB", "%RETRY%g")
KEYS = ("k0", "k1", "k2", "k3", "Aa", "BB")

msg_strategy = st.fixed_dictionaries(
    {
        "topic": st.sampled_from(TOPICS),
        "queue_id": st.integers(0, 2),
        "body": st.binary(max_size=600),
        "keys": st.lists(st.sampled_from(KEYS), unique=True, max_size=2),
        "tags": st.one_of(st.none(), st.sampled_from(("TagA", "TagB", "标签"))),
    }
)


class StoreModel(RuleBasedStateMachine):
    base_dir = None
    counter = 0

    @initialize()
    def open_store(self):
        StoreModel.counter += 1
        self.root = os.path.join(StoreModel.base_dir, f"m{StoreModel.counter}")
        self.clock = StepClock(T0, step=7)
        self.store = MessageStore.open(self.root, SMALL, clock=self.clock)
        self.queues = {}  # (topic, qid) -> [(phy, spec)]
        self.by_phy = {}

    def teardown(self):
        store = getattr(self, "store", None)
        if store is not None:
            self._check_everything()
            store.close()

    def _message(self, spec):
        return Message(spec["topic"], spec["body"], queue_id=spec["queue_id"],
                       keys=" ".join(spec["keys"]) if spec["keys"] else None, tags=spec["tags"])

    def _record(self, spec, res):
        q = self.queues.setdefault((spec["topic"], spec["queue_id"]), [])
        assert res.queue_offset == len(q)
        q.append((res.wrote_offset, spec))
        self.by_phy[res.wrote_offset] = spec

    @rule(spec=msg_strategy)
    def put(self, spec):
        self._record(spec, self.store.put_message(self._message(spec)))

    @rule(specs=st.lists(msg_strategy, min_size=1, max_size=4))
    def put_batch(self, specs):
        results = self.store.put_messages([self._message(s) for s in specs])
        assert len(results) == len(specs)
        for s, r in zip(specs, results):
            self._record(s, r)

    @precondition(lambda self: self.queues)
    @rule(data=st.data())
    def pull(self, data):
        key = data.draw(st.sampled_from(sorted(self.queues)))
        q = self.queues[key]
        off = data.draw(st.integers(0, len(q) + 1))
        n = data.draw(st.integers(1, 5))
        res = self.store.get_messages(key[0], key[1], off, max_count=n)
        if off == len(q):
            assert res.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        elif off > len(q):
            assert res.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        else:
            assert res.status is GetMessageStatus.FOUND
            assert [m.physical_offset for m in res.messages] == [p for p, _ in q[off : off + n]]
            assert res.next_begin_offset == off + len(res.messages)

    @rule(topic=st.sampled_from(TOPICS), key=st.sampled_from(KEYS))
    def query(self, topic, key):
        want = sorted((p for p, s in self.by_phy.items() if s["topic"] == topic and key in s["keys"]), reverse=True)
        got = [m.physical_offset for m in self.store.query_messages(topic, key)]
        assert got == want[:64]

    @rule(crash=st.booleans())
    def reopen(self, crash):
        self.store.close()
        if crash:
            with open(os.path.join(self.root, "abort"), "w") as fh:
                fh.write("1")
        self.store = MessageStore.open(self.root, SMALL, clock=self.clock)
        assert self.store.recovery_report["stopped_because"] is None

    @invariant()
    def queues_dense(self):
        for (topic, qid), q in self.queues.items():
            assert self.store.get_max_offset_in_queue(topic, qid) == len(q)
            assert self.store.get_min_offset_in_queue(topic, qid) == 0

    def _check_everything(self):
        s = self.store
        for (topic, qid), q in self.queues.items():
            for off, (phy, spec) in enumerate(q):
                m = s.get_message(phy)
                res = s.get_messages(topic, qid, off, max_count=1)
                assert res.messages and res.messages[0].physical_offset == phy
                for got in (m, res.messages[0]):
                    assert got.topic == spec["topic"] and got.queue_id == spec["queue_id"]
                    assert got.queue_offset == off
                    assert got.body == spec["body"]
                    assert got.tags == spec["tags"]
                    assert got.keys == (" ".join(spec["keys"]) if spec["keys"] else None)
        assert [m.physical_offset for m in s.iter_messages()] == sorted(self.by_phy)

    @rule()
    def check_everything(self):
        self._check_everything()


def test_store_model(tmp_path):
    StoreModel.base_dir = str(tmp_path)
    run_state_machine_as_test(
        StoreModel,
        settings=settings(max_examples=scaled(30), stateful_step_count=20, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


# --- put_message_columns ------------------------------------------------------------


def _files(root) -> dict:
    """Every store file's bytes by path (index files, named after the wall
    clock at creation, by their order)."""
    out = {}
    for d, _, names in os.walk(root):
        for i, name in enumerate(sorted(names)):
            if name not in ("lock", "abort", "checkpoint"):
                p = os.path.join(d, name)
                key = os.path.relpath(p, root)
                if os.path.basename(d) == "index":
                    key = f"index/#{i}"
                with open(p, "rb") as f:
                    out[key] = f.read()
    return out


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_put_message_columns_writes_what_put_messages_writes(tmp_path, flush):
    """Rows are the Messages of their fields: byte-identical stores (one
    store time for a call, as a clock standing still gives put_messages),
    CommitLog files rolling and queues appearing in mid-call."""
    import numpy as np

    cfg = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=400,
                      max_hash_slot_num=64, max_index_num=512, flush_disk_type=flush)
    n = 120
    bodies = [bytes([i]) * (20 + i) for i in range(n)]
    qids = np.array([i % 3 if i < 60 else i % 5 for i in range(n)])  # queues 3 and 4 appear at row 60
    tags = [None if i % 7 == 0 else f"T{i % 4}" for i in range(n)]
    uniq = [f"U{i:04d}" for i in range(n)]
    with MessageStore.open(tmp_path / "a", config=cfg, clock=lambda: 1_700_000_000_000) as a, \
            MessageStore.open(tmp_path / "b", config=cfg, clock=lambda: 1_700_000_000_000) as b:
        for lo in (0, 50):  # two calls
            hi = lo + 50 if lo == 0 else n
            want = a.put_messages([Message("T", bodies[i], queue_id=int(qids[i]), tags=tags[i], keys="k1 k2",
                                           unique_key=uniq[i]) for i in range(lo, hi)])
            got = b.put_message_columns("T", bodies[lo:hi], qids[lo:hi], tags=tags[lo:hi], keys="k1 k2",
                                        unique_keys=uniq[lo:hi])
            assert got.status is PutMessageStatus.PUT_OK and got.store_timestamp == 1_700_000_000_000
            assert got.physical_offsets.tolist() == [r.wrote_offset for r in want]
            assert got.sizes.tolist() == [r.wrote_bytes for r in want]
            assert got.queue_offsets.tolist() == [r.queue_offset for r in want]
        assert len(os.listdir(tmp_path / "b" / "commitlog")) > 2
        assert b.query_messages("T", "U0077")[0].body == bodies[77]
        assert [m.body for m in b.get_messages("T", 4, 0, 3).messages] == [bodies[64], bodies[69], bodies[74]]
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_put_message_columns_validates_every_row_before_writing(tmp_path):
    from rmqstore import IllegalMessageError, MessageTooLargeError, MessageTypeError

    # (files compared byte for byte while the store is open: nothing made ahead meanwhile)
    small = StoreConfig(mapped_file_size_commit_log=65536, max_hash_slot_num=64, max_index_num=512,
                        make_files_ahead=False)
    with MessageStore.open(tmp_path / "s", config=small) as s:
        s.put_message_columns("T", [b"first"], 0)
        before = _files(tmp_path / "s")
        with pytest.raises(IllegalMessageError):
            s.put_message_columns("T", [b"a", b"b"], [0, 1], tags=["ok", "bad\x01"])
        with pytest.raises(MessageTypeError):
            s.put_message_columns("T", [b"a", "text"], 0)
        with pytest.raises(IllegalMessageError):
            s.put_message_columns("T", [b"a", b"b"], [0, -1])
        with pytest.raises(MessageTooLargeError):
            s.put_message_columns("T", [b"a", b"x" * (small.max_message_size + 1)], 0)
        with pytest.raises(ValueError):
            s.put_message_columns("T", [b"a", b"b"], [0, 1, 2])
        assert _files(tmp_path / "s") == before  # nothing of any refused call
        r = s.put_message_columns("T", [], 0)
        assert len(r.physical_offsets) == 0
        assert s.get_max_offset_in_queue("T", 0) == 1


def test_a_store_reopens_writable_without_its_config(tmp_path):
    """Sizes are read from the files: a store made with a broker's sizes (or
    any) opens for writing with no config given; a config given that
    disagrees is still refused."""
    root = tmp_path / "s"
    made = StoreConfig.broker_defaults(mapped_file_size_commit_log=1 << 20, make_files_ahead=False)
    with MessageStore.open(root, made) as s:
        first = s.put_message(Message("T", b"a", keys="k"))
    with MessageStore.open(root) as s:
        assert s.config.mapped_file_size_commit_log == 1 << 20
        assert s.config.mapped_file_size_consume_queue == 6_000_000
        assert (s.config.max_hash_slot_num, s.config.max_index_num) == (5_000_000, 20_000_000)
        second = s.put_message(Message("T", b"b", keys="k"))
        assert sorted(m.body for m in s.query_messages("T", "k")) == [b"a", b"b"]  # one index, both keys
    assert second.wrote_offset == first.wrote_offset + first.wrote_bytes
    with pytest.raises(ConfigError):
        MessageStore.open(root, StoreConfig())  # a service's sizes: not this store's
    fresh = tmp_path / "new"
    with MessageStore.open(fresh, {"makeFilesAhead": False}) as s:
        s.put_message(Message("T", b"x"))
    assert os.path.getsize(fresh / "commitlog" / f"{0:020d}") == StoreConfig().mapped_file_size_commit_log
