"""Load-time recovery: plan from the files without writing, then cut, re-dispatch
and re-index (docs/recovery.md#recovery)."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os

from .. import _kernels as k
from ..dispatch import consume_queue_mask, gets_consume_queue_unit, tags_code
from ..exceptions import CorruptedFileError
from ..format.layout import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, SCHEDULE_TOPIC
from ..storage.consumequeue import ConsumeQueue, queue_dirs
from ..storage.mapped_file import _NOFOLLOW, open_no_follow
from .commit import Commit

log = logging.getLogger("rmqstore.store")

# How rmqstore.tools.recover_store hears of the recovery walk's progress
# without a parameter on MessageStore.open (recovery runs inside open, before
# the caller holds a store to set anything on): it sets this around its own
# open (reporting_progress) and the walk reads it once. A context variable,
# so an open in another thread or task never reports to it.
_progress_hook: contextvars.ContextVar = contextvars.ContextVar("rmqstore_recovery_progress", default=None)

# bytes walked between two reports (a report or more per segment of the
# usual sizes, never per record: a bar does not slow the walk)
_PROGRESS_STEP = 32 << 20
_NEVER = 1 << 63  # (a report threshold no offset reaches)


@contextlib.contextmanager
def reporting_progress(progress):
    """Within this block, the recovery of a store opened in this thread (or
    task) calls ``progress(done_bytes, total_bytes)`` (see :class:`_Walk`)."""
    token = _progress_hook.set(progress)
    try:
        yield
    finally:
        _progress_hook.reset(token)


class _Walk:
    """The recovery walk's progress, in CommitLog bytes: those checked from
    the segment the scan starts at to the end of the last segment holding
    data (those the index lacks before it too, on a writable open), then,
    writable, those of the valid runs re-dispatched and those indexed from
    the CommitLog. Reported at most every ``_PROGRESS_STEP`` bytes and at
    the end of each pass, never per record; *done* never goes down, the
    total is the bytes the walk expects (first estimated, then as the scan
    found them), and the last report has ``done == total``."""

    __slots__ = ("progress", "done", "total", "told", "next_at")

    def __init__(self, progress) -> None:
        self.progress = progress
        self.done = self.total = 0
        self.told: tuple | None = None
        self.next_at = _PROGRESS_STEP  # *done* at which to report next

    def expect(self, total: int) -> None:
        self.total = max(total, self.done)

    def at(self, done: int, tell: bool = False) -> None:
        """*done* bytes walked; reported when a step was crossed or *tell*."""
        if done > self.done:
            self.done = done
            self.total = max(self.total, done)
        if tell or self.done >= self.next_at:
            self.next_at = self.done + _PROGRESS_STEP
            now = (self.done, self.total)
            if now != self.told:
                self.told = now
                self.progress(*now)

    def finish(self) -> None:
        self.total = self.done = max(self.done, self.total)
        self.at(self.done, tell=True)


class Recovery(Commit):
    """The layer that brings the files back to one consistent state at open:
    RocketMQ's ``DefaultMessageStore.recover`` (normal and abnormal
    recovery, ConsumeQueue and index repair), planned first without a
    write."""

    @staticmethod
    def _write_abort(path) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = open_no_follow(path, flags, 0o644)
        try:
            os.write(fd, str(os.getpid()).encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def _load_consume_queues(self) -> None:
        base = os.path.join(self.root_dir, "consumequeue")
        size = None if self.read_only else self.config.mapped_file_size_consume_queue
        for topic, qid, _qdir in queue_dirs(self.root_dir):
            cq = ConsumeQueue(base, topic, qid, size, read_only=self.read_only)
            cq.load()
            self._cqs[(topic, qid)] = cq

    def _plan_recovery(self) -> dict:
        """What load-time recovery will do, read from the files without
        writing: where each ConsumeQueue ends, where the CommitLog scan
        starts, the runs of valid records it found (to dispatch) and where
        valid data ends (RocketMQ's normal and abnormal recovery).

        A crash can only tear what was being written last: nothing valid
        lies behind a torn end. Where records that validate follow the point
        the scan stopped at, or a record the index must be rebuilt from does
        not validate (an older segment), the damage is the disk's, not a
        crash's, and recovery must not cut there: a writable open raises
        :class:`CorruptedFileError` (nothing has been written), a read-only
        one reads around it and lists it in ``recovery_report["damage"]``."""
        cfg = self.config
        cl = self.commitlog
        cq_ends = {key: cq.recover_end() for key, cq in self._cqs.items()}
        max_cq_phy = max((cq.max_physic_offset for cq in self._cqs.values()), default=-1)
        files = cl.queue.files
        crc = cfg.check_crc_on_recover
        # body CRC, and the store's own __CRC32# entry when it writes one
        crc_mode = 1 if cfg.force_verify_prop_crc else (2 if cfg.enabled_append_prop_crc else 0)
        plan: dict = {"cq_ends": cq_ends, "max_cq_phy": max_cq_phy, "runs": [], "process_offset": 0,
                      "reason": None, "damage": [], "start_file": None, "drop_last_index": False,
                      "dispatch_from": max_cq_phy if self.last_exit_ok else -1}
        hook = _progress_hook.get()
        walk = plan["walk"] = _Walk(hook) if hook is not None else None
        if not files:
            return plan
        start = self._normal_start(max_cq_phy) if self.last_exit_ok else self._abnormal_start()
        plan["start_file"] = files[start].path
        runs = plan["runs"]
        scan_from = files[start].file_from_offset
        walked, checking = None, 0
        if walk is None:
            on_run = lambda mf, lo, hi: runs.append((mf, lo, hi))  # noqa: E731
        else:
            checking = max(0, self._data_segments_end() - scan_from)
            redispatch = 0 if self.read_only else checking - max(0, plan["dispatch_from"] - scan_from)
            walk.expect(checking + max(0, redispatch))

            def walked(mf, lo, hi):
                walk.at(mf.file_from_offset + hi - scan_from)

            def on_run(mf, lo, hi):
                runs.append((mf, lo, hi))
                walked(mf, lo, hi)

        end, reason = cl.scan_valid(start, crc, crc_mode, on_run)
        plan["reason"] = reason
        while reason is not None:
            if not self._disk_damage(end):
                break  # where a crash tears: recovery cuts there, as RocketMQ does
            nxt = cl.find_valid_record(end, crc, crc_mode)
            if nxt is None:
                break  # nothing valid behind it: the end of the data
            mf = cl.queue.find(end)
            if not self.read_only:
                raise CorruptedFileError(
                    f"the CommitLog does not validate at physical offset {end} ({reason}), but records that "
                    f"validate follow it (the first at physical offset {nxt}): damage a crash cannot cause, as a "
                    "crash tears only what was written last. Opening the store for writing would cut them, so "
                    "nothing was changed. Read it with read_only=True, or copy every valid record into a new "
                    f"store with: rmqstore salvage {self.root_dir} <new directory>",
                    mf.path if mf else cl.queue.directory, end - mf.file_from_offset if mf else end,
                )
            plan["damage"].append({"path": mf.path if mf else None, "physical_offset": end, "reason": reason,
                                   "resumes_at": nxt})
            log.warning("read-only open of %s: damage at physical offset %d (%s), reading on from %d",
                        self.root_dir, end, reason, nxt)
            seg = cl.queue.find(nxt)
            end, reason = cl.scan_valid(files.index(seg), crc, crc_mode, walked, nxt - seg.file_from_offset)
        plan["process_offset"] = end
        if walk is not None:  # (what lies past the end of data is checked too: it is not data)
            walk.at(max(checking, end - scan_from), tell=True)
        if not self.read_only and cfg.message_index_enable:
            # a last index file a crash tore (power loss) is rebuilt
            files_ = self.index.files
            plan["drop_last_index"] = not self.last_exit_ok and bool(files_) and not files_[-1].is_consistent()
            self._check_index_source(plan, start, crc_mode)
        if walk is not None and not self.read_only:  # the re-dispatch, now that the valid runs are known
            since = plan["dispatch_from"]
            walk.expect(walk.done + sum(hi - lo for mf, lo, hi in runs if mf.file_from_offset + hi > since))
        return plan

    def _data_segments_end(self) -> int:
        """Physical offset past the last CommitLog segment that holds data
        (segments made ahead, never written, do not count)."""
        files = self.commitlog.queue.files
        last = len(files) - 1
        while last > 0 and not any(files[last].mm[:8]):
            last -= 1
        return files[last].file_from_offset + files[last].file_size

    def _disk_damage(self, offset: int) -> bool:
        """Whether damage at CommitLog physical *offset* lies where no crash
        can have torn the data: below the offset the checkpoint names as
        flushed (``confirmPhyOffset``, which this store keeps at its
        flushed end; a value past the files is not believed), or in a
        segment before the last two that hold data (a crash tears what was
        being written: the last segment, or the one before it just after a
        roll)."""
        cl = self.commitlog
        files = cl.queue.files
        flushed = self.checkpoint.confirm_phy_offset
        if 0 < flushed <= cl.max_offset() and offset < flushed:
            return True
        last = len(files) - 1
        while last > 0 and not any(files[last].mm[:8]):  # a segment made ahead, never written
            last -= 1
        mf = cl.queue.find(offset)
        return mf is not None and files.index(mf) < last - 1

    def _check_index_source(self, plan: dict, scan_start: int, crc_mode: int) -> None:
        """Recovery indexes the records the index lacks, from the CommitLog:
        those before the scanned segments must validate (body CRC included)
        before anything is written, or the open raises CorruptedFileError
        (damage in a segment before the ones being written is the disk's)."""
        cl = self.commitlog
        files = cl.queue.files
        end = plan["process_offset"]
        index_files = list(self.index.files)
        if plan["drop_last_index"]:
            index_files.pop()  # recovery rebuilds it
        # where the index catch-up starts: the end of what the kept files index
        # below the valid end (a lower bound where the last file is cut)
        indexed = max((f.end_phy_offset for f in index_files if f.end_phy_offset < end), default=0)
        lo = max(indexed, cl.min_offset())
        hi = files[scan_start].file_from_offset
        if lo >= hi:
            return
        seg = cl.queue.find(lo)
        walk, walked, base = plan["walk"], None, 0
        if walk is not None:
            base = walk.done - lo
            walk.expect(walk.total + hi - lo)

            def walked(mf, _lo, run_end):
                walk.at(base + mf.file_from_offset + run_end)

        reached, reason = cl.scan_valid(files.index(seg), True, crc_mode, walked, lo - seg.file_from_offset,
                                        stop_index=scan_start)
        if walk is not None:
            walk.at(base + hi, tell=True)
        if reached < hi:
            mf = cl.queue.find(reached)
            raise CorruptedFileError(
                f"the index lacks the records from physical offset {lo} on, and the CommitLog does not validate "
                f"at physical offset {reached} ({reason or 'no record'}): damage in a segment before the ones "
                "being written, which a crash cannot cause. Nothing was changed. Read the store with "
                f"read_only=True, or copy every valid record into a new store with: rmqstore salvage "
                f"{self.root_dir} <new directory>",
                mf.path if mf else cl.queue.directory, reached - mf.file_from_offset if mf else reached,
            )

    def _recover(self, plan: dict) -> None:
        """Load-time recovery as :meth:`_plan_recovery` decided it: cut each
        ConsumeQueue at its valid end, dispatch what the queues and the
        index miss, cut queues and CommitLog at the valid end, index what
        the index lacks (writable); in memory only when read-only."""
        cfg = self.config
        for key, cq in self._cqs.items():
            end = plan["cq_ends"].get(key)
            if end is not None:
                cq.queue.truncate_dirty(end)
        max_cq_phy = plan["max_cq_phy"]
        process_offset = plan["process_offset"]
        report = self.recovery_report = {
            "last_exit_ok": self.last_exit_ok, "max_cq_physical_offset": max_cq_phy,
            "process_offset": process_offset, "index_keys_added": 0, "stopped_because": plan["reason"],
            "damage": plan["damage"],
        }
        if plan["start_file"] is not None:
            report["start_file"] = plan["start_file"]
        self.commitlog.damaged = {d["physical_offset"]: d["resumes_at"] for d in plan["damage"]}
        walk = plan["walk"]
        if plan["runs"] and not self.read_only:
            on_run = self._recovery_dispatcher(plan["dispatch_from"], walk)
            for mf, lo, hi in plan["runs"]:
                on_run(mf, lo, hi)
            if walk is not None:
                walk.at(walk.done, tell=True)
        if max_cq_phy >= process_offset:
            for cq in self._cqs.values():
                cq.truncate_dirty_logic_files(process_offset)
        # bytes of data the cut drops (not the zeros a preallocated segment ends with)
        report["truncated_bytes"] = max(0, self.commitlog.data_end_estimate(process_offset) - process_offset)
        self.commitlog.truncate(process_offset)
        if not self.read_only:  # (a cut in the crash window: what was flushed ends here at most)
            self.checkpoint.confirm_phy_offset = min(self.checkpoint.confirm_phy_offset, process_offset)
        if not self.read_only and cfg.message_index_enable:
            self._recover_index(process_offset, plan["drop_last_index"], walk)
        # keys indexed by recovery: re-dispatched records and the catch-up above
        report["index_keys_added"] = self.index.keys_added
        if self.index.keys_added:
            log.warning("recovery indexed %d keys the index was missing", self.index.keys_added)
        cl_min = self.commitlog.min_offset()
        for key, cq in list(self._cqs.items()):
            if cq.max_offset_in_queue() == 0 and cq.queue.files:
                # no unit ever: files a put made ahead and a crash left unused
                if self.read_only:
                    cq.close()
                else:
                    cq.destroy()
                    cq.remove_directory()
                del self._cqs[key]
                continue
            self._queue_offsets[key] = cq.max_offset_in_queue()
            cq.correct_min_offset(cl_min)
        if walk is not None:
            walk.finish()
        self.recovery_report = report
        log.info("recovered %s: %s", self.root_dir, report)

    def _recover_index(self, process_offset: int, drop_last: bool, walk: _Walk | None = None) -> None:
        """Make the index cover exactly the CommitLog: after a crash drop a last
        index file that is not consistent (torn by a power loss), cut entries past
        *process_offset* (docs/recovery.md#pitfall-index-not-truncated), then index each record the index lacks straight
        from the CommitLog — RocketMQ instead deletes unflushed index files after
        a crash and never rebuilds them (docs/recovery.md#pitfall-index-lost-after-crash)."""
        index = self.index
        ts_at = lambda phy: self.commitlog.store_timestamp_at(phy, 1)  # noqa: E731
        if drop_last:
            log.warning("index file %s is not consistent after a crash; rebuilding it", index.files[-1].path)
            index.files.pop().destroy()
        index.truncate(process_offset, ts_at)
        last = index.files[-1] if index.files else None
        start = max(last.end_phy_offset if last else 0, self.commitlog.min_offset())
        base, report_at = 0, _NEVER  # (one comparison a record: a report every _PROGRESS_STEP bytes)
        if walk is not None:
            base = walk.done - start
            walk.expect(walk.total + max(0, process_offset - start))
            report_at = start + _PROGRESS_STEP
        for phy, _size in self.commitlog.iter_offsets(start):
            if phy >= report_at and walk is not None:
                walk.at(base + phy)
                report_at = phy + _PROGRESS_STEP
            f = self.commitlog.read(phy, with_body=False, strict=True)
            props = k.parse_properties(f[16])
            index.build_index(f[15], phy, f[10], f[7], props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
        if walk is not None:
            walk.at(base + max(start, process_offset), tell=True)
        # from the files, not from the checkpoint or the rolls this recovery
        # happened to make: a recovery that died before writing the checkpoint
        # leaves full files the next one never rolls (_flush_all flushes them
        # before the checkpoint names them)
        index.last_full_end_timestamp = index.newest_full_end_timestamp()

    def _normal_start(self, max_cq_phy: int) -> int:
        """The last three segments, or earlier when the queues lag behind
        (docs/recovery.md#normal-recovery: a superset of every RocketMQ version's choice)."""
        files = self.commitlog.queue.files
        start = max(0, len(files) - 3)
        for i in range(len(files) - 1, -1, -1):
            if files[i].file_from_offset <= max_cq_phy:
                return min(start, i)
        return 0

    def _abnormal_start(self) -> int:
        """Newest segment whose first record validates and was stored before the
        checkpoint's safe time (docs/recovery.md#abnormal-recovery); segment 0 otherwise."""
        cp = self.checkpoint
        index_safe = self.config.message_index_enable and self.config.message_index_safe
        limit = cp.min_timestamp_index if index_safe else cp.min_timestamp
        files = self.commitlog.queue.files
        for i in range(len(files) - 1, -1, -1):
            t = self.commitlog.first_record_timestamp(i)
            if t > 0 and t <= limit:
                return i
        return 0

    def _recovery_dispatcher(self, dispatch_from: int, walk: _Walk | None = None):
        """``on_run`` for the recovery scan: dispatch (again) every record of a
        validated run that ends after *dispatch_from*. Runs are decoded into
        columns (``decode_columns``); a record its queue and the index hold
        already is passed over without a dispatch call. *walk* counts the
        bytes of the runs dispatched, one decoded batch at a time."""
        topics: dict = {}  # topic bytes -> str, decoded once
        index = self.index if self.config.message_index_enable else None

        def on_run(mf, start, end):
            base = mf.file_from_offset
            if base + end <= dispatch_from:
                return
            pos = start
            before = walk.done - start if walk is not None else 0
            while pos < end:
                pos_next, _stop, c = k.decode_columns(mf.mm, pos, end, base, 8192, False, False)
                if pos_next == pos:  # cannot happen on a validated run; never loop on it
                    raise CorruptedFileError("recovery could not decode a validated record", mf.path, pos)
                pos = pos_next
                self._dispatch_columns(mf, c, dispatch_from, topics, index)
                if walk is not None:
                    walk.at(before + pos)

        return on_run

    def _undispatched(self, c, dispatch_from: int, index_end):
        """Rows of columns *c* that may need a dispatch. When the rows share one
        topic (the usual case) the rows whose queue and index hold them
        already are found with array operations; otherwise every row."""
        import numpy as np

        toff, tdata = c["topic_offsets"], c["topic_data"]
        n = len(toff) - 1
        width = int(toff[1] - toff[0]) if n else 0
        if n == 0 or not (np.diff(toff) == width).all() or \
                (width and not (tdata.reshape(n, width) == tdata[:width]).all()):
            return range(n)
        topic = tdata[:width].tobytes().decode("utf-8", "replace")
        phy = c["physical_offset"]
        end = phy + c["store_size"]
        qids = c["queue_id"]
        have = np.full(n, -1, dtype=np.int64)  # each row's queue: its max physical offset
        for qid in np.unique(qids).tolist():
            cq = self._cqs.get((topic, qid))
            if cq is not None:
                have[qids == qid] = cq.max_physic_offset
        done = consume_queue_mask(c["sys_flag"]) & (end <= have)
        if index_end is not None:
            done &= phy < index_end
        return np.flatnonzero((end > dispatch_from) & ~done).tolist()

    def _dispatch_columns(self, mf, c, dispatch_from: int, topics: dict, index) -> None:
        """Dispatch the records of columns *c* (decoded from segment *mf*)."""
        phys, sizes = c["physical_offset"].tolist(), c["store_size"].tolist()
        qids, qoffs = c["queue_id"].tolist(), c["queue_offset"].tolist()
        flags, times = c["sys_flag"].tolist(), c["store_timestamp"].tolist()
        toff, tdata = c["topic_offsets"].tolist(), c["topic_data"].tobytes()
        optional = [
            (name, c[col + "_valid"].tolist(), c[col + "_offsets"].tolist(), c[col + "_data"].tobytes())
            for name, col in ((PROPERTY_TAGS, "tags"), (PROPERTY_KEYS, "keys"), (PROPERTY_UNIQ_KEY, "unique_key"))
        ]
        index_end = index.files[-1].end_phy_offset if index is not None and index.files else -1
        cqs = self._cqs
        for i in self._undispatched(c, dispatch_from, index_end if index is not None else None):
            phy = phys[i]
            size = sizes[i]
            if phy + size <= dispatch_from:
                continue
            tb = tdata[toff[i] : toff[i + 1]]
            topic = topics.get(tb)
            if topic is None:
                topic = topics[tb] = tb.decode("utf-8", "replace")
            sys_flag = flags[i]
            if gets_consume_queue_unit(sys_flag):
                cq = cqs.get((topic, qids[i]))
                if cq is not None and phy + size <= cq.max_physic_offset and (index is None or phy < index_end):
                    continue  # in its queue and in the index already
            if topic == SCHEDULE_TOPIC:  # its tags code needs DELAY: every property
                props = k.parse_properties(k.decode_record(mf.mm, phy - mf.file_from_offset, False)[16])
            else:
                props = {}
                for name, valid, off, data in optional:
                    if valid[i]:
                        props[name] = data[off[i] : off[i + 1]].decode("utf-8", "replace")
            self._dispatch(topic, qids[i], qoffs[i], phy, size, sys_flag, times[i],
                           tags_code(topic, props, times[i], self.config), props.get(PROPERTY_UNIQ_KEY),
                           props.get(PROPERTY_KEYS))
