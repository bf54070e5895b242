"""Bad input raises a typed exception (also an instance of the matching
builtin) and writes nothing: the CommitLog bytes, the end offset and the
queues are unchanged, and the next valid put goes exactly where it would have."""

from __future__ import annotations

import os

import pytest

from conftest import StepClock, read_bytes
from rmqstore import (
    IllegalMessageError,
    Message,
    MessageStore,
    MessageTooLargeError,
    MessageTypeError,
    PropertiesSizeExceededError,
    RmqStoreError,
    StoreConfig,
)

CFG = StoreConfig(
    mapped_file_size_commit_log=65536,
    mapped_file_size_consume_queue=200,
    max_hash_slot_num=16,
    max_index_num=32,
    max_message_size=1024,
    # the harness compares every file byte for byte around a refused put: no
    # file made ahead may appear meanwhile (test_files_ahead.py covers those)
    make_files_ahead=False,
)


def _snapshot(root, store):
    files = {}
    for sub in ("commitlog", "consumequeue", "index"):
        for dirpath, _, names in os.walk(os.path.join(root, sub)):
            for n in names:
                p = os.path.join(dirpath, n)
                files[os.path.relpath(p, root)] = read_bytes(p)
    return store.max_physical_offset, files, store.queues(), store.get_max_offset_in_queue("Good", 0)


class Harness:
    def __init__(self, root, config=CFG):
        self.root = str(root)
        self.store = MessageStore.open(self.root, config, clock=StepClock())
        self.first = self.store.put_message(Message("Good", b"first", keys="k0"))

    def expect(self, exc_type, builtin, make, batch=False):
        """*make* builds the bad message(s) and puts them; it must raise
        *exc_type* (also a *builtin*) and leave the store unchanged."""
        s = self.store
        s.flush()
        before = _snapshot(self.root, s)
        with pytest.raises(exc_type) as ei:
            make(s)
        assert isinstance(ei.value, builtin)
        assert isinstance(ei.value, RmqStoreError)
        s.flush()
        assert _snapshot(self.root, s) == before
        res = s.put_message(Message("Good", b"after", keys="k-after"))
        assert res.wrote_offset == before[0]
        assert res.queue_offset == before[3]
        assert s.get_message(res.wrote_offset).body == b"after"
        return ei.value

    def close(self):
        self.store.close()


@pytest.fixture
def h(tmp_path):
    harness = Harness(tmp_path / "s")
    yield harness
    harness.close()


def put(**kw):
    kw.setdefault("topic", "Good")
    kw.setdefault("body", b"x")
    return lambda s: s.put_message(Message(**kw))


def test_body_over_max_message_size(h):
    h.expect(MessageTooLargeError, ValueError, put(body=b"x" * 1025))
    e = h.expect(IllegalMessageError, ValueError, put(body=bytearray(5000)))
    assert isinstance(e, MessageTooLargeError)
    # exactly the limit is fine
    r = h.store.put_message(Message("Good", b"y" * 1024))
    assert h.store.get_message(r.wrote_offset).body == b"y" * 1024


def test_record_too_big_for_a_commitlog_file(tmp_path):
    cfg = CFG.replace(mapped_file_size_commit_log=4096, max_message_size=1 << 20)
    h = Harness(tmp_path / "s", cfg)
    try:
        # topic "Good" (4 bytes), no properties: size = 95 + body; fits iff size + 8 <= 4096
        h.expect(MessageTooLargeError, ValueError, put(body=b"z" * (4096 - 8 - 95 + 1)))
        h.expect(MessageTooLargeError, ValueError, put(body=b"z" * 100_000))
        r = h.store.put_message(Message("Good", b"z" * (4096 - 8 - 95)))
        assert r.wrote_bytes == 4088 and r.wrote_offset == 4096
    finally:
        h.close()


def test_properties_too_large(tmp_path):
    h = Harness(tmp_path / "s", CFG.replace(mapped_file_size_commit_log=1 << 17))
    try:
        # "p" \x01 value \x02 = len(value) + 3 bytes
        e = h.expect(PropertiesSizeExceededError, ValueError, put(properties={"p": "v" * (32767 - 3 + 1)}))
        assert isinstance(e, IllegalMessageError)
        h.expect(PropertiesSizeExceededError, ValueError, put(properties={f"n{i}": "é" * 100 for i in range(200)}))
        h.expect(PropertiesSizeExceededError, ValueError, put(tags="t" * 40000))
        r = h.store.put_message(Message("Good", b"x", properties={"p": "v" * (32767 - 3)}))
        assert len(h.store.get_message(r.wrote_offset).properties_blob) == 32767
    finally:
        h.close()


def test_properties_too_large_with_crc_property(tmp_path):
    h = Harness(tmp_path / "s", CFG.replace(mapped_file_size_commit_log=1 << 17, enabled_append_prop_crc=True))
    try:
        h.expect(PropertiesSizeExceededError, ValueError, put(properties={"p": "v" * (32767 - 3 - 10)}))
    finally:
        h.close()


def test_properties_limit_with_crc_property(tmp_path):
    """With the CRC entry, 20 bytes of the 32767 are reserved: still an
    IllegalMessageError and nothing written."""
    h = Harness(tmp_path / "s", CFG.replace(mapped_file_size_commit_log=1 << 17, enabled_append_prop_crc=True))
    try:
        h.expect(IllegalMessageError, ValueError, put(properties={"p": "v" * (32767 - 3 - 10)}))
        r = h.store.put_message(Message("Good", b"x", properties={"p": "v" * (32767 - 3 - 20)}))
        assert len(h.store.get_message(r.wrote_offset).properties_blob) == 32767
    finally:
        h.close()


@pytest.mark.parametrize(
    "kw",
    [
        {"properties": {"na\x01me": "v"}},
        {"properties": {"na\x02me": "v"}},
        {"properties": {"name": "va\x01lue"}},
        {"properties": {"name": "va\x02lue"}},
        {"properties": {"": "v"}},
        {"tags": "Ta\x01g"},
        {"tags": "Ta\x02g"},
        {"keys": "k\x02ey"},
        {"keys": ["ok", "k\x01ey"]},
        {"unique_key": "U\x01K"},
        {"unique_key": "U\x02K"},
        {"topic": ""},
        {"queue_id": -1},
        {"flag": 2**31},
        {"flag": -(2**31) - 1},
        {"reconsume_times": 2**31},
        {"born_timestamp": 2**63},
        {"sys_flag": 2**32},
        {"prepared_transaction_offset": -(2**63) - 1},
    ],
    ids=lambda kw: repr(kw)[:40],
)
def test_illegal_message_fields(h, kw):
    h.expect(IllegalMessageError, ValueError, put(**kw))


@pytest.mark.parametrize(
    "topic",
    ["a/b", "/", "x" * 32768, "é" * 16384, ".", ".."],
    ids=["slash", "only-slash", "32768-bytes", "32768-utf8-bytes", "dot", "dotdot"],
)
def test_illegal_topics(h, topic):
    h.expect(IllegalMessageError, ValueError, put(topic=topic))


def test_long_topic_without_auto_version(tmp_path):
    h = Harness(tmp_path / "s", CFG.replace(auto_message_version_on_topic_len=False))
    try:
        h.expect(IllegalMessageError, ValueError, put(topic="T" * 128))
        h.expect(IllegalMessageError, ValueError, put(topic="é" * 64))  # 64 chars, 128 bytes
        r = h.store.put_message(Message("T" * 127, b"x"))
        assert h.store.get_message(r.wrote_offset).topic == "T" * 127
    finally:
        h.close()


@pytest.mark.parametrize(
    "make",
    [
        put(topic=5),
        put(topic=b"bytes-topic"),
        put(body="a str body"),
        put(body=None),
        put(queue_id="1"),
        put(queue_id=True),
        put(queue_id=1.0),
        put(flag=1.5),
        put(properties=[("a", "b")]),
        put(properties={"a": 1}),
        put(properties={1: "a"}),
        put(tags=5),
        put(keys=5),
        put(keys=["a", 5]),
        put(unique_key=b"uk"),
        put(born_timestamp="now"),
        put(reconsume_times=None),
        put(born_host=12345),
        lambda s: s.put_message("not a message"),
        lambda s: s.put_message(None),
        lambda s: s.put_messages([Message("Good", b"ok"), "not a message"]),
        lambda s: s.put_messages([Message("Good", b"ok"), None]),
    ],
    ids=lambda m: "case",
)
def test_wrong_types(h, make):
    h.expect(MessageTypeError, TypeError, make)


@pytest.mark.parametrize("host", ["nonsense", "10.0.0.1", "300.1.1.1:80", "[::1]:x", "10.0.0.1:99999999999"])
def test_bad_hosts(h, host):
    h.expect(IllegalMessageError, ValueError, put(born_host=host))
    h.expect(IllegalMessageError, ValueError, put(store_host=host))


def test_shorthand_conflicts(h):
    h.expect(IllegalMessageError, ValueError, put(tags="A", properties={"TAGS": "B"}))
    h.expect(IllegalMessageError, ValueError, put(keys="k1", properties={"KEYS": "k2"}))
    h.expect(IllegalMessageError, ValueError, put(unique_key="U1", properties={"UNIQ_KEY": "U2"}))
    # agreeing values are fine and keep the position given in properties
    r = h.store.put_message(Message("Good", b"x", tags="A", unique_key="U",
                                    properties={"first": "1", "TAGS": "A", "last": "2"}))
    blob = h.store.get_message(r.wrote_offset).properties_blob
    assert blob == b"first\x011\x02TAGS\x01A\x02last\x012\x02UNIQ_KEY\x01U\x02"


def test_batch_with_one_bad_message_writes_nothing(h):
    good = [Message("Good", b"g%d" % i, keys=f"gk{i}") for i in range(5)]
    for bad in (
        Message("a/b", b"bad topic"),
        Message("Good", b"x" * 2000),  # over max_message_size
        Message("Good", b"x", tags="A", properties={"TAGS": "B"}),
        Message("Good", b"x", properties={"p": "v" * 40000}),
        Message("Good", b"x", born_host="nonsense"),
    ):
        msgs = good[:3] + [bad] + good[3:]
        h.expect(IllegalMessageError, ValueError, lambda s: s.put_messages(msgs))
        assert h.store.query_offsets("Good", "gk0") == []
    expect_q = h.store.get_max_offset_in_queue("Good", 0)
    results = h.store.put_messages(good)
    assert [r.queue_offset for r in results] == list(range(expect_q, expect_q + 5))


def test_valid_edge_values_are_accepted(h):
    s = h.store
    r = s.put_message(Message("Good", memoryview(b"mv-body"), queue_id=0, flag=-(2**31), reconsume_times=2**31 - 1,
                              born_timestamp=-1, prepared_transaction_offset=2**63 - 1, properties={"e": ""}))
    m = s.get_message(r.wrote_offset)
    assert (m.body, m.flag, m.reconsume_times, m.born_timestamp, m.prepared_transaction_offset) == (
        b"mv-body", -(2**31), 2**31 - 1, -1, 2**63 - 1)
    assert m.properties_blob == b"e\x01\x02"
    assert m.properties == {}
    r = s.put_message(Message("Good", bytearray(b"ba"), keys=["a", "b"]))
    assert s.get_message(r.wrote_offset).keys == "a b"


@pytest.mark.parametrize("make_body", [
    lambda: memoryview(__import__("array").array("i", [1, 2])),
    lambda: memoryview(b"abcdef")[::2],
], ids=["int-memoryview", "strided-memoryview"])
def test_exotic_buffer_bodies(tmp_path, make_body):
    root = tmp_path / "s"
    with MessageStore.open(root, CFG, clock=StepClock()) as s:
        s.put_message(Message("Good", b"first"))
        s.flush()
        before = _snapshot(str(root), s)
        body = make_body()
        try:
            r = s.put_message(Message("Good", body))
        except MessageTypeError:
            s.flush()
            assert _snapshot(str(root), s) == before
        else:
            assert s.get_message(r.wrote_offset).body == body.tobytes()
    with MessageStore.open(root, CFG) as s:
        assert s.recovery_report["stopped_because"] is None
