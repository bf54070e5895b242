"""Consumer groups: committed offsets in RocketMQ's ``config/consumerOffset.json``
and the at-least-once consumer helper.

* the file: the JSON shape a broker reads (``offsetTable`` keyed
  ``"<topic>@<group>"``, queue maps, ``dataVersion``), files a broker wrote
  (fastjson's bare integer keys, unknown members), ``.bak`` fallback, atomic
  replacement (a failed or interrupted write leaves the old file);
* the consumer: round robin, tag filter, restart, early exit, and
  at-least-once across a simulated crash (``store._crash()``) and a real
  SIGKILL of a forked consumer (the committed offset is one the child
  acknowledged; nothing before it went undelivered; at most the in-flight
  message comes again).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import threading
import time
import traceback
from pathlib import Path

import pytest

from conftest import golden_store, no_hang
from rmqstore import (
    Consumer,
    ConsumerOffsetStore,
    CorruptedFileError,
    GetMessageStatus,
    IllegalMessageError,
    Message,
    MessageStore,
    MessageTypeError,
    StoreClosedError,
    StoreConfig,
    StoreReadOnlyError,
)
from rmqstore.service.offsets import encode_offset_json, parse_offset_json, split_offset_key

SMALL = dict(
    mapped_file_size_commit_log=64 * 1024,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=32,
    max_index_num=128,
)

# Byte for byte what RocketMQ's ConsumerOffsetManager writes, produced by
# fastjson 1.2.83's JSON.toJSONString(manager, true) (RemotingSerializable.toJson
# with prettyFormat) over a class with ConsumerOffsetManager's fields and
# getters: tabs, members in alphabetical order, Integer map keys written bare
# (not JSON), a key with two '@' (the broadcast offset manager's).
FASTJSON_FILE = (
    "{\n"
    '\t"dataVersion":{\n'
    '\t\t"counter":1,\n'
    '\t\t"stateVersion":0,\n'
    '\t\t"timestamp":1726732800123\n'
    "\t},\n"
    '\t"groupTopicMap":{\n'
    '\t\t"G1":["TopicTest","%RETRY%G1"]\n'
    "\t},\n"
    '\t"offsetTable":{\n'
    '\t\t"TopicTest@G1@broadcast":{0:9\n'
    "\t\t},\n"
    '\t\t"TopicTest@G1":{0:250,1:251\n'
    "\t\t},\n"
    '\t\t"%RETRY%G1@G1":{0:0\n'
    "\t\t}\n"
    "\t}\n"
    "}"
)
FASTJSON_TABLE = {"TopicTest@G1@broadcast": {0: 9}, "TopicTest@G1": {0: 250, 1: 251}, "%RETRY%G1@G1": {0: 0}}

# RocketMQ 4.x: no dataVersion, no groupTopicMap
ROCKETMQ4_FILE = (
    '{\n\t"offsetTable":{\n\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:250,2:250,3:250\n\t\t}\n\t}\n}'
)


def cfg() -> StoreConfig:
    return StoreConfig(**SMALL)


def open_store(root, **kw) -> MessageStore:
    return MessageStore.open(root, config=cfg(), **kw)


def offsets_path(root):
    return os.path.join(str(root), "config", "consumerOffset.json")


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def fill(store, topic="T", per_queue=(5,), tags=None) -> None:
    """per_queue[q] messages into queue q; bodies name (queue, offset)."""
    for q, n in enumerate(per_queue):
        for i in range(n):
            t = None if tags is None else tags(q, i)
            store.put_message(Message(topic, f"{q}:{i}".encode(), queue_id=q, tags=t))


def ids(msgs) -> list:
    return [(m.queue_id, m.queue_offset) for m in msgs]


# --- the file format --------------------------------------------------------------------------


def test_commit_writes_rocketmq_offset_table_round_trip(tmp_path):
    """Write ours, parse it as plain JSON, compare keys ``topic@group`` and the queue maps."""
    root = tmp_path / "s"
    with open_store(root) as s:
        s.commit_offset("G1", "TopicA", 0, 5)
        s.commit_offset("G1", "TopicA", 1, 7)
        s.commit_offset("G1", "TopicA", 0, 6)  # moves on
        s.commit_offset("G2", "TopicA", 3, 0)
        s.commit_offset("G1", "TopicB", 2, 2**40)
        s.commit_offset("%RETRY%G1", "%RETRY%G1", 0, 1)
        assert s.get_committed_offset("G1", "TopicA", 0) == 6
        assert s.get_committed_offset("G1", "TopicA", 2) is None
        assert s.get_committed_offset("nobody", "TopicA", 0) is None
    doc = read_json(offsets_path(root))
    assert doc["offsetTable"] == {
        "TopicA@G1": {"0": 6, "1": 7},
        "TopicA@G2": {"3": 0},
        "TopicB@G1": {"2": 2**40},
        "%RETRY%G1@%RETRY%G1": {"0": 1},
    }
    for queues in doc["offsetTable"].values():
        assert all(type(v) is int for v in queues.values())
    assert set(doc["dataVersion"]) == {"counter", "stateVersion", "timestamp"}
    assert all(type(v) is int for v in doc["dataVersion"].values())
    assert doc["groupTopicMap"] == {"G1": ["TopicA", "TopicB"], "G2": ["TopicA"], "%RETRY%G1": ["%RETRY%G1"]}
    assert list(doc) == sorted(doc)  # fastjson's member order
    text = Path(offsets_path(root)).read_text(encoding="utf-8")
    assert text.startswith('{\n\t"dataVersion":{\n\t\t"counter":') and "\t\t" in text  # fastjson's pretty layout
    # what a broker's decode keeps: keys split at '@' into (topic, group)
    assert {split_offset_key(k) for k in doc["offsetTable"]} == {
        ("TopicA", "G1"), ("TopicA", "G2"), ("TopicB", "G1"), ("%RETRY%G1", "%RETRY%G1"),
    }
    with open_store(root, read_only=True) as ro:
        assert ro.get_committed_offset("G1", "TopicA", 0) == 6
        assert ro.get_committed_offset("G1", "TopicB", 2) == 2**40
        assert ro.consumer_offsets().table() == {
            "TopicA@G1": {0: 6, 1: 7}, "TopicA@G2": {3: 0}, "TopicB@G1": {2: 2**40}, "%RETRY%G1@%RETRY%G1": {0: 1},
        }


def test_reads_the_file_fastjson_writes(tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    path.parent.mkdir()
    path.write_text(FASTJSON_FILE, encoding="utf-8")
    with pytest.raises(ValueError):
        json.loads(FASTJSON_FILE)  # fastjson's bare integer keys are not JSON
    s = ConsumerOffsetStore(path)
    assert s.load()
    assert s.table() == FASTJSON_TABLE
    assert s.data_version == {"counter": 1, "stateVersion": 0, "timestamp": 1726732800123}
    assert s.get("G1", "TopicTest", 1) == 251
    assert s.get("G1@broadcast", "TopicTest", 0) == 9  # looked up as given
    assert s.get_all("G1", "TopicTest") == {0: 250, 1: 251}
    assert s.group_topic_map() == {"G1": ["%RETRY%G1", "TopicTest"]}
    s.commit("G1", "TopicTest", 1, 300)
    doc = read_json(path)  # rewritten as strict JSON; the broker's entries kept
    assert doc["offsetTable"] == {
        "TopicTest@G1@broadcast": {"0": 9}, "TopicTest@G1": {"0": 250, "1": 300}, "%RETRY%G1@G1": {"0": 0},
    }
    assert doc["dataVersion"]["timestamp"] == 1726732800123  # counter moves every 500 commits, as RocketMQ's
    assert (tmp_path / "config" / "consumerOffset.json.bak").read_text(encoding="utf-8") == FASTJSON_FILE
    s.close()


def test_ours_matches_fastjson_layout_but_quotes_queue_ids():
    """The only difference from fastjson's bytes: queue ids are JSON strings."""
    dv = {"counter": 1, "stateVersion": 0, "timestamp": 1726732800123}
    ours = encode_offset_json(FASTJSON_TABLE, dv)
    expected = FASTJSON_FILE.replace("{0:", '{"0":').replace(",1:", ',"1":')
    # groupTopicMap: fastjson prints a HashSet in hash order, we sort
    expected = expected.replace('["TopicTest","%RETRY%G1"]', '["%RETRY%G1","TopicTest"]')
    assert ours == expected
    assert parse_offset_json(ours)["offsetTable"] == FASTJSON_TABLE


def test_reads_rocketmq4_file_without_data_version(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_text(ROCKETMQ4_FILE)
    s = ConsumerOffsetStore(path)
    s.load()
    assert s.get_all("please_rename_unique_group_name_4", "TopicTest") == {0: 250, 1: 250, 2: 250, 3: 250}
    s.commit("g", "t", 0, 1)
    doc = read_json(path)
    assert set(doc) == {"dataVersion", "groupTopicMap", "offsetTable"}
    assert doc["offsetTable"]["TopicTest@please_rename_unique_group_name_4"] == {"0": 250, "1": 250, "2": 250, "3": 250}


def test_unknown_members_are_kept(tmp_path):
    path = tmp_path / "consumerOffset.json"
    doc = {
        "offsetTable": {"T@G": {"0": 3}},
        "lmqOffsetTable": {"%LMQ%1@%LMQ%1": 5},  # LmqConsumerOffsetManager's
        "futureField": {"nested": [1, 2, {"a": None}], "s": "é"},
        "groupTopicMap": {"stale": ["stale"]},  # derived: recomputed
        "dataVersion": {"counter": 7, "stateVersion": 2, "timestamp": 5},
    }
    path.write_text(json.dumps(doc, indent=1))
    s = ConsumerOffsetStore(path)
    s.load()
    assert s.get("G", "T", 0) == 3
    s.commit("G", "T", 0, 4)
    out = read_json(path)
    assert out["lmqOffsetTable"] == doc["lmqOffsetTable"]
    assert out["futureField"] == doc["futureField"]
    assert out["groupTopicMap"] == {"G": ["T"]}
    assert out["dataVersion"] == {"counter": 7, "stateVersion": 2, "timestamp": 5}
    assert out["offsetTable"] == {"T@G": {"0": 4}}
    assert list(out) == sorted(out)


def test_data_version_moves_every_500_commits(tmp_path):
    s = ConsumerOffsetStore(tmp_path / "c.json", sync=False)
    before = s.data_version["counter"]
    for i in range(1000):
        s.commit("G", "T", i % 3, i)
    assert s.data_version["counter"] == before + 2
    s.close()
    assert read_json(tmp_path / "c.json")["dataVersion"]["counter"] == before + 2


BAD_MAIN = {
    "truncated": lambda good: good[: len(good) // 2],
    "garbage": lambda good: b"\x00\xff\xfe garbage \x01",
    "empty": lambda good: b"",
    "zeros": lambda good: b"\x00" * len(good),
    "not-an-object": lambda good: b"[1, 2, 3]",
    "bad-queue-id": lambda good: b'{"offsetTable": {"T@G": {"x": 1}}}',
    "bad-offset": lambda good: b'{"offsetTable": {"T@G": {"0": "many"}}}',
    "missing": None,
}


@pytest.mark.parametrize("damage", sorted(BAD_MAIN))
def test_falls_back_to_bak(tmp_path, damage):
    root = tmp_path / "s"
    with open_store(root) as s:
        s.commit_offset("G", "T", 0, 10)
        s.commit_offset("G", "T", 0, 20)  # .bak now holds offset 10
    path = offsets_path(root)
    good_bak = Path(path + ".bak").read_bytes()
    assert parse_offset_json(good_bak.decode())["offsetTable"] == {"T@G": {0: 10}}
    good = Path(path).read_bytes()
    if BAD_MAIN[damage] is None:
        os.unlink(path)
    else:
        with open(path, "wb") as fh:
            fh.write(BAD_MAIN[damage](good))
    with open_store(root, read_only=True) as ro:
        assert ro.get_committed_offset("G", "T", 0) == 10
        assert ro.consumer_offsets().loaded_from == path + ".bak"
    with open_store(root) as s:
        assert s.get_committed_offset("G", "T", 0) == 10
        s.commit_offset("G", "T", 1, 1)
        # the damaged file is never kept as .bak: the good one stays
        assert Path(path + ".bak").read_bytes() == good_bak
        s.commit_offset("G", "T", 1, 2)
    assert read_json(path)["offsetTable"] == {"T@G": {"0": 10, "1": 2}}
    assert read_json(path + ".bak")["offsetTable"] == {"T@G": {"0": 10, "1": 1}}


def test_bad_file_without_usable_bak_is_an_error(tmp_path):
    root = tmp_path / "s"
    with open_store(root) as s:
        s.commit_offset("G", "T", 0, 1)  # one persist: no .bak yet
    path = offsets_path(root)
    assert not os.path.exists(path + ".bak")
    with open(path, "wb") as fh:
        fh.write(b'{"offsetTable": {"T@G": {0: 1')
    with open_store(root, read_only=True) as ro:
        with pytest.raises(CorruptedFileError) as ei:
            ro.get_committed_offset("G", "T", 0)
        assert ei.value.path == path
    with open(path + ".bak", "wb") as fh:
        fh.write(b"{{{")
    with open_store(root) as s, pytest.raises(CorruptedFileError):
        s.commit_offset("G", "T", 0, 2)
    os.unlink(path)  # missing file, bad .bak: still an error (RocketMQ refuses to start)
    with pytest.raises(CorruptedFileError):
        ConsumerOffsetStore(path).load()
    os.unlink(path + ".bak")  # neither: an empty table
    s2 = ConsumerOffsetStore(path)
    assert s2.load() is False and s2.table() == {}


def test_bak_holds_the_previous_version(tmp_path):
    path = tmp_path / "c.json"
    s = ConsumerOffsetStore(path)
    s.load()
    for off in range(1, 5):
        s.commit("G", "T", 0, off)
        assert read_json(path)["offsetTable"] == {"T@G": {"0": off}}
        if off > 1:
            assert read_json(str(path) + ".bak")["offsetTable"] == {"T@G": {"0": off - 1}}
    # (and the lock that serializes persists of several processes)
    assert sorted(os.listdir(tmp_path)) == ["c.json", "c.json.bak", "c.json.lock"]


def test_bak_by_copy_where_hard_links_fail(tmp_path, monkeypatch):
    def no_link(*a, **k):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    path = tmp_path / "c.json"
    s = ConsumerOffsetStore(path)
    s.commit("G", "T", 0, 1)
    s.commit("G", "T", 0, 2)
    assert read_json(str(path) + ".bak")["offsetTable"] == {"T@G": {"0": 1}}
    assert os.stat(path).st_ino != os.stat(str(path) + ".bak").st_ino


# --- atomic replacement -------------------------------------------------------------------------


@pytest.mark.parametrize("fail", ["rename", "fsync", "write"])
def test_a_failed_persist_leaves_the_old_file(tmp_path, monkeypatch, fail):
    root = tmp_path / "s"
    with open_store(root) as s:
        s.commit_offset("G", "T", 0, 10)
        path = offsets_path(root)
        old = Path(path).read_bytes()
        real_replace, real_rename, real_fsync, real_write = os.replace, os.rename, os.fsync, os.write

        def boom(*a, **k):
            raise OSError(5, f"injected {fail} failure")

        if fail == "rename":  # the final rename of .tmp over the file (the .bak rename may happen)
            def replace(src, dst, *a, **k):
                if os.fspath(dst) == path:
                    boom()
                return real_replace(src, dst, *a, **k)

            def rename(src, dst, *a, **k):
                if os.fspath(dst) == path:
                    boom()
                return real_rename(src, dst, *a, **k)

            monkeypatch.setattr(os, "replace", replace)
            monkeypatch.setattr(os, "rename", rename)
        elif fail == "fsync":
            monkeypatch.setattr(os, "fsync", boom)
        else:
            monkeypatch.setattr(os, "write", boom)
        with pytest.raises(OSError, match="injected"):
            s.commit_offset("G", "T", 0, 11)
        assert Path(path).read_bytes() == old
        fresh = ConsumerOffsetStore(path)
        fresh.load()
        assert fresh.get("G", "T", 0) == 10 and fresh.loaded_from == path
        monkeypatch.setattr(os, "replace", real_replace)
        monkeypatch.setattr(os, "rename", real_rename)
        monkeypatch.setattr(os, "fsync", real_fsync)
        monkeypatch.setattr(os, "write", real_write)
        assert s.consumer_offsets().dirty  # the commit is held in memory ...
    assert read_json(path)["offsetTable"] == {"T@G": {"0": 11}}  # ... and written at close


def test_leftover_temporary_files_are_ignored(tmp_path):
    path = tmp_path / "c.json"
    s = ConsumerOffsetStore(path)
    s.commit("G", "T", 0, 3)
    # a crash between writing .tmp (or .bak.tmp) and renaming it leaves them behind
    (tmp_path / "c.json.tmp").write_text('{"offsetTable": {"T@G": {"0": 999')
    (tmp_path / "c.json.bak.tmp").write_text("half")
    fresh = ConsumerOffsetStore(path)
    fresh.load()
    assert fresh.get("G", "T", 0) == 3
    fresh.commit("G", "T", 0, 4)
    assert read_json(path)["offsetTable"] == {"T@G": {"0": 4}}
    assert read_json(str(path) + ".bak")["offsetTable"] == {"T@G": {"0": 3}}
    assert not (tmp_path / "c.json.tmp").exists() and not (tmp_path / "c.json.bak.tmp").exists()


# --- arguments, concurrency, deferred commits ---------------------------------------------------


@pytest.mark.parametrize(
    "args, error",
    [
        (("G", "T", 0, -1), IllegalMessageError),
        (("G", "T", -1, 0), IllegalMessageError),
        (("G", "T", 1 << 31, 0), IllegalMessageError),
        (("G", "T", 0, 1 << 63), IllegalMessageError),
        (("G@x", "T", 0, 0), IllegalMessageError),
        (("G", "T@x", 0, 0), IllegalMessageError),
        (("", "T", 0, 0), IllegalMessageError),
        (("G", "", 0, 0), IllegalMessageError),
        (("G", "T", 0, 1.0), MessageTypeError),
        (("G", "T", True, 0), MessageTypeError),
        (("G", b"T", 0, 0), MessageTypeError),
        ((None, "T", 0, 0), MessageTypeError),
    ],
)
def test_bad_commits_are_refused(tmp_path, args, error):
    with open_store(tmp_path / "s") as s:
        with pytest.raises(error):
            s.commit_offset(*args)
        assert issubclass(error, ValueError if error is IllegalMessageError else TypeError)
        assert not os.path.exists(offsets_path(tmp_path / "s"))


def test_concurrent_commits_all_land(tmp_path):
    path = tmp_path / "c.json"
    s = ConsumerOffsetStore(path)
    errors = []

    def work(t):
        try:
            for i in range(1, 31):
                s.commit(f"G{t % 2}", "T", t, i)
                assert s.get(f"G{t % 2}", "T", t) == i
        except BaseException as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    with no_hang(30):
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    expected = {f"T@G{g}": {str(t): 30 for t in range(6) if t % 2 == g} for g in (0, 1)}
    assert read_json(path)["offsetTable"] == expected  # the file holds every last commit
    s.close()


def test_deferred_commits_are_persisted_by_timer_flush_and_close(tmp_path):
    path = tmp_path / "c.json"
    s = ConsumerOffsetStore(path, sync=False, flush_interval_ms=30)
    s.commit("G", "T", 0, 1)
    assert s.dirty
    deadline = time.monotonic() + 5
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert read_json(path)["offsetTable"] == {"T@G": {"0": 1}}
    s.flush_interval_ms = 60_000
    time.sleep(0.1)  # the flusher's current wait ends; the next is long
    s.commit("G", "T", 0, 2)
    s.commit("G", "T", 1, 5, sync=True)  # forced: on disk now, with the deferred one
    assert read_json(path)["offsetTable"] == {"T@G": {"0": 2, "1": 5}}
    s.commit("G", "T", 0, 3)
    s.flush()
    assert read_json(path)["offsetTable"]["T@G"]["0"] == 3 and not s.dirty
    s.commit("G", "T", 0, 4)
    s.close()
    assert read_json(path)["offsetTable"]["T@G"]["0"] == 4
    with pytest.raises(StoreClosedError):
        s.commit("G", "T", 0, 5)


def test_store_close_persists_deferred_commits_and_a_crash_does_not(tmp_path):
    root = tmp_path / "s"
    with open_store(root) as s:
        s.commit_offset("G", "T", 0, 1, sync=False)
        assert not os.path.exists(offsets_path(root))
    assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 1}}
    s = open_store(root)
    s.consumer_offsets().flush_interval_ms = 1000
    s.commit_offset("G", "T", 0, 2, sync=False)
    s._crash()  # like kill -9: the deferred commit is lost ...
    time.sleep(1.3)  # ... and the flusher of the dropped store writes nothing later
    assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 1}}
    with open_store(root) as s:
        assert s.get_committed_offset("G", "T", 0) == 1


# --- read-only stores ---------------------------------------------------------------------------


def test_read_only_store_reads_offsets_and_commits_beside_the_writer(tmp_path):
    """A read-only store (a follower process) reads the writer's commits and
    commits itself; neither overwrites the other's queues. An offset store
    opened read-only still refuses."""
    root = tmp_path / "s"
    with open_store(root) as s:
        fill(s, per_queue=(3, 3))
        s.commit_offset("G", "T", 0, 2)
        with open_store(root, read_only=True) as ro:
            assert ro.get_committed_offset("G", "T", 0) == 2
            ro.commit_offset("G", "T", 1, 3)
            s.commit_offset("G", "T", 0, 3)  # the writer's table did not hold queue 1: merged, not lost
            assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 3, "1": 3}}
            assert s.get_committed_offset("G", "T", 1) == 3 and ro.get_committed_offset("G", "T", 0) == 3
            s.commit_offset("H", "T", 0, 1, sync=False)  # deferred: laid over what the follower writes next
            ro.commit_offset("G", "T", 1, 1)
            assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 3, "1": 1}}
        assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 3, "1": 1}}
    assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 3, "1": 1}, "T@H": {"0": 1}}
    ro_offsets = ConsumerOffsetStore(offsets_path(root), read_only=True)
    ro_offsets.load()
    with pytest.raises(StoreReadOnlyError):
        ro_offsets.commit("G", "T", 0, 3)
    with pytest.raises(StoreReadOnlyError):
        ro_offsets.persist()
    assert ro_offsets.get("H", "T", 0) == 1


def test_read_only_store_sees_a_writer_commit(tmp_path):
    root = tmp_path / "s"
    with open_store(root) as w, open_store(root, read_only=True) as ro:
        assert ro.get_committed_offset("G", "T", 0) is None
        w.commit_offset("G", "T", 0, 1)
        assert ro.get_committed_offset("G", "T", 0) == 1
        w.commit_offset("G", "T", 0, 7)
        assert ro.get_committed_offset("G", "T", 0) == 7


def test_read_only_golden_store_has_no_offsets_and_is_not_written(golden_set):
    root = golden_store(golden_set)
    before = sorted(os.listdir(root))
    with MessageStore.open(root, read_only=True) as ro:
        assert ro.get_committed_offset("G", "TopicTest", 0) is None
        assert ro.consumer_offsets().table() == {}
    assert sorted(os.listdir(root)) == before


def test_closed_store(tmp_path):
    s = open_store(tmp_path / "s")
    fill(s, per_queue=(2,))
    c = s.consumer("G", "T")
    assert next(c).queue_offset == 0
    s.close()
    with pytest.raises(StoreClosedError):
        s.commit_offset("G", "T", 0, 1)
    with pytest.raises(StoreClosedError):
        s.get_committed_offset("G", "T", 0)
    with pytest.raises(StoreClosedError):
        next(c)
    c.close()  # nothing to do: the store is gone
    with pytest.raises(StoreClosedError):
        s.consumer("G", "T")


# --- the consumer -------------------------------------------------------------------------------


def test_consumer_round_robin_over_queues(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=(3, 1, 2))
        for batch in (1, 2, 32):
            with s.consumer(f"G{batch}", "T", batch=batch) as c:
                got = list(c)
            assert ids(got) == [(0, 0), (1, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
            assert [m.body for m in got] == [b"0:0", b"1:0", b"2:0", b"0:1", b"2:1", b"0:2"]
            assert s.consumer_offsets().get_all(f"G{batch}", "T") == {0: 3, 1: 1, 2: 2}
        with s.consumer("Gq", "T", queue_ids=[2, 0]) as c:
            assert ids(c) == [(0, 0), (2, 0), (0, 1), (2, 1), (0, 2)]
        assert s.consumer_offsets().get_all("Gq", "T") == {0: 3, 2: 2}


def test_consumer_commits_each_message_when_the_next_is_asked_for(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=(4,))
        c = s.consumer("G", "T")
        m = next(c)
        assert m.queue_offset == 0 and c.in_flight == (0, 0)
        assert s.get_committed_offset("G", "T", 0) is None  # in flight: not acknowledged
        next(c)
        assert s.get_committed_offset("G", "T", 0) == 1  # asking for #1 acknowledged #0
        assert read_json(offsets_path(tmp_path / "s"))["offsetTable"] == {"T@G": {"0": 1}}  # on disk
        next(c)
        assert s.get_committed_offset("G", "T", 0) == 2
        c.close()  # the in-flight message (#2) is not acknowledged by close
        assert s.get_committed_offset("G", "T", 0) == 2
        with pytest.raises(StoreClosedError):
            next(c)
        c2 = s.consumer("G", "T")
        assert next(c2).queue_offset == 2  # re-delivered
        c2.commit()  # processed it: acknowledge before leaving early
        assert s.get_committed_offset("G", "T", 0) == 3
        c2.close()
        assert ids(s.consumer("G", "T")) == [(0, 3)]
        assert s.get_committed_offset("G", "T", 0) == 4


@pytest.mark.parametrize("per_queue", [(3,), (3, 2)], ids=["one-queue", "two-queues"])
def test_consumer_commits_each_acknowledgement_once(tmp_path, monkeypatch, per_queue):
    """One commit per message acknowledged, none for a pull or a drained
    queue (with sync=True each would replace the file)."""
    from rmqstore.service.offsets import ConsumerOffsetStore

    commits: list = []
    real = ConsumerOffsetStore._commit_checked
    monkeypatch.setattr(ConsumerOffsetStore, "_commit_checked",
                        lambda self, key, checked, sync: (commits.append(dict(checked)),
                                                          real(self, key, checked, sync)))
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=per_queue)
        c = s.consumer("G", "T", batch=2)
        assert len(list(c)) == sum(per_queue)
        want = [{0: 1}, {0: 2}, {0: 3}] if per_queue == (3,) else [{0: 1}, {1: 1}, {0: 2}, {1: 2}, {0: 3}]
        assert commits == want
        assert list(c) == [] and commits == want  # drained: nothing more to commit
        c.close()


def test_consumer_commit_that_failed_is_made_by_the_next_message(tmp_path, monkeypatch):
    """A persist that fails raises from next() (the message is not handed out);
    the next call commits that progress again, with nothing else moving."""
    root = tmp_path / "s"
    with open_store(root) as s:
        fill(s, per_queue=(4, 4))
        c = s.consumer("G", "T")
        assert ids([next(c), next(c), next(c)]) == [(0, 0), (1, 0), (0, 1)]
        real_fsync = os.fsync

        def boom(fd):
            raise OSError(5, "injected fsync failure")

        monkeypatch.setattr(os, "fsync", boom)
        with pytest.raises(OSError, match="injected"):
            next(c)  # acknowledges (0, 1): its commit is not on disk
        assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 1, "1": 1}}
        monkeypatch.setattr(os, "fsync", real_fsync)
        assert ids([next(c)]) == [(1, 1)]  # the failed call handed out nothing
        assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 2, "1": 1}}
        c.close()


def test_consumer_exception_in_the_loop_redelivers_that_message(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=(5,))
        seen = []
        with pytest.raises(RuntimeError), s.consumer("G", "T") as c:
            for m in c:
                if m.queue_offset == 3:
                    raise RuntimeError("handler failed")
                seen.append(m.queue_offset)
        assert seen == [0, 1, 2]
        assert s.get_committed_offset("G", "T", 0) == 3
        with s.consumer("G", "T") as c:
            assert [m.queue_offset for m in c] == [3, 4]


def test_consumer_restarts_and_new_queues_are_found(tmp_path):
    root = tmp_path / "s"
    with open_store(root) as s:
        fill(s, per_queue=(2,))
        c = s.consumer("G", "T")
        assert ids(c) == [(0, 0), (0, 1)]
        assert list(c) == []  # drained: no waiting
        s.put_message(Message("T", b"late", queue_id=0))
        s.put_message(Message("T", b"new queue", queue_id=3))
        assert ids(c) == [(0, 2), (3, 0)]  # iterating again continues, queue 3 found
        c.close()
        assert ids(s.consumer("G", "T")) == []
        assert ids(s.consumer("other", "T")) == [(0, 0), (3, 0), (0, 1), (0, 2)]
    with open_store(root) as s:  # after a restart
        assert s.consumer_offsets().get_all("G", "T") == {0: 3, 3: 1}
        s.put_message(Message("T", b"after restart", queue_id=3))
        assert [m.body for m in s.consumer("G", "T")] == [b"after restart"]


def test_consumer_tag_filter(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=(10, 4), tags=lambda q, i: "A" if (i % 3 == 0) else "B")
        got = list(s.consumer("GA", "T", tags="A", batch=2))
        assert ids(got) == [(0, 0), (1, 0), (0, 3), (1, 3), (0, 6), (0, 9)]
        assert all(m.tags == "A" for m in got)
        # the filtered-out messages count as consumed: the queues are done
        assert s.consumer_offsets().get_all("GA", "T") == {0: 10, 1: 4}
        got = list(s.consumer("GB", "T", tags="B || C"))
        assert len(got) == 10 - 4 + 4 - 2 and all(m.tags == "B" for m in got)
        assert s.consumer_offsets().get_all("GB", "T") == {0: 10, 1: 4}
        assert list(s.consumer("GZ", "T", tags=["Z"])) == []
        assert s.consumer_offsets().get_all("GZ", "T") == {0: 10, 1: 4}


def test_consumer_starts_at_committed_offset_and_corrects_overflow(tmp_path):
    with open_store(tmp_path / "s") as s:
        fill(s, per_queue=(5, 5))
        s.commit_offset("G", "T", 0, 3)
        s.commit_offset("G", "T", 1, 1000)  # past the end (OFFSET_OVERFLOW_BADLY): moved to the end
        c = s.consumer("G", "T")
        assert ids(c) == [(0, 3), (0, 4)]
        assert s.consumer_offsets().get_all("G", "T") == {0: 5, 1: 5}


def test_consumer_arguments(tmp_path):
    with open_store(tmp_path / "s") as s:
        for kwargs, error in [
            (dict(group="G@x", topic="T"), IllegalMessageError),
            (dict(group="G", topic=""), IllegalMessageError),
            (dict(group="G", topic="T", batch=0), IllegalMessageError),
            (dict(group="G", topic="T", batch=1.5), MessageTypeError),
            (dict(group="G", topic="T", queue_ids=3), MessageTypeError),
            (dict(group="G", topic="T", queue_ids=[-1]), IllegalMessageError),
            (dict(group=1, topic="T"), MessageTypeError),
        ]:
            with pytest.raises(error):
                s.consumer(**kwargs)
        c = s.consumer("G", "T")
        assert isinstance(c, Consumer) and list(c) == [] and "G" in repr(c)


def test_deferred_consumer_commits_are_written_at_close(tmp_path):
    root = tmp_path / "s"
    with open_store(root) as s:
        fill(s, per_queue=(20,))
        with s.consumer("G", "T", sync=False) as c:
            assert len(list(c)) == 20
        assert s.get_committed_offset("G", "T", 0) == 20
    assert read_json(offsets_path(root))["offsetTable"] == {"T@G": {"0": 20}}


# --- at-least-once across crashes ---------------------------------------------------------------


@pytest.mark.parametrize("queues", [1, 3])
def test_at_least_once_across_simulated_crash(tmp_path, queues):
    rnd = random.Random(1234 + queues)
    root = tmp_path / "s"
    per = (12, 7, 9)[:queues]
    with open_store(root) as s:
        fill(s, per_queue=per)
    everything = {(q, i) for q in range(queues) for i in range(per[q])}
    delivered: list = []
    for _round in range(4):
        s = open_store(root)
        c = s.consumer("G", "T", batch=rnd.choice([1, 3, 32]))
        n = rnd.randint(1, 8)
        got = []
        for m in c:
            got.append((m.queue_id, m.queue_offset))
            if len(got) == n:
                break
        if delivered and got:
            # only the previous round's in-flight message may come again
            assert got[0] == delivered[-1] or got[0] not in delivered
        delivered += got
        in_flight = got[-1] if len(got) == n else None
        s._crash()  # no close: nothing more is committed, like kill -9
        s = open_store(root, read_only=True)
        committed = s.consumer_offsets().get_all("G", "T")
        s.close()
        for q, off in committed.items():
            # everything before the committed offset was delivered
            assert {(q, i) for i in range(off)} <= set(delivered)
            if in_flight is not None and in_flight[0] == q:
                assert off == in_flight[1]  # the in-flight message is not acknowledged
    with open_store(root) as s:
        rest = ids(s.consumer("G", "T"))
    delivered += rest
    assert set(delivered) == everything
    dups = len(delivered) - len(set(delivered))
    assert dups <= 4  # at most one in-flight message per crash


def _child_consume(root, wfd, seed: int) -> int:
    rnd = random.Random(seed)
    s = MessageStore.open(root, config=cfg())
    os.write(wfd, b"ready\n")
    c = s.consumer("G", "T", batch=rnd.choice([1, 4, 32]))
    for m in c:
        # "delivered" before processing it; asking for the next one acknowledges it
        os.write(wfd, f"D {m.queue_id} {m.queue_offset}\n".encode())
        if rnd.random() < 0.3:
            time.sleep(rnd.uniform(0, 0.002))
    os.write(wfd, b"done\n")
    s.close()
    return 0


def _run_and_kill(root, seed: int, rnd: random.Random):
    """Fork a consumer, SIGKILL it after a random number of deliveries (or when
    it ends by itself); return its delivery lines."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 1
        try:
            os.close(rfd)
            code = _child_consume(root, wfd, seed)
        except BaseException:
            try:
                os.write(wfd, ("E " + traceback.format_exc().replace("\n", " | "))[:500].encode() + b"\n")
            except BaseException:
                pass
            code = 2
        finally:
            os._exit(code)
    os.close(wfd)
    kill_after = rnd.randint(0, 25)
    buf = bytearray()
    give_up = time.monotonic() + 20
    try:
        while time.monotonic() < give_up:
            r, _, _ = select.select([rfd], [], [], 0.05)
            if r:
                data = os.read(rfd, 1 << 16)
                if not data:
                    break
                buf += data
                if buf.count(b"\nD ") + buf.startswith(b"D ") >= kill_after:
                    time.sleep(rnd.uniform(0, 0.003))  # land anywhere: in the handler, a pull, a persist
                    break
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
    while True:
        data = os.read(rfd, 1 << 16)
        if not data:
            break
        buf += data
    os.close(rfd)
    lines = bytes(buf).split(b"\n")[:-1]  # complete lines only
    errors = [ln for ln in lines if ln.startswith(b"E ")]
    assert not errors, errors[0].decode()
    return [tuple(map(int, ln.split()[1:])) for ln in lines if ln.startswith(b"D ")]


KILL_CAMPAIGNS = max(1, int(os.environ.get("RMQSTORE_CONSUMER_KILL_CAMPAIGNS", "3")))


@pytest.mark.parametrize("campaign", range(KILL_CAMPAIGNS))
def test_at_least_once_across_kill_9(tmp_path, campaign):
    """Up to 8 rounds on one store: a forked consumer is killed after a random
    number of deliveries (often inside a persist); the parent checks the
    committed offsets after each kill, then resumes. RMQSTORE_CONSUMER_KILL_CAMPAIGNS
    sets the number of stores (default 3), RMQSTORE_CRASH_SEED the seed."""
    seed = int(os.environ.get("RMQSTORE_CRASH_SEED", random.randrange(1 << 30))) + 1000 * campaign
    rnd = random.Random(seed)
    root = str(tmp_path / "s")
    per = (40, 25, 35)
    with open_store(root) as s:
        fill(s, per_queue=per)
    everything = {(q, i) for q in range(3) for i in range(per[q])}
    delivered: list = []
    kills = 0
    with no_hang(60):
        for rnd_i in range(8):
            before = set(delivered)
            got = _run_and_kill(root, seed + rnd_i, rnd)
            kills += 1
            with open_store(root, read_only=True) as ro:
                committed = ro.consumer_offsets().get_all("G", "T")
            for q, off in committed.items():
                acked = {o + 1 for (qq, o) in got if qq == q} | {o + 1 for (qq, o) in before if qq == q}
                # the committed offset is one the child (or an earlier one) acknowledged ...
                assert off in acked, (seed, rnd_i, q, off)
                # ... and every message before it was delivered
                assert {(q, i) for i in range(off)} <= before | set(got), (seed, rnd_i, q, off)
            # within this round: every message but the last delivered one is acknowledged
            for q in range(3):
                mine = [o for (qq, o) in got[:-1] if qq == q]
                if mine:
                    assert committed.get(q, 0) >= max(mine) + 1, (seed, rnd_i, q)
            delivered += got
            if set(delivered) == everything and len(committed) == 3 and all(
                committed[q] == per[q] for q in range(3)
            ):
                break
    with open_store(root) as s:  # resume: from the committed offsets
        committed = s.consumer_offsets().get_all("G", "T")
        rest = ids(s.consumer("G", "T"))
    for q in range(3):
        first = [o for (qq, o) in rest if qq == q]
        if first:
            assert first[0] == committed.get(q, 0), (seed, q)
    delivered += rest
    assert set(delivered) == everything, seed
    assert len(delivered) - len(everything) <= kills, seed  # at most the in-flight message per kill


def test_a_follower_pulls_past_the_end_it_last_saw(tmp_path):
    """A read-only store asked beyond the end it knows (an offset another
    member committed) follows the writer first: FOUND, not
    OFFSET_OVERFLOW_BADLY (which sent a consumer back to the queue's start)."""
    root = tmp_path / "s"
    with open_store(root) as s:
        fill(s, per_queue=(2,))
        with open_store(root, read_only=True) as ro:
            assert ro.get_messages("T", 0, 0).next_begin_offset == 2
            fill(s, per_queue=(6,))
            r = ro.get_messages("T", 0, 5)
            assert r.status is GetMessageStatus.FOUND and [m.queue_offset for m in r.messages] == [5, 6, 7]
