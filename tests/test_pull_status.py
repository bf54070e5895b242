"""Every pull status, as RocketMQ ``DefaultMessageStore.getMessage`` gives it,
through every pull path, on both implementations.

For each status the exact ``(status, next_begin_offset, min_offset,
max_offset)`` is checked through ``get_messages``, ``get_message_views``,
``get_message_columns``, a waiting ``get_messages`` and the same three on a
read-only follower of the store: one answer across the paths. And the
statuses are ``IntEnum`` members valued by the Java declaration order.
"""

import enum
import os

import pytest

import rmqstore
from conftest import ListClock
from rmqstore import (
    GetMessageStatus,
    Message,
    MessageStore,
    PutMessageStatus,
    StoreConfig,
    message,
)

S = GetMessageStatus
TINY = StoreConfig(
    mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200, max_hash_slot_num=16, max_index_num=32,
    clean_service_enable=False,
)
T0 = 1_700_000_000_000
PLACEHOLDER = (0).to_bytes(8, "big") + (0x7FFFFFFF).to_bytes(4, "big") + bytes(8)  # a pre-blank unit


def _scenario(root):
    """A store at *root* holding one case of each status; returns the
    cases ``(name, topic, queue_id, offset, max_count, status, next)``,
    *next* a function of the queue's (min, max). Queue 2's records are all
    cleaned up while its minimum is left at 0 (a clean-up not yet
    reflected in the ConsumeQueue: ``set_back`` does it again on a
    follower); queue 3's last unit is a pre-blank placeholder; queue 5
    exists without a unit."""
    s = MessageStore.open(root, TINY, clock=ListClock(range(T0, T0 + 1000)))
    try:
        for i in range(5):
            s.put_message(Message("V", b"early%d" % i + bytes(200), queue_id=2, tags="t"))
        for i in range(60):
            s.put_message(Message("V", b"v%03d-" % i + bytes(range(256))[: (i * 37) % 300], queue_id=i % 2,
                                  tags=f"t{i % 3}"))
        for i in range(3):
            s.put_message(Message("V", b"late%d" % i, queue_id=3, tags="t"))
        s.delete_expired(force=True)
        assert s.get_min_offset_in_queue("V", 0) > 0 and s.get_min_offset_in_queue("V", 2) == 5
        cq3 = s._cqs[("V", 3)]
        cq3.queue.files[0].mm[40:60] = PLACEHOLDER
        s.flush()
    finally:
        s.close()
    os.makedirs(os.path.join(root, "consumequeue", "V", "5"))
    return [
        ("FOUND", "V", 1, 29, 1, S.FOUND, lambda mn, mx: 30),
        ("FOUND at the first", "V", 3, 0, 1, S.FOUND, lambda mn, mx: 1),
        ("NO_MATCHED_MESSAGE", "V", 3, 2, 4, S.NO_MATCHED_MESSAGE, lambda mn, mx: mx),
        ("MESSAGE_WAS_REMOVING", "V", 2, 0, 4, S.MESSAGE_WAS_REMOVING, lambda mn, mx: mx),
        ("OFFSET_OVERFLOW_BADLY", "V", 0, 31, 4, S.OFFSET_OVERFLOW_BADLY, lambda mn, mx: mx),
        ("OFFSET_OVERFLOW_BADLY far", "V", 0, (1 << 63) - 1, 4, S.OFFSET_OVERFLOW_BADLY, lambda mn, mx: mx),
        ("OFFSET_OVERFLOW_ONE", "V", 0, 30, 4, S.OFFSET_OVERFLOW_ONE, lambda mn, mx: 30),
        ("OFFSET_TOO_SMALL", "V", 0, 0, 4, S.OFFSET_TOO_SMALL, lambda mn, mx: mn),
        ("OFFSET_TOO_SMALL below 0", "V", 1, -(1 << 63), 4, S.OFFSET_TOO_SMALL, lambda mn, mx: mn),
        ("NO_MATCHED_LOGIC_QUEUE", "V", 7, 3, 4, S.NO_MATCHED_LOGIC_QUEUE, lambda mn, mx: 0),
        ("NO_MATCHED_LOGIC_QUEUE topic", "W", 0, 0, 4, S.NO_MATCHED_LOGIC_QUEUE, lambda mn, mx: 0),
        ("NO_MESSAGE_IN_QUEUE", "V", 5, 0, 4, S.NO_MESSAGE_IN_QUEUE, lambda mn, mx: 0),
        ("NO_MESSAGE_IN_QUEUE past", "V", 5, 9, 4, S.NO_MESSAGE_IN_QUEUE, lambda mn, mx: 0),
    ]


def set_back(store) -> None:
    """Queue 2's minimum back to 0: its units point at cleaned-up records."""
    store._cqs[("V", 2)].min_logic_offset = 0


def _answer(r):
    return r.status, r.next_begin_offset, r.min_offset, r.max_offset


PATHS = {
    "get_messages": lambda s, t, q, o, n: s.get_messages(t, q, o, n),
    "get_message_views": lambda s, t, q, o, n: s.get_message_views(t, q, o, n),
    "get_message_columns": lambda s, t, q, o, n: s.get_message_columns(t, q, o, n),
    "waiting": lambda s, t, q, o, n: s.get_messages(t, q, o, n, wait_ms=15),
}


@pytest.fixture
def stores(tmp_path, impl):
    """(writable store, read-only follower, cases), opened with *impl*."""
    cases = _scenario(str(tmp_path / "s"))
    with MessageStore.open(str(tmp_path / "s"), TINY, clock=ListClock(range(T0 + 1000, T0 + 2000))) as s:
        set_back(s)
        with MessageStore.open(str(tmp_path / "s"), TINY, read_only=True) as ro:
            set_back(ro)
            yield s, ro, cases


def test_every_status_through_every_path(stores):
    s, ro, cases = stores
    seen = set()
    for name, topic, qid, offset, max_count, status, nxt in cases:
        if status is S.NO_MATCHED_LOGIC_QUEUE:
            mn = mx = 0
        else:
            mn, mx = s.get_min_offset_in_queue(topic, qid), s.get_max_offset_in_queue(topic, qid)
        want = (status, nxt(mn, mx), mn, mx)
        for store, kind in ((s, "writer"), (ro, "follower")):
            for path, pull in PATHS.items():
                r = pull(store, topic, qid, offset, max_count)
                assert _answer(r) == want, (name, kind, path)
                assert type(r.status) is GetMessageStatus, (name, kind, path)
        seen.add(status)
    # every status this store gives (RocketMQ's OFFSET_FOUND_NULL and OFFSET_RESET it never does)
    assert seen == set(S) - {S.OFFSET_FOUND_NULL, S.OFFSET_RESET}


def test_a_filter_that_matches_nothing(stores):
    """NO_MATCHED_MESSAGE from a tag filter: next past every unit visited."""
    s, ro, _ = stores
    mn, mx = s.get_min_offset_in_queue("V", 1), s.get_max_offset_in_queue("V", 1)
    for store in (s, ro):
        for wait_ms in (0, 15):
            r = store.get_messages("V", 1, mn, 4, tags="nothing", wait_ms=wait_ms)
            assert _answer(r) == (S.NO_MATCHED_MESSAGE, mx, mn, mx) and r.messages == []
        # cleaned-up units, then one the filter drops: NO_MATCHED_MESSAGE (the last miss), as RocketMQ
        r = store.get_messages("V", 2, 0, 4, tags="nothing")
        assert _answer(r) == (S.NO_MATCHED_MESSAGE, 5, 0, 5)
        r = store.get_messages("V", 2, 0, 4, tags="t")
        assert _answer(r) == (S.MESSAGE_WAS_REMOVING, 5, 0, 5)


def test_found_wins_over_earlier_misses(stores):
    """Units cleaned up, then a record: FOUND, next past the record."""
    s, ro, _ = stores
    for store in (s, ro):
        cq = store._cqs[("V", 0)]
        cq.min_logic_offset = cq.queue.files[0].file_from_offset  # (the first ConsumeQueue file left)
        mn = cq.min_logic_offset // 20
        assert 0 < mn < 29
        for path, pull in PATHS.items():
            r = pull(store, "V", 0, mn, 1)
            assert _answer(r) == (S.FOUND, 30, mn, 30), path


def test_statuses_are_int_enums_in_java_order():
    java_get = ["FOUND", "NO_MATCHED_MESSAGE", "MESSAGE_WAS_REMOVING", "OFFSET_FOUND_NULL", "OFFSET_OVERFLOW_BADLY",
                "OFFSET_OVERFLOW_ONE", "OFFSET_TOO_SMALL", "NO_MATCHED_LOGIC_QUEUE", "NO_MESSAGE_IN_QUEUE",
                "OFFSET_RESET"]
    java_put = ["PUT_OK", "FLUSH_DISK_TIMEOUT", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE", "SERVICE_NOT_AVAILABLE",
                "CREATE_MAPPED_FILE_FAILED", "MESSAGE_ILLEGAL", "PROPERTIES_SIZE_EXCEEDED", "OS_PAGE_CACHE_BUSY",
                "UNKNOWN_ERROR", "IN_SYNC_REPLICAS_NOT_ENOUGH", "PUT_TO_REMOTE_BROKER_FAIL",
                "LMQ_CONSUME_QUEUE_NUM_EXCEEDED", "WHEEL_TIMER_FLOW_CONTROL", "WHEEL_TIMER_MSG_ILLEGAL",
                "WHEEL_TIMER_NOT_ENABLE"]
    for enum_type, java in ((GetMessageStatus, java_get), (PutMessageStatus, java_put)):
        assert issubclass(enum_type, enum.IntEnum)
        assert [m.name for m in enum_type] == java
        assert [int(m) for m in enum_type] == list(range(len(java)))
        assert all(enum_type[name] == i and enum_type(i).name == name for i, name in enumerate(java))
        # printed by name on every Python (3.11 prints an IntEnum as its int)
        for m in enum_type:
            assert str(m) == f"{m}" == m.name and f"{m:>30}" == f"{m.name:>30}" and f"{m:d}" == str(int(m))
    # one definition, importable from where it always was
    assert message.GetMessageStatus is rmqstore.GetMessageStatus is GetMessageStatus
    assert message.PutMessageStatus is rmqstore.PutMessageStatus is PutMessageStatus


def test_put_statuses_are_members(tmp_path, impl):
    with MessageStore.open(str(tmp_path / "s"), TINY) as s:
        r = s.put_message(Message("V", b"x"))
        assert type(r.status) is PutMessageStatus and r.status is PutMessageStatus.PUT_OK and r.status == 0
        assert all(type(x.status) is PutMessageStatus for x in s.put_messages([Message("V", b"y")] * 3))
        assert type(s.put_message_columns("V", [b"z"], [0]).status) is PutMessageStatus
        r = s.get_messages("V", 0, 0)
        assert type(r.status) is GetMessageStatus and r.status is GetMessageStatus.FOUND and r.status == 0
