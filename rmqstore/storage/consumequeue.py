"""ConsumeQueue: per (topic, queue id), 20-byte units pointing into the CommitLog (docs/format.md#consumequeue-unit)."""

from __future__ import annotations

import logging
import os

from .. import _kernels as k
from ..dispatch import java_parse_int, tags_code  # noqa: F401 (the old home of the tags code rule)
from ..exceptions import CorruptedFileError
from ..format.layout import CQ_STORE_UNIT_SIZE as UNIT
from ..format.layout import PRE_BLANK_SIZE, queue_id_of
from .mapped_file import MappedFileQueue

__all__ = ["ConsumeQueue", "is_pre_blank", "queue_dirs", "tags_code"]

log = logging.getLogger("rmqstore.consumequeue")

_CORRECT_CHUNK = 1024 * UNIT  # units read at a time by correct_min_offset


def queue_dirs(store_dir) -> list:
    """``[(topic, queue_id, directory)]`` of a store's ConsumeQueues
    (``consumequeue/<topic>/<queue_id>/``), sorted by topic and queue id. A
    store without a ``consumequeue`` directory has none. Entries that are no
    queue of this store are skipped with a warning (once per path), never
    an error: files, names that are not a valid UTF-8 topic or a canonical
    queue id (``"007"``, other scripts' digits), symbolic links (the store
    never writes through one), directories it may not read."""
    base = os.path.join(os.fspath(store_dir), "consumequeue")
    try:
        topics = os.listdir(base)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for topic in topics:
        tdir = os.path.join(base, topic)
        if os.path.islink(tdir) or not _valid_topic_name(topic):
            _stray(tdir, "not a topic's directory")
            continue
        try:
            names = os.listdir(tdir)
        except FileNotFoundError:  # deleted meanwhile
            continue
        except NotADirectoryError:
            _stray(tdir, "a file, not a topic's directory")
            continue
        except OSError as e:
            _stray(tdir, f"cannot be read ({e.strerror})")
            continue
        for q in names:
            qdir = os.path.join(tdir, q)
            qid = queue_id_of(q)
            if qid is None or os.path.islink(qdir) or not os.path.isdir(qdir):
                _stray(qdir, "not a queue's directory (a queue's is its id in decimal)")
                continue
            out.append((topic, qid, qdir))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


_warned: set = set()


def _stray(path: str, why: str) -> None:
    if path not in _warned:
        if len(_warned) < 10_000:  # (bounded: a follower re-lists the directory every second)
            _warned.add(path)
        log.warning("skipping %s: %s", path, why)


def _valid_topic_name(name: str) -> bool:
    """Whether a directory name can be a topic: it has a UTF-8 form (names
    that are not UTF-8 on disk come back from ``listdir`` with lone
    surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return bool(name)


def _rmdirs(dirs) -> None:
    """Remove the empty directories *dirs*, deepest first, stopping at the first that is not."""
    for d in dirs:
        try:
            os.rmdir(d)
        except OSError:
            break


def is_pre_blank(unit) -> bool:
    """Whether a unit is a placeholder below a queue's first entry (docs/recovery.md#pitfall-pre-blank-units-served)."""
    return unit[0] == 0 and unit[1] == PRE_BLANK_SIZE and unit[2] == 0


def view_time(view: tuple, physical_offset: int, size: int) -> int:
    """Store timestamp of the record at *physical_offset* through a
    ``CommitLog.segment_view()``; -1 unless ``[offset, offset + size)`` is
    stored (RocketMQ ``pickupStoreTimestamp``)."""
    bufs, fs, base, lo, hi = view
    if physical_offset < lo or physical_offset + size > hi or physical_offset < base:
        return -1
    i = (physical_offset - base) // fs
    if i >= len(bufs):
        return -1
    return k.read_store_timestamp(bufs[i], physical_offset - base - i * fs)


def _unit_time(mf, pos: int, view: tuple) -> int:
    if pos < 0 or pos + UNIT > mf.wrote_position:
        return -1
    phy, size, _ = k.cq_get(mf.mm, pos)
    return view_time(view, phy, size)


class ConsumeQueue(k.ConsumeQueueBase):
    """One logical queue: ``consumequeue/<topic>/<queue_id>/``.

    Attributes:
        topic (str), queue_id (int).
        max_physic_offset (int): end (offset + size) of the last unit's record, -1 if unknown.
        min_logic_offset (int): byte offset of the first unit still pointing at live data.
    """

    __slots__ = ()  # (every field is ConsumeQueueBase's, which the kernels read)
    queue: MappedFileQueue

    def __init__(self, root, topic: str, queue_id: int, file_size, read_only: bool = False):
        self.topic = topic
        self.queue_id = queue_id
        # a file a put makes has its directory entry synced by the next
        # flush, not on the put (1 ms and more): the queue is rebuilt from
        # the CommitLog, and the checkpoint counts it only once flushed
        self.queue = MappedFileQueue(os.path.join(root, topic, str(queue_id)), file_size, read_only,
                                     sync_creation=False)
        self.max_physic_offset = -1
        self.min_logic_offset = 0

    @property
    def file_size(self) -> int:
        return self.queue.file_size

    def load(self) -> None:
        self.queue.load()

    # --- offsets ------------------------------------------------------------------

    def min_offset_in_queue(self) -> int:
        return self.min_logic_offset // UNIT

    def max_offset_in_queue(self) -> int:
        """The next queue offset to be written."""
        return self.queue.max_offset() // UNIT

    # --- recovery -------------------------------------------------------------------

    def recover(self) -> None:
        """Scan the last three files, stop at the first invalid unit, cut the
        queue there (RocketMQ ``ConsumeQueue.recover``)."""
        end = self.recover_end()
        if end is not None:
            self.queue.truncate_dirty(end)

    def recover_end(self):
        """Where :meth:`recover` cuts the queue (a logical byte offset; None
        without files), with ``max_physic_offset`` set as after it; writes
        nothing."""
        files = self.queue.files
        if not files:
            return None
        fs = self.file_size
        i = max(0, len(files) - 3)
        max_phy = -1
        while True:
            mf = files[i]
            end, last = k.cq_scan(mf.mm, 0, fs)
            if last >= 0:
                max_phy = last
            if end == fs and i + 1 < len(files):
                i += 1
                continue
            break
        self.max_physic_offset = max_phy
        return mf.file_from_offset + end

    def truncate_dirty_logic_files(self, phy_offset: int) -> None:
        """docs/recovery.md#cutting-a-consumequeue: drop units whose record starts at or after *phy_offset*;
        unit 0 of a file is checked for validity too (docs/recovery.md#pitfall-unit-zero-unchecked)."""
        self.max_physic_offset = phy_offset
        while self.queue.files:
            mf = self.queue.last
            keep, max_end = k.cq_scan(mf.mm, 0, self.file_size, phy_offset)
            if keep == 0:
                self.queue.delete_last()
                continue
            if max_end >= 0:  # else every unit kept is a pre-blank placeholder
                self.max_physic_offset = max_end
            self.queue.truncate_dirty(mf.file_from_offset + keep)
            break

    def correct_min_offset(self, min_commit_log_offset: int) -> None:
        """docs/recovery.md#queue-minimum-offset: point ``min_logic_offset`` at the first unit whose record is
        still in the CommitLog, skipping pre-blank placeholders (docs/recovery.md#pitfall-pre-blank-units-served)."""
        files = self.queue.files
        if not files:
            return
        max_bytes = self.queue.max_offset()
        if self.min_logic_offset >= max_bytes:
            return
        first = files[0]
        start = max(self.min_logic_offset, first.file_from_offset)
        for mf in files:
            if mf.file_from_offset + mf.wrote_position <= start:
                continue
            pos = max(0, start - mf.file_from_offset)
            while pos < mf.wrote_position:
                # a chunk at a time: the answer is nearly always the first
                # unit, and a whole file of tuples costs an open ~0.1 s a queue
                end = min(mf.wrote_position, pos + _CORRECT_CHUNK)
                for j, unit in enumerate(k.cq_units(mf.mm, pos, end)):
                    if unit[0] >= min_commit_log_offset and not is_pre_blank(unit):
                        self.min_logic_offset = mf.file_from_offset + pos + j * UNIT
                        return
                pos = end
        self.min_logic_offset = max_bytes

    # --- writing --------------------------------------------------------------------

    def reserve(self, first_queue_offset: int, end_queue_offset: int) -> None:
        """Make the files that units up to *end_queue_offset* (exclusive) go
        into, before their records are written; *first_queue_offset* places
        the first file of a queue that has none. A new queue whose first
        file cannot be made leaves no directory behind. Raises what making
        a file raises (OSError, DiskFullError, CorruptedFileError)."""
        q = self.queue
        fresh = not q.files and not q.spares
        made = []  # directories this call creates, deepest first
        if fresh:
            d = q.directory
            for _ in range(3):  # <queue id>, <topic>, consumequeue: never written through a link
                if os.path.islink(d):
                    raise CorruptedFileError("a symbolic link where the store keeps a directory of its own; "
                                             "the store never writes through one", d)
                if not os.path.isdir(d):
                    made.append(d)
                d = os.path.dirname(d)
        try:
            q.reserve(end_queue_offset * UNIT, first_queue_offset * UNIT)
        except BaseException:
            if fresh:  # what this call made, and nothing else
                try:
                    q.drop_spares()
                except OSError:
                    pass
                _rmdirs(made)
            raise

    def remove_directory(self) -> None:
        """Remove the directories of a queue left with no file (a put that
        made the queue was undone), the topic's too when it is empty."""
        self.queue.drop_spares()
        d = self.queue.directory
        _rmdirs([d, os.path.dirname(d)])

    def put(self, physical_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Append the unit for *queue_offset* (docs/format.md#writing-units). Already-present units
        are skipped (idempotent re-dispatch); a gap below *queue_offset* is
        filled with pre-blank placeholders instead of shifting offsets (docs/recovery.md#pitfall-consumequeue-gap)."""
        if physical_offset + size <= self.max_physic_offset:
            return True
        expect = queue_offset * UNIT
        mf = self.queue.last_for_append(expect)
        fs = self.file_size
        if mf.first_created_in_queue and queue_offset != 0 and mf.wrote_position == 0:
            self.min_logic_offset = expect
            self._fill_pre_blank(mf, expect % fs)
        current = mf.file_from_offset + mf.wrote_position
        if expect < current:
            return True
        while expect > current:
            log.warning(
                "ConsumeQueue %s-%d: gap before queue offset %d, filled with placeholders",
                self.topic, self.queue_id, queue_offset,
            )
            self._fill_pre_blank(mf, min(fs, expect - mf.file_from_offset))
            mf = self.queue.last_for_append(expect)
            current = mf.file_from_offset + mf.wrote_position
        k.cq_put(mf.mm, mf.wrote_position, physical_offset, size, tags_code)
        mf.wrote_position += UNIT
        self.max_physic_offset = physical_offset + size
        return True

    @staticmethod
    def _fill_pre_blank(mf, until: int) -> None:
        for pos in range(mf.wrote_position, until, UNIT):
            k.cq_put(mf.mm, pos, 0, PRE_BLANK_SIZE, 0)
        mf.wrote_position = max(mf.wrote_position, until)

    # --- reading --------------------------------------------------------------------

    def get_unit(self, queue_offset: int):
        """``(physical_offset, size, tags_code)`` at *queue_offset*, or None."""
        units = self.get_units(queue_offset, 1)
        return units[0] if units else None

    def get_units(self, queue_offset: int, max_count: int) -> list:
        """Up to *max_count* units from *queue_offset*, within one file (docs/format.md#reading-units)."""
        where = self.unit_range(queue_offset, max_count)
        return [] if where is None else k.cq_units(*where)

    def unit_range(self, queue_offset: int, max_count: int):
        """Where :meth:`get_units` reads: ``(buffer, start, end)``, byte
        positions of whole units in one file, or None."""
        off = queue_offset * UNIT
        if off < self.min_logic_offset or max_count <= 0:
            return None
        mf = self.queue.find(off)
        if mf is None:
            return None
        pos = off - mf.file_from_offset
        return mf.mm, pos, max(pos, min(mf.wrote_position, pos + max_count * UNIT))

    def offset_by_time(self, timestamp: int, upper: bool, view: tuple) -> int:
        """Queue offset for *timestamp* (RocketMQ 5.1.1+ ``getOffsetInQueueByTime``,
        docs/format.md#time-search), clamped to [min, max] as the store answers. *view* is
        ``CommitLog.segment_view()``; records below its minimum are skipped."""
        files = self.queue.files
        if not files:
            return 0
        mn = self.min_logic_offset // UNIT
        last = files[-1]
        mx = (last.file_from_offset + last.wrote_position) // UNIT
        mf = self._file_by_time(timestamp, upper, view)
        fs = self.queue.file_size
        if mf is None:
            res = 0
        elif mf.wrote_position <= 0:
            res = mf.file_from_offset // UNIT
        else:
            low = self.min_logic_offset - mf.file_from_offset
            wrote = mf.wrote_position
            res = k.cq_search_time(
                mf.mm, mf.file_from_offset, low if low > 0 else 0, wrote if wrote < fs else fs, timestamp, upper,
                view[3], view,
            )
        res = mn if res < mn else res  # min(max(res, mn), mx), without two calls
        return mx if res > mx else res

    def _file_by_time(self, timestamp, upper, view):
        files = self.queue.files
        if not files:
            return None
        if upper:
            for mf in reversed(files):
                t = _unit_time(mf, 0, view)
                if 0 <= t <= timestamp:
                    return mf
            return None
        for mf in files[:-1]:
            if _unit_time(mf, self.file_size - UNIT, view) >= timestamp:
                return mf
        return files[-1]

    # --- retention and follow mode (docs/recovery.md#retention) ---------------------------

    def expired_head_count(self, min_commit_log_offset: int) -> int:
        """docs/recovery.md#retention: how many files, oldest first and never the last, have a
        last unit whose record starts below *min_commit_log_offset* (their
        messages are all gone from the CommitLog)."""
        files = self.queue.files
        n = 0
        for mf in files[:-1]:
            phy, size, tags = k.cq_get(mf.mm, mf.file_size - UNIT)
            if phy >= min_commit_log_offset and not is_pre_blank((phy, size, tags)):
                break
            n += 1
        return n

    def follow(self, max_physical_end: int) -> bool:
        """Read-only follow mode: take in units another process appended since
        the last call (and files it created). A unit counts once its size is
        non-zero (the writer stores the size last) and its record ends at or
        below *max_physical_end*, the CommitLog's known end (so a unit whose
        record is not seen yet, or was cut by recovery, stays out). Returns
        whether the queue grew."""
        q = self.queue
        if not q.files and not q.follow_files():  # earlier files are full; the last one is scanned below
            return False
        grew = False
        fs = q.file_size
        while True:
            mf = q.files[-1]
            start = mf.wrote_position
            end, _last = k.cq_scan(mf.mm, start, fs)
            pos = start
            if end > start:
                for unit in k.cq_units(mf.mm, start, end):
                    if not is_pre_blank(unit):
                        if unit[0] + unit[1] > max_physical_end:
                            end = pos  # its record is not there (yet)
                            break
                        self.max_physic_offset = unit[0] + unit[1]
                    pos += UNIT
                if end > start:
                    mf.wrote_position = end
                    grew = True
            if end < fs or not q.map_new_segments():
                return grew

    def flush(self, least_pages: int = 0) -> None:
        self.queue.flush(least_pages)

    def close(self) -> None:
        """Unmap the files; a queue that only ever had files made ahead
        (its puts undone) leaves no directory."""
        unused = not self.queue.files and self.queue.spares
        self.queue.close()
        if unused:
            d = self.queue.directory
            _rmdirs([d, os.path.dirname(d)])

    def destroy(self) -> None:
        self.queue.destroy()
