"""The one-call put and pull paths.

``Appender``: the Cython core and the pure twin write what the step-by-step
kernels write (``write_record`` + ``cq_put`` + ``index_put_keys`` with
``Message.encode_properties``' blob), byte for byte, and decline, writing
nothing, whatever the store's step-by-step path must take.

``pull_units``: both build the messages ``MessageExt(decode_record(...))``
builds, skip what a pull skips, and stop at a unit whose record they cannot
vouch for.

``read_keyed``: both keep what a key lookup's step-by-step verification
keeps (topic, UNIQ_KEY or one of the KEYS, each record once).

Store-level behaviour is covered by every store test: ASYNC_FLUSH puts,
unfiltered pulls and key lookups go through these kernels."""

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqstore import _pure
from rmqstore._pure.message import MESSAGE_FIELDS
from rmqstore.message import (
    GetMessageStatus,
    Message,
    MessageExt,
    PutMessageResult,
    PutMessageStatus,
    encode_host,
)
from test_kernels import FAST, _need_core

HOST = bytes([10, 0, 0, 1]) + struct.pack(">i", 10911)
HOST6 = bytes(range(16)) + struct.pack(">i", 10911)
TOPIC = "TopicTest"
CL_SIZE, CQ_SIZE, HSN, INUM = 4096, 200, 8, 12
INDEX_SIZE = 40 + HSN * 4 + INUM * 20
TS = 1_700_000_000_000


@pytest.fixture(params=["pure", "core"])
def k(request):
    return _pure if request.param == "pure" else _need_core()


def _region(k, **fields):
    """A mapped file as the kernels of *k* take it (their MappedRegion)."""
    return k.MappedRegion(**fields)


def _of(cls, **fields):
    """An instance of one of *k*'s state classes with *fields* set."""
    o = cls()
    for name, value in fields.items():
        setattr(o, name, value)
    return o


class Files:
    """A CommitLog file at offset 8192, one queue at queue offset 3, an index
    file: bytearrays behind the attributes the Appender reads and writes."""

    def __init__(self, k, host=HOST, append_crc=False, index=True, max_message_size=1024, cq_pos=60,
                 host_bytes=None, topic=TOPIC, delay_levels=None):
        self.k, self.topic, self.delay_levels = k, topic, delay_levels
        self.commit = _region(k, mm=bytearray(CL_SIZE), file_from_offset=8192, file_size=CL_SIZE,
                                      wrote_position=100)
        self.cq_file = _region(k, mm=bytearray(CQ_SIZE), file_from_offset=0, file_size=CQ_SIZE,
                                       wrote_position=cq_pos)
        self.cq = _of(k.ConsumeQueueBase, max_physic_offset=8000)
        self.index = _of(k.IndexRegion, mm=bytearray(INDEX_SIZE), hash_slot_num=HSN, index_num=INUM)
        self.offsets = {(topic, 1): cq_pos // 20}
        self.args = dict(store_host=host, append_crc=append_crc, index_enable=index)
        self.ap = k.Appender(message_type=Message, result_type=PutMessageResult, ok_status=PutMessageStatus.PUT_OK,
                             store_host=host, append_crc=append_crc, max_message_size=max_message_size,
                             index_enable=index, queue_offsets=self.offsets, host_bytes=host_bytes,
                             delay_levels=delay_levels)
        self.ap.bind_commit_log(self.commit)
        self.ap.bind_index(self.index if index else None)
        self.ap.bind_queue(topic, 1, topic.encode(), self.cq, self.cq_file)

    def state(self):
        return (bytes(self.commit.mm), self.commit.wrote_position, bytes(self.cq_file.mm),
                self.cq_file.wrote_position, self.cq.max_physic_offset, bytes(self.index.mm), dict(self.offsets))


def steps(k, f, msg, store_ts):
    """What the step-by-step kernels write for *msg* on the same files, by
    the dispatch rules as rmqstore.dispatch writes them."""
    from rmqstore.config import StoreConfig
    from rmqstore.dispatch import gets_consume_queue_unit, gets_index_entries, tags_code

    props = msg.property_map()
    if f.args["append_crc"]:
        props.pop("__CRC32#", None)
    blob = msg.encode_properties(props)
    host = f.args["store_host"]
    born = host if msg.born_host is None else encode_host(msg.born_host)
    store = host if msg.store_host is None else encode_host(msg.store_host)
    sys_flag = msg.sys_flag & ~0x30 | (0x10 if len(born) == 20 else 0) | (0x20 if len(store) == 20 else 0)
    pos, cq_pos = f.commit.wrote_position, f.cq_file.wrote_position
    unit = gets_consume_queue_unit(sys_flag)
    qo = f.offsets[(f.topic, 1)] if unit else 0
    phy = f.commit.file_from_offset + pos
    born_ts = store_ts if msg.born_timestamp is None else msg.born_timestamp
    size = k.write_record(f.commit.mm, pos, msg.queue_id, msg.flag, qo, phy, sys_flag, born_ts, born, store_ts, store,
                          msg.reconsume_times, msg.prepared_transaction_offset, msg.body, f.topic.encode(), blob,
                          f.args["append_crc"])
    if unit:
        levels = f.delay_levels or ()
        cfg = StoreConfig(message_delay_level=" ".join(f"{d // 1000}s" for d in levels))
        k.cq_put(f.cq_file.mm, cq_pos, phy, size, tags_code(f.topic, props, store_ts, cfg))
    if f.args["index_enable"] and gets_index_entries(sys_flag):
        keys = [props["UNIQ_KEY"]] if props.get("UNIQ_KEY") else []
        keys += [x for x in (props.get("KEYS") or "").split(" ") if x]
        k.index_put_keys(f.index.mm, HSN, INUM, f.topic + "#", keys, phy, store_ts)
    f.commit.wrote_position += size
    if unit:
        f.cq_file.wrote_position += 20
        f.cq.max_physic_offset = phy + size
        f.offsets[(f.topic, 1)] = qo + 1
    msg_id = (store + struct.pack(">q", phy)).hex().upper()
    return PutMessageResult(PutMessageStatus.PUT_OK, msg_id, phy, size, qo, store_ts)


MESSAGES = [
    Message(TOPIC, b"hello", queue_id=1),
    Message(TOPIC, b"x" * 300, queue_id=1, tags="TagA", keys=["k1", "k2"], unique_key="U1", flag=7,
            born_timestamp=TS - 5, reconsume_times=2, sys_flag=0x8, prepared_transaction_offset=77),
    Message(TOPIC, bytearray(b"body"), queue_id=1, keys="  two  spaces ", properties={"a": "1", "TAGS": "T"}),
    Message(TOPIC, memoryview(b"mv"), queue_id=1, tags="T", properties={"TAGS": "T", "KEYS": "kk", "é": "ü"}),
    Message(TOPIC, b"", queue_id=1, properties={"__CRC32#": "123", "UNIQ_KEY": "u"}, keys="\U0001f600 k"),
    Message(TOPIC, b"z", queue_id=1, tags="", keys="", unique_key=""),
]


@pytest.mark.parametrize("host", [HOST, HOST6], ids=["v4", "v6"])
@pytest.mark.parametrize("append_crc", [False, True], ids=["", "crc"])
@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
def test_put_writes_what_the_steps_write(k, host, append_crc, index):
    fast, slow = Files(k, host, append_crc, index), Files(k, host, append_crc, index)
    for i, msg in enumerate(MESSAGES):
        assert fast.ap.check(msg)
        got = fast.ap.put(msg, TS + i)
        assert got == steps(k, slow, msg, TS + i)
        assert type(got) is PutMessageResult
        assert fast.state() == slow.state()


SCHEDULE = "SCHEDULE_TOPIC_XXXX"
DELAYS = (1000, 5000, 10000)


def _tx(sys_flag, **kw):
    return Message(TOPIC, b"tx", queue_id=1, sys_flag=sys_flag, keys="k1", unique_key="U", tags="T", **kw)


@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
@pytest.mark.parametrize("batch", [False, True], ids=["put", "put_batch"])
def test_transactions_are_written_as_the_dispatch_rules_say(k, index, batch):
    """Prepared (0x4) and rollback (0xC) records: no unit and queue offset
    0, index entries for prepared only; commit (0x8) and plain records get
    units and take the next queue offsets."""
    fast, slow = Files(k, index=index), Files(k, index=index)
    msgs = [_tx(0x4), _tx(0xC), _tx(0x8), _tx(0x0), _tx(0x4 | 0x1), _tx(0xC)]
    results: list = []
    if batch:
        assert fast.ap.put_batch(msgs, 0, lambda: TS, results) == (len(msgs), None)
    else:
        results = [fast.ap.put(m, TS) for m in msgs]
    want = [steps(k, slow, m, TS) for m in msgs]
    assert results == want
    assert [r.queue_offset for r in results] == [0, 0, 3, 4, 0, 0]
    assert fast.state() == slow.state()
    assert fast.ap.unit_timestamp == (TS if batch else -1)  # (the last put: a rollback)


def test_unit_timestamp_is_the_last_unit_of_the_call(k):
    f = Files(k)
    assert f.ap.unit_timestamp == -1
    f.ap.put(_tx(0x0), TS)
    assert f.ap.unit_timestamp == TS
    f.ap.put(_tx(0x4), TS + 1)  # a prepared record: no unit
    assert f.ap.unit_timestamp == -1
    results: list = []
    f.ap.put_batch([_tx(0x0), _tx(0x4)], 0, iter([TS + 2, TS + 3]).__next__, results)
    assert f.ap.unit_timestamp == TS + 2


@pytest.mark.parametrize("delay, level", [
    ("1", 1), ("2", 2), ("3", 3), ("9", 3), ("+2", 2), ("2147483647", 3), ("0", 0), ("-1", 0), ("", 0),
])
def test_schedule_topic_units_take_the_delay_rule(k, delay, level):
    fast = Files(k, topic=SCHEDULE, delay_levels=DELAYS)
    slow = Files(k, topic=SCHEDULE, delay_levels=DELAYS)
    msg = Message(SCHEDULE, b"later", queue_id=1, tags="T", properties={"DELAY": delay, "REAL_TOPIC": "X"})
    got = fast.ap.put(msg, TS)
    assert got == steps(k, slow, msg, TS)
    assert fast.state() == slow.state()
    code = struct.unpack_from(">q", fast.cq_file.mm, 60 + 12)[0]
    assert code == (TS + DELAYS[level - 1] if level else k.java_hash("T"))


@pytest.mark.parametrize("delay", ["x", "1.5", "+", "2147483648", " 1"])
def test_a_delay_java_cannot_parse_goes_step_by_step(k, delay):
    f = Files(k, topic=SCHEDULE, delay_levels=DELAYS)
    before = f.state()
    msg = Message(SCHEDULE, b"later", queue_id=1, properties={"DELAY": delay})
    assert f.ap.put(msg, TS) is None
    assert f.state() == before


def test_delays_without_a_table_and_delayed_messages_go_step_by_step(k):
    f = Files(k, topic=SCHEDULE)
    before = f.state()
    assert f.ap.put(Message(SCHEDULE, b"later", queue_id=1, properties={"DELAY": "1"}), TS) is None
    assert f.state() == before
    # a DELAY (or its shorthand) outside SCHEDULE_TOPIC_XXXX: the store's
    # step-by-step path moves the message there; the kernel writes nothing
    g = Files(k, delay_levels=DELAYS)
    before = g.state()
    for msg in (Message(TOPIC, b"delayed", queue_id=1, tags="T", properties={"DELAY": "2"}),
                Message(TOPIC, b"delayed", queue_id=1, tags="T", delay_level=2),
                Message(TOPIC, b"delayed", queue_id=1, tags="T", properties={"DELAY": "0"})):
        assert g.ap.put(msg, TS) is None
        assert g.state() == before


HOSTED = [  # born and store hosts the store encodes (encode_host), v4 and v6, each side
    Message(TOPIC, b"b4", queue_id=1, born_host="10.0.0.7:1234"),
    Message(TOPIC, b"s4", queue_id=1, store_host="192.168.1.1:10911", tags="T"),
    Message(TOPIC, b"b6", queue_id=1, born_host="[::1]:9876", keys="k1 k2"),
    Message(TOPIC, b"s6", queue_id=1, store_host="[fe80::1]:10911", unique_key="U"),
    Message(TOPIC, b"46", queue_id=1, born_host="10.0.0.7:1234", store_host="[2001:db8::5]:1"),
    Message(TOPIC, b"64", queue_id=1, born_host="[2001:db8::5]:1", store_host="10.0.0.7:1234", sys_flag=0x30),
]


@pytest.mark.parametrize("host", [HOST, HOST6], ids=["v4", "v6"])
@pytest.mark.parametrize("batch", [False, True], ids=["put", "put_batch"])
def test_messages_with_hosts_are_written_as_the_steps_write_them(k, host, batch):
    """Given the store's host encoder, a message's own born and store hosts
    go through the kernel: the same bytes, sys_flag bits and msgId (of the
    record's store host) as the step-by-step kernels write."""
    fast, slow = Files(k, host, host_bytes=encode_host), Files(k, host)
    msgs = list(HOSTED)
    if batch:
        refused, enc = fast.ap.check_all(msgs)
        assert refused == []
        results: list = []
        assert fast.ap.put_batch(msgs, 0, lambda: TS, results, enc) == (len(msgs), None)
    else:
        results = [fast.ap.put(m, TS) for m in msgs]
    assert results == [steps(k, slow, m, TS) for m in msgs]
    assert fast.state() == slow.state()


def test_hosts_the_encoder_refuses_go_step_by_step(k):
    """A host the encoder refuses, gives no 8 or 20 bytes for, or that is
    not a str, or no encoder at all: the message is declined, nothing
    written (the step-by-step path raises its error)."""
    def odd(host):
        return b"short" if host == "1.2.3.4:5" else encode_host(host)

    for host_bytes, host in ((encode_host, "not a host"), (encode_host, "1.2.3.4:99999999999"), (odd, "1.2.3.4:5"),
                             (encode_host, ("1.2.3.4", 5)), (None, "1.2.3.4:5")):
        f = Files(k, host_bytes=host_bytes)
        for slot in ("born_host", "store_host"):
            msg = Message(TOPIC, b"x", queue_id=1)
            setattr(msg, slot, host)
            before = f.state()
            assert f.ap.put(msg, TS) is None and not f.ap.check(msg)
            assert f.ap.check_all([msg])[0] == [0]
            assert f.state() == before


@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
def test_put_batch_writes_what_puts_write(k, index):
    """One put_batch call leaves the bytes, positions, results and clock
    readings of one put per message (the core holds the files once)."""
    fast, slow = Files(k, index=index), Files(k, index=index)
    readings = iter(range(TS, TS + 100))
    results: list = []
    assert fast.ap.put_batch(MESSAGES, 0, lambda: next(readings), results) == (len(MESSAGES), None)
    assert results == [slow.ap.put(m, TS + i) for i, m in enumerate(MESSAGES)]
    assert all(type(r) is PutMessageResult for r in results)
    assert fast.state() == slow.state()
    assert next(readings) == TS + len(MESSAGES)  # one reading per message


@pytest.mark.parametrize("checked", [False, True], ids=["", "checked"])
@pytest.mark.parametrize("why", ["declined", "file full", "bad clock", "no index file"])
def test_put_batch_stops_where_put_declines(k, why, checked):
    """Stops at the first message put declines, handing back its index and
    the clock reading it took; what came before is written, nothing after."""
    f, ref = Files(k), Files(k)
    msgs = [Message(TOPIC, b"m%d" % i + bytes(200), queue_id=1) for i in range(8)]
    stop = 0 if why == "no index file" else 5
    readings = list(range(TS, TS + 8))
    if why == "no index file":  # (not created yet: the step-by-step path creates it)
        f.ap.bind_index(None)
    elif why == "declined":
        msgs[stop] = Message(TOPIC, b"other queue", queue_id=2)
    elif why == "file full":
        size = Files(k).ap.put(msgs[0], TS).wrote_bytes  # (all of one size)
        f.commit.wrote_position = ref.commit.wrote_position = CL_SIZE - stop * size - 8  # the end blank's 8
    else:
        readings[stop] = "not a time"
    clock = iter(readings)
    results: list = []
    enc = f.ap.check_all(msgs)[1] if checked else None
    assert f.ap.put_batch(msgs, 0, lambda: next(clock), results, enc) == (stop, readings[stop])
    assert results == [ref.ap.put(m, TS + i) for i, m in enumerate(msgs[:stop])]
    assert f.state() == ref.state()
    if why != "no index file":
        got = f.ap.put_batch(msgs, stop + 1, lambda: next(clock), results, enc)[0]
        assert got == (stop + 1 if why == "file full" else 8)


def test_put_batch_reads_the_wall_clock_and_refuses_bad_arguments(k):
    import time

    f = Files(k)
    results: list = []
    before = time.time_ns() // 1_000_000
    assert f.ap.put_batch(MESSAGES[:2], 0, None, results) == (2, None)
    assert before <= results[0].store_timestamp <= results[1].store_timestamp <= time.time_ns() // 1_000_000
    assert f.ap.put_batch(MESSAGES, 6, None, results) == (6, None)  # nothing left
    with pytest.raises(TypeError):
        f.ap.put_batch(tuple(MESSAGES), 0, None, results)
    with pytest.raises(TypeError):
        f.ap.check_all(tuple(MESSAGES))
    f.ap.unbind()
    assert f.ap.put_batch(MESSAGES, 0, None, results) == (0, None)  # no CommitLog file: no reading either
    assert len(results) == 2


@pytest.mark.parametrize("host", [HOST, HOST6], ids=["v4", "v6"])
@pytest.mark.parametrize("append_crc", [False, True], ids=["", "crc"])
@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
def test_put_batch_writes_what_check_all_encoded(k, host, append_crc, index):
    """Given check_all's encodings, put_batch writes what one put per
    message writes, without encoding a message twice."""
    fast, slow = Files(k, host, append_crc, index), Files(k, host, append_crc, index)
    msgs = list(MESSAGES)
    refused, enc = fast.ap.check_all(msgs)
    assert refused == []
    readings = iter(range(TS, TS + 100))
    results: list = []
    assert fast.ap.put_batch(msgs, 0, lambda: next(readings), results, enc) == (len(msgs), None)
    assert results == [slow.ap.put(m, TS + i) for i, m in enumerate(msgs)]
    assert fast.state() == slow.state()


def test_a_checked_message_is_written_as_checked(k):
    """With check_all's encodings each message is read once, when checked:
    changing it afterwards changes nothing written, and a message put in
    its place in the list is encoded afresh."""
    f, ref = Files(k), Files(k)
    msgs = [Message(TOPIC, b"one", queue_id=1, tags="A", keys="k1 k2"), Message(TOPIC, b"two", queue_id=1),
            Message(TOPIC, b"three", queue_id=1)]
    expected = [Message(TOPIC, b"one", queue_id=1, tags="A", keys="k1 k2"), msgs[1],
                Message(TOPIC, b"other", queue_id=1, unique_key="U")]
    _, enc = f.ap.check_all(msgs)
    msgs[0].tags, msgs[0].keys, msgs[0].body, msgs[0].flag = "changed", None, b"a longer body", 9
    msgs[2] = expected[2]
    results: list = []
    assert f.ap.put_batch(msgs, 0, lambda: TS, results, enc) == (3, None)
    assert results == [ref.ap.put(m, TS) for m in expected]
    assert f.state() == ref.state()


def _rebind(f, change):
    """Bindings changed after a check: "queue rebound" binds a new last
    queue file (f.last, at queue offset 11), "queue unbound" and "index
    unbound" unbind; anything else changes nothing."""
    if change == "queue rebound":
        f.last = _region(f.k, mm=bytearray(CQ_SIZE), file_from_offset=CQ_SIZE, file_size=CQ_SIZE, wrote_position=20)
        f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), f.cq, f.last)
    elif change == "queue unbound":
        f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), f.cq, None)
    elif change == "index unbound":
        f.ap.bind_index(None)


@pytest.mark.parametrize("change", ["queue rebound", "queue unbound", "index unbound", "other list"])
def test_check_all_encodings_follow_the_bindings(k, change):
    """An encoding made for a queue since rebound is made afresh (and goes
    where the new binding says); encodings for a list of another length are
    not used at all: the messages are read again (here: changed since)."""
    f, ref = Files(k), Files(k)
    msgs = [Message(TOPIC, b"m%d" % i, queue_id=1, keys=f"k{i}") for i in range(3)]
    _, enc = f.ap.check_all(msgs[:2] if change == "other list" else msgs)
    for m in msgs:
        m.body = m.body.upper()
    for g in (f, ref):
        _rebind(g, change)
    before = f.state()
    results: list = []
    got = f.ap.put_batch(msgs, 0, lambda: TS, results, enc)
    if change in ("queue unbound", "index unbound"):
        assert got == (0, TS) and f.state() == before
        return
    assert got == (3, None)
    assert results == [ref.ap.put(m, TS) for m in msgs]
    assert [r.queue_offset for r in results] == ([11, 12, 13] if change == "queue rebound" else [3, 4, 5])
    assert f.state() == ref.state()
    if change == "queue rebound":
        assert (f.last.wrote_position, f.cq_file.wrote_position) == (80, 60)


def test_put_batch_refuses_foreign_encodings(k):
    f = Files(k)
    for wrong in (object(), ([], None), [None] * len(MESSAGES)):
        with pytest.raises(TypeError):
            f.ap.put_batch(list(MESSAGES), 0, None, [], wrong)
    assert f.commit.wrote_position == 100


def test_a_put_re_entering_a_put_call_is_refused(k):
    """The core keeps a call's positions in C until the call ends, so a put
    made from inside one (here by the clock) is refused with a RuntimeError
    rather than written over; what the call wrote before is written back
    exactly, and the Appender goes on afterwards. The twin refuses it as
    well, so that both behave alike."""
    f, ref = Files(k), Files(k)
    msgs = [Message(TOPIC, b"m%d" % i, queue_id=1, keys=f"k{i}") for i in range(4)]
    readings = iter(range(TS, TS + 10))

    def clock():
        t = next(readings)
        if t == TS + 2:  # the third reading: rows 0 and 1 are written, the files held
            f.ap.put(Message(TOPIC, b"nested", queue_id=1), t)
        return t

    results: list = []
    with pytest.raises(RuntimeError, match="inside another put"):
        f.ap.put_batch(msgs, 0, clock, results)
    assert results == [ref.ap.put(m, TS + i) for i, m in enumerate(msgs[:2])]
    assert f.state() == ref.state()
    assert f.ap.put(msgs[2], TS + 5) == ref.ap.put(msgs[2], TS + 5)
    assert f.state() == ref.state()


def test_core_results_leave_the_gc_alone_unless_their_type_has_a_dict():
    """A batch's PutMessageResults are not traversed by the young
    collections that run while it is put: the core hands them out untracked
    (they hold ints, the msgId and the shared status). A result type with a
    __dict__ could be made part of a cycle, so its results stay tracked."""
    import gc

    core = _need_core()
    f = Files(core)
    results: list = []
    assert f.ap.put_batch(MESSAGES, 0, None, results) == (len(MESSAGES), None)
    assert [gc.is_tracked(r) for r in results] == [False] * len(MESSAGES)
    assert not gc.is_tracked(f.ap.put(MESSAGES[0], TS))

    class WithDict(PutMessageResult):
        pass

    g = Files(core)
    g.ap = core.Appender(Message, WithDict, PutMessageStatus.PUT_OK, HOST, False, 1024, True, g.offsets)
    g.ap.bind_commit_log(g.commit)
    g.ap.bind_index(g.index)
    g.ap.bind_queue(TOPIC, 1, TOPIC.encode(), g.cq, g.cq_file)
    got = g.ap.put(MESSAGES[0], TS)
    assert type(got) is WithDict and gc.is_tracked(got)
    got.cycle = got  # what tracking is for: collected once unreachable
    del got
    assert gc.collect() >= 1


def test_check_all_lists_what_check_refuses(k):
    f = Files(k, max_message_size=100)
    msgs = [Message(TOPIC, b"ok", queue_id=1), Message(TOPIC, bytes(101), queue_id=1),
            Message(TOPIC, b"ok", queue_id=2), Message(TOPIC, b"ok", queue_id=1)]
    refused, _ = f.ap.check_all(msgs)
    assert refused == [i for i, m in enumerate(msgs) if not f.ap.check(m)] == [1, 2]


def test_check_all_takes_valid_messages_of_unbound_queues_given_their_topics(k):
    """With topic_bytes and file_size, check_all checks a message of an
    unbound queue (or with no CommitLog file bound) against its topic's
    bytes and the file size: valid ones are taken, the rest refused as
    check refuses them; topic_bytes is asked once per topic."""
    f = Files(k, max_message_size=1000)
    asked = []

    def topic_bytes(topic):
        asked.append(topic)
        return None if topic == "Refused" else topic.encode()

    msgs = [Message(TOPIC, b"bound", queue_id=1), Message(TOPIC, b"new queue", queue_id=2),
            Message("Other", b"new topic", queue_id=0, keys="a b"), Message("Refused", b"x", queue_id=0),
            Message("Other", bytes(1001), queue_id=0), Message("Other", b"p", queue_id=5, sys_flag=0x4),
            Message("Other", b"born host", queue_id=5, born_host="1.2.3.4:5"), Message("Other", bytes(990), queue_id=3)]
    assert f.ap.check_all(msgs)[0] == [1, 2, 3, 4, 5, 6, 7]
    refused, _ = f.ap.check_all(msgs, topic_bytes, 4096)
    assert refused == [3, 4, 6] and asked == [TOPIC, "Other", "Refused"]
    assert f.ap.check_all(msgs, topic_bytes, 1200)[0] == [3, 4, 6]  # (the bound file's size counts)
    f.ap.unbind()  # no CommitLog or index file either: checked against file_size
    assert f.ap.check_all(msgs, topic_bytes, 4096)[0] == [3, 4, 6]
    assert f.ap.check_all(msgs, topic_bytes, 1050)[0] == [3, 4, 6, 7]  # 990 B of body fit no 1050-byte file
    assert f.ap.check_all(msgs)[0] == list(range(8))
    assert f.ap.check_all(msgs, lambda t: t, 4096)[0] == list(range(8))  # str, not bytes: refused
    for args in ((topic_bytes, None), (None, 4096)):
        with pytest.raises(TypeError):
            f.ap.check_all(msgs, *args)


def test_put_batch_writes_unbound_queues_messages_once_bound(k):
    """What check_all took for an unbound queue is not written through a
    placeholder: put_batch stops at it (the step-by-step path binds the
    queue), then writes the rest as one put per message would; a put
    within topic_bytes finds the queue unbound too."""
    fast, slow = Files(k), Files(k)
    msgs = [Message(TOPIC, b"a", queue_id=1), Message(TOPIC, b"b", queue_id=2, keys="k"),
            Message(TOPIC, b"c", queue_id=2), Message(TOPIC, b"d", queue_id=1)]

    def topic_bytes(topic):
        assert fast.ap.put(Message(topic, b"inside", queue_id=2), TS) is None
        return topic.encode()

    refused, enc = fast.ap.check_all(msgs, topic_bytes, CL_SIZE)
    assert refused == []
    results: list = []
    before = fast.state()
    assert fast.ap.put_batch(msgs, 0, lambda: TS, results, enc) == (1, TS)
    assert len(results) == 1 and fast.state() != before
    for g in (fast, slow):  # what the step-by-step path does for msgs[1] (here: bind the queue)
        g.cq2 = _region(g.k, mm=bytearray(CQ_SIZE), file_from_offset=0, file_size=CQ_SIZE, wrote_position=20)
        g.ap.bind_queue(TOPIC, 2, TOPIC.encode(), _of(g.k.ConsumeQueueBase, max_physic_offset=0), g.cq2)
        g.offsets[(TOPIC, 2)] = 1
    assert fast.ap.put_batch(msgs, 2, lambda: TS, results, enc) == (4, None)
    assert results == [slow.ap.put(m, TS) for m in (msgs[0], msgs[2], msgs[3])]
    assert fast.state() == slow.state() and bytes(fast.cq2.mm) == bytes(slow.cq2.mm)


@pytest.mark.parametrize("case", [
    "not a message", "subclass", "unset slot", "unbound queue", "born host", "store host", "tags twice",
    "non-str property", "property dict subclass", "too large", "properties too long", "int field", "body type",
    "int subclass field", "str subclass tags",
])
def test_declines_for_the_step_by_step_path(k, case):
    f = Files(k)
    msg = Message(TOPIC, b"body", queue_id=1, tags="T")
    if case == "not a message":
        msg = SimpleNamespace(**{s: getattr(msg, s) for s in MESSAGE_FIELDS})
    elif case == "subclass":
        msg = type("Sub", (Message,), {})(TOPIC, b"body", queue_id=1)
    elif case == "unset slot":
        del msg.flag
    elif case == "unbound queue":
        msg.queue_id = 2
    elif case == "born host":
        msg.born_host = "1.2.3.4:5"
    elif case == "store host":
        msg.store_host = "1.2.3.4:5"
    elif case == "tags twice":
        msg.properties = {"TAGS": "other"}
    elif case == "non-str property":
        msg.properties = {"a": 1}
    elif case == "property dict subclass":
        msg.properties = type("D", (dict,), {})(a="1")
    elif case == "too large":
        msg.body = b"x" * 1025
    elif case == "properties too long":
        msg.properties = {"a": "v" * 32767}
    elif case == "int field":
        msg.flag = 1 << 31
    elif case == "body type":
        msg.body = "text"
    elif case == "int subclass field":  # (exact types only: no user code runs mid-encode)
        msg.flag = type("I", (int,), {})(1)
    elif case == "str subclass tags":
        msg.tags = type("S", (str,), {})("T")
    before = f.state()
    assert not f.ap.check(msg)
    assert f.ap.put(msg, TS) is None
    assert f.state() == before


@pytest.mark.parametrize("case", [
    "no commit file", "no index file", "file full", "queue file full", "queue start", "queue position",
    "max physical offset", "index full", "index past",
])
def test_declines_where_files_stand(k, case):
    f = Files(k)
    msg = Message(TOPIC, b"body", queue_id=1, keys="a b")
    if case == "no commit file":
        f.ap.bind_commit_log(None)
    elif case == "no index file":
        f.ap.bind_index(None)
    elif case == "file full":
        f.commit.wrote_position = CL_SIZE - 100  # a record + the 8-byte end blank do not fit
    elif case == "queue file full":
        f.cq_file.wrote_position = CQ_SIZE
    elif case == "queue start":  # an empty file the queue's next offset is not the first of: blanks are owed
        f.cq_file.wrote_position, f.offsets[(TOPIC, 1)] = 0, 3
    elif case == "queue position":
        f.cq_file.wrote_position += 1  # not at a unit boundary
    elif case == "max physical offset":
        f.cq.max_physic_offset = 1 << 40
    elif case == "index full":
        struct.pack_into(">i", f.index.mm, 36, INUM - 1)  # room for one key, not two
    elif case == "index past":
        struct.pack_into(">q", f.index.mm, 24, 8192 + 100)  # indexed up to this record already
    before = f.state()
    assert f.ap.put(msg, TS) is None
    assert f.state() == before
    if case in ("no commit file", "no index file"):
        assert not f.ap.check(msg)


@pytest.mark.parametrize("known", [True, False])
def test_an_empty_queue_file_takes_the_queue_s_next_unit(k, known):
    """A file made for a queue (a new queue's first, or the file after a full
    one) takes its first unit from the Appender when the store's next queue
    offset is the file's first (no record of the queue yet: 0)."""
    f = Files(k, cq_pos=0)
    if not known:
        del f.offsets[(TOPIC, 1)]
    r = f.ap.put(Message(TOPIC, b"body", queue_id=1, keys="a b"), TS)
    assert r is not None and r.queue_offset == 0
    assert f.cq_file.wrote_position == 20 and f.offsets[(TOPIC, 1)] == 1
    assert struct.unpack_from(">qiq", f.cq_file.mm, 0)[:2] == (r.wrote_offset, r.wrote_bytes)


def test_unbind_and_rebinding_a_queue(k):
    f = Files(k)
    msg = Message(TOPIC, b"body", queue_id=1)
    f.ap.unbind()
    assert f.ap.put(msg, TS) is None
    f.ap.bind_commit_log(f.commit)
    f.ap.bind_index(f.index)
    assert f.ap.put(msg, TS) is None  # the queue is still unbound
    f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), f.cq, f.cq_file)
    assert f.ap.put(msg, TS).queue_offset == 3
    f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), f.cq, None)
    assert f.ap.put(msg, TS) is None


def test_puts_find_each_queue_as_bound(k):
    """Queues that share the core's lookup slot (queue ids 1 and 17, two
    topics with queue id 1), a topic equal to but not the bound str, and
    rebinding (a file roll) under puts: every unit lands in its queue's
    current file, at its queue's next offset."""
    f = Files(k)
    other = "Other"
    cqs = {}

    def bind(topic, qid):
        # (a file's first unit goes step by step: start at its second)
        cq_file = _region(k, mm=bytearray(CQ_SIZE), file_from_offset=0, file_size=CQ_SIZE, wrote_position=20)
        cq = _of(k.ConsumeQueueBase, max_physic_offset=0)
        f.ap.bind_queue(topic, qid, topic.encode(), cq, cq_file)
        f.offsets[(topic, qid)] = 1
        cqs[(topic, qid)] = cq_file

    for topic, qid in [(TOPIC, 1), (TOPIC, 17), (other, 1)]:
        bind(topic, qid)
    written = {}

    def put(topic, qid):
        r = f.ap.put(Message(topic, b"b", queue_id=qid), TS)
        unit = bytes(cqs[(topic, qid)].mm[20 * r.queue_offset : 20 * r.queue_offset + 8])
        assert struct.unpack(">q", unit)[0] == r.wrote_offset
        written.setdefault((topic, qid), []).append(r.queue_offset)

    for _ in range(3):
        put(TOPIC, 1)
        put(TOPIC, 17)
        put(other, 1)
        put("".join(["Topic", "Test"]), 1)  # noqa: FLY002 (equal to TOPIC, another object)
    put(TOPIC, 1)
    assert written == {(TOPIC, 1): [1, 2, 3, 4, 5, 6, 7], (TOPIC, 17): [1, 2, 3], (other, 1): [1, 2, 3]}
    assert f.offsets == {(TOPIC, 1): 8, (TOPIC, 17): 4, (other, 1): 4}
    old = cqs[(TOPIC, 1)]
    bind(TOPIC, 1)  # a new last file: the old one takes no more units
    put(TOPIC, 1)
    assert written[(TOPIC, 1)][-1] == 1 and old.wrote_position == 160 and cqs[(TOPIC, 1)].wrote_position == 40
    put(other, 1)
    f.ap.unbind()
    f.ap.bind_commit_log(f.commit)
    f.ap.bind_index(f.index)
    assert f.ap.put(Message(other, b"b", queue_id=1), TS) is None  # unbound, though found just before
    bind(other, 1)
    put(other, 1)
    assert written[(other, 1)][-1] == 1


def test_bad_bindings_raise(k):
    f = Files(k)
    if k is not _pure:  # the core takes its own state classes (MappedFile is a MappedRegion), nothing else
        for bind in (f.ap.bind_commit_log, lambda mf: f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), f.cq, mf)):
            with pytest.raises(TypeError):
                bind(SimpleNamespace(mm=bytearray(CQ_SIZE), file_from_offset=0, file_size=CQ_SIZE, wrote_position=0))
        with pytest.raises(TypeError):
            f.ap.bind_queue(TOPIC, 1, TOPIC.encode(), SimpleNamespace(max_physic_offset=0), f.cq_file)
        with pytest.raises(TypeError):
            f.ap.bind_index(SimpleNamespace(mm=bytearray(INDEX_SIZE), hash_slot_num=HSN, index_num=INUM))
    with pytest.raises(ValueError):
        f.ap.bind_index(_of(k.IndexRegion, mm=bytearray(INDEX_SIZE - 1), hash_slot_num=HSN, index_num=INUM))
    with pytest.raises(TypeError):
        f.ap.bind_queue(TOPIC, 1, TOPIC, f.cq, f.cq_file)
    f.commit.mm = bytes(CL_SIZE)
    f.ap.bind_commit_log(f.commit)
    with pytest.raises(TypeError):
        f.ap.put(Message(TOPIC, b"x", queue_id=1), TS)
    with pytest.raises(ValueError):
        k.Appender(Message, PutMessageResult, PutMessageStatus.PUT_OK, b"short", False, 10, True, {})
    with pytest.raises(TypeError):
        k.Appender(Message, dict, PutMessageStatus.PUT_OK, HOST, False, 10, True, {})


_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=12)


@FAST
@given(
    tags=st.none() | _text, keys=st.none() | _text, uniq=st.none() | _text,
    props=st.none() | st.dictionaries(_text.filter(bool), _text, max_size=4),
    body=st.binary(max_size=64), append_crc=st.booleans(), born=st.none() | st.integers(-(1 << 63), (1 << 63) - 1),
)
def test_core_and_pure_agree_with_the_steps(tags, keys, uniq, props, body, append_crc, born):
    core = _need_core()
    try:
        msg = Message(TOPIC, body, queue_id=1, tags=tags, keys=keys, unique_key=uniq, properties=props,
                      born_timestamp=born)
        msg.property_map()
    except Exception:  # noqa: BLE001 - contradicting shorthands: the step-by-step path raises
        for impl in (core, _pure):
            assert Files(impl, append_crc=append_crc).ap.put(msg, TS) is None
        return
    states = []
    for impl in (core, _pure):
        fast, slow = Files(impl, append_crc=append_crc), Files(impl, append_crc=append_crc)
        assert fast.ap.put(msg, TS) == steps(impl, slow, msg, TS)
        assert fast.state() == slow.state()
        states.append(fast.state())
    assert states[0] == states[1]


# --- pull_units -----------------------------------------------------------

FS = 2048  # CommitLog file size of the pull fixtures


def pull_fixture(k, n=6, base=4096):
    """Two CommitLog segments from *base* holding records of TOPIC queue 1 at
    queue offsets 10.. (every third with an IPv6 store host), and their units."""
    segs = [bytearray(FS), bytearray(FS)]
    cq = bytearray(20 * (n + 2))
    pos, seg = 0, 0
    for i in range(n):
        host = HOST6 if i % 3 == 2 else HOST
        flag = 0x30 if len(host) == 20 else 0
        props = f"TAGS\x01T{i}\x02".encode()
        body = bytes([i]) * (50 + 100 * i)
        size = k.record_size(flag, len(body), len(TOPIC), len(props), False)
        if pos + size > FS:
            seg, pos = seg + 1, 0
        phy = base + seg * FS + pos
        k.write_record(segs[seg], pos, 1, i, 10 + i, phy, flag, TS + i, host, TS + 100 + i, host, 0, 0,
                       body, TOPIC.encode(), props, False)
        k.cq_put(cq, 20 * i, phy, size, k.java_hash(f"T{i}"))
        pos += size
    assert seg == 1  # the records span both segments
    view = (segs, FS, base, base, base + seg * FS + pos)
    return segs, cq, view


def expected(k, view, cq, count):
    segs, fs, base = view[0], view[1], view[2]
    out = []
    for phy, _size, _ in k.cq_units(cq, 0, 20 * count):
        seg = (phy - base) // fs
        out.append(MessageExt(k.decode_record(segs[seg], phy - base - seg * fs, True)))
    return out


def pull(k, cq, view, start=0, end=None, max_count=100, cl_min=0, out=None, topic=TOPIC, qid=1, q0=10):
    out = [] if out is None else out
    end = 20 * 6 if end is None else end
    r = k.pull_units(cq, start, end, view, topic, qid, q0, max_count, cl_min, 4096, MessageExt, out)
    return r, out


def test_pull_units_builds_what_decode_record_builds(k):
    _segs, cq, view = pull_fixture(k)
    (done, event, stopped), out = pull(k, cq, view)
    assert (done, event, stopped) == (6, GetMessageStatus.FOUND, False)
    want = expected(k, view, cq, 6)
    assert out == want
    for m, w in zip(out, want):  # every slot, the lazily parsed ones included
        assert m.to_dict() == w.to_dict() and m.msg_id == w.msg_id and m.tags == w.tags
    assert {m.store_host for m in out} == {"10.0.0.1:10911", "[1:203:405:607:809:a0b:c0d:e0f]:10911"}
    assert [m.queue_offset for m in out] == list(range(10, 16))


def test_pull_units_fields_that_repeat_and_change(k):
    """The core keeps one object per field value records repeat (hosts,
    size, store time, born time equal to it): runs of equal values and
    values that change back and forth still read as decode_record reads."""
    seg, cq = bytearray(FS), bytearray(20 * 8)
    pos = 0
    stores = [TS, TS, TS + 1, TS + 1, TS, TS + 2, TS + 2, TS + 2]
    borns = [TS, TS - 3, TS + 1, TS + 1, TS, TS + 2, 0, TS + 2]  # (equal to the store time, or not)
    bodies = [b"a" * 9, b"b" * 9, b"c" * 9, b"d" * 10, b"e" * 9, b"f" * 9, b"g" * 9, b"h" * 11]
    for i, (store_ts, born_ts, body) in enumerate(zip(stores, borns, bodies)):
        host = HOST6 if i in (3, 4) else HOST
        flag = 0x30 if len(host) == 20 else 0
        size = k.write_record(seg, pos, 1, 0, 10 + i, 4096 + pos, flag, born_ts, host, store_ts, host, 0, 0, body,
                              TOPIC.encode(), b"", False)
        k.cq_put(cq, 20 * i, 4096 + pos, size, 0)
        pos += size
    view = ([seg], FS, 4096, 4096, 4096 + pos)
    (done, _, stopped), out = pull(k, cq, view, end=20 * 8)
    assert (done, stopped) == (8, False)
    want = expected(k, view, cq, 8)
    assert [m._stored() for m in out] == [m._stored() for m in want]
    assert [m.store_timestamp for m in out] == stores and [m.born_timestamp for m in out] == borns
    assert [m.store_size for m in out] == [m.store_size for m in want]


def test_pull_units_stops_at_max_count_and_appends(k):
    _segs, cq, view = pull_fixture(k)
    first = [object()]
    (done, event, stopped), out = pull(k, cq, view, max_count=3, out=first)
    assert (done, event, stopped) == (2, GetMessageStatus.FOUND, False) and len(out) == 3
    (done, event, stopped), out = pull(k, cq, view, start=40, max_count=2, q0=12)
    assert (done, event, stopped) == (2, GetMessageStatus.FOUND, False)
    assert out == expected(k, view, cq, 4)[2:]


def test_pull_units_skips_placeholders_and_cleaned_records(k):
    _segs, cq, view = pull_fixture(k)
    second_seg = view[2] + FS
    units = k.cq_units(cq, 0, 120)
    k.cq_put(cq, 20, 0, 0x7FFFFFFF, 0)  # a pre-blank placeholder at queue offset 11
    (done, event, stopped), out = pull(k, cq, view, cl_min=second_seg)
    assert (done, event, stopped) == (6, GetMessageStatus.FOUND, False)
    assert out == [m for m in expected(k, view, cq, 6) if m.physical_offset >= second_seg]
    assert len(out) == sum(1 for phy, _, _ in units if phy >= second_seg) > 0
    (done, event, stopped), out = pull(k, cq, view, end=20, cl_min=second_seg)
    assert (done, event, stopped, out) == (1, GetMessageStatus.MESSAGE_WAS_REMOVING, False, [])  # a cleaned-up record
    (done, event, stopped), out = pull(k, cq, view, start=20, end=40, q0=11)
    assert (done, event, stopped, out) == (1, None, False, [])  # a placeholder alone: no status


@pytest.mark.parametrize("case", ["size", "queue offset", "queue id", "topic", "past the end", "garbage",
                                  "below the first segment"])
def test_pull_units_stops_where_the_unit_is_not_its_record(k, case):
    segs, cq, view = pull_fixture(k)
    phy, size, tags = k.cq_get(cq, 40)  # the third unit
    kw = {}
    if case == "size":
        k.cq_put(cq, 40, phy, size + 1, tags)
    elif case == "queue offset":
        kw["q0"] = 9
    elif case == "queue id":
        kw["qid"] = 2
    elif case == "topic":
        kw["topic"] = "TopicTesT"
    elif case == "past the end":
        k.cq_put(cq, 40, view[4], size, tags)
    elif case == "garbage":
        k.cq_put(cq, 40, phy + 4, size, tags)
    elif case == "below the first segment":
        view = (segs, FS, view[2], 0, view[4])
        k.cq_put(cq, 40, 100, size, tags)
    (done, event, stopped), out = pull(k, cq, view, **kw)
    if case in ("queue offset", "queue id", "topic"):
        assert (done, stopped, out) == (0, True, [])  # the first unit already disagrees
    else:
        assert (done, event, stopped) == (2, GetMessageStatus.FOUND, True)
        assert out == expected(k, view, cq, 2)


def test_pull_units_refuses_bad_arguments(k):
    segs, cq, view = pull_fixture(k)
    with pytest.raises(TypeError):
        k.pull_units(cq, 0, 20, view, TOPIC, 1, 10, 5, 0, 4096, SimpleNamespace, [])
    with pytest.raises(TypeError):
        k.pull_units(cq, 0, 20, view, TOPIC.encode(), 1, 10, 5, 0, 4096, MessageExt, [])
    for start, end in ((0, 30), (-20, 20), (40, 20), (0, len(cq) + 20)):
        with pytest.raises(ValueError):
            k.pull_units(cq, start, end, view, TOPIC, 1, 10, 5, 0, 4096, MessageExt, [])
    with pytest.raises(ValueError):
        k.pull_units(cq, 0, 20, (segs, 0, 0, 0, 0), TOPIC, 1, 10, 5, 0, 4096, MessageExt, [])
    with pytest.raises(TypeError):  # a view holds a list of buffers
        k.pull_units(cq, 0, 20, (tuple(segs),) + view[1:], TOPIC, 1, 10, 5, 0, 4096, MessageExt, [])


# --- read_keyed -------------------------------------------------------------


def keyed_fixture(k, base=4096):
    """Records of several topics and key properties over two segments;
    returns (view, [physical offset of each record])."""
    props = [
        b"UNIQ_KEY\x01K\x02", b"KEYS\x01a K b\x02", b"KEYS\x01K\x02UNIQ_KEY\x01u\x02", b"KEYS\x01Kx\x02",
        b"KEYS\x01\x02UNIQ_KEY\x01K\x02", b"UNIQ_KEY\x01K\x02UNIQ_KEY\x01z\x02", b"KEYS\x01  K  \x02", b"",
        b"KEYS\x01\xff \xe9\x02", b"TAGS\x01t\x02KEYS\x01x\x02KEYS\x01K\x02",
    ]
    segs = [bytearray(FS), bytearray(FS)]
    offsets, pos, seg = [], 0, 0
    for i, blob in enumerate(props * 2):
        topic = (TOPIC if i % 7 else "Other").encode()  # every property set under TOPIC, three under Other too
        size = k.record_size(0, 40, len(topic), len(blob), False)
        if pos + size > FS:
            seg, pos = seg + 1, 0
        phy = base + seg * FS + pos
        k.write_record(segs[seg], pos, 1, 0, i, phy, 0, TS, HOST, TS, HOST, 0, 0, bytes(40), topic, blob, False)
        offsets.append(phy)
        pos += size
    return (segs, FS, base, base, base + seg * FS + pos), offsets


def keyed_reference(k, view, offsets, topic, key):
    """query_messages' verification as the store did it step by step."""
    segs, fs, base, lo, hi = view
    out, seen = [], set()
    for phy in offsets:
        if phy in seen or phy < lo:
            continue
        seen.add(phy)
        seg = (phy - base) // fs
        if phy >= hi or phy < base or seg >= len(segs):
            continue
        fields = k.read_record(segs[seg], phy - base - seg * fs, min(fs, hi - base - seg * fs), phy, 4096, True)
        if type(fields) is not tuple or fields[15] != topic:
            continue
        props = k.parse_properties(fields[16])
        if props.get("UNIQ_KEY") == key or key in (props.get("KEYS") or "").split(" "):
            out.append(MessageExt(fields))
    return out


@pytest.mark.parametrize("key", ["K", "u", "a", "Kx", "", "z", "\ufffd", "\ud800", "missing"])
def test_read_keyed_keeps_what_verification_keeps(k, key):
    view, offsets = keyed_fixture(k)
    segs = view[0]
    damaged = offsets[13]
    seg = (damaged - view[2]) // FS
    segs[seg][damaged - view[2] - seg * FS + 4] ^= 0xFF  # a magic code no more
    asked = offsets + offsets[:4] + [view[4], view[2] - 20, 7, damaged + 1]  # repeats, past the end, nowhere
    lo_view = (segs, FS, view[2], offsets[2], view[4])  # the first two records cleaned up
    for v in (view, lo_view):
        want = keyed_reference(k, v, asked, TOPIC, key)
        out = []
        assert k.read_keyed(v, asked, TOPIC, key, 4096, MessageExt, out) is None
        assert out == want
        assert [m.to_dict() for m in out] == [m.to_dict() for m in want]
    if key == "K":
        assert len(want) >= 5
    if key == "\ufffd":  # an invalid byte read back as U+FFFD matches as text
        assert len(want) == 2


def test_read_keyed_refuses_bad_arguments(k):
    view, offsets = keyed_fixture(k)
    for args in ((view, tuple(offsets), TOPIC, "K"), (view, offsets, TOPIC, b"K"), (view, offsets, None, "K")):
        with pytest.raises(TypeError):
            k.read_keyed(*args, 4096, MessageExt, [])
    with pytest.raises(TypeError):
        k.read_keyed(view, offsets, TOPIC, "K", 4096, SimpleNamespace, [])
    with pytest.raises(ValueError):
        k.read_keyed((view[0], 0) + view[2:], offsets, TOPIC, "K", 4096, MessageExt, [])
    with pytest.raises(TypeError):
        k.read_keyed((tuple(view[0]),) + view[1:], offsets, TOPIC, "K", 4096, MessageExt, [])


# --- put_columns / check_columns ------------------------------------------------


@pytest.mark.parametrize("checked", [False, True], ids=["", "checked"])
def test_put_columns_writes_what_put_writes(k, checked):
    """Rows of columns are the Messages of those fields: the same bytes as
    put() of each, with one store timestamp, their offsets in the arrays
    (from check_columns' encodings, or encoded afresh)."""
    import numpy as np

    rows = [(b"a" * 40, 1, "TagA", "k1 k2", "U1"), (bytearray(b"b"), 1, None, None, None),
            (memoryview(b"cc"), 1, "", "", ""), (b"d" * 300, 1, "T\u00e9", " x  y ", "\U0001f600")]
    bodies, qids, tags, keys, uniqs = (list(c) for c in zip(*rows))
    fast, slow = Files(k), Files(k)
    n = len(rows)
    stop, enc = fast.ap.check_columns(TOPIC, bodies, qids, tags, keys, uniqs, 0)
    assert stop == n
    phys, sizes, qoffs = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    got = fast.ap.put_columns(TOPIC, bodies, qids, tags, keys, uniqs, 0, TS, phys, sizes, qoffs,
                              enc if checked else None)
    assert got == n
    for i, (body, qid, tag, key, uniq) in enumerate(rows):
        want = slow.ap.put(Message(TOPIC, body, queue_id=qid, tags=tag, keys=key, unique_key=uniq), TS)
        assert (phys[i], sizes[i], qoffs[i]) == (want.wrote_offset, want.wrote_bytes, want.queue_offset)
    assert fast.state() == slow.state()


def test_columns_of_unbound_queues_are_checked_given_their_topic(k):
    """check_columns with topic_bytes and file_size: as check_all, rows of
    an unbound queue (or with no CommitLog file) are checked against the
    topic's bytes and the file size; put_columns writes them once bound."""
    import numpy as np

    fast, slow = Files(k), Files(k)
    bodies, qids = [b"a", b"b", b"c" * 990, b"d"], [1, 2, 2, 1]
    asked = []

    def topic_bytes(topic):
        asked.append(topic)
        return topic.encode()

    assert fast.ap.check_columns(TOPIC, bodies, qids, None, ["k"] * 4, None, 0)[0] == 1
    assert fast.ap.check_columns(TOPIC, bodies, qids, None, ["k"] * 4, None, 0, None, lambda t: None, 4096)[0] == 1
    stop, enc = fast.ap.check_columns(TOPIC, bodies, qids, None, ["k"] * 4, None, 0, None, topic_bytes, 4096)
    assert stop == 4 and asked == [TOPIC]
    with pytest.raises(TypeError):
        fast.ap.check_columns(TOPIC, bodies, qids, None, None, None, 0, None, topic_bytes, None)
    outs = [np.zeros(4, np.int64) for _ in range(3)]
    assert fast.ap.put_columns(TOPIC, bodies, qids, None, ["k"] * 4, None, 0, TS, *outs, enc) == 1
    for g in (fast, slow):  # what the step-by-step path does for row 1 (here: bind the queue)
        g.cq2 = _region(g.k, mm=bytearray(CQ_SIZE), file_from_offset=0, file_size=CQ_SIZE, wrote_position=20)
        g.ap.bind_queue(TOPIC, 2, TOPIC.encode(), _of(g.k.ConsumeQueueBase, max_physic_offset=0), g.cq2)
        g.offsets[(TOPIC, 2)] = 1
    assert fast.ap.put_columns(TOPIC, bodies, qids, None, ["k"] * 4, None, 2, TS, *outs, enc) == 4
    for i in (0, 2, 3):
        want = slow.ap.put(Message(TOPIC, bodies[i], queue_id=qids[i], keys="k"), TS)
        assert [int(o[i]) for o in outs] == [want.wrote_offset, want.wrote_bytes, want.queue_offset]
    assert fast.state() == slow.state() and bytes(fast.cq2.mm) == bytes(slow.cq2.mm)
    fast.ap.unbind()  # no files bound: rows are checked against file_size
    assert fast.ap.check_columns(TOPIC, bodies, qids, None, None, None, 0, None, topic_bytes, 4096)[0] == 4
    assert fast.ap.check_columns(TOPIC, bodies, qids, None, None, None, 0, None, topic_bytes, 1050)[0] == 2


@pytest.mark.parametrize("case", ["separator", "not a str", "bool queue", "unbound queue", "body type",
                                  "too large", "file full"])
def test_columns_stop_at_the_row_put_declines(k, case):
    """check_columns stops at the first row the step-by-step path must check
    (a full file is not the row's fault); put_columns at the first row it
    declines, having written the rows before it and nothing of that one."""
    import numpy as np

    bodies, qids, tags = [b"x", b"y", b"z"], [1, 1, 1], ["a", "b", "c"]
    f = Files(k)
    if case == "separator":
        tags[1] = "b\x02"
    elif case == "not a str":
        tags[1] = 5
    elif case == "bool queue":
        qids[1] = True
    elif case == "unbound queue":
        qids[1] = 2
    elif case == "body type":
        bodies[1] = "text"
    elif case == "too large":
        bodies[1] = b"x" * 2000
    elif case == "file full":  # room for exactly one record
        f.commit.wrote_position = CL_SIZE - 8 - k.record_size(0, 1, len(TOPIC), len(b"TAGS\x01a\x02"), False)
    out = [np.zeros(3, np.int64) for _ in range(3)]
    stop, enc = f.ap.check_columns(TOPIC, bodies, qids, tags, None, None, 0)
    assert stop == (3 if case == "file full" else 1)
    if stop < 3:  # on past the refused row, adding to the same encodings
        assert f.ap.check_columns(TOPIC, bodies, qids, tags, None, None, 2, enc) == (3, enc)
    assert f.ap.put_columns(TOPIC, bodies, qids, tags, None, None, 0, TS, *out, enc) == 1
    after_one = f.state()
    assert f.ap.put_columns(TOPIC, bodies, qids, tags, None, None, 1, TS, *out, enc) == 1  # nothing of row 1
    assert f.state() == after_one
    got = f.ap.put_columns(TOPIC, bodies, qids, tags, None, None, 2, TS, *out, enc)
    assert got == (2 if case == "file full" else 3)


def test_a_checked_row_is_written_as_checked(k):
    """With check_columns' encodings each row is read once, when checked:
    changing the columns afterwards changes nothing written."""
    import numpy as np

    f, ref = Files(k), Files(k)
    bodies, qids, tags, keys = [b"one", b"two"], [1, 1], ["A", None], ["k1 k2", "k3"]
    _, enc = f.ap.check_columns(TOPIC, bodies, qids, tags, keys, None, 0)
    bodies[0], tags[0], keys[1] = b"a longer body", "changed", None
    out = [np.zeros(2, np.int64) for _ in range(3)]
    assert f.ap.put_columns(TOPIC, bodies, qids, tags, keys, None, 0, TS, *out, enc) == 2
    ref.ap.put(Message(TOPIC, b"one", queue_id=1, tags="A", keys="k1 k2"), TS)
    ref.ap.put(Message(TOPIC, b"two", queue_id=1, keys="k3"), TS)
    assert f.state() == ref.state()


@pytest.mark.parametrize("change", ["queue rebound", "queue unbound", "other columns", "other topic"])
def test_check_columns_encodings_follow_the_bindings(k, change):
    """As check_all's: an encoding for a queue since rebound is made afresh,
    and encodings for other columns (or another topic object) are not used
    at all: the rows are read again (here: changed since the check)."""
    import numpy as np

    f, ref = Files(k), Files(k)
    bodies, qids, keys = [b"x", b"y", b"z"], [1, 1, 1], ["k0", "k1", "k2"]
    _, enc = f.ap.check_columns(TOPIC, list(bodies) if change == "other columns" else bodies, qids, None, keys,
                                None, 0)
    bodies[:] = [b"X", b"Y", b"Z"]
    for g in (f, ref):
        _rebind(g, change)
    before = f.state()
    out = [np.zeros(3, np.int64) for _ in range(3)]
    topic = "".join(["Topic", "Test"]) if change == "other topic" else TOPIC  # noqa: FLY002 (equal, not the same object)
    got = f.ap.put_columns(topic, bodies, qids, None, keys, None, 0, TS, *out, enc)
    if change == "queue unbound":
        assert got == 0 and f.state() == before
        return
    assert got == 3
    want = [ref.ap.put(Message(TOPIC, b, queue_id=1, keys=key), TS) for b, key in zip(bodies, keys)]
    assert list(out[2]) == [r.queue_offset for r in want] == ([11, 12, 13] if change == "queue rebound" else [3, 4, 5])
    assert f.state() == ref.state()
    if change == "queue rebound":
        assert (f.last.wrote_position, f.cq_file.wrote_position) == (80, 60)


def test_columns_refuse_foreign_encodings(k):
    import numpy as np

    f = Files(k)
    _, from_messages = f.ap.check_all([Message(TOPIC, b"x", queue_id=1)])
    out = [np.zeros(1, np.int64) for _ in range(3)]
    for wrong in (object(), (1, None)):
        with pytest.raises(TypeError):
            f.ap.check_columns(TOPIC, [b"x"], [1], None, None, None, 0, wrong)
        with pytest.raises(TypeError):
            f.ap.put_columns(TOPIC, [b"x"], [1], None, None, None, 0, TS, *out, wrong)
    # check_all's are for its list only (and the other way round)
    _, enc = f.ap.check_columns(TOPIC, [b"x"], [1], None, None, None, 0, from_messages)
    assert enc is not from_messages
    results: list = []
    assert f.ap.put_batch([Message(TOPIC, b"y", queue_id=1)], 0, None, results, enc) == (1, None)
    assert f.ap.put_columns(TOPIC, [b"z"], [1], None, None, None, 0, TS, *out, from_messages) == 1
    assert f.commit.wrote_position > 100


def test_columns_refuse_ragged_columns(k):
    import numpy as np

    f = Files(k)
    out = [np.zeros(2, np.int64) for _ in range(3)]
    for args in (([b"x"], [1, 1], None, None, None), ((b"x",), [1], None, None, None),
                 ([b"x"], [1], ["a", "b"], None, None), ([b"x"], [1], None, "k", None)):
        with pytest.raises(TypeError):
            f.ap.check_columns(TOPIC, *args, 0)
        with pytest.raises(TypeError):
            f.ap.put_columns(TOPIC, *args, 0, TS, *out)
    with pytest.raises(ValueError):
        f.ap.put_columns(TOPIC, [b"x"] * 3, [1] * 3, None, None, None, 0, TS, *out)


@pytest.mark.parametrize("topic", ["Other", ["not", "hashable"]], ids=["unbound", "unhashable"])
def test_columns_of_a_topic_with_no_bound_queue_go_step_by_step(k, topic):
    import numpy as np

    f = Files(k)
    before = f.state()
    out = [np.zeros(2, np.int64) for _ in range(3)]
    assert f.ap.check_columns(topic, [b"x", b"y"], [1, 1], None, None, None, 0)[0] == 0
    assert f.ap.put_columns(topic, [b"x", b"y"], [1, 1], None, None, None, 0, TS, *out) == 0
    assert f.state() == before


def test_the_index_room_is_counted_exactly_near_a_full_file(k):
    """A put checks the index file's room against a cheap bound of its keys
    (k keys take at least 2k - 1 characters); near a full file the exact
    count decides: a record whose keys fit is written, not declined."""
    fast, slow = Files(k), Files(k)
    for f in (fast, slow):  # the file takes 11 entries (its count starts at 1): 10 taken, room for one
        k.index_put_keys(f.index.mm, HSN, INUM, TOPIC + "#", [f"x{i}" for i in range(10)], 1, TS)
    spaced = Message(TOPIC, b"one key", queue_id=1, keys="   a   ")  # bound 4, one key
    assert fast.ap.put(spaced, TS) == steps(k, slow, spaced, TS)
    assert fast.state() == slow.state()
    before = fast.state()
    assert fast.ap.put(Message(TOPIC, b"two keys", queue_id=1, keys="b c"), TS) is None  # no room for two
    assert fast.state() == before
