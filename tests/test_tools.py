"""The damaged-store tools: ``verify``, ``salvage`` and ``recover`` (rmqstore.tools
and their CLI commands), on the golden stores and on damaged copies of
``basic`` made in tmp_path. Every damage test names the file and the exact
offset it damaged."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import struct
import sys

import pytest

from conftest import copy_golden_store, dump_messages, golden_store, load_dump, load_input
from rmqstore import Message, MessageStore, StoreConfig, _pure
from rmqstore.cli import main
from rmqstore.tools import Problem, recover_store, salvage_store, verify_store

GOLD = "basic"
FILE_SIZE = 65536
CL = ["00000000000000000000", "00000000000000065536", "00000000000000131072"]
SLOTS, ENTRIES = 100, 300
INDEX_BASE = 40 + 4 * SLOTS  # entry n at INDEX_BASE + 20 * n


# --- helpers ---------------------------------------------------------------------------------------


def records():
    return dump_messages(GOLD)


def seg_records(i):
    return [r for r in records() if r["file"] == CL[i]]


def data_end_position():
    """Where written data ends in the last segment (a position in that file)."""
    return load_dump(GOLD)["commitlog"]["files"][-1]["dataEndPosition"]


def cq_units(topic, qid):
    return next(c for c in load_dump(GOLD)["consumeQueues"] if (c["topic"], c["queueId"]) == (topic, qid))["units"]


def index_files():
    return load_dump(GOLD)["index"]["files"]


def patch(path, offset, data: bytes):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def xor_byte(path, offset, mask=0xFF):
    with open(path, "rb") as fh:
        fh.seek(offset)
        b = fh.read(1)[0]
    patch(path, offset, bytes([b ^ mask]))


def hash_tree(root):
    """sha256, size and mtime of every file under *root*, by relative path."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
            st = os.stat(p)
            out[os.path.relpath(p, root)] = (digest, st.st_size, st.st_mtime_ns)
    return out


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture
def root(tmp_path):
    return copy_golden_store(GOLD, tmp_path / "store")


def errors(problems):
    return [p for p in problems if p.severity == "error"]


def find(problems, file, offset, text, severity="error"):
    """The problems at *file*@*offset* of *severity* whose text contains *text*."""
    hits = [p for p in problems
            if p.file == file and p.offset == offset and p.severity == severity and text in p.problem]
    assert hits, f"no {severity} '{text}' at {file}@{offset} in:\n" + "\n".join(map(str, problems))
    return hits


# --- verify: healthy stores ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "basic"])
def test_golden_store_has_no_problems_and_is_not_touched(name):
    root = golden_store(name)
    before = hash_tree(root)
    assert verify_store(root) == []
    assert hash_tree(root) == before


def test_verify_keeps_the_records_it_walked_as_columns(tmp_path):
    """The verifier's record table gives back each record as it was added
    (keys of every count, topics and files shared by number) and finds
    records by physical offset only where one starts."""
    from rmqstore.tools import _Rec, _RecordTable, _Verifier

    recs = [
        _Rec("commitlog/0", 0, 0, 100, "T", 0, 0, 0, 7, frozenset()),
        _Rec("commitlog/0", 100, 100, 120, "Other", 3, 2**40, 8, -(2**62), frozenset({5})),
        _Rec("commitlog/1", 0, 4096, 90, "T", 2**31 - 1, 1, 4, 0, frozenset({0, 2**31 - 1, 77})),
        _Rec("commitlog/1", 90, 4186, 95, "T", 1, 2, 0, 9, frozenset()),
    ]
    table = _RecordTable()
    for r in recs:
        table.add(r)
    assert len(table) == 4 and list(table) == recs
    assert [table.get(r.phys) for r in recs] == recs
    assert [table.get(p) for p in (-1, 1, 99, 4095, 4187, 10**6)] == [None] * 6
    assert table.names == ["T", "commitlog/0", "Other", "commitlog/1"]
    with pytest.raises(ValueError):
        table.add(recs[0])  # the walk adds in physical-offset order only
    # the golden store's walk: every record found where the dump says
    v = _Verifier(str(golden_store("basic")), None, window=10**6)  # (one window: the whole walk kept)
    try:
        v.commitlog()
        dump = dump_messages("basic")
        assert len(v.records) == len(dump)
        for m in dump:
            rec = v.lookup(m["physicalOffset"])
            assert (rec.phys, rec.size, rec.topic, rec.queue_id, rec.queue_offset, rec.tags_code) == (
                m["physicalOffset"], m["totalSize"], m["topic"], m["queueId"], m["queueOffset"],
                m["dispatch"]["tagsCode"])
            keys = [m["dispatch"]["uniqKey"]] + (m["dispatch"]["keys"] or "").split(" ")
            assert rec.key_hashes == {_pure.index_key_hash(f"{m['topic']}#{key}") for key in keys if key}
    finally:
        v.close()


def test_cli_verify_golden(capsys):
    code, out, _ = run(capsys, "verify", golden_store(GOLD))
    assert code == 0
    assert out.strip().endswith("OK, no problems found")
    code, out, _ = run(capsys, "verify", golden_store(GOLD), "--json", "--strict")
    assert (code, json.loads(out)) == (0, [])


def test_verify_store_with_crc_properties(tmp_path):
    """A store written with __CRC32# properties verifies clean; damage outside
    the body (which the body CRC does not cover) is caught by the property CRC."""
    cfg = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=200,
                      max_hash_slot_num=8, max_index_num=32, enabled_append_prop_crc=True)
    with MessageStore.open(tmp_path / "s", config=cfg, clock=lambda: 1_700_000_000_000) as s:
        results = [s.put_message(Message("T", b"body-%d" % i, tags="a", keys=f"k{i}")) for i in range(5)]
    assert verify_store(tmp_path / "s") == []
    victim = results[2].wrote_offset
    xor_byte(tmp_path / "s" / "commitlog" / CL[0], victim + 16, 0x01)  # FLAG
    problems = verify_store(tmp_path / "s")
    find(problems, f"commitlog/{CL[0]}", victim, "__CRC32#")


def test_salvage_keeps_crc_properties_record_by_record(tmp_path):
    """Records with and without __CRC32# (the option was switched on later)
    come out byte-identical; a record whose __CRC32# fails is skipped."""
    cfg = StoreConfig(mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=200,
                      max_hash_slot_num=8, max_index_num=32)
    src = tmp_path / "src"
    clock = iter(range(1_700_000_000_000, 1_700_000_001_000))
    for crc in (False, True, False):
        with MessageStore.open(src, config=cfg.replace(enabled_append_prop_crc=crc), clock=lambda: next(clock)) as s:
            s.put_messages([Message("T", b"m%d" % i, queue_id=i % 2, tags="t", properties={"p": ""}) for i in range(3)])
    report = salvage_store(src, tmp_path / "out")
    assert report["messages_copied"] == 9 and report["properties_rewritten"] == 0
    assert hash_tree(src / "commitlog") .keys() == hash_tree(tmp_path / "out" / "commitlog").keys()
    for name in hash_tree(src / "commitlog"):
        assert (src / "commitlog" / name).read_bytes() == (tmp_path / "out" / "commitlog" / name).read_bytes()
    assert verify_store(tmp_path / "out") == []
    # damage the FLAG of a CRC record: its body CRC still passes, its __CRC32# does not
    second = [m for m in _messages(src)][4]
    xor_byte(src / "commitlog" / CL[0], second.physical_offset + 16, 0x01)
    report = salvage_store(src, tmp_path / "out2")
    assert report["messages_copied"] == 8
    assert [tuple(r) for r in report["bad_regions"]] == [
        (f"commitlog/{CL[0]}", second.physical_offset, second.store_size)]


@pytest.mark.parametrize("window", [1, 2, 7, 64])
def test_verify_in_windows_finds_what_one_window_finds(root, window, monkeypatch):
    """The walk keeps at most *window* records; units and index entries
    are checked as it passes what they point at. Damage of every kind
    (a bad record, units pointing wrong, a unit zeroed, index entries
    pointing wrong or out of order) is reported the same, in the same order,
    whatever the window."""
    from rmqstore.tools import verify as verify_module

    xor_byte(root / "commitlog" / CL[0], seg_records(0)[30]["filePosition"] + 88 + 3, 0x10)  # a body CRC
    units = cq_units("TopicTest", 0)
    rel = f"consumequeue/TopicTest/0/{units[5]['file']}"
    patch(root / rel, units[5]["filePosition"], struct.pack(">q", units[40]["commitLogOffset"]))  # forward
    rel2 = f"consumequeue/TopicTest/0/{units[45]['file']}"
    patch(root / rel2, units[45]["filePosition"], struct.pack(">q", units[2]["commitLogOffset"]))  # backward
    oq = cq_units("OrderTopic", 1)
    patch(root / f"consumequeue/OrderTopic/1/{oq[7]['file']}", oq[7]["filePosition"], bytes(20))  # zeroed
    ix = index_files()[0]
    base = 40 + 4 * 100
    for e, phy in ((3, records()[150]["physicalOffset"]), (200, records()[1]["physicalOffset"] + 1)):
        patch(root / "index" / ix["name"], base + 20 * e + 4, struct.pack(">q", phy))
    whole = verify_store(root)
    assert len(errors(whole)) >= 6
    monkeypatch.delenv("RMQSTORE_VERIFY_WINDOW", raising=False)
    monkeypatch.setattr(verify_module, "WINDOW_RECORDS", window)
    assert verify_store(root) == whole


# --- verify: CommitLog damage ----------------------------------------------------------------------


def test_flipped_body_byte_in_a_non_last_segment(root, capsys):
    victim = seg_records(0)[50]
    xor_byte(root / "commitlog" / CL[0], victim["filePosition"] + 88 + 2000, 0x04)
    problems = verify_store(root)
    find(problems, f"commitlog/{CL[0]}", victim["filePosition"], "body CRC mismatch")
    code, out, _ = run(capsys, "verify", root)
    assert code == 1
    assert f"error commitlog/{CL[0]}@{victim['filePosition']}: invalid record at physical offset " in out
    assert "error(s)" in out.splitlines()[-1]


def test_physical_offset_field_mismatch(root):
    victim = seg_records(0)[10]
    xor_byte(root / "commitlog" / CL[0], victim["filePosition"] + 35, 0x01)
    find(verify_store(root), f"commitlog/{CL[0]}", victim["filePosition"], "PHYSICALOFFSET field holds")


def test_truncated_segment(root):
    os.truncate(root / "commitlog" / CL[1], 40000)
    problems = verify_store(root)
    find(problems, f"commitlog/{CL[1]}", 40000, "segment has 40000 bytes, the other segments 65536")


def test_zeroed_hole_in_a_non_last_segment(root):
    victim = seg_records(1)[20]
    patch(root / "commitlog" / CL[1], victim["filePosition"], bytes(100))
    problems = verify_store(root)
    find(problems, f"commitlog/{CL[1]}", victim["filePosition"], "a hole in a segment that is not the last")


def test_zeroed_hole_in_the_last_segment_before_valid_records(root):
    victim = seg_records(2)[10]
    patch(root / "commitlog" / CL[2], victim["filePosition"], bytes(8))
    find(verify_store(root), f"commitlog/{CL[2]}", victim["filePosition"], "valid records follow")


def test_garbage_after_the_end_of_data_in_the_last_segment(root, capsys):
    pos = data_end_position() + 1000
    patch(root / "commitlog" / CL[2], pos, b"\x5a" * 16)
    problems = verify_store(root)
    assert problems == [Problem(f"commitlog/{CL[2]}", pos, problems[0].problem, "warning")]
    assert "after the end of written data" in problems[0].problem
    assert run(capsys, "verify", root)[0] == 0  # warnings only
    assert run(capsys, "verify", root, "--strict")[0] == 1


# --- verify: ConsumeQueue damage -------------------------------------------------------------------


def test_cq_unit_points_at_the_wrong_record(root):
    units = cq_units("TopicTest", 0)
    u5, u6 = units[5], units[6]
    rel = f"consumequeue/TopicTest/0/{u5['file']}"
    patch(root / rel, u5["filePosition"], struct.pack(">q", u6["commitLogOffset"]))
    problems = verify_store(root)
    find(problems, rel, u5["filePosition"], "points at a record of")
    # and the record the unit stood for is now missing from its queue
    find(problems, rel, u5["filePosition"], "message missing from ConsumeQueue")


def test_missing_cq_unit(root):
    units = cq_units("TopicTest", 0)
    u5 = units[5]
    rel = f"consumequeue/TopicTest/0/{u5['file']}"
    patch(root / rel, u5["filePosition"], bytes(20))
    problems = verify_store(root)
    assert len(problems) == 2, problems
    find(problems, rel, u5["filePosition"], "message missing from ConsumeQueue: TopicTest/0 queue offset 5")
    find(problems, rel, u5["filePosition"] + 20, "stale units after the end of the queue", "warning")


def test_cq_unit_beyond_the_commitlog_end(root):
    u = cq_units("OrderTopic", 1)[3]
    rel = f"consumequeue/OrderTopic/1/{u['file']}"
    patch(root / rel, u["filePosition"], struct.pack(">q", 10 * FILE_SIZE))
    find(verify_store(root), rel, u["filePosition"], "points beyond the CommitLog end")


def test_cq_unit_with_a_wrong_tags_code(root):
    u = cq_units("TopicTest", 1)[2]
    rel = f"consumequeue/TopicTest/1/{u['file']}"
    patch(root / rel, u["filePosition"] + 12, struct.pack(">q", u["tagsCode"] + 1))
    problems = verify_store(root)
    assert [(p.file, p.offset) for p in problems] == [(rel, u["filePosition"])]
    assert "tags code" in problems[0].problem


# --- verify: index damage --------------------------------------------------------------------------


def test_index_entry_with_a_wrong_physical_offset(root):
    f = index_files()[1]
    e = f["entries"][9]  # entry 10
    rel = f"index/{f['name']}"
    off = INDEX_BASE + 20 * e["index"]
    patch(root / rel, off + 4, struct.pack(">q", e["phyOffset"] + 1))
    problems = verify_store(root)
    bad = errors(problems)
    assert [(p.file, p.offset) for p in bad] == [(rel, off)], problems
    assert "where no valid record starts" in bad[0].problem
    # the next entry (same record) now looks out of CommitLog order
    find(problems, rel, off + 20, "before the previous entry's", "warning")


def test_index_entry_pointing_at_a_record_without_its_key(root):
    f = index_files()[1]
    e10, e12 = f["entries"][9], f["entries"][11]
    assert e10["phyOffset"] != e12["phyOffset"]
    rel = f"index/{f['name']}"
    off = INDEX_BASE + 20 * e10["index"]
    patch(root / rel, off + 4, struct.pack(">q", e12["phyOffset"]))
    find(verify_store(root), rel, off, "has no key with this hash")


def test_index_slot_pointing_beyond_index_count(root):
    f = index_files()[1]
    count = f["header"]["indexCount"]
    slot = f["usedSlots"][0]["slot"]
    rel = f"index/{f['name']}"
    off = 40 + 4 * slot
    patch(root / rel, off, struct.pack(">i", count + 5))
    problems = verify_store(root)
    bad = errors(problems)
    assert [(p.file, p.offset) for p in bad] == [(rel, off)], problems
    assert f"outside [1, indexCount={count})" in bad[0].problem
    # the entries of that slot's chain can no longer be found
    assert any("not reachable from their hash slot" in p.problem for p in problems if p.severity == "warning")


def test_index_file_of_the_wrong_size(root):
    f = index_files()[0]
    rel = f"index/{f['name']}"
    os.truncate(root / rel, 6000)
    find(verify_store(root), rel, 6000, "index file has 6000 bytes")


# --- verify: checkpoint and abort ------------------------------------------------------------------


def test_missing_checkpoint(root, capsys):
    os.remove(root / "checkpoint")
    assert verify_store(root) == [Problem("checkpoint", 0, "checkpoint file is missing", "warning")]
    code, out, _ = run(capsys, "verify", root)
    assert code == 0 and out.splitlines()[0] == "warning checkpoint@0: checkpoint file is missing"


def test_abort_file(root, capsys):
    (root / "abort").write_text("4242")
    problems = verify_store(root)
    assert [(p.file, p.offset, p.severity) for p in problems] == [("abort", 0, "warning")]
    assert "not shut down cleanly" in problems[0].problem
    code, out, _ = run(capsys, "verify", root, "--json", "--strict")
    assert code == 1
    assert json.loads(out) == [problems[0]._asdict()]


def test_verify_opens_nothing_writable(root, monkeypatch):
    """verify maps and reads; it never asks for write access (nor creates files)."""
    import builtins

    xor_byte(root / "commitlog" / CL[1], seg_records(1)[5]["filePosition"] + 100)
    real_os_open, real_open = os.open, builtins.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def os_open(path, flags, *a, **kw):
        assert not flags & write_flags, (path, flags)
        return real_os_open(path, flags, *a, **kw)

    def open_(file, mode="r", *a, **kw):
        assert not set(mode) & set("wax+"), (file, mode)
        return real_open(file, mode, *a, **kw)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    problems = verify_store(root)
    monkeypatch.undo()
    assert errors(problems)


def test_missing_middle_segment(root):
    os.remove(root / "commitlog" / CL[1])
    problems = verify_store(root)
    find(problems, f"commitlog/{CL[2]}", 0, f"segment starts at {2 * FILE_SIZE}, expected {FILE_SIZE}")
    u = next(u for u in cq_units("OrderTopic", 0) if FILE_SIZE <= u["commitLogOffset"] < 2 * FILE_SIZE)
    find(problems, f"consumequeue/OrderTopic/0/{u['file']}", u["filePosition"], "where no valid record starts")


def test_verify_unreadable_store(tmp_path, capsys):
    code, _, err = run(capsys, "verify", tmp_path / "nope")
    assert code == 2 and "cannot read" in err
    (tmp_path / "file").write_text("x")
    assert run(capsys, "verify", tmp_path / "file")[0] == 2


# --- salvage ---------------------------------------------------------------------------------------


def _stored_fields(m):
    return (m.topic, m.queue_id, m.body, m.properties_blob, m.born_timestamp, m.store_timestamp, m.born_host,
            m.store_host, m.flag, m.sys_flag, m.reconsume_times)


def _dump_fields(r):
    return (r["topic"], r["queueId"], base64.b64decode(r["body"]), r["propertiesString"].encode("utf-8"),
            r["bornTimestamp"], r["storeTimestamp"], r["bornHost"], r["storeHost"], r["flag"], r["sysFlag"],
            r["reconsumeTimes"])


def _messages(path):
    with MessageStore.open(path, read_only=True) as s:
        return list(s.iter_messages())


def test_salvage_of_a_healthy_store_is_byte_identical(tmp_path):
    src = golden_store(GOLD)
    before = hash_tree(src)
    report = salvage_store(src, tmp_path / "out")
    assert hash_tree(src) == before
    assert report["messages_copied"] == report["records_found"] == len(records())
    assert (report["bad_regions"], report["bytes_skipped"], report["not_copied"]) == ([], 0, [])
    assert report["queue_offsets_renumbered"] == 0 and report["properties_rewritten"] == 0
    assert [_stored_fields(m) for m in _messages(tmp_path / "out")] == [_dump_fields(r) for r in records()]
    for sub in ("commitlog", "consumequeue"):
        a = {k: v[:2] for k, v in hash_tree(src / sub).items()}
        b = {k: v[:2] for k, v in hash_tree(tmp_path / "out" / sub).items()}
        assert a == b, sub
    assert verify_store(tmp_path / "out") == []


def test_salvage_takes_bodies_longer_than_the_config_allows(tmp_path):
    """A source whose bodies pass the given config's max_message_size is
    copied whole: the output store's limit is raised to the longest body."""
    src = tmp_path / "src"
    with MessageStore.open(src, StoreConfig(mapped_file_size_commit_log=1 << 16)) as s:
        for i in range(5):
            s.put_message(Message("T", bytes([i]) * (600 + 700 * i)))
    report = salvage_store(src, tmp_path / "out", StoreConfig(max_message_size=1024))
    assert report["messages_copied"] == 5 and report["not_copied"] == []
    assert [len(m.body) for m in _messages(tmp_path / "out")] == [600 + 700 * i for i in range(5)]


def test_salvage_of_a_damaged_store(root, tmp_path):
    a = seg_records(0)[70]
    b = seg_records(2)[15]
    z = seg_records(1)[29]  # a 30000-byte body: 100 zeroed bytes inside it
    xor_byte(root / "commitlog" / CL[0], a["filePosition"] + 88 + 3000, 0x20)
    xor_byte(root / "commitlog" / CL[2], b["filePosition"] + 88 + 1500, 0x01)
    patch(root / "commitlog" / CL[1], z["filePosition"] + 88 + 10000, bytes(100))
    before = hash_tree(root)
    report = salvage_store(root, tmp_path / "out")
    assert hash_tree(root) == before
    lost = {a["physicalOffset"], b["physicalOffset"], z["physicalOffset"]}
    want = [r for r in records() if r["physicalOffset"] not in lost]
    assert report["records_found"] == report["messages_copied"] == len(want) == len(records()) - 3
    assert [tuple(x) for x in report["bad_regions"]] == [
        (f"commitlog/{CL[0]}", a["filePosition"], a["totalSize"]),
        (f"commitlog/{CL[1]}", z["filePosition"], z["totalSize"]),
        (f"commitlog/{CL[2]}", b["filePosition"], b["totalSize"]),
    ]
    assert report["bytes_skipped"] == a["totalSize"] + b["totalSize"] + z["totalSize"]
    got = _messages(tmp_path / "out")
    assert [_stored_fields(m) for m in got] == [_dump_fields(r) for r in want]
    # queue offsets renumbered densely, prepared offsets remapped
    new_phys = {r["physicalOffset"]: m.physical_offset for r, m in zip(want, got)}
    seen: dict = {}
    for r, m in zip(want, got):
        if r["sysFlag"] & 0xC in (0, 8):
            key = (m.topic, m.queue_id)
            assert m.queue_offset == seen.get(key, 0)
            seen[key] = m.queue_offset + 1
        if r["sysFlag"] & 0xC == 8:
            assert m.prepared_transaction_offset == new_phys[r["preparedTransactionOffset"]]
    assert report["queue_offsets_renumbered"] > 0
    assert verify_store(tmp_path / "out") == []


def test_salvage_refuses_a_non_empty_output(root, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError):
        salvage_store(root, tmp_path / "full")
    with pytest.raises(ValueError):
        salvage_store(root, root / "inside")
    assert not (root / "inside").exists()
    assert run(capsys, "salvage", root, tmp_path / "full")[0] == 2


def test_cli_salvage(root, tmp_path, capsys):
    code, out, err = run(capsys, "salvage", golden_store("tiny"), tmp_path / "tiny-out")
    report = json.loads(out)  # (stdout: the report alone; the sentence on stderr)
    assert code == 0 and report["messages_copied"] == len(dump_messages("tiny"))
    assert err.startswith(f"salvaged {report['messages_copied']} of ")
    victim = seg_records(0)[3]
    xor_byte(root / "commitlog" / CL[0], victim["filePosition"] + 88, 0x01)
    code, out, _ = run(capsys, "salvage", root, tmp_path / "out")
    assert code == 1
    assert json.loads(out.splitlines()[0])["bad_regions"] == [
        [f"commitlog/{CL[0]}", victim["filePosition"], victim["totalSize"]]]


# --- recover ---------------------------------------------------------------------------------------


def test_recover_truncates_and_is_idempotent(root, capsys):
    victim = seg_records(2)[12]
    pos = victim["filePosition"] + 30  # the tail from inside the victim on is zeroed
    patch(root / "commitlog" / CL[2], pos, bytes(FILE_SIZE - pos))
    (root / "abort").write_text("1")
    code, out, err = run(capsys, "recover", root)
    assert code == 0
    report = json.loads(out)  # (stdout: the report alone; the sentence on stderr)
    assert report["last_exit_ok"] is False
    assert report["process_offset"] == victim["physicalOffset"]
    assert report["truncated_bytes"] > 0 and report["stopped_because"]
    assert 0 < report["data_bytes_dropped"] <= pos - victim["filePosition"]
    later = [r for r in records() if r["physicalOffset"] >= victim["physicalOffset"] and r["sysFlag"] & 0xC in (0, 8)]
    assert report["consume_queue_units_dropped"] == len(later)
    assert "abnormal recovery" in err
    assert not (root / "abort").exists()
    # the recovered store is consistent
    assert verify_store(root) == []
    again = recover_store(root)
    assert again["last_exit_ok"] is True
    assert again["truncated_bytes"] == 0 and again["stopped_because"] is None
    assert again["process_offset"] == victim["physicalOffset"]
    assert again["consume_queue_units_dropped"] == 0


def test_recover_dry_run_says_what_recover_does_and_changes_nothing(root, capsys):
    victim = seg_records(2)[12]
    pos = victim["filePosition"] + 30
    patch(root / "commitlog" / CL[2], pos, bytes(FILE_SIZE - pos))
    (root / "abort").write_text("1")
    before = {p: hash_tree(root / p) for p in ("commitlog", "consumequeue", "index")}
    names = sorted(p.name for p in root.iterdir())
    code, out, err = run(capsys, "recover", root, "--dry-run")
    assert code == 0
    plan = json.loads(out)
    assert plan["dry_run"] is True and plan["writer_running"] is False and "would_refuse" not in plan
    assert "would truncate" in err and "nothing was changed" in err
    assert {p: hash_tree(root / p) for p in before} == before
    assert sorted(p.name for p in root.iterdir()) == names  # (abort still there: nothing written)
    real = recover_store(root)
    for key in ("last_exit_ok", "process_offset", "truncated_bytes", "stopped_because", "data_end_before",
                "data_bytes_dropped", "consume_queue_units_dropped"):
        assert plan[key] == real[key], key


def test_destructive_commands_ask_on_a_terminal(root, capsys, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    victim = seg_records(2)[12]
    patch(root / "commitlog" / CL[2], victim["filePosition"] + 30, bytes(FILE_SIZE - victim["filePosition"] - 30))
    before = hash_tree(root / "commitlog")
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = run(capsys, "recover", root)
    assert code == 1 and out == ""
    assert "would truncate" in err and "recover now? [y/N]" in err and "nothing was changed" in err
    assert hash_tree(root / "commitlog") == before
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, err = run(capsys, "recover", root)
    assert code == 0 and json.loads(out.splitlines()[0])["process_offset"] == victim["physicalOffset"]
    assert hash_tree(root / "commitlog") != before
    # clean: the same question; --yes skips it
    monkeypatch.setattr(sys, "stdin", Terminal("no\n"))
    code, out, err = run(capsys, "clean", root, "--force")
    assert code == 1 and "would delete" in err and "delete these files now? [y/N]" in err
    assert len(os.listdir(root / "commitlog")) == len(CL)
    code, out, err = run(capsys, "clean", root, "--force", "--yes")
    assert code == 0 and len(os.listdir(root / "commitlog")) == 1 and "[y/N]" not in err


def test_clean_dry_run_names_what_clean_deletes(root, capsys):
    listing = {d: sorted(str(p.relative_to(root)) for p in (root / d).rglob("*") if p.is_file())
               for d in ("commitlog", "consumequeue", "index")}
    code, out, _ = run(capsys, "clean", root, "--force", "--dry-run", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["dry_run"] is True and plan["deleted"] == len(CL) - 1
    assert {d: sorted(str(p.relative_to(root)) for p in (root / d).rglob("*") if p.is_file())
            for d in listing} == listing  # nothing deleted
    code, out, _ = run(capsys, "clean", root, "--force", "--json")
    done = json.loads(out)
    for key in ("commit_log_files", "consume_queue_files", "index_files", "min_physical_offset", "deleted"):
        assert plan[key] == done[key], key
    assert done["consume_queue_files"] or done["index_files"]  # (the plan foresaw the queues' and index's too)


def test_read_commands_say_they_read_around_damage(root, capsys):
    """Damage is never silent: a read command that reads around damage
    says where on stderr, points to verify and salvage, and exits 3."""
    victim = seg_records(0)[40]
    patch(root / "commitlog" / CL[0], victim["filePosition"], bytes(8))  # a zeroed header inside the first file
    code, out, err = run(capsys, "dump", root)  # stops at the damage, and says so
    assert code == 3
    assert [json.loads(line)["physical_offset"] for line in out.splitlines()] == [
        r["physicalOffset"] for r in records()[:40]]
    assert f"dump stopped at the damage at CommitLog physical offset {victim['physicalOffset']}" in err
    code, out, err = run(capsys, "dump", root, "--skip-damaged")
    assert code == 3
    assert len(out.splitlines()) == len(records()) - 1  # every other message is dumped
    assert f"damage at CommitLog physical offset {victim['physicalOffset']}" in err
    assert "rmqstore verify" in err and "rmqstore salvage" in err and "dump stopped" not in err
    code, out, err = run(capsys, "info", root, "--json")
    assert code == 3
    states = json.loads(out)["commitlog"]["file_states"]
    assert [f["state"] for f in states] == [f"damaged at {victim['physicalOffset']}"] + ["ok"] * (len(CL) - 1)
    code, out, _ = run(capsys, "query-msgid", root, records()[0]["msgId"])
    assert code == 3 and json.loads(out)["physical_offset"] == 0


def test_a_torn_tail_is_damage_after_a_clean_shutdown_not_after_a_crash(root, capsys):
    last = seg_records(len(CL) - 1)[-1]
    patch(root / "commitlog" / CL[-1], last["filePosition"] + 10, b"\xff" * 8)  # the last record's header
    code, _out, err = run(capsys, "dump", root, "--limit", "1")
    assert code == 3 and "shut down cleanly but its CommitLog's valid data ends at physical offset" in err
    (root / "abort").write_text("")  # a crash: its torn tail is what recovery cuts, not damage
    code, _out, err = run(capsys, "dump", root, "--limit", "1")
    assert code == 0 and "rmqstore:" not in err


def test_recover_refuses_a_locked_store(root, capsys):
    # (the writer holding the lock delivers nothing meanwhile: the files stay as they were)
    cfg = StoreConfig.from_dict(load_input(GOLD)["storeConfig"]).replace(schedule_service_enable=False)
    before = hash_tree(root / "commitlog")
    with MessageStore.open(root, config=cfg):
        code, out, err = run(capsys, "recover", root)
        assert code == 2 and out == ""
        assert "locked" in err and "refusing" in err
        code, out, err = run(capsys, "recover", root, "--dry-run")  # (reads only: says a real run would refuse)
        assert code == 0 and json.loads(out.splitlines()[0])["writer_running"] is True
        assert "a writer holds the store" in err
    assert hash_tree(root / "commitlog") == before


def test_recover_missing_store(tmp_path, capsys):
    assert run(capsys, "recover", tmp_path / "nope")[0] == 2
    assert not (tmp_path / "nope").exists()
    (tmp_path / "empty").mkdir()
    assert run(capsys, "recover", tmp_path / "empty")[0] == 2
    assert os.listdir(tmp_path / "empty") == []  # no store is created in a random directory


def test_golden_copy_recovers_without_changes(tmp_path):
    root = tmp_path / "store"
    shutil.copytree(golden_store("tiny"), root)
    from conftest import make_writable

    make_writable(root)
    cl = hash_tree(root / "commitlog")
    report = recover_store(root)
    assert report["last_exit_ok"] is True and report["truncated_bytes"] == 0
    assert report["config"]["mapped_file_size_commit_log"] == 4096
    assert {k: v[:2] for k, v in hash_tree(root / "commitlog").items()} == {k: v[:2] for k, v in cl.items()}
    assert verify_store(root) == []


LIVE_WRITER = """
import sys, time
from rmqstore import Message, MessageStore, StoreConfig
s = MessageStore.open(sys.argv[1], StoreConfig(mapped_file_size_commit_log=1 << 20, max_hash_slot_num=500,
                                               max_index_num=2000, mapped_file_size_consume_queue=20 * 500))
print("open", flush=True)
i = 0
while True:
    s.put_messages([Message("T", b"x" * 200, queue_id=j % 4, keys="k%d" % (i + j)) for j in range(50)])
    i += 50
    time.sleep(0.005)
"""


def test_verify_beside_a_live_writer_reports_no_false_errors(tmp_path, capsys):
    """A writer is not damage: while a writer process puts (rolling CommitLog,
    queue and index files), verify checks what it had written, says a writer
    holds the store, and finds no error; after a kill -9 (files made ahead
    and unused included) neither."""
    import subprocess
    import time

    root = tmp_path / "live"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), os.environ.get("PYTHONPATH")])))
    p = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(root)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "open"
        time.sleep(0.5)
        for _ in range(2):
            problems = verify_store(root)
            assert [x for x in problems if x.severity == "error"] == []
            assert any("a writer holds the store" in x.problem for x in problems)
        # the read commands: no damage (exit 0), and they say a writer holds the store
        code, out, err = run(capsys, "info", root, "--json")
        assert code == 0 and json.loads(out)["writer_running"] is True and "a writer holds the store" in err
        code, out, err = run(capsys, "dump", root, "--body", "none")
        rows = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and len(rows) > 100 and "damage" not in err and "a writer holds the store" in err
        assert run(capsys, "query-msgid", root, rows[-1]["msg_id"])[0] == 0
    finally:
        p.kill()
        p.wait()
    problems = verify_store(root)  # (a killed writer's index header may lag its entries: warnings)
    assert [x for x in problems if x.severity == "error"] == []
    assert "abort" in [x.file for x in problems]


def test_long_commands_show_progress_on_a_terminal_only(root, tmp_path, capsys, monkeypatch):
    seen = []
    assert verify_store(root, progress=lambda done, total: seen.append((done, total))) == []
    total = sum(os.path.getsize(root / "commitlog" / n) for n in CL)
    assert seen[-1] == (total, total) and len(seen) == len(CL)
    stages = []
    salvage_store(root, tmp_path / "copy", progress=lambda *a: stages.append(a))
    assert stages[len(CL) - 1] == ("scan", total, total) and stages[-1] == ("copy", len(records()), len(records()))

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["verify", str(root)]) == 0
    assert "verify" in term.getvalue() and "100%" in term.getvalue()  # (tqdm's bar)
    term.truncate(0)
    assert main(["verify", str(root), "--quiet"]) == 0
    assert term.getvalue().strip("\x00") == ""
