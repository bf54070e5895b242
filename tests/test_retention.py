"""Retention and disk space (docs/recovery.md#retention): expired CommitLog files by age at the
``delete_when`` hours or under disk pressure, ConsumeQueue and index files
following the CommitLog minimum, reader references while clean-up runs, and
write refusal with DiskFullError (fake disk probe, simulated and real ENOSPC).

Every time comes from a fake clock and every disk ratio from a fake probe, so
nothing here waits for hours or needs a full disk (except the tmpfs test,
which fills a real one where the machine allows mounting it)."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
import time

import pytest

from conftest import no_hang
from rmqstore import GetMessageStatus, Message, MessageStore, PutMessageStatus, StoreConfig
from rmqstore.exceptions import DiskFullError, RmqStoreError, StoreReadOnlyError
from rmqstore.service import retention as retention_mod
from rmqstore.tools import verify_store

T0 = 1_700_000_000_000
HOUR = 3_600_000
CL_SIZE = 8192
TOPIC = "RetTopic"
QUEUES = 4


class FakeClock:
    """Store clock under test control (ms since epoch)."""

    def __init__(self, now=T0):
        self.now = now

    def __call__(self) -> int:
        return self.now


class FakeDisk:
    """Disk-usage probe under test control; counts its calls."""

    def __init__(self, ratio=0.10):
        self.ratio = ratio
        self.calls = 0

    def __call__(self, path) -> float:
        self.calls += 1
        return self.ratio


def config(**kw) -> StoreConfig:
    base = dict(
        mapped_file_size_commit_log=CL_SIZE,
        mapped_file_size_consume_queue=200,  # 10 units per file
        max_hash_slot_num=64,
        max_index_num=40,
        clean_service_enable=False,
        delete_commit_log_files_interval=0,
        delete_consume_queue_files_interval=0,
        disk_check_interval=0,
        # file lists and disk use here are exact: no file made ahead beside them
        # (test_files_ahead.py runs clean-up with the service on)
        make_files_ahead=False,
    )
    base.update(kw)
    return StoreConfig(**base)


def body_of(i: int) -> bytes:
    return (f"message-{i:05d}-".encode() * 12)[:150]


def open_store(root, clock=None, disk=None, **kw):
    return MessageStore.open(root, config=config(**kw), clock=clock or FakeClock(), disk_usage=disk or FakeDisk())


def fill(store, clock, n, start=0, step_ms=60_000):
    """Put messages start..start+n-1, message i stored at T0 + i * step_ms."""
    out = []
    for i in range(start, start + n):
        clock.now = T0 + i * step_ms
        r = store.put_message(Message(TOPIC, body_of(i), queue_id=i % QUEUES, keys=f"k{i}", tags=f"T{i % 3}"))
        assert r.status is PutMessageStatus.PUT_OK
        out.append(r)
    return out


def files_of(results):
    """CommitLog file start -> store time of its last record (independently
    of the store: from the put results)."""
    last: dict = {}
    for r in results:
        f = r.wrote_offset - r.wrote_offset % CL_SIZE
        last[f] = max(last.get(f, 0), r.store_timestamp)
    return last


def cl_names(root):
    return sorted(os.listdir(os.path.join(root, "commitlog")))


# --- CommitLog by age -------------------------------------------------------------


def test_expired_files_deleted_oldest_first_never_the_current_one(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        results = fill(s, clock, 300)
        before = cl_names(tmp_path)
        assert len(before) >= 8
        clock.now = T0 + 1000 * HOUR  # everything is long expired
        rep = s.delete_expired()
        # batch max 10 per round, never the last file
        want = min(10, len(before) - 1)
        assert rep.deleted == want
        assert [os.path.basename(p) for p in rep.commit_log_files] == before[:want]
        assert cl_names(tmp_path) == before[want:]
        assert s.min_physical_offset == int(before[want])
        while s.delete_expired().deleted:
            pass
        assert cl_names(tmp_path) == before[-1:]  # the current file stays
        assert s.min_physical_offset == int(before[-1])
        # the store keeps writing into it
        r = s.put_message(Message(TOPIC, b"after", queue_id=0))
        assert s.get_message(r.wrote_offset).body == b"after"
        assert results


def test_age_is_the_last_records_store_time_not_the_mtime(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        results = fill(s, clock, 200)
        last_ts = files_of(results)
        starts = sorted(last_ts)
        # mtimes say "ancient" (docs/recovery.md#pitfall-retention-by-mtime: a copied store): they must not matter
        for name in cl_names(tmp_path):
            os.utime(os.path.join(tmp_path, "commitlog", name), (1, 1))
        # now = just when the third file's last record turns 1 h old
        clock.now = last_ts[starts[2]] + HOUR
        rep = s.delete_expired(reserved_hours=1)
        assert [int(os.path.basename(p)) for p in rep.commit_log_files] == starts[:3]
        assert s.min_physical_offset == starts[3]
        # one ms earlier for the fourth: nothing more
        clock.now = last_ts[starts[3]] + HOUR - 1
        assert s.delete_expired(reserved_hours=1).deleted == 0
        clock.now += 1
        assert s.delete_expired(reserved_hours=1).deleted == 1


def test_age_falls_back_to_mtime_without_records(tmp_path):
    from rmqstore.commitlog import CommitLog

    cl = CommitLog(tmp_path / "commitlog", 4096, 1024)
    cl.load()
    mf = cl.queue.last_for_append(0)  # an all-zero segment: no record in it
    mf.wrote_position = mf.file_size
    os.utime(mf.path, (1000, 1234))
    try:
        assert cl.last_record_timestamp(mf) == -1
        assert cl.file_timestamp(mf) == 1_234_000
    finally:
        cl.close()


def test_reserved_time_default_is_72_hours(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        results = fill(s, clock, 100)
        first_last = files_of(results)[0]
        clock.now = first_last + 72 * HOUR - 1
        assert s.delete_expired().deleted == 0
        clock.now = first_last + 72 * HOUR
        assert s.delete_expired().deleted == 1


def _local_ms(hour: int, base_ms: int) -> int:
    """A time after *base_ms* whose local hour of day is *hour*."""
    t = time.localtime(base_ms / 1000 + 4 * 86400)
    return int(time.mktime((t.tm_year, t.tm_mon, t.tm_mday, hour, 30, 0, 0, 0, -1)) * 1000)


def test_periodic_round_deletes_only_in_delete_when_hours(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.10)
    with open_store(tmp_path, clock, disk, delete_when="03;04") as s:
        fill(s, clock, 200)
        n = len(cl_names(tmp_path))
        clock.now = _local_ms(5, T0 + 100 * HOUR)
        rep = s.run_maintenance()
        assert rep.deleted == 0 and rep.reason == ""
        assert len(cl_names(tmp_path)) == n
        clock.now = _local_ms(3, T0 + 100 * HOUR)
        rep = s.run_maintenance()
        assert rep.reason == "time" and rep.deleted == n - 1
        assert not rep.clean_at_once


def test_disk_pressure_deletes_outside_the_hours_by_age_then_regardless(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.80)  # above disk_max_used_space_ratio (75), below clean-forcibly (85)
    with open_store(tmp_path, clock, disk, delete_when="", file_reserved_time=1, delete_file_batch_max=3) as s:
        results = fill(s, clock, 200)
        last_ts = files_of(results)
        starts = sorted(last_ts)
        clock.now = last_ts[starts[1]] + HOUR  # files 0 and 1 expired, 2 not yet
        rep = s.run_maintenance()
        assert rep.reason == "space" and not rep.clean_at_once
        assert [int(os.path.basename(p)) for p in rep.commit_log_files] == starts[:2]
        # below every threshold and outside the hours: nothing runs even when expired
        disk.ratio = 0.50
        clock.now = last_ts[starts[-1]] + 10 * HOUR
        rep = s.run_maintenance()
        assert rep.reason == "" and rep.deleted == 0
        # above the clean-forcibly level (85 %): age does not matter, 3 per round
        disk.ratio = 0.86
        clock.now = T0  # nothing is expired by age
        before = cl_names(tmp_path)
        rep = s.run_maintenance()
        assert rep.clean_at_once and rep.deleted == min(3, len(before) - 1)
        assert cl_names(tmp_path) == before[rep.deleted:]
        assert not s.disk_full  # 86 % is below the warning level (90 %)


def test_forcible_cleaning_can_be_disabled(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock, FakeDisk(0.87), clean_file_forcibly_enable=False) as s:
        fill(s, clock, 100)
        rep = s.run_maintenance()
        assert rep.reason == "space" and not rep.clean_at_once and rep.deleted == 0


def test_force_deletes_every_non_current_file(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock, delete_file_batch_max=100) as s:
        fill(s, clock, 200)
        names = cl_names(tmp_path)
        rep = s.delete_expired(force=True)
        assert rep.deleted == len(names) - 1 and rep.clean_at_once
        assert cl_names(tmp_path) == names[-1:]


def test_pacing_between_deletions_uses_the_interval(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock, delete_commit_log_files_interval=30) as s:
        fill(s, clock, 120)
        n = len(cl_names(tmp_path)) - 1
        assert n >= 3
        t = time.monotonic()
        rep = s.delete_expired(force=True)
        assert rep.deleted == n
        # n files, n - 1 pauses of 30 ms between them (a lower bound, not a speed claim)
        assert time.monotonic() - t >= (n - 1) * 0.030


# --- ConsumeQueue and index follow ---------------------------------------------------


@pytest.mark.parametrize("chunk_units", [None, 3])
def test_consume_queues_and_index_follow_the_commitlog_minimum(tmp_path, monkeypatch, chunk_units):
    if chunk_units:  # the minimum is searched a chunk of units at a time: across chunks too
        from rmqstore.storage import consumequeue

        monkeypatch.setattr(consumequeue, "_CORRECT_CHUNK", chunk_units * 20)
    clock = FakeClock()
    with open_store(tmp_path, clock, delete_file_batch_max=5) as s:
        results = fill(s, clock, 300)
        index_before = sorted(os.listdir(tmp_path / "index"))
        rep = s.delete_expired(force=True)
        cl_min = s.min_physical_offset
        assert rep.deleted == 5 and cl_min == rep.min_physical_offset
        for q in range(QUEUES):
            mine = [r for i, r in enumerate(results) if i % QUEUES == q]
            live = [r.queue_offset for r in mine if r.wrote_offset >= cl_min]
            assert s.get_min_offset_in_queue(TOPIC, q) == live[0]
            assert s.get_max_offset_in_queue(TOPIC, q) == mine[-1].queue_offset + 1
            # every remaining CQ file but the last still points at live data
            d = tmp_path / "consumequeue" / TOPIC / str(q)
            names = sorted(os.listdir(d))
            first_file_start = int(names[0]) // 20
            assert first_file_start <= live[0] < first_file_start + 10
            gone = [p for p in rep.consume_queue_files if os.path.dirname(p) == str(d)]
            assert gone and all(int(os.path.basename(p)) // 20 + 10 <= live[0] for p in gone)
        # index: files whose entries all lie below the minimum are gone, the rest stay
        index_after = sorted(os.listdir(tmp_path / "index"))
        assert rep.index_files
        assert set(index_after) | {os.path.basename(p) for p in rep.index_files} == set(index_before)
        for f in s.index.files[:-1]:
            assert f.end_phy_offset >= cl_min
        # keys: gone below the minimum, found above it
        old = next(i for i, r in enumerate(results) if r.wrote_offset < cl_min)
        new = next(i for i, r in enumerate(results) if r.wrote_offset >= cl_min)
        assert s.query_messages(TOPIC, f"k{old}") == []
        [m] = s.query_messages(TOPIC, f"k{new}")
        assert m.body == body_of(new)


def test_reads_of_deleted_offsets_give_clean_statuses(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        results = fill(s, clock, 200)
        held = s.get_messages(TOPIC, 0, 0, 8).messages  # read before the clean-up
        s.delete_expired(force=True)
        cl_min = s.min_physical_offset
        # messages returned earlier are copies: still whole after their file is gone
        assert results[0].wrote_offset < cl_min
        assert [m.body for m in held] == [body_of(i) for i in range(0, 32, QUEUES)]
        for q in range(QUEUES):
            mn = s.get_min_offset_in_queue(TOPIC, q)
            r = s.get_messages(TOPIC, q, 0, 8)
            assert r.status is GetMessageStatus.OFFSET_TOO_SMALL and r.messages == []
            assert r.next_begin_offset == mn == r.min_offset
            r = s.get_messages(TOPIC, q, mn, 1000)
            assert r.status is GetMessageStatus.FOUND
            assert [m.body for m in r.messages] == [
                body_of(i) for i, x in enumerate(results) if i % QUEUES == q and x.wrote_offset >= cl_min
            ][: len(r.messages)]
            # by time: before the minimum clamps to it
            assert s.get_offset_in_queue_by_time(TOPIC, q, T0) == mn
        gone = results[0]
        assert s.get_message(gone.wrote_offset) is None
        assert s.look_message_by_msg_id(gone.msg_id) is None
        assert next(m.body for m in s.iter_messages(0)) == body_of(
            next(i for i, r in enumerate(results) if r.wrote_offset >= cl_min)
        )


def test_store_reopens_consistently_after_cleanup(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        fill(s, clock, 250)
        s.delete_expired(force=True)
        mins = {q: s.get_min_offset_in_queue(TOPIC, q) for q in range(QUEUES)}
        maxs = {q: s.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)}
        cl_min = s.min_physical_offset
    assert [p for p in verify_store(tmp_path) if p.severity == "error"] == []
    with open_store(tmp_path, clock) as s:
        assert s.min_physical_offset == cl_min
        assert {q: s.get_min_offset_in_queue(TOPIC, q) for q in range(QUEUES)} == mins
        assert {q: s.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)} == maxs
        fill(s, clock, 10, start=250)
    with MessageStore.open(tmp_path, read_only=True) as ro:
        assert {q: ro.get_min_offset_in_queue(TOPIC, q) for q in range(QUEUES)} == mins


def test_delete_expired_is_refused_read_only_and_validates(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        fill(s, clock, 5)
        with pytest.raises(ValueError):
            s.delete_expired(reserved_hours=-1)
    with MessageStore.open(tmp_path, read_only=True) as ro:
        with pytest.raises(StoreReadOnlyError):
            ro.delete_expired()
        assert ro.run_maintenance() is None


def test_background_service_cleans_by_itself(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.87)  # forces clean-at-once
    with open_store(tmp_path, clock, disk, clean_service_enable=True, clean_resource_initial_delay=0,
                    clean_resource_interval=20) as s:
        fill(s, clock, 150)
        with no_hang(20):
            while len(cl_names(tmp_path)) > 1:
                time.sleep(0.01)
        assert s.min_physical_offset == int(cl_names(tmp_path)[0])


def test_config_names_defaults_and_clamps():
    c = StoreConfig()
    assert (c.file_reserved_time, c.delete_when, c.disk_max_used_space_ratio) == (72, "04", 75)
    assert (c.disk_space_warning_level_ratio, c.disk_space_clean_forcibly_ratio) == (90, 85)
    assert (c.delete_physic_files_interval, c.destroy_mapped_file_interval_forcibly) == (100, 120_000)
    assert (c.clean_resource_interval, c.delete_consume_queue_files_interval, c.delete_file_batch_max) == (
        10_000, 100, 10)
    c = StoreConfig.from_dict({"diskSpaceWarningLevelRatio": "99", "diskSpaceCleanForciblyRatio": "10",
                               "diskMaxUsedSpaceRatio": "5", "deleteWhen": "03;04",
                               "deletePhysicFilesInterval": "7", "destroyMapedFileIntervalForcibly": "9"})
    assert c.disk_space_warning_level == 0.90 and c.disk_space_clean_forcibly_level == 0.30
    assert c.disk_max_used_space_level == 0.10 and c.delete_hours == {3, 4}
    assert c.delete_commit_log_files_interval == 7 and c.destroy_maped_file_interval_forcibly == 9
    with pytest.raises(ValueError):
        StoreConfig(delete_when="25")


def test_disk_usage_ratio_formula(monkeypatch):
    class St:
        f_frsize = 4096
        f_blocks = 1000
        f_bfree = 300  # used = 700
        f_bavail = 250  # root reserve of 50 blocks

    monkeypatch.setattr(retention_mod.os, "statvfs", lambda p: St)
    # ceil(100 * 700 / 950) / 100 = ceil(73.68) / 100
    assert retention_mod.disk_usage_ratio("/x") == 0.74
    monkeypatch.setattr(retention_mod.os, "statvfs", lambda p: (_ for _ in ()).throw(OSError(errno.ENOENT, "x")))
    assert retention_mod.disk_usage_ratio("/x") == -1.0


# --- reader references ---------------------------------------------------------------


def test_cleanup_waits_for_readers_then_forces_after_the_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(retention_mod, "_EXCLUSIVE_WAIT", 0.05)
    clock = FakeClock()
    with open_store(tmp_path, clock, destroy_maped_file_interval_forcibly=120_000) as s:
        fill(s, clock, 100)
        names = cl_names(tmp_path)
        first = s.commitlog.queue.files[0]
        s._refs.hold()  # a reader inside (as during a pull)
        try:
            rep = s.delete_expired(force=True)
            assert rep.deleted == 0 and rep.busy
            assert cl_names(tmp_path) == names and not first.closed and first.available
            clock.now += 119_999
            assert s.delete_expired(force=True).deleted == 0
            clock.now += 1  # 120 s after the first attempt: the file goes, the mapping stays for the reader
            rep = s.delete_expired(force=True)
            assert rep.deleted == 1 and rep.busy and cl_names(tmp_path) == names[1:]
            assert not first.closed and not first.available
            assert s.get_message(0).body == body_of(0)  # reads through the mapping still work
            assert s.min_physical_offset == 0
        finally:
            s._refs.release()
        # the next round finds no reader: the mapping is closed and dropped, reported once
        rep = s.delete_expired(force=True)
        assert first.closed and rep.deleted == len(names) - 2
        assert first.path not in rep.commit_log_files
        assert s.min_physical_offset == int(names[-1])


def test_reading_while_cleanup_runs(tmp_path):
    """Readers pull, look up keys and times in threads while the writer puts
    and deletes files as fast as it can: no exception, every message read is
    byte-equal to what was written."""
    clock = FakeClock()
    errors: list = []
    stop = threading.Event()
    with open_store(tmp_path, clock, delete_file_batch_max=100) as s:
        fill(s, clock, 100)

        def reader(q):
            off = 0
            try:
                while not stop.is_set():
                    r = s.get_messages(TOPIC, q, off, 16)
                    for m in r.messages:
                        i = int(m.keys.lstrip("k"))
                        assert m.body == body_of(i) and i % QUEUES == q
                    off = r.next_begin_offset if r.status is not GetMessageStatus.OFFSET_OVERFLOW_ONE else 0
                    for m in s.query_messages(TOPIC, f"k{off * QUEUES + q}"):
                        assert m.body == body_of(off * QUEUES + q)
                    s.get_offset_in_queue_by_time(TOPIC, q, T0 + off * 60_000)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(q,)) for q in range(QUEUES)]
        for t in threads:
            t.start()
        try:
            with no_hang(60):
                for round_ in range(30):
                    fill(s, clock, 40, start=100 + round_ * 40)
                    s.delete_expired(force=True)
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert errors == []


# --- disk full ---------------------------------------------------------------------------


def test_puts_refused_above_the_warning_level_and_resume_by_themselves(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.50)
    with open_store(tmp_path, clock, disk) as s:
        fill(s, clock, 5)
        disk.ratio = 0.91
        assert s.check_disk_space() == 0.91 and s.disk_full
        end, qmax = s.max_physical_offset, s.get_max_offset_in_queue(TOPIC, 0)
        with pytest.raises(DiskFullError) as ei:
            s.put_message(Message(TOPIC, b"x", queue_id=0))
        assert ei.value.status is PutMessageStatus.SERVICE_NOT_AVAILABLE and not ei.value.stored
        assert isinstance(ei.value, RmqStoreError) and isinstance(ei.value, OSError)
        assert ei.value.ratio == 0.91
        with pytest.raises(DiskFullError):
            s.put_messages([Message(TOPIC, b"y", queue_id=0)])
        assert (s.max_physical_offset, s.get_max_offset_in_queue(TOPIC, 0)) == (end, qmax)
        disk.ratio = 0.50  # space is back: the next put re-checks by itself
        r = s.put_message(Message(TOPIC, b"z", queue_id=0))
        assert r.status is PutMessageStatus.PUT_OK and not s.disk_full
        assert s.get_messages(TOPIC, 0, r.queue_offset, 1).messages[0].body == b"z"


def test_full_disk_recheck_is_paced_not_per_put(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.95)
    with open_store(tmp_path, clock, disk, disk_check_interval=3_600_000) as s:
        s.check_disk_space()
        calls = disk.calls
        disk.ratio = 0.10
        for _ in range(50):
            with pytest.raises(DiskFullError):
                s.put_message(Message(TOPIC, b"x"))
        assert disk.calls == calls  # no probe per put while the interval runs
        s.check_disk_space()
        assert s.put_message(Message(TOPIC, b"x")).status is PutMessageStatus.PUT_OK


def test_warning_level_is_clamped_to_90_percent(tmp_path):
    disk = FakeDisk(0.91)
    with open_store(tmp_path, disk=disk, disk_space_warning_level_ratio=99) as s:
        s.check_disk_space()
        with pytest.raises(DiskFullError):
            s.put_message(Message(TOPIC, b"x"))


def test_clean_round_sets_and_clears_disk_full(tmp_path):
    clock = FakeClock()
    disk = FakeDisk(0.93)
    with open_store(tmp_path, clock, disk) as s:
        fill(s, clock, 60)
        rep = s.run_maintenance()
        assert s.disk_full and rep.clean_at_once and rep.deleted >= 1
        disk.ratio = 0.86  # between the levels: still cleaning at once, flag unchanged
        s.run_maintenance()
        assert s.disk_full
        disk.ratio = 0.50
        s.run_maintenance()
        assert not s.disk_full


def _enospc(*a, **k):
    raise DiskFullError(errno.ENOSPC, "simulated: no space left on device", "x")


def test_enospc_on_a_new_commitlog_file_writes_nothing(tmp_path, monkeypatch):
    import rmqstore.storage.mapped_file as mfmod

    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        fill(s, clock, 20)
        real = mfmod.allocate_file
        monkeypatch.setattr(mfmod, "allocate_file", _enospc)
        ok = 20
        with pytest.raises(DiskFullError) as ei:
            for i in range(20, 200):  # until a new CommitLog file is needed
                fill(s, clock, 1, start=i)
                ok += 1
        assert ei.value.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and not ei.value.stored
        assert [m.body for m in s.iter_messages()] == [body_of(i) for i in range(ok)]
        names = cl_names(tmp_path)
        assert all(os.path.getsize(tmp_path / "commitlog" / n) == CL_SIZE for n in names)
        monkeypatch.setattr(mfmod, "allocate_file", real)
        r = s.put_message(Message(TOPIC, b"after", queue_id=ok % QUEUES))
        assert s.get_message(r.wrote_offset).body == b"after"
        assert r.queue_offset == ok // QUEUES  # no queue offset was used up by the failed put
    assert [p for p in verify_store(tmp_path) if p.severity == "error"] == []


def test_enospc_mid_batch_stores_nothing_of_the_batch(tmp_path, monkeypatch):
    import rmqstore.storage.mapped_file as mfmod

    clock = FakeClock()
    with open_store(tmp_path, clock, mapped_file_size_consume_queue=20_000) as s:  # only the CommitLog rolls
        fill(s, clock, 3)
        end, qmax = s.max_physical_offset, s.get_max_offset_in_queue(TOPIC, 0)
        real = mfmod.allocate_file
        monkeypatch.setattr(mfmod, "allocate_file", _enospc)
        batch = [Message(TOPIC, body_of(i), queue_id=0, keys=f"k{i}") for i in range(100, 200)]
        with pytest.raises(DiskFullError) as ei:
            s.put_messages(batch)  # needs a new CommitLog file, made before the first record is written
        assert ei.value.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED and not ei.value.stored
        assert s.max_physical_offset == end and s.get_max_offset_in_queue(TOPIC, 0) == qmax
        assert s.query_messages(TOPIC, "k100") == []
        monkeypatch.setattr(mfmod, "allocate_file", real)
        results = s.put_messages(batch)  # the retry stores each message once
        assert [r.queue_offset for r in results] == list(range(qmax, qmax + len(batch)))
        assert [m.body for m in s.query_messages(TOPIC, "k150")] == [body_of(150)]


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_enospc_on_a_consume_queue_file_writes_nothing(tmp_path, monkeypatch, flush):
    import rmqstore.storage.mapped_file as mfmod

    clock = FakeClock()
    with open_store(tmp_path, clock, flush_disk_type=flush) as s:
        fill(s, clock, 4)  # one unit in each queue
        end = s.max_physical_offset
        real = mfmod.allocate_file
        monkeypatch.setattr(mfmod, "allocate_file", _enospc)
        # a new queue needs a new ConsumeQueue file: made first, so the record is not written
        with pytest.raises(DiskFullError) as ei:
            s.put_message(Message("NewTopic", b"pending", keys="kp"))
        assert not ei.value.stored and not s.disk_full
        assert s.max_physical_offset == end and ("NewTopic", 0) not in s.queues()
        r = s.put_message(Message(TOPIC, b"meanwhile", queue_id=0))  # the other queues go on
        monkeypatch.setattr(mfmod, "allocate_file", real)
        r2 = s.put_message(Message("NewTopic", b"pending", keys="kp"))
        assert r2.queue_offset == 0
        assert s.get_messages("NewTopic", 0, 0, 5).messages[0].body == b"pending"
        assert s.get_messages(TOPIC, 0, r.queue_offset, 5).messages[0].body == b"meanwhile"
        assert [m.body for m in s.query_messages("NewTopic", "kp")] == [b"pending"]
    with MessageStore.open(tmp_path, read_only=True) as ro:
        assert [m.body for m in ro.iter_messages()][-2:] == [b"meanwhile", b"pending"]


def _try_mount_tmpfs(path, size: str) -> str | None:
    """Mount a small tmpfs at *path*; the reason it cannot be done, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    os.makedirs(path, exist_ok=True)
    try:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run mount: {e}"
    if p.returncode != 0:
        return f"mount -t tmpfs is not permitted here: {p.stderr.strip()}"
    return None


@pytest.mark.parametrize("probe", ["real-probe", "no-probe"])
def test_real_full_disk_on_a_small_tmpfs(tmp_path, probe):
    """Fill a 1 MiB tmpfs. With the real statvfs probe the refusal threshold
    (90 %) trips first; with a probe that says "empty" the file system's own
    ENOSPC does. Either way the error is DiskFullError, nothing is torn, reads
    keep working, and after clean-up frees space puts resume by themselves."""
    mnt = tmp_path / "mnt"
    why = _try_mount_tmpfs(mnt, "1m")
    if why:
        pytest.skip(why)
    try:
        cfg = dict(mapped_file_size_commit_log=128 * 1024, mapped_file_size_consume_queue=2000,
                   max_hash_slot_num=100, max_index_num=400, delete_file_batch_max=100)
        disk = None if probe == "real-probe" else (lambda p: 0.0)
        clock = FakeClock()
        store = MessageStore.open(mnt / "store", config=config(**cfg), clock=clock, disk_usage=disk)
        written: dict = {}
        err = None
        with no_hang(60):
            for i in range(100_000):
                clock.now = T0 + i
                if disk is None and i % 10 == 0:
                    store.check_disk_space()  # what the flush thread does every second
                body = body_of(i) * 6
                try:
                    r = store.put_message(Message(TOPIC, body, queue_id=i % QUEUES, keys=f"k{i}"))
                except DiskFullError as e:
                    err = e
                    if e.stored:
                        written[i] = body
                    break
                written[i] = body
        assert err is not None, "the tmpfs never filled up"
        if probe == "no-probe":
            assert err.status is PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        else:  # the 90 % level, unless the file system ran out between two probes
            assert err.status in (PutMessageStatus.SERVICE_NOT_AVAILABLE, PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
        # no short or half-created files
        for d, size in (("commitlog", 128 * 1024),):
            for n in os.listdir(mnt / "store" / d):
                assert os.path.getsize(mnt / "store" / d / n) == size
        # reads keep working while full
        got = {int(m.keys[1:]): m.body for m in store.iter_messages()}
        assert got == written
        # free space: clean-up deletes every non-current file; puts resume by themselves
        rep = store.delete_expired(force=True)
        assert rep.deleted >= 1
        store._disk_next_check = 0.0  # do not wait out disk_check_interval
        r = store.put_message(Message(TOPIC, b"after the clean-up", queue_id=0))
        assert store.get_message(r.wrote_offset).body == b"after the clean-up"
        store.close()
        assert [p for p in verify_store(mnt / "store") if p.severity == "error"] == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_iteration_goes_on_at_the_new_start_when_its_file_is_deleted(tmp_path):
    clock = FakeClock()
    with open_store(tmp_path, clock) as s:
        results = fill(s, clock, 150)
        it = s.iter_messages()
        first = [next(it) for _ in range(5)]
        s.delete_expired(force=True)
        rest = list(it)
        cl_min = s.min_physical_offset
        assert [m.body for m in first] == [body_of(i) for i in range(5)]
        assert [m.body for m in rest] == [body_of(i) for i, r in enumerate(results) if r.wrote_offset >= cl_min]
