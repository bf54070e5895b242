"""Retries and dead letters (docs/service.md#retries-and-dead-letters):
``consumer.reconsume_later`` stores a failed message again as RocketMQ's
broker does (compared field by field with the ``%RETRY%`` and
``SCHEDULE_TOPIC_XXXX`` records of the golden ``basic`` store), the group's
members consume their retry topic, and a message that keeps failing ends in
``%DLQ%<group>``."""

from __future__ import annotations

import json
import os
import time

import pytest

from conftest import DELAY_LEVEL_MS, STORE_HOST, StepClock, dump_messages, input_body, load_input
from rmqstore import IllegalMessageError, Message, MessageStore, MessageTypeError, StoreConfig
from rmqstore.cli import main as cli_main
from rmqstore.service.retry import send_back_message

SMALL = StoreConfig(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 64,
                    max_hash_slot_num=32, max_index_num=128)
T0 = 1_700_000_000_000
SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def fixed_clock(now: int = T0) -> StepClock:
    return StepClock(now, step=0)


def golden(topic: str) -> list:
    return [r for r in dump_messages("basic") if r["topic"] == topic]


def test_a_retry_is_stored_as_rocketmq_stores_one(tmp_path):
    """A golden TopicTest message consumed by group cg_basic and handed back:
    the record in SCHEDULE_TOPIC_XXXX, then the one in %RETRY%cg_basic, have
    the topics, queue ids, sys flags and properties of the golden store's
    records of those topics (the golden ones were written by RocketMQ's
    store from a broker's send-back)."""
    inp = load_input("basic")
    first = next(m for m in inp["messages"] if m["topic"] == "TopicTest" and "CLUSTER" in m.get("properties", {}))
    gold_retry, gold_sched = golden("%RETRY%cg_basic"), golden(SCHEDULE)
    cfg = StoreConfig.from_dict(inp["storeConfig"])
    clock = fixed_clock(first["storeTimestamp"])
    with MessageStore.open(tmp_path, cfg, store_host=STORE_HOST, clock=clock) as s:
        s.put_message(Message(
            "TopicTest", input_body(first), queue_id=first["queueId"], tags=first.get("tags"),
            keys=first.get("keys"), unique_key=first.get("uniqKey"), properties=first["properties"],
            born_timestamp=first["bornTimestamp"], born_host=first["bornHost"], store_host=first["storeHost"],
        ))
        c = s.consumer("cg_basic", "TopicTest")
        original = next(c)
        r = c.reconsume_later(original)
        sched = s.get_message(r.wrote_offset)
        # SCHEDULE_TOPIC_XXXX: level 3 (a first retry) is queue 2, as the golden record's
        assert (sched.topic, sched.queue_id, sched.sys_flag) == (SCHEDULE, 2, gold_sched[0]["sysFlag"])
        assert {"REAL_TOPIC", "REAL_QID", "DELAY"} <= set(sched.properties) & set(gold_sched[0]["properties"])
        assert (sched.properties["REAL_TOPIC"], sched.properties["REAL_QID"], sched.properties["DELAY"]) == \
            ("%RETRY%cg_basic", "0", "3")
        assert s.consume_queue(SCHEDULE, 2).get_unit(0)[2] == sched.store_timestamp + DELAY_LEVEL_MS[3]
        clock.now += DELAY_LEVEL_MS[3]
        s._schedule.deliver_due()
        (retry,) = s.get_messages("%RETRY%cg_basic", 0, 0).messages
        # %RETRY%cg_basic: queue 0, the original's sys flag, the golden records' properties
        assert {(g["queueId"], g["sysFlag"]) for g in gold_retry} == {(retry.queue_id, retry.sys_flag)}
        gold_names = set(gold_retry[1]["properties"])  # (msg-29: tags, keys, a user property)
        assert gold_names - {"orderId"} <= set(retry.properties)
        assert retry.properties["RETRY_TOPIC"] == "TopicTest" == gold_retry[1]["properties"]["RETRY_TOPIC"]
        assert retry.properties["MAX_RECONSUME_TIMES"] == "16" == gold_retry[1]["properties"]["MAX_RECONSUME_TIMES"]
        assert retry.properties["ORIGIN_MESSAGE_ID"] == original.msg_id  # (the golden ones: a client's ids)
        assert retry.properties["WAIT"] == "false"  # (the broker's setWaitStoreMsgOK(false))
        for name in ("CLUSTER", "KEYS", "UNIQ_KEY", "TAGS", "中文键"):
            assert retry.properties.get(name) == original.properties.get(name), name
        assert (retry.body, retry.flag, retry.born_timestamp, retry.born_host, retry.reconsume_times) == \
            (original.body, original.flag, original.born_timestamp, original.born_host, 1)
        c.close()


def test_a_message_that_keeps_failing_ends_in_the_dead_letter_queue(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"poison", queue_id=1, tags="A", keys="k"))
        s.put_message(Message("T", b"fine", queue_id=0))
        seen, levels = [], []
        with s.consumer("g", "T") as c:
            for _round in range(40):
                for m in c:
                    seen.append((m.topic, m.body, m.reconsume_times))
                    if m.body == b"poison":
                        r = c.reconsume_later(m)
                        stored = s.get_message(r.wrote_offset)
                        levels.append(stored.properties.get("DELAY"))
                clock.now += DELAY_LEVEL_MS[18]
                s._schedule.deliver_due()
        # the original and 16 retries, each handed out with the original topic
        assert seen.count(("T", b"fine", 0)) == 1
        assert [x for x in seen if x[1] == b"poison"] == [("T", b"poison", n) for n in range(17)]
        assert levels == [str(3 + n) for n in range(16)] + ["0"]  # (3 + reconsume times; the put caps at 18)
        (dead,) = s.get_messages("%DLQ%g", 0, 0).messages
        assert (dead.body, dead.reconsume_times, dead.properties["RETRY_TOPIC"]) == (b"poison", 17, "T")
        assert dead.properties["DELAY"] == "0"
        first = s.get_messages("T", 1, 0).messages[0]
        assert dead.properties["ORIGIN_MESSAGE_ID"] == first.msg_id  # (kept from the first retry on)
        assert s.get_committed_offset("g", "%RETRY%g", 0) == 16
    code = cli_main(["consumer-progress", str(tmp_path), "g", "--json"])
    assert code == 0


def test_consumer_progress_shows_retries_and_dead_letters(tmp_path, capsys):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as s:
        for i in range(3):
            s.put_message(Message("T", b"%d" % i))
        with s.consumer("g", "T") as c:
            for m in c:
                c.reconsume_later(m, delay_level=-1 if m.body == b"0" else 1)
        s._schedule._store._clock.now += 1000  # (the store's clock)
        s._schedule.deliver_due()
    capsys.readouterr()
    assert cli_main(["consumer-progress", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["group"], r["topic"], r["retry_messages"], r["dead_letters"]) for r in rows} == {("g", "T", 2, 1)}
    assert cli_main(["consumer-progress", str(tmp_path)]) == 0
    assert "2 in %RETRY%g, 1 dead letter(s) in %DLQ%g" in capsys.readouterr().out


def test_explicit_levels_and_limits(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"x"))
        c = s.consumer("g", "T", max_reconsume_times=0)
        m = next(c)
        assert s.get_message(c.reconsume_later(m).wrote_offset).topic == "%DLQ%g"  # (0 retries allowed)
        c.close()
        c = s.consumer("g2", "T")
        m = next(c)
        stored = s.get_message(c.reconsume_later(m, delay_level=7).wrote_offset)
        assert (stored.topic, stored.queue_id, stored.properties["DELAY"]) == (SCHEDULE, 6, "7")
        with pytest.raises(MessageTypeError):
            c.reconsume_later("not a message")
        with pytest.raises(MessageTypeError):
            c.reconsume_later(m, delay_level="3")
        c.close()
        with pytest.raises(IllegalMessageError):
            s.consumer("g3", "T", max_reconsume_times=-1)


def test_send_back_keeps_what_came_before(tmp_path):
    """A retry of a retry keeps RETRY_TOPIC and ORIGIN_MESSAGE_ID; the record
    goes to the retry topic, queue 0, reconsume times + 1."""
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock(), read_only=False) as s:
        r = s.put_message(Message("%RETRY%g", b"x", reconsume_times=4,
                                  properties={"RETRY_TOPIC": "Orders", "ORIGIN_MESSAGE_ID": "ABC"}))
        ext = s.get_message(r.wrote_offset)
        out, dead = send_back_message(ext, "g")
        assert not dead
        assert (out.topic, out.queue_id, out.reconsume_times) == ("%RETRY%g", 0, 5)
        assert out.properties["RETRY_TOPIC"] == "Orders" and out.properties["ORIGIN_MESSAGE_ID"] == "ABC"
        assert out.properties["DELAY"] == "7"


def test_a_followers_send_back_is_stored_by_the_writer(tmp_path):
    """A consumer in a read-only process leaves its send-back, fsynced, in
    config/sendBack/; the writer's schedule service stores it and removes
    the file."""
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as w:
        w.put_message(Message("T", b"x", keys="k"))
        with MessageStore.open(tmp_path, read_only=True) as ro:
            c = ro.consumer("g", "T")
            m = next(c)
            assert c.reconsume_later(m, delay_level=2) is None
            assert list(c) == []  # (processed: committed)
            c.close()
        spool = tmp_path / "config" / "sendBack"
        (name,) = os.listdir(spool)
        assert json.loads((spool / name).read_text())["msg_id"] == m.msg_id
        deadline = time.monotonic() + 30
        while os.listdir(spool):  # the writer's service thread looks about once a second
            assert time.monotonic() < deadline, "the writer did not store the send-back"
            time.sleep(0.02)
        (sched,) = w.get_messages(SCHEDULE, 1, 0).messages  # (level 2: queue 1)
        assert (sched.properties["REAL_TOPIC"], sched.properties["RETRY_TOPIC"], sched.reconsume_times) == \
            ("%RETRY%g", "T", 1)
        clock.now += DELAY_LEVEL_MS[2]
        w._schedule.deliver_due()
        with w.consumer("g", "T") as again:
            assert [(x.topic, x.body, x.reconsume_times) for x in again] == [("T", b"x", 1)]


def test_send_backs_that_cannot_be_stored_are_dropped(tmp_path, caplog):
    with MessageStore.open(tmp_path, SMALL, clock=fixed_clock()) as w:
        r = w.put_message(Message("T", b"x"))
        spool = tmp_path / "config" / "sendBack"
        spool.mkdir(parents=True)
        (spool / "h@1.jsonl").write_text(
            "not json\n"
            + json.dumps({"group": "g", "offset": r.wrote_offset, "msg_id": "0" * 32}) + "\n"  # another record
            + json.dumps({"group": "g", "offset": r.wrote_offset, "msg_id": w.get_message(0).msg_id}) + "\n"
            + '{"group": "g", "offset": 0, "msg_id": "x", "delay_level": 1')  # (a writer killed mid-line)
        w._schedule.deliver_due()
        assert os.listdir(spool) == []
        assert len(w.get_messages(SCHEDULE, 2, 0).messages) == 1  # (the one good request)
    assert "does not parse" in caplog.text and "gone" in caplog.text


def test_consumers_of_fixed_queues_do_not_read_retries(tmp_path):
    clock = fixed_clock()
    with MessageStore.open(tmp_path, SMALL, clock=clock) as s:
        s.put_message(Message("T", b"x"))
        with s.consumer("g", "T") as c:
            for m in c:
                c.reconsume_later(m)
        clock.now += DELAY_LEVEL_MS[3]
        s._schedule.deliver_due()
        with s.consumer("g", "T", queue_ids=[0]) as fixed:
            assert list(fixed) == []
        with s.consumer("g", "T") as member:
            assert [(m.topic, m.body, m.reconsume_times) for m in member] == [("T", b"x", 1)]
