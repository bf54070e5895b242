"""Progress of ``recover`` and ``clean``: ``recover_store(progress=)`` over
the recovery walk (dry and real runs, on a crashed store of small
segments), ``MessageStore.delete_expired(progress=)`` over the files it
deletes, and their bars in the CLI: on a terminal only, never with
``--quiet``."""

from __future__ import annotations

import io
import os
import sys

import pytest

from conftest import copy_golden_store, load_input
from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.cli import main
from rmqstore.store import recovery
from rmqstore.tools import recover_store

FS = 64 * 1024  # CommitLog segment
SMALL = StoreConfig(
    mapped_file_size_commit_log=FS,
    mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=64,
    max_index_num=256,
    schedule_service_enable=False,
    clean_service_enable=False,
)
GOLD = "basic"  # three CommitLog segments of 64 KiB


class Terminal(io.StringIO):
    def isatty(self):
        return True


def crashed_store(root, n=400):
    """A store of several CommitLog segments left as a crash leaves it: the
    ``abort`` file kept and the last record torn."""
    with MessageStore.open(root, config=SMALL) as s:
        for i in range(n):
            s.put_message(Message(topic=f"T{i % 2}", body=b"b" * 500, queue_id=i % 3, keys=f"k{i}", tags="t"))
        last = s.max_physical_offset
    (root / "abort").write_text("4242")
    segment = root / "commitlog" / f"{(last - 1) // FS * FS:020d}"
    with open(segment, "r+b") as fh:  # the last record half written
        fh.seek((last - 1) % FS - 200)
        fh.write(bytes(200))
    return root


def data_segments(root):
    """Start offsets of the CommitLog segments holding data."""
    return sorted(int(n) for n in os.listdir(root / "commitlog") if any(open(root / "commitlog" / n, "rb").read(8)))


def check_calls(calls):
    """Monotone done, never past the total, ending at done == total."""
    assert calls, "progress was never called"
    dones = [d for d, _ in calls]
    assert dones == sorted(dones)
    assert all(0 <= d <= t for d, t in calls)
    assert calls[-1][0] == calls[-1][1]


def golden_config():
    return StoreConfig.from_dict(load_input(GOLD)["storeConfig"]).replace(
        schedule_service_enable=False, clean_service_enable=False,
        delete_commit_log_files_interval=0, delete_consume_queue_files_interval=0,
    )


def sizes(root):
    return {str(p): p.stat().st_size for d in ("commitlog", "consumequeue", "index")
            for p in (root / d).rglob("*") if p.is_file()}


# --- recover_store(progress=) ----------------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_recover_reports_the_walk_per_segment(tmp_path, monkeypatch, dry_run):
    root = crashed_store(tmp_path / "store")
    segs = data_segments(root)
    assert len(segs) >= 3
    monkeypatch.setattr(recovery, "_PROGRESS_STEP", 1)  # a report at every run of valid records
    calls = []
    report = recover_store(root, dry_run=dry_run, progress=lambda done, total: calls.append((done, total)))
    assert report["last_exit_ok"] is False and report["truncated_bytes"] > 0
    check_calls(calls)
    start = int(os.path.basename(report["start_file"]))
    checked = segs[-1] + FS - start  # from the scan's start to the end of the segments holding data
    assert len(calls) >= len(segs) - segs.index(start)
    if dry_run:
        assert calls[-1] == (checked, checked)
        assert (root / "abort").exists()  # (nothing written)
    else:
        # the check, then the re-dispatch of the valid records (the blank records ending segments left
        # out) and the index catch-up (from the last record indexed: a record or so here)
        valid = report["process_offset"] - start
        assert checked + valid * 9 // 10 < calls[-1][1] <= checked + valid + 4096
        assert not (root / "abort").exists()


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "real"])
def test_recover_reports_rarely_by_default(tmp_path, dry_run):
    """A store far smaller than a step: a report at the end of each pass only."""
    root = crashed_store(tmp_path / "store")
    calls = []
    recover_store(root, dry_run=dry_run, progress=lambda done, total: calls.append((done, total)))
    check_calls(calls)
    assert len(calls) == 1 if dry_run else 2 <= len(calls) <= 4


def test_recover_after_a_clean_shutdown_and_of_an_empty_store(tmp_path):
    root = crashed_store(tmp_path / "store")
    recover_store(root)
    calls = []
    report = recover_store(root, progress=lambda done, total: calls.append((done, total)))
    assert report["last_exit_ok"] is True
    check_calls(calls)
    empty = tmp_path / "empty"
    MessageStore.open(empty, config=SMALL).close()
    calls.clear()
    recover_store(empty, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 0)]


def test_recover_progress_that_raises_ends_the_open_and_is_forgotten(tmp_path):
    root = crashed_store(tmp_path / "store")

    def boom(done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        recover_store(root, progress=boom)
    assert recovery._progress_hook.get() is None
    assert recover_store(root)["last_exit_ok"] is False  # (still a crash to recover, no report to boom)
    with MessageStore.open(root, config=SMALL):  # an open of its own reports to nobody
        pass


# --- delete_expired(progress=) ---------------------------------------------------------------------


def test_delete_expired_reports_each_deleted_file(tmp_path):
    root = copy_golden_store(GOLD, tmp_path / "store")
    before = sizes(root)
    calls = []
    with MessageStore.open(root, config=golden_config()) as s:
        assert s.delete_expired(force=True, dry_run=True, progress=lambda *a: calls.append(a)).deleted == 2
        assert calls == []  # (a dry run deletes nothing)
        report = s.delete_expired(force=True, progress=lambda done, total: calls.append((done, total)))
    assert report.deleted == 2 and not report.busy
    check_calls(calls)
    freed = sum(before[p] for p in report.commit_log_files + report.consume_queue_files + report.index_files)
    assert calls[-1] == (freed, freed)
    assert all(t == freed for _, t in calls)  # (the total known from the start)
    # one report per CommitLog segment, then per queue's files and for the index files
    assert [d for d, _ in calls[:2]] == [FS, 2 * FS]
    assert len(calls) == 2 + len({os.path.dirname(p) for p in report.consume_queue_files}) + bool(report.index_files)


def test_delete_expired_with_nothing_to_delete(tmp_path):
    root = copy_golden_store(GOLD, tmp_path / "store")
    calls = []
    with MessageStore.open(root, config=golden_config()) as s:
        s.delete_expired(force=True)
        report = s.delete_expired(force=True, progress=lambda done, total: calls.append((done, total)))
    assert report.deleted == 0 and calls == [(0, 0)]


# --- the CLI -----------------------------------------------------------------------------------------


def test_recover_shows_a_bar_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    root = crashed_store(tmp_path / "store")
    assert main(["recover", str(root), "--dry-run"]) == 0  # stderr not a terminal: no bar
    err = capsys.readouterr().err
    assert "would truncate" in err and "%|" not in err and "\r" not in err
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["recover", str(root), "--dry-run", "--quiet"]) == 0
    assert "would truncate" in term.getvalue() and "%|" not in term.getvalue()
    term.truncate(0)
    term.seek(0)
    assert main(["recover", str(root), "--dry-run"]) == 0
    assert "recover (dry run): 100%|" in term.getvalue()  # (tqdm's bar)
    term.truncate(0)
    term.seek(0)
    assert main(["recover", str(root), "--yes"]) == 0
    assert "recover: 100%|" in term.getvalue() and "abnormal recovery" in term.getvalue()
    assert not (root / "abort").exists()


def test_clean_shows_a_bar_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    quiet = copy_golden_store(GOLD, tmp_path / "quiet")
    assert main(["clean", str(quiet), "--force", "--yes"]) == 0  # stderr not a terminal: no bar
    cap = capsys.readouterr()
    assert "deleted CommitLog" in cap.out and "%|" not in cap.err and "\r" not in cap.err
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    root = copy_golden_store(GOLD, tmp_path / "store")
    assert main(["clean", str(root), "--force", "--yes", "--quiet"]) == 0
    assert term.getvalue().strip("\x00") == ""
    root = copy_golden_store(GOLD, tmp_path / "again")
    assert main(["clean", str(root), "--force", "--yes"]) == 0
    assert "clean: 100%|" in term.getvalue()
    assert len(os.listdir(root / "commitlog")) == 1
