"""Delayed delivery (docs/service.md#delayed-delivery): the put's rewrite to
SCHEDULE_TOPIC_XXXX, compared with the records RocketMQ wrote in the golden
``basic`` store, and the writer's schedule service on an injected clock:
never before the time, within one round after, exactly once across a clean
restart, never lost across a crash."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import (
    DELAY_LEVEL_MS,
    STORE_HOST,
    StepClock,
    copy_golden_store,
    dump_messages,
    input_body,
    java_hash,
    load_input,
    no_hang,
)
from rmqstore import IllegalMessageError, Message, MessageStore, MessageTypeError, StoreConfig
from rmqstore.service.schedule import DelayOffsetTable, time_up_message, to_schedule

SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 64,
                    max_hash_slot_num=32, max_index_num=128)
T0 = 1_700_000_000_000
SCHEDULE = "SCHEDULE_TOPIC_XXXX"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fixed_clock(now: int = T0) -> StepClock:
    return StepClock(now, step=0)  # (the service's rounds read it too: it moves only when a test moves it)


def delivered(s, topic, queue_id) -> list:
    """Every message of the queue."""
    out, offset = [], 0
    while True:
        r = s.get_messages(topic, queue_id, offset, 1000)
        out += r.messages
        if not r.messages:
            return out
        offset = r.next_begin_offset


def wait_until(cond, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "not delivered in time"
        time.sleep(0.01)


# --- the rewrite ----------------------------------------------------------------------------------


def golden_delayed() -> list:
    """(input message, dump record) of the golden basic store's delayed records."""
    inputs = load_input("basic")["messages"]
    return [(m, r) for m, r in zip(inputs, dump_messages("basic")) if m["topic"] == SCHEDULE]


def test_the_put_stores_a_delayed_message_as_rocketmq_does(tmp_path):
    """Put each of the golden store's delayed messages as a producer would
    (its real topic and queue, ``delay_level``) and compare the record with
    the one RocketMQ's broker wrote: topic, queue, sys flag, properties,
    tags code (the delivery time), sizes and body."""
    pairs = golden_delayed()
    assert len(pairs) == 2
    cfg = StoreConfig.from_dict(load_input("basic")["storeConfig"])
    clock = fixed_clock()
    with MessageStore.open(tmp_path, cfg, store_host=STORE_HOST, clock=clock) as s:
        for m, gold in pairs:
            props = dict(m["properties"])
            level = int(props.pop("DELAY"))
            real_topic, real_qid = props.pop("REAL_TOPIC"), int(props.pop("REAL_QID"))
            clock.now = m["storeTimestamp"]
            r = s.put_message(Message(
                real_topic, input_body(m), queue_id=real_qid, tags=m.get("tags"), keys=m.get("keys"),
                unique_key=m.get("uniqKey"), properties=props, born_timestamp=m["bornTimestamp"],
                born_host=m["bornHost"], store_host=m["storeHost"], delay_level=level,
            ))
            ext = s.get_message(r.wrote_offset)
            assert (ext.topic, ext.queue_id, ext.sys_flag) == (gold["topic"], gold["queueId"], gold["sysFlag"])
            assert ext.properties == gold["properties"]  # (order aside: the broker's is a HashMap's)
            assert (ext.store_size, ext.body_crc, ext.body) == (gold["totalSize"], gold["bodyCRC"], input_body(m))
            unit = s.consume_queue(SCHEDULE, gold["queueId"]).get_unit(r.queue_offset)
            assert unit[2] == gold["dispatch"]["tagsCode"] == m["storeTimestamp"] + DELAY_LEVEL_MS[level]
            assert s.get_max_offset_in_queue(real_topic, real_qid) == 0


@pytest.mark.parametrize("how", ["shorthand", "property"])
def test_levels_are_capped_and_the_shorthand_is_the_property(tmp_path, how):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        for given, stored in ((1, 1), (18, 18), (19, 18), (2**31 - 1, 18)):
            kw = {"delay_level": given} if how == "shorthand" else {"properties": {"DELAY": str(given)}}
            ext = s.get_message(s.put_message(Message("T", b"x", queue_id=3, **kw)).wrote_offset)
            assert (ext.topic, ext.queue_id) == (SCHEDULE, stored - 1)
            assert ext.properties == {"DELAY": str(stored), "REAL_TOPIC": "T", "REAL_QID": "3"}


def test_what_is_not_delayed_is_stored_as_given(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        kept = [
            Message("T", b"zero", delay_level=0),  # (a dead letter's DELAY=0)
            Message("T", b"negative", properties={"DELAY": "-3"}),
            Message("T", b"prepared", delay_level=2, sys_flag=0x4),
            Message("T", b"rollback", delay_level=2, sys_flag=0xC),
            Message(SCHEDULE, b"rewritten already", queue_id=5, properties={"DELAY": "2"}),
        ]
        for m in kept:
            ext = s.get_message(s.put_message(m).wrote_offset)
            assert (ext.topic, ext.queue_id, ext.body) == (m.topic, m.queue_id, m.body)
            assert "REAL_TOPIC" not in ext.properties
        commit = s.get_message(s.put_message(Message("T", b"commit", delay_level=2, sys_flag=0x8)).wrote_offset)
        assert (commit.topic, commit.queue_id) == (SCHEDULE, 1)


def test_bad_delays_are_refused_and_nothing_is_stored(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        for bad in ("", "x", " 3", "1.5", "99999999999"):
            with pytest.raises(IllegalMessageError, match="DELAY"):
                s.put_message(Message("T", b"x", properties={"DELAY": bad}))
            with pytest.raises(IllegalMessageError, match="DELAY"):
                s.put_messages([Message("T", b"ok"), Message("T", b"x", properties={"DELAY": bad})])
        with pytest.raises(IllegalMessageError, match="DELAY"):  # the shorthand and the property disagree
            s.put_message(Message("T", b"x", delay_level=2, properties={"DELAY": "3"}))
        assert s.queues() == []
    with pytest.raises(MessageTypeError):
        Message("T", b"x", delay_level="3")
    with pytest.raises(IllegalMessageError):
        Message("T", b"x", delay_level=2**31)


def test_a_batch_mixes_delayed_and_plain_messages(tmp_path, monkeypatch):
    from rmqstore.service.schedule import ScheduleService

    wakes = []
    wake = ScheduleService.wake
    monkeypatch.setattr(ScheduleService, "wake", lambda self: (wakes.append(1), wake(self))[1])
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        s.put_messages([Message("T", b"plain") for _ in range(3)])
        assert wakes == []  # nothing delayed: the service is left to its round
        rs = s.put_messages([Message("T", b"a"), Message("T", b"b", delay_level=1), Message("T", b"c")])
        assert wakes  # a delayed message wakes the service at once
        assert [r.queue_offset for r in rs] == [3, 0, 4]
        assert [m.body for m in delivered(s, "T", 0)] == [b"plain"] * 3 + [b"a", b"c"]
        assert [m.body for m in delivered(s, SCHEDULE, 0)] == [b"b"]


def test_the_rules_alone():
    props = {"TAGS": "A", "DELAY": "40"}
    assert to_schedule("T", 7, 0, props, 18) == (SCHEDULE, 17)
    assert props == {"TAGS": "A", "DELAY": "18", "REAL_TOPIC": "T", "REAL_QID": "7"}
    assert to_schedule("T", 7, 0, {"DELAY": "1"}, 0) is None  # (no levels)
    with pytest.raises(IllegalMessageError):
        to_schedule("T", 0, 0, {"DELAY": "+"}, 18)


# --- delivery -------------------------------------------------------------------------------------


def test_delivered_at_its_time_not_before(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        r = s.put_message(Message("T", b"later", queue_id=2, flag=7, tags="TagA", keys="k1", unique_key="U1",
                                  properties={"p": "v"}, born_timestamp=T0 - 5, born_host="10.0.0.9:4000",
                                  reconsume_times=2, delay_level=2))
        service = s._schedule
        clock.now = T0 + DELAY_LEVEL_MS[2] - 1
        assert service.deliver_due() == 1  # (ms until it is due)
        assert delivered(s, "T", 2) == []
        clock.now = T0 + DELAY_LEVEL_MS[2]
        assert service.deliver_due() is None
        (out,) = delivered(s, "T", 2)
        assert out.store_timestamp == clock.now
        src = s.get_message(r.wrote_offset)
        assert (out.body, out.flag, out.born_timestamp, out.born_host, out.store_host, out.reconsume_times) == \
            (b"later", 7, T0 - 5, "10.0.0.9:4000", src.store_host, 2)
        assert out.properties == {"TAGS": "TagA", "KEYS": "k1", "UNIQ_KEY": "U1", "p": "v",
                                  "REAL_TOPIC": "T", "REAL_QID": "2"}
        assert s.consume_queue("T", 2).get_unit(0)[2] == java_hash("TagA")
        assert [m.physical_offset for m in s.query_messages("T", "k1")] == [out.physical_offset]
        for _ in range(3):  # once only
            service.deliver_due()
        assert len(delivered(s, "T", 2)) == 1


def test_levels_deliver_in_order_each_record_once(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        expect = []
        for i in range(60):
            level = 1 + i % 4
            clock.now = T0 + i
            s.put_message(Message("T", b"%d" % i, queue_id=i % 2, delay_level=level))
            expect.append((T0 + i + DELAY_LEVEL_MS[level], i % 2, b"%d" % i))
        # (from the last put on: the clock never steps back here)
        for step in range(59, DELAY_LEVEL_MS[4] + 60 + 997, 997):
            clock.now = T0 + step
            s._schedule.deliver_due()
            got = sorted((m.body for q in (0, 1) for m in delivered(s, "T", q)), key=int)
            assert got == sorted((b for due, _q, b in expect if due <= clock.now), key=int)
        for q in (0, 1):
            assert [m.body for m in delivered(s, "T", q)] == \
                [b for _due, qq, b in sorted(expect) if qq == q]  # (by due time: levels interleave)


def test_offsets_survive_a_clean_restart_in_rocketmqs_file(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        for i in range(3):
            s.put_message(Message("T", b"%d" % i, delay_level=1 + 2 * (i % 2)))
        clock.now = T0 + DELAY_LEVEL_MS[1]
        s._schedule.deliver_due()
        assert len(delivered(s, "T", 0)) == 2
    path = tmp_path / "config" / "delayOffset.json"
    doc = json.loads(path.read_text())
    assert doc["offsetTable"] == {"1": 2}
    assert set(doc["dataVersion"]) == {"counter", "stateVersion", "timestamp"}
    clock.now = T0 + DELAY_LEVEL_MS[3]
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        with no_hang():
            wait_until(lambda: len(delivered(s, "T", 0)) == 3)  # (the thread: the store has a delayed queue)
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"0", b"2", b"1"]
    assert json.loads(path.read_text())["offsetTable"] == {"1": 2, "3": 1}
    assert os.path.exists(str(path) + ".bak")


def test_a_brokers_offset_file_is_read(tmp_path):
    clock = fixed_clock(T0 + 10**9)
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        for i in range(3):
            s.put_message(Message("T", b"%d" % i, delay_level=1))
    # fastjson's bare keys: RocketMQ's broker delivered the first two
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "delayOffset.json").write_text('{\n\t"offsetTable":{1:2\n\t}\n}')
    clock.now += 1000
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"2"]


def test_offsets_past_the_queue_are_corrected(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"a", delay_level=1))
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / "delayOffset.json").write_text('{"offsetTable":{"1":99}}')
    clock.now = T0 + 1000
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        assert s._schedule.offsets.table == {1: 1}  # (RocketMQ's correctDelayOffset: to the queue's end)
        s.put_message(Message("T", b"b", delay_level=1))
        clock.now = T0 + 2000
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"b"]


def test_a_bad_offset_file_refuses_the_open_and_changes_nothing(tmp_path):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        s.put_message(Message("T", b"a", delay_level=1))
    cfg_dir = tmp_path / "config"
    cfg_dir.mkdir(exist_ok=True)
    for name in ("delayOffset.json", "delayOffset.json.bak"):
        (cfg_dir / name).write_text("{not json")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(Exception, match="delayOffset"):
        MessageStore.open(tmp_path, SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "abort").exists()
    (cfg_dir / "delayOffset.json").write_text('{"offsetTable":{"1":0}}')  # (.bak still bad: the file wins)
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()):
        pass


def test_never_lost_across_a_crash(tmp_path):
    clock = fixed_clock()
    s = MessageStore.open(tmp_path, SMALL, clock=clock)
    s.put_message(Message("T", b"a", delay_level=1))
    s.put_message(Message("T", b"b", delay_level=2))
    s._crash()  # before either is due: nothing delivered, no offsets file
    clock.now = T0 + DELAY_LEVEL_MS[2]
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s._schedule.deliver_due()
        assert sorted(m.body for m in delivered(s, "T", 0)) == [b"a", b"b"]


def test_a_crash_before_the_offsets_are_written_delivers_again(tmp_path, monkeypatch):
    """At least once across a crash: a delivery stored after the last write
    of delayOffset.json is stored again by the next writer."""
    clock = fixed_clock()
    s = MessageStore.open(tmp_path, SMALL, clock=clock)
    s.put_message(Message("T", b"a", delay_level=1))
    clock.now = T0 + 1000

    def fail(self, now_ms):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(DelayOffsetTable, "persist", fail)
    with pytest.raises(OSError):
        s._schedule.deliver_due()
    assert len(delivered(s, "T", 0)) == 1
    s._crash()
    monkeypatch.undo()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"a", b"a"]


def test_a_clock_stepped_back_delivers_at_once(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"a", delay_level=1))  # due at T0 + 1 s
        clock.now = T0 - 3_600_000  # an hour back: due further ahead than level 1 allows
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"a"]
        s.put_message(Message("T", b"b", delay_level=18))  # due in 2 h: waits
        assert s._schedule.deliver_due() == DELAY_LEVEL_MS[18]


def test_undeliverable_records_are_skipped(tmp_path, caplog):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message(SCHEDULE, b"no real topic", queue_id=0, properties={"DELAY": "1"}))
        s.put_message(Message(SCHEDULE, b"bad qid", queue_id=0,
                              properties={"DELAY": "1", "REAL_TOPIC": "T", "REAL_QID": "x"}))
        s.put_message(Message(SCHEDULE, b"half", queue_id=0,
                              properties={"DELAY": "1", "REAL_TOPIC": "RMQ_SYS_TRANS_HALF_TOPIC", "REAL_QID": "0"}))
        s.put_message(Message("T", b"good", delay_level=1))
        clock.now = T0 + 1000
        s._schedule.deliver_due()
        assert [m.body for m in delivered(s, "T", 0)] == [b"good"]
        assert s._schedule.offsets.table == {1: 4}
    assert "cannot be delivered" in caplog.text


def test_a_brokers_store_delivers_its_delayed_records(tmp_path):
    """The golden store's two delayed records (due in 2024) are delivered by
    a writer that opens it, as a broker taking over would."""
    root = copy_golden_store("basic", tmp_path / "store")
    cfg = StoreConfig.from_dict(load_input("basic")["storeConfig"])
    pairs = golden_delayed()
    with MessageStore.open(root, cfg, store_host=STORE_HOST) as s:
        with no_hang():
            wait_until(lambda: s._schedule.offsets.table == {3: 1, 5: 1})
        for m, gold in pairs:
            props = gold["properties"]
            topic, qid = props["REAL_TOPIC"], int(props["REAL_QID"])
            out = [x for x in delivered(s, topic, qid) if x.body == input_body(m)]
            assert len(out) == 1
            assert out[0].properties == {n: v for n, v in props.items() if n != "DELAY"}
            assert (out[0].born_timestamp, out[0].born_host, out[0].store_host) == \
                (gold["bornTimestamp"], gold["bornHost"], gold["storeHost"])
    with open(os.path.join(root, "config", "delayOffset.json")) as fh:
        assert json.load(fh)["offsetTable"] == {"3": 1, "5": 1}


def test_the_service_can_be_off(tmp_path):
    """Off, the writer is a plain store: a DELAY stays a property of a
    message stored where it was put, and delayed records already in
    SCHEDULE_TOPIC_XXXX stay there."""
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"delayed", delay_level=1))
    clock.now += 1000
    with MessageStore.open(tmp_path, SMALL.replace(schedule_service_enable=False), clock=clock) as s:
        assert s._schedule is None
        r = s.put_message(Message("T", b"as given", delay_level=1))
        assert (s.get_message(r.wrote_offset).topic, s.get_message(r.wrote_offset).properties) == \
            ("T", {"DELAY": "1"})
        assert [m.body for m in delivered(s, SCHEDULE, 0)] == [b"delayed"]
        assert [m.body for m in delivered(s, "T", 0)] == [b"as given"]
    assert not (tmp_path / "config" / "delayOffset.json").exists()


def test_time_up_message_keeps_what_rocketmq_keeps():
    class Ext:  # (the fields a MessageExt has)
        properties = None
        body, flag, born_timestamp, born_host, store_host, reconsume_times, sys_flag = \
            b"x", 3, 5, "1.2.3.4:5", "6.7.8.9:10", 1, 0

    Ext.properties = {"DELAY": "3", "TIMER_DELIVER_MS": "1", "REAL_TOPIC": "T", "REAL_QID": "4", "a": "b"}
    m = time_up_message(Ext)
    assert (m.topic, m.queue_id, m.properties) == ("T", 4, {"REAL_TOPIC": "T", "REAL_QID": "4", "a": "b"})
    Ext.properties = {"REAL_QID": "4"}
    with pytest.raises(ValueError, match="REAL_TOPIC"):
        time_up_message(Ext)


CHILD = textwrap.dedent("""
    import sys, time
    from rmqstore import Message, MessageStore, StoreConfig
    root, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    store = MessageStore.open(root, StoreConfig(mapped_file_size_commit_log=1 << 20))
    print("open", flush=True)
    for b in range(20):  # due times spread over a second: the kill lands among deliveries
        store.put_messages([Message("T", b"%s-%d" % (tag.encode(), i), queue_id=i % 4, unique_key=f"{tag}-{i}",
                                    delay_level=1) for i in range(b * n // 20, (b + 1) * n // 20)])
        time.sleep(0.05)
    print("put", flush=True)
    time.sleep(600)
""")


def test_kill_9_while_delivering_loses_nothing_and_delivers_nothing_early(tmp_path):
    """A writer killed (SIGKILL) while its schedule service delivers: the
    next writer delivers every delayed message, none before its time; what
    the killed one delivered after its last offsets write comes again (at
    least once), nothing more."""
    root = tmp_path / "s"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    n, rounds = 400, int(os.environ.get("RMQSTORE_CRASH_ROUNDS", "2"))
    rng = random.Random(7)
    for r in range(rounds):
        p = subprocess.Popen([sys.executable, "-c", CHILD, str(root), str(n), f"r{r}"], stdout=subprocess.PIPE,
                             text=True, env=env)
        try:
            assert p.stdout.readline().strip() == "open"
            time.sleep(1.0 + rng.random())  # (the first are due after 1 s; the puts go on for 1 s)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
    bodies = {b"r%d-%d" % (r, i) for r in range(rounds) for i in range(n)}
    with no_hang(120), MessageStore.open(root) as s:
        scheduled = {m.unique_key: m for q in range(1) for m in delivered(s, SCHEDULE, q)}
        wait_until(lambda: {m.body for q in range(4) for m in delivered(s, "T", q)} >= {
            m.body for m in scheduled.values()}, 60)
        out = [m for q in range(4) for m in delivered(s, "T", q)]
    assert {m.body for m in out} == {m.body for m in scheduled.values()}  # every one stored is delivered
    assert {m.body for m in scheduled.values()} <= bodies
    for m in out:
        assert m.store_timestamp >= scheduled[m.unique_key].store_timestamp + DELAY_LEVEL_MS[1]  # not early
    duplicates = len(out) - len({m.body for m in out})
    assert duplicates <= rounds * n // 20 * 2  # (the kill's round, at most: a batch or two)
