"""Numbers are checked at the door.

Every ``StoreConfig`` field and every numeric argument of the read API is
range-checked: a bool where an int is expected, a float, NaN, an infinity, a
negative value, a value too large for RocketMQ's format, or a zero that
would make a thread spin or a query come back empty is refused with
ConfigError (settings), MessageTypeError (wrong type) or ArgumentError (an
argument out of range), each naming the field and its allowed range. Where
RocketMQ answers a status for a valid long it still does (a negative or
too-large queue offset: OFFSET_TOO_SMALL / OFFSET_OVERFLOW_BADLY; a physical
offset with no record: None). Each API test runs with both kernels, the
checks holding on the ReadGate's fast path and on the store method alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
import time

import pytest

import rmqstore
from conftest import no_hang
from rmqstore import (
    ArgumentError,
    ConfigError,
    GetMessageStatus,
    Message,
    MessageStore,
    MessageTypeError,
    StoreConfig,
)

I32 = (1 << 31) - 1
I64 = (1 << 63) - 1
NAN, INF = float("nan"), float("inf")

SMALL = dict(  # 4 KiB CommitLog files, 10 units per ConsumeQueue file, 32-entry index files
    mapped_file_size_commit_log=4096, mapped_file_size_consume_queue=200, max_hash_slot_num=16, max_index_num=32,
    clean_service_enable=False,
)
N = 30


# --- StoreConfig ----------------------------------------------------------------------------


def _int_fields():
    return [f.name for f in dataclasses.fields(StoreConfig) if f.init and type(f.default) is int]


def _bool_fields():
    return [f.name for f in dataclasses.fields(StoreConfig) if f.init and type(f.default) is bool]


def test_defaults_and_rocketmq_values_are_accepted():
    assert StoreConfig.broker_defaults().mapped_file_size_commit_log == 1 << 30
    # values a broker runs with, at the edges of what works
    StoreConfig(
        mapped_file_size_commit_log=I32, mapped_file_size_consume_queue=20, max_hash_slot_num=1, max_index_num=2,
        max_message_size=1, flush_interval_commit_log=1, flush_commit_log_least_pages=0,
        flush_commit_log_thorough_interval=0, flush_interval_consume_queue=1, flush_consume_queue_least_pages=0,
        file_reserved_time=0, disk_max_used_space_ratio=0, disk_space_warning_level_ratio=100,
        disk_space_clean_forcibly_ratio=100, clean_resource_interval=1, delete_commit_log_files_interval=0,
        destroy_maped_file_interval_forcibly=0, clean_resource_initial_delay=0, disk_check_interval=0,
        follow_poll_interval=1, max_msgs_num_batch=1, default_query_max_num=1, message_delay_level="",
        delete_when="", sync_flush_timeout=1,
    )
    # RocketMQ's getter rounds a ConsumeQueue file size up to whole units
    assert StoreConfig(mapped_file_size_consume_queue=30).mapped_file_size_consume_queue == 40
    assert StoreConfig(mapped_file_size_consume_queue=I32 - 7).mapped_file_size_consume_queue == I32 - 7
    # the largest index whose positions fit the format's int32
    StoreConfig(max_hash_slot_num=1, max_index_num=(I32 - 44) // 20)
    assert StoreConfig(message_delay_level="0s 1d").delay_millis(2) == 86_400_000


@pytest.mark.parametrize("name", _int_fields())
def test_every_int_field_refuses_wrong_types_and_non_numbers(name):
    for bad in (True, False, 5.0, NAN, INF, -INF, "5", None):
        with pytest.raises(ConfigError, match=name):
            StoreConfig(**{name: bad})


@pytest.mark.parametrize("name", _int_fields())
def test_every_int_field_has_a_range_named_in_the_error(name):
    for bad in (-1, I64 + 1, -(1 << 70)):
        with pytest.raises(ConfigError, match=rf"{name}.*\[-?\d+, \d+\]"):
            StoreConfig(**{name: bad})


@pytest.mark.parametrize("name", _bool_fields())
def test_bool_fields_take_bools_only(name):
    for bad in (0, 1, "true", None):
        with pytest.raises(ConfigError, match=name):
            StoreConfig(**{name: bad})


@pytest.mark.parametrize("name, bad", [
    # a thread would spin: a wait of 0 ms
    ("flush_interval_commit_log", 0),
    ("flush_interval_consume_queue", 0),
    ("clean_resource_interval", 0),
    ("follow_poll_interval", 0),
    # every query would come back empty, every round delete nothing
    ("max_msgs_num_batch", 0),
    ("default_query_max_num", 0),
    ("delete_file_batch_max", 0),
    ("max_transfer_count_on_message_in_memory", 0),
    ("max_transfer_bytes_on_message_in_memory", 0),
    ("sync_flush_timeout", 0),
    # an index that can hold no key, or whose positions overflow int32
    ("max_hash_slot_num", 0),
    ("max_index_num", 1),
    ("max_index_num", 200_000_000),
    ("max_hash_slot_num", 600_000_000),
    # segments: too small for a record, too large for the format's int positions
    ("mapped_file_size_commit_log", 4095),
    ("mapped_file_size_commit_log", I32 + 1),
    ("mapped_file_size_consume_queue", 0),
    ("mapped_file_size_consume_queue", I32),  # rounds up past int32
    ("max_message_size", 0),
    ("max_message_size", I32 + 1),
    # percentages
    ("disk_max_used_space_ratio", 101),
    ("disk_space_warning_level_ratio", 101),
    ("disk_space_clean_forcibly_ratio", -1),
    ("max_topic_length", 128),
    # hours: as ms they must fit a long
    ("file_reserved_time", I32 + 1),
])
def test_values_that_cannot_work_are_refused(name, bad):
    with pytest.raises(ConfigError, match=name):
        StoreConfig(**{name: bad})


def test_index_geometry_is_checked_as_a_whole():
    # each field in range, the file they make is not: 40 + 4 * slots + 20 * entries > int32
    with pytest.raises(ConfigError, match=r"max_hash_slot_num.*max_index_num"):
        StoreConfig(max_hash_slot_num=100_000_000, max_index_num=100_000_000)


@pytest.mark.parametrize("text", ["1x", "s", "-1s", "1.5s", "1_0s", " 1s 2", "99999999999999999999d", "١s"])
def test_delay_levels_that_do_not_parse_are_refused(text):
    with pytest.raises(ConfigError, match="message_delay_level"):
        StoreConfig(message_delay_level=text)


@pytest.mark.parametrize("text", ["24", "-1", "4;x", "٤"])
def test_delete_when_must_name_hours(text):
    with pytest.raises(ConfigError, match="delete_when"):
        StoreConfig(delete_when=text)


def test_strings_from_properties_parse_as_java_does(tmp_path):
    cfg = StoreConfig.from_dict({"flushIntervalCommitLog": " 250 ", "maxMsgsNumBatch": "+16",
                                 "messageIndexEnable": "false"})
    assert (cfg.flush_interval_commit_log, cfg.max_msgs_num_batch, cfg.message_index_enable) == (250, 16, False)
    for bad in ("NaN", "inf", "1e3", "1.0", "1_000", "", "0x10", "٣"):
        with pytest.raises(ConfigError, match="flush_interval_commit_log"):
            StoreConfig.from_dict({"flushIntervalCommitLog": bad})
    with pytest.raises(ConfigError, match=r"flush_interval_commit_log.*\[1, "):
        StoreConfig.from_dict({"flushIntervalCommitLog": "0"})
    props = tmp_path / "broker.properties"
    props.write_text("brokerName=b\nmaxHashSlotNum=-5\n")
    with pytest.raises(ConfigError, match="max_hash_slot_num"):
        StoreConfig.from_properties(props)


def test_replace_checks_again():
    with pytest.raises(ConfigError, match="clean_resource_interval"):
        StoreConfig().replace(clean_resource_interval=0)


def test_no_put_fails_after_writing(tmp_path, impl):
    """A record that cannot fit in a CommitLog file is refused before
    anything is written, whatever max_message_size allows."""
    cfg = StoreConfig(**SMALL, max_message_size=1 << 20)
    with MessageStore.open(tmp_path, cfg) as s:
        s.put_message(Message("T", b"x" * 3000))
        before = (s.max_physical_offset, [mf.wrote_position for mf in s.commitlog.queue.files])
        for put in (lambda m: s.put_message(m), lambda m: s.put_messages([m]),
                    lambda m: s.put_message_columns("T", [m.body])):
            with pytest.raises(rmqstore.MessageTooLargeError):
                put(Message("T", b"y" * 4096))
            assert (s.max_physical_offset, [mf.wrote_position for mf in s.commitlog.queue.files]) == before
        assert s.put_message(Message("T", b"z")).status.name == "PUT_OK"


# --- read arguments ---------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path, impl):
    s = MessageStore.open(tmp_path / "s", StoreConfig(**SMALL))
    for i in range(N):
        s.put_message(Message("T", b"m%d" % i, keys=f"k{i}", tags="A"))
    yield s
    s.close()


BAD_OFFSET_TYPES = (True, False, 1.0, NAN, "1", None)
BAD_COUNTS = (0, -1, I32 + 1, 1 << 70)
BAD_COUNT_TYPES = (True, 1.0, NAN, "1")


@pytest.mark.parametrize("tags", [None, "A", "A || B"])
@pytest.mark.parametrize("queue_id", [0, 5])  # 5: no such queue (the store method's path)
def test_get_messages_offsets(store, tags, queue_id):
    s = store
    for bad in BAD_OFFSET_TYPES:
        with pytest.raises(MessageTypeError, match="offset"):
            s.get_messages("T", queue_id, bad, 4, tags)
    for bad in (I64 + 1, -(I64 + 2), 1 << 80):
        with pytest.raises(ArgumentError, match=r"offset.*\[-9223372036854775808, 9223372036854775807\]"):
            s.get_messages("T", queue_id, bad, 4, tags)
    if queue_id == 0:  # a valid long out of the queue: RocketMQ's statuses
        r = s.get_messages("T", 0, -1, 4, tags)
        assert (r.status, r.next_begin_offset) == (GetMessageStatus.OFFSET_TOO_SMALL, 0)
        r = s.get_messages("T", 0, I64, 4, tags)
        assert (r.status, r.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, N)
        r = s.get_messages("T", 0, -(I64 + 1), 4, tags)
        assert r.status is GetMessageStatus.OFFSET_TOO_SMALL


@pytest.mark.parametrize("queue_id", [0, 5])
def test_get_messages_counts_and_queue_ids(store, queue_id):
    s = store
    for bad in BAD_COUNTS:
        with pytest.raises(ArgumentError, match=r"max_count.*\[1, 2147483647\]"):
            s.get_messages("T", queue_id, 0, bad)
    for bad in BAD_COUNT_TYPES:
        with pytest.raises(MessageTypeError, match="max_count"):
            s.get_messages("T", queue_id, 0, bad)
    assert len(s.get_messages("T", 0, 0, I32).messages) == N
    for bad in (I32 + 1, -(I32 + 2)):
        with pytest.raises(ArgumentError, match=r"queue_id.*\[-2147483648, 2147483647\]"):
            s.get_messages("T", bad, 0)
    for bad in (True, 0.0, "0"):
        with pytest.raises(MessageTypeError, match="queue_id"):
            s.get_messages("T", bad, 0)
    assert s.get_messages("T", -1, 0).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE


def test_wait_ms_is_checked_whatever_the_pull_finds(store):
    with no_hang(20):
        _check_wait_ms(store)


def _check_wait_ms(s):
    for offset in (0, N, N + 5):  # messages found, nothing yet (a wait), a bad offset
        for bad in (-1, -0.5, NAN, INF, -INF, I64 + 1, 1 << 80):
            with pytest.raises(ArgumentError, match=r"wait_ms.*\[0, 9223372036854775807\]"):
                s.get_messages("T", 0, offset, 4, wait_ms=bad)
        for bad in (True, "1", None):
            with pytest.raises(MessageTypeError, match="wait_ms"):
                s.get_messages("T", 0, offset, 4, wait_ms=bad)
    assert s.get_messages("T", 0, N, 4, wait_ms=0.5).status is GetMessageStatus.OFFSET_OVERFLOW_ONE


def test_a_huge_wait_is_woken_by_an_arrival_and_by_close(store):
    s = store
    got = []

    def pull(offset):
        try:
            got.append(s.get_messages("T", 0, offset, 4, wait_ms=I64))
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            got.append(e)

    with no_hang(20):
        t = threading.Thread(target=pull, args=(N,))
        t.start()
        time.sleep(0.05)
        s.put_message(Message("T", b"late"))
        t.join(10)
        assert not t.is_alive()
        assert [m.body for m in got[0].messages] == [b"late"], got
        t = threading.Thread(target=pull, args=(N + 1,))
        t.start()
        time.sleep(0.05)
        s.close()
        t.join(10)
        assert not t.is_alive()
        assert not isinstance(got[1], BaseException) or isinstance(got[1], rmqstore.StoreClosedError), got


def test_get_message_physical_offsets(store):
    s = store
    assert s.get_message(0).body == b"m0"
    for bad in (False, True, 0.0, NAN, "0", None):
        with pytest.raises(MessageTypeError, match="physical_offset"):
            s.get_message(bad)
    for bad in (I64 + 1, -(I64 + 2), 1 << 80):
        with pytest.raises(ArgumentError, match="physical_offset"):
            s.get_message(bad)
    # valid longs with no record there: RocketMQ's null
    assert s.get_message(-1) is None and s.get_message(I64) is None and s.get_message(1) is None
    assert s.look_message_by_msg_id("nonsense") is None


@pytest.mark.parametrize("queue_id", [0, 5])
def test_views_and_columns(store, queue_id):
    s = store
    for method in (s.get_message_views, s.get_message_columns):
        for bad in BAD_OFFSET_TYPES:
            with pytest.raises(MessageTypeError, match="offset"):
                method("T", queue_id, bad, 4)
        for bad in (I64 + 1, -(I64 + 2)):
            with pytest.raises(ArgumentError, match="offset"):
                method("T", queue_id, bad, 4)
        for bad in BAD_COUNTS:
            with pytest.raises(ArgumentError, match="max_count"):
                method("T", queue_id, 0, bad)
        for bad in BAD_COUNT_TYPES:
            with pytest.raises(MessageTypeError, match="max_count"):
                method("T", queue_id, 0, bad)
        for bad in (I32 + 1, True):
            with pytest.raises((ArgumentError, MessageTypeError), match="queue_id"):
                method("T", bad, 0, 4)
        if queue_id == 0:
            assert method("T", 0, -1, 4).status is GetMessageStatus.OFFSET_TOO_SMALL
            assert method("T", 0, I64, 4).status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
            assert method("T", 0, 0, I32).status is GetMessageStatus.FOUND


@pytest.mark.parametrize("method", ["query_messages", "query_offsets"])
def test_key_queries(store, method):
    q = getattr(store, method)
    assert len(q("T", "k3")) == 1
    assert len(q("T", "k3", I32)) == 1
    for bad in BAD_COUNTS:
        with pytest.raises(ArgumentError, match=r"max_count.*\[1, 2147483647\]"):
            q("T", "k3", bad)
    for bad in BAD_COUNT_TYPES:
        with pytest.raises(MessageTypeError, match="max_count"):
            q("T", "k3", bad)
    for name, args in (("begin", (1 << 63, I64)), ("begin", (-(1 << 63) - 1, 0)), ("end", (0, 1 << 63))):
        with pytest.raises(ArgumentError, match=name):
            q("T", "k3", 4, *args)
    for name, args in (("begin", (True, I64)), ("begin", (0.0, I64)), ("end", (0, INF)), ("end", (0, NAN))):
        with pytest.raises((MessageTypeError, ArgumentError), match=name):
            q("T", "k3", 4, *args)
    with pytest.raises(ArgumentError, match=r"begin.*end"):
        q("T", "k3", 4, 10, 5)
    assert len(q("T", "k3", 4, -(1 << 63), I64)) == 1  # the whole long range
    assert q("T", "k3", 4, 5, 5) == []


@pytest.mark.parametrize("queue_id", [0, 5])
def test_time_lookups(store, queue_id):
    s = store
    for bad in (True, 1.5, NAN, "0", None):
        with pytest.raises(MessageTypeError, match="timestamp"):
            s.get_offset_in_queue_by_time("T", queue_id, bad)
    for bad in (1 << 63, -(1 << 63) - 1, 1 << 80):
        with pytest.raises(ArgumentError, match=r"timestamp.*\[-9223372036854775808, 9223372036854775807\]"):
            s.get_offset_in_queue_by_time("T", queue_id, bad, "upper")
    for bad in (I32 + 1, True):
        with pytest.raises((ArgumentError, MessageTypeError), match="queue_id"):
            s.get_offset_in_queue_by_time("T", bad, 0)
    want = 0 if queue_id == 5 else N
    assert s.get_offset_in_queue_by_time("T", queue_id, I64) == want
    assert s.get_offset_in_queue_by_time("T", queue_id, -(1 << 63)) == 0
    with pytest.raises(ArgumentError, match="boundary"):
        s.get_offset_in_queue_by_time("T", queue_id, 0, "middle")


def test_iter_messages_start(store):
    s = store
    assert len(list(s.iter_messages(0))) == N
    for bad in (True, 0.0, "0"):
        with pytest.raises(MessageTypeError, match="start_offset"):
            s.iter_messages(bad)
    for bad in (-1, I64 + 1):
        with pytest.raises(ArgumentError, match=r"start_offset.*\[0, 9223372036854775807\]"):
            s.iter_messages(bad)
    assert list(s.iter_messages(I64)) == []


def test_queue_offset_lookups(store):
    s = store
    for method in (s.get_min_offset_in_queue, s.get_max_offset_in_queue):
        with pytest.raises(ArgumentError, match="queue_id"):
            method("T", I32 + 1)
        with pytest.raises(MessageTypeError, match="queue_id"):
            method("T", True)
        assert method("T", -1) == 0


def test_delete_expired_hours(store):
    s = store
    for bad in (-1, I32 + 1):
        with pytest.raises(ConfigError, match="reserved_hours"):
            s.delete_expired(reserved_hours=bad)
    for bad in (True, 1.0):
        with pytest.raises(ConfigError, match="reserved_hours"):
            s.delete_expired(reserved_hours=bad)
    assert s.delete_expired(reserved_hours=I32).deleted == 0


def test_consumer_batch(store):
    s = store
    for bad in (0, -1, I32 + 1):
        with pytest.raises(ValueError, match=r"batch.*\[1, 2147483647\]"):
            s.consumer("G", "T", batch=bad)
    for bad in (True, 1.0):
        with pytest.raises(MessageTypeError, match="batch"):
            s.consumer("G", "T", batch=bad)
    with s.consumer("G", "T", batch=I32) as c:
        assert [m.body for m in c][:2] == [b"m0", b"m1"]


def test_offset_store_flush_interval(tmp_path):
    from rmqstore import ConsumerOffsetStore

    for bad in (0, -1, I32 + 1):
        with pytest.raises(ValueError, match="flush_interval_ms"):
            ConsumerOffsetStore(tmp_path / "o.json", flush_interval_ms=bad)
    ConsumerOffsetStore(tmp_path / "o.json", flush_interval_ms=I32).close()


def test_asyncio_front_checks_wait_ms(store):
    from rmqstore.service.aio import AsyncMessageStore

    async def main():
        a = AsyncMessageStore(store)
        assert len((await a.get_messages("T", 0, 0, 4)).messages) == 4
        for bad in (-1, NAN, INF, I64 + 1):
            with pytest.raises(ArgumentError, match="wait_ms"):
                await a.get_messages("T", 0, 0, 4, wait_ms=bad)
        with pytest.raises(MessageTypeError, match="wait_ms"):
            await a.get_messages("T", 0, 0, 4, wait_ms=True)
        with pytest.raises(ArgumentError, match="max_count"):
            await a.get_messages("T", 0, 0, 0)

    with no_hang(20):
        asyncio.run(main())


def test_read_only_store_checks_as_the_writer(tmp_path, impl):
    with no_hang(20), MessageStore.open(tmp_path, StoreConfig(**SMALL)) as w:
        for i in range(5):
            w.put_message(Message("T", b"m%d" % i))
        with MessageStore.open(tmp_path, read_only=True) as r:
            with pytest.raises(ArgumentError, match="wait_ms"):
                r.get_messages("T", 0, 5, 4, wait_ms=NAN)
            with pytest.raises(ArgumentError, match="max_count"):
                r.get_messages("T", 0, 0, 0)
            with pytest.raises(MessageTypeError, match="offset"):
                r.get_message_views("T", 0, True)
            t0 = time.monotonic()
            r.get_messages("T", 0, 5, 4, wait_ms=30)
            assert time.monotonic() - t0 < 5


def test_the_gate_and_the_store_method_agree(store):
    """The instance's (gated) methods and MessageStore's own raise alike."""
    s = store
    cases = [
        ("get_messages", ("T", 0, True)), ("get_messages", ("T", 0, 0, 0)), ("get_messages", ("T", 0, 1 << 63)),
        ("get_messages", ("T", 0, 0, 4, None, -1)), ("get_message_views", ("T", 0, 0, 0)),
        ("get_message_views", ("T", 0, 1.0)), ("query_messages", ("T", "k1", 0)),
        ("query_messages", ("T", "k1", 4, 3, 2)), ("get_offset_in_queue_by_time", ("T", 0, 1 << 64)),
        ("get_offset_in_queue_by_time", ("T", 0, False)),
    ]
    for name, args in cases:
        errors = []
        for call in (getattr(s, name), lambda *a, n=name: getattr(MessageStore, n)(s, *a)):
            with pytest.raises((ArgumentError, MessageTypeError)) as e:
                call(*args)
            errors.append(type(e.value))
        assert errors[0] is errors[1], (name, args)


def test_error_classes():
    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, rmqstore.RmqStoreError)
    assert issubclass(MessageTypeError, TypeError)
    assert "ArgumentError" in rmqstore.__all__
    assert math.isnan(NAN)


def test_properties_are_read_as_java_reads_them(tmp_path):
    """ISO-8859-1 (a byte that is not UTF-8 is no error), and ``=``, ``:``
    or whitespace between a name and its value."""
    p = tmp_path / "broker.properties"
    p.write_bytes(b"brokerName=caf\xe9\nflushDiskType SYNC_FLUSH\nmappedFileSizeCommitLog: 65536\n# a comment\n")
    cfg = StoreConfig.from_properties(p)
    assert cfg.flush_disk_type == "SYNC_FLUSH" and cfg.mapped_file_size_commit_log == 65536
