"""rmqstore.storage.walker: the read-only walker of store files (listing, mapping,
record validation, the resynchronising search after damage), against the
golden stores RocketMQ wrote (tests/data/golden)."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import dump_messages, golden_store, load_dump
from rmqstore.exceptions import CorruptedFileError
from rmqstore.storage.walker import (
    PHY_MISMATCH,
    Segment,
    find_valid_record,
    iter_records,
    list_segments,
    map_readonly,
    validate_record,
)

PAGE = 4096


def _segments(golden_set):
    files, strays = list_segments(golden_store(golden_set) / "commitlog")
    assert strays == []
    return files


def test_list_segments_by_offset_with_strays(tmp_path):
    d = tmp_path / "commitlog"
    d.mkdir()
    for name in ("00000000000000131072", "00000000000000000000", "00000000000000065536"):
        (d / name).write_bytes(b"x")
    (d / "00000000000000000000.bak").write_bytes(b"x")
    (d / "²").write_bytes(b"x")  # a digit, but not an ASCII one
    (d / "99999999999999999999").mkdir()  # a directory with a segment's name: skipped silently
    os.mkfifo(d / "12345")  # not a regular file
    files, strays = list_segments(d)
    assert [(start, name) for start, name, _ in files] == [
        (0, "00000000000000000000"), (65536, "00000000000000065536"), (131072, "00000000000000131072"),
    ]
    assert all(path == os.path.join(d, name) for _, name, path in files)
    assert strays == sorted(["00000000000000000000.bak", "²", "12345"])
    assert list_segments(tmp_path / "missing") == ([], [])
    (tmp_path / "afile").write_bytes(b"")
    assert list_segments(tmp_path / "afile") == ([], [])


def test_iter_records_reproduces_the_golden_records(golden_set):
    dump = load_dump(golden_set)["commitlog"]
    fs = dump["fileSize"]
    by_file = {f["name"]: f for f in dump["files"]}
    expected = [(r["physicalOffset"], r["totalSize"]) for r in dump_messages(golden_set)]
    got = []
    for start, name, path in _segments(golden_set):
        with Segment(path, name, start) as seg:
            assert seg.size == fs
            end = 0
            for pos, size, fields in iter_records(seg.buf, 0, seg.size, seg.start, fs):
                assert pos == end and fields[15]  # back to back, each with its topic
                got.append((seg.start + pos, size))
                end = pos + size
            st, fields = validate_record(seg.buf, end, seg.size, seg.start + end, fs)
            blank = by_file[name].get("blankRecordPosition")
            if blank is not None:  # a full segment ends with its END_OF_FILE record
                assert (end, st, fields) == (blank, 0, None)
    assert got == expected


def test_a_wrong_physical_offset_field_is_reported(golden_set):
    start, name, path = _segments(golden_set)[0]
    with Segment(path, name, start) as seg:
        st, _ = validate_record(seg.buf, 0, seg.size, seg.start + 8, seg.size)
        assert st == PHY_MISMATCH


@pytest.mark.parametrize("prop_crc_tail", [False, True])
def test_resync_across_a_flipped_byte(tmp_path, golden_set, prop_crc_tail):
    start, name, path = _segments(golden_set)[0]
    records = [r for r in dump_messages(golden_set) if r["file"] == name]
    assert len(records) >= 3
    victim, after = records[1], records[2]
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[victim["filePosition"] + victim["totalSize"] - 1] ^= 0xFF  # in the body or the properties
    copy = tmp_path / name
    copy.write_bytes(bytes(data))
    fs = len(data)
    with Segment(copy, name, start) as seg:
        pos = victim["filePosition"]
        assert validate_record(seg.buf, pos, fs, seg.start + pos, fs)[0] < 0
        walked = [p for p, _, _ in iter_records(seg.buf, 0, fs, seg.start, fs)]
        assert walked == [records[0]["filePosition"]]  # the walk stops at the damage
        for ranges in (None, seg.data_ranges(pos + 1)):
            found = find_valid_record(seg.buf, pos + 1, fs, seg.start, fs, prop_crc_tail=prop_crc_tail,
                                      blank_end=fs, ranges=ranges)
            assert found == (after["filePosition"], after["totalSize"])
        # from the last record on, only the END_OF_FILE record is left (when the segment is full)
        last = records[-1]
        blank = load_dump(golden_set)["commitlog"]["files"][0].get("blankRecordPosition")
        found = find_valid_record(seg.buf, last["filePosition"] + 1, fs, seg.start, fs, blank_end=fs)
        assert found == (None if blank is None else (blank, 0))
        assert find_valid_record(seg.buf, last["filePosition"] + 1, fs, seg.start, fs) is None


@pytest.mark.parametrize("golden_set", ["basic"])  # (tiny's records fit in two pages)
def test_resync_across_a_hole(tmp_path, golden_set):
    """Bytes [a, b) of a segment never written (a hole): the search finds the
    first record after it, whether it asks the file system for the data
    ranges or reads the zeros."""
    start, name, path = _segments(golden_set)[0]
    records = [r for r in dump_messages(golden_set) if r["file"] == name]
    with open(path, "rb") as f:
        data = f.read()
    fs = len(data)
    a = records[1]["filePosition"]
    b = -(-(a + 1) // PAGE) * PAGE + PAGE  # a page boundary past a whole page of hole
    following = [r for r in records if r["filePosition"] >= b]
    copy = tmp_path / name
    with open(copy, "wb") as fh:
        fh.write(data[:a])
        fh.seek(b)
        fh.write(data[b:])
    with Segment(copy, name, start) as seg:
        assert seg.size == fs
        assert validate_record(seg.buf, a, fs, seg.start + a, fs)[0] < 0  # zeros
        ranges = seg.data_ranges(a)
        assert ranges and ranges[0][0] >= a and ranges[-1][1] <= fs
        if ranges[0][0] > a:  # the file system reports the hole: the search starts past it
            assert ranges[0][0] >= b - PAGE
        want = (following[0]["filePosition"], following[0]["totalSize"])
        for r in (None, ranges):
            assert find_valid_record(seg.buf, a, fs, seg.start, fs, ranges=r) == want
            assert find_valid_record(seg.buf, a, fs, seg.start, fs, ranges=r, prop_crc_tail=True) == want


def test_a_symlinked_segment_is_refused(tmp_path, golden_set):
    start, name, path = _segments(golden_set)[0]
    d = tmp_path / "commitlog"
    d.mkdir()
    target = tmp_path / "elsewhere"
    shutil.copyfile(path, target)
    link = d / name
    os.symlink(target, link)
    assert [n for _, n, _ in list_segments(d)[0]] == [name]  # listed: a link to a regular file
    with pytest.raises(CorruptedFileError, match="symbolic link"):
        Segment(link, name, start)
    with pytest.raises(CorruptedFileError, match="symbolic link"):
        map_readonly(link)
    with Segment(link, name, start, follow_links=True) as seg:  # (what the read-only tools do)
        assert seg.size == os.path.getsize(path)
    buf = map_readonly(link, follow_links=True)
    try:
        assert len(buf) == seg.size
    finally:
        buf.close()


def test_an_empty_file_maps_as_empty_bytes(tmp_path):
    p = tmp_path / "00000000000000000000"
    p.write_bytes(b"")
    assert map_readonly(p) == b""
    seg = Segment(p)
    assert (seg.size, seg.buf, seg.rel, seg.start) == (0, b"", str(p), 0)
    seg.close()
    seg.close()
