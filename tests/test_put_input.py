"""Input is frozen once accepted, and names and values are checked at the door.

A body another thread changes during the put (a ``bytearray`` resized, a
numpy array rewritten by C code that runs without the GIL) can never make a
record's length and the write position disagree: each record is written
from one snapshot and its CRC is the CRC of the bytes written. A message
whose attributes were changed after it was made is checked again. Names and
values with no UTF-8 form (lone surrogates) are refused with the library's
typed errors before anything is stored, on every put path.
"""

from __future__ import annotations

import os
import threading

import pytest

from rmqstore import (
    IllegalMessageError,
    Message,
    MessageStore,
    MessageTypeError,
    StoreConfig,
)
from rmqstore.tools import verify_store

CFG = dict(mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=2000, max_hash_slot_num=64,
           max_index_num=256, clean_service_enable=False)
ROUNDS = int(os.environ.get("RMQSTORE_RACE_ROUNDS", "600"))


def no_errors(root) -> None:
    assert [p for p in verify_store(root) if p.severity == "error"] == []


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("shape", ["one", "many"])
def test_a_bytearray_resized_by_another_thread_during_puts(tmp_path, flush, shape):
    """The mutator resizes and rewrites the shared body as fast as it can;
    every value it sets is one letter repeated, so a body read back is
    either one of them whole or a record is wrong."""
    root = tmp_path / "s"
    shared = bytearray(b"a" * 10)
    stop = threading.Event()

    def mutate():
        n = 0
        while not stop.is_set():
            n += 1
            try:
                shared[:] = bytes([97 + n % 26]) * (1 + n * 37 % 3000)
            except BufferError:  # exported to a put right now: resizing is refused
                pass

    acked = []
    t = threading.Thread(target=mutate)
    with MessageStore.open(root, StoreConfig(flush_disk_type=flush, **CFG)) as s:
        t.start()
        try:
            for i in range(ROUNDS // (1 if shape == "one" else 10)):
                if shape == "one":
                    r = [s.put_message(Message("T", shared, queue_id=i % 3))]
                else:
                    r = s.put_messages([Message("T", shared, queue_id=j % 3) for j in range(10)])
                for x in r:
                    m = s.get_message(x.wrote_offset)
                    assert m is not None and m.store_size == x.wrote_bytes
                    acked.append((x.wrote_offset, x.wrote_bytes, m.body))
        finally:
            stop.set()
            t.join()
    with MessageStore.open(root, StoreConfig(flush_disk_type=flush, **CFG)) as s:
        assert s.recovery_report["truncated_bytes"] == 0
        for phy, size, body in acked:
            m = s.get_message(phy)
            assert m is not None and m.store_size == size and m.body == body
            assert body == body[:1] * len(body)  # one of the values, whole
        assert [m.physical_offset for m in s.iter_messages()] == [a[0] for a in acked]
    no_errors(root)


def test_a_numpy_body_rewritten_without_the_gil(tmp_path):
    """numpy copies large arrays with the GIL released: the body changes
    while the put copies it. The CRC is taken of the bytes written, so every
    record is valid, whatever mix of values it holds."""
    np = pytest.importorskip("numpy")
    root = tmp_path / "s"
    arr = np.zeros(64 * 1024, dtype=np.uint8)
    fills = [np.full(arr.shape, v, dtype=np.uint8) for v in range(1, 9)]
    stop = threading.Event()

    def mutate():
        n = 0
        while not stop.is_set():
            np.copyto(arr, fills[n % len(fills)])
            n += 1

    t = threading.Thread(target=mutate)
    acked = []
    cfg = StoreConfig(**dict(CFG, mapped_file_size_commit_log=1 << 20))
    with MessageStore.open(root, cfg) as s:
        t.start()
        try:
            for i in range(200):
                r = s.put_message(Message("T", memoryview(arr), queue_id=i % 2))
                acked.append((r.wrote_offset, s.get_message(r.wrote_offset).body))
        finally:
            stop.set()
            t.join()
    with MessageStore.open(root, cfg) as s:
        assert s.recovery_report["truncated_bytes"] == 0
        for phy, body in acked:
            assert s.get_message(phy).body == body
    no_errors(root)


# --- a message changed after it was made ----------------------------------------------

CHANGES = {
    "queue_id negative": (lambda m: setattr(m, "queue_id", -1), IllegalMessageError),
    "queue_id a str": (lambda m: setattr(m, "queue_id", "1"), MessageTypeError),
    "queue_id past int32": (lambda m: setattr(m, "queue_id", 1 << 31), IllegalMessageError),
    "flag a float": (lambda m: setattr(m, "flag", 1.5), MessageTypeError),
    "born_timestamp past int64": (lambda m: setattr(m, "born_timestamp", 1 << 63), IllegalMessageError),
    "topic not a str": (lambda m: setattr(m, "topic", b"T"), MessageTypeError),
    "body not bytes-like": (lambda m: setattr(m, "body", "text"), MessageTypeError),
    "tags with a separator": (lambda m: setattr(m, "tags", "a\x01b"), IllegalMessageError),
    "property value with a separator": (lambda m: setattr(m, "properties", {"p": "x\x02y"}), IllegalMessageError),
    "property name empty": (lambda m: setattr(m, "properties", {"": "x"}), IllegalMessageError),
    "property value not a str": (lambda m: setattr(m, "properties", {"p": 1}), MessageTypeError),
}


def refuse(s, bad, shape: str) -> None:
    """Offer *bad* to the store the way *shape* says."""
    if shape == "one":
        s.put_message(bad)
    elif shape == "check":  # the batch check, which writes nothing either way
        s.check_messages([Message("T", b"ok"), bad])
    else:
        s.put_messages([Message("T", b"ok"), bad])


@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("shape", ["one", "many", "check"])
def test_a_message_changed_after_it_was_made_is_checked_again(tmp_path, change, shape):
    fn, error = CHANGES[change]
    with MessageStore.open(tmp_path / "s", StoreConfig(**CFG)) as s:
        s.put_message(Message("T", b"before"))
        end = s.max_physical_offset
        m = Message("T", b"changed")
        fn(m)
        with pytest.raises(error):
            refuse(s, m, shape)
        assert s.max_physical_offset == end
        assert s.put_message(Message("T", b"after")).queue_offset == 1


# --- names with no UTF-8 form ------------------------------------------------------------

SURROGATE = "\udc80"
BAD = {
    "topic": lambda: Message("T" + SURROGATE, b"x"),
    "tags": lambda: Message("T", b"x", tags="t" + SURROGATE),
    "keys": lambda: Message("T", b"x", keys="k" + SURROGATE),
    "unique_key": lambda: Message("T", b"x", unique_key="u" + SURROGATE),
    "property name": lambda: Message("T", b"x", properties={"p" + SURROGATE: "v"}),
    "property value": lambda: Message("T", b"x", properties={"p": "v" + SURROGATE}),
}


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
@pytest.mark.parametrize("where", sorted(BAD))
@pytest.mark.parametrize("shape", ["one", "many", "new-queue", "check", "check-new-queue"])
def test_a_lone_surrogate_is_refused_before_anything_is_stored(tmp_path, where, shape, flush):
    with MessageStore.open(tmp_path / "s", StoreConfig(flush_disk_type=flush, **CFG)) as s:
        s.put_message(Message("T", b"before", keys="kb"))
        end = s.max_physical_offset
        bad = BAD[where]()
        if shape.endswith("new-queue"):
            bad.queue_id = 5
        with pytest.raises(IllegalMessageError):
            refuse(s, bad, {"new-queue": "many", "check-new-queue": "check"}.get(shape, shape))
        assert s.max_physical_offset == end and s.queues() == [("T", 0)]
        s.put_message(Message("T", b"after", keys="ka"))
    with MessageStore.open(tmp_path / "s", read_only=True) as ro:
        assert [m.body for m in ro.iter_messages()] == [b"before", b"after"]


@pytest.mark.parametrize("column", ["tags", "keys", "unique_keys"])
def test_a_lone_surrogate_in_a_column_is_refused(tmp_path, column):
    with MessageStore.open(tmp_path / "s", StoreConfig(**CFG)) as s:
        s.put_message(Message("T", b"before"))
        end = s.max_physical_offset
        with pytest.raises(IllegalMessageError):
            s.put_message_columns("T", [b"a", b"b"], 0, **{column: ["ok", "x" + SURROGATE]})
        assert s.max_physical_offset == end
        with pytest.raises(IllegalMessageError):
            s.put_message_columns("T" + SURROGATE, [b"a"], 0)
        assert s.max_physical_offset == end


def test_a_topic_the_file_system_cannot_name_is_refused_before_writing(tmp_path):
    cfg = StoreConfig(auto_message_version_on_topic_len=True, **CFG)  # topics up to 32767 bytes
    with MessageStore.open(tmp_path / "s", cfg) as s:
        end = s.max_physical_offset
        for topic in ("A" * 256, "é" * 128):  # one byte past NAME_MAX (255)
            with pytest.raises(IllegalMessageError, match="cannot name a ConsumeQueue directory"):
                s.put_message(Message(topic, b"x"))
            with pytest.raises(IllegalMessageError):
                s.put_messages([Message("T", b"x"), Message(topic, b"y")])
            with pytest.raises(IllegalMessageError):
                s.put_message_columns(topic, [b"x"])
        assert s.max_physical_offset == end
        s.put_message(Message("A" * 255, b"fits"))  # NAME_MAX itself is a name
    with MessageStore.open(tmp_path / "s", cfg) as s:
        assert [m.topic for m in s.iter_messages()] == ["A" * 255]


def test_a_topic_too_long_for_the_path_is_refused(tmp_path):
    """Under a root whose path is near PATH_MAX (4096), a topic that fits
    NAME_MAX can still make the queue file's path too long."""
    deep = tmp_path
    while len(os.fsencode(str(deep))) < 3800:
        deep = deep / ("d" * 200)
    try:
        deep.mkdir(parents=True)
    except OSError as e:
        pytest.skip(f"cannot make a directory that deep here: {e}")
    cfg = StoreConfig(auto_message_version_on_topic_len=True, **CFG)
    with MessageStore.open(deep / "s", cfg) as s:
        end = s.max_physical_offset
        with pytest.raises(IllegalMessageError, match="cannot name a ConsumeQueue directory"):
            s.put_message(Message("B" * 250, b"x"))
        assert s.max_physical_offset == end
        s.put_message(Message("short", b"x"))


def test_a_message_subclass_in_a_cycle_is_stored_and_collected(tmp_path):
    """The core's Message stays out of the cycle collector (its own fields
    never close a cycle); a subclass's attributes are still traversed, so a
    subclassed message that refers to itself is put as any other and then
    freed by a collection, not leaked."""
    import gc
    import weakref

    class Traced(Message):
        pass

    with MessageStore.open(tmp_path, StoreConfig(**CFG)) as s:
        m = Traced("T", b"cyclic", keys="k")
        m.me = m
        r = s.put_message(m)
        gone = weakref.ref(m)
        del m
        gc.collect()
        assert gone() is None
        (got,) = s.query_messages("T", "k")
        assert (got.body, got.physical_offset) == (b"cyclic", r.wrote_offset)


def test_check_messages_takes_what_a_put_takes_and_writes_nothing(tmp_path):
    """A valid batch (new topics and queues, a delayed message, hosts, a
    message at the size limit) passes the check, the store stays as it
    was, and put_messages then takes the same batch; one byte over the
    limit anywhere in the batch is refused with the put's error."""
    from rmqstore import MessageTooLargeError, StoreClosedError

    cfg = StoreConfig(**dict(CFG, max_message_size=1024))
    batch = [
        Message("T", b"a", keys="k1 k2", unique_key="U1"),
        Message("New", b"b", queue_id=3, tags="t", born_host="10.0.0.1:1234"),
        Message("T", b"c", properties={"DELAY": "2"}),
        Message("T", b"x" * 1024),
    ]
    with MessageStore.open(tmp_path / "s", cfg) as s:
        s.put_message(Message("T", b"before"))
        end, queues = s.max_physical_offset, s.queues()
        assert s.check_messages(batch) is None
        assert s.check_messages(iter(batch)) is None  # any iterable
        assert (s.max_physical_offset, s.queues()) == (end, queues)
        assert not (tmp_path / "s" / "consumequeue" / "New").exists()
        with pytest.raises(MessageTooLargeError):
            s.check_messages([*batch, Message("T", b"x" * 1025)])
        assert s.max_physical_offset == end
        sizes = [s.check_message(m) for m in batch]
        assert [r.wrote_bytes for r in s.put_messages(batch)] == sizes  # (check_message: the record's size)
    with MessageStore.open(tmp_path / "s", cfg, read_only=True) as ro:
        assert [m.body[:1] for m in ro.iter_messages()] == [b"b", b"a", b"b", b"c", b"x"]
        assert ro.check_messages(batch) is None  # (a read-only store checks too)
        with pytest.raises(MessageTooLargeError):
            ro.check_messages([*batch, Message("T", b"x" * 1025)])
    with pytest.raises(StoreClosedError):
        ro.check_messages(batch)
