"""join_stores: part stores laid end to end are the store a sequential
writer makes of the same messages, byte for byte (the Spark writer's
parallel commit)."""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.exceptions import ConfigError, CorruptedFileError
from rmqstore.format.layout import SCHEDULE_TOPIC
from rmqstore.tools import verify_store
from rmqstore.tools.join import join_stores, part_config

# small files: many CommitLog rolls (and blanks), ConsumeQueue files and index files
CFG = StoreConfig(
    mapped_file_size_commit_log=4096,
    mapped_file_size_consume_queue=20 * 7,
    max_hash_slot_num=5,
    max_index_num=9,
    make_files_ahead=False,
    clean_service_enable=False,
    schedule_service_enable=False,
)


def _messages(seed: int, n: int) -> list:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        kind = rnd.random()
        level = rnd.randint(1, 3)
        # a delayed record as a broker stores it: its unit's tags code is its delivery time
        delayed = kind < 0.1
        props = {"DELAY": str(level), "REAL_TOPIC": "T1", "REAL_QID": "0"} if delayed else None
        out.append(Message(
            SCHEDULE_TOPIC if delayed else rnd.choice(["T1", "T2", "a-much-longer-topic-name"]),
            os.urandom(rnd.choice([0, 10, 200, 900])),
            queue_id=level - 1 if delayed else rnd.randrange(3),
            tags=rnd.choice([None, "tagA", "tagB"]),
            keys=rnd.choice([None, f"k{i % 7}", f"k{i} k{i % 5}"]),
            unique_key=rnd.choice([None, f"U{i:08d}"]),
            properties=props,
            born_timestamp=1_700_000_000_000 + i,
            born_host=rnd.choice(["10.0.0.1:1234", "[2001:db8::1]:99"]),
            sys_flag=4 if 0.1 <= kind < 0.15 else 0,  # a prepared transaction: no unit, no index entry
        ))
    return out


def _write(path: str, msgs: list, stamps: list, cfg=CFG) -> None:
    now = [0]
    st = MessageStore.open(path, config=cfg, clock=lambda: now[0])
    try:
        for m, ts in zip(msgs, stamps):
            now[0] = ts
            st.put_message(m)
    finally:
        st.close()


def _files(root: str, sub: str) -> list:
    """The contents of a store's files under *sub*, in name order (index file names are times: not compared)."""
    out = []
    for d, dirs, files in sorted(os.walk(os.path.join(root, sub))):
        dirs.sort()
        for name in sorted(files):
            if name.isdigit():
                with open(os.path.join(d, name), "rb") as f:
                    out.append((os.path.relpath(d, root) if sub != "index" else "index", f.read()))
    return out


def _stamps(seed: int, n: int) -> list:
    rnd = random.Random(seed)
    t, out = 1_750_000_000_000, []
    for _ in range(n):
        t += rnd.choice([0, 0, 1, 999, 1500, -2000])  # equal, close, far and stepping back
        out.append(t)
    return out


@pytest.mark.parametrize("seed", range(60))
def test_an_index_file_built_whole_is_the_one_puts_make(seed):
    """build_index_file == index_put of each entry in order: hash
    collisions, equal and stepping-back times, zero times, a previous
    file's end values, empty and full files."""
    from rmqstore import _kernels as k
    from rmqstore.storage.index import _new_header, build_index_file, index_file_size

    rnd = random.Random(seed)
    slots, num = rnd.choice([(4, 8), (32, 40), (500, 2000)])
    n = rnd.choice([0, num - 1, rnd.randrange(num)])
    keys = [f"T#k{rnd.randrange(3 * slots)}" for _ in range(n)]
    t = rnd.choice([0, 1_700_000_000_000])
    phy = rnd.randrange(1 << 40)
    phys, times = [], []
    for _ in range(n):
        phy += rnd.randrange(100, 5000)
        t += rnd.choice([0, 0, 1, 999, 1000, 1500, -2000])
        phys.append(phy)
        times.append(t)
    end_phy, end_ts = rnd.choice([(0, 0), (123, 1_699_999_999_000), (123, 1_800_000_000_000)])
    want = bytearray(index_file_size(slots, num))
    want[:40] = _new_header(end_phy, end_ts)
    for key, p, ts in zip(keys, phys, times):
        assert k.index_put(want, slots, num, key, p, ts)
    got = build_index_file([k.index_key_hash(x) for x in keys], phys, times, slots, num, end_phy, end_ts)
    assert got == want
    with pytest.raises(ValueError, match="do not fit"):
        build_index_file([1] * num, [1] * num, [1] * num, slots, num)


@pytest.mark.parametrize("seed", range(6))
def test_joined_parts_are_the_sequential_store_byte_for_byte(tmp_path, seed):
    rnd = random.Random(seed)
    n = rnd.choice([1, 40, 300])
    msgs, stamps = _messages(seed, n), _stamps(seed, n)
    _write(str(tmp_path / "seq"), msgs, stamps)
    cuts = sorted(rnd.sample(range(n + 1), min(n + 1, rnd.randint(1, 5))))
    bounds = [0, *cuts, n]
    parts = []
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        p = str(tmp_path / f"part{i}")
        _write(p, msgs[lo:hi], stamps[lo:hi], part_config(CFG))  # empty parts too
        parts.append(p)
    got = join_stores(parts, str(tmp_path / "joined"), CFG)
    assert got["records"] == n
    for sub in ("commitlog", "consumequeue", "index"):
        assert _files(str(tmp_path / "joined"), sub) == _files(str(tmp_path / "seq"), sub), sub
    assert verify_store(str(tmp_path / "joined")) == []


def test_store_times_made_non_decreasing_as_a_sequential_clock_gives(tmp_path):
    """keep_store_times=False: the parts' times, each raised to the largest
    before it, as if one writer had stamped them in order; delayed units'
    delivery times move with their records."""
    msgs = _messages(7, 160)
    # two parts written side by side: the second's clock starts before the first's ends
    first = [1_750_000_000_000 + 40 * i for i in range(80)]
    second = [1_750_000_000_500 + 40 * i for i in range(80)]
    _write(str(tmp_path / "a"), msgs[:80], first, part_config(CFG))
    _write(str(tmp_path / "b"), msgs[80:], second, part_config(CFG))
    join_stores([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "j"), CFG, keep_store_times=False)
    _write(str(tmp_path / "seq"), msgs, np.maximum.accumulate(first + second).tolist())
    assert any(m.topic == SCHEDULE_TOPIC for m in msgs[80:])
    for sub in ("commitlog", "consumequeue", "index"):
        assert _files(str(tmp_path / "j"), sub) == _files(str(tmp_path / "seq"), sub), sub
    assert verify_store(str(tmp_path / "j")) == []


def _one_part(tmp_path, n=30) -> str:
    p = str(tmp_path / "part")
    _write(p, _messages(3, n), _stamps(3, n), part_config(CFG))
    return p


def test_an_existing_target_is_refused_and_left_alone(tmp_path):
    part = _one_part(tmp_path)
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "mine").write_bytes(b"x")
    with pytest.raises(FileExistsError):
        join_stores([part], str(tmp_path / "t"), CFG)
    assert os.listdir(tmp_path / "t") == ["mine"]


def test_a_damaged_part_fails_the_join_and_leaves_no_target(tmp_path):
    part = _one_part(tmp_path)
    seg = os.path.join(part, "commitlog", "0" * 20)
    with open(seg, "r+b") as f:
        f.seek(200)
        f.write(b"\xff" * 8)  # inside the first or second record: its size or magic no longer holds
    with pytest.raises(CorruptedFileError):
        join_stores([part], str(tmp_path / "t"), CFG)
    assert not os.path.exists(tmp_path / "t")


def test_a_unit_pointing_at_no_record_fails_the_join(tmp_path):
    part = _one_part(tmp_path)
    d = os.path.join(part, "consumequeue", "T1", "0")
    q = os.path.join(d, sorted(os.listdir(d))[0])
    with open(q, "r+b") as f:
        f.write((5).to_bytes(8, "big"))  # unit 0 now points into the first record
    with pytest.raises(CorruptedFileError, match="points at no record"):
        join_stores([part], str(tmp_path / "t"), CFG)
    assert not os.path.exists(tmp_path / "t")


def test_property_crc_stores_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="__CRC32#"):
        join_stores([], str(tmp_path / "t"), CFG.replace(enabled_append_prop_crc=True))
    assert not os.path.exists(tmp_path / "t")


def test_records_larger_than_the_target_segment_are_refused(tmp_path):
    part = str(tmp_path / "part")
    big = CFG.replace(mapped_file_size_commit_log=65536)
    _write(part, [Message("T1", b"x" * 5000)], [1_750_000_000_000], part_config(big))
    with pytest.raises(ConfigError, match="does not fit"):
        join_stores([part], str(tmp_path / "t"), CFG)
    assert not os.path.exists(tmp_path / "t")


def test_no_parts_make_an_empty_store(tmp_path):
    got = join_stores([], str(tmp_path / "t"), CFG)
    assert got["records"] == 0
    with MessageStore.open(str(tmp_path / "t"), config=CFG) as st:
        assert st.max_physical_offset == 0


def test_a_full_disk_fails_the_join_with_nothing_left(tmp_path, monkeypatch):
    import errno

    from rmqstore.exceptions import DiskFullError

    part = _one_part(tmp_path)

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(DiskFullError):
        join_stores([part], str(tmp_path / "t"), CFG)
    assert not os.path.exists(tmp_path / "t")
