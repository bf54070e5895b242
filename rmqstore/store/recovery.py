"""Load-time recovery: plan from the files without writing, then cut, re-dispatch
and re-index (docs/recovery.md#recovery)."""

from __future__ import annotations

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
        if not files:
            return plan
        start = self._normal_start(max_cq_phy) if self.last_exit_ok else self._abnormal_start()
        plan["start_file"] = files[start].path
        runs = plan["runs"]
        end, reason = cl.scan_valid(start, crc, crc_mode, lambda mf, lo, hi: runs.append((mf, lo, hi)))
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
            end, reason = cl.scan_valid(files.index(seg), crc, crc_mode, None, nxt - seg.file_from_offset)
        plan["process_offset"] = end
        if not self.read_only and cfg.message_index_enable:
            # a last index file a crash tore (power loss) is rebuilt
            files_ = self.index.files
            plan["drop_last_index"] = not self.last_exit_ok and bool(files_) and not files_[-1].is_consistent()
            self._check_index_source(plan, start, crc_mode)
        return plan

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
        reached, reason = cl.scan_valid(files.index(seg), True, crc_mode, None, lo - seg.file_from_offset,
                                        stop_index=scan_start)
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
        if plan["runs"] and not self.read_only:
            on_run = self._recovery_dispatcher(plan["dispatch_from"])
            for mf, lo, hi in plan["runs"]:
                on_run(mf, lo, hi)
        if max_cq_phy >= process_offset:
            for cq in self._cqs.values():
                cq.truncate_dirty_logic_files(process_offset)
        # bytes of data the cut drops (not the zeros a preallocated segment ends with)
        report["truncated_bytes"] = max(0, self.commitlog.data_end_estimate(process_offset) - process_offset)
        self.commitlog.truncate(process_offset)
        if not self.read_only:  # (a cut in the crash window: what was flushed ends here at most)
            self.checkpoint.confirm_phy_offset = min(self.checkpoint.confirm_phy_offset, process_offset)
        if not self.read_only and cfg.message_index_enable:
            self._recover_index(process_offset, plan["drop_last_index"])
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
        self.recovery_report = report
        log.info("recovered %s: %s", self.root_dir, report)

    def _recover_index(self, process_offset: int, drop_last: bool) -> None:
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
        for phy, _size in self.commitlog.iter_offsets(start):
            f = self.commitlog.read(phy, with_body=False, strict=True)
            props = k.parse_properties(f[16])
            index.build_index(f[15], phy, f[10], f[7], props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
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

    def _recovery_dispatcher(self, dispatch_from: int):
        """``on_run`` for the recovery scan: dispatch (again) every record of a
        validated run that ends after *dispatch_from*. Runs are decoded into
        columns (``decode_columns``); a record its queue and the index hold
        already is passed over without a dispatch call."""
        topics: dict = {}  # topic bytes -> str, decoded once
        index = self.index if self.config.message_index_enable else None

        def on_run(mf, start, end):
            base = mf.file_from_offset
            if base + end <= dispatch_from:
                return
            pos = start
            while pos < end:
                pos_next, _stop, c = k.decode_columns(mf.mm, pos, end, base, 8192, False, False)
                if pos_next == pos:  # cannot happen on a validated run; never loop on it
                    raise CorruptedFileError("recovery could not decode a validated record", mf.path, pos)
                pos = pos_next
                self._dispatch_columns(mf, c, dispatch_from, topics, index)

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
