"""``ReadGate``: the common case of an open store's lookups and pulls in one
kernel call each.

An open store's instance calls ``k.ReadGate``'s ``get_offset_in_queue_by_time``,
``query_messages`` and ``get_messages`` directly (the core then runs no
Python code on them). Whatever else comes goes to the ``MessageStore``
method of the same name. The gate must answer exactly as that method:
this suite compares them input by input. It also checks that a closed,
crashed or collected store refuses, and that a subclass's own method is
left alone. Each test runs with both kernels.
"""

from __future__ import annotations

import gc
import inspect
import itertools
import threading

import pytest

from conftest import ListClock
from rmqstore import Message, MessageExt, MessageStore, StoreConfig, _kernels
from rmqstore.exceptions import ArgumentError, MessageTypeError, StoreClosedError
from rmqstore.message import GetMessageResult, GetMessageStatus, GetViewsResult
from rmqstore.store.pull import _tag_filter, _view_units

T0 = 1_700_000_000_000
GATED = ("get_offset_in_queue_by_time", "query_messages", "get_messages", "get_message_views")
#: (queue id, offset, max_count) of the pulls compared: queues 0, 1 and none; offsets around the file
#: boundary (400) and the end (500) of a queue, and the ends of a long
PULLS = list(itertools.product((0, 1, 7), (-(2**63), -1, 0, 1, 399, 400, 498, 499, 500, 501, 2**63 - 1), (1, 32, 600)))
#: (arguments, error) both the gate and the store's method refuse
REFUSED_PULLS = [(("T", 0, 10**20, 32), ArgumentError), (("T", 7, -(2**63) - 1, 32), ArgumentError),
                 (("T", 0, 0, 0), ArgumentError), (("T", 0, 0, 2**31), ArgumentError),
                 (("T", 0, True, 32), MessageTypeError),
                 (("T", 0, 0, 1.0), MessageTypeError), (("T", True, 0, 32), MessageTypeError),
                 (("T", 2**31, 0, 32), ArgumentError)]
CFG = StoreConfig(  # 400-unit queue files: the queues below span two
    mapped_file_size_commit_log=1 << 20,
    mapped_file_size_consume_queue=8_000,
    max_hash_slot_num=64,
    max_index_num=4096,
    clean_service_enable=False,
)


def _fill(path, n=1000, **kw):
    """A store of n messages over queues 0 and 1, one put each, in time
    groups of 3 (equal store timestamps: message i at T0 + i // 3 * 10;
    later puts at T0 + 10**5), keys k<i % 50>, tags A or B."""
    clock = ListClock([T0 + i // 3 * 10 for i in range(n)] + [T0 + 10**5] * 10)
    s = MessageStore.open(path, CFG, clock=clock, **kw)
    for i in range(n):
        s.put_message(Message("T", b"m%d" % i, queue_id=i % 2, tags="AB"[i % 4 == 0], keys=f"k{i % 50}"))
    return s


def _gate(s):
    return _kernels.ReadGate(s, s._state, s._cqs, s.commitlog, s.index, s._refs, s.read_only, MessageExt,
                             GetMessageResult, GetViewsResult, _view_units, _tag_filter, 800)


def _views(r: GetViewsResult):
    return r.status, r.units.tolist(), r.bodies() if r.buffer is not None else [], r.next_begin_offset, \
        r.min_offset, r.max_offset, r.buffer is None or r.buffer.readonly


def _pull(r: GetMessageResult):
    return r.status, [m.physical_offset for m in r.messages], r.next_begin_offset, r.min_offset, r.max_offset


def test_an_open_store_reads_through_its_gate(tmp_path, impl):
    s = _fill(tmp_path / "s")
    gate = s._read_gate
    assert type(gate).__module__ == ("rmqstore._core" if impl == "cython" else "rmqstore._pure.gates")
    for name in GATED:  # StoreCore's methods, through the gate: none installed on the instance
        assert name not in vars(s) and name not in vars(MessageStore), name
    assert s.get_offset_in_queue_by_time("T", 0, T0 + 30) == 5  # time group 3 is messages 9..11: queue 0 has 10
    assert [m.body for m in s.query_messages("T", "k7")] == [b"m%d" % i for i in range(957, 0, -50)]  # newest first
    r = s.get_messages("T", 1, 5, 3)
    assert r.status is GetMessageStatus.FOUND and [m.body for m in r.messages] == [b"m11", b"m13", b"m15"]
    assert type(r) is GetMessageResult and type(r.messages[0]) is MessageExt
    kept = [getattr(s, name) for name in GATED]
    s.close()
    assert s._read_gate is None and not set(GATED) & set(vars(s))
    for method, args in zip(kept, (("T", 0, T0), ("T", "k7"), ("T", 0, 0), ("T", 0, 0))):
        with pytest.raises(StoreClosedError):
            method(*args)
        with pytest.raises(StoreClosedError):
            getattr(s, method.__name__)(*args)


def test_the_gate_takes_the_store_methods_signatures(tmp_path, impl):
    with _fill(tmp_path / "s", 10) as s:
        for name in GATED:
            store_params = list(inspect.signature(getattr(MessageStore, name)).parameters.values())[1:]
            gate_params = inspect.signature(getattr(s, name)).parameters.values()
            assert [(p.name, p.default) for p in gate_params] == [(p.name, p.default) for p in store_params], name


def test_time_lookups_answer_as_the_store_method(tmp_path, impl):
    s = _fill(tmp_path / "s")
    try:
        times = [T0 - 1] + [T0 + g * 10 + d for g in range(0, 340, 17) for d in (0, 5)] + [T0 + 3330, T0 + 10**6]
        for q in (0, 1, 2):  # 2: no such queue
            for ts in times:
                for boundary in ("lower", "upper", "Lower", "UPPER"):
                    want = s._get_offset_in_queue_by_time("T", q, ts, boundary)
                    assert s.get_offset_in_queue_by_time("T", q, ts, boundary) == want, (q, ts, boundary)
                    assert s.get_offset_in_queue_by_time("T", q, ts, boundary=boundary) == want
            assert s.get_offset_in_queue_by_time("T", q, T0 + 50) == \
                s._get_offset_in_queue_by_time("T", q, T0 + 50, "lower")
        for ts in (2**70, -(2**70)):  # past a long: refused by both
            for call in (s.get_offset_in_queue_by_time, s._get_offset_in_queue_by_time):
                with pytest.raises(ArgumentError, match="timestamp"):
                    call("T", 0, ts)
        for bad in ("middle", None, b"lower"):
            with pytest.raises(ValueError, match="boundary must be"):
                s.get_offset_in_queue_by_time("T", 0, T0, bad)
        with pytest.raises(TypeError):
            s.get_offset_in_queue_by_time(["T"], 0, T0)  # an unhashable topic, as the store's dict lookup raises
    finally:
        s.close()


def test_key_lookups_answer_as_the_store_method(tmp_path, impl):
    s = _fill(tmp_path / "s")
    try:
        cases = [("T", "k3"), ("T", "k49"), ("T", "nope"), ("U", "k3"), ("T", "k3", 4), ("T", "k3", 64, T0 + 1000),
                 ("T", "k3", 64, 0, T0 + 500), ("T", "k3", 2**31 - 1, -(2**63), 2**63 - 1)]
        for args in cases:
            want = [m.physical_offset for m in s._query_messages(*args)]
            assert [m.physical_offset for m in s.query_messages(*args)] == want, args
        for args, error in [(("T", "k3", 0), ArgumentError), (("T", "k3", True), MessageTypeError),
                            (("T", "k3", 4, 5, 4), ArgumentError), (("T", "k3", 4, 0, 2**63), ArgumentError)]:
            for call in (s.query_messages, s._query_messages):
                with pytest.raises(error):
                    call(*args)
        assert len(s.query_messages("T", "k3")) == 20
        for bad in (("T", b"k3"), (b"T", "k3"), ("T", 3)):
            with pytest.raises(MessageTypeError):
                s.query_messages(*bad)
    finally:
        s.close()


def test_pulls_answer_as_the_store_method(tmp_path, impl):
    s = _fill(tmp_path / "s")
    try:
        for (q, offset, max_count), tags in itertools.product(PULLS, (None, "A", "A || B", "*")):
            args = ("T", q, offset, max_count, tags)
            assert _pull(s.get_messages(*args)) == _pull(s._get_messages(*args)), args
        for args, error in REFUSED_PULLS:
            for call in (s.get_messages, s._get_messages):
                with pytest.raises(error):
                    call(*args)
        # a position past the tail with a wait: the store's method waits for a put
        threading.Timer(0.05, lambda: s.put_message(Message("T", b"late", queue_id=0))).start()
        r = s.get_messages("T", 0, 500, 32, None, 5000)
        assert r.status is GetMessageStatus.FOUND and [m.body for m in r.messages] == [b"late"]
    finally:
        s.close()


def test_views_answer_as_the_store_method(tmp_path, impl):
    s = _fill(tmp_path / "s")
    try:
        for q, offset, max_count in PULLS:
            args = ("T", q, offset, max_count)
            got, want = s.get_message_views(*args), s._get_message_views(*args)
            assert type(got) is GetViewsResult and _views(got) == _views(want), args
        for args, error in REFUSED_PULLS:
            for call in (s.get_message_views, s._get_message_views):
                with pytest.raises(error):
                    call(*args)
        r = s.get_message_views("T", 1, 5, 3)
        assert r.status is GetMessageStatus.FOUND and r.bodies() == [b"m11", b"m13", b"m15"]
        # not exact ints: the store's method (an int with __index__ is one, a bool is not)
        np = pytest.importorskip("numpy")
        assert _views(s.get_message_views("T", np.int32(1), np.int64(1), np.int8(3))) == \
            _views(s._get_message_views("T", 1, 1, 3))
        with pytest.raises(MessageTypeError):
            s.get_message_views("T", 1, True, 3)
        with pytest.raises(TypeError):
            s.get_message_views("T", 1, 5, 3.0)
    finally:
        s.close()


def test_a_read_only_store_follows_through_its_gate(tmp_path, impl):
    """A read-only store's pull that finds nothing goes to the store's
    method, which re-reads the queue's tail a writer has grown."""
    w = _fill(tmp_path / "s", 10)
    w.flush()
    r = MessageStore.open(tmp_path / "s", CFG, read_only=True)
    try:
        assert r._read_gate is not None and "get_messages" not in vars(r)
        assert r.get_messages("T", 0, 5).status is GetMessageStatus.OFFSET_OVERFLOW_ONE
        w.put_message(Message("T", b"more", queue_id=0))
        w.flush()
        assert r.get_message_views("T", 0, 5).bodies() == [b"more"]  # views follow the writer too
        w.put_message(Message("T", b"even more", queue_id=0))
        w.flush()
        got = r.get_messages("T", 0, 5)  # what it knows is found: no follow
        assert got.status is GetMessageStatus.FOUND and [m.body for m in got.messages] == [b"more"]
        got = r.get_messages("T", 0, 6)
        assert got.status is GetMessageStatus.FOUND and [m.body for m in got.messages] == [b"even more"]
    finally:
        r.close()
        w.close()


def test_a_crashed_or_collected_store_refuses(tmp_path, impl):
    s = _fill(tmp_path / "s", 10)
    kept = [getattr(s, name) for name in GATED]
    s._crash()  # the gate stays attached: it reads the store's closed flag
    assert [getattr(s, name) for name in GATED] == kept
    for method, args in zip(kept, (("T", 0, T0), ("T", "k1"), ("T", 0, 0), ("T", 0, 0))):
        with pytest.raises(StoreClosedError):
            method(*args)
    s2 = _fill(tmp_path / "s2", 10)
    gate = _gate(s2)
    assert [m.body for m in gate.query_messages("T", "k1")] == [b"m1"]
    s2.close()
    del s2
    gc.collect()
    with pytest.raises(StoreClosedError, match="gone"):
        gate.query_messages("T", "k1")


def test_a_subclass_keeps_its_own_methods(tmp_path, impl):
    class Counting(MessageStore):
        calls = 0

        def query_messages(self, *args):
            Counting.calls += 1
            return super().query_messages(*args)

    s = Counting.open(tmp_path / "s", CFG, clock=ListClock([T0] * 5))
    try:
        s.put_messages([Message("T", b"x", keys="k")] * 2)
        assert "query_messages" not in vars(s)
        assert len(s.query_messages("T", "k")) == 2 and Counting.calls == 1
        assert s._read_gate is not None
    finally:
        s.close()


def test_the_gate_checks_what_it_is_given(tmp_path, impl):
    with _fill(tmp_path / "s", 10) as s:
        s.__dict__["_cqs"] = dict(s._cqs)  # still a dict: fine
        _gate(s)
        s.__dict__["_cqs"] = list(s._cqs.items())
        with pytest.raises(TypeError, match="_cqs"):
            _gate(s)
        s.__dict__["_cqs"] = dict(s.__dict__["_cqs"])


def test_the_gate_finds_each_queue_as_the_store_dict_does(tmp_path, impl):
    """The core keeps the queues it found by the identity of topic and queue
    id (16 slots by queue id): other topics, equal but other strs, queue ids
    that share a slot, bools and queues made later must all answer as the
    store's dict does."""
    with MessageStore.open(tmp_path / "s", CFG, clock=ListClock(range(T0, T0 + 1000))) as s:
        for i in range(40):  # Tx: queues 0, 1 and 16 (0 and 16 share a slot), message i at T0 + i
            s.put_message(Message("Tx", b"t%d" % i, queue_id=(0, 1, 16)[i % 3]))
        for i in range(5):  # Ux: queue 0, at T0 + 40 + i
            s.put_message(Message("Ux", b"u%d" % i, queue_id=0))
        other = "".join(["T", "x"])  # equal, not identical  # noqa: FLY002
        assert other == "Tx" and other is not "Tx"  # noqa: F632
        for _ in range(2):  # (the second round from the slots)
            for topic, qid, ts, want in [("Tx", 0, T0 + 6, 2), ("Tx", 16, T0 + 8, 2), ("Ux", 0, T0 + 42, 2),
                                         ("Tx", 0, T0 + 6, 2), (other, 16, T0 + 8, 2), ("Tx", 1, T0 + 7, 2),
                                         ("Tx", 5, T0, 0), ("Ux", 1, T0, 0)]:
                assert s.get_offset_in_queue_by_time(topic, qid, ts) == want, (topic, qid)
                got = s.get_messages(topic, qid, want, 1)
                assert _pull(got) == _pull(s._get_messages(topic, qid, want, 1)), (topic, qid)
                assert [m.topic for m in got.messages] == ([topic] if qid != 5 and (topic, qid) != ("Ux", 1) else [])
        for call in (lambda: s.get_offset_in_queue_by_time("Tx", True, T0 + 7),
                     lambda: s.get_messages("Tx", True, 2, 1)):
            with pytest.raises(MessageTypeError):  # a bool is no queue id, though True == 1 finds queue 1 in a dict
                call()
        s.put_message(Message("Tx", b"late", queue_id=5))  # a queue made after lookups missed it
        assert s.get_offset_in_queue_by_time("Tx", 5, T0 + 45) == 0
        assert [m.body for m in s.get_messages("Tx", 5, 0).messages] == [b"late"]
