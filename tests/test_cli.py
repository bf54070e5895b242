"""The command line, run in-process through rmqstore.cli.main and once as
``python -m rmqstore`` in a subprocess."""

import json
import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.cli import main

GOLDEN = Path(__file__).parent / "data" / "golden"
BASIC = GOLDEN / "basic"


@pytest.fixture(scope="module")
def basic_dump():
    return json.loads((BASIC / "dump.json").read_text(encoding="utf-8"))


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_info_json_matches_dump(capsys, basic_dump):
    code, out, _ = run(capsys, "info", BASIC / "store", "--json")
    assert code == 0
    info = json.loads(out)
    files = basic_dump["commitlog"]["files"]
    assert info["commitlog"]["files"] == [f["name"] for f in files]
    assert info["commitlog"]["file_size"] == 65536
    assert info["clean_shutdown"] is True
    assert info["index"]["hash_slot_num"] == 100 and info["index"]["index_num"] == 300
    by_queue = {(q["topic"], q["queue_id"]): q for q in info["queues"]}
    assert len(by_queue) == len(basic_dump["consumeQueues"])
    for cq in basic_dump["consumeQueues"]:
        q = by_queue[(cq["topic"], cq["queueId"])]
        assert (q["min_offset"], q["max_offset"]) == (cq["minOffset"], cq["maxOffset"])
    assert info["checkpoint"]["index_msg_timestamp"] == basic_dump["checkpoint"]["indexMsgTimestamp"]


def test_info_text(capsys):
    code, out, _ = run(capsys, "info", BASIC / "store")
    assert code == 0
    assert "clean shutdown" in out and "TopicTest" in out and "SCHEDULE_TOPIC_XXXX" in out


def test_dump_filters(capsys, basic_dump):
    records = [r for r in basic_dump["commitlog"]["records"] if r["kind"] == "message"]
    code, out, _ = run(capsys, "dump", BASIC / "store", "--body", "base64")
    assert code == 0
    rows = json_lines(out)
    assert [r["physical_offset"] for r in rows] == [r["physicalOffset"] for r in records]
    assert [r["body"] for r in rows] == [r["body"] for r in records]
    assert [r["msg_id"] for r in rows] == [r["msgId"] for r in records]

    code, out, _ = run(capsys, "dump", BASIC / "store", "--topic", "OrderTopic", "--queue-id", "1", "--body", "none")
    rows = json_lines(out)
    expected = [r for r in records if r["topic"] == "OrderTopic" and r["queueId"] == 1]
    assert [r["queue_offset"] for r in rows] == [r["queueOffset"] for r in expected]
    assert all("body" not in r for r in rows)

    t0, t1 = records[10]["storeTimestamp"], records[20]["storeTimestamp"]
    code, out, _ = run(capsys, "dump", BASIC / "store", "--begin", t0, "--end", t1, "--limit", "5")
    rows = json_lines(out)
    assert len(rows) == 5 and all(t0 <= r["store_timestamp"] <= t1 for r in rows)

    start = records[100]["physicalOffset"]
    end = records[103]["physicalOffset"]
    code, out, _ = run(capsys, "dump", BASIC / "store", "--from-offset", start, "--to-offset", end)
    assert [r["physical_offset"] for r in json_lines(out)] == [r["physicalOffset"] for r in records[100:103]]


@pytest.mark.parametrize("topic, queue_id", [(None, None), ("TopicTest", None), ("OrderTopic", 1)])
def test_dump_time_window_seeks_and_matches_a_full_filter(capsys, basic_dump, topic, queue_id):
    """--begin/--end answer exactly what filtering every record would, while
    the scan starts past the records stored before --begin (ConsumeQueue
    time search) and stops at the first one after --end."""
    from rmqstore.cli import _time_seek

    records = [r for r in basic_dump["commitlog"]["records"] if r["kind"] == "message"]
    times = sorted({r["storeTimestamp"] for r in records})
    extra = (["--topic", topic] if topic else []) + (["--queue-id", queue_id] if queue_id is not None else [])
    with MessageStore.open(BASIC / "store", read_only=True) as s:
        for i in (0, len(times) // 3, len(times) // 2, len(times) - 1):
            begin, end = times[i], times[min(len(times) - 1, i + 25)]
            want = [r["physicalOffset"] for r in records if begin <= r["storeTimestamp"] <= end
                    and (topic is None or r["topic"] == topic) and (queue_id is None or r["queueId"] == queue_id)]
            code, out, _ = run(capsys, "dump", BASIC / "store", "--begin", begin, "--end", end, "--body", "none",
                               *extra)
            assert code == 0 and [r["physical_offset"] for r in json_lines(out)] == want
            seek = _time_seek(s, begin, topic, queue_id)
            assert all(r["storeTimestamp"] < begin for r in records if r["physicalOffset"] < seek)
            if i:  # (past the first time, the scan skips what came before)
                assert seek > 0


def test_tail_since_starts_at_the_time(capsys, tmp_path):
    root, t0 = tmp_path / "s", 1_726_732_800_000
    clock = iter(range(t0, t0 + 10_000_000, 1000))  # one message a second
    cfg = StoreConfig(mapped_file_size_commit_log=1 << 16, make_files_ahead=False)
    with MessageStore.open(root, cfg, clock=lambda: next(clock)) as s:
        offsets = [s.put_message(Message("T", b"m%d" % i, queue_id=i % 4)).wrote_offset for i in range(120)]
    since = t0 + 70_500  # between the 71st and 72nd message
    code, out, _ = run(capsys, "tail", root, "--topic", "T", "--since", since, "--timeout", "1", "--body", "none",
                       "--interval", "0")
    assert code == 0
    assert sorted(r["physical_offset"] for r in json_lines(out)) == offsets[71:]


def test_query_key_and_offsets(capsys, basic_dump):
    q = next(k for k in basic_dump["queries"]["keyQueries"] if k["key"] == "order-1001" and k["topic"] == "TopicTest")
    code, out, _ = run(capsys, "query-key", BASIC / "store", "TopicTest", "order-1001", "--offsets-only")
    assert code == 0 and json.loads(out) == q["phyOffsets"]
    code, out, _ = run(capsys, "query-key", BASIC / "store", "TopicTest", "order-1001", "--body", "none")
    rows = json_lines(out)
    assert rows and all(
        r["topic"] == "TopicTest" and "order-1001" in (r["keys"] or "").split(" ") for r in rows
    )
    code, out, _ = run(capsys, "query-key", BASIC / "store", "TopicTest", "no-such-key")
    assert code == 1 and out == ""


def test_query_msgid(capsys, basic_dump):
    rec = [r for r in basic_dump["commitlog"]["records"] if r["kind"] == "message"][42]
    code, out, _ = run(capsys, "query-msgid", BASIC / "store", rec["msgId"], "--body", "base64")
    assert code == 0
    row = json.loads(out)
    assert row["physical_offset"] == rec["physicalOffset"] and row["body"] == rec["body"]
    code, out, err = run(capsys, "query-msgid", BASIC / "store", "C0A8016400002A9F00000000DEADBEEF")
    assert code == 1 and "no message" in err


def test_print_queue(capsys, basic_dump):
    cq = next(q for q in basic_dump["consumeQueues"] if q["topic"] == "TopicTest" and q["queueId"] == 0)
    code, out, _ = run(capsys, "print-queue", BASIC / "store", "TopicTest", "0")
    rows = json_lines(out)
    assert [(r["queue_offset"], r["physical_offset"], r["size"], r["tags_code"]) for r in rows] == [
        (u["queueOffset"], u["commitLogOffset"], u["size"], u["tagsCode"]) for u in cq["units"]
    ]
    code, out, _ = run(capsys, "print-queue", BASIC / "store", "TopicTest", "0", "--start", "10", "--count", "3")
    assert [r["queue_offset"] for r in json_lines(out)] == [10, 11, 12]
    code, _, err = run(capsys, "print-queue", BASIC / "store", "NoTopic", "0")
    assert code == 1 and "no ConsumeQueue" in err


def test_offset_for_time(capsys, basic_dump):
    for tq in basic_dump["queries"]["timeQueries"][:20]:
        for boundary, key in (("lower", "offsetLower"), ("upper", "offsetUpper")):
            code, out, _ = run(
                capsys, "offset-for-time", BASIC / "store", tq["topic"], tq["queueId"], tq["timestamp"],
                "--boundary", boundary,
            )
            assert code == 0 and json.loads(out)["queue_offset"] == tq[key]


def test_iso_time_argument(capsys):
    _code, out, _ = run(capsys, "offset-for-time", BASIC / "store", "TopicTest", "0", "2024-09-19T08:00:30")
    assert json.loads(out)["timestamp"] == 1726732830000


def test_errors_are_reported_not_raised(capsys, tmp_path):
    code, _, err = run(capsys, "info", tmp_path / "missing")
    assert code == 2 and "no store directory" in err
    bad = tmp_path / "bad"
    shutil.copytree(BASIC / "store", bad)
    cl = bad / "commitlog" / "00000000000000065536"
    os.chmod(cl, 0o644)
    with open(cl, "r+b") as fh:
        fh.truncate(1000)
    code, _, err = run(capsys, "info", bad)
    assert code == 2 and "00000000000000065536" in err


def test_demo_small(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "demo", "--count", "2000", "--dir", "demo-store")
    assert code == 0, out
    assert "put" in out and "consume" in out and "key" in out and "time" in out
    assert re.search(r"views +2,000 messages zero-copy", out), out
    with MessageStore.open(tmp_path / "demo-store", read_only=True) as s:
        assert sum(s.get_max_offset_in_queue("DemoTopic", q) for q in range(8)) == 2000
    # default settings: a 1 GiB CommitLog file, as RocketMQ preallocates
    first = tmp_path / "demo-store" / "commitlog" / "00000000000000000000"
    assert first.stat().st_size == StoreConfig().mapped_file_size_commit_log


def test_python_dash_m(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent.parent)] + sys.path)
    r = subprocess.run(
        [sys.executable, "-m", "rmqstore", "print-queue", str(BASIC / "store"), "OrderTopic", "3"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 5


def test_consumer_progress_and_groups_in_info(tmp_path, capsys):
    root = tmp_path / "s"
    with MessageStore.open(root, StoreConfig(mapped_file_size_commit_log=1 << 16, make_files_ahead=False)) as s:
        for i in range(10):
            s.put_message(Message("T", b"m%d" % i, queue_id=i % 2))
        times = [s.get_messages("T", q, 0, 10).messages for q in (0, 1)]
        s.commit_offset("billing", "T", 0, 5)  # queue 0 drained
        s.commit_offset("billing", "T", 1, 2)  # queue 1: 3 behind, from its message at offset 2
        s.commit_offset("audit", "T", 0, 0)
    code, out, _ = run(capsys, "consumer-progress", root, "--json")
    assert code == 0
    rows = json.loads(out)
    assert [(r["group"], r["queue_id"], r["committed_offset"], r["max_offset"], r["lag"]) for r in rows] == [
        ("audit", 0, 0, 5, 5), ("billing", 0, 5, 5, 0), ("billing", 1, 2, 5, 3)]  # by "<topic>@<group>", queue
    billing1 = next(r for r in rows if r["group"] == "billing" and r["queue_id"] == 1)
    want = datetime.fromtimestamp(times[1][2].store_timestamp / 1000, timezone.utc).isoformat(timespec="milliseconds")
    assert billing1["first_unconsumed_store_time"] == want and billing1["lag_ms"] >= 0
    code, out, _ = run(capsys, "consumer-progress", root, "billing")
    assert code == 0 and "group billing: 3 message(s) behind" in out and "audit" not in out
    code, out, err = run(capsys, "consumer-progress", root, "nobody")
    assert code == 1 and out == "" and "no committed offsets for group 'nobody'" in err
    code, out, _ = run(capsys, "info", root, "--json")
    assert json.loads(out)["groups"] == {"audit": ["T"], "billing": ["T"]}
    code, out, _ = run(capsys, "info", root)
    assert "consumer groups  2" in out and "  billing: T" in out
