"""rmqstore.report: the HTML and PNG report of a store, checked against the
golden dumps (counts, bytes, store times, files), consumer_progress, and for
escaping, atomic writes and edge cases."""

import html
import json
import os
import re
import sys

import pytest

pytest.importorskip("matplotlib")

from conftest import StepClock, copy_golden_store, golden_dir, load_dump, load_input
from rmqstore import Message, MessageStore, StoreConfig
from rmqstore import report as rp
from rmqstore.report import write_report
from rmqstore.service.progress import consumer_progress

SECTIONS = ("topics-over-time", "queue-sizes", "consumer-lag", "store-files")
NOW = 1_800_000_000_000
SMALL = StoreConfig(mapped_file_size_commit_log=1 << 16, mapped_file_size_consume_queue=20 * 64,
                    make_files_ahead=False)


# --- expectations from the golden dumps alone ----------------------------------------------


def expected_units(name):
    """Per ConsumeQueue unit of the dump: (topic, queue_id, store_timestamp, size), the
    store time taken from the CommitLog record the unit points at."""
    dump = load_dump(name)
    records = {r["physicalOffset"]: r for r in dump["commitlog"]["records"] if r["kind"] == "message"}
    out = []
    for q in dump["consumeQueues"]:
        for u in q["units"]:
            if q["minOffset"] <= u["queueOffset"] < q["maxOffset"]:
                rec = records[u["commitLogOffset"]]
                assert rec["totalSize"] == u["size"]
                out.append((q["topic"], q["queueId"], rec["storeTimestamp"], u["size"]))
    return out


def expected_topics(name):
    out = {}
    for topic, _qid, _ts, size in expected_units(name):
        t = out.setdefault(topic, {"messages": 0, "bytes": 0})
        t["messages"] += 1
        t["bytes"] += size
    return out


def table_rows(page, table_id):
    """The cells (tags stripped, entities decoded) of each body row of table *table_id*."""
    m = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', page, re.S)
    assert m, table_id
    rows = re.findall(r"<tr>(.*?)</tr>", m.group(1), re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)]
            for r in rows]


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """The golden basic store (a copy) and its HTML report: (store dir, summary, page, progress calls)."""
    root = copy_golden_store("basic", tmp_path_factory.mktemp("basic") / "store")
    calls = []
    out = root.parent / "report.html"
    summary = write_report(root, out, now_ms=NOW, progress=lambda d, t: calls.append((d, t)))
    return root, summary, out.read_text(encoding="utf-8"), calls


# --- the golden store ------------------------------------------------------------------------


def test_html_report_of_golden_store(basic):
    root, summary, page, _calls = basic
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for sid in SECTIONS:
        assert page.count(f'id="{sid}"') == 1
    want = expected_topics("basic")
    assert set(want) == {"TopicTest", "OrderTopic", "%RETRY%cg_basic", "SCHEDULE_TOPIC_XXXX"}
    assert summary["topics"] == want
    # most messages first
    assert list(summary["topics"]) == sorted(want, key=lambda t: (-want[t]["messages"], t))
    for topic in want:
        assert html.escape(topic) in page
    assert [r[:2] for r in table_rows(page, "topics-table")] == [
        [t, str(v["messages"])] for t, v in summary["topics"].items()]
    assert html.escape(str(root)) in page
    assert "no consumer group has committed an offset" in page and summary["groups"] == []
    assert summary["output"] == str(root.parent / "report.html") and summary["format"] == "html"
    json.dumps(summary)  # JSON-serialisable
    assert summary["undated"] == 0 and summary["out_of_range"] == 0


def test_queue_table_matches_store_queues(basic):
    root, summary, page, _calls = basic
    dump = load_dump("basic")
    want = sorted((q["topic"], q["queueId"], q["minOffset"], q["maxOffset"]) for q in dump["consumeQueues"])
    got = [(q["topic"], q["queue_id"], q["min_offset"], q["max_offset"]) for q in summary["queues"]]
    assert got == want
    assert all(q["messages"] == q["max_offset"] - q["min_offset"] for q in summary["queues"])
    with MessageStore.open(root, read_only=True) as s:
        assert [(q[0], q[1]) for q in got] == s.queues()
    assert table_rows(page, "queues-table") == [[t, str(q), str(a), str(b), str(b - a)] for t, q, a, b in want]


def test_store_files_match_the_manifest(basic):
    _root, summary, page, _calls = basic
    sizes = {}
    for f in load_dump("basic")["manifest"]:
        kind = f["path"].split("/")[0]
        if kind in ("commitlog", "consumequeue", "index"):
            n, b = sizes.get(kind, (0, 0))
            sizes[kind] = (n + 1, b + f["size"])
    assert {k: (v["count"], v["bytes"]) for k, v in summary["files"].items()} == sizes
    assert set(summary["disk"]) == {"total", "used", "free"}
    assert 0 < summary["disk"]["free"] <= summary["disk"]["total"]
    names = [f["name"] for f in load_dump("basic")["commitlog"]["files"]]
    assert [r[0] for r in table_rows(page, "commitlog-table")] == names
    assert [r[:2] for r in table_rows(page, "files-table")] == [
        ["commitlog", "3"], ["consumequeue", "18"], ["index", "2"]]


def test_page_is_self_contained(basic):
    _root, _summary, page, _calls = basic
    assert "<script" not in page.lower() and "<link" not in page.lower() and "<img" not in page.lower()
    assert "src=" not in page and "@import" not in page
    assert page.count("<svg") == 3  # (no lag chart without consumer groups)
    # every chart's ids are its own: no id repeats across the page, every reference resolves
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    refs = set(re.findall(r'href="#([^"]+)"', page)) | set(re.findall(r"url\(#([^)]+)\)", page))
    assert refs and refs <= set(ids)


def test_progress_calls(basic):
    _root, _summary, _page, calls = basic
    total = load_dump("basic")["commitlog"]["maxOffset"] - load_dump("basic")["commitlog"]["minOffset"]
    assert calls and calls[-1] == (total, total)
    assert all(t == total and 0 <= d <= t for d, t in calls)
    assert [d for d, _t in calls] == sorted(d for d, _t in calls)


@pytest.mark.parametrize("name", ["tiny", "basic"])
def test_time_series_from_the_dump(name):
    """Messages and bytes per bucket equal what the dump's store times give, for
    automatic and explicit bucket sizes, with the other topics summed."""
    units = expected_units(name)
    with MessageStore.open(golden_dir(name) / "store", read_only=True) as s:
        for bucket_ms in (None, 1000, 60_000):
            scan = rp._scan(s, bucket_ms)
            b = scan.bucket_ms
            if bucket_ms is not None:
                assert b == bucket_ms
            t0, t1 = min(u[2] for u in units), max(u[2] for u in units)
            assert scan.start_ms == t0 // b * b and scan.buckets == t1 // b - t0 // b + 1
            assert scan.buckets <= rp.AUTO_BUCKETS or bucket_ms is not None
            want_m = [[0] * scan.buckets for _ in scan.rows]
            want_b = [[0] * scan.buckets for _ in scan.rows]
            for topic, _qid, ts, size in units:
                row = scan.rows.index(topic) if topic in scan.rows else scan.rows.index(rp.OTHER)
                want_m[row][(ts - scan.start_ms) // b] += 1
                want_b[row][(ts - scan.start_ms) // b] += size
            assert scan.messages.tolist() == want_m and scan.nbytes.tolist() == want_b
            for topic, v in scan.topics.items():
                times = [u[2] for u in units if u[0] == topic]
                assert (v["first_store_time"], v["last_store_time"]) == (min(times), max(times))


@pytest.mark.parametrize("name", ["tiny", "basic"])
def test_vectorised_store_times_equal_the_commitlog_reads(name):
    """_store_timestamps (numpy gathers) answers as CommitLog.store_timestamp_at
    for every unit (IPv6 born hosts included) and for offsets outside the data."""
    import numpy as np

    with MessageStore.open(golden_dir(name) / "store", read_only=True) as s:
        units = [u for t, q in s.queues() for u in s.consume_queue(t, q).get_units(0, 1 << 20)]
        hi = s.max_physical_offset
        units += [(hi - 10, 100, 0), (hi, 1, 0), (-5, 10, 0), (0, rp.PRE_BLANK_SIZE, 0)]
        phy = np.array([u[0] for u in units], dtype=np.int64)
        size = np.array([u[1] for u in units], dtype=np.int64)
        got = rp._store_timestamps(s.commitlog.segment_view(), phy, size).tolist()
        assert got == [s.commitlog.store_timestamp_at(u[0], u[1]) for u in units]
        assert got[-4:] == [-1, -1, -1, -1] and min(got[:-4]) > 0


def test_png_report(tmp_path):
    root = copy_golden_store("basic", tmp_path / "store")
    out = tmp_path / "r.png"
    summary = write_report(root, out, now_ms=NOW)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert 20_000 < len(data) < 5_000_000
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert 800 <= width <= 2000 and height > width  # (four panels, one above the other)
    assert summary["format"] == "png" and summary["topics"] == expected_topics("basic")
    assert set(os.listdir(tmp_path)) == {"store", "r.png"}


# --- consumer lag --------------------------------------------------------------------------


def test_consumer_lag_matches_consumer_progress(tmp_path):
    root = copy_golden_store("tiny", tmp_path / "store")
    cfg = StoreConfig.from_dict(load_input("tiny")["storeConfig"]).replace(schedule_service_enable=False)
    with MessageStore.open(root, config=cfg) as s:
        maxes = {q: s.get_max_offset_in_queue(*q) for q in s.queues()}
        s.commit_offset("cg<1>", "TopicTest", 0, 0)  # all behind
        s.commit_offset("cg<1>", "TopicTest", 1, maxes[("TopicTest", 1)])  # drained
        s.commit_offset("audit&co", "OrderTopic", 2, 0)
    out = tmp_path / "r.html"
    summary = write_report(root, out, now_ms=NOW)
    with MessageStore.open(root, read_only=True) as s:
        want = consumer_progress(s, now_ms=NOW)
    assert summary["groups"] == want and len(want) == 3
    assert sum(r["lag"] for r in want) == maxes[("TopicTest", 0)] + maxes[("OrderTopic", 2)] > 0
    page = out.read_text(encoding="utf-8")
    rows = table_rows(page, "lag-table")
    assert [r[:6] for r in rows] == [
        [r["group"], r["topic"], str(r["queue_id"]), str(r["committed_offset"]), str(r["max_offset"]), str(r["lag"])]
        for r in want]
    assert [float(r[7]) for r in rows] == [round(r["lag_ms"] / 1000, 1) for r in want]
    assert "cg&lt;1&gt;" in page and "audit&amp;co" in page and "cg<1>" not in page
    assert "no consumer group has committed an offset" not in page
    lag_section = re.search(r'<section id="consumer-lag">.*?</section>', page, re.S).group(0)
    assert lag_section.count("<svg") == 1


# --- small stores written here ---------------------------------------------------------------


def test_store_supplied_text_is_escaped_and_small_topics_are_summed(tmp_path):
    evil = '<script>alert("x")<script>'
    topics = [evil, "_$x$_", "a&b"] + [f"T{i:02d}" for i in range(10)]
    root = tmp_path / "s"
    clock = StepClock(start=1_700_000_000_000, step=7_000)
    with MessageStore.open(root, SMALL, clock=clock) as s:
        for i, t in enumerate(topics):
            for j in range(len(topics) - i):  # (evil has the most messages)
                s.put_message(Message(t, b"x" * j, queue_id=j % 2))
    out = tmp_path / "r.html"
    summary = write_report(root, out, now_ms=NOW)
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page
    assert html.escape(evil) in page and "a&amp;b" in page and "_$x$_" in page
    assert list(summary["topics"])[:3] == [evil, "_$x$_", "a&b"]
    assert {t: v["messages"] for t, v in summary["topics"].items()} == {
        t: len(topics) - i for i, t in enumerate(topics)}
    # 13 topics: the 10 biggest drawn, 3 summed as "(other)"
    assert "the other 3 topics summed as (other)" in page
    scan_rows = table_rows(page, "topics-table")
    assert [r[0] for r in scan_rows] == list(summary["topics"])
    # 91 puts 7 s apart: 10.5 minutes, in 15 s buckets
    t0, t1 = 1_700_000_000_000, 1_700_000_000_000 + 90 * 7_000
    assert summary["bucket_ms"] == 15_000 and summary["time_buckets"] == t1 // 15_000 - t0 // 15_000 + 1


def test_empty_store_renders(tmp_path):
    root = tmp_path / "empty"
    with MessageStore.open(root, SMALL):
        pass
    summary = write_report(root, tmp_path / "r.html", now_ms=NOW)
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    for sid in SECTIONS:
        assert f'id="{sid}"' in page
    assert summary["topics"] == {} and summary["queues"] == [] and summary["groups"] == []
    assert summary["time_buckets"] == 0 and summary["files"]["consumequeue"] == {"count": 0, "bytes": 0,
                                                                                 "allocated": 0}
    assert "no consumer group has committed an offset" in page
    summary = write_report(root, tmp_path / "r.png", now_ms=NOW)
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["r.pdf", "r", "r.html.gz", "r.svg"])
def test_bad_suffix_raises_and_creates_nothing(tmp_path, name):
    root = copy_golden_store("tiny", tmp_path / "store")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError, match=r"\.html.*\.png"):
        write_report(root, tmp_path / name)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_bad_bucket_ms(tmp_path):
    root = golden_dir("basic") / "store"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="bucket_ms"):
            write_report(root, tmp_path / "r.html", bucket_ms=bad)
    with pytest.raises(ValueError, match="time buckets"):
        write_report(root, tmp_path / "r.html", bucket_ms=1)  # (250 s in ms)
    assert os.listdir(tmp_path) == []


def test_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path / "nothing", tmp_path / "r.html")
    assert os.listdir(tmp_path) == []


def test_missing_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib raises ImportError)
    with pytest.raises(ImportError, match=r"pip install 'rmqstore\[report\]'"):
        write_report(golden_dir("tiny") / "store", tmp_path / "r.html")
    assert os.listdir(tmp_path) == []


def _fake_page(*_args):
    return "<!DOCTYPE html>" + "x" * 100_000


@pytest.mark.parametrize("where", ["fsync", "replace", "render"])
def test_failure_mid_write_leaves_no_file(tmp_path, monkeypatch, where):
    root = copy_golden_store("tiny", tmp_path / "store")
    out = tmp_path / "out"
    out.mkdir()

    def boom(*_args, **_kw):
        raise OSError(28, "No space left on device")

    if where == "render":
        monkeypatch.setattr(rp, "_draw_time", boom)
    else:
        monkeypatch.setattr(rp, "_html", _fake_page)
        monkeypatch.setattr(rp.os, where, boom)
    with pytest.raises(OSError, match="No space"):
        write_report(root, out / "r.html", now_ms=NOW)
    monkeypatch.undo()
    assert os.listdir(out) == []
    # an earlier report stays whole when the next one fails
    (out / "r.html").write_text("old", encoding="utf-8")
    monkeypatch.setattr(rp, "_html", _fake_page)
    monkeypatch.setattr(rp.os, "replace", boom)
    with pytest.raises(OSError):
        write_report(root, out / "r.html", now_ms=NOW)
    assert os.listdir(out) == ["r.html"] and (out / "r.html").read_text(encoding="utf-8") == "old"
