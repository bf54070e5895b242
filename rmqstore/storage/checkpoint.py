"""The ``checkpoint`` file: five big-endian i64 fields in 4096 bytes (docs/format.md#checkpoint)."""

from __future__ import annotations

import logging
import os
import struct
import time

from ..format.layout import CHECKPOINT_FILE_SIZE, is_offset_name
from .mapped_file import _NOFOLLOW, open_no_follow

__all__ = ["StoreCheckpoint", "field_problems"]

log = logging.getLogger("rmqstore.checkpoint")

_FIELDS = struct.Struct(">qqqqq")
_NAMES = (
    "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp", "master_flushed_offset",
    "confirm_phy_offset",
)
_TIMESTAMPS = _NAMES[:3]
#: a store time further ahead of this machine's clock than this is not believed
FUTURE_SLACK_MS = 24 * 3600 * 1000


def field_problems(fields, commitlog_end=None, now_ms=None) -> list:
    """The checkpoint *fields* (its five values in file order) that contradict
    the store, as ``[(byte offset, attribute name, text)]``: a negative
    field, a store time more than :data:`FUTURE_SLACK_MS` ahead of *now_ms*
    (default: this machine's clock), an offset past *commitlog_end* (where
    the CommitLog ends; None: not checked)."""
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    out = []
    for i, (name, v) in enumerate(zip(_NAMES, fields)):
        if v < 0:
            out.append((8 * i, name, f"{name} {v} is negative"))
        elif name in _TIMESTAMPS and v > now_ms + FUTURE_SLACK_MS:
            out.append((8 * i, name, f"{name} {v} lies more than a day ahead of this machine's clock ({now_ms})"))
        elif name not in _TIMESTAMPS and commitlog_end is not None and v > commitlog_end:
            out.append((8 * i, name, f"{name} {v} lies beyond the CommitLog's end ({commitlog_end})"))
    return out


def _commitlog_end(root: str):
    """Where the CommitLog files under *root* end at most: the largest start
    offset (a file's name) plus that file's size; None without a CommitLog
    directory."""
    directory = os.path.join(root, "commitlog")
    try:
        names = [n for n in os.listdir(directory) if is_offset_name(n)]
    except (FileNotFoundError, NotADirectoryError):
        return None
    end = 0
    for n in names:
        try:
            end = max(end, int(n) + os.path.getsize(os.path.join(directory, n)))
        except OSError:  # (deleted meanwhile)
            continue
    return end


class StoreCheckpoint:
    """RocketMQ ``StoreCheckpoint``.

    Attributes (ms since epoch, or a physical offset):
        physic_msg_timestamp, logics_msg_timestamp, index_msg_timestamp,
        master_flushed_offset, confirm_phy_offset.
    """

    __slots__ = (
        "path", "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
        "master_flushed_offset", "confirm_phy_offset", "_written",
    )

    def __init__(self, path):
        self.path = str(path)
        self._written = b""  # what the last flush put on disk
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0

    def load(self) -> bool:
        """Read the file if it exists; returns whether it held the five fields.
        A missing, empty or short file (a crash during its first write) leaves
        every field 0: recovery then starts from the first CommitLog segment,
        which is always safe. The checkpoint only advises where to start, so
        a field that contradicts the store (see :func:`field_problems`; the
        CommitLog is the ``commitlog`` directory beside the file) is read as
        0 too, with a warning."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(_FIELDS.size)
        except FileNotFoundError:
            return False
        if len(data) < _FIELDS.size:
            log.warning("checkpoint %s holds %d bytes; ignoring it (full recovery scan)", self.path, len(data))
            return False
        values = dict(zip(_NAMES, _FIELDS.unpack(data)))
        for _offset, name, text in field_problems(values.values(), _commitlog_end(os.path.dirname(self.path))):
            log.warning("checkpoint %s: %s; read as 0", self.path, text)
            values[name] = 0
        for name, v in values.items():
            setattr(self, name, v)
        return True

    @property
    def min_timestamp(self) -> int:
        """``max(0, min(physic, logics) - 3000)``: where abnormal recovery may start."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def to_bytes(self) -> bytes:
        return _FIELDS.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
            self.master_flushed_offset, self.confirm_phy_offset,
        ) + bytes(CHECKPOINT_FILE_SIZE - _FIELDS.size)

    def flush(self, sync: bool = True) -> None:
        """Write all 4096 bytes in place and fsync (the file keeps its inode, as
        RocketMQ's mapped checkpoint does; *sync* False: no fsync, NO_FLUSH);
        nothing to do when the values are the ones this object last wrote
        (the store flushes it every second)."""
        data = self.to_bytes()
        if data == self._written:
            return
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = open_no_follow(self.path, flags, 0o644)  # never written through a symbolic link
        try:
            os.pwrite(fd, data, 0)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._written = data

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in _NAMES}
